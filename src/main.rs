//! The `runnev` command line (SPEC §5): parse flags, then hand over to the library.
//!
//! Exit statuses are part of the contract ([`cli::Exit`], listed by `runnev --help` and in
//! `docs/cli.md`); `docs/cli-reference.md` is generated from the definitions below (see the
//! test at the end).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use runnev::limits::{
    APPEND_BYTES_DEFAULT, BATCH_BYTES_DEFAULT, BODY_READ_TIMEOUT_DEFAULT, BODY_READ_TIMEOUT_MIN,
    CONNECTIONS_MAX_DEFAULT, HEADER_READ_TIMEOUT_DEFAULT, HEADER_READ_TIMEOUT_MIN, MAX_CLOCK_OFFSET_MS_DEFAULT,
    MIN_FREE_DISK_BYTES_DEFAULT, PROPOSALS_QUEUED_MAX_DEFAULT, SNAPSHOT_KEEP_LOGS_DEFAULT, SNAPSHOT_LOGS_DEFAULT,
    SUBSCRIBERS_MAX_DEFAULT,
};
use runnev::node::{self, NodeConfig};
use runnev::units::{self, Limit};
use tokio::signal::unix::{signal, SignalKind};

mod cli;

/// The process's allocator: mimalloc (Leijen, Zorn, de Moura, "Mimalloc: Free List Sharding in
/// Action", 2019), for its per-thread free lists. With glibc's malloc, allocation and free took
/// a tenth to a sixth of a node's CPU under publish load (`malloc_consolidate`, `_int_malloc`,
/// `unlink_chunk` in `perf`): a payload is allocated on one thread and freed on another (the
/// blocking pool, the runtime's workers). Built without its transparent-huge-page requests
/// (`no_thp`, Cargo.toml): with them a node's memory grew by 2 MiB pages. The library does not
/// choose an allocator; the executable does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use cli::{Exit, Output};

/// The exit statuses, as `runnev --help` lists them after the commands.
fn exit_help() -> String {
    let mut text = String::from("Exit status:");
    for exit in Exit::ALL {
        text.push_str(&format!("\n  {}  {}", exit as u8, exit.summary()));
    }
    text
}

/// The command line's definition, with the exit statuses in its help.
fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().after_help(exit_help())
}

#[derive(Parser)]
#[command(name = "runnev", version, about = "A Raft-replicated log service with an honest delivery guarantee")]
struct Cli {
    #[command(flatten)]
    at: TopClientArgs,
    /// How log lines are written on stderr: text (readable) or json (one object per line; in
    /// `runnev serve` each carries the node id and its Raft term)
    #[arg(
        long = "log-format",
        value_name = "FORMAT",
        global = true,
        env = "RUNNEV_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: runnev::logging::LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

/// The client flags before the subcommand (`runnev --nodes … streams`); the same flags after it
/// ([`ClientArgs`]) take precedence.
#[derive(clap::Args)]
struct TopClientArgs {
    /// Nodes the client commands talk to: HOST:PORT or http://HOST:PORT, comma-separated; the
    /// client fails over between them [env: RUNNEV_NODES] [default: 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003]
    #[arg(short = 'n', long = "nodes", value_name = "NODES")]
    nodes: Option<String>,
    /// Output of the client commands: text (for people) or json (one JSON document per line)
    /// [default: text on a terminal, json when stdout is not one]
    #[arg(short = 'o', long = "output", value_name = "FORMAT")]
    output: Option<Output>,
    /// The token the client commands send (nodes run with --auth); sent only over TLS, so it needs --ca-file [env: RUNNEV_TOKEN]
    #[arg(long = "token", value_name = "TOKEN")]
    token: Option<String>,
    /// The cluster CA's certificate: the client commands speak TLS and verify the nodes with it
    /// [env: RUNNEV_CA_FILE]
    #[arg(long = "ca-file", value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

/// Where client commands find the cluster, and how they print (SPEC §5). Accepted anywhere after
/// the command (`runnev streams create t1 --nodes …`).
#[derive(clap::Args)]
struct ClientArgs {
    /// Nodes to talk to: HOST:PORT or http://HOST:PORT, comma-separated; the client fails over
    /// between them [env: RUNNEV_NODES] [default: 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003]
    #[arg(short = 'n', long = "nodes", value_name = "NODES", global = true)]
    nodes: Option<String>,
    /// Output: text (for people) or json (one JSON document per line) [default: text on a
    /// terminal, json when stdout is not one]
    #[arg(short = 'o', long = "output", value_name = "FORMAT", global = true)]
    output: Option<Output>,
    /// The token to send (nodes run with --auth); sent only over TLS, so it needs --ca-file [env: RUNNEV_TOKEN]
    #[arg(long = "token", value_name = "TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// The cluster CA's certificate: speak TLS to the nodes and verify them with it
    /// [env: RUNNEV_CA_FILE]
    #[arg(long = "ca-file", value_name = "FILE", global = true)]
    ca_file: Option<PathBuf>,
}

/// The resolved client flags of one command.
struct At {
    nodes: String,
    output: Output,
    token: Option<String>,
    ca_file: Option<PathBuf>,
}

impl At {
    /// Errors: a `--ca-file` that cannot be read is a local problem (exit 1, docs/cli.md), named
    /// before the client is made (it was a usage error, exit 2); the rest as
    /// [`runnev::client::Client::from_flags`].
    fn client(&self) -> Result<runnev::client::Client> {
        if let Some(ca) = &self.ca_file {
            std::fs::File::open(ca).with_context(|| format!("reading --ca-file {}", ca.display()))?;
        }
        Ok(runnev::client::Client::from_flags(&self.nodes, self.ca_file.as_deref(), self.token.as_deref())?)
    }
}

/// A token's name ([`runnev::auth::validate_name`]), checked before the cluster is asked (it
/// was refused by the node, exit 4).
fn token_name(s: &str) -> Result<String, String> {
    runnev::auth::validate_name(s).map(|()| s.to_string())
}

/// A client certificate's name: the rule of a token's name, in the words of a client.
fn client_name(s: &str) -> Result<String, String> {
    runnev::auth::validate_name(s).map(|()| s.to_string()).map_err(|_| {
        format!("{s:?} is not a client name: 1 to {} characters of A-Z a-z 0-9 . -", runnev::auth::TOKEN_NAME_CHARS_MAX)
    })
}

/// The cluster CA in `dir` for `runnev cert create-node / create-client`; a missing one says
/// how to make it (it said only "No such file or directory").
fn cluster_ca(dir: &std::path::Path) -> Result<runnev::tls::Issued> {
    runnev::tls::read_ca(dir).map_err(|e| match e {
        runnev::tls::TlsError::File { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            anyhow::anyhow!(
                "{e}: no cluster CA in {0}; make it first with `runnev cert create-ca --dir {0}`",
                dir.display()
            )
        }
        other => other.into(),
    })
}

/// A node id: a whole number from 1 (SPEC §5).
fn node_id(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("node ids start at 1; 0 is not a node id".into()),
        Ok(id) => Ok(id),
        Err(_) => Err(format!("{s:?} is not a node id (a whole number from 1)")),
    }
}

/// A publisher's seq: a whole number from 1 (SPEC §2.3), as the server checks it.
fn seq(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("seq={s:?} must be an integer >= 1")),
    }
}

/// A stream name, checked with the server's rule and words (SPEC §1).
fn stream_name(s: &str) -> Result<String, String> {
    runnev::stream::validate_name(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// `--after`: the last seq already processed; -1 and 0 both mean the start (as the server reads
/// `after`), any other negative number is refused as the server refuses it.
fn after(s: &str) -> Result<u64, String> {
    match s.trim() {
        "-1" => Ok(0),
        t => t.parse::<u64>().map_err(|_| format!("after={t:?} must be a non-negative integer (or -1, the start)")),
    }
}

/// A count of at least 1 (`--max-connections`, `--max-subscribers`, `--max-queued-proposals`).
fn at_least_one_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number from 1")),
    }
}

/// A deadline flag's value (`--header-read-timeout`, `--body-read-timeout`): shown as
/// [`units::format_duration`] writes it, so the default printed is the constant's.
#[derive(Debug, Clone, Copy)]
struct Deadline(Duration);

impl std::fmt::Display for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&units::format_duration(self.0))
    }
}

/// A duration of at least `min` ([`units::parse_duration`]).
fn deadline_from(s: &str, min: Duration) -> Result<Deadline, String> {
    let d = units::parse_duration(s)?;
    if d < min {
        return Err(format!("{s:?} is under the least allowed, {}", units::format_duration(min)));
    }
    Ok(Deadline(d))
}

/// `--header-read-timeout`: at least [`HEADER_READ_TIMEOUT_MIN`].
fn header_deadline(s: &str) -> Result<Deadline, String> {
    deadline_from(s, HEADER_READ_TIMEOUT_MIN)
}

/// `--body-read-timeout`: at least [`BODY_READ_TIMEOUT_MIN`].
fn body_deadline(s: &str) -> Result<Deadline, String> {
    deadline_from(s, BODY_READ_TIMEOUT_MIN)
}

/// A size in bytes for a `usize` flag ([`units::parse_bytes`]).
/// A size in bytes (`units::parse_bytes`), as a u64.
fn size_u64(s: &str) -> Result<u64, String> {
    units::parse_bytes(s)
}

fn size(s: &str) -> Result<usize, String> {
    let n = units::parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?} is too large"))
}

/// A retention limit: at least 1 of its unit, or `none`.
fn at_least_one<T: PartialEq + Default>(limit: Limit<T>, what: &str) -> Result<Limit<T>, String> {
    match limit {
        Limit::Set(v) if v == T::default() => Err(format!("{what} of 0 would keep nothing; give at least 1, or none")),
        l => Ok(l),
    }
}

fn batches_limit(s: &str) -> Result<Limit<u64>, String> {
    at_least_one(units::parse_count_limit(s)?, "a batch limit")
}

fn bytes_limit(s: &str) -> Result<Limit<u64>, String> {
    at_least_one(units::parse_bytes_limit(s)?, "a size limit")
}

fn age_limit(s: &str) -> Result<Limit<Duration>, String> {
    let limit = units::parse_duration_limit(s)?;
    if let Limit::Set(d) = limit {
        if d < Duration::from_millis(1) {
            return Err("an age limit under 1ms would keep nothing; give at least 1ms, or none".into());
        }
    }
    Ok(limit)
}

/// `runnev probe`'s URL: `http://` or `https://` and the rest (a bare `HOST:PORT` used to fail
/// with hyper's "UserAbsoluteUriRequired").
fn probe_url(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.starts_with("http://") || t.starts_with("https://") {
        return Ok(t.to_string());
    }
    let bare = t.trim_start_matches('/');
    // `HOST:PORT/PATH` keeps its path; a bare `HOST:PORT` gets `/readyz`.
    let example = if bare.contains('/') { format!("http://{bare}") } else { format!("http://{bare}/readyz") };
    Err(format!("{t:?} is not a URL: give one whole, e.g. {example} (https:// with --ca-file)"))
}

/// `--max-age-ms`: a whole number of ms (its old form), or a duration with its unit.
fn age_ms(s: &str) -> Result<u64, String> {
    let ms = match s.trim().parse::<u64>() {
        Ok(ms) => ms,
        Err(_) => u64::try_from(units::parse_duration(s)?.as_millis()).unwrap_or(u64::MAX),
    };
    if ms == 0 {
        return Err("an age limit under 1ms would keep nothing; give at least 1ms".into());
    }
    Ok(ms)
}

/// Retention flags of `streams create` and `streams set`.
#[derive(clap::Args, Debug, Clone)]
pub struct RetentionArgs {
    /// Most batches kept (the newest is never evicted), or none
    #[arg(long, value_name = "N|none", value_parser = batches_limit)]
    max_batches: Option<Limit<u64>>,
    /// Most payload bytes kept, e.g. 64MiB, 1GB, 1048576 (the newest batch is never evicted), or
    /// none
    #[arg(long, value_name = "SIZE|none", value_parser = bytes_limit)]
    max_bytes: Option<Limit<u64>>,
    /// Oldest batch age kept, e.g. 30s, 15m, 1h, 7d, or none
    #[arg(long, value_name = "DURATION|none", value_parser = age_limit, conflicts_with = "max_age_ms")]
    max_age: Option<Limit<Duration>>,
    /// The former spelling of --max-age: ms, or a duration.
    #[arg(long, value_name = "MS", hide = true, value_parser = age_ms)]
    max_age_ms: Option<u64>,
}

/// `runnev cluster` subcommands.
#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Add a node (started with `runnev serve --id ID …`, its id not in its --peers) as a
    /// learner; with --wait-voter, wait until it has caught up and is a voter.
    Add {
        /// The new node's id.
        #[arg(value_parser = node_id)]
        id: u64,
        /// Its address, HOST:PORT, as the other nodes reach it.
        addr: String,
        /// Then wait until it has caught up and been promoted to voter, showing its progress.
        #[arg(long)]
        wait_voter: bool,
        /// How long --wait-voter waits before it gives up (the node stays a learner).
        #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = units::parse_duration, requires = "wait_voter")]
        timeout: Duration,
        /// Keep it a learner: what `add` does without --wait-voter (kept for scripts).
        #[arg(long, hide = true, conflicts_with = "wait_voter")]
        learner: bool,
    },
    /// Remove a node: a learner at once, a voter through a joint configuration.
    #[command(visible_alias = "rm")]
    Remove {
        /// The node's id.
        #[arg(value_parser = node_id)]
        id: u64,
    },
}

/// `runnev streams` subcommands.
#[derive(Subcommand)]
pub enum StreamsCmd {
    /// List streams (the default).
    #[command(visible_alias = "ls")]
    List,
    /// Create a stream; on an existing stream, a retention flag replaces its whole retention
    /// (a limit not given becomes none).
    Create {
        /// Stream name: 1-128 of A-Z a-z 0-9 . _ -
        #[arg(value_parser = stream_name)]
        name: String,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Change some retention limits of an existing stream, keeping the others (none clears one).
    #[command(visible_alias = "update")]
    Set {
        /// Stream name.
        #[arg(value_parser = stream_name)]
        name: String,
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Show one stream.
    Info {
        /// Stream name.
        #[arg(value_parser = stream_name)]
        name: String,
    },
    /// Delete a stream and its batches.
    #[command(visible_alias = "rm")]
    Delete {
        /// Stream name.
        #[arg(value_parser = stream_name)]
        name: String,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Serve {
        /// This node's id: a whole number from 1, unique in the cluster.
        #[arg(long, value_parser = node_id)]
        id: u64,
        /// Directory for the node's Raft log, database and snapshots; must persist across
        /// restarts.
        #[arg(long)]
        data_dir: PathBuf,
        /// Address for the client API and Raft traffic, e.g. 127.0.0.1:7001.
        #[arg(long)]
        listen: String,
        /// Initial cluster members: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT (one node: 1=HOST:PORT).
        #[arg(long)]
        peers: String,
        /// Largest batch payload: bytes, or with a unit (512KiB, 4MiB); at most 32MiB.
        #[arg(long, value_name = "SIZE", default_value_t = BATCH_BYTES_DEFAULT, value_parser = size)]
        max_batch_bytes: usize,
        /// Largest body of a many-batches publish (Content-Type application/vnd.runnev.frames),
        /// frame headers included: bytes, or with a unit (8MiB); at most 64MiB.
        #[arg(long, value_name = "SIZE", default_value_t = APPEND_BYTES_DEFAULT, value_parser = size)]
        max_append_bytes: usize,
        /// Create a stream on its first publish instead of answering 404.
        #[arg(long)]
        auto_create_streams: bool,
        /// Build a snapshot every N applied log entries.
        #[arg(long, default_value_t = SNAPSHOT_LOGS_DEFAULT)]
        snapshot_logs: u64,
        /// Log entries kept behind a snapshot when the log is purged.
        #[arg(long, default_value_t = SNAPSHOT_KEEP_LOGS_DEFAULT)]
        snapshot_keep_logs: u64,
        /// Also build a snapshot once the entries applied since the last one carry this many
        /// payload bytes (bytes, or with a unit: 64MiB), whatever their count: bounds the log
        /// a snapshot lets the node purge when batches are large.
        #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = size_u64)]
        snapshot_log_bytes: u64,
        /// Most a node's wall clock may differ from the median of the voters' clocks, in ms;
        /// past it the node does not lead.
        #[arg(long, default_value_t = MAX_CLOCK_OFFSET_MS_DEFAULT)]
        max_clock_offset_ms: u64,
        /// Free space the node keeps on its data directory's file system: bytes, or with a unit
        /// (64MiB); at most a quarter of the file system is kept. Below it the node takes no new
        /// writes (a leader answers 507 storage_full) and goes on by itself once space is freed.
        /// 0 turns the guard off.
        #[arg(long, value_name = "SIZE", default_value_t = MIN_FREE_DISK_BYTES_DEFAULT, value_parser = units::parse_bytes)]
        min_free_disk_bytes: u64,
        /// Most connections held open at once; past it a new one is answered 503 overloaded.
        #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT, value_parser = at_least_one_count)]
        max_connections: usize,
        /// Most subscriptions served at once; past it a new one is answered 503 overloaded.
        #[arg(long, default_value_t = SUBSCRIBERS_MAX_DEFAULT, value_parser = at_least_one_count)]
        max_subscribers: usize,
        /// Most writes waiting on the leader for a log entry to carry them; past it a write is
        /// answered 503 overloaded, and nothing is proposed (a client may resend it).
        #[arg(long, default_value_t = PROPOSALS_QUEUED_MAX_DEFAULT, value_parser = at_least_one_count)]
        max_queued_proposals: usize,
        /// Deadline for each request's line and headers, from when the connection waits for
        /// them (once accepted, and after each answer on a kept-alive connection); past it the
        /// connection is closed without an answer. An idle connection is closed too.
        #[arg(long, value_name = "DURATION", default_value_t = Deadline(HEADER_READ_TIMEOUT_DEFAULT), value_parser = header_deadline)]
        header_read_timeout: Deadline,
        /// Deadline for each request's whole body, from the end of its headers; past it the
        /// request is answered 408 request_timeout, nothing is done, and the connection closes.
        #[arg(long, value_name = "DURATION", default_value_t = Deadline(BODY_READ_TIMEOUT_DEFAULT), value_parser = body_deadline)]
        body_read_timeout: Deadline,
        #[command(flatten)]
        security: ServeSecurity,
    },
    /// Start a local cluster of child processes on 127.0.0.1; Ctrl-C stops it.
    ///
    /// It supervises the nodes as systemd's `Restart=on-failure` does: a node that exits
    /// uncleanly (a crash, kill -9, a Raft core that stopped) is started again on its data 2 s
    /// later; one stopped cleanly (SIGTERM, exit 0) stays down; one that needed five starts
    /// within 60 s is left down with its cause. Exits 1 once no node runs and none is due to
    /// start again.
    Local {
        /// Number of nodes.
        #[arg(long = "nodes", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=99))]
        count: u64,
        /// Directory for the nodes' data and logs (kept across runs).
        #[arg(long, default_value = ".runnev-local")]
        dir: PathBuf,
        /// Port of node 1; node N listens on base-port + N - 1.
        #[arg(long, default_value_t = 7001)]
        base_port: u16,
        /// Run with peer TLS, client TLS and tokens: writes a throwaway CA, node certificates
        /// and an admin token under --dir (DIR/ca.pem, DIR/admin.token) on its first run.
        #[arg(long)]
        secure: bool,
        /// Flags for every node's `runnev serve`, after `--` (`runnev local -- --auto-create-streams
        /// --snapshot-logs 300`); not the ones it sets itself (--id, --data-dir, --listen,
        /// --peers, --log-format; with --secure the TLS and token flags).
        #[arg(last = true, value_name = "SERVE_FLAGS")]
        serve_flags: Vec<String>,
    },
    /// Make the cluster's certificates: a CA, node certificates naming their node id, client
    /// certificates.
    Cert {
        #[command(subcommand)]
        cmd: CertCmd,
    },
    /// Manage client tokens (nodes started with --auth).
    Auth {
        #[command(flatten)]
        at: ClientArgs,
        #[command(subcommand)]
        cmd: AuthCmd,
    },
    /// Publish one batch and print the answer.
    Publish {
        #[command(flatten)]
        at: ClientArgs,
        /// Stream name.
        #[arg(value_parser = stream_name)]
        stream: String,
        /// Your own seq (from 1), for idempotent retries.
        #[arg(short, long, value_parser = seq)]
        seq: Option<u64>,
        /// The payload (else --file, else stdin; `-` is stdin).
        #[arg(conflicts_with = "file")]
        data: Option<String>,
        /// Read the payload from this file (`-` is stdin).
        #[arg(short, long)]
        file: Option<PathBuf>,
        /// Publish each line of the input as its own batch, many batches per request (one Raft
        /// entry each, all or none; at most 10000 lines or 8MiB a request); with --seq, line i
        /// gets seq N+i. Prints one answer per request.
        #[arg(long)]
        frames: bool,
    },
    /// Print batches as they arrive, failing over between nodes and retrying without end.
    Subscribe {
        #[command(flatten)]
        at: ClientArgs,
        /// Stream name.
        #[arg(value_parser = stream_name)]
        stream: String,
        /// Start after this seq (0 or -1: the start; overrides the cursor file).
        #[arg(short, long, allow_hyphen_values = true, value_parser = after)]
        after: Option<u64>,
        /// Resume from, and save the cursor to, this file after each batch is printed.
        #[arg(short, long)]
        cursor_file: Option<PathBuf>,
        /// Give up (exit 3 or 6) after this long without a connection to any node, e.g. 5m;
        /// without it, retry until stopped.
        #[arg(long, value_name = "DURATION", value_parser = units::parse_duration)]
        max_outage: Option<Duration>,
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
    /// Save a backup of the whole cluster state (every stream, its retained batches and seqs)
    /// from the leader to FILE, checked before it is kept.
    Backup {
        #[command(flatten)]
        at: ClientArgs,
        /// The file to write (written beside it first, renamed once checked).
        file: PathBuf,
    },
    /// Lay out a fresh data directory for one node of a new cluster from a backup file; run it
    /// once per node with the same --peers, then start each node with `runnev serve`.
    Restore {
        /// The backup file (`runnev backup`).
        #[arg(long)]
        from: PathBuf,
        /// The data directory to create; it must not exist or be empty.
        #[arg(long)]
        data_dir: PathBuf,
        /// This node's id in the new cluster.
        #[arg(long, value_parser = node_id)]
        id: u64,
        /// The new cluster's members: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT (as `serve --peers`).
        #[arg(long)]
        peers: String,
    },
    /// Exit 0 if URL answers 2xx within the timeout, else 1 (container health checks).
    Probe {
        /// The URL, e.g. http://127.0.0.1:7001/readyz.
        #[arg(value_parser = probe_url)]
        url: String,
        /// Timeout, in ms.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// The cluster CA's certificate: probe an https:// URL, verifying the node with it
        #[arg(long, value_name = "FILE", env = "RUNNEV_CA_FILE")]
        ca_file: Option<PathBuf>,
    },
    /// Show each node's view of the cluster; exit 3 when no node answers.
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

/// The security flags of `runnev serve`.
#[derive(clap::Args)]
struct ServeSecurity {
    /// The cluster CA's certificate (PEM): peers and clients are verified against it. With
    /// --tls-cert and --tls-key, the node serves TLS only, and a Raft RPC needs a node
    /// certificate naming the node it claims to come from.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM), from `runnev cert create-node`.
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_cert"])]
    tls_key: Option<PathBuf>,
    /// Serve a non-loopback address without TLS: anyone who reaches the port can send Raft
    /// RPCs. Logged as a warning at every start.
    #[arg(long)]
    insecure: bool,
    /// Require a token on every request but /healthz, /readyz, the status page / and
    /// /v1/openapi.json, which hold no data (see `runnev auth`); needs
    /// the TLS flags (the nodes call each other with their certificates).
    #[arg(long, requires = "tls_ca")]
    auth: bool,
    /// A file holding the cluster's first admin token (grant admin:*), made at bootstrap by
    /// the first leader; created (mode 0600) with a new token when missing. Give every node the
    /// same file.
    #[arg(long, value_name = "FILE", requires = "auth")]
    admin_token_file: Option<PathBuf>,
}

/// `runnev cert` subcommands. Files are written under --dir and never overwritten; keys are
/// mode 0600.
#[derive(Subcommand)]
enum CertCmd {
    /// Make a new cluster CA: DIR/ca.pem (give it to every node and client) and DIR/ca.key
    /// (keep it offline).
    #[command(name = "create-ca")]
    Ca {
        /// Where to write.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
    /// Make node N's certificate and key (DIR/node-N.pem, DIR/node-N.key), signed by DIR/ca.*.
    #[command(name = "create-node")]
    Node {
        /// Where the CA is and the files go.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The node's id, as in its --id.
        #[arg(long, value_parser = node_id)]
        id: u64,
        /// A DNS name or IP address the node is reached at (repeat for several).
        #[arg(long = "host", value_name = "HOST", required = true)]
        hosts: Vec<String>,
    },
    /// Make the cluster's first admin token: DIR/admin.token (mode 0600), for every node's
    /// --admin-token-file; the first leader makes it the admin token (grant admin:*).
    #[command(name = "create-admin-token")]
    AdminToken {
        /// Where to write.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
    /// Make a client certificate and key (DIR/client-NAME.pem, DIR/client-NAME.key).
    #[command(name = "create-client")]
    Client {
        /// Where the CA is and the files go.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The client's name: 1-64 of A-Z a-z 0-9 . -
        #[arg(long, value_parser = client_name)]
        name: String,
    },
}

/// `runnev auth` subcommands.
#[derive(Subcommand)]
enum AuthCmd {
    /// Client tokens.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
}

/// `runnev auth token` subcommands.
#[derive(Subcommand)]
enum TokenCmd {
    /// Create a token and print it (the only time its secret is shown).
    Create {
        /// Its name: 1-64 of A-Z a-z 0-9 . -
        #[arg(value_parser = token_name)]
        name: String,
        /// PERMISSION:PATTERN, e.g. publish:orders.* or read:* (repeat for several);
        /// permissions: read, publish, admin.
        #[arg(long = "grant", value_name = "GRANT", required = true)]
        grants: Vec<runnev::auth::Grant>,
    },
    /// List tokens: names and grants, never secrets.
    #[command(visible_alias = "ls")]
    List,
    /// Delete a token: it stops working on every node once applied there.
    #[command(visible_alias = "rm")]
    Delete {
        /// Its name.
        name: String,
    },
}

/// Whether `listen` (HOST:PORT) is on a loopback address only.
async fn is_loopback(listen: &str) -> bool {
    match tokio::net::lookup_host(listen).await {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Reads the admin token file, or creates it (mode 0600, atomically: nodes sharing a directory
/// may race) with a new token.
fn admin_token(path: &std::path::Path) -> Result<runnev::auth::Token> {
    if !path.exists() {
        let token = runnev::auth::Token::generate(runnev::auth::ADMIN_TOKEN_NAME)?;
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        runnev::tls::write_private(&tmp, &format!("{}\n", token.expose()))?;
        // A hard link fails if another process made the file first: then theirs is the one.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => tracing::info!(file = %path.display(), "wrote a new admin token"),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("writing {}", path.display())),
        }
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    runnev::auth::Token::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The admin token of a missing `--admin-token-file` at `path`: a new one written there if this
/// node's state (`store`) has no bootstrap admin token yet; `None`, with a warning and no file
/// written, if it has one (a restored backup's, or a cluster bootstrapped before the file was
/// lost): a new token would never be the cluster's, since only a cluster's first leader makes
/// its admin token (docs/security.md), so the file would only mislead.
fn admin_token_for(store: &runnev::storage::Store, path: &std::path::Path) -> Result<Option<runnev::auth::Token>> {
    let (_, bootstrapped) = store.tokens().context("reading the state's tokens")?;
    if bootstrapped {
        tracing::warn!(
            file = %path.display(),
            "--admin-token-file does not exist and this node's state already has its cluster's admin token \
             (made at the cluster's bootstrap, or restored from a backup): no new token written, since it \
             would never be the cluster's; use the cluster's own token file (after a restore, the old cluster's)"
        );
        return Ok(None);
    }
    admin_token(path).map(Some)
}

/// Warns when a node runs `--auth` without `--admin-token-file` and its state has no bootstrap
/// admin token: it will propose none if it leads, so unless a node that has the file leads
/// first, tokens can only be made over a node certificate (docs/security.md).
fn warn_without_admin_token(store: &runnev::storage::Store) -> Result<()> {
    let (_, bootstrapped) = store.tokens().context("reading the state's tokens")?;
    if !bootstrapped {
        tracing::warn!(
            "--auth without --admin-token-file, and this cluster has no admin token yet: this node makes none if \
             it leads. Give every node the same --admin-token-file (made when missing), or make the first token \
             over a node's certificate (docs/security.md, \"The first admin token\")"
        );
    }
    Ok(())
}

fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').with_context(|| format!("peer {part:?} is not ID=HOST:PORT"))?;
        let id = node_id(id).map_err(|e| anyhow::anyhow!("peer {part:?}: {e}"))?;
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

/// The process's tokio runtime: multi-threaded, with tokio's worker count (`TOKIO_WORKER_THREADS`,
/// else one per CPU) but at least [`runnev::limits::RUNTIME_WORKERS_MIN`] unless the variable says
/// otherwise.
///
/// Errors: the runtime could not start its threads.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(workers) = worker_threads(std::env::var_os("TOKIO_WORKER_THREADS").is_some(), cpus) {
        builder.worker_threads(workers);
    }
    builder.build()
}

/// The worker threads to ask tokio for on a host with `cpus` CPUs: `None` (tokio decides) when
/// `TOKIO_WORKER_THREADS` is set (`env_set`), else `cpus`, at least
/// [`runnev::limits::RUNTIME_WORKERS_MIN`].
fn worker_threads(env_set: bool, cpus: usize) -> Option<usize> {
    (!env_set).then_some(cpus.max(runnev::limits::RUNTIME_WORKERS_MIN))
}

fn main() -> std::process::ExitCode {
    // Usage errors exit 2 (clap's own status, Exit::Usage), help and version 0.
    let args = match command().try_get_matches().and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m)) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let runtime = match runtime() {
        Ok(r) => r,
        Err(e) => {
            cli::note(format_args!("runnev: starting the runtime: {e}"));
            return std::process::ExitCode::from(Exit::Local as u8);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::from(Exit::Success as u8),
        Err(e) => {
            let exit = cli::exit_of(&e);
            cli::note(format_args!("runnev: {}", cli::message(&e, exit)));
            std::process::ExitCode::from(exit as u8)
        }
    }
}

/// The client flags of a command: after it, else before it, else `RUNNEV_NODES`, else the
/// default nodes; the output as asked, else text on a terminal and JSON otherwise.
fn resolve(top: &TopClientArgs, at: &ClientArgs) -> At {
    let nodes = at
        .nodes
        .clone()
        .or_else(|| top.nodes.clone())
        .or_else(|| std::env::var("RUNNEV_NODES").ok().filter(|v| !v.trim().is_empty()))
        .unwrap_or_else(|| runnev::client::DEFAULT_NODES.to_string());
    let output = at.output.or(top.output).unwrap_or_else(Output::detect);
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let token = at.token.clone().or_else(|| top.token.clone()).or_else(|| env("RUNNEV_TOKEN"));
    let ca_file =
        at.ca_file.clone().or_else(|| top.ca_file.clone()).or_else(|| env("RUNNEV_CA_FILE").map(PathBuf::from));
    At { nodes, output, token, ca_file }
}

/// `runnev cert …`: writes the files and says where they are.
fn cert(cmd: CertCmd) -> Result<()> {
    use runnev::tls::{create_ca, issue, write_private, write_public, Subject};
    match cmd {
        CertCmd::Ca { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let ca = create_ca("runnev cluster CA")?;
            write_public(&dir.join("ca.pem"), &ca.cert_pem)?;
            write_private(&dir.join("ca.key"), &ca.key_pem)?;
            println!("wrote {0}/ca.pem and {0}/ca.key (keep the key offline)", dir.display());
        }
        CertCmd::Node { dir, id, hosts } => {
            let issued = issue(&cluster_ca(&dir)?, &Subject::Node(id), &hosts)?;
            write_public(&dir.join(format!("node-{id}.pem")), &issued.cert_pem)?;
            write_private(&dir.join(format!("node-{id}.key")), &issued.key_pem)?;
            println!("wrote {0}/node-{id}.pem and {0}/node-{id}.key", dir.display());
        }
        CertCmd::AdminToken { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join("admin.token");
            if path.exists() {
                bail!("{} exists: it is never overwritten (delete it first to make a new one)", path.display());
            }
            admin_token(&path)?;
            println!("wrote {} (keep it secret: it holds the admin token)", path.display());
        }
        CertCmd::Client { dir, name } => {
            let issued = issue(&cluster_ca(&dir)?, &Subject::Client(name.clone()), &[])?;
            write_public(&dir.join(format!("client-{name}.pem")), &issued.cert_pem)?;
            write_private(&dir.join(format!("client-{name}.key")), &issued.key_pem)?;
            println!("wrote {0}/client-{name}.pem and {0}/client-{name}.key", dir.display());
        }
    }
    Ok(())
}

async fn run(args: Cli) -> Result<()> {
    let top = args.at;
    let client_command = matches!(
        args.command,
        Cmd::Publish { .. }
            | Cmd::Subscribe { .. }
            | Cmd::Streams { .. }
            | Cmd::Cluster { .. }
            | Cmd::Status { .. }
            | Cmd::Auth { .. }
            | Cmd::Backup { .. }
    );
    if client_command {
        runnev::logging::init_with(args.log_format, "warn");
    } else {
        runnev::logging::init(args.log_format);
        if top.nodes.is_some() || top.output.is_some() || top.token.is_some() || top.ca_file.is_some() {
            return Err(cli::usage(
                "--nodes, --output, --token and --ca-file before the command belong to the client commands \
                 (publish, subscribe, streams, status, cluster, auth); give this command's own flags after it",
            ));
        }
    }
    match args.command {
        Cmd::Serve {
            id,
            data_dir,
            listen,
            peers,
            max_batch_bytes,
            max_append_bytes,
            auto_create_streams,
            snapshot_logs,
            snapshot_keep_logs,
            snapshot_log_bytes,
            max_clock_offset_ms,
            min_free_disk_bytes,
            max_connections,
            max_subscribers,
            max_queued_proposals,
            header_read_timeout,
            body_read_timeout,
            security,
        } => {
            let peers = parse_peers(&peers).map_err(|e| cli::usage(&format!("--peers: {e:#}")))?;
            let tls = match (&security.tls_ca, &security.tls_cert, &security.tls_key) {
                (Some(ca), Some(cert), Some(key)) => {
                    Some(runnev::tls::TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() })
                }
                _ => None,
            };
            if tls.is_none() {
                if security.insecure {
                    tracing::warn!(
                        %listen,
                        "running with --insecure: no peer TLS; anyone who reaches this port can send Raft RPCs and call the API"
                    );
                } else if !is_loopback(&listen).await {
                    return Err(cli::usage(&format!(
                        "--listen {listen} is not a loopback address: serve it with peer TLS (--tls-ca, --tls-cert, \
                         --tls-key; `runnev cert` makes them), or pass --insecure to run it without"
                    )));
                }
            }
            // A missing certificate or key is named before anything else is tried (a container
            // started without its credentials mounted says which file it lacks).
            for path in tls.iter().flat_map(|t| [&t.ca, &t.cert, &t.key]) {
                std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
            }
            // Certificates that do not fit this node are a configuration mistake, refused now
            // rather than by every peer later.
            if let Some(files) = &tls {
                runnev::tls::check_node_files(files, id).map_err(|e| match e {
                    runnev::tls::TlsError::Mismatch { .. } => cli::usage(&format!("--tls-cert: {e}")),
                    other => other.into(),
                })?;
            }
            // An existing file is read now (a bad one is refused before anything starts); a
            // missing one is made once the state is open, and only for a cluster that has no
            // admin token yet ([`admin_token_for`]).
            let admin_token_file = security.admin_token_file.clone();
            let mut admin_token = match &admin_token_file {
                Some(path) if path.exists() => Some(admin_token(path)?),
                _ => None,
            };
            runnev::logging::set_node(id);
            // Before the storage opens: its payload segments size their open handles from it.
            match runnev::open_files::raise_soft_to_hard() {
                Ok(r) if r.to > r.from => {
                    tracing::info!(from = r.from, to = r.to, "raised the soft limit on open files to the hard limit")
                }
                Ok(r) => tracing::debug!(limit = r.to, "the soft limit on open files is the hard limit"),
                Err(e) => tracing::warn!(error = %e, "could not raise the soft limit on open files"),
            }
            // Latencies and entry sizes as Prometheus histograms (buckets), not summaries, as
            // docs/http-api.md says: a dashboard can then take quantiles over all nodes
            // (`histogram_quantile` of summed buckets).
            let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
                    runnev::limits::LATENCY_BUCKETS_SECONDS,
                )
                .context("setting the latency buckets")?
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full("runnev_proposal_commands".into()),
                    runnev::limits::PROPOSAL_COMMANDS_BUCKETS,
                )
                .context("setting the proposal buckets")?
                .install_recorder()
                .context("installing the metrics recorder")?;
            let tcp = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("binding {listen}"))?;
            let mut env = node::Environment::production(Some(prometheus));
            let node_security = runnev::api::auth::Security { peer_tls: tls.is_some(), auth: security.auth };
            let store = runnev::storage::Store::open(&data_dir).map_err(|e| cli::store_open_error(&data_dir, e))?;
            match admin_token_file.filter(|_| admin_token.is_none()) {
                Some(path) => admin_token = admin_token_for(&store, &path)?,
                None if security.auth && admin_token.is_none() => warn_without_admin_token(&store)?,
                None => {}
            }
            let cfg = NodeConfig {
                id,
                data_dir,
                peers,
                max_batch_bytes,
                max_append_bytes,
                auto_create_streams,
                snapshot_logs,
                snapshot_keep_logs,
                snapshot_log_bytes,
                max_clock_offset_ms,
                min_free_disk_bytes,
                security: node_security,
                admin_token,
                max_connections,
                max_subscribers,
                max_queued_proposals,
                header_read_timeout: header_read_timeout.0,
                body_read_timeout: body_read_timeout.0,
                exit_after_raft_stop: runnev::limits::RAFT_STOPPED_EXIT_AFTER_DEFAULT,
            };
            match tls {
                Some(files) => {
                    let server = runnev::tls::server_config(&files)?;
                    // No ALPN: nodes speak HTTP/1.1 to each other, a connection per RPC in
                    // flight, so a heartbeat never queues behind a snapshot chunk or a large
                    // append on one TCP stream, and one stalled connection stalls one RPC.
                    let client = runnev::tls::client_config(&files.ca, Some((&files.cert, &files.key)))?;
                    env.dialer = std::sync::Arc::new(runnev::tls::TlsDialer::new(env.dialer.clone(), client));
                    let listener = runnev::tls::TlsListener::start(tcp, server)?;
                    tracing::info!(%listen, "serving TLS only; raft rpcs need a node certificate of the cluster's CA");
                    node::run(cfg, store, listener, env, shutdown_signal()).await?;
                }
                None => {
                    // Answers are small: without TCP_NODELAY, Nagle and delayed ACKs add ~40 ms to each.
                    let listener = axum::serve::ListenerExt::tap_io(tcp, |tcp| {
                        if let Err(e) = tcp.set_nodelay(true) {
                            tracing::warn!(error = %e, "TCP_NODELAY");
                        }
                    });
                    node::run(cfg, store, listener, env, shutdown_signal()).await?;
                }
            }
        }
        Cmd::Local { count, dir, base_port, secure, serve_flags } => {
            runnev::local::check_serve_flags(&serve_flags, secure).map_err(|e| cli::usage(&e.to_string()))?;
            // The nodes write their logs as this command was asked to.
            let log_format = match args.log_format {
                runnev::logging::LogFormat::Text => "text",
                runnev::logging::LogFormat::Json => "json",
            };
            runnev::local::run(runnev::local::LocalOptions {
                nodes: count,
                dir,
                base_port,
                serve_args: ["--log-format".to_string(), log_format.into()].into_iter().chain(serve_flags).collect(),
                secure,
            })
            .await?;
        }
        Cmd::Cert { cmd } => cert(cmd)?,
        Cmd::Auth { at, cmd: AuthCmd::Token { cmd } } => {
            let at = resolve(&top, &at);
            let client = at.client()?;
            match cmd {
                TokenCmd::Create { name, grants } => cli::token_create(&client, at.output, &name, grants).await?,
                TokenCmd::List => cli::token_list(&client, at.output).await?,
                TokenCmd::Delete { name } => cli::token_delete(&client, at.output, &name).await?,
            }
        }
        Cmd::Publish { at, stream, seq, data, file, frames } => {
            let at = resolve(&top, &at);
            cli::publish(&at.client()?, at.output, &stream, seq, frames, data, file).await?
        }
        Cmd::Subscribe { at, stream, after, cursor_file, max_outage } => {
            let at = resolve(&top, &at);
            cli::subscribe(&at.client()?, at.output, &stream, after, cursor_file, max_outage).await?
        }
        Cmd::Streams { at, cmd } => {
            let at = resolve(&top, &at);
            cli::streams(&at.client()?, at.output, cmd).await?
        }
        Cmd::Status { at } => {
            let at = resolve(&top, &at);
            cli::status(&at.client()?, at.output).await?
        }
        Cmd::Probe { url, timeout_ms, ca_file } => {
            cli::probe(&url, Duration::from_millis(timeout_ms), ca_file.as_deref()).await?
        }
        Cmd::Cluster { at, cmd } => {
            let at = resolve(&top, &at);
            cli::cluster(&at.client()?, at.output, cmd).await?
        }
        Cmd::Backup { at, file } => {
            let at = resolve(&top, &at);
            cli::backup(&at.client()?, at.output, &file).await?
        }
        Cmd::Restore { from, data_dir, id, peers } => {
            let peers = parse_peers(&peers).map_err(|e| cli::usage(&format!("--peers: {e:#}")))?;
            cli::restore(&from, &data_dir, id, &peers).await?
        }
        Cmd::Bench { args } => return Err(cli::bench(args)),
        Cmd::OutboxRelay(args) => runnev::outbox::cli::relay(args, shutdown_signal()).await?,
        Cmd::SinkPostgres(args) => runnev::outbox::cli::sink(args, shutdown_signal()).await?,
    }
    Ok(())
}

/// The command-line reference: every command's `--help`, as Markdown. `docs/cli-reference.md`
/// is this text (checked by the test below; `RUNNEV_WRITE_REFERENCE=1 cargo test -p runnev --bin
/// runnev reference` rewrites it).
#[cfg(test)]
fn reference() -> String {
    fn walk(cmd: &mut clap::Command, path: &str, out: &mut String) {
        let long_help = cmd.render_long_help().to_string();
        out.push_str(&format!("\n## `{path}`\n\n```text\n{}\n```\n", long_help.trim_end()));
        let names: Vec<String> =
            cmd.get_subcommands().filter(|s| s.get_name() != "help").map(|s| s.get_name().to_string()).collect();
        for name in names {
            if let Some(sub) = cmd.find_subcommand_mut(&name) {
                walk(sub, &format!("{path} {name}"), out);
            }
        }
    }
    let mut cmd = command();
    cmd.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from `runnev`'s own definitions: each section is that command's `--help`. \
         A test fails when this file and the binary disagree. How the commands behave, their \
         output and their exit statuses are described in [cli.md](cli.md).\n",
    );
    walk(&mut cmd, "runnev", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node runs at least two workers (one may be fsyncing a log append), as many as its CPUs
    /// beyond that, and exactly what TOKIO_WORKER_THREADS says when it is set.
    #[test]
    fn a_node_runs_at_least_two_workers_unless_told_otherwise() {
        assert_eq!(worker_threads(false, 1), Some(2));
        assert_eq!(worker_threads(false, 2), Some(2));
        assert_eq!(worker_threads(false, 16), Some(16));
        assert_eq!(worker_threads(true, 1), None);
    }

    #[test]
    fn probe_takes_whole_urls_only() {
        assert_eq!(probe_url("http://127.0.0.1:7001/readyz"), Ok("http://127.0.0.1:7001/readyz".into()));
        assert_eq!(probe_url(" https://n1:7001/healthz"), Ok("https://n1:7001/healthz".into()));
        let e = probe_url("127.0.0.1:8101").unwrap_err();
        assert!(e.contains("e.g. http://127.0.0.1:8101/readyz"), "{e}");
        // With a path, the path is kept (it was doubled: `…/readyz/readyz`).
        let e = probe_url("127.0.0.1:8101/healthz").unwrap_err();
        assert!(e.contains("e.g. http://127.0.0.1:8101/healthz (https://"), "{e}");
    }

    #[test]
    fn the_definitions_are_consistent() {
        command().debug_assert();
    }

    /// `docs/cli-reference.md` is what the binary says about itself.
    #[test]
    fn reference_matches_the_committed_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli-reference.md");
        let generated = reference();
        if std::env::var_os("RUNNEV_WRITE_REFERENCE").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} differs from `runnev --help` of every command; regenerate it with \
             `RUNNEV_WRITE_REFERENCE=1 cargo test -p runnev --bin runnev reference`",
            path.display()
        );
    }

    /// Every exit status is listed by `--help`, by its number.
    #[test]
    fn help_lists_every_exit_status() {
        let help = command().render_long_help().to_string();
        for (n, exit) in Exit::ALL.iter().enumerate() {
            assert_eq!(*exit as usize, n);
            assert!(help.contains(&format!("  {n}  {}", exit.summary())), "{help}");
        }
    }

    #[test]
    fn node_ids_start_at_one() {
        assert!(node_id("0").unwrap_err().contains("start at 1"));
        assert_eq!(node_id("4"), Ok(4));
        assert!(parse_peers("0=h:1,1=h:2").is_err());
        assert_eq!(after("-1"), Ok(0));
        assert!(after("-5").unwrap_err().contains("non-negative"));
    }
}
