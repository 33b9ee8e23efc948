//! Black-box test harness for Runnev: spawns `runnev serve` processes on loopback ports,
//! talks to them over HTTP, and cleans up (no orphans) even when a test panics.
//!
//! Every wait in here is bounded and fails with a message that says what it was waiting for.
//! When a test fails (the `Cluster` is dropped while panicking), the node data directories are
//! kept and the path and tail of every node's log are printed.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_runnev");

/// Default per-request timeout of the HTTP helper.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// HTTP client helper
// ---------------------------------------------------------------------------------------------

/// One HTTP answer.
#[derive(Clone, Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics (with the body text) when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("expected a JSON body, got status {} body {:?}: {e}", self.status, truncate(&self.text(), 500))
        })
    }

    pub fn try_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// `error.code` of a SPEC error body, if the body is one.
    pub fn error_code(&self) -> Option<String> {
        self.try_json()?.get("error")?.get("code")?.as_str().map(str::to_owned)
    }

    /// Short description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status {} Runnev-Node {:?} body {:?}",
            self.status,
            self.header("runnev-node"),
            truncate(&self.text(), 400)
        )
    }
}

pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_owned()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…({} bytes)", &s[..end], s.len())
    }
}

/// A small HTTP/1 client over hyper-util's legacy client. Errors (connect refused, timeout,
/// reset) are returned as strings so load generators can count them as "unacknowledged".
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    pub timeout: Duration,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Self::with_timeout(REQUEST_TIMEOUT)
    }

    pub fn with_timeout(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(32)
            .build(connector);
        Http { client, timeout }
    }

    pub async fn request(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Resp, String> {
        let mut builder = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| format!("building request {method} {url}: {e}"))?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{method} {url}: {e:?}"))?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body =
                resp.into_body().collect().await.map_err(|e| format!("{method} {url}: reading body: {e}"))?.to_bytes();
            Ok(Resp { status, headers, body })
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("{method} {url}: timed out after {timeout:?}")),
        }
    }

    pub async fn get(&self, url: &str) -> Result<Resp, String> {
        self.request(Method::GET, url, None, &[], self.timeout).await
    }

    pub async fn delete(&self, url: &str) -> Result<Resp, String> {
        self.request(Method::DELETE, url, None, &[], self.timeout).await
    }

    pub async fn post(&self, url: &str, body: impl Into<Bytes>) -> Result<Resp, String> {
        self.request(
            Method::POST,
            url,
            Some(body.into()),
            &[("content-type", "application/octet-stream")],
            self.timeout,
        )
        .await
    }

    /// PUT with an optional JSON body (`None`: no body at all).
    pub async fn put(&self, url: &str, body: Option<&str>) -> Result<Resp, String> {
        match body {
            Some(b) => {
                self.request(
                    Method::PUT,
                    url,
                    Some(Bytes::copy_from_slice(b.as_bytes())),
                    &[("content-type", "application/json")],
                    self.timeout,
                )
                .await
            }
            None => self.request(Method::PUT, url, None, &[], self.timeout).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Polling helpers
// ---------------------------------------------------------------------------------------------

/// Calls `f` every `every` until it returns `Ok(v)`; panics after `timeout` with `what` and the
/// last `Err` message.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, every: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    match try_wait_for(timeout, every, &mut f).await {
        Ok(v) => v,
        Err(last) => panic!("timed out after {timeout:?} waiting for {what}; last state: {last}"),
    }
}

/// Like [`wait_for`] but returns the last error instead of panicking.
pub async fn try_wait_for<T, F, Fut>(timeout: Duration, every: Duration, f: &mut F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::from("(never polled)");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining.max(Duration::from_millis(1)), f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("(poll did not finish before the deadline; before that: {last})"),
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(every.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Process spawning (children die with the test process)
// ---------------------------------------------------------------------------------------------

type SpawnReq = (Command, mpsc::Sender<io::Result<Child>>);

/// All children are spawned from one thread that lives as long as the test process, so that
/// `PR_SET_PDEATHSIG` (which fires when the *spawning thread* exits) kills them only when the
/// whole test process goes away (e.g. the test binary is killed by a timeout).
fn spawn_child(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnReq>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnReq>();
        std::thread::Builder::new()
            .name("runnev-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    tx.lock().unwrap_or_else(|p| p.into_inner()).send((cmd, rtx)).expect("spawner thread alive");
    rrx.recv().expect("spawner thread answered")
}

fn free_ports(n: usize) -> Vec<u16> {
    // Hold all listeners at once so the n ports are distinct.
    let listeners: Vec<TcpListener> =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
    listeners.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn tail_file(path: &Path, lines: usize) -> String {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(cannot open {}: {e})", path.display()),
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    let _ = f.seek(SeekFrom::Start(start));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    all[from..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------------------------

pub struct Node {
    pub id: u64,
    pub port: u16,
    dir: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Node {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub peers: String,
    pub extra_args: Vec<String>,
    pub http: Http,
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) with `extra_args` appended to each `runnev serve` command line,
    /// and waits (bounded) until every node reports the same non-null `leader_id`.
    pub async fn start(n: usize, extra_args: &[&str]) -> Cluster {
        let ports = free_ports(n);
        let peers =
            ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{}", i + 1, p)).collect::<Vec<_>>().join(",");
        let mut nodes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let id = (i + 1) as u64;
            let dir =
                tempfile::Builder::new().prefix(&format!("runnev-test-n{id}-")).tempdir().expect("create tempdir");
            let root = dir.path().to_path_buf();
            let data_dir = root.join("data");
            std::fs::create_dir_all(&data_dir).expect("create data dir");
            let log_path = root.join(format!("node-{id}.log"));
            nodes.push(Node { id, port: *port, dir: Some(dir), root, data_dir, log_path, child: None, starts: 0 });
        }
        let mut c =
            Cluster { nodes, peers, extra_args: extra_args.iter().map(|s| s.to_string()).collect(), http: Http::new() };
        for id in 1..=n as u64 {
            c.spawn(id);
        }
        for id in 1..=n as u64 {
            c.wait_healthy(id, Duration::from_secs(20)).await;
        }
        c.wait_leader_agreed(Duration::from_secs(30)).await;
        c
    }

    /// Starts a new, empty node `id` on a fresh port with the cluster's `--peers` (which do not
    /// list it, so it waits to be added with `POST /v1/cluster/members`); waits for /healthz.
    pub async fn add_node(&mut self, id: u64) {
        assert!(self.nodes.iter().all(|n| n.id != id), "node {id} exists");
        let port = free_ports(1)[0];
        let dir = tempfile::Builder::new().prefix(&format!("runnev-test-n{id}-")).tempdir().expect("create tempdir");
        let root = dir.path().to_path_buf();
        let data_dir = root.join("data");
        std::fs::create_dir_all(&data_dir).expect("create data dir");
        let log_path = root.join(format!("node-{id}.log"));
        self.nodes.push(Node { id, port, dir: Some(dir), root, data_dir, log_path, child: None, starts: 0 });
        self.spawn(id);
        self.wait_healthy(id, Duration::from_secs(20)).await;
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes.iter().find(|n| n.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn running_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.is_running()).map(|n| n.id).collect()
    }

    pub fn url(&self, id: u64) -> String {
        self.node(id).url()
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    fn spawn(&mut self, id: u64) {
        let peers = self.peers.clone();
        let extra = self.extra_args.clone();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is already running");
        node.starts += 1;
        let mut log = OpenOptions::new().create(true).append(true).open(&node.log_path).expect("open node log");
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--id".into(),
            id.to_string(),
            "--data-dir".into(),
            node.data_dir.display().to_string(),
            "--listen".into(),
            node.addr(),
            "--peers".into(),
            peers,
        ];
        args.extend(extra);
        let _ =
            writeln!(log, "===== test harness: start #{} of node {id}: {BIN} {} =====", node.starts, args.join(" "));
        let err_log = log.try_clone().expect("clone log handle");
        let mut cmd = Command::new(BIN);
        cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::from(log)).stderr(Stdio::from(err_log));
        if let Ok(level) = std::env::var("RUNNEV_TEST_LOG") {
            cmd.env("RUST_LOG", level);
        }
        // SAFETY: prctl is async-signal-safe and touches only the child's own process state.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        let child = spawn_child(cmd).unwrap_or_else(|e| panic!("spawning {BIN}: {e}"));
        node.child = Some(child);
    }

    /// Panics (with the log tail) if the node's process has exited on its own.
    pub fn check_alive(&mut self, id: u64) -> Result<(), String> {
        let node = self.node_mut(id);
        if let Some(child) = node.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                node.child = None;
                return Err(format!(
                    "node {id} exited on its own with {status}; log {}:\n{}",
                    node.log_path.display(),
                    tail_file(&node.log_path, 40)
                ));
            }
        }
        Ok(())
    }

    /// Waits until `GET /healthz` on the node answers 200.
    pub async fn wait_healthy(&mut self, id: u64, timeout: Duration) {
        let url = format!("{}/healthz", self.url(id));
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            if let Err(e) = self.check_alive(id) {
                panic!("{e}");
            }
            match self.http.request(Method::GET, &url, None, &[], Duration::from_secs(2)).await {
                Ok(r) if r.status == 200 => return,
                Ok(r) => last = r.describe(),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                panic!("node {id}: /healthz not 200 within {timeout:?}; last: {last}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /v1/cluster` on one node, as JSON.
    pub async fn cluster_info(&self, id: u64) -> Result<Value, String> {
        let r = self
            .http
            .request(Method::GET, &format!("{}/v1/cluster", self.url(id)), None, &[], Duration::from_secs(3))
            .await?;
        if r.status != 200 {
            return Err(format!("node {id} /v1/cluster: {}", r.describe()));
        }
        r.try_json().ok_or_else(|| format!("node {id} /v1/cluster: not JSON: {}", r.describe()))
    }

    /// Waits until every running node reports the same non-null leader_id (a running node) and
    /// the same term; returns (leader_id, term).
    pub async fn wait_leader_agreed(&mut self, timeout: Duration) -> (u64, u64) {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            for id in self.running_ids() {
                if let Err(e) = self.check_alive(id) {
                    panic!("{e}");
                }
            }
            match self.leader_agreement().await {
                Ok(v) => return v,
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                panic!("no agreed leader within {timeout:?}; last: {last}");
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    async fn leader_agreement(&self) -> Result<(u64, u64), String> {
        let running = self.running_ids();
        let mut seen = BTreeMap::new();
        for id in &running {
            let v = self.cluster_info(*id).await?;
            let leader = v["leader_id"].as_u64();
            let term = v["term"].as_u64();
            seen.insert(*id, (leader, term));
        }
        let first = seen.values().next().copied().ok_or("no running node")?;
        match first {
            (Some(l), Some(t)) if running.contains(&l) && seen.values().all(|v| *v == (Some(l), Some(t))) => Ok((l, t)),
            _ => Err(format!("(leader_id, term) per node: {seen:?}")),
        }
    }

    /// The current leader's id, as agreed by the leader itself (bounded wait).
    pub async fn leader(&self) -> u64 {
        let this = self;
        wait_for(
            "a node that reports itself as leader",
            Duration::from_secs(20),
            Duration::from_millis(100),
            move || async move {
                let mut last = String::new();
                for id in this.running_ids() {
                    match this.cluster_info(id).await {
                        Ok(v) => {
                            if let Some(l) = v["leader_id"].as_u64() {
                                if this.running_ids().contains(&l) {
                                    if let Ok(lv) = this.cluster_info(l).await {
                                        if lv["leader_id"].as_u64() == Some(l) {
                                            return Ok(l);
                                        }
                                    }
                                }
                            }
                            last = format!("node {id} says leader_id={}", v["leader_id"]);
                        }
                        Err(e) => last = e,
                    }
                }
                Err(last)
            },
        )
        .await
    }

    /// Running node ids other than the leader.
    pub async fn followers(&self) -> Vec<u64> {
        let l = self.leader().await;
        self.running_ids().into_iter().filter(|i| *i != l).collect()
    }

    /// SIGKILL the node's process and reap it.
    pub fn kill_9(&mut self, id: u64) {
        let node = self.node_mut(id);
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM the node and wait (up to 10 s, then SIGKILL) for it to exit.
    pub async fn stop(&mut self, id: u64) {
        let node = self.node_mut(id);
        let Some(mut child) = node.child.take() else {
            return;
        };
        // SAFETY: signalling our own child, which has not been reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            if Instant::now() >= deadline {
                eprintln!("node {id} did not exit within 10 s of SIGTERM; sending SIGKILL");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a stopped node again on the same data dir and port; waits for /healthz.
    pub async fn restart(&mut self, id: u64) {
        if self.node(id).is_running() {
            self.stop(id).await;
        }
        // The port may be briefly unavailable right after the old process died (the server
        // should bind with SO_REUSEADDR); retry only when the node exited complaining about it.
        for attempt in 1..=5 {
            self.spawn(id);
            tokio::time::sleep(Duration::from_millis(300)).await;
            match self.check_alive(id) {
                Ok(()) => break,
                Err(e) if attempt < 5 && e.to_lowercase().contains("in use") => {
                    eprintln!("node {id} restart attempt {attempt}: port busy, retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        self.wait_healthy(id, Duration::from_secs(20)).await;
    }

    /// Prints log paths and the last `lines` lines of every node's log to stderr.
    pub fn dump_logs(&self, lines: usize) {
        for n in &self.nodes {
            eprintln!(
                "----- node {} (port {}, running: {}) log {} (last {lines} lines) -----\n{}",
                n.id,
                n.port,
                n.is_running(),
                n.log_path.display(),
                tail_file(&n.log_path, lines)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("RUNNEV_TEST_KEEP").is_some() {
            eprintln!("===== test failed (or RUNNEV_TEST_KEEP set): node dirs kept =====");
            self.dump_logs(40);
            for n in &mut self.nodes {
                if let Some(d) = n.dir.take() {
                    let p = d.keep();
                    eprintln!("kept node {} dir: {}", n.id, p.display());
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runnev API helpers
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub seq: u64,
    pub ts: u64,
    pub data: Vec<u8>,
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn unb64(s: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("bad base64 {:?}: {e}", truncate(s, 80)))
}

/// Creates a stream (PUT without body) via `base`; expects 201 or 200.
pub async fn create_stream(http: &Http, base: &str, name: &str) -> Value {
    let r =
        http.put(&format!("{base}/v1/streams/{name}"), None).await.unwrap_or_else(|e| panic!("PUT stream {name}: {e}"));
    assert!(r.status == 201 || r.status == 200, "PUT /v1/streams/{name} via {base}: {}", r.describe());
    r.json()
}

/// Reads the whole stream from one node (`after`=0, pages of 1000) with `min_index` on every
/// page. A `503 not_ready` is retried until `timeout`. Checks the read invariants that hold for a
/// stream without retention: no gap, seqs strictly increasing, `next_after` = last seq returned.
/// Stops at the first empty page.
pub async fn read_all(
    http: &Http,
    base: &str,
    stream: &str,
    min_index: u64,
    timeout: Duration,
) -> Result<Vec<Batch>, String> {
    let deadline = Instant::now() + timeout;
    let mut out: Vec<Batch> = Vec::new();
    let mut after = 0u64;
    loop {
        let url = format!("{base}/v1/streams/{stream}/batches?after={after}&limit=1000&min_index={min_index}");
        let r = http.request(Method::GET, &url, None, &[], Duration::from_secs(15)).await?;
        if r.status == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        if r.status != 200 {
            return Err(format!("GET {url}: {}", r.describe()));
        }
        let v = r.try_json().ok_or_else(|| format!("GET {url}: not JSON: {}", r.describe()))?;
        if !v["gap"].is_null() {
            return Err(format!("GET {url}: unexpected gap {}", v["gap"]));
        }
        let batches =
            v["batches"].as_array().ok_or_else(|| format!("GET {url}: no batches array: {}", r.describe()))?;
        if batches.is_empty() {
            let na = v["next_after"].as_u64();
            if na != Some(after) {
                return Err(format!("GET {url}: empty page but next_after={} (expected {after})", v["next_after"]));
            }
            return Ok(out);
        }
        for b in batches {
            let seq = b["seq"].as_u64().ok_or_else(|| format!("batch without u64 seq: {b}"))?;
            let ts = b["ts"].as_u64().ok_or_else(|| format!("batch without u64 ts: {b}"))?;
            let data = unb64(b["data"].as_str().ok_or_else(|| format!("batch without string data: {b}"))?)?;
            if seq <= after {
                return Err(format!("GET {url}: seq {seq} not greater than the previous seq/after {after}"));
            }
            after = seq;
            out.push(Batch { seq, ts, data });
        }
        if v["next_after"].as_u64() != Some(after) {
            return Err(format!(
                "GET {url}: next_after={} but the last batch returned has seq {after}",
                v["next_after"]
            ));
        }
    }
}

/// Sum of the samples of a Prometheus metric (any labels) in `/metrics` text.
pub fn prom_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value_part = if rest.starts_with('{') {
            match rest.find('}') {
                Some(i) => &rest[i + 1..],
                None => continue,
            }
        } else {
            rest
        };
        if let Some(v) = value_part.split_whitespace().next().and_then(|s| s.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// A tiny deterministic PRNG (xorshift64*), so tests need no extra crates.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn from_time() -> Self {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        Rng::new(t ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A distinct, partly non-UTF-8 payload for (tag, i): the prefix makes it unique, the tail
/// has varying length and arbitrary bytes so byte-exactness is exercised.
pub fn payload(tag: &str, i: u64) -> Vec<u8> {
    let mut p = format!("{tag}-{i}:").into_bytes();
    let extra = (i * 37 % 300) as usize;
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..extra {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.push((x & 0xff) as u8);
    }
    p
}
