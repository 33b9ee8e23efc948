//! The PostgreSQL sink: each batch of a stream applied to PostgreSQL exactly once.
//!
//! Owns: the consumer's cursor in `runnev_sink_cursor` and the dedupe. Must never: apply a batch
//! at or below the cursor, commit effects without the cursor (or the cursor without effects),
//! or step over a gap without recording it.
//!
//! Each group of deliveries is one transaction: lock the cursor row (`FOR UPDATE`), skip batches
//! with `seq <= cursor` (redeliveries after a reconnect or a crash), apply the rest with an
//! [`Apply`], record gaps in `runnev_sink_gaps`, move the cursor, commit. A crash before the
//! commit undoes the effects and the cursor together; the subscription resumes from the
//! committed cursor. Two sinks for the same (consumer, stream) serialise on the cursor row and
//! still apply each batch once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio_postgres::types::{ToSql, Type};
use tokio_util::task::AbortOnDropHandle;

use super::{count_error, failpoint, Backoff, Failpoint, FailpointName, OutboxError, PgTarget};
use crate::client::{Batch, Client, ClientError, Delivery, Gap};

const SCHEMA_FILE: &str = "sql/sink.sql";

/// The default statement of [`SqlApply`]: one row per batch in `runnev_sink_batches`.
pub const DEFAULT_APPLY_SQL: &str =
    "INSERT INTO runnev_sink_batches (consumer, stream, seq, ts, payload) VALUES ($5, $1, $2, $3, $4)";

/// Applies batches inside the sink's transaction. Implement it for your own effects; any error
/// rolls the whole transaction back (cursor included) and the sink retries with backoff.
pub trait Apply: Send {
    /// Applies `batches` of `stream` (seq order, each above the cursor) inside `tx`.
    ///
    /// Errors: any driver error; the transaction is rolled back.
    fn apply<'a>(
        &'a mut self,
        tx: &'a tokio_postgres::Transaction<'a>,
        stream: &'a str,
        batches: &'a [Batch],
    ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>>;

    /// The transaction of the last [`Apply::apply`] calls (every call since the previous
    /// `committed`) committed, cursor included: their effects are durable. Called once per
    /// group that applied at least one batch; not called when the transaction failed (those
    /// batches come again). The default does nothing; `runnev bench outbox` stamps its latency
    /// here.
    fn committed(&mut self, _stream: &str) {}
}

/// An [`Apply`] running one SQL statement per batch, with parameters `$1` stream (text), `$2`
/// seq (int8), `$3` ts (int8, ms since the Unix epoch), `$4` payload (bytea), `$5` consumer
/// (text). E.g. `INSERT INTO orders (id, body) SELECT (j->>'id')::int8, j FROM
/// (SELECT convert_from($4, 'UTF8')::jsonb AS j) x`.
#[derive(Debug, Clone)]
pub struct SqlApply {
    sql: String,
    consumer: String,
}

impl SqlApply {
    /// A statement `sql` for consumer `consumer` (passed as `$5`).
    pub fn new(sql: impl Into<String>, consumer: impl Into<String>) -> SqlApply {
        SqlApply { sql: sql.into(), consumer: consumer.into() }
    }
}

impl Apply for SqlApply {
    fn apply<'a>(
        &'a mut self,
        tx: &'a tokio_postgres::Transaction<'a>,
        stream: &'a str,
        batches: &'a [Batch],
    ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>> {
        async move {
            let stmt =
                tx.prepare_typed(&self.sql, &[Type::TEXT, Type::INT8, Type::INT8, Type::BYTEA, Type::TEXT]).await?;
            let consumer = self.consumer.as_str();
            // Pipelined: the statements are sent without waiting for each answer.
            let runs = batches.iter().map(|b| {
                let stmt = &stmt;
                async move {
                    let (seq, ts, data) = (b.seq as i64, b.ts as i64, b.data.as_ref());
                    tx.execute(stmt, &[&stream, &seq, &ts, &data, &consumer]).await
                }
            });
            metrics::counter!("runnev_outbox_sink_statements_total", "stream" => stream.to_string())
                .increment(batches.len() as u64);
            futures::future::try_join_all(runs).await.map(|_| ())
        }
        .boxed()
    }
}

/// The sink's default [`Apply`]: every batch of a group as one row of `runnev_sink_batches`,
/// in ONE statement (`INSERT … SELECT … FROM unnest(seqs, tss, payloads)`), whatever the
/// group's size. Same rows as [`SqlApply`] with [`DEFAULT_APPLY_SQL`], one round trip instead
/// of one statement per batch.
#[derive(Debug, Clone)]
pub struct BulkApply {
    consumer: String,
}

/// The statement of [`BulkApply`]: `$1` consumer, `$2` stream, `$3` seqs (int8[]), `$4` tss
/// (int8[], ms since the Unix epoch), `$5` payloads (bytea[]).
pub const BULK_APPLY_SQL: &str = "INSERT INTO runnev_sink_batches (consumer, stream, seq, ts, payload)
     SELECT $1, $2, b.seq, b.ts, b.payload FROM unnest($3::int8[], $4::int8[], $5::bytea[]) AS b(seq, ts, payload)";

impl BulkApply {
    /// The bulk path for consumer `consumer`.
    pub fn new(consumer: impl Into<String>) -> BulkApply {
        BulkApply { consumer: consumer.into() }
    }
}

impl Apply for BulkApply {
    fn apply<'a>(
        &'a mut self,
        tx: &'a tokio_postgres::Transaction<'a>,
        stream: &'a str,
        batches: &'a [Batch],
    ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>> {
        async move {
            let seqs: Vec<i64> = batches.iter().map(|b| b.seq as i64).collect();
            let tss: Vec<i64> = batches.iter().map(|b| b.ts as i64).collect();
            let payloads: Vec<&[u8]> = batches.iter().map(|b| b.data.as_ref()).collect();
            let n = tx
                .execute_typed(
                    BULK_APPLY_SQL,
                    &[
                        (&self.consumer, Type::TEXT),
                        (&stream, Type::TEXT),
                        (&seqs, Type::INT8_ARRAY),
                        (&tss, Type::INT8_ARRAY),
                        (&payloads, Type::BYTEA_ARRAY),
                    ],
                )
                .await?;
            debug_assert_eq!(n, batches.len() as u64);
            metrics::counter!("runnev_outbox_sink_statements_total", "stream" => stream.to_string()).increment(1);
            Ok(())
        }
        .boxed()
    }
}

/// What one sink transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupOutcome {
    /// Batches applied.
    pub applied: usize,
    /// Batches skipped because `seq <= cursor` (redelivered).
    pub redelivered: usize,
    /// Gaps recorded in `runnev_sink_gaps` (the cursor moved past them).
    pub gaps: Vec<Gap>,
    /// The cursor committed.
    pub cursor: u64,
}

/// Loads the cursor of (`consumer`, `stream`), creating it at 0 if missing.
///
/// Errors: the driver's error (e.g. `runnev_sink_cursor` does not exist).
pub async fn load_cursor(
    pg: &tokio_postgres::Client,
    consumer: &str,
    stream: &str,
) -> Result<u64, tokio_postgres::Error> {
    pg.execute(
        "INSERT INTO runnev_sink_cursor (consumer, stream) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        &[&consumer, &stream],
    )
    .await?;
    let row = pg
        .query_one("SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2", &[&consumer, &stream])
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// Applies `deliveries` of `stream` for `consumer` in one transaction: dedupe against the
/// cursor (locked `FOR UPDATE`), apply, record gaps, move the cursor, commit.
///
/// Errors: the driver's or `apply`'s error; nothing is committed then.
pub async fn apply_deliveries<A: Apply + ?Sized>(
    pg: &mut tokio_postgres::Client,
    consumer: &str,
    stream: &str,
    deliveries: &[Delivery],
    apply: &mut A,
) -> Result<GroupOutcome, tokio_postgres::Error> {
    apply_group(pg, consumer, stream, deliveries, apply, &None).await
}

async fn apply_group<A: Apply + ?Sized>(
    pg: &mut tokio_postgres::Client,
    consumer: &str,
    stream: &str,
    deliveries: &[Delivery],
    apply: &mut A,
    fp: &Option<Arc<Failpoint>>,
) -> Result<GroupOutcome, tokio_postgres::Error> {
    let tx = pg.transaction().await?;
    // One round trip each (typed, no separate prepare); the cursor row is created only when
    // missing.
    let key: [(&(dyn ToSql + Sync), Type); 2] = [(&consumer, Type::TEXT), (&stream, Type::TEXT)];
    let lock = "SELECT cursor FROM runnev_sink_cursor WHERE consumer = $1 AND stream = $2 FOR UPDATE";
    let row = match tx.query_typed_opt(lock, &key).await? {
        Some(row) => row,
        None => {
            tx.execute_typed(
                "INSERT INTO runnev_sink_cursor (consumer, stream) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &key,
            )
            .await?;
            tx.query_typed_one(lock, &key).await?
        }
    };
    let start = row.get::<_, i64>(0).max(0) as u64;
    let mut out = GroupOutcome { cursor: start, ..GroupOutcome::default() };
    let mut fresh: Vec<Batch> = Vec::new();
    for d in deliveries {
        match d {
            Delivery::Batch(b) if b.seq <= out.cursor => out.redelivered += 1,
            Delivery::Batch(b) => {
                out.cursor = b.seq;
                fresh.push(b.clone());
            }
            Delivery::Gap(g) if g.to <= out.cursor => {}
            Delivery::Gap(g) => {
                if !fresh.is_empty() {
                    apply.apply(&tx, stream, &fresh).await?;
                    out.applied += fresh.len();
                    fresh.clear();
                }
                let gap = Gap { from: g.from.max(out.cursor + 1), to: g.to };
                tx.execute(
                    "INSERT INTO runnev_sink_gaps (consumer, stream, from_seq, to_seq) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (consumer, stream, from_seq) DO UPDATE SET to_seq = GREATEST(runnev_sink_gaps.to_seq, EXCLUDED.to_seq)",
                    &[&consumer, &stream, &(gap.from as i64), &(gap.to as i64)],
                )
                .await?;
                out.cursor = gap.to;
                out.gaps.push(gap);
            }
        }
    }
    if !fresh.is_empty() {
        apply.apply(&tx, stream, &fresh).await?;
        out.applied += fresh.len();
    }
    if out.cursor != start {
        tx.execute_typed(
            "UPDATE runnev_sink_cursor SET cursor = $3, updated_at = now() WHERE consumer = $1 AND stream = $2",
            &[(&consumer, Type::TEXT), (&stream, Type::TEXT), (&(out.cursor as i64), Type::INT8)],
        )
        .await?;
    }
    failpoint(fp, FailpointName::BeforeCommit);
    tx.commit().await?;
    if out.applied > 0 {
        apply.committed(stream);
    }
    Ok(out)
}

/// Creates the sink schema ([`super::SINK_SQL`]) if missing, under a transaction-level
/// advisory lock so that sinks starting together do not race on the DDL.
///
/// Errors: [`OutboxError::Postgres`] when a statement fails (e.g. permission denied).
pub async fn init_schema(pg: &tokio_postgres::Client) -> Result<(), OutboxError> {
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('runnev-sink-schema', 0));
         SET LOCAL client_min_messages = warning; {}; COMMIT;",
        super::SINK_SQL
    );
    pg.batch_execute(&sql).await.map_err(OutboxError::Postgres)
}

/// How the sink runs. [`SinkOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// PostgreSQL URL, `postgres://user:password@host:port/dbname`.
    pub postgres: String,
    /// The consumer's name: its cursor is the row (consumer, stream).
    pub consumer: String,
    /// The stream to consume.
    pub stream: String,
    /// Most deliveries applied in one transaction (those already received are grouped).
    pub batch_max: usize,
    /// Create the sink tables at start if missing.
    pub init_schema: bool,
    /// First delay after an error; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest delay between retries.
    pub backoff_max: Duration,
    /// A test's crash point, if any.
    pub failpoint: Option<Arc<Failpoint>>,
}

impl SinkOptions {
    /// Defaults: groups of up to 5,000, backoff 200 ms → 30 s, no schema creation.
    pub fn new(postgres: impl Into<String>, consumer: impl Into<String>, stream: impl Into<String>) -> SinkOptions {
        SinkOptions {
            postgres: postgres.into(),
            consumer: consumer.into(),
            stream: stream.into(),
            batch_max: 5000,
            init_schema: false,
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            failpoint: None,
        }
    }
}

/// A sink: subscribes to one stream from the cursor stored in PostgreSQL and applies every
/// batch exactly once with its [`Apply`].
pub struct Sink<A: Apply> {
    client: Client,
    opts: SinkOptions,
    target: PgTarget,
    apply: A,
}

impl<A: Apply> Sink<A> {
    /// A sink reading through `client`.
    ///
    /// Errors: [`OutboxError::Config`] for a malformed URL, an empty consumer, `batch_max` 0, or
    /// a stream name no stream can have (SPEC §1; it was retried for ever).
    pub fn new(client: Client, opts: SinkOptions, apply: A) -> Result<Sink<A>, OutboxError> {
        if opts.consumer.is_empty() || opts.batch_max == 0 {
            return Err(OutboxError::Config("the consumer name must not be empty and batch_max must be >= 1".into()));
        }
        crate::stream::validate_name(&opts.stream)
            .map_err(|e| OutboxError::Config(format!("--stream {:?}: {e}", opts.stream)))?;
        let target = PgTarget::parse(&opts.postgres, "runnev-sink")?;
        Ok(Sink { client, opts, target, apply })
    }

    /// Runs until `shutdown` completes. Failures (database, cluster) are logged, counted and
    /// retried with backoff from the committed cursor; this returns `Ok(())` at shutdown.
    /// Dropping the future at any point is safe.
    ///
    /// Errors: none after start; kept for symmetry with [`Sink::new`].
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), OutboxError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = Backoff::new(self.opts.backoff_min, self.opts.backoff_max);
        loop {
            let err = tokio::select! {
                e = self.session(&mut backoff) => e,
                _ = &mut shutdown => {
                    tracing::info!(stream = %self.opts.stream, consumer = %self.opts.consumer, "sink stopping");
                    return Ok(());
                }
            };
            count_error("sink", &err);
            let delay = backoff.next_delay();
            tracing::error!(stream = %self.opts.stream, consumer = %self.opts.consumer, error = %err, retry_in = ?delay,
                "sink failed; resuming from the committed cursor");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut shutdown => return Ok(()),
            }
        }
    }

    async fn session(&mut self, backoff: &mut Backoff) -> OutboxError {
        match self.session_inner(backoff).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn session_inner(&mut self, backoff: &mut Backoff) -> Result<std::convert::Infallible, OutboxError> {
        let (consumer, stream) = (self.opts.consumer.clone(), self.opts.stream.clone());
        let display = self.target.display.clone();
        let pg_err = |e| OutboxError::from_pg(&display, e, SCHEMA_FILE);
        let (mut pg, _notes) = self.target.connect().await?;
        if self.opts.init_schema {
            init_schema(&pg).await?;
        }
        let cursor = load_cursor(&pg, &consumer, &stream).await.map_err(pg_err)?;
        let labels = [("consumer", consumer.clone()), ("stream", stream.clone())];
        metrics::gauge!("runnev_outbox_sink_cursor", &labels).set(cursor as f64);
        tracing::info!(stream = %stream, consumer = %consumer, cursor, "sink subscribing after its committed cursor");
        // Read-ahead: a task drains the subscription into a queue of up to `batch_max`
        // deliveries while a transaction is in flight, so the next group takes everything that
        // arrived meanwhile (many batches per transaction under load, one when idle).
        let mut sub = self.client.subscribe(&stream, cursor);
        let (queue, mut deliveries) = tokio::sync::mpsc::channel(self.opts.batch_max);
        let _reader = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Some(item) = sub.next().await {
                if queue.send(item).await.is_err() {
                    break;
                }
            }
        }));
        let mut next = deliveries.recv().await;
        loop {
            let first = match next.take() {
                Some(Ok(d)) => d,
                Some(Err(e @ (ClientError::Unavailable { .. } | ClientError::Unreachable { .. }))) => {
                    tracing::warn!(stream = %stream, error = %e, "no node answers the subscription; still trying");
                    count_error("sink", &OutboxError::Cluster(e));
                    next = deliveries.recv().await;
                    continue;
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(OutboxError::Cluster(ClientError::Protocol {
                        node: "subscription".into(),
                        what: "the subscription ended".into(),
                    }))
                }
            };
            let mut group = vec![first];
            // An error queued behind the group is handled after the group is applied.
            let mut after: Option<Option<Result<Delivery, ClientError>>> = None;
            while group.len() < self.opts.batch_max {
                match deliveries.try_recv() {
                    Ok(Ok(d)) => group.push(d),
                    Ok(Err(e)) => {
                        after = Some(Some(Err(e)));
                        break;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                        after = Some(None);
                        break;
                    }
                }
            }
            let out = apply_group(&mut pg, &consumer, &stream, &group, &mut self.apply, &self.opts.failpoint)
                .await
                .map_err(pg_err)?;
            backoff.reset();
            metrics::counter!("runnev_outbox_sink_batches_total", &labels).increment(out.applied as u64);
            metrics::counter!("runnev_outbox_sink_redelivered_total", &labels).increment(out.redelivered as u64);
            metrics::gauge!("runnev_outbox_sink_cursor", &labels).set(out.cursor as f64);
            for g in &out.gaps {
                metrics::counter!("runnev_outbox_sink_gaps_total", &labels).increment(1);
                metrics::counter!("runnev_outbox_sink_gap_seqs_total", &labels).increment(g.to - g.from + 1);
                tracing::error!(stream = %stream, consumer = %consumer, from = g.from, to = g.to,
                    "GAP: retention evicted these seqs before this consumer applied them; recorded in runnev_sink_gaps");
            }
            next = match after {
                Some(item) => item,
                None => deliveries.recv().await,
            };
        }
    }
}
