//! `runnev bench membership`: how long publishing pauses while the cluster grows and shrinks.
//!
//! Starts its own cluster ([`LocalCluster`]), keeps publishers running (each on its own stream with
//! its own seqs, so the client's retries are idempotent), then, `--rounds` times: starts two new
//! nodes outside the configuration, adds them as voters one at a time (learner, caught up,
//! promoted: Raft paper §6), removes them again one at a time, and stops them (a removed node
//! left running could disrupt the cluster by standing for election, Raft paper §6). For every change it
//! measures how long the change took (request to answer) and the longest stretch without any
//! acknowledged publish while it ran: the pause publishers saw. At the end every acknowledged seq
//! is read back from every voter; a missing one fails the run.
//!
//! Owns: the change loop and its report. Must never: reuse a seq for a different payload (a
//! publish that failed is resent with the same seq and bytes until acknowledged).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::cluster::{self, eager_retry_policy, BenchError, OwnCluster};
use super::stats::Latencies;
use runnev::client::{Client, ClientError};
use runnev::launcher::LocalCluster;

/// How long the cluster may take to form or to agree on a leader, and a spare node to answer
/// `/healthz`, in ms.
const LEADER_WAIT_MS_MAX: u64 = 30_000;
/// Batches read per request when checking for losses.
const READ_LIMIT: usize = 10_000;
/// Steady publishing before the first change and between two changes, in ms.
const SETTLE_MS: u64 = 300;

/// Flags of `runnev bench membership`.
#[derive(Debug, Clone, clap::Args)]
pub struct MembershipArgs {
    /// Rounds: each adds the two spare nodes as voters and removes them again.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Concurrent publishers, each on its own stream with its own seqs.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Payload size, in bytes.
    #[arg(long, default_value_t = 128)]
    pub payload_bytes: usize,
    /// The cluster this benchmark starts (the spares come on top of `--nodes`).
    #[command(flatten)]
    pub cluster: OwnCluster,
    /// Print the summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// One membership change's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Change {
    /// `add` or `remove`.
    pub action: &'static str,
    /// The node added or removed.
    pub node: u64,
    /// From sending the change to its answer, in ms.
    pub change_ms: f64,
    /// The longest stretch without an acknowledged publish between sending the change and
    /// its answer (from the last acknowledgement before it), in ms.
    pub longest_pause_ms: f64,
    /// Publishes acknowledged while the change ran.
    pub acked_during: u64,
}

/// What a publisher hands back: its stream, the seqs acknowledged, and counts.
struct Published {
    stream: String,
    acked: Vec<u64>,
    max_index: u64,
    resent: u64,
}

fn payload(worker: usize, seq: u64, size: usize) -> Bytes {
    let mut p = vec![b'.'; size];
    let tag = format!("m{worker}-s{seq}-");
    let n = tag.len().min(size);
    p[..n].copy_from_slice(&tag.as_bytes()[..n]);
    Bytes::from(p)
}

async fn publisher(
    client: Client,
    worker: usize,
    stream: String,
    size: usize,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Instant>>>,
) -> Result<Published, BenchError> {
    let mut out = Published { stream, acked: Vec::new(), max_index: 0, resent: 0 };
    let mut seq = 1;
    while !stop.load(Ordering::Relaxed) {
        match client.publish(&out.stream, Some(seq), payload(worker, seq, size)).await {
            Ok(ack) => {
                acks.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now());
                if ack.seq != seq {
                    return Err(BenchError::Cluster(format!(
                        "{}: published seq {seq}, acknowledged as seq {}",
                        out.stream, ack.seq
                    )));
                }
                out.acked.push(seq);
                out.max_index = out.max_index.max(ack.index);
                seq += 1;
            }
            // A definitive refusal (409, 404, 413…) is a bug here, not an outage.
            Err(e @ ClientError::Api { .. }) => return Err(e.into()),
            // Unavailable or outcome unknown: resend the same seq and bytes.
            Err(_) => out.resent += 1,
        }
    }
    Ok(out)
}

/// The longest stretch without an acknowledgement in `[from, to]`, counting from the last
/// acknowledgement before `from` (or `from`), and the acknowledgements inside it.
fn longest_pause(acks: &[Instant], from: Instant, to: Instant) -> (Duration, u64) {
    let mut last = acks.iter().rev().find(|a| **a <= from).copied().unwrap_or(from);
    let mut longest = Duration::ZERO;
    let mut n = 0;
    for a in acks.iter().filter(|a| **a > from && **a <= to) {
        longest = longest.max(a.duration_since(last));
        last = *a;
        n += 1;
    }
    (longest.max(to.duration_since(last)), n)
}

/// Runs the benchmark, printing progress on stderr and the summary on stdout.
///
/// Errors: the cluster could not be started, a change failed, a publish was refused, or an
/// acknowledged batch is missing ([`BenchError::Lost`]).
pub async fn run(args: MembershipArgs) -> Result<(), BenchError> {
    if args.rounds == 0 || args.concurrency == 0 {
        return Err(BenchError::Invalid("--rounds and --concurrency must be at least 1".into()));
    }
    let timeout = Duration::from_millis(LEADER_WAIT_MS_MAX);
    cluster::run_on_own(&args.cluster, "membership", timeout, async |c| changes(c, &args).await).await
}

async fn changes(cluster: &mut LocalCluster, args: &MembershipArgs) -> Result<(), BenchError> {
    let voters = cluster.ids();
    // Publishers and the admin client talk to the original voters, which stay members.
    let urls: Vec<String> = voters.iter().map(|id| cluster.url(*id)).collect();
    let client = Client::with_dialer(&urls, Arc::new(runnev::net::TcpDialer), eager_retry_policy())?;
    let streams: Vec<String> = (0..args.concurrency).map(|w| format!("membership-{w}")).collect();
    for s in &streams {
        client.put_stream(s, None).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(w, s)| {
            tokio::spawn(publisher(client.clone(), w, s.clone(), args.payload_bytes, stop.clone(), acks.clone()))
        })
        .collect();
    let outcome = run_changes(cluster, args, &client, &acks).await;
    stop.store(true, Ordering::Relaxed);
    let mut published = Vec::new();
    for w in workers {
        match w.await {
            Ok(Ok(p)) => published.push(p),
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(BenchError::Cluster(format!("a publisher panicked: {e}"))),
        }
    }
    let changes = outcome?;

    let max_index = published.iter().map(|p| p.max_index).max().unwrap_or(0);
    let mut lost = 0u64;
    let mut first_lost = None;
    for id in &voters {
        let node = Client::new(&[cluster.url(*id)])?;
        for p in &published {
            let mut have = BTreeSet::new();
            let (mut after, mut min) = (0, Some(max_index));
            loop {
                let a = node.read_at(&p.stream, after, READ_LIMIT, 0, min.take()).await?;
                if a.batches.is_empty() {
                    break;
                }
                have.extend(a.batches.iter().map(|b| b.seq));
                after = a.next_after;
            }
            for seq in p.acked.iter().filter(|s| !have.contains(s)) {
                lost += 1;
                first_lost.get_or_insert_with(|| format!("node {id} {} {seq}", p.stream));
            }
        }
    }
    let acked: u64 = published.iter().map(|p| p.acked.len() as u64).sum();
    let resent: u64 = published.iter().map(|p| p.resent).sum();
    print_summary(args, &changes, acked, resent, lost);
    match first_lost {
        None => Ok(()),
        Some(first) => Err(BenchError::Lost { lost, first }),
    }
}

async fn run_changes(
    cluster: &mut LocalCluster,
    args: &MembershipArgs,
    client: &Client,
    acks: &Mutex<Vec<Instant>>,
) -> Result<Vec<Change>, BenchError> {
    let mut changes = Vec::new();
    let total = args.rounds as usize * 4;
    for round in 0..u64::from(args.rounds) {
        let spares = [args.cluster.nodes + 1 + 2 * round, args.cluster.nodes + 2 + 2 * round];
        for id in spares {
            cluster.add_node(id)?;
            cluster.wait_healthy(id, Duration::from_millis(LEADER_WAIT_MS_MAX)).await?;
        }
        for (action, &node) in spares.iter().map(|n| ("add", n)).chain(spares.iter().map(|n| ("remove", n))) {
            tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
            let from = Instant::now();
            match action {
                "add" => client.add_member(node, &cluster.node(node)?.addr(), true).await?,
                _ => client.remove_member(node).await?.0,
            };
            let to = Instant::now();
            let (pause, n) = longest_pause(&acks.lock().unwrap_or_else(|p| p.into_inner()), from, to);
            let c = Change { action, node, change_ms: ms(to - from), longest_pause_ms: ms(pause), acked_during: n };
            eprintln!(
                "change {}/{total}: {action} node {node}: {:.1} ms, longest pause {:.1} ms, {n} publishes acknowledged meanwhile",
                changes.len() + 1,
                c.change_ms,
                c.longest_pause_ms
            );
            changes.push(c);
        }
        for id in spares {
            cluster.stop(id, Duration::from_millis(cluster::STOP_TERM_MS_MAX)).await?;
        }
    }
    Ok(changes)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn print_summary(args: &MembershipArgs, changes: &[Change], acked: u64, resent: u64, lost: u64) {
    let mut pauses = Latencies::default();
    let mut durations = Latencies::default();
    for c in changes {
        pauses.record_us((c.longest_pause_ms * 1000.0).round() as u64);
        durations.record_us((c.change_ms * 1000.0).round() as u64);
    }
    if args.json {
        let v = serde_json::json!({
            "mode": "membership", "rounds": args.rounds, "changes": changes.len(),
            "concurrency": args.concurrency, "payload_bytes": args.payload_bytes, "nodes": args.cluster.nodes,
            "pause_median_ms": pauses.ms(0.5), "pause_max_ms": pauses.ms(1.0),
            "change_median_ms": durations.ms(0.5), "change_max_ms": durations.ms(1.0),
            "acked": acked, "lost": lost, "resent": resent, "change_details": changes,
        });
        println!("{v}");
        return;
    }
    println!(
        "membership: {} changes ({} rounds of adding and removing 2 voters), {} publishers on {} nodes",
        changes.len(),
        args.rounds,
        args.concurrency,
        args.cluster.nodes
    );
    println!("{:>7} {:>5} {:>10} {:>17} {:>14}", "action", "node", "change ms", "longest pause ms", "acked during");
    for c in changes {
        println!(
            "{:>7} {:>5} {:>10.1} {:>17.1} {:>14}",
            c.action, c.node, c.change_ms, c.longest_pause_ms, c.acked_during
        );
    }
    println!(
        "longest pause: median {:.1} ms, max {:.1} ms; change: median {:.1} ms, max {:.1} ms",
        pauses.ms(0.5),
        pauses.ms(1.0),
        durations.ms(0.5),
        durations.ms(1.0)
    );
    println!("acknowledged {acked}, lost {lost}, resent after an error {resent}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_pause_counts_from_the_last_ack_before_the_change() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let acks = [at(0), at(10), at(100), at(130), at(400)];
        // Change from 50 to 300: pauses 10→100 (90), 100→130 (30), 130→300 (170).
        assert_eq!(longest_pause(&acks, at(50), at(300)), (Duration::from_millis(170), 2));
        // No ack during the change: the whole stretch since the last one.
        assert_eq!(longest_pause(&acks, at(140), at(200)), (Duration::from_millis(70), 0));
        assert_eq!(longest_pause(&[], at(10), at(20)), (Duration::from_millis(10), 0));
    }

    #[test]
    fn payloads_are_tagged_and_sized() {
        let p = payload(2, 9, 16);
        assert_eq!(p.len(), 16);
        assert!(p.starts_with(b"m2-s9-"));
    }
}
