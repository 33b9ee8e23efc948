//! Bad input gets the SPEC's error answers (status, JSON error body, Runnev-Node header) on
//! every node, never crashes a node and never changes state (streams, batches, leader, term,
//! members): one rule per test, each on a cluster of its own ([`Fixture`]). The client routes,
//! the membership routes, and the Raft routes between nodes (garbage, truncated postcard of
//! requests that would change the term if they decoded, oversized bodies).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use hyper::Method;
use serde_json::Value;

const MAX_BATCH: usize = 1_048_576;

struct Checker {
    http: Http,
    failures: Vec<String>,
    checked: usize,
}

impl Checker {
    /// Sends the request and checks it gets `status` with error `code` in a SPEC error body,
    /// Content-Type application/json and a Runnev-Node header. Failures are collected.
    #[allow(clippy::too_many_arguments)] // one call site per table row reads best flat
    async fn expect_error(
        &mut self,
        node: u64,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        content_type: Option<&str>,
        status: u16,
        code: &str,
    ) {
        self.checked += 1;
        let headers: Vec<(&str, &str)> = content_type.map(|ct| vec![("content-type", ct)]).unwrap_or_default();
        let label = format!("node {node}: {method} {}", short_url(url));
        let r = match self.http.request(method.clone(), url, body, &headers, Duration::from_secs(10)).await {
            Ok(r) => r,
            Err(e) => {
                self.failures.push(format!("{label}: expected {status} {code}, got a transport error: {e}"));
                return;
            }
        };
        if let Some(problem) = error_problem(&r, status, code) {
            self.failures.push(format!("{label}: expected {status} {code}: {problem}; got {}", r.describe()));
        }
    }

    async fn expect_status(
        &mut self,
        node: u64,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        status: u16,
    ) -> Option<Resp> {
        self.checked += 1;
        let label = format!("node {node}: {method} {}", short_url(url));
        match self.http.request(method, url, body, &[], Duration::from_secs(10)).await {
            Ok(r) => {
                if r.status != status {
                    self.failures.push(format!("{label}: expected {status}, got {}", r.describe()));
                } else if r.header("runnev-node").is_none() {
                    self.failures.push(format!("{label}: no Runnev-Node header"));
                }
                Some(r)
            }
            Err(e) => {
                self.failures.push(format!("{label}: expected {status}, got a transport error: {e}"));
                None
            }
        }
    }
}

fn short_url(url: &str) -> String {
    let path = url.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap_or_else(|| url.to_owned());
    truncate(&path, 120)
}

/// What is wrong with `r` as a SPEC error answer with `status` and `code`, if anything.
fn error_problem(r: &Resp, status: u16, code: &str) -> Option<String> {
    let mut problems = Vec::new();
    if r.status != status {
        problems.push(format!("status {}", r.status));
    }
    match r.header("content-type") {
        Some(ct) if ct.to_ascii_lowercase().starts_with("application/json") => {}
        other => problems.push(format!("Content-Type {other:?}")),
    }
    match r.header("runnev-node").map(|h| h.trim().parse::<u64>()) {
        Some(Ok(n)) if (1..=3).contains(&n) => {}
        other => problems.push(format!("Runnev-Node header {other:?}")),
    }
    match r.try_json() {
        None => problems.push("body is not JSON".into()),
        Some(v) => {
            let e = &v["error"];
            if e["code"].as_str() != Some(code) {
                problems.push(format!("error.code {}", e["code"]));
            }
            match e["message"].as_str() {
                Some(m) if !m.trim().is_empty() => {}
                _ => problems.push(format!("error.message {}", e["message"])),
            }
        }
    }
    if problems.is_empty() {
        None
    } else {
        Some(problems.join(", "))
    }
}

#[derive(PartialEq)]
struct State {
    list: Vec<Value>,
    good: Value,
    long: Value,
    batches: Vec<Batch>,
    /// The node's view of Raft: (leader, term, members as (id, addr, voter)).
    raft: (Option<u64>, u64, Vec<(u64, String, bool)>),
}

impl State {
    /// A short description of how `self` differs from `other` (None when equal).
    fn diff(&self, other: &State) -> Option<String> {
        let mut d = Vec::new();
        if self.list != other.list {
            d.push(format!(
                "GET /v1/streams: {} vs {}",
                Value::Array(self.list.clone()),
                Value::Array(other.list.clone())
            ));
        }
        if self.good != other.good {
            d.push(format!("info of 'good': {} vs {}", self.good, other.good));
        }
        if self.long != other.long {
            d.push(format!("info of the 128-char stream: {} vs {}", self.long, other.long));
        }
        if self.batches != other.batches {
            let sum = |bs: &[Batch]| {
                bs.iter()
                    .map(|b| format!("(seq {} ts {} {} bytes)", b.seq, b.ts, b.data.len()))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            d.push(format!(
                "batches of 'good': [{}] vs [{}]{}",
                sum(&self.batches),
                sum(&other.batches),
                if self.batches.len() == other.batches.len() { " (bytes differ)" } else { "" }
            ));
        }
        if self.raft != other.raft {
            d.push(format!("(leader, term, members): {:?} vs {:?}", self.raft, other.raft));
        }
        if d.is_empty() {
            None
        } else {
            Some(d.join("; "))
        }
    }
}

/// The node's view of the streams, after it has applied `min_index`, and of Raft.
async fn state_of(c: &Cluster, node: u64, long_name: &str, min_index: u64) -> State {
    let http = &c.http;
    let base = c.url(node);
    // First the min_index read, so the node has applied everything before the other reads.
    let batches = read_all(http, &base, "good", min_index, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| panic!("node {node}: reading 'good': {e}"));
    let r = http.get(&format!("{base}/v1/streams")).await.expect("GET /v1/streams");
    assert_eq!(r.status, 200, "node {node} GET /v1/streams: {}", r.describe());
    let mut list = r.json()["streams"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("node {node}: no streams array: {}", r.describe()));
    list.sort_by_key(|v| v["name"].as_str().unwrap_or_default().to_owned());
    let info = |name: String| {
        let url = format!("{base}/v1/streams/{name}");
        async move {
            let r = http.get(&url).await.expect("GET stream info");
            assert_eq!(r.status, 200, "node {node} GET {url}: {}", r.describe());
            r.json()
        }
    };
    let good = info("good".into()).await;
    let long = info(long_name.to_owned()).await;
    let v = c.cluster_info(node).await.unwrap_or_else(|e| panic!("node {node}: /v1/cluster: {e}"));
    let mut members: Vec<(u64, String, bool)> = v.members.iter().map(|m| (m.id, m.addr.clone(), m.voter)).collect();
    members.sort();
    State { list, good, long, batches, raft: (v.leader_id, v.term, members) }
}

/// A cluster with two streams and four batches (the last exactly `MAX_BATCH` bytes), every
/// node's view of them, and a [`Checker`]: each test below sends one kind of bad request to every
/// node, then [`Fixture::finish`] checks that nothing changed and every node is still up.
struct Fixture {
    c: Cluster,
    long_name: String,
    max_index: u64,
    big: Vec<u8>,
    before: Vec<State>,
    ck: Checker,
}

impl Fixture {
    async fn start() -> Fixture {
        Fixture::with(Cluster::start(3, &[]).await).await
    }

    /// Plain HTTP: the Raft routes of a secure node refuse any caller without a node certificate
    /// (403, tests/security.rs) before the parsing and version checks these tests are about.
    async fn start_insecure() -> Fixture {
        Fixture::with(Cluster::start_insecure(3, &[]).await).await
    }

    async fn with(c: Cluster) -> Fixture {
        let http = c.http.clone();
        let leader = c.leader().await;
        let lurl = c.url(leader);

        create_stream(&http, &lurl, "good").await;
        let long_name: String = "L".repeat(128);
        let r = http.put(&format!("{lurl}/v1/streams/{long_name}"), None).await.unwrap();
        assert_eq!(r.status, 201, "a 128-char name is valid: {}", r.describe());
        let mut max_index = 0;
        for i in 1..=3u64 {
            let r = http.post(&format!("{lurl}/v1/streams/good/batches"), format!("batch-{i}")).await.unwrap();
            assert_eq!(r.status, 201, "{}", r.describe());
            assert_eq!(r.json()["seq"].as_u64(), Some(i), "{}", r.describe());
            max_index = max_index.max(r.json()["index"].as_u64().unwrap());
        }
        // Exactly max_batch_bytes is accepted (through a follower, so forwarding carries it).
        let follower = c.followers().await[0];
        let big: Vec<u8> = (0..MAX_BATCH).map(|i| (i % 251) as u8).collect();
        let r = http.post(&format!("{}/v1/streams/good/batches", c.url(follower)), big.clone()).await.unwrap();
        assert_eq!(r.status, 201, "a payload of exactly {MAX_BATCH} bytes must be accepted: {}", r.describe());
        assert_eq!(r.json()["seq"].as_u64(), Some(4), "{}", r.describe());
        max_index = max_index.max(r.json()["index"].as_u64().unwrap());

        let mut before = Vec::new();
        for id in c.ids() {
            before.push(state_of(&c, id, &long_name, max_index).await);
        }
        assert_eq!(before[0].batches.len(), 4, "setup: 'good' should hold 4 batches");
        assert!(before[0].batches[3].data == big, "the 1 MiB batch does not read back byte for byte");
        for (i, s) in before.iter().enumerate().skip(1) {
            if let Some(d) = s.diff(&before[0]) {
                panic!("setup: node {} vs node 1 differ: {d}", i + 1);
            }
        }
        let ck = Checker { http, failures: Vec::new(), checked: 0 };
        Fixture { c, long_name, max_index, big, before, ck }
    }

    /// Every node is up, holds exactly what it held before the bad requests, and no stream they
    /// named was created; then every check of the test must have passed.
    async fn finish(mut self) {
        let (c, ck, http) = (&self.c, &mut self.ck, self.c.http.clone());
        for id in c.ids() {
            let r = http.get(&format!("{}/healthz", c.url(id))).await;
            match r {
                Ok(r) if r.status == 200 => {}
                other => ck.failures.push(format!("node {id} /healthz after the bad requests: {other:?}")),
            }
        }
        // Wait for anything a bad request might have (wrongly) committed to be applied everywhere:
        // read with min_index = the leader's current commit index.
        let leader = c.leader().await;
        let commit = c.cluster_info(leader).await.unwrap().commit_index;
        for (i, id) in c.ids().into_iter().enumerate() {
            let after = state_of(c, id, &self.long_name, commit.max(self.max_index)).await;
            if let Some(d) = self.before[i].diff(&after) {
                ck.failures.push(format!("node {id}: state changed by the bad requests (before vs after): {d}"));
            }
        }
        for name in ["x", "missing"] {
            let r = http.get(&format!("{}/v1/streams/{name}", c.url(leader))).await.unwrap();
            if r.status != 404 {
                ck.failures.push(format!("stream {name} should not exist: {}", r.describe()));
            }
        }

        println!("{} checks, {} failures", ck.checked, ck.failures.len());
        assert!(
            ck.failures.is_empty(),
            "{} of {} checks failed:\n{}",
            ck.failures.len(),
            ck.checked,
            ck.failures.join("\n")
        );
    }
}

/// Malformed or mistyped JSON bodies → 400 invalid_body (new and existing stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_invalid_body() {
    let mut f = Fixture::start().await;
    let bodies: Vec<&[u8]> = vec![
        b"{",
        b"not json",
        b"{\"retention\": 5}",
        b"{\"retention\": {\"max_batches\": \"ten\"}}",
        b"{\"retention\": {\"max_batches\": -1}}",
        b"[1, 2, 3]",
        b"\xff\xfe\x00",
        // An array where the retention object goes: serde would read the limits from it in
        // order (found by Schemathesis: `[null, null]` was taken as "no limits").
        b"{\"retention\": [null, null]}",
        b"{\"retention\": [1, 2, 3]}",
        b"{\"retention\": null}",
    ];
    for id in f.c.ids() {
        let base = f.c.url(id);
        for name in ["x", "good"] {
            for b in &bodies {
                f.ck.expect_error(
                    id,
                    Method::PUT,
                    &format!("{base}/v1/streams/{name}"),
                    Some(Bytes::copy_from_slice(b)),
                    Some("application/json"),
                    400,
                    "invalid_body",
                )
                .await;
            }
        }
    }
    f.finish().await;
}

/// Bad token requests → 400, and no token is created: a grant given as an array instead of an
/// object (serde would read its fields from it in order: the fault Schemathesis found in a
/// stream's retention), and a token name in the path that is not valid percent-encoded UTF-8
/// (it was answered by axum's own plain-text rejection, not the JSON error body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_requests_are_refused() {
    let mut f = Fixture::start().await;
    // The tokens before (the harness's admin token when it runs secure, none when plain).
    let leader = f.c.leader().await;
    let before = f.c.http.get(&format!("{}/v1/auth/tokens", f.c.url(leader))).await.unwrap();
    assert_eq!(before.status, 200, "{}", before.describe());
    let before = before.json()["tokens"].clone();
    assert!(before.as_array().is_some_and(|t| t.iter().all(|t| t["name"] != "t1")), "{before}");
    let bodies: Vec<&[u8]> = vec![
        br#"{"name": "t1", "grants": [["read", "*"]]}"#,
        br#"{"name": "t1", "grants": [{"permission": "read", "streams": "*"}, ["admin", "*"]]}"#,
        br#"{"name": "t1", "grants": [null]}"#,
    ];
    for id in f.c.ids() {
        let base = f.c.url(id);
        for b in &bodies {
            let url = format!("{base}/v1/auth/tokens");
            let body = Some(Bytes::copy_from_slice(b));
            f.ck.expect_error(id, Method::POST, &url, body, Some("application/json"), 400, "invalid_body").await;
        }
        let url = format!("{base}/v1/auth/tokens/%FF");
        f.ck.expect_error(id, Method::DELETE, &url, None, None, 400, "invalid_parameter").await;
    }
    let leader = f.c.leader().await;
    let r = f.c.http.get(&format!("{}/v1/auth/tokens", f.c.url(leader))).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(r.json()["tokens"], before, "no token may be created: {}", r.describe());
    f.finish().await;
}

/// Unknown paths → 404 not_found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_not_found() {
    let mut f = Fixture::start().await;
    for id in f.c.ids() {
        let base = f.c.url(id);
        for (m, p) in [
            (Method::GET, "/nope"),
            (Method::GET, "/v1/nope"),
            (Method::GET, "/v1/streams/good/nope"),
            (Method::POST, "/v1/nothing/here"),
            (Method::GET, "/v2/streams"),
        ] {
            f.ck.expect_error(id, m, &format!("{base}{p}"), None, None, 404, "not_found").await;
        }
    }
    f.finish().await;
}

/// Bad stream names → 400 invalid_stream_name, on every stream endpoint; an empty name is a
/// path problem: some 4xx, still a SPEC error body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stream_names_are_invalid_stream_name() {
    let mut f = Fixture::start().await;
    let too_long = "a".repeat(129);
    let bad_names =
        ["a%20b", too_long.as_str(), "..", ".", "%2E%2E", "a%2Fb", "a%5Cb", "%C3%A9", "a*b", "a%00b", "a+b", "a~b"];
    for id in f.c.ids() {
        let base = f.c.url(id);
        for name in bad_names {
            for (m, suffix, body) in [
                (Method::PUT, "", None),
                (Method::GET, "", None),
                (Method::DELETE, "", None),
                (Method::POST, "/batches", Some(Bytes::from_static(b"x"))),
                (Method::GET, "/batches", None),
                (Method::GET, "/subscribe", None),
            ] {
                f.ck.expect_error(
                    id,
                    m,
                    &format!("{base}/v1/streams/{name}{suffix}"),
                    body,
                    None,
                    400,
                    "invalid_stream_name",
                )
                .await;
            }
        }
        f.ck.checked += 1;
        let url = format!("{base}/v1/streams/");
        match f.c.http.put(&url, None).await {
            Ok(r) => {
                let code = r.error_code().unwrap_or_default();
                let st = r.status;
                if !(400..500).contains(&st) || error_problem(&r, st, &code).is_some() || code.is_empty() {
                    f.ck.failures.push(format!(
                        "node {id}: PUT /v1/streams/ (empty name): expected a 4xx SPEC error, got {}",
                        r.describe()
                    ));
                }
            }
            Err(e) => f.ck.failures.push(format!("node {id}: PUT /v1/streams/: {e}")),
        }
    }
    f.finish().await;
}

/// A missing stream → 404 stream_not_found, for writes and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_streams_are_stream_not_found() {
    let mut f = Fixture::start().await;
    for id in f.c.ids() {
        let base = f.c.url(id);
        for (m, p, body) in [
            (Method::POST, "/v1/streams/missing/batches", Some(Bytes::from_static(b"x"))),
            (Method::POST, "/v1/streams/missing/batches?seq=5", Some(Bytes::from_static(b"x"))),
            (Method::GET, "/v1/streams/missing", None),
            (Method::GET, "/v1/streams/missing/batches?after=0", None),
            (Method::DELETE, "/v1/streams/missing", None),
        ] {
            f.ck.expect_error(id, m, &format!("{base}{p}"), body, None, 404, "stream_not_found").await;
        }
    }
    f.finish().await;
}

/// One byte over max_batch_bytes → 413 payload_too_large. Sent on a client of its own, so that
/// the connection a refused body leaves behind (kept open once the node has read the rest of it:
/// `oversized_publish_is_answered_413_to_a_client_still_writing`) is not reused by the checks
/// that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_over_the_batch_limit_is_payload_too_large() {
    let mut f = Fixture::start().await;
    let mut over = f.big.clone();
    over.push(7);
    for id in f.c.ids() {
        let base = f.c.url(id);
        let shared = std::mem::take(&mut f.ck.http);
        f.ck.expect_error(
            id,
            Method::POST,
            &format!("{base}/v1/streams/good/batches"),
            Some(Bytes::from(over.clone())),
            Some("application/octet-stream"),
            413,
            "payload_too_large",
        )
        .await;
        f.ck.http = shared;
    }
    f.finish().await;
}

/// A bad `?seq` → 400 invalid_seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_seqs_are_invalid_seq() {
    let mut f = Fixture::start().await;
    for id in f.c.ids() {
        let base = f.c.url(id);
        for s in ["abc", "0", "-1", "1.5", "18446744073709551616", "0x10", "%201"] {
            f.ck.expect_error(
                id,
                Method::POST,
                &format!("{base}/v1/streams/good/batches?seq={s}"),
                Some(Bytes::from_static(b"should-not-be-written")),
                None,
                400,
                "invalid_seq",
            )
            .await;
        }
    }
    f.finish().await;
}

/// The idempotency answers write nothing: another payload at a stored seq → 409 seq_conflict,
/// the same payload → 200 `duplicate: true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_answers_write_nothing() {
    let mut f = Fixture::start().await;
    for id in f.c.ids() {
        let base = f.c.url(id);
        f.ck.expect_error(
            id,
            Method::POST,
            &format!("{base}/v1/streams/good/batches?seq=2"),
            Some(Bytes::from_static(b"not-batch-2")),
            None,
            409,
            "seq_conflict",
        )
        .await;
        if let Some(r) =
            f.ck.expect_status(
                id,
                Method::POST,
                &format!("{base}/v1/streams/good/batches?seq=2"),
                Some(Bytes::from_static(b"batch-2")),
                200,
            )
            .await
        {
            if r.status == 200 {
                let v = r.json();
                if v["duplicate"] != Value::Bool(true) || v["seq"].as_u64() != Some(2) {
                    f.ck.failures.push(format!("node {id}: duplicate publish of seq 2: {v}"));
                }
            }
        }
    }
    f.finish().await;
}

/// Bad read parameters → 400 invalid_parameter, while the boundaries are fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_read_parameters_are_invalid_parameter() {
    let mut f = Fixture::start().await;
    for id in f.c.ids() {
        let base = f.c.url(id);
        for q in [
            "limit=0",
            "limit=10001",
            "limit=-1",
            "limit=abc",
            "wait_ms=60001",
            "wait_ms=-1",
            "wait_ms=abc",
            "after=xyz",
            "after=1.5",
            "after=-2",
            "min_index=abc",
            "min_index=-1",
        ] {
            f.ck.expect_error(
                id,
                Method::GET,
                &format!("{base}/v1/streams/good/batches?{q}"),
                None,
                None,
                400,
                "invalid_parameter",
            )
            .await;
        }
        for q in ["limit=1", "limit=10000", "wait_ms=0", "wait_ms=60000&after=0", "after=-1", "after=0&limit=2"] {
            f.ck.expect_status(id, Method::GET, &format!("{base}/v1/streams/good/batches?{q}"), None, 200).await;
        }
    }
    f.finish().await;
}

/// A publish one byte over the limit is answered 413 to a client that is still writing its
/// body: the node reads and drops the rest of the body first (RFC 9112 §9.6), so the client's
/// write completes and it reads the answer, not a reset (a hyper client used to get
/// `BrokenPipe` instead of the 413 when the node answered and closed mid-write). The writer here
/// pauses after the first 64 KiB, past the moment the node answers, so the race always goes the
/// way that used to fail. Then the connection must serve the next request, or have announced
/// `Connection: close`. Raw bytes, so that no client-side pool retry hides the behaviour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_publish_is_answered_413_to_a_client_still_writing() {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

    /// Reads one HTTP/1.1 response with a Content-Length body; returns (head, body).
    async fn read_response<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut Vec<u8>) -> Result<(String, Vec<u8>), String> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        if k.trim().eq_ignore_ascii_case("content-length") {
                            v.trim().parse::<usize>().ok()
                        } else {
                            None
                        }
                    })
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    let body = buf[end + 4..end + 4 + len].to_vec();
                    buf.drain(..end + 4 + len);
                    return Ok((head, body));
                }
            }
            let mut chunk = [0u8; 8192];
            match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut chunk)).await {
                Err(_) => return Err("no complete response within 10 s".into()),
                Ok(Err(e)) => return Err(format!("read error: {e}")),
                Ok(Ok(0)) => {
                    return Err(format!("connection closed by the server ({} bytes of a response read)", buf.len()))
                }
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    let c = Cluster::start(1, &[]).await;
    create_stream(&c.http, &c.url(1), "good").await;
    let addr = c.node(1).addr();

    let auth = c.auth_line();
    let sock = c.connect_raw(1).await.expect("connect");
    let (mut rd, mut wr) = tokio::io::split(sock);
    let mut req = format!(
        "POST /v1/streams/good/batches HTTP/1.1\r\nHost: {addr}\r\n{auth}\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        MAX_BATCH + 1
    )
    .into_bytes();
    let head_len = req.len();
    req.extend(std::iter::repeat_n(b'z', MAX_BATCH + 1));
    let writer = tokio::spawn(async move {
        let (first, rest) = req.split_at(head_len + 64 * 1024);
        let mut ok = wr.write_all(first).await.is_ok();
        // The node has the head and knows the length: it answers now, while the rest is unsent.
        tokio::time::sleep(Duration::from_millis(500)).await;
        ok = ok && wr.write_all(rest).await.is_ok() && wr.flush().await.is_ok();
        (wr, ok)
    });

    let mut buf = Vec::new();
    let (head, body) = read_response(&mut rd, &mut buf)
        .await
        .unwrap_or_else(|e| panic!("no answer to a {}-byte publish: {e}", MAX_BATCH + 1));
    let (mut wr, wrote_all) = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("writing the oversized request did not finish within 10 s")
        .expect("writer task");
    println!("first answer (request body fully written: {wrote_all}):\n{head}\n{}", String::from_utf8_lossy(&body));
    assert!(head.starts_with("HTTP/1.1 413"), "expected 413, got:\n{head}");
    assert!(wrote_all, "the node closed the connection under a client still writing the body it refused");

    let announces_close = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("connection") && v.to_ascii_lowercase().contains("close")
        })
    });
    if announces_close {
        println!("the 413 answer announces Connection: close");
        return;
    }
    // Keep-alive was promised: the same connection must serve the next request.
    let next = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n");
    let sent = wr.write_all(next.as_bytes()).await;
    let second = match sent {
        Ok(()) => read_response(&mut rd, &mut buf).await,
        Err(e) => Err(format!("write error: {e}")),
    };
    match second {
        Ok((h, _)) => assert!(h.starts_with("HTTP/1.1 200"), "second request on the connection: {h}"),
        Err(e) => panic!(
            "the 413 answer did not say `Connection: close`, but the next request on the same \
             keep-alive connection failed: {e}. A server that stops reading a request body must \
             send `Connection: close` (or read and discard the rest of the body)."
        ),
    }
}

/// A method a path does not serve → 405 method_not_allowed with an `Allow` header listing the
/// methods it does serve (RFC 9110 §15.5.6), on every node, before anything else is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_a_path_does_not_serve_are_405_with_allow() {
    let mut f = Fixture::start().await;
    let stream = ["DELETE", "GET", "HEAD", "PUT"].as_slice();
    let get = ["GET", "HEAD"].as_slice();
    let cases = [
        (Method::PATCH, "/v1/streams/good", stream),
        (Method::POST, "/v1/streams/good", stream),
        (Method::PATCH, "/v1/streams/a%20b", stream),
        (Method::PUT, "/v1/streams/good/batches", ["GET", "HEAD", "POST"].as_slice()),
        (Method::DELETE, "/v1/streams/good/subscribe", get),
        (Method::PUT, "/v1/streams", get),
        (Method::POST, "/v1/cluster", get),
        (Method::GET, "/v1/cluster/members", ["POST"].as_slice()),
        (Method::PATCH, "/v1/cluster/members/2", ["DELETE"].as_slice()),
        (Method::POST, "/healthz", get),
        // The status page and its data only read.
        (Method::POST, "/", get),
        (Method::DELETE, "/v1/cluster/nodes", get),
        (Method::GET, "/raft/append", ["POST"].as_slice()),
    ];
    for id in f.c.ids() {
        let base = f.c.url(id);
        for (m, p, allow) in &cases {
            let url = format!("{base}{p}");
            f.ck.expect_error(id, m.clone(), &url, Some(Bytes::from_static(b"x")), None, 405, "method_not_allowed")
                .await;
            let r = f.c.http.request(m.clone(), &url, None, &[], Duration::from_secs(10)).await.expect("answer");
            let mut got: Vec<String> = r
                .header("allow")
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_ascii_uppercase())
                .filter(|s| !s.is_empty())
                .collect();
            got.sort();
            f.ck.checked += 1;
            if got != allow.iter().map(|s| s.to_string()).collect::<Vec<_>>() {
                f.ck.failures.push(format!("node {id}: {m} {p}: Allow {got:?}, expected {allow:?}"));
            }
        }
    }
    f.finish().await;
}

// ---------------------------------------------------------------------------------------------
// Membership routes
// ---------------------------------------------------------------------------------------------

/// Bad bodies, unknown ids, id 0 and oversized bodies on `POST /v1/cluster/members` and
/// `DELETE /v1/cluster/members/{id}`: each gets its error, and the membership (and everything
/// else) is unchanged on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_requests_change_nothing() {
    let mut f = Fixture::start().await;
    let voter_addr = f.c.node(1).addr();
    let bodies: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "invalid_body"),
        (b"{".to_vec(), "invalid_body"),
        (b"not json".to_vec(), "invalid_body"),
        (b"[4, \"127.0.0.1:1\"]".to_vec(), "invalid_body"),
        (b"{}".to_vec(), "invalid_body"),
        (br#"{"id": 4}"#.to_vec(), "invalid_body"),
        (br#"{"addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": "four", "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": -4, "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4.5, "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 18446744073709551616, "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4, "addr": "127.0.0.1:1", "voter": "yes"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4, "addr": "127.0.0.1:1", "extra": 1}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4, "addr": ""}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4, "addr": "no-port"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 4, "addr": 7001}"#.to_vec(), "invalid_body"),
        (b"\xff\xfe\x00".to_vec(), "invalid_body"),
        // Node ids are positive: id 0 is refused before anything is proposed.
        (br#"{"id": 0, "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_body"),
        (br#"{"id": 0, "addr": "127.0.0.1:1", "voter": false}"#.to_vec(), "invalid_body"),
        // An existing voter at another address, or asked to become a learner.
        (br#"{"id": 1, "addr": "127.0.0.1:1"}"#.to_vec(), "invalid_parameter"),
        (format!(r#"{{"id": 1, "addr": "{voter_addr}", "voter": false}}"#).into_bytes(), "invalid_parameter"),
    ];
    for id in f.c.ids() {
        let base = f.c.url(id);
        for (body, code) in &bodies {
            f.ck.expect_error(
                id,
                Method::POST,
                &format!("{base}/v1/cluster/members"),
                Some(Bytes::from(body.clone())),
                Some("application/json"),
                400,
                code,
            )
            .await;
        }
        // Unknown ids, id 0 and ids that are not u64 on DELETE.
        for (path, status, code) in [
            ("/v1/cluster/members/42", 404, "not_found"),
            ("/v1/cluster/members/0", 404, "not_found"),
            ("/v1/cluster/members/18446744073709551615", 404, "not_found"),
            ("/v1/cluster/members/abc", 400, "invalid_parameter"),
            ("/v1/cluster/members/-1", 400, "invalid_parameter"),
            ("/v1/cluster/members/1.5", 400, "invalid_parameter"),
            ("/v1/cluster/members/18446744073709551616", 400, "invalid_parameter"),
        ] {
            f.ck.expect_error(id, Method::DELETE, &format!("{base}{path}"), None, None, status, code).await;
        }
        // A body over 64 KiB (valid JSON inside), on a client of its own: the server closes the
        // connection after a 413.
        let huge = format!(r#"{{"id": 4, "addr": "127.0.0.1:1", "pad": "{}"}}"#, "x".repeat(70 * 1024));
        let shared = std::mem::take(&mut f.ck.http);
        f.ck.expect_error(
            id,
            Method::POST,
            &format!("{base}/v1/cluster/members"),
            Some(Bytes::from(huge)),
            Some("application/json"),
            413,
            "payload_too_large",
        )
        .await;
        f.ck.http = shared;
    }
    f.finish().await;
}

// ---------------------------------------------------------------------------------------------
// Raft routes
// ---------------------------------------------------------------------------------------------

/// POSTs `body` to `path` on a node and checks it gets `400 invalid_body`.
async fn expect_raft_refusal(f: &mut Fixture, node: u64, path: &str, body: Vec<u8>, what: &str) {
    expect_raft_refusal_with(f, node, path, body, &[], "invalid_body", what).await
}

/// POSTs `body` to `path` on a node with `headers` and checks it gets `400 code`.
async fn expect_raft_refusal_with(
    f: &mut Fixture,
    node: u64,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
    code: &str,
    what: &str,
) {
    expect_raft_status(f, node, path, body, headers, 400, code, what).await
}

/// POSTs `body` to `path` on a node with `headers` and checks it gets `status code`.
#[allow(clippy::too_many_arguments)]
async fn expect_raft_status(
    f: &mut Fixture,
    node: u64,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
    status: u16,
    code: &str,
    what: &str,
) {
    let url = format!("{}{path}", f.c.url(node));
    let mut all = vec![("content-type", "application/octet-stream")];
    all.extend_from_slice(headers);
    f.ck.checked += 1;
    let r = f.ck.http.request(Method::POST, &url, Some(Bytes::from(body)), &all, Duration::from_secs(10)).await;
    match r {
        Ok(r) => {
            if let Some(problem) = error_problem(&r, status, code) {
                f.ck.failures.push(format!("node {node}: POST {path} ({what}): {problem}; got {}", r.describe()));
            }
        }
        Err(e) => f.ck.failures.push(format!("node {node}: POST {path} ({what}): transport error {e}")),
    }
}

/// Requests that would move every node to a term far ahead if they decoded (a vote request, an
/// append and an install-snapshot from node 2 as leader at `term`), postcard-encoded as the
/// nodes send them: (path, bytes).
fn raft_requests(term: u64) -> Vec<(&'static str, Vec<u8>)> {
    use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
    use openraft::{LogId, SnapshotMeta, Vote};
    use runnev::raft::TypeConfig;
    let vote = Vote::new_committed(term, 2);
    let last = Some(LogId::new(openraft::CommittedLeaderId::new(term, 2), 1_000_000));
    let v = VoteRequest::new(Vote::new(term, 2), last);
    let a = AppendEntriesRequest::<TypeConfig> { vote, prev_log_id: last, entries: vec![], leader_commit: last };
    let meta = SnapshotMeta { last_log_id: last, snapshot_id: "forged".into(), ..Default::default() };
    let s = InstallSnapshotRequest::<TypeConfig> { vote, meta, offset: 0, data: vec![7; 64], done: true };
    vec![
        ("/raft/vote", postcard::to_stdvec(&v).expect("encode")),
        ("/raft/append", postcard::to_stdvec(&a).expect("encode")),
        ("/raft/snapshot", postcard::to_stdvec(&s).expect("encode")),
    ]
}

/// Garbage and truncated requests on `/raft/append`, `/raft/vote` and `/raft/snapshot`: each is
/// answered `400 invalid_body` and reaches no Raft state (the truncated ones would, whole, have
/// moved the term 1000 ahead); leader, term, members and streams are unchanged everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_raft_rpcs_change_nothing() {
    let mut f = Fixture::start_insecure().await;
    let term = f.before[0].raft.1;
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("an empty body", vec![]),
        ("text", b"not postcard".to_vec()),
        ("an overlong varint", vec![0xff; 16]),
        ("JSON", br#"{"vote":{"leader_id":{"term":99,"node_id":2},"committed":true}}"#.to_vec()),
    ];
    let forged = raft_requests(term + 1000);
    for id in f.c.ids() {
        for path in ["/raft/append", "/raft/vote", "/raft/snapshot"] {
            for (what, body) in &garbage {
                expect_raft_refusal(&mut f, id, path, body.clone(), what).await;
            }
        }
        for (path, whole) in &forged {
            for cut in [1, whole.len() / 2, whole.len() - 1] {
                let what = format!("a request of {} bytes cut to {cut}", whole.len());
                expect_raft_refusal(&mut f, id, path, whole[..cut].to_vec(), &what).await;
            }
        }
    }
    f.finish().await;
}

/// Raft RPCs addressed to a Raft group the node does not host (`/raft/groups/<id>/…`, any id
/// but 0, or one that is not a number), or naming no RPC, are refused with `404 not_found`
/// before their body is read: whole, they would move every node 1000 terms ahead. The
/// cluster's group is served under the same route (a garbage body there gets `400
/// invalid_body`, the answer of the RPC's own handler). Leader, term, members and streams are
/// unchanged everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_of_a_group_the_node_does_not_host_are_refused() {
    let mut f = Fixture::start_insecure().await;
    let term = f.before[0].raft.1;
    let forged = raft_requests(term + 1000);
    for id in f.c.ids() {
        for (path, whole) in &forged {
            let rpc = path.trim_start_matches("/raft/");
            for group in ["7", "4294967295", "x", "00x"] {
                let at = format!("/raft/groups/{group}/{rpc}");
                let what = format!("group {group:?}");
                expect_raft_status(&mut f, id, &at, whole.clone(), &[], 404, "not_found", &what).await;
            }
            expect_raft_refusal(&mut f, id, &format!("/raft/groups/0/{rpc}"), b"junk".to_vec(), "group 0, junk").await;
        }
        let (_, whole) = &forged[0];
        expect_raft_status(&mut f, id, "/raft/groups/0/elect", whole.clone(), &[], 404, "not_found", "no such RPC")
            .await;
    }
    f.finish().await;
}

/// Raft RPCs that say they speak another protocol version (or an unreadable one) are refused
/// with `400 protocol_mismatch` before their body reaches openraft: whole, they would move every
/// node 1000 terms ahead. Leader, term, members and streams are unchanged everywhere, and the
/// refusing node says why in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_of_another_protocol_version_are_refused() {
    let mut f = Fixture::start_insecure().await;
    let term = f.before[0].raft.1;
    let forged = raft_requests(term + 1000);
    for id in f.c.ids() {
        for (path, whole) in &forged {
            for version in ["2", "0", "one"] {
                let what = format!("protocol version {version:?}");
                let headers = [("runnev-protocol", version)];
                expect_raft_refusal_with(&mut f, id, path, whole.clone(), &headers, "protocol_mismatch", &what).await;
            }
        }
        f.ck.checked += 1;
        let log = std::fs::read_to_string(f.c.log_path(id)).unwrap_or_default();
        if !log.contains("refusing a Raft RPC: this node speaks Raft RPC protocol version 1; the peer sent version 2") {
            f.ck.failures.push(format!("node {id}: no log line naming both protocol versions"));
        }
    }
    f.finish().await;
}

/// Sends `head` (then `body`) on a new connection to node `id` (TLS when the cluster is secure;
/// `head` must carry [`Cluster::auth_line`]) and reads one answer: (status line and
/// headers, body by Content-Length).
async fn raw_exchange(c: &Cluster, id: u64, head: &str, body: &[u8]) -> Result<(String, Vec<u8>), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = c.connect_raw(id).await?;
    let mut req = head.as_bytes().to_vec();
    req.extend_from_slice(body);
    sock.write_all(&req).await.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return Ok((head, buf[end + 4..end + 4 + len].to_vec()));
            }
        }
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout(Duration::from_secs(10), sock.read(&mut chunk)).await {
            Err(_) => return Err("no complete answer within 10 s".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err(format!("closed after {} bytes: {:?}", buf.len(), String::from_utf8_lossy(&buf))),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

/// A request whose Transfer-Encoding is anything but `chunked` alone → 501 not_implemented
/// (RFC 9112 §6.1: a server refuses transfer codings it does not implement), on every node and
/// every endpoint that takes a body; nothing is stored (the compressed bytes would otherwise be
/// stored as the payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_codings_other_than_chunked_are_501() {
    let mut f = Fixture::start().await;
    // "hi" as one chunk; the bytes are what matters, not whether they really are gzip.
    let chunked = b"2\r\nhi\r\n0\r\n\r\n";
    let auth = f.c.auth_line();
    for id in f.c.ids() {
        let addr = f.c.node(id).addr();
        for coding in ["gzip, chunked", "chunked, chunked", "deflate,chunked", "x-custom, chunked"] {
            for (method, path) in [
                ("POST", "/v1/streams/good/batches"),
                ("POST", "/v1/streams/x/batches?seq=9"),
                ("PUT", "/v1/streams/x"),
            ] {
                f.ck.checked += 1;
                let head = format!(
                    "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: {coding}\r\n{auth}\
                     Content-Type: application/octet-stream\r\n\r\n"
                );
                let label = format!("node {id}: {method} {path} with Transfer-Encoding: {coding}");
                match raw_exchange(&f.c, id, &head, chunked).await {
                    Err(e) => f.ck.failures.push(format!("{label}: {e}")),
                    Ok((head, body)) => {
                        let code = serde_json::from_slice::<Value>(&body)
                            .ok()
                            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
                        if !head.starts_with("HTTP/1.1 501") || code.as_deref() != Some("not_implemented") {
                            f.ck.failures.push(format!(
                                "{label}: expected 501 not_implemented, got {head:?} {:?}",
                                String::from_utf8_lossy(&body)
                            ));
                        } else if header_of(&head, "runnev-node").is_none() {
                            f.ck.failures.push(format!("{label}: no Runnev-Node header"));
                        }
                    }
                }
            }
        }
    }
    f.finish().await;
}

/// A Raft RPC body over the 256 MiB limit, declared by its Content-Length: `413
/// payload_too_large` (and `Connection: close`) before the node buffers it, on every Raft route;
/// nothing changes. Raw TCP, so no client library hides how the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_raft_rpcs_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const RAFT_RPC_BYTES_MAX: u64 = 256 * 1024 * 1024;
    let mut f = Fixture::start_insecure().await;
    let target = f.c.followers().await[0];
    let addr = f.c.node(target).addr();
    for path in ["/raft/append", "/raft/vote", "/raft/snapshot"] {
        f.ck.checked += 1;
        let sock = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let (mut rd, mut wr) = sock.into_split();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            RAFT_RPC_BYTES_MAX + 1
        );
        wr.write_all(head.as_bytes()).await.expect("write the head");
        // Send the body too, as a real client would, until the node answers or stops reading.
        let writer = tokio::spawn(async move {
            let chunk = vec![0u8; 1 << 20];
            let mut sent = 0u64;
            while sent <= RAFT_RPC_BYTES_MAX {
                if wr.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len() as u64;
            }
            sent
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), async {
            let mut buf = [0u8; 4096];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => answer.extend_from_slice(&buf[..n]),
                }
                if answer.windows(4).any(|w| w == b"\r\n\r\n") && answer.ends_with(b"}") {
                    break;
                }
            }
        })
        .await;
        writer.abort();
        let text = String::from_utf8_lossy(&answer).to_string();
        let ok = read.is_ok()
            && text.starts_with("HTTP/1.1 413")
            && text.contains("payload_too_large")
            && text.to_ascii_lowercase().contains("connection: close");
        if !ok {
            f.ck.failures.push(format!(
                "node {target}: POST {path} with {} bytes: {}",
                RAFT_RPC_BYTES_MAX + 1,
                truncate(&text, 400)
            ));
        }
    }
    f.finish().await;
}

/// `Transfer-Encoding: chunked` alone is accepted, and `Content-Encoding` is not applied: the
/// body's bytes are stored verbatim (a gzip body is stored compressed), and the header is not
/// stored either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_are_accepted_and_content_encoding_is_stored_verbatim() {
    let c = Cluster::start(1, &[]).await;
    create_stream(&c.http, &c.url(1), "raw").await;
    let (addr, auth) = (c.node(1).addr(), c.auth_line());
    // The gzip member of an empty file: stored as these bytes, not as nothing.
    let gzip: &[u8] = &[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut chunked = format!("{:x}\r\n", gzip.len()).into_bytes();
    chunked.extend_from_slice(gzip);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let head = format!(
        "POST /v1/streams/raw/batches HTTP/1.1\r\nHost: {addr}\r\nTransfer-Encoding: chunked\r\n{auth}\
         Content-Encoding: gzip\r\n\r\n"
    );
    let (answer, body) = raw_exchange(&c, 1, &head, &chunked).await.expect("chunked publish");
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer} {:?}", String::from_utf8_lossy(&body));
    let head = format!(
        "POST /v1/streams/raw/batches HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n{auth}\
         Content-Encoding: gzip\r\n\r\n",
        gzip.len()
    );
    let (answer, body) = raw_exchange(&c, 1, &head, gzip).await.expect("publish with Content-Length");
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer} {:?}", String::from_utf8_lossy(&body));
    let index = serde_json::from_slice::<Value>(&body).expect("JSON")["index"].as_u64().expect("index");
    let batches = read_all(&c.http, &c.url(1), "raw", index, Duration::from_secs(10)).await.expect("read raw");
    assert_eq!(batches.len(), 2);
    for b in &batches {
        assert_eq!(b.data, gzip, "seq {}: the bytes as sent, not decompressed", b.seq);
    }
}

/// A request that asks `Expect: 100-continue` with a `Content-Length` over its route's limit is
/// answered `413` at once, not `100 Continue` (which told curl to upload the whole body to be
/// refused; found by a fresh user's trial): a publish, a frames publish and a stream's PUT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_announced_with_expect_continue_is_refused_before_it_is_sent() {
    let c = Cluster::start(1, &[]).await;
    create_stream(&c.http, &c.url(1), "big").await;
    let (addr, auth) = (c.node(1).addr(), c.auth_line());
    for (what, line, extra) in [
        ("a publish", "POST /v1/streams/big/batches", ""),
        ("a frames publish", "POST /v1/streams/big/batches", "Content-Type: application/vnd.runnev.frames\r\n"),
        ("a stream's PUT", "PUT /v1/streams/big", "Content-Type: application/json\r\n"),
    ] {
        let head = format!(
            "{line} HTTP/1.1\r\nHost: {addr}\r\n{auth}{extra}Expect: 100-continue\r\nContent-Length: 50000000\r\n\r\n"
        );
        let answer = tokio::time::timeout(Duration::from_secs(10), raw_exchange(&c, 1, &head, b"")).await;
        let (answer, body) = answer.unwrap_or_else(|_| panic!("{what}: no answer within 10 s")).expect(what);
        assert!(answer.starts_with("HTTP/1.1 413"), "{what}: {answer}");
        assert!(String::from_utf8_lossy(&body).contains("payload_too_large"), "{what}: {body:?}");
    }
    let r = c.http.get(&format!("{}/v1/streams/big", c.url(1))).await.expect("info");
    assert_eq!(r.json()["last_seq"], 0, "nothing was published: {}", r.describe());
}
