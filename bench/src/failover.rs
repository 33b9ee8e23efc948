//! `runnev bench failover`: how long publishes stop when the leader dies.
//!
//! Starts its own cluster ([`LocalCluster`]) and keeps publishers running, each on its own
//! stream with explicit seqs (so the client's retries are idempotent). Each trial kills the
//! current leader (`SIGKILL`, or `SIGTERM` and an immediate restart with `--action restart`)
//! and measures the *unavailability window*: from the signal to the acknowledgement of the
//! first publish sent after the old leader's process was gone (so no acknowledgement the old
//! leader sent before dying can end the window; this overstates the window by at most one
//! publish's latency). The killed node is then restarted and the next trial waits until it is
//! ready and caught up. At the end every acknowledged seq is read back from every node; a
//! missing one fails the run.
//!
//! Owns: the trial loop and its report. Must never: reuse a seq for a different payload (a
//! publish that failed is retried with the same seq and bytes until acknowledged).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::cluster::{self, eager_retry_policy, BenchError, OwnCluster, StopSignal, Ticker};
use super::stats::Latencies;
use runnev::client::{Client, ClientError};
use runnev::launcher::LocalCluster;

/// How long a trial waits for the first acknowledged publish after the kill, in ms.
const WINDOW_MS_MAX: u64 = 60_000;
/// How long a restarted node may take to be ready and caught up, in ms.
const CATCH_UP_MS_MAX: u64 = 60_000;
/// How long the cluster may take to form or to agree on a leader, in ms.
const LEADER_WAIT_MS_MAX: u64 = 30_000;
/// Steady publishing before each kill: at least this long, in ms (plus up to as much again of
/// jitter, so the kill lands at a different point of a publish each time).
const STEADY_MS_MIN: u64 = 200;
/// Batches read per request when checking for losses.
const READ_LIMIT: usize = 10_000;

/// What happens to the leader in each trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailoverAction {
    /// `kill -9` the leader; restart it once the window is measured.
    Kill,
    /// `SIGTERM` the leader (a clean shutdown) and start it again at once.
    Restart,
}

impl FailoverAction {
    fn name(self) -> &'static str {
        match self {
            FailoverAction::Kill => "kill",
            FailoverAction::Restart => "restart",
        }
    }
}

/// Flags of `runnev bench failover`.
#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    /// Trials: each stops the current leader once.
    #[arg(long, default_value_t = 20)]
    pub trials: u32,
    /// `kill`: SIGKILL the leader, restart it after the window; `restart`: SIGTERM it and start
    /// it again at once.
    #[arg(long, value_enum, default_value_t = FailoverAction::Kill)]
    pub action: FailoverAction,
    /// Concurrent publishers, each on its own stream with its own seqs.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Payload size, in bytes.
    #[arg(long, default_value_t = 128)]
    pub payload_bytes: usize,
    /// The cluster this benchmark starts.
    #[command(flatten)]
    pub cluster: OwnCluster,
    /// Print the summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// One trial's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Trial {
    /// The node that was stopped (the leader).
    pub stopped: u64,
    /// The leader after the trial.
    pub new_leader: u64,
    /// From the signal to the next acknowledged publish, in ms.
    pub window_ms: f64,
    /// From the signal to the old leader's process being reaped, in ms.
    pub exit_ms: f64,
    /// From the stopped node's restart (spawn) to its `/readyz` answering 200, in ms.
    pub ready_ms: f64,
}

/// Where the trial loop and the publishers meet: the current trial's instants.
#[derive(Default)]
struct Watch {
    /// When the stopped leader's process was seen gone; publishes sent after it count.
    dead_at: Option<Instant>,
    /// When the first publish sent after `dead_at` was acknowledged.
    first_ack: Option<Instant>,
}

/// What a publisher hands back: its stream, the seqs acknowledged, and counts.
struct Published {
    stream: String,
    acked: Vec<u64>,
    max_index: u64,
    duplicates: u64,
    errors: u64,
}

fn payload(worker: usize, seq: u64, size: usize) -> Bytes {
    let mut p = vec![b'.'; size];
    let tag = format!("w{worker}-s{seq}-");
    let n = tag.len().min(size);
    p[..n].copy_from_slice(&tag.as_bytes()[..n]);
    Bytes::from(p)
}

#[allow(clippy::too_many_arguments)]
async fn publisher(
    client: Client,
    worker: usize,
    stream: String,
    size: usize,
    stop: Arc<AtomicBool>,
    watch: Arc<Mutex<Watch>>,
    acks: Arc<AtomicU64>,
    errors_seen: Arc<AtomicU64>,
) -> Result<Published, BenchError> {
    let mut out = Published { stream, acked: Vec::new(), max_index: 0, duplicates: 0, errors: 0 };
    let mut seq = 1;
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        match client.publish(&out.stream, Some(seq), payload(worker, seq, size)).await {
            Ok(ack) => {
                let at = Instant::now();
                {
                    let mut w = watch.lock().unwrap_or_else(|p| p.into_inner());
                    if w.first_ack.is_none() && w.dead_at.is_some_and(|d| sent >= d) {
                        w.first_ack = Some(at);
                    }
                }
                if ack.seq != seq {
                    return Err(BenchError::Cluster(format!(
                        "{}: published seq {seq}, acknowledged as seq {}",
                        out.stream, ack.seq
                    )));
                }
                out.acked.push(seq);
                out.max_index = out.max_index.max(ack.index);
                out.duplicates += u64::from(ack.duplicate);
                acks.fetch_add(1, Ordering::Relaxed);
                seq += 1;
            }
            // A definitive refusal (409, 404, 413…) is a bug here, not an outage.
            Err(e @ ClientError::Api { .. }) => return Err(e.into()),
            // Unavailable or outcome unknown: resend the same seq and bytes.
            Err(_) => {
                out.errors += 1;
                errors_seen.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(out)
}

/// Reads `stream` back from one node (after it applied `min_index`); every seq it holds.
async fn read_seqs(node: &str, stream: &str, min_index: u64) -> Result<BTreeSet<u64>, BenchError> {
    let client = Client::new(&[node.to_string()])?;
    let mut seqs = BTreeSet::new();
    let mut after = 0;
    let mut min = Some(min_index);
    loop {
        let a = client.read_at(stream, after, READ_LIMIT, 0, min.take()).await?;
        if a.batches.is_empty() {
            return Ok(seqs);
        }
        seqs.extend(a.batches.iter().map(|b| b.seq));
        after = a.next_after;
    }
}

/// Runs the benchmark, printing progress on stderr and the summary on stdout.
///
/// Errors: the cluster could not be started or did not recover within the bounds above, a
/// publish was refused, or an acknowledged batch is missing ([`BenchError::Lost`]).
pub async fn run(args: FailoverArgs) -> Result<(), BenchError> {
    if args.trials == 0 || args.concurrency == 0 {
        return Err(BenchError::Invalid("--trials and --concurrency must be at least 1".into()));
    }
    if args.cluster.nodes < 3 {
        return Err(BenchError::Invalid("--nodes must be at least 3 (a majority must survive a kill)".into()));
    }
    let timeout = Duration::from_millis(LEADER_WAIT_MS_MAX);
    cluster::run_on_own(&args.cluster, "failover", timeout, async |c| trials(c, &args).await).await
}

async fn trials(cluster: &mut LocalCluster, args: &FailoverArgs) -> Result<(), BenchError> {
    let client = cluster::client(cluster, eager_retry_policy())?;
    let streams: Vec<String> = (0..args.concurrency).map(|w| format!("failover-{w}")).collect();
    for s in &streams {
        client.put_stream(s, None).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watch = Arc::new(Mutex::new(Watch::default()));
    let acks = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(w, s)| {
            tokio::spawn(publisher(
                client.clone(),
                w,
                s.clone(),
                args.payload_bytes,
                stop.clone(),
                watch.clone(),
                acks.clone(),
                errors.clone(),
            ))
        })
        .collect();
    let _ticker = {
        let (acks, errors) = (acks.clone(), errors.clone());
        let mut last = 0;
        Ticker::start(move |t| {
            let now = acks.load(Ordering::Relaxed);
            eprintln!(
                "  {:>5.0} s: {now} acknowledged ({}/s), {} publish attempts failed and were resent",
                t.as_secs_f64(),
                now - last,
                errors.load(Ordering::Relaxed)
            );
            last = now;
        })
    };

    let outcome = run_trials(cluster, args, &watch, &acks).await;
    stop.store(true, Ordering::Relaxed);
    let mut published = Vec::new();
    for w in workers {
        match w.await {
            Ok(Ok(p)) => published.push(p),
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(BenchError::Cluster(format!("a publisher panicked: {e}"))),
        }
    }
    let trials = outcome?;

    // Every acknowledged seq must be on every node.
    let max_index = published.iter().map(|p| p.max_index).max().unwrap_or(0);
    let mut lost = 0u64;
    let mut first_lost = None;
    for id in cluster.ids() {
        let node = cluster.url(id);
        for p in &published {
            let have = read_seqs(&node, &p.stream, max_index).await?;
            for seq in p.acked.iter().filter(|s| !have.contains(s)) {
                lost += 1;
                first_lost.get_or_insert_with(|| format!("node {id} {} {seq}", p.stream));
            }
        }
    }
    let acked: u64 = published.iter().map(|p| p.acked.len() as u64).sum();
    let duplicates: u64 = published.iter().map(|p| p.duplicates).sum();
    let resent: u64 = published.iter().map(|p| p.errors).sum();
    print_summary(args, &trials, acked, duplicates, resent, lost);
    match first_lost {
        None => Ok(()),
        Some(first) => Err(BenchError::Lost { lost, first }),
    }
}

async fn run_trials(
    cluster: &mut LocalCluster,
    args: &FailoverArgs,
    watch: &Mutex<Watch>,
    acks: &AtomicU64,
) -> Result<Vec<Trial>, BenchError> {
    let mut trials = Vec::new();
    let signal = match args.action {
        FailoverAction::Kill => StopSignal::Kill,
        FailoverAction::Restart => StopSignal::Term,
    };
    for n in 1..=args.trials {
        let leader = cluster.wait_leader(&[], true, Duration::from_millis(LEADER_WAIT_MS_MAX)).await?.0;
        // Publishing must be flowing before the kill, or the window would include a warm-up.
        let before = acks.load(Ordering::Relaxed);
        let jitter = u64::from(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos(),
        ) % STEADY_MS_MIN;
        tokio::time::sleep(Duration::from_millis(STEADY_MS_MIN + jitter)).await;
        let steady_deadline = Instant::now() + Duration::from_millis(WINDOW_MS_MAX);
        while acks.load(Ordering::Relaxed) == before {
            if Instant::now() >= steady_deadline {
                return Err(BenchError::Cluster(format!(
                    "no publish was acknowledged for {WINDOW_MS_MAX} ms before trial {n}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        *watch.lock().unwrap_or_else(|p| p.into_inner()) = Watch::default();

        let signalled = cluster.signal(leader, signal.into())?;
        let dead = cluster.wait_exit(leader, Duration::from_millis(cluster::STOP_TERM_MS_MAX)).await?;
        watch.lock().unwrap_or_else(|p| p.into_inner()).dead_at = Some(dead);
        let mut spawned = None;
        if args.action == FailoverAction::Restart {
            spawned = Some(cluster.start_node(leader)?);
        }
        let window_deadline = signalled + Duration::from_millis(WINDOW_MS_MAX);
        let first_ack = loop {
            if let Some(at) = watch.lock().unwrap_or_else(|p| p.into_inner()).first_ack {
                break at;
            }
            if Instant::now() >= window_deadline {
                return Err(BenchError::Cluster(format!(
                    "trial {n}: no publish was acknowledged within {WINDOW_MS_MAX} ms of stopping leader {leader}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let new_leader = cluster.wait_leader(&[], true, Duration::from_millis(LEADER_WAIT_MS_MAX)).await?.0;
        let spawned = match spawned {
            Some(at) => at,
            None => cluster.start_node(leader)?,
        };
        let ready = cluster.wait_ready(leader, Duration::from_millis(CATCH_UP_MS_MAX)).await?;
        // Caught up: it has applied what the leader had committed once it was ready.
        let target = cluster.view(new_leader).await.map_err(BenchError::Cluster)?.commit_index;
        cluster.wait_applied(leader, target, Duration::from_millis(CATCH_UP_MS_MAX)).await?;
        let t = Trial {
            stopped: leader,
            new_leader,
            window_ms: ms(first_ack - signalled),
            exit_ms: ms(dead - signalled),
            ready_ms: ms(ready - spawned),
        };
        eprintln!(
            "trial {n}/{}: {} leader {leader}: next publish acknowledged after {:.1} ms (new leader {new_leader}); node {leader} ready {:.1} ms after its restart",
            args.trials,
            args.action.name(),
            t.window_ms,
            t.ready_ms
        );
        trials.push(t);
    }
    Ok(trials)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Window figures over the trials: (median, p90, max, min), in ms.
fn window_summary(trials: &[Trial]) -> (f64, f64, f64, f64) {
    let mut l = Latencies::default();
    for t in trials {
        l.record_us((t.window_ms * 1000.0).round() as u64);
    }
    (l.ms(0.5), l.ms(0.9), l.ms(1.0), l.ms(0.0))
}

fn print_summary(args: &FailoverArgs, trials: &[Trial], acked: u64, duplicates: u64, resent: u64, lost: u64) {
    let (median, p90, max, min) = window_summary(trials);
    let mut ready = Latencies::default();
    for t in trials {
        ready.record_us((t.ready_ms * 1000.0).round() as u64);
    }
    if args.json {
        let v = serde_json::json!({
            "mode": "failover", "action": args.action.name(), "trials": trials.len(),
            "concurrency": args.concurrency, "payload_bytes": args.payload_bytes, "nodes": args.cluster.nodes,
            "median_ms": median, "p90_ms": p90, "max_ms": max, "min_ms": min,
            "windows_ms": trials.iter().map(|t| t.window_ms).collect::<Vec<_>>(),
            "ready_median_ms": ready.ms(0.5), "ready_max_ms": ready.ms(1.0),
            "acked": acked, "lost": lost, "duplicates": duplicates, "resent": resent,
            "trial_details": trials,
        });
        println!("{v}");
        return;
    }
    println!(
        "failover: {} trials, {} the leader, {} publishers on {} nodes",
        trials.len(),
        args.action.name(),
        args.concurrency,
        args.cluster.nodes
    );
    println!(
        "{:>6} {:>8} {:>11} {:>10} {:>8} {:>9}",
        "trial", "stopped", "new leader", "window ms", "exit ms", "ready ms"
    );
    for (i, t) in trials.iter().enumerate() {
        println!(
            "{:>6} {:>8} {:>11} {:>10.1} {:>8.1} {:>9.1}",
            i + 1,
            t.stopped,
            t.new_leader,
            t.window_ms,
            t.exit_ms,
            t.ready_ms
        );
    }
    println!("{:>12} {:>10} {:>10} {:>10}", "window ms:", "median", "p90", "max");
    println!("{:>12} {:>10.1} {:>10.1} {:>10.1}", "", median, p90, max);
    println!("acknowledged {acked}, lost {lost}, duplicate acks {duplicates}, resent after an error {resent}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(window_ms: f64) -> Trial {
        Trial { stopped: 1, new_leader: 2, window_ms, exit_ms: 1.0, ready_ms: 100.0 }
    }

    #[test]
    fn window_summary_is_nearest_rank() {
        let trials: Vec<Trial> = [900.0, 700.0, 800.0, 1200.0, 600.0].into_iter().map(trial).collect();
        assert_eq!(window_summary(&trials), (800.0, 1200.0, 1200.0, 600.0));
        assert_eq!(window_summary(&[]), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn payloads_are_tagged_and_sized() {
        let p = payload(3, 42, 32);
        assert_eq!(p.len(), 32);
        assert!(p.starts_with(b"w3-s42-"));
        assert_eq!(payload(3, 42, 4).as_ref(), b"w3-s");
        assert_eq!(payload(3, 42, 32), payload(3, 42, 32), "a resend carries the same bytes");
    }
}
