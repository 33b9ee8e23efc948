//! The transactional outbox relay and the exactly-once PostgreSQL sink.
//!
//! An application writes its business rows and an outbox row (`stream`, `payload`) in one
//! PostgreSQL transaction ([`OUTBOX_SQL`]). The [`relay`] moves committed outbox rows into
//! Runnev streams, publishing each with a seq recorded in the row, so a retry after any crash is
//! answered `duplicate: true` (SPEC §2.3) and every committed row is in its stream exactly once.
//! The [`sink`] does the reverse: it applies each batch of a stream to PostgreSQL and stores the
//! consumer's cursor in the same transaction ([`SINK_SQL`]), so effects happen exactly once.
//!
//! Owns: the outbox and cursor schemas, the relay's seq assignment and progress, the sink's
//! dedupe. Must never: publish a row under two seqs, publish a seq below its stream's last seq,
//! lose a committed row, apply a batch twice, or step over a gap without recording it.
//!
//! Failures (unreachable database, wrong credentials, missing table, cluster unavailable) are
//! logged with a message that says what to fix, counted in `runnev_outbox_errors_total`, and
//! retried with exponential backoff; the position lives in PostgreSQL, so nothing is lost.

pub mod cli;
pub mod relay;
pub mod sink;

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::error::SqlState;

use crate::client::ClientError;

/// The outbox schema for the table `runnev_outbox` (tables, indexes, triggers). Idempotent.
/// [`outbox_schema`] gives it for another table name.
pub const OUTBOX_SQL: &str = include_str!("../../sql/outbox.sql");

/// The sink schema: `runnev_sink_cursor`, `runnev_sink_gaps`, `runnev_sink_batches`. Idempotent.
pub const SINK_SQL: &str = include_str!("../../sql/sink.sql");

/// The default outbox table name.
pub const DEFAULT_TABLE: &str = "runnev_outbox";

/// An outbox or sink error. Every variant's message says what went wrong and, where it can,
/// what to fix; the relay and the sink log it and retry (see [`is_connection_problem`]).
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// PostgreSQL could not be reached (refused, timed out, DNS) or the connection broke.
    #[error("cannot reach PostgreSQL at {target}: {}", postgres_text(source))]
    Unreachable {
        /// `host:port/dbname` (never the password).
        target: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// PostgreSQL refused the user, password or database of the URL.
    #[error(
        "PostgreSQL at {target} refused the connection: {message} (check the user, password and database in the URL)"
    )]
    Auth {
        /// `user@host:port/dbname`.
        target: String,
        /// The server's message.
        message: String,
    },
    /// A table does not exist: one the relay or sink needs, or one a sink's `--apply-sql` names.
    #[error(
        "PostgreSQL: {message}: create the relay's or sink's own tables with --init-schema, or apply {file} with \
         psql; a table your --apply-sql names is yours to create"
    )]
    MissingTable {
        /// The server's message (names the table).
        message: String,
        /// The repository file with the DDL.
        file: &'static str,
    },
    /// Any other PostgreSQL error (a statement failed, a constraint, a serialization failure).
    #[error("PostgreSQL: {}", postgres_text(.0))]
    Postgres(#[source] tokio_postgres::Error),
    /// The Runnev cluster refused or did not answer.
    #[error("Runnev cluster: {0}")]
    Cluster(#[from] ClientError),
    /// A stream refused a row for a reason retrying cannot fix by itself (e.g. `413
    /// payload_too_large`); the relay keeps retrying that stream, and relaying the others. The
    /// message says how to unblock it ([`stuck_fix`]).
    #[error("stream {stream}, seq {seq}: {source}; the row stays unpublished until {}", stuck_fix(.source))]
    Stuck {
        /// The stream.
        stream: String,
        /// The row's seq.
        seq: u64,
        /// The cluster's answer.
        source: ClientError,
    },
    /// Bad options (a table name that is not an identifier, a malformed URL).
    #[error("configuration: {0}")]
    Config(String),
}

/// `e` in the server's own words where it has them: message, SQLSTATE code, detail and hint
/// (the driver's own text is only "db error"; found by a fresh user's trial, whose sink with
/// `--apply-sql "SELEC 1"` logged nothing else); otherwise the driver's text and its cause
/// ("error connecting to server: Connection refused").
pub fn postgres_text(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        };
    };
    let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str(&format!("; {detail}"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!("; hint: {hint}"));
    }
    text
}

impl OutboxError {
    /// Classifies a driver error: connection problems, authentication, missing tables.
    pub fn from_pg(target: &str, e: tokio_postgres::Error, file: &'static str) -> OutboxError {
        if let Some(db) = e.as_db_error() {
            let code = db.code();
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *code == SqlState::INVALID_CATALOG_NAME
            {
                return OutboxError::Auth { target: target.to_string(), message: db.message().to_string() };
            }
            if *code == SqlState::UNDEFINED_TABLE {
                return OutboxError::MissingTable { message: db.message().to_string(), file };
            }
            if *code == SqlState::ADMIN_SHUTDOWN || *code == SqlState::CRASH_SHUTDOWN {
                return OutboxError::Unreachable { target: target.to_string(), source: e };
            }
            return OutboxError::Postgres(e);
        }
        if e.is_closed() || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>()) {
            return OutboxError::Unreachable { target: target.to_string(), source: e };
        }
        // Timeouts and other connection-level failures carry no database error.
        OutboxError::Unreachable { target: target.to_string(), source: e }
    }

    /// A short label for the `kind` of `runnev_outbox_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            OutboxError::Unreachable { .. } => "unreachable",
            OutboxError::Auth { .. } => "auth",
            OutboxError::MissingTable { .. } => "missing_table",
            OutboxError::Postgres(_) => "postgres",
            OutboxError::Cluster(_) => "cluster",
            OutboxError::Stuck { .. } => "stuck",
            OutboxError::Config(_) => "config",
        }
    }
}

/// What unblocks a row the cluster refused for good with `source` (the end of
/// [`OutboxError::Stuck`]'s message).
fn stuck_fix(source: &ClientError) -> &'static str {
    match source.code() {
        Some("payload_too_large") => {
            "it fits: raise the nodes' --max-batch-bytes, or delete the row (its stream's later rows then follow)"
        }
        Some("unauthorized" | "forbidden") => {
            "the relay's token may publish to this stream (`runnev auth token create`)"
        }
        _ => "the cause above is fixed, or the row is deleted (its stream's later rows then follow)",
    }
}

/// True when `e` means the PostgreSQL session is gone or unusable, so the caller must reconnect
/// (and, for the relay, give up the singleton lock, which the server released with the session).
pub fn is_connection_problem(e: &OutboxError) -> bool {
    match e {
        OutboxError::Unreachable { .. } | OutboxError::Auth { .. } | OutboxError::MissingTable { .. } => true,
        OutboxError::Postgres(pg) => pg.is_closed(),
        _ => false,
    }
}

/// Checks that `name` is a plain lower-case SQL identifier (`[a-z_][a-z0-9_]*`, at most 40
/// characters), so it can be spliced into DDL and queries safely.
///
/// Errors: [`OutboxError::Config`] naming the rule.
pub fn check_identifier(name: &str) -> Result<(), OutboxError> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(OutboxError::Config(format!(
            "table name {name:?} must match [a-z_][a-z0-9_]* and be at most 40 characters"
        )))
    }
}

/// The outbox schema ([`OUTBOX_SQL`]) for the table `table`: every `runnev_outbox` identifier
/// (the table, `<table>_progress`, its indexes, triggers, functions and NOTIFY channel) renamed.
///
/// Errors: [`OutboxError::Config`] if `table` is not an identifier ([`check_identifier`]).
pub fn outbox_schema(table: &str) -> Result<String, OutboxError> {
    check_identifier(table)?;
    Ok(OUTBOX_SQL.replace(DEFAULT_TABLE, table))
}

/// A parsed PostgreSQL URL plus a printable target without the password.
#[derive(Clone)]
pub struct PgTarget {
    config: tokio_postgres::Config,
    /// `user@host:port/dbname`, for messages.
    pub display: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

impl PgTarget {
    /// Parses a `postgres://user:password@host:port/dbname` URL (or a libpq key=value string).
    /// Sets a 5 s connect timeout and TCP keepalives unless the URL sets them, and
    /// `application_name`. TLS is not supported: `sslmode=require` fails to connect.
    ///
    /// Errors: [`OutboxError::Config`] for a malformed URL (the message omits the password).
    pub fn parse(url: &str, application_name: &str) -> Result<PgTarget, OutboxError> {
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| OutboxError::Config(format!("the PostgreSQL URL is malformed: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        config.keepalives(true).keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name(application_name);
        }
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(s) => s.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let display = format!(
            "{}@{}:{port}/{}",
            config.get_user().unwrap_or("?"),
            if hosts.is_empty() { "localhost".to_string() } else { hosts.join(",") },
            config.get_dbname().unwrap_or("?")
        );
        Ok(PgTarget { config, display })
    }

    /// Connects. The connection task runs in the background and forwards `NOTIFY` payloads
    /// (channel names) to the returned receiver; the receiver closes when the connection ends.
    ///
    /// Errors: [`OutboxError::Unreachable`] or [`OutboxError::Auth`] (classified, see
    /// [`OutboxError::from_pg`]).
    pub async fn connect(&self) -> Result<(tokio_postgres::Client, mpsc::UnboundedReceiver<String>), OutboxError> {
        let (client, mut connection) = self
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| OutboxError::from_pg(&self.display, e, "sql/"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let target = self.display.clone();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                        let _ = tx.send(n.channel().to_string());
                    }
                    Ok(tokio_postgres::AsyncMessage::Notice(n)) => {
                        tracing::debug!(notice = %n.message(), "PostgreSQL notice");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(target = %target, error = %e, "PostgreSQL connection ended");
                        break;
                    }
                }
            }
        });
        Ok((client, rx))
    }
}

pub use crate::client::Backoff;

/// Where a test makes the relay or sink process abort (as `kill -9` would), to prove a crash at
/// that point loses and repeats nothing. Set with `RUNNEV_OUTBOX_FAILPOINT=NAME[:N]` (abort on
/// the N-th time the point is reached, default 1); NAME is one of the variants in kebab case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailpointName {
    /// Relay: seqs were assigned and committed, nothing published yet.
    AfterAssign,
    /// Relay: the batch was published (acknowledged), the progress not yet committed.
    AfterPublish,
    /// Sink: the batches were applied inside the transaction, the commit not yet sent.
    BeforeCommit,
}

/// A failpoint armed to fire on its `nth` hit (see [`FailpointName`]).
#[derive(Debug)]
pub struct Failpoint {
    name: FailpointName,
    nth: u64,
    hits: AtomicU64,
}

impl Failpoint {
    /// Parses `NAME[:N]` (e.g. `after-publish:3`).
    ///
    /// Errors: [`OutboxError::Config`] for an unknown name or a bad N.
    pub fn parse(s: &str) -> Result<Failpoint, OutboxError> {
        let (name, nth) = match s.split_once(':') {
            Some((n, k)) => (n, k.parse::<u64>().map_err(|_| OutboxError::Config(format!("failpoint {s:?}: bad N")))?),
            None => (s, 1),
        };
        let name = match name {
            "after-assign" => FailpointName::AfterAssign,
            "after-publish" => FailpointName::AfterPublish,
            "before-commit" => FailpointName::BeforeCommit,
            _ => return Err(OutboxError::Config(format!("unknown failpoint {name:?}"))),
        };
        Ok(Failpoint { name, nth: nth.max(1), hits: AtomicU64::new(0) })
    }

    /// From `RUNNEV_OUTBOX_FAILPOINT`, if set.
    ///
    /// Errors: as [`Failpoint::parse`].
    pub fn from_env() -> Result<Option<Failpoint>, OutboxError> {
        match std::env::var("RUNNEV_OUTBOX_FAILPOINT") {
            Ok(s) if !s.trim().is_empty() => Failpoint::parse(s.trim()).map(Some),
            _ => Ok(None),
        }
    }

    /// Aborts the process if this is point `at` reached for the `nth` time.
    pub fn hit(&self, at: FailpointName) {
        if at == self.name && self.hits.fetch_add(1, Ordering::SeqCst) + 1 == self.nth {
            eprintln!("runnev: failpoint {at:?} reached: aborting");
            std::process::abort();
        }
    }
}

/// Reaches failpoint `at` if one is armed.
pub(crate) fn failpoint(fp: &Option<std::sync::Arc<Failpoint>>, at: FailpointName) {
    if let Some(f) = fp {
        f.hit(at);
    }
}

/// Installs a Prometheus recorder and serves it at `http://ADDR/metrics` in the background.
///
/// Errors: the recorder is already installed, or `addr` cannot be bound.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let h = handle.clone();
            async move { h.render() }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(local)
}

/// Counts an error in `runnev_outbox_errors_total{component, kind}` and stamps
/// `runnev_outbox_last_error_timestamp_seconds{component}` (seconds since the Unix epoch).
pub(crate) fn count_error(component: &'static str, e: &OutboxError) {
    metrics::counter!("runnev_outbox_errors_total", "component" => component, "kind" => e.kind()).increment(1);
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    metrics::gauge!("runnev_outbox_last_error_timestamp_seconds", "component" => component).set(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection refused says so (it said only "error connecting to server").
    #[tokio::test]
    async fn a_driver_error_keeps_its_cause() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("postgres://u@127.0.0.1:{port}/d?connect_timeout=5");
        let e = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.err().expect("nothing listens there");
        let text = OutboxError::from_pg("u@127.0.0.1/d", e, "sql/outbox.sql").to_string();
        assert!(text.starts_with("cannot reach PostgreSQL at u@127.0.0.1/d: error connecting to server: "), "{text}");
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }

    #[test]
    fn identifiers_and_schema_renaming() {
        assert!(check_identifier("runnev_outbox").is_ok());
        assert!(check_identifier("t_1").is_ok());
        for bad in ["", "1t", "T", "a-b", "a;drop", &"x".repeat(41)] {
            assert!(check_identifier(bad).is_err(), "{bad:?}");
        }
        let sql = outbox_schema("shop_outbox").unwrap();
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS shop_outbox ("));
        assert!(sql.contains("shop_outbox_progress"));
        assert!(sql.contains("pg_notify('shop_outbox'"));
        assert!(!sql.contains("runnev_outbox"));
    }

    #[test]
    fn failpoints_parse() {
        assert_eq!(Failpoint::parse("after-publish:3").unwrap().nth, 3);
        assert_eq!(Failpoint::parse("after-assign").unwrap().name, FailpointName::AfterAssign);
        assert!(Failpoint::parse("nope").is_err());
        assert!(Failpoint::parse("after-publish:x").is_err());
    }

    #[test]
    fn backoff_doubles_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        assert_eq!(b.next_delay(), Duration::from_millis(200));
        assert_eq!(b.next_delay(), Duration::from_millis(350));
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn target_hides_the_password() {
        let t = PgTarget::parse("postgres://u:secret@127.0.0.1:5555/db", "x").unwrap();
        assert_eq!(t.display, "u@127.0.0.1:5555/db");
        assert!(PgTarget::parse("postgres://u@h:notaport/db", "x").is_err());
    }
}
