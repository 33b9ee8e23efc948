//! The `runnev` command line (SPEC §5): parse flags, then hand over to the library.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use runnev::limits::{
    BATCH_BYTES_DEFAULT, MAX_CLOCK_OFFSET_MS_DEFAULT, SNAPSHOT_KEEP_LOGS_DEFAULT, SNAPSHOT_LOGS_DEFAULT,
};
use runnev::node::{self, NodeConfig};
use tokio::signal::unix::{signal, SignalKind};

mod cli;

#[derive(Parser)]
#[command(name = "runnev", version, about = "A Raft-replicated log service with an honest delivery guarantee")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Where client commands find the cluster (SPEC §5).
#[derive(clap::Args)]
struct ClientArgs {
    /// Nodes to talk to, comma-separated base URLs; the client fails over between them.
    #[arg(long = "nodes", env = "RUNNEV_NODES", default_value = runnev::client::DEFAULT_NODES)]
    nodes: String,
}

impl ClientArgs {
    fn client(&self) -> Result<runnev::client::Client> {
        Ok(runnev::client::Client::new(&runnev::client::Client::parse_nodes(&self.nodes))?)
    }
}

/// `runnev cluster` subcommands.
#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Add a node (started with `runnev serve --id ID …`): learner first, voter once caught up.
    Add {
        /// The new node's id.
        id: u64,
        /// Its address, HOST:PORT, as the other nodes reach it.
        addr: String,
        /// Keep it a learner (no vote).
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node.
    Remove {
        /// The node's id.
        id: u64,
    },
}

/// `runnev streams` subcommands.
#[derive(Subcommand)]
pub enum StreamsCmd {
    /// List streams (the default).
    List,
    /// Create a stream, or replace its retention.
    Create {
        /// Stream name.
        name: String,
        /// Most batches kept.
        #[arg(long)]
        max_batches: Option<u64>,
        /// Most payload bytes kept.
        #[arg(long)]
        max_bytes: Option<u64>,
        /// Oldest batch age kept, in ms.
        #[arg(long)]
        max_age_ms: Option<u64>,
    },
    /// Show one stream.
    Info {
        /// Stream name.
        name: String,
    },
    /// Delete a stream and its batches.
    Delete {
        /// Stream name.
        name: String,
    },
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
        /// Most a node's wall clock may differ from the median of the voters' clocks, in ms;
        /// past it the node does not lead.
        #[arg(long, default_value_t = MAX_CLOCK_OFFSET_MS_DEFAULT)]
        max_clock_offset_ms: u64,
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
    /// Publish one batch and print the answer.
    Publish {
        #[command(flatten)]
        at: ClientArgs,
        /// Stream name.
        stream: String,
        /// Your own seq, for idempotent retries.
        #[arg(long)]
        seq: Option<u64>,
        /// The payload (else --file, else stdin).
        data: Option<String>,
        /// Read the payload from this file.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Print batches as they arrive, failing over between nodes.
    Subscribe {
        #[command(flatten)]
        at: ClientArgs,
        /// Stream name.
        stream: String,
        /// Start after this seq (overrides the cursor file).
        #[arg(long, allow_hyphen_values = true)]
        after: Option<i64>,
        /// Resume from, and save the cursor to, this file after each batch is printed.
        #[arg(long)]
        cursor_file: Option<PathBuf>,
    },
    /// Manage streams.
    Streams {
        #[command(flatten)]
        at: ClientArgs,
        #[command(subcommand)]
        cmd: Option<StreamsCmd>,
    },
    /// Change the cluster's membership.
    Cluster {
        #[command(flatten)]
        at: ClientArgs,
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Exit 0 if URL answers 2xx within the timeout, else 1 (container health checks).
    Probe {
        /// The URL, e.g. http://127.0.0.1:7001/readyz.
        url: String,
        /// Timeout, in ms.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// Show each node's view of the cluster.
    Status {
        #[command(flatten)]
        at: ClientArgs,
    },
    /// Load and fault benchmarks (publish, catchup, failover, restart), run by the runnev-bench
    /// executable beside this one; `runnev bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        /// Passed to runnev-bench as they are.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Relay committed rows of a PostgreSQL outbox table into streams, each exactly once.
    OutboxRelay(runnev::outbox::cli::RelayArgs),
    /// Apply a stream's batches to PostgreSQL exactly once (cursor kept in the same transaction).
    SinkPostgres(runnev::outbox::cli::SinkArgs),
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

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("runnev: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runnev: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    runnev::node::init_logging();
    match Cli::parse().command {
        Cmd::Serve {
            id,
            data_dir,
            listen,
            peers,
            max_batch_bytes,
            auto_create_streams,
            snapshot_logs,
            snapshot_keep_logs,
            max_clock_offset_ms,
        } => {
            let peers = parse_peers(&peers)?;
            let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
            // Answers are small: without TCP_NODELAY, Nagle and delayed ACKs add ~40 ms to each.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::warn!(error = %e, "TCP_NODELAY");
                }
            });
            let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .context("installing the metrics recorder")?;
            let cfg = NodeConfig {
                id,
                data_dir,
                peers,
                max_batch_bytes,
                auto_create_streams,
                snapshot_logs,
                snapshot_keep_logs,
                max_clock_offset_ms,
            };
            let store = runnev::storage::Store::open(&cfg.data_dir)
                .with_context(|| format!("opening the data dir {}", cfg.data_dir.display()))?;
            node::run(cfg, store, listener, node::Environment::production(Some(prometheus)), shutdown_signal()).await?;
        }
        Cmd::Local { nodes, dir, base_port } => {
            runnev::local::run(runnev::local::LocalOptions { nodes, dir, base_port, serve_args: Vec::new() }).await?;
        }
        Cmd::Publish { at, stream, seq, data, file } => cli::publish(&at.client()?, &stream, seq, data, file).await?,
        Cmd::Subscribe { at, stream, after, cursor_file } => {
            cli::subscribe(&at.client()?, &stream, after, cursor_file).await?
        }
        Cmd::Streams { at, cmd } => cli::streams(&at.client()?, cmd).await?,
        Cmd::Status { at } => cli::status(&at.client()?).await?,
        Cmd::Probe { url, timeout_ms } => cli::probe(&url, std::time::Duration::from_millis(timeout_ms)).await?,
        Cmd::Cluster { at, cmd } => {
            let client = at.client()?;
            let view = match cmd {
                ClusterCmd::Add { id, addr, learner } => client.add_member(id, &addr, !learner).await?,
                ClusterCmd::Remove { id } => client.remove_member(id).await?,
            };
            // Through a JSON value: keys sorted, as this output has always been.
            println!("{}", serde_json::to_value(view)?);
        }
        Cmd::Bench { args } => return Err(cli::bench(args)),
        Cmd::OutboxRelay(args) => runnev::outbox::cli::relay(args, shutdown_signal()).await?,
        Cmd::SinkPostgres(args) => runnev::outbox::cli::sink(args, shutdown_signal()).await?,
    }
    Ok(())
}
