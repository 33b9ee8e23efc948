//! `cargo run -p simulation --release -- --seeds N [--start S] [--jobs J]` sweeps seeds (each in
//! its own process, so a livelocked seed is reported and the sweep goes on);
//! `-- --seed S` runs (replays) one seed in this process, printing its plan and fault log when
//! it fails. Other flags: `--fault-ms MS` (length of the fault phase), `--classic` (the plans
//! of the first rounds, before swarm plans: the older regression seeds), `--no-membership` (swarm
//! plans never change the membership, delete no stream and lose no disk: the plans of the sweeps
//! before any was on), `--no-deletes` (swarm plans never delete streams: the plans before that was
//! on), `--no-wipe` (no
//! disk is ever wiped and a node that refuses its rotten log is retired: the plans and runs of
//! the sweeps before wipes), `--replace-after-ms MS` (how long a rotten node waits for its new
//! disk), `--twice` (run each seed
//! again in a new process and compare the histories), `--plan` (print the plans only), `--history` (print the
//! plan and fault log even when the seed passes). Every failure prints the one command that
//! replays it. See `README.md`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use simulation::runner::LIVELOCK_EXIT;
use simulation::{replay_command, run_seed, Knobs, Plan, RunReport};

struct Args {
    seeds: Vec<u64>,
    sweep: bool,
    jobs: usize,
    knobs: Knobs,
    twice: bool,
    plan_only: bool,
    history: bool,
}

const USAGE: &str =
    "usage: simulation [--seeds N [--start S] [--jobs J]] [--seed S] [--fault-ms MS] [--classic] [--no-membership] [--no-deletes] [--no-wipe] [--replace-after-ms MS] [--twice] [--plan] [--history]";

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut count, mut start, mut one, mut jobs) = (None, 1u64, None, 1usize);
    let mut knobs = Knobs::default();
    let (mut twice, mut plan_only, mut history) = (false, false, false);
    let num = |v: Option<String>, flag: &str| -> Result<u64, String> {
        v.ok_or(format!("{flag} needs a value"))?.parse().map_err(|e| format!("{flag}: {e}"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seeds" => count = Some(num(args.next(), "--seeds")?),
            "--start" => start = num(args.next(), "--start")?,
            "--seed" => one = Some(num(args.next(), "--seed")?),
            "--jobs" => jobs = num(args.next(), "--jobs")?.max(1) as usize,
            "--fault-ms" => knobs.fault_phase_ms = num(args.next(), "--fault-ms")?,
            "--classic" => knobs.swarm = false,
            // On by default since round two's membership fixes; kept so older commands still work.
            "--membership" => knobs.membership = true,
            // The plans of the sweeps before membership changes had no lost disks either.
            "--no-membership" => (knobs.membership, knobs.wipes) = (false, false),
            "--no-deletes" => knobs.deletes = false,
            "--no-wipe" => knobs.wipes = false,
            "--replace-after-ms" => knobs.replace_after_ms = num(args.next(), "--replace-after-ms")?,
            "--twice" => twice = true,
            "--plan" => plan_only = true,
            "--history" => history = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let (seeds, sweep) = match (one, count) {
        (Some(s), _) => (vec![s], false),
        (None, Some(n)) => ((start..start + n).collect(), true),
        (None, None) => return Err(USAGE.into()),
    };
    Ok(Args { seeds, sweep, jobs, knobs, twice, plan_only, history })
}

fn summary(r: &RunReport, wall_s: f64) -> String {
    let s = &r.stats;
    format!(
        "seed {:>6} {}  sim {:>5.1} s  wall {:>5.1} s  publishes {} acks {} (dup {}) attempts {}  delivered {} gaps {}  faults {} crashes {} lost pages {} torn in {}  rpc dup {} replay {}  digest {:016x}",
        r.seed,
        if r.violations.is_empty() { "ok  " } else { "FAIL" },
        s.sim_ms as f64 / 1000.0,
        wall_s,
        s.publishes,
        s.acks,
        s.duplicate_acks,
        s.attempts,
        s.delivered,
        s.gaps,
        s.faults,
        s.disk.crashes,
        s.disk.pages_lost,
        s.disk.pages_torn_in,
        s.rpc_duplicated,
        s.rpc_replayed,
        r.history_digest
    ) + &effects(&s.effects)
}

/// The second round's faults, as they bit (only those that did).
fn effects(e: &simulation::runner::FaultEffects) -> String {
    let mut out = String::new();
    for (what, n) in [
        ("slow fsyncs", e.slow_syncs),
        ("ENOSPC", e.full_refusals),
        ("full-disk restarts", e.full_restarts),
        ("clock jumps", e.clock_jumps),
        ("snapshot chunks cut", e.snapshot_chunks_cut),
        ("snapshot crashes", e.snapshot_crashes),
        ("bits flipped", e.bits_flipped),
        ("rotten logs refused", e.refused_rotten_logs),
        ("membership changes", e.membership_changes),
        ("stream deletes", e.stream_deletes),
        ("re-creates", e.stream_recreates),
        ("seq_evicted", e.seq_evicted),
        ("disks wiped", e.wipes),
        ("rotten disks replaced", e.rotten_replaced),
        ("lost disks caught up", e.lost_caught_up),
    ] {
        if n > 0 {
            out.push_str(&format!("  {what} {n}"));
        }
    }
    out
}

/// Runs one seed here; prints its summary, and on failure its violations, plan and fault log.
/// The last line is machine-readable for a sweeping parent: `RESULT <seed> <ok|fail> <sim_ms>
/// <digest>[ <digest of the second run>]`.
fn run_here(seed: u64, args: &Args) -> bool {
    let t = Instant::now();
    let r = run_seed(seed, args.knobs);
    println!("{}", summary(&r, t.elapsed().as_secs_f64()));
    let ok = r.violations.is_empty();
    if args.history || !ok {
        print!("{}", Plan::generate(seed, args.knobs));
        for line in &r.history.fault_log {
            println!("  {line}");
        }
    }
    for v in r.violations.iter().take(40) {
        println!("    {v}");
    }
    if r.violations.len() > 40 {
        println!("    … and {} more", r.violations.len() - 40);
    }
    if !ok {
        println!("    replay: {}", r.replay_command());
    }
    let mut sim_ms = r.stats.sim_ms;
    let mut second = String::new();
    if args.twice {
        match run_again(seed, args.knobs) {
            Ok((again_ms, again_digest)) => {
                sim_ms += again_ms;
                println!(
                    "    determinism: history {} ({:016x} vs {again_digest:016x})",
                    if again_digest == r.history_digest { "same" } else { "DIFFERENT" },
                    r.history_digest,
                );
                second = format!(" {again_digest:016x}");
            }
            Err(e) => println!("    determinism: the second run did not finish: {e}"),
        }
    }
    println!("RESULT {seed} {} {sim_ms} {:016x}{second}", if ok { "ok" } else { "fail" }, r.history_digest);
    ok
}

/// Runs `seed` again in a child process, as a replay does (`--seed S` in a new process), and
/// returns its simulated ms and history digest. Not in this process: tokio numbers tasks from
/// one process-wide counter, and a crashed host's runtime drops its tasks in an order that
/// depends on those numbers, so a second run in the same process can diverge at its first crash
/// (README, "Determinism").
fn run_again(seed: u64, knobs: Knobs) -> Result<(u64, u64), String> {
    let out = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("--seed")
        .arg(seed.to_string())
        .arg("--fault-ms")
        .arg(knobs.fault_phase_ms.to_string())
        .args(if knobs.swarm { &[][..] } else { &["--classic"][..] })
        .args(if knobs.membership { &[][..] } else { &["--no-membership"][..] })
        .args(if knobs.deletes { &[][..] } else { &["--no-deletes"][..] })
        .args(if knobs.wipes { &[][..] } else { &["--no-wipe"][..] })
        .arg("--replace-after-ms")
        .arg(knobs.replace_after_ms.to_string())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let result =
        text.lines().find_map(|l| l.strip_prefix("RESULT ")).ok_or(format!("status {}, no RESULT line", out.status))?;
    let fields: Vec<&str> = result.split(' ').collect();
    let sim_ms = fields.get(2).and_then(|v| v.parse().ok()).ok_or(format!("bad RESULT line: {result}"))?;
    let digest =
        fields.get(3).and_then(|v| u64::from_str_radix(v, 16).ok()).ok_or(format!("bad RESULT line: {result}"))?;
    Ok((sim_ms, digest))
}

fn spawn(seed: u64, args: &Args) -> std::io::Result<Child> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--seed").arg(seed.to_string()).arg("--fault-ms").arg(args.knobs.fault_phase_ms.to_string());
    if !args.knobs.swarm {
        cmd.arg("--classic");
    }
    if !args.knobs.membership {
        cmd.arg("--no-membership");
    }
    if !args.knobs.deletes {
        cmd.arg("--no-deletes");
    }
    if !args.knobs.wipes {
        cmd.arg("--no-wipe");
    }
    cmd.arg("--replace-after-ms").arg(args.knobs.replace_after_ms.to_string());
    if args.twice {
        cmd.arg("--twice");
    }
    if args.history {
        cmd.arg("--history");
    }
    cmd.stdout(Stdio::piped()).spawn()
}

/// What one child process of a sweep left: its seed, the lines it printed (the `RESULT` line
/// apart), that line's fields, and its exit status (`None`: killed by a signal or not waited for).
struct Finished {
    seed: u64,
    lines: Vec<String>,
    result: Option<Vec<String>>,
    status: Option<i32>,
}

/// Reads a child's output to its end and waits for it, on its own thread, so a sweep collects
/// children in the order they finish: one slow seed no longer holds the other job slots idle.
fn collect(seed: u64, mut child: Child, done: mpsc::Sender<Finished>) {
    std::thread::spawn(move || {
        let (mut lines, mut result) = (Vec::new(), None);
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                match line.strip_prefix("RESULT ") {
                    Some(rest) => result = Some(rest.split(' ').map(str::to_string).collect()),
                    None => lines.push(line),
                }
            }
        }
        let status = child.wait().map(|s| s.code()).unwrap_or(None);
        // The receiver outlives every sender (the sweep waits for each child it started).
        let _ = done.send(Finished { seed, lines, result, status });
    });
}

/// Runs every seed in a child process, `args.jobs` at a time, collecting each as it finishes
/// (its lines are printed whole, in the order the seeds finish).
fn sweep(args: &Args) -> ExitCode {
    let started = Instant::now();
    let (mut failed, mut livelocked, mut differed) = (Vec::new(), Vec::new(), Vec::new());
    let mut sim_total_ms = 0u64;
    let mut pending = args.seeds.iter().copied();
    let (done_tx, done_rx) = mpsc::channel();
    let mut running = 0usize;
    loop {
        while running < args.jobs {
            let Some(seed) = pending.next() else { break };
            match spawn(seed, args) {
                Ok(c) => {
                    collect(seed, c, done_tx.clone());
                    running += 1;
                }
                Err(e) => {
                    eprintln!("seed {seed}: could not start a child process: {e}");
                    failed.push(seed);
                }
            }
        }
        if running == 0 {
            break;
        }
        let Ok(Finished { seed, lines, result, status }) = done_rx.recv() else { break };
        running -= 1;
        for line in lines {
            println!("{line}");
        }
        match (status, &result) {
            (Some(0), Some(r)) | (Some(1), Some(r)) => {
                sim_total_ms += r.get(2).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                if r.get(1).map(String::as_str) != Some("ok") {
                    failed.push(seed);
                }
                if r.len() > 4 && r[3] != r[4] {
                    differed.push(seed);
                }
            }
            (Some(LIVELOCK_EXIT), _) => livelocked.push(seed),
            _ => {
                println!(
                    "seed {seed}: the run died (status {status:?})\n    replay: {}",
                    replay_command(seed, args.knobs)
                );
                failed.push(seed);
            }
        }
    }
    failed.sort_unstable();
    livelocked.sort_unstable();
    differed.sort_unstable();
    println!(
        "{} seeds: {} failed, {} livelocked; {:.1} simulated s in {:.1} wall s",
        args.seeds.len(),
        failed.len(),
        livelocked.len(),
        sim_total_ms as f64 / 1000.0,
        started.elapsed().as_secs_f64()
    );
    if args.twice {
        println!("histories differed between two runs of the same seed for {} seeds: {differed:?}", differed.len());
    }
    for s in failed.iter().chain(&livelocked) {
        println!("  replay: {}", replay_command(*s, args.knobs));
    }
    if failed.is_empty() && livelocked.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    simulation::runner::init_tracing();
    if args.plan_only {
        for s in &args.seeds {
            print!("{}", Plan::generate(*s, args.knobs));
        }
        return ExitCode::SUCCESS;
    }
    if args.sweep {
        return sweep(&args);
    }
    if run_here(args.seeds[0], &args) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The C library's `getrandom(2)` wrapper, replaced in this executable by a fixed byte stream
/// (the same on every call): `buf` receives `len` bytes, the return value is `len`; `flags` is
/// ignored and the call never fails or blocks.
///
/// Why: std seeds every `HashMap`'s `RandomState` from this call, and dependencies on simulated
/// paths iterate such maps (hyper-util's connection pool sweeps its idle connections that way,
/// for one), so with OS keys the order things happen in after a restart varied from process to
/// process and about one seed in eight did not replay. Fixed keys make that order a function of
/// the run. This executable only simulates: nothing in it needs unpredictable hash keys or OS
/// randomness (openraft's draws are seeded by `runnev::raft::runtime::with_seed`; `rand` 0.8's
/// `thread_rng`, used outside that scope, reads the system call directly and is not affected).
/// The symbol is found because an executable's exported symbols come before the C library's.
///
/// # Safety
/// `buf` must point to `len` writable bytes, as `getrandom(2)` requires of its callers.
#[no_mangle]
pub unsafe extern "C" fn getrandom(buf: *mut u8, len: usize, _flags: u32) -> isize {
    if buf.is_null() || len == 0 {
        return 0;
    }
    // SAFETY: the caller guarantees `len` writable bytes at `buf` (non-null, checked above).
    let out = unsafe { std::slice::from_raw_parts_mut(buf, len) };
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in out {
        // A 64-bit LCG (Knuth's MMIX constants); only the high bits are used.
        x = x.wrapping_mul(0x5851_F42D_4C95_7F2D).wrapping_add(0x1405_7B7E_F767_814F);
        *b = (x >> 56) as u8;
    }
    isize::try_from(len).unwrap_or(isize::MAX)
}
