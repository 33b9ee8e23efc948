//! Local `runnev serve` processes: the cluster of `runnev local`, of the benchmarks that kill
//! and restart nodes, and of the integration tests, started, signalled and probed one way.
//!
//! Owns: spawning children of a `runnev` executable on 127.0.0.1 (each node with its data
//! directory `ROOT/node-N` and its log `ROOT/node-N.log`, every start heading the log with its
//! exact command), their ports, signals and reaping, and the probes over HTTP (cluster view,
//! health, readiness, leader agreement, applied index). Must never: signal a process it did not
//! start, or leave a child running after the cluster is dropped or this process dies (children
//! are killed on drop and, through `PR_SET_PDEATHSIG`, when this process dies).
//!
//! Every wait is bounded and says, when it gives up, what it waited for and what it saw last.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::net::{http_client, HttpClient, TcpDialer};
use crate::wire::ClusterView;

/// Interval between two probes of a node while waiting for it, in ms: the resolution of the
/// readiness and exit times the benchmarks report.
pub const PROBE_INTERVAL_MS: u64 = 2;
/// Interval between two rounds of asking every node for its leader, in ms.
pub const AGREEMENT_POLL_MS: u64 = 20;
/// Deadline of one probe (`/healthz`, `/readyz`, `/v1/cluster`), in ms.
pub const PROBE_TIMEOUT_MS: u64 = 3_000;
/// Largest probe answer read, in bytes.
const PROBE_BODY_BYTES_MAX: usize = 1024 * 1024;
/// How long [`Drop`] waits for killed children to be reaped before removing their directory.
const REAP_ON_DROP_MS_MAX: u64 = 5_000;

/// A signal the launcher sends to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `SIGKILL` (`kill -9`): no shutdown code runs, as in a crash.
    Kill,
    /// `SIGTERM`: the node shuts down cleanly.
    Term,
    /// `SIGSTOP`: the process is frozen (a stalled node) until [`Signal::Cont`].
    Stop,
    /// `SIGCONT`: a frozen process runs again.
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Kill => libc::SIGKILL,
            Signal::Term => libc::SIGTERM,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Where the nodes listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// Free loopback ports picked by the operating system (tests, benchmarks).
    Free,
    /// Node N listens on `base + N - 1` (`runnev local --base-port`).
    Base(u16),
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `runnev` executable the nodes run.
    pub exe: PathBuf,
    /// Directory holding `node-N/` (data) and `node-N.log` (created if missing).
    pub root: PathBuf,
    /// Number of nodes, ids `1..=nodes`, all listed in every node's `--peers`.
    pub nodes: u64,
    /// Where they listen.
    pub ports: Ports,
    /// Extra flags appended to every `runnev serve`; `{id}` in one is replaced by the node's id
    /// (`--tls-cert DIR/node-{id}.pem`).
    pub serve_args: Vec<String>,
    /// Extra environment variables of every node.
    pub env: Vec<(String, String)>,
    /// Extra environment variables of one node, by id, after [`ClusterSpec::env`] (the tests run
    /// one node under libfaketime this way).
    pub node_env: BTreeMap<u64, Vec<(String, String)>>,
    /// Who starts them, heading each start in a node's log (`runnev local`, `runnev bench`…).
    pub label: String,
    /// The signal a node gets when this process dies (`PR_SET_PDEATHSIG`).
    pub death_signal: Signal,
    /// Keep the root directory when the cluster is dropped (else it is removed, data and logs).
    pub keep_dir: bool,
    /// The cluster CA's certificate when the nodes serve TLS: the probes speak TLS and verify
    /// the nodes with it.
    pub tls_ca: Option<PathBuf>,
    /// A token the probes send (nodes run with `--auth`).
    pub token: Option<String>,
}

impl ClusterSpec {
    /// `nodes` nodes of `exe` under `root` on free ports, no extra flags, killed with this
    /// process.
    pub fn new(exe: impl Into<PathBuf>, root: impl Into<PathBuf>, nodes: u64, label: &str) -> ClusterSpec {
        ClusterSpec {
            exe: exe.into(),
            root: root.into(),
            nodes,
            ports: Ports::Free,
            serve_args: Vec::new(),
            env: Vec::new(),
            node_env: BTreeMap::new(),
            label: label.to_string(),
            death_signal: Signal::Kill,
            keep_dir: false,
            tls_ca: None,
            token: None,
        }
    }
}

/// Why the launcher could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A process could not be spawned, signalled or waited on, or a file or port could not be had.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The ports would overflow.
    #[error("base port {0} leaves no room for {1} nodes")]
    Ports(u16, u64),
    /// A cluster needs at least one node.
    #[error("a cluster needs at least one node")]
    NoNodes,
    /// There is no node with this id.
    #[error("no node {0}")]
    NoSuchNode(u64),
    /// The node's process is not running.
    #[error("node {0} is not running")]
    NotRunning(u64),
    /// The node's process is already running.
    #[error("node {0} is already running")]
    AlreadyRunning(u64),
    /// The node's process exited when nobody stopped it.
    #[error("node {id} exited on its own with {status}; log {}:\n{tail}", log.display())]
    Exited {
        /// The node.
        id: u64,
        /// How it exited.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// A wait ran out: what was waited for, how long, and the last state seen.
    #[error("{0}")]
    Timeout(String),
    /// A port a node needs is already taken on 127.0.0.1 (nothing was started).
    #[error("port {port} on 127.0.0.1 is already in use{}", .holder.as_ref().map_or_else(|| " (by a process this user cannot see; `ss -ltnp` may show it)".to_string(), |h| format!(" by process {} ({})", h.pid, h.command)))]
    PortInUse {
        /// The port.
        port: u16,
        /// Who listens on it, when /proc tells.
        holder: Option<PortHolder>,
    },
}

/// A process listening on a TCP port, as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command line, arguments separated by spaces.
    pub command: String,
}

impl PortHolder {
    /// Whether it is a `runnev serve` node.
    pub fn is_runnev_node(&self) -> bool {
        self.command.contains("runnev") && self.command.split(' ').any(|a| a == "serve")
    }
}

/// Whether TCP `port` can be bound on 127.0.0.1 now (the listener is closed again at once).
///
/// Errors: [`LaunchError::PortInUse`] with the process that holds it, when /proc tells; another
/// bind failure as [`LaunchError::Io`].
pub fn check_port_free(port: u16) -> Result<(), LaunchError> {
    match std::net::TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            Err(LaunchError::PortInUse { port, holder: port_holder(port) })
        }
        Err(e) => Err(e.into()),
    }
}

/// The process listening on TCP `port` on any local address, found as `ss -ltnp` finds it: the
/// listening socket's inode in `/proc/net/tcp` and `/proc/net/tcp6`, then the process with a
/// file descriptor on that socket under `/proc/PID/fd`. `None` when there is no such socket or
/// the process is not visible to this user.
pub fn port_holder(port: u16) -> Option<PortHolder> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let targets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            if targets.iter().any(|t| link.as_os_str() == t.as_str()) {
                let raw = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                let command = raw
                    .split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ");
                return Some(PortHolder { pid, command });
            }
        }
    }
    None
}

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` table (`local_address` is
/// `HEXADDR:HEXPORT`, state `0A` is LISTEN, the inode is the tenth column).
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols.get(1)?.rsplit_once(':')?.1;
            let listening = *cols.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| cols.get(9).map(|s| s.to_string()))?
        })
        .collect()
}

/// One node of a [`LocalCluster`].
#[derive(Debug)]
pub struct Node {
    /// Its id.
    pub id: u64,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data directory (`--data-dir`).
    pub data_dir: PathBuf,
    /// Its log file (stdout and stderr of every start).
    pub log_path: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Node {
    /// `127.0.0.1:PORT`, as peers reach it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether its process was started and not yet seen gone.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Its process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// `n` distinct ports on 127.0.0.1 that nothing listens on now, drawn at random from outside
/// the range the kernel gives outgoing connections their local ports from
/// (`/proc/sys/net/ipv4/ip_local_port_range`, by default 32768–60999), where another test's
/// connection cannot take a node's port between this pick and the node's bind, or between a
/// node's stop and its restart (a port released by `bind(0)` is in that range: a CI run's node
/// once met `Address already in use` so).
///
/// Errors: binding a listener failed; no free ports were found in the listening range.
pub fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let range = listening_range(outgoing_range());
    let mut held: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    // Hold every listener at once so the ports are distinct.
    while held.len() < n {
        held.push(bind_free(range, 1)?.remove(0));
    }
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// A port `base` such that `base..base + n` can all be bound on 127.0.0.1 now, from the same
/// range as [`free_ports`] (for `runnev local --base-port` and other consecutive layouts).
///
/// Errors: as [`free_ports`].
pub fn free_base_port(n: u16) -> io::Result<u16> {
    let held = bind_free(listening_range(outgoing_range()), n.max(1))?;
    held[0].local_addr().map(|a| a.port())
}

/// Binds `n` consecutive loopback ports within `(low, high)` (a few hundred random tries),
/// returning the listeners that hold them.
fn bind_free((low, high): (u16, u16), n: u16) -> io::Result<Vec<std::net::TcpListener>> {
    use rand_08::Rng;
    debug_assert!(n >= 1, "bind_free binds at least one port");
    let none = || io::Error::new(io::ErrorKind::AddrInUse, format!("no {n} free consecutive ports in {low}..={high}"));
    // The highest base whose last port is still in the range.
    let top = high.checked_sub(n - 1).filter(|top| *top >= low).ok_or_else(none)?;
    let mut rng = rand_08::thread_rng();
    for _ in 0..512 {
        let base = rng.gen_range(low..=top);
        let bound: io::Result<Vec<_>> =
            (base..=base + (n - 1)).map(|p| std::net::TcpListener::bind(("127.0.0.1", p))).collect();
        if let Ok(listeners) = bound {
            return Ok(listeners);
        }
    }
    Err(none())
}

/// The kernel's range for the local ports of outgoing connections
/// (`/proc/sys/net/ipv4/ip_local_port_range`), or Linux's default where it cannot be read.
fn outgoing_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

/// The ports to listen on, given the `outgoing` range: below it (from 10000), or above it when
/// too little is left below.
fn listening_range((eph_low, eph_high): (u16, u16)) -> (u16, u16) {
    const LOW: u16 = 10_000;
    const ENOUGH: u16 = 4_096;
    if eph_low >= LOW.saturating_add(ENOUGH) {
        (LOW, eph_low - 1)
    } else if u16::MAX - eph_high >= ENOUGH {
        (eph_high + 1, u16::MAX)
    } else {
        (LOW, u16::MAX)
    }
}

/// The last `lines` lines of the file at `path` (reading at most its last 64 KiB), or a note
/// saying why it cannot be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(cannot open {}: {e})", path.display()),
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Opens `path` for appending and writes `heading` as one line `===== heading =====`: the
/// stdout and stderr of a child about to start.
///
/// Errors: the file cannot be opened or written.
pub fn open_log(path: &Path, heading: &str) -> io::Result<std::fs::File> {
    let mut log = OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(log, "===== {heading} =====")?;
    Ok(log)
}

/// `cmd` as one line: the program and its arguments, separated by spaces.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that the child gets `death_signal` when this process dies.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the process, so
/// every child is spawned from one thread that lives as long as the process: a child never dies
/// because a runtime's worker thread was retired.
///
/// Errors: the process could not be spawned.
pub fn spawn_child(mut cmd: Command, death_signal: Signal) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let raw = death_signal.raw();
    // SAFETY: prctl is async-signal-safe and touches only the child's own process state.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, raw as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let started = std::thread::Builder::new().name("runnev-spawner".into()).spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        });
        if let Err(e) = started {
            tracing::error!(error = %e, "starting the spawner thread");
        }
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    let sent = spawner.lock().unwrap_or_else(|p| p.into_inner()).send((cmd, reply));
    sent.map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer.recv().map_err(|_| io::Error::other("the spawner thread did not answer"))?
}

/// Sends `sig` to `child`, which has not been reaped.
fn send(child: &Child, sig: Signal) -> io::Result<()> {
    // SAFETY: signalling our own child, not yet reaped, so the pid is still ours.
    if unsafe { libc::kill(child.id() as libc::pid_t, sig.raw()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A cluster of `runnev serve` children on 127.0.0.1. Dropping it kills every node and removes
/// its directory, unless [`LocalCluster::keep`] was called.
pub struct LocalCluster {
    spec: ClusterSpec,
    peers: String,
    nodes: Vec<Node>,
    keep: bool,
    http: HttpClient,
}

impl LocalCluster {
    /// Lays out the nodes of `spec` under its root and spawns them all; returns at once (see
    /// [`LocalCluster::wait_formed`] to wait for a leader).
    ///
    /// Errors: no node, ports out of range, the root or a log cannot be made, a process cannot
    /// be spawned (the ones already spawned are killed).
    pub fn spawn(spec: ClusterSpec) -> Result<LocalCluster, LaunchError> {
        if spec.nodes == 0 {
            return Err(LaunchError::NoNodes);
        }
        let ports: Vec<u16> = match spec.ports {
            Ports::Free => free_ports(spec.nodes as usize)?,
            Ports::Base(base) => {
                let last = u64::from(base) + spec.nodes - 1;
                if last > u64::from(u16::MAX) {
                    return Err(LaunchError::Ports(base, spec.nodes));
                }
                let ports: Vec<u16> = (0..spec.nodes).map(|i| base + i as u16).collect();
                // A process already there (a node left from an earlier run) would take the
                // node's place: its peers would find it and it could lead them. Start nothing.
                for &port in &ports {
                    check_port_free(port)?;
                }
                ports
            }
        };
        std::fs::create_dir_all(&spec.root)?;
        let peers =
            ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
        let nodes = ports.iter().enumerate().map(|(i, &port)| Self::node_at(&spec.root, i as u64 + 1, port)).collect();
        let keep = spec.keep_dir;
        let dialer: Arc<dyn crate::net::Dialer> = match &spec.tls_ca {
            Some(ca) => {
                let config = crate::tls::client_config(ca, None).map_err(|e| io::Error::other(e.to_string()))?;
                Arc::new(crate::tls::TlsDialer::new(Arc::new(TcpDialer), config))
            }
            None => Arc::new(TcpDialer),
        };
        let mut c = LocalCluster { spec, peers, nodes, keep, http: http_client(dialer) };
        for id in c.ids() {
            c.start_node(id)?;
        }
        Ok(c)
    }

    fn node_at(root: &Path, id: u64, port: u16) -> Node {
        Node {
            id,
            port,
            data_dir: root.join(format!("node-{id}")),
            log_path: root.join(format!("node-{id}.log")),
            child: None,
            starts: 0,
        }
    }

    /// Waits until every node answers `/healthz` and the running nodes agree on a leader
    /// ([`LocalCluster::wait_leader`]); with `ready`, until every node answers `/readyz` and the
    /// leader does too. Returns the leader and its term.
    ///
    /// Errors: a node exited, or the cluster did not form within `timeout`.
    pub async fn wait_formed(&mut self, ready: bool, timeout: Duration) -> Result<(u64, u64), LaunchError> {
        let deadline = Instant::now() + timeout;
        for id in self.ids() {
            let left = deadline.saturating_duration_since(Instant::now());
            if ready {
                self.wait_ready(id, left).await?;
            } else {
                self.wait_healthy(id, left).await?;
            }
        }
        self.wait_leader(&[], ready, deadline.saturating_duration_since(Instant::now())).await
    }

    /// Keeps the directory (data and logs) when the cluster is dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Whether the directory will be kept.
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// The cluster's directory.
    pub fn root(&self) -> &Path {
        &self.spec.root
    }

    /// Every node, in id order of creation.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `id`, if there is one.
    pub fn get(&self, id: u64) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Node `id`.
    ///
    /// Errors: there is no such node.
    pub fn node(&self, id: u64) -> Result<&Node, LaunchError> {
        self.get(id).ok_or(LaunchError::NoSuchNode(id))
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut Node, LaunchError> {
        self.nodes.iter_mut().find(|n| n.id == id).ok_or(LaunchError::NoSuchNode(id))
    }

    /// Every node id.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Ids of the nodes whose process is running.
    pub fn running_ids(&self) -> Vec<u64> {
        self.nodes.iter().filter(|n| n.is_running()).map(|n| n.id).collect()
    }

    /// Whether the nodes serve TLS ([`ClusterSpec::tls_ca`] is set).
    pub fn tls(&self) -> bool {
        self.spec.tls_ca.is_some()
    }

    /// Base URL of node `id`, e.g. `http://127.0.0.1:40123`, or `https://…` when the nodes
    /// serve TLS (empty if there is no such node).
    pub fn url(&self, id: u64) -> String {
        self.get(id).map(|n| self.url_of(n)).unwrap_or_default()
    }

    /// Base URLs of every node, as [`LocalCluster::url`].
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| self.url_of(n)).collect()
    }

    fn url_of(&self, node: &Node) -> String {
        match self.tls() {
            true => format!("https://{}", node.addr()),
            false => node.url(),
        }
    }

    /// Node `id`'s data directory (empty if there is no such node).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.get(id).map(|n| n.data_dir.clone()).unwrap_or_default()
    }

    /// Node `id`'s log file (empty if there is no such node).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.get(id).map(|n| n.log_path.clone()).unwrap_or_default()
    }

    /// Makes later starts of every node run `exe` (a rolling upgrade to another build); nodes
    /// already running are not touched.
    pub fn set_exe(&mut self, exe: impl Into<PathBuf>) {
        self.spec.exe = exe.into();
    }

    /// Starts node `id` on its data (a restart, if it ran before); returns the instant just
    /// before the spawn.
    ///
    /// Errors: no such node, it is running, or the process could not be spawned.
    pub fn start_node(&mut self, id: u64) -> Result<Instant, LaunchError> {
        let (exe, peers) = (self.spec.exe.clone(), self.peers.clone());
        let args: Vec<String> = self.spec.serve_args.iter().map(|a| a.replace("{id}", &id.to_string())).collect();
        let (label, death) = (self.spec.label.clone(), self.spec.death_signal);
        let mut env = self.spec.env.clone();
        env.extend(self.spec.node_env.get(&id).cloned().unwrap_or_default());
        let node = self.node_mut(id)?;
        if node.is_running() {
            return Err(LaunchError::AlreadyRunning(id));
        }
        crate::storage::create_private_dir(&node.data_dir)?;
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--listen")
            .arg(node.addr())
            .arg("--peers")
            .arg(&peers)
            .args(&args)
            .envs(env);
        node.starts += 1;
        // The exact command heads each start in the log, so a node can be started again by hand.
        let heading = format!("{label}: start #{} of node {id}: {}", node.starts, command_line(&cmd));
        let log = open_log(&node.log_path, &heading)?;
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let at = Instant::now();
        node.child = Some(spawn_child(cmd, death)?);
        Ok(at)
    }

    /// Adds a new, empty node `id` on a free port with the cluster's `--peers`, which do not
    /// list it (so it waits to be added with `POST /v1/cluster/members`), and starts it.
    ///
    /// Errors: the id is taken, or the node could not be started.
    pub fn add_node(&mut self, id: u64) -> Result<(), LaunchError> {
        if self.get(id).is_some() {
            return Err(LaunchError::AlreadyRunning(id));
        }
        let port = free_ports(1)?[0];
        self.nodes.push(Self::node_at(&self.spec.root, id, port));
        self.start_node(id)?;
        Ok(())
    }

    /// Sends `sig` to node `id`'s process; returns the instant just before sending.
    ///
    /// Errors: the node is not running, or `kill(2)` failed.
    pub fn signal(&mut self, id: u64, sig: Signal) -> Result<Instant, LaunchError> {
        let node = self.node_mut(id)?;
        let child = node.child.as_ref().ok_or(LaunchError::NotRunning(id))?;
        let at = Instant::now();
        send(child, sig)?;
        Ok(at)
    }

    /// `kill -9` node `id` and reap it, at once (nothing if it is not running).
    pub fn kill(&mut self, id: u64) {
        if let Ok(node) = self.node_mut(id) {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// If node `id`'s process has exited (nobody reaped it yet), reaps it and says how.
    pub fn exited(&mut self, id: u64) -> Option<ExitStatus> {
        let node = self.node_mut(id).ok()?;
        let status = node.child.as_mut()?.try_wait().ok()??;
        node.child = None;
        Some(status)
    }

    /// Fails with [`LaunchError::Exited`] (and the log's tail) if node `id` exited on its own.
    ///
    /// Errors: as said.
    pub fn check_alive(&mut self, id: u64) -> Result<(), LaunchError> {
        match self.exited(id) {
            None => Ok(()),
            Some(status) => {
                let log = self.log_path(id);
                Err(LaunchError::Exited { id, status, tail: log_tail(&log, 40), log })
            }
        }
    }

    /// Waits until node `id`'s process has exited and reaps it; returns the instant it was seen
    /// gone (within [`PROBE_INTERVAL_MS`]). After `timeout` it is killed, and this is an error.
    ///
    /// Errors: the node is not running, or it did not exit in time.
    pub async fn wait_exit(&mut self, id: u64, timeout: Duration) -> Result<Instant, LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = self.node_mut(id)?;
            let child = node.child.as_mut().ok_or(LaunchError::NotRunning(id))?;
            if child.try_wait()?.is_some() {
                node.child = None;
                return Ok(Instant::now());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                node.child = None;
                return Err(LaunchError::Timeout(format!("node {id} did not exit within {timeout:?}; killed it")));
            }
            tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        }
    }

    /// Stops node `id` with `SIGTERM` and waits for it, killing it after `timeout` (nothing if
    /// it is not running).
    ///
    /// Errors: it did not exit within `timeout` (it was killed).
    pub async fn stop(&mut self, id: u64, timeout: Duration) -> Result<(), LaunchError> {
        match self.signal(id, Signal::Term) {
            Ok(_) => self.wait_exit(id, timeout).await.map(|_| ()),
            Err(LaunchError::NotRunning(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stops every running node with `SIGTERM`, then waits for each, killing those that take
    /// longer than `timeout`. Returns the ids that had to be killed.
    pub async fn stop_all(&mut self, timeout: Duration) -> Vec<u64> {
        for id in self.running_ids() {
            let _ = self.signal(id, Signal::Term);
        }
        let mut killed = Vec::new();
        for id in self.running_ids() {
            if self.wait_exit(id, timeout).await.is_err() {
                killed.push(id);
            }
        }
        killed
    }

    /// GETs `path` on node `id` once with the probe deadline; the status and body, or why there
    /// is none.
    async fn probe(&self, id: u64, path: &str) -> Result<(u16, bytes::Bytes), String> {
        // The probe's dialer decides TLS, so the node's plain address serves either way.
        let url = format!("{}{path}", self.node(id).map_err(|e| e.to_string())?.url());
        let (status, body) = crate::net::get_as(
            &self.http,
            &url,
            Duration::from_millis(PROBE_TIMEOUT_MS),
            PROBE_BODY_BYTES_MAX,
            self.spec.token.as_deref(),
        )
        .await?;
        Ok((status.as_u16(), body))
    }

    /// Node `id`'s view of the cluster (`GET /v1/cluster`), once.
    ///
    /// Errors: a text saying why there is none.
    pub async fn view(&self, id: u64) -> Result<ClusterView, String> {
        match self.probe(id, "/v1/cluster").await? {
            (200, body) => serde_json::from_slice(&body).map_err(|e| format!("node {id} /v1/cluster: {e}")),
            (status, body) => {
                Err(format!("node {id} /v1/cluster answered {status}: {}", String::from_utf8_lossy(&body).trim()))
            }
        }
    }

    /// Whether node `id` answers `/readyz` with 200 now: `Some(true)`; another status:
    /// `Some(false)`; no answer: `None`.
    pub async fn ready_now(&self, id: u64) -> Option<bool> {
        self.probe(id, "/readyz").await.ok().map(|(s, _)| s == 200)
    }

    /// Waits until node `id` answers `/healthz` with 200 (it serves HTTP); returns when it first
    /// did.
    ///
    /// Errors: it exited, or not within `timeout` (the last answer is in the text).
    pub async fn wait_healthy(&mut self, id: u64, timeout: Duration) -> Result<Instant, LaunchError> {
        self.wait_ok(id, "/healthz", timeout).await
    }

    /// Waits until node `id` answers `/readyz` with 200 (it knows a leader and has applied what
    /// it knows is committed); returns when it first did.
    ///
    /// Errors: it exited, or not within `timeout` (the last answer is in the text).
    pub async fn wait_ready(&mut self, id: u64, timeout: Duration) -> Result<Instant, LaunchError> {
        self.wait_ok(id, "/readyz", timeout).await
    }

    async fn wait_ok(&mut self, id: u64, path: &str, timeout: Duration) -> Result<Instant, LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive(id)?;
            let last = match self.probe(id, path).await {
                Ok((200, _)) => return Ok(Instant::now()),
                Ok((s, body)) => format!("{s} {}", String::from_utf8_lossy(&body).trim()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(LaunchError::Timeout(format!(
                    "node {id}: {path} did not answer 200 within {timeout:?}; last answer: {last}; log: {}",
                    self.log_path(id).display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        }
    }

    /// Waits until node `id` has applied log index `index`; returns when it first had.
    ///
    /// Errors: not within `timeout`.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> Result<Instant, LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.view(id).await {
                Ok(v) if v.applied_index >= index => return Ok(Instant::now()),
                Ok(v) => format!("applied {}", v.applied_index),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(LaunchError::Timeout(format!(
                    "node {id} did not apply index {index} within {timeout:?}; last: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        }
    }

    /// The leader and term every running node not in `ignore` reports, now, if they all report
    /// the same one and it is one of them.
    ///
    /// Errors: a text with what each node said.
    pub async fn agreed_leader(&self, ignore: &[u64]) -> Result<(u64, u64), String> {
        let asked: Vec<u64> = self.running_ids().into_iter().filter(|id| !ignore.contains(id)).collect();
        let mut said = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for &id in &asked {
            match self.view(id).await {
                Ok(v) => {
                    said.push(format!("{id}: leader {:?} term {}", v.leader_id, v.term));
                    seen.insert((v.leader_id, Some(v.term)));
                }
                Err(e) => {
                    said.push(format!("{id}: {e}"));
                    seen.insert((None, None));
                }
            }
        }
        match (seen.len(), seen.first()) {
            (1, Some(&(Some(l), Some(t)))) if asked.contains(&l) => Ok((l, t)),
            _ => Err(said.join("; ")),
        }
    }

    /// Waits until the running nodes not in `ignore` (nodes known to be behind, which may
    /// campaign in vain with ever higher terms) agree on a leader and term
    /// ([`LocalCluster::agreed_leader`]); with `ready`, until that leader also answers `/readyz`
    /// with 200. Returns the leader and its term.
    ///
    /// Errors: a running node exited, or no agreement within `timeout` (what each node said is in
    /// the text).
    pub async fn wait_leader(
        &mut self,
        ignore: &[u64],
        ready: bool,
        timeout: Duration,
    ) -> Result<(u64, u64), LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            for id in self.running_ids() {
                self.check_alive(id)?;
            }
            let last = match self.agreed_leader(ignore).await {
                Ok((l, t)) if !ready || self.ready_now(l).await == Some(true) => return Ok((l, t)),
                Ok((l, t)) => format!("leader {l} (term {t}) is not ready"),
                Err(said) => said,
            };
            if Instant::now() >= deadline {
                let what = if ready { "a ready leader" } else { "a leader" };
                return Err(LaunchError::Timeout(format!(
                    "the running nodes did not agree on {what} within {timeout:?}: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(AGREEMENT_POLL_MS)).await;
        }
    }

    /// A running node that says it leads, as some running node sees it (the others need not
    /// know yet), now.
    ///
    /// Errors: a text with what the last node asked said.
    pub async fn reported_leader(&self) -> Result<u64, String> {
        let running = self.running_ids();
        let mut last = String::from("no running node");
        for &id in &running {
            match self.view(id).await {
                Ok(v) => {
                    if let Some(l) = v.leader_id.filter(|l| running.contains(l)) {
                        if self.view(l).await.is_ok_and(|lv| lv.leader_id == Some(l)) {
                            return Ok(l);
                        }
                    }
                    last = format!("node {id} says leader_id={:?}", v.leader_id);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let mut children: Vec<Child> = self.nodes.iter_mut().filter_map(|n| n.child.take()).collect();
        for c in &mut children {
            let _ = c.kill();
        }
        // Reap them (bounded) so nothing writes into the directory while it is removed.
        let deadline = Instant::now() + Duration::from_millis(REAP_ON_DROP_MS_MAX);
        while !children.is_empty() && Instant::now() < deadline {
            children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.spec.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(8).unwrap();
        let distinct: std::collections::BTreeSet<_> = p.iter().collect();
        assert_eq!(distinct.len(), 8);
    }

    /// Ports for nodes come from outside the kernel's range for outgoing connections, where a
    /// connection's local port cannot take one between the pick and the node's bind (a CI
    /// run's node met `Address already in use` with ports from `bind(0)`, which are in it).
    #[test]
    fn free_ports_are_outside_the_range_of_outgoing_connections() {
        let (el, eh) = outgoing_range();
        let (low, high) = listening_range((el, eh));
        for _ in 0..32 {
            for p in free_ports(3).unwrap().into_iter().chain([free_base_port(3).unwrap()]) {
                assert!((low..=high).contains(&p), "{p} outside {low}..={high}");
                assert!(!(el..=eh).contains(&p), "{p} is in the outgoing range {el}..={eh}");
            }
        }
        let base = free_base_port(3).unwrap();
        for p in base..base + 3 {
            std::net::TcpListener::bind(("127.0.0.1", p)).expect("each port of a free base is free");
        }
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let mut f = open_log(&p, "test: start").unwrap();
        writeln!(f, "a\nb\nc").unwrap();
        assert_eq!(log_tail(&p, 2), "b\nc");
        assert_eq!(log_tail(&p, 10), "===== test: start =====\na\nb\nc");
        assert!(log_tail(&d.path().join("missing"), 2).starts_with("(cannot open"));
    }

    /// The port comes from below the range of outgoing connections' ports ([`free_ports`]): a
    /// port from `bind(0)`, once released at the end, could be taken by another test's outgoing
    /// connection before `check_port_free` binds it (a fresh-clone CI run failed so).
    #[test]
    fn a_taken_port_is_refused_naming_its_holder() {
        let port = free_ports(1).unwrap()[0];
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        match check_port_free(port) {
            Err(LaunchError::PortInUse { port: p, holder }) => {
                assert_eq!(p, port);
                let h = holder.expect("/proc names this process");
                assert_eq!(h.pid, std::process::id());
                assert!(!h.is_runnev_node(), "{h:?}");
            }
            other => panic!("{other:?}"),
        }
        let d = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::new("/bin/false", d.path().join("c"), 1, "test");
        spec.ports = Ports::Base(port);
        let err = LocalCluster::spawn(spec).err().expect("refused");
        assert!(err.to_string().contains(&format!("port {port} on 127.0.0.1 is already in use by process")), "{err}");
        drop(l);
        // A child forked by a test running beside this one holds a copy of every descriptor
        // until it execs (close-on-exec closes it only then), so the socket may outlive `drop`
        // by that long: a CI run under load saw it still listening.
        let freed = Instant::now() + Duration::from_secs(5);
        while check_port_free(port).is_err() && Instant::now() < freed {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(check_port_free(port).is_ok(), "port {port} still taken 5 s after its listener was dropped");
    }

    #[test]
    fn listening_sockets_are_found_in_the_proc_table() {
        let table =
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                     0: 0100007F:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n\
                     1: 0100007F:1B59 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1\n";
        assert_eq!(listening_inodes(table, 7001), vec!["4242".to_string()]);
        assert!(listening_inodes(table, 7002).is_empty());
    }

    #[test]
    fn base_ports_that_overflow_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::new("/bin/false", d.path(), 3, "test");
        spec.ports = Ports::Base(u16::MAX - 1);
        assert!(matches!(LocalCluster::spawn(spec.clone()), Err(LaunchError::Ports(_, 3))));
        spec.nodes = 0;
        assert!(matches!(LocalCluster::spawn(spec), Err(LaunchError::NoNodes)));
    }

    /// A child that exits at once is seen gone, with its log's tail; a heading names the command.
    #[tokio::test]
    async fn an_exited_node_is_reported_with_its_log() {
        let d = tempfile::tempdir().unwrap();
        let mut c = LocalCluster::spawn(ClusterSpec::new("/bin/false", d.path().join("c"), 1, "test")).unwrap();
        let heading = std::fs::read_to_string(c.log_path(1)).unwrap();
        assert!(
            heading.starts_with("===== test: start #1 of node 1: /bin/false serve --id 1 --data-dir "),
            "{heading}"
        );
        let err = c.wait_healthy(1, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, LaunchError::Exited { id: 1, .. }), "{err}");
        assert!(c.running_ids().is_empty());
        drop(c);
        assert!(!d.path().join("c").exists(), "the directory is removed on drop");
    }
}
