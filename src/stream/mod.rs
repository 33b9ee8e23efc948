//! The stream rules of SPEC §1–§2: names, seq assignment, idempotent publish by (stream, seq),
//! retention and gaps.
//!
//! Owns: the decisions, as plain functions over a stream's metadata. Must never: do I/O, read a
//! clock or draw randomness. The state machine calls these while applying the Raft log, and every
//! replica must reach the same decision from the same log (SPEC §2.7).

use serde::{Deserialize, Serialize};

use crate::limits::STREAM_NAME_CHARS_MAX;

/// Per-stream retention limits (SPEC §1). Each is optional; `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Most batches kept; never evicts the newest batch.
    #[serde(default)]
    pub max_batches: Option<u64>,
    /// Most payload bytes kept (sum of payload lengths); never evicts the newest batch.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Oldest batch age kept, in ms, measured against the leader-assigned `ts` of the entry being
    /// applied. May empty the stream.
    #[serde(default)]
    pub max_age_ms: Option<u64>,
}

impl Retention {
    /// Checks that every limit present is at least 1.
    ///
    /// Errors: the name of the first field that is 0.
    pub fn validate(&self) -> Result<(), &'static str> {
        for (name, value) in
            [("max_batches", self.max_batches), ("max_bytes", self.max_bytes), ("max_age_ms", self.max_age_ms)]
        {
            if value == Some(0) {
                return Err(name);
            }
        }
        Ok(())
    }
}

/// A stream's replicated metadata. Invariants: `evicted_through < first_seq <= last_seq + 1`;
/// `batches == 0` iff `first_seq == last_seq + 1`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMeta {
    /// Retention limits in force.
    pub retention: Retention,
    /// Seq of the oldest retained batch, or `last_seq + 1` when the stream is empty.
    pub first_seq: u64,
    /// Highest seq ever accepted (0 before the first publish). Never decreases.
    pub last_seq: u64,
    /// Highest seq retention has evicted (0 if none). Never decreases.
    pub evicted_through: u64,
    /// Number of retained batches.
    pub batches: u64,
    /// Sum of retained payload lengths, in bytes.
    pub bytes: u64,
}

impl StreamMeta {
    /// A new, empty stream with the given retention.
    pub fn new(retention: Retention) -> Self {
        StreamMeta { retention, first_seq: 1, ..Default::default() }
    }

    /// Whether the invariants hold: `evicted_through < first_seq <= last_seq + 1`; `batches == 0`
    /// iff `first_seq == last_seq + 1`; at most one batch per seq in `first_seq..=last_seq`, and
    /// no bytes without a batch. Computed in u128, so no seq overflows. The state machine asserts
    /// it (`debug_assert!`) after every change, so the simulation checks it on every step.
    pub fn is_consistent(&self) -> bool {
        let (first, last, evicted) =
            (u128::from(self.first_seq), u128::from(self.last_seq), u128::from(self.evicted_through));
        evicted < first
            && first <= last + 1
            && (self.batches == 0) == (first == last + 1)
            && u128::from(self.batches) <= last + 1 - first
            && (self.batches > 0 || self.bytes == 0)
    }
}

/// A stream created under the name of a deleted one: it continues after the deleted stream's
/// last seq, which counts as evicted, so seqs are never reused and a consumer holding a cursor
/// into the old stream is told about a gap rather than skipping new batches (SPEC §1, §2.5).
pub fn reincarnate(deleted: &StreamMeta, retention: Retention) -> StreamMeta {
    StreamMeta {
        retention,
        first_seq: deleted.last_seq + 1,
        last_seq: deleted.last_seq,
        evicted_through: deleted.last_seq,
        batches: 0,
        bytes: 0,
    }
}

/// Why a stream name is refused (SPEC §1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty name.
    #[error("stream name is empty")]
    Empty,
    /// Longer than [`STREAM_NAME_CHARS_MAX`].
    #[error("stream name has {0} characters; the most is {STREAM_NAME_CHARS_MAX}")]
    TooLong(usize),
    /// A character outside `[A-Za-z0-9._-]`.
    #[error("stream name has {0:?}; only A-Z, a-z, 0-9, '.', '_' and '-' are allowed")]
    BadChar(char),
    /// `.` or `..`.
    #[error("stream name cannot be '.' or '..'")]
    Dots,
    /// The path segment is not valid percent-encoded UTF-8.
    #[error("stream name is not valid percent-encoded UTF-8")]
    Undecodable,
}

/// Validates a stream name: 1–128 chars of `[A-Za-z0-9._-]`, not `.` or `..` (SPEC §1).
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let chars = name.chars().count();
    if chars == 0 {
        return Err(NameError::Empty);
    }
    if chars > STREAM_NAME_CHARS_MAX {
        return Err(NameError::TooLong(chars));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(NameError::BadChar(c));
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots);
    }
    Ok(())
}

/// What the stream already holds at a publisher-supplied seq, looked up by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// No batch is stored at that seq.
    Absent,
    /// A batch with byte-identical payload is stored.
    SamePayload,
    /// A batch with another payload is stored.
    OtherPayload,
}

/// A publish refused by the rules of SPEC §2.3. Nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PublishRejection {
    /// `409 seq_conflict`: the seq holds a batch with another payload.
    #[error("seq {seq} already holds a batch with a different payload")]
    SeqConflict {
        /// The seq asked for.
        seq: u64,
    },
    /// `409 seq_not_increasing`: seq ≤ last seq, no batch there, and not evicted.
    #[error("seq {seq} is not above the stream's last seq {last_seq} and was never accepted")]
    SeqNotIncreasing {
        /// The seq asked for.
        seq: u64,
        /// The stream's last seq.
        last_seq: u64,
    },
    /// `409 seq_evicted`: seq ≤ evicted_through and no batch there.
    #[error(
        "seq {seq} is at or below evicted_through {evicted_through}; whether it was accepted can no longer be told"
    )]
    SeqEvicted {
        /// The seq asked for.
        seq: u64,
        /// The stream's evicted_through.
        evicted_through: u64,
    },
    /// `409 seq_not_increasing`: the server-assigned seq would overflow u64.
    #[error("the stream's seq space is exhausted")]
    SeqExhausted,
}

/// The outcome of the SPEC §2.3 rules for one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishDecision {
    /// Append a new batch with this seq.
    Append(u64),
    /// The same batch is already stored at this seq: answer `duplicate: true`, write nothing.
    Duplicate(u64),
    /// Refuse.
    Reject(PublishRejection),
}

/// Decides a publish (SPEC §2.3). `requested` is the publisher's seq (≥ 1) or `None` for a
/// server-assigned one; `existing` is what the stream holds at `requested` (ignored when `None`,
/// or when `requested > last_seq`).
pub fn decide_publish(meta: &StreamMeta, requested: Option<u64>, existing: Existing) -> PublishDecision {
    let Some(seq) = requested else {
        return match meta.last_seq.checked_add(1) {
            Some(next) => PublishDecision::Append(next),
            None => PublishDecision::Reject(PublishRejection::SeqExhausted),
        };
    };
    if seq > meta.last_seq {
        return PublishDecision::Append(seq);
    }
    match existing {
        Existing::SamePayload => PublishDecision::Duplicate(seq),
        Existing::OtherPayload => PublishDecision::Reject(PublishRejection::SeqConflict { seq }),
        Existing::Absent if seq <= meta.evicted_through => {
            PublishDecision::Reject(PublishRejection::SeqEvicted { seq, evicted_through: meta.evicted_through })
        }
        Existing::Absent => {
            PublishDecision::Reject(PublishRejection::SeqNotIncreasing { seq, last_seq: meta.last_seq })
        }
    }
}

/// Records an appended batch of `len` bytes at `seq` (which [`decide_publish`] returned).
pub fn record_append(meta: &mut StreamMeta, seq: u64, len: u64) {
    debug_assert!(seq > meta.last_seq);
    if meta.batches == 0 {
        meta.first_seq = seq;
    }
    meta.last_seq = seq;
    meta.batches += 1;
    meta.bytes += len;
    debug_assert!(meta.is_consistent(), "after appending seq {seq}: {meta:?}");
}

/// The oldest retained batch, as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oldest {
    /// Its seq.
    pub seq: u64,
    /// Its leader-assigned ts, in ms since the Unix epoch.
    pub ts_ms: u64,
    /// Its payload length, in bytes.
    pub len: u64,
}

/// Whether retention evicts the oldest batch now. `now_ms` is the `ts` carried by the log entry
/// being applied (never a local clock). `max_batches` and `max_bytes` never evict the newest
/// batch; `max_age_ms` may (SPEC §2.7).
pub fn must_evict(meta: &StreamMeta, oldest: &Oldest, now_ms: u64) -> bool {
    if meta.batches == 0 {
        return false;
    }
    let r = &meta.retention;
    let over_age = r.max_age_ms.is_some_and(|age| now_ms.saturating_sub(oldest.ts_ms) > age);
    if over_age {
        return true;
    }
    if meta.batches <= 1 {
        return false;
    }
    r.max_batches.is_some_and(|n| meta.batches > n) || r.max_bytes.is_some_and(|n| meta.bytes > n)
}

/// Records the eviction of the oldest batch; `next_first_seq` is the seq of the batch after it,
/// or `None` when it was the last one.
pub fn record_eviction(meta: &mut StreamMeta, oldest: &Oldest, next_first_seq: Option<u64>) {
    debug_assert_eq!(oldest.seq, meta.first_seq);
    meta.batches -= 1;
    meta.bytes -= oldest.len;
    meta.evicted_through = meta.evicted_through.max(oldest.seq);
    meta.first_seq = next_first_seq.unwrap_or(meta.last_seq + 1);
    debug_assert!(meta.is_consistent(), "after evicting seq {}: {meta:?}", oldest.seq);
}

/// The gap a consumer at `after` must be told about (SPEC §2.5), as an inclusive seq range.
pub fn gap_for(meta: &StreamMeta, after: u64) -> Option<(u64, u64)> {
    (after < meta.evicted_through).then(|| (after + 1, meta.evicted_through))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(last_seq: u64, evicted_through: u64) -> StreamMeta {
        StreamMeta { last_seq, evicted_through, first_seq: evicted_through + 1, ..Default::default() }
    }

    #[test]
    fn stream_invariants_are_checked() {
        assert!(StreamMeta::new(Retention::default()).is_consistent());
        let mut m = StreamMeta::new(Retention::default());
        record_append(&mut m, 3, 10);
        record_append(&mut m, 9, 1);
        assert!(m.is_consistent());
        assert!(!StreamMeta { batches: 8, ..m }.is_consistent(), "more batches than seqs 3..=9");
        assert!(!StreamMeta { first_seq: 2, evicted_through: 2, ..m }.is_consistent(), "evicted a retained seq");
        assert!(!StreamMeta { batches: 0, ..m }.is_consistent(), "no batches in a non-empty range");
        assert!(!StreamMeta { bytes: 5, ..StreamMeta::new(Retention::default()) }.is_consistent());
        let full = StreamMeta { first_seq: u64::MAX, last_seq: u64::MAX, batches: 1, bytes: 1, ..Default::default() };
        assert!(full.is_consistent(), "the last seq does not overflow the check");
    }

    #[test]
    fn names_follow_spec_1() {
        assert_eq!(validate_name("orders.v1_eu-west"), Ok(()));
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name("."), Err(NameError::Dots));
        assert_eq!(validate_name(".."), Err(NameError::Dots));
        assert_eq!(validate_name("..."), Ok(()));
        assert_eq!(validate_name("a b"), Err(NameError::BadChar(' ')));
        assert_eq!(validate_name("a/b"), Err(NameError::BadChar('/')));
        assert_eq!(validate_name("é"), Err(NameError::BadChar('é')));
        assert_eq!(validate_name(&"x".repeat(128)), Ok(()));
        assert_eq!(validate_name(&"x".repeat(129)), Err(NameError::TooLong(129)));
    }

    #[test]
    fn server_assigned_seq_is_last_plus_one() {
        assert_eq!(decide_publish(&meta(0, 0), None, Existing::Absent), PublishDecision::Append(1));
        assert_eq!(decide_publish(&meta(41, 3), None, Existing::Absent), PublishDecision::Append(42));
        assert_eq!(
            decide_publish(&meta(u64::MAX, 0), None, Existing::Absent),
            PublishDecision::Reject(PublishRejection::SeqExhausted)
        );
    }

    #[test]
    fn the_five_outcomes_of_spec_2_3() {
        let m = meta(10, 4);
        assert_eq!(decide_publish(&m, Some(1000), Existing::Absent), PublishDecision::Append(1000));
        assert_eq!(decide_publish(&m, Some(7), Existing::SamePayload), PublishDecision::Duplicate(7));
        assert_eq!(
            decide_publish(&m, Some(7), Existing::OtherPayload),
            PublishDecision::Reject(PublishRejection::SeqConflict { seq: 7 })
        );
        assert_eq!(
            decide_publish(&m, Some(7), Existing::Absent),
            PublishDecision::Reject(PublishRejection::SeqNotIncreasing { seq: 7, last_seq: 10 })
        );
        assert_eq!(
            decide_publish(&m, Some(4), Existing::Absent),
            PublishDecision::Reject(PublishRejection::SeqEvicted { seq: 4, evicted_through: 4 })
        );
    }

    #[test]
    fn count_and_bytes_never_evict_the_newest_batch() {
        let mut m = StreamMeta::new(Retention { max_batches: Some(1), max_bytes: Some(1), max_age_ms: None });
        record_append(&mut m, 1, 10);
        let oldest = Oldest { seq: 1, ts_ms: 0, len: 10 };
        assert!(!must_evict(&m, &oldest, 0));
        record_append(&mut m, 2, 10);
        assert!(must_evict(&m, &oldest, 0));
        record_eviction(&mut m, &oldest, Some(2));
        assert_eq!((m.first_seq, m.evicted_through, m.batches, m.bytes), (2, 1, 1, 10));
    }

    #[test]
    fn age_may_empty_a_stream_and_uses_the_entry_ts() {
        let mut m = StreamMeta::new(Retention { max_age_ms: Some(100), ..Default::default() });
        record_append(&mut m, 5, 3);
        let oldest = Oldest { seq: 5, ts_ms: 1_000, len: 3 };
        assert!(!must_evict(&m, &oldest, 1_100));
        assert!(must_evict(&m, &oldest, 1_101));
        record_eviction(&mut m, &oldest, None);
        assert_eq!((m.first_seq, m.last_seq, m.evicted_through, m.batches), (6, 5, 5, 0));
    }

    #[test]
    fn a_recreated_stream_never_reuses_seqs() {
        let mut old = StreamMeta::new(Retention::default());
        record_append(&mut old, 1, 1);
        record_append(&mut old, 2, 1);
        let new = reincarnate(&old, Retention::default());
        assert_eq!(decide_publish(&new, None, Existing::Absent), PublishDecision::Append(3));
        assert_eq!(gap_for(&new, 1), Some((2, 2)));
        assert_eq!(
            decide_publish(&new, Some(2), Existing::Absent),
            PublishDecision::Reject(PublishRejection::SeqEvicted { seq: 2, evicted_through: 2 })
        );
    }

    #[test]
    fn gaps_follow_spec_2_5() {
        // A stream whose first publish used seq 1000 shows no gap to a consumer from 0.
        let mut m = StreamMeta::new(Retention::default());
        record_append(&mut m, 1000, 1);
        assert_eq!(gap_for(&m, 0), None);
        assert_eq!(gap_for(&meta(200, 117), 0), Some((1, 117)));
        assert_eq!(gap_for(&meta(200, 117), 116), Some((117, 117)));
        assert_eq!(gap_for(&meta(200, 117), 117), None);
    }
}
