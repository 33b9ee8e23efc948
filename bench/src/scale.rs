//! `runnev bench streams | subscribers | disk`: how Runnev holds up as a deployment grows: many
//! streams, many subscribers on one node, and the disk it takes per byte of payload.
//!
//! - `streams`: against a running cluster (`--nodes`), the same publish load (count,
//!   concurrency, payload, with the generator of [`crate::publish`]) on one stream and on
//!   `--many-streams` (default 10,000) streams, in alternating rounds; prints each run and the
//!   ratio of the medians of msgs/s (many / one). Creating the streams is not timed.
//! - `subscribers`: starts its own cluster, opens `--subscribers` (default 1,000) SSE
//!   subscriptions on one stream at one follower, then publishes `--rate` batches/s on a fixed
//!   schedule for `--duration-secs`. Reports the follower's resident memory (`VmRSS` in
//!   `/proc/PID/status`) before the subscribers, with them idle, at the end and its peak
//!   (`VmHWM`), and the fan-out: batches delivered over all subscribers per second, each
//!   subscriber checked to get every seq once and in order.
//! - `disk`: starts its own cluster and reports the bytes its data directories take (allocated
//!   blocks, what `du` counts), fresh, after a fill of `--fill-bytes` of payload (default 256
//!   MiB) and after a snapshot cycle (small publishes until every node has a snapshot covering
//!   the fill and has purged its log behind it), as bytes per byte of payload and by top-level
//!   entry of the data directory (log, redb, snapshots, ballast).
//!
//! Owns: these three measurements and their reports. Must never: count a delivery twice, or
//! measure the disk before every node applied what it is measured against.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;

use crate::cli::PublishArgs;
use crate::cluster::{self, eager_retry_policy, parse_size, BenchError, OwnCluster};
use crate::publish::{self, stream_names, LoadSpec, RunnevTarget, Summary};
use runnev::client::{Client, Connection, Delivery, SubscribeOptions};
use runnev::launcher::LocalCluster;
use runnev::net::TcpDialer;

/// How long the cluster may take to form, or every node to apply what was published, in ms.
const READY_MS_MAX: u64 = 120_000;
/// How long `disk`'s small publishes may take to bring every node a snapshot of the fill, in ms.
const SNAPSHOT_CYCLE_MS_MAX: u64 = 600_000;

// ---------------------------------------------------------------------------------------------
// streams
// ---------------------------------------------------------------------------------------------

/// Flags of `runnev bench streams`.
#[derive(clap::Args)]
pub struct StreamsArgs {
    /// The load of each run (its --streams is refused: the runs use one stream and
    /// --many-streams).
    #[command(flatten)]
    pub publish: PublishArgs,
    /// Streams of the many-streams run.
    #[arg(long, default_value_t = 10_000)]
    pub many_streams: usize,
    /// Rounds, each one run on one stream and one on many (alternating which goes first).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
}

/// The median of `v` (0.0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Runs `runnev bench streams` (see the module docs); each run's summary on stdout as it ends.
///
/// Errors: bad flags, or a run could not start (a stream could not be created).
pub async fn streams(a: StreamsArgs) -> Result<(), BenchError> {
    if a.publish.load.streams.is_some() {
        return Err(BenchError::Invalid("--streams: this mode runs one stream and --many-streams".into()));
    }
    if a.many_streams < 2 || a.rounds == 0 {
        return Err(BenchError::Invalid("--many-streams must be at least 2 and --rounds at least 1".into()));
    }
    let client = a.publish.client().map_err(|e| BenchError::Invalid(e.to_string()))?;
    let base = a.publish.load.spec();
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for round in 1..=a.rounds {
        let order = if round % 2 == 1 { [1, a.many_streams] } else { [a.many_streams, 1] };
        for n in order {
            let spec = LoadSpec { streams: n, ..base.clone() };
            let prefix = if n == 1 { format!("{}-one", a.publish.load.stream) } else { a.publish.load.stream.clone() };
            let target = Arc::new(RunnevTarget::new(client.clone(), stream_names(&prefix, n)));
            eprintln!("round {round}: {n} stream{}…", if n == 1 { "" } else { "s" });
            let s = publish::run(target, &spec, !a.publish.load.quiet)
                .await
                .map_err(|e| BenchError::Cluster(e.to_string()))?;
            print_run(&s, a.publish.load.json, "streams", round);
            let runs = if n == 1 { &mut one } else { &mut many };
            runs.push(s.msgs_per_sec);
        }
    }
    let (one, many) = (median(one), median(many));
    let ratio = if one > 0.0 { many / one } else { 0.0 };
    if a.publish.load.json {
        let v = serde_json::json!({
            "mode": "streams", "many_streams": a.many_streams, "rounds": a.rounds,
            "one_msgs_per_sec": one, "many_msgs_per_sec": many, "ratio": ratio,
        });
        println!("{v}");
    } else {
        println!(
            "medians over {} round{}: 1 stream {one:.0} msgs/s, {} streams {many:.0} msgs/s: {ratio:.2}× (target ≥ 0.90×)",
            a.rounds,
            if a.rounds == 1 { "" } else { "s" },
            a.many_streams
        );
    }
    Ok(())
}

/// Prints one publish run: its table, or its JSON line tagged with the mode and round.
fn print_run(s: &Summary, json: bool, mode: &str, round: u32) {
    if json {
        let mut v = serde_json::to_value(s).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("mode".into(), mode.into());
            o.insert("round".into(), round.into());
        }
        println!("{v}");
    } else {
        print!("{}", s.table());
    }
}

// ---------------------------------------------------------------------------------------------
// subscribers
// ---------------------------------------------------------------------------------------------

/// Flags of `runnev bench subscribers`.
#[derive(Debug, Clone, clap::Args)]
pub struct SubscribersArgs {
    /// SSE subscriptions opened at the follower (the nodes serve at most 1,024 by default).
    #[arg(long, default_value_t = 1000)]
    pub subscribers: usize,
    /// Batches published per second, on a fixed schedule.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Payload of each batch, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// How long to publish, in s.
    #[arg(long, default_value_t = 20)]
    pub duration_secs: u64,
    /// How long every subscriber may take to get the last batch once publishing ended, in s.
    #[arg(long, default_value_t = 120)]
    pub drain_secs: u64,
    /// The cluster this benchmark starts.
    #[command(flatten)]
    pub cluster: OwnCluster,
    /// Print the summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// What `runnev bench subscribers` measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FanOut {
    /// Subscriptions opened.
    pub subscribers: usize,
    /// The follower they were opened at.
    pub node_id: u64,
    /// Batches published (acknowledged).
    pub published: u64,
    /// Batches delivered, over all subscribers.
    pub delivered: u64,
    /// Subscribers that got every published batch.
    pub complete: usize,
    /// From the first publish to the last delivery, in s.
    pub seconds: f64,
    /// Deliveries per second over all subscribers.
    pub deliveries_per_sec: f64,
    /// Payload delivered, in MB (10^6 bytes) per second.
    pub mb_per_sec: f64,
    /// The follower's resident memory before any subscriber, in KiB.
    pub rss_before_kib: u64,
    /// With every subscriber connected and idle, in KiB.
    pub rss_idle_kib: u64,
    /// At the end, in KiB.
    pub rss_end_kib: u64,
    /// Its peak resident memory (`VmHWM`), in KiB.
    pub rss_peak_kib: u64,
    /// The publish load's own summary (the open loop's latencies, from the schedule).
    pub publish: Option<Summary>,
}

/// A field of `/proc/PID/status` given in kB (`VmRSS`, `VmHWM`); `None` if unreadable.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kib(&text, field)
}

/// The value of `field` in the text of a `/proc/PID/status` (`VmRSS:\t  1234 kB` → 1234).
fn parse_status_kib(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The ids of the leader and of one follower, from the nodes' views.
async fn leader_and_follower(c: &LocalCluster) -> Result<(u64, u64), BenchError> {
    let mut leader = None;
    for id in c.ids() {
        if let Ok(v) = c.view(id).await {
            leader = leader.or(v.leader_id);
        }
    }
    let leader = leader.ok_or_else(|| BenchError::Cluster("no node knows a leader".into()))?;
    let follower = c.ids().into_iter().find(|id| *id != leader);
    Ok((leader, follower.ok_or_else(|| BenchError::Cluster("the cluster has no follower".into()))?))
}

/// Runs `runnev bench subscribers` (see the module docs) and prints its summary.
///
/// Errors: bad flags, the cluster did not form, a subscriber saw a seq out of order or a gap, or
/// not every subscriber connected in time.
pub async fn subscribers(a: SubscribersArgs) -> Result<(), BenchError> {
    if a.subscribers == 0 || !(a.rate.is_finite() && a.rate > 0.0) || a.duration_secs == 0 {
        return Err(BenchError::Invalid("--subscribers, --rate and --duration-secs must be positive".into()));
    }
    let own = a.cluster.clone();
    cluster::run_on_own(&own, "subscribers", Duration::from_millis(READY_MS_MAX), async |c: &mut LocalCluster| {
        let f = fan_out(c, &a).await?;
        if a.json {
            println!("{}", serde_json::to_string(&f).unwrap_or_default());
        } else {
            let mib = |kib: u64| kib as f64 / 1024.0;
            println!(
                "{} SSE subscribers at follower {}: {} batches of {} B published at {}/s; {} delivered ({} subscribers complete) in {:.1} s: {:.0} deliveries/s, {:.1} MB/s",
                f.subscribers, f.node_id, f.published, a.payload_bytes, a.rate, f.delivered, f.complete, f.seconds,
                f.deliveries_per_sec, f.mb_per_sec
            );
            println!(
                "follower memory (RSS): {:.1} MiB before, {:.1} MiB with the subscribers idle ({:.1} KiB each), {:.1} MiB at the end, peak {:.1} MiB",
                mib(f.rss_before_kib),
                mib(f.rss_idle_kib),
                f.rss_idle_kib.saturating_sub(f.rss_before_kib) as f64 / f.subscribers as f64,
                mib(f.rss_end_kib),
                mib(f.rss_peak_kib)
            );
            if let Some(s) = &f.publish {
                print!("publish load: {}", s.table());
            }
        }
        if f.complete < f.subscribers {
            return Err(BenchError::Cluster(format!(
                "{} of {} subscribers did not get every batch within {} s",
                f.subscribers - f.complete,
                f.subscribers,
                a.drain_secs
            )));
        }
        Ok(())
    })
    .await
}

/// Shared by the subscriber tasks.
#[derive(Default)]
struct FanOutCounters {
    connected: AtomicU64,
    delivered: AtomicU64,
    bytes: AtomicU64,
    /// Of the last delivery, µs since the start of the load.
    last_delivery_us: AtomicU64,
}

async fn fan_out(c: &mut LocalCluster, a: &SubscribersArgs) -> Result<FanOut, BenchError> {
    const STREAM: &str = "fanout";
    let client = cluster::client(c, eager_retry_policy())?;
    client.put_stream(STREAM, None).await?;
    let (_, follower) = leader_and_follower(c).await?;
    let pid = c.get(follower).and_then(|n| n.pid()).ok_or_else(|| BenchError::Cluster("no follower pid".into()))?;
    let rss = |field| proc_status_kib(pid, field).unwrap_or(0);
    let mut f =
        FanOut { subscribers: a.subscribers, node_id: follower, rss_before_kib: rss("VmRSS"), ..FanOut::default() };

    let at_follower = Client::with_dialer(&[c.url(follower)], Arc::new(TcpDialer), eager_retry_policy())?;
    let counters = Arc::new(FanOutCounters::default());
    // The last seq published; a subscriber stops once it has it (`u64::MAX` until known).
    let (until_tx, until_rx) = tokio::sync::watch::channel(u64::MAX);
    let load_start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..a.subscribers {
        let (counters, load_start, mut until) = (counters.clone(), load_start.clone(), until_rx.clone());
        let hook_counters = counters.clone();
        let options = SubscribeOptions {
            max_outage: Some(Duration::from_secs(30)),
            on_connection: Some(Arc::new(move |e: &Connection| {
                if matches!(e, Connection::Connected { .. }) {
                    hook_counters.connected.fetch_add(1, Ordering::Relaxed);
                }
            })),
        };
        let mut sub = at_follower.subscribe_with(STREAM, 0, options);
        tasks.spawn(async move {
            let mut last = 0;
            while last < *until.borrow_and_update() {
                let delivery = tokio::select! {
                    d = sub.next() => d,
                    // The last seq became known: check it against what this one has.
                    _ = until.changed() => continue,
                };
                match delivery {
                    Some(Ok(Delivery::Batch(b))) => {
                        if b.seq <= last {
                            return Err(format!("seq {} came after seq {last}", b.seq));
                        }
                        last = b.seq;
                        counters.delivered.fetch_add(1, Ordering::Relaxed);
                        counters.bytes.fetch_add(b.data.len() as u64, Ordering::Relaxed);
                        if let Some(t) = load_start.get() {
                            counters.last_delivery_us.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                        }
                    }
                    Some(Ok(Delivery::Gap(g))) => return Err(format!("gap {}..={}", g.from, g.to)),
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err(format!("the subscription ended at seq {last}")),
                }
            }
            Ok(last)
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (counters.connected.load(Ordering::Relaxed) as usize) < a.subscribers {
        if Instant::now() >= deadline {
            return Err(BenchError::Cluster(format!(
                "{} of {} subscribers connected within 60 s",
                counters.connected.load(Ordering::Relaxed),
                a.subscribers
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.rss_idle_kib = rss("VmRSS");
    eprintln!("{} subscribers connected to node {follower}; publishing {} batches/s…", a.subscribers, a.rate);

    let spec = LoadSpec {
        payload_bytes: a.payload_bytes,
        concurrency: 64,
        streams: 1,
        count: (a.rate * a.duration_secs as f64).ceil() as u64,
        duration: Duration::from_secs(a.duration_secs),
        with_seq: false,
        frames: 1,
        rate: Some(a.rate),
    };
    let _ = load_start.set(Instant::now());
    let target = Arc::new(RunnevTarget::new(client.clone(), vec![STREAM.to_string()]));
    let s = publish::run(target, &spec, true).await.map_err(|e| BenchError::Cluster(e.to_string()))?;
    let (info, _) = client.put_stream(STREAM, None).await?;
    until_tx.send_replace(info.last_seq);
    f.published = info.last_seq;
    // Subscribers that already have the last seq stop on it; the others as it arrives.
    let drain = tokio::time::timeout(Duration::from_secs(a.drain_secs), async {
        let mut complete = 0;
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(Ok(last)) if last >= info.last_seq => complete += 1,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(BenchError::Cluster(format!("a subscriber: {e}"))),
                Err(e) => return Err(BenchError::Cluster(format!("a subscriber task: {e}"))),
            }
        }
        Ok(complete)
    })
    .await;
    f.complete = match drain {
        Ok(complete) => complete?,
        Err(_) => {
            tasks.abort_all();
            0
        }
    };
    f.delivered = counters.delivered.load(Ordering::Relaxed);
    f.seconds = counters.last_delivery_us.load(Ordering::Relaxed) as f64 / 1e6;
    if f.seconds > 0.0 {
        f.deliveries_per_sec = f.delivered as f64 / f.seconds;
        f.mb_per_sec = counters.bytes.load(Ordering::Relaxed) as f64 / 1e6 / f.seconds;
    }
    f.rss_end_kib = rss("VmRSS");
    // Linux updates the high-water mark (`VmHWM`) lazily, so it can read below a `VmRSS` taken
    // just before it (seen in CI: 36,564 against 36,596 KiB): the peak is at least every reading.
    f.rss_peak_kib = rss("VmHWM").max(f.rss_end_kib).max(f.rss_idle_kib);
    f.publish = Some(s);
    Ok(f)
}

// ---------------------------------------------------------------------------------------------
// disk
// ---------------------------------------------------------------------------------------------

/// Flags of `runnev bench disk`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiskArgs {
    /// Payload to fill the cluster with: bytes, or with a K/KiB, M/MiB, G/GiB (1024-based) or
    /// KB/MB/GB suffix.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub fill_bytes: u64,
    /// Payload of each batch, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Publishers filling, each with one publish in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Batches per publish request while filling (frames).
    #[arg(long, default_value_t = 1)]
    pub frames: usize,
    /// The nodes' `--snapshot-logs` (a snapshot every N applied log entries; default theirs).
    #[arg(long)]
    pub snapshot_logs: Option<u64>,
    /// The nodes' `--snapshot-keep-logs` (entries kept behind a snapshot; default theirs).
    #[arg(long)]
    pub snapshot_keep_logs: Option<u64>,
    /// The cluster this benchmark starts.
    #[command(flatten)]
    pub cluster: OwnCluster,
    /// Print each phase as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// Bytes the file system allocated to `path` (`st_blocks` × 512, what `du` counts: preallocated
/// space counts, holes do not), a directory's being the sum of everything under it; 0 if it is
/// gone.
pub fn allocated_bytes(path: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(path) else { return 0 };
    if !m.is_dir() {
        return m.blocks().saturating_mul(512);
    }
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries.flatten().map(|e| allocated_bytes(&e.path())).sum()
}

/// [`allocated_bytes`] of each top-level entry of the data directory `dir` (`FORMAT`, the
/// ballast, …) and of each entry of each Raft group's directory in it (`groups/0/log`,
/// `groups/0/runnev.redb`, `groups/0/snapshot.bin`, …), by name (a group's entries by their path
/// under `dir`); together they add up to [`allocated_bytes`] of `dir`.
pub fn allocated_by_entry(dir: &Path) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return by };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != runnev::storage::layout::GROUPS_DIR || !e.path().is_dir() {
            by.insert(name, allocated_bytes(&e.path()));
            continue;
        }
        for group in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
            let g = group.file_name().to_string_lossy().into_owned();
            if !group.path().is_dir() {
                by.insert(format!("{name}/{g}"), allocated_bytes(&group.path()));
                continue;
            }
            for f in std::fs::read_dir(group.path()).into_iter().flatten().flatten() {
                let key = format!("{name}/{g}/{}", f.file_name().to_string_lossy());
                by.insert(key, allocated_bytes(&f.path()));
            }
        }
    }
    by
}

/// One node's disk at one phase.
#[derive(Debug, Clone, Serialize)]
pub struct NodeDisk {
    /// The node.
    pub node_id: u64,
    /// Its data directory's allocated bytes.
    pub bytes: u64,
    /// By entry ([`allocated_by_entry`]).
    pub entries: BTreeMap<String, u64>,
}

/// How often [`DiskPhase::measure_settled`] measures, in ms.
const SETTLE_POLL_MS: u64 = 500;
/// The longest [`DiskPhase::measure_settled`] waits for the directories to settle, in ms.
const SETTLE_MS_MAX: u64 = 10_000;

/// The cluster's disk at one phase.
#[derive(Debug, Clone, Serialize)]
pub struct DiskPhase {
    /// `fresh`, `filled` or `snapshotted`.
    pub phase: &'static str,
    /// Payload the cluster holds, in bytes.
    pub payload_bytes: u64,
    /// Each node.
    pub nodes: Vec<NodeDisk>,
    /// The largest node's bytes per byte of payload (0 when there is no payload).
    pub bytes_per_payload_byte: f64,
}

impl DiskPhase {
    fn measure(c: &LocalCluster, phase: &'static str, payload_bytes: u64) -> DiskPhase {
        let nodes: Vec<NodeDisk> = c
            .ids()
            .into_iter()
            .map(|id| {
                let dir = c.data_dir(id);
                NodeDisk { node_id: id, bytes: allocated_bytes(&dir), entries: allocated_by_entry(&dir) }
            })
            .collect();
        let largest = nodes.iter().map(|n| n.bytes).max().unwrap_or(0);
        let bytes_per_payload_byte = if payload_bytes > 0 { largest as f64 / payload_bytes as f64 } else { 0.0 };
        DiskPhase { phase, payload_bytes, nodes, bytes_per_payload_byte }
    }

    /// [`DiskPhase::measure`] once the data directories stop shrinking: the log segments a
    /// purge empties are removed in the background after the purge is reported (`purged_index`),
    /// gently, so a measurement right after it could count some of them. Measures every
    /// [`SETTLE_POLL_MS`] until two measurements in a row hold the same total, for at most
    /// [`SETTLE_MS_MAX`] (then the last one).
    async fn measure_settled(c: &LocalCluster, phase: &'static str, payload_bytes: u64) -> DiskPhase {
        let total = |d: &DiskPhase| d.nodes.iter().map(|n| n.bytes).sum::<u64>();
        let deadline = Instant::now() + Duration::from_millis(SETTLE_MS_MAX);
        let mut last = DiskPhase::measure(c, phase, payload_bytes);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
            let next = DiskPhase::measure(c, phase, payload_bytes);
            let settled = total(&next) >= total(&last);
            last = next;
            if settled {
                break;
            }
        }
        last
    }

    fn print(&self, json: bool) {
        if json {
            println!("{}", serde_json::to_string(self).unwrap_or_default());
            return;
        }
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let total: u64 = self.nodes.iter().map(|n| n.bytes).sum();
        println!(
            "{}: {:.1} MiB payload; {:.1} MiB on disk over {} nodes{}",
            self.phase,
            mib(self.payload_bytes),
            mib(total),
            self.nodes.len(),
            if self.payload_bytes > 0 {
                format!(", {:.2} bytes per payload byte on the largest node", self.bytes_per_payload_byte)
            } else {
                String::new()
            }
        );
        for n in &self.nodes {
            let parts: Vec<String> =
                n.entries.iter().filter(|(_, b)| **b > 0).map(|(k, b)| format!("{k} {:.1}", mib(*b))).collect();
            println!("  node {}: {:.1} MiB ({})", n.node_id, mib(n.bytes), parts.join(", "));
        }
    }
}

/// Waits until every node of `c` has applied `index`.
async fn wait_all_applied(c: &LocalCluster, index: u64) -> Result<(), BenchError> {
    for id in c.ids() {
        c.wait_applied(id, index, Duration::from_millis(READY_MS_MAX)).await?;
    }
    Ok(())
}

/// The highest commit index any node reports.
async fn commit_index(c: &LocalCluster) -> u64 {
    let mut best = 0;
    for id in c.ids() {
        if let Ok(v) = c.view(id).await {
            best = best.max(v.commit_index);
        }
    }
    best
}

/// Runs `runnev bench disk` (see the module docs) and prints each phase.
///
/// Errors: bad flags, the cluster did not form, the fill failed, or the nodes did not snapshot
/// the fill in time.
pub async fn disk(a: DiskArgs) -> Result<(), BenchError> {
    if a.payload_bytes == 0 || a.fill_bytes < a.payload_bytes as u64 {
        return Err(BenchError::Invalid("--payload-bytes must be positive and at most --fill-bytes".into()));
    }
    let own = a.cluster.clone();
    let mut serve_args = Vec::new();
    for (flag, value) in [("--snapshot-logs", a.snapshot_logs), ("--snapshot-keep-logs", a.snapshot_keep_logs)] {
        if let Some(v) = value {
            serve_args.extend([flag.to_string(), v.to_string()]);
        }
    }
    let timeout = Duration::from_millis(READY_MS_MAX);
    cluster::run_on_own_with(&own, "disk", serve_args, timeout, async |c: &mut LocalCluster| {
        let client = cluster::client(c, eager_retry_policy())?;
        DiskPhase::measure(c, "fresh", 0).print(a.json);

        let spec = LoadSpec {
            payload_bytes: a.payload_bytes,
            concurrency: a.concurrency,
            streams: 1,
            count: a.fill_bytes / a.payload_bytes as u64,
            duration: Duration::from_secs(24 * 3600),
            with_seq: false,
            frames: a.frames,
            rate: None,
        };
        eprintln!("filling {} batches of {} B…", spec.count, spec.payload_bytes);
        let target = Arc::new(RunnevTarget::new(client.clone(), vec!["disk".into()]));
        let s = publish::run(target, &spec, true).await.map_err(|e| BenchError::Cluster(e.to_string()))?;
        if !a.json {
            print!("fill: {}", s.table());
        }
        let payload = s.published * a.payload_bytes as u64;
        let filled_index = commit_index(c).await;
        wait_all_applied(c, filled_index).await?;
        DiskPhase::measure(c, "filled", payload).print(a.json);

        // A snapshot cycle: small publishes until every node has a snapshot covering the fill
        // and has purged its log behind it.
        eprintln!("publishing small batches until every node has snapshotted index {filled_index}…");
        client.put_stream("disk-tick", None).await?;
        let deadline = Instant::now() + Duration::from_millis(SNAPSHOT_CYCLE_MS_MAX);
        loop {
            let mut pending = Vec::new();
            for id in c.ids() {
                let v = c.view(id).await.map_err(BenchError::Cluster)?;
                if v.snapshot_index.unwrap_or(0) < filled_index || v.purged_index.unwrap_or(0) == 0 {
                    pending.push(id);
                }
            }
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Cluster(format!("nodes {pending:?} did not snapshot index {filled_index}")));
            }
            let publishes = (0..100).map(|_| client.publish("disk-tick", None, bytes::Bytes::from_static(b"tick")));
            for r in futures::future::join_all(publishes).await {
                r?;
            }
        }
        wait_all_applied(c, commit_index(c).await).await?;
        DiskPhase::measure_settled(c, "snapshotted", payload).await.print(a.json);
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn proc_status_fields_in_kib() {
        let text = "Name:\trunnev\nVmHWM:\t   20480 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n";
        assert_eq!(parse_status_kib(text, "VmRSS"), Some(12345));
        assert_eq!(parse_status_kib(text, "VmHWM"), Some(20480));
        assert_eq!(parse_status_kib(text, "VmSwap"), None);
        assert_eq!(parse_status_kib("VmRSSX: 1 kB", "VmRSS"), None, "the field name is matched whole");
        assert!(proc_status_kib(std::process::id(), "VmRSS").is_some_and(|k| k > 0), "this process has memory");
    }

    #[test]
    fn allocated_bytes_count_blocks_not_length() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("log")).unwrap();
        std::fs::write(dir.path().join("log/a"), vec![1u8; 10_000]).unwrap();
        // A sparse file: 1 MiB long, no block written.
        std::fs::File::create(dir.path().join("sparse")).unwrap().set_len(1 << 20).unwrap();
        let by = allocated_by_entry(dir.path());
        assert!(by["log"] >= 10_000 && by["log"].is_multiple_of(512), "{by:?}");
        assert!(by["sparse"] < 1 << 20, "a hole takes no blocks: {by:?}");
        assert_eq!(allocated_bytes(dir.path()), by.values().sum::<u64>());
        assert_eq!(allocated_bytes(&dir.path().join("missing")), 0);
    }

    /// A group's entries are named by their path under the data directory, so a report tells
    /// its log, database and snapshot apart; they still add up to the whole.
    #[test]
    fn a_group_s_entries_are_counted_each() {
        let dir = tempfile::tempdir().unwrap();
        let group = dir.path().join("groups/0");
        std::fs::create_dir_all(group.join("log")).unwrap();
        std::fs::write(group.join("log/1.seg"), vec![1u8; 8_192]).unwrap();
        std::fs::write(group.join("snapshot.bin"), vec![2u8; 4_096]).unwrap();
        std::fs::write(dir.path().join("FORMAT"), b"runnev data format 5\n").unwrap();
        let by = allocated_by_entry(dir.path());
        let names: Vec<&str> = by.keys().map(String::as_str).collect();
        assert_eq!(names, ["FORMAT", "groups/0/log", "groups/0/snapshot.bin"]);
        assert!(by["groups/0/log"] >= 8_192, "{by:?}");
        assert_eq!(allocated_bytes(dir.path()), by.values().sum::<u64>());
    }
}
