//! The `runnev outbox-relay` and `runnev sink-postgres` commands: flags and wiring.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::relay::{Relay, RelayOptions};
use super::sink::{BulkApply, Sink, SinkOptions, SqlApply};
use super::{Failpoint, DEFAULT_TABLE};
use crate::client::{Client, DEFAULT_NODES};

/// Flags of `runnev outbox-relay`.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/DB (its value is never shown by --help).
    #[arg(long, env = "RUNNEV_POSTGRES_URL", hide_env_values = true)]
    pub postgres: String,
    /// Runnev nodes: HOST:PORT or http://HOST:PORT, comma-separated; the client fails over between them.
    #[arg(long = "nodes", env = "RUNNEV_NODES", hide_env_values = true, default_value = DEFAULT_NODES)]
    pub nodes: String,
    /// The cluster CA's certificate: speak TLS to the nodes and verify them with it.
    #[arg(long = "ca-file", env = "RUNNEV_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The token to send (nodes run with --auth); needs publish (relay) or read (sink) on the streams.
    #[arg(long = "token", env = "RUNNEV_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The outbox table; its progress table is TABLE_progress. One active relay per table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    pub table: String,
    /// Most rows assigned and published per cycle (1 to 100000).
    #[arg(long, default_value_t = 5000, value_parser = count_in(1, 100_000))]
    pub batch_size: usize,
    /// Most streams published at once (one request each in flight).
    #[arg(long, default_value_t = 16, value_parser = count_in(1, usize::MAX))]
    pub concurrency: usize,
    /// Largest publish request (a stream's rows as frames, frame headers included): at most
    /// the cluster's --max-append-bytes. Bytes, or with a unit (8MiB). Larger sets are split.
    #[arg(long, value_name = "SIZE", default_value = "8MiB", value_parser = request_size)]
    pub max_append_bytes: u64,
    /// Keep relayed rows (acknowledged, progress recorded) this long after they were written,
    /// then remove them (e.g. 0s, 10m, 7d).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = crate::units::parse_duration)]
    pub keep_relayed: Duration,
    /// Most relayed rows of one stream removed by one DELETE (the streams' DELETEs of a round share one short transaction).
    #[arg(long, default_value_t = 5000, value_parser = count_in(1, usize::MAX))]
    pub delete_batch: usize,
    /// Poll for rows this often (ms) even without a NOTIFY.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// A standby tries to take over this often (ms).
    #[arg(long, default_value_t = 1000)]
    pub standby_poll_ms: u64,
    /// Create the outbox tables (sql/outbox.sql) if missing.
    #[arg(long)]
    pub init_schema: bool,
    /// Create a stream the first time a row names it.
    #[arg(long)]
    pub create_streams: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// Flags of `runnev sink-postgres`.
#[derive(clap::Args, Debug, Clone)]
pub struct SinkArgs {
    /// PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/DB (its value is never shown by --help).
    #[arg(long, env = "RUNNEV_POSTGRES_URL", hide_env_values = true)]
    pub postgres: String,
    /// Runnev nodes: HOST:PORT or http://HOST:PORT, comma-separated; the client fails over between them.
    #[arg(long = "nodes", env = "RUNNEV_NODES", hide_env_values = true, default_value = DEFAULT_NODES)]
    pub nodes: String,
    /// The cluster CA's certificate: speak TLS to the nodes and verify them with it.
    #[arg(long = "ca-file", env = "RUNNEV_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The token to send (nodes run with --auth); needs publish (relay) or read (sink) on the streams.
    #[arg(long = "token", env = "RUNNEV_TOKEN", value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The stream to consume.
    #[arg(long)]
    pub stream: String,
    /// This consumer's name; its cursor is the row (consumer, stream) of runnev_sink_cursor.
    #[arg(long)]
    pub consumer: String,
    /// Statement run for each batch: $1 stream, $2 seq, $3 ts (ms), $4 payload (bytea), $5 consumer.
    /// Without it, each transaction's batches go into runnev_sink_batches in one statement.
    #[arg(long)]
    pub apply_sql: Option<String>,
    /// Most batches applied in one transaction (at least 1).
    #[arg(long, default_value_t = 5000, value_parser = count_in(1, usize::MAX))]
    pub batch_size: usize,
    /// Create the sink tables (sql/sink.sql) if missing.
    #[arg(long)]
    pub init_schema: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// A clap parser of a count from `min` to `max`: a flag out of range is a usage error that
/// names the flag (the library's own check, [`super::relay::Relay::new`], did not).
fn count_in(min: usize, max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let n: usize = s.trim().parse().map_err(|_| format!("{s:?} is not a whole number"))?;
        if (min..=max).contains(&n) {
            Ok(n)
        } else if max == usize::MAX {
            Err(format!("{n} is below {min}"))
        } else {
            Err(format!("{n} is not from {min} to {max}"))
        }
    }
}

/// `--max-append-bytes`: a size ([`crate::units::parse_bytes`]) that holds a frame header (4
/// bytes) and is at most [`crate::limits::APPEND_BYTES_MAX`].
fn request_size(s: &str) -> Result<u64, String> {
    let n = crate::units::parse_bytes(s)?;
    let max = crate::limits::APPEND_BYTES_MAX as u64;
    if (4..=max).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} bytes is not from 4 bytes to {max} bytes ({})", crate::units::format_bytes(max)))
    }
}

fn failpoint() -> Result<Option<Arc<Failpoint>>> {
    Ok(Failpoint::from_env()?.map(Arc::new))
}

async fn metrics(addr: Option<SocketAddr>) -> Result<()> {
    if let Some(a) = addr {
        let local = super::serve_metrics(a).await.with_context(|| format!("serving metrics on {a}"))?;
        tracing::info!(%local, "metrics at /metrics");
    }
    Ok(())
}

/// Runs `runnev outbox-relay` until `shutdown`.
///
/// Errors: bad flags (table name, URL, node list) or the metrics address cannot be bound;
/// database and cluster failures are retried, not returned.
pub async fn relay(args: RelayArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    metrics(args.metrics_listen).await?;
    let client = Client::from_flags(&args.nodes, args.ca_file.as_deref(), args.token.as_deref())?;
    let mut o = RelayOptions::new(args.postgres, args.table);
    o.batch_size = args.batch_size;
    o.concurrency = args.concurrency;
    o.max_append_bytes = usize::try_from(args.max_append_bytes).unwrap_or(usize::MAX);
    o.keep_relayed = args.keep_relayed;
    o.delete_batch = args.delete_batch;
    o.poll = Duration::from_millis(args.poll_ms.max(1));
    o.standby_poll = Duration::from_millis(args.standby_poll_ms.max(1));
    o.init_schema = args.init_schema;
    o.create_streams = args.create_streams;
    o.failpoint = failpoint()?;
    Relay::new(client, o)?.run(shutdown).await?;
    Ok(())
}

/// Runs `runnev sink-postgres` until `shutdown`.
///
/// Errors: as [`relay`].
pub async fn sink(args: SinkArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    metrics(args.metrics_listen).await?;
    let client = Client::from_flags(&args.nodes, args.ca_file.as_deref(), args.token.as_deref())?;
    let mut o = SinkOptions::new(args.postgres, args.consumer.clone(), args.stream);
    o.batch_max = args.batch_size;
    o.init_schema = args.init_schema;
    o.failpoint = failpoint()?;
    match args.apply_sql {
        Some(sql) => Sink::new(client, o, SqlApply::new(sql, args.consumer))?.run(shutdown).await?,
        None => Sink::new(client, o, BulkApply::new(args.consumer))?.run(shutdown).await?,
    }
    Ok(())
}
