//! Backup and restore with real processes: `runnev backup` while publishes run is a consistent
//! cut, `runnev restore` lays out a new cluster that serves exactly the backed-up streams (seqs,
//! payloads, retention, evicted_through) on every node and continues each stream's seqs, and a
//! damaged or truncated backup is refused before anything is created.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use runnev::launcher::Ports;

/// `runnev restore` with these flags; the answer once it exits.
async fn restore(from: &str, data_dir: &str, id: &str, peers: &str) -> CliRun {
    cli(&["restore", "--from", from, "--data-dir", data_dir, "--id", id, "--peers", peers], &[]).await
}

fn seqs(batches: &[Batch]) -> Vec<u64> {
    batches.iter().map(|b| b.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_cluster_that_continues_every_stream() {
    let a = Cluster::start(3, &[]).await;
    let leader = a.leader().await;
    let base_a = a.url(leader);
    create_stream(&a.http, &base_a, "orders").await;
    let r = a.http.put(&format!("{base_a}/v1/streams/tiny"), Some(r#"{"retention":{"max_batches":5}}"#)).await;
    assert_eq!(r.expect("PUT tiny").status, 201);
    for i in 1..=20u64 {
        let r = a.http.post(&format!("{base_a}/v1/streams/tiny/batches"), payload("tiny", i)).await.expect("publish");
        assert_eq!(r.status, 201, "{}", r.describe());
    }
    for i in 1..=50u64 {
        let r = a.http.post(&format!("{base_a}/v1/streams/orders/batches"), payload("orders", i)).await.expect("pub");
        assert_eq!(r.status, 201, "{}", r.describe());
    }
    // Publishes go on while the backup is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (http, url, stop) = (a.http.clone(), format!("{base_a}/v1/streams/orders/batches"), stop.clone());
        tokio::spawn(async move {
            let mut acked = 0u64;
            let mut i = 51u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = http.post(&url, payload("orders", i)).await {
                    assert_eq!(r.status, 201, "{}", r.describe());
                    acked = r.json()["seq"].as_u64().expect("seq");
                    i += 1;
                }
            }
            acked
        })
    };
    wait_for("publishes under way", Duration::from_secs(20), Duration::from_millis(20), || {
        let (http, url) = (a.http.clone(), format!("{base_a}/v1/streams/orders"));
        async move {
            let last = http.get(&url).await?.json()["last_seq"].as_u64().unwrap_or(0);
            if last > 60 {
                Ok(())
            } else {
                Err(format!("last_seq {last}"))
            }
        }
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.backup");
    let nodes = a.urls().join(",");
    let r = cli(&["backup", file.to_str().unwrap(), "--nodes", &nodes], &[]).await;
    r.expect_code(0, "runnev backup under load");
    let said: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("JSON when not on a terminal");
    assert_eq!((said["streams"].as_u64(), said["file"].as_str()), (Some(2), file.to_str()), "{r:#?}");
    assert!(!dir.path().join("cluster.backup.partial").exists(), "the partial file is renamed away");
    // Readable by its owner only: it holds every payload and the tokens' salted hashes (it was
    // 0644; found by a fresh user's trial).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).expect("the backup").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the backup's mode is {mode:o}");
    stop.store(true, Ordering::Relaxed);
    let last_acked = load.await.expect("load task");
    let info = runnev::storage::backup::check(&file).expect("the saved backup checks out");
    assert_eq!(info.streams, 2, "{info:?}");

    // Damaged and truncated copies are refused, and nothing is created.
    let bytes = std::fs::read(&file).expect("read backup");
    let truncated = dir.path().join("truncated.backup");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).expect("write");
    let mut flipped = bytes.clone();
    let at = bytes.len() / 2;
    flipped[at] ^= 0x01;
    let damaged = dir.path().join("damaged.backup");
    std::fs::write(&damaged, &flipped).expect("write");
    for bad in [&truncated, &damaged] {
        let target = dir.path().join("never");
        let r = restore(bad.to_str().unwrap(), target.to_str().unwrap(), "1", "1=127.0.0.1:1").await;
        r.expect_code(1, "restore from a bad backup");
        assert!(r.stderr.contains("the backup is damaged or truncated"), "{r:#?}");
        assert!(!target.exists(), "nothing created for {}", bad.display());
    }
    // A missing backup file, and a data directory that is a file, are named as such (found by a
    // fresh user's trial: both said only "i/o: …"), and nothing is created or changed.
    let target = dir.path().join("never");
    let missing = dir.path().join("missing.backup");
    let r = restore(missing.to_str().unwrap(), target.to_str().unwrap(), "1", "1=127.0.0.1:1").await;
    r.expect_code(1, "restore from a missing file");
    assert!(r.stderr.contains(&format!("cannot read the backup file {}", missing.display())), "{r:#?}");
    assert!(!target.exists(), "nothing created for a missing backup");
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, b"kept").expect("write");
    let r = restore(file.to_str().unwrap(), a_file.to_str().unwrap(), "1", "1=127.0.0.1:1").await;
    r.expect_code(1, "restore into a file");
    assert!(r.stderr.contains("is not a directory"), "{r:#?}");
    assert_eq!(std::fs::read(&a_file).expect("read"), b"kept", "the file is unchanged");

    // A new cluster from the backup, on other ports.
    let base = free_base(3);
    let root = tempfile::Builder::new().prefix("runnev-test-").tempdir().expect("tempdir").keep();
    let peers = (0..3u16).map(|i| format!("{}=127.0.0.1:{}", i + 1, base + i)).collect::<Vec<_>>().join(",");
    for id in 1..=3u64 {
        let data = root.join(format!("node-{id}"));
        let r = restore(file.to_str().unwrap(), data.to_str().unwrap(), &id.to_string(), &peers).await;
        r.expect_code(0, "restore");
        // The start command it prints is whole: `serve` needs --listen too.
        let listen = format!("--listen 127.0.0.1:{} --peers {peers}", base + id as u16 - 1);
        assert!(r.stdout.contains(&listen), "{r:#?}");
    }
    let r = restore(file.to_str().unwrap(), root.join("node-1").to_str().unwrap(), "1", &peers).await;
    r.expect_code(1, "restore into a directory that is not empty");
    assert!(r.stderr.contains("is not empty"), "{r:#?}");

    // With the harness's security, each node is given an admin token file that does not exist:
    // the restored state has the old cluster's admin token, so a new one could never be the
    // cluster's, and none is written (a useless token file used to be; found by a fresh user's
    // trial). The cluster's tokens are the backup's: the harness's admin token still works.
    let mut lost_tokens = false;
    let b = Cluster::start_edited(3, &[], |spec| {
        spec.root = root.clone();
        spec.ports = Ports::Base(base);
        if let Some(i) = spec.serve_args.iter().position(|a| a == "--admin-token-file") {
            spec.serve_args[i + 1] = root.join("lost-{id}.token").display().to_string();
            lost_tokens = true;
        }
    })
    .await;
    let state = assert_identical(&b, &b.ids(), 1, "the restored cluster").await;
    if lost_tokens {
        for id in b.ids() {
            let lost = root.join(format!("lost-{id}.token"));
            assert!(!lost.exists(), "node {id} wrote {} for a restored state", lost.display());
            let log = std::fs::read_to_string(b.log_path(id)).expect("a node's log");
            assert!(log.contains("no new token written"), "{}", runnev::launcher::log_tail(&b.log_path(id), 20));
        }
    }
    let (orders_gap, orders) = &state.batches["orders"];
    assert_eq!(*orders_gap, None, "nothing was evicted from orders");
    let cut = orders.last().map_or(0, |x| x.seq);
    assert_eq!(seqs(orders), (1..=cut).collect::<Vec<_>>(), "a consistent cut: no seq above a missing one");
    assert!((50..=last_acked).contains(&cut), "the cut {cut} lies between 50 and the last acknowledged {last_acked}");
    for x in orders {
        assert_eq!(x.data, payload("orders", x.seq), "orders seq {} restored byte for byte", x.seq);
    }
    let (tiny_gap, tiny) = &state.batches["tiny"];
    assert_eq!((*tiny_gap, seqs(tiny)), (Some((1, 15)), (16..=20).collect::<Vec<_>>()), "retention and the gap");
    let tiny_info = state.streams.iter().find(|s| s["name"] == "tiny").expect("tiny listed");
    assert_eq!(tiny_info["evicted_through"], 15, "{tiny_info}");
    assert_eq!(tiny_info["retention"]["max_batches"], 5, "retention restored: {tiny_info}");
    // The new cluster serves the backup exactly as the old one served it at the cut.
    let a_state = assert_identical(&a, &a.ids(), 1, "the backed-up cluster").await;
    assert_eq!(a_state.batches["tiny"], state.batches["tiny"], "tiny on the old and the new cluster");
    assert_eq!(a_state.batches["orders"].1[..orders.len()], orders[..], "orders up to the cut");

    // The next publish on each stream continues after its last seq.
    let lb = b.leader().await;
    let r = b.http.post(&format!("{}/v1/streams/orders/batches", b.url(lb)), b"after".to_vec()).await.expect("pub");
    assert_eq!((r.status, r.json()["seq"].as_u64()), (201, Some(cut + 1)), "{}", r.describe());
    let r = b.http.post(&format!("{}/v1/streams/tiny/batches", b.url(lb)), b"after".to_vec()).await.expect("pub");
    assert_eq!((r.status, r.json()["seq"].as_u64()), (201, Some(21)), "{}", r.describe());
}

/// `runnev backup` just after its cluster's leader died fails over to a live node (it used to
/// ask the dead leader once, from a follower's view, and fail in milliseconds saying "within
/// 10s"; found by a fresh user's trial), and a path that is a directory is refused before the
/// cluster is asked, leaving nothing behind (it used to take the whole backup, fail at the
/// rename and leave `DIR.partial`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_fails_over_from_a_leader_that_just_died() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "orders").await;
    let r = c.http.post(&format!("{}/v1/streams/orders/batches", c.url(leader)), payload("orders", 1)).await;
    assert_eq!(r.expect("publish").status, 201);
    let nodes = c.urls().join(",");
    let dir = tempfile::tempdir().expect("tempdir");

    let r = cli(&["backup", dir.path().to_str().unwrap(), "--nodes", &nodes], &[]).await;
    r.expect_code(1, "backup to a directory");
    assert!(r.stderr.contains("is a directory"), "{r:#?}");
    assert!(!std::path::Path::new(&format!("{}.partial", dir.path().display())).exists(), "no partial file left");

    c.kill_9(leader);
    let file = dir.path().join("after-failover.backup");
    let r = cli(&["backup", file.to_str().unwrap(), "--nodes", &nodes], &[]).await;
    r.expect_code(0, "backup right after the leader died");
    let info = runnev::storage::backup::check(&file).expect("the saved backup checks out");
    assert_eq!((info.streams, info.batches), (1, 1), "{info:?}");
}
