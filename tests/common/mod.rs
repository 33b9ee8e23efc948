//! Black-box test helpers for Runnev: a cluster of `runnev serve` processes on loopback ports
//! (started by `runnev::launcher`), an HTTP helper, and helpers for reads, payloads and metrics.
//! Cleans up (no orphans) even when a test panics.
//!
//! Secure by default, as production runs (docs/security.md): every [`Cluster`] runs with peer
//! TLS, client TLS and `--auth`, from one throwaway CA and admin token per test process
//! ([`security`]); its URLs are `https://`, [`Http`] trusts that CA and sends the admin token,
//! and [`cli`] passes both to the `runnev` client commands. `RUNNEV_TEST_INSECURE=1` runs the
//! whole harness without security; [`Cluster::start_insecure`] opts one test out.
//!
//! Every wait in here is bounded and fails with a message that says what it was waiting for.
//! When a test fails (the `Cluster` is dropped while panicking), the node data directories are
//! kept and the path and tail of every node's log are printed.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::SeedableRng;
use runnev::launcher::{log_tail, ClusterSpec, LocalCluster, Node, Signal};
use runnev::net::{http_client, HttpClient, TcpDialer};
use runnev::tls::TlsDialer;
use runnev::wire::ClusterView;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_runnev");

/// Default per-request timeout of the HTTP helper.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Security: one throwaway CA and admin token per test process
// ---------------------------------------------------------------------------------------------

/// Node certificates made up front, for ids `1..=SECURE_NODE_IDS` (tests add nodes up to 5).
const SECURE_NODE_IDS: u64 = 9;

/// The files and secrets every secure [`Cluster`] of this test process shares, made by
/// `runnev local --secure`'s own [`runnev::local::prepare_secure`].
#[derive(Debug)]
pub struct Security {
    /// The directory holding them (removed when the process exits).
    pub dir: PathBuf,
    /// The CA's certificate (`ca.pem`): nodes, [`Http`] and the CLI verify each other with it.
    pub ca: PathBuf,
    /// The admin token (`rnv_admin_…`), which every harness request and CLI run sends.
    pub admin: String,
    /// The `runnev serve` flags for peer TLS, client TLS and `--auth` (`{id}` is the node's id).
    pub serve_args: Vec<String>,
}

impl Security {
    /// Node `id`'s certificate and key (`node-N.pem`, `node-N.key`).
    pub fn node_cert(&self, id: u64) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("node-{id}.pem")), self.dir.join(format!("node-{id}.key")))
    }
}

static SECURITY: OnceLock<Option<Security>> = OnceLock::new();

/// The harness's security, made on first use; `None` when `RUNNEV_TEST_INSECURE=1` (the whole
/// harness then runs plain HTTP without tokens, for debugging and to keep that path exercised).
pub fn security() -> Option<&'static Security> {
    SECURITY
        .get_or_init(|| {
            if std::env::var("RUNNEV_TEST_INSECURE").is_ok_and(|v| v == "1") {
                return None;
            }
            let dir = std::env::temp_dir().join(format!("runnev-test-pki-{}", std::process::id()));
            let files = runnev::local::prepare_secure(&dir, SECURE_NODE_IDS)
                .unwrap_or_else(|e| panic!("making the test CA under {}: {e}", dir.display()));
            let admin =
                std::fs::read_to_string(&files.admin_token).expect("reading the admin token").trim().to_string();
            // The directory outlives every cluster of the process; it goes when the process exits.
            extern "C" fn remove_pki() {
                if let Some(Some(s)) = SECURITY.get() {
                    let _ = std::fs::remove_dir_all(&s.dir);
                }
            }
            // SAFETY: registers a plain `extern "C" fn` with no arguments, as atexit(3) asks.
            unsafe { libc::atexit(remove_pki) };
            Some(Security { dir, ca: files.ca, admin, serve_args: files.serve_args })
        })
        .as_ref()
}

/// `RUNNEV_CA_FILE` and `RUNNEV_TOKEN` for a `runnev` client command (or relay, sink, bench)
/// against a harness cluster (empty, which they read as unset, when the harness is insecure).
pub fn cli_security_env() -> Vec<(String, String)> {
    match security() {
        Some(s) => vec![
            ("RUNNEV_CA_FILE".into(), s.ca.to_string_lossy().into_owned()),
            ("RUNNEV_TOKEN".into(), s.admin.clone()),
        ],
        None => vec![("RUNNEV_CA_FILE".into(), String::new()), ("RUNNEV_TOKEN".into(), String::new())],
    }
}

/// How a CLI run with [`cli_security_env`] names the nodes: `https` with the harness secure,
/// else `http`.
pub fn cli_scheme() -> &'static str {
    if security().is_some() {
        "https"
    } else {
        "http"
    }
}

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
///
/// `http://` URLs go over plain TCP; `https://` ones over TLS verified with the harness CA
/// (Runnev's own [`TlsDialer`]). With the harness secure, every request carries the admin token
/// unless it names its own `Authorization`.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    tls: Option<HttpClient>,
    token: Option<String>,
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

    /// An HTTP helper for the harness's clusters: TLS with its CA and its admin token when it
    /// is secure ([`security`]).
    pub fn with_timeout(timeout: Duration) -> Self {
        let mut http = Self::insecure(timeout);
        if let Some(s) = security() {
            let config = runnev::tls::client_config(&s.ca, None).expect("the test CA is usable");
            http.tls = Some(http_client(Arc::new(TlsDialer::new(Arc::new(TcpDialer), config))));
            http.token = Some(s.admin.clone());
        }
        http
    }

    /// An HTTP helper that presents node `id`'s certificate, as a peer does, for the nodes-only
    /// paths (`/raft/...`); the same as [`Http::new`] when the harness is insecure.
    pub fn as_node(id: u64) -> Self {
        let mut http = Self::new();
        if let Some(s) = security() {
            let (cert, key) = s.node_cert(id);
            let config = runnev::tls::client_config(&s.ca, Some((&cert, &key))).expect("the test node cert is usable");
            http.tls = Some(http_client(Arc::new(TlsDialer::new(Arc::new(TcpDialer), config))));
        }
        http
    }

    /// Plain HTTP without a token, whatever the harness (for clusters that run insecure).
    pub fn insecure(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        let client = Client::builder(TokioExecutor::new())
            // Under the nodes' idle pooled connections, which stay below the least
            // --header-read-timeout: a node never closes a connection this client reuses.
            .pool_idle_timeout(Duration::from_millis(runnev::limits::HTTP_POOL_IDLE_MS))
            .pool_max_idle_per_host(32)
            .build(connector);
        Http { client, tls: None, token: None, timeout }
    }

    pub async fn request(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Resp, String> {
        let fut = async {
            let resp = self.open(method.clone(), url, body, headers).await?;
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

    /// Sends one request and returns the answer as it starts, its body unread (an event
    /// stream, say); no deadline of its own.
    pub async fn open(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        headers: &[(&str, &str)],
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut builder = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        if let Some(t) = &self.token {
            if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization")) {
                builder = builder.header("authorization", format!("Bearer {t}"));
            }
        }
        let req = builder
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| format!("building request {method} {url}: {e}"))?;
        match (&self.tls, url.starts_with("https://")) {
            (Some(c), true) => c.request(req).await.map_err(|e| format!("{method} {url}: {e:?}")),
            (None, true) => Err(format!("{method} {url}: https:// needs the harness's CA, and it runs insecure")),
            _ => self.client.request(req).await.map_err(|e| format!("{method} {url}: {e:?}")),
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

/// Says loudly that a test did not run: on stderr, and as a line in the file named by
/// `RUNNEV_TEST_SKIPS` (scripts/test sets it, counts the lines and names them in its summary;
/// cargo test shows no output of a test that passes).
pub fn skipped(why: &str) {
    eprintln!("SKIPPED: {why}");
    if let Some(path) = std::env::var_os("RUNNEV_TEST_SKIPS") {
        use std::io::Write;
        let line = format!("{why}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!("recording the skip in {}: {e}", std::path::Path::new(&path).display());
        }
    }
}

/// Sends `GET path` on a new raw connection to `port` and reads the answer's head (and what
/// came with it); the connection is returned open.
pub async fn raw_get(port: u16, path: &str) -> Result<(tokio::net::TcpStream, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, String>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.map_err(|_| "no answer".to_string())??;
    Ok((s, String::from_utf8_lossy(&head).into_owned()))
}

/// A Rust client over `urls` ([`runnev::client::Client::secure`]): with the harness's CA and
/// admin token when they are `https://` (a secure cluster's nodes), plain otherwise.
pub fn client_for(urls: &[String]) -> runnev::client::Client {
    let secure = security().filter(|_| urls.iter().any(|u| u.starts_with("https://")));
    let (ca, token) = match secure {
        Some(s) => (Some(s.ca.as_path()), Some(runnev::auth::Token::parse(&s.admin).expect("the admin token"))),
        None => (None, None),
    };
    runnev::client::Client::secure(urls, ca, token).expect("a client over the cluster")
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
// Cluster: runnev::launcher's local cluster, with waits that panic with what they waited for
// ---------------------------------------------------------------------------------------------

/// How long a test cluster may take to form: every node healthy, then a leader agreed.
const FORM_TIMEOUT: Duration = Duration::from_secs(50);
/// How long a node may take to answer `/healthz` after a start.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a node may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A cluster of `runnev serve` processes for one test ([`LocalCluster`], which it derefs to, for
/// URLs, ids, nodes and signals). Its directory is removed when the test passes; when it fails
/// (or `RUNNEV_TEST_KEEP` is set), it is kept and every node's log tail is printed.
pub struct Cluster {
    inner: LocalCluster,
    pub http: Http,
}

impl std::ops::Deref for Cluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) with `extra_args` appended to each `runnev serve` command line,
    /// and waits (bounded) until every node is healthy and all report the same leader and term.
    pub async fn start(n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_edited(n, extra_args, |_| {}).await
    }

    /// Like [`Cluster::start`], with `edit` applied to the launcher's spec first (to give one
    /// node an environment of its own, say).
    pub async fn start_edited(n: usize, extra_args: &[&str], edit: impl FnOnce(&mut ClusterSpec)) -> Cluster {
        Cluster::launch(n, extra_args, security(), edit).await
    }

    /// Like [`Cluster::start`] but without the harness's security: plain HTTP, no tokens, and
    /// [`Cluster::http`] speaks plain HTTP. Only for tests about the insecure mode or that must
    /// speak raw bytes to a node; each use says why.
    pub async fn start_insecure(n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::launch(n, extra_args, None, |_| {}).await
    }

    /// [`Cluster::start_insecure`] with `edit` applied to the spec (a test that brings its own
    /// certificates and tokens).
    pub async fn start_insecure_edited(n: usize, extra_args: &[&str], edit: impl FnOnce(&mut ClusterSpec)) -> Cluster {
        Cluster::launch(n, extra_args, None, edit).await
    }

    async fn launch(
        n: usize,
        extra_args: &[&str],
        security: Option<&'static Security>,
        edit: impl FnOnce(&mut ClusterSpec),
    ) -> Cluster {
        let root = tempfile::Builder::new().prefix("runnev-test-").tempdir().expect("create tempdir").keep();
        let mut spec = ClusterSpec::new(BIN, root, n as u64, "test harness");
        spec.serve_args = extra_args.iter().map(|s| s.to_string()).collect();
        if let Some(s) = security {
            spec.serve_args.extend(s.serve_args.iter().cloned());
            spec.tls_ca = Some(s.ca.clone());
            spec.token = Some(s.admin.clone());
        }
        edit(&mut spec);
        if let Ok(level) = std::env::var("RUNNEV_TEST_LOG") {
            spec.env.push(("RUST_LOG".into(), level));
        }
        let inner = LocalCluster::spawn(spec).unwrap_or_else(|e| panic!("starting {n} nodes: {e}"));
        let http = match security {
            Some(_) => Http::new(),
            None => Http::insecure(REQUEST_TIMEOUT),
        };
        let mut c = Cluster { inner, http };
        if let Err(e) = c.inner.wait_formed(false, FORM_TIMEOUT).await {
            panic!("the cluster did not form: {e}");
        }
        c
    }

    /// Whether the nodes run with the harness's security (TLS and tokens).
    pub fn secure(&self) -> bool {
        self.inner.tls()
    }

    /// A Rust client over every node, secured as the cluster is ([`client_for`]).
    pub fn client(&self) -> runnev::client::Client {
        client_for(&self.urls())
    }

    /// A raw byte stream to node `id`, for tests that write HTTP/1 by hand: TLS verified with
    /// the harness's CA (Runnev's [`TlsDialer`]) when the cluster is secure, else plain TCP.
    /// A request written on it needs [`Cluster::auth_line`] among its headers.
    pub async fn connect_raw(&self, id: u64) -> Result<Box<dyn runnev::net::Io>, String> {
        let addr = self.node(id).addr();
        let dialer: Box<dyn runnev::net::Dialer> = match security().filter(|_| self.secure()) {
            Some(s) => Box::new(TlsDialer::new(
                Arc::new(TcpDialer),
                runnev::tls::client_config(&s.ca, None).map_err(|e| e.to_string())?,
            )),
            None => Box::new(TcpDialer),
        };
        dialer.dial(addr.clone()).await.map_err(|e| format!("connect {addr}: {e}"))
    }

    /// The header line (with its CRLF) a hand-written request needs: the admin token's
    /// `Authorization: Bearer …` when the cluster is secure, else nothing.
    pub fn auth_line(&self) -> String {
        match security().filter(|_| self.secure()) {
            Some(s) => format!("Authorization: Bearer {}\r\n", s.admin),
            None => String::new(),
        }
    }

    /// Node `id`; panics if there is none.
    pub fn node(&self, id: u64) -> &Node {
        self.inner.node(id).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a new, empty node `id` on a fresh port with the cluster's `--peers` (which do not
    /// list it, so it waits to be added with `POST /v1/cluster/members`); waits for /healthz.
    pub async fn add_node(&mut self, id: u64) {
        self.inner.add_node(id).unwrap_or_else(|e| panic!("adding node {id}: {e}"));
        self.wait_healthy(id, HEALTHY_TIMEOUT).await;
    }

    /// Waits until `GET /healthz` on the node answers 200; panics (with the log tail) if it
    /// exited or did not in time.
    pub async fn wait_healthy(&mut self, id: u64, timeout: Duration) {
        if let Err(e) = self.inner.wait_healthy(id, timeout).await {
            panic!("{e}");
        }
    }

    /// `GET /v1/cluster` on one node.
    pub async fn cluster_info(&self, id: u64) -> Result<ClusterView, String> {
        self.inner.view(id).await
    }

    /// Waits until every running node reports the same leader (a running node) and the same
    /// term; returns (leader_id, term).
    pub async fn wait_leader_agreed(&mut self, timeout: Duration) -> (u64, u64) {
        self.inner.wait_leader(&[], false, timeout).await.unwrap_or_else(|e| panic!("no agreed leader: {e}"))
    }

    /// The current leader's id, as agreed by the leader itself (bounded wait).
    pub async fn leader(&self) -> u64 {
        let c = &self.inner;
        wait_for("a node that reports itself as leader", Duration::from_secs(20), Duration::from_millis(100), || {
            c.reported_leader()
        })
        .await
    }

    /// Running node ids other than the leader.
    pub async fn followers(&self) -> Vec<u64> {
        let l = self.leader().await;
        self.running_ids().into_iter().filter(|i| *i != l).collect()
    }

    /// SIGKILL the node's process and reap it.
    pub fn kill_9(&mut self, id: u64) {
        self.inner.kill(id);
    }

    /// SIGSTOP the node's process: it stalls, holding its sockets, until [`Cluster::resume`].
    pub fn pause(&mut self, id: u64) {
        self.inner.signal(id, Signal::Stop).unwrap_or_else(|e| panic!("pausing node {id}: {e}"));
    }

    /// SIGCONT a paused node.
    pub fn resume(&mut self, id: u64) {
        self.inner.signal(id, Signal::Cont).unwrap_or_else(|e| panic!("resuming node {id}: {e}"));
    }

    /// SIGTERM the node and wait (up to 10 s, then SIGKILL) for it to exit.
    pub async fn stop(&mut self, id: u64) {
        if let Err(e) = self.inner.stop(id, STOP_TIMEOUT).await {
            eprintln!("{e}");
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
            self.inner.start_node(id).unwrap_or_else(|e| panic!("starting node {id}: {e}"));
            tokio::time::sleep(Duration::from_millis(300)).await;
            match self.inner.check_alive(id) {
                Ok(()) => break,
                Err(e) if attempt < 5 && e.to_string().to_lowercase().contains("in use") => {
                    eprintln!("node {id} restart attempt {attempt}: port busy, retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
        self.wait_healthy(id, HEALTHY_TIMEOUT).await;
    }

    /// Prints log paths and the last `lines` lines of every node's log to stderr.
    pub fn dump_logs(&self, lines: usize) {
        for n in self.nodes() {
            eprintln!(
                "----- node {} (port {}, running: {}) log {} (last {lines} lines) -----\n{}",
                n.id,
                n.port,
                n.is_running(),
                n.log_path.display(),
                log_tail(&n.log_path, lines)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.ids() {
            self.inner.kill(id);
        }
        if std::thread::panicking() || std::env::var_os("RUNNEV_TEST_KEEP").is_some() {
            eprintln!("===== test failed (or RUNNEV_TEST_KEEP set): node dirs kept =====");
            self.dump_logs(40);
            self.inner.keep();
            eprintln!("kept the cluster's dir: {}", self.root().display());
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
    match read_stream(http, base, stream, min_index, timeout).await? {
        (None, batches) => Ok(batches),
        (Some(gap), _) => Err(format!("{base} {stream}: unexpected gap {gap:?}")),
    }
}

/// Like [`read_all`] for a stream that may have evicted: the gap the first page announces (as
/// `(from, to)`), then every retained batch. A gap on a later page is an error.
pub async fn read_stream(
    http: &Http,
    base: &str,
    stream: &str,
    min_index: u64,
    timeout: Duration,
) -> Result<StreamRead, String> {
    let deadline = Instant::now() + timeout;
    let mut out: Vec<Batch> = Vec::new();
    let mut first_gap = None;
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
            if after != 0 || first_gap.is_some() {
                return Err(format!("GET {url}: a gap {} after the first page", v["gap"]));
            }
            let (from, to) = (v["gap"]["from"].as_u64(), v["gap"]["to"].as_u64());
            let (Some(from), Some(to)) = (from, to) else {
                return Err(format!("GET {url}: a gap without from/to: {}", v["gap"]));
            };
            first_gap = Some((from, to));
            if v["batches"].as_array().is_some_and(|b| b.is_empty()) {
                if v["next_after"].as_u64() != Some(to) {
                    return Err(format!("GET {url}: gap to {to} but next_after={}", v["next_after"]));
                }
                after = to;
                continue;
            }
        }
        let batches =
            v["batches"].as_array().ok_or_else(|| format!("GET {url}: no batches array: {}", r.describe()))?;
        if batches.is_empty() {
            let na = v["next_after"].as_u64();
            if na != Some(after) {
                return Err(format!("GET {url}: empty page but next_after={} (expected {after})", v["next_after"]));
            }
            return Ok((first_gap, out));
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

/// Sum of the samples of a Prometheus metric (any labels) in `/metrics` text, parsed by
/// prometheus-parse; `None` when the text has no sample of it (histograms and summaries count
/// as none).
pub fn prom_value(text: &str, name: &str) -> Option<f64> {
    prom_value_where(text, name, None)
}

/// Like [`prom_value`], counting only the samples whose label `label.0` is `label.1` (all of
/// them with `None`).
pub fn prom_value_where(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).ok()?;
    let values: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(v),
            _ => None,
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The variable that replays a test's random choices: set it to the seed a failed run printed.
pub const SEED_ENV: &str = "RUNNEV_TEST_SEED";

/// A test's random seed: from [`SEED_ENV`] when set (to replay a failure), else from the clock.
/// It is printed (the harness shows it when the test fails), with how to replay it. `tag` names
/// the test. Derive one generator per task with [`rng`].
pub fn test_seed(tag: &str) -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(s) => s.trim().parse().unwrap_or_else(|e| panic!("{SEED_ENV}={s:?} is not a u64: {e}")),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    };
    eprintln!("{tag}: random seed {seed} (replay with {SEED_ENV}={seed})");
    seed
}

/// The generator of task `n` of a test seeded with `seed` ([`test_seed`]): distinct per task,
/// the same on a replay.
pub fn rng(seed: u64, n: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
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

// ---------------------------------------------------------------------------------------------
// The `runnev` command line, run as a user runs it
// ---------------------------------------------------------------------------------------------

/// What one `runnev` invocation did.
#[derive(Debug)]
pub struct CliRun {
    /// Its exit status (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// How long it ran (printed with failures; never a verdict).
    pub took: Duration,
}

impl CliRun {
    /// Panics, showing everything, unless it exited with `code`.
    pub fn expect_code(&self, code: i32, what: &str) -> &CliRun {
        assert_eq!(self.code, Some(code), "{what}: expected exit {code}; {self:#?}");
        self
    }

    /// The stdout as JSON documents, one per line.
    pub fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line {l:?}: {e}; {self:#?}")))
            .collect()
    }
}

/// How long one CLI invocation may run before the test calls it a hang.
pub const CLI_HANG: Duration = Duration::from_secs(90);

/// Runs `runnev ARGS` with `RUNNEV_NODES` unset, stdin empty and stdout piped (so output is
/// JSON unless asked otherwise); `env` adds variables. With the harness secure, the client
/// commands get its CA and admin token (`RUNNEV_CA_FILE`, `RUNNEV_TOKEN`) unless `env` sets
/// them (empty: unset). Panics if it runs past [`CLI_HANG`].
pub async fn cli(args: &[&str], env: &[(&str, &str)]) -> CliRun {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .env_remove("RUNNEV_NODES")
        .env_remove("RUST_LOG")
        .envs(cli_security_env())
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {BIN} {args:?}: {e}"));
    let out = tokio::time::timeout(CLI_HANG, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`runnev {}` still ran after {CLI_HANG:?}", args.join(" ")))
        .unwrap_or_else(|e| panic!("waiting for runnev {args:?}: {e}"));
    CliRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// A loopback port nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A base port with it and the next `n - 1` free on loopback now (for `runnev local
/// --base-port` and other consecutive-port layouts), outside the range of outgoing connections'
/// ports ([`runnev::launcher::free_base_port`]).
pub fn free_base(n: u16) -> u16 {
    runnev::launcher::free_base_port(n).expect("free consecutive ports")
}

/// A TCP proxy on loopback to `upstream` (`HOST:PORT`) that loses the answers of its first
/// `lose` connections: it delivers the request, waits for the upstream's answer to begin (the
/// request was processed), then closes the connection without passing it on. Later connections
/// are forwarded both ways. Stops when dropped.
///
/// With the harness secure it ends TLS on both sides (it serves the harness's node 1 certificate,
/// valid for 127.0.0.1, and dials the upstream verifying it), so it sees the HTTP it loses.
pub struct LossyProxy {
    /// Its address, `127.0.0.1:PORT`.
    pub addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl LossyProxy {
    pub async fn start(upstream: &str, lose: usize) -> LossyProxy {
        use runnev::net::Dialer as _;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let upstream = upstream.to_string();
        let tls = security().map(|s| {
            let (cert, key) = s.node_cert(1);
            let files = runnev::tls::TlsFiles { ca: s.ca.clone(), cert, key };
            // An HTTP/1.1 proxy: it offers only `http/1.1` by ALPN, so clients speak HTTP/1.1 to it.
            let mut config = (*runnev::tls::server_config(&files).expect("proxy TLS")).clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let dialer = TlsDialer::new(Arc::new(TcpDialer), runnev::tls::client_config(&s.ca, None).expect("CA"));
            (acceptor, Arc::new(dialer))
        });
        let task = tokio::spawn(async move {
            let mut n = 0usize;
            while let Ok((down, _)) = listener.accept().await {
                n += 1;
                let upstream = upstream.clone();
                let lossy = n <= lose;
                let tls = tls.clone();
                tokio::spawn(async move {
                    let (mut down, mut up): (Box<dyn runnev::net::Io>, Box<dyn runnev::net::Io>) = match tls {
                        Some((acceptor, dialer)) => {
                            let Ok(down) = acceptor.accept(down).await else { return };
                            let Ok(up) = dialer.dial(upstream).await else { return };
                            (Box::new(down), up)
                        }
                        None => {
                            let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else { return };
                            (Box::new(down), Box::new(up))
                        }
                    };
                    if !lossy {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        return;
                    }
                    // The whole request: its head, then Content-Length bytes of body.
                    let mut req = Vec::new();
                    let mut buf = [0u8; 8192];
                    let head_end = loop {
                        let Ok(k) = down.read(&mut buf).await else { return };
                        if k == 0 {
                            return;
                        }
                        req.extend_from_slice(&buf[..k]);
                        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&req[..head_end]).to_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                        .unwrap_or(0);
                    while req.len() < head_end + len {
                        let Ok(k) = down.read(&mut buf).await else { return };
                        if k == 0 {
                            return;
                        }
                        req.extend_from_slice(&buf[..k]);
                    }
                    if up.write_all(&req).await.is_err() {
                        return;
                    }
                    // The first bytes of the answer: the request was processed. Then drop both.
                    let _ = up.read(&mut buf).await;
                });
            }
        });
        LossyProxy { addr, task }
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics, whole-node state, curl
// ---------------------------------------------------------------------------------------------

impl Cluster {
    /// `GET /metrics` on node `id`: the sum of `name`'s samples whose label matches `label`
    /// (all with `None`); `Ok(None)` when the node exports no such sample yet.
    pub async fn metric(&self, id: u64, name: &str, label: Option<(&str, &str)>) -> Result<Option<f64>, String> {
        let r = self.http.get(&format!("{}/metrics", self.url(id))).await?;
        if r.status != 200 {
            return Err(format!("node {id} /metrics: {}", r.describe()));
        }
        Ok(prom_value_where(&r.text(), name, label))
    }

    /// Waits until node `id` has parked at least `n` requests of `kind` (`read`, `subscribe`) in
    /// their wait for it to apply what they need (`runnev_request_waits_total`, which counts
    /// every park and so cannot be missed between two scrapes). The witness that a request sent
    /// to a node held behind is in its waiting path, not merely unanswered yet.
    pub async fn wait_parked(&self, id: u64, kind: &str, n: f64, timeout: Duration) {
        let what = format!("node {id} to park {n} {kind} request(s) in their wait");
        wait_for(&what, timeout, Duration::from_millis(5), || async move {
            match self.metric(id, "runnev_request_waits_total", Some(("kind", kind))).await? {
                Some(v) if v >= n => Ok(()),
                other => Err(format!("runnev_request_waits_total{{kind={kind:?}}} = {other:?}")),
            }
        })
        .await
    }

    /// Pauses (SIGSTOP) every node in `ids`.
    pub fn pause_all(&mut self, ids: &[u64]) {
        for id in ids {
            self.pause(*id);
        }
    }

    /// Pauses (SIGSTOP) every follower of the current leader and returns `(leader, followers)`
    /// once the leader, with them paused, still reports itself leader. Leadership can move
    /// between reading it and pausing (on a loaded machine a heartbeat can arrive later than an
    /// election timeout), and a test that means to hold a leader without a quorum must not hold
    /// a follower instead: that node would stand for election and append nothing (CI run of
    /// `idempotent_publish_holds_across_leader_failover`, 2026-12-03). Otherwise resumes them and
    /// tries again, up to 5 times. With its followers paused a leader hears no higher term, so
    /// it stays leader (openraft 0.9 has no step-down on a lost quorum).
    pub async fn pause_followers_of_leader(&mut self) -> (u64, Vec<u64>) {
        let mut last = String::new();
        for _ in 0..5 {
            let (leader, _) = self.wait_leader_agreed(Duration::from_secs(30)).await;
            let followers: Vec<u64> = self.running_ids().into_iter().filter(|i| *i != leader).collect();
            self.pause_all(&followers);
            match self.cluster_info(leader).await {
                Ok(v) if v.state == "Leader" && v.leader_id == Some(leader) => return (leader, followers),
                Ok(v) => {
                    last = format!(
                        "node {leader} is {} (leader {:?}) once its followers were paused",
                        v.state, v.leader_id
                    )
                }
                Err(e) => last = e,
            }
            self.resume_all(&followers);
        }
        panic!("no leader stayed leader while its followers were paused, 5 tries: {last}");
    }

    /// Resumes (SIGCONT) every node in `ids`.
    pub fn resume_all(&mut self, ids: &[u64]) {
        for id in ids {
            self.resume(*id);
        }
    }

    /// The commit index of the leader the running nodes agree on, once they agree (bounded).
    pub async fn leader_commit_index(&mut self) -> u64 {
        let (leader, _) = self.wait_leader_agreed(Duration::from_secs(30)).await;
        self.cluster_info(leader).await.unwrap_or_else(|e| panic!("leader {leader} view: {e}")).commit_index
    }
}

/// A whole stream as a reader from 0 sees it: the gap announced first (`(from, to)`), then every
/// retained batch.
pub type StreamRead = (Option<(u64, u64)>, Vec<Batch>);

/// Everything one node serves, read from that node alone: every stream's info in name order
/// (`GET /v1/streams`) and, per stream, the gap a reader from 0 is told and every retained batch.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeState {
    /// `GET /v1/streams`, as JSON values.
    pub streams: Vec<Value>,
    /// Per stream name: the gap a read from 0 announces, then the retained batches.
    pub batches: std::collections::BTreeMap<String, StreamRead>,
}

impl NodeState {
    /// What differs between `self` (node `a`) and `other` (node `b`), if anything.
    pub fn diff(&self, a: u64, other: &NodeState, b: u64) -> Option<String> {
        if self.streams != other.streams {
            return Some(format!(
                "streams differ: node {a} {} vs node {b} {}",
                Value::Array(self.streams.clone()),
                Value::Array(other.streams.clone())
            ));
        }
        for (name, (gap, batches)) in &self.batches {
            let Some((ogap, obatches)) = other.batches.get(name) else {
                return Some(format!("stream {name}: read on node {a} but not on node {b}"));
            };
            if gap != ogap {
                return Some(format!("stream {name}: gap {gap:?} on node {a} vs {ogap:?} on node {b}"));
            }
            if batches != obatches {
                let seqs = |bs: &[Batch]| bs.iter().map(|x| x.seq).collect::<Vec<_>>();
                let first = batches.iter().zip(obatches).find(|(x, y)| x != y).map(|(x, _)| x.seq);
                return Some(format!(
                    "stream {name}: batches differ (first differing seq {first:?}): node {a} seqs {:?} vs node {b} seqs {:?}",
                    truncate(&format!("{:?}", seqs(batches)), 300),
                    truncate(&format!("{:?}", seqs(obatches)), 300)
                ));
            }
        }
        None
    }
}

/// Reads [`NodeState`] from one node after it has applied `min_index`.
pub async fn node_state(http: &Http, base: &str, min_index: u64, timeout: Duration) -> Result<NodeState, String> {
    // A read with min_index first, so that the list below is of the applied state at min_index.
    // The stream "-" does not exist: 404 once min_index is applied, 503 after the node's own
    // wait (10 s) before; the request's deadline is longer than that wait.
    let deadline = Instant::now() + timeout;
    let url = format!("{base}/v1/streams/-/batches?min_index={min_index}");
    loop {
        let r = http.request(Method::GET, &url, None, &[], Duration::from_secs(20)).await?;
        if r.status == 404 {
            break;
        }
        if r.status != 503 || Instant::now() >= deadline {
            return Err(format!("{base} did not apply log index {min_index} within {timeout:?}: {}", r.describe()));
        }
    }
    let r = http.get(&format!("{base}/v1/streams")).await?;
    if r.status != 200 {
        return Err(format!("{base} GET /v1/streams: {}", r.describe()));
    }
    let streams = r.try_json().and_then(|v| v["streams"].as_array().cloned()).ok_or_else(|| r.describe())?;
    let mut batches = std::collections::BTreeMap::new();
    for s in &streams {
        let name = s["name"].as_str().ok_or_else(|| format!("a stream without a name: {s}"))?;
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(5));
        let read = read_stream(http, base, name, min_index, left).await?;
        check_info_against_batches(s, &read).map_err(|e| format!("{base} stream {name}: {e}"))?;
        batches.insert(name.to_string(), read);
    }
    Ok(NodeState { streams, batches })
}

/// A node's stream info must describe the batches it serves: the count, the bytes, the first
/// seq (`last_seq + 1` when empty), a last seq at or after the newest batch, and a gap from 1 to
/// `evicted_through` for a reader from 0 exactly when something was evicted.
fn check_info_against_batches(info: &Value, (gap, batches): &StreamRead) -> Result<(), String> {
    let field = |k: &str| info[k].as_u64().ok_or_else(|| format!("info without u64 {k}: {info}"));
    let (first, last, evicted) = (field("first_seq")?, field("last_seq")?, field("evicted_through")?);
    let bytes: u64 = batches.iter().map(|b| b.data.len() as u64).sum();
    let want_first = batches.first().map_or(last + 1, |b| b.seq);
    let want_gap = (evicted > 0).then_some((1, evicted));
    let problems: Vec<String> = [
        (field("batches")? != batches.len() as u64)
            .then(|| format!("counts {} batches, serves {}", info["batches"], batches.len())),
        (field("bytes")? != bytes).then(|| format!("counts {} bytes, serves {bytes}", info["bytes"])),
        (first != want_first).then(|| format!("first_seq {first}, but the oldest batch served makes it {want_first}")),
        batches.last().filter(|b| b.seq > last).map(|b| format!("last_seq {last} is below the newest batch {}", b.seq)),
        (*gap != want_gap).then(|| format!("evicted_through {evicted}, but a reader from 0 is told the gap {gap:?}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("the info does not describe the batches served: {}; info {info}", problems.join("; ")))
    }
}

/// Reads every node's [`NodeState`] after it applied `min_index` and asserts they are identical
/// (same streams, same metadata, same gap, same batches byte for byte); returns the state.
pub async fn assert_identical(c: &Cluster, ids: &[u64], min_index: u64, what: &str) -> NodeState {
    let mut states = Vec::new();
    for &id in ids {
        let s = node_state(&c.http, &c.url(id), min_index, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{what}: reading node {id}: {e}"));
        states.push((id, s));
    }
    let (id0, first) = &states[0];
    for (id, s) in &states[1..] {
        if let Some(d) = first.diff(*id0, s, *id) {
            panic!("{what}: nodes are not identical: {d}");
        }
    }
    states.swap_remove(0).1
}

/// Runs `curl -sN URL` (with `headers`) and reads its output as it comes, until `done` says the
/// text so far is complete; then stops curl and returns the text. Panics with the text so far
/// when `deadline` (a liveness bound: only a hang reaches it) passes first or curl exits early.
pub async fn curl_until(url: &str, headers: &[&str], deadline: Duration, done: impl Fn(&str) -> bool) -> String {
    use tokio::io::AsyncReadExt;
    let mut cmd = tokio::process::Command::new("curl");
    cmd.arg("-sN");
    if let Some(s) = security().filter(|_| url.starts_with("https://")) {
        cmd.arg("--cacert").arg(&s.ca).args(["-H", &format!("Authorization: Bearer {}", s.admin)]);
    }
    for h in headers {
        cmd.args(["-H", h]);
    }
    cmd.arg(url).stdout(std::process::Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().expect("curl is installed");
    let mut out = child.stdout.take().expect("curl's stdout");
    let mut text = Vec::new();
    let until = Instant::now() + deadline;
    loop {
        if done(&String::from_utf8_lossy(&text)) {
            let _ = child.kill().await;
            return String::from_utf8(text).expect("utf-8 event stream");
        }
        let mut buf = [0u8; 4096];
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, out.read(&mut buf)).await {
            Ok(Ok(0)) => panic!("curl {url} ended before the expected events:\n{}", String::from_utf8_lossy(&text)),
            Ok(Ok(n)) => text.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("reading curl's output: {e}"),
            Err(_) => panic!(
                "liveness bound: curl {url} did not show the expected events within {deadline:?}:\n{}",
                String::from_utf8_lossy(&text)
            ),
        }
    }
}
