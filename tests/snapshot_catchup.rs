//! A follower that was down (stopped, or paused while publishes went on) while the leader
//! snapshotted and purged the log entries it lacks catches up by installing a snapshot, and then
//! serves exactly what the others serve.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use serde_json::Value;

const STREAM: &str = "snap";

/// Acknowledged (seq, payload) pairs.
type Acked = Vec<(u64, Vec<u8>)>;

/// Publishes `count` batches (tag/ids from `from`) with some concurrency, round-robin over `urls`;
/// every answer must be 201. Returns the highest Raft index seen.
async fn publish_many(http: &Http, urls: &[String], tag: &str, from: u64, count: u64) -> u64 {
    let results: Vec<(u64, Result<Resp, String>)> = futures::stream::iter(from..from + count)
        .map(|i| {
            let http = http.clone();
            let url = format!("{}/v1/streams/{STREAM}/batches", urls[(i as usize) % urls.len()]);
            async move { (i, http.post(&url, Bytes::from(payload(tag, i))).await) }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut max_index = 0;
    for (i, r) in results {
        let r = r.unwrap_or_else(|e| panic!("publish {tag} #{i}: {e}"));
        assert_eq!(r.status, 201, "publish {tag} #{i}: {}", r.describe());
        max_index = max_index.max(r.json()["index"].as_u64().expect("index in publish answer"));
    }
    max_index
}

async fn applied(c: &Cluster, id: u64) -> Result<u64, String> {
    Ok(c.cluster_info(id).await?.applied_index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_catches_up_by_snapshot() {
    let mut c = Cluster::start(3, &["--snapshot-logs", "50", "--snapshot-keep-logs", "10"]).await;
    let http = c.http.clone();
    let leader = c.leader().await;
    let lagger = c.followers().await[0];
    let other = c.ids().into_iter().find(|i| *i != leader && *i != lagger).unwrap();
    println!("leader {leader}, follower to stop {lagger}, other follower {other}");

    create_stream(&http, &c.url(leader), STREAM).await;
    let idx1 = publish_many(&http, &c.urls(), "early", 0, 20).await;

    // Let the follower apply what was published so far, then take it down.
    let lag_applied = {
        let cr = &c;
        wait_for(
            &format!("node {lagger} to apply index {idx1}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            move || async move {
                let a = applied(cr, lagger).await?;
                if a >= idx1 {
                    Ok(a)
                } else {
                    Err(format!("applied {a}"))
                }
            },
        )
        .await
    };
    c.stop(lagger).await;
    println!("stopped node {lagger} at applied_index {lag_applied}");

    // Publish ~500 more through the two live nodes.
    let live = vec![c.url(leader), c.url(other)];
    let idx2 = publish_many(&http, &live, "late", 1000, 500).await;
    println!("published 500 more, up to index {idx2}");

    // The leader (whoever it is now) must have purged past what the stopped follower holds.
    let (leader_now, purged) = {
        let cr = &c;
        wait_for(
            &format!("the leader's purged_index to pass {lag_applied}"),
            Duration::from_secs(30),
            Duration::from_millis(200),
            move || async move {
                let l = cr.leader().await;
                let v = cr.cluster_info(l).await?;
                match v.purged_index {
                    Some(p) if p > lag_applied => Ok((l, p)),
                    _ => Err(format!(
                        "node {l}: snapshot_index {:?} purged_index {:?} applied_index {}",
                        v.snapshot_index, v.purged_index, v.applied_index
                    )),
                }
            },
        )
        .await
    };
    let leader_view = c.cluster_info(leader_now).await.unwrap();
    println!(
        "leader {leader_now}: snapshot_index {:?} purged_index {purged} applied_index {}",
        leader_view.snapshot_index, leader_view.applied_index
    );
    let target = {
        let cr = &c;
        wait_for(
            &format!("leader {leader_now} to apply index {idx2}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            move || async move {
                let a = applied(cr, leader_now).await?;
                if a >= idx2 {
                    Ok(a)
                } else {
                    Err(format!("applied {a}"))
                }
            },
        )
        .await
    };

    // Restart the follower: it has to install a snapshot to catch up.
    c.restart(lagger).await;
    let caught_up = {
        let cr = &c;
        wait_for(
            &format!("restarted node {lagger} to apply the leader's applied_index {target}"),
            Duration::from_secs(40),
            Duration::from_millis(200),
            move || async move {
                let v = cr.cluster_info(lagger).await?;
                if v.applied_index >= target {
                    Ok(v)
                } else {
                    Err(format!(
                        "applied_index {} snapshot_index {:?} purged_index {:?}",
                        v.applied_index, v.snapshot_index, v.purged_index
                    ))
                }
            },
        )
        .await
    };
    println!("restarted node {lagger} caught up: {caught_up}");

    let metrics = http.get(&format!("{}/metrics", c.url(lagger))).await.expect("GET /metrics");
    assert_eq!(metrics.status, 200, "{}", metrics.describe());
    let installed = prom_value(&metrics.text(), "runnev_snapshots_installed_total").unwrap_or_else(|| {
        panic!(
            "no runnev_snapshots_installed_total sample in /metrics of node {lagger}:\n{}",
            truncate(&metrics.text(), 3000)
        )
    });
    println!("node {lagger} runnev_snapshots_installed_total = {installed}");
    assert!(
        installed >= 1.0,
        "node {lagger} caught up past the leader's purged_index {purged} (it had applied only \
         {lag_applied}) but reports runnev_snapshots_installed_total = {installed}"
    );
    assert!(
        caught_up.snapshot_index.is_some(),
        "node {lagger} installed a snapshot but reports snapshot_index = {:?}",
        caught_up.snapshot_index
    );

    // It serves exactly the leader's stream.
    let from_leader = read_all(&http, &c.url(leader_now), STREAM, idx2, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| panic!("reading from leader {leader_now}: {e}"));
    let from_lagger = read_all(&http, &c.url(lagger), STREAM, idx2, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| panic!("reading from restarted node {lagger}: {e}"));
    assert_eq!(from_leader.len(), 520, "leader serves {} batches, 520 were published", from_leader.len());
    assert_eq!(from_leader.iter().map(|b| b.seq).collect::<Vec<_>>(), (1..=520).collect::<Vec<u64>>(), "leader seqs");
    assert_eq!(from_lagger.len(), from_leader.len(), "restarted follower batch count");
    for (x, y) in from_lagger.iter().zip(&from_leader) {
        assert!(x == y, "seq {}: restarted follower {x:?} != leader {y:?}", y.seq);
    }

    let info = |id: u64| {
        let http = http.clone();
        let url = format!("{}/v1/streams/{STREAM}", c.url(id));
        async move {
            let r = http.get(&url).await.expect("GET stream info");
            assert_eq!(r.status, 200, "node {id}: {}", r.describe());
            r.json()
        }
    };
    let li: Value = info(leader_now).await;
    let fi: Value = info(lagger).await;
    assert_eq!(fi, li, "stream info on restarted follower vs leader");
    assert_eq!(li["last_seq"].as_u64(), Some(520), "{li}");
}

/// A follower paused (SIGSTOP) while publishes go on, until the leader has purged its log past
/// what the follower holds, then resumed while they still go on: it installs a snapshot (its
/// `runnev_snapshots_installed_total` goes up), catches up, and then holds exactly what the
/// other nodes hold: the same streams, metadata and batches, every acknowledged batch among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_installs_a_snapshot_while_publishes_continue() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut c = Cluster::start(3, &["--snapshot-logs", "50", "--snapshot-keep-logs", "10"]).await;
    let leader = c.leader().await;
    let lagger = c.followers().await[0];
    let other = c.ids().into_iter().find(|i| *i != leader && *i != lagger).expect("a third node");
    create_stream(&c.http, &c.url(leader), STREAM).await;
    let installed = |c: &Cluster| {
        let (http, url) = (c.http.clone(), format!("{}/metrics", c.url(lagger)));
        async move {
            let r = http.get(&url).await?;
            Ok::<f64, String>(prom_value(&r.text(), "runnev_snapshots_installed_total").unwrap_or(0.0))
        }
    };
    let installed_before = installed(&c).await.expect("metrics");

    // A publisher through the two nodes that stay up, with its own seqs, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let publisher = {
        let (stop, acked) = (stop.clone(), acked.clone());
        let client = client_for(&[c.url(leader), c.url(other)]);
        tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let body = payload("live", seq);
                let ack =
                    client.publish(STREAM, Some(seq), body.clone()).await.expect("publish through the live nodes");
                assert_eq!(ack.seq, seq);
                acked.lock().unwrap().push((seq, body));
            }
        })
    };
    let acks_now = || acked.lock().unwrap().len();
    let wait_acks = |n: usize, what: &'static str| {
        let acked = acked.clone();
        async move {
            wait_for(what, Duration::from_secs(60), Duration::from_millis(10), || {
                let acked = acked.clone();
                async move {
                    let k = acked.lock().unwrap().len();
                    if k >= n {
                        Ok(())
                    } else {
                        Err(format!("{k} acknowledged"))
                    }
                }
            })
            .await
        }
    };
    wait_acks(20, "the first publishes").await;

    c.pause(lagger);
    // The leader reports how far it knows the paused follower's log matches its own; wait until
    // it has purged its log past that point, so only a snapshot can bring the follower back.
    let (matched, purged) = wait_for(
        "the leader to purge its log past the paused follower (liveness bound)",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            let c = &c;
            async move {
                let v = c.cluster_info(leader).await?;
                let matched = v.members.iter().find(|m| m.id == lagger).and_then(|m| m.matched_index).unwrap_or(0);
                match v.purged_index {
                    Some(p) if p > matched + 1 => Ok((matched, p)),
                    p => Err(format!("follower matched {matched}, leader purged {p:?}")),
                }
            }
        },
    )
    .await;
    eprintln!("node {lagger} paused at matched index {matched}; leader {leader} purged through {purged}");
    let at_resume = acks_now();
    c.resume(lagger);
    wait_for("the resumed follower to install a snapshot", Duration::from_secs(60), Duration::from_millis(50), || {
        let c = &c;
        async move {
            let now = installed(c).await?;
            if now > installed_before {
                Ok(())
            } else {
                Err(format!("runnev_snapshots_installed_total {now}"))
            }
        }
    })
    .await;
    // Publishing went on across the install; a few more, then stop.
    wait_acks(acks_now().max(at_resume) + 20, "publishes after the install").await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), publisher)
        .await
        .expect("liveness bound: the publisher stops")
        .expect("publisher task");
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    eprintln!("{} publishes acknowledged, {} of them after the resume", acked.len(), acked.len() - at_resume);
    let commit = c.leader_commit_index().await;
    let state = assert_identical(&c, &c.ids(), commit, "after the snapshot install").await;
    let (gap, batches) = &state.batches[STREAM];
    assert_eq!(*gap, None);
    let want: Acked = acked;
    let got: Vec<(u64, Vec<u8>)> = batches.iter().map(|b| (b.seq, b.data.clone())).collect();
    assert!(got == want, "the stream holds exactly the acknowledged batches ({} vs {})", got.len(), want.len());
    let view = c.cluster_info(lagger).await.expect("view");
    assert!(view.snapshot_index.is_some(), "node {lagger} installed a snapshot: {view}");
}

/// Issue 15: snapshots by bytes, not only by entry count. With `--snapshot-logs` far out of
/// reach, 3 MiB of payloads in a dozen entries make every node snapshot (and purge its log)
/// once 1 MiB was applied since the last one (fails without `--snapshot-log-bytes`: no
/// snapshot is ever taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_taken_by_bytes_applied_whatever_the_entry_count() {
    let c =
        Cluster::start(3, &["--snapshot-logs", "1000000", "--snapshot-keep-logs", "0", "--snapshot-log-bytes", "1MiB"])
            .await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), STREAM).await;
    let mut last = 0;
    for i in 0..12u8 {
        let r = c.http.post(&format!("{}/v1/streams/{STREAM}/batches", c.url(leader)), vec![i; 256 << 10]).await;
        let r = r.expect("publish");
        assert_eq!(r.status, 201, "{}", r.describe());
        last = r.json()["index"].as_u64().expect("index");
    }
    for id in c.ids() {
        let c = &c;
        let snapshot = wait_for(
            &format!("node {id} to snapshot by bytes"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async move {
                let v = c.cluster_info(id).await?;
                match v.snapshot_index {
                    Some(s) if s > 0 && v.purged_index.is_some() => Ok(s),
                    other => Err(format!("snapshot index {other:?}, purged {:?}", v.purged_index)),
                }
            },
        )
        .await;
        assert!(snapshot <= last, "node {id}: snapshot at {snapshot}, past the last entry {last}");
    }
}
