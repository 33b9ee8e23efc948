//! `runnev-bench nats`: drives NATS JetStream with the same publish load generator as
//! `runnev bench publish` ([`crate::publish`]): same flags, same worker loop, same payloads, same
//! summary (one JSON line with `--json`), so the two can be compared line by line.
//!
//! NATS JetStream mapping:
//! - A Runnev stream is a subject `SUBJECT_PREFIX.NAME` of one JetStream stream (R3, file storage,
//!   created if missing). All Runnev streams share one Raft group too, so both systems replicate
//!   every publish through a single consensus group.
//! - A publish is a JetStream publish that waits for its PubAck: the stream leader stored it and
//!   a quorum of the R3 group has it; fsynced before the ack only with `sync_interval: always`.
//! - `--with-seq` sets the `Nats-Msg-Id` header to `RUN-NAME-SEQ`: JetStream's idempotent-publish
//!   path (a retry within the duplicate window is stored once), the equivalent of Runnev's
//!   dedup on (stream, seq). The generator keeps seqs increasing per stream, as for Runnev.
//! - By default the client connects to the server that leads the stream, as Runnev's client
//!   sends publishes to the leader; `--any-server` connects to the first server that answers.
//! - `--frames K` sends each worker's K publishes back to back and then waits for their K PubAcks
//!   (JetStream's async publish): as many publishes in flight as a Runnev worker sending K frames
//!   in one request, which JetStream has no equivalent of.
//! - `--rate` runs the generator's open loop, as for Runnev: publishes start on a fixed schedule,
//!   each waits for its PubAck in a task of its own, all multiplexed on the one connection.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::publish::{run as run_load, stream_names, LoadArgs, Target, TargetError};
use anyhow::{bail, Context, Result};
use async_nats::jetstream::{self, context::ContextBuilder, stream};
use bytes::Bytes;

/// Flags of `runnev-bench nats`.
#[derive(clap::Args)]
pub struct NatsArgs {
    /// NATS servers, comma-separated URLs.
    #[arg(
        long,
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:14222,nats://127.0.0.1:14223,nats://127.0.0.1:14224"
    )]
    servers: String,
    /// The JetStream stream holding the subjects (created if missing).
    #[arg(long, default_value = "BENCH")]
    js_stream: String,
    /// Subjects are SUBJECT_PREFIX.NAME; a created stream takes SUBJECT_PREFIX.>.
    #[arg(long, default_value = "bench")]
    subject_prefix: String,
    /// Replicas of a created stream.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Connect to the first server that answers instead of the stream's leader.
    #[arg(long)]
    any_server: bool,
    /// How long to wait for the stream's leader and replicas to be current, in s.
    #[arg(long, default_value_t = 30)]
    ready_timeout_secs: u64,
    #[command(flatten)]
    load: LoadArgs,
}

/// The subject of each of the run's streams.
fn subjects(prefix: &str, names: &[String]) -> Vec<String> {
    names.iter().map(|n| format!("{prefix}.{n}")).collect()
}

/// The `Nats-Msg-Id` of a publish with a seq: unique per run, subject and seq.
fn msg_id(run: &str, subject: &str, seq: u64) -> String {
    format!("{run}-{subject}-{seq}")
}

/// NATS JetStream as a [`Target`] (see the crate docs for the mapping).
struct NatsTarget {
    js: jetstream::Context,
    subjects: Vec<String>,
    run: String,
}

impl Target for NatsTarget {
    async fn prepare(&self, _stream: usize) -> Result<u64, TargetError> {
        // Seqs live only in the message ids, which carry a per-run prefix: every run starts at 1.
        Ok(1)
    }

    async fn publish(&self, stream: usize, seq: Option<u64>, payload: Bytes) -> Result<(), TargetError> {
        check_ack(self.send(stream, seq, payload).await?.await?)
    }

    /// JetStream has no request carrying many messages; the equivalent load is `n` publishes
    /// sent back to back without waiting (JetStream's async publish, all `n` PubAcks pending at
    /// once on the one connection), then a wait for all `n` acknowledgements. So a worker keeps
    /// as many publishes in flight as a Runnev worker sending `n` frames per request. Message
    /// `k` carries seq `seq + k` in its `Nats-Msg-Id` when a seq is given.
    async fn publish_frames(
        &self,
        stream: usize,
        seq: Option<u64>,
        payload: Bytes,
        n: usize,
    ) -> Result<(), TargetError> {
        let mut pending = Vec::with_capacity(n);
        for k in 0..n {
            pending.push(self.send(stream, frame_seq(seq, k), payload.clone()).await?);
        }
        for ack in pending {
            check_ack(ack.await?)?;
        }
        Ok(())
    }
}

impl NatsTarget {
    /// Sends one message to stream `stream`'s subject, with a `Nats-Msg-Id` when it has a seq,
    /// and returns its pending PubAck (sent, not yet acknowledged).
    async fn send(
        &self,
        stream: usize,
        seq: Option<u64>,
        payload: Bytes,
    ) -> Result<jetstream::context::PublishAckFuture, TargetError> {
        let subject = self.subjects[stream].clone();
        Ok(match seq {
            Some(seq) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", msg_id(&self.run, &subject, seq).as_str());
                self.js.publish_with_headers(subject, headers, payload).await?
            }
            None => self.js.publish(subject, payload).await?,
        })
    }
}

/// The seq of message `k` of a request whose first message has `seq` (`None` without seqs).
fn frame_seq(seq: Option<u64>, k: usize) -> Option<u64> {
    seq.map(|s| s.saturating_add(k as u64))
}

/// Refuses a PubAck that says the message was a duplicate: every message of a run is new.
fn check_ack(ack: async_nats::jetstream::publish::PublishAck) -> Result<(), TargetError> {
    if ack.duplicate {
        return Err(format!("message {} of the run was answered as a duplicate", ack.sequence).into());
    }
    Ok(())
}

/// Waits until the stream has a leader and every replica is current; returns the leader's name.
async fn wait_ready(js: &jetstream::Context, name: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut s = js.get_stream(name).await.with_context(|| format!("looking up stream {name}"))?;
        let info = s.info().await.with_context(|| format!("stream {name} info"))?;
        if let Some(cluster) = &info.cluster {
            if let Some(leader) = &cluster.leader {
                if cluster.replicas.iter().all(|r| r.current && !r.offline) {
                    return Ok(leader.clone());
                }
            }
        } else {
            return Ok(String::new()); // not clustered: nothing to wait for
        }
        if Instant::now() >= deadline {
            bail!("stream {name} has no leader with current replicas after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connects to the server named `leader` among `servers`, if one of them is it.
async fn connect_to(servers: &[&str], leader: &str) -> Option<(async_nats::Client, String)> {
    for url in servers {
        if let Ok(c) = async_nats::connect(*url).await {
            if c.server_info().server_name == leader {
                return Some((c, url.to_string()));
            }
        }
    }
    None
}

/// Runs a publish load against NATS JetStream and prints its summary on stdout.
///
/// Errors: the servers cannot be reached, the stream cannot be made ready, or a stream could not
/// be prepared.
pub async fn run(a: NatsArgs) -> Result<()> {
    let spec = a.load.spec();
    let servers: Vec<&str> = a.servers.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let client = async_nats::connect(servers.clone()).await.with_context(|| format!("connecting to {}", a.servers))?;
    // Every publish a run keeps in flight may await its PubAck at once (the client's default
    // bound is 5,000, below 64 workers with `--frames 100`).
    let in_flight = spec.concurrency.saturating_mul(spec.frames).max(5_000);
    let context = |c: async_nats::Client| ContextBuilder::new().max_ack_inflight(in_flight).build(c);
    let js = context(client.clone());
    js.get_or_create_stream(stream::Config {
        name: a.js_stream.clone(),
        subjects: vec![format!("{}.>", a.subject_prefix)],
        num_replicas: a.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .with_context(|| format!("creating stream {}", a.js_stream))?;
    let leader = wait_ready(&js, &a.js_stream, Duration::from_secs(a.ready_timeout_secs)).await?;
    let js = if a.any_server || leader.is_empty() {
        eprintln!("nats: stream {} leader {leader:?}; connected to {}", a.js_stream, client.server_info().server_name);
        js
    } else {
        match connect_to(&servers, &leader).await {
            Some((c, url)) => {
                eprintln!("nats: stream {} leader {leader}; connected to it at {url}", a.js_stream);
                context(c)
            }
            None => {
                eprintln!("nats: stream {} leader {leader} is not among --servers; using any server", a.js_stream);
                js
            }
        }
    };
    let names = stream_names(&a.load.stream, spec.streams);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let target = NatsTarget { js, subjects: subjects(&a.subject_prefix, &names), run: format!("{nanos:x}") };
    let summary = run_load(Arc::new(target), &spec, !a.load.quiet).await?;
    if a.load.json {
        println!("{}", summary.json_line());
    } else {
        print!("{}", summary.table());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_map_to_subjects_under_the_prefix() {
        assert_eq!(subjects("bench", &stream_names("b1", 1)), vec!["bench.b1"]);
        assert_eq!(subjects("bench", &stream_names("b1", 2)), vec!["bench.b1-0", "bench.b1-1"]);
    }

    #[test]
    fn msg_ids_are_unique_per_run_subject_and_seq() {
        let ids = [
            msg_id("r1", "bench.a", 1),
            msg_id("r1", "bench.a", 2),
            msg_id("r1", "bench.b", 1),
            msg_id("r2", "bench.a", 1),
        ];
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len());
        assert_eq!(ids[0], "r1-bench.a-1");
    }

    #[test]
    fn messages_of_a_request_take_consecutive_seqs() {
        assert_eq!((0..3).map(|k| frame_seq(Some(7), k)).collect::<Vec<_>>(), vec![Some(7), Some(8), Some(9)]);
        assert_eq!(frame_seq(None, 2), None);
        assert_eq!(frame_seq(Some(u64::MAX), 1), Some(u64::MAX), "saturates, never wraps");
    }
}
