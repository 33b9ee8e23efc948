//! `runnev bench outbox`: the transactional outbox end to end. Writers insert rows through real
//! PostgreSQL transactions, the outbox relay publishes them to a three-node cluster this mode
//! starts, one PostgreSQL sink per stream applies them back (the default bulk path); it reports
//! rows/s at each stage, commit → sink latency percentiles and the outbox table's size.
//!
//! The latency is also split into stages, each row stamped as it goes: the writer's INSERT and
//! COMMIT, the relay's assignment (committed) and the cluster's acknowledgement (through
//! [`RelayObserver`]), the sink's `Apply` and its commit (through [`Apply::committed`]); each
//! stage's percentiles are over the rows, so the slowest stage is shown, not guessed. A row
//! assigned before its writer saw its COMMIT return has no "committed → assigned" sample.
//!
//! Two phases: a **backlog** (`--backlog` rows inserted before the relay starts; the time it
//! takes to drain them is the relay's capacity), then a **steady** run (`--rate` rows/s for
//! `--duration`), where the latency and the table size are measured.
//!
//! Owns: the writers, the latency stamps and the summary. Must never: relay or apply by itself
//! (that is [`runnev::outbox`]'s relay and sink, run in this process on their library API).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use futures::FutureExt;
use runnev::client::{Batch, Client};
use runnev::launcher::LocalCluster;
use runnev::outbox::relay::{CycleTiming, Relay, RelayObserver, RelayOptions};
use runnev::outbox::sink::{Apply, BulkApply, Sink, SinkOptions};

use crate::cluster::{parse_size, run_on_own, BenchError, OwnCluster, Ticker};
use crate::stats::Latencies;

/// Flags of `runnev bench outbox`.
#[derive(Debug, Clone, clap::Args)]
pub struct OutboxArgs {
    /// PostgreSQL URL, postgres://USER:PASSWORD@HOST:PORT/DB (`scripts/postgres url` prints one).
    #[arg(long, env = "RUNNEV_POSTGRES_URL", hide_env_values = true)]
    pub postgres: String,
    /// Streams the rows are spread over (round robin), each with its own sink.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Rows per second the writers commit in the steady phase, all streams together (0: as fast
    /// as they can).
    #[arg(long, default_value_t = 2500)]
    pub rate: u64,
    /// Length of the steady phase (e.g. 2m, 10m).
    #[arg(long, default_value = "2m", value_parser = runnev::units::parse_duration)]
    pub duration: Duration,
    /// Payload size of a row (e.g. 1KiB).
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    pub row_size: u64,
    /// Rows inserted before the relay starts; the time to drain them is the relay's capacity
    /// (0: no backlog phase).
    #[arg(long, default_value_t = 100_000)]
    pub backlog: u64,
    /// Concurrent writers (one PostgreSQL connection each).
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Rows each writer transaction inserts.
    #[arg(long, default_value_t = 10)]
    pub rows_per_tx: usize,
    /// The relay's --batch-size (rows per cycle).
    #[arg(long, default_value_t = 5000)]
    pub batch_size: usize,
    /// The relay's --max-append-bytes (largest publish request).
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub max_append_bytes: u64,
    /// Print the summary as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// The cluster this benchmark starts.
    #[command(flatten)]
    pub cluster: OwnCluster,
}

/// Microseconds since the Unix epoch.
fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// A row's payload: the writer's clock just before COMMIT (µs since the epoch, 8 bytes big
/// endian), padded to `size`.
fn row_payload(size: usize, stamp_us: u64) -> Vec<u8> {
    let mut p = vec![b'x'; size.max(8)];
    p[..8].copy_from_slice(&stamp_us.to_be_bytes());
    p
}

/// The stamp a writer put in a row's payload (µs since the epoch), if the payload has one.
fn stamp_of(payload: &[u8]) -> Option<u64> {
    payload.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes)
}

/// When one row was committed and the relay handled it (µs since the epoch), kept from its
/// assignment until a sink commits it.
#[derive(Debug, Default, Clone, Copy)]
struct RowStamps {
    committed: Option<u64>,
    assigned: Option<u64>,
    acked: Option<u64>,
}

/// Percentiles of one stage, in ms.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Percentiles {
    samples: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Percentiles {
    fn of(l: &mut Latencies) -> Percentiles {
        Percentiles {
            samples: l.len(),
            p50: l.ms(0.5),
            p90: l.ms(0.9),
            p99: l.ms(0.99),
            p999: l.ms(0.999),
            max: l.ms(1.0),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"samples": self.samples, "p50": self.p50, "p90": self.p90, "p99": self.p99,
                           "p999": self.p999, "max": self.max})
    }
}

/// The stages a row goes through, in order; each sample is the time between two stamps of the
/// same row (µs).
#[derive(Debug, Default)]
struct Stages {
    /// Rows assigned or acknowledged while measuring and not yet committed by a sink.
    rows: HashMap<(String, u64), RowStamps>,
    /// Writer's stamp → when its COMMIT returned (µs), for rows not yet assigned.
    committed: HashMap<u64, u64>,
    /// Writer's stamp (just before its INSERT) → its COMMIT returned: the writer's own latency.
    writer_commit: Latencies,
    /// COMMIT returned → the relay's assignment transaction committed (the relay's wait for a
    /// cycle and the assignment).
    commit_to_assigned: Latencies,
    /// Assigned → the cluster acknowledged the publish request carrying the row.
    assigned_to_acked: Latencies,
    /// Acknowledged → a sink's `Apply` runs on it (subscription delivery, the sink's queue,
    /// its transaction's cursor lock).
    acked_to_sink: Latencies,
    /// The sink's `Apply` → its transaction committed (insert, cursor update, commit).
    sink_to_commit: Latencies,
    /// Writer's stamp → the sink's commit: the end-to-end latency.
    end_to_end: Latencies,
    /// The writer's COMMIT returned → the sink's commit.
    commit_to_sink: Latencies,
    /// Relay cycles (those that moved rows): rows, and each phase's duration in µs.
    cycle_rows: Vec<u64>,
    cycle_remove: Latencies,
    cycle_assign: Latencies,
    cycle_publish: Latencies,
    cycle_record: Latencies,
}

/// What [`Stages`] reports: each stage's percentiles and the relay's cycles.
#[derive(Debug, Default, Clone)]
struct StageSummary {
    writer_commit: Percentiles,
    commit_to_assigned: Percentiles,
    assigned_to_acked: Percentiles,
    acked_to_sink: Percentiles,
    sink_to_commit: Percentiles,
    end_to_end: Percentiles,
    commit_to_sink: Percentiles,
    cycles: usize,
    cycle_rows_p50: u64,
    cycle_rows_max: u64,
    cycle_remove: Percentiles,
    cycle_assign: Percentiles,
    cycle_publish: Percentiles,
    cycle_record: Percentiles,
}

impl Stages {
    fn summary(&mut self) -> StageSummary {
        self.cycle_rows.sort_unstable();
        StageSummary {
            writer_commit: Percentiles::of(&mut self.writer_commit),
            commit_to_assigned: Percentiles::of(&mut self.commit_to_assigned),
            assigned_to_acked: Percentiles::of(&mut self.assigned_to_acked),
            acked_to_sink: Percentiles::of(&mut self.acked_to_sink),
            sink_to_commit: Percentiles::of(&mut self.sink_to_commit),
            end_to_end: Percentiles::of(&mut self.end_to_end),
            commit_to_sink: Percentiles::of(&mut self.commit_to_sink),
            cycles: self.cycle_rows.len(),
            cycle_rows_p50: crate::stats::percentile(&self.cycle_rows, 0.5).unwrap_or(0),
            cycle_rows_max: crate::stats::percentile(&self.cycle_rows, 1.0).unwrap_or(0),
            cycle_remove: Percentiles::of(&mut self.cycle_remove),
            cycle_assign: Percentiles::of(&mut self.cycle_assign),
            cycle_publish: Percentiles::of(&mut self.cycle_publish),
            cycle_record: Percentiles::of(&mut self.cycle_record),
        }
    }
}

/// The relay's observer: stamps each row's assignment and acknowledgement, and each cycle's
/// phases, while the steady phase is measured.
#[derive(Debug)]
struct RelayStamps {
    stages: Arc<Mutex<Stages>>,
    measure: Arc<AtomicBool>,
}

impl RelayStamps {
    /// The clock (µs since the epoch) and the stages, while the steady phase is measured.
    fn stamp(&self) -> Option<(u64, std::sync::MutexGuard<'_, Stages>)> {
        self.measure.load(Ordering::Relaxed).then(|| (now_us(), self.stages.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

impl RelayObserver for RelayStamps {
    fn assigned(&self, stream: &str, rows: &[(u64, &[u8])]) {
        let Some((now, mut st)) = self.stamp() else { return };
        for (seq, payload) in rows {
            let committed = stamp_of(payload).and_then(|stamp| st.committed.get(&stamp).copied());
            if let Some(c) = committed {
                st.commit_to_assigned.record_us(now.saturating_sub(c));
            }
            let r = st.rows.entry((stream.to_string(), *seq)).or_default();
            r.assigned = Some(now);
            r.committed = committed;
        }
    }

    fn acknowledged(&self, stream: &str, rows: &[(u64, &[u8])]) {
        let Some((now, mut st)) = self.stamp() else { return };
        for (seq, _) in rows {
            let r = st.rows.entry((stream.to_string(), *seq)).or_default();
            r.acked = Some(now);
            if let Some(a) = r.assigned {
                st.assigned_to_acked.record_us(now.saturating_sub(a));
            }
        }
    }

    fn cycle(&self, t: &CycleTiming) {
        let Some((_, mut st)) = self.stamp() else { return };
        let us = |d: Duration| d.as_micros() as u64;
        st.cycle_rows.push(t.rows as u64);
        st.cycle_remove.record_us(us(t.remove));
        st.cycle_assign.record_us(us(t.assign));
        st.cycle_publish.record_us(us(t.publish));
        st.cycle_record.record_us(us(t.record));
    }
}

/// The sink's bulk path, stamping each batch when it is applied and again when its transaction
/// commits (see [`Stages`]).
struct Stamped {
    bulk: BulkApply,
    stages: Arc<Mutex<Stages>>,
    applied: Arc<AtomicU64>,
    measure: Arc<AtomicBool>,
    /// Batches applied in the open transaction: seq → (writer's stamp, applied at), µs. A
    /// batch applied again after a failed transaction replaces its entry.
    pending: BTreeMap<u64, (u64, u64)>,
    /// Batches applied in the open transaction, measured or not.
    uncommitted: u64,
}

impl Apply for Stamped {
    fn apply<'a>(
        &'a mut self,
        tx: &'a tokio_postgres::Transaction<'a>,
        stream: &'a str,
        batches: &'a [Batch],
    ) -> BoxFuture<'a, Result<(), tokio_postgres::Error>> {
        async move {
            let now = now_us();
            self.uncommitted += batches.len() as u64;
            if self.measure.load(Ordering::Relaxed) {
                for b in batches {
                    if let Some(stamp) = stamp_of(&b.data) {
                        self.pending.insert(b.seq, (stamp, now));
                    }
                }
            }
            self.bulk.apply(tx, stream, batches).await
        }
        .boxed()
    }

    fn committed(&mut self, stream: &str) {
        self.applied.fetch_add(std::mem::take(&mut self.uncommitted), Ordering::Relaxed);
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return;
        }
        let now = now_us();
        let mut st = self.stages.lock().unwrap_or_else(|p| p.into_inner());
        for (seq, (stamp, applied_at)) in pending {
            st.end_to_end.record_us(now.saturating_sub(stamp));
            st.sink_to_commit.record_us(now.saturating_sub(applied_at));
            st.committed.remove(&stamp);
            let r = st.rows.remove(&(stream.to_string(), seq)).unwrap_or_default();
            if let Some(acked) = r.acked {
                st.acked_to_sink.record_us(applied_at.saturating_sub(acked));
            }
            if let Some(c) = r.committed {
                st.commit_to_sink.record_us(now.saturating_sub(c));
            }
        }
    }
}

async fn connect(url: &str) -> Result<tokio_postgres::Client, BenchError> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| BenchError::Invalid(format!("connecting to PostgreSQL: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

fn pg(e: tokio_postgres::Error) -> BenchError {
    BenchError::Cluster(format!("PostgreSQL: {e}"))
}

/// One transaction inserting `streams.len()` rows (`INSERT … SELECT FROM unnest`).
/// With `stages`, the time its COMMIT returned is kept for each row's stamp.
async fn insert(
    pg_client: &mut tokio_postgres::Client,
    table: &str,
    streams: &[String],
    size: usize,
    stages: Option<&Mutex<Stages>>,
) -> Result<(), BenchError> {
    let tx = pg_client.transaction().await.map_err(pg)?;
    let stamps: Vec<u64> = streams.iter().map(|_| now_us()).collect();
    let payloads: Vec<Vec<u8>> = stamps.iter().map(|s| row_payload(size, *s)).collect();
    tx.execute(
        &format!("INSERT INTO {table} (stream, payload) SELECT * FROM unnest($1::text[], $2::bytea[])"),
        &[&streams, &payloads],
    )
    .await
    .map_err(pg)?;
    // The stamp is taken before the insert; the commit follows at once.
    tx.commit().await.map_err(pg)?;
    if let Some(st) = stages {
        let now = now_us();
        let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
        for stamp in stamps {
            st.writer_commit.record_us(now.saturating_sub(stamp));
            st.committed.insert(stamp, now);
        }
    }
    Ok(())
}

/// Rows the relay has published, all streams (sum of `published_seq`).
async fn published(pg_client: &tokio_postgres::Client, table: &str) -> Result<u64, BenchError> {
    let row = pg_client
        .query_one(&format!("SELECT coalesce(sum(published_seq), 0)::int8 FROM {table}_progress"), &[])
        .await
        .map_err(pg)?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// `pg_total_relation_size` of the outbox table (heap, indexes, TOAST), in bytes.
async fn table_bytes(pg_client: &tokio_postgres::Client, table: &str) -> Result<u64, BenchError> {
    let row =
        pg_client.query_one("SELECT pg_total_relation_size($1::text::regclass)::int8", &[&table]).await.map_err(pg)?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// Waits until `published` reaches `target`; returns the time it took.
async fn wait_published(
    pg_client: &tokio_postgres::Client,
    table: &str,
    target: u64,
    timeout: Duration,
) -> Result<Duration, BenchError> {
    let t = Instant::now();
    loop {
        let p = published(pg_client, table).await?;
        if p >= target {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            return Err(BenchError::Cluster(format!("the relay published {p} of {target} rows in {timeout:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the run measured.
#[derive(Debug, Default)]
struct Summary {
    streams: usize,
    row_bytes: u64,
    backlog_rows: u64,
    backlog_relay_rows_per_s: f64,
    steady_secs: f64,
    written_rows_per_s: f64,
    relayed_rows_per_s: f64,
    sunk_rows_per_s: f64,
    stages: StageSummary,
    table_bytes_start: u64,
    table_bytes_max: u64,
    table_bytes_end: u64,
    load_average: String,
}

impl Summary {
    fn table(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let st = &self.stages;
        let e = st.end_to_end;
        let line = |name: &str, p: &Percentiles| {
            format!("  {name:<34} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}\n", p.p50, p.p90, p.p99, p.p999, p.max)
        };
        let mut out = format!(
            "outbox bench: {} stream(s), {} B rows\n\
             backlog:  {} rows relayed at {:.0} rows/s\n\
             steady:   {:.0} s; written {:.0} rows/s, relayed {:.0} rows/s, sunk {:.0} rows/s\n\
             commit → sink latency (ms, writer's INSERT → sink's commit): p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n\
             stages (ms, each row)                    p50      p90      p99    p99.9      max\n",
            self.streams,
            self.row_bytes,
            self.backlog_rows,
            self.backlog_relay_rows_per_s,
            self.steady_secs,
            self.written_rows_per_s,
            self.relayed_rows_per_s,
            self.sunk_rows_per_s,
            e.p50,
            e.p90,
            e.p99,
            e.p999,
            e.max,
        );
        out += &line("writer: INSERT + COMMIT", &st.writer_commit);
        out += &line("committed → assigned (relay)", &st.commit_to_assigned);
        out += &line("assigned → acked (cluster)", &st.assigned_to_acked);
        out += &line("acked → sink applies", &st.acked_to_sink);
        out += &line("sink applies → sink commit", &st.sink_to_commit);
        out += &line("COMMIT returned → sink commit", &st.commit_to_sink);
        out += &format!(
            "relay cycles: {}, rows per cycle p50 {} max {}; phase ms p50/p99/max: remove {:.1}/{:.1}/{:.1}, \
             assign {:.1}/{:.1}/{:.1}, publish {:.1}/{:.1}/{:.1}, record {:.1}/{:.1}/{:.1}\n",
            st.cycles,
            st.cycle_rows_p50,
            st.cycle_rows_max,
            st.cycle_remove.p50,
            st.cycle_remove.p99,
            st.cycle_remove.max,
            st.cycle_assign.p50,
            st.cycle_assign.p99,
            st.cycle_assign.max,
            st.cycle_publish.p50,
            st.cycle_publish.p99,
            st.cycle_publish.max,
            st.cycle_record.p50,
            st.cycle_record.p99,
            st.cycle_record.max,
        );
        out += &format!(
            "outbox table (pg_total_relation_size): start {:.1} MiB, max {:.1} MiB, end {:.1} MiB\n\
             load average at the end: {}\n",
            mib(self.table_bytes_start),
            mib(self.table_bytes_max),
            mib(self.table_bytes_end),
            self.load_average,
        );
        out
    }

    fn json_line(&self) -> String {
        let st = &self.stages;
        serde_json::json!({
            "mode": "outbox",
            "streams": self.streams,
            "row_bytes": self.row_bytes,
            "backlog_rows": self.backlog_rows,
            "backlog_relay_rows_per_s": self.backlog_relay_rows_per_s,
            "steady_secs": self.steady_secs,
            "written_rows_per_s": self.written_rows_per_s,
            "relayed_rows_per_s": self.relayed_rows_per_s,
            "sunk_rows_per_s": self.sunk_rows_per_s,
            "latency_ms": st.end_to_end.json(),
            "stages_ms": {
                "writer_commit": st.writer_commit.json(),
                "commit_to_assigned": st.commit_to_assigned.json(),
                "assigned_to_acked": st.assigned_to_acked.json(),
                "acked_to_sink": st.acked_to_sink.json(),
                "sink_to_commit": st.sink_to_commit.json(),
                "commit_to_sink": st.commit_to_sink.json(),
            },
            "relay_cycles": {
                "count": st.cycles,
                "rows_p50": st.cycle_rows_p50,
                "rows_max": st.cycle_rows_max,
                "remove_ms": st.cycle_remove.json(),
                "assign_ms": st.cycle_assign.json(),
                "publish_ms": st.cycle_publish.json(),
                "record_ms": st.cycle_record.json(),
            },
            "table_bytes": {"start": self.table_bytes_start, "max": self.table_bytes_max, "end": self.table_bytes_end},
            "load_average": self.load_average,
        })
        .to_string()
    }
}

/// `runnev bench outbox`: starts the cluster, runs both phases, prints the summary.
///
/// Errors: bad flags, PostgreSQL unreachable, the cluster did not form, or the relay or the
/// sinks did not catch up within a minute after the writers stopped.
pub async fn run(a: OutboxArgs) -> Result<(), BenchError> {
    if a.streams == 0 || a.writers == 0 || a.rows_per_tx == 0 {
        return Err(BenchError::Invalid("--streams, --writers and --rows-per-tx must be at least 1".into()));
    }
    let own = a.cluster.clone();
    run_on_own(&own, "outbox", Duration::from_secs(60), async move |c: &mut LocalCluster| {
        let summary = measure(&a, c).await?;
        if a.json {
            println!("{}", summary.json_line());
        } else {
            print!("{}", summary.table());
        }
        Ok(())
    })
    .await
}

async fn measure(a: &OutboxArgs, c: &LocalCluster) -> Result<Summary, BenchError> {
    let size = a.row_size as usize;
    let table = format!("bench_outbox_{}", std::process::id());
    let consumer = format!("bench-{}", std::process::id());
    let names: Vec<String> = (0..a.streams).map(|i| format!("outbox-bench-{i}")).collect();
    let main = connect(&a.postgres).await?;
    runnev::outbox::relay::init_schema(&main, &table).await.map_err(|e| BenchError::Cluster(e.to_string()))?;
    runnev::outbox::sink::init_schema(&main).await.map_err(|e| BenchError::Cluster(e.to_string()))?;
    let client = Client::new(&c.urls())?;
    for s in &names {
        client.put_stream(s, None).await?;
    }
    let mut s = Summary { streams: a.streams, row_bytes: a.row_size, ..Summary::default() };

    // Backlog: rows committed before the relay starts.
    if a.backlog > 0 {
        eprintln!("inserting a backlog of {} rows…", a.backlog);
        let chunk = 5000usize;
        let mut done = 0u64;
        while done < a.backlog {
            let n = chunk.min((a.backlog - done) as usize);
            let streams: Vec<String> = (0..n).map(|i| names[(done as usize + i) % names.len()].clone()).collect();
            let mut w = connect(&a.postgres).await?;
            insert(&mut w, &table, &streams, size, None).await?;
            done += n as u64;
        }
    }
    s.backlog_rows = a.backlog;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let stages = Arc::new(Mutex::new(Stages::default()));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut ro = RelayOptions::new(a.postgres.clone(), table.clone());
    ro.batch_size = a.batch_size;
    ro.max_append_bytes = a.max_append_bytes as usize;
    ro.create_streams = true;
    ro.observer = Some(Arc::new(RelayStamps { stages: stages.clone(), measure: measuring.clone() }));
    let relay = Relay::new(client.clone(), ro).map_err(|e| BenchError::Invalid(e.to_string()))?;
    let relay_task = tokio::spawn(relay.run(stopped(stop_rx.clone())));
    if a.backlog > 0 {
        let took = wait_published(&main, &table, a.backlog, Duration::from_secs(600)).await?;
        s.backlog_relay_rows_per_s = a.backlog as f64 / took.as_secs_f64();
        eprintln!(
            "backlog relayed: {} rows in {:.2} s = {:.0} rows/s",
            a.backlog,
            took.as_secs_f64(),
            s.backlog_relay_rows_per_s
        );
    }

    // Sinks (they catch up on the backlog before the steady phase is measured).
    let applied = Arc::new(AtomicU64::new(0));
    let mut sinks = Vec::new();
    for name in &names {
        let mut so = SinkOptions::new(a.postgres.clone(), consumer.clone(), name.clone());
        so.batch_max = 5000;
        let apply = Stamped {
            bulk: BulkApply::new(consumer.clone()),
            stages: stages.clone(),
            applied: applied.clone(),
            measure: measuring.clone(),
            pending: BTreeMap::new(),
            uncommitted: 0,
        };
        let sink = Sink::new(client.clone(), so, apply).map_err(|e| BenchError::Invalid(e.to_string()))?;
        sinks.push(tokio::spawn(sink.run(stopped(stop_rx.clone()))));
    }
    let t = Instant::now();
    while applied.load(Ordering::Relaxed) < a.backlog {
        if t.elapsed() > Duration::from_secs(600) {
            return Err(BenchError::Cluster("the sinks did not apply the backlog within 10 minutes".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Steady phase.
    s.table_bytes_start = table_bytes(&main, &table).await?;
    let written = Arc::new(AtomicU64::new(0));
    let writing = Arc::new(AtomicBool::new(true));
    measuring.store(true, Ordering::Relaxed);
    let published_start = published(&main, &table).await?;
    let applied_start = applied.load(Ordering::Relaxed);
    let per_writer_rate = a.rate as f64 / a.writers as f64;
    let mut writers = Vec::new();
    for w in 0..a.writers {
        let (url, table, names) = (a.postgres.clone(), table.clone(), names.clone());
        let (written, writing, stages) = (written.clone(), writing.clone(), stages.clone());
        let rows = a.rows_per_tx;
        writers.push(tokio::spawn(async move {
            let mut pgw = connect(&url).await?;
            let started = Instant::now();
            let mut mine = 0u64;
            let mut next = w;
            while writing.load(Ordering::Relaxed) {
                if per_writer_rate > 0.0 {
                    let due = Duration::from_secs_f64(mine as f64 / per_writer_rate);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        tokio::time::sleep(wait).await;
                    }
                }
                let streams: Vec<String> = (0..rows).map(|i| names[(next + i) % names.len()].clone()).collect();
                next += rows;
                insert(&mut pgw, &table, &streams, size, Some(&stages)).await?;
                mine += rows as u64;
                written.fetch_add(rows as u64, Ordering::Relaxed);
            }
            Ok::<(), BenchError>(())
        }));
    }
    let max_bytes = Arc::new(AtomicU64::new(s.table_bytes_start));
    let ticker = {
        let (url, table, written, applied, max_bytes) =
            (a.postgres.clone(), table.clone(), written.clone(), applied.clone(), max_bytes.clone());
        let probe = Arc::new(tokio::sync::Mutex::new(None::<tokio_postgres::Client>));
        Ticker::start(move |elapsed| {
            let (url, table, written, applied, max_bytes, probe) =
                (url.clone(), table.clone(), written.clone(), applied.clone(), max_bytes.clone(), probe.clone());
            tokio::spawn(async move {
                let mut guard = probe.lock().await;
                if guard.is_none() {
                    *guard = connect(&url).await.ok();
                }
                let Some(p) = guard.as_ref() else { return };
                let (Ok(pubd), Ok(bytes)) = (published(p, &table).await, table_bytes(p, &table).await) else { return };
                max_bytes.fetch_max(bytes, Ordering::Relaxed);
                eprintln!(
                    "{:>4.0} s  written {:>9}  published {:>9}  sunk {:>9}  outbox {:>7.1} MiB",
                    elapsed.as_secs_f64(),
                    written.load(Ordering::Relaxed),
                    pubd,
                    applied.load(Ordering::Relaxed),
                    bytes as f64 / (1024.0 * 1024.0)
                );
            });
        })
    };
    let t0 = Instant::now();
    tokio::time::sleep(a.duration).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let relayed_in_window = published(&main, &table).await?.saturating_sub(published_start);
    let sunk_in_window = applied.load(Ordering::Relaxed) - applied_start;
    writing.store(false, Ordering::Relaxed);
    for w in writers {
        w.await.map_err(|e| BenchError::Cluster(e.to_string()))??;
    }
    let total_written = written.load(Ordering::Relaxed);
    s.steady_secs = elapsed;
    s.written_rows_per_s = total_written as f64 / elapsed;
    s.relayed_rows_per_s = relayed_in_window as f64 / elapsed;
    s.sunk_rows_per_s = sunk_in_window as f64 / elapsed;
    // Let the relay and the sinks finish what was written, so every latency counts.
    let target = a.backlog + total_written;
    wait_published(&main, &table, target, Duration::from_secs(120)).await?;
    let t = Instant::now();
    while applied.load(Ordering::Relaxed) < target && t.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(ticker);
    s.table_bytes_end = table_bytes(&main, &table).await?;
    s.table_bytes_max = max_bytes.load(Ordering::Relaxed).max(s.table_bytes_end);
    s.stages = stages.lock().unwrap_or_else(|p| p.into_inner()).summary();
    s.load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    // The figures are taken: stopping and cleaning up must not keep them from being printed, so
    // each step is bounded and a step that does not finish is reported and left behind.
    let _ = stop_tx.send(true);
    let mut tasks = vec![("the relay", relay_task)];
    tasks.extend(sinks.into_iter().map(|k| ("a sink", k)));
    for (what, task) in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
            eprintln!("warning: {what} did not stop within {} s of being told to; aborted", STOP_WAIT.as_secs());
            abort.abort();
        }
    }
    let cleanup = async {
        main.batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}, {table}_progress; DROP FUNCTION IF EXISTS {table}_notify(), {table}_frozen();"
        ))
        .await?;
        main.execute("DELETE FROM runnev_sink_batches WHERE consumer = $1", &[&consumer]).await?;
        main.execute("DELETE FROM runnev_sink_cursor WHERE consumer = $1", &[&consumer]).await?;
        Ok::<(), tokio_postgres::Error>(())
    };
    match tokio::time::timeout(STOP_WAIT, cleanup).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("warning: dropping the benchmark's tables {table}*: {e}"),
        Err(_) => eprintln!(
            "warning: dropping the benchmark's tables {table}* did not finish within {} s; left behind",
            STOP_WAIT.as_secs()
        ),
    }
    Ok(s)
}

/// How long the stop of the relay, of each sink and the clean-up of the tables may take once
/// the figures are taken, before the benchmark reports it and goes on to print them.
const STOP_WAIT: Duration = Duration::from_secs(30);
