//! Overload, against real `runnev serve` processes (docs/security.md, "Overload"): a node of a
//! three-node cluster holding thousands of idle connections, hundreds of subscribers and a
//! client that sends its body one byte a second keeps serving publishes within its bounds,
//! answers `503 overloaded` past them, cuts the slow client at its deadline, and stays within a
//! memory bound; slow request heads and bodies are cut at their deadlines; a full queue of
//! proposals refuses writes without proposing them.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Idle connections held open to the loaded node.
const IDLE_CONNECTIONS: usize = 2_000;
/// Subscriptions held open on the loaded node: its `--max-subscribers`.
const SUBSCRIBERS: usize = 500;
/// `--max-connections` of the loaded node: the idle connections and the subscribers, and room
/// for the peers' connections, the slow client and the test's own.
const CONNECTIONS_MAX: usize = 2_600;
/// File descriptors the test process (and each node, which inherits its limit) needs: every
/// connection up to the bound, and the rest of a process (logs, storage, peers) beside them.
const NOFILE_NEEDED: u64 = 4_096;
/// Memory a node may use per connection it holds on top of its idle resident size, in bytes.
/// hyper keeps an 8 KiB read buffer per connection (and a write buffer while it answers), plus
/// the connection's task and service and, for a subscription, its state and channel: about
/// 10 KiB for an idle connection and 15 KiB for a subscription, measured (debug build). Twice
/// to three times that leaves room for the allocator's slack; a node that kept a body, or a
/// buffer that grows, per connection would go past it.
const RSS_PER_CONNECTION_BYTES: u64 = 32 * 1024;

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (the nodes it starts inherit
/// it); `Err` saying why when the hard limit is below [`NOFILE_NEEDED`].
fn raise_nofile() -> Result<u64, String> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct passed, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    if lim.rlim_max < NOFILE_NEEDED {
        return Err(format!(
            "the hard RLIMIT_NOFILE is {}, under the {NOFILE_NEEDED} descriptors the test needs (raise it with ulimit -Hn)",
            lim.rlim_max
        ));
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit only reads the struct passed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(lim.rlim_cur)
}

/// The resident set size of process `pid`, in bytes (`VmRSS` of /proc/PID/status).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/PID/status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"));
    kib * 1024
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One HTTP/1.1 connection kept alive across requests (hyper's client connection).
struct KeptAlive(hyper::client::conn::http1::SendRequest<Full<Bytes>>);

impl KeptAlive {
    async fn open(port: u16) -> KeptAlive {
        let s = TcpStream::connect(("127.0.0.1", port)).await.expect("connecting");
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await.expect("a handshake");
        tokio::spawn(conn);
        KeptAlive(send)
    }

    /// Sends `method path` with `body`; the status and the answer's body.
    async fn send(&mut self, method: &str, path: &str, body: &[u8]) -> Result<(u16, String), String> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            self.0.ready().await.map_err(|e| e.to_string())?;
            let resp = self.0.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| format!("{method} {path}: no answer"))?
    }

    async fn metric(&mut self, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let (status, text) = self.send("GET", "/metrics", b"").await.expect("GET /metrics");
        assert_eq!(status, 200, "{text}");
        prom_value_where(&text, name, label)
    }
}

/// What a client that trickles its request saw.
struct Trickled {
    /// Bytes of the trickled part sent before the node closed the connection.
    sent: usize,
    /// Everything the node answered, up to its close.
    answer: String,
    /// From the first trickled byte to the close.
    elapsed: Duration,
}

/// Connects to `port`, sends `head` at once and then `trickle` one byte a second, reading the
/// answer meanwhile, until the node closes the connection; panics if it has not after `give_up`.
async fn trickle(port: u16, head: &[u8], trickle: &[u8], give_up: Duration) -> Trickled {
    let s = TcpStream::connect(("127.0.0.1", port)).await.expect("connecting");
    let (mut r, mut w) = s.into_split();
    w.write_all(head).await.expect("sending the head");
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let writer = {
        let (sent, trickle) = (sent.clone(), trickle.to_vec());
        tokio::spawn(async move {
            for b in trickle {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if w.write_all(&[b]).await.is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
            // Everything sent: hold the connection open until the node closes it.
            std::future::pending::<()>().await;
        })
    };
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(give_up, read).await.is_ok();
    let elapsed = started.elapsed();
    writer.abort();
    assert!(closed, "the node kept a trickling connection open for {give_up:?}");
    Trickled { sent: sent.load(Ordering::SeqCst), answer: String::from_utf8_lossy(&answer).into_owned(), elapsed }
}

/// Publishes `payload(stream, seq)` at `seq`; panics unless it is stored (`201`).
async fn publish_ok(http: &Http, url: &str, stream: &str, seq: u64) {
    let r = http.post(&format!("{url}/v1/streams/{stream}/batches?seq={seq}"), payload(stream, seq)).await.unwrap();
    assert_eq!(r.status, 201, "publish {seq}: {}", r.describe());
}

/// The head of a publish of `len` bytes at `seq` to stream `stream`.
fn publish_head(stream: &str, seq: u64, len: usize) -> Vec<u8> {
    format!(
        "POST /v1/streams/{stream}/batches?seq={seq} HTTP/1.1\r\nhost: 127.0.0.1\r\n\
         content-type: application/octet-stream\r\ncontent-length: {len}\r\n\r\n"
    )
    .into_bytes()
}

/// Asserts that `t` is a `408 request_timeout` answer sent before the whole body of
/// `declared` bytes arrived, then the connection's close.
fn assert_cut_with_408(t: &Trickled, declared: usize, what: &str) {
    assert!(t.answer.starts_with("HTTP/1.1 408"), "{what}: {}", t.answer);
    assert!(t.answer.contains("\"request_timeout\""), "{what}: {}", t.answer);
    assert!(t.answer.to_ascii_lowercase().contains("connection: close"), "{what}: {}", t.answer);
    assert!(t.sent < declared, "{what}: the whole body ({declared} bytes) was sent before the cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_node_serves_within_its_bounds_and_refuses_past_them() {
    let nofile = match raise_nofile() {
        Ok(n) => n,
        Err(why) => {
            return skipped(&format!("overload::a_loaded_node_serves_within_its_bounds_and_refuses_past_them: {why}"))
        }
    };
    // A head deadline longer than the test, so the idle connections stay; a short body one.
    // Plain HTTP: the test holds and trickles thousands of connections by hand, byte by byte; the
    // bounds are the same behind TLS (whose handshakes have a bound and a deadline of their own).
    let c = Cluster::start_insecure(
        3,
        &[
            "--max-connections",
            &CONNECTIONS_MAX.to_string(),
            "--max-subscribers",
            &SUBSCRIBERS.to_string(),
            "--header-read-timeout",
            "10m",
            "--body-read-timeout",
            "3s",
        ],
    )
    .await;
    // The leader takes the load: its publishes are proposed on the node under test.
    let id = c.leader().await;
    let (port, pid) = (c.node(id).port, c.node(id).pid().expect("the node runs"));
    let url = c.url(id);
    create_stream(&c.http, &url, "load").await;
    let mut seq = 0u64;
    for _ in 0..3 {
        seq += 1;
        publish_ok(&c.http, &url, "load", seq).await;
    }
    let rss_idle = rss_bytes(pid);

    // 2,000 idle connections: connected, nothing sent.
    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    for chunk in 0..IDLE_CONNECTIONS / 100 {
        let opened = futures::future::join_all((0..100).map(|_| TcpStream::connect(("127.0.0.1", port)))).await;
        for s in opened {
            idle.push(s.unwrap_or_else(|e| panic!("idle connection in chunk {chunk}: {e}")));
        }
    }
    let mut kept = KeptAlive::open(port).await;
    let waited = Instant::now();
    loop {
        match kept.metric("runnev_connections", None).await {
            Some(n) if n as usize > IDLE_CONNECTIONS => break,
            other => assert!(
                waited.elapsed() < Duration::from_secs(20),
                "the node did not take the idle connections: runnev_connections = {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rss_connections = rss_bytes(pid);

    // 500 subscribers: each connection's subscription answered 200, its events streaming.
    let mut subscribers = Vec::with_capacity(SUBSCRIBERS);
    for _ in 0..SUBSCRIBERS / 50 {
        let opened =
            futures::future::join_all((0..50).map(|_| raw_get(port, "/v1/streams/load/subscribe?after=0"))).await;
        for s in opened {
            let (conn, head) = s.expect("a subscription");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            subscribers.push(conn);
        }
    }
    let rss_subscribers = rss_bytes(pid);

    // One subscriber more than the bound: 503 overloaded.
    let (_, head) = raw_get(port, "/v1/streams/load/subscribe?after=0").await.unwrap();
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 1") && head.contains("\"overloaded\""), "{head}");

    // A client trickling its publish body, one byte a second, meanwhile.
    let declared = 60;
    let slow_seq = 1_000_000;
    let slow = tokio::spawn(async move {
        trickle(port, &publish_head("load", slow_seq, declared), &vec![b'x'; declared], Duration::from_secs(30)).await
    });

    // A fresh client's publishes are served while the subscriber bound is reached.
    let fresh = Http::new();
    for _ in 0..20 {
        seq += 1;
        publish_ok(&fresh, &url, "load", seq).await;
    }

    // Fill the connection bound; the next connection is answered 503 overloaded. (A peer's
    // pooled connection may close meanwhile and free a slot: then keep filling.)
    let mut filled = Vec::new();
    let refused = loop {
        let (conn, head) = raw_get(port, "/healthz").await.unwrap();
        if head.starts_with("HTTP/1.1 503") {
            break head;
        }
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        filled.push(conn);
        assert!(
            idle.len() + subscribers.len() + filled.len() <= CONNECTIONS_MAX,
            "{} connections served past --max-connections {CONNECTIONS_MAX}",
            idle.len() + subscribers.len() + filled.len()
        );
    };
    assert!(refused.contains("\"overloaded\"") && refused.to_ascii_lowercase().contains("retry-after: 1"), "{refused}");
    // At the bound, a connection the node holds still gets its publishes served.
    for _ in 0..5 {
        seq += 1;
        let (status, text) =
            kept.send("POST", &format!("/v1/streams/load/batches?seq={seq}"), &payload("load", seq)).await.unwrap();
        assert_eq!(status, 201, "{text}");
    }

    // The trickling client was cut at its deadline: 408, before its body was all sent.
    let slow = slow.await.expect("the slow client");
    assert_cut_with_408(&slow, declared, "a publish body trickled to a loaded node");
    let rss_end = rss_bytes(pid);
    let held = (idle.len() + subscribers.len() + filled.len()) as u64;
    assert!(kept.metric("runnev_read_timeouts_total", Some(("kind", "body"))).await >= Some(1.0));
    assert!(kept.metric("runnev_overloaded_total", Some(("bound", "connections"))).await >= Some(1.0));
    assert!(kept.metric("runnev_overloaded_total", Some(("bound", "subscribers"))).await >= Some(1.0));
    // Every publish served was stored once, the cut one not at all.
    let stored = read_all(&fresh, &url, "load", 0, REQUEST_TIMEOUT).await.unwrap();
    assert_eq!(stored.iter().map(|b| b.seq).collect::<Vec<_>>(), (1..=seq).collect::<Vec<_>>());

    println!(
        "node {id} (RLIMIT_NOFILE {nofile}): RSS idle {:.1} MiB; with {IDLE_CONNECTIONS} idle connections {:.1} MiB; \
         with {SUBSCRIBERS} subscribers too {:.1} MiB; at the connection bound ({held} held) {:.1} MiB; \
         the slow body was cut after {:?} ({} of {declared} bytes sent)",
        mib(rss_idle),
        mib(rss_connections),
        mib(rss_subscribers),
        mib(rss_end),
        slow.elapsed,
        slow.sent
    );
    let bound = rss_idle + held * RSS_PER_CONNECTION_BYTES;
    for (what, rss) in
        [("2,000 connections", rss_connections), ("500 subscribers", rss_subscribers), ("the bound", rss_end)]
    {
        assert!(rss <= bound, "RSS with {what}: {:.1} MiB, over the bound {:.1} MiB", mib(rss), mib(bound));
    }
    drop((idle, subscribers, filled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_bodies_are_cut_at_their_deadlines() {
    // Plain HTTP: heads and bodies are written by hand, a byte at a time (the deadlines run after
    // a TLS handshake the same way).
    let c = Cluster::start_insecure(1, &["--header-read-timeout", "5s", "--body-read-timeout", "2s"]).await;
    let (port, url) = (c.node(1).port, c.url(1));
    create_stream(&c.http, &url, "s").await;
    let give_up = Duration::from_secs(30);

    // A subscription outlives both deadlines: streaming an answer is no wait for a head.
    let (mut sub, head) = raw_get(port, "/v1/streams/s/subscribe?after=0").await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let slow_head = b"x-slow: ".iter().chain(&[b'a'; 60]).chain(b"\r\n\r\n").copied().collect::<Vec<u8>>();
    let frames_head = |len: usize| {
        format!(
            "POST /v1/streams/s/batches?seq=1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\
             content-type: application/vnd.runnev.frames\r\ncontent-length: {len}\r\n\r\n"
        )
        .into_bytes()
    };
    let put_head = |len: usize| {
        format!(
            "PUT /v1/streams/t HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
        .into_bytes()
    };
    let (publish, frames, put) = (publish_head("s", 1, 40), frames_head(40), put_head(40));
    let (head_cut, idle_cut, body_cut, frames_cut, put_cut) = tokio::join!(
        trickle(port, b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n", &slow_head, give_up),
        trickle(port, b"", b"", give_up),
        trickle(port, &publish, &[b'x'; 40], give_up),
        trickle(port, &frames, &[0u8; 40], give_up),
        trickle(port, &put, &[b' '; 40], give_up),
    );
    // A head that does not arrive in time: the connection closes, unanswered.
    assert!(head_cut.answer.is_empty(), "a trickled head was answered: {}", head_cut.answer);
    assert!(head_cut.sent < slow_head.len(), "the whole trickled head was sent before the cut");
    // A connection that sends nothing is closed at the same deadline.
    assert!(idle_cut.answer.is_empty(), "an idle connection was answered: {}", idle_cut.answer);
    // Bodies that do not arrive in time: 408 request_timeout, then the close.
    assert_cut_with_408(&body_cut, 40, "a publish body");
    assert_cut_with_408(&frames_cut, 40, "a frames publish body");
    assert_cut_with_408(&put_cut, 40, "a stream's retention document");
    println!(
        "head cut after {:?}, idle connection after {:?}, bodies after {:?}, {:?}, {:?}",
        head_cut.elapsed, idle_cut.elapsed, body_cut.elapsed, frames_cut.elapsed, put_cut.elapsed
    );
    assert!(c.metric(1, "runnev_read_timeouts_total", Some(("kind", "header"))).await.unwrap() >= Some(2.0));
    assert!(c.metric(1, "runnev_read_timeouts_total", Some(("kind", "body"))).await.unwrap() >= Some(3.0));

    // Nothing of the cut requests was done.
    let r = c.http.get(&format!("{url}/v1/streams/t")).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.describe());
    let r = c.http.post(&format!("{url}/v1/streams/s/batches?seq=1"), &b"whole"[..]).await.unwrap();
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(r.json()["duplicate"], false, "{}", r.describe());

    // The subscription, open all along, carries the publish.
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("id: 1") {
            let n = sub.read(&mut buf).await.expect("reading the subscription");
            assert!(n > 0, "the subscription was closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read).await.unwrap_or_else(|_| panic!("no event"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_of_proposals_refuses_writes_without_proposing_them() {
    const TRIES: u64 = 12;
    let mut c = Cluster::start(3, &["--max-queued-proposals", "1"]).await;
    let leader = c.leader().await;
    let url = c.url(leader);
    // One stream per publish: when leadership moves, the requests in flight are retried on the
    // new leader each on its own, in any order.
    for i in 1..=TRIES {
        create_stream(&c.http, &url, &format!("q{i}")).await;
    }

    // With the followers stopped nothing commits: the leader keeps its entries in flight (four
    // at most), one request waits in the queue, and the next finds it full. Leadership may have
    // moved since `leader` was read: the helper pauses the followers of the leader there is now.
    let (leader, followers) = c.pause_followers_of_leader().await;
    let url = c.url(leader);
    let http = Http::with_timeout(Duration::from_secs(30));
    let mut pending = Vec::new();
    let mut refused = None;
    for i in 1..=TRIES {
        let (http, url) = (http.clone(), url.clone());
        let task = tokio::spawn(async move {
            http.post(&format!("{url}/v1/streams/q{i}/batches?seq=1"), payload("q", i)).await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        if task.is_finished() {
            let r = task.await.unwrap();
            assert_eq!(r.status, 503, "publish {i} while nothing commits: {}", r.describe());
            assert_eq!(r.error_code().as_deref(), Some("overloaded"), "{}", r.describe());
            assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{}", r.describe());
            assert_eq!(r.header(runnev::error::OUTCOME_HEADER), None, "{}", r.describe());
            refused = Some(i);
            break;
        }
        pending.push((i, task));
    }
    let refused = refused.expect("no publish was refused with the queue full");
    assert_eq!(c.metric(leader, "runnev_proposal_queue", None).await.unwrap(), Some(1.0));
    c.resume_all(&followers);
    for (i, task) in pending {
        let mut r = task.await.unwrap();
        // The followers' election timers ran out while they were stopped, so leadership may move
        // as they resume; the requests in flight are then retried on the new leader, whose queue
        // of one may refuse some (`overloaded`: nothing proposed). Those are sent again with
        // their seq, which stores each once whatever happened before.
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        while r.status == 503 && r.error_code().as_deref() == Some("overloaded") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            r = http.post(&format!("{url}/v1/streams/q{i}/batches?seq=1"), payload("q", i)).await.unwrap();
        }
        let stored = r.status == 201 || (r.status == 200 && r.json()["duplicate"] == true);
        assert!(stored, "publish {i}, queued: {}", r.describe());
    }

    // The refused publish was never proposed: its stream is empty, and resending it (same
    // seq) stores it, once.
    let url = c.url(c.leader().await);
    for i in 1..=TRIES {
        let seqs: Vec<u64> = read_all(&c.http, &url, &format!("q{i}"), 0, REQUEST_TIMEOUT)
            .await
            .unwrap()
            .iter()
            .map(|b| b.seq)
            .collect();
        let expected = if i < refused { vec![1] } else { vec![] };
        assert_eq!(seqs, expected, "stream q{i}; publish {refused} was refused");
    }
    let r = http.post(&format!("{url}/v1/streams/q{refused}/batches?seq=1"), payload("q", refused)).await.unwrap();
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(r.json()["duplicate"], false, "{}", r.describe());
    assert!(c.metric(leader, "runnev_overloaded_total", Some(("bound", "proposals"))).await.unwrap() >= Some(1.0));
}
