//! The stream rules of SPEC §1–§2: names, seq assignment, idempotent publish by (stream, seq),
//! retention and gaps.
//!
//! Owns: the decisions, as plain functions over a stream's metadata. Must never: do I/O, read a
//! clock or draw randomness, or wrap or panic on any input: the state machine calls these while
//! applying the Raft log, every replica must reach the same decision from the same log (SPEC
//! §2.7), and a panic there would stop every replica on the same entry. Arithmetic is checked;
//! a change the counters cannot represent is a [`MetaError`], and the metadata is left as it was.

use serde::{Deserialize, Serialize};

use crate::limits::STREAM_NAME_CHARS_MAX;

/// The largest seq a stream may hold: 2⁶⁴−2 (the usable seqs are `1..=SEQ_MAX`). 2⁶⁴−1 is never
/// a seq, so `last_seq + 1`, the `first_seq` of an emptied stream, always fits in a u64.
pub const SEQ_MAX: u64 = u64::MAX - 1;

/// Per-stream retention limits (SPEC §1). Each is optional; `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Most batches kept; never evicts the newest batch.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_batches: Option<u64>,
    /// Most payload bytes kept (sum of payload lengths); never evicts the newest batch.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_bytes: Option<u64>,
    /// Oldest batch age kept, in ms, measured against the leader-assigned `ts` of the entry being
    /// applied. May empty the stream.
    #[serde(default)]
    #[schema(minimum = 1)]
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

/// A change to a stream's metadata that its counters cannot represent, or that its current
/// metadata does not allow. The `record_*` rules return it instead of wrapping or panicking, and
/// leave the metadata unchanged; the state machine turns it into the rejection of the command
/// (a publish) or of the step (an eviction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum MetaError {
    /// A seq outside `1..=SEQ_MAX`.
    #[error("seq {0} is outside the usable seqs 1..={SEQ_MAX}")]
    SeqOutOfRange(u64),
    /// An append at or below the stream's last seq.
    #[error("seq {seq} is not above the stream's last seq {last_seq}")]
    SeqNotAbove {
        /// The seq of the append.
        seq: u64,
        /// The stream's last seq.
        last_seq: u64,
    },
    /// The retained batch count would pass 2⁶⁴−1.
    #[error("the stream's retained batch count would pass 2^64-1")]
    BatchCountOverflow,
    /// The retained payload bytes would pass 2⁶⁴−1.
    #[error("the stream's retained payload bytes would pass 2^64-1")]
    BytesOverflow,
    /// An eviction of a batch that is not the stream's oldest.
    #[error("the batch to evict is not the stream's oldest")]
    NotOldest,
    /// An eviction from a stream that counts no batch.
    #[error("the stream counts no batch to evict")]
    NoBatch,
    /// An eviction of a batch larger than the stream's retained bytes.
    #[error("the stream counts fewer payload bytes than the batch to evict")]
    FewerBytes,
    /// An eviction whose result would break the invariants of [`StreamMeta`].
    #[error("evicting the batch would break the stream's invariants")]
    BreaksInvariants,
    /// Emptying the stream would put `first_seq` past 2⁶⁴−1: only a stream whose last seq is
    /// 2⁶⁴−1, written by an older build that accepted that seq.
    #[error("emptying the stream would put first_seq past 2^64-1")]
    PastTheTop,
}

/// A stream created under the name of a deleted one: it continues after the deleted stream's
/// last seq, which counts as evicted, so seqs are never reused and a consumer holding a cursor
/// into the old stream is told about a gap rather than skipping new batches (SPEC §1, §2.5).
///
/// The one exception: when the deleted stream's last seq is [`SEQ_MAX`] (or above, written by an
/// older build), no seq is left after it, and the new stream starts a new seq space at 1 instead,
/// so that a deleted name is always usable again.
pub fn reincarnate(deleted: &StreamMeta, retention: Retention) -> StreamMeta {
    match deleted.last_seq.checked_add(1).filter(|first| *first <= SEQ_MAX) {
        Some(first_seq) => StreamMeta {
            retention,
            first_seq,
            last_seq: deleted.last_seq,
            evicted_through: deleted.last_seq,
            batches: 0,
            bytes: 0,
        },
        None => StreamMeta::new(retention),
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
    /// `409 seq_not_increasing`: the stream's last seq is [`SEQ_MAX`], so no server-assigned
    /// seq is left.
    #[error("the stream's seq space is exhausted: its last seq is the largest usable seq, {SEQ_MAX}")]
    SeqExhausted,
    /// `400 invalid_seq`: a seq outside `1..=SEQ_MAX` (the API refuses it before proposing; this
    /// guards entries that reach the state machine anyway).
    #[error("seq {seq} is outside the usable seqs 1..={SEQ_MAX}")]
    SeqOutOfRange {
        /// The seq asked for.
        seq: u64,
    },
    /// `507 storage_full`: the stream's counters cannot take the batch (its retained payload
    /// bytes would pass 2⁶⁴−1).
    #[error("the stream cannot take this batch: {0}")]
    Unrepresentable(MetaError),
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

/// Decides a publish (SPEC §2.3). `requested` is the publisher's seq (`1..=SEQ_MAX`) or `None`
/// for a server-assigned one; `existing` is what the stream holds at `requested` (ignored when
/// `None`, or when `requested > last_seq`). A seq outside `1..=SEQ_MAX` is refused, and so is a
/// server-assigned seq past [`SEQ_MAX`].
pub fn decide_publish(meta: &StreamMeta, requested: Option<u64>, existing: Existing) -> PublishDecision {
    let Some(seq) = requested else {
        return match meta.last_seq.checked_add(1).filter(|next| *next <= SEQ_MAX) {
            Some(next) => PublishDecision::Append(next),
            None => PublishDecision::Reject(PublishRejection::SeqExhausted),
        };
    };
    if seq == 0 || seq > SEQ_MAX {
        return PublishDecision::Reject(PublishRejection::SeqOutOfRange { seq });
    }
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

/// A frames publish (SPEC §6) refused; nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum FramesRejection {
    /// Frame `frame` (0-based) broke a rule of SPEC §2.3: the first frame that did. Answered
    /// with that rule's status and code, and `"frame": frame`.
    #[error("frame {frame}: {rejection}")]
    Frame {
        /// Index of the first failing frame.
        frame: u64,
        /// The rule it broke.
        rejection: PublishRejection,
    },
    /// `409 partial_duplicate`: frames `0..first_new` are stored already (same seqs, same
    /// payloads) and the rest are new. Resend frames `first_new..` with `seq` = `first_new_seq`.
    #[error(
        "frames 0..{first_new} are already stored (duplicates) and frames from {first_new} on are new; nothing was written: resend frames {first_new}.. with seq={first_new_seq}"
    )]
    PartialDuplicate {
        /// Index of the first new frame (the count of duplicates before it).
        first_new: u64,
        /// That frame's seq.
        first_new_seq: u64,
    },
    /// The request carried no frame (the API refuses it before proposing; this guards entries
    /// that reach the state machine anyway).
    #[error("the request carries no frame")]
    Empty,
}

/// The outcome of the SPEC §6 rules for one frames publish of `count` frames, which take
/// consecutive seqs `first_seq..=last_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramesDecision {
    /// Append every frame: frame k at `first_seq + k`.
    Append {
        /// The first frame's seq.
        first_seq: u64,
        /// The last frame's seq.
        last_seq: u64,
    },
    /// Every frame is stored already with the same payload: answer `duplicate: true`, write
    /// nothing.
    Duplicate {
        /// The first frame's seq.
        first_seq: u64,
        /// The last frame's seq.
        last_seq: u64,
    },
    /// Refuse the whole request.
    Reject(FramesRejection),
}

/// Decides a frames publish of `count` frames (SPEC §6): all or none. `requested` is the
/// publisher's seq for frame 0 (frame k then asks for `requested + k`), or `None` for
/// server-assigned seqs `last_seq + 1 ..`. Each frame follows [`decide_publish`]; the first
/// frame it refuses refuses the request ([`FramesRejection::Frame`]); otherwise every frame new
/// is [`FramesDecision::Append`], every frame a duplicate is [`FramesDecision::Duplicate`], and a
/// mix is [`FramesRejection::PartialDuplicate`].
///
/// `existing(k, seq)` tells what the stream holds at `seq` for frame `k`; it is asked only for
/// frames whose seq is at or below `last_seq` (consecutive seqs above it are all new), in frame
/// order, and its error ends the decision. Arithmetic is checked: a seq past [`SEQ_MAX`] refuses
/// that frame (`SeqOutOfRange` with `requested`, `SeqExhausted` without), never wraps.
pub fn decide_frames<E>(
    meta: &StreamMeta,
    requested: Option<u64>,
    count: u64,
    mut existing: impl FnMut(u64, u64) -> Result<Existing, E>,
) -> Result<FramesDecision, E> {
    let reject = |frame, rejection| Ok(FramesDecision::Reject(FramesRejection::Frame { frame, rejection }));
    if count == 0 {
        return Ok(FramesDecision::Reject(FramesRejection::Empty));
    }
    let first_seq = match requested {
        None => match meta.last_seq.checked_add(1).filter(|next| *next <= SEQ_MAX) {
            Some(next) => next,
            None => return reject(0, PublishRejection::SeqExhausted),
        },
        Some(seq) if seq == 0 || seq > SEQ_MAX => return reject(0, PublishRejection::SeqOutOfRange { seq }),
        Some(seq) => seq,
    };
    // Frames at or below the last seq, in order: each a duplicate, or the request's refusal.
    let mut frame = 0u64;
    while frame < count {
        let Some(seq) = first_seq.checked_add(frame).filter(|s| *s <= meta.last_seq) else { break };
        match decide_publish(meta, Some(seq), existing(frame, seq)?) {
            PublishDecision::Duplicate(_) => {}
            PublishDecision::Reject(r) => return reject(frame, r),
            // Not reached: seq ≤ last_seq is never appended. Refuse rather than trust it.
            PublishDecision::Append(_) => {
                return reject(frame, PublishRejection::SeqNotIncreasing { seq, last_seq: meta.last_seq })
            }
        }
        frame += 1;
    }
    let duplicates = frame;
    // The rest are new; the first of them past SEQ_MAX, if any, is refused.
    let last_seq = match frames_last_seq(first_seq, count) {
        Ok(last) => last,
        Err(frame) => {
            let rejection = match requested {
                Some(_) => PublishRejection::SeqOutOfRange { seq: first_seq.saturating_add(frame) },
                None => PublishRejection::SeqExhausted,
            };
            return reject(frame, rejection);
        }
    };
    Ok(match duplicates {
        0 => FramesDecision::Append { first_seq, last_seq },
        d if d == count => FramesDecision::Duplicate { first_seq, last_seq },
        d => FramesDecision::Reject(FramesRejection::PartialDuplicate { first_new: d, first_new_seq: first_seq + d }),
    })
}

/// The last seq of `count` frames taking consecutive seqs from `first_seq` (SPEC §6).
///
/// Errors: the index of the first frame whose seq would be past [`SEQ_MAX`] (frame 0 when
/// `first_seq` itself is, or when `count` is 0 and nothing can be last).
pub fn frames_last_seq(first_seq: u64, count: u64) -> Result<u64, u64> {
    let room = SEQ_MAX.checked_sub(first_seq).ok_or(0u64)?; // frames 0..=room fit
    let last_frame = count.checked_sub(1).ok_or(0u64)?;
    if last_frame > room {
        return Err(room + 1);
    }
    Ok(first_seq + last_frame)
}

/// Records the frames of an appended frames publish: frame k, of `lens[k]` bytes, at
/// `first_seq + k` ([`decide_frames`] returned `first_seq`). All or none.
///
/// Errors (`meta` unchanged): the index of the first frame [`record_append`] refuses, with why
/// (a seq past [`SEQ_MAX`], a count or bytes past 2⁶⁴−1).
pub fn record_frames(
    meta: &mut StreamMeta,
    first_seq: u64,
    lens: impl IntoIterator<Item = u64>,
) -> Result<(), (u64, MetaError)> {
    let mut after = *meta;
    for (frame, len) in (0u64..).zip(lens) {
        let seq = first_seq.checked_add(frame).ok_or((frame, MetaError::SeqOutOfRange(u64::MAX)))?;
        record_append(&mut after, seq, len).map_err(|e| (frame, e))?;
    }
    *meta = after;
    Ok(())
}

/// Records an appended batch of `len` bytes at `seq` (which [`decide_publish`] returned).
///
/// Errors (`meta` unchanged): `seq` outside `1..=SEQ_MAX` or not above `last_seq`; the batch
/// count or bytes would pass 2⁶⁴−1 (checked, not saturating: a saturated count would make
/// retention and the invariants lie).
pub fn record_append(meta: &mut StreamMeta, seq: u64, len: u64) -> Result<(), MetaError> {
    if seq == 0 || seq > SEQ_MAX {
        return Err(MetaError::SeqOutOfRange(seq));
    }
    if seq <= meta.last_seq {
        return Err(MetaError::SeqNotAbove { seq, last_seq: meta.last_seq });
    }
    let batches = meta.batches.checked_add(1).ok_or(MetaError::BatchCountOverflow)?;
    let bytes = meta.bytes.checked_add(len).ok_or(MetaError::BytesOverflow)?;
    if meta.batches == 0 {
        meta.first_seq = seq;
    }
    meta.last_seq = seq;
    meta.batches = batches;
    meta.bytes = bytes;
    debug_assert!(meta.is_consistent(), "after appending seq {seq}: {meta:?}");
    Ok(())
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
    over_age || over_size_limits(meta)
}

/// Whether `meta` is over its `max_batches` or `max_bytes` with more than one batch (those
/// limits never evict the newest batch, SPEC §2.7): what [`must_evict`] and [`may_evict`] both
/// ask apart from age.
fn over_size_limits(meta: &StreamMeta) -> bool {
    let r = &meta.retention;
    meta.batches > 1 && (r.max_batches.is_some_and(|n| meta.batches > n) || r.max_bytes.is_some_and(|n| meta.bytes > n))
}

/// Whether [`must_evict`] can say yes for `meta`, whatever its oldest batch is: false when the
/// stream is empty, has no age limit and is within its count and byte limits (always so for a
/// stream without retention). Lets the state machine skip looking up the oldest batch on every
/// publish; `must_evict(meta, oldest, now)` implies `may_evict(meta)` (a property test below).
pub fn may_evict(meta: &StreamMeta) -> bool {
    meta.batches > 0 && (meta.retention.max_age_ms.is_some() || over_size_limits(meta))
}

/// Records the eviction of the oldest batch; `next_first_seq` is the seq of the batch after it,
/// or `None` when it was the last one.
///
/// Errors (`meta` unchanged): `oldest` is not the stream's first batch, the stream counts no
/// batch or fewer bytes than `oldest.len`, the result would break the invariants, or emptying
/// the stream would put `first_seq` past 2⁶⁴−1 ([`MetaError::PastTheTop`]).
pub fn record_eviction(meta: &mut StreamMeta, oldest: &Oldest, next_first_seq: Option<u64>) -> Result<(), MetaError> {
    if oldest.seq != meta.first_seq {
        return Err(MetaError::NotOldest);
    }
    let batches = meta.batches.checked_sub(1).ok_or(MetaError::NoBatch)?;
    let bytes = meta.bytes.checked_sub(oldest.len).ok_or(MetaError::FewerBytes)?;
    let first_seq = match next_first_seq {
        Some(next) => next,
        None => meta.last_seq.checked_add(1).ok_or(MetaError::PastTheTop)?,
    };
    let after =
        StreamMeta { batches, bytes, first_seq, evicted_through: meta.evicted_through.max(oldest.seq), ..*meta };
    if !after.is_consistent() {
        return Err(MetaError::BreaksInvariants);
    }
    *meta = after;
    Ok(())
}

/// The gap a consumer at `after` must be told about (SPEC §2.5), as an inclusive seq range.
/// (`after < evicted_through`, so `after + 1` cannot overflow.)
pub fn gap_for(meta: &StreamMeta, after: u64) -> Option<(u64, u64)> {
    (after < meta.evicted_through).then(|| (after.saturating_add(1), meta.evicted_through))
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
        record_append(&mut m, 3, 10).unwrap();
        record_append(&mut m, 9, 1).unwrap();
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
        assert_eq!(decide_publish(&meta(SEQ_MAX - 1, 0), None, Existing::Absent), PublishDecision::Append(SEQ_MAX));
        for last in [SEQ_MAX, u64::MAX] {
            assert_eq!(
                decide_publish(&meta(last, 0), None, Existing::Absent),
                PublishDecision::Reject(PublishRejection::SeqExhausted)
            );
        }
    }

    #[test]
    fn the_usable_seqs_are_1_to_seq_max() {
        let m = meta(10, 4);
        assert_eq!(decide_publish(&m, Some(SEQ_MAX), Existing::Absent), PublishDecision::Append(SEQ_MAX));
        for seq in [0, u64::MAX] {
            assert_eq!(
                decide_publish(&m, Some(seq), Existing::Absent),
                PublishDecision::Reject(PublishRejection::SeqOutOfRange { seq })
            );
            let mut n = m;
            assert_eq!(record_append(&mut n, seq, 1), Err(MetaError::SeqOutOfRange(seq)));
            assert_eq!(n, m, "a refused append changes nothing");
        }
        // The top seq can be taken, and the stream emptied after it: first_seq = 2^64-1 fits.
        let mut top = StreamMeta::new(Retention::default());
        record_append(&mut top, SEQ_MAX, 7).unwrap();
        record_eviction(&mut top, &Oldest { seq: SEQ_MAX, ts_ms: 0, len: 7 }, None).unwrap();
        assert_eq!((top.first_seq, top.last_seq, top.evicted_through, top.batches), (u64::MAX, SEQ_MAX, SEQ_MAX, 0));
        assert!(top.is_consistent());
    }

    #[test]
    fn counters_refuse_to_wrap() {
        let mut m = StreamMeta::new(Retention::default());
        record_append(&mut m, 1, u64::MAX).unwrap();
        let before = m;
        assert_eq!(record_append(&mut m, 2, 1), Err(MetaError::BytesOverflow));
        assert_eq!(m, before);
        let oldest = Oldest { seq: 1, ts_ms: 0, len: u64::MAX };
        assert_eq!(record_eviction(&mut StreamMeta { bytes: 3, ..m }, &oldest, None), Err(MetaError::FewerBytes));
        assert_eq!(record_eviction(&mut m, &Oldest { seq: 2, ..oldest }, None), Err(MetaError::NotOldest));
        // A stream whose last seq is 2^64-1 (an older build accepted it) keeps its last batch
        // rather than store a first_seq that does not fit.
        let mut legacy =
            StreamMeta { first_seq: u64::MAX, last_seq: u64::MAX, batches: 1, bytes: 1, ..Default::default() };
        let before = legacy;
        let last = Oldest { seq: u64::MAX, ts_ms: 0, len: 1 };
        assert_eq!(record_eviction(&mut legacy, &last, None), Err(MetaError::PastTheTop));
        assert_eq!(legacy, before);
    }

    #[test]
    fn a_name_deleted_at_the_top_starts_a_new_seq_space() {
        for last_seq in [SEQ_MAX, u64::MAX] {
            let deleted = StreamMeta { last_seq, first_seq: last_seq, batches: 1, bytes: 1, ..Default::default() };
            let new = reincarnate(&deleted, Retention::default());
            assert_eq!(new, StreamMeta::new(Retention::default()));
            assert_eq!(decide_publish(&new, None, Existing::Absent), PublishDecision::Append(1));
        }
        let below = StreamMeta { last_seq: SEQ_MAX - 1, first_seq: SEQ_MAX - 1, batches: 1, ..Default::default() };
        let new = reincarnate(&below, Retention::default());
        assert_eq!((new.first_seq, new.last_seq, new.evicted_through), (SEQ_MAX, SEQ_MAX - 1, SEQ_MAX - 1));
        assert_eq!(decide_publish(&new, None, Existing::Absent), PublishDecision::Append(SEQ_MAX));
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

    /// What a stream holds, for the frames rules: seq → payload.
    fn holding<'a>(stored: &'a [(u64, &'static [u8])]) -> impl Fn(u64) -> Option<&'static [u8]> + 'a {
        move |seq| stored.iter().find(|(s, _)| *s == seq).map(|(_, p)| *p)
    }

    /// Decides frames `payloads` against a stream holding `stored`, recording which frames were
    /// looked up.
    fn frames(
        m: &StreamMeta,
        stored: &[(u64, &'static [u8])],
        seq: Option<u64>,
        payloads: &[&[u8]],
    ) -> (FramesDecision, Vec<u64>) {
        let at = holding(stored);
        let mut asked = Vec::new();
        let d = decide_frames::<()>(m, seq, payloads.len() as u64, |k, s| {
            asked.push(k);
            Ok(match at(s) {
                Some(p) if p == payloads[k as usize] => Existing::SamePayload,
                Some(_) => Existing::OtherPayload,
                None => Existing::Absent,
            })
        })
        .unwrap();
        (d, asked)
    }

    fn stream_1_to_3() -> (StreamMeta, Vec<(u64, &'static [u8])>) {
        let mut m = StreamMeta::new(Retention::default());
        for seq in 1..=3 {
            record_append(&mut m, seq, 1).unwrap();
        }
        (m, vec![(1, b"a".as_slice()), (2, b"b"), (3, b"c")])
    }

    #[test]
    fn frames_take_consecutive_seqs_all_or_none() {
        let (m, stored) = stream_1_to_3();
        // Server-assigned: last + 1 on, nothing looked up.
        assert_eq!(
            frames(&m, &stored, None, &[b"x", b"y"]),
            (FramesDecision::Append { first_seq: 4, last_seq: 5 }, vec![])
        );
        // Publisher's seq above the last: new, with holes allowed before it.
        assert_eq!(
            frames(&m, &stored, Some(10), &[b"x".as_slice(); 3]).0,
            FramesDecision::Append { first_seq: 10, last_seq: 12 }
        );
        // A retry of stored frames: every frame a duplicate.
        assert_eq!(
            frames(&m, &stored, Some(1), &[b"a", b"b", b"c"]),
            (FramesDecision::Duplicate { first_seq: 1, last_seq: 3 }, vec![0, 1, 2])
        );
        // A mix: partial_duplicate, naming the first new frame and its seq.
        assert_eq!(
            frames(&m, &stored, Some(2), &[b"b", b"c", b"d", b"e"]).0,
            FramesDecision::Reject(FramesRejection::PartialDuplicate { first_new: 2, first_new_seq: 4 })
        );
        // No frame: refused.
        assert_eq!(frames(&m, &stored, None, &[]).0, FramesDecision::Reject(FramesRejection::Empty));
    }

    #[test]
    fn the_first_failing_frame_refuses_the_request() {
        let (m, stored) = stream_1_to_3();
        // A conflict in the middle, after a duplicate: the conflict, at its frame; frames after
        // it are not looked at.
        assert_eq!(
            frames(&m, &stored, Some(1), &[b"a", b"X", b"c", b"d"]),
            (
                FramesDecision::Reject(FramesRejection::Frame {
                    frame: 1,
                    rejection: PublishRejection::SeqConflict { seq: 2 }
                }),
                vec![0, 1]
            )
        );
        // A failing frame wins over a mix of duplicates and new frames.
        let mut holes = StreamMeta::new(Retention::default());
        record_append(&mut holes, 1, 1).unwrap();
        record_append(&mut holes, 3, 1).unwrap();
        let stored = [(1, b"a".as_slice()), (3, b"c")];
        assert_eq!(
            frames(&holes, &stored, Some(1), &[b"a", b"b", b"c", b"d"]).0,
            FramesDecision::Reject(FramesRejection::Frame {
                frame: 1,
                rejection: PublishRejection::SeqNotIncreasing { seq: 2, last_seq: 3 }
            })
        );
        // Evicted seqs: seq_evicted at the frame.
        let evicted = meta(10, 4);
        assert_eq!(
            frames(&evicted, &[], Some(4), &[b"a", b"b"]).0,
            FramesDecision::Reject(FramesRejection::Frame {
                frame: 0,
                rejection: PublishRejection::SeqEvicted { seq: 4, evicted_through: 4 }
            })
        );
        // A lookup error ends the decision.
        assert_eq!(decide_frames(&m, Some(1), 2, |_, _| Err("io")), Err("io"));
    }

    #[test]
    fn frames_never_pass_seq_max() {
        let m = meta(SEQ_MAX - 2, 0);
        assert_eq!(
            frames(&m, &[], None, &[b"x".as_slice(); 2]).0,
            FramesDecision::Append { first_seq: SEQ_MAX - 1, last_seq: SEQ_MAX }
        );
        assert_eq!(
            frames(&m, &[], None, &[b"x".as_slice(); 3]).0,
            FramesDecision::Reject(FramesRejection::Frame { frame: 2, rejection: PublishRejection::SeqExhausted })
        );
        assert_eq!(
            frames(&meta(SEQ_MAX, 0), &[], None, &[b"x"]).0,
            FramesDecision::Reject(FramesRejection::Frame { frame: 0, rejection: PublishRejection::SeqExhausted })
        );
        assert_eq!(
            frames(&meta(0, 0), &[], Some(SEQ_MAX), &[b"x".as_slice(); 3]).0,
            FramesDecision::Reject(FramesRejection::Frame {
                frame: 1,
                rejection: PublishRejection::SeqOutOfRange { seq: u64::MAX }
            })
        );
        for seq in [0, u64::MAX] {
            assert_eq!(
                frames(&meta(0, 0), &[], Some(seq), &[b"x"]).0,
                FramesDecision::Reject(FramesRejection::Frame {
                    frame: 0,
                    rejection: PublishRejection::SeqOutOfRange { seq }
                })
            );
        }
        // A count far beyond any request does not wrap either.
        let d = decide_frames::<()>(&meta(0, 0), Some(2), u64::MAX, |_, _| Ok(Existing::Absent)).unwrap();
        assert_eq!(
            d,
            FramesDecision::Reject(FramesRejection::Frame {
                frame: SEQ_MAX - 1,
                rejection: PublishRejection::SeqOutOfRange { seq: u64::MAX }
            })
        );
    }

    #[test]
    fn frame_seqs_stop_at_seq_max() {
        assert_eq!(frames_last_seq(1, 10_000), Ok(10_000));
        assert_eq!(frames_last_seq(SEQ_MAX, 1), Ok(SEQ_MAX));
        assert_eq!(frames_last_seq(SEQ_MAX, 2), Err(1));
        assert_eq!(frames_last_seq(SEQ_MAX - 9, u64::MAX), Err(10));
        assert_eq!(frames_last_seq(u64::MAX, 1), Err(0));
        assert_eq!(frames_last_seq(5, 0), Err(0));
    }

    #[test]
    fn recording_frames_is_all_or_none() {
        let mut m = StreamMeta::new(Retention::default());
        record_frames(&mut m, 5, [1, 0, 2]).unwrap();
        assert_eq!((m.first_seq, m.last_seq, m.batches, m.bytes), (5, 7, 3, 3));
        let before = m;
        assert_eq!(record_frames(&mut m, 8, [1, u64::MAX]), Err((1, MetaError::BytesOverflow)));
        assert_eq!(m, before, "a refused frame leaves the stream as it was");
        assert_eq!(record_frames(&mut m, 7, [1]), Err((0, MetaError::SeqNotAbove { seq: 7, last_seq: 7 })));
        assert_eq!(record_frames(&mut m, SEQ_MAX, [1, 1]), Err((1, MetaError::SeqOutOfRange(u64::MAX))));
        assert_eq!(m, before);
    }

    #[test]
    fn count_and_bytes_never_evict_the_newest_batch() {
        let mut m = StreamMeta::new(Retention { max_batches: Some(1), max_bytes: Some(1), max_age_ms: None });
        record_append(&mut m, 1, 10).unwrap();
        let oldest = Oldest { seq: 1, ts_ms: 0, len: 10 };
        assert!(!must_evict(&m, &oldest, 0));
        record_append(&mut m, 2, 10).unwrap();
        assert!(must_evict(&m, &oldest, 0));
        record_eviction(&mut m, &oldest, Some(2)).unwrap();
        assert_eq!((m.first_seq, m.evicted_through, m.batches, m.bytes), (2, 1, 1, 10));
    }

    #[test]
    fn age_may_empty_a_stream_and_uses_the_entry_ts() {
        let mut m = StreamMeta::new(Retention { max_age_ms: Some(100), ..Default::default() });
        record_append(&mut m, 5, 3).unwrap();
        let oldest = Oldest { seq: 5, ts_ms: 1_000, len: 3 };
        assert!(!must_evict(&m, &oldest, 1_100));
        assert!(must_evict(&m, &oldest, 1_101));
        record_eviction(&mut m, &oldest, None).unwrap();
        assert_eq!((m.first_seq, m.last_seq, m.evicted_through, m.batches), (6, 5, 5, 0));
    }

    #[test]
    fn a_recreated_stream_never_reuses_seqs() {
        let mut old = StreamMeta::new(Retention::default());
        record_append(&mut old, 1, 1).unwrap();
        record_append(&mut old, 2, 1).unwrap();
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
        record_append(&mut m, 1000, 1).unwrap();
        assert_eq!(gap_for(&m, 0), None);
        assert_eq!(gap_for(&meta(200, 117), 0), Some((1, 117)));
        assert_eq!(gap_for(&meta(200, 117), 116), Some((117, 117)));
        assert_eq!(gap_for(&meta(200, 117), 117), None);
    }
}

/// Property tests of the stream rules at the limits of seq, bytes and ts: any sequence of
/// publishes, evictions and delete-and-create-again keeps [`StreamMeta::is_consistent`], never
/// wraps or panics, and agrees with a model of the stored batches.
#[cfg(test)]
mod properties {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Values at the limits and in between.
    fn edgy(near: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            0..4u64,
            near.saturating_sub(4)..=near,
            (u64::MAX - 4)..=u64::MAX,
            (SEQ_MAX - 3)..=SEQ_MAX,
            any::<u64>(),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A publish with the publisher's seq (or none), `len` payload bytes, and whether a
        /// batch already stored at that seq has the same payload.
        Publish { seq: Option<u64>, len: u64, same: bool },
        /// Retention checked at entry ts `now_ms`, with `max_batches`, `max_bytes`, `max_age_ms`.
        Retain { now_ms: u64, retention: Retention },
        /// Delete the stream and create it again.
        Recreate,
    }

    fn op() -> impl Strategy<Value = Op> {
        let limit = || proptest::option::of(edgy(3).prop_filter("a limit is at least 1", |v| *v >= 1));
        prop_oneof![
            4 => (proptest::option::of(edgy(10)), edgy(8), any::<bool>())
                .prop_map(|(seq, len, same)| Op::Publish { seq, len, same }),
            2 => (edgy(1_000), limit(), limit(), limit()).prop_map(|(now_ms, max_batches, max_bytes, max_age_ms)| {
                Op::Retain { now_ms, retention: Retention { max_batches, max_bytes, max_age_ms } }
            }),
            1 => Just(Op::Recreate),
        ]
    }

    /// The stream as stored: seq → (ts, len), and the metadata the rules keep.
    struct Model {
        meta: StreamMeta,
        batches: BTreeMap<u64, (u64, u64)>,
        ts: u64,
    }

    impl Model {
        fn check(&self) -> Result<(), TestCaseError> {
            let m = &self.meta;
            prop_assert!(m.is_consistent(), "{m:?}");
            prop_assert!(m.last_seq <= SEQ_MAX, "{m:?}");
            prop_assert_eq!(m.batches, self.batches.len() as u64);
            let bytes: u128 = self.batches.values().map(|(_, len)| u128::from(*len)).sum();
            prop_assert_eq!(u128::from(m.bytes), bytes);
            match self.batches.first_key_value() {
                Some((first, _)) => prop_assert_eq!(m.first_seq, *first),
                None => prop_assert_eq!(u128::from(m.first_seq), u128::from(m.last_seq) + 1),
            }
            if let Some((last, _)) = self.batches.last_key_value() {
                prop_assert_eq!(m.last_seq, *last);
            }
            for after in [0, m.evicted_through.saturating_sub(1), m.evicted_through, u64::MAX] {
                if let Some((from, to)) = gap_for(m, after) {
                    prop_assert!(from == after + 1 && from <= to && to == m.evicted_through);
                }
            }
            Ok(())
        }

        fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
            match op {
                Op::Publish { seq, len, same } => {
                    let existing = match seq.and_then(|s| self.batches.get(&s)) {
                        Some(_) if same => Existing::SamePayload,
                        Some(_) => Existing::OtherPayload,
                        None => Existing::Absent,
                    };
                    let before = self.meta;
                    match decide_publish(&self.meta, seq, existing) {
                        PublishDecision::Append(s) => {
                            prop_assert!((1..=SEQ_MAX).contains(&s) && s > before.last_seq);
                            prop_assert!(seq.is_none_or(|r| r == s));
                            match record_append(&mut self.meta, s, len) {
                                Ok(()) => {
                                    self.ts = self.ts.saturating_add(1);
                                    self.batches.insert(s, (self.ts, len));
                                }
                                Err(e) => {
                                    prop_assert_eq!(e, MetaError::BytesOverflow);
                                    prop_assert_eq!(self.meta, before);
                                }
                            }
                        }
                        PublishDecision::Duplicate(s) => {
                            prop_assert!(self.batches.contains_key(&s) && same);
                        }
                        PublishDecision::Reject(PublishRejection::SeqExhausted) => {
                            prop_assert!(seq.is_none() && before.last_seq >= SEQ_MAX);
                        }
                        PublishDecision::Reject(PublishRejection::SeqOutOfRange { seq: s }) => {
                            prop_assert!(s == 0 || s > SEQ_MAX);
                        }
                        PublishDecision::Reject(r) => {
                            prop_assert!(seq.is_some_and(|s| s <= before.last_seq), "{r:?}");
                        }
                    }
                }
                Op::Retain { now_ms, retention } => {
                    self.meta.retention = retention;
                    while let Some((&seq, &(ts_ms, len))) = self.batches.first_key_value() {
                        let oldest = Oldest { seq, ts_ms, len };
                        if !must_evict(&self.meta, &oldest, now_ms) {
                            break;
                        }
                        let next = self.batches.range(seq.saturating_add(1)..).next().map(|(s, _)| *s);
                        prop_assert_eq!(record_eviction(&mut self.meta, &oldest, next), Ok(()));
                        self.batches.remove(&seq);
                        prop_assert!(self.meta.evicted_through >= seq);
                    }
                }
                Op::Recreate => {
                    let old = self.meta;
                    self.meta = reincarnate(&old, Retention::default());
                    self.batches.clear();
                    if old.last_seq < SEQ_MAX {
                        prop_assert_eq!((self.meta.last_seq, self.meta.evicted_through), (old.last_seq, old.last_seq));
                    } else {
                        prop_assert_eq!(self.meta, StreamMeta::new(Retention::default()));
                    }
                    // A deleted name is always usable again.
                    let next = decide_publish(&self.meta, None, Existing::Absent);
                    prop_assert!(matches!(next, PublishDecision::Append(_)), "{next:?}");
                }
            }
            self.check()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn the_rules_keep_the_invariants_at_the_limits(ops in proptest::collection::vec(op(), 1..40)) {
            let mut model = Model { meta: StreamMeta::new(Retention::default()), batches: BTreeMap::new(), ts: 0 };
            model.check()?;
            for op in ops {
                model.step(op)?;
            }
        }

        /// A frames publish decides as its frames would one by one (SPEC §6): the first frame
        /// refused refuses it, otherwise all new, all duplicates, or a partial duplicate; its
        /// seqs never wrap, and a recorded append is the frames' seqs exactly.
        #[test]
        fn frames_decide_as_their_frames_one_by_one(
            stored in proptest::collection::btree_map(prop_oneof![1..12u64, (SEQ_MAX - 4)..=SEQ_MAX], any::<bool>(), 0..6),
            evicted_through in 0..4u64,
            requested in proptest::option::of(prop_oneof![0..14u64, (SEQ_MAX - 5)..=u64::MAX]),
            count in 0..6u64,
        ) {
            // The stream holds `stored` (seq → whether the request's payload at that seq is the
            // same), every seq above evicted_through.
            let stored: BTreeMap<u64, bool> = stored.into_iter().filter(|(s, _)| *s > evicted_through).collect();
            let mut meta = StreamMeta { evicted_through, first_seq: evicted_through + 1, last_seq: evicted_through, ..StreamMeta::new(Retention::default()) };
            for seq in stored.keys() {
                record_append(&mut meta, *seq, 1).unwrap();
            }
            let existing = |seq: u64| match stored.get(&seq) {
                Some(true) => Existing::SamePayload,
                Some(false) => Existing::OtherPayload,
                None => Existing::Absent,
            };
            let mut asked = Vec::new();
            let got = decide_frames::<()>(&meta, requested, count, |k, seq| {
                asked.push((k, seq));
                Ok(existing(seq))
            }).unwrap();
            // The reference: each frame alone against the stream as it is.
            let want = if count == 0 {
                FramesDecision::Reject(FramesRejection::Empty)
            } else {
                let first = match requested {
                    Some(r) => Some(r),
                    None => meta.last_seq.checked_add(1).filter(|n| *n <= SEQ_MAX),
                };
                let mut decisions = Vec::new();
                for k in 0..count {
                    let d = match (requested, first.and_then(|f| f.checked_add(k))) {
                        (Some(_), Some(seq)) => decide_publish(&meta, Some(seq), existing(seq)),
                        (Some(_), None) => PublishDecision::Reject(PublishRejection::SeqOutOfRange { seq: u64::MAX }),
                        (None, Some(seq)) if seq <= SEQ_MAX => PublishDecision::Append(seq),
                        (None, _) => PublishDecision::Reject(PublishRejection::SeqExhausted),
                    };
                    decisions.push(d);
                }
                match decisions.iter().position(|d| matches!(d, PublishDecision::Reject(_))) {
                    Some(k) => {
                        let PublishDecision::Reject(rejection) = decisions[k] else { unreachable!() };
                        FramesDecision::Reject(FramesRejection::Frame { frame: k as u64, rejection })
                    }
                    None => {
                        let dups = decisions.iter().filter(|d| matches!(d, PublishDecision::Duplicate(_))).count() as u64;
                        let first = first.unwrap();
                        let last = first + count - 1;
                        if dups == 0 {
                            FramesDecision::Append { first_seq: first, last_seq: last }
                        } else if dups == count {
                            FramesDecision::Duplicate { first_seq: first, last_seq: last }
                        } else {
                            FramesDecision::Reject(FramesRejection::PartialDuplicate { first_new: dups, first_new_seq: first + dups })
                        }
                    }
                }
            };
            prop_assert_eq!(got, want, "meta {:?}, stored {:?}", meta, stored);
            // Only frames at or below the last seq are looked up, in order.
            prop_assert!(asked.iter().all(|(_, seq)| *seq <= meta.last_seq));
            prop_assert!(asked.windows(2).all(|w| w[1].0 == w[0].0 + 1));
            if let FramesDecision::Append { first_seq, last_seq } = got {
                let mut after = meta;
                prop_assert_eq!(record_frames(&mut after, first_seq, (0..count).map(|_| 1)), Ok(()));
                prop_assert_eq!((after.last_seq, after.batches), (last_seq, meta.batches + count));
            }
        }

        #[test]
        fn what_must_be_evicted_may_be(
            batches in 0u64..5,
            bytes in edgy(3),
            max_batches in proptest::option::of(1u64..5),
            max_bytes in proptest::option::of(edgy(3)),
            max_age_ms in proptest::option::of(edgy(3)),
            oldest_ts in edgy(3),
            now_ms in edgy(3),
        ) {
            let mut m = StreamMeta::new(Retention { max_batches, max_bytes, max_age_ms });
            (m.batches, m.bytes) = (batches, bytes);
            let oldest = Oldest { seq: 1, ts_ms: oldest_ts, len: 0 };
            prop_assert!(!must_evict(&m, &oldest, now_ms) || may_evict(&m), "meta {:?}", m);
            if max_batches.is_none() && max_bytes.is_none() && max_age_ms.is_none() {
                prop_assert!(!may_evict(&m), "a stream without retention never evicts");
            }
        }

        #[test]
        fn age_is_measured_without_wrapping(oldest_ts in edgy(5), now_ms in edgy(5), age in edgy(5)) {
            let mut m = StreamMeta::new(Retention { max_age_ms: Some(age.max(1)), ..Default::default() });
            record_append(&mut m, 1, 0).unwrap();
            let evict = must_evict(&m, &Oldest { seq: 1, ts_ms: oldest_ts, len: 0 }, now_ms);
            prop_assert_eq!(evict, u128::from(now_ms) > u128::from(oldest_ts) + u128::from(age.max(1)));
        }
    }
}
