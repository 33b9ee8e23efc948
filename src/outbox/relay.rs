//! The outbox relay: committed outbox rows → Runnev streams, each row exactly once.
//!
//! Owns: seq assignment for outbox rows, publishing, progress, the singleton lock. Must never:
//! publish a row under two seqs, publish a seq at or below its stream's last seq, or lose a
//! committed row.
//!
//! Cycles run as a pipeline of two on the PostgreSQL session that holds the relay's advisory
//! lock: while cycle N's rows are published (by a task of its own), cycle N+1 is prepared.
//! 1. **Remove** (short transactions, each one `DELETE` per stream of at most `delete_batch`
//!    rows): rows with `seq <= published_seq` older than `keep_relayed`. Only those: a row
//!    above `published_seq` may still have to be published again, and the progress table, not
//!    the outbox, says what was published.
//! 2. **Assign**, in cycle N+1's transaction, left open: take up to `batch_size` rows with
//!    `seq IS NULL` in id order, give each the next seq of its stream (per-stream counter in
//!    `<table>_progress`); rows assigned earlier and not acknowledged (after a crash or a failed
//!    publish) and not in cycle N are loaded with them. If none is found while N publishes, the
//!    transaction ends and the relay waits for N, a NOTIFY or the poll, then prepares again: a
//!    row committed during a long publish is assigned at once and published right after it.
//! 3. Once N's publish has landed, **top up** N+1: assign, in the same transaction, the rows
//!    committed since N+1 was prepared (up to `batch_size` rows in all; their seqs follow N+1's),
//!    so that a row committed during N's publish goes out right after it and does not wait for
//!    N+2, a whole publish more. Then **record** N's progress (`published_seq` per stream) in
//!    that transaction and **commit**: one commit per cycle, and N+1's seqs are durable *before*
//!    anything of N+1 is published.
//! 4. **Publish** N+1: each stream's rows as many frames in one request (SPEC §6, `?seq=N`:
//!    frame k is the row with seq N+k), split to stay within `max_append_bytes` and 10,000
//!    frames; up to `concurrency` streams in flight at once. After a crash, rows assigned but
//!    not recorded as published are published again first; the cluster answers `duplicate:
//!    true` for a request it already has, and `409 partial_duplicate` (frame k) when only frames
//!    `0..k` are stored: the relay resends from frame k with seq N+k.
//!
//! Order per stream: N+1's rows of a stream carry the seqs after N's and are published only if
//! N's publish acknowledged every row it had of that stream; otherwise they stay assigned and a
//! later cycle loads them after what N did not publish. At most two cycles are open at once (one
//! publishing, one prepared). A crash before N+1's commit rolls its transaction back (none of
//! its seqs was used) and leaves N assigned and unrecorded: published again, answered
//! duplicate; a crash after it leaves N+1 assigned and unrecorded in the same way.
//!
//! Why seqs are assigned by the relay and not taken from the row id: ids come from a sequence
//! in `nextval` order, not commit order. A transaction holding id 7 may commit after id 8 was
//! relayed as seq 8; publishing id 7 as seq 7 would then be refused (`seq_not_increasing`). Here
//! id 7 is simply still `seq IS NULL` when it becomes visible, and gets the stream's next seq.
//!
//! Why a cycle's seqs are committed before it is published, and not in the transaction that
//! records its progress: a crash after publishing would roll the assignment back, and the retry
//! could give the same seq to another row (one that committed in between) → `seq_conflict`.
//! Recording N with N+1's assignment is safe for that reason: N+1's seqs are published only
//! after that commit.
//!
//! If another publisher took a seq the relay assigned (the relay should be the stream's only
//! publisher), the cluster answers `seq_not_increasing` or `seq_conflict`: no batch of that row
//! is stored, so the row and those after it in that stream go back to `seq IS NULL` and get
//! seqs after the stream's last seq; `runnev_outbox_reassigned_total` counts them.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tokio_postgres::types::Type;
use tokio_util::task::AbortOnDropHandle;

use super::{count_error, failpoint, is_connection_problem, Backoff, Failpoint, FailpointName, OutboxError, PgTarget};
use crate::client::{Client, ClientError};

const SCHEMA_FILE: &str = "sql/outbox.sql";

/// Most `DELETE`s of relayed rows per stream per cycle (see `Relay::remove_relayed`).
const REMOVE_ROUNDS_MAX: usize = 8;

/// Longest time between two removals of relayed rows while rows are acknowledged (fewer than a
/// delete batch of them): the outbox holds at most this long's rows beyond `keep_relayed`.
const REMOVE_EVERY: Duration = Duration::from_secs(1);

/// How the relay runs. [`RelayOptions::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// PostgreSQL URL, `postgres://user:password@host:port/dbname`.
    pub postgres: String,
    /// The outbox table (an identifier, see [`super::check_identifier`]); its progress table is
    /// `<table>_progress`, its NOTIFY channel `<table>`.
    pub table: String,
    /// Most rows assigned and published per cycle.
    pub batch_size: usize,
    /// How often the active relay looks for rows without a notification.
    pub poll: Duration,
    /// How often a standby tries to take the lock.
    pub standby_poll: Duration,
    /// Create the tables ([`super::outbox_schema`]) at start if missing.
    pub init_schema: bool,
    /// Create a stream the first time a row names it, instead of failing.
    pub create_streams: bool,
    /// First delay after an error; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest delay between retries.
    pub backoff_max: Duration,
    /// How often the lag gauges are refreshed.
    pub lag_every: Duration,
    /// Most streams published at once (each one request in flight).
    pub concurrency: usize,
    /// Largest body of one frames request, frame headers included, in bytes: at most the
    /// cluster's `--max-append-bytes`. A request is also at most
    /// [`crate::limits::FRAMES_PER_APPEND_MAX`] frames.
    pub max_append_bytes: usize,
    /// How long a relayed row (`seq <= published_seq`) stays in the outbox after it was
    /// written (`created_at`); zero removes it right after its progress is recorded.
    pub keep_relayed: Duration,
    /// Most rows of one stream removed by one `DELETE` (the streams' `DELETE`s of a round
    /// share one short transaction).
    pub delete_batch: usize,
    /// A test's crash point, if any.
    pub failpoint: Option<Arc<Failpoint>>,
    /// Told about every assignment, acknowledgement and cycle (the benchmark's per-stage
    /// latency); `None` in the `runnev outbox-relay` command.
    pub observer: Option<Arc<dyn RelayObserver>>,
}

/// Receives what the relay does, as it does it, for measurements: `runnev bench outbox` splits
/// its commit → sink latency into stages with it. Called inline on the relay's task, so an
/// implementation must return quickly and never block. Every method has an empty default.
pub trait RelayObserver: Send + Sync + std::fmt::Debug {
    /// The assignment transaction that gave these rows of `stream` their seqs committed.
    /// `rows`: (seq, payload), ascending seqs.
    fn assigned(&self, _stream: &str, _rows: &[(u64, &[u8])]) {}
    /// The cluster acknowledged these rows of `stream` (stored, or answered duplicate).
    /// `rows`: (seq, payload), consecutive ascending seqs.
    fn acknowledged(&self, _stream: &str, _rows: &[(u64, &[u8])]) {}
    /// A cycle that moved at least one row ended (its progress committed).
    fn cycle(&self, _timing: &CycleTiming) {}
}

/// How long the phases of one relay cycle took (wall clock), reported to
/// [`RelayObserver::cycle`].
#[derive(Debug, Clone, Default)]
pub struct CycleTiming {
    /// Rows handed to the publish (loaded after a crash plus newly assigned).
    pub rows: usize,
    /// Removing relayed rows (`DELETE`s).
    pub remove: Duration,
    /// Loading unpublished rows and the assignment transaction, to its commit.
    pub assign: Duration,
    /// Publishing, from the first request to the last answer of every stream.
    pub publish: Duration,
    /// Topping the next cycle up, recording the progress (both in the next cycle's
    /// transaction) and that transaction's commit.
    pub record: Duration,
}

impl RelayOptions {
    /// Defaults for `table` on `postgres`: batches of 5,000 rows, poll every 1 s, standby every
    /// 1 s, backoff 200 ms → 30 s, lag every 1 s, 16 streams in flight, requests of at most
    /// 8 MiB (the cluster's default `--max-append-bytes`), relayed rows removed at once in
    /// deletes of 5,000, no schema or stream creation.
    pub fn new(postgres: impl Into<String>, table: impl Into<String>) -> RelayOptions {
        RelayOptions {
            postgres: postgres.into(),
            table: table.into(),
            batch_size: 5000,
            poll: Duration::from_secs(1),
            standby_poll: Duration::from_secs(1),
            init_schema: false,
            create_streams: false,
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            lag_every: Duration::from_secs(1),
            concurrency: 16,
            max_append_bytes: crate::limits::APPEND_BYTES_DEFAULT,
            keep_relayed: Duration::ZERO,
            delete_batch: 5000,
            failpoint: None,
            observer: None,
        }
    }
}

/// One outbox row with its seq.
#[derive(Debug, Clone)]
struct Row {
    stream: String,
    seq: u64,
    payload: Bytes,
}

impl Row {
    /// A result row whose columns are `(stream text, seq int8, payload bytea)`.
    fn from_columns(r: &tokio_postgres::Row) -> Row {
        Row { stream: r.get(0), seq: r.get::<_, i64>(1) as u64, payload: Bytes::from(r.get::<_, Vec<u8>>(2)) }
    }
}

/// What publishing one stream's rows did.
#[derive(Debug, Default)]
struct StreamOutcome {
    /// Highest seq acknowledged (rows are published in seq order, stopping at the first failure).
    acked: Option<u64>,
    acked_rows: u64,
    duplicates: u64,
    /// Publish requests sent (each carrying one or more rows as frames).
    requests: u64,
    /// The first seq another publisher had taken (`409 seq_not_increasing` / `seq_conflict`).
    taken: Option<u64>,
    /// The stream's last seq, read after `taken`.
    last_seq: u64,
    error: Option<OutboxError>,
}

/// What a turn of the pipeline leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Go on at once: a cycle is publishing, or more rows may be waiting.
    Again,
    /// Nothing in flight and nothing found: wait for a NOTIFY or the poll timer.
    Idle,
}

/// What one PostgreSQL session of the active relay keeps between turns.
#[derive(Default)]
struct Pipe {
    /// The cycle being published, until its progress is recorded.
    flight: Option<InFlight>,
    /// Streams whose row the cluster refused for good, and until when they are left alone.
    resting: BTreeMap<String, Instant>,
    /// Streams that do not exist (without `--create-streams`), and until when their rows are
    /// left without a seq: they hold back only their own rows, not the other streams'.
    missing: BTreeMap<String, Instant>,
}

/// A cycle whose rows are being published by a task of its own.
struct InFlight {
    task: AbortOnDropHandle<BTreeMap<String, StreamOutcome>>,
    /// Per stream, the last seq this cycle carries; the next cycle's rows of the stream follow
    /// it and are published only once this one is acknowledged through it.
    last: BTreeMap<String, u64>,
    /// The preparation's phases (rows, remove, assign); publish and record are added later.
    timing: CycleTiming,
    started: Instant,
    /// The publish's outcomes per stream and how long it took, once it finished.
    landed: Option<(BTreeMap<String, StreamOutcome>, Duration)>,
}

impl InFlight {
    /// Waits until the publish finished (at once if it has). Cancel-safe: dropping it before it
    /// returns leaves the publish running. A publish task that panicked counts as a publish
    /// that acknowledged nothing.
    async fn land(&mut self) {
        if self.landed.is_some() {
            return;
        }
        let outcomes = (&mut self.task).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the publish task failed; its rows are published again");
            BTreeMap::new()
        });
        self.landed = Some((outcomes, self.started.elapsed()));
    }

    /// The outcomes (empty before [`InFlight::land`]).
    fn outcomes(&self) -> &BTreeMap<String, StreamOutcome> {
        static NONE: BTreeMap<String, StreamOutcome> = BTreeMap::new();
        self.landed.as_ref().map_or(&NONE, |l| &l.0)
    }

    /// Streams whose rows were not all acknowledged.
    fn stopped_short(&self) -> BTreeSet<String> {
        let o = self.outcomes();
        self.last
            .iter()
            .filter(|(s, last)| o.get(*s).and_then(|o| o.acked) != Some(**last))
            .map(|(s, _)| s.clone())
            .collect()
    }
}

/// The next cycle, prepared while the one before publishes: its transaction (open, the
/// assignment done) and its rows.
struct Prepared<'c> {
    tx: tokio_postgres::Transaction<'c>,
    /// Rows to publish, per stream in seq order: those loaded (assigned earlier, not
    /// acknowledged), then the newly assigned ones of streams that had none loaded.
    work: Vec<Row>,
    /// Every row this transaction assigned (for the observer).
    fresh: Vec<Row>,
    /// Streams with rows loaded (assigned earlier, not acknowledged): their newly assigned rows
    /// wait for a later cycle.
    blocked: BTreeSet<String>,
    /// The assignment took a full batch: more rows may be waiting.
    full: bool,
    /// Streams found not to exist (without `--create-streams`); their rows got no seq.
    missing: Vec<String>,
    remove: Duration,
    assign: Duration,
}

/// The relay for one outbox table. See the module docs for the algorithm.
pub struct Relay {
    client: Client,
    opts: RelayOptions,
    target: PgTarget,
    progress: String,
    /// Per stream, the seq through which this relay has removed relayed rows (see
    /// `Relay::remove_relayed`); learnt from the table on first use.
    removed_through: std::sync::Mutex<BTreeMap<String, i64>>,
    /// When the last removal ran (`None`: not yet).
    last_removal: std::sync::Mutex<Option<Instant>>,
    /// Rows acknowledged since the last removal.
    acked_since_removal: std::sync::atomic::AtomicU64,
}

impl StreamOutcome {
    /// Counts `rows` (consecutive, after those already counted) as acknowledged.
    fn acknowledge(&mut self, rows: &[Row], duplicate: bool) {
        debug_assert!(self.acked.is_none_or(|a| rows.first().is_none_or(|r| r.seq > a)));
        if let Some(last) = rows.last() {
            self.acked = Some(last.seq);
            self.acked_rows += rows.len() as u64;
            if duplicate {
                self.duplicates += rows.len() as u64;
            }
        }
    }
}

/// Bytes of a frames body carrying `rows`: a 4-byte length before each payload.
fn chunk_bytes(rows: &[Row]) -> usize {
    rows.iter().map(|r| 4 + r.payload.len()).sum()
}

/// The end (exclusive) of the request starting at `rows[start]`: consecutive seqs only, at
/// most [`crate::limits::FRAMES_PER_APPEND_MAX`] frames and `max_bytes` of body, never past
/// `cap`; always at least one row (a row too large on its own is the cluster's to refuse).
fn request_end(rows: &[Row], start: usize, max_bytes: usize, cap: usize) -> usize {
    debug_assert!(start < rows.len() && start < cap);
    let limit = cap.min(rows.len()).min(start + crate::limits::FRAMES_PER_APPEND_MAX);
    let mut bytes = 4 + rows[start].payload.len();
    let mut end = start + 1;
    while end < limit {
        let next = 4 + rows[end].payload.len();
        if rows[end].seq != rows[end - 1].seq + 1 || bytes + next > max_bytes {
            break;
        }
        bytes += next;
        end += 1;
    }
    end
}

impl Relay {
    /// A relay publishing through `client`.
    ///
    /// Errors: [`OutboxError::Config`] for a bad table name, batch size 0, concurrency 0, a
    /// request size too small for a frame header, delete batch 0, or a malformed URL.
    pub fn new(client: Client, opts: RelayOptions) -> Result<Relay, OutboxError> {
        super::check_identifier(&opts.table)?;
        if opts.batch_size == 0 || opts.batch_size > 100_000 {
            return Err(OutboxError::Config("batch size must be 1-100000".into()));
        }
        if opts.concurrency == 0 || opts.delete_batch == 0 {
            return Err(OutboxError::Config("concurrency and delete batch must be at least 1".into()));
        }
        if opts.max_append_bytes < 4 || opts.max_append_bytes > crate::limits::APPEND_BYTES_MAX {
            return Err(OutboxError::Config(format!(
                "the request size must be 4 bytes to {} bytes",
                crate::limits::APPEND_BYTES_MAX
            )));
        }
        let target = PgTarget::parse(&opts.postgres, "runnev-outbox-relay")?;
        let progress = format!("{}_progress", opts.table);
        Ok(Relay {
            client,
            opts,
            target,
            progress,
            removed_through: Default::default(),
            last_removal: Default::default(),
            acked_since_removal: Default::default(),
        })
    }

    /// Runs until `shutdown` completes: waits as a hot standby while another relay holds the
    /// table's lock, then relays. Every failure is logged, counted and retried with backoff;
    /// this returns `Ok(())` only at shutdown. Dropping the future at any point is safe.
    ///
    /// Errors: none after start (failures are retried); kept for symmetry with [`Relay::new`].
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), OutboxError> {
        // Shared with the task publishing the cycle in flight.
        let relay = Arc::new(self);
        relay.run_shared(shutdown).await
    }

    async fn run_shared(self: &Arc<Self>, shutdown: impl Future<Output = ()>) -> Result<(), OutboxError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = Backoff::new(self.opts.backoff_min, self.opts.backoff_max);
        let table = self.opts.table.clone();
        loop {
            let err = tokio::select! {
                e = self.session(&mut backoff) => e,
                _ = &mut shutdown => {
                    metrics::gauge!("runnev_outbox_active", "table" => table.clone()).set(0.0);
                    tracing::info!(table = %table, "outbox relay stopping");
                    return Ok(());
                }
            };
            metrics::gauge!("runnev_outbox_active", "table" => table.clone()).set(0.0);
            count_error("relay", &err);
            let delay = backoff.next_delay();
            tracing::error!(table = %table, error = %err, retry_in = ?delay, "outbox relay: no PostgreSQL session (it could not start, or broke); reconnecting");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = &mut shutdown => return Ok(()),
            }
        }
    }

    /// One PostgreSQL session: connect, (init,) wait for the lock, relay until a session-level
    /// failure, which is returned.
    async fn session(self: &Arc<Self>, backoff: &mut Backoff) -> OutboxError {
        match self.session_inner(backoff).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn session_inner(self: &Arc<Self>, backoff: &mut Backoff) -> Result<std::convert::Infallible, OutboxError> {
        let table = &self.opts.table;
        let pg_err = |e| OutboxError::from_pg(&self.target.display, e, SCHEMA_FILE);
        metrics::gauge!("runnev_outbox_active", "table" => table.clone()).set(0.0);
        let (mut pg, mut notes) = self.target.connect().await?;
        // Short statements only: compiling one with JIT would cost more than running it.
        pg.batch_execute("SET jit = off").await.map_err(pg_err)?;
        if self.opts.init_schema {
            init_schema(&pg, table).await?;
        }
        self.check_tables(&pg).await?;
        // Singleton: a session-level advisory lock, released by the server when this session
        // ends (process killed, connection lost), which is when a standby takes over.
        let lock_key = format!("runnev-outbox-relay:{table}");
        let mut announced = false;
        loop {
            let got: bool = pg
                .query_one("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", &[&lock_key])
                .await
                .map_err(pg_err)?
                .get(0);
            if got {
                break;
            }
            if !announced {
                tracing::info!(table = %table, "another relay holds this outbox; waiting as a hot standby");
                announced = true;
            }
            backoff.reset();
            tokio::time::sleep(self.opts.standby_poll).await;
        }
        pg.batch_execute(&format!("LISTEN {table}")).await.map_err(pg_err)?;
        metrics::gauge!("runnev_outbox_active", "table" => table.clone()).set(1.0);
        tracing::info!(table = %table, target = %self.target.display, "outbox relay active");
        backoff.reset();
        let mut cycle_backoff = Backoff::new(self.opts.backoff_min, self.opts.backoff_max);
        let mut last_lag = Instant::now() - self.opts.lag_every;
        let mut pipe = Pipe::default();
        loop {
            if last_lag.elapsed() >= self.opts.lag_every {
                self.update_lag(&pg).await?;
                last_lag = Instant::now();
            }
            match self.turn(&mut pg, &mut notes, &mut pipe).await {
                Ok(Turn::Again) => cycle_backoff.reset(),
                Ok(Turn::Idle) => {
                    cycle_backoff.reset();
                    // Idle: wake on NOTIFY (a commit that inserted rows) or on the poll timer.
                    if let Ok(Some(_)) = tokio::time::timeout(self.opts.poll, notes.recv()).await {
                        while notes.try_recv().is_ok() {}
                    }
                }
                Err(e) => {
                    // A publish still in flight is abandoned (its task aborted): its rows are
                    // loaded again by the next cycle and answered duplicate: true if stored.
                    pipe.flight = None;
                    if is_connection_problem(&e) {
                        return Err(e);
                    }
                    count_error("relay", &e);
                    let delay = cycle_backoff.next_delay();
                    tracing::error!(table = %table, error = %e, retry_in = ?delay, "outbox relay cycle failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn check_tables(&self, pg: &tokio_postgres::Client) -> Result<(), OutboxError> {
        for t in [&self.opts.table, &self.progress] {
            let found: Option<String> = pg
                .query_one("SELECT to_regclass($1)::text", &[t])
                .await
                .map_err(|e| OutboxError::from_pg(&self.target.display, e, SCHEMA_FILE))?
                .get(0);
            if found.is_none() {
                return Err(OutboxError::MissingTable {
                    message: format!("relation \"{t}\" does not exist in {}", self.target.display),
                    file: SCHEMA_FILE,
                });
            }
        }
        Ok(())
    }

    /// Refreshes `runnev_outbox_lag_rows` (rows committed but not yet acknowledged by the
    /// cluster) and `runnev_outbox_lag_seconds` (age of the oldest such row).
    async fn update_lag(&self, pg: &tokio_postgres::Client) -> Result<(), OutboxError> {
        let (t, p) = (&self.opts.table, &self.progress);
        let sql = format!(
            "SELECT count(*)::int8, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM (
               SELECT created_at FROM {t} WHERE seq IS NULL
               UNION ALL
               SELECT o.created_at FROM {p} p
                 CROSS JOIN LATERAL (SELECT created_at FROM {t} o WHERE o.stream = p.stream AND o.seq > p.published_seq) o
             ) x"
        );
        let row = pg.query_typed_one(&sql, &[]).await.map_err(|e| self.pg_err(e))?;
        let (rows, secs): (i64, f64) = (row.get(0), row.get(1));
        metrics::gauge!("runnev_outbox_lag_rows", "table" => t.clone()).set(rows as f64);
        metrics::gauge!("runnev_outbox_lag_seconds", "table" => t.clone()).set(secs);
        Ok(())
    }

    /// Removes relayed rows: those with `seq <= published_seq` of their stream (the cluster
    /// acknowledged them and the progress says so) written at least `keep_relayed` ago, once
    /// [`REMOVE_EVERY`] has passed since the last removal or `delete_batch` rows were
    /// acknowledged since (so a cycle of a few rows does not pay for a removal). Each
    /// round is one short transaction with one `DELETE` per stream (sent together, without
    /// waiting for each answer) over the stream's seq range `(low, high]` of at most
    /// `delete_batch` seqs, found through the `(stream, seq)` index; `low` is what this relay
    /// already removed (kept in memory, so the scan never walks the index entries of rows
    /// removed before), `high` at most `published_seq`. It locks only the rows it removes,
    /// which no writer touches again, so inserts never wait for it. At most
    /// [`REMOVE_ROUNDS_MAX`] rounds per cycle (the next cycle goes on). Returns the rows removed.
    async fn remove_relayed(&self, pg: &mut tokio_postgres::Client) -> Result<u64, OutboxError> {
        {
            // Due after REMOVE_EVERY, or once a delete's worth of rows was acknowledged.
            let mut last = self.last_removal.lock().unwrap_or_else(|e| e.into_inner());
            let acked = self.acked_since_removal.load(std::sync::atomic::Ordering::Relaxed);
            if last.is_some_and(|l| l.elapsed() < REMOVE_EVERY) && acked < self.opts.delete_batch as u64 {
                return Ok(0);
            }
            *last = Some(Instant::now());
            self.acked_since_removal.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let (t, p) = (&self.opts.table, &self.progress);
        let keep = self.opts.keep_relayed.as_secs_f64();
        let published: Vec<(String, i64)> = pg
            .query_typed(&format!("SELECT stream, published_seq FROM {p}"), &[])
            .await
            .map_err(|e| self.pg_err(e))?
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        // (stream, low, top): what is left to remove of each stream.
        let mut ranges: Vec<(String, i64, i64)> = Vec::with_capacity(published.len());
        for (stream, top) in published {
            let known = self.removed_through.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).copied();
            let low = match known {
                Some(l) => l,
                None => pg
                    .query_one(
                        &format!("SELECT coalesce(min(seq) - 1, $2) FROM {t} WHERE stream = $1 AND seq IS NOT NULL"),
                        &[&stream, &top],
                    )
                    .await
                    .map_err(|e| self.pg_err(e))?
                    .get::<_, i64>(0),
            };
            ranges.push((stream, low, top));
        }
        let delete = format!(
            "DELETE FROM {t} WHERE stream = $1 AND seq > $2 AND seq <= $3
               AND created_at <= now() - make_interval(secs => $4)"
        );
        let first_kept = format!("SELECT min(seq) FROM {t} WHERE stream = $1 AND seq > $2 AND seq <= $3");
        let (delete, first_kept) = (&delete, &first_kept);
        let mut removed = 0;
        for _ in 0..REMOVE_ROUNDS_MAX {
            let round: Vec<(String, i64, i64)> = ranges
                .iter()
                .filter(|(_, low, top)| low < top)
                .map(|(s, low, top)| (s.clone(), *low, (*top).min(low.saturating_add(self.opts.delete_batch as i64))))
                .collect();
            if round.is_empty() {
                break;
            }
            let tx = pg.transaction().await.map_err(|e| self.pg_err(e))?;
            let txr = &tx;
            let counts = futures::future::try_join_all(round.iter().map(|(s, low, high)| async move {
                txr.execute_typed(
                    delete,
                    &[(s, Type::TEXT), (low, Type::INT8), (high, Type::INT8), (&keep, Type::FLOAT8)],
                )
                .await
            }))
            .await
            .map_err(|e| self.pg_err(e))?;
            // Rows inside the keep window stay: the stream's range continues from the first.
            let kept: Vec<Option<i64>> = if keep > 0.0 {
                futures::future::try_join_all(round.iter().map(|(s, low, high)| async move {
                    txr.query_one(first_kept, &[s, low, high]).await.map(|r| r.get::<_, Option<i64>>(0))
                }))
                .await
                .map_err(|e| self.pg_err(e))?
            } else {
                vec![None; round.len()]
            };
            tx.commit().await.map_err(|e| self.pg_err(e))?;
            metrics::counter!("runnev_outbox_remove_statements_total", "table" => t.clone())
                .increment(round.len() as u64);
            for (((stream, low, high), n), kept) in round.iter().zip(counts).zip(kept) {
                debug_assert!(n <= (high - low) as u64);
                removed += n;
                let Some(r) = ranges.iter_mut().find(|r| &r.0 == stream) else { continue };
                match kept {
                    // Nothing more of this stream this cycle.
                    Some(k) => (r.1, r.2) = (k - 1, k - 1),
                    None => r.1 = *high,
                }
            }
        }
        metrics::counter!("runnev_outbox_removed_total", "table" => t.clone()).increment(removed);
        let mut through = self.removed_through.lock().unwrap_or_else(|e| e.into_inner());
        for (stream, low, _) in ranges {
            through.insert(stream, low);
        }
        Ok(removed)
    }

    fn pg_err(&self, e: tokio_postgres::Error) -> OutboxError {
        OutboxError::from_pg(&self.target.display, e, SCHEMA_FILE)
    }

    /// One turn of the pipeline (see the module docs): prepare the next cycle in a
    /// transaction while the cycle in `pipe` publishes; once that publish has landed, record its
    /// progress in the same transaction, commit, and start publishing the new cycle.
    async fn turn(
        self: &Arc<Self>,
        pg: &mut tokio_postgres::Client,
        notes: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
        pipe: &mut Pipe,
    ) -> Result<Turn, OutboxError> {
        let in_flight = pipe.flight.as_ref().map(|f| f.last.clone()).unwrap_or_default();
        let now = Instant::now();
        pipe.missing.retain(|_, until| *until > now);
        let mut next = self.prepare(pg, &in_flight, &pipe.missing).await?;
        for stream in std::mem::take(&mut next.missing) {
            let e = OutboxError::Config(format!(
                "outbox rows name stream {stream:?}, which does not exist: create it, or run the relay with --create-streams; \
                 its rows wait (the other streams' rows are relayed), and it is looked up again in {}",
                humantime::format_duration(self.opts.poll)
            ));
            tracing::warn!(table = %self.opts.table, stream = %stream, error = %e, "a stream's rows wait");
            count_error("relay", &e);
            pipe.missing.insert(stream, now + self.opts.poll);
        }
        if next.work.is_empty() && !next.full {
            if let Some(f) = pipe.flight.as_mut().filter(|f| f.landed.is_none()) {
                // Nothing new yet: end the empty transaction and wait for the publish to land, a
                // NOTIFY or the poll timer; then prepare again.
                next.tx.commit().await.map_err(|e| self.pg_err(e))?;
                tokio::select! {
                    _ = f.land() => {}
                    _ = notes.recv() => while notes.try_recv().is_ok() {},
                    _ = tokio::time::sleep(self.opts.poll) => {}
                }
                return Ok(Turn::Again);
            }
        }
        let mut finished = pipe.flight.take();
        let mut record = Duration::ZERO;
        if let Some(f) = finished.as_mut() {
            f.land().await;
            failpoint(&self.opts.failpoint, FailpointName::AfterPublish);
            let t = Instant::now();
            self.top_up_and_record(&mut next, f.outcomes()).await?;
            record = t.elapsed();
            // A stream whose publish stopped short keeps its next rows back (they are loaded
            // again, after what it did not publish, by a later cycle): no seq overtakes one that
            // is not acknowledged.
            let short = f.stopped_short();
            next.work.retain(|r| !short.contains(&r.stream));
        }
        // Streams refused for good rest for a poll interval rather than being retried each turn.
        let now = Instant::now();
        pipe.resting.retain(|_, until| *until > now);
        next.work.retain(|r| !pipe.resting.contains_key(&r.stream));
        let t = Instant::now();
        next.tx.commit().await.map_err(|e| self.pg_err(e))?;
        record += t.elapsed();
        if let Some(obs) = &self.opts.observer {
            for rows in next.fresh.chunk_by(|a, b| a.stream == b.stream) {
                obs.assigned(&rows[0].stream, &rows.iter().map(|r| (r.seq, r.payload.as_ref())).collect::<Vec<_>>());
            }
        }
        let mut acked = 0;
        let mut first_error = None;
        if let Some(f) = finished {
            let mut timing = f.timing.clone();
            timing.record = record;
            timing.publish = f.landed.as_ref().map_or(Duration::ZERO, |l| l.1);
            if let Some(obs) = &self.opts.observer {
                obs.cycle(&timing);
            }
            (acked, first_error) = self.report(f, &mut pipe.resting);
        }
        match first_error {
            // Nothing moved and waiting may help (database, cluster): back off. The new cycle is
            // not published; its rows are loaded again after the backoff.
            Some(e) if acked == 0 && !matches!(e, OutboxError::Stuck { .. }) => return Err(e),
            // Other streams moved, or the row is refused for good: count the error and go on.
            Some(e) => count_error("relay", &e),
            None => {}
        }
        if next.work.is_empty() {
            return Ok(if next.full { Turn::Again } else { Turn::Idle });
        }
        failpoint(&self.opts.failpoint, FailpointName::AfterAssign);
        let mut last = BTreeMap::new();
        for r in &next.work {
            debug_assert!(in_flight.get(&r.stream).is_none_or(|l| r.seq > *l), "a seq overtook the cycle before");
            debug_assert!(last.get(&r.stream).is_none_or(|l| r.seq > *l), "seqs not increasing in a cycle");
            last.insert(r.stream.clone(), r.seq);
        }
        let timing =
            CycleTiming { rows: next.work.len(), remove: next.remove, assign: next.assign, ..CycleTiming::default() };
        let relay = Arc::clone(self);
        let work = std::mem::take(&mut next.work);
        pipe.flight = Some(InFlight {
            task: AbortOnDropHandle::new(tokio::spawn(async move { relay.publish(work).await })),
            last,
            timing,
            started: Instant::now(),
            landed: None,
        });
        Ok(Turn::Again)
    }

    /// Prepares the next cycle on `pg`: removes relayed rows, then opens the cycle's
    /// transaction, loads the rows assigned earlier and not acknowledged (minus those
    /// `in_flight`: per stream, the last seq of the cycle being published) and assigns seqs to
    /// new rows. The transaction is left open: the caller records the cycle in flight in it and
    /// commits.
    async fn prepare<'c>(
        &self,
        pg: &'c mut tokio_postgres::Client,
        in_flight: &BTreeMap<String, u64>,
        missing: &BTreeMap<String, Instant>,
    ) -> Result<Prepared<'c>, OutboxError> {
        let t = Instant::now();
        self.remove_relayed(pg).await?;
        let remove = t.elapsed();
        let t = Instant::now();
        let tx = pg.transaction().await.map_err(|e| self.pg_err(e))?;
        let mut work = self.load_unpublished(&tx, in_flight).await?;
        // Streams with rows assigned but not acknowledged (after a crash or a failed publish)
        // continue with exactly those rows, in seq order; their newly assigned rows wait for a
        // later cycle so that no seq overtakes an unpublished one. Other streams are not held
        // back by a stream that keeps failing.
        let blocked: BTreeSet<String> = work.iter().map(|r| r.stream.clone()).collect();
        if !work.is_empty() {
            tracing::info!(
                rows = work.len(),
                "publishing rows assigned but not yet acknowledged (duplicates expected after a crash)"
            );
        }
        let (fresh, full, missing) = self.assign(&tx, self.opts.batch_size, missing).await?;
        work.extend(fresh.iter().filter(|r| !blocked.contains(&r.stream)).cloned());
        Ok(Prepared { tx, work, fresh, blocked, full, missing, remove, assign: t.elapsed() })
    }

    /// The top-up of `next` (see the module docs): in its open transaction, rows committed since
    /// it was prepared get the seqs after those it assigned, in one statement ([`Relay::assign_known`])
    /// sent with the progress of the cycle that landed (`outcomes`, [`Relay::record`]), without
    /// waiting for its answer in between; the topped-up rows go out with `next`. At most
    /// `batch_size` rows in all.
    async fn top_up_and_record(
        &self,
        next: &mut Prepared<'_>,
        outcomes: &BTreeMap<String, StreamOutcome>,
    ) -> Result<(), OutboxError> {
        let room = self.opts.batch_size.saturating_sub(next.fresh.len());
        if next.full || room == 0 {
            return self.record(&next.tx, outcomes).await;
        }
        // Sent in this order on the one connection, so PostgreSQL runs them in this order.
        let ((more, full), ()) =
            futures::future::try_join(self.assign_known(&next.tx, room), self.record(&next.tx, outcomes)).await?;
        if more.is_empty() {
            return Ok(());
        }
        next.full = full;
        next.work.extend(more.iter().filter(|r| !next.blocked.contains(&r.stream)).cloned());
        next.fresh.extend(more);
        // Per stream in seq order: a stream's topped-up rows follow its rows assigned before.
        next.work.sort_by(|a, b| (&a.stream, a.seq).cmp(&(&b.stream, b.seq)));
        next.fresh.sort_by(|a, b| (&a.stream, a.seq).cmp(&(&b.stream, b.seq)));
        Ok(())
    }

    /// The assignment of [`Relay::assign`] in one statement (one round trip), for streams that
    /// already have a progress row: of the oldest `limit` rows without a seq, those of such
    /// streams get the next seqs of their streams, in id order; rows of a stream seen for the
    /// first time are left to the next [`Relay::assign`]. Returns the rows assigned, per stream
    /// in seq order, and whether `limit` rows were assigned (more may be waiting).
    async fn assign_known(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        limit: usize,
    ) -> Result<(Vec<Row>, bool), OutboxError> {
        let (t, p) = (&self.opts.table, &self.progress);
        let sql = format!(
            "WITH pending AS (SELECT id, stream, payload FROM {t} WHERE seq IS NULL ORDER BY id LIMIT $1),
             picked AS (SELECT o.id, o.stream, o.payload, row_number() OVER (PARTITION BY o.stream ORDER BY o.id) AS rn
                        FROM pending o WHERE EXISTS (SELECT 1 FROM {p} WHERE {p}.stream = o.stream)),
             counts AS (SELECT stream, count(*) AS n FROM picked GROUP BY stream),
             prog AS (UPDATE {p} SET assigned_seq = {p}.assigned_seq + c.n, updated_at = now()
                      FROM counts c WHERE {p}.stream = c.stream
                      RETURNING {p}.stream, {p}.assigned_seq - c.n AS base),
             upd AS (UPDATE {t} SET seq = g.base + k.rn FROM picked k JOIN prog g ON g.stream = k.stream
                     WHERE {t}.id = k.id)
             SELECT k.stream, g.base + k.rn, k.payload FROM picked k JOIN prog g ON g.stream = k.stream
             ORDER BY 1, 2"
        );
        let rows = tx.query_typed(&sql, &[(&(limit as i64), Type::INT8)]).await.map_err(|e| self.pg_err(e))?;
        let full = rows.len() >= limit;
        let rows: Vec<Row> = rows.into_iter().map(|r| Row::from_columns(&r)).collect();
        debug_assert!(rows.windows(2).all(|w| w[0].stream != w[1].stream || w[1].seq == w[0].seq + 1));
        Ok((rows, full))
    }

    /// Counts the outcomes of a cycle that landed in the metrics and logs; a stream refused for
    /// good rests in `resting` for a poll interval. Returns the rows acknowledged and the first
    /// error.
    fn report(&self, f: InFlight, resting: &mut BTreeMap<String, Instant>) -> (usize, Option<OutboxError>) {
        let table = self.opts.table.clone();
        let mut acked = 0usize;
        let mut first_error = None;
        for (stream, o) in f.landed.map(|l| l.0).unwrap_or_default() {
            acked += o.acked_rows as usize;
            self.acked_since_removal.fetch_add(o.acked_rows, std::sync::atomic::Ordering::Relaxed);
            metrics::counter!("runnev_outbox_relayed_total", "table" => table.clone()).increment(o.acked_rows);
            metrics::counter!("runnev_outbox_publish_requests_total", "table" => table.clone()).increment(o.requests);
            metrics::counter!("runnev_outbox_duplicates_total", "table" => table.clone()).increment(o.duplicates);
            if o.duplicates > 0 {
                tracing::info!(table = %table, stream = %stream, duplicates = o.duplicates,
                    "the cluster already had these rows (answered duplicate: true): a retry after a crash");
            }
            if let Some(e) = o.error {
                tracing::warn!(table = %table, stream = %stream, error = %e, "publishing stopped for this stream");
                if matches!(e, OutboxError::Stuck { .. }) {
                    resting.insert(stream, Instant::now() + self.opts.poll);
                }
                first_error.get_or_insert(e);
            }
        }
        (acked, first_error)
    }

    /// Rows with seq above both published_seq and the stream's last seq `in_flight` (assigned,
    /// not known to be acknowledged, not being published), at most `batch_size` per stream, per
    /// stream in seq order.
    async fn load_unpublished(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        in_flight: &BTreeMap<String, u64>,
    ) -> Result<Vec<Row>, OutboxError> {
        let (t, p) = (&self.opts.table, &self.progress);
        let sql = format!(
            "SELECT o.stream, o.seq, o.payload FROM {p} p
               LEFT JOIN unnest($2::text[], $3::int8[]) AS f(stream, seq) ON f.stream = p.stream
               CROSS JOIN LATERAL (SELECT stream, seq, payload FROM {t} o
                                   WHERE o.stream = p.stream AND o.seq > GREATEST(p.published_seq, f.seq)
                                   ORDER BY o.seq LIMIT $1) o
             ORDER BY o.stream, o.seq"
        );
        let (names, seqs): (Vec<&str>, Vec<i64>) = in_flight.iter().map(|(s, q)| (s.as_str(), *q as i64)).unzip();
        let rows = tx
            .query_typed(
                &sql,
                &[(&(self.opts.batch_size as i64), Type::INT8), (&names, Type::TEXT_ARRAY), (&seqs, Type::INT8_ARRAY)],
            )
            .await
            .map_err(|e| self.pg_err(e))?;
        Ok(rows.into_iter().map(|r| Row::from_columns(&r)).collect())
    }

    /// The assignment, inside the cycle's transaction `tx`: the oldest `limit` rows
    /// without a seq, other than those of the streams in `missing`, get the next seqs of their
    /// streams (committed by the caller before any of them is published). Returns those rows,
    /// per stream in seq order, whether the batch was full (more rows may be waiting), and the
    /// streams newly found not to exist (their rows keep no seq).
    async fn assign(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        limit: usize,
        missing: &BTreeMap<String, Instant>,
    ) -> Result<(Vec<Row>, bool, Vec<String>), OutboxError> {
        let (t, p) = (&self.opts.table, &self.progress);
        let skip: Vec<&str> = missing.keys().map(String::as_str).collect();
        let rows = tx
            .query_typed(
                &format!(
                    "SELECT id, stream, payload FROM {t} WHERE seq IS NULL AND stream <> ALL($2) ORDER BY id LIMIT $1"
                ),
                &[(&(limit as i64), Type::INT8), (&skip, Type::TEXT_ARRAY)],
            )
            .await
            .map_err(|e| self.pg_err(e))?;
        if rows.is_empty() {
            return Ok((Vec::new(), false, Vec::new()));
        }
        let full = rows.len() >= limit;
        let mut streams: Vec<String> = rows.iter().map(|r| r.get::<_, String>(1)).collect();
        streams.sort();
        streams.dedup();
        let mut next: BTreeMap<String, u64> = tx
            .query_typed(
                &format!("SELECT stream, assigned_seq FROM {p} WHERE stream = ANY($1) FOR UPDATE"),
                &[(&streams, Type::TEXT_ARRAY)],
            )
            .await
            .map_err(|e| self.pg_err(e))?
            .into_iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .collect();
        let mut absent = Vec::new();
        for s in &streams {
            if next.contains_key(s) {
                continue;
            }
            let Some(last) = self.first_seen(s).await? else {
                absent.push(s.clone());
                continue;
            };
            tx.execute(
                &format!(
                    "INSERT INTO {p} (stream, assigned_seq, published_seq) VALUES ($1, $2, $2) ON CONFLICT DO NOTHING"
                ),
                &[s, &(last as i64)],
            )
            .await
            .map_err(|e| self.pg_err(e))?;
            tracing::info!(stream = %s, after_seq = last, "first row for this stream: its seqs continue after the stream's last seq");
            next.insert(s.clone(), last);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut seqs = Vec::with_capacity(rows.len());
        let mut work = Vec::with_capacity(rows.len());
        for r in rows {
            let stream: String = r.get(1);
            if absent.contains(&stream) {
                continue;
            }
            let n = next.get_mut(&stream).ok_or_else(|| OutboxError::Config(format!("stream {stream} vanished")))?;
            *n += 1;
            ids.push(r.get::<_, i64>(0));
            seqs.push(*n as i64);
            work.push(Row { stream, seq: *n, payload: Bytes::from(r.get::<_, Vec<u8>>(2)) });
        }
        tx.execute_typed(
            &format!(
                "UPDATE {t} SET seq = v.seq FROM unnest($1::int8[], $2::int8[]) AS v(id, seq) WHERE {t}.id = v.id"
            ),
            &[(&ids, Type::INT8_ARRAY), (&seqs, Type::INT8_ARRAY)],
        )
        .await
        .map_err(|e| self.pg_err(e))?;
        let (names, tops): (Vec<String>, Vec<i64>) = next.into_iter().map(|(s, n)| (s, n as i64)).unzip();
        tx.execute_typed(
            &format!(
                "UPDATE {p} SET assigned_seq = v.seq, updated_at = now()
                 FROM unnest($1::text[], $2::int8[]) AS v(stream, seq) WHERE {p}.stream = v.stream"
            ),
            &[(&names, Type::TEXT_ARRAY), (&tops, Type::INT8_ARRAY)],
        )
        .await
        .map_err(|e| self.pg_err(e))?;
        work.sort_by(|a, b| (&a.stream, a.seq).cmp(&(&b.stream, b.seq)));
        Ok((work, full, absent))
    }

    /// The last seq of a stream the relay has not seen before (creating it if allowed); `None`
    /// if it does not exist and the relay may not create it.
    async fn first_seen(&self, stream: &str) -> Result<Option<u64>, OutboxError> {
        match self.client.stream(stream).await {
            Ok(info) => Ok(Some(info.last_seq)),
            Err(e) if e.code() == Some("stream_not_found") && self.opts.create_streams => {
                let (info, _) = self.client.put_stream(stream, None).await?;
                Ok(Some(info.last_seq))
            }
            Err(e) if e.code() == Some("stream_not_found") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes each stream's rows in seq order, up to `concurrency` streams at once.
    async fn publish(&self, work: Vec<Row>) -> BTreeMap<String, StreamOutcome> {
        let mut by_stream: BTreeMap<String, Vec<Row>> = BTreeMap::new();
        for r in work {
            by_stream.entry(r.stream.clone()).or_default().push(r);
        }
        let tasks = by_stream.into_iter().map(|(stream, rows)| async move {
            let o = self.publish_stream(&stream, rows).await;
            (stream, o)
        });
        futures::stream::iter(tasks).buffer_unordered(self.opts.concurrency).collect().await
    }

    /// Publishes one stream's rows (seq order) as frames requests, each starting at its first
    /// row's seq, stopping at the first failure. Every answer that names a frame is handled
    /// by what it says about the frames before it (SPEC §6: nothing of a refused request is
    /// written):
    /// - `partial_duplicate`, frame k: frames `0..k` are stored → acknowledged; resend from k.
    /// - `seq_not_increasing` / `seq_conflict`, frame k > 0: the frames before it are resent
    ///   alone (answered duplicate or stored), and the next request meets the taken seq at
    ///   frame 0, which hands the rows from there to reassignment.
    /// - `seq_evicted`, frame k: frames `0..=k` were stored and since evicted (see below).
    /// - `payload_too_large` without a frame: the cluster's `--max-append-bytes` is below ours;
    ///   the request is halved. With frame k > 0, the frames before it are sent alone.
    async fn publish_stream(&self, stream: &str, rows: Vec<Row>) -> StreamOutcome {
        let mut o = StreamOutcome::default();
        let mut recreated = false;
        let mut max_bytes = self.opts.max_append_bytes;
        // An upper bound on the next request's end (exclusive), after an answer named a frame.
        let mut cap: Option<usize> = None;
        let mut i = 0;
        while i < rows.len() {
            let end = request_end(&rows, i, max_bytes, cap.unwrap_or(rows.len()));
            let chunk = &rows[i..end];
            let first = chunk[0].seq;
            let payloads: Vec<&[u8]> = chunk.iter().map(|r| r.payload.as_ref()).collect();
            o.requests += 1;
            let answer = self.client.publish_many(stream, Some(first), &payloads).await;
            let frame = |e: &ClientError| match e {
                ClientError::Api { frame: Some(k), .. } if (*k as usize) < chunk.len() => Some(*k as usize),
                _ => None,
            };
            match answer {
                Ok(ack) => {
                    self.acknowledge(&mut o, stream, chunk, ack.duplicate);
                    i = end;
                    cap = None;
                }
                Err(e) if e.code() == Some("partial_duplicate") => match frame(&e) {
                    Some(k) if k > 0 => {
                        tracing::info!(stream, first, stored = k, "the cluster had the first frames of this request (a retry after a crash); resending from the first new one");
                        self.acknowledge(&mut o, stream, &chunk[..k], true);
                        i += k;
                        cap = None;
                    }
                    _ => {
                        o.error = Some(self.protocol(stream, &e));
                        break;
                    }
                },
                Err(e) if matches!(e.code(), Some("seq_not_increasing") | Some("seq_conflict")) => match frame(&e) {
                    Some(k) if k > 0 => cap = Some(i + k),
                    Some(_) => {
                        // No batch of this row is stored (the cluster would have answered
                        // duplicate), and nothing after it in this stream.
                        o.taken = Some(first);
                        match self.client.stream(stream).await {
                            Ok(info) => o.last_seq = info.last_seq,
                            Err(e2) => {
                                o.taken = None;
                                o.error = Some(e2.into());
                            }
                        }
                        tracing::warn!(stream, seq = first, error = %e, "another publisher took this seq; the stream's unpublished rows get new seqs");
                        break;
                    }
                    None => {
                        o.error = Some(self.protocol(stream, &e));
                        break;
                    }
                },
                Err(e) if e.code() == Some("stream_not_found") && self.opts.create_streams && !recreated => {
                    tracing::warn!(stream, "stream was deleted; creating it again");
                    recreated = true;
                    if let Err(e) = self.client.put_stream(stream, None).await {
                        o.error = Some(e.into());
                        break;
                    }
                }
                Err(e) if e.code() == Some("seq_evicted") => match frame(&e) {
                    Some(k) => {
                        // seq <= evicted_through: a batch with a seq at or above it was stored,
                        // and as the streams' only publisher, publishing in seq order, the relay
                        // stored this one (and the frames before it) earlier; retention has
                        // since evicted it.
                        tracing::warn!(
                            stream,
                            seq = chunk[k].seq,
                            "already published and since evicted by retention; counted as relayed"
                        );
                        self.acknowledge(&mut o, stream, &chunk[..=k], true);
                        i += k + 1;
                        cap = None;
                    }
                    None => {
                        o.error = Some(self.protocol(stream, &e));
                        break;
                    }
                },
                Err(e) if e.code() == Some("payload_too_large") && chunk.len() > 1 => match frame(&e) {
                    Some(0) => {
                        o.error = Some(OutboxError::Stuck { stream: stream.to_string(), seq: first, source: e });
                        break;
                    }
                    Some(k) => cap = Some(i + k),
                    None => {
                        max_bytes = (chunk_bytes(chunk) / 2).max(4);
                        tracing::warn!(
                            stream,
                            max_bytes,
                            "the cluster refused the request size; sending smaller requests"
                        );
                    }
                },
                Err(e @ ClientError::Api { .. }) if e.code() != Some("stream_not_found") => {
                    let seq = frame(&e).map_or(first, |k| chunk[k].seq);
                    o.error = Some(OutboxError::Stuck { stream: stream.to_string(), seq, source: e });
                    break;
                }
                Err(e) => {
                    o.error = Some(e.into());
                    break;
                }
            }
        }
        o
    }

    /// Counts `rows` of `stream` as acknowledged in `o` and tells the observer.
    fn acknowledge(&self, o: &mut StreamOutcome, stream: &str, rows: &[Row], duplicate: bool) {
        o.acknowledge(rows, duplicate);
        if let Some(obs) = &self.opts.observer {
            obs.acknowledged(stream, &rows.iter().map(|r| (r.seq, r.payload.as_ref())).collect::<Vec<_>>());
        }
    }

    /// An answer that breaks SPEC §6 (a frame index missing or out of range).
    fn protocol(&self, stream: &str, e: &ClientError) -> OutboxError {
        OutboxError::Cluster(ClientError::Protocol {
            node: stream.to_string(),
            what: format!("a frames publish was answered {e} without a usable frame index"),
        })
    }

    /// The progress transaction: published_seq per stream; rows whose seq another publisher
    /// took go back to `seq IS NULL`.
    async fn record(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        outcomes: &BTreeMap<String, StreamOutcome>,
    ) -> Result<(), OutboxError> {
        let (t, p) = (&self.opts.table, &self.progress);
        let (mut names, mut acked) = (Vec::new(), Vec::new());
        for (s, o) in outcomes {
            if let Some(a) = o.acked {
                names.push(s.clone());
                acked.push(a as i64);
            }
        }
        if !names.is_empty() {
            tx.execute_typed(
                &format!(
                    "UPDATE {p} SET published_seq = GREATEST(published_seq, v.seq), updated_at = now()
                     FROM unnest($1::text[], $2::int8[]) AS v(stream, seq) WHERE {p}.stream = v.stream"
                ),
                &[(&names, Type::TEXT_ARRAY), (&acked, Type::INT8_ARRAY)],
            )
            .await
            .map_err(|e| self.pg_err(e))?;
        }
        for (s, o) in outcomes {
            let Some(taken) = o.taken else { continue };
            let n = tx
                .execute(&format!("UPDATE {t} SET seq = NULL WHERE stream = $1 AND seq >= $2"), &[s, &(taken as i64)])
                .await
                .map_err(|e| self.pg_err(e))?;
            let after = o.last_seq.max(taken) as i64;
            tx.execute(
                &format!(
                    "UPDATE {p} SET assigned_seq = GREATEST($2, published_seq), updated_at = now() WHERE stream = $1"
                ),
                &[s, &after],
            )
            .await
            .map_err(|e| self.pg_err(e))?;
            metrics::counter!("runnev_outbox_reassigned_total", "table" => t.clone()).increment(n);
        }
        Ok(())
    }
}

/// Creates the outbox schema for `table` ([`super::outbox_schema`]) if missing, under a
/// transaction-level advisory lock so that relays starting together do not race on the DDL.
///
/// Errors: [`OutboxError::Config`] for a bad table name; [`OutboxError::Postgres`] when a
/// statement fails (e.g. permission denied).
pub async fn init_schema(pg: &tokio_postgres::Client, table: &str) -> Result<(), OutboxError> {
    let ddl = super::outbox_schema(table)?;
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('runnev-outbox-schema:{table}', 0));
         SET LOCAL client_min_messages = warning; {ddl}; COMMIT;"
    );
    pg.batch_execute(&sql).await.map_err(OutboxError::Postgres)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(seqs: impl IntoIterator<Item = u64>, len: usize) -> Vec<Row> {
        seqs.into_iter().map(|seq| Row { stream: "s".into(), seq, payload: Bytes::from(vec![0u8; len]) }).collect()
    }

    #[test]
    fn a_request_stops_at_the_byte_limit_counting_frame_headers() {
        let r = rows(1..=10, 96); // 100 bytes per frame
        assert_eq!(request_end(&r, 0, 1000, r.len()), 10);
        assert_eq!(request_end(&r, 0, 999, r.len()), 9);
        assert_eq!(request_end(&r, 3, 250, r.len()), 5);
        // A row larger than the limit still goes alone (the cluster refuses it, or not).
        assert_eq!(request_end(&r, 0, 10, r.len()), 1);
    }

    #[test]
    fn a_request_stops_at_a_seq_gap_and_at_the_cap() {
        let r = rows([1, 2, 3, 7, 8], 1);
        assert_eq!(request_end(&r, 0, usize::MAX, r.len()), 3);
        assert_eq!(request_end(&r, 3, usize::MAX, r.len()), 5);
        assert_eq!(request_end(&r, 0, usize::MAX, 2), 2);
    }

    #[test]
    fn a_request_carries_at_most_the_frames_limit() {
        let n = crate::limits::FRAMES_PER_APPEND_MAX as u64 + 5;
        let r = rows(1..=n, 0);
        assert_eq!(request_end(&r, 0, usize::MAX, r.len()), crate::limits::FRAMES_PER_APPEND_MAX);
        assert_eq!(request_end(&r, crate::limits::FRAMES_PER_APPEND_MAX, usize::MAX, r.len()), r.len());
    }

    #[tokio::test]
    async fn a_stream_not_acknowledged_through_its_last_seq_stopped_short() {
        let mut f = InFlight {
            task: AbortOnDropHandle::new(tokio::spawn(async {
                let mut done = BTreeMap::new();
                let mut whole = StreamOutcome::default();
                whole.acknowledge(&rows(1..=3, 1), false);
                let mut part = StreamOutcome::default();
                part.acknowledge(&rows(4..=5, 1), false);
                done.insert("whole".to_string(), whole);
                done.insert("part".to_string(), part);
                done
            })),
            last: BTreeMap::from([("whole".to_string(), 3), ("part".to_string(), 7), ("lost".to_string(), 2)]),
            timing: CycleTiming::default(),
            started: Instant::now(),
            landed: None,
        };
        // Before it lands, nothing is known to be acknowledged.
        assert_eq!(f.stopped_short().len(), 3);
        f.land().await;
        let short: Vec<String> = f.stopped_short().into_iter().collect();
        assert_eq!(short, ["lost", "part"], "part stopped at 5 of 7; lost has no outcome");
    }

    #[test]
    fn acknowledged_rows_move_the_acked_seq_and_count_duplicates() {
        let r = rows(5..=9, 1);
        let mut o = StreamOutcome::default();
        o.acknowledge(&r[..3], true);
        o.acknowledge(&r[3..], false);
        assert_eq!((o.acked, o.acked_rows, o.duplicates), (Some(9), 5, 3));
    }
}
