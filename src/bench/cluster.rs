//! A throw-away local cluster for the benchmarks that kill and restart nodes (`runnev bench
//! failover` and `restart`): `runnev serve` children of the current executable on free loopback
//! ports, each with its own data dir and log under one directory that is removed at the end.
//!
//! Owns: spawning, signalling, reaping and probing the nodes it started, the error type of the
//! bench modes, sizes with units (`1GiB`) and the once-a-second progress ticker. Must never:
//! signal a process it did not start, or leave a child running after it is dropped (children
//! are killed on drop and, through `PR_SET_PDEATHSIG`, when this process dies).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::client::{Client, ClientError, RetryPolicy};
use crate::net::{http_client, HttpClient, TcpDialer};
use crate::wire::ClusterView;

/// Interval between two probes of a node while waiting for it, in ms: the resolution of the
/// readiness times the benchmarks report.
pub const PROBE_INTERVAL_MS: u64 = 2;
/// Deadline of one probe (`/readyz`, `/v1/cluster`), in ms.
const PROBE_TIMEOUT_MS: u64 = 1_000;
/// Largest probe answer read, in bytes.
const PROBE_BODY_BYTES_MAX: usize = 1024 * 1024;
/// How long a node stopped with SIGTERM may take to exit before it gets SIGKILL, in ms.
pub const STOP_TERM_MS_MAX: u64 = 15_000;

/// Why a bench mode failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The cluster answered with an error, or no node answered in time.
    #[error("client: {0}")]
    Client(#[from] ClientError),
    /// A node could not be started, signalled or waited on, or a file could not be written.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A node or the cluster did not reach a state in time; what and how long is in the text.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A flag's value is unusable.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Batches the cluster acknowledged are missing when read back: a broken guarantee.
    #[error("{lost} acknowledged batches are missing when read back (first: {first})")]
    Lost {
        /// How many acknowledged (stream, seq) pairs are missing on some node.
        lost: u64,
        /// The first missing one, as `node stream seq`.
        first: String,
    },
}

/// How a node is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StopSignal {
    /// `SIGKILL` (`kill -9`): no shutdown code runs, as in a crash.
    Kill,
    /// `SIGTERM`: the node shuts down cleanly.
    Term,
}

impl StopSignal {
    fn raw(self) -> libc::c_int {
        match self {
            StopSignal::Kill => libc::SIGKILL,
            StopSignal::Term => libc::SIGTERM,
        }
    }

    /// Its name for reports: `kill` or `term`.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Kill => "kill",
            StopSignal::Term => "term",
        }
    }
}

/// GETs `url` once with the probe deadline; the status and body, or why there is none.
async fn probe(http: &HttpClient, url: &str) -> Result<(u16, bytes::Bytes), String> {
    let (status, body) =
        crate::net::get(http, url, Duration::from_millis(PROBE_TIMEOUT_MS), PROBE_BODY_BYTES_MAX).await?;
    Ok((status.as_u16(), body))
}

/// `GET {node}/v1/cluster` once, without retries.
///
/// Errors: a text saying why no view could be had.
pub async fn view_of(http: &HttpClient, node: &str) -> Result<ClusterView, String> {
    let (status, body) = probe(http, &format!("{node}/v1/cluster")).await?;
    if status != 200 {
        return Err(format!("{node}/v1/cluster answered {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{node}/v1/cluster: {e}"))
}

/// An HTTP client for probes (no retries; each probe has its own deadline).
pub fn probe_client() -> HttpClient {
    http_client(Arc::new(TcpDialer))
}

/// A retry policy for load during failures: short backoffs, so the time a publish waits after
/// the cluster is available again is small next to the unavailability being measured.
pub fn eager_retry_policy() -> RetryPolicy {
    RetryPolicy {
        request_timeout: Duration::from_secs(10),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        give_up_after: Duration::from_secs(60),
    }
}

/// Parses a size: plain bytes (`1048576`) or with a suffix, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`
/// (powers of 1024) or `KB`/`MB`/`GB` (powers of 1000); case-insensitive, decimals allowed
/// (`1.5GiB`). Returns bytes.
///
/// Errors: a text saying what is wrong with `s`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use bytes, K/KiB, M/MiB, G/GiB, KB, MB or GB)")),
    };
    if num.is_empty() {
        return Err(format!("{s:?}: no number"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"));
    }
    let x: f64 = num.parse().map_err(|_| format!("{s:?}: {num:?} is not a number"))?;
    let bytes = x * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Total size of the files under `dir`, in bytes (0 if it does not exist).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Calls its function once a second with the time since it started, until dropped: the
/// benchmarks' progress lines on stderr.
pub struct Ticker(tokio::task::JoinHandle<()>);

impl Ticker {
    /// Starts ticking; the first call comes one second from now.
    pub fn start(mut f: impl FnMut(Duration) + Send + 'static) -> Ticker {
        let started = Instant::now();
        Ticker(tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.tick().await;
            loop {
                every.tick().await;
                f(started.elapsed());
            }
        }))
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Flags of the benchmarks that start their own cluster.
#[derive(Debug, Clone, clap::Args)]
pub struct OwnCluster {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Directory under which the cluster's data is kept while it runs (default: the system temp
    /// dir); removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the cluster's data and logs at the end.
    #[arg(long)]
    pub keep: bool,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of nodes (ids 1..=nodes).
    pub nodes: u64,
    /// Directory under which the cluster's own directory is made (default: the system temp dir).
    pub parent_dir: Option<PathBuf>,
    /// Short name of the benchmark, part of the directory name.
    pub label: String,
    /// Extra flags for every `runnev serve`.
    pub serve_args: Vec<String>,
}

struct LocalNode {
    id: u64,
    port: u16,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl LocalNode {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A cluster of `runnev serve` children of this executable on 127.0.0.1. Dropping it kills every
/// node and removes its directory (unless [`LocalCluster::keep`] was called).
pub struct LocalCluster {
    root: PathBuf,
    keep: bool,
    exe: PathBuf,
    peers: String,
    serve_args: Vec<String>,
    nodes: Vec<LocalNode>,
    http: HttpClient,
}

fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    // Hold every listener at once so the ports are distinct.
    let listeners = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>()?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

impl LocalCluster {
    /// Starts the nodes and waits (up to `timeout`) until every one is ready and they agree on a
    /// leader.
    ///
    /// Errors: a node could not be spawned, or the cluster did not form in time (the nodes are
    /// killed; their directory is kept and named).
    pub async fn start(opts: ClusterOptions, timeout: Duration) -> Result<LocalCluster, BenchError> {
        if opts.nodes == 0 {
            return Err(BenchError::Invalid("a cluster needs at least one node".into()));
        }
        let parent = opts.parent_dir.clone().unwrap_or_else(std::env::temp_dir);
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
        let root = parent.join(format!("runnev-bench-{}-{}-{stamp}", opts.label, std::process::id()));
        std::fs::create_dir_all(&root)?;
        let ports = free_ports(opts.nodes as usize)?;
        let peers =
            ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let id = i as u64 + 1;
                LocalNode {
                    id,
                    port,
                    data_dir: root.join(format!("node-{id}")),
                    log_path: root.join(format!("node-{id}.log")),
                    child: None,
                    starts: 0,
                }
            })
            .collect();
        let mut c = LocalCluster {
            root,
            keep: false,
            exe: std::env::current_exe()?,
            peers,
            serve_args: opts.serve_args,
            nodes,
            http: probe_client(),
        };
        for id in c.ids() {
            c.spawn(id)?;
        }
        let deadline = Instant::now() + timeout;
        for id in c.ids() {
            if let Err(e) = c.wait_ready(id, deadline.saturating_duration_since(Instant::now())).await {
                c.keep();
                return Err(e);
            }
        }
        if let Err(e) = c.leader(deadline.saturating_duration_since(Instant::now())).await {
            c.keep();
            return Err(e);
        }
        Ok(c)
    }

    /// Keeps the directory (data and logs) when the cluster is dropped; says where on stderr.
    pub fn keep(&mut self) {
        if !self.keep {
            eprintln!("runnev bench: node data and logs kept under {}", self.root.display());
        }
        self.keep = true;
    }

    /// The cluster's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every node id.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Ids of the nodes whose process is running.
    pub fn running_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.child.is_some()).map(|n| n.id).collect()
    }

    fn node(&self, id: u64) -> Result<&LocalNode, BenchError> {
        self.nodes.iter().find(|n| n.id == id).ok_or_else(|| BenchError::Invalid(format!("no node {id}")))
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut LocalNode, BenchError> {
        self.nodes.iter_mut().find(|n| n.id == id).ok_or_else(|| BenchError::Invalid(format!("no node {id}")))
    }

    /// Base URL of node `id`, e.g. `http://127.0.0.1:40123` (empty if there is no such node).
    pub fn url(&self, id: u64) -> String {
        self.node(id).map(LocalNode::url).unwrap_or_default()
    }

    /// Base URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(LocalNode::url).collect()
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.node(id).map(|n| n.data_dir.clone()).unwrap_or_default()
    }

    /// Node `id`'s log file.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.node(id).map(|n| n.log_path.clone()).unwrap_or_default()
    }

    /// A client over every node with `policy`.
    ///
    /// Errors: none in practice (the URLs are well formed).
    pub fn client(&self, policy: RetryPolicy) -> Result<Client, BenchError> {
        Ok(Client::with_dialer(&self.urls(), Arc::new(TcpDialer), policy)?)
    }

    /// Starts node `id` (on its data, if it has some); returns when the process was spawned.
    ///
    /// Errors: it is already running, or the process could not be spawned.
    pub fn spawn(&mut self, id: u64) -> Result<Instant, BenchError> {
        let (exe, peers, extra) = (self.exe.clone(), self.peers.clone(), self.serve_args.clone());
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            return Err(BenchError::Invalid(format!("node {id} is already running")));
        }
        std::fs::create_dir_all(&node.data_dir)?;
        node.starts += 1;
        let mut log = OpenOptions::new().create(true).append(true).open(&node.log_path)?;
        let mut args = vec![
            "serve".to_string(),
            "--id".into(),
            id.to_string(),
            "--data-dir".into(),
            node.data_dir.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", node.port),
            "--peers".into(),
            peers,
        ];
        args.extend(extra);
        writeln!(
            log,
            "===== runnev bench: start #{} of node {id}: {} {} =====",
            node.starts,
            exe.display(),
            args.join(" ")
        )?;
        let mut cmd = Command::new(&exe);
        cmd.args(&args).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches only the child's own process state.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let at = Instant::now();
        node.child = Some(cmd.spawn()?);
        Ok(at)
    }

    /// Sends `sig` to node `id`'s process; returns the instant just before sending.
    ///
    /// Errors: the node is not running, or `kill(2)` failed.
    pub fn signal(&mut self, id: u64, sig: StopSignal) -> Result<Instant, BenchError> {
        let node = self.node_mut(id)?;
        let pid = node
            .child
            .as_ref()
            .and_then(Child::id)
            .ok_or_else(|| BenchError::Invalid(format!("node {id} is not running")))?;
        let at = Instant::now();
        // SAFETY: signalling our own child, which has not been reaped (so the pid is still ours).
        if unsafe { libc::kill(pid as libc::pid_t, sig.raw()) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(at)
    }

    /// Waits until node `id`'s process has exited and reaps it; returns the instant it was
    /// seen gone. After [`STOP_TERM_MS_MAX`] it is killed (and this is an error).
    ///
    /// Errors: the node is not running, or it did not exit in time.
    pub async fn wait_exit(&mut self, id: u64) -> Result<Instant, BenchError> {
        let node = self.node_mut(id)?;
        let child = node.child.as_mut().ok_or_else(|| BenchError::Invalid(format!("node {id} is not running")))?;
        let outcome = tokio::time::timeout(Duration::from_millis(STOP_TERM_MS_MAX), child.wait()).await;
        let at = Instant::now();
        let result = match outcome {
            Ok(Ok(_)) => Ok(at),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let _ = child.kill().await;
                Err(BenchError::Cluster(format!("node {id} did not exit within {STOP_TERM_MS_MAX} ms; killed it")))
            }
        };
        node.child = None;
        result
    }

    /// Node `id`'s view of the cluster, once.
    ///
    /// Errors: a text saying why there is none.
    pub async fn view(&self, id: u64) -> Result<ClusterView, String> {
        view_of(&self.http, &self.url(id)).await
    }

    /// Whether node `id` answers `/readyz` with 200 now: `Some(true)`; another status:
    /// `Some(false)`; no answer: `None`.
    pub async fn ready_now(&self, id: u64) -> Option<bool> {
        probe(&self.http, &format!("{}/readyz", self.url(id))).await.ok().map(|(s, _)| s == 200)
    }

    /// Waits until node `id` answers `/readyz` with 200; returns when it first did.
    ///
    /// Errors: not within `timeout` (the last answer is in the text).
    pub async fn wait_ready(&self, id: u64, timeout: Duration) -> Result<Instant, BenchError> {
        let deadline = Instant::now() + timeout;
        let url = format!("{}/readyz", self.url(id));
        loop {
            let last = match probe(&self.http, &url).await {
                Ok((200, _)) => return Ok(Instant::now()),
                Ok((s, body)) => format!("{s} {}", String::from_utf8_lossy(&body).trim()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(BenchError::Cluster(format!(
                    "node {id} was not ready within {timeout:?}; last answer: {last}; log: {}",
                    self.log_path(id).display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        }
    }

    /// Waits until node `id` has applied log index `index`; returns when it first had.
    ///
    /// Errors: not within `timeout`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> Result<Instant, BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.view(id).await {
                Ok(v) if v.applied_index >= index => return Ok(Instant::now()),
                Ok(v) => format!("applied {}", v.applied_index),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(BenchError::Cluster(format!(
                    "node {id} did not apply index {index} within {timeout:?}; last: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        }
    }

    /// The leader every running node agrees on, once it is ready: polls until then.
    ///
    /// Errors: no agreement within `timeout` (what each node said is in the text).
    pub async fn leader(&self, timeout: Duration) -> Result<u64, BenchError> {
        self.leader_among(&[], timeout).await
    }

    /// Like [`LocalCluster::leader`], asking only the running nodes not in `ignore` (nodes known
    /// to be behind, which may campaign in vain with ever higher terms).
    ///
    /// Errors: as [`LocalCluster::leader`].
    pub async fn leader_among(&self, ignore: &[u64], timeout: Duration) -> Result<u64, BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let running: Vec<u64> = self.running_ids().into_iter().filter(|id| !ignore.contains(id)).collect();
            let mut said = Vec::new();
            let mut leaders = std::collections::BTreeSet::new();
            for &id in &running {
                match self.view(id).await {
                    Ok(v) => {
                        said.push(format!("{id}: leader {:?} term {}", v.leader_id, v.term));
                        leaders.insert(v.leader_id);
                    }
                    Err(e) => {
                        said.push(format!("{id}: {e}"));
                        leaders.insert(None);
                    }
                }
            }
            if let (1, Some(&Some(l))) = (leaders.len(), leaders.iter().next()) {
                if running.contains(&l) && self.ready_now(l).await == Some(true) {
                    return Ok(l);
                }
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Cluster(format!(
                    "the running nodes did not agree on a ready leader within {timeout:?}: {}",
                    said.join("; ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every node with SIGTERM (SIGKILL after [`STOP_TERM_MS_MAX`]) and removes the
    /// directory unless kept.
    pub async fn shutdown(mut self) {
        for id in self.running_ids() {
            let _ = self.signal(id, StopSignal::Term);
        }
        for id in self.running_ids() {
            let _ = self.wait_exit(id).await;
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let mut children: Vec<Child> = self.nodes.iter_mut().filter_map(|n| n.child.take()).collect();
        for c in &mut children {
            let _ = c.start_kill();
        }
        // Reap them (bounded) so nothing writes into the directory while it is removed.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !children.is_empty() && Instant::now() < deadline {
            children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1gib"), Ok(1 << 30));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("256K"), Ok(256 << 10));
        assert_eq!(parse_size("256 KiB"), Ok(256 << 10));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("12b"), Ok(12));
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("1TiB").is_err());
        assert!(parse_size("1..5M").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_size("20000000000G").is_err());
    }

    #[test]
    fn dir_bytes_sums_nested_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), [0u8; 10]).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b"), [0u8; 5]).unwrap();
        assert_eq!(dir_bytes(d.path()), 15);
        assert_eq!(dir_bytes(&d.path().join("missing")), 0);
    }
}
