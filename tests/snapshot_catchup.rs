//! A follower that was down while the leader snapshotted and purged the log entries it lacks
//! catches up by installing a snapshot, and then serves exactly the leader's stream.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use serde_json::Value;

const STREAM: &str = "snap";

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
