//! `runnev local`: a whole cluster on one machine, as child processes on 127.0.0.1.
//!
//! Owns: the command's options, its output and its watch over the children, which
//! [`crate::launcher`] starts and stops. Must never: leave a child running after it returns or
//! after it dies (children get SIGTERM on a clean stop and, through `PR_SET_PDEATHSIG`, when
//! this process is killed).

use std::path::PathBuf;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use crate::launcher::{ClusterSpec, LaunchError, LocalCluster, Ports, Signal};

/// Options of `runnev local` (SPEC §5).
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Number of nodes.
    pub nodes: u64,
    /// Directory holding `node-N/` data dirs; kept across runs so a restart rejoins.
    pub dir: PathBuf,
    /// Port of node 1; node N listens on `base_port + N - 1`.
    pub base_port: u16,
    /// Extra flags passed to every `runnev serve`.
    pub serve_args: Vec<String>,
}

/// How long a node may take to stop after SIGTERM before it is killed, in ms.
const STOP_MS_MAX: u64 = 10_000;
/// Interval at which the nodes are checked for having exited, in ms.
const WATCH_MS: u64 = 500;

/// Runs the cluster until Ctrl-C or SIGTERM, then stops every node (SIGTERM, then SIGKILL after
/// 10 s) and returns.
///
/// Errors: a node could not be started (the others are stopped first), or the ports would
/// overflow.
pub async fn run(opts: LocalOptions) -> Result<(), LaunchError> {
    let spec = ClusterSpec {
        exe: std::env::current_exe()?,
        root: opts.dir.clone(),
        nodes: opts.nodes,
        ports: Ports::Base(opts.base_port),
        serve_args: opts.serve_args.clone(),
        env: Vec::new(),
        node_env: Default::default(),
        label: "runnev local".into(),
        // A clean stop when `runnev local` itself is killed.
        death_signal: Signal::Term,
        // The data stays across runs, so a restart rejoins.
        keep_dir: true,
    };
    let mut cluster = LocalCluster::spawn(spec)?;
    println!("runnev local: {} nodes, data and logs under {}", opts.nodes, opts.dir.display());
    for n in cluster.nodes() {
        println!("  node {}: {}   (log: {})", n.id, n.url(), n.log_path.display());
    }
    println!("RUNNEV_NODES={}", cluster.urls().join(","));
    println!("Ctrl-C stops the cluster.");

    let mut term = signal(SignalKind::terminate())?;
    let mut watch = tokio::time::interval(Duration::from_millis(WATCH_MS));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = watch.tick() => {
                for id in cluster.running_ids() {
                    if let Some(status) = cluster.exited(id) {
                        eprintln!("runnev local: node {id} exited ({status}); see its log");
                    }
                }
                if cluster.running_ids().is_empty() {
                    eprintln!("runnev local: every node has exited; stopping");
                    return Ok(());
                }
            }
        }
    }
    println!("runnev local: stopping");
    for id in cluster.stop_all(Duration::from_millis(STOP_MS_MAX)).await {
        eprintln!("runnev local: node {id} did not stop in {STOP_MS_MAX} ms; killed it");
    }
    Ok(())
}
