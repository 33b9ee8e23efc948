//! `runnev local`: a whole cluster on one machine, as child processes on 127.0.0.1.
//!
//! Owns: the command's options, its output and its watch over the children, which
//! [`crate::launcher`] starts and stops, and their restarts: a node that exits uncleanly (a crash,
//! `kill -9`, or a node whose Raft core stopped for good and exited with status 1, the recovery
//! path `node::run` relies on) is started again on its data, as systemd's `Restart=on-failure`
//! does for `deploy/runnev.service` (`Restarts`). Must never: leave a child running after it returns or
//! after it dies (children get SIGTERM on a clean stop and, through `PR_SET_PDEATHSIG`, when
//! this process is killed); start beside a process that holds one of its ports (a node left from
//! an earlier run would take a node's place and could lead the others); or exit 0 when its
//! nodes could not run. A node started by hand beside it is not its business: it neither stops
//! nor watches one.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};

use crate::launcher::{log_tail, port_holder, ClusterSpec, LaunchError, LocalCluster, Ports, Signal};

/// Options of `runnev local` (SPEC §5).
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Number of nodes.
    pub nodes: u64,
    /// Directory holding `node-N/` data dirs; kept across runs so a restart rejoins.
    pub dir: PathBuf,
    /// Port of node 1; node N listens on `base_port + N - 1`.
    pub base_port: u16,
    /// Extra flags passed to every `runnev serve` (the user's, after `--`, and the log format);
    /// none may be one `runnev local` sets itself ([`check_serve_flags`]).
    pub serve_args: Vec<String>,
    /// Run with peer TLS, client TLS and `--auth` ([`prepare_secure`]).
    pub secure: bool,
}

/// What `runnev local --secure` made under its directory.
#[derive(Debug, Clone)]
pub struct SecureFiles {
    /// `DIR/ca.pem`, the throwaway CA's certificate (its key is `DIR/ca.key`).
    pub ca: PathBuf,
    /// `DIR/admin.token` (mode 0600), the cluster's first admin token.
    pub admin_token: PathBuf,
    /// The flags that make a node use them (`{id}` stands for the node's id).
    pub serve_args: Vec<String>,
}

/// Makes, on the first run, a throwaway CA (`DIR/ca.pem`, `DIR/ca.key`), a certificate for each
/// of `nodes` nodes on 127.0.0.1 and localhost (`DIR/node-N.pem`, `DIR/node-N.key`) and an admin
/// token (`DIR/admin.token`, mode 0600); later runs reuse them (a node missing its certificate
/// gets one from the CA).
///
/// Errors: a file cannot be read or written, or a certificate cannot be made.
pub fn prepare_secure(dir: &std::path::Path, nodes: u64) -> Result<SecureFiles, crate::tls::TlsError> {
    use crate::tls::{create_ca, issue, read_ca, write_private, write_public, Subject, TlsError};
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| TlsError::File { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let ca_path = dir.join("ca.pem");
    if !ca_path.exists() {
        let ca = create_ca("runnev local CA (throwaway)")?;
        write_private(&dir.join("ca.key"), &ca.key_pem)?;
        write_public(&ca_path, &ca.cert_pem)?;
    }
    let ca = read_ca(dir)?;
    for id in 1..=nodes {
        let cert = dir.join(format!("node-{id}.pem"));
        if !cert.exists() {
            let issued = issue(&ca, &Subject::Node(id), &["127.0.0.1".into(), "localhost".into()])?;
            let key = dir.join(format!("node-{id}.key"));
            let _ = std::fs::remove_file(&key);
            write_private(&key, &issued.key_pem)?;
            write_public(&cert, &issued.cert_pem)?;
        }
    }
    let admin_token = dir.join("admin.token");
    if !admin_token.exists() {
        let token = crate::auth::Token::generate(crate::auth::ADMIN_TOKEN_NAME)
            .map_err(|e| TlsError::Generate(format!("no randomness: {e}")))?;
        write_private(&admin_token, &format!("{}\n", token.expose()))?;
    }
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let serve_args = vec![
        "--tls-ca".into(),
        path(ca_path.clone()),
        "--tls-cert".into(),
        path(dir.join("node-{id}.pem")),
        "--tls-key".into(),
        path(dir.join("node-{id}.key")),
        "--auth".into(),
        "--admin-token-file".into(),
        path(admin_token.clone()),
    ];
    Ok(SecureFiles { ca: ca_path, admin_token, serve_args })
}

/// Why `runnev local` stopped without being asked to.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A port it needs is taken by a Runnev node it did not start.
    #[error(
        "port {port} is held by a runnev node that this `runnev local` did not start (process {pid}: {command}), \
         left from an earlier run or started by hand; started beside it, this cluster's nodes would join it. \
         Stop it (`kill {pid}`) and run `runnev local` again, or use other ports (--base-port)"
    )]
    StrayNode {
        /// The port.
        port: u16,
        /// The node's process id.
        pid: u32,
        /// Its command line.
        command: String,
    },
    /// A node exited before it served, with the cause from its log.
    #[error("node {id} could not start: {cause}; the other nodes were stopped (log: {log})")]
    NodeFailed {
        /// The node.
        id: u64,
        /// The cause, from the node's last words in its log (and who holds its port, if that is it).
        cause: String,
        /// Its log file.
        log: PathBuf,
    },
    /// Every node exited on its own, and none is to be started again (each stopped cleanly or
    /// failed [`RESTART_BURST`] starts within [`RESTART_WINDOW_MS`]).
    #[error("every node has exited on its own and none is started again; their logs are under {0}")]
    AllExited(PathBuf),
    /// The nodes could not be started, signalled or watched.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// A flag given for the nodes (after `--`) is one `runnev local` sets itself.
    #[error(
        "{flag} cannot be passed to the nodes: runnev local sets it itself ({why}); \
         flags after `--` are any other `runnev serve` flags, such as --auto-create-streams"
    )]
    OwnFlag {
        /// The flag, as given.
        flag: String,
        /// Which of its options sets it.
        why: &'static str,
    },
    /// The certificates or the admin token of `--secure` could not be made.
    #[error(transparent)]
    Secure(#[from] crate::tls::TlsError),
}

impl From<std::io::Error> for LocalError {
    fn from(e: std::io::Error) -> Self {
        LocalError::Launch(e.into())
    }
}

/// Prints a line on stdout; a closed stdout (`runnev local | head`) is not a reason to stop the
/// cluster abruptly (`println!` would panic), so the line is dropped.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`out!`] for stderr.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// How long a node may take to stop after SIGTERM before it is killed, in ms.
const STOP_MS_MAX: u64 = 10_000;
/// Interval at which the nodes are checked for having exited, in ms.
const WATCH_MS: u64 = 500;
/// How long a node may take to answer `/healthz` after it was started, in ms.
const START_MS_MAX: u64 = 60_000;
/// How long after an unclean exit a node is started again, in ms (`RestartSec=2s` of
/// `deploy/runnev.service`).
pub const RESTART_MS: u64 = 2_000;
/// A node that exits uncleanly after this many starts within [`RESTART_WINDOW_MS`] is not started
/// again (systemd's start limit, `StartLimitBurst=`): a node that cannot run (a damaged data dir,
/// a disk that refuses writes) is reported once instead of restarted every 2 s for ever.
pub const RESTART_BURST: usize = 5;
/// The window of [`RESTART_BURST`], in ms.
pub const RESTART_WINDOW_MS: u64 = 60_000;

/// What becomes of a node that exited ([`Restarts::exited`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterExit {
    /// It is started again at this instant.
    Restart(Instant),
    /// It started [`RESTART_BURST`] times within [`RESTART_WINDOW_MS`]: it is left down.
    GiveUp,
    /// It exited cleanly (SIGTERM or Ctrl-C sent to it): it is left down, as systemd's
    /// `Restart=on-failure` leaves a unit that stopped with status 0.
    Leave,
}

/// One node's restarts: the rule of systemd's `Restart=on-failure`, `RestartSec=` and start
/// limit, kept per node by [`run`]. Pure bookkeeping over instants the caller passes, so it is
/// tested without processes or clocks.
#[derive(Debug, Default)]
struct Restarts {
    /// The instants of its starts within the last [`RESTART_WINDOW_MS`] (older ones are dropped
    /// at each exit), oldest first.
    starts: VecDeque<Instant>,
    /// When it is to be started again, if it is.
    due: Option<Instant>,
}

impl Restarts {
    /// Records a start at `at`.
    fn started(&mut self, at: Instant) {
        self.starts.push_back(at);
        self.due = None;
    }

    /// Decides what follows an exit at `now`, clean (status 0) or not.
    fn exited(&mut self, clean: bool, now: Instant) -> AfterExit {
        self.due = None;
        if clean {
            return AfterExit::Leave;
        }
        let window = Duration::from_millis(RESTART_WINDOW_MS);
        while self.starts.front().is_some_and(|&s| now.saturating_duration_since(s) > window) {
            self.starts.pop_front();
        }
        if self.starts.len() >= RESTART_BURST {
            return AfterExit::GiveUp;
        }
        let at = now + Duration::from_millis(RESTART_MS);
        self.due = Some(at);
        AfterExit::Restart(at)
    }

    /// Whether it is to be started again at or before `now`.
    fn due(&self, now: Instant) -> bool {
        self.due.is_some_and(|at| at <= now)
    }

    /// Whether a restart is pending.
    fn pending(&self) -> bool {
        self.due.is_some()
    }
}

impl AfterExit {
    /// What `runnev local` says follows an exit.
    fn describe(self) -> String {
        match self {
            AfterExit::Restart(_) => format!("starting it again in {} s", RESTART_MS / 1000),
            AfterExit::GiveUp => {
                format!(
                    "it started {RESTART_BURST} times within {} s, so it is not started again",
                    RESTART_WINDOW_MS / 1000
                )
            }
            AfterExit::Leave => "it is not started again (it stopped cleanly)".to_string(),
        }
    }
}

/// A node's last words: the last line its `runnev serve` printed as an error (`runnev: …`, the
/// reason it stopped, or clap's `error: …` for a flag it does not take, such as one given after
/// `--`), else its log's last line, said to be only that (a node killed by a signal
/// writes no reason, and its last line may be any event: it read as the cause); with the process
/// holding its port when the port was the problem.
fn cause_from_log(log: &std::path::Path, port: u16) -> String {
    let tail = log_tail(log, 40);
    let cause = match tail.lines().rev().find_map(|l| l.strip_prefix("runnev: ").or_else(|| l.strip_prefix("error: ")))
    {
        Some(reason) => reason.to_string(),
        None => match tail.lines().rev().find(|l| !l.trim().is_empty() && !l.starts_with("=====")) {
            Some(last) => format!("it gave no reason; its log's last line: {last}"),
            None => "it printed nothing".to_string(),
        },
    };
    if !cause.contains("in use") {
        return cause;
    }
    match port_holder(port) {
        Some(h) => format!("{cause} (port {port} is held by process {}: {})", h.pid, h.command),
        None => cause,
    }
}

/// The `runnev serve` flags `runnev local` sets on every node itself, and where from.
const OWN_FLAGS: &[(&str, &str)] = &[
    ("--id", "each node's id"),
    ("--data-dir", "DIR/node-N, from --dir"),
    ("--listen", "127.0.0.1 and --base-port"),
    ("--peers", "the other nodes"),
    ("--log-format", "use `runnev local --log-format`"),
];

/// The flags `runnev local --secure` sets on every node.
const SECURE_FLAGS: &[&str] = &["--tls-ca", "--tls-cert", "--tls-key", "--auth", "--admin-token-file"];

/// Checks the flags a user gives for the nodes (`runnev local … -- FLAGS`): none may be one
/// `runnev local` sets itself (given twice, every node would refuse to start), as `--flag` or
/// `--flag=value`. What the flags mean is left to `runnev serve`, which refuses a bad one in
/// its log (and `runnev local` reports it with the node's last words).
///
/// Errors: [`LocalError::OwnFlag`] naming the first such flag.
pub fn check_serve_flags(flags: &[String], secure: bool) -> Result<(), LocalError> {
    let secure_flags = SECURE_FLAGS.iter().filter(|_| secure).map(|f| (*f, "--secure sets the TLS files and tokens"));
    for flag in flags {
        let name = flag.split_once('=').map_or(flag.as_str(), |(name, _)| name);
        if let Some((_, why)) = OWN_FLAGS.iter().copied().chain(secure_flags.clone()).find(|(own, _)| *own == name) {
            return Err(LocalError::OwnFlag { flag: flag.clone(), why });
        }
    }
    Ok(())
}

/// Runs the cluster until Ctrl-C or SIGTERM, then stops every node (SIGTERM, then SIGKILL after
/// 10 s) and returns.
///
/// Errors: a port is taken ([`LocalError::StrayNode`] for a Runnev node, else
/// [`LaunchError::PortInUse`]); a node exited before it served ([`LocalError::NodeFailed`], the
/// others are stopped); every node exited later ([`LocalError::AllExited`]); the ports would
/// overflow, or a process could not be started.
pub async fn run(opts: LocalOptions) -> Result<(), LocalError> {
    // The handlers first: a SIGTERM or Ctrl-C that arrives while the nodes start is kept until
    // they are up, then stops them. Installed after the banner, as they were, one that came
    // between the banner and their installation killed `runnev local` outright (a test that
    // stops it as soon as the banner is out saw that on a loaded machine).
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let secure = match opts.secure {
        true => Some(prepare_secure(&opts.dir, opts.nodes)?),
        false => None,
    };
    let mut serve_args = opts.serve_args.clone();
    serve_args.extend(secure.iter().flat_map(|s| s.serve_args.clone()));
    let token = match &secure {
        Some(s) => Some(std::fs::read_to_string(&s.admin_token)?.trim().to_string()),
        None => None,
    };
    let spec = ClusterSpec {
        exe: std::env::current_exe()?,
        root: opts.dir.clone(),
        nodes: opts.nodes,
        ports: Ports::Base(opts.base_port),
        serve_args,
        tls_ca: secure.as_ref().map(|s| s.ca.clone()),
        token,
        env: Vec::new(),
        node_env: Default::default(),
        label: "runnev local".into(),
        // A clean stop when `runnev local` itself is killed.
        death_signal: Signal::Term,
        // The data stays across runs, so a restart rejoins.
        keep_dir: true,
    };
    let mut cluster = match LocalCluster::spawn(spec) {
        Ok(c) => c,
        Err(LaunchError::PortInUse { port, holder: Some(h) }) if h.is_runnev_node() => {
            return Err(LocalError::StrayNode { port, pid: h.pid, command: h.command })
        }
        Err(e) => return Err(e.into()),
    };
    out!("runnev local: starting {} nodes, data and logs under {}", opts.nodes, opts.dir.display());
    let started = {
        let startup = async {
            for id in cluster.ids() {
                if let Err(e) = cluster.wait_healthy(id, Duration::from_millis(START_MS_MAX)).await {
                    return Err((id, e));
                }
            }
            Ok(())
        };
        tokio::select! {
            r = startup => Some(r),
            _ = interrupt.recv() => None,
            _ = term.recv() => None,
        }
    };
    let failed = match started {
        Some(r) => r.err(),
        // Stopped while starting: the nodes are stopped as at any other time.
        None => {
            stop(&mut cluster).await;
            return Ok(());
        }
    };
    if let Some((id, e)) = failed {
        let node = cluster.node(id)?;
        let (port, log) = (node.port, node.log_path.clone());
        let cause = match e {
            LaunchError::Exited { status, .. } => format!("{} ({status})", cause_from_log(&log, port)),
            e => e.to_string(),
        };
        cluster.stop_all(Duration::from_millis(STOP_MS_MAX)).await;
        return Err(LocalError::NodeFailed { id, cause, log });
    }
    // With --secure the nodes speak TLS only, which their `https://` URLs say to curl.
    for n in cluster.nodes() {
        out!("  node {}: {}   (log: {})", n.id, cluster.url(n.id), n.log_path.display());
    }
    if let Some(first) = cluster.urls().into_iter().next() {
        out!("Status page (in a browser; every node serves it): {first}/");
    }
    out!("RUNNEV_NODES={}", cluster.urls().join(","));
    if let Some(s) = &secure {
        out!("RUNNEV_CA_FILE={}", s.ca.display());
        out!("RUNNEV_TOKEN=$(cat {})   (the admin token; mode 0600)", s.admin_token.display());
        out!("Peer TLS, client TLS and tokens are on: clients need both (or --ca-file and --token).");
    }
    out!("Ctrl-C stops the cluster.");

    let mut restarts: std::collections::BTreeMap<u64, Restarts> =
        cluster.ids().into_iter().map(|id| (id, Restarts::default())).collect();
    let spawned = Instant::now();
    restarts.values_mut().for_each(|r| r.started(spawned));
    let mut watch = tokio::time::interval(Duration::from_millis(WATCH_MS));
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = term.recv() => break,
            _ = watch.tick() => {
                let now = Instant::now();
                for id in cluster.running_ids() {
                    let Some(status) = cluster.exited(id) else { continue };
                    let node = cluster.node(id)?;
                    let cause = if status.success() {
                        "it was stopped (SIGTERM or Ctrl-C)".to_string()
                    } else {
                        cause_from_log(&node.log_path, node.port)
                    };
                    let then = restarts.entry(id).or_default().exited(status.success(), now).describe();
                    note!("runnev local: node {id} exited ({status}): {cause}; {then} (log: {})", node.log_path.display());
                }
                for (&id, r) in restarts.iter_mut() {
                    if !r.due(now) {
                        continue;
                    }
                    match cluster.start_node(id) {
                        Ok(at) => {
                            r.started(at);
                            note!("runnev local: node {id} started again on its data");
                        }
                        Err(e) => {
                            // A start that failed counts towards the start limit, as systemd
                            // counts it: a node that can never be spawned is not retried for ever.
                            r.started(now);
                            let then = r.exited(false, now).describe();
                            note!("runnev local: node {id} could not be started again: {e}; {then}");
                        }
                    }
                }
                if cluster.running_ids().is_empty() && !restarts.values().any(Restarts::pending) {
                    return Err(LocalError::AllExited(opts.dir.clone()));
                }
            }
        }
    }
    stop(&mut cluster).await;
    Ok(())
}

/// Stops every node (SIGTERM, then SIGKILL after [`STOP_MS_MAX`]), saying so.
async fn stop(cluster: &mut LocalCluster) {
    out!("runnev local: stopping");
    for id in cluster.stop_all(Duration::from_millis(STOP_MS_MAX)).await {
        note!("runnev local: node {id} did not stop in {STOP_MS_MAX} ms; killed it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule of `Restart=on-failure` with its start limit: an unclean exit restarts the node
    /// 2 s later; a clean one leaves it down; the sixth unclean exit within a minute of five
    /// starts leaves it down too, and starts older than the window no longer count.
    #[test]
    fn a_node_that_crashed_is_restarted_until_it_crashes_five_times_in_a_minute() {
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let mut r = Restarts::default();
        r.started(s(0));
        assert_eq!(r.exited(true, s(1_000)), AfterExit::Leave, "a clean stop is not restarted");
        assert!(!r.pending());

        let mut r = Restarts::default();
        r.started(s(0));
        assert_eq!(r.exited(false, s(100)), AfterExit::Restart(s(2_100)));
        assert!(r.pending() && !r.due(s(2_099)) && r.due(s(2_100)));
        // Four more starts, each crashing at once: five starts within the window, then no more.
        for k in 1..RESTART_BURST as u64 {
            let at = s(2_100 * k);
            r.started(at);
            assert!(!r.pending());
            let after = r.exited(false, at + Duration::from_millis(100));
            if k + 1 < RESTART_BURST as u64 {
                assert_eq!(after, AfterExit::Restart(at + Duration::from_millis(2_100)), "start {}", k + 1);
            } else {
                assert_eq!(after, AfterExit::GiveUp, "the fifth start crashed within the window");
                assert!(!r.pending());
            }
        }

        // A node that crashes once every two minutes is restarted for ever.
        let mut r = Restarts::default();
        for k in 0..10u64 {
            let at = s(120_000 * k);
            r.started(at);
            assert_eq!(
                r.exited(false, at + Duration::from_millis(110_000)),
                AfterExit::Restart(at + Duration::from_millis(112_000))
            );
        }
    }

    /// A node killed by a signal writes no reason: its log's last line is named as only that
    /// (a user read `token created` as the reason node 3 died); a `runnev: …` line is the reason.
    #[test]
    fn a_nodes_last_log_line_is_not_given_as_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        std::fs::write(&log, "2026-12-01T20:00:00Z  INFO runnev::api: token created token=x\n").unwrap();
        assert_eq!(
            cause_from_log(&log, 1),
            "it gave no reason; its log's last line: 2026-12-01T20:00:00Z  INFO runnev::api: token created token=x"
        );
        std::fs::write(&log, "INFO starting\nrunnev: reading /etc/runnev/ca.pem: No such file or directory\n").unwrap();
        assert_eq!(cause_from_log(&log, 1), "reading /etc/runnev/ca.pem: No such file or directory");
        let clap = "error: unexpected argument '--bogus' found\n\nUsage: runnev serve --id <ID>\n\nFor more information, try '--help'.\n";
        std::fs::write(&log, clap).unwrap();
        assert_eq!(cause_from_log(&log, 1), "unexpected argument '--bogus' found");
        std::fs::write(&log, "").unwrap();
        assert_eq!(cause_from_log(&log, 1), "it printed nothing");
    }
}
