//! `runnev bench failover | restart | catchup | membership | publish --rate | streams |
//! subscribers | disk`, run as the real binary in small configurations: each finishes, prints
//! sane JSON summaries, loses nothing, and leaves no directory behind.
//!
//! `runnev bench` runs the `runnev-bench` executable from beside `runnev` (another workspace
//! member, which cargo builds for these tests only when asked): the tests build it first, for the
//! same profile as `runnev` (a no-op when it is up to date).

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use runnev::launcher::log_tail;
use serde_json::Value;

/// Builds `runnev-bench` beside `runnev` (once per test process).
fn build_runnev_bench() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let profile_dir = Path::new(BIN).parent().and_then(Path::file_name).and_then(|d| d.to_str());
        let mut cargo = std::process::Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "runnev-bench", "--bin", "runnev-bench"]);
        // What cargo set for this test's own crate would make build scripts that watch it (ring's
        // watches CARGO_MANIFEST_DIR) rebuild, each time, what the outer build just built.
        const OWN: [&str; 7] = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ];
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(|k| OWN.iter().any(|p| k.starts_with(p))) {
                cargo.env_remove(key);
            }
        }
        match profile_dir {
            Some("debug") | None => {}
            Some(profile) => {
                cargo.args(["--profile", profile]);
            }
        }
        let status = cargo.status().expect("run cargo build -p runnev-bench");
        assert!(status.success(), "cargo build -p runnev-bench failed: {status}");
    });
}

/// Runs `runnev ARGS` (bounded by `timeout`); panics with its output unless it exits 0.
/// Returns the JSON lines of its stdout.
async fn bench(args: &[&str], timeout: Duration) -> Vec<Value> {
    build_runnev_bench();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args).kill_on_drop(true);
    if args.contains(&"--nodes") {
        // Against a harness cluster: its CA and token (bench's own clusters need none).
        cmd.envs(cli_security_env());
    }
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("runnev {} did not finish within {timeout:?}", args.join(" ")))
        .expect("run runnev");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "runnev {} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}\n{}",
        args.join(" "),
        out.status,
        kept_logs(&stderr)
    );
    stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line {l:?} is not JSON: {e}\nstderr:\n{stderr}"))
        })
        .collect()
}

/// The tails of the node logs a failed bench kept (it names the directory on stderr: "kept under
/// DIR"), so the failure shows why a node failed even once the test's directory is removed.
fn kept_logs(stderr: &str) -> String {
    let Some(dir) = stderr.lines().find_map(|l| l.split_once("kept under ").map(|(_, d)| d.trim().to_string())) else {
        return String::new();
    };
    let mut out = String::new();
    let mut logs: Vec<_> = std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    logs.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|x| x == "log"));
    logs.sort();
    for log in logs {
        out.push_str(&format!("----- {} (last 60 lines) -----\n{}\n", log.display(), log_tail(&log, 60)));
    }
    out
}

fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "the bench left {left:?} behind");
}

/// Runs `runnev ARGS --json --dir TMP` for a mode that starts its own cluster under a fresh TMP,
/// and checks that it left nothing there; returns its JSON lines.
async fn bench_own(args: &[&str], timeout: Duration) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let lines = bench(&[args, &["--json", "--dir", d]].concat(), timeout).await;
    assert_empty(dir.path());
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_two_kill_trials_lose_nothing() {
    let lines = bench_own(&["bench", "failover", "--trials", "2"], Duration::from_secs(90)).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    assert_eq!(v["mode"], "failover");
    assert_eq!(v["trials"], 2, "{v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert!(v["acked"].as_u64().unwrap() > 0, "{v}");
    let windows = v["windows_ms"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "{v}");
    for w in windows {
        // Above zero, and below the client's give-up time: the cluster recovered each time.
        let w = w.as_f64().unwrap();
        assert!(w > 0.0 && w < 60_000.0, "{v}");
    }
    assert!(v["median_ms"].as_f64().unwrap() > 0.0, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_a_small_fill_reports_both_signals() {
    let lines =
        bench_own(&["bench", "restart", "--fill-bytes", "8MiB", "--payload-bytes", "256K"], Duration::from_secs(90))
            .await;
    assert_eq!(lines.len(), 2, "one summary per signal: {lines:?}");
    for (v, signal) in lines.iter().zip(["kill", "term"]) {
        assert_eq!(v["mode"], "restart");
        assert_eq!(v["signal"], signal, "{v}");
        assert!(v["fill_bytes"].as_u64().unwrap() >= 8 << 20, "{v}");
        let ready = v["ready_ms"].as_f64().unwrap();
        assert!(ready > 0.0, "{v}");
        assert!(v["caught_up_ms"].as_f64().unwrap() >= ready - 1.0, "{v}");
        assert!(v["data_dir_bytes"].as_u64().unwrap() > 8 << 20, "a follower holds the fill: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_reads_the_whole_stream_from_a_follower() {
    let c = Cluster::start(3, &[]).await;
    let nodes = c.urls().join(",");
    let lines = bench(
        &["bench", "catchup", "--nodes", &nodes, "--batches", "2000", "--payload-bytes", "512", "--json"],
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(lines.len(), 2, "poll and sse: {lines:?}");
    for (v, method) in lines.iter().zip(["poll", "sse"]) {
        assert_eq!(v["mode"], "catchup");
        assert_eq!(v["method"], method, "{v}");
        assert_eq!(v["batches"], 2000, "{v}");
        assert_eq!(v["bytes"], 2000 * 512, "{v}");
        assert_eq!(v["follower"], true, "{v}");
        assert_ne!(v["node_id"], v["leader_id"], "{v}");
        assert!(v["mb_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    }
    // A second run reuses the stream: nothing to publish, the same 2000 batches read.
    let again = bench(
        &["bench", "catchup", "--nodes", &nodes, "--batches", "2000", "--skip-sse", "--json"],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["batches"], 2000, "{}", again[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_one_round_loses_nothing() {
    let lines = bench_own(&["bench", "membership", "--rounds", "1"], Duration::from_secs(120)).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    assert_eq!(v["mode"], "membership");
    assert_eq!(v["changes"], 4, "two adds and two removes: {v}");
    assert_eq!(v["lost"], 0, "{v}");
    assert!(v["acked"].as_u64().unwrap() > 0, "{v}");
    let details = v["change_details"].as_array().unwrap();
    let actions: Vec<(&str, u64)> =
        details.iter().map(|c| (c["action"].as_str().unwrap(), c["node"].as_u64().unwrap())).collect();
    assert_eq!(actions, vec![("add", 4), ("add", 5), ("remove", 4), ("remove", 5)], "{v}");
    for c in details {
        // Non-negative figures; their size is what the benchmark reports, not a verdict.
        assert!(c["change_ms"].as_f64().unwrap() >= 0.0 && c["longest_pause_ms"].as_f64().unwrap() >= 0.0, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_publish_and_many_streams_against_a_cluster() {
    let c = Cluster::start(3, &[]).await;
    let nodes = c.urls().join(",");
    let args = ["--nodes", &nodes, "--concurrency", "16", "--json", "--quiet"];
    let open =
        bench(&[&["bench", "publish", "--rate", "200", "--count", "200"], &args[..]].concat(), Duration::from_secs(90))
            .await;
    assert_eq!(open.len(), 1, "{open:?}");
    let v = &open[0];
    assert_eq!((v["published"].as_u64(), v["errors"].as_u64()), (Some(200), Some(0)), "{v}");
    assert_eq!(v["rate"], 200.0, "{v}");
    assert!(v["behind_schedule"].as_u64().is_some_and(|b| b <= 200), "{v}");
    let (p99, p999, max) =
        (v["p99_ms"].as_f64().unwrap(), v["p999_ms"].as_f64().unwrap(), v["max_ms"].as_f64().unwrap());
    assert!(0.0 < p99 && p99 <= p999 && p999 <= max, "{v}");

    let runs = bench(
        &[&["bench", "streams", "--many-streams", "40", "--count", "200"], &args[..]].concat(),
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(runs.len(), 3, "one run on one stream, one on many, then the ratio: {runs:?}");
    let streams: Vec<u64> = runs[..2].iter().map(|r| r["streams"].as_u64().unwrap()).collect();
    assert_eq!(streams, vec![1, 40], "{runs:?}");
    assert!(runs[..2].iter().all(|r| r["published"] == 200 && r["errors"] == 0), "{runs:?}");
    let summary = &runs[2];
    assert_eq!((&summary["mode"], &summary["many_streams"]), (&"streams".into(), &40.into()), "{summary}");
    assert!(summary["ratio"].as_f64().unwrap() > 0.0, "{summary}");
    // Every one of the 40 streams got publishes: 40 workers' worth of streams from 16 workers.
    let http = c.http.clone();
    for i in 0..40 {
        let r = http.get(&format!("{}/v1/streams/bench-{i}", c.url(c.leader().await))).await.unwrap();
        assert!(r.json()["last_seq"].as_u64().unwrap() >= 1, "stream bench-{i}: {}", r.describe());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_each_get_every_batch_and_memory_is_read() {
    let lines = bench_own(
        &["bench", "subscribers", "--subscribers", "20", "--rate", "50", "--duration-secs", "2"],
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    let published = v["published"].as_u64().unwrap();
    assert!(published > 0, "{v}");
    assert_eq!(v["complete"], 20, "{v}");
    assert_eq!(v["delivered"].as_u64(), Some(20 * published), "each subscriber got each batch once: {v}");
    for k in ["rss_before_kib", "rss_idle_kib", "rss_end_kib", "rss_peak_kib"] {
        assert!(v[k].as_u64().unwrap() > 0, "{k}: {v}");
    }
    assert!(v["rss_peak_kib"].as_u64() >= v["rss_end_kib"].as_u64(), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_reports_fresh_filled_and_snapshotted() {
    let lines = bench_own(
        &[
            "bench",
            "disk",
            "--fill-bytes",
            "1MiB",
            "--concurrency",
            "8",
            // A snapshot cycle within a few hundred entries: the fill is about 700.
            "--snapshot-logs",
            "300",
            "--snapshot-keep-logs",
            "50",
        ],
        Duration::from_secs(240),
    )
    .await;
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, vec!["fresh", "filled", "snapshotted"], "{lines:?}");
    assert_eq!(lines[0]["payload_bytes"], 0, "{}", lines[0]);
    let node_bytes = |l: &Value| -> Vec<u64> {
        l["nodes"].as_array().unwrap().iter().map(|n| n["bytes"].as_u64().unwrap()).collect()
    };
    let (fresh, filled) = (node_bytes(&lines[0]), node_bytes(&lines[1]));
    assert!(fresh.iter().zip(&filled).all(|(f, g)| g > f), "every node grew with the fill: {fresh:?} {filled:?}");
    for l in &lines[1..] {
        assert_eq!(l["payload_bytes"].as_u64(), Some(1 << 20), "{l}");
        assert!(l["bytes_per_payload_byte"].as_f64().unwrap() > 0.0, "{l}");
    }
    for node in lines[2]["nodes"].as_array().unwrap() {
        let entries = node["entries"].as_object().unwrap();
        let sum: u64 = entries.values().map(|b| b.as_u64().unwrap()).sum();
        assert_eq!(node["bytes"].as_u64(), Some(sum), "the entries add up: {node}");
        assert!(entries.keys().any(|k| k.contains("snapshot")), "a snapshot after the cycle: {node}");
    }
}
