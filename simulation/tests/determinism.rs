//! What a seed fixes, checked: the plan (cluster settings, workload, fault schedule) and every
//! publisher's sequence of intents (seqs and payloads) are functions of the seed alone, a run
//! follows them, and two runs of a seed, each in its own process, observe the same history
//! (equal digests): openraft's election timeouts are drawn from the seed
//! (`runnev::raft::runtime::with_seed`) and every host's tokio runtime is seeded by turmoil
//! (`--cfg tokio_unstable`, set in `.cargo/config.toml`). Two runs in one process are not
//! compared: tokio's task ids come from a process-wide counter and order a crashed host's task
//! teardown (README, "Determinism").

use simulation::history::{History, Publisher};
use simulation::{run_seed, Knobs, Plan};

const SEED: u64 = 11;
const KNOBS: Knobs = Knobs {
    fault_phase_ms: 8_000,
    swarm: true,
    membership: false,
    deletes: false,
    wipes: false,
    replace_after_ms: 3_000,
};

/// Every workload publisher's recorded publishes are a prefix of its planned intents: one
/// record per batch (a frames publish records each of its batches), on the intent's stream,
/// with the seqs the intents fix (per stream, holes and frames included).
fn follows_its_intents(plan: &Plan, h: &History) {
    for spec in &plan.publishers {
        let recorded: Vec<_> = h.publishes.iter().filter(|p| p.publisher == Publisher::Workload(spec.id)).collect();
        assert!(!recorded.is_empty(), "pub{} published nothing", spec.id);
        let streams: Vec<&str> = std::iter::once(spec.stream)
            .chain(spec.more_streams.iter().copied())
            .map(|i| plan.streams[i].name.as_str())
            .collect();
        let mut seqs = vec![0u64; streams.len()];
        let mut records = recorded.iter();
        'intents: for intent in plan.intents(spec.id) {
            let first = seqs[intent.stream_slot] + intent.seq_step;
            let frames = std::iter::once(&intent.payload).chain(&intent.more_frames);
            for (k, payload) in frames.enumerate() {
                let Some(p) = records.next() else { break 'intents };
                assert_eq!(&p.payload, payload, "pub{} strayed from its intents", spec.id);
                assert_eq!(p.stream, streams[intent.stream_slot]);
                let want = spec.with_seq.then_some(first + k as u64);
                assert_eq!(p.seq, want);
            }
            seqs[intent.stream_slot] = first + intent.more_frames.len() as u64;
        }
    }
}

/// The fault schedule as applied: every planned fault started at its planned time.
fn follows_its_schedule(plan: &Plan, h: &History) {
    for (i, f) in plan.faults.iter().filter(|f| f.at_ms < plan.knobs.fault_phase_ms).enumerate() {
        let line = format!("{:>7} ms start #{i}:", f.at_ms);
        assert!(h.fault_log.iter().any(|l| l.starts_with(&line)), "fault #{i} did not start at {} ms", f.at_ms);
    }
}

#[test]
fn a_seed_fixes_its_plan_intents_and_schedule() {
    let plan = Plan::generate(SEED, KNOBS);
    let a = run_seed(SEED, KNOBS);
    let b = run_seed(SEED, KNOBS);
    assert_eq!(a.plan_digest, plan.digest());
    assert_eq!(a.plan_digest, b.plan_digest);
    for r in [&a, &b] {
        follows_its_intents(&plan, &r.history);
        follows_its_schedule(&plan, &r.history);
    }
}

/// A seed replays exactly: `simulation --seed S --twice` runs the seed, then again in a new
/// process (as a replay does), and both runs observe the same history, digest for digest. Each
/// seed runs in its own process so that a livelock is reported by the watchdog instead of
/// hanging the test. A 10 s fault phase and classic plans (smaller workloads) keep it quick in
/// debug; seeds 2 and 7 crash nodes in it, seed 11 does not; swarm seed 15 runs the second
/// round's faults (a slow disk, a full disk and
/// the node's restart, a clock jump on the leader). Without the seeded election timeouts and
/// tokio runtimes every seed tried gave two digests.
#[test]
fn seeds_replay_exactly() {
    for (seed, swarm) in [(11u64, false), (2, false), (7, false), (15, true), (6, true)] {
        let seed_arg = seed.to_string();
        let mut args = vec!["--seed", &seed_arg, "--fault-ms", "10000", "--twice"];
        if !swarm {
            args.push("--classic");
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_simulation"))
            .args(&args)
            .env("SIM_WATCHDOG_SECS", "120")
            .output()
            .expect("the simulation binary runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let result: Vec<&str> = text
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("seed {seed}: no RESULT line:\n{text}"))
            .split(' ')
            .collect();
        assert_eq!(result.len(), 5, "seed {seed}: RESULT <seed> <ok|fail> <sim_ms> <digest> <digest>:\n{text}");
        assert_eq!(result[3], result[4], "seed {seed}: two runs observed different histories:\n{text}");
    }
}

/// A seed replays the same history with logs on as without: the sweep that finds a failure
/// runs without `RUST_LOG`, the diagnosis with it. Seed 40331 diverged when the log subscriber
/// was installed only with `RUST_LOG` set (`runner::init_tracing`: std's hash map keys count
/// the maps created before). Release only (a swarm seed, slow in debug).
#[test]
#[ignore = "a swarm seed, slow in debug: scripts/test runs it in the sim profile (cargo test -p simulation --profile sim -- --ignored)"]
fn a_seed_replays_the_same_with_logs_on() {
    let run = |log: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_simulation"));
        cmd.args(["--seed", "40331"]).env("SIM_WATCHDOG_SECS", "120").env_remove("RUST_LOG");
        if let Some(filter) = log {
            cmd.env("RUST_LOG", filter);
        }
        let out = cmd.output().expect("the simulation binary runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let result = text.lines().find_map(|l| l.strip_prefix("RESULT ")).map(str::to_string);
        result.unwrap_or_else(|| panic!("no RESULT line:\n{text}"))
    };
    let quiet = run(None);
    let logged = run(Some("info"));
    assert!(quiet.starts_with("40331 ok "), "seed 40331 must pass: {quiet}");
    assert_eq!(quiet, logged, "the same seed, with and without logs, observed different histories");
}
