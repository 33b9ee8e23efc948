//! The clients of a run, each on its own simulated host: publishers (with and without seq)
//! that resend until acknowledged, subscribers that reconnect and resume from their cursor, and
//! the control client that creates the streams, watches the leader, and runs the heal phase.
//!
//! Owns: the workload and the heal-phase protocol. Every client uses the production
//! `runnev::client::Client` over turmoil's TCP. Must never: decide anything from the wall clock
//! or from anything but the plan; record an answer other than as it came.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use runnev::client::{Client, ClientError, Delivery, RetryPolicy};
use runnev::stream::Retention;

use crate::history::{
    Attempt, Batch, BeforeDelete, Deletion, FinalStream, NodeFinal, NodeId, Outcome, Publish, Publisher, ReadCheck,
    Recreated, Seen,
};
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

/// Records one attempt's outcome under every frame's history record (`recs[k]` is frame `k`);
/// the attempt was sent at `sent_ms`.
fn record_attempt(shared: &Shared, recs: &[usize], sent_ms: u64, outcome: &Outcome, deliberate_resend: bool) {
    let at_ms = now_ms();
    shared.record(|h| {
        for (k, rec) in recs.iter().enumerate() {
            let outcome = frame_outcome(outcome, k as u64);
            h.publishes[*rec].attempts.push(Attempt { sent_ms, at_ms, deliberate_resend, outcome });
        }
    });
}

/// Whether the plan deletes streams ([`crate::plan::FaultKind::StreamDelete`]).
fn deletes_streams(shared: &Shared) -> bool {
    shared.plan.kinds.contains(&crate::plan::FaultKind::StreamDelete)
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
        let sent_ms = now_ms();
        let outcome = publish_once(client, stream, seq, frames).await;
        record_attempt(shared, recs, sent_ms, &outcome, false);
        match outcome {
            Outcome::Ack { seq, index, .. } => return Some((seq, index)),
            // The stream is deleted for a while: it comes back (the control client creates it
            // again), so the publish is sent again, as a publisher that waits for its stream does.
            Outcome::Rejected { status: 404, .. } if deletes_streams(shared) && now_ms() < deadline_ms => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
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
                let sent_ms = now_ms();
                let outcome = publish_once(&client, &stream, requested, &frames).await;
                record_attempt(&shared, &recs, sent_ms, &outcome, true);
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
    // membership changes and stream deletions the driver asks for.
    let mut deleting: Vec<Deleting> = plan.streams.iter().map(|_| Deleting::No).collect();
    while now_ms() < fault_end {
        for n in 1..=NODES {
            if let Some(RaftView { leader: Some(l), .. }) = raft_view(n).await {
                shared.leader_seen.store(l, Ordering::SeqCst);
                break;
            }
        }
        if shared.plan.kinds.contains(&crate::plan::FaultKind::Membership) {
            change_membership(&shared, false).await;
        }
        if deletes_streams(&shared) {
            change_streams(&shared, &mut deleting, false).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Heal phase: the driver has repaired the network and restarted crashed nodes; every node
    // outside the voters is put back first (a retired node stays out: it is down for good).
    if shared.plan.kinds.contains(&crate::plan::FaultKind::Membership) {
        // Every node in must hold for a while: a removal cut short leaves a joint configuration,
        // whose voters `/v1/cluster` lists as one set (the removed node among them), until the
        // next leader finishes it (`finish_joint_changes`, every second) and the node is out
        // after all (seed 1055: n2, the leader, crashed while removing itself).
        let mut all_in = false;
        let mut in_since: Option<u64> = None;
        while now_ms() < deadline {
            if change_membership(&shared, true).await {
                let since = *in_since.get_or_insert(now_ms());
                if now_ms() >= since + MEMBERSHIP_SETTLE_MS {
                    all_in = true;
                    break;
                }
            } else {
                in_since = None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !all_in {
            let out: Vec<NodeId> =
                (1..=NODES).filter(|n| shared.not_voter[*n as usize].load(Ordering::SeqCst)).collect();
            problem(format!("nodes still outside the voters at the end of the heal phase: {out:?}"));
        }
    }
    // Every deleted stream is created again (a delete under way is finished first).
    if deletes_streams(&shared) {
        let mut all_back = false;
        while now_ms() < deadline {
            if change_streams(&shared, &mut deleting, true).await {
                all_back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !all_back {
            problem("a deleted stream was not created again by the end of the heal phase".into());
        }
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

/// Where the control client is with one workload stream's deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Deleting {
    /// The stream exists (as far as this client knows).
    No,
    /// It was read, and delete calls are being made (one may have deleted it already): what it
    /// held, when the first call was made, and until when a request of these calls may still
    /// reach the leader.
    Calls(BeforeDelete, u64, u64),
    /// Deleted: `history.deletions[i]`; to be created again, not before the simulated ms given.
    Gone(usize, u64),
}

/// How long after a delete call that may have left a request on its way (one of its attempts
/// timed out, or it failed) the stream is not created again, in simulated ms: such a request
/// can still reach a node (up to 1.5 s of latency in a `Slow` fault), wait there for a leader
/// (`503 no_leader` after 5 s), be forwarded (up to twice) and be proposed; created again before
/// that, the stream would be deleted by it once more, a deletion the history does not hold.
const STALE_DELETE_MS: u64 = 15_000;

/// One step towards the stream deletions the driver asks for (`Shared::delete_wanted`; none
/// when `heal`): a stream the driver wants gone is read (every batch, on a node that applied
/// every acknowledged publish so far), then deleted (retried through the faults; a retry that
/// finds it gone after a lost answer is a success, as `runnev streams delete` counts it); a
/// deleted stream the driver no longer wants gone is created again with its retention, and
/// one batch acknowledged before the delete is then sent again (same seq and payload), which
/// the new stream must refuse `409 seq_evicted` (contract §5). Every call goes through the
/// production client. Returns whether every workload stream exists. A call that fails is made
/// again next time.
async fn change_streams(shared: &Shared, deleting: &mut [Deleting], heal: bool) -> bool {
    let all: Vec<NodeId> = (1..=NODES).collect();
    let policy = RetryPolicy { give_up_after: Duration::from_secs(2), ..workload_policy() };
    let client = client_for(&all, policy);
    let log = |line: String| shared.record(|h| h.fault_log.push(format!("{:>7} ms control: {line}", now_ms())));
    for (i, state) in deleting.iter_mut().enumerate() {
        let spec = &shared.plan.streams[i];
        let wanted = !heal && shared.delete_wanted[i].load(Ordering::SeqCst);
        if *state == Deleting::No && wanted {
            match read_before_delete(shared, &client, &spec.name).await {
                Ok(before) => *state = Deleting::Calls(before, now_ms(), 0),
                Err(e) => {
                    log(format!("reading {} before deleting it failed (will retry): {e}", spec.name));
                    continue;
                }
            }
        }
        if let Deleting::Calls(before, delete_sent_ms, stale_until) = state {
            let call_ms = now_ms();
            let answer = client.delete_stream(&spec.name).await;
            // A call that took a whole request timeout had an attempt time out: its request may
            // still be on its way.
            if answer.is_err() || now_ms() - call_ms >= policy.request_timeout.as_millis() as u64 {
                *stale_until = now_ms() + STALE_DELETE_MS;
            }
            let already = match answer {
                Ok(runnev::client::Deleted::Now) => false,
                Ok(runnev::client::Deleted::Already) => true,
                // A call that gave up earlier may have deleted it.
                Err(ClientError::Api { status: 404, .. }) => true,
                Err(e) => {
                    log(format!("deleting {} failed (will retry): {e}", spec.name));
                    continue;
                }
            };
            log(format!("deleted {}{}", spec.name, if already { " (already gone)" } else { "" }));
            let d = Deletion {
                stream: spec.name.clone(),
                before: before.clone(),
                delete_sent_ms: *delete_sent_ms,
                deleted_at_ms: now_ms(),
                already,
                recreated: None,
            };
            let stale_until = *stale_until;
            *state = Deleting::Gone(
                shared.record(|h| {
                    h.deletions.push(d);
                    h.deletions.len() - 1
                }),
                stale_until,
            );
        }
        if let Deleting::Gone(k, stale_until) = *state {
            if wanted || now_ms() < stale_until {
                continue;
            }
            let retention = spec.max_batches.map(|n| Retention { max_batches: Some(n), ..Default::default() });
            match client.put_stream(&spec.name, retention).await {
                Ok((info, created)) => {
                    let again = Recreated {
                        at_ms: now_ms(),
                        created,
                        first_seq: info.first_seq,
                        last_seq: info.last_seq,
                        evicted_through: info.evicted_through,
                    };
                    log(format!("created {} again: {again:?}", spec.name));
                    let d = shared.record(|h| {
                        h.deletions[k].recreated = Some(again);
                        h.deletions[k].clone()
                    });
                    *state = Deleting::No;
                    resend_across_delete(shared, &client, &d).await;
                }
                Err(e) => log(format!("creating {} again failed (will retry): {e}", spec.name)),
            }
        }
    }
    deleting.iter().all(|d| *d == Deleting::No)
}

/// Reads all of `stream` (pages of batches after 0) on nodes that have applied the highest
/// index acknowledged to any publish recorded so far (`min_index`), so that every batch
/// acknowledged before now is in it unless retention evicted it.
async fn read_before_delete(shared: &Shared, client: &Client, stream: &str) -> Result<BeforeDelete, ClientError> {
    let read_ms = now_ms();
    let min_index = shared.record(|h| h.publishes.iter().flat_map(|p| p.acks().map(|a| a.3)).max().unwrap_or(0));
    let mut before = BeforeDelete { read_ms, min_index, batches: Vec::new(), last_seq: 0, evicted_through: 0 };
    let mut after = 0;
    loop {
        let a = client.read_at(stream, after, 10_000, 0, Some(min_index)).await?;
        if let Some(g) = &a.gap {
            before.evicted_through = before.evicted_through.max(g.to);
        }
        before.last_seq = before.last_seq.max(a.last_seq);
        if a.batches.is_empty() {
            return Ok(before);
        }
        before.batches.extend(a.batches.iter().map(|b| (b.seq, b.ts, crate::history::fnv(&b.data))));
        after = a.next_after;
    }
}

/// After `d`'s stream was created again: sends once more the workload publish with seq
/// acknowledged last before the stream was read for its deletion (its seq and payload, as a
/// publisher resending after a lost answer would), recorded as a deliberate resend of it. The
/// deleted stream's seqs count as evicted in the new one, so the answer must be `409
/// seq_evicted`: never `duplicate: true` (the dedup of a deleted stream survived) nor a new
/// batch (a seq given twice).
async fn resend_across_delete(shared: &Shared, client: &Client, d: &Deletion) {
    let picked = shared.record(|h| {
        h.publishes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.stream == d.stream && p.seq.is_some() && matches!(p.publisher, Publisher::Workload(_)))
            .filter_map(|(i, p)| {
                p.attempts
                    .iter()
                    .find_map(|a| match a.outcome {
                        Outcome::Ack { seq, .. } if a.at_ms < d.before.read_ms => Some(seq),
                        _ => None,
                    })
                    .map(|seq| (seq, i, p.payload.clone()))
            })
            .max()
    });
    let Some((seq, rec, payload)) = picked else { return };
    let sent_ms = now_ms();
    let r = client.publish(&d.stream, Some(seq), payload).await;
    let outcome = outcome_of(&r, |a| Outcome::Ack { seq: a.seq, ts: a.ts, duplicate: a.duplicate, index: a.index });
    record_attempt(shared, &[rec], sent_ms, &outcome, true);
}

/// How long, in simulated ms, every serving node must be seen a voter before the heal phase
/// goes on: three times `runnev::limits::JOINT_REPAIR_MS`, the period at which a leader finishes
/// a joint configuration left by a change cut short.
const MEMBERSHIP_SETTLE_MS: u64 = 3 * runnev::limits::JOINT_REPAIR_MS;

/// The leader's view of the voters: (leader, voters, full voters), from the first node that
/// names itself leader; `None` when none does (no leader, or none reachable). `voters` holds
/// every node of either voter set; `full` only those in each (they differ while a joint
/// configuration is in effect, Raft paper §6: a node being added or removed is in one set).
async fn leader_voters() -> Option<(NodeId, BTreeSet<NodeId>, BTreeSet<NodeId>)> {
    let policy = RetryPolicy { request_timeout: Duration::from_millis(500), ..workload_policy() };
    for n in 1..=NODES {
        let Ok(v) = client_for(&[n], policy).cluster_view(&node_url(n)).await else { continue };
        if v.leader_id == Some(n) {
            let voters: BTreeSet<NodeId> = v.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            let full = voters.iter().copied().filter(|id| v.voter_sets.iter().all(|set| set.contains(id))).collect();
            return Some((n, voters, full));
        }
    }
    None
}

/// One step towards the membership the driver asks for (`Shared::membership_out`; every
/// serving node a voter when `heal`), judged from the leader's view of the voters rather than
/// from what this client did (a change whose answer was lost may have been made, or not):
/// first puts back one node that is outside the voters and should not be, else (not in the
/// heal phase) takes out one node the driver wants out — never a second one (a voter left
/// alone is the whole cluster: lose its disk and nothing can be recovered), and never while a
/// node is retired. Sends the change to the leader first. Returns whether every serving node
/// is a voter. A change that fails is tried again next time.
async fn change_membership(shared: &Shared, heal: bool) -> bool {
    let Some((leader, voters, full)) = leader_voters().await else { return false };
    let serving = shared.serving_nodes();
    // A node in only one half of a joint configuration counts as outside the voters: the other
    // half may be two voters, and a disk lost by either then leaves a voter set without a live
    // majority (seed 40331: n2 being added back to {n1, n3}, n1's disk lost).
    for n in 1..=NODES {
        shared.not_voter[n as usize].store(!full.contains(&n), Ordering::SeqCst);
    }
    // No node goes out while a lost disk may not be caught up, or a flipped bit will lose one
    // at its node's restart: the two voters left would include one that grants no vote until a
    // leader catches it up, and if the other was not the leader, none could be elected
    // (`runnev::raft::vote_gate`). A removal started before the loss can stay joint for good,
    // the new voter set needing the lost node's vote (seed 6364).
    let lost = (1..=NODES).any(|n| {
        shared.lost_disk[n as usize].load(Ordering::SeqCst) || shared.rotten[n as usize].load(Ordering::SeqCst)
    });
    let wants_out = |n: NodeId| !heal && !lost && shared.membership_out[n as usize].load(Ordering::SeqCst);
    let Some((n, remove)) = next_change(&voters, &serving, wants_out) else {
        return serving.iter().all(|n| voters.contains(n));
    };
    let order: Vec<NodeId> = std::iter::once(leader).chain((1..=NODES).filter(|o| *o != leader)).collect();
    let policy = RetryPolicy { give_up_after: Duration::from_secs(2), ..workload_policy() };
    let client = client_for(&order, policy);
    let done = if remove {
        shared.not_voter[n as usize].store(true, Ordering::SeqCst);
        // A leader that removes itself is the case of seed 40939: name it, so a pin can ask for it.
        let what = if n == leader { "removed from the voters while it led" } else { "removed from the voters" };
        client.remove_member(n).await.map(|_| what)
    } else {
        let addr = format!("{}:{}", crate::plan::node_host(n), crate::plan::NODE_PORT);
        client.add_member(n, &addr, true).await.map(|_| "added back as a voter")
    };
    let line = match done {
        Ok(what) => {
            shared.membership_changes.fetch_add(1, Ordering::Relaxed);
            format!("{:>7} ms control: n{n} {what}", now_ms())
        }
        Err(e) => format!("{:>7} ms control: changing n{n}'s membership failed (will retry): {e}", now_ms()),
    };
    shared.record(|h| h.fault_log.push(line));
    false
}

/// The next membership change towards what the driver wants, from the leader's `voters`:
/// `Some((node, remove))`. First a serving node outside the voters that `wants_out` does not
/// name is put back (`false`); otherwise, only while every node serves (none retired) and every
/// one is a voter, one node `wants_out` names is taken out (`true`). So at most one node is
/// ever outside the voters: a voter left alone is the whole cluster, and losing its disk would
/// lose everything (the product allows it; an operator may do it, the driver does not).
fn next_change(
    voters: &BTreeSet<NodeId>,
    serving: &[NodeId],
    wants_out: impl Fn(NodeId) -> bool,
) -> Option<(NodeId, bool)> {
    let out: Vec<NodeId> = serving.iter().copied().filter(|n| !voters.contains(n)).collect();
    if let Some(&n) = out.iter().find(|n| !wants_out(**n)) {
        return Some((n, false));
    }
    if !out.is_empty() || serving.len() < NODES as usize {
        return None;
    }
    serving.iter().copied().find(|n| wants_out(*n)).map(|n| (n, true))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    /// The control client's membership steps: one node out at a time, put back first, back
    /// whatever this client believes it did (a removal whose answer was lost), and all back in
    /// the heal phase; never a removal while a node is retired.
    #[test]
    fn membership_changes_take_out_one_node_at_a_time_and_put_back_first() {
        let all = [1, 2, 3];
        // The driver wants n2 out: taken out.
        assert_eq!(next_change(&set(&all), &all, |n| n == 2), Some((2, true)));
        // n2 is out and the driver now wants n1 out too: nothing until n2 is back (seed 13, where
        // n1 and n2 went out together and n3, left alone, then lost its log).
        assert_eq!(next_change(&set(&[1, 3]), &all, |n| n == 1 || n == 2), None);
        // n2's fault ended: n2 is put back before n1 is taken out (seed 6 took n1 out first).
        assert_eq!(next_change(&set(&[1, 3]), &all, |n| n == 1), Some((2, false)));
        // A removal whose answer was lost, and which the leader made: n1 is outside the voters
        // and nobody wants it out: put back (seed 9, where the driver believed it was in).
        assert_eq!(next_change(&set(&[2, 3]), &all, |_| false), Some((1, false)));
        // The heal phase wants nobody out: every serving node outside the voters comes back.
        assert_eq!(next_change(&set(&[3]), &all, |_| false), Some((1, false)));
        assert_eq!(next_change(&set(&all), &all, |_| false), None);
        // n3 retired (down for good): no removal, since the two left must stay a quorum.
        assert_eq!(next_change(&set(&all), &[1, 2], |n| n == 1), None);
        // A retired node outside the voters is not put back: it is not serving.
        assert_eq!(next_change(&set(&[1, 2]), &[1, 2], |_| false), None);
    }
}
