//! A throw-away local cluster for the benchmarks that kill and restart nodes (`runnev bench
//! failover` and `restart`), started by [`runnev::launcher`] on free loopback ports under one
//! directory that is removed at the end.
//!
//! Owns: the error type of the bench modes, their cluster flags, sizes with units (`1GiB`) and
//! the once-a-second progress ticker. Must never: start, signal or probe processes itself (the
//! launcher does).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runnev::client::{Client, ClientError, RetryPolicy};
use runnev::launcher::{ClusterSpec, LaunchError, LocalCluster, Signal};
use runnev::net::TcpDialer;

/// The variable `runnev bench` sets to its own executable when it runs `runnev-bench`; the
/// modes that start a cluster run that executable's `serve`.
pub const RUNNEV_EXE_ENV: &str = "RUNNEV_EXE";

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
    /// The local cluster could not be started, signalled or probed.
    #[error("cluster: {0}")]
    Launch(#[from] LaunchError),
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

impl From<StopSignal> for Signal {
    fn from(s: StopSignal) -> Signal {
        match s {
            StopSignal::Kill => Signal::Kill,
            StopSignal::Term => Signal::Term,
        }
    }
}

impl StopSignal {
    /// Its name for reports: `kill` or `term`.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Kill => "kill",
            StopSignal::Term => "term",
        }
    }
}

/// A retry policy for load during failures: short backoffs, so the time a publish waits after
/// the cluster is available again is small next to the unavailability being measured.
pub fn eager_retry_policy() -> RetryPolicy {
    RetryPolicy {
        request_timeout: Duration::from_secs(10),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        give_up_after: Duration::from_secs(60),
        // Ride out a cluster whose nodes are all restarting: refused connections are retried as
        // long as anything else.
        unreachable_after: Duration::from_secs(60),
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

/// Starts the nodes of `opts` under a new directory and waits (up to `timeout`) until every
/// one is ready and they agree on a ready leader.
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
    let mut spec = ClusterSpec::new(runnev_exe()?, root, opts.nodes, "runnev bench");
    spec.serve_args = opts.serve_args;
    let mut c = LocalCluster::spawn(spec)?;
    if let Err(e) = c.wait_formed(true, timeout).await {
        keep(&mut c);
        return Err(e.into());
    }
    Ok(c)
}

/// Starts the cluster `own` asks for (see [`start`]), runs `body` on it, then stops it; its
/// directory is kept when `own.keep` says so or `body` failed.
///
/// Errors: the cluster did not form within `timeout`, or `body`'s error.
pub async fn run_on_own<F>(own: &OwnCluster, label: &str, timeout: Duration, body: F) -> Result<(), BenchError>
where
    F: AsyncFnOnce(&mut LocalCluster) -> Result<(), BenchError>,
{
    run_on_own_with(own, label, vec![], timeout, body).await
}

/// [`run_on_own`] with `serve_args` appended to every node's `runnev serve`.
///
/// Errors: as [`run_on_own`].
pub async fn run_on_own_with<F>(
    own: &OwnCluster,
    label: &str,
    serve_args: Vec<String>,
    timeout: Duration,
    body: F,
) -> Result<(), BenchError>
where
    F: AsyncFnOnce(&mut LocalCluster) -> Result<(), BenchError>,
{
    let opts = ClusterOptions { nodes: own.nodes, parent_dir: own.dir.clone(), label: label.into(), serve_args };
    eprintln!("starting a {}-node cluster…", own.nodes);
    let mut cluster = start(opts, timeout).await?;
    if own.keep {
        keep(&mut cluster);
    }
    let result = body(&mut cluster).await;
    if result.is_err() {
        keep(&mut cluster);
    }
    shutdown(cluster).await;
    result
}

/// Keeps the cluster's directory (data and logs) when it is dropped; says where on stderr.
pub fn keep(c: &mut LocalCluster) {
    if !c.kept() {
        eprintln!("runnev bench: node data and logs kept under {}", c.root().display());
    }
    c.keep();
}

/// A client over every node of `c` with `policy`.
///
/// Errors: none in practice (the URLs are well formed).
pub fn client(c: &LocalCluster, policy: RetryPolicy) -> Result<Client, BenchError> {
    Ok(Client::with_dialer(&c.urls(), Arc::new(TcpDialer), policy)?)
}

/// Stops every node with SIGTERM (SIGKILL after [`STOP_TERM_MS_MAX`]) and drops the cluster,
/// which removes its directory unless kept.
pub async fn shutdown(mut c: LocalCluster) {
    c.stop_all(Duration::from_millis(STOP_TERM_MS_MAX)).await;
}

/// The `runnev` executable the nodes run: the one that ran `runnev bench` (it sets
/// [`RUNNEV_EXE_ENV`]), else a `runnev` beside this executable.
///
/// Errors: neither is there.
fn runnev_exe() -> Result<PathBuf, BenchError> {
    if let Some(exe) = std::env::var_os(RUNNEV_EXE_ENV) {
        return Ok(PathBuf::from(exe));
    }
    let beside = std::env::current_exe()?.with_file_name("runnev");
    if beside.is_file() {
        return Ok(beside);
    }
    Err(BenchError::Invalid(format!(
        "no runnev executable: run this as `runnev bench …`, or put runnev at {}",
        beside.display()
    )))
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
