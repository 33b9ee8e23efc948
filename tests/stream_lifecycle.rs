//! A stream's life after its creation, end to end on three real nodes: retention replaced by
//! `PUT` (tightened, then loosened), delete and re-create (SPEC §5 of the contract: the new
//! stream continues after the old seqs, which count as evicted), and the subscription's
//! keep-alive `: ping` on an idle stream. Every answer is checked on every node once it has
//! applied the change.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The interval of the SSE keep-alive comment (docs/http-api.md, "A `: ping` comment comes
/// every 10 s"), in ms.
const PING_INTERVAL_MS: u64 = 10_000;

async fn publish(c: &Cluster, node: u64, stream: &str, body: &str) -> Value {
    let url = format!("{}/v1/streams/{stream}/batches", c.url(node));
    let r = c.http.post(&url, body.as_bytes().to_vec()).await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert_eq!(r.status, 201, "POST {url}: {}", r.describe());
    r.json()
}

/// `PUT /v1/streams/{name}` with `body` through `node`; the answer.
async fn put(c: &Cluster, node: u64, stream: &str, body: Option<&str>) -> Resp {
    let url = format!("{}/v1/streams/{stream}", c.url(node));
    c.http.put(&url, body).await.unwrap_or_else(|e| panic!("PUT {url}: {e}"))
}

/// (first_seq, last_seq, evicted_through, batches) of an info body.
fn shape(info: &Value) -> (u64, u64, u64, u64) {
    let f = |k: &str| info[k].as_u64().unwrap_or_else(|| panic!("no u64 {k} in {info}"));
    (f("first_seq"), f("last_seq"), f("evicted_through"), f("batches"))
}

/// Every node, once it applied everything the leader committed: the stream's info has `want`
/// shape and `retention`, and a read from 0 announces `gap` and then serves `seqs` (payloads
/// `b{seq}`). The nodes are identical.
async fn check_on_every_node(
    c: &mut Cluster,
    stream: &str,
    want: (u64, u64, u64, u64),
    retention: Value,
    gap: Option<(u64, u64)>,
    seqs: &[u64],
    what: &str,
) {
    let commit = c.leader_commit_index().await;
    let state = assert_identical(c, &c.ids(), commit, what).await;
    let info = state
        .streams
        .iter()
        .find(|s| s["name"] == stream)
        .unwrap_or_else(|| panic!("{what}: no stream {stream}: {:?}", state.streams));
    assert_eq!(shape(info), want, "{what}: (first_seq, last_seq, evicted_through, batches) of {info}");
    assert_eq!(info["retention"], retention, "{what}: {info}");
    let (got_gap, batches) = &state.batches[stream];
    assert_eq!(*got_gap, gap, "{what}: the gap a reader from 0 is told");
    let got: Vec<(u64, Vec<u8>)> = batches.iter().map(|b| (b.seq, b.data.clone())).collect();
    let expected: Vec<(u64, Vec<u8>)> = seqs.iter().map(|s| (*s, format!("b{s}").into_bytes())).collect();
    assert_eq!(got, expected, "{what}: retained batches");
    let bytes: u64 = expected.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(info["bytes"].as_u64(), Some(bytes), "{what}: {info}");
}

fn no_limits() -> Value {
    json!({"max_batches": null, "max_bytes": null, "max_age_ms": null})
}

/// `PUT` with a body replaces the retention as a whole and applies it at once: tightening
/// evicts the oldest batches on every node (and a reader is told the gap); loosening keeps what
/// was evicted evicted and lets new batches stay; `PUT` without a body changes nothing; `{}`
/// removes every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_put_tightens_and_loosens() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    assert_eq!(put(&c, follower, "ret", None).await.status, 201);
    for s in 1..=10 {
        assert_eq!(publish(&c, leader, "ret", &format!("b{s}")).await["seq"], s);
    }
    check_on_every_node(&mut c, "ret", (1, 10, 0, 10), no_limits(), None, &(1..=10).collect::<Vec<_>>(), "created")
        .await;

    // Tighten to 3 batches, through a follower: 1..=7 evicted at once.
    let r = put(&c, follower, "ret", Some(r#"{"retention":{"max_batches":3}}"#)).await;
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(shape(&r.json()), (8, 10, 7, 3), "the answer shows the eviction: {}", r.json());
    let three = json!({"max_batches": 3, "max_bytes": null, "max_age_ms": null});
    check_on_every_node(&mut c, "ret", (8, 10, 7, 3), three.clone(), Some((1, 7)), &[8, 9, 10], "tightened").await;

    // A publish keeps only the newest 3.
    assert_eq!(publish(&c, follower, "ret", "b11").await["seq"], 11);
    check_on_every_node(&mut c, "ret", (9, 11, 8, 3), three.clone(), Some((1, 8)), &[9, 10, 11], "one more").await;

    // Tighten by bytes as well: "b10" and "b11" are 3 bytes each, so 6 bytes keep two batches.
    let r = put(&c, leader, "ret", Some(r#"{"retention":{"max_batches":3,"max_bytes":6}}"#)).await;
    assert_eq!(r.status, 200, "{}", r.describe());
    let bytes6 = json!({"max_batches": 3, "max_bytes": 6, "max_age_ms": null});
    check_on_every_node(&mut c, "ret", (10, 11, 9, 2), bytes6.clone(), Some((1, 9)), &[10, 11], "by bytes").await;

    // A PUT without a body leaves the stream and its retention unchanged.
    let r = put(&c, follower, "ret", None).await;
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!((shape(&r.json()), r.json()["retention"].clone()), ((10, 11, 9, 2), bytes6.clone()), "{}", r.json());

    // Loosen: what was evicted stays evicted; new batches are kept up to the new limit.
    let r = put(&c, leader, "ret", Some(r#"{"retention":{"max_batches":100}}"#)).await;
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(shape(&r.json()), (10, 11, 9, 2), "loosening brings nothing back: {}", r.json());
    for s in 12..=15 {
        assert_eq!(publish(&c, follower, "ret", &format!("b{s}")).await["seq"], s);
    }
    let hundred = json!({"max_batches": 100, "max_bytes": null, "max_age_ms": null});
    check_on_every_node(&mut c, "ret", (10, 15, 9, 6), hundred, Some((1, 9)), &[10, 11, 12, 13, 14, 15], "loosened")
        .await;

    // `{}` removes every limit.
    let r = put(&c, follower, "ret", Some("{}")).await;
    assert_eq!(r.status, 200, "{}", r.describe());
    check_on_every_node(
        &mut c,
        "ret",
        (10, 15, 9, 6),
        no_limits(),
        Some((1, 9)),
        &[10, 11, 12, 13, 14, 15],
        "no limits",
    )
    .await;
    // A publisher's retry of an evicted seq is told so.
    let r =
        c.http.post(&format!("{}/v1/streams/ret/batches?seq=3", c.url(leader)), b"b3".to_vec()).await.expect("POST");
    assert_eq!((r.status, r.error_code().as_deref()), (409, Some("seq_evicted")), "{}", r.describe());
}

/// `DELETE` then `PUT` again, at the level of requests and answers: after the delete every node
/// answers `404 stream_not_found` for the info, a read and a publish; the re-created stream
/// starts after the old last seq, the old seqs counting as evicted (a reader from 0 is told the
/// gap, a retry of an old seq is `409 seq_evicted`), on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_recreate_continue_after_the_old_seqs() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    assert_eq!(put(&c, leader, "life", None).await.status, 201);
    for s in 1..=5 {
        publish(&c, follower, "life", &format!("b{s}")).await;
    }
    // Another stream, which the delete must not touch.
    assert_eq!(put(&c, leader, "other", None).await.status, 201);
    publish(&c, leader, "other", "b1").await;

    let r = c.http.delete(&format!("{}/v1/streams/life", c.url(follower))).await.expect("DELETE");
    assert_eq!(r.status, 204, "{}", r.describe());
    assert!(r.body.is_empty(), "204 has no body: {}", r.describe());
    let commit = c.leader_commit_index().await;
    let state = assert_identical(&c, &c.ids(), commit, "after the delete").await;
    let names: Vec<&str> = state.streams.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, vec!["other"], "the deleted stream is gone, the other is not");
    for id in c.ids() {
        let base = c.url(id);
        for (what, r) in [
            ("info", c.http.get(&format!("{base}/v1/streams/life")).await),
            ("read", c.http.get(&format!("{base}/v1/streams/life/batches?after=0")).await),
            ("publish", c.http.post(&format!("{base}/v1/streams/life/batches?seq=6"), b"b6".to_vec()).await),
            ("delete again", c.http.delete(&format!("{base}/v1/streams/life")).await),
        ] {
            let r = r.unwrap_or_else(|e| panic!("node {id} {what}: {e}"));
            assert_eq!(
                (r.status, r.error_code().as_deref()),
                (404, Some("stream_not_found")),
                "node {id}: {what} of a deleted stream: {}",
                r.describe()
            );
        }
    }

    // Re-created (through another node): it continues after seq 5, which counts as evicted.
    let r = put(&c, c.ids().into_iter().find(|i| *i != follower).expect("a node"), "life", None).await;
    assert_eq!(r.status, 201, "re-created: {}", r.describe());
    assert_eq!(
        shape(&r.json()),
        (6, 5, 5, 0),
        "first_seq = old last_seq + 1, evicted_through = old last_seq: {}",
        r.json()
    );
    check_on_every_node(&mut c, "life", (6, 5, 5, 0), no_limits(), Some((1, 5)), &[], "re-created").await;
    let r =
        c.http.post(&format!("{}/v1/streams/life/batches?seq=3", c.url(follower)), b"b3".to_vec()).await.expect("POST");
    assert_eq!((r.status, r.error_code().as_deref()), (409, Some("seq_evicted")), "an old seq: {}", r.describe());
    assert_eq!(publish(&c, follower, "life", "b6").await["seq"], 6, "the next seq after the old ones");
    check_on_every_node(&mut c, "life", (6, 6, 5, 1), no_limits(), Some((1, 5)), &[6], "after a publish").await;
    // A reader holding a cursor into the old stream is told the gap up to the old last seq.
    for id in c.ids() {
        let v = c.http.get(&format!("{}/v1/streams/life/batches?after=2", c.url(id))).await.expect("read").json();
        assert_eq!(v["gap"], json!({"from": 3, "to": 5}), "node {id}: {v}");
        assert_eq!(v["batches"][0]["seq"], 6, "node {id}: {v}");
    }
    // The other stream is untouched.
    let commit = c.leader_commit_index().await;
    let state = assert_identical(&c, &c.ids(), commit, "at the end").await;
    assert_eq!(state.batches["other"].1.iter().map(|b| b.seq).collect::<Vec<_>>(), vec![1]);
}

/// An idle subscription gets the keep-alive comment `: ping` within the documented interval
/// (10 s). The bound checked is the interval plus a margin: a liveness bound, which only a
/// node that never pings (or pings far too rarely) fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_subscription_gets_keep_alive_pings() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    assert_eq!(put(&c, leader, "idle", None).await.status, 201);
    publish(&c, leader, "idle", "b1").await;
    let node = c.followers().await[0];
    let url = format!("{}/v1/streams/idle/subscribe?after=0", c.url(node));
    // Two pings: the first may come early (the interval may start before the answer does);
    // the second is a whole interval after it.
    let bound = Duration::from_millis(2 * PING_INTERVAL_MS + 10_000);
    let text =
        curl_until(&url, &[], bound, |t| t.matches("\n: ping\n").count() + usize::from(t.starts_with(": ping\n")) >= 2)
            .await;
    assert!(text.contains("id: 1\n"), "the retained batch comes first:\n{text}");
    let batch_at = text.find("id: 1\n").expect("the batch");
    let ping_at = text.find(": ping").expect("a ping");
    assert!(batch_at < ping_at, "the batch is sent before the idle stream's pings:\n{text}");
    for line in text.lines() {
        assert!(
            line.is_empty()
                || line == ": ping"
                || line.starts_with("event: ")
                || line.starts_with("id: ")
                || line.starts_with("data: "),
            "an SSE line of another kind: {line:?}\n{text}"
        );
    }
}
