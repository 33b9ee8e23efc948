//! How long a subscription (and a long poll) lives, against real `runnev serve` processes: it
//! follows its stream's name through a deletion and a re-creation, and a node cut off from the
//! leader ends it so that the client fails over.

mod common;

use std::time::Duration;

use common::*;
use eventsource_stream::{Event, Eventsource};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use serde_json::Value;

/// Deadline for something that should happen within about a second; only catches a hang.
const SOON: Duration = Duration::from_secs(20);

/// One open `GET …/subscribe` answer, as SSE events (keep-alive comments are not events).
struct Sse {
    label: String,
    events: std::pin::Pin<Box<dyn Stream<Item = Result<Event, String>> + Send>>,
}

impl Sse {
    /// Opens a subscription; returns the HTTP status when it is not `200`.
    async fn open(url: &str, last_event_id: Option<u64>) -> Result<Sse, (u16, String)> {
        let id = last_event_id.map(|id| id.to_string());
        let mut headers = vec![("accept", "text/event-stream")];
        headers.extend(id.as_deref().map(|id| ("last-event-id", id)));
        let resp = tokio::time::timeout(SOON, Http::new().open(hyper::Method::GET, url, None, &headers))
            .await
            .unwrap_or_else(|_| panic!("GET {url}: no answer within {SOON:?}"))
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            return Err((status, String::from_utf8_lossy(&body).into_owned()));
        }
        let events = resp.into_body().into_data_stream().eventsource().map(|r| r.map_err(|e| e.to_string()));
        Ok(Sse { label: url.to_string(), events: Box::pin(events) })
    }

    /// The next event, `None` when the server ended the stream; panics after `within`.
    async fn next(&mut self, within: Duration) -> Option<Event> {
        match tokio::time::timeout(within, self.events.next()).await {
            Err(_) => panic!("{}: no event and no end within {within:?}", self.label),
            Ok(None) => None,
            Ok(Some(Ok(ev))) => Some(ev),
            Ok(Some(Err(e))) => panic!("{}: the event stream broke: {e}", self.label),
        }
    }

    /// The next event, which must be a batch: its seq.
    async fn batch(&mut self) -> u64 {
        let ev = self.next(SOON).await.unwrap_or_else(|| panic!("{}: ended while a batch was due", self.label));
        assert_eq!(ev.event, "batch", "{}: expected a batch, got {ev:?}", self.label);
        let v: Value = serde_json::from_str(&ev.data).expect("batch JSON");
        let seq = v["seq"].as_u64().expect("seq");
        assert_eq!(ev.id, seq.to_string(), "{}: the id is the seq", self.label);
        seq
    }

    /// The next event, which must be a gap: (from, to).
    async fn gap(&mut self) -> (u64, u64) {
        let ev = self.next(SOON).await.unwrap_or_else(|| panic!("{}: ended while a gap was due", self.label));
        assert_eq!(ev.event, "gap", "{}: expected a gap, got {ev:?}", self.label);
        let v: Value = serde_json::from_str(&ev.data).expect("gap JSON");
        (v["from"].as_u64().expect("from"), v["to"].as_u64().expect("to"))
    }
}

async fn publish(c: &Cluster, node: u64, stream: &str, body: &[u8]) -> u64 {
    let url = format!("{}/v1/streams/{stream}/batches", c.url(node));
    let r = c.http.post(&url, body.to_vec()).await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert_eq!(r.status, 201, "POST {url}: {}", r.describe());
    r.json()["index"].as_u64().expect("index")
}

/// Waits until `GET /v1/streams/{name}` on `node` answers `status`.
async fn wait_stream_status(c: &Cluster, node: u64, name: &str, status: u16) {
    let url = format!("{}/v1/streams/{name}", c.url(node));
    wait_for(&format!("{url} to answer {status}"), SOON, Duration::from_millis(50), || {
        let (http, url) = (c.http.clone(), url.clone());
        async move {
            let r = http.get(&url).await?;
            if r.status == status {
                Ok(())
            } else {
                Err(r.describe())
            }
        }
    })
    .await;
}

/// SPEC §4 with a stream deleted and created again under an open subscription: the
/// subscription follows the name. On the leader and on a follower, a subscription that
/// delivered 1–10 stays open through the deletion and delivers 11–13 of the new stream; a long
/// poll after 10 does the same; a consumer whose cursor was 5 is told the gap 6–10 (the seqs
/// the deletion removed) and then gets 11–13.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_subscription_follows_its_stream_through_delete_and_recreate() {
    let c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    create_stream(&c.http, &c.url(leader), "dr").await;
    for i in 1..=10 {
        publish(&c, leader, "dr", format!("old-{i}").as_bytes()).await;
    }
    let mut subs = Vec::new();
    for node in [leader, follower] {
        let url = format!("{}/v1/streams/dr/subscribe?after=0", c.url(node));
        let mut sub = Sse::open(&url, None).await.unwrap_or_else(|e| panic!("subscribe on node {node}: {e:?}"));
        for want in 1..=10 {
            assert_eq!(sub.batch().await, want, "node {node}");
        }
        subs.push((node, sub));
    }
    let mut polls = Vec::new();
    for node in [leader, follower] {
        let url = format!("{}/v1/streams/dr/batches?after=10&wait_ms=30000", c.url(node));
        let http = c.http.clone();
        polls.push((
            node,
            tokio::spawn(
                async move { http.request(hyper::Method::GET, &url, None, &[], Duration::from_secs(40)).await },
            ),
        ));
    }
    let r = c.http.delete(&format!("{}/v1/streams/dr", c.url(follower))).await.expect("DELETE dr");
    assert_eq!(r.status, 204, "{}", r.describe());
    for node in [leader, follower] {
        wait_stream_status(&c, node, "dr", 404).await;
    }
    let r = c.http.put(&format!("{}/v1/streams/dr", c.url(leader)), None).await.expect("PUT dr");
    assert_eq!(r.status, 201, "created again: {}", r.describe());
    assert_eq!((r.json()["first_seq"].as_u64(), r.json()["evicted_through"].as_u64()), (Some(11), Some(10)));
    let mut index = 0;
    for i in 1..=3 {
        index = publish(&c, follower, "dr", format!("new-{i}").as_bytes()).await;
    }

    for (node, mut sub) in subs {
        for want in 11..=13 {
            assert_eq!(sub.batch().await, want, "node {node}: the open subscription continues on the new stream");
        }
    }
    for (node, poll) in polls {
        let r = poll.await.expect("task").unwrap_or_else(|e| panic!("long poll on node {node}: {e}"));
        assert_eq!(r.status, 200, "node {node}: the long poll waited through the deletion: {}", r.describe());
        let v = r.json();
        assert!(v["gap"].is_null(), "node {node}: nothing was missed: {v}");
        let seqs: Vec<u64> =
            v["batches"].as_array().expect("batches").iter().filter_map(|b| b["seq"].as_u64()).collect();
        assert!(!seqs.is_empty() && seqs.iter().copied().eq(11..11 + seqs.len() as u64), "node {node}: {v}");
    }
    for node in [leader, follower] {
        let url = format!("{}/v1/streams/dr/subscribe?after=0", c.url(node));
        let mut sub = Sse::open(&url, Some(5)).await.unwrap_or_else(|e| panic!("subscribe on node {node}: {e:?}"));
        assert_eq!(sub.gap().await, (6, 10), "node {node}: the seqs the deletion removed");
        for want in 11..=13 {
            assert_eq!(sub.batch().await, want, "node {node}");
        }
        let url = format!("{}/v1/streams/dr/batches?after=5&min_index={index}", c.url(node));
        let v = c.http.get(&url).await.expect("read").json();
        assert_eq!(v["gap"], serde_json::json!({"from": 6, "to": 10}), "node {node}: {v}");
        let seqs: Vec<u64> =
            v["batches"].as_array().expect("batches").iter().filter_map(|b| b["seq"].as_u64()).collect();
        assert_eq!(seqs, vec![11, 12, 13], "node {node}: {v}");
    }
}

/// A node that hears from no leader ends its subscriptions with an `unavailable` event (so a
/// client fails over to another node instead of taking `: ping` for health), refuses new ones
/// with `503 not_ready`, and serves them again once a leader is back. Checked on a follower and
/// on the leader, each cut off by stopping (SIGSTOP) the two other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_leader_ends_its_subscriptions() {
    let mut c = Cluster::start(3, &[]).await;
    let leader = c.leader().await;
    create_stream(&c.http, &c.url(leader), "cut").await;
    publish(&c, leader, "cut", b"1").await;
    let mut delivered = 1;
    for role in ["follower", "leader"] {
        let node = if role == "leader" { c.leader().await } else { c.followers().await[0] };
        let url = format!("{}/v1/streams/cut/subscribe?after=0", c.url(node));
        let mut sub = Sse::open(&url, None).await.unwrap_or_else(|e| panic!("{role}: subscribe: {e:?}"));
        for want in 1..=delivered {
            assert_eq!(sub.batch().await, want, "{role}");
        }
        let others: Vec<u64> = c.ids().into_iter().filter(|i| *i != node).collect();
        for &o in &others {
            c.pause(o);
        }
        let ev = sub.next(Duration::from_secs(30)).await;
        let ev = ev.unwrap_or_else(|| panic!("{role}: the stream ended without saying why"));
        assert_eq!(ev.event, "unavailable", "{role}: {ev:?}");
        let v: Value = serde_json::from_str(&ev.data).expect("unavailable JSON");
        assert!(v["message"].as_str().is_some_and(|m| m.contains("leader")), "{role}: {v}");
        assert!(sub.next(SOON).await.is_none(), "{role}: the server ends the stream after `unavailable`");
        match Sse::open(&url, None).await {
            Err((503, body)) => assert!(body.contains("not_ready"), "{role}: {body}"),
            Err(other) => panic!("{role}: a new subscription on a cut-off node: {other:?}"),
            Ok(_) => panic!("{role}: a cut-off node took a new subscription"),
        }
        for &o in &others {
            c.resume(o);
        }
        c.wait_leader_agreed(Duration::from_secs(30)).await;
        let l = c.leader().await;
        publish(&c, l, "cut", format!("{}", delivered + 1).as_bytes()).await;
        delivered += 1;
        // Once it hears from a leader again the node serves subscriptions as before.
        let mut sub = wait_for(
            &format!("{role}: node {node} to take subscriptions again"),
            SOON,
            Duration::from_millis(100),
            || {
                let url = url.clone();
                async move { Sse::open(&url, Some(delivered - 1)).await.map_err(|e| format!("{e:?}")) }
            },
        )
        .await;
        assert_eq!(sub.batch().await, delivered, "{role}");
    }
}
