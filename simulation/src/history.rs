//! What a run observed, as the checker reads it: every publish attempt and its answer, every
//! subscriber's deliveries, read-your-writes probes, each node's final state after the heal
//! phase, and the liveness milestones.
//!
//! Owns: the record's shape and its digest. Must never: hold anything derived from wall-clock
//! time or iteration over hashed collections (the digest compares runs), or anything the
//! checker would have to trust instead of check.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

/// A node's id (1, 2, 3).
pub type NodeId = u64;

/// One batch as a client or a node showed it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    /// Its seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// The payload, byte for byte.
    pub data: Vec<u8>,
}

/// A stream of the workload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamSpec {
    /// Its name.
    pub name: String,
    /// `retention.max_batches`, if any: such a stream may evict, so consumers may see gaps.
    pub max_batches: Option<u64>,
}

/// The answer one publish attempt got.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `201`/`200` with this body.
    Ack {
        /// The batch's seq.
        seq: u64,
        /// The batch's ts.
        ts: u64,
        /// `"duplicate": true`.
        duplicate: bool,
        /// Raft log index of the batch.
        index: u64,
    },
    /// A definitive error answer (SPEC §3 code).
    Rejected {
        /// HTTP status.
        status: u16,
        /// Error code.
        code: String,
    },
    /// The client gave up without a definitive answer: the outcome is unknown.
    Unknown(String),
}

/// One send of a publish (the client's own retries inside one call count as one attempt).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attempt {
    /// Simulated time the call was made, ms since the run started.
    pub sent_ms: u64,
    /// Simulated time the answer came, ms since the run started.
    pub at_ms: u64,
    /// A resend after an acknowledgement, made on purpose to test dedup.
    pub deliberate_resend: bool,
    /// What came back.
    pub outcome: Outcome,
}

/// Who published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Publisher {
    /// A workload publisher, by number.
    Workload(usize),
    /// The control client's liveness publishes in the heal phase.
    Heal,
}

/// One logical publish: one payload, sent until acknowledged (or the run ended).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Publish {
    /// Who sent it.
    pub publisher: Publisher,
    /// To which stream.
    pub stream: String,
    /// The seq asked for, or `None` for server-assigned.
    pub seq: Option<u64>,
    /// The payload (unique per logical publish).
    pub payload: Vec<u8>,
    /// Every send, in order.
    pub attempts: Vec<Attempt>,
}

impl Publish {
    /// The acknowledgements this publish received: (seq, ts, duplicate, index).
    pub fn acks(&self) -> impl Iterator<Item = (u64, u64, bool, u64)> + '_ {
        self.attempts.iter().filter_map(|a| match a.outcome {
            Outcome::Ack { seq, ts, duplicate, index } => Some((seq, ts, duplicate, index)),
            _ => None,
        })
    }
}

/// Something a subscriber saw.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seen {
    /// A batch (after the client's dedupe by cursor).
    Batch(Batch),
    /// An announced gap, inclusive.
    Gap {
        /// First evicted seq announced.
        from: u64,
        /// Last evicted seq announced.
        to: u64,
    },
    /// The consumer restarted its subscription from its cursor (a deliberate reconnect).
    Restart {
        /// The cursor it resumed from.
        cursor: u64,
    },
    /// The subscription reported an error (it keeps trying unless the error is final).
    Error(String),
}

/// One subscriber's view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubscriberLog {
    /// Its number.
    pub id: usize,
    /// The stream it follows.
    pub stream: String,
    /// The cursor it started from.
    pub start_after: u64,
    /// What it saw, with the simulated time (ms since the start).
    pub events: Vec<(u64, Seen)>,
}

impl SubscriberLog {
    /// The last seq it processed or was told is gone (its cursor).
    pub fn position(&self) -> u64 {
        self.events.iter().fold(self.start_after, |pos, (_, s)| match s {
            Seen::Batch(b) => pos.max(b.seq),
            Seen::Gap { to, .. } => pos.max(*to),
            _ => pos,
        })
    }
}

/// A read's answer: the gap it announced (inclusive), and the batches after it.
pub type ReadAnswer = (Option<(u64, u64)>, Vec<Batch>);

/// A read-your-writes probe: after an acknowledgement, a read on one node with
/// `after = seq - 1` and `min_index = index` (SPEC §3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadCheck {
    /// The node asked.
    pub node: NodeId,
    /// The stream.
    pub stream: String,
    /// The acknowledged seq.
    pub seq: u64,
    /// The acknowledged payload.
    pub payload: Vec<u8>,
    /// The acknowledged index, passed as `min_index`.
    pub min_index: u64,
    /// What the node answered: the gap and batches, or why not.
    pub answer: Result<ReadAnswer, String>,
}

/// A stream as one node holds it at the end.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FinalStream {
    /// Oldest retained seq.
    pub first_seq: u64,
    /// Highest accepted seq.
    pub last_seq: u64,
    /// Highest evicted seq.
    pub evicted_through: u64,
    /// Retained batch count, as the node's metadata says.
    pub batches_counted: u64,
    /// The retained batches, in seq order.
    pub batches: Vec<Batch>,
}

/// One node's state after the heal phase, read from that node alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeFinal {
    /// The node.
    pub node: NodeId,
    /// Its streams, or why they could not be read.
    pub streams: Result<BTreeMap<String, FinalStream>, String>,
}

/// A stream's content as the control client read it just before deleting it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BeforeDelete {
    /// When the read started, ms since the run started; it asked for `min_index` = the highest
    /// log index acknowledged to any publish recorded by then, so every batch acknowledged
    /// before this time is in it (unless evicted by retention).
    pub read_ms: u64,
    /// The `min_index` it read with.
    pub min_index: u64,
    /// The retained batches, in seq order: (seq, ts, [`fnv`](fn@fnv) of the payload).
    pub batches: Vec<(u64, u64, u64)>,
    /// The stream's `last_seq` as read.
    pub last_seq: u64,
    /// The highest seq the read was told is evicted (its gap's end), 0 if none.
    pub evicted_through: u64,
}

/// A stream as its creation (again) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Recreated {
    /// When the answer came, ms since the run started.
    pub at_ms: u64,
    /// `201` (created) rather than `200` (it existed: an attempt whose answer was lost made it).
    pub created: bool,
    /// Its `first_seq`.
    pub first_seq: u64,
    /// Its `last_seq`.
    pub last_seq: u64,
    /// Its `evicted_through`.
    pub evicted_through: u64,
}

/// One deletion of a workload stream by the control client, and its creation again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Deletion {
    /// The stream.
    pub stream: String,
    /// What it held just before.
    pub before: BeforeDelete,
    /// When the first delete call was made, ms since the run started (from then the stream
    /// may be gone).
    pub delete_sent_ms: u64,
    /// When a delete call succeeded.
    pub deleted_at_ms: u64,
    /// The call found the stream already gone (`404` after an attempt whose answer was lost,
    /// or after an earlier call that gave up): an earlier attempt deleted it.
    pub already: bool,
    /// The creation again, once it succeeded (`None`: the run ended first).
    pub recreated: Option<Recreated>,
}

/// Liveness milestones of the heal phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Liveness {
    /// When the fault phase ended and the heal phase began, in ms since the start.
    pub heal_started_at_ms: u64,
    /// When every node agreed on one leader and had applied all it knew committed.
    pub converged_at_ms: Option<u64>,
    /// Whether every workload publisher finished its last publish.
    pub publishers_finished: bool,
    /// Per subscriber: (id, position reached, the stream's last seq it had to reach).
    pub subscriber_positions: Vec<(usize, u64, u64)>,
    /// What went wrong, in words.
    pub problems: Vec<String>,
}

/// Everything the checker reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct History {
    /// The run's seed.
    pub seed: u64,
    /// The workload's streams (the heal stream included).
    pub streams: Vec<StreamSpec>,
    /// Every logical publish, in the order they started.
    pub publishes: Vec<Publish>,
    /// Every subscriber's view.
    pub subscribers: Vec<SubscriberLog>,
    /// Read-your-writes probes.
    pub read_checks: Vec<ReadCheck>,
    /// Each node's final state.
    pub finals: Vec<NodeFinal>,
    /// Workload streams deleted and created again, in order.
    pub deletions: Vec<Deletion>,
    /// Heal-phase liveness.
    pub liveness: Liveness,
    /// Panics caught during the run (any thread of the simulation).
    pub panics: Vec<String>,
    /// Node incarnations that failed to start (e.g. the store did not reopen after a crash).
    pub node_errors: Vec<String>,
    /// The faults as applied, with their simulated times.
    pub fault_log: Vec<String>,
    /// The simulation itself failed (turmoil error, a host's software returned an error).
    pub sim_error: Option<String>,
}

impl History {
    /// The spec of `stream`, if it is one of the workload's.
    pub fn stream(&self, name: &str) -> Option<&StreamSpec> {
        self.streams.iter().find(|s| s.name == name)
    }

    /// Whether `stream` may have seqs below its `evicted_through` that it no longer holds: it has
    /// a retention limit, or it was deleted and created again (the new stream continues after
    /// the deleted one's `last_seq`, whose seqs count as evicted: contract §5).
    pub fn may_evict(&self, name: &str) -> bool {
        self.stream(name).is_some_and(|s| s.max_batches.is_some()) || self.deletions.iter().any(|d| d.stream == name)
    }

    /// The highest `evicted_through` any node reports for `stream` (0 if none).
    pub fn evicted_through(&self, stream: &str) -> u64 {
        self.finals
            .iter()
            .filter_map(|f| f.streams.as_ref().ok())
            .filter_map(|m| m.get(stream))
            .map(|s| s.evicted_through)
            .max()
            .unwrap_or(0)
    }

    /// A digest of the whole history: equal digests mean the runs observed the same things.
    /// Every field goes through [`Hash`] into FNV-1a: no field is formatted first (formatting
    /// each payload byte as decimal text made the digest an eighth of a seed's CPU time).
    pub fn digest(&self) -> u64 {
        let mut hasher = fnv::FnvHasher::default();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

/// FNV-1a, 64 bits, of `bytes`: a digest that is the same on every machine and every run.
pub fn fnv(bytes: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}
