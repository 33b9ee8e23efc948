//! The JSON bodies of the HTTP API (SPEC §3, §4), as types: the server serialises them, and the
//! client, cluster formation, the benchmark and the tests deserialise them; and the one binary
//! body, the frames of a many-batches publish (SPEC §6, [`encode_frames`], [`decode_frames`]).
//! One schema, written once.
//!
//! Owns: the field names, their order and their types. Must never: hold logic beyond
//! (de)serialising, or change a byte of what clients have always received. Field order is the
//! order of the JSON on the wire: declaration order, or alphabetical for the publish answer,
//! which the API has always written with sorted keys.
//!
//! Units: seqs are stream positions (SPEC §2); `index` fields are Raft log indexes; `ts` is ms
//! since the Unix epoch, assigned by the leader.

use std::borrow::Cow;
use std::fmt;

use base64::Engine;
use serde::{Deserialize, Serialize};

pub use crate::stream::Retention;
use crate::stream::StreamMeta;

/// The answer to a publish (SPEC §3): `201` for a new batch, `200` for a duplicate. Keys are in
/// alphabetical order, as the API has always written them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PublishAck {
    /// True when the batch was already stored (a retry); nothing was written.
    pub duplicate: bool,
    /// Raft log index of the entry that stored the batch (for a duplicate: of the original);
    /// pass it as `min_index` to read your write on any node.
    pub index: u64,
    /// The batch's seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
}

/// The answer to a frames publish (SPEC §6): `201` when every frame is new, `200` when every
/// frame is a duplicate. Keys in SPEC §6's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FramesAck {
    /// The first frame's seq.
    pub first_seq: u64,
    /// The last frame's seq (`first_seq + count - 1`: frames take consecutive seqs).
    pub last_seq: u64,
    /// How many frames (batches) the request carried.
    pub count: u64,
    /// Leader-assigned time, ms since the Unix epoch: every frame of a new request shares it; for
    /// a duplicate, the `ts` of the last frame's original (the latest of them).
    pub ts: u64,
    /// Raft log index of the one entry that stored every frame; for a duplicate, of the entry
    /// that stored the last frame's original (the highest of them, so `min_index` covers all).
    pub index: u64,
    /// True when every frame was already stored (a retry); nothing was written.
    pub duplicate: bool,
}

/// Why a frames body (SPEC §6) cannot be read. `frame` is the 0-based index of the frame at
/// fault. [`FrameError::TooMany`] and [`FrameError::TooLarge`] are `413 payload_too_large` (split
/// the request); the rest are `400 invalid_body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The body is empty: a frames publish carries at least one frame.
    #[error("the body holds no frame; a frames publish carries 1 to {max} frames", max = crate::limits::FRAMES_PER_APPEND_MAX)]
    Empty,
    /// Fewer than 4 bytes were left where frame `frame`'s length header starts (trailing bytes).
    #[error("frame {frame}: only {left} byte(s) left at offset {offset}, where a 4-byte big-endian length was expected (trailing bytes after the last frame?)")]
    Truncated {
        /// Index of the frame.
        frame: u64,
        /// Body offset of its header, in bytes.
        offset: u64,
        /// Bytes left in the body.
        left: u64,
    },
    /// Frame `frame`'s length runs past the end of the body.
    #[error("frame {frame}: its length {len} at offset {offset} runs past the end of the body ({left} byte(s) left after the header)")]
    PastEnd {
        /// Index of the frame.
        frame: u64,
        /// Body offset of its header, in bytes.
        offset: u64,
        /// The length it declares, in bytes.
        len: u64,
        /// Bytes left after its header.
        left: u64,
    },
    /// More frames than allowed; `frame` is the first one past the limit (= the limit).
    #[error("frame {frame}: more than {max} frames in one request; split it", max = crate::limits::FRAMES_PER_APPEND_MAX)]
    TooMany {
        /// Index of the first frame past the limit.
        frame: u64,
    },
    /// Frame `frame`'s payload is larger than the largest batch this node accepts.
    #[error(
        "frame {frame}: its payload of {len} bytes is larger than {max} bytes, the largest batch this node accepts"
    )]
    TooLarge {
        /// Index of the frame.
        frame: u64,
        /// Its length, in bytes.
        len: u64,
        /// The largest batch payload (`--max-batch-bytes`), in bytes.
        max: u64,
    },
}

impl FrameError {
    /// The 0-based index of the frame at fault (`None` for an empty body).
    pub fn frame(&self) -> Option<u64> {
        match self {
            FrameError::Empty => None,
            FrameError::Truncated { frame, .. }
            | FrameError::PastEnd { frame, .. }
            | FrameError::TooMany { frame }
            | FrameError::TooLarge { frame, .. } => Some(*frame),
        }
    }
}

/// The frames body (SPEC §6) of `payloads`: each a 4-byte big-endian length, then its bytes.
///
/// Errors: a payload of 2³² bytes or more, which no frame can carry (`Err` holds its index).
pub fn encode_frames<P: AsRef<[u8]>>(payloads: &[P]) -> Result<Vec<u8>, usize> {
    use crate::limits::FRAME_HEADER_BYTES;
    let total =
        payloads.iter().map(|p| p.as_ref().len().saturating_add(FRAME_HEADER_BYTES)).fold(0, usize::saturating_add);
    let mut out = Vec::with_capacity(total);
    for (i, p) in payloads.iter().enumerate() {
        let p = p.as_ref();
        let len = u32::try_from(p.len()).map_err(|_| i)?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(p);
    }
    Ok(out)
}

/// Splits a frames body (SPEC §6) into its payloads' byte ranges in `body`, in order, checking
/// each against `max_frames` and `max_frame_bytes` before going on, so that a bad body is
/// refused after reading at most `max_frames + 1` headers, without copying anything.
///
/// Errors: [`FrameError`], naming the first frame at fault.
pub fn decode_frames(
    body: &[u8],
    max_frames: usize,
    max_frame_bytes: usize,
) -> Result<Vec<std::ops::Range<usize>>, FrameError> {
    use crate::limits::FRAME_HEADER_BYTES;
    if body.is_empty() {
        return Err(FrameError::Empty);
    }
    let mut frames = Vec::new();
    let mut at = 0usize;
    while at < body.len() {
        let frame = frames.len() as u64;
        if frames.len() >= max_frames {
            return Err(FrameError::TooMany { frame });
        }
        let left = body.len() - at;
        let Some(header) = body.get(at..at + FRAME_HEADER_BYTES) else {
            return Err(FrameError::Truncated { frame, offset: at as u64, left: left as u64 });
        };
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let start = at + FRAME_HEADER_BYTES;
        let left = (body.len() - start) as u64;
        if u64::from(len) > left {
            return Err(FrameError::PastEnd { frame, offset: at as u64, len: u64::from(len), left });
        }
        if u64::from(len) > max_frame_bytes as u64 {
            return Err(FrameError::TooLarge { frame, len: u64::from(len), max: max_frame_bytes as u64 });
        }
        let end = start + len as usize;
        frames.push(start..end);
        at = end;
    }
    debug_assert_eq!(at, body.len());
    Ok(frames)
}

/// A range of seqs that retention evicted before the consumer read them (SPEC §2.5),
/// inclusive: the `gap` of a read answer and the data of an SSE `gap` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Gap {
    /// First evicted seq asked for.
    pub from: u64,
    /// Last evicted seq (the stream's `evicted_through`).
    pub to: u64,
}

/// The data of an SSE `unavailable` event (SPEC §4): the node that sent it has not heard from a
/// leader for too long and ends the subscription; resume on another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Unavailable {
    /// Why, and what to do.
    pub message: String,
}

/// One batch as the wire carries it: in a read answer and as the data of an SSE `batch` event.
/// `data` is standard base64; deserialising borrows it from the answer (base64 never holds a
/// JSON escape), so a catch-up read copies each payload once, when decoding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchBody<'a> {
    /// The batch's seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// The payload, standard base64 (RFC 4648 §4, with padding).
    #[serde(borrow)]
    #[schema(value_type = String, content_encoding = "base64")]
    pub data: Cow<'a, str>,
}

impl BatchBody<'_> {
    /// The body of a batch with payload `data` (base64-encoded here).
    pub fn encode(seq: u64, ts: u64, data: &[u8]) -> BatchBody<'static> {
        BatchBody { seq, ts, data: Cow::Owned(base64::engine::general_purpose::STANDARD.encode(data)) }
    }

    /// The payload, decoded from base64.
    ///
    /// Errors: `data` is not standard base64.
    pub fn payload(&self) -> Result<Vec<u8>, base64::DecodeError> {
        base64::engine::general_purpose::STANDARD.decode(self.data.as_bytes())
    }
}

/// The answer to `GET /v1/streams/{name}/batches` (SPEC §3). The server writes it by hand for
/// speed (`api::streams`), and a test there checks its bytes against this type's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReadAnswer<'a> {
    /// Batches after the cursor, in seq order.
    #[serde(borrow)]
    pub batches: Vec<BatchBody<'a>>,
    /// The gap before them, if retention evicted seqs the consumer asked for.
    pub gap: Option<Gap>,
    /// The stream's last seq on the node that answered.
    pub last_seq: u64,
    /// Pass back as `after` to continue without loss.
    pub next_after: u64,
}
/// Media type of a read answered as binary records instead of JSON: asked for with `Accept`
/// on `GET /v1/streams/{name}/batches`, the same answer as [`ReadAnswer`] without base64 or
/// JSON (Runnev's addition to SPEC §3, content negotiation of RFC 9110 §12.5.1; the body is
/// described at [`encode_batches_head`]). Errors are JSON whatever `Accept` says.
pub const BATCHES_CONTENT_TYPE: &str = "application/vnd.runnev.batches";

/// Whether `value` (a `Content-Type`, or one media range of an `Accept`) names the media type
/// `media`, case and parameters aside (RFC 9110 §8.3.1): `application/Foo; q=1` names
/// `application/foo`.
pub fn media_type_is(value: &str, media: &str) -> bool {
    value.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case(media))
}

/// Bytes of the head of a binary read answer ([`BATCHES_CONTENT_TYPE`]): `last_seq`,
/// `next_after`, `gap_from`, `gap_to` (each u64), then `count` (u32), all big-endian.
pub const BATCHES_HEAD_BYTES: usize = 36;

/// Bytes of each record's header in a binary read answer: `seq`, `ts` (u64 each), then the
/// payload's length in bytes (u32), all big-endian.
pub const BATCH_RECORD_HEAD_BYTES: usize = 20;

/// The head of a binary read answer: what [`ReadAnswer`] carries besides its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchesHead {
    /// The stream's last seq on the node that answered.
    pub last_seq: u64,
    /// Pass back as `after` to continue without loss.
    pub next_after: u64,
    /// The gap before the batches, if retention evicted seqs the consumer asked for.
    pub gap: Option<Gap>,
    /// How many batch records follow the head.
    pub count: u32,
}

/// Writes `head` over the first [`BATCHES_HEAD_BYTES`] of `out`, the head of a binary read
/// answer. The body of such an answer ([`BATCHES_CONTENT_TYPE`]) is this head, then `count`
/// records, each [`BATCH_RECORD_HEAD_BYTES`] of header (see [`push_batch_record`]) and the
/// payload, byte for byte, in seq order. No gap is written as `gap_from` = `gap_to` = 0 (a
/// gap starts at seq 1 or later). Big-endian, like the frames of SPEC §6.
///
/// Panics (debug) if `out` is shorter than the head.
pub fn encode_batches_head(out: &mut [u8], head: &BatchesHead) {
    debug_assert!(out.len() >= BATCHES_HEAD_BYTES, "room for the head is reserved first");
    let (from, to) = head.gap.map_or((0, 0), |g| (g.from, g.to));
    debug_assert!(head.gap.is_none() || from >= 1, "a gap starts at seq 1 or later");
    let mut at = 0;
    for v in [head.last_seq, head.next_after, from, to] {
        out[at..at + 8].copy_from_slice(&v.to_be_bytes());
        at += 8;
    }
    out[at..at + 4].copy_from_slice(&head.count.to_be_bytes());
}

/// Appends one batch record of a binary read answer to `out`: `seq`, `ts` (ms since the Unix
/// epoch), the payload's length (u32, bytes), the payload.
///
/// Errors: a payload of 2³² bytes or more (no record can carry it; a batch is at most
/// [`crate::limits::BATCH_BYTES_MAX`], so the server never meets it). Nothing is written then.
pub fn push_batch_record(out: &mut Vec<u8>, seq: u64, ts: u64, data: &[u8]) -> Result<(), usize> {
    let len = u32::try_from(data.len()).map_err(|_| data.len())?;
    out.reserve(BATCH_RECORD_HEAD_BYTES + data.len());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&ts.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(data);
    Ok(())
}

/// One batch of a binary read answer, its payload a slice of the answer's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecord {
    /// The batch's seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// The payload, byte for byte.
    pub data: bytes::Bytes,
}

/// Why a binary read answer cannot be read: the node sent something else than
/// [`encode_batches_head`] describes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchesError {
    /// The body ends inside the head or inside record `record`'s header or payload.
    #[error("the answer ends at byte {len} inside {what}")]
    Truncated {
        /// What was being read (the head, or record k's header or payload).
        what: String,
        /// The body's length, in bytes.
        len: usize,
    },
    /// Bytes follow the last of the `count` records the head announced.
    #[error("{extra} byte(s) follow the {count} record(s) the head announced")]
    Trailing {
        /// Records announced.
        count: u32,
        /// Bytes past the last record.
        extra: usize,
    },
    /// A record's seq is not above the one before it (or not above the cursor).
    #[error("record {record} has seq {seq}, not above {floor}")]
    OutOfOrder {
        /// Index of the record.
        record: u32,
        /// Its seq.
        seq: u64,
        /// The seq it must be above.
        floor: u64,
    },
}

/// Reads a binary read answer ([`BATCHES_CONTENT_TYPE`]) of a read after cursor `after`:
/// its head, and each batch with its payload a slice of `body` (no copy), in seq order.
///
/// Errors: [`BatchesError`]: a body cut short, bytes past the last record, or seqs not strictly
/// increasing above `after`.
pub fn decode_batches(after: u64, body: &bytes::Bytes) -> Result<(BatchesHead, Vec<BatchRecord>), BatchesError> {
    let len = body.len();
    let u64_at = |at: usize| -> Option<u64> {
        body.get(at..at + 8).map(|b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    let u32_at =
        |at: usize| -> Option<u32> { body.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])) };
    let truncated = |what: String| BatchesError::Truncated { what, len };
    let (Some(last_seq), Some(next_after), Some(from), Some(to), Some(count)) =
        (u64_at(0), u64_at(8), u64_at(16), u64_at(24), u32_at(32))
    else {
        return Err(truncated("the head".into()));
    };
    let gap = (from != 0 || to != 0).then_some(Gap { from, to });
    // Each record takes at least its header: a count the body cannot hold is refused before
    // anything is allocated for it.
    let room = (len - BATCHES_HEAD_BYTES) / BATCH_RECORD_HEAD_BYTES;
    let mut batches = Vec::with_capacity((count as usize).min(room));
    let (mut at, mut floor) = (BATCHES_HEAD_BYTES, after);
    for record in 0..count {
        let (Some(seq), Some(ts), Some(size)) = (u64_at(at), u64_at(at + 8), u32_at(at + 16)) else {
            return Err(truncated(format!("record {record}'s header")));
        };
        if seq <= floor {
            return Err(BatchesError::OutOfOrder { record, seq, floor });
        }
        let start = at + BATCH_RECORD_HEAD_BYTES;
        let Some(end) = start.checked_add(size as usize).filter(|&end| end <= len) else {
            return Err(truncated(format!("record {record}'s payload of {size} bytes")));
        };
        batches.push(BatchRecord { seq, ts, data: body.slice(start..end) });
        (at, floor) = (end, seq);
    }
    if at != len {
        return Err(BatchesError::Trailing { count, extra: len - at });
    }
    Ok((BatchesHead { last_seq, next_after, gap, count }, batches))
}

/// Stream info (SPEC §3): the answer to `PUT` and `GET /v1/streams/{name}`, and each item of
/// [`StreamList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamInfo {
    /// Name.
    pub name: String,
    /// Oldest retained seq (`last_seq + 1` when empty).
    pub first_seq: u64,
    /// Highest accepted seq.
    pub last_seq: u64,
    /// Highest evicted seq.
    pub evicted_through: u64,
    /// Retained batches.
    pub batches: u64,
    /// Retained payload, in bytes.
    pub bytes: u64,
    /// Retention limits.
    pub retention: Retention,
}

impl StreamInfo {
    /// The info of stream `name` with metadata `meta`.
    pub fn new(name: &str, meta: &StreamMeta) -> StreamInfo {
        StreamInfo {
            name: name.to_string(),
            first_seq: meta.first_seq,
            last_seq: meta.last_seq,
            evicted_through: meta.evicted_through,
            batches: meta.batches,
            bytes: meta.bytes,
            retention: meta.retention,
        }
    }
}

/// The answer to `GET /v1/streams`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamList {
    /// Every stream, in name order.
    pub streams: Vec<StreamInfo>,
}

/// The body of `PUT /v1/streams/{name}` (an empty body creates with no limits or leaves an
/// existing stream unchanged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutStream {
    /// The new retention (every limit omitted: none).
    #[serde(default)]
    pub retention: Retention,
}

/// The body of `POST /v1/cluster/members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    /// The new node's id, a positive integer (0 is refused).
    #[schema(minimum = 1)]
    pub id: u64,
    /// Its address, `HOST:PORT`, as the other nodes reach it.
    #[schema(pattern = ":")]
    pub addr: String,
    /// Promote it to voter once caught up (default); `false` keeps it a learner.
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub voter: bool,
}

fn yes() -> bool {
    true
}

/// What a node is, as a fresh peer forming the cluster sees it: the answer to
/// `GET /raft/formation` (SPEC §5), a nodes-only path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum FormationAnswer {
    /// Its data dir is empty: it may be counted in the majority that forms the cluster.
    Fresh,
    /// It holds Raft state but no membership yet (a wiped node holding its vote, or a node
    /// waiting to be added): not counted, not a cluster to join either.
    Joining,
    /// It belongs to a formed cluster, at this term.
    Member {
        /// The node's current term (its durable vote's).
        term: u64,
        /// The node its durable vote in `term` is for (a candidate's is for itself): openraft
        /// orders votes by term, then node id, so a node whose disk may have been wiped needs
        /// both to tell whether a leader of `term` can have been deposed within it
        /// (`raft::vote_gate`). Absent from the answers of earlier builds (`null`: unknown).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        voted_for: Option<u64>,
        /// Whether this node initialised that cluster from its current data dir (absent from
        /// the answers of earlier builds: `false`). A pristine node that answered this node's
        /// probe as fresh learns from it that the cluster is new.
        #[serde(default)]
        formed: bool,
        /// The node's effective membership: its voter sets, one for a uniform configuration,
        /// two while a change is joint (Raft paper §6), each a list of node ids in ascending
        /// order. A node whose disk may have been wiped reads it to tell whether a leader can
        /// have been deposed without its knowledge (`raft::vote_gate`). Absent from the answers
        /// of earlier builds (`null`: unknown).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        voters: Option<Vec<std::collections::BTreeSet<u64>>>,
        /// Whether the node has applied (so committed) the log entry of that membership: a
        /// committed joint membership binds every later leader to its new voter set (Raft paper
        /// §6). Absent from earlier builds: `false`, which asks for both sets.
        #[serde(default)]
        committed: bool,
        /// The log index of that membership's entry (absent: the node has none, or an earlier
        /// build). A node removed without being told compares it with its own membership's
        /// (`raft::removal`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        membership_index: Option<u64>,
        /// The address (`HOST:PORT`) of each node of that membership, voters and learners: a
        /// node whose `--peers` is older than the membership probes these too, to learn the
        /// terms its vote gate needs (`raft::vote_gate`). Absent from earlier builds: empty.
        /// (A list, not a map keyed by id: serde cannot read integer map keys inside an
        /// internally tagged enum.)
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<NodeAddr>,
    },
}

/// One node of a membership and where it listens, in a [`FormationAnswer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// The node's id.
    pub id: u64,
    /// Its `HOST:PORT`.
    pub addr: String,
}

/// One member in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Member {
    /// Its node id.
    pub id: u64,
    /// Its address, `HOST:PORT`.
    pub addr: String,
    /// True for a voter, false for a learner (Raft paper §6).
    pub voter: bool,
    /// On the leader: the last log index known replicated to it; `null` elsewhere.
    pub matched_index: Option<u64>,
    /// Its wall clock minus the answering node's, in ms, as the answering node last measured it
    /// (0 for the answering node itself); `null` when unknown (no measurement in the last 5 s).
    #[serde(default)]
    pub clock_offset_ms: Option<i64>,
    /// On the leader: whether its disk is low, as its latest append answers said (it then takes
    /// no new entries); `null` elsewhere.
    #[serde(default)]
    pub disk_low: Option<bool>,
    /// On the leader: how many log entries the member is behind it, its `last_log_index` minus
    /// `matched_index` (a member it has matched nothing on yet counts from 0; 0 for the leader
    /// itself); `null` elsewhere.
    #[serde(default)]
    pub lag_entries: Option<u64>,
}

/// A node's wall clock against the cluster's, in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClockView {
    /// Its wall clock minus the median of its own and the voters' clocks it knows, in ms.
    pub offset_ms: i64,
    /// The bound (`--max-clock-offset-ms`), in ms.
    pub max_offset_ms: u64,
    /// `in_bounds`; `out_of_bounds` (the node does not lead); or `unverified` (it knows the
    /// clocks of fewer than a majority of the voters, itself included).
    pub state: String,
    /// How many voters' clocks it knows, itself included when it is a voter.
    pub known_voters: u64,
}

/// A node's view of the cluster: `GET /v1/cluster` and the answer to a membership change
/// (SPEC §3). `snapshot_index` and `purged_index` go beyond SPEC §3: the log index covered by
/// the node's latest snapshot and the last one purged from its log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// The answering node's id.
    pub node_id: u64,
    /// The leader it knows, if any.
    pub leader_id: Option<u64>,
    /// Its Raft role: `Leader`, `Follower`, `Candidate`, `Learner` or `Shutdown`.
    pub state: String,
    /// Its current term (Raft paper §5.1).
    pub term: u64,
    /// The highest log index it knows is committed.
    pub commit_index: u64,
    /// The highest log index its state machine has applied.
    pub applied_index: u64,
    /// The last log index it holds, if any.
    pub last_log_index: Option<u64>,
    /// The log index its latest snapshot covers, if any.
    pub snapshot_index: Option<u64>,
    /// The last log index purged from its log, if any.
    pub purged_index: Option<u64>,
    /// Why this node's Raft core has stopped for good; `None` while it runs. A node in this
    /// state answers every client request with `503` and its `/healthz` with `503`.
    #[serde(default)]
    pub raft_stopped: Option<String>,
    /// The members of the configuration it knows (empty before the cluster formed).
    pub members: Vec<Member>,
    /// The voter sets of that configuration, each a list of node ids in ascending order: one
    /// set, or two while a joint configuration is in effect (Raft paper §6: the old voters, then
    /// the new), when a leader needs a majority of each and a node in only one of them is not
    /// yet (or no longer) a full voter. `members[].voter` is true for a node in either set.
    /// Empty before the cluster formed, and from nodes of older builds.
    #[serde(default)]
    pub voter_sets: Vec<Vec<u64>>,
    /// Its wall clock against the cluster's (absent from nodes of older builds).
    #[serde(default)]
    pub clock: Option<ClockView>,
    /// Its data directory's free space against what it keeps free (absent from nodes of older
    /// builds).
    #[serde(default)]
    pub disk: Option<DiskView>,
}

/// A node's data directory's free space, in a [`ClusterView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DiskView {
    /// Bytes free on the file system, as last measured.
    pub free_bytes: u64,
    /// What the node keeps free (`--min-free-disk-bytes`, at most a quarter of the file
    /// system; 0: not guarded).
    pub min_free_bytes: u64,
    /// Whether the node takes no new writes for lack of space: a leader answers `507
    /// storage_full`, a follower takes no new entries, until space is freed.
    pub low: bool,
}

/// The answer to `GET /v1/cluster/nodes`: every member's own view of the cluster, as the
/// answering node asked each of them just now (the status page's source, [`crate::api`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodesView {
    /// The answering node's id.
    pub node_id: u64,
    /// Every member of the configuration the answering node knows, in id order (itself alone,
    /// unreachable from nowhere, before the cluster formed).
    pub nodes: Vec<NodeReport>,
}

/// One member in a [`NodesView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeReport {
    /// Its node id.
    pub id: u64,
    /// Its address, `HOST:PORT`, as the membership records it.
    pub addr: String,
    /// Whether it answered its `GET /v1/cluster` within the deadline
    /// ([`crate::limits::STATUS_PEER_MS`]) with a cluster view.
    pub reachable: bool,
    /// Why it is not reachable (connection refused, no answer in time, an error status);
    /// `null` when it is.
    pub error: Option<String>,
    /// Its own view, as it answered; `null` when unreachable.
    pub view: Option<ClusterView>,
}

impl ClusterView {
    /// Ids of the voters, ascending.
    pub fn voters(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        v.sort_unstable();
        v
    }
}

impl fmt::Display for ClusterView {
    /// The view as the JSON the node sent.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
}

/// The body of every error answer (SPEC §3, "Errors").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The `error` of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// The SPEC §3 code, e.g. `seq_conflict`.
    pub code: String,
    /// What was wrong and how to fix it.
    pub message: String,
    /// For a frames publish (SPEC §6): the 0-based index of the frame the error is about; absent
    /// from every other error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary read answer of `batches` after `after`, as the server writes it.
    fn batches_body(head: BatchesHead, batches: &[(u64, u64, &[u8])]) -> bytes::Bytes {
        let mut out = vec![0u8; BATCHES_HEAD_BYTES];
        for (seq, ts, data) in batches {
            push_batch_record(&mut out, *seq, *ts, data).unwrap();
        }
        encode_batches_head(&mut out, &head);
        out.into()
    }

    #[test]
    fn a_media_type_is_named_whatever_its_case_and_parameters() {
        assert!(media_type_is("application/vnd.runnev.batches", BATCHES_CONTENT_TYPE));
        assert!(media_type_is(" Application/VND.runnev.Batches ; q=0.5", BATCHES_CONTENT_TYPE));
        assert!(!media_type_is("application/vnd.runnev.batches2", BATCHES_CONTENT_TYPE));
        assert!(!media_type_is("application/json; x=application/vnd.runnev.batches", BATCHES_CONTENT_TYPE));
    }

    #[test]
    fn a_binary_read_answer_reads_back_as_written() {
        let head = BatchesHead { last_seq: 9, next_after: 7, gap: Some(Gap { from: 3, to: 4 }), count: 3 };
        let body = batches_body(head, &[(5, 100, b"five"), (6, 101, b""), (7, 102, &[0u8, 255, 10])]);
        assert_eq!(body.len(), BATCHES_HEAD_BYTES + 3 * BATCH_RECORD_HEAD_BYTES + 4 + 3);
        let (got, batches) = decode_batches(2, &body).unwrap();
        assert_eq!(got, head);
        let got: Vec<(u64, u64, &[u8])> = batches.iter().map(|b| (b.seq, b.ts, &b.data[..])).collect();
        assert_eq!(got, [(5, 100, &b"five"[..]), (6, 101, &b""[..]), (7, 102, &[0u8, 255, 10][..])]);
        // No gap is all zeros, and reads back as none.
        let head = BatchesHead { last_seq: 0, next_after: 0, gap: None, count: 0 };
        let body = batches_body(head, &[]);
        assert_eq!(&body[..], &[0u8; BATCHES_HEAD_BYTES][..]);
        assert_eq!(decode_batches(0, &body).unwrap(), (head, vec![]));
    }

    #[test]
    fn a_binary_read_answer_that_is_not_what_its_head_says_is_refused() {
        let head = BatchesHead { last_seq: 2, next_after: 2, gap: None, count: 2 };
        let body = batches_body(head, &[(1, 10, b"ab"), (2, 11, b"cd")]);
        // Cut anywhere: refused, never a shorter answer.
        for cut in 0..body.len() {
            let e = decode_batches(0, &body.slice(..cut)).unwrap_err();
            assert!(matches!(e, BatchesError::Truncated { len, .. } if len == cut), "cut at {cut}: {e}");
        }
        let mut longer = body.to_vec();
        longer.push(0);
        assert_eq!(decode_batches(0, &longer.into()).unwrap_err(), BatchesError::Trailing { count: 2, extra: 1 });
        // Seqs must rise above the cursor and each other.
        assert_eq!(decode_batches(1, &body).unwrap_err(), BatchesError::OutOfOrder { record: 0, seq: 1, floor: 1 });
        let body = batches_body(head, &[(2, 10, b"ab"), (2, 11, b"cd")]);
        assert_eq!(decode_batches(0, &body).unwrap_err(), BatchesError::OutOfOrder { record: 1, seq: 2, floor: 2 });
        // A count the body cannot hold allocates nothing for it and is refused.
        let head = BatchesHead { last_seq: 2, next_after: 2, gap: None, count: u32::MAX };
        let body = batches_body(head, &[(1, 10, b"ab")]);
        assert!(matches!(decode_batches(0, &body).unwrap_err(), BatchesError::Truncated { .. }));
    }

    #[test]
    fn the_publish_answer_keeps_its_sorted_keys() {
        let a = PublishAck { duplicate: false, index: 3, seq: 1, ts: 1_795_982_672_385 };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text, r#"{"duplicate":false,"index":3,"seq":1,"ts":1795982672385}"#);
        assert_eq!(serde_json::from_str::<PublishAck>(&text).unwrap(), a);
    }

    #[test]
    fn bodies_have_their_field_order() {
        let info = StreamInfo::new("s", &StreamMeta::new(Retention { max_batches: Some(2), ..Default::default() }));
        assert_eq!(
            serde_json::to_string(&info).unwrap(),
            r#"{"name":"s","first_seq":1,"last_seq":0,"evicted_through":0,"batches":0,"bytes":0,"retention":{"max_batches":2,"max_bytes":null,"max_age_ms":null}}"#
        );
        let e = ErrorBody { error: ErrorDetail { code: "not_found".into(), message: "m".into(), frame: None } };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"error":{"code":"not_found","message":"m"}}"#);
        let e = ErrorBody { error: ErrorDetail { code: "seq_conflict".into(), message: "m".into(), frame: Some(3) } };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"error":{"code":"seq_conflict","message":"m","frame":3}}"#);
        let ack = FramesAck { first_seq: 5, last_seq: 7, count: 3, ts: 9, index: 11, duplicate: false };
        assert_eq!(
            serde_json::to_string(&ack).unwrap(),
            r#"{"first_seq":5,"last_seq":7,"count":3,"ts":9,"index":11,"duplicate":false}"#
        );
    }

    #[test]
    fn batch_bodies_borrow_and_decode() {
        let text = serde_json::to_string(&BatchBody::encode(4, 5, &[0, 255, 10])).unwrap();
        assert_eq!(text, r#"{"seq":4,"ts":5,"data":"AP8K"}"#);
        let b: BatchBody<'_> = serde_json::from_str(&text).unwrap();
        assert!(matches!(b.data, Cow::Borrowed(_)));
        assert_eq!(b.payload().unwrap(), vec![0, 255, 10]);
    }

    #[test]
    fn frames_round_trip() {
        let payloads: Vec<Vec<u8>> = vec![b"a".to_vec(), Vec::new(), vec![0; 300], b"\n\r\0".to_vec()];
        let body = encode_frames(&payloads).unwrap();
        assert_eq!(&body[..5], &[0, 0, 0, 1, b'a']);
        assert_eq!(&body[5..9], &[0, 0, 0, 0]);
        assert_eq!(&body[9..13], &[0, 0, 1, 44]);
        let ranges = decode_frames(&body, 10, 300).unwrap();
        let back: Vec<&[u8]> = ranges.iter().map(|r| &body[r.clone()]).collect();
        assert_eq!(back, payloads.iter().map(Vec::as_slice).collect::<Vec<_>>());
        // Exactly at both limits is accepted.
        assert_eq!(decode_frames(&body, 4, 300).unwrap().len(), 4);
    }

    #[test]
    fn malformed_frames_name_the_frame_at_fault() {
        let body = encode_frames(&[b"ab".as_slice(), b"cde"]).unwrap();
        assert_eq!(decode_frames(&[], 10, 10), Err(FrameError::Empty));
        assert_eq!(decode_frames(&[], 10, 10).unwrap_err().frame(), None);
        // Trailing bytes: 1, 2 or 3 bytes where the next header should be.
        for extra in 1..4 {
            let mut b = body.clone();
            b.extend(std::iter::repeat_n(0u8, extra));
            assert_eq!(
                decode_frames(&b, 10, 10),
                Err(FrameError::Truncated { frame: 2, offset: body.len() as u64, left: extra as u64 })
            );
        }
        // A length past the end: the last frame cut short, and a header alone.
        let cut = &body[..body.len() - 1];
        assert_eq!(decode_frames(cut, 10, 10), Err(FrameError::PastEnd { frame: 1, offset: 6, len: 3, left: 2 }));
        assert_eq!(
            decode_frames(&[0, 0, 0, 9], 10, 10),
            Err(FrameError::PastEnd { frame: 0, offset: 0, len: 9, left: 0 })
        );
        // A huge declared length in a short body is malformed, not merely too large.
        let huge = [0xff, 0xff, 0xff, 0xff, 1];
        assert_eq!(
            decode_frames(&huge, 10, 10),
            Err(FrameError::PastEnd { frame: 0, offset: 0, len: u64::from(u32::MAX), left: 1 })
        );
        // Too many frames, and one too large, each named by index.
        assert_eq!(decode_frames(&body, 1, 10), Err(FrameError::TooMany { frame: 1 }));
        assert_eq!(decode_frames(&body, 10, 2), Err(FrameError::TooLarge { frame: 1, len: 3, max: 2 }));
        for e in [FrameError::TooMany { frame: 1 }, FrameError::TooLarge { frame: 1, len: 3, max: 2 }] {
            assert!(e.to_string().starts_with("frame 1:"), "{e}");
        }
        // Zero-length frames are batches of 0 bytes (SPEC §1), not an end marker.
        assert_eq!(decode_frames(&[0, 0, 0, 0, 0, 0, 0, 0], 10, 10).unwrap(), vec![4..4, 8..8]);
    }

    #[test]
    fn a_member_body_defaults_to_voter_and_refuses_unknown_fields() {
        let m: AddMember = serde_json::from_str(r#"{"id":4,"addr":"h:1"}"#).unwrap();
        assert!(m.voter);
        assert!(serde_json::from_str::<AddMember>(r#"{"id":4,"addr":"h:1","x":1}"#).is_err());
    }
}
