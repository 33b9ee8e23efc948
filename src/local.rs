//! `runnev local`: a whole cluster on one machine, as child processes on 127.0.0.1.
//!
//! Owns: starting, watching and stopping the children. Must never: leave a child running after
//! it returns or after it dies (children get SIGTERM on a clean stop and, through
//! `PR_SET_PDEATHSIG`, when this process is killed).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

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

/// Why `runnev local` failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A child could not be started or waited on.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Ports would overflow.
    #[error("base port {0} leaves no room for {1} nodes")]
    Ports(u16, u64),
}

fn spawn_node(exe: &PathBuf, id: u64, opts: &LocalOptions, peers: &str, port: u16) -> std::io::Result<Child> {
    let data = opts.dir.join(format!("node-{id}"));
    std::fs::create_dir_all(&data)?;
    let mut log =
        std::fs::OpenOptions::new().create(true).append(true).open(opts.dir.join(format!("node-{id}.log")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .arg("--id")
        .arg(id.to_string())
        .arg("--data-dir")
        .arg(&data)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--peers")
        .arg(peers)
        .args(&opts.serve_args);
    // The exact command heads each start in the log, so a node can be started again by hand.
    let line: Vec<String> = std::iter::once(cmd.as_std().get_program())
        .chain(cmd.as_std().get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    std::io::Write::write_all(&mut log, format!("===== runnev local: {} =====\n", line.join(" ")).as_bytes())?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches only the child's own process state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Runs the cluster until Ctrl-C or SIGTERM, then stops every node (SIGTERM, then SIGKILL after
/// 10 s) and returns.
///
/// Errors: a node could not be started (the others are stopped first).
pub async fn run(opts: LocalOptions) -> Result<(), LocalError> {
    let last = u64::from(opts.base_port) + opts.nodes.saturating_sub(1);
    if opts.nodes == 0 || last > u64::from(u16::MAX) {
        return Err(LocalError::Ports(opts.base_port, opts.nodes));
    }
    let exe = std::env::current_exe()?;
    let port = |id: u64| (u64::from(opts.base_port) + id - 1) as u16;
    let peers: Vec<String> = (1..=opts.nodes).map(|id| format!("{id}=127.0.0.1:{}", port(id))).collect();
    let peers = peers.join(",");
    std::fs::create_dir_all(&opts.dir)?;
    let mut children = Vec::new();
    for id in 1..=opts.nodes {
        match spawn_node(&exe, id, &opts, &peers, port(id)) {
            Ok(c) => children.push((id, c)),
            Err(e) => {
                stop_all(&mut children).await;
                return Err(e.into());
            }
        }
    }
    println!("runnev local: {} nodes, data and logs under {}", opts.nodes, opts.dir.display());
    for id in 1..=opts.nodes {
        println!(
            "  node {id}: http://127.0.0.1:{}   (log: {})",
            port(id),
            opts.dir.join(format!("node-{id}.log")).display()
        );
    }
    let endpoints: Vec<String> = (1..=opts.nodes).map(|id| format!("http://127.0.0.1:{}", port(id))).collect();
    println!("RUNNEV_NODES={}", endpoints.join(","));
    println!("Ctrl-C stops the cluster.");

    let mut term = signal(SignalKind::terminate())?;
    let mut watch = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = watch.tick() => {
                for (id, child) in children.iter_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        eprintln!("runnev local: node {id} exited ({status}); see its log");
                    }
                }
                children.retain_mut(|(_, c)| !matches!(c.try_wait(), Ok(Some(_))));
                if children.is_empty() {
                    eprintln!("runnev local: every node has exited; stopping");
                    return Ok(());
                }
            }
        }
    }
    println!("runnev local: stopping");
    stop_all(&mut children).await;
    Ok(())
}

async fn stop_all(children: &mut Vec<(u64, Child)>) {
    for (_, child) in children.iter() {
        if let Some(pid) = child.id() {
            // SAFETY: sending a signal to our own child's pid.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    for (id, child) in children.iter_mut() {
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                eprintln!("runnev local: node {id} did not stop in 10 s; killing it");
                let _ = child.kill().await;
            }
        }
    }
    children.clear();
}
