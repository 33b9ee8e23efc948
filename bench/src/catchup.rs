//! `runnev bench catchup`: how fast one consumer catches up on a stream, reading from a follower.
//!
//! Against a running cluster (`--nodes`): fills a stream until it holds `--batches` batches
//! (publishing only what is missing, so a second run reuses the stream), picks a follower
//! (or `--read-node`), waits until it has applied the fill, and reads the whole stream from
//! cursor 0 to its last seq as one consumer, end to end through the client: first with
//! `GET …/batches?after=C&limit=10000` (`poll`, through the client's `catch_up`: binary records,
//! or JSON and base64 from a node of a build without them; the next read asked for while this
//! one is handed out), then with an SSE subscription (`sse`: JSON events with base64 payloads,
//! unless `--skip-sse`). Reports payload MB/s and batches/s for each.
//!
//! Owns: the fill, the two read loops and their report. Must never: count a batch twice or
//! accept an out-of-order seq (each read checks seqs strictly increase).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

use super::cluster::{BenchError, Ticker};
use super::stats::Latencies;
use runnev::client::{Client, Delivery};

/// How long the read node may take to apply the fill, in ms (a read's `min_index` wait is
/// bounded by the server at 10 s; this retries past it).
const APPLY_MS_MAX: u64 = 300_000;

/// Flags of `runnev bench catchup`.
#[derive(Debug, Clone, clap::Args)]
pub struct CatchupArgs {
    /// Nodes to talk to, comma-separated base URLs.
    #[arg(long = "nodes", env = "RUNNEV_NODES", default_value = runnev::client::DEFAULT_NODES)]
    pub nodes: String,
    /// The token to send (nodes run with --auth).
    #[arg(long = "token", env = "RUNNEV_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The cluster CA's certificate: speak TLS to the nodes and verify them with it.
    #[arg(long = "ca-file", env = "RUNNEV_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Stream to read (created and filled up to --batches if it holds fewer).
    #[arg(long, default_value = "catchup")]
    pub stream: String,
    /// Batches the stream must hold before the read.
    #[arg(long, default_value_t = 200_000)]
    pub batches: u64,
    /// Payload size of the batches published to fill it, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Concurrent publishers while filling.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Node to read from, a base URL (default: a follower of the current leader).
    #[arg(long)]
    pub read_node: Option<String>,
    /// Batches per read request (1–10 000).
    #[arg(long, default_value_t = runnev::limits::READ_BATCHES_MAX)]
    pub limit: usize,
    /// Measure only the polling read, not the SSE subscription.
    #[arg(long)]
    pub skip_sse: bool,
    /// Print each summary as one JSON line.
    #[arg(long)]
    pub json: bool,
}

/// One read's figures.
#[derive(Debug, Clone, Default)]
pub struct ReadFigures {
    /// Batches read.
    pub batches: u64,
    /// Payload bytes read (decoded).
    pub bytes: u64,
    /// Wall time of the read, in seconds.
    pub seconds: f64,
    /// Latency of each read request, in µs (poll only).
    pub requests: Latencies,
}

impl ReadFigures {
    /// Payload throughput, in MB/s (10^6 bytes).
    pub fn mb_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / 1e6 / self.seconds
        } else {
            0.0
        }
    }

    /// Batches per second.
    pub fn batches_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.batches as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Progress counters shared with the ticker.
#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    bytes: AtomicU64,
}

fn progress(label: &'static str, c: Arc<Counters>, total: u64) -> Ticker {
    let (mut last_b, mut last_n) = (0, 0);
    Ticker::start(move |t| {
        let (n, b) = (c.batches.load(Ordering::Relaxed), c.bytes.load(Ordering::Relaxed));
        eprintln!(
            "  {:>5.0} s: {label} {n} of {total} batches, {:.1} MB ({:.0} batches/s, {:.1} MB/s now)",
            t.as_secs_f64(),
            b as f64 / 1e6,
            (n - last_n) as f64,
            (b - last_b) as f64 / 1e6
        );
        (last_n, last_b) = (n, b);
    })
}

/// Publishes `count` batches without seqs; returns the highest log index acknowledged.
async fn fill(client: &Client, args: &CatchupArgs, count: u64) -> Result<u64, BenchError> {
    let c = Arc::new(Counters::default());
    let _ticker = progress("published", c.clone(), count);
    let next = Arc::new(AtomicU64::new(0));
    let payload = Bytes::from(vec![b'c'; args.payload_bytes]);
    let started = Instant::now();
    let workers: Vec<_> = (0..args.concurrency.max(1))
        .map(|_| {
            let (client, next, c, payload, stream) =
                (client.clone(), next.clone(), c.clone(), payload.clone(), args.stream.clone());
            tokio::spawn(async move {
                let mut max_index = 0;
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let ack = client.publish(&stream, None, payload.clone()).await?;
                    max_index = max_index.max(ack.index);
                    c.batches.fetch_add(1, Ordering::Relaxed);
                    c.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, BenchError>(max_index)
            })
        })
        .collect();
    let mut max_index = 0;
    for w in workers {
        max_index = max_index.max(w.await.map_err(|e| BenchError::Cluster(format!("a publisher panicked: {e}")))??);
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("published {count} batches in {secs:.1} s ({:.0} batches/s)", count as f64 / secs);
    Ok(max_index)
}

/// Reads `stream` on `client`'s one node from cursor 0 through `last_seq` with `limit` per request.
async fn read_poll(client: &Client, stream: &str, last_seq: u64, limit: usize) -> Result<ReadFigures, BenchError> {
    let c = Arc::new(Counters::default());
    let _ticker = progress("read (poll)", c.clone(), last_seq);
    let mut f = ReadFigures::default();
    let mut after = 0;
    let mut reads = client.catch_up(stream, 0, limit);
    let started = Instant::now();
    while after < last_seq {
        let t = Instant::now();
        let a = reads.next().await?;
        f.requests.record_us(t.elapsed().as_micros() as u64);
        if a.batches.is_empty() {
            return Err(BenchError::Cluster(format!("{stream}: an empty read after seq {after}, before {last_seq}")));
        }
        for b in &a.batches {
            if b.seq <= after {
                return Err(BenchError::Cluster(format!("{stream}: seq {} came after seq {after}", b.seq)));
            }
            after = b.seq;
            f.batches += 1;
            f.bytes += b.data.len() as u64;
        }
        c.batches.store(f.batches, Ordering::Relaxed);
        c.bytes.store(f.bytes, Ordering::Relaxed);
    }
    f.seconds = started.elapsed().as_secs_f64();
    Ok(f)
}

/// Reads `stream` on `client`'s one node from cursor 0 through `last_seq` as an SSE subscription.
async fn read_sse(client: &Client, stream: &str, last_seq: u64) -> Result<ReadFigures, BenchError> {
    let c = Arc::new(Counters::default());
    let _ticker = progress("read (sse)", c.clone(), last_seq);
    let mut f = ReadFigures::default();
    let started = Instant::now();
    let mut sub = client.subscribe(stream, 0);
    let mut after = 0;
    while after < last_seq {
        match sub.next().await {
            Some(Ok(Delivery::Batch(b))) => {
                if b.seq <= after {
                    return Err(BenchError::Cluster(format!("{stream}: seq {} came after seq {after}", b.seq)));
                }
                after = b.seq;
                f.batches += 1;
                f.bytes += b.data.len() as u64;
                if f.batches % 1024 == 0 {
                    c.batches.store(f.batches, Ordering::Relaxed);
                    c.bytes.store(f.bytes, Ordering::Relaxed);
                }
            }
            Some(Ok(Delivery::Gap(g))) => {
                return Err(BenchError::Cluster(format!(
                    "{stream}: gap {}..={} (retention evicted batches)",
                    g.from, g.to
                )))
            }
            Some(Err(e)) => return Err(e.into()),
            None => return Err(BenchError::Cluster(format!("{stream}: the subscription ended at seq {after}"))),
        }
    }
    f.seconds = started.elapsed().as_secs_f64();
    Ok(f)
}

/// Picks the node to read from: `--read-node`, else the first node that is not the leader.
/// Returns (url, its node id, the leader id).
async fn pick_node(client: &Client, args: &CatchupArgs) -> Result<(String, u64, Option<u64>), BenchError> {
    let mut views = Vec::new();
    for n in client.nodes() {
        if let Ok(v) = client.cluster_view(n).await {
            views.push((n.clone(), v.node_id, v.leader_id));
        }
    }
    let leader = views.iter().find_map(|v| v.2);
    if let Some(url) = &args.read_node {
        let url = url.trim_end_matches('/').to_string();
        let v = client.cluster_view(&url).await?;
        return Ok((url, v.node_id, leader));
    }
    match views.iter().find(|v| Some(v.1) != leader) {
        Some((url, id, _)) => Ok((url.clone(), *id, leader)),
        None => {
            eprintln!("no follower answered; reading from the leader");
            let (url, id, _) = views.first().ok_or_else(|| BenchError::Cluster("no node answered".into()))?;
            Ok((url.clone(), *id, leader))
        }
    }
}

/// Runs the benchmark, printing progress on stderr and the summaries on stdout.
///
/// Errors: bad flags, the cluster refused the fill or a read, or a read saw seqs out of order.
pub async fn run(args: CatchupArgs) -> Result<(), BenchError> {
    if args.limit == 0 || args.limit > runnev::limits::READ_BATCHES_MAX {
        return Err(BenchError::Invalid(format!("--limit must be 1 to {}", runnev::limits::READ_BATCHES_MAX)));
    }
    let token = args
        .token
        .as_deref()
        .filter(|t| !t.trim().is_empty())
        .map(|t| runnev::auth::Token::parse(t.trim()))
        .transpose()
        .map_err(|e| BenchError::Invalid(format!("--token: {e}")))?;
    let secure = |nodes: &[String]| Client::secure(nodes, args.ca_file.as_deref(), token.clone());
    let client = secure(&Client::parse_nodes(&args.nodes))?;
    let (info, _) = client.put_stream(&args.stream, None).await?;
    let missing = args.batches.saturating_sub(info.batches);
    let mut min_index = 0;
    if missing > 0 {
        eprintln!(
            "{}: holds {} batches; publishing {missing} of {} bytes…",
            args.stream, info.batches, args.payload_bytes
        );
        min_index = fill(&client, &args, missing).await?;
    }
    let (url, node_id, leader) = pick_node(&client, &args).await?;
    let reader = secure(std::slice::from_ref(&url))?;
    // Wait until the read node has applied the fill; the server bounds each wait at 10 s.
    let deadline = Instant::now() + Duration::from_millis(APPLY_MS_MAX);
    let last_seq = loop {
        match reader.read_at(&args.stream, 0, 1, 0, Some(min_index)).await {
            Ok(a) => break a.last_seq,
            Err(e) if e.code() == Some("not_ready") && Instant::now() < deadline => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let role = if Some(node_id) == leader { "the leader" } else { "a follower" };
    eprintln!("reading {} through seq {last_seq} from node {node_id} ({url}, {role})…", args.stream);
    let poll = read_poll(&reader, &args.stream, last_seq, args.limit).await?;
    let sse = if args.skip_sse { None } else { Some(read_sse(&reader, &args.stream, last_seq).await?) };

    let mut rows = vec![("poll", poll)];
    rows.extend(sse.map(|s| ("sse", s)));
    if !args.json {
        println!("catchup: {} read from node {node_id} ({url}, {role}) by one consumer", args.stream);
        println!(
            "{:>7} {:>10} {:>10} {:>9} {:>10} {:>12} {:>12}",
            "method", "batches", "MB", "seconds", "MB/s", "batches/s", "req p50 ms"
        );
    }
    for (method, mut f) in rows {
        if args.json {
            let v = serde_json::json!({
                "mode": "catchup", "method": method, "stream": args.stream, "node": url,
                "node_id": node_id, "leader_id": leader, "follower": Some(node_id) != leader,
                "batches": f.batches, "bytes": f.bytes, "seconds": f.seconds,
                "mb_per_sec": f.mb_per_sec(), "batches_per_sec": f.batches_per_sec(),
                "limit": if method == "poll" { args.limit } else { runnev::limits::SUBSCRIBE_READ_BATCHES },
                "request_p50_ms": (!f.requests.is_empty()).then(|| f.requests.ms(0.5)),
                "request_max_ms": (!f.requests.is_empty()).then(|| f.requests.ms(1.0)),
            });
            println!("{v}");
        } else {
            let p50 = if f.requests.is_empty() { "-".to_string() } else { format!("{:.1}", f.requests.ms(0.5)) };
            println!(
                "{:>7} {:>10} {:>10.1} {:>9.2} {:>10.1} {:>12.0} {:>12}",
                method,
                f.batches,
                f.bytes as f64 / 1e6,
                f.seconds,
                f.mb_per_sec(),
                f.batches_per_sec(),
                p50
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_and_zero_without_time() {
        let f = ReadFigures { batches: 1000, bytes: 2_000_000, seconds: 0.5, requests: Latencies::default() };
        assert_eq!(f.mb_per_sec(), 4.0);
        assert_eq!(f.batches_per_sec(), 2000.0);
        let z = ReadFigures::default();
        assert_eq!(z.mb_per_sec(), 0.0);
        assert_eq!(z.batches_per_sec(), 0.0);
    }
}
