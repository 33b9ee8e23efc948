//! A node raises its soft limit on open files to the hard limit at start, so that many streams'
//! payload segments stay open (docs/operations.md, "Many streams and open files"). Its own test
//! binary: it lowers this process's soft limit, which the nodes it starts inherit.

mod common;

use std::time::Duration;

use common::*;

/// The soft and hard "Max open files" of process `pid`, as `/proc/PID/limits` gives them.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc/PID/limits");
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("a Max open files line");
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_string(), fields[4].to_string())
}

#[tokio::test]
async fn a_node_raises_its_soft_open_file_limit_to_the_hard_one() {
    const LOWERED: u64 = 512;
    let (_, hard) = runnev::open_files::limits().expect("this process's open-file limits");
    if hard <= LOWERED {
        skipped(&format!("open_files: the hard open-file limit is {hard}, not above {LOWERED}: nothing to raise"));
        return;
    }
    let lowered = libc::rlimit { rlim_cur: LOWERED, rlim_max: hard };
    // SAFETY: setrlimit reads the `rlimit` it is given, which lives for the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0, "lowering this test's soft limit");

    let c = Cluster::start(1, &[]).await;
    let pid = c.node(1).pid().expect("node 1 runs");
    let hard = if hard == libc::RLIM_INFINITY { "unlimited".to_string() } else { hard.to_string() };
    assert_eq!(open_file_limits(pid), (hard.clone(), hard), "node 1's open-file limits");
    let log = wait_for("node 1 to log the raise", Duration::from_secs(10), Duration::from_millis(100), || async {
        let log = std::fs::read_to_string(&c.node(1).log_path).unwrap_or_default();
        match log.contains("raised the soft limit on open files") {
            true => Ok(log),
            false => Err(truncate(&log, 500)),
        }
    })
    .await;
    assert!(log.contains(&format!("from={LOWERED}")), "the log names the limit it found: {}", truncate(&log, 2000));

    c.http.put(&format!("{}/v1/streams/files", c.url(1)), None).await.expect("a stream");
    let ack = c.client().publish("files", None, "one").await.expect("a publish");
    assert_eq!(ack.seq, 1);
}
