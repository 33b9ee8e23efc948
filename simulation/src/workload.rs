//! The clients of a run, each on its own simulated host: publishers (with and without seq)
//! that resend until acknowledged, subscribers that reconnect and resume from their cursor, and
//! the control client that creates the streams, watches the leader, and runs the heal phase.
//!
//! Owns: the workload and the heal-phase protocol. Every client uses the production
//! `runnev::client::Client` over turmoil's TCP. Must never: decide anything from the wall clock
//! or from anything but the plan; record an answer other than as it came.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use runnev::client::{Client, ClientError, Delivery, RetryPolicy};
use runnev::stream::Retention;

use crate::history::{Attempt, Batch, FinalStream, NodeFinal, NodeId, Outcome, Publish, Publisher, ReadCheck, Seen};
use crate::net::SimDialer;
use crate::plan::{node_url, HEAL_STREAM, NODES};
use crate::world::{now_ms, Shared};

/// How the workload's clients retry: short enough that a publisher resends (a new attempt in
/// the history) several times during a long fault.
pub fn workload_policy() -> RetryPolicy {
    RetryPolicy {
        request_timeout: Duration::from_secs(3),
        backoff_min: Duration::from_millis(50),
        backoff_max: Duration::from_millis(1_000),
        give_up_after: Duration::from_secs(6),
        // Faults make every node refuse at times; the workload keeps trying through them.
        unreachable_after: Duration::from_secs(6),
    }
}

/// A client over the nodes in `order`.
pub fn client_for(order: &[NodeId], policy: RetryPolicy) -> Client {
    let urls: Vec<String> = order.iter().map(|n| node_url(*n)).collect();
    Client::with_dialer(&urls, Arc::new(SimDialer), policy).expect("node URLs are well formed")
}

fn outcome_of<T>(r: &Result<T, ClientError>, ack: impl Fn(&T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ack(v),
        Err(ClientError::Api { status, code, .. }) => Outcome::Rejected { status: *status, code: code.clone() },
        Err(e) => Outcome::Unknown(e.to_string()),
    }
}

fn batch(b: &runnev::client::Batch) -> Batch {
    Batch { seq: b.seq, ts: b.ts, data: b.data.to_vec() }
}

/// The outcome of one publish attempt for its frame `k`: a frames acknowledgement names the
/// first seq, and frame `k` is stored at `first_seq + k` under the same ts and index.
fn frame_outcome(outcome: &Outcome, k: u64) -> Outcome {
    match outcome {
        Outcome::Ack { seq, ts, duplicate, index } => {
            Outcome::Ack { seq: seq.saturating_add(k), ts: *ts, duplicate: *duplicate, index: *index }
        }
        other => other.clone(),
    }
}

/// Sends `frames` once: one batch with `Client::publish`, several as one frames publish with
/// `Client::publish_many` (SPEC §6). The outcome names the first batch's seq.
async fn publish_once(client: &Client, stream: &str, seq: Option<u64>, frames: &[Vec<u8>]) -> Outcome {
    if let [payload] = frames {
        let r = client.publish(stream, seq, payload.clone()).await;
        outcome_of(&r, |a| Outcome::Ack { seq: a.seq, ts: a.ts, duplicate: a.duplicate, index: a.index })
    } else {
        let r = client.publish_many(stream, seq, frames).await;
        outcome_of(&r, |a| Outcome::Ack { seq: a.first_seq, ts: a.ts, duplicate: a.duplicate, index: a.index })
    }
}

/// Records one attempt's outcome under every frame's history record (`recs[k]` is frame `k`).
fn record_attempt(shared: &Shared, recs: &[usize], outcome: &Outcome, deliberate_resend: bool) {
    let at_ms = now_ms();
    shared.record(|h| {
        for (k, rec) in recs.iter().enumerate() {
            let outcome = frame_outcome(outcome, k as u64);
            h.publishes[*rec].attempts.push(Attempt { at_ms, deliberate_resend, outcome });
        }
    });
}

/// Sends one logical publish (one batch, or several as one frames publish) until it is
/// acknowledged or rejected, or `deadline_ms` passes; records every attempt under the history
/// records `recs` (one per batch). Returns the acknowledgement (first seq, index).
async fn publish_until_done(
    shared: &Shared,
    client: &Client,
    recs: &[usize],
    stream: &str,
    seq: Option<u64>,
    frames: &[Vec<u8>],
    deadline_ms: u64,
) -> Option<(u64, u64)> {
    loop {
        let outcome = publish_once(client, stream, seq, frames).await;
        record_attempt(shared, recs, &outcome, false);
        match outcome {
            Outcome::Ack { seq, index, .. } => return Some((seq, index)),
            Outcome::Rejected { .. } => return None,
            Outcome::Unknown(_) if now_ms() >= deadline_ms => return None,
            Outcome::Unknown(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Publisher `id`: follows its intents until the fault phase ends, finishing the publish in
/// progress (which must then succeed: the heal phase checks it).
pub async fn publisher(shared: Arc<Shared>, id: usize) -> turmoil::Result {
    let plan = &shared.plan;
    let hard_deadline = plan.knobs.fault_phase_ms + plan.heal_budget_ms / 2;
    if shared.wait_for(&shared.workload_ready, hard_deadline).await {
        let spec = plan.publishers[id].clone();
        let streams: Vec<String> = std::iter::once(spec.stream)
            .chain(spec.more_streams.iter().copied())
            .map(|i| plan.streams[i].name.clone())
            .collect();
        // The last seq used on each of its streams.
        let mut seqs = vec![0u64; streams.len()];
        let client = client_for(&spec.nodes, workload_policy());
        for intent in plan.intents(id) {
            if now_ms() >= plan.knobs.fault_phase_ms {
                break;
            }
            let slot = intent.stream_slot;
            let stream = streams[slot].clone();
            let frames: Vec<Vec<u8>> =
                std::iter::once(intent.payload.clone()).chain(intent.more_frames.iter().cloned()).collect();
            let requested = spec.with_seq.then(|| {
                let first = seqs[slot] + intent.seq_step;
                seqs[slot] = first + frames.len() as u64 - 1;
                first
            });
            let recs: Vec<usize> = shared.record(|h| {
                frames
                    .iter()
                    .enumerate()
                    .map(|(k, payload)| {
                        h.publishes.push(Publish {
                            publisher: Publisher::Workload(id),
                            stream: stream.clone(),
                            seq: requested.map(|s| s + k as u64),
                            payload: payload.clone(),
                            attempts: Vec::new(),
                        });
                        h.publishes.len() - 1
                    })
                    .collect()
            });
            let acked = publish_until_done(&shared, &client, &recs, &stream, requested, &frames, hard_deadline).await;
            if acked.is_some() && intent.resend {
                let outcome = publish_once(&client, &stream, requested, &frames).await;
                record_attempt(&shared, &recs, &outcome, true);
            }
            if let (Some((acked_seq, index)), Some(node)) = (acked, intent.read_check) {
                read_check(&shared, node, &stream, acked_seq, &intent.payload, index).await;
            }
            tokio::time::sleep(Duration::from_millis(intent.pause_ms)).await;
        }
    }
    shared.publishers_active.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Reads `seq` back from `node` alone with `min_index = index` (SPEC §3 read-your-writes).
async fn read_check(shared: &Shared, node: NodeId, stream: &str, seq: u64, payload: &[u8], index: u64) {
    let policy = RetryPolicy { give_up_after: Duration::from_secs(3), ..workload_policy() };
    let client = client_for(&[node], policy);
    let answer = match client.read_at(stream, seq - 1, 1, 0, Some(index)).await {
        Ok(a) => Ok((a.gap.map(|g| (g.from, g.to)), a.batches.iter().map(batch).collect())),
        Err(e) => Err(e.to_string()),
    };
    shared.record(|h| {
        h.read_checks.push(ReadCheck {
            node,
            stream: stream.to_string(),
            seq,
            payload: payload.to_vec(),
            min_index: index,
            answer,
        })
    });
}

/// Subscriber `id`: follows its stream from cursor 0 until told to stop, restarting its
/// subscription from its cursor now and then (on another node first) during the fault phase.
pub async fn subscriber(shared: Arc<Shared>, id: usize) -> turmoil::Result {
    let plan = &shared.plan;
    let deadline = plan.knobs.fault_phase_ms + plan.heal_budget_ms;
    if !shared.wait_for(&shared.workload_ready, deadline).await {
        return Ok(());
    }
    let spec = plan.subscribers[id].clone();
    let stream = plan.streams[spec.stream].name.clone();
    // A late subscriber joins at its start time, from cursor 0.
    while now_ms() < spec.start_ms {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shared.record(|h| {
        h.subscribers.push(crate::history::SubscriberLog {
            id,
            stream: stream.clone(),
            start_after: 0,
            events: Vec::new(),
        })
    });
    let log = |seen: Seen| {
        let at = now_ms();
        shared.record(|h| {
            if let Some(s) = h.subscribers.iter_mut().find(|s| s.id == id) {
                s.events.push((at, seen));
            }
        })
    };
    let mut cursor = 0u64;
    let mut round = 0usize;
    'subscriptions: loop {
        let mut order = spec.nodes.clone();
        let turn = round % order.len();
        order.rotate_left(turn);
        round += 1;
        let client = client_for(&order, workload_policy());
        let mut sub = client.subscribe(&stream, cursor);
        let restart_at = if spec.restart_every_ms > 0 { now_ms() + spec.restart_every_ms } else { u64::MAX };
        loop {
            if shared.stop_subscribers.load(Ordering::SeqCst) {
                break 'subscriptions;
            }
            tokio::select! {
                item = sub.next() => match item {
                    Some(Ok(Delivery::Batch(b))) => {
                        cursor = b.seq;
                        log(Seen::Batch(batch(&b)));
                        // Slow consumers dawdle during the fault phase only: in the heal phase
                        // every subscriber must catch up within the budget.
                        if spec.slow_ms > 0 && now_ms() < plan.knobs.fault_phase_ms {
                            tokio::time::sleep(Duration::from_millis(spec.slow_ms)).await;
                        }
                    }
                    Some(Ok(Delivery::Gap(g))) => {
                        cursor = g.to;
                        log(Seen::Gap { from: g.from, to: g.to });
                    }
                    Some(Err(e)) => log(Seen::Error(e.to_string())),
                    None => {
                        log(Seen::Error("subscription ended".into()));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue 'subscriptions;
                    }
                },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let now = now_ms();
            if now >= restart_at && now < plan.knobs.fault_phase_ms {
                log(Seen::Restart { cursor });
                continue 'subscriptions;
            }
        }
    }
    Ok(())
}

/// What the control client learned about one node's Raft state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RaftView {
    leader: Option<u64>,
    term: u64,
    commit: u64,
    applied: u64,
}

async fn raft_view(node: NodeId) -> Option<RaftView> {
    let policy = RetryPolicy { request_timeout: Duration::from_millis(500), ..workload_policy() };
    let v = client_for(&[node], policy).cluster_view(&node_url(node)).await.ok()?;
    Some(RaftView { leader: v.leader_id, term: v.term, commit: v.commit_index, applied: v.applied_index })
}

/// The control client: creates the streams, tracks the leader during the fault phase, then runs
/// the heal phase (convergence, liveness publishes, subscriber catch-up) and reads every
/// node's final state.
pub async fn control(shared: Arc<Shared>) -> turmoil::Result {
    let plan = &shared.plan;
    let fault_end = plan.knobs.fault_phase_ms;
    let deadline = fault_end + plan.heal_budget_ms;
    let problem = |p: String| shared.record(|h| h.liveness.problems.push(p));
    let milestone = |what: &str| {
        let line = format!("{:>7} ms control: {what}", now_ms());
        shared.record(|h| h.fault_log.push(line));
    };
    let all: Vec<NodeId> = (1..=NODES).collect();
    let client = client_for(&all, workload_policy());

    // Setup: the workload's streams (and the heal stream), retried through the faults.
    let specs = shared.record(|h| h.streams.clone());
    for s in &specs {
        let retention = s.max_batches.map(|n| Retention { max_batches: Some(n), ..Default::default() });
        loop {
            match client.put_stream(&s.name, retention).await {
                Ok(_) => break,
                Err(ClientError::Unavailable { .. } | ClientError::Unreachable { .. }) if now_ms() < deadline => {
                    continue
                }
                Err(e) => {
                    problem(format!("creating stream {} failed: {e}", s.name));
                    break;
                }
            }
        }
    }
    shared.workload_ready.store(true, Ordering::SeqCst);
    milestone("streams created; workload starts");

    // Fault phase: keep an eye on the leader, for the leader-isolation faults, and make the
    // membership changes the driver asks for.
    let mut out = vec![false; NODES as usize + 1];
    while now_ms() < fault_end {
        for n in 1..=NODES {
            if let Some(RaftView { leader: Some(l), .. }) = raft_view(n).await {
                shared.leader_seen.store(l, Ordering::SeqCst);
                break;
            }
        }
        change_membership(&shared, &mut out, false).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Heal phase: the driver has repaired the network and restarted crashed nodes; every node
    // taken out of the membership is put back first.
    // (A retired node stays out: it is down for good.)
    let still_out = |out: &[bool]| shared.serving_nodes().into_iter().any(|n| out[n as usize]);
    while still_out(&out) && now_ms() < deadline {
        change_membership(&shared, &mut out, true).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if still_out(&out) {
        problem(format!("nodes still out of the membership at the end of the heal phase: {out:?}"));
    }
    let converged = loop {
        let mut views = Vec::new();
        for n in shared.serving_nodes() {
            views.push(raft_view(n).await);
        }
        let agreed = views.iter().all(|v| {
            v.as_ref().is_some_and(|v| v.leader.is_some() && v.applied >= v.commit && Some(v) == views[0].as_ref())
        });
        let (commits, applied): (Vec<_>, Vec<_>) =
            views.iter().map(|v| v.as_ref().map(|v| (v.commit, v.applied)).unwrap_or((0, 0))).unzip();
        let same_index = commits.windows(2).all(|w| w[0] == w[1]) && applied.windows(2).all(|w| w[0] == w[1]);
        if agreed && same_index {
            break Some(now_ms());
        }
        if now_ms() >= deadline {
            problem(format!("the cluster did not converge in the heal phase; last views {views:?}"));
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    shared.record(|h| h.liveness.converged_at_ms = converged);
    milestone("converged (or gave up)");

    // Liveness: publishes must go through now.
    let heal_client = client_for(&all, workload_policy());
    let mut heal_seq = 0u64;
    let mut barrier = 0u64;
    let mut heal_publish = |label: &'static str| {
        heal_seq += 1;
        let seq = heal_seq;
        let payload = format!("heal:{label}:{seq}").into_bytes();
        let rec = shared.record(|h| {
            h.publishes.push(Publish {
                publisher: Publisher::Heal,
                stream: HEAL_STREAM.into(),
                seq: Some(seq),
                payload: payload.clone(),
                attempts: Vec::new(),
            });
            h.publishes.len() - 1
        });
        let (shared, heal_client) = (shared.clone(), heal_client.clone());
        async move {
            let limit = (now_ms() + 20_000).min(deadline);
            publish_until_done(&shared, &heal_client, &[rec], HEAL_STREAM, Some(seq), &[payload], limit).await
        }
    };
    for _ in 0..3 {
        match heal_publish("liveness").await {
            Some((_, index)) => barrier = barrier.max(index),
            None => problem(format!("a heal-phase publish did not succeed by {} ms", now_ms())),
        }
    }

    milestone("liveness publishes done");
    // Publishers finish their last publish (which must succeed now).
    while shared.publishers_active.load(Ordering::SeqCst) > 0 && now_ms() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let finished = shared.publishers_active.load(Ordering::SeqCst) == 0;
    shared.record(|h| h.liveness.publishers_finished = finished);
    if !finished {
        problem("publishers were still retrying at the end of the heal phase".into());
    }
    // A barrier after every workload write: every node must reach this log index.
    match heal_publish("barrier").await {
        Some((_, index)) => barrier = barrier.max(index),
        None => problem("the barrier publish did not succeed".into()),
    }

    milestone("publishers finished; barrier written");
    // Subscribers catch up to what the cluster holds.
    let mut targets: BTreeMap<String, u64> = BTreeMap::new();
    for s in &specs {
        if let Ok(info) = client.stream(&s.name).await {
            targets.insert(s.name.clone(), info.last_seq);
        }
    }
    let positions = |shared: &Shared| {
        shared.record(|h| h.subscribers.iter().map(|s| (s.id, s.stream.clone(), s.position())).collect::<Vec<_>>())
    };
    loop {
        let behind = positions(&shared).iter().any(|(_, stream, pos)| targets.get(stream).is_some_and(|t| pos < t));
        if !behind || now_ms() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reached: Vec<(usize, u64, u64)> = positions(&shared)
        .into_iter()
        .map(|(id, stream, pos)| (id, pos, targets.get(&stream).copied().unwrap_or(0)))
        .collect();
    shared.record(|h| h.liveness.subscriber_positions = reached);
    shared.stop_subscribers.store(true, Ordering::SeqCst);
    milestone("subscribers caught up (or gave up)");

    // Every node's final state, each read from that node alone once it applied the barrier
    // (but a retired node's: its disk is corrupt, it serves nothing).
    for n in shared.serving_nodes() {
        let streams = final_state(n, barrier).await;
        shared.record(|h| h.finals.push(NodeFinal { node: n, streams }));
    }
    milestone("final states read");
    Ok(())
}

/// One step towards the membership the driver asks for (`Shared::membership_out`; all back in
/// when `heal`): removes or re-adds at most one node, through any node, and records it. `out`
/// is which nodes this client has taken out. A call that fails is tried again next time.
async fn change_membership(shared: &Shared, out: &mut [bool], heal: bool) {
    let all: Vec<NodeId> = (1..=NODES).collect();
    let policy = RetryPolicy { give_up_after: Duration::from_secs(2), ..workload_policy() };
    let client = client_for(&all, policy);
    for n in shared.serving_nodes() {
        let want_out = !heal && shared.membership_out[n as usize].load(Ordering::SeqCst);
        let i = n as usize;
        let done = if want_out && !out[i] {
            client.remove_member(n).await.map(|_| "removed from the voters")
        } else if !want_out && out[i] {
            let addr = format!("{}:{}", crate::plan::node_host(n), crate::plan::NODE_PORT);
            client.add_member(n, &addr, true).await.map(|_| "added back as a voter")
        } else {
            continue;
        };
        let line = match done {
            Ok(what) => {
                out[i] = want_out;
                shared.membership_changes.fetch_add(1, Ordering::Relaxed);
                format!("{:>7} ms control: n{n} {what}", now_ms())
            }
            Err(e) => format!("{:>7} ms control: changing n{n}'s membership failed (will retry): {e}", now_ms()),
        };
        shared.record(|h| h.fault_log.push(line));
        return;
    }
}

async fn final_state(node: NodeId, barrier: u64) -> Result<BTreeMap<String, FinalStream>, String> {
    let policy = RetryPolicy { give_up_after: Duration::from_secs(20), ..workload_policy() };
    let c = client_for(&[node], policy);
    // Wait until this node has applied the barrier, then read a stable state.
    c.read_at(HEAL_STREAM, 0, 1, 0, Some(barrier)).await.map_err(|e| format!("n{node}: {e}"))?;
    let listed = c.streams().await.map_err(|e| format!("n{node}: listing streams: {e}"))?;
    let mut out = BTreeMap::new();
    for info in listed {
        let mut batches = Vec::new();
        let mut after = 0;
        loop {
            let a = c
                .read_at(&info.name, after, 10_000, 0, Some(barrier))
                .await
                .map_err(|e| format!("n{node}: reading {}: {e}", info.name))?;
            if a.batches.is_empty() {
                break;
            }
            batches.extend(a.batches.iter().map(batch));
            after = a.next_after;
        }
        out.insert(
            info.name.clone(),
            FinalStream {
                first_seq: info.first_seq,
                last_seq: info.last_seq,
                evicted_through: info.evicted_through,
                batches_counted: info.batches,
                batches,
            },
        );
    }
    Ok(out)
}
