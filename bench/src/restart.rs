//! `runnev bench restart`: how long a node restarted on a lot of data takes to be ready.
//!
//! Starts its own cluster ([`LocalCluster`]), fills it with large batches until it holds
//! `--fill-bytes` of payload (streams created without retention, so nothing is evicted), waits
//! until every node has applied the fill, then stops a follower (`SIGKILL` and/or `SIGTERM`),
//! starts it again on its data and measures, from the spawn: the first HTTP answer of any kind
//! (`answer_ms`, the process is serving), `/readyz` 200 (`ready_ms`) and the node having applied
//! the leader's commit index of before the stop (`caught_up_ms`).
//!
//! Owns: the fill, the restart rounds and their report. Must never: measure a node that did not
//! hold the whole fill when it was stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::cluster::{self, dir_bytes, eager_retry_policy, parse_size, BenchError, OwnCluster, StopSignal, Ticker};
use super::stats::Latencies;
use runnev::client::{Client, ClientError};
use runnev::launcher::{LocalCluster, PROBE_INTERVAL_MS};

/// How long the cluster may take to form or a restarted node to be ready, in ms.
const READY_MS_MAX: u64 = 120_000;
/// How long each node may take to apply the whole fill once it is acknowledged, in ms.
const APPLY_MS_MAX: u64 = 60_000;

/// Flags of `runnev bench restart`.
#[derive(Debug, Clone, clap::Args)]
pub struct RestartArgs {
    /// Payload to fill the cluster with before restarting: bytes, or with a K/KiB, M/MiB, G/GiB
    /// (1024-based) or KB/MB/GB suffix.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub fill_bytes: u64,
    /// Payload of each fill batch, in bytes (suffixes as for --fill-bytes; at most 1 MiB, the
    /// nodes' default --max-batch-bytes).
    #[arg(long, default_value = "512KiB", value_parser = parse_size)]
    pub payload_bytes: u64,
    /// Concurrent fill publishers, each on its own stream.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// How the follower is stopped: kill (SIGKILL), term (SIGTERM), or both in turn
    /// (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [StopSignal::Kill, StopSignal::Term])]
    pub signal: Vec<StopSignal>,
    /// Restarts per signal (each on the same fill).
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// The cluster this benchmark starts.
    #[command(flatten)]
    pub cluster: OwnCluster,
    /// Print each summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// One restart's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restart {
    /// The follower restarted.
    pub node: u64,
    /// How it was stopped: `kill` or `term`.
    pub signal: &'static str,
    /// Its data directory's size when stopped, in bytes.
    pub data_dir_bytes: u64,
    /// From the signal to the process being reaped, in ms.
    pub exit_ms: f64,
    /// From the spawn to the first HTTP answer (any status), in ms.
    pub answer_ms: f64,
    /// From the spawn to `/readyz` answering 200, in ms.
    pub ready_ms: f64,
    /// From the spawn to having applied the leader's commit index of before the stop, in ms.
    pub caught_up_ms: f64,
}

/// The fill's figures.
struct Fill {
    bytes: u64,
    batches: u64,
    seconds: f64,
    max_index: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Publishes `fill_bytes` of payload in `payload_bytes` batches over `concurrency` streams.
async fn fill(client: &Client, args: &RestartArgs) -> Result<Fill, BenchError> {
    let size = args.payload_bytes as usize;
    let streams: Vec<String> = (0..args.concurrency).map(|w| format!("fill-{w}")).collect();
    for s in &streams {
        // No body: no retention limits, so the fill stays whole.
        client.put_stream(s, None).await?;
    }
    let claimed = Arc::new(AtomicU64::new(0));
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let _ticker = {
        let (written, total) = (written.clone(), args.fill_bytes);
        let mut last = 0;
        Ticker::start(move |t| {
            let now = written.load(Ordering::Relaxed);
            eprintln!(
                "  {:>5.0} s: filled {:.0} of {:.0} MB ({:.1} MB/s now, {:.1} MB/s average)",
                t.as_secs_f64(),
                now as f64 / 1e6,
                total as f64 / 1e6,
                (now - last) as f64 / 1e6,
                now as f64 / 1e6 / t.as_secs_f64()
            );
            last = now;
        })
    };
    let workers: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(w, stream)| {
            let (client, claimed, written, total) = (client.clone(), claimed.clone(), written.clone(), args.fill_bytes);
            tokio::spawn(async move {
                let mut seq = 1u64;
                let mut max_index = 0;
                let mut body = vec![b'.'; size];
                while claimed.fetch_add(size as u64, Ordering::Relaxed) < total {
                    let tag = format!("w{w}-s{seq}-");
                    let n = tag.len().min(size);
                    body[..n].copy_from_slice(&tag.as_bytes()[..n]);
                    let payload = Bytes::copy_from_slice(&body);
                    // Resend the same seq and bytes until acknowledged (idempotent).
                    let ack = loop {
                        match client.publish(&stream, Some(seq), payload.clone()).await {
                            Ok(ack) => break ack,
                            Err(e @ ClientError::Api { .. }) => return Err(BenchError::from(e)),
                            Err(e) => eprintln!("  {stream} seq {seq}: {e}; resending"),
                        }
                    };
                    max_index = max_index.max(ack.index);
                    written.fetch_add(size as u64, Ordering::Relaxed);
                    seq += 1;
                }
                Ok::<_, BenchError>((seq - 1, max_index))
            })
        })
        .collect();
    let mut out = Fill { bytes: 0, batches: 0, seconds: 0.0, max_index: 0 };
    for w in workers {
        let (batches, max_index) =
            w.await.map_err(|e| BenchError::Cluster(format!("a fill publisher panicked: {e}")))??;
        out.batches += batches;
        out.max_index = out.max_index.max(max_index);
    }
    out.seconds = started.elapsed().as_secs_f64();
    out.bytes = written.load(Ordering::Relaxed);
    Ok(out)
}

/// Stops follower `node` with `signal`, restarts it and times it. `commit` is the leader's commit
/// index before the stop.
async fn restart_once(
    cluster: &mut LocalCluster,
    node: u64,
    signal: StopSignal,
    commit: u64,
) -> Result<Restart, BenchError> {
    let data_dir_bytes = dir_bytes(&cluster.data_dir(node));
    let signalled = cluster.signal(node, signal.into())?;
    let exited = cluster.wait_exit(node, Duration::from_millis(cluster::STOP_TERM_MS_MAX)).await?;
    let spawned = cluster.start_node(node)?;
    let deadline = spawned + Duration::from_millis(READY_MS_MAX);
    let mut answered = None;
    let ready = loop {
        match cluster.ready_now(node).await {
            Some(true) => break Instant::now(),
            Some(false) => {
                answered.get_or_insert_with(Instant::now);
            }
            None => {}
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Cluster(format!(
                "node {node} was not ready within {READY_MS_MAX} ms of its restart; log: {}",
                cluster.log_path(node).display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
    };
    let answered = answered.unwrap_or(ready);
    let caught_up = cluster.wait_applied(node, commit, Duration::from_millis(READY_MS_MAX)).await?;
    Ok(Restart {
        node,
        signal: signal.name(),
        data_dir_bytes,
        exit_ms: ms(exited - signalled),
        answer_ms: ms(answered - spawned),
        ready_ms: ms(ready - spawned),
        caught_up_ms: ms(caught_up - spawned),
    })
}

/// Runs the benchmark, printing progress on stderr and the summaries on stdout.
///
/// Errors: bad flags, the cluster could not be started or filled, or a restarted node was not
/// ready within the bounds above.
pub async fn run(args: RestartArgs) -> Result<(), BenchError> {
    if args.payload_bytes == 0 || args.payload_bytes > runnev::limits::BATCH_BYTES_DEFAULT as u64 {
        return Err(BenchError::Invalid(format!(
            "--payload-bytes must be 1 to {} bytes (the nodes' --max-batch-bytes)",
            runnev::limits::BATCH_BYTES_DEFAULT
        )));
    }
    if args.concurrency == 0 || args.rounds == 0 || args.signal.is_empty() {
        return Err(BenchError::Invalid("--concurrency, --rounds and --signal need at least one".into()));
    }
    if args.cluster.nodes < 2 {
        return Err(BenchError::Invalid("--nodes must be at least 2 (a follower is restarted)".into()));
    }
    let timeout = Duration::from_millis(READY_MS_MAX);
    cluster::run_on_own(&args.cluster, "restart", timeout, async |c| fill_and_restart(c, &args).await).await
}

async fn fill_and_restart(cluster: &mut LocalCluster, args: &RestartArgs) -> Result<(), BenchError> {
    let client = cluster::client(cluster, eager_retry_policy())?;
    eprintln!(
        "filling {:.0} MB in {} KiB batches over {} streams…",
        args.fill_bytes as f64 / 1e6,
        args.payload_bytes / 1024,
        args.concurrency
    );
    let f = fill(&client, args).await?;
    eprintln!(
        "filled {:.0} MB ({} batches) in {:.1} s: {:.1} MB/s; waiting for every node to apply it…",
        f.bytes as f64 / 1e6,
        f.batches,
        f.seconds,
        f.bytes as f64 / 1e6 / f.seconds
    );
    // A node that does not apply the fill in time is reported and left out: restarting it would
    // not measure a restart on the fill.
    let mut lagging = Vec::new();
    for id in cluster.ids() {
        if let Err(e) = cluster.wait_applied(id, f.max_index, Duration::from_millis(APPLY_MS_MAX)).await {
            eprintln!("warning: {e}; it is left out of the restarts");
            lagging.push(id);
        }
    }
    let mut results = Vec::new();
    let mut turn = 0usize;
    for round in 1..=args.rounds {
        for &signal in &args.signal {
            let leader = cluster.wait_leader(&lagging, true, Duration::from_millis(READY_MS_MAX)).await?.0;
            let followers: Vec<u64> =
                cluster.ids().into_iter().filter(|id| *id != leader && !lagging.contains(id)).collect();
            if followers.is_empty() {
                return Err(BenchError::Cluster(format!("no follower applied the fill (lagging: {lagging:?})")));
            }
            let node = followers[turn % followers.len()];
            turn += 1;
            let commit = cluster.view(leader).await.map_err(BenchError::Cluster)?.commit_index;
            let r = restart_once(cluster, node, signal, commit).await?;
            eprintln!(
                "round {round}: {} follower {node} ({:.0} MB on disk): exited in {:.1} ms; after its restart it answered in {:.1} ms, was ready in {:.1} ms, caught up in {:.1} ms",
                signal.name(),
                r.data_dir_bytes as f64 / 1e6,
                r.exit_ms,
                r.answer_ms,
                r.ready_ms,
                r.caught_up_ms
            );
            results.push(r);
        }
    }
    print_summary(args, &f, &results, &lagging);
    Ok(())
}

/// Median and max of one field over restarts, in ms.
fn median_max(rs: &[&Restart], field: impl Fn(&Restart) -> f64) -> (f64, f64) {
    let mut l = Latencies::default();
    for r in rs {
        l.record_us((field(r) * 1000.0).round() as u64);
    }
    (l.ms(0.5), l.ms(1.0))
}

fn print_summary(args: &RestartArgs, f: &Fill, results: &[Restart], lagging: &[u64]) {
    let mut signals: Vec<&'static str> = Vec::new();
    for r in results {
        if !signals.contains(&r.signal) {
            signals.push(r.signal);
        }
    }
    if !args.json {
        println!(
            "restart: {} nodes filled with {:.0} MB ({} batches of {} bytes) at {:.1} MB/s",
            args.cluster.nodes,
            f.bytes as f64 / 1e6,
            f.batches,
            args.payload_bytes,
            f.bytes as f64 / 1e6 / f.seconds
        );
        if !lagging.is_empty() {
            println!("nodes that did not apply the fill within {APPLY_MS_MAX} ms (not restarted): {lagging:?}");
        }
        println!(
            "{:>7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>14}",
            "signal", "rounds", "exit ms", "answer ms", "ready ms", "ready max", "caught up ms"
        );
    }
    for s in signals {
        let rs: Vec<&Restart> = results.iter().filter(|r| r.signal == s).collect();
        let (exit, _) = median_max(&rs, |r| r.exit_ms);
        let (answer, _) = median_max(&rs, |r| r.answer_ms);
        let (ready, ready_max) = median_max(&rs, |r| r.ready_ms);
        let (caught_up, _) = median_max(&rs, |r| r.caught_up_ms);
        if args.json {
            let v = serde_json::json!({
                "mode": "restart", "signal": s, "rounds": rs.len(), "nodes": args.cluster.nodes,
                "fill_bytes": f.bytes, "fill_batches": f.batches, "payload_bytes": args.payload_bytes,
                "fill_mb_per_sec": f.bytes as f64 / 1e6 / f.seconds,
                "data_dir_bytes": rs.iter().map(|r| r.data_dir_bytes).max().unwrap_or(0),
                "exit_ms": exit, "answer_ms": answer, "ready_ms": ready, "ready_max_ms": ready_max,
                "caught_up_ms": caught_up, "lagging_nodes": lagging, "restarts": rs,
            });
            println!("{v}");
        } else {
            println!(
                "{:>7} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>14.1}",
                s,
                rs.len(),
                exit,
                answer,
                ready,
                ready_max,
                caught_up
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: RestartArgs,
    }

    #[test]
    fn flags_take_sizes_and_signal_lists() {
        let c =
            Cmd::try_parse_from(["x", "--fill-bytes", "8MiB", "--payload-bytes", "256K", "--signal", "term"]).unwrap();
        assert_eq!(c.args.fill_bytes, 8 << 20);
        assert_eq!(c.args.payload_bytes, 256 << 10);
        assert_eq!(c.args.signal, vec![StopSignal::Term]);
        let d = Cmd::try_parse_from(["x"]).unwrap();
        assert_eq!(d.args.fill_bytes, 1 << 30);
        assert_eq!(d.args.signal, vec![StopSignal::Kill, StopSignal::Term]);
        assert!(Cmd::try_parse_from(["x", "--fill-bytes", "lots"]).is_err());
    }

    #[test]
    fn medians_per_field() {
        let r = |ready_ms: f64| Restart {
            node: 2,
            signal: "kill",
            data_dir_bytes: 0,
            exit_ms: 1.0,
            answer_ms: 2.0,
            ready_ms,
            caught_up_ms: ready_ms,
        };
        let rs = [r(300.0), r(100.0), r(200.0)];
        let refs: Vec<&Restart> = rs.iter().collect();
        assert_eq!(median_max(&refs, |r| r.ready_ms), (200.0, 300.0));
        assert_eq!(median_max(&refs, |r| r.exit_ms), (1.0, 1.0));
    }
}
