//! A rolling upgrade under publish load, as docs/operations.md describes it: one node at a time,
//! followers first, each stopped with SIGTERM, started from the new executable on its own data
//! directory, and waited for on `/readyz` before the next. The new build here is a copy of this
//! one at another path (same protocol and data format: what a patch release is); the test checks
//! that every node ends up running it, that no acknowledged publish is lost, and that publishes
//! kept being acknowledged throughout (the longest stretch without one is bounded and printed).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A liveness bound, not a performance verdict: a stretch this long without any acknowledged
/// publish means the upgrade made the cluster unavailable.
const LONGEST_STALL_BOUND: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "roll").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let next = dir.path().join("runnev-next");
    std::fs::copy(BIN, &next).expect("copy the executable");

    let client = c.client();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut acked: Vec<(u64, Instant)> = Vec::new();
            let mut seq = 1u64;
            while !stop.load(Ordering::Relaxed) {
                match client.publish("roll", Some(seq), payload("roll", seq)).await {
                    Ok(ack) => {
                        assert_eq!(ack.seq, seq, "{ack:?}");
                        acked.push((seq, Instant::now()));
                        seq += 1;
                    }
                    // Unavailable past the client's own retry deadline: try the same seq again.
                    Err(e) => eprintln!("publish seq {seq}: {e}; retrying"),
                }
            }
            acked
        })
    };
    let started = Instant::now();
    let mut order = c.followers().await;
    order.push(leader);
    c.set_exe(&next);
    for id in order {
        c.stop(id).await;
        c.start_node(id).unwrap_or_else(|e| panic!("starting node {id} on the new build: {e}"));
        c.wait_ready(id, Duration::from_secs(60)).await.unwrap_or_else(|e| panic!("node {id} after upgrade: {e}"));
        let pid = c.node(id).pid().expect("running");
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the node's executable");
        assert_eq!(exe, next, "node {id} runs the new build");
    }
    // A little load on the upgraded cluster too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let acked = load.await.expect("load task");
    let upgrade_took = started.elapsed();
    assert!(!acked.is_empty(), "publishes were acknowledged");
    let mut longest = Duration::ZERO;
    let mut prev = started;
    for (_, at) in &acked {
        longest = longest.max(at.duration_since(prev));
        prev = *at;
    }
    eprintln!(
        "rolling upgrade of 3 nodes took {upgrade_took:?}; {} publishes acknowledged; longest stretch without an \
         acknowledgement {longest:?}",
        acked.len()
    );
    assert!(longest < LONGEST_STALL_BOUND, "no publish acknowledged for {longest:?} during the upgrade");

    let last = acked.last().map_or(0, |(s, _)| *s);
    let index = c.leader_commit_index().await;
    let state = assert_identical(&c, &c.ids(), index, "after the rolling upgrade").await;
    let (gap, batches) = &state.batches["roll"];
    assert_eq!(*gap, None);
    let served: Vec<u64> = batches.iter().map(|b| b.seq).collect();
    // The load's last attempt may have failed at the client yet be stored: seq last + 1 at most.
    let stored = served.last().copied().unwrap_or(0);
    assert!(stored == last || stored == last + 1, "stored through {stored}, acknowledged through {last}");
    assert_eq!(served, (1..=stored).collect::<Vec<_>>(), "every acknowledged seq, once, in order");
    for b in batches {
        assert_eq!(b.data, payload("roll", b.seq), "seq {} byte for byte", b.seq);
    }
}

/// Lays a stopped node's data directory out as a build of data format 4 left it: group 0's
/// files at the top of the directory (no `groups/`), `FORMAT` saying 4.
fn as_format_4(data_dir: &std::path::Path) {
    let group = data_dir.join("groups").join("0");
    for entry in std::fs::read_dir(&group).expect("the group's directory") {
        let entry = entry.expect("an entry");
        std::fs::rename(entry.path(), data_dir.join(entry.file_name())).expect("move to the top");
    }
    std::fs::remove_dir_all(data_dir.join("groups")).expect("remove groups/");
    std::fs::write(data_dir.join("FORMAT"), "runnev data format 4\n").expect("write FORMAT");
}

/// Issue 15, "room for many Raft groups": a cluster whose data directories are of format 4
/// (group 0's files at their top) is upgraded one node at a time, each started on its old
/// directory, while the others already run on format 5: each node moves its files into
/// `groups/0/`, marks the directory 5, and comes back with everything it held (log, state
/// machine, snapshot); every batch published before and during the upgrade reads back the
/// same on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_data_format_4_is_upgraded_one_node_at_a_time() {
    // Snapshots every 20 entries: each directory holds a snapshot file to move as well.
    let mut c = Cluster::start(3, &["--snapshot-logs", "20", "--snapshot-keep-logs", "5"]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "old").await;
    let client = c.client();
    for seq in 1..=60 {
        client.publish("old", Some(seq), payload("old", seq)).await.expect("publish before the upgrade");
    }
    let mut order = c.followers().await;
    order.push(c.leader().await);
    let mut next = 61;
    for id in order {
        c.stop(id).await;
        let dir = c.node(id).data_dir.clone();
        assert!(dir.join("groups/0/snapshot.bin").exists(), "node {id} took a snapshot before the upgrade");
        as_format_4(&dir);
        c.restart(id).await;
        c.wait_ready(id, Duration::from_secs(60)).await.unwrap_or_else(|e| panic!("node {id} after upgrade: {e}"));
        assert_eq!(std::fs::read_to_string(dir.join("FORMAT")).expect("FORMAT"), "runnev data format 5\n");
        for name in ["log", "payloads", "runnev.redb", "snapshot.bin"] {
            assert!(!dir.join(name).exists(), "node {id}: {name} is still at the top of its data directory");
            assert!(dir.join("groups/0").join(name).exists(), "node {id}: {name} is not in groups/0");
        }
        for _ in 0..10 {
            client.publish("old", Some(next), payload("old", next)).await.expect("publish during the upgrade");
            next += 1;
        }
    }
    let index = c.leader_commit_index().await;
    let state = assert_identical(&c, &c.ids(), index, "after the upgrade from format 4").await;
    let (gap, batches) = &state.batches["old"];
    assert_eq!(*gap, None);
    assert_eq!(batches.iter().map(|b| b.seq).collect::<Vec<_>>(), (1..next).collect::<Vec<_>>());
    for b in batches {
        assert_eq!(b.data, payload("old", b.seq), "seq {} byte for byte", b.seq);
    }
}
