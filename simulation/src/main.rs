//! `cargo run -p simulation --release -- [--seeds N] [--start S] [--seed S] [--fault-ms MS]
//! [--twice] [--plan] [--history]`: sweeps seeds, or replays one; every failure prints the one
//! command that replays it. See `README.md`.

use std::process::ExitCode;
use std::time::Instant;

use simulation::{replay_command, run_seed, Knobs, Plan, RunReport};

struct Args {
    seeds: Vec<u64>,
    knobs: Knobs,
    twice: bool,
    plan_only: bool,
    history: bool,
}

const USAGE: &str =
    "usage: simulation [--seeds N [--start S]] [--seed S] [--fault-ms MS] [--twice] [--plan] [--history]";

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut count, mut start, mut one) = (None, 1u64, None);
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
            "--fault-ms" => knobs.fault_phase_ms = num(args.next(), "--fault-ms")?,
            "--twice" => twice = true,
            "--plan" => plan_only = true,
            "--history" => history = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let seeds = match (one, count) {
        (Some(s), _) => vec![s],
        (None, Some(n)) => (start..start + n).collect(),
        (None, None) => (start..start + 10).collect(),
    };
    Ok(Args { seeds, knobs, twice, plan_only, history })
}

fn summary(r: &RunReport, wall_s: f64) -> String {
    let s = &r.stats;
    format!(
        "seed {:>6} {}  sim {:>5.1} s  wall {:>5.1} s  publishes {} acks {} (dup {}) attempts {}  delivered {} gaps {}  faults {} crashes {} lost pages {}  rpc dup {} replay {}  digest {:016x}",
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
        s.rpc_duplicated,
        s.rpc_replayed,
        r.history_digest
    )
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
    let (mut failed, mut nondeterministic) = (Vec::new(), Vec::new());
    let (mut sim_total_ms, started) = (0u64, Instant::now());
    for &seed in &args.seeds {
        let t = Instant::now();
        let r = run_seed(seed, args.knobs);
        println!("{}", summary(&r, t.elapsed().as_secs_f64()));
        sim_total_ms += r.stats.sim_ms;
        if args.history || (args.seeds.len() == 1 && !r.violations.is_empty()) {
            println!("{}", Plan::generate(seed, args.knobs));
            for line in &r.history.fault_log {
                println!("  {line}");
            }
        }
        if !r.violations.is_empty() {
            for v in r.violations.iter().take(30) {
                println!("    {v}");
            }
            if r.violations.len() > 30 {
                println!("    … and {} more", r.violations.len() - 30);
            }
            println!("    replay: {}", r.replay_command());
            failed.push(seed);
        }
        if args.twice {
            let again = run_seed(seed, args.knobs);
            sim_total_ms += again.stats.sim_ms;
            let same = again.history_digest == r.history_digest;
            println!(
                "    determinism: plan {} , history {} ({:016x} vs {:016x})",
                if again.plan_digest == r.plan_digest { "same" } else { "DIFFERENT" },
                if same { "same" } else { "different" },
                r.history_digest,
                again.history_digest
            );
            if !same {
                nondeterministic.push(seed);
            }
        }
    }
    println!(
        "{} seeds, {} failed, {:.1} simulated s in {:.1} wall s",
        args.seeds.len(),
        failed.len(),
        sim_total_ms as f64 / 1000.0,
        started.elapsed().as_secs_f64()
    );
    if args.twice {
        println!(
            "histories differed between two runs of the same seed for {} seeds: {nondeterministic:?}",
            nondeterministic.len()
        );
    }
    for s in &failed {
        println!("  replay: {}", replay_command(*s, args.knobs));
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
