//! Proposal batching on the leader: concurrent writes share one Raft log entry.
//!
//! openraft 0.9 appends (and so fsyncs) each proposal on the leader before taking the next, so
//! one entry per publish caps a leader at one publish per fsync. The proposer drains whatever
//! requests are waiting into one [`Command::Batch`] entry: one fsync on each node for all of
//! them. A request waits for nothing but the entry in flight ahead of it; a lone request is
//! proposed alone, at once.
//!
//! The queue of requests waiting for an entry is bounded (`--max-queued-proposals`): past it a
//! request is answered `503 overloaded` at once and never reaches Raft, so a client may resend
//! it (same seq) without risk. The idea is admission control at a bounded queue, as in any
//! server that sheds load rather than let latency and memory grow without bound.
//!
//! Owns: forming batches, bounding the queue, and handing each request its own outcome. Must
//! never: answer a request before its entry is committed and applied, reorder commands within
//! an entry, or propose a request it answered `503 overloaded`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::write::{op_error, OpError};
use crate::error::ApiError;
use crate::limits::{COMMIT_WAIT_MS, PROPOSALS_IN_FLIGHT_MAX, PROPOSAL_BYTES_MAX, PROPOSAL_COMMANDS_MAX};
use crate::raft::{Command, Outcome, Raft};

type Reply = oneshot::Sender<Result<(Outcome, u64), OpError>>;

struct Proposal {
    cmd: Command,
    reply: Reply,
}

/// Hands commands to the batching task. Cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Proposal>,
}

/// Reports the queue's depth in the gauge `runnev_proposal_queue`, in requests.
fn report_depth(depth: usize) {
    metrics::gauge!("runnev_proposal_queue").set(depth as f64);
}

impl Proposer {
    /// Starts the batching task for `raft`, holding at most `queued_max` requests (at least 1)
    /// that wait for an entry; it ends when every `Proposer` clone is dropped.
    pub fn start(raft: Raft, queued_max: usize) -> Proposer {
        debug_assert!(queued_max >= 1, "a queue of proposals holds at least one");
        let (tx, rx) = mpsc::channel(queued_max.max(1));
        report_depth(0);
        tokio::spawn(run(raft, rx));
        Proposer { tx }
    }

    /// Proposes `cmd` (possibly batched with others) and returns its outcome and the log index
    /// of the entry that carried it, once committed and applied.
    ///
    /// Errors: `503 overloaded` at once, with nothing proposed, when `queued_max` requests
    /// already wait (counted in `runnev_overloaded_total{bound="proposals"}`);
    /// `OpError::NotLeader` if this node is not (or stopped being) leader; `503 no_leader` if
    /// the entry did not commit within [`COMMIT_WAIT_MS`] (outcome unknown); `500 internal` if
    /// Raft stopped.
    pub(crate) async fn propose(&self, cmd: Command) -> Result<(Outcome, u64), OpError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Proposal { cmd, reply }) {
            Ok(()) => report_depth(self.tx.max_capacity() - self.tx.capacity()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!("runnev_overloaded_total", "bound" => "proposals").increment(1);
                return Err(OpError::Fail(ApiError::Overloaded(format!(
                    "the leader's queue of proposals is full ({} wait, --max-queued-proposals); nothing was proposed: retry later",
                    self.tx.max_capacity()
                ))));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(OpError::Fail(ApiError::Internal("the proposer has stopped".into())))
            }
        }
        rx.await.map_err(|_| OpError::Fail(ApiError::Internal("the proposer dropped a request".into())))?
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Proposal>) {
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut bytes = first.cmd.payload_bytes() as usize;
        let mut batch = vec![first];
        while batch.len() < PROPOSAL_COMMANDS_MAX && bytes < PROPOSAL_BYTES_MAX {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.cmd.payload_bytes() as usize;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        report_depth(rx.len());
        let raft = raft.clone();
        tokio::spawn(async move {
            commit(&raft, batch).await;
            drop(permit);
        });
    }
}

async fn commit(raft: &Raft, batch: Vec<Proposal>) {
    let (cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().map(|p| (p.cmd, p.reply)).unzip();
    let n = cmds.len();
    let entry =
        if n == 1 { cmds.into_iter().next().unwrap_or(Command::Batch(Vec::new())) } else { Command::Batch(cmds) };
    metrics::histogram!("runnev_proposal_commands").record(n as f64);
    // A leader cut off from its quorum cannot commit; answer within a bound instead of holding
    // the clients. The entry may still commit later: the outcome is unknown to them.
    let result = match tokio::time::timeout(Duration::from_millis(COMMIT_WAIT_MS), raft.client_write(entry)).await {
        Ok(Ok(r)) => Ok((r.data, r.log_id.index)),
        Ok(Err(e)) => Err(op_error(e)),
        Err(_) => Err(OpError::Fail(ApiError::OutcomeUnknown(format!(
            "the entry was not committed within {COMMIT_WAIT_MS} ms (no quorum reachable?); its outcome is unknown: retry, with the same seq"
        )))),
    };
    match result {
        Ok((outcome, index)) if n == 1 => send_all(replies, |_| Ok((outcome.clone(), index))),
        Ok((Outcome::Batch(outcomes), index)) if outcomes.len() == n => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok((outcome, index)));
            }
        }
        Ok((other, index)) => send_all(replies, |_| {
            Err(OpError::Fail(ApiError::Internal(format!("entry {index} of {n} commands applied as {other:?}"))))
        }),
        Err(e) => send_all(replies, |_| Err(e.clone())),
    }
}

fn send_all(replies: Vec<Reply>, f: impl Fn(usize) -> Result<(Outcome, u64), OpError>) {
    for (i, reply) in replies.into_iter().enumerate() {
        let _ = reply.send(f(i));
    }
}
