//! A bounded publish load generator, generic over the system under load, so that Runnev (through
//! [`runnev::client::Client`]) and a peer (NATS JetStream, in the `bench/` crate) are driven by the
//! same loop, the same payloads and the same clock.
//!
//! Owns: the load shape ([`LoadSpec`]), the worker loop, progress lines on stderr and the
//! [`Summary`]. Must never: retry on its own (a target's client does that, as an application's
//! would) or count a publish as done before the target acknowledged it.
//!
//! How the load is laid out:
//! - `concurrency` workers, each with exactly one publish in flight; they claim publish slots from
//!   one shared counter, so at most `count` publishes are started, and none after `duration`.
//! - Worker `w` publishes to stream `w % streams` ([`stream_of`]); with more streams than
//!   workers, it owns streams `w`, `w + concurrency`, … and goes through them in turn
//!   ([`stream_for`]), so every stream gets publishes. Stream `i` is named
//!   [`stream_names`]`(prefix, streams)[i]`; streams are prepared up to 64 at a time.
//! - With seqs, a stream has one writer at a time: each stream's next seq sits behind an async
//!   lock held from before the publish until its answer, so the seqs reaching a stream strictly
//!   increase (SPEC §2.3), and a stream carries one publish in flight. `streams = concurrency`
//!   (the `runnev bench --with-seq` default) gives every worker its own stream and no waiting;
//!   fewer streams cap the useful concurrency at `streams`. A seq is used once, even when its
//!   publish failed (holes are allowed), so the next one is above anything that may be stored.
//! - A latency sample is the time from handing the batch to the target until its acknowledgement
//!   (time waiting for a stream's lock is not in it); failed publishes give no sample.
//! - With `frames` > 1, each publish is one request carrying `frames` batches (SPEC §6, one Raft
//!   entry): `count` still counts batches, a request claims `frames` of them (the last one fewer
//!   if `count` is not a multiple), seqs advance by the batches sent, msgs/s counts batches, and a
//!   latency sample is one request's.
//! - Open loop (`rate`): instead of workers that wait for each answer, one dispatcher starts
//!   request `i` at its scheduled time [`scheduled_offset`] (`rate` batches per second), each in a
//!   task of its own, with at most `concurrency` in flight; request `i` goes to stream
//!   `i % streams`. Its latency sample runs from the *scheduled* time, not from when it was
//!   actually sent ([`Timing`]): a system that stalls makes the requests due meanwhile wait, and
//!   their wait is counted, which a closed loop hides by sending less (Gil Tene's "coordinated
//!   omission"; wrk2 and HdrHistogram measure the same way). Sends that started more than
//!   [`SCHEDULE_SLACK`] late are counted in [`Summary::behind_schedule`]: many of them mean the
//!   generator (or its `concurrency` bound) could not keep the rate, and the latencies then
//!   include that wait.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use super::stats::Histogram;
use runnev::client::Client;

/// The error a [`Target`] returns for one publish or one stream preparation.
pub type TargetError = Box<dyn std::error::Error + Send + Sync>;

/// The shape of one publish load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSpec {
    /// Payload of each batch, in bytes.
    pub payload_bytes: usize,
    /// Workers, each with one publish in flight (≥ 1).
    pub concurrency: usize,
    /// Streams the workers are spread over (≥ 1); worker `w` uses stream `w % streams`.
    pub streams: usize,
    /// Most publishes started in all (successful or not).
    pub count: u64,
    /// No publish is started after this much time, from the start of the load.
    #[serde(rename = "duration_secs", with = "secs_f64")]
    pub duration: Duration,
    /// Publish with explicit, increasing seqs per stream (the idempotent path).
    pub with_seq: bool,
    /// Batches per publish request (≥ 1); more than 1 sends them as frames (SPEC §6).
    #[serde(default = "one")]
    pub frames: usize,
    /// Open loop: start publishes on a fixed schedule of this many batches per second, whatever
    /// the answers, with at most `concurrency` in flight (`None`: closed loop, each worker
    /// starts its next publish when its last one was answered).
    #[serde(default)]
    pub rate: Option<f64>,
}

fn one() -> usize {
    1
}

impl LoadSpec {
    /// Checks the spec; the message says which field is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.concurrency == 0 {
            return Err("concurrency must be at least 1".into());
        }
        if self.streams == 0 {
            return Err("streams must be at least 1".into());
        }
        if self.duration.is_zero() {
            return Err("duration must be positive".into());
        }
        if self.frames == 0 || self.frames > runnev::limits::FRAMES_PER_APPEND_MAX {
            return Err(format!("frames must be from 1 to {}", runnev::limits::FRAMES_PER_APPEND_MAX));
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("rate must be a positive number of batches per second, not {rate}"));
            }
        }
        Ok(())
    }
}

/// The command-line flags of a publish load, shared by `runnev bench publish` and the peer
/// benchmark in `bench/`, so both take the same flags with the same defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Stream name, or with --streams N > 1 the prefix of STREAM-0 .. STREAM-(N-1).
    #[arg(long, default_value = "bench")]
    pub stream: String,
    /// Payload size, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Concurrent publishers, each with one publish in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Streams the publishers are spread over [default: 1, or --concurrency with --with-seq].
    #[arg(long)]
    pub streams: Option<usize>,
    /// Publishes to start in all.
    #[arg(long, default_value_t = 20_000)]
    pub count: u64,
    /// Start no publish after this many seconds, even if --count is not reached.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Publish with explicit, increasing seqs per stream (the idempotent path); a stream has one
    /// publish in flight at a time.
    #[arg(long)]
    pub with_seq: bool,
    /// Batches per publish request, sent as frames (one Raft entry per request); --count still
    /// counts batches.
    #[arg(long, default_value_t = 1)]
    pub frames: usize,
    /// Open loop: start this many batches per second on a fixed schedule, whatever the answers,
    /// with at most --concurrency publishes in flight; latency counts from each publish's
    /// scheduled time (no coordinated omission), and sends that fell behind are counted.
    #[arg(long, value_name = "BATCHES_PER_SEC")]
    pub rate: Option<f64>,
    /// Print the summary as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl LoadArgs {
    /// The load these flags ask for.
    pub fn spec(&self) -> LoadSpec {
        LoadSpec {
            payload_bytes: self.payload_bytes,
            concurrency: self.concurrency,
            streams: self.streams.unwrap_or(if self.with_seq { self.concurrency } else { 1 }),
            count: self.count,
            duration: Duration::from_secs(self.duration_secs),
            with_seq: self.with_seq,
            frames: self.frames,
            rate: self.rate,
        }
    }
}

/// How late past its scheduled time an open-loop send may start and still count as on schedule:
/// twice tokio's timer resolution (1 ms), by which a sleep may wake after its deadline.
pub const SCHEDULE_SLACK: Duration = Duration::from_millis(2);

/// When open-loop request `i` (from 0) is due, from the start of the load: it carries batches
/// `i * frames ..`, at `rate` batches per second, so it is due at `i * frames / rate` s.
/// Computed from `i` rather than by adding intervals, so rounding never accumulates; a time past
/// what a [`Duration`] holds saturates.
pub fn scheduled_offset(i: u64, frames: u64, rate: f64) -> Duration {
    Duration::try_from_secs_f64(i as f64 * frames as f64 / rate).unwrap_or(Duration::MAX)
}

/// The three instants of one open-loop request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// When the schedule said to send it.
    pub scheduled: Instant,
    /// When it was handed to the target (after a free in-flight slot and, with seqs, its
    /// stream's lock).
    pub sent: Instant,
    /// When the target answered.
    pub answered: Instant,
}

impl Timing {
    /// The latency a user of the system sees: from the scheduled send to the answer, so time
    /// spent waiting to be sent is counted (0 if the clock says otherwise).
    pub fn latency(&self) -> Duration {
        self.answered.saturating_duration_since(self.scheduled)
    }

    /// How late the send started.
    pub fn lag(&self) -> Duration {
        self.sent.saturating_duration_since(self.scheduled)
    }

    /// Whether the send started more than [`SCHEDULE_SLACK`] late.
    pub fn behind(&self) -> bool {
        self.lag() > SCHEDULE_SLACK
    }
}

/// The stream a worker publishes to when there are no more streams than workers.
pub fn stream_of(worker: usize, streams: usize) -> usize {
    worker % streams.max(1)
}

/// The stream of closed-loop worker `worker`'s `j`-th publish (from 0), of `concurrency`
/// workers: with no more streams than workers, always [`stream_of`]; with more, the worker owns
/// streams `worker`, `worker + concurrency`, `worker + 2·concurrency`, … below `streams` and goes
/// through them in turn, so every stream is used and no two workers share one (no waiting on a
/// stream's seq lock).
pub fn stream_for(worker: usize, j: u64, concurrency: usize, streams: usize) -> usize {
    let (c, s) = (concurrency.max(1), streams.max(1));
    if s <= c {
        return stream_of(worker, s);
    }
    let first = worker % c;
    let owned = (s - first).div_ceil(c); // ≥ 1, as first < c < s
    first + c * (j % owned as u64) as usize
}

/// Streams prepared at once before a load.
const PREPARE_AT_ONCE: usize = 64;

/// The names of a run's streams: `prefix` alone for one stream, else `prefix-0` ..
/// `prefix-(n-1)`.
pub fn stream_names(prefix: &str, n: usize) -> Vec<String> {
    if n == 1 {
        vec![prefix.to_string()]
    } else {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }
}

/// The payload every publish of a run carries: `bytes` long, a repeating printable pattern.
pub fn payload(bytes: usize) -> Bytes {
    (0..bytes).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>().into()
}

/// A system the generator publishes to. Implementations are cheap to share: the generator holds
/// one in an [`Arc`] and calls it from every worker.
pub trait Target: Send + Sync + 'static {
    /// Creates stream `stream` (an index into the run's streams) if it is missing, and returns
    /// the first seq a publish with a seq may use on it (its last seq + 1; 1 for a target whose
    /// seqs start afresh).
    fn prepare(&self, stream: usize) -> impl Future<Output = Result<u64, TargetError>> + Send;

    /// Publishes one batch to stream `stream`, with `seq` when given, and returns once the
    /// target acknowledged it (for Runnev: committed on a majority; each target documents what
    /// its acknowledgement means).
    fn publish(
        &self,
        stream: usize,
        seq: Option<u64>,
        payload: Bytes,
    ) -> impl Future<Output = Result<(), TargetError>> + Send;

    /// Publishes `n` batches of `payload` to stream `stream` in one request (frame k at
    /// `seq + k` when given) and returns once the target acknowledged all of them. A target
    /// without such a request refuses (the default).
    fn publish_frames(
        &self,
        stream: usize,
        seq: Option<u64>,
        payload: Bytes,
        n: usize,
    ) -> impl Future<Output = Result<(), TargetError>> + Send {
        let _ = (stream, seq, payload);
        async move { Err(format!("this target cannot publish {n} batches in one request").into()) }
    }
}

/// Why a load could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The spec is not valid.
    #[error("invalid load: {0}")]
    Spec(String),
    /// A stream could not be prepared.
    #[error("preparing stream {stream}: {error}")]
    Prepare {
        /// The stream's index.
        stream: usize,
        /// What went wrong.
        error: TargetError,
    },
    /// A worker task panicked.
    #[error("a worker failed: {0}")]
    Worker(String),
}

/// The outcome of one load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Publishes acknowledged.
    pub published: u64,
    /// Publishes that failed.
    pub errors: u64,
    /// The first failure's message, if any.
    pub first_error: Option<String>,
    /// Wall time from the first publish started to the last one answered, in s.
    pub seconds: f64,
    /// Acknowledged publishes per second.
    pub msgs_per_sec: f64,
    /// Acknowledged payload, in MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// Median publish latency, in ms.
    pub p50_ms: f64,
    /// 90th percentile publish latency, in ms.
    pub p90_ms: f64,
    /// 99th percentile publish latency, in ms.
    pub p99_ms: f64,
    /// 99.9th percentile publish latency, in ms.
    #[serde(default)]
    pub p999_ms: f64,
    /// Largest publish latency, in ms.
    pub max_ms: f64,
    /// Open loop: sends that started more than [`SCHEDULE_SLACK`] after their scheduled time
    /// (0 in a closed loop, which has no schedule).
    #[serde(default)]
    pub behind_schedule: u64,
    /// Open loop: the latest a send started after its scheduled time, in ms.
    #[serde(default)]
    pub max_behind_ms: f64,
    /// CPU time (user + system) the generator's process used during the load, in s; includes
    /// the target's client library, so it is the client-side cost of the load.
    pub client_cpu_secs: f64,
    /// The load that was run.
    #[serde(flatten)]
    pub spec: LoadSpec,
}

impl Summary {
    /// Summarises a load from its latency samples (one per acknowledged publish, in µs), its
    /// failures, its wall time and the process CPU time it used.
    pub fn new(
        spec: LoadSpec,
        latencies: Histogram,
        errors: u64,
        first_error: Option<String>,
        elapsed: Duration,
        client_cpu: Duration,
    ) -> Summary {
        // One sample per acknowledged request: the last request of a run may carry fewer than
        // `frames` batches, which [`Summary::count_batches`] corrects when the generator ran.
        let published = latencies.len() * spec.frames.max(1) as u64;
        let seconds = elapsed.as_secs_f64();
        let per_sec = |n: f64| if seconds > 0.0 { n / seconds } else { 0.0 };
        Summary {
            published,
            errors,
            first_error,
            seconds,
            msgs_per_sec: per_sec(published as f64),
            mb_per_sec: per_sec(published as f64 * spec.payload_bytes as f64) / 1e6,
            p50_ms: latencies.ms(0.50),
            p90_ms: latencies.ms(0.90),
            p99_ms: latencies.ms(0.99),
            p999_ms: latencies.ms(0.999),
            max_ms: latencies.ms(1.0),
            behind_schedule: 0,
            max_behind_ms: 0.0,
            client_cpu_secs: client_cpu.as_secs_f64(),
            spec,
        }
    }

    /// Sets the batches acknowledged to the exact count `published` (a run's last request may
    /// carry fewer than `frames`), and the rates from it.
    fn count_batches(&mut self, published: u64) {
        let per_sec = |n: f64| if self.seconds > 0.0 { n / self.seconds } else { 0.0 };
        self.published = published;
        self.msgs_per_sec = per_sec(published as f64);
        self.mb_per_sec = per_sec(published as f64 * self.spec.payload_bytes as f64) / 1e6;
    }

    /// The summary as one JSON line (no trailing newline).
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).expect("a summary always serialises")
    }

    /// The summary as a small table for a terminal (ends with a newline).
    pub fn table(&self) -> String {
        let s = &self.spec;
        let mut out = format!(
            "{} B payloads, concurrency {}, {} stream{}{}{}: published {} ({} errors) in {:.2} s, client CPU {:.2} s\n",
            s.payload_bytes,
            s.concurrency,
            s.streams,
            if s.streams == 1 { "" } else { "s" },
            if s.with_seq { ", with seq" } else { "" },
            if s.frames > 1 { format!(", {} batches per request", s.frames) } else { String::new() },
            self.published,
            self.errors,
            self.seconds,
            self.client_cpu_secs,
        );
        if let Some(rate) = s.rate {
            out += &format!(
                "open loop at {rate} batches/s, at most {} in flight: {} sends behind schedule (latest {:.2} ms late); latency from the scheduled send\n",
                s.concurrency, self.behind_schedule, self.max_behind_ms
            );
        }
        out += &format!(
            "{:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "msgs/s", "MB/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        out += &format!(
            "{:>12.0} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            self.msgs_per_sec, self.mb_per_sec, self.p50_ms, self.p90_ms, self.p99_ms, self.p999_ms, self.max_ms
        );
        if let Some(e) = &self.first_error {
            out += &format!("first error: {e}\n");
        }
        out
    }
}

/// Counters shared by a load's workers (or open-loop tasks) and its progress reporter.
#[derive(Default)]
struct Tally {
    /// Batches acknowledged.
    acked: AtomicU64,
    /// Publish requests that failed.
    failed: AtomicU64,
    /// The first failure's message.
    first_error: Mutex<Option<String>>,
}

impl Tally {
    /// Counts one failed request and keeps its message if it is the first.
    fn fail(&self, e: &TargetError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e.to_string());
        }
    }
}

/// What one loop (closed or open) measured.
struct Ran {
    /// One sample per acknowledged request, in µs.
    latencies: Histogram,
    /// From the first publish started to the last one answered.
    elapsed: Duration,
    /// Open loop: sends that started late ([`Timing::behind`]).
    behind: u64,
    /// Open loop: the largest [`Timing::lag`].
    max_lag: Duration,
}

/// Each stream's next seq, behind the lock a publish with a seq holds until its answer.
type Lanes = Arc<Vec<tokio::sync::Mutex<u64>>>;

/// Runs `spec` against `target`: prepares every stream, then publishes until `count` publishes
/// were started or `duration` passed, and summarises: in a closed loop by default, on a fixed
/// schedule with `spec.rate` (see the module docs). With `progress`, prints one line a second
/// on stderr (published so far, errors, msgs/s over the last second).
///
/// Errors: [`LoadError::Spec`] for an invalid spec, [`LoadError::Prepare`] when a stream cannot
/// be prepared, [`LoadError::Worker`] when a worker task panicked. Failed publishes are counted
/// in the summary, not returned.
pub async fn run<T: Target>(target: Arc<T>, spec: &LoadSpec, progress: bool) -> Result<Summary, LoadError> {
    spec.validate().map_err(LoadError::Spec)?;
    if progress && spec.streams > PREPARE_AT_ONCE {
        eprintln!("preparing {} streams…", spec.streams);
    }
    let lanes: Vec<_> = futures::stream::iter(0..spec.streams)
        .map(|stream| {
            let target = target.clone();
            async move {
                let first_seq = target.prepare(stream).await.map_err(|error| LoadError::Prepare { stream, error })?;
                Ok::<_, LoadError>(tokio::sync::Mutex::new(first_seq))
            }
        })
        .buffered(PREPARE_AT_ONCE)
        .try_collect()
        .await?;
    let lanes = Arc::new(lanes);
    let tally = Arc::new(Tally::default());
    let cpu_before = process_cpu();

    let reporter = progress.then(|| {
        let tally = tally.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = tally.acked.load(Ordering::Relaxed);
                eprintln!(
                    "  {:>9} published {:>6} errors {:>8} msgs/s",
                    now,
                    tally.failed.load(Ordering::Relaxed),
                    now - last
                );
                last = now;
            }
        })
    });

    let ran = match spec.rate {
        Some(rate) => run_open(target, spec, rate, lanes, tally.clone()).await,
        None => run_closed(target, spec, lanes, tally.clone()).await,
    };
    let cpu = process_cpu().saturating_sub(cpu_before);
    if let Some(r) = reporter {
        r.abort();
    }
    let ran = ran?;
    let first_error = tally.first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut summary =
        Summary::new(spec.clone(), ran.latencies, tally.failed.load(Ordering::Relaxed), first_error, ran.elapsed, cpu);
    summary.count_batches(tally.acked.load(Ordering::Relaxed));
    summary.behind_schedule = ran.behind;
    summary.max_behind_ms = ran.max_lag.as_secs_f64() * 1000.0;
    Ok(summary)
}

/// The closed loop: `concurrency` workers, each with one publish in flight (module docs). Both
/// loops time on tokio's clock (the wall clock, except in tests that pause it).
async fn run_closed<T: Target>(
    target: Arc<T>,
    spec: &LoadSpec,
    lanes: Lanes,
    tally: Arc<Tally>,
) -> Result<Ran, LoadError> {
    let claimed = Arc::new(AtomicU64::new(0));
    let body = payload(spec.payload_bytes);
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut workers = Vec::with_capacity(spec.concurrency);
    for worker in 0..spec.concurrency {
        let (target, lanes, claimed, tally) = (target.clone(), lanes.clone(), claimed.clone(), tally.clone());
        let (concurrency, streams, count, with_seq, body, frames) =
            (spec.concurrency, spec.streams, spec.count, spec.with_seq, body.clone(), spec.frames as u64);
        workers.push(tokio::spawn(async move {
            let mut latencies = Histogram::default();
            for j in 0u64.. {
                let stream = stream_for(worker, j, concurrency, streams);
                let first = claimed.fetch_add(frames, Ordering::Relaxed);
                if first >= count || Instant::now() >= deadline {
                    break;
                }
                let n = frames.min(count - first);
                let mut lane = if with_seq { Some(lanes[stream].lock().await) } else { None };
                if Instant::now() >= deadline {
                    break;
                }
                let seq = lane.as_deref().copied();
                let t = Instant::now();
                let outcome = publish(&*target, stream, seq, body.clone(), frames, n).await;
                let took = t.elapsed();
                if let Some(next) = lane.as_deref_mut() {
                    *next += n;
                }
                drop(lane);
                match outcome {
                    Ok(()) => {
                        latencies.record_us(took.as_micros() as u64);
                        tally.acked.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => tally.fail(&e),
                }
            }
            latencies
        }));
    }
    let mut latencies = Histogram::default();
    let mut panicked = None;
    for w in workers {
        match w.await {
            Ok(l) => latencies.merge(&l),
            Err(e) => panicked = Some(e.to_string()),
        }
    }
    let elapsed = started.elapsed();
    if let Some(e) = panicked {
        return Err(LoadError::Worker(e));
    }
    Ok(Ran { latencies, elapsed, behind: 0, max_lag: Duration::ZERO })
}

/// One request of `n` batches: a plain publish in a load of one batch per request, frames
/// otherwise (even for a last request of one batch).
async fn publish<T: Target>(
    target: &T,
    stream: usize,
    seq: Option<u64>,
    body: Bytes,
    frames: u64,
    n: u64,
) -> Result<(), TargetError> {
    if frames == 1 {
        target.publish(stream, seq, body).await
    } else {
        target.publish_frames(stream, seq, body, n as usize).await
    }
}

/// The open loop: request `i` starts at [`scheduled_offset`]`(i, frames, rate)` in a task of its
/// own, once one of `concurrency` in-flight slots is free; latencies run from the scheduled time
/// (module docs).
async fn run_open<T: Target>(
    target: Arc<T>,
    spec: &LoadSpec,
    rate: f64,
    lanes: Lanes,
    tally: Arc<Tally>,
) -> Result<Ran, LoadError> {
    let frames = spec.frames as u64;
    let body = payload(spec.payload_bytes);
    let slots = Arc::new(tokio::sync::Semaphore::new(spec.concurrency));
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut ran = Ran { latencies: Histogram::default(), elapsed: Duration::ZERO, behind: 0, max_lag: Duration::ZERO };
    let mut fold = |done: Result<(Timing, bool), tokio::task::JoinError>| -> Result<(), LoadError> {
        let (timing, ok) = done.map_err(|e| LoadError::Worker(e.to_string()))?;
        if ok {
            ran.latencies.record_us(timing.latency().as_micros() as u64);
        }
        ran.behind += u64::from(timing.behind());
        ran.max_lag = ran.max_lag.max(timing.lag());
        Ok(())
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0u64.. {
        let first = i.saturating_mul(frames);
        let scheduled = started + scheduled_offset(i, frames, rate).min(spec.duration);
        if first >= spec.count || scheduled >= deadline {
            break;
        }
        tokio::time::sleep_until(scheduled).await;
        let slot = slots.clone().acquire_owned().await.map_err(|e| LoadError::Worker(e.to_string()))?;
        while let Some(done) = tasks.try_join_next() {
            fold(done)?;
        }
        let n = frames.min(spec.count - first);
        let stream = (i % spec.streams as u64) as usize;
        let (target, lanes, tally, body, with_seq) =
            (target.clone(), lanes.clone(), tally.clone(), body.clone(), spec.with_seq);
        tasks.spawn(async move {
            let mut lane = if with_seq { Some(lanes[stream].lock().await) } else { None };
            let seq = lane.as_deref().copied();
            let sent = Instant::now();
            let outcome = publish(&*target, stream, seq, body, frames, n).await;
            let answered = Instant::now();
            if let Some(next) = lane.as_deref_mut() {
                *next += n;
            }
            drop((lane, slot));
            let ok = match outcome {
                Ok(()) => {
                    tally.acked.fetch_add(n, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    tally.fail(&e);
                    false
                }
            };
            (Timing { scheduled, sent, answered }, ok)
        });
    }
    while let Some(done) = tasks.join_next().await {
        fold(done)?;
    }
    ran.elapsed = started.elapsed();
    Ok(ran)
}

/// CPU time (user + system) this process has used so far; zero if the OS does not say.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given when it returns 0,
    // and the value is read only in that case.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return Duration::ZERO;
        }
        usage.assume_init()
    };
    let tv =
        |t: libc::timeval| Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runnev as a [`Target`]: stream `i` is `names[i]`, created on [`Target::prepare`]; a publish is
/// acknowledged once the batch is committed on a majority (SPEC §2.1). The client's own retries
/// (failover, leader affinity, retries of publishes with a seq) are part of what is measured.
#[derive(Clone)]
pub struct RunnevTarget {
    client: Client,
    names: Arc<Vec<String>>,
}

impl RunnevTarget {
    /// A target publishing through `client` to the streams `names` (see [`stream_names`]).
    pub fn new(client: Client, names: Vec<String>) -> RunnevTarget {
        RunnevTarget { client, names: Arc::new(names) }
    }
}

impl Target for RunnevTarget {
    async fn prepare(&self, stream: usize) -> Result<u64, TargetError> {
        let (info, _) = self.client.put_stream(&self.names[stream], None).await?;
        Ok(info.last_seq + 1)
    }

    async fn publish(&self, stream: usize, seq: Option<u64>, payload: Bytes) -> Result<(), TargetError> {
        let ack = self.client.publish(&self.names[stream], seq, payload).await?;
        if ack.duplicate {
            // Every seq of a run is fresh: a duplicate means the load or the server is wrong.
            return Err(format!("seq {} on {} answered as a duplicate", ack.seq, self.names[stream]).into());
        }
        Ok(())
    }

    async fn publish_frames(
        &self,
        stream: usize,
        seq: Option<u64>,
        payload: Bytes,
        n: usize,
    ) -> Result<(), TargetError> {
        let payloads = vec![payload; n];
        let ack = self.client.publish_many(&self.names[stream], seq, &payloads).await?;
        if ack.duplicate || ack.count != n as u64 {
            return Err(format!(
                "seqs {}..={} on {} answered as {} duplicate={}",
                ack.first_seq, ack.last_seq, self.names[stream], ack.count, ack.duplicate
            )
            .into());
        }
        Ok(())
    }
}

/// (De)serialises a [`Duration`] as a number of seconds.
mod secs_f64 {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn spec(concurrency: usize, streams: usize, count: u64, with_seq: bool) -> LoadSpec {
        LoadSpec {
            payload_bytes: 100,
            concurrency,
            streams,
            count,
            duration: Duration::from_secs(30),
            with_seq,
            frames: 1,
            rate: None,
        }
    }

    /// Records every publish; checks that a stream never has two publishes in flight when seqs
    /// are used; fails publishes whose seq is in `fail_seqs`.
    #[derive(Default)]
    struct Recorder {
        log: Mutex<Vec<(usize, Option<u64>, usize)>>,
        in_flight: Mutex<HashMap<usize, usize>>,
        max_in_flight_per_stream: AtomicU64,
        fail_seqs: Vec<u64>,
        first_seq: u64,
    }

    /// The seqs `stream` was published with, in the order they were answered.
    fn seqs_of(log: &[(usize, Option<u64>, usize)], stream: usize) -> Vec<u64> {
        log.iter().filter(|e| e.0 == stream).filter_map(|e| e.1).collect()
    }

    impl Target for Recorder {
        async fn prepare(&self, stream: usize) -> Result<u64, TargetError> {
            Ok(self.first_seq + 100 * stream as u64)
        }

        async fn publish(&self, stream: usize, seq: Option<u64>, payload: Bytes) -> Result<(), TargetError> {
            let n = {
                let mut f = self.in_flight.lock().unwrap();
                let n = f.entry(stream).or_default();
                *n += 1;
                *n
            };
            self.max_in_flight_per_stream.fetch_max(n as u64, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_micros(200)).await;
            *self.in_flight.lock().unwrap().get_mut(&stream).unwrap() -= 1;
            self.log.lock().unwrap().push((stream, seq, payload.len()));
            match seq {
                Some(s) if self.fail_seqs.contains(&s) => Err(format!("refused seq {s}").into()),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn workers_are_spread_round_robin_over_streams() {
        assert_eq!((0..6).map(|w| stream_of(w, 3)).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!((0..3).map(|w| stream_of(w, 1)).collect::<Vec<_>>(), vec![0, 0, 0]);
        assert_eq!(stream_of(5, 0), 0, "zero streams is treated as one, never a division by zero");
        assert_eq!(stream_names("b", 1), vec!["b"]);
        // No more streams than workers: the same stream every time.
        assert!((0..5).all(|j| stream_for(4, j, 6, 3) == 1));
        // 3 workers over 8 streams: worker 0 owns 0, 3, 6; worker 2 owns 2, 5.
        assert_eq!((0..4).map(|j| stream_for(0, j, 3, 8)).collect::<Vec<_>>(), vec![0, 3, 6, 0]);
        assert_eq!((0..3).map(|j| stream_for(2, j, 3, 8)).collect::<Vec<_>>(), vec![2, 5, 2]);
        let mut used: Vec<usize> = (0..3).flat_map(|w| (0..3).map(move |j| stream_for(w, j, 3, 8))).collect();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used, (0..8).collect::<Vec<_>>(), "every stream is used");
        assert_eq!(stream_names("b", 3), vec!["b-0", "b-1", "b-2"]);
    }

    #[test]
    fn flags_default_streams_by_mode() {
        let args = |with_seq, streams| LoadArgs {
            stream: "s".into(),
            payload_bytes: 10,
            concurrency: 8,
            streams,
            count: 5,
            duration_secs: 2,
            with_seq,
            frames: 1,
            rate: None,
            json: false,
            quiet: true,
        };
        assert_eq!(args(false, None).spec().streams, 1, "plain load: one stream");
        assert_eq!(args(true, None).spec().streams, 8, "with seq: one stream per worker");
        assert_eq!(args(true, Some(2)).spec().streams, 2, "an explicit --streams wins");
        assert_eq!(args(false, None).spec().duration, Duration::from_secs(2));
    }

    #[test]
    fn invalid_specs_are_refused() {
        assert!(spec(0, 1, 1, false).validate().unwrap_err().contains("concurrency"));
        assert!(spec(1, 0, 1, false).validate().unwrap_err().contains("streams"));
        let mut s = spec(1, 1, 1, false);
        s.duration = Duration::ZERO;
        assert!(s.validate().unwrap_err().contains("duration"));
        assert_eq!(spec(4, 2, 0, true).validate(), Ok(()));
    }

    #[test]
    fn payload_has_the_asked_size() {
        assert_eq!(payload(0).len(), 0);
        assert_eq!(&payload(28)[..], b"abcdefghijklmnopqrstuvwxyzab");
    }

    #[test]
    fn summary_math() {
        let mut l = Histogram::default();
        for ms in 1..=1000u64 {
            l.record_us(ms * 100);
        }
        let s = Summary::new(
            spec(4, 1, 100, false),
            l,
            3,
            Some("boom".into()),
            Duration::from_secs(2),
            Duration::from_millis(500),
        );
        assert_eq!(s.published, 1000);
        assert_eq!(s.errors, 3);
        assert_eq!(s.msgs_per_sec, 500.0);
        assert_eq!(s.mb_per_sec, 500.0 * 100.0 / 1e6);
        // HdrHistogram's 3 significant digits: each within 0.1 % above the exact sample.
        for (got, want) in [(s.p50_ms, 50.0), (s.p90_ms, 90.0), (s.p99_ms, 99.0), (s.p999_ms, 99.9), (s.max_ms, 100.0)]
        {
            assert!(got >= want && got <= want * 1.001, "{got} ms, want {want}");
        }
        assert_eq!((s.behind_schedule, s.max_behind_ms), (0, 0.0), "a closed loop has no schedule");
        assert_eq!(s.client_cpu_secs, 0.5);
        let empty = Summary::new(spec(1, 1, 0, false), Histogram::default(), 0, None, Duration::ZERO, Duration::ZERO);
        assert_eq!((empty.msgs_per_sec, empty.mb_per_sec, empty.p99_ms), (0.0, 0.0, 0.0));
    }

    #[test]
    fn summary_json_is_flat_and_round_trips() {
        let s =
            Summary::new(spec(2, 1, 1, true), Histogram::default(), 0, None, Duration::from_secs(1), Duration::ZERO);
        let line = s.json_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["concurrency"], 2);
        assert_eq!(v["with_seq"], true);
        assert_eq!(v["duration_secs"], 30.0);
        assert!(v["msgs_per_sec"].is_number() && v["p99_ms"].is_number());
        assert_eq!(serde_json::from_str::<Summary>(&line).unwrap(), s);
        assert!(s.table().contains("with seq"));
    }

    #[test]
    fn the_schedule_is_computed_from_the_index() {
        assert_eq!(scheduled_offset(0, 1, 1000.0), Duration::ZERO);
        assert_eq!(scheduled_offset(1, 1, 1000.0), Duration::from_millis(1));
        assert_eq!(scheduled_offset(1000, 1, 1000.0), Duration::from_secs(1));
        // Ten batches per request at 1,000 batches/s: a request every 10 ms.
        assert_eq!(scheduled_offset(3, 10, 1000.0), Duration::from_millis(30));
        // A third of a ms each: no drift after a million requests (a sum of rounded intervals would).
        assert_eq!(scheduled_offset(3_000_000, 1, 3000.0), Duration::from_secs(1000));
        assert_eq!(scheduled_offset(u64::MAX, 1, 1e-9), Duration::MAX, "saturates, never panics");
    }

    #[test]
    fn a_late_send_counts_its_latency_from_its_scheduled_time() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let late = Timing { scheduled: t0, sent: t0 + ms(30), answered: t0 + ms(32) };
        assert_eq!(late.latency(), ms(32), "the 30 ms it waited to be sent are in its latency");
        assert_eq!(late.lag(), ms(30));
        assert!(late.behind());
        let on_time = Timing { scheduled: t0, sent: t0 + ms(1), answered: t0 + ms(3) };
        assert_eq!(on_time.latency(), ms(3));
        assert!(!on_time.behind(), "within the timer's slack");
        let odd = Timing { scheduled: t0 + ms(5), sent: t0, answered: t0 };
        assert_eq!((odd.latency(), odd.lag()), (Duration::ZERO, Duration::ZERO), "never negative");
    }

    #[test]
    fn a_rate_must_be_positive_and_finite() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let s = LoadSpec { rate: Some(bad), ..spec(1, 1, 1, false) };
            assert!(s.validate().unwrap_err().contains("rate"), "{bad}");
        }
        assert_eq!(LoadSpec { rate: Some(0.5), ..spec(1, 1, 1, false) }.validate(), Ok(()));
    }

    /// Answers every publish after `.0` of tokio's time.
    struct Slow(Duration);

    impl Target for Slow {
        async fn prepare(&self, _: usize) -> Result<u64, TargetError> {
            Ok(1)
        }
        async fn publish(&self, _: usize, _: Option<u64>, _: Bytes) -> Result<(), TargetError> {
            tokio::time::sleep(self.0).await;
            Ok(())
        }
    }

    /// A target that takes 50 ms per publish, one in flight, asked for one every 10 ms: request
    /// i is due at 10·i ms but sent at 50·i ms, so its latency from the schedule is 40·i + 50 ms.
    /// The closed loop on the same target reports 50 ms for every publish.
    #[tokio::test(start_paused = true)]
    async fn open_loop_latency_runs_from_the_schedule() {
        let open = LoadSpec { rate: Some(100.0), ..spec(1, 1, 5, false) };
        let s = run(Arc::new(Slow(Duration::from_millis(50))), &open, false).await.unwrap();
        assert_eq!((s.published, s.errors), (5, 0));
        // Samples 50, 90, 130, 170, 210 ms; nearest rank of 5: p50 is the 3rd.
        let about = |got: f64, want: f64| got >= want && got <= want * 1.001;
        assert!(about(s.p50_ms, 130.0), "p50 {}", s.p50_ms);
        assert!(about(s.max_ms, 210.0), "max {}", s.max_ms);
        assert_eq!(s.behind_schedule, 4, "every send after the first waited for the one before");
        assert_eq!(s.max_behind_ms, 160.0, "the last was due at 40 ms and sent at 200 ms");
        assert!(s.table().contains("open loop at 100 batches/s"), "{}", s.table());

        let closed = run(Arc::new(Slow(Duration::from_millis(50))), &spec(1, 1, 5, false), false).await.unwrap();
        assert!(closed.max_ms < 50.1, "the closed loop sent later instead, and hides the wait: {}", closed.max_ms);
    }

    /// A target that keeps up (5 ms per publish, 1,000 publishes/s asked, room for 8 in flight):
    /// every latency is the service time and no send is late.
    #[tokio::test(start_paused = true)]
    async fn open_loop_keeps_its_rate_when_the_target_keeps_up() {
        let open = LoadSpec { rate: Some(1000.0), ..spec(8, 1, 100, false) };
        let s = run(Arc::new(Slow(Duration::from_millis(5))), &open, false).await.unwrap();
        assert_eq!((s.published, s.errors, s.behind_schedule), (100, 0, 0));
        assert!(s.p50_ms >= 5.0 && s.max_ms <= 5.005, "{} {}", s.p50_ms, s.max_ms);
        assert_eq!(s.max_behind_ms, 0.0);
        // The last of 100 is due at 99 ms and answered 5 ms later.
        assert_eq!(s.seconds, 0.104);
        assert!(about_rate(s.msgs_per_sec, 100.0 / 0.104));
    }

    fn about_rate(got: f64, want: f64) -> bool {
        (got - want).abs() < 1e-6 * want
    }

    /// The duration bounds the schedule: at 100/s for 1 s, about 100 requests start, not count.
    #[tokio::test(start_paused = true)]
    async fn open_loop_stops_scheduling_at_the_duration() {
        let mut open = LoadSpec { rate: Some(100.0), ..spec(4, 1, u64::MAX, false) };
        open.duration = Duration::from_secs(1);
        let s = run(Arc::new(Slow(Duration::from_millis(1))), &open, false).await.unwrap();
        assert_eq!(s.published, 100, "due at 0, 10, …, 990 ms");
    }

    /// With seqs and frames in the open loop, request i goes to stream i % streams and each
    /// stream's seqs still advance by the batches sent, one publish in flight per stream.
    #[tokio::test(start_paused = true)]
    async fn open_loop_spreads_requests_over_streams_with_increasing_seqs() {
        let open = LoadSpec { rate: Some(2000.0), ..spec(16, 3, 30, true) };
        assert!(consecutive_seqs_per_stream(&open).await.iter().all(|seqs| seqs.len() == 10));
    }

    /// Runs `spec` (with seqs) on a fresh [`Recorder`]; checks that every batch was acknowledged
    /// with one publish in flight per stream and that each stream's seqs are consecutive from
    /// its first (1 + 100 × stream); returns them.
    async fn consecutive_seqs_per_stream(spec: &LoadSpec) -> Vec<Vec<u64>> {
        let target = Arc::new(Recorder { first_seq: 1, ..Default::default() });
        let s = run(target.clone(), spec, false).await.unwrap();
        assert_eq!((s.published, s.errors), (spec.count, 0));
        assert_eq!(target.max_in_flight_per_stream.load(Ordering::Relaxed), 1);
        let log = target.log.lock().unwrap();
        (0..spec.streams)
            .map(|stream| {
                let seqs = seqs_of(&log, stream);
                let first = 1 + 100 * stream as u64;
                assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>(), "stream {stream}");
                seqs
            })
            .collect()
    }

    #[tokio::test]
    async fn frames_claim_batches_and_advance_seqs_by_the_batches_sent() {
        #[derive(Default)]
        struct Frames {
            log: Mutex<Vec<(Option<u64>, usize)>>,
        }
        impl Target for Frames {
            async fn prepare(&self, _: usize) -> Result<u64, TargetError> {
                Ok(1)
            }
            async fn publish(&self, _: usize, _: Option<u64>, _: Bytes) -> Result<(), TargetError> {
                unreachable!("with frames every publish is a frames request")
            }
            async fn publish_frames(&self, _: usize, seq: Option<u64>, _: Bytes, n: usize) -> Result<(), TargetError> {
                self.log.lock().unwrap().push((seq, n));
                Ok(())
            }
        }
        let target = Arc::new(Frames::default());
        let spec = LoadSpec { frames: 10, ..spec(1, 1, 25, true) };
        let s = run(target.clone(), &spec, false).await.unwrap();
        assert_eq!((s.published, s.errors), (25, 0), "count counts batches");
        assert_eq!(*target.log.lock().unwrap(), vec![(Some(1), 10), (Some(11), 10), (Some(21), 5)]);
        assert!(s.table().contains("10 batches per request"));
        assert!(LoadSpec { frames: 0, ..spec.clone() }.validate().is_err());
        assert!(LoadSpec { frames: 10_001, ..spec }.validate().is_err());
    }

    #[tokio::test]
    async fn plain_load_publishes_count_batches_without_seqs() {
        let target = Arc::new(Recorder::default());
        let s = run(target.clone(), &spec(8, 1, 50, false), false).await.unwrap();
        assert_eq!((s.published, s.errors), (50, 0));
        let log = target.log.lock().unwrap();
        assert_eq!(log.len(), 50, "exactly count publishes are started");
        assert!(log.iter().all(|&(stream, seq, len)| stream == 0 && seq.is_none() && len == 100));
    }

    #[tokio::test]
    async fn seqs_increase_per_stream_with_one_writer_at_a_time() {
        let target = Arc::new(Recorder { first_seq: 7, fail_seqs: vec![9], ..Default::default() });
        // 6 workers share 2 streams: each stream must still see one publish at a time.
        let s = run(target.clone(), &spec(6, 2, 40, true), false).await.unwrap();
        assert_eq!(s.published + s.errors, 40);
        assert_eq!(s.errors, 1, "the refused seq is counted as an error");
        assert_eq!(s.first_error.as_deref(), Some("refused seq 9"));
        assert_eq!(target.max_in_flight_per_stream.load(Ordering::Relaxed), 1);
        let log = target.log.lock().unwrap();
        for stream in 0..2 {
            let seqs = seqs_of(&log, stream);
            let first = 7 + 100 * stream as u64;
            // Consecutive from the prepared first seq: a failed seq (9) is not reused.
            assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>(), "stream {stream}");
        }
    }

    #[tokio::test]
    async fn more_streams_than_workers_are_all_used_in_turn() {
        let seqs = consecutive_seqs_per_stream(&spec(2, 5, 20, true)).await;
        assert!(seqs.iter().all(|s| !s.is_empty()), "a stream got no publish: {seqs:?}");
    }

    #[tokio::test]
    async fn duration_bounds_an_unbounded_count() {
        let target = Arc::new(Recorder::default());
        let mut sp = spec(2, 1, u64::MAX, false);
        sp.duration = Duration::from_millis(100);
        let t = Instant::now();
        let s = run(target, &sp, false).await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(s.published > 0);
        assert!(s.seconds >= 0.1);
    }

    #[tokio::test]
    async fn a_failing_prepare_stops_the_load() {
        struct NoStreams;
        impl Target for NoStreams {
            async fn prepare(&self, _: usize) -> Result<u64, TargetError> {
                Err("no such cluster".into())
            }
            async fn publish(&self, _: usize, _: Option<u64>, _: Bytes) -> Result<(), TargetError> {
                unreachable!("nothing is published when a stream could not be prepared")
            }
        }
        let err = run(Arc::new(NoStreams), &spec(1, 2, 1, false), false).await.unwrap_err();
        assert!(matches!(err, LoadError::Prepare { stream: 0, .. }), "{err}");
        let err = run(Arc::new(NoStreams), &spec(0, 1, 1, false), false).await.unwrap_err();
        assert!(matches!(err, LoadError::Spec(_)), "{err}");
    }
}
