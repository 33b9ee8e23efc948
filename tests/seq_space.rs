//! The top of the seq space against real `runnev serve` processes: the usable seqs are
//! 1 ..= 2⁶⁴−2, a stream emptied or deleted at the top keeps its invariants, and its name stays
//! usable. Every node must agree.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// The largest seq a stream may hold: 2⁶⁴−2.
const SEQ_MAX: u64 = u64::MAX - 1;

async fn publish(c: &Cluster, node: u64, stream: &str, seq: Option<u64>, body: &[u8]) -> Resp {
    let url = match seq {
        Some(s) => format!("{}/v1/streams/{stream}/batches?seq={s}", c.url(node)),
        None => format!("{}/v1/streams/{stream}/batches", c.url(node)),
    };
    c.http.post(&url, body.to_vec()).await.unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// `GET /v1/streams/{name}` on every node once it applied `min_index` (a read with
/// `min_index` first); panics unless all answer the same info, which it returns.
async fn info_everywhere(c: &Cluster, name: &str, min_index: u64) -> Value {
    let mut seen: Option<(u64, Value)> = None;
    for id in c.ids() {
        let base = c.url(id);
        let url = format!("{base}/v1/streams/{name}/batches?after=0&limit=1&min_index={min_index}");
        let r = c.http.get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        assert_eq!(r.status, 200, "node {id}: GET {url}: {}", r.describe());
        let r = c.http.get(&format!("{base}/v1/streams/{name}")).await.expect("GET stream info");
        assert_eq!(r.status, 200, "node {id}: stream {name}: {}", r.describe());
        let v = r.json();
        match &seen {
            None => seen = Some((id, v)),
            Some((first, w)) => assert_eq!(&v, w, "node {id} and node {first} disagree on stream {name}"),
        }
    }
    seen.expect("a node").1
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no u64 {key} in {v}"))
}

/// A stream with `max_age_ms` takes the largest usable seq, retention empties it, and its info
/// keeps `evicted_through < first_seq = last_seq + 1`; 2⁶⁴−1 is refused as a seq, and a
/// server-assigned publish past the top is `409 seq_not_increasing` (exhausted), on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_emptied_at_the_top_of_the_seq_space_keeps_its_invariants() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    let url = format!("{}/v1/streams/ag", c.url(follower));
    let r = c.http.put(&url, Some(r#"{"retention":{"max_age_ms":1000}}"#)).await.expect("PUT ag");
    assert_eq!(r.status, 201, "{}", r.describe());

    let over = publish(&c, follower, "ag", Some(u64::MAX), b"too far").await;
    assert_eq!(over.status, 400, "2^64-1 is not a seq: {}", over.describe());
    assert_eq!(over.error_code().as_deref(), Some("invalid_seq"));
    assert!(over.text().contains(&SEQ_MAX.to_string()), "the message states the range: {}", over.describe());

    let top = publish(&c, leader, "ag", Some(SEQ_MAX), b"top").await;
    assert_eq!(top.status, 201, "the largest usable seq is accepted: {}", top.describe());
    assert_eq!(u(&top.json(), "seq"), SEQ_MAX);
    let next = publish(&c, follower, "ag", None, b"next").await;
    assert_eq!(next.status, 409, "no seq is left: {}", next.describe());
    assert_eq!(next.error_code().as_deref(), Some("seq_not_increasing"));
    assert!(next.text().contains("exhausted"), "{}", next.describe());

    // The leader's tick evicts the batch once it is older than 1 s: the stream is empty, after
    // the top of the seq space.
    let base = c.url(leader);
    let emptied = wait_for("age retention to empty ag", Duration::from_secs(30), Duration::from_millis(200), || {
        let url = format!("{base}/v1/streams/ag");
        let http = c.http.clone();
        async move {
            let v = http.get(&url).await?.json();
            if u(&v, "batches") == 0 {
                Ok(v)
            } else {
                Err(format!("not yet evicted: {v}"))
            }
        }
    })
    .await;
    let index = c.cluster_info(leader).await.expect("cluster view").commit_index;
    let v = info_everywhere(&c, "ag", index).await;
    assert_eq!(v, emptied);
    assert_eq!((u(&v, "first_seq"), u(&v, "last_seq"), u(&v, "evicted_through")), (u64::MAX, SEQ_MAX, SEQ_MAX), "{v}");
    assert!(u(&v, "first_seq") > u(&v, "evicted_through"), "{v}");
    for id in c.ids() {
        let r = c.http.get(&format!("{}/healthz", c.url(id))).await.expect("healthz");
        assert_eq!(r.status, 200, "node {id} is up");
    }
}

/// A name deleted at the top of the seq space is usable again: created anew, it takes
/// server-assigned publishes (its seqs start again at 1, the one case where a name's seqs
/// restart), and every node agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_deleted_at_the_top_of_the_seq_space_is_usable_again() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    create_stream(&c.http, &c.url(leader), "dx").await;
    let top = publish(&c, follower, "dx", Some(SEQ_MAX), b"top").await;
    assert_eq!(top.status, 201, "{}", top.describe());
    let r = c.http.delete(&format!("{}/v1/streams/dx", c.url(follower))).await.expect("DELETE dx");
    assert_eq!(r.status, 204, "{}", r.describe());
    let again = create_stream(&c.http, &c.url(follower), "dx").await;
    assert_eq!(
        (u(&again, "first_seq"), u(&again, "last_seq"), u(&again, "evicted_through")),
        (1, 0, 0),
        "the name starts a new seq space: {again}"
    );
    let mut index = 0;
    for want in 1..=3u64 {
        let r = publish(&c, if want % 2 == 0 { leader } else { follower }, "dx", None, b"again").await;
        assert_eq!(r.status, 201, "publish {want} on the re-created name: {}", r.describe());
        assert_eq!(u(&r.json(), "seq"), want, "{}", r.describe());
        index = u(&r.json(), "index");
    }
    let v = info_everywhere(&c, "dx", index).await;
    assert_eq!((u(&v, "first_seq"), u(&v, "last_seq"), u(&v, "batches")), (1, 3, 3), "{v}");
    let batches = read_all(&c.http, &c.url(follower), "dx", index, Duration::from_secs(10)).await.expect("read dx");
    assert_eq!(batches.iter().map(|b| b.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
}
