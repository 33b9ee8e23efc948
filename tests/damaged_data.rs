//! A bit flipped on disk in a stored batch is detected and never served (data format 3: every
//! payload record in a payload segment carries a CRC-32 of its stream, seq, `ts`, log index and
//! payload). A real three-node cluster; one follower is stopped, a bit of a stored payload is
//! flipped in its payload segment, and it is started again.

mod common;

use std::time::Duration;

use common::*;

/// A payload no other bytes of the database repeat, so its copies in the file can be found.
fn marker(i: u64) -> Vec<u8> {
    format!("damaged-data-marker-{i:04}-{}", "m".repeat(200)).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bit_flipped_in_a_stored_batch_is_refused_never_served() {
    let mut c = Cluster::start(3, &[]).await;
    let client = c.client();
    client.put_stream("damaged", None).await.expect("create stream");
    const MARKED: u64 = 5;
    for i in 1..=MARKED {
        client.publish("damaged", Some(i), marker(i)).await.expect("publish a marked batch");
    }
    // More than `limits::SM_DURABLE_EVERY_ENTRIES` entries after them, so the state machine
    // holding the marked batches was committed durably and a restart does not apply them again
    // from the log (which would overwrite the damage with the log's good copy).
    let frames: Vec<Vec<u8>> = (0..10).map(|k| format!("filler-{k}").into_bytes()).collect();
    for i in 0..1_100u64 {
        let seq = MARKED + 1 + i * frames.len() as u64;
        client.publish_many("damaged", Some(seq), &frames).await.expect("publish filler");
    }
    let follower = c.followers().await[0];
    let last = 5 + 1_100 * 10;
    let base = c.url(follower);
    let http = c.http.clone();
    wait_for("the follower applied every batch", Duration::from_secs(30), Duration::from_millis(200), || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http.get(&format!("{base}/v1/streams/damaged")).await?;
            if r.status == 200 && r.json()["last_seq"].as_u64() == Some(last) {
                Ok(())
            } else {
                Err(r.describe())
            }
        }
    })
    .await;
    c.stop(follower).await;

    // Flip one bit in the middle of marked batch 3's payload in the follower's payload
    // segments (each payload is written there once).
    let payloads = c.node(follower).data_dir.join("groups/0/payloads");
    let needle = marker(3);
    let mut flipped = 0;
    for entry in std::fs::read_dir(&payloads).expect("read the payloads directory") {
        let path = entry.expect("a directory entry").path();
        let mut bytes = std::fs::read(&path).expect("read a payload segment");
        let mut at = 0;
        while let Some(pos) = bytes[at..].windows(needle.len()).position(|w| w == needle.as_slice()) {
            let hit = at + pos;
            bytes[hit + needle.len() / 2] ^= 0x04;
            flipped += 1;
            at = hit + needle.len();
        }
        std::fs::write(&path, &bytes).expect("write a payload segment");
    }
    assert_eq!(flipped, 1, "marked batch 3 once in {}", payloads.display());
    let mut damaged = marker(3);
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x04;

    c.restart(follower).await;
    // Read batches 1..=5 from the damaged node: never the damaged payload; the read of the page
    // holding batch 3 is refused.
    let url = format!("{base}/v1/streams/damaged/batches?after=0&limit=10");
    let r =
        wait_for("the restarted follower answers reads", Duration::from_secs(30), Duration::from_millis(200), || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.get(&url).await?;
                if r.status == 503 {
                    Err(r.describe())
                } else {
                    Ok(r)
                }
            }
        })
        .await;
    if r.status == 200 {
        for b in r.json()["batches"].as_array().expect("batches") {
            let data = unb64(b["data"].as_str().expect("data")).expect("base64");
            assert_ne!(data, damaged, "the damaged payload was served: {}", r.describe());
        }
        panic!("the page holding the damaged batch was served: {}", truncate(&r.text(), 400));
    }
    assert_eq!(r.status, 500, "{}", r.describe());
    assert!(r.text().contains("stream damaged, seq 3:") && r.text().contains("fails its checksum"), "{}", r.describe());
    // Below the damage the node still serves; the other nodes serve the batch intact.
    let r = http.get(&format!("{base}/v1/streams/damaged/batches?after=0&limit=2")).await.expect("read 1..=2");
    assert_eq!(r.status, 200, "{}", r.describe());
    let leader = c.leader().await;
    let r = http.get(&format!("{}/v1/streams/damaged/batches?after=2&limit=1", c.url(leader))).await.expect("read");
    let data = unb64(r.json()["batches"][0]["data"].as_str().expect("data")).expect("base64");
    assert_eq!(data, marker(3), "the leader's copy of batch 3");
}
