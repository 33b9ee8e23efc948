//! 1,000 batches published with concurrency 16, round-robin over all three nodes; every node
//! then serves exactly seqs 1..=1000 with the published bytes, identically.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use futures::StreamExt;

const N: u64 = 1000;
const CONCURRENCY: usize = 16;
const STREAM: &str = "s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_publishes_read_back_identically_everywhere() {
    let c = Cluster::start(3, &[]).await;
    let http = c.http.clone();
    let urls = c.urls();

    create_stream(&http, &urls[0], STREAM).await;

    let started = Instant::now();
    let results: Vec<(u64, Vec<u8>, Result<Resp, String>)> = futures::stream::iter(0..N)
        .map(|i| {
            let http = http.clone();
            let url = format!("{}/v1/streams/{STREAM}/batches", urls[(i % 3) as usize]);
            async move {
                let p = payload("readback", i);
                let r = http.post(&url, Bytes::from(p.clone())).await;
                (i, p, r)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let elapsed = started.elapsed();
    println!("published {N} batches in {elapsed:?} ({:.0}/s)", N as f64 / elapsed.as_secs_f64());

    // Every publish answered 201 {"seq", "ts", "duplicate": false, "index"}.
    let mut seq_to_payload: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut seq_to_ts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut max_index = 0u64;
    let mut failures = Vec::new();
    for (i, p, r) in &results {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("publish #{i} to node {}: {e}", i % 3 + 1));
                continue;
            }
        };
        if r.status != 201 {
            failures.push(format!("publish #{i} to node {}: {}", i % 3 + 1, r.describe()));
            continue;
        }
        let v = r.json();
        let (Some(seq), Some(ts), Some(index)) = (v["seq"].as_u64(), v["ts"].as_u64(), v["index"].as_u64()) else {
            failures.push(format!("publish #{i}: answer without u64 seq/ts/index: {v}"));
            continue;
        };
        if v["duplicate"] != serde_json::json!(false) {
            failures.push(format!("publish #{i}: duplicate should be false: {v}"));
        }
        if r.header("runnev-node").is_none() {
            failures.push(format!("publish #{i}: no Runnev-Node header"));
        }
        if let Some(prev) = seq_to_payload.insert(seq, p.clone()) {
            failures.push(format!(
                "seq {seq} acknowledged twice (publish #{i} and a payload starting {:?})",
                String::from_utf8_lossy(&prev[..prev.len().min(20)])
            ));
        }
        seq_to_ts.insert(seq, ts);
        max_index = max_index.max(index);
    }
    assert!(
        failures.is_empty(),
        "{} of {N} publishes failed; first ones:\n{}",
        failures.len(),
        failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    let expected_seqs: Vec<u64> = (1..=N).collect();
    assert_eq!(
        seq_to_payload.keys().copied().collect::<Vec<_>>(),
        expected_seqs,
        "publish answers' seqs are not exactly 1..={N}"
    );

    // Read back from every node, waiting (min_index) for it to have applied every publish.
    let published: BTreeSet<Vec<u8>> = results.iter().map(|(_, p, _)| p.clone()).collect();
    let mut per_node: Vec<(u64, Vec<Batch>)> = Vec::new();
    for id in c.ids() {
        let batches = read_all(&http, &c.url(id), STREAM, max_index, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("reading stream from node {id}: {e}"));
        let seqs: Vec<u64> = batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs.len() as u64, N, "node {id}: read {} batches, expected {N}", seqs.len());
        assert_eq!(seqs, expected_seqs, "node {id}: seqs are not exactly 1..={N}");
        let got: BTreeSet<Vec<u8>> = batches.iter().map(|b| b.data.clone()).collect();
        assert_eq!(got.len() as u64, N, "node {id}: payloads are not distinct");
        assert!(got == published, "node {id}: the set of payloads differs from what was published");
        for b in &batches {
            assert_eq!(
                Some(&b.data),
                seq_to_payload.get(&b.seq),
                "node {id}: seq {} does not hold the payload its publish answer named",
                b.seq
            );
            assert_eq!(
                Some(&b.ts),
                seq_to_ts.get(&b.seq),
                "node {id}: seq {} ts differs from its publish answer",
                b.seq
            );
        }
        // Stream info agrees.
        let info = http.get(&format!("{}/v1/streams/{STREAM}", c.url(id))).await.unwrap().json();
        assert_eq!(info["last_seq"].as_u64(), Some(N), "node {id}: info {info}");
        assert_eq!(info["first_seq"].as_u64(), Some(1), "node {id}: info {info}");
        assert_eq!(info["batches"].as_u64(), Some(N), "node {id}: info {info}");
        let total: u64 = published.iter().map(|p| p.len() as u64).sum();
        assert_eq!(info["bytes"].as_u64(), Some(total), "node {id}: info bytes {info}");
        per_node.push((id, batches));
    }
    let (first_id, first) = &per_node[0];
    for (id, batches) in &per_node[1..] {
        assert!(batches == first, "node {id} and node {first_id} serve different (seq, ts, bytes) histories");
    }

    // Paging with a small limit gives the same sequence (next_after continues without loss).
    let mut after = 0u64;
    let mut seen = Vec::new();
    let url0 = c.url(c.ids()[1]);
    for _ in 0..20 {
        let r = http.get(&format!("{url0}/v1/streams/{STREAM}/batches?after={after}&limit=73")).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.describe());
        let v = r.json();
        assert_eq!(v["last_seq"].as_u64(), Some(N), "{v}");
        let bs = v["batches"].as_array().unwrap();
        if bs.is_empty() {
            break;
        }
        assert!(bs.len() <= 73, "limit=73 returned {} batches", bs.len());
        seen.extend(bs.iter().map(|b| b["seq"].as_u64().unwrap()));
        after = v["next_after"].as_u64().unwrap();
    }
    assert_eq!(seen, expected_seqs[..seen.len()].to_vec(), "paging by 73 skipped or repeated seqs");
    assert_eq!(seen.len() as u64, (20 * 73u64).min(N), "paging by 73 ended early");
}

/// Issue 15 (catch-up): a consumer reading with one read ahead (`Client::catch_up`) gets
/// exactly the answers of plain reads, in order: publisher-chosen seqs with holes between
/// them, a gap where retention evicted what it asked for (told once, then the batches after
/// it), an empty answer once caught up, and what is published after that on its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_ahead_consumer_gets_what_plain_reads_get_in_order() {
    let c = Cluster::start(3, &[]).await;
    let client = c.client();
    let retention = runnev::stream::Retention { max_batches: Some(150), ..Default::default() };
    client.put_stream("ahead", Some(retention)).await.expect("create the stream");
    // Seqs 3, 6, …, 600: the oldest 50 are evicted by retention (at most 150 kept).
    for i in 1..=200u64 {
        client.publish("ahead", Some(3 * i), payload("ahead", i)).await.expect("publish");
    }
    // One node, the leader, for both: each publish was applied there before it was answered.
    let node = client_for(&[c.url(c.leader().await)]);
    let plain = {
        let mut answers = Vec::new();
        let mut after = 0;
        loop {
            let a = node.read("ahead", after, 7, 0).await.expect("plain read");
            let done = a.batches.is_empty() && a.gap.is_none();
            after = a.next_after;
            answers.push(a);
            if done {
                break;
            }
        }
        answers
    };
    let mut reads = node.catch_up("ahead", 0, 7);
    let mut ahead = Vec::new();
    loop {
        let a = reads.next().await.expect("read ahead");
        let done = a.batches.is_empty() && a.gap.is_none();
        assert_eq!(reads.cursor(), a.next_after);
        ahead.push(a);
        if done {
            break;
        }
    }
    assert_eq!(ahead, plain, "the same answers in the same order");
    let first = &ahead[0];
    assert_eq!(first.gap.map(|g| (g.from, g.to)), Some((1, 150)), "the evicted seqs are told as a gap");
    let seqs: Vec<u64> = ahead.iter().flat_map(|a| a.batches.iter().map(|b| b.seq)).collect();
    assert_eq!(seqs, (51..=200).map(|i| 3 * i).collect::<Vec<_>>());
    // Caught up: what is published next comes with the next call.
    node.publish("ahead", Some(1_000), payload("ahead", 1_000)).await.expect("publish after");
    let later = reads.next().await.expect("read after catching up");
    assert_eq!(
        later.batches.iter().map(|b| (b.seq, b.data.to_vec())).collect::<Vec<_>>(),
        [(1_000, payload("ahead", 1_000))]
    );
}
