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

/// A read asked for as binary records (`Accept: application/vnd.runnev.batches`) answers with
/// that content type and `Vary: Accept`, and carries exactly what the JSON read of the same
/// cursor does (the batches' seqs, times and bytes, the gap, `last_seq`, `next_after`); a weight
/// of 0 keeps JSON; errors stay JSON; and the client, which asks for binary, reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_asked_for_as_binary_records_carries_what_the_json_read_does() {
    use base64::Engine;
    use hyper::Method;
    let c = Cluster::start(3, &[]).await;
    let client = c.client();
    let retention = runnev::stream::Retention { max_batches: Some(6), ..Default::default() };
    client.put_stream("bin", Some(retention)).await.expect("create the stream");
    for i in 1..=10u64 {
        // An empty payload among them: a record of length 0.
        let data = if i == 8 { Vec::new() } else { payload("bin", i) };
        client.publish("bin", Some(2 * i), data).await.expect("publish");
    }
    let base = c.url(c.leader().await);
    let get = |path: String, accept: &'static str| {
        let http = c.http.clone();
        let url = format!("{base}{path}");
        async move {
            http.request(Method::GET, &url, None, &[("accept", accept)], Duration::from_secs(10)).await.expect("read")
        }
    };
    let binary = "application/vnd.runnev.batches";
    for (after, limit) in [(0u64, 100usize), (3, 2), (12, 100), (20, 100)] {
        let path = format!("/v1/streams/bin/batches?after={after}&limit={limit}");
        let json = get(path.clone(), "application/json").await;
        assert_eq!(json.status, 200, "{}", json.describe());
        assert_eq!(json.header("content-type").as_deref(), Some("application/json"));
        let json = json.json();
        let bin = get(path.clone(), binary).await;
        assert_eq!(bin.status, 200, "{}", bin.describe());
        assert_eq!(bin.header("content-type").as_deref(), Some(binary));
        assert_eq!(bin.header("vary").as_deref(), Some("accept"));
        let (head, batches) = runnev::wire::decode_batches(after, &bin.body).expect("a well-formed binary answer");
        assert_eq!(head.last_seq, json["last_seq"].as_u64().unwrap(), "after={after}");
        assert_eq!(head.next_after, json["next_after"].as_u64().unwrap(), "after={after}");
        let gap = head.gap.map(|g| serde_json::json!({"from": g.from, "to": g.to}));
        assert_eq!(gap.unwrap_or(serde_json::Value::Null), json["gap"], "after={after}");
        let want: Vec<(u64, u64, Vec<u8>)> = json["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let data = base64::engine::general_purpose::STANDARD.decode(b["data"].as_str().unwrap()).unwrap();
                (b["seq"].as_u64().unwrap(), b["ts"].as_u64().unwrap(), data)
            })
            .collect();
        let got: Vec<(u64, u64, Vec<u8>)> = batches.into_iter().map(|b| (b.seq, b.ts, b.data.to_vec())).collect();
        assert_eq!(got, want, "after={after}");
        // The client asks for binary; what it reads is the JSON answer's content.
        let read = client_for(std::slice::from_ref(&base)).read("bin", after, limit, 0).await.expect("client read");
        let read: Vec<(u64, u64, Vec<u8>)> = read.batches.iter().map(|b| (b.seq, b.ts, b.data.to_vec())).collect();
        assert_eq!(read, want, "client read after={after}");
        if after == 0 {
            assert_eq!(json["gap"], serde_json::json!({"from": 1, "to": 8}), "retention evicted seqs 2..8");
            assert_eq!(want.iter().map(|b| b.0).collect::<Vec<_>>(), [10, 12, 14, 16, 18, 20]);
            assert!(want.iter().any(|b| b.2.is_empty()), "the empty payload is read back");
        }
    }
    let weightless = get("/v1/streams/bin/batches".into(), "application/vnd.runnev.batches;q=0").await;
    assert_eq!(weightless.header("content-type").as_deref(), Some("application/json"));
    let missing = get("/v1/streams/nope/batches".into(), binary).await;
    assert_eq!((missing.status, missing.error_code().as_deref()), (404, Some("stream_not_found")));
    assert_eq!(missing.header("content-type").as_deref(), Some("application/json"));
}
