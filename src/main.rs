//! The `runnev` command line (SPEC §5): parse flags, then hand over to the library.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use runnev::limits::{BATCH_BYTES_DEFAULT, SNAPSHOT_KEEP_LOGS_DEFAULT, SNAPSHOT_LOGS_DEFAULT};
use runnev::node::{self, NodeConfig};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser)]
#[command(name = "runnev", version, about = "A Raft-replicated log service with an honest delivery guarantee")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Serve {
        /// This node's id (a positive integer, unique in the cluster).
        #[arg(long)]
        id: u64,
        /// Directory for the node's database and snapshot; must persist across restarts.
        #[arg(long)]
        data_dir: PathBuf,
        /// Address for the client API and Raft traffic, e.g. 127.0.0.1:7001.
        #[arg(long)]
        listen: String,
        /// Initial cluster members: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT.
        #[arg(long)]
        peers: String,
        /// Address peers use to reach this node when it is not in --peers (defaults to --listen).
        #[arg(long)]
        advertise: Option<String>,
        /// Largest batch payload, in bytes.
        #[arg(long, default_value_t = BATCH_BYTES_DEFAULT)]
        max_batch_bytes: usize,
        /// Create a stream on its first publish instead of answering 404.
        #[arg(long)]
        auto_create_streams: bool,
        /// Build a snapshot every N applied log entries.
        #[arg(long, default_value_t = SNAPSHOT_LOGS_DEFAULT)]
        snapshot_logs: u64,
        /// Log entries kept behind a snapshot when the log is purged.
        #[arg(long, default_value_t = SNAPSHOT_KEEP_LOGS_DEFAULT)]
        snapshot_keep_logs: u64,
    },
    /// Start a local cluster of child processes on 127.0.0.1; Ctrl-C stops it.
    Local {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Directory for the nodes' data and logs (kept across runs).
        #[arg(long, default_value = ".runnev-local")]
        dir: PathBuf,
        /// Port of node 1; node N listens on base-port + N - 1.
        #[arg(long, default_value_t = 7001)]
        base_port: u16,
    },
}

fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').with_context(|| format!("peer {part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id.parse().with_context(|| format!("peer id {id:?} is not an integer"))?;
        if !addr.contains(':') {
            bail!("peer address {addr:?} has no port");
        }
        if peers.insert(id, addr.to_string()).is_some() {
            bail!("peer id {id} is listed twice");
        }
    }
    if peers.is_empty() {
        bail!("--peers lists no node");
    }
    Ok(peers)
}

async fn shutdown_signal() {
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutdown signal received");
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Serve {
            id,
            data_dir,
            listen,
            peers,
            advertise,
            max_batch_bytes,
            auto_create_streams,
            snapshot_logs,
            snapshot_keep_logs,
        } => {
            let peers = parse_peers(&peers)?;
            let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
            let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .context("installing the metrics recorder")?;
            let cfg = NodeConfig {
                id,
                data_dir,
                advertise: advertise.unwrap_or_else(|| listen.clone()),
                peers,
                max_batch_bytes,
                auto_create_streams,
                snapshot_logs,
                snapshot_keep_logs,
            };
            node::run(
                cfg,
                listener,
                Arc::new(runnev::net::TcpDialer),
                runnev::api::system_clock(),
                Some(prometheus),
                shutdown_signal(),
            )
            .await?;
        }
        Cmd::Local { nodes, dir, base_port } => {
            runnev::local::run(runnev::local::LocalOptions { nodes, dir, base_port, serve_args: Vec::new() }).await?;
        }
    }
    Ok(())
}
