//! The simulation in CI: a fixed set of seeds, each run by the `simulation` binary in its own
//! process (so a livelock is reported by the watchdog instead of hanging the test run), and the
//! seeds that reproduced bugs, pinned as regression tests (fixed; run in release by scripts/test).
//!
//! `cargo test -p simulation` runs the CI seeds (debug build). Replay one with the command it
//! prints, e.g. `cargo run -p simulation --release -- --seed 2`.

use std::process::Command;

/// The CI seeds: plans without duplicated Raft RPCs (bug 3 needs them), each of which passed
/// eight release runs in a row. Bugs 1 and 2 can still strike any seed with crashes; if one of
/// these fails, its output names the invariant and the replay command.
///
/// Runs the simulation binary with `args`; returns whether it passed, and its output.
fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_simulation"))
        .args(args)
        .env("SIM_WATCHDOG_SECS", "120")
        .output()
        .expect("the simulation binary runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Runs `seed` (a classic plan, as the seeds below were found with); asserts it passed.
fn must_pass(seed: u64) {
    let (ok, out) = run(&["--seed", &seed.to_string(), "--classic"]);
    let summary: Vec<&str> = out.lines().filter(|l| l.starts_with("seed ")).collect();
    println!("{}", summary.join("\n"));
    assert!(ok, "seed {seed} failed:\n{out}");
}

/// A known bug's seed: passes only once the bug is fixed. Runs it `runs` times, which mattered
/// when a replay was not exact (README, "Determinism"); a seed now replays exactly.
fn must_pass_repeatedly(seed: u64, runs: usize) {
    for _ in 0..runs {
        must_pass(seed);
    }
}

macro_rules! ci_seeds {
    ($($name:ident => $seed:expr),* $(,)?) => {$(
        #[test]
        fn $name() {
            must_pass($seed);
        }
    )*};
}

/// Swarm seeds 1..=50 (every fault kind on in some, most kinds off in others; larger
/// workloads), swept two at a time, each in its own process, in release by `scripts/test`
/// (`cargo test -p simulation --release -- --ignored`). About a minute and a half on two cores.
#[test]
#[ignore = "a 50-seed sweep: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn swarm_seeds_1_to_50() {
    let (ok, out) = run(&["--seeds", "50", "--start", "1", "--jobs", "2"]);
    let tally = out.lines().filter(|l| l.contains(" seeds: ")).collect::<Vec<_>>().join("\n");
    println!("{tally}");
    assert!(ok && tally.contains("50 seeds: 0 failed, 0 livelocked"), "the sweep failed:\n{out}");
}

ci_seeds! {
    ci_seed_19 => 19,
    ci_seed_24 => 24,
    ci_seed_25 => 25,
    ci_seed_28 => 28,
    ci_seed_30 => 30,
    ci_seed_31 => 31,
    ci_seed_35 => 35,
    ci_seed_36 => 36,
}

/// Bug 1 (README, "Bugs found"): a crash after a snapshot is built but before the next durable
/// redb commit leaves `snapshot.bin` ahead of the durable state machine; on restart openraft
/// panics (`snapshot_last_log_id <= committed`) and the node never rejoins. Then bug 2 (the
/// write path spins when the Raft core has stopped) livelocks the run.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_4_snapshot_ahead_of_durable_state_machine() {
    must_pass_repeatedly(4, 3);
}

/// Bug 3 (README, "Bugs found"): with duplicated append-entries RPCs, a follower catching up
/// after a restart ends up with a hole in its stored log; the state machine applies the range
/// with the hole (skipping committed entries) and openraft then panics at
/// `raft_core.rs:779` (`applying_entries.next().unwrap()`). About one run in two or three.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_215_log_hole_after_duplicated_appends() {
    must_pass_repeatedly(215, 5);
}

/// Bug 3 again, with its consequences on what the node serves: a read with `min_index` that
/// misses an acknowledged batch and a subscriber that silently skips two seqs.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_160_log_hole_serves_a_silent_gap() {
    must_pass_repeatedly(160, 5);
}

/// Bug 4 (README, "Bugs found"): a follower that installed a snapshot and crashed before its old
/// log was purged restarts with a Raft core that quits on a defensive storage error
/// (`try to get log at index 38 but got Some(103)`) and never rejoins. Five runs in five.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_112_restart_after_snapshot_install_before_purge() {
    must_pass_repeatedly(112, 3);
}

/// Segment log (README, "Segment log: findings"): a truncation cut between its shrink and its
/// grow, then a rollover and a power loss, left a log that refused to open ("segment 45 starts
/// at index 45 after index 48"); one run in the 400-seed sweep that found it. The deterministic
/// reproduction is `a_truncation_cut_short_then_a_power_loss_leaves_a_log_that_opens`.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_324_truncation_cut_short_then_power_loss() {
    must_pass_repeatedly(324, 3);
}

/// A follower restarted on a stale log tail behind a newer purge point (README, "Segment log:
/// findings", 5): a crash cut n3's truncation of its uncommitted term-1 entries while a
/// snapshot of the new leader's entry 159 survived; at the restart the snapshot was restored,
/// the log kept term-1 entries 160..=162 behind the purge point T17-159 and reported a last
/// log id below it, openraft's next append was refused ("append of index 160 where Some(162)
/// was next") and n3's Raft core quit for good; n3 then looked ready and held reads past the
/// client's deadline. On 6f10ac6 one run in 2.4 fails (41 of 100, 53 of 130 with earlier
/// replays); 12 runs fail at least once with probability 1 - (1 - 0.33)^12 > 99% even at the
/// lower end of that rate's 95% interval (0.33). Deterministic reproductions:
/// `a_lost_truncation_behind_a_newer_purge_point_is_discarded_at_restart` and, in runnev,
/// `a_snapshot_restored_over_a_stale_log_tail_leaves_a_log_openraft_can_append_to`.
#[test]
#[ignore = "regression seed, slow in debug: scripts/test runs it in release (cargo test -p simulation --release -- --ignored)"]
fn regression_seed_200860_stale_log_tail_behind_a_newer_purge_point() {
    must_pass_repeatedly(200860, 12);
}
