//! Three fresh processes form one cluster, elect one leader that all agree on, and a stream
//! created through a follower becomes visible on every node; a fresh cluster is small on disk.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_a_leader_and_replicate_a_stream() {
    let mut c = Cluster::start(3, &[]).await;
    let http = c.http.clone();

    // --- one leader, agreed by all, in one term -----------------------------------------
    let (leader, term) = c.wait_leader_agreed(Duration::from_secs(20)).await;
    assert!((1..=3).contains(&leader), "leader_id {leader} is not a member id");
    assert!(term >= 1, "term {term} of an elected leader should be >= 1");
    println!("leader: node {leader}, term {term}");

    for id in c.ids() {
        let r = http.get(&format!("{}/v1/cluster", c.url(id))).await.expect("GET /v1/cluster");
        assert_eq!(r.status, 200, "node {id}: {}", r.describe());
        assert_eq!(
            r.header("runnev-node").as_deref(),
            Some(id.to_string().as_str()),
            "node {id}: Runnev-Node header of a locally served GET /v1/cluster"
        );
        let v = r.json();
        assert_eq!(v["node_id"].as_u64(), Some(id), "node {id}: node_id in {v}");
        let members = v["members"].as_array().unwrap_or_else(|| panic!("node {id}: members is not an array: {v}"));
        assert_eq!(members.len(), 3, "node {id}: expected 3 members: {v}");
        for m in members {
            let mid = m["id"].as_u64().unwrap_or_else(|| panic!("member id in {m}"));
            assert_eq!(m["addr"].as_str(), Some(c.node(mid).addr().as_str()), "node {id}: member {mid} addr in {v}");
            assert_eq!(m["voter"].as_bool(), Some(true), "node {id}: member {mid} voter in {v}");
        }
        let mut ids: Vec<u64> = members.iter().filter_map(|m| m["id"].as_u64()).collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3], "node {id}: member ids in {v}");
    }

    // --- exactly one node thinks it is the leader --------------------------------------
    let mut self_leaders = Vec::new();
    for id in c.ids() {
        let v = c.cluster_info(id).await.unwrap();
        if v.leader_id == Some(id) {
            self_leaders.push(id);
        }
    }
    assert_eq!(self_leaders, vec![leader], "nodes reporting themselves as leader");

    // --- each node's formation answer names its vote: term and node (raft::vote_gate) ---
    let peer = Http::as_node(1);
    for id in c.ids() {
        let r = peer.get(&format!("{}/raft/formation", c.url(id))).await.expect("GET /raft/formation");
        assert_eq!(r.status, 200, "node {id}: {}", r.describe());
        let v = r.json();
        assert_eq!(v["state"], "member", "node {id}: {v}");
        assert_eq!((v["term"].as_u64(), v["voted_for"].as_u64()), (Some(term), Some(leader)), "node {id}: {v}");
    }

    // --- readiness --------------------------------------------------------------------
    for id in c.ids() {
        let url = format!("{}/readyz", c.url(id));
        wait_for(&format!("node {id} /readyz = 200"), Duration::from_secs(15), Duration::from_millis(100), || {
            let http = http.clone();
            let url = url.clone();
            async move {
                let r = http.get(&url).await?;
                if r.status == 200 {
                    Ok(())
                } else {
                    Err(r.describe())
                }
            }
        })
        .await;
    }

    // --- create a stream through a follower ------------------------------------------
    let follower = c.followers().await[0];
    let r = http.put(&format!("{}/v1/streams/formed", c.url(follower)), None).await.expect("PUT via follower");
    assert_eq!(r.status, 201, "PUT /v1/streams/formed via follower {follower}: {}", r.describe());
    assert!(r.header("runnev-node").is_some(), "no Runnev-Node header: {}", r.describe());
    let created = r.json();
    assert_eq!(created["name"], "formed", "created info: {created}");
    assert_eq!(created["last_seq"].as_u64(), Some(0), "created info: {created}");
    assert_eq!(created["first_seq"].as_u64(), Some(1), "empty stream: first_seq = last_seq + 1: {created}");
    assert_eq!(created["batches"].as_u64(), Some(0), "created info: {created}");
    assert_eq!(created["bytes"].as_u64(), Some(0), "created info: {created}");
    assert_eq!(created["evicted_through"].as_u64(), Some(0), "created info: {created}");

    // Creating it again (no body) leaves it unchanged: 200, same info.
    let other_follower = c.followers().await.into_iter().find(|f| *f != follower).unwrap();
    let r = http.put(&format!("{}/v1/streams/formed", c.url(other_follower)), None).await.expect("second PUT");
    assert_eq!(r.status, 200, "second PUT (unchanged) via node {other_follower}: {}", r.describe());
    assert_eq!(r.json(), created, "second PUT returned different info");

    // --- visible on every node (followers apply asynchronously: poll) -----------------
    for id in c.ids() {
        let url = format!("{}/v1/streams/formed", c.url(id));
        let list_url = format!("{}/v1/streams", c.url(id));
        let expected = created.clone();
        wait_for(
            &format!("stream 'formed' visible with the created info on node {id}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || {
                let (http, url, list_url, expected) = (http.clone(), url.clone(), list_url.clone(), expected.clone());
                async move {
                    let r = http.get(&url).await?;
                    if r.status != 200 {
                        return Err(r.describe());
                    }
                    if r.header("runnev-node").as_deref() != Some(id.to_string().as_str()) {
                        return Err(format!("Runnev-Node header of a local read: {:?}", r.header("runnev-node")));
                    }
                    let v = r.try_json().ok_or_else(|| r.describe())?;
                    if v != expected {
                        return Err(format!("info {v} != created {expected}"));
                    }
                    let l = http.get(&list_url).await?;
                    let lv = l.try_json().ok_or_else(|| l.describe())?;
                    let listed = lv["streams"].as_array().cloned().unwrap_or_default();
                    if l.status != 200 || !listed.contains(&expected) {
                        return Err(format!("GET /v1/streams: {}", l.describe()));
                    }
                    Ok(())
                }
            },
        )
        .await;
    }

    // A node that does not have the stream answers 404 stream_not_found for another name.
    let r = http.get(&format!("{}/v1/streams/not-there", c.url(follower))).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.describe());
    assert_eq!(r.error_code().as_deref(), Some("stream_not_found"), "{}", r.describe());

    // Still the same leader and term: nothing above may cause an election.
    let (leader2, term2) = c.wait_leader_agreed(Duration::from_secs(10)).await;
    assert_eq!(
        (leader2, term2),
        (leader, term),
        "creating a stream through followers changed the leader or the term (leader, term)"
    );
    for id in c.ids() {
        let v = c.cluster_info(id).await.expect("view");
        assert_eq!((v.leader_id, v.term), (Some(leader), term), "node {id}: {v}");
    }
}

/// Most disk a fresh three-node cluster with a handful of publishes may take, all nodes together,
/// in allocated bytes (the target "small by default": a test cluster must not take hundreds of
/// MiB).
const FRESH_CLUSTER_DISK_MAX: u64 = 30 * 1024 * 1024;

/// Every file under `dir` with the bytes the file system allocated to it (`st_blocks` × 512, what
/// `du` counts: preallocated space counts, holes do not).
fn allocated_files(dir: &Path, out: &mut Vec<(u64, PathBuf)>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        let m = std::fs::symlink_metadata(e.path()).unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
        if m.is_dir() {
            allocated_files(&e.path(), out);
        } else {
            out.push((m.blocks() * 512, e.path()));
        }
    }
}

/// A fresh cluster, one stream and 20 small publishes, replicated to every node: the three
/// data directories together take at most [`FRESH_CLUSTER_DISK_MAX`] of allocated blocks (the
/// Raft log's first segment, redb, the disk ballast and the rest, all counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cluster_with_a_few_publishes_is_small_on_disk() {
    const BATCHES: u64 = 20;
    let c = Cluster::start(3, &[]).await;
    let client = c.client();
    client.put_stream("small", None).await.expect("create the stream");
    for i in 0..BATCHES {
        client.publish("small", None, payload("small", i)).await.expect("publish");
    }
    // Followers apply asynchronously: wait until every node holds every batch.
    for id in c.ids() {
        let url = format!("{}/v1/streams/small", c.url(id));
        wait_for(
            &format!("node {id} has the {BATCHES} batches"),
            Duration::from_secs(10),
            Duration::from_millis(50),
            || {
                let (http, url) = (c.http.clone(), url.clone());
                async move {
                    let v = http.get(&url).await?.try_json().ok_or("no JSON")?;
                    if v["last_seq"].as_u64() == Some(BATCHES) {
                        Ok(())
                    } else {
                        Err(format!("{v}"))
                    }
                }
            },
        )
        .await;
    }
    let mut files = Vec::new();
    for id in c.ids() {
        allocated_files(&c.data_dir(id), &mut files);
    }
    let total: u64 = files.iter().map(|(b, _)| b).sum();
    files.sort_unstable_by(|a, b| b.cmp(a));
    let largest: Vec<String> = files.iter().take(8).map(|(b, p)| format!("{b} {}", p.display())).collect();
    println!("fresh cluster on disk: {total} bytes allocated; largest files:\n{}", largest.join("\n"));
    assert!(
        total <= FRESH_CLUSTER_DISK_MAX,
        "a fresh cluster takes {total} bytes of disk (at most {FRESH_CLUSTER_DISK_MAX}); largest files:\n{}",
        largest.join("\n")
    );
}
