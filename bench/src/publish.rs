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
//! - Worker `w` publishes to stream `w % streams` ([`stream_of`]); stream `i` is named
//!   [`stream_names`]`(prefix, streams)[i]`.
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

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::stats::Latencies;
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
        }
    }
}

/// The stream a worker publishes to.
pub fn stream_of(worker: usize, streams: usize) -> usize {
    worker % streams.max(1)
}

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
    /// Largest publish latency, in ms.
    pub max_ms: f64,
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
        mut latencies: Latencies,
        errors: u64,
        first_error: Option<String>,
        elapsed: Duration,
        client_cpu: Duration,
    ) -> Summary {
        // One sample per acknowledged request: the last request of a run may carry fewer than
        // `frames` batches, which [`Summary::count_batches`] corrects when the generator ran.
        let published = latencies.len() as u64 * spec.frames.max(1) as u64;
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
            max_ms: latencies.ms(1.0),
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
        out += &format!(
            "{:>12} {:>10} {:>9} {:>9} {:>9} {:>9}\n",
            "msgs/s", "MB/s", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        out += &format!(
            "{:>12.0} {:>10.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
            self.msgs_per_sec, self.mb_per_sec, self.p50_ms, self.p90_ms, self.p99_ms, self.max_ms
        );
        if let Some(e) = &self.first_error {
            out += &format!("first error: {e}\n");
        }
        out
    }
}

/// Runs `spec` against `target`: prepares every stream, then publishes until `count` publishes
/// were started or `duration` passed, and summarises. With `progress`, prints one line a second
/// on stderr (published so far, errors, msgs/s over the last second).
///
/// Errors: [`LoadError::Spec`] for an invalid spec, [`LoadError::Prepare`] when a stream cannot
/// be prepared. Failed publishes are counted in the summary, not returned.
pub async fn run<T: Target>(target: Arc<T>, spec: &LoadSpec, progress: bool) -> Result<Summary, LoadError> {
    spec.validate().map_err(LoadError::Spec)?;
    let mut lanes = Vec::with_capacity(spec.streams);
    for stream in 0..spec.streams {
        let first_seq = target.prepare(stream).await.map_err(|error| LoadError::Prepare { stream, error })?;
        lanes.push(tokio::sync::Mutex::new(first_seq));
    }
    let lanes = Arc::new(lanes);
    let claimed = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let body = payload(spec.payload_bytes);
    let cpu_before = process_cpu();
    let started = Instant::now();
    let deadline = started + spec.duration;

    let reporter = progress.then(|| {
        let (acked, failed) = (acked.clone(), failed.clone());
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = acked.load(Ordering::Relaxed);
                eprintln!(
                    "  {:>9} published {:>6} errors {:>8} msgs/s",
                    now,
                    failed.load(Ordering::Relaxed),
                    now - last
                );
                last = now;
            }
        })
    });

    let mut workers = Vec::with_capacity(spec.concurrency);
    for worker in 0..spec.concurrency {
        let (target, lanes, claimed, acked, failed, first_error) =
            (target.clone(), lanes.clone(), claimed.clone(), acked.clone(), failed.clone(), first_error.clone());
        let (stream, count, with_seq, body, frames) =
            (stream_of(worker, spec.streams), spec.count, spec.with_seq, body.clone(), spec.frames as u64);
        workers.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            loop {
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
                let outcome = if frames == 1 {
                    target.publish(stream, seq, body.clone()).await
                } else {
                    target.publish_frames(stream, seq, body.clone(), n as usize).await
                };
                let took = t.elapsed();
                if let Some(next) = lane.as_deref_mut() {
                    *next += n;
                }
                drop(lane);
                match outcome {
                    Ok(()) => {
                        latencies.record_us(took.as_micros() as u64);
                        acked.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                        if first.is_none() {
                            *first = Some(e.to_string());
                        }
                    }
                }
            }
            latencies
        }));
    }
    let mut latencies = Latencies::default();
    let mut panicked = None;
    for w in workers {
        match w.await {
            Ok(l) => latencies.merge(l),
            Err(e) => panicked = Some(e.to_string()),
        }
    }
    let elapsed = started.elapsed();
    let cpu = process_cpu().saturating_sub(cpu_before);
    if let Some(r) = reporter {
        r.abort();
    }
    if let Some(e) = panicked {
        return Err(LoadError::Worker(e));
    }
    let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut summary = Summary::new(spec.clone(), latencies, failed.load(Ordering::Relaxed), first_error, elapsed, cpu);
    summary.count_batches(acked.load(Ordering::Relaxed));
    Ok(summary)
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
        let mut l = Latencies::default();
        for ms in 1..=100u64 {
            l.record_us(ms * 1000);
        }
        let s = Summary::new(
            spec(4, 1, 100, false),
            l,
            3,
            Some("boom".into()),
            Duration::from_secs(2),
            Duration::from_millis(500),
        );
        assert_eq!(s.published, 100);
        assert_eq!(s.errors, 3);
        assert_eq!(s.msgs_per_sec, 50.0);
        assert_eq!(s.mb_per_sec, 50.0 * 100.0 / 1e6);
        assert_eq!((s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.client_cpu_secs, 0.5);
        let empty = Summary::new(spec(1, 1, 0, false), Latencies::default(), 0, None, Duration::ZERO, Duration::ZERO);
        assert_eq!((empty.msgs_per_sec, empty.mb_per_sec, empty.p99_ms), (0.0, 0.0, 0.0));
    }

    #[test]
    fn summary_json_is_flat_and_round_trips() {
        let s =
            Summary::new(spec(2, 1, 1, true), Latencies::default(), 0, None, Duration::from_secs(1), Duration::ZERO);
        let line = s.json_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["concurrency"], 2);
        assert_eq!(v["with_seq"], true);
        assert_eq!(v["duration_secs"], 30.0);
        assert!(v["msgs_per_sec"].is_number() && v["p99_ms"].is_number());
        assert_eq!(serde_json::from_str::<Summary>(&line).unwrap(), s);
        assert!(s.table().contains("with seq"));
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
            let seqs: Vec<u64> = log.iter().filter(|e| e.0 == stream).map(|e| e.1.unwrap()).collect();
            let first = 7 + 100 * stream as u64;
            // Consecutive from the prepared first seq: a failed seq (9) is not reused.
            assert_eq!(seqs, (first..first + seqs.len() as u64).collect::<Vec<_>>(), "stream {stream}");
        }
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
