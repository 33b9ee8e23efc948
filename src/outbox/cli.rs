//! The `runnev outbox-relay` and `runnev sink-postgres` commands: flags and wiring.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::relay::{Relay, RelayOptions};
use super::sink::{Sink, SinkOptions, SqlApply, DEFAULT_APPLY_SQL};
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
    pub ca_file: Option<std::path::PathBuf>,
    /// The token to send (nodes run with --auth); needs publish (relay) or read (sink) grants.
    #[arg(long, env = "RUNNEV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The outbox table; its progress table is TABLE_progress. One active relay per table.
    #[arg(long, default_value = DEFAULT_TABLE)]
    pub table: String,
    /// Most rows assigned and published per cycle.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
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
    pub ca_file: Option<std::path::PathBuf>,
    /// The token to send (nodes run with --auth); needs publish (relay) or read (sink) grants.
    #[arg(long, env = "RUNNEV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The stream to consume.
    #[arg(long)]
    pub stream: String,
    /// This consumer's name; its cursor is the row (consumer, stream) of runnev_sink_cursor.
    #[arg(long)]
    pub consumer: String,
    /// Statement run for each batch: $1 stream, $2 seq, $3 ts (ms), $4 payload (bytea), $5 consumer.
    #[arg(long, default_value = DEFAULT_APPLY_SQL)]
    pub apply_sql: String,
    /// Most batches applied in one transaction.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Create the sink tables (sql/sink.sql) if missing.
    #[arg(long)]
    pub init_schema: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

/// The client over `nodes`, with TLS verified by `ca_file` and `token` sent when given.
fn client(nodes: &str, ca_file: Option<&std::path::Path>, token: Option<&str>) -> Result<Client> {
    let token = token
        .filter(|t| !t.trim().is_empty())
        .map(|t| crate::auth::Token::parse(t.trim()))
        .transpose()
        .map_err(|e| anyhow::anyhow!("--token (or RUNNEV_TOKEN): {e}"))?;
    Ok(Client::secure(&Client::parse_nodes(nodes), ca_file, token)?)
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
    let client = client(&args.nodes, args.ca_file.as_deref(), args.token.as_deref())?;
    let mut o = RelayOptions::new(args.postgres, args.table);
    o.batch_size = args.batch_size;
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
    let client = client(&args.nodes, args.ca_file.as_deref(), args.token.as_deref())?;
    let mut o = SinkOptions::new(args.postgres, args.consumer.clone(), args.stream);
    o.batch_max = args.batch_size;
    o.init_schema = args.init_schema;
    o.failpoint = failpoint()?;
    Sink::new(client, o, SqlApply::new(args.apply_sql, args.consumer))?.run(shutdown).await?;
    Ok(())
}
