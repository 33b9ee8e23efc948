//! Many batches in one request (the frames content type): a request's frames take consecutive
//! seqs from one log entry and every node serves them in order, to readers and subscribers; a
//! retry answers duplicate for the whole request and stores nothing twice; publisher seqs with a
//! partial duplicate, or a failing frame in the middle, write nothing and name the frame; a
//! malformed body is refused, naming the frame, and changes nothing; across a leader kill no
//! acknowledged frame is lost and no request is stored in part. Real `runnev serve` processes.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use hyper::Method;
use runnev::wire::encode_frames;
use serde_json::{json, Value};

const FRAMES: &str = "application/vnd.runnev.frames";

/// POSTs `body` as frames to `base`'s stream, with `?seq=` when given.
async fn post_frames(http: &Http, base: &str, stream: &str, seq: Option<u64>, body: Vec<u8>) -> Resp {
    post_typed(http, base, stream, seq, body, FRAMES).await
}

async fn post_typed(http: &Http, base: &str, stream: &str, seq: Option<u64>, body: Vec<u8>, ct: &str) -> Resp {
    let url = match seq {
        Some(s) => format!("{base}/v1/streams/{stream}/batches?seq={s}"),
        None => format!("{base}/v1/streams/{stream}/batches"),
    };
    http.request(Method::POST, &url, Some(Bytes::from(body)), &[("content-type", ct)], http.timeout)
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

fn frames_of(payloads: &[Vec<u8>]) -> Vec<u8> {
    encode_frames(payloads).expect("small payloads")
}

/// The stream's info from `base`, once it has applied log index `min_index` (a node answers
/// from its own applied state).
async fn info(http: &Http, base: &str, stream: &str, min_index: u64) -> Value {
    read_all(http, base, stream, min_index, Duration::from_secs(30)).await.expect("the node applies min_index");
    let r = http.get(&format!("{base}/v1/streams/{stream}")).await.expect("GET stream");
    assert_eq!(r.status, 200, "{}", r.describe());
    r.json()
}

/// Checks a 2xx frames answer and returns (first_seq, last_seq, ts, index).
fn ack(r: &Resp, status: u16, count: u64, duplicate: bool) -> (u64, u64, u64, u64) {
    assert_eq!(r.status, status, "{}", r.describe());
    let v = r.json();
    let keys: Vec<&str> = v.as_object().expect("an object").keys().map(String::as_str).collect();
    let mut want = vec!["count", "duplicate", "first_seq", "index", "last_seq", "ts"];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want, "the answer's keys: {v}");
    assert_eq!(v["count"], json!(count), "{v}");
    assert_eq!(v["duplicate"], json!(duplicate), "{v}");
    let (first, last) = (v["first_seq"].as_u64().unwrap(), v["last_seq"].as_u64().unwrap());
    assert_eq!(last - first + 1, count, "consecutive seqs: {v}");
    (first, last, v["ts"].as_u64().unwrap(), v["index"].as_u64().unwrap())
}

/// Checks an error answer: status, code, and the frame it names.
fn refused(r: &Resp, status: u16, code: &str, frame: Option<u64>) {
    assert_eq!(r.status, status, "{}", r.describe());
    assert_eq!(r.error_code().as_deref(), Some(code), "{}", r.describe());
    let v = r.json();
    assert_eq!(v["error"]["frame"].as_u64(), frame, "{}", r.describe());
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "an error says why: {}", r.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_take_consecutive_seqs_and_every_node_serves_them_in_order() {
    let c = Cluster::start(3, &[]).await;
    let http = c.http.clone();
    create_stream(&http, &c.url(1), "f").await;
    let follower = c.followers().await[0];
    let mut expected: Vec<(Vec<u8>, u64)> = Vec::new(); // (payload, log index) in seq order
    let mut last_index = 0;
    // Three requests of 400 frames, through the follower and the leader, with an empty payload
    // and every byte value among them.
    for round in 0..3u64 {
        let mut payloads: Vec<Vec<u8>> = (0..400).map(|i| payload(&format!("r{round}"), i)).collect();
        payloads[7] = Vec::new();
        payloads[8] = (0..=255u8).collect();
        let via = if round == 1 { c.leader().await } else { follower };
        let r = post_frames(&http, &c.url(via), "f", None, frames_of(&payloads)).await;
        let (first, last, _ts, index) = ack(&r, 201, 400, false);
        assert_eq!(first, round * 400 + 1, "server-assigned seqs continue the stream");
        assert_eq!(last, round * 400 + 400);
        assert!(index > last_index, "one new log entry per request");
        last_index = index;
        expected.extend(payloads.into_iter().map(|p| (p, index)));
    }
    // Every node serves seqs 1..=1200 with the payloads in frame order; frames of one request
    // share their ts.
    for id in c.ids() {
        let batches = read_all(&http, &c.url(id), "f", last_index, Duration::from_secs(30)).await.unwrap();
        assert_eq!(batches.len(), expected.len(), "node {id}");
        for (i, (b, (p, _))) in batches.iter().zip(&expected).enumerate() {
            assert_eq!(b.seq, i as u64 + 1, "node {id}");
            assert_eq!(&b.data, p, "node {id} seq {}", b.seq);
        }
        for chunk in batches.chunks(400) {
            assert!(chunk.iter().all(|b| b.ts == chunk[0].ts), "node {id}: one request, one ts");
        }
    }
    // Subscribers on every node get seqs 1..=1200 in order.
    for id in c.ids() {
        let url = format!("{}/v1/streams/f/subscribe?after=0", c.url(id));
        let text = curl_until(&url, &[], Duration::from_secs(60), |t| t.contains("\nid: 1200\n")).await;
        let ids: Vec<u64> =
            text.lines().filter_map(|l| l.strip_prefix("id: ")).map(|s| s.trim().parse().unwrap()).collect();
        assert_eq!(ids, (1..=1200).collect::<Vec<u64>>(), "node {id}'s subscription");
    }
    // The one-batch meaning is kept for every other content type: the same bytes as one batch.
    let body = frames_of(&[b"x".to_vec()]);
    let r = post_typed(&http, &c.url(1), "f", None, body.clone(), "application/octet-stream").await;
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(r.json()["seq"], json!(1201));
    let one = read_all(&http, &c.url(1), "f", r.json()["index"].as_u64().unwrap(), Duration::from_secs(10)).await;
    assert_eq!(one.unwrap().last().unwrap().data, body);
    // Media-type parameters and case do not matter (RFC 9110 §8.3.1).
    let r = post_typed(&http, &c.url(1), "f", None, frames_of(&[b"y".to_vec()]), "Application/VND.Runnev.Frames; v=1")
        .await;
    assert_eq!(ack(&r, 201, 1, false).0, 1202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_a_duplicate_for_every_frame_and_stores_nothing_twice() {
    let c = Cluster::start(3, &[]).await;
    let http = c.http.clone();
    create_stream(&http, &c.url(1), "r").await;
    let payloads: Vec<Vec<u8>> = (0..50).map(|i| payload("retry", i)).collect();
    let body = frames_of(&payloads);
    let r = post_frames(&http, &c.url(1), "r", Some(1), body.clone()).await;
    let (_, _, ts, index) = ack(&r, 201, 50, false);
    // The same request again, on every node: duplicate, the original's ts and index.
    for id in c.ids() {
        let again = post_frames(&http, &c.url(id), "r", Some(1), body.clone()).await;
        let (first, last, ts2, index2) = ack(&again, 200, 50, true);
        assert_eq!((first, last, ts2, index2), (1, 50, ts, index), "node {id}");
    }
    // Through the Rust client too.
    let client = c.client();
    let a = client.publish_many("r", Some(1), &payloads).await.expect("a retry through the client");
    assert!(a.duplicate && a.index == index && a.count == 50, "{a:?}");
    let i = info(&http, &c.url(1), "r", index).await;
    assert_eq!((i["last_seq"].as_u64(), i["batches"].as_u64()), (Some(50), Some(50)), "{i}");
    let stored = read_all(&http, &c.url(2), "r", index, Duration::from_secs(10)).await.unwrap();
    assert_eq!(stored.iter().map(|b| b.data.clone()).collect::<Vec<_>>(), payloads, "stored once");
    // A new request through the client continues after them.
    let more = client.publish_many("r", None, &[b"a".as_slice(), b"b"]).await.unwrap();
    assert_eq!((more.first_seq, more.last_seq, more.duplicate), (51, 52, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_seqs_with_a_partial_duplicate_or_a_failing_frame_write_nothing() {
    let c = Cluster::start(3, &[]).await;
    let http = c.http.clone();
    create_stream(&http, &c.url(1), "p").await;
    let p = |s: &str| s.as_bytes().to_vec();
    let r = post_frames(&http, &c.url(1), "p", Some(1), frames_of(&[p("a"), p("b"), p("c"), p("d"), p("e")])).await;
    let (_, _, _, index) = ack(&r, 201, 5, false);
    let before = info(&http, &c.url(1), "p", index).await;
    for id in c.ids() {
        let base = c.url(id);
        // Seqs 4..=7: 4 and 5 stored with these payloads, 6 and 7 new → partial_duplicate at
        // frame 2, nothing written.
        let r = post_frames(&http, &base, "p", Some(4), frames_of(&[p("d"), p("e"), p("f"), p("g")])).await;
        refused(&r, 409, "partial_duplicate", Some(2));
        assert!(r.json()["error"]["message"].as_str().unwrap().contains("seq=6"), "{}", r.describe());
        // A conflict in the middle, after a duplicate: its code, at its frame.
        let r = post_frames(&http, &base, "p", Some(2), frames_of(&[p("b"), p("X"), p("d")])).await;
        refused(&r, 409, "seq_conflict", Some(1));
        // A failing frame wins over a mix of duplicates and new frames.
        let r = post_frames(&http, &base, "p", Some(5), frames_of(&[p("e"), p("f")])).await;
        refused(&r, 409, "partial_duplicate", Some(1));
        let r = post_frames(&http, &base, "p", Some(4), frames_of(&[p("Z"), p("e"), p("f")])).await;
        refused(&r, 409, "seq_conflict", Some(0));
    }
    let leader = c.leader().await;
    let last = c.cluster_info(leader).await.expect("the leader's view").commit_index;
    assert_eq!(info(&http, &c.url(1), "p", last).await, before, "nothing was written");
    // The publisher resends what was new, from the frame named.
    let r = post_frames(&http, &c.url(2), "p", Some(6), frames_of(&[p("f"), p("g")])).await;
    assert_eq!(ack(&r, 201, 2, false).0, 6);
    // Holes are allowed; below the last seq where no batch is: seq_not_increasing, at its frame.
    let r = post_frames(&http, &c.url(3), "p", Some(100), frames_of(&[p("h")])).await;
    let (first, _, _, index) = ack(&r, 201, 1, false);
    assert_eq!(first, 100);
    let r = post_frames(&http, &c.url(3), "p", Some(7), frames_of(&[p("g"), p("i")])).await;
    refused(&r, 409, "seq_not_increasing", Some(1));
    let end = info(&http, &c.url(1), "p", index).await;
    assert_eq!((end["last_seq"].as_u64(), end["batches"].as_u64()), (Some(100), Some(8)), "{end}");
    let stored = read_all(&http, &c.url(1), "p", index, Duration::from_secs(10)).await.unwrap();
    let seqs: Vec<(u64, String)> = stored.iter().map(|b| (b.seq, String::from_utf8(b.data.clone()).unwrap())).collect();
    let want: Vec<(u64, String)> = [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (6, "f"), (7, "g"), (100, "h")]
        .iter()
        .map(|(s, d)| (*s, d.to_string()))
        .collect();
    assert_eq!(seqs, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_refused_naming_the_frame_and_change_nothing() {
    let c = Cluster::start(3, &["--max-batch-bytes", "1KiB", "--max-append-bytes", "64KiB"]).await;
    let http = c.http.clone();
    create_stream(&http, &c.url(1), "m").await;
    let r = post_frames(&http, &c.url(1), "m", None, frames_of(&[b"ok".to_vec()])).await;
    let (_, _, _, index) = ack(&r, 201, 1, false);
    let two = frames_of(&[b"ab".to_vec(), b"cde".to_vec()]);
    let mut trailing = two.clone();
    trailing.extend_from_slice(&[0, 0]);
    let many = vec![0u8; 4 * 10_001];
    let big = frames_of(&[b"a".to_vec(), vec![1; 1025]]);
    let over = frames_of(&vec![vec![2u8; 1000]; 70]);
    let leader = c.leader().await;
    for id in c.ids() {
        let base = c.url(id);
        let via = if id == leader { "leader" } else { "follower" };
        println!("bad bodies through node {id} ({via})");
        refused(&post_frames(&http, &base, "m", None, Vec::new()).await, 400, "invalid_body", None);
        refused(&post_frames(&http, &base, "m", None, trailing.clone()).await, 400, "invalid_body", Some(2));
        refused(
            &post_frames(&http, &base, "m", None, two[..two.len() - 1].to_vec()).await,
            400,
            "invalid_body",
            Some(1),
        );
        refused(&post_frames(&http, &base, "m", None, many.clone()).await, 413, "payload_too_large", Some(10_000));
        refused(&post_frames(&http, &base, "m", None, big.clone()).await, 413, "payload_too_large", Some(1));
        let r = post_frames(&http, &base, "m", None, over.clone()).await;
        assert_eq!((r.status, r.error_code().as_deref()), (413, Some("payload_too_large")), "{}", r.describe());
        // Seqs past 2^64-2: the first frame past it, before anything is proposed.
        let top = u64::MAX - 1;
        refused(&post_frames(&http, &base, "m", Some(top), two.clone()).await, 400, "invalid_seq", Some(1));
        let r = post_frames(&http, &base, "m", Some(0), two.clone()).await;
        assert_eq!((r.status, r.error_code().as_deref()), (400, Some("invalid_seq")), "{}", r.describe());
        // A missing stream: 404, nothing created.
        let r = post_frames(&http, &base, "nope", None, two.clone()).await;
        assert_eq!((r.status, r.error_code().as_deref()), (404, Some("stream_not_found")), "{}", r.describe());
    }
    // Nothing changed: the stream holds its one batch, and no node created "nope" (checked
    // once each node has applied all the leader committed).
    let leader = c.leader().await;
    let last = c.cluster_info(leader).await.expect("the leader's view").commit_index.max(index);
    for id in c.ids() {
        let stored = read_all(&http, &c.url(id), "m", last, Duration::from_secs(10)).await.unwrap();
        assert_eq!(stored.iter().map(|b| (b.seq, b.data.clone())).collect::<Vec<_>>(), vec![(1, b"ok".to_vec())]);
        let r = http.get(&format!("{}/v1/streams/nope", c.url(id))).await.unwrap();
        assert_eq!(r.status, 404, "{}", r.describe());
    }
    // Exactly at the limits is accepted: a 1 KiB frame, and a body of exactly 64 KiB.
    let at_batch = frames_of(&[vec![3; 1024]]);
    ack(&post_frames(&http, &c.url(1), "m", None, at_batch).await, 201, 1, false);
    let n = 64 * 1024 / (4 + 1020);
    let at_append = frames_of(&vec![vec![4u8; 1020]; n]);
    assert_eq!(at_append.len(), 64 * 1024);
    ack(&post_frames(&http, &c.url(2), "m", None, at_append).await, 201, n as u64, false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_publishes_each_line_as_a_batch() {
    let c = Cluster::start(3, &[]).await;
    let http = c.http.clone();
    create_stream(&http, &c.url(1), "lines").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.txt");
    let lines: Vec<String> = (0..25_000).map(|i| format!("line {i}")).collect();
    std::fs::write(&file, format!("{}\n", lines.join("\n"))).unwrap();
    let nodes = c.urls().join(",");
    let f = file.to_str().unwrap();
    let run = cli(&["publish", "lines", "--frames", "--seq", "1", "--file", f, "--nodes", &nodes], &[]).await;
    run.expect_code(0, "publish --frames");
    let answers = run.json_lines();
    // 25,000 lines: three requests of at most 10,000 frames, consecutive.
    let ranges: Vec<(u64, u64, bool)> = answers
        .iter()
        .map(|a| (a["first_seq"].as_u64().unwrap(), a["last_seq"].as_u64().unwrap(), a["duplicate"].as_bool().unwrap()))
        .collect();
    assert_eq!(ranges, vec![(1, 10_000, false), (10_001, 20_000, false), (20_001, 25_000, false)]);
    // Run again: every request a duplicate, nothing stored twice.
    let again = cli(&["publish", "lines", "--frames", "--seq", "1", "--file", f, "--nodes", &nodes], &[]).await;
    again.expect_code(0, "publish --frames again");
    assert!(again.json_lines().iter().all(|a| a["duplicate"] == json!(true)), "{again:#?}");
    let index = answers.last().unwrap()["index"].as_u64().unwrap();
    let stored = read_all(&http, &c.url(3), "lines", index, Duration::from_secs(30)).await.unwrap();
    assert_eq!(stored.len(), 25_000);
    assert!(stored.iter().zip(&lines).all(|(b, l)| b.data == l.as_bytes()), "each line is its batch");
    // A partial duplicate is refused with exit status 4 (refused), naming the frame.
    std::fs::write(&file, "line 24999\nnew\n").unwrap();
    let mixed = cli(&["publish", "lines", "--frames", "--seq", "25000", "--file", f, "--nodes", &nodes], &[]).await;
    mixed.expect_code(4, "a partial duplicate");
    assert!(mixed.stderr.contains("partial_duplicate"), "{mixed:#?}");
}

/// What one frames request did: its payloads, when it was sent, and its answer if any.
struct Sent {
    payloads: Vec<Vec<u8>>,
    sent: Instant,
    ack: Option<(u64, u64, u64)>, // first_seq, last_seq, index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_frame_is_lost_across_a_leader_kill() {
    let mut c = Cluster::start(3, &[]).await;
    let http = Http::with_timeout(Duration::from_secs(4));
    create_stream(&http, &c.url(1), "k").await;
    let urls: Vec<String> = c.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut tasks = Vec::new();
    for p in 0..2u64 {
        let (http, stop, sent, urls) = (http.clone(), stop.clone(), sent.clone(), urls.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            let hard_deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < hard_deadline {
                i += 1;
                let payloads: Vec<Vec<u8>> = (0..200).map(|k| payload(&format!("p{p}r{i}"), k)).collect();
                let base = &urls[((p + i) % urls.len() as u64) as usize];
                let at = Instant::now();
                let url = format!("{base}/v1/streams/k/batches");
                let r = http
                    .request(
                        Method::POST,
                        &url,
                        Some(Bytes::from(frames_of(&payloads))),
                        &[("content-type", FRAMES)],
                        http.timeout,
                    )
                    .await;
                let ack = match &r {
                    Ok(r) if r.status == 201 => {
                        let v = r.json();
                        Some((
                            v["first_seq"].as_u64().unwrap(),
                            v["last_seq"].as_u64().unwrap(),
                            v["index"].as_u64().unwrap(),
                        ))
                    }
                    _ => None,
                };
                let failed = ack.is_none();
                sent.lock().unwrap().push(Sent { payloads, sent: at, ack });
                if failed {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    let acked = |sent: &Arc<Mutex<Vec<Sent>>>, since: Instant| {
        sent.lock().unwrap().iter().filter(|s| s.ack.is_some() && s.sent >= since).count()
    };
    let started = Instant::now();
    wait_for("acknowledged frames before the kill", Duration::from_secs(30), Duration::from_millis(20), || {
        let n = acked(&sent, started);
        async move {
            if n >= 10 {
                Ok(())
            } else {
                Err(format!("{n} acknowledged"))
            }
        }
    })
    .await;
    let old_leader = c.leader().await;
    let kill_at = Instant::now();
    c.kill_9(old_leader);
    wait_for("acknowledged frames sent after the kill", Duration::from_secs(30), Duration::from_millis(20), || {
        let n = acked(&sent, kill_at);
        async move {
            if n >= 10 {
                Ok(())
            } else {
                Err(format!("{n} acknowledged since the kill"))
            }
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    c.restart(old_leader).await;
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let max_index = sent.iter().filter_map(|s| s.ack.map(|a| a.2)).max().unwrap();
    let acks = sent.iter().filter(|s| s.ack.is_some()).count();
    println!("{} requests, {acks} acknowledged; leader {old_leader} killed and restarted", sent.len());
    let mut histories = Vec::new();
    for id in c.ids() {
        let stored = read_all(&http, &c.url(id), "k", max_index, Duration::from_secs(60)).await.unwrap();
        let by_payload: BTreeMap<&[u8], u64> = stored.iter().map(|b| (b.data.as_slice(), b.seq)).collect();
        assert_eq!(by_payload.len(), stored.len(), "node {id}: a payload stored twice");
        for s in &sent {
            let seqs: Vec<Option<u64>> = s.payloads.iter().map(|p| by_payload.get(p.as_slice()).copied()).collect();
            if let Some((first, last, _)) = s.ack {
                let want: Vec<Option<u64>> = (first..=last).map(Some).collect();
                assert_eq!(seqs, want, "node {id}: an acknowledged request's frames at their seqs");
            } else if seqs.iter().any(Option::is_some) {
                // Unacknowledged (outcome unknown): all of it or none, at consecutive seqs.
                let first = seqs[0].expect("all frames of a request or none");
                let want: Vec<Option<u64>> = (first..first + seqs.len() as u64).map(Some).collect();
                assert_eq!(seqs, want, "node {id}: an unacknowledged request stored in part");
            }
        }
        histories.push(stored);
    }
    assert!(histories.windows(2).all(|w| w[0] == w[1]), "every node serves the same history");
}

/// A request at the default limits, 8 MiB of frames each at the default 1 MiB batch limit, is
/// one log entry that replicates whole: acknowledged, and served by every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_at_the_default_limits_replicates_whole() {
    let c = Cluster::start(3, &[]).await;
    let http = Http::with_timeout(Duration::from_secs(30));
    create_stream(&http, &c.url(1), "big").await;
    // 8 frames of 1 MiB less their header: exactly 8 MiB of body.
    let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1024 * 1024 - 4]).collect();
    let body = frames_of(&payloads);
    assert_eq!(body.len(), 8 * 1024 * 1024);
    let follower = c.followers().await[0];
    // A `503` that says nothing was done (no `Runnev-Outcome: unknown`) is retried as the
    // contract allows: on a loaded machine, forwarding 8 MiB can outlast the 5 s leader wait.
    let r = wait_for("the 8 MiB request to be taken", Duration::from_secs(60), Duration::from_millis(500), || {
        let (http, url, body) = (&http, c.url(follower), body.clone());
        async move {
            let r = post_frames(http, &url, "big", None, body).await;
            let nothing_done = r.status == 503 && r.header("runnev-outcome").as_deref() != Some("unknown");
            if nothing_done {
                Err(r.describe())
            } else {
                Ok(r)
            }
        }
    })
    .await;
    let (first, last, _, index) = ack(&r, 201, 8, false);
    assert_eq!((first, last), (1, 8));
    for id in c.ids() {
        let stored = read_all(&http, &c.url(id), "big", index, Duration::from_secs(30)).await.unwrap();
        assert_eq!(stored.iter().map(|b| b.data.clone()).collect::<Vec<_>>(), payloads, "node {id}");
    }
}
