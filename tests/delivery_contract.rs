//! SPEC §2–§4, the delivery contract, against real `runnev serve` processes: idempotent publish
//! by (stream, seq) across leader failover, subscriptions that survive node loss, announced gaps,
//! byte-exact payloads, standard SSE clients, and nodes behind the cursor waiting.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use runnev::client::{Client, Delivery};
use serde_json::Value;

fn client(c: &Cluster, first: u64) -> Client {
    // Put `first` first so a subscription starts there; the client rotates through the rest.
    let mut urls = vec![c.url(first)];
    urls.extend(c.ids().into_iter().filter(|i| *i != first).map(|i| c.url(i)));
    client_for(&urls)
}

async fn publish(c: &Cluster, node: u64, stream: &str, seq: Option<u64>, body: &[u8]) -> Resp {
    let url = match seq {
        Some(s) => format!("{}/v1/streams/{stream}/batches?seq={s}", c.url(node)),
        None => format!("{}/v1/streams/{stream}/batches", c.url(node)),
    };
    c.http.post(&url, body.to_vec()).await.unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// Reads (stream, seq) on `node` after it applied `min_index`; `None` if no such batch.
async fn batch_at(c: &Cluster, node: u64, stream: &str, seq: u64, min_index: u64) -> Option<Vec<u8>> {
    let url = format!("{}/v1/streams/{stream}/batches?after={}&limit=1&min_index={min_index}", c.url(node), seq - 1);
    let r = c.http.get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status, 200, "GET {url}: {}", r.describe());
    let v = r.json();
    let b = v["batches"].as_array()?.first()?.clone();
    (b["seq"].as_u64() == Some(seq)).then(|| unb64(b["data"].as_str().unwrap_or_default()).expect("base64"))
}

/// SPEC §2.3: all five outcomes, and a retry of the same (stream, seq) on another node after the
/// leader that took the first attempt was killed gives exactly one batch; `duplicate: true` is
/// only ever answered for a batch that every node then serves. A leader that cannot reach a
/// majority never acknowledges: it answers `503` outcome unknown, or dies with the publish in
/// flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_publish_holds_across_leader_failover() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let f = c.followers().await;
    create_stream(&c.http, &c.url(f[0]), "orders").await;

    let a = publish(&c, leader, "orders", Some(10), b"A").await;
    assert_eq!(a.status, 201, "{}", a.describe());
    assert_eq!(a.json()["seq"], 10);
    let dup = publish(&c, f[0], "orders", Some(10), b"A").await;
    assert_eq!(dup.status, 200, "{}", dup.describe());
    assert_eq!(dup.json()["duplicate"], true);
    assert_eq!(dup.json()["index"], a.json()["index"], "a duplicate answers with the original's log index");
    assert_eq!(publish(&c, f[1], "orders", Some(10), b"B").await.error_code().as_deref(), Some("seq_conflict"));
    assert_eq!(publish(&c, f[1], "orders", Some(5), b"A").await.error_code().as_deref(), Some("seq_not_increasing"));
    let next = publish(&c, f[1], "orders", None, b"next").await;
    assert_eq!(next.json()["seq"], 11, "server-assigned seq is last seq + 1");

    // seq_evicted: retention keeps one batch, so seq 1 is evicted once seq 2 exists.
    let r = c.http.put(&format!("{}/v1/streams/tiny", c.url(leader)), Some(r#"{"retention":{"max_batches":1}}"#)).await;
    assert_eq!(r.expect("PUT tiny").status, 201);
    assert_eq!(publish(&c, leader, "tiny", Some(1), b"1").await.status, 201);
    assert_eq!(publish(&c, leader, "tiny", Some(2), b"2").await.status, 201);
    assert_eq!(publish(&c, f[0], "tiny", Some(1), b"1").await.error_code().as_deref(), Some("seq_evicted"));

    // An acknowledged publish, then the leader dies: the retry elsewhere is a duplicate.
    let acked = publish(&c, leader, "orders", Some(20), b"twenty").await;
    assert_eq!(acked.status, 201, "{}", acked.describe());
    // Both followers paused: nothing can commit. A publish then is appended by the leader and
    // must be answered `503 no_leader` with `Runnev-Outcome: unknown` once the commit wait runs
    // out, never acknowledged. A second one is sent while the first waits, so both are appended
    // while the leader's measures of its peers' clocks are fresh (a leader that can no longer
    // measure a majority's clocks refuses to propose, `503 not_ready`); it is still unanswered,
    // or answered without an acknowledgement, when the leader is killed. Both outcomes are
    // unknown to the client, and a retry with the same seq resolves them. Leadership may have
    // moved since `leader` was read: the helper pauses the followers of the leader there is now.
    let (leader, f) = c.pause_followers_of_leader().await;
    let appended = |after: u64| {
        let c = &c;
        wait_for(
            "the leader to append the publish (liveness bound)",
            Duration::from_secs(20),
            Duration::from_millis(5),
            move || async move {
                match c.cluster_info(leader).await?.last_log_index {
                    Some(i) if i > after => Ok(i),
                    other => Err(format!("last_log_index {other:?}, was {after}")),
                }
            },
        )
    };
    let before = c.cluster_info(leader).await.expect("leader view").last_log_index.unwrap_or(0);
    let url = format!("{}/v1/streams/orders/batches?seq=30", c.url(leader));
    let http = c.http.clone();
    let no_quorum = tokio::spawn(async move {
        http.request(hyper::Method::POST, &url, Some(b"thirty".to_vec().into()), &[], Duration::from_secs(60)).await
    });
    let after_30 = appended(before).await;
    // The leader holds seq 30 in its log, uncommitted: it must not serve it (SPEC §2.2).
    let read = c.http.get(&format!("{}/v1/streams/orders/batches?after=11", c.url(leader))).await.expect("read");
    let v = read.json();
    let seqs: Vec<u64> = v["batches"].as_array().expect("batches").iter().filter_map(|b| b["seq"].as_u64()).collect();
    assert_eq!((seqs, v["last_seq"].as_u64()), (vec![20], Some(20)), "the leader serves an uncommitted batch: {v}");
    let url = format!("{}/v1/streams/orders/batches?seq=31", c.url(leader));
    let http = c.http.clone();
    let in_flight = tokio::spawn(async move { http.post(&url, b"thirty-one".to_vec()).await });
    let appended_31 = appended(after_30).await;
    let no_quorum = no_quorum.await.expect("publish task").expect("an answer from the leader without a quorum");
    assert_eq!(
        (no_quorum.status, no_quorum.error_code().as_deref(), no_quorum.header("runnev-outcome").as_deref()),
        (503, Some("no_leader"), Some("unknown")),
        "a publish that cannot commit (both followers paused) is not acknowledged: {}",
        no_quorum.describe()
    );
    c.kill_9(leader);
    c.resume_all(&f);
    match in_flight.await.expect("publish task") {
        Ok(r) if r.status == 200 || r.status == 201 => panic!(
            "the leader acknowledged seq 31 (log index {appended_31}) while both followers were paused: \
             acknowledged without a majority: {}",
            r.describe()
        ),
        other => eprintln!("the in-flight publish ended without an acknowledgement: {other:?}"),
    }

    let other = f[1];
    for (seq, body) in [(20u64, &b"twenty"[..]), (30, &b"thirty"[..]), (31, &b"thirty-one"[..])] {
        let retry = wait_for("the retry to be answered", Duration::from_secs(20), Duration::from_millis(200), || {
            let c = &c;
            async move {
                let r = publish(c, other, "orders", Some(seq), body).await;
                if r.status == 201 || r.status == 200 {
                    Ok(r)
                } else {
                    Err(r.describe())
                }
            }
        })
        .await;
        let v = retry.json();
        if seq == 20 {
            assert_eq!(v["duplicate"], true, "an acknowledged batch must be recognised after failover: {v}");
        }
        let index = v["index"].as_u64().expect("index");
        for node in [f[0], f[1]] {
            assert_eq!(
                batch_at(&c, node, "orders", seq, index).await.as_deref(),
                Some(body),
                "node {node} must serve ({seq}) after the answer {v}"
            );
        }
    }
    c.restart(leader).await;
    let all = read_all(&c.http, &c.url(leader), "orders", 0, Duration::from_secs(20)).await.expect("read");
    let seqs: Vec<u64> = all.iter().map(|b| b.seq).collect();
    let wait_all =
        wait_for("the restarted node to hold seq 31", Duration::from_secs(20), Duration::from_millis(200), || {
            let c = &c;
            async move {
                let b = read_all(&c.http, &c.url(leader), "orders", 0, Duration::from_secs(5)).await?;
                if b.iter().any(|b| b.seq == 31) {
                    Ok(b)
                } else {
                    Err(format!("seqs {:?}", b.iter().map(|b| b.seq).collect::<Vec<_>>()))
                }
            }
        })
        .await;
    assert_eq!(wait_all.iter().map(|b| b.seq).collect::<Vec<_>>(), vec![10, 11, 20, 30, 31], "before: {seqs:?}");
    let data: Vec<&[u8]> = wait_all.iter().map(|b| b.data.as_slice()).collect();
    assert_eq!(data[3..], [&b"thirty"[..], &b"thirty-one"[..]], "each stored once, with its bytes");
}

/// SPEC §2.4, §2.6: a subscriber on a follower receives every batch in order while the leader
/// is killed and replaced, reconnecting across nodes, with no hole and no batch twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_on_a_follower_survives_leader_failover() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    create_stream(&c.http, &c.url(leader), "feed").await;
    const N: u64 = 300;

    let sub_client = client(&c, follower);
    let consumer = tokio::spawn(async move {
        let mut sub = sub_client.subscribe("feed", 0);
        let mut seen = Vec::new();
        while (seen.len() as u64) < N {
            match tokio::time::timeout(Duration::from_secs(60), sub.next()).await {
                Ok(Some(Ok(Delivery::Batch(b)))) => seen.push((b.seq, b.data.to_vec())),
                Ok(Some(Ok(Delivery::Gap(g)))) => panic!("unexpected gap {g:?}"),
                Ok(Some(Err(e))) => eprintln!("subscription error (it keeps trying): {e}"),
                Ok(None) => panic!("subscription ended"),
                Err(_) => panic!("no delivery for 60 s after {} batches", seen.len()),
            }
        }
        seen
    });

    let pub_client = client(&c, follower);
    for seq in 1..=N {
        if seq == N / 2 {
            c.kill_9(leader);
        }
        if seq == N * 3 / 4 {
            c.restart(leader).await;
        }
        let ack = pub_client.publish("feed", Some(seq), format!("batch {seq}").into_bytes()).await.expect("publish");
        assert_eq!(ack.seq, seq);
    }
    let seen = consumer.await.expect("consumer");
    let expected: Vec<(u64, Vec<u8>)> = (1..=N).map(|s| (s, format!("batch {s}").into_bytes())).collect();
    assert_eq!(seen, expected, "every batch once, in order");
}

/// SPEC §2.5, §4: a consumer behind retention gets a gap with the exact evicted range, then the
/// oldest retained batch; last_seq never decreases; the next publish after eviction gets
/// last seq + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_behind_retention_is_told_the_exact_gap() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let r =
        c.http.put(&format!("{}/v1/streams/short", c.url(leader)), Some(r#"{"retention":{"max_batches":5}}"#)).await;
    assert_eq!(r.expect("PUT").status, 201);
    let mut last_index = 0;
    let mut last_seen = [0u64; 4];
    for seq in 1..=20u64 {
        let r = publish(&c, leader, "short", None, format!("b{seq}").as_bytes()).await;
        assert_eq!(r.status, 201, "{}", r.describe());
        assert_eq!(r.json()["seq"], seq);
        last_index = r.json()["index"].as_u64().expect("index");
        for id in c.ids() {
            let v = c.http.get(&format!("{}/v1/streams/short", c.url(id))).await.expect("info").json();
            let ls = v["last_seq"].as_u64().unwrap_or(0);
            assert!(ls >= last_seen[id as usize], "node {id}: last_seq went from {} to {ls}", last_seen[id as usize]);
            last_seen[id as usize] = ls;
        }
    }
    for id in c.ids() {
        let url = format!("{}/v1/streams/short/batches?after=3&min_index={last_index}", c.url(id));
        let v = c.http.get(&url).await.expect("read").json();
        assert_eq!(v["gap"], serde_json::json!({"from": 4, "to": 15}), "node {id}: {v}");
        let seqs: Vec<u64> =
            v["batches"].as_array().expect("batches").iter().filter_map(|b| b["seq"].as_u64()).collect();
        assert_eq!(seqs, vec![16, 17, 18, 19, 20], "node {id}");
        assert_eq!(v["next_after"], 20);
    }
    let mut sub = client(&c, c.followers().await[0]).subscribe("short", 0);
    let first = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("event").expect("item");
    assert_eq!(first.expect("ok"), Delivery::Gap(runnev::client::Gap { from: 1, to: 15 }));
    match tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("event").expect("item").expect("ok") {
        Delivery::Batch(b) => assert_eq!((b.seq, &b.data[..]), (16, &b"b16"[..])),
        other => panic!("expected batch 16, got {other:?}"),
    }
    let after = publish(&c, leader, "short", None, b"b21").await;
    assert_eq!(after.json()["seq"], 21, "the next publish after eviction gets last seq + 1");
}

/// Payloads of 0 bytes, exactly the limit, and all 256 byte values round-trip byte-exact through
/// publish, read and SSE; one byte over the limit gets 413 payload_too_large.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip_byte_exact() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    create_stream(&c.http, &c.url(leader), "bytes").await;
    let limit = 1024 * 1024;
    let all: Vec<u8> = (0..=255u8).collect();
    let big: Vec<u8> = (0..limit).map(|i| (i * 7 % 251) as u8).collect();
    let payloads = [Vec::new(), all.clone(), big.clone()];
    let mut index = 0;
    for p in &payloads {
        let r = publish(&c, follower, "bytes", None, p).await;
        assert_eq!(r.status, 201, "{} bytes: {}", p.len(), r.describe());
        index = r.json()["index"].as_u64().expect("index");
    }
    let over = publish(&c, follower, "bytes", None, &vec![0u8; limit + 1]).await;
    assert_eq!((over.status, over.error_code().as_deref()), (413, Some("payload_too_large")));

    for id in c.ids() {
        let got = read_all(&c.http, &c.url(id), "bytes", index, Duration::from_secs(20)).await.expect("read");
        let data: Vec<Vec<u8>> = got.into_iter().map(|b| b.data).collect();
        assert_eq!(data, payloads, "node {id} read");
    }
    let mut sub = client(&c, follower).subscribe("bytes", 0);
    for p in &payloads {
        match tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("event")
            .expect("item")
            .expect("ok")
        {
            Delivery::Batch(b) => assert_eq!(&b.data[..], &p[..], "SSE payload of {} bytes", p.len()),
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// SPEC §4 with a client that is not ours: curl reads the event stream, and resumes from
/// `Last-Event-ID` (which takes precedence over `after`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_consumes_and_resumes_with_last_event_id() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "sse").await;
    for i in 1..=5 {
        assert_eq!(publish(&c, leader, "sse", None, format!("e{i}").as_bytes()).await.status, 201);
    }
    let node = c.followers().await[0];
    let url = format!("{}/v1/streams/sse/subscribe?after=0", c.url(node));
    let ids = |text: &str| -> Vec<u64> {
        text.lines().filter_map(|l| l.strip_prefix("id: ")).filter_map(|v| v.trim().parse().ok()).collect()
    };
    // Read until the last event is complete (its blank line), with a liveness bound only.
    let through_5 = |t: &str| t.contains("id: 5\n") && t.split("id: 5\n").nth(1).is_some_and(|r| r.contains("\n\n"));
    let full = curl_until(&url, &[], Duration::from_secs(30), through_5).await;
    assert_eq!(ids(&full), vec![1, 2, 3, 4, 5], "stream:\n{full}");
    assert!(full.contains("event: batch"), "{full}");
    let first_data = full.lines().find_map(|l| l.strip_prefix("data: ")).expect("a data line");
    let v: Value = serde_json::from_str(first_data).expect("JSON data");
    assert_eq!(unb64(v["data"].as_str().expect("data")).expect("b64"), b"e1");
    let resumed = curl_until(&url, &["Last-Event-ID: 3"], Duration::from_secs(30), through_5).await;
    assert_eq!(ids(&resumed), vec![4, 5], "Last-Event-ID takes precedence over after:\n{resumed}");
}

/// Holds `lagging` (stopped while the others went on) behind them: the leader and the other
/// follower are paused (SIGSTOP), then `lagging` is started again on its data, so it runs and
/// serves HTTP but nothing new reaches it until the others are resumed. (A node paused rather
/// than stopped would, once resumed, still process the appends the leader had left in its
/// socket buffers, and catch up without any leader.) Returns the paused nodes.
async fn hold_behind(c: &mut Cluster, lagging: u64) -> Vec<u64> {
    let others: Vec<u64> = c.ids().into_iter().filter(|i| *i != lagging).collect();
    c.pause_all(&others);
    c.restart(lagging).await;
    others
}

/// The stream info `node` serves now (its applied state), as (status, last_seq).
async fn info_on(c: &Cluster, node: u64, stream: &str) -> (u16, Option<u64>) {
    let r = c.http.get(&format!("{}/v1/streams/{stream}", c.url(node))).await.expect("GET info");
    (r.status, r.try_json().and_then(|v| v["last_seq"].as_u64()))
}

/// SPEC §2.6: a node behind the cursor waits (long poll) rather than answering empty or
/// announcing a false gap; once it catches up it serves the batches. The node is held behind
/// (the others paused) until the read is seen parked in its wait, so the waiting path runs
/// every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_node_waits_for_the_cursor() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let lagging = c.followers().await[0];
    create_stream(&c.http, &c.url(leader), "lag").await;
    let first = publish(&c, leader, "lag", None, b"1").await;
    let index = first.json()["index"].as_u64().expect("index");
    c.wait_applied(lagging, index, Duration::from_secs(20)).await.expect("the lagging node applies seq 1");
    c.stop(lagging).await;
    for i in 2..=10 {
        assert_eq!(publish(&c, leader, "lag", None, format!("{i}").as_bytes()).await.status, 201);
    }
    let paused = hold_behind(&mut c, lagging).await;
    assert_eq!(info_on(&c, lagging, "lag").await, (200, Some(1)), "node {lagging} is behind: it has seq 1 only");
    // The consumer already processed seq 8 elsewhere and asks the lagging node for more.
    let url = format!("{}/v1/streams/lag/batches?after=8&wait_ms=60000", c.url(lagging));
    let http = c.http.clone();
    let read =
        tokio::spawn(async move { http.request(hyper::Method::GET, &url, None, &[], Duration::from_secs(90)).await });
    c.wait_parked(lagging, "read", 1.0, Duration::from_secs(20)).await;
    assert!(!read.is_finished(), "the read parked in its wait and the node is still behind");
    assert_eq!(info_on(&c, lagging, "lag").await, (200, Some(1)), "still behind while the read waits");
    c.resume_all(&paused);
    let r = read.await.expect("task").expect("answer");
    assert_eq!(r.status, 200, "{}", r.describe());
    let v = r.json();
    assert!(v["gap"].is_null(), "no false gap: {v}");
    let seqs: Vec<u64> = v["batches"].as_array().expect("batches").iter().filter_map(|b| b["seq"].as_u64()).collect();
    assert_eq!(seqs, vec![9, 10], "the lagging node waited and then served the batches: {v}");
    assert_eq!(v["next_after"], 10, "{v}");
}

/// SPEC §2.7: `max_age_ms` evicts from an idle stream through the leader's tick entries (and
/// may empty it); `max_bytes` never evicts the newest batch. Every node agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_and_byte_retention_evict_deterministically() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let put = |name: &'static str, body: &'static str| {
        let url = format!("{}/v1/streams/{name}", c.url(leader));
        let http = c.http.clone();
        async move { http.put(&url, Some(body)).await.expect("PUT") }
    };
    assert_eq!(put("aging", r#"{"retention":{"max_age_ms":1000}}"#).await.status, 201);
    assert_eq!(put("sized", r#"{"retention":{"max_bytes":10}}"#).await.status, 201);
    for i in 1..=3 {
        assert_eq!(publish(&c, leader, "aging", None, format!("a{i}").as_bytes()).await.status, 201);
    }
    for body in [&b"1234"[..], b"5678", b"9abc", b"0123456789abcdef"] {
        assert_eq!(publish(&c, leader, "sized", None, body).await.status, 201);
    }
    for id in c.ids() {
        let v = wait_for("the idle stream to age out", Duration::from_secs(15), Duration::from_millis(200), || {
            let c = &c;
            async move {
                let v = c.http.get(&format!("{}/v1/streams/aging", c.url(id))).await?.json();
                if v["batches"] == 0 {
                    Ok(v)
                } else {
                    Err(v.to_string())
                }
            }
        })
        .await;
        assert_eq!(
            (v["first_seq"].as_u64(), v["last_seq"].as_u64(), v["evicted_through"].as_u64()),
            (Some(4), Some(3), Some(3)),
            "node {id}: {v}"
        );
        let r = c.http.get(&format!("{}/v1/streams/aging/batches?after=0", c.url(id))).await.expect("read").json();
        assert_eq!(r["gap"], serde_json::json!({"from": 1, "to": 3}), "node {id}: {r}");
        assert_eq!(r["next_after"], 3, "node {id}: {r}");
    }
    let next = publish(&c, leader, "aging", None, b"a4").await;
    assert_eq!(next.json()["seq"], 4, "an emptied stream continues after its last seq");
    let sized = c.http.get(&format!("{}/v1/streams/sized", c.url(leader))).await.expect("info").json();
    // 16 bytes > 10: only the newest batch is left, because it is the newest.
    assert_eq!(
        (sized["batches"].as_u64(), sized["bytes"].as_u64(), sized["first_seq"].as_u64()),
        (Some(1), Some(16), Some(4)),
        "{sized}"
    );
}

/// Regression: a follower that had not yet applied a stream's creation answered a long-poll
/// read `404 stream_not_found` (seen as a flaky `a_lagging_node_waits_for_the_cursor`). A node
/// behind the creation now waits like a node behind the cursor, for reads and subscriptions.
/// The node is held behind (the others paused) until the read is seen parked in its wait: the
/// read then serves seq 1 once the node catches up. A subscription on the node while it is held
/// behind and has heard from no leader is refused as retryable (`503 not_ready`), not `404`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_a_streams_creation_waits_instead_of_404() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let lagging = c.followers().await[0];
    c.stop(lagging).await;
    create_stream(&c.http, &c.url(leader), "late").await;
    assert_eq!(publish(&c, leader, "late", None, b"first").await.status, 201);
    let paused = hold_behind(&mut c, lagging).await;
    assert_eq!(info_on(&c, lagging, "late").await.0, 404, "node {lagging} has not applied the creation");
    let read_url = format!("{}/v1/streams/late/batches?after=0&wait_ms=60000", c.url(lagging));
    let http = c.http.clone();
    let read =
        tokio::spawn(
            async move { http.request(hyper::Method::GET, &read_url, None, &[], Duration::from_secs(90)).await },
        );
    c.wait_parked(lagging, "read", 1.0, Duration::from_secs(20)).await;
    // A subscription there is refused as retryable, never `404`: the restarted node has not heard
    // from a leader since it started (the others are paused), so it cannot tell whether it is
    // behind, and a subscriber must go to another node (`503 not_ready`).
    let sub_url = format!("{}/v1/streams/late/subscribe?after=0", c.url(lagging));
    let s = c.http.get(&sub_url).await.expect("an answer to the subscription");
    assert_eq!(
        (s.status, s.error_code().as_deref()),
        (503, Some("not_ready")),
        "a subscription on a node held behind and cut off from the leader: {}",
        s.describe()
    );
    assert!(!read.is_finished(), "the read still waits: its wait_ms is 60 s");
    assert_eq!(info_on(&c, lagging, "late").await.0, 404, "still behind while the read waits");
    c.resume_all(&paused);
    let r = read.await.expect("task").expect("answer");
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(r.json()["batches"][0]["seq"], 1, "{}", r.describe());
    assert_eq!(unb64(r.json()["batches"][0]["data"].as_str().unwrap_or_default()).expect("b64"), b"first");
    // Caught up, the node serves the subscription.
    let sub_url = format!("{}/v1/streams/late/subscribe?after=0", c.url(lagging));
    let out = curl_until(&sub_url, &[], Duration::from_secs(30), |t| t.contains("id: 1\n")).await;
    assert!(out.contains("event: batch"), "{out}");
}

/// Regressions from a new user's trial: a publish without seq whose outcome is unknown (the
/// leader lost its quorum) is not retried by the client, so it is stored at most once; the
/// leader without a quorum is not ready; a stream body that is not a JSON object is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_not_retried_without_seq() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "once").await;
    let r = c.http.put(&format!("{}/v1/streams/arr", c.url(leader)), Some("[]")).await.expect("PUT");
    assert_eq!((r.status, r.error_code().as_deref()), (400, Some("invalid_body")), "{}", r.describe());

    let others: Vec<u64> = c.ids().into_iter().filter(|i| *i != leader).collect();
    for id in &others {
        c.kill_9(*id);
    }
    let ready =
        wait_for("the lone leader to stop being ready", Duration::from_secs(10), Duration::from_millis(200), || {
            let c = &c;
            async move {
                let r = c.http.get(&format!("{}/readyz", c.url(leader))).await?;
                if r.status == 503 {
                    Ok(r)
                } else {
                    Err(r.describe())
                }
            }
        })
        .await;
    assert!(ready.text().contains("quorum"), "{}", ready.describe());

    let policy = runnev::client::RetryPolicy { request_timeout: Duration::from_secs(3), ..Default::default() };
    let client = client_for(&[c.url(leader)]).with_policy(policy);
    let err = client.publish("once", None, b"exactly one".to_vec()).await.expect_err("no quorum");
    assert!(matches!(err, runnev::client::ClientError::OutcomeUnknown(_)), "{err}");
    for id in others {
        c.restart(id).await;
    }
    let leader = c.leader().await;
    let index = c.cluster_info(leader).await.expect("view").commit_index;
    let all = read_all(&c.http, &c.url(leader), "once", index, Duration::from_secs(20)).await.expect("read");
    let copies = all.iter().filter(|b| b.data == b"exactly one").count();
    assert!(copies <= 1, "a publish without seq was stored {copies} times");
}
