//! Crashes of more than a minority, with real processes on their own disks (SPEC §2.1: an
//! acknowledged batch is on the disk of a majority and survives any crash):
//!
//! - every node `kill -9`ed at once under publish load, then all restarted on their data;
//! - a majority (the leader and one follower) `kill -9`ed under load, then restarted: while it is
//!   down no publish is acknowledged, and afterwards nothing acknowledged is missing.
//!
//! After the restart every acknowledged batch is on every node with its bytes and ts, and every
//! node serves exactly the same streams, metadata and batches. Publishers pick nodes at random
//! from the test's seed ([`test_seed`]), and resend a failed publish with the same seq.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use rand::Rng as _;
use runnev::launcher::Signal;

/// Streams under load: two without retention, one keeping its last 40 batches (so eviction
/// metadata is part of what must survive and agree).
const STREAMS: [(&str, Option<u64>); 3] = [("crash-a", None), ("crash-b", None), ("crash-evict", Some(40))];

/// One acknowledged publish.
#[derive(Clone, Debug)]
struct Ack {
    stream: &'static str,
    seq: u64,
    ts: u64,
    index: u64,
    payload: Vec<u8>,
    sent: Instant,
    answered: Instant,
}

/// What the publishers saw.
#[derive(Default)]
struct Record {
    acks: Vec<Ack>,
    /// Publishes that ended without an acknowledgement: (node, sent, answered, what).
    failures: Vec<(u64, Instant, Instant, String)>,
}

/// One publisher per stream, each with its own seqs 1, 2, 3…: a publish goes to a node picked
/// at random (seeded) and is resent with the same seq and bytes until it is acknowledged or the
/// load stops.
struct Load {
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicU64>,
    record: Arc<Mutex<Record>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_load(c: &Cluster, seed: u64) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let in_flight = Arc::new(AtomicU64::new(0));
    let record = Arc::new(Mutex::new(Record::default()));
    let urls: Vec<(u64, String)> = c.ids().into_iter().map(|id| (id, c.url(id))).collect();
    // A short timeout: a request to a dead node fails fast and is resent elsewhere.
    let http = Http::with_timeout(Duration::from_secs(4));
    let tasks = STREAMS
        .iter()
        .enumerate()
        .map(|(p, (stream, _))| {
            let (stop, in_flight, record, urls, http) =
                (stop.clone(), in_flight.clone(), record.clone(), urls.clone(), http.clone());
            let stream: &'static str = stream;
            tokio::spawn(async move {
                let mut rng = rng(seed, p as u64);
                let mut seq = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    let body = payload(stream, seq);
                    let (node, url) = &urls[rng.random_range(0..urls.len())];
                    let sent = Instant::now();
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    let r = http
                        .post(&format!("{url}/v1/streams/{stream}/batches?seq={seq}"), Bytes::from(body.clone()))
                        .await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    let answered = Instant::now();
                    let failed = {
                        let mut rec = record.lock().unwrap();
                        match r {
                            Ok(r) if r.status == 200 || r.status == 201 => {
                                let v = r.json();
                                let (Some(s), Some(ts), Some(index)) =
                                    (v["seq"].as_u64(), v["ts"].as_u64(), v["index"].as_u64())
                                else {
                                    panic!("{stream}/{seq}: a 2xx without seq/ts/index: {v}");
                                };
                                assert_eq!(s, seq, "{stream}: published seq {seq}, acknowledged as {s}");
                                rec.acks.push(Ack { stream, seq, ts, index, payload: body, sent, answered });
                                seq += 1;
                                false
                            }
                            Ok(r) => {
                                // Only "try again" answers are expected while nodes die.
                                let code = r.error_code().unwrap_or_default();
                                assert!(
                                    r.status == 503 || r.status == 500,
                                    "{stream}/{seq} on node {node}: a refusal that is not an outage: {}",
                                    r.describe()
                                );
                                rec.failures.push((*node, sent, answered, format!("{} {code}", r.status)));
                                true
                            }
                            Err(e) => {
                                rec.failures.push((*node, sent, answered, e));
                                true
                            }
                        }
                    };
                    // A failure (a dead node refuses at once) is paced, not spun.
                    if failed {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect();
    Load { stop, in_flight, record, tasks }
}

impl Load {
    fn counts(&self) -> Vec<usize> {
        let r = self.record.lock().unwrap();
        STREAMS.iter().map(|(s, _)| r.acks.iter().filter(|a| a.stream == *s).count()).collect()
    }

    /// Waits until every stream has had `n` more publishes acknowledged (liveness bound).
    async fn wait_acks(&self, n: usize, what: &str) {
        let from = self.counts();
        let record = self.record.clone();
        wait_for(what, Duration::from_secs(60), Duration::from_millis(10), || {
            let (record, from) = (record.clone(), from.clone());
            async move {
                let r = record.lock().unwrap();
                let counts: Vec<usize> =
                    STREAMS.iter().map(|(s, _)| r.acks.iter().filter(|a| a.stream == *s).count()).collect();
                if counts.iter().zip(&from).all(|(c, f)| *c >= f + n) {
                    Ok(())
                } else {
                    Err(format!("acks per stream {counts:?}, last failure {:?}", r.failures.last().map(|f| &f.3)))
                }
            }
        })
        .await
    }

    /// Waits until at least one publish is in flight (sent, not answered): the load is running
    /// at the instant that follows.
    async fn wait_in_flight(&self) {
        let n = self.in_flight.clone();
        wait_for("a publish in flight", Duration::from_secs(30), Duration::from_millis(1), || {
            let n = n.clone();
            async move {
                match n.load(Ordering::SeqCst) {
                    0 => Err("none in flight".to_string()),
                    k => Ok(k),
                }
            }
        })
        .await;
    }

    async fn finish(self) -> Record {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("liveness bound: a publisher did not stop")
                .expect("publisher task");
        }
        std::mem::take(&mut *self.record.lock().unwrap())
    }
}

async fn create_streams(c: &Cluster) {
    for (name, max) in STREAMS {
        let body = max.map(|m| format!(r#"{{"retention":{{"max_batches":{m}}}}}"#));
        let r = c.http.put(&format!("{}/v1/streams/{name}", c.url(1)), body.as_deref()).await.expect("PUT");
        assert_eq!(r.status, 201, "{}", r.describe());
    }
}

/// Every node serves the same streams, metadata and batches (after applying the leader's commit
/// index), and holds every acknowledged batch with its bytes and ts (on the stream with
/// retention, those above `evicted_through`). Returns the common state.
async fn check_everything(c: &mut Cluster, acks: &[Ack], what: &str) -> NodeState {
    let commit = c.leader_commit_index().await;
    let max_index = acks.iter().map(|a| a.index).max().unwrap_or(0);
    assert!(
        commit >= max_index,
        "{what}: the leader's commit index {commit} is below an acknowledged index {max_index}"
    );
    let state = assert_identical(c, &c.ids(), commit, what).await;
    let evicted: BTreeMap<&str, u64> = state
        .streams
        .iter()
        .map(|s| (s["name"].as_str().unwrap_or_default(), s["evicted_through"].as_u64().unwrap_or(0)))
        .collect();
    let mut missing = Vec::new();
    for a in acks {
        let (_, batches) = &state.batches[a.stream];
        match batches.iter().find(|b| b.seq == a.seq) {
            Some(b) => {
                assert!(
                    b.data == a.payload && b.ts == a.ts,
                    "{what}: {}/{} holds other bytes or ts than acknowledged",
                    a.stream,
                    a.seq
                )
            }
            None if a.seq <= evicted[a.stream] => {}
            None => missing.push(format!("{}/{}", a.stream, a.seq)),
        }
    }
    assert!(
        missing.is_empty(),
        "{what}: {} acknowledged batches are missing: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    state
}

/// Publishing works again after the restart and continues each stream after its last seq.
async fn publishes_continue(c: &Cluster, state: &NodeState) {
    let client = c.client();
    for s in &state.streams {
        let name = s["name"].as_str().expect("name");
        let last = s["last_seq"].as_u64().expect("last_seq");
        let ack = client.publish(name, None, b"after the restart".to_vec()).await.expect("publish after the restart");
        assert_eq!(ack.seq, last + 1, "{name}: the first publish after the restart");
    }
}

/// Every node `kill -9`ed while publishes are in flight, then restarted on its own data: every
/// acknowledged batch is there, on every node, and the nodes are identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_killed_under_load_restarts_with_every_acknowledged_batch() {
    let mut c = Cluster::start(3, &["--snapshot-logs", "200", "--snapshot-keep-logs", "20"]).await;
    create_streams(&c).await;
    let load = start_load(&c, test_seed("whole-cluster kill publishers"));
    // Enough to pass a snapshot on every node, so the restart recovers a snapshot and a log.
    load.wait_acks(120, "load before the crash").await;
    load.wait_in_flight().await;
    for id in c.ids() {
        c.signal(id, Signal::Kill).expect("SIGKILL");
    }
    for id in c.ids() {
        c.kill_9(id); // reaps it
    }
    let record = load.finish().await;
    eprintln!(
        "killed all three with {} publishes acknowledged and {} failed",
        record.acks.len(),
        record.failures.len()
    );
    for id in c.ids() {
        c.restart(id).await;
    }
    let state = check_everything(&mut c, &record.acks, "after killing every node").await;
    publishes_continue(&c, &state).await;
}

/// The leader and one follower `kill -9`ed under load: the survivor acknowledges nothing while
/// the majority is down; once both are restarted on their data, every acknowledged batch is on
/// every node and the nodes are identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_majority_restarts_with_every_acknowledged_batch() {
    let mut c = Cluster::start(3, &[]).await;
    create_streams(&c).await;
    let load = start_load(&c, test_seed("majority kill publishers"));
    load.wait_acks(50, "load before the crash").await;
    let leader = c.leader().await;
    let follower = c.followers().await[0];
    let survivor = c.ids().into_iter().find(|i| *i != leader && *i != follower).expect("a third node");
    load.wait_in_flight().await;
    c.signal(leader, Signal::Kill).expect("SIGKILL");
    c.signal(follower, Signal::Kill).expect("SIGKILL");
    c.kill_9(leader);
    c.kill_9(follower);
    let down_at = Instant::now();
    // Wait until publishes sent to the survivor after the kill have ended unacknowledged (an
    // error or a client timeout), so the check below is not vacuous.
    let record = load.record.clone();
    wait_for(
        "publishes sent to the survivor after the kill to end",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            let record = record.clone();
            async move {
                let r = record.lock().unwrap();
                let n = r.failures.iter().filter(|f| f.0 == survivor && f.1 >= down_at).count();
                if n >= 2 {
                    Ok(())
                } else {
                    Err(format!("{n} answered so far"))
                }
            }
        },
    )
    .await;
    let up_at = Instant::now();
    {
        let r = load.record.lock().unwrap();
        let acked_while_down: Vec<&Ack> = r.acks.iter().filter(|a| a.sent >= down_at && a.answered < up_at).collect();
        assert!(
            acked_while_down.is_empty(),
            "publishes sent while only node {survivor} was up were acknowledged (no majority): {acked_while_down:?}"
        );
    }
    c.restart(leader).await;
    c.restart(follower).await;
    // More load once the majority is back, then stop.
    load.wait_acks(10, "load after the restart").await;
    let record = load.finish().await;
    eprintln!("{} publishes acknowledged, {} failed", record.acks.len(), record.failures.len());
    let state = check_everything(&mut c, &record.acks, "after restarting the killed majority").await;
    publishes_continue(&c, &state).await;
}
