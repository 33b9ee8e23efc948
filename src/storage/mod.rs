//! Storage: per Raft group on a node, the Raft log in segment files, one redb database holding
//! the vote and the state machine, the payload segments, and the snapshot file beside them.
//!
//! Owns: the on-disk layout, its encodings, and the read side of the state machine that the API
//! serves. Must never: acknowledge a write before it is fsynced, or serve a batch that is not
//! applied (everything in the state-machine tables is committed by Raft).
//!
//! Layout (`--data-dir`, [`layout`]): `FORMAT` ([`format`](mod@format)), and per Raft group, under
//! `groups/<group id>/`:
//! - `log/<index>.seg`: the Raft log (see [`segments`]);
//! - `payloads/<stream id>-<first seq>.seg`: batch payloads, each written once when applied,
//!   per stream in append-only segment files (see [`payloads`]);
//! - `runnev.redb`: tables `RAFT_META`, `SM_META`, `STREAMS`, `TOMBSTONES`,
//!   `STREAM_IDS`, `BATCH_INDEX` (seq → where the payload is, never the payload), `TOKENS`;
//!   created as `runnev.redb.new` and renamed once complete (see [`db_dir`]);
//! - `snapshot.bin`: the newest snapshot, a manifest naming the payload segments it holds
//!   (see [`snapshot`]), replaced atomically by rename.
//!
//! The state machine commits without fsync (the log is the durable record and replays it) and
//! durably every [`crate::limits::SM_DURABLE_EVERY_ENTRIES`] entries or
//! [`crate::limits::SM_DURABLE_EVERY_BYTES`] bytes, which bounds the replay after a crash.
//! Every durable commit goes through `Store::commit_durably`, which fsyncs the payload
//! segments first: a durable commit also persists the non-durable ones before it, so no durable
//! state may ever point at payload bytes that are not on disk.

pub mod backup;
pub mod db_dir;
pub mod format;
pub mod io;
pub mod layout;
pub mod log_store;
pub mod payloads;
pub mod segments;
pub mod snapshot;
pub mod state_machine;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};
use tokio::sync::watch;

use crate::raft::{StreamInfo, TypeConfig};
use crate::stream::StreamMeta;

/// Where the Raft log lived before it moved to [`segments`]; a database that still has it is
/// refused rather than silently started without its log.
const LEGACY_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: `"vote"` → `Vote`, `"last_purged"` → `LogId`, postcard-encoded.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// Creates `dir` and its missing parents, each readable by its owner only (mode 0700): a data
/// directory holds every payload and the tokens' salted hashes. An existing directory keeps its
/// mode (an operator may have chosen it).
///
/// Errors: the file system's.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}
/// Key in [`RAFT_META`] present while a node that lost its disk has not been caught up by a
/// leader (`raft::formation::guard_wiped_node`): it grants no vote meanwhile.
const CATCHING_UP: &str = "catching_up";
/// Prefix of the keys in [`RAFT_META`] naming each peer whose formation probe this pristine node
/// answered as fresh (`counted_fresh_by/ID`, `raft::formation`): that peer may have counted it in
/// the majority it formed the cluster with, so the cluster *that peer* says it formed is new to
/// this node. A record proves nothing about any other cluster. A wiped disk loses them with
/// everything else. (Data dirs of an earlier build may hold a key `counted_fresh` naming no peer:
/// it is ignored.)
const COUNTED_FRESH_BY: &str = "counted_fresh_by/";
/// Key in [`RAFT_META`] present once this node initialised the cluster from this data dir
/// (`raft::formation::form`), written before it calls openraft's `initialize`.
const FORMED: &str = "formed";
/// Key in [`RAFT_META`] present from the start of a node whose empty data dir may be a wiped one
/// (`raft::formation::may_be_wiped`) until it learns the cluster is new or a leader caught it up
/// (`raft::vote_gate`): its vote gate stays closed across restarts meanwhile, also once a
/// leader's first appends made the directory non-empty.
const UNSURE: &str = "unsure";
/// State-machine metadata: `"last_applied"` → `Option<LogId>`, `"membership"` → `StoredMembership`,
/// `"clock_ms"` → u64, the cluster clock (see [`state_machine`]).
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
/// Streams: name → postcard-encoded [`StreamMeta`].
pub(crate) const STREAMS: TableDefinition<&str, &[u8]> = TableDefinition::new("streams");
/// Deleted streams: name → the postcard-encoded [`StreamMeta`] it had when deleted, so a stream
/// created again under the name continues after its last seq (seqs are never reused, SPEC §1).
pub(crate) const TOMBSTONES: TableDefinition<&str, &[u8]> = TableDefinition::new("tombstones");
/// Client tokens: name → postcard-encoded [`crate::auth::TokenRecord`] (salt and hash, never
/// the secret); the key [`TOKENS_BOOTSTRAPPED`] (not a token name) marks that the cluster's
/// bootstrap token was made.
pub(crate) const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
/// The key in [`TOKENS`] recording that the bootstrap admin token was made (empty: no token
/// can have this name).
pub(crate) const TOKENS_BOOTSTRAPPED: &str = "";
/// Batches of data formats 1 and 2, payloads inline: (stream, seq) → [`BatchValue`] encoding
/// (`ts` ms, log index, CRC-32, payload). Read only by the upgrade to format 3
/// ([`Store::migrate_inline_batches`]), which moves them to [`payloads`] and drops the table.
pub(crate) const BATCHES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("batches");
/// Each stream's id on this node: name → id, the name of its payload segments
/// ([`payloads::SegmentKey`]). Local to the node (a snapshot does not carry it; an installing
/// node numbers streams itself) and never reused: the next id is `"next_stream_id"` in
/// [`SM_META`]. A stream gets its id with its first batch; a deleted stream loses it.
pub(crate) const STREAM_IDS: TableDefinition<&str, u64> = TableDefinition::new("stream_ids");
/// The batch index: (stream id, seq) → [`IndexRow`] (`ts`, log index and the payload's
/// [`payloads::Location`]; 40 bytes a batch, whatever the payload's size).
pub(crate) const BATCH_INDEX: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("batch_index");
/// The key in [`SM_META`] of the next stream id to assign (absent: 0).
pub(crate) const NEXT_STREAM_ID: &str = "next_stream_id";

/// Makes the entries of the directory `dir` durable (the names created, renamed and removed in
/// it so far): an fsync of the directory itself, as POSIX requires for a rename to survive a
/// crash.
///
/// Errors: [`StoreError::Io`] when the directory cannot be opened or fsynced.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// A storage failure. Never caused by client input: callers validate before reaching storage.
/// [`StoreError::is_storage_full`] tells a full disk (the one failure a client is told about as
/// such, `507`; `crate::error` maps every variant to HTTP).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb failed (I/O, corruption, transaction).
    #[error("database: {0}")]
    Db(#[from] redb::Error),
    /// A stored value did not decode.
    #[error("decoding a stored value: {0}")]
    Codec(#[from] postcard::Error),
    /// File I/O on the log, the snapshot or the data directory failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A stored structure of the Raft log or the state machine broke an invariant.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A snapshot file, built here or received from the leader, is not a complete snapshot (no
    /// magic, no header, a record over the limit, counts or metadata that do not match).
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// A snapshot record is larger than its u32 length can frame (4 GiB).
    #[error("a snapshot record of {0} bytes is over the 4 GiB its length can frame")]
    RecordTooLarge(usize),
    /// redb refused the durability asked of a transaction: a fault of this build, not damage.
    #[error("setting a transaction's durability: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// The data directory keeps its Raft log in redb, an older Runnev layout this build does not
    /// read.
    #[error("this data directory keeps its Raft log in redb (an older Runnev layout); start from an empty directory")]
    LegacyLayout,
    /// The data directory's `FORMAT` file (or a backup's header) names a format this build does
    /// not read ([`format::READABLE`]; it writes [`format::FORMAT_VERSION`]).
    #[error(
        "this data directory is in data format {found}; this runnev reads formats 1 to {supported}: run the runnev that wrote it, or start from an empty directory"
    )]
    UnsupportedFormat {
        /// The format the directory was written in.
        found: u32,
        /// The newest format this build reads (and the one it writes).
        supported: u32,
    },
    /// A backup file is not a complete, undamaged backup, or a restore cannot lay out its
    /// directory (see [`backup::restore`]).
    #[error("{0}")]
    Backup(String),
}

impl StoreError {
    /// Whether the failure is a full disk (`ENOSPC`, [`std::io::ErrorKind::StorageFull`]), from
    /// file I/O or wrapped by redb.
    pub fn is_storage_full(&self) -> bool {
        let io = match self {
            StoreError::Io(e) | StoreError::Db(redb::Error::Io(e)) => e,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::StorageFull
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(impl From<$t> for StoreError { fn from(e: $t) -> Self { StoreError::Db(e.into()) } })*};
}
from_redb!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

/// The little-endian u64 at the start of `b` (0 when `b` is shorter: callers pass slices of
/// fixed-width encodings they have already length-checked).
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    b.first_chunk().map_or(0, |c| u64::from_le_bytes(*c))
}

/// The little-endian u32 at the start of `b`, as [`le_u64`].
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    b.first_chunk().map_or(0, |c| u32::from_le_bytes(*c))
}

/// Encodes a value for storage or the wire (postcard: compact, schema-less, serde-driven).
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, StoreError> {
    let len = encoded_len(value)?;
    let mut out = Vec::with_capacity(len);
    encode_append(value, &mut out)?;
    debug_assert_eq!(out.len(), len, "the counting pass and the encoding agree");
    Ok(out)
}

/// Bytes of `value`'s encoding ([`encode`]), counted without writing them (postcard's `Size`
/// flavor: a walk over the value, no copy of its payloads). Sizing a buffer first saves the
/// copies a growing one makes: an entry of 100 frames of 1 KiB was copied about twice over.
///
/// Errors: what `value`'s `Serialize` refuses.
pub(crate) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, StoreError> {
    Ok(postcard::serialize_with_flavor::<T, _, usize>(value, postcard::ser_flavors::Size::default())?)
}

/// Appends `value`'s encoding (the bytes of [`encode`]) to `out`; size `out` with
/// [`encoded_len`] first to write it without regrowth.
///
/// Errors: what `value`'s `Serialize` refuses; `out` then holds part of the encoding.
pub(crate) fn encode_append<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), StoreError> {
    Ok(postcard::serialize_with_flavor::<T, _, ()>(value, AppendTo(out))?)
}

/// A postcard output that appends to a caller's vector ([`encode_append`]).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decodes a value written by [`encode`].
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// A stored batch value: a fixed-width header, then the payload.
///
/// Data format 2 (written), 21 bytes of header: `ts` ms (u64 LE); the log index's low 56 bits
/// with the tag `0xC5` in the top byte (u64 LE); CRC-32 (IEEE, u32 LE) of the stream name's
/// length and bytes, the seq (u64 LE), `ts`, the log index and the payload; the log index's top
/// byte; then the payload. Data format 1 (read only): `ts`, the log index (top byte 0 in every
/// directory written by a real cluster), the payload, no checksum. A top byte that is neither is
/// refused: the tag is four bits from 0, so one flipped bit cannot make a checked value pass as
/// an unchecked one. redb checks its own page checksums only in `check_integrity`, not on reads, so
/// a bit flipped on disk in a payload would otherwise be served as it is; with the checksum over
/// key and content it is refused as [`StoreError::Corrupt`] (detected, never served), and a value
/// stored under another key fails too.
pub(crate) struct BatchValue;

impl BatchValue {
    const LEGACY_HEADER_BYTES: usize = 16;
    const HEADER_BYTES: usize = 21;
    /// The top byte of the index word of a checked value: a checksum follows.
    const TAG: u64 = 0xC5 << 56;
    /// The log index's bits of the index word.
    const INDEX_MASK: u64 = (1 << 56) - 1;

    /// Encodes (`ts` ms, log index, payload) for the batch at (`stream`, `seq`).
    pub(crate) fn encode(stream: &str, seq: u64, ts: u64, index: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::HEADER_BYTES + payload.len());
        v.extend_from_slice(&ts.to_le_bytes());
        v.extend_from_slice(&((index & Self::INDEX_MASK) | Self::TAG).to_le_bytes());
        v.extend_from_slice(&Self::checksum(stream, seq, ts, index, payload).to_le_bytes());
        v.push((index >> 56) as u8);
        v.extend_from_slice(payload);
        v
    }

    /// Splits the stored value of the batch at (`stream`, `seq`) into (`ts` ms, log index,
    /// payload), after checking its checksum (format 2; a format-1 value has none).
    ///
    /// Errors: [`StoreError::Corrupt`] when the value is shorter than its header or fails its
    /// checksum (a bit changed on disk since it was written, or a value under the wrong key).
    pub(crate) fn decode<'v>(stream: &str, seq: u64, v: &'v [u8]) -> Result<(u64, u64, &'v [u8]), StoreError> {
        if v.len() < Self::LEGACY_HEADER_BYTES {
            return Err(StoreError::Corrupt(format!("batch {stream}/{seq}: a value of {} bytes", v.len())));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (ts, index) = (word(0), word(8));
        match index & !Self::INDEX_MASK {
            0 => return Ok((ts, index, &v[Self::LEGACY_HEADER_BYTES..])),
            Self::TAG => {}
            other => {
                return Err(StoreError::Corrupt(format!(
                    "batch {stream}/{seq}: its header's tag is {:02x}, neither 0 nor c5",
                    other >> 56
                )))
            }
        }
        if v.len() < Self::HEADER_BYTES {
            return Err(StoreError::Corrupt(format!("batch {stream}/{seq}: a value of {} bytes", v.len())));
        }
        let index = (index & Self::INDEX_MASK) | (u64::from(v[20]) << 56);
        let mut c = [0u8; 4];
        c.copy_from_slice(&v[16..20]);
        let stored = u32::from_le_bytes(c);
        let payload = &v[Self::HEADER_BYTES..];
        let computed = Self::checksum(stream, seq, ts, index, payload);
        if stored != computed {
            return Err(StoreError::Corrupt(format!(
                "batch {stream}/{seq} fails its checksum (stored {stored:08x}, computed {computed:08x}): \
                 its bytes changed since they were written"
            )));
        }
        Ok((ts, index, payload))
    }

    fn checksum(stream: &str, seq: u64, ts: u64, index: u64, payload: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&(stream.len() as u64).to_le_bytes());
        h.update(stream.as_bytes());
        h.update(&seq.to_le_bytes());
        h.update(&ts.to_le_bytes());
        h.update(&index.to_le_bytes());
        h.update(payload);
        h.finalize()
    }
}

/// A row of [`BATCH_INDEX`]: what the state machine knows of a batch besides its payload.
///
/// Encoding, 40 bytes, all little-endian: `ts` ms (u64), log index (u64), the payload's
/// [`payloads::Location`] (20 bytes), CRC-32 (IEEE, u32) of the stream id, the seq and the 36
/// bytes before it. redb does not check page checksums on reads, so a flipped bit in a row (a
/// `ts` that would make retention evict early, a location elsewhere) is refused as
/// [`StoreError::Corrupt`] instead of acted on; the payload record checks its own bytes
/// ([`payloads::parse_record`]) and must agree with the row's `ts` and log index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexRow {
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// Raft log index of the entry that stored the batch.
    pub index: u64,
    /// Where its payload record is.
    pub loc: payloads::Location,
}

impl IndexRow {
    /// Encoded length, bytes.
    pub(crate) const BYTES: usize = 16 + payloads::Location::ENCODED_BYTES + 4;

    fn checksum(stream: u64, seq: u64, body: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&stream.to_le_bytes());
        h.update(&seq.to_le_bytes());
        h.update(body);
        h.finalize()
    }

    /// Encodes the row of batch `seq` of stream id `stream`.
    pub(crate) fn encode(&self, stream: u64, seq: u64) -> [u8; Self::BYTES] {
        let mut v = [0u8; Self::BYTES];
        v[..8].copy_from_slice(&self.ts.to_le_bytes());
        v[8..16].copy_from_slice(&self.index.to_le_bytes());
        v[16..36].copy_from_slice(&self.loc.encode());
        let sum = Self::checksum(stream, seq, &v[..36]);
        v[36..].copy_from_slice(&sum.to_le_bytes());
        v
    }

    /// Decodes the row stored under (`stream`, `seq`).
    ///
    /// Errors: [`StoreError::Corrupt`] for a value of another length or one that fails its
    /// checksum (changed on disk, or stored under another key).
    pub(crate) fn decode(stream: u64, seq: u64, v: &[u8]) -> Result<IndexRow, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("batch index row {stream:x}/{seq}: {what}"));
        let v: &[u8; Self::BYTES] = v.try_into().map_err(|_| corrupt(&format!("{} bytes", v.len())))?;
        let stored = le_u32(&v[36..]);
        if stored != Self::checksum(stream, seq, &v[..36]) {
            return Err(corrupt("fails its checksum: its bytes changed since they were written"));
        }
        let loc = payloads::Location::decode(&v[16..36]).ok_or_else(|| corrupt("a location that does not decode"))?;
        Ok(IndexRow { ts: le_u64(&v[..8]), index: le_u64(&v[8..16]), loc })
    }
}

/// One batch as read back for a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    /// Its seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// Raft log index of the entry that stored it.
    pub index: u64,
    /// The payload, byte for byte.
    pub data: Vec<u8>,
}

/// The answer of [`Store::read_batches`]: the stream's metadata and the batches after a cursor,
/// both from one consistent read transaction.
#[derive(Debug, Clone)]
pub struct BatchesView {
    /// The stream as of the read.
    pub meta: StreamMeta,
    /// Batches with seq > `after`, in seq order.
    pub batches: Vec<StoredBatch>,
}

/// The storage of one Raft group on a node ([`layout`]): its redb database, its Raft log, its
/// payload segments, its directory, and the applied-index signal that readers wait on.
pub struct Store {
    db: Database,
    log: std::sync::Mutex<segments::SegmentLog>,
    payloads: payloads::PayloadStore,
    /// The group's directory ([`layout::group_dir`]): its snapshots live here.
    dir: PathBuf,
    /// The Raft group this store holds.
    group: layout::GroupId,
    applied_tx: watch::Sender<u64>,
    committed_index: AtomicU64,
    /// The current snapshot's pin of its payload spans ([`snapshot`]), under the lock that
    /// replacing the current snapshot takes.
    snapshot_pin: std::sync::Mutex<Option<payloads::PinId>>,
    disk_low: Arc<AtomicBool>,
    /// The last log index of each received snapshot being installed ([`Store::begin_install`]),
    /// one element per install under way (a duplicated RPC can start two).
    installs: std::sync::Mutex<Vec<u64>>,
    /// Payload bytes applied since the last snapshot began ([`Store::note_applied_bytes`]).
    bytes_since_snapshot: AtomicU64,
    /// Those bytes that make a snapshot due (`--snapshot-log-bytes`; `u64::MAX`: never).
    snapshot_log_bytes: AtomicU64,
    /// Woken when the applied bytes cross [`Store::set_snapshot_log_bytes`]'s bound.
    snapshot_due: tokio::sync::Notify,
}

impl Store {
    /// Opens (or creates) the store of the cluster's group ([`layout::GroupId::CLUSTER`]) in the
    /// data directory `data_dir`: [`Store::open_group`].
    ///
    /// Errors: as [`Store::open_group`].
    pub fn open(data_dir: &Path) -> Result<Arc<Store>, StoreError> {
        Store::open_group(data_dir, layout::GroupId::CLUSTER)
    }

    /// Opens (or creates) the store of Raft group `group` in the data directory `data_dir`, in
    /// the group's directory ([`layout::group_dir`]), creating the directories, the database
    /// (atomically: [`db_dir`]) and every table. A data directory of format 4 or older has its
    /// group 0 moved into its directory first (`layout::adopt_flat_layout`).
    ///
    /// Errors: a directory cannot be created; the data directory's `FORMAT` names another data
    /// format ([`StoreError::UnsupportedFormat`], checked before anything else is opened or
    /// moved); the flat layout cannot be moved; the database cannot be created
    /// (`db_dir::open_database`); or redb cannot open the database (another process holds
    /// it, or it is corrupt).
    pub fn open_group(data_dir: &Path, group: layout::GroupId) -> Result<Arc<Store>, StoreError> {
        let dir = layout::group_dir(data_dir, group);
        Store::open_marked(data_dir, group, &db_dir::FsDatabaseDir::new(&dir), || {
            Ok((
                Arc::new(segments::FsSegments::new(dir.join(layout::LOG_DIR))?),
                Arc::new(payloads::FsPayloads::new(dir.join(layout::PAYLOADS_DIR))?),
            ))
        })
    }

    /// Opens the cluster group's store with its database in `db`, its Raft log in `segments`
    /// and its payload segments in `payloads` (the simulation's, which lose unsynced writes on
    /// a crash); `FORMAT` still lives in `data_dir` and the snapshots in the group's directory
    /// under it. A missing database is created in `db` as [`Store::open`] creates it.
    ///
    /// Errors: as [`Store::open_group`].
    pub fn open_with(
        data_dir: &Path,
        db: &impl db_dir::DatabaseDir,
        segments: Arc<dyn segments::SegmentDir>,
        payloads: Arc<dyn payloads::PayloadDir>,
    ) -> Result<Arc<Store>, StoreError> {
        Store::open_marked(data_dir, layout::GroupId::CLUSTER, db, || Ok((segments, payloads)))
    }

    /// Creates `data_dir`, checks its `FORMAT` before the database or the log is opened (or
    /// created), moves a flat layout of format 4 or older into group 0's directory (marking the
    /// directory before the first file moves, [`layout::adopt_flat_layout`]), and otherwise
    /// writes the marker of a new or older directory only once the store has opened (a failed
    /// open leaves such a directory in the format it found; at most a temporary database file,
    /// which the next start removes), before anything of this format is written: the upgrade of
    /// a directory of format 1 or 2 ([`Store::migrate_inline_batches`]) runs after the mark.
    fn open_marked(
        data_dir: &Path,
        group: layout::GroupId,
        db: &impl db_dir::DatabaseDir,
        files: impl FnOnce() -> Result<(Arc<dyn segments::SegmentDir>, Arc<dyn payloads::PayloadDir>), StoreError>,
    ) -> Result<Arc<Store>, StoreError> {
        create_private_dir(data_dir)?;
        let mut mark = format::check(data_dir)?;
        if layout::adopt_flat_layout(data_dir, mark)? > 0 {
            mark = false; // marked before the first file moved
        }
        let dir = layout::group_dir(data_dir, group);
        std::fs::create_dir_all(&dir)?;
        let db = db_dir::open_database(db, create_tables)?;
        let (segments, payloads) = files()?;
        let store = Store::init(db, segments, payloads, &dir, group)?;
        if mark {
            format::write(data_dir)?;
        }
        store.migrate_inline_batches()?;
        Ok(store)
    }

    fn init(
        db: Database,
        segments: Arc<dyn segments::SegmentDir>,
        payload_dir: Arc<dyn payloads::PayloadDir>,
        dir: &Path,
        group: layout::GroupId,
    ) -> Result<Arc<Store>, StoreError> {
        {
            let txn = db.begin_read()?;
            match txn.open_table(LEGACY_LOG) {
                Ok(t) if t.first()?.is_some() => return Err(StoreError::LegacyLayout),
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        create_tables(&db)?;
        let purged: Option<crate::raft::LogId> = {
            let txn = db.begin_read()?;
            let t = txn.open_table(RAFT_META)?;
            t.get("last_purged")?.map(|v| decode(v.value())).transpose()?
        };
        let log = segments::SegmentLog::open(segments, purged)?;
        let extents = payload_extents(&db)?;
        let spans = snapshot::current_spans(dir)?;
        let (payloads, pin) =
            payloads::PayloadStore::open_pinned(payload_dir, crate::limits::PAYLOAD_SEGMENT_BYTES, &extents, spans)?;
        let store = Store {
            db,
            log: std::sync::Mutex::new(log),
            payloads,
            dir: dir.to_path_buf(),
            group,
            applied_tx: watch::Sender::new(0),
            committed_index: AtomicU64::new(0),
            snapshot_pin: std::sync::Mutex::new(Some(pin)),
            disk_low: Arc::default(),
            installs: std::sync::Mutex::new(Vec::new()),
            bytes_since_snapshot: AtomicU64::new(0),
            snapshot_log_bytes: AtomicU64::new(u64::MAX),
            snapshot_due: tokio::sync::Notify::new(),
        };
        let applied = store.last_applied()?.map(|l| l.index).unwrap_or(0);
        store.applied_tx.send_replace(applied);
        Ok(Arc::new(store))
    }

    pub(crate) fn db(&self) -> &Database {
        &self.db
    }

    /// A write transaction that commits durably and saves redb's allocator state (redb's
    /// "quick repair"): after a crash redb opens at once instead of verifying and walking the
    /// whole file (seconds per GiB). It costs a second fsync per durable commit, and durable
    /// commits are rare: votes, purges, snapshots, and the state machine's periodic one.
    ///
    /// Errors: redb could not start a transaction.
    pub(crate) fn begin_durable_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        begin_durable_write(&self.db)
    }

    /// Commits `txn` durably, the one way any durable commit is made: first fsyncs every
    /// payload segment appended to ([`payloads::PayloadStore::sync`]), because a durable commit
    /// also persists every non-durable state-machine commit before it, whose index rows point at
    /// those bytes; `txn` holds redb's only write transaction meanwhile, so no other commit
    /// slips in between. Then lets the payload segments retired by states now durable go
    /// ([`payloads::PayloadStore::durable`]: removed on the blocking pool, nobody waits).
    ///
    /// Errors: the fsync of a payload segment (nothing is committed) or the commit.
    pub(crate) fn commit_durably(&self, txn: redb::WriteTransaction) -> Result<(), StoreError> {
        self.payloads.sync()?;
        let sealed = self.payloads.seal();
        if let Err(e) = txn.commit() {
            self.payloads.unseal(sealed);
            return Err(e.into());
        }
        self.payloads.durable(sealed);
        Ok(())
    }

    /// The payload segments.
    pub(crate) fn payloads(&self) -> &payloads::PayloadStore {
        &self.payloads
    }

    /// Moves the batches of a data directory of format 1 or 2, whose payloads are inline in the
    /// `batches` table, to payload segments and the batch index, in one durable transaction that
    /// drops the old table (a crash before its commit leaves the old table whole, and the next
    /// start does it again; the segments it had written are removed at open, as nothing refers
    /// to them). Logs its progress every 64 MiB. Nothing to do for a directory of format 3.
    ///
    /// Errors: a value that fails its checksum (the upgrade stops, the directory keeps its old
    /// table), redb or file I/O.
    fn migrate_inline_batches(&self) -> Result<(), StoreError> {
        {
            let txn = self.db.begin_read()?;
            match txn.open_table(BATCHES) {
                Ok(t) if t.first()?.is_some() => {}
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(dir = %self.dir.display(), "moving batch payloads out of the database into payload segments (data format 3)");
        let txn = self.begin_durable_write()?;
        let (mut batches, mut bytes, mut logged) = (0u64, 0u64, 0u64);
        {
            let old = txn.open_table(BATCHES)?;
            let mut ids = txn.open_table(STREAM_IDS)?;
            let mut index = txn.open_table(BATCH_INDEX)?;
            let mut sm = txn.open_table(SM_META)?;
            let mut next: u64 = sm.get(NEXT_STREAM_ID)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
            for row in old.iter()? {
                let (k, v) = row?;
                let (name, seq) = k.value();
                let (ts, log_index, payload) = BatchValue::decode(name, seq, v.value())?;
                let id = stream_id_or_assign(&mut ids, &mut next, name)?;
                let loc = self.payloads.append(id, seq, ts, log_index, payload)?;
                index.insert((id, seq), IndexRow { ts, index: log_index, loc }.encode(id, seq).as_slice())?;
                batches += 1;
                bytes = bytes.saturating_add(payload.len() as u64);
                if bytes - logged >= 64 << 20 {
                    logged = bytes;
                    tracing::info!(batches, payload_bytes = bytes, "moving batch payloads");
                }
            }
            sm.insert(NEXT_STREAM_ID, encode(&next)?.as_slice())?;
        }
        txn.delete_table(BATCHES)?;
        self.commit_durably(txn)?;
        tracing::info!(batches, payload_bytes = bytes, "moved batch payloads into payload segments");
        Ok(())
    }

    /// The Raft log. Held only for in-memory work and page-cache I/O, never across an fsync of
    /// an append ([`segments::PendingSync`]).
    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, segments::SegmentLog> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Raft log if no one holds it now, without waiting (for work cheap enough to do on an
    /// async task: a read of cached entries).
    pub(crate) fn try_log(&self) -> Option<std::sync::MutexGuard<'_, segments::SegmentLog>> {
        match self.log.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The group's directory ([`layout::group_dir`]).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The Raft group this store holds ([`layout`]).
    pub fn group(&self) -> layout::GroupId {
        self.group
    }

    /// The log index up to which the state machine has applied (0 before any).
    pub fn applied_index(&self) -> u64 {
        *self.applied_tx.borrow()
    }

    /// A receiver that changes whenever the applied index advances.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// Sets the payload bytes applied since the last snapshot that make the next one due
    /// (`--snapshot-log-bytes`); until called, never.
    pub fn set_snapshot_log_bytes(&self, bytes: u64) {
        self.snapshot_log_bytes.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Counts `bytes` of payload applied; wakes [`Store::snapshot_due`] once the count since
    /// the last snapshot crosses the bound.
    pub(crate) fn note_applied_bytes(&self, bytes: u64) {
        let limit = self.snapshot_log_bytes.load(Ordering::Relaxed);
        let before = self.bytes_since_snapshot.fetch_add(bytes, Ordering::Relaxed);
        if before < limit && before.saturating_add(bytes) >= limit {
            self.snapshot_due.notify_one();
        }
    }

    /// Restarts the count of [`Store::note_applied_bytes`]: a snapshot is being built.
    pub(crate) fn snapshot_begun(&self) {
        self.bytes_since_snapshot.store(0, Ordering::Relaxed);
    }

    /// Resolves once the payload bytes applied since the last snapshot reach the bound of
    /// [`Store::set_snapshot_log_bytes`] (or at once, if they did since the last call).
    pub async fn snapshot_due(&self) {
        self.snapshot_due.notified().await;
    }

    pub(crate) fn set_applied(&self, index: u64) {
        self.applied_tx.send_if_modified(|cur| {
            let advanced = index != *cur;
            *cur = index;
            advanced
        });
    }

    /// The flag the disk guard ([`crate::disk`]) sets while the data directory is low on space:
    /// the state machine then defers its periodic durable commit, which would write out every
    /// batch applied since the last one at once (up to
    /// [`crate::limits::SM_DURABLE_EVERY_BYTES`]) and stop the Raft core on `ENOSPC`. The log
    /// holds those entries durably meanwhile; the commit happens once space is back.
    pub fn disk_low_flag(&self) -> Arc<AtomicBool> {
        self.disk_low.clone()
    }

    pub(crate) fn disk_low(&self) -> bool {
        self.disk_low.load(Ordering::Relaxed)
    }

    /// The highest log index this node knows to be committed (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.committed_index.load(Ordering::Acquire)
    }

    pub(crate) fn set_committed(&self, index: u64) {
        self.committed_index.fetch_max(index, Ordering::AcqRel);
    }

    fn last_applied(&self) -> Result<Option<crate::raft::LogId>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(SM_META)?;
        match t.get("last_applied")? {
            Some(v) => decode(v.value()),
            None => Ok(None),
        }
    }

    /// True when this store has never held Raft state: no vote, no log entry, nothing purged.
    ///
    /// Errors: redb failures.
    pub fn is_pristine(&self) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(RAFT_META)?;
        Ok(meta.get("vote")?.is_none() && meta.get("last_purged")?.is_none() && self.log().is_empty())
    }

    /// Marks that a snapshot received from the leader, whose last entry is at log index
    /// `last_index`, is being installed (from its last chunk until [`InstallGuard`] is
    /// dropped): the log store leaves a purge past the applied state to it
    /// (`log_store::LogStore::purge`).
    pub fn begin_install(self: &Arc<Self>, last_index: u64) -> InstallGuard {
        self.installs.lock().unwrap_or_else(|p| p.into_inner()).push(last_index);
        InstallGuard { store: self.clone(), last_index }
    }

    /// The highest last log index of the received snapshots being installed, if one is: two
    /// can overlap (a duplicated install RPC), and the end of one leaves the other's in force.
    pub(crate) fn install_pending_through(&self) -> Option<u64> {
        self.installs.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().max()
    }

    /// The vote last saved durably (openraft's `save_vote`, or [`Store::seed_vote`]), `None`
    /// before the first. Its term is this node's durable current term (Raft paper §5.1, Figure
    /// 2: `currentTerm` and `votedFor` are persisted before the node answers with them), which
    /// never goes down, unlike the term in openraft's metrics, which moves before the vote is
    /// saved and falls back when the save fails (a full disk) and the node restarts.
    ///
    /// Errors: redb failures, or a stored vote that does not decode.
    pub fn saved_vote(&self) -> Result<Option<openraft::Vote<crate::raft::NodeId>>, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(RAFT_META)?;
        meta.get("vote")?.map(|v| decode(v.value())).transpose()
    }

    /// Durably records `vote` before Raft starts (see `raft::formation::guard_wiped_node`).
    ///
    /// Errors: redb failures.
    pub fn seed_vote(&self, vote: &openraft::Vote<crate::raft::NodeId>) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        txn.open_table(RAFT_META)?.insert("vote", encode(vote)?.as_slice())?;
        self.commit_durably(txn)?;
        Ok(())
    }

    /// Durably records `vote` for a node that lost its disk, and that it must not vote until a
    /// leader has caught it up ([`Store::catching_up`]), in one transaction (see
    /// `raft::formation::guard_wiped_node`).
    ///
    /// Errors: redb failures.
    pub fn seed_wiped_vote(&self, vote: &openraft::Vote<crate::raft::NodeId>) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        {
            let mut meta = txn.open_table(RAFT_META)?;
            meta.insert("vote", encode(vote)?.as_slice())?;
            meta.insert(CATCHING_UP, [1u8].as_slice())?;
        }
        self.commit_durably(txn)?;
        Ok(())
    }

    /// Whether this node lost its disk and has not yet been caught up by a leader: it must not
    /// grant votes meanwhile (it may have acknowledged entries its empty log no longer holds).
    /// Survives restarts until [`Store::caught_up`].
    ///
    /// Errors: redb failures.
    pub fn catching_up(&self) -> Result<bool, StoreError> {
        self.has_meta(CATCHING_UP)
    }

    /// Whether this node, while pristine, answered a formation probe of node `prober` as fresh
    /// ([`Store::mark_counted_fresh_by`]).
    ///
    /// Errors: redb failures.
    pub fn counted_fresh_by(&self, prober: u64) -> Result<bool, StoreError> {
        self.has_meta(&format!("{COUNTED_FRESH_BY}{prober}"))
    }

    /// Durably records that this pristine node answered node `prober`'s formation probe as
    /// fresh, before the answer leaves (see `raft::formation`). Leaves [`Store::is_pristine`]
    /// true.
    ///
    /// Errors: redb failures.
    pub fn mark_counted_fresh_by(&self, prober: u64) -> Result<(), StoreError> {
        self.set_meta(&format!("{COUNTED_FRESH_BY}{prober}"), true)
    }

    /// Whether this node initialised the cluster from this data dir ([`Store::mark_formed`]).
    ///
    /// Errors: redb failures.
    pub fn formed(&self) -> Result<bool, StoreError> {
        self.has_meta(FORMED)
    }

    /// Durably records that this node initialises the cluster, before it does.
    ///
    /// Errors: redb failures.
    pub fn mark_formed(&self) -> Result<(), StoreError> {
        self.set_meta(FORMED, true)
    }

    /// Durably adds (`present`) or removes the marker `key` in [`RAFT_META`].
    fn set_meta(&self, key: &str, present: bool) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        {
            let mut meta = txn.open_table(RAFT_META)?;
            match present {
                true => drop(meta.insert(key, [1u8].as_slice())?),
                false => drop(meta.remove(key)?),
            }
        }
        self.commit_durably(txn)?;
        Ok(())
    }

    /// Whether the marker `key` is present in [`RAFT_META`].
    fn has_meta(&self, key: &str) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(RAFT_META)?.get(key)?.is_some())
    }

    /// Durably ends [`Store::catching_up`] and [`Store::unsure`] (one transaction).
    ///
    /// Errors: redb failures.
    pub fn caught_up(&self) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        {
            let mut meta = txn.open_table(RAFT_META)?;
            meta.remove(CATCHING_UP)?;
            meta.remove(UNSURE)?;
        }
        self.commit_durably(txn)?;
        Ok(())
    }

    /// Whether this node started on an empty data dir that may be a wiped one and has not yet
    /// learned that the cluster is new nor been caught up by a leader ([`Store::mark_unsure`]).
    ///
    /// Errors: redb failures.
    pub fn unsure(&self) -> Result<bool, StoreError> {
        self.has_meta(UNSURE)
    }

    /// Durably records that this node is unsure whether its empty data dir is a wiped one
    /// (see `raft::vote_gate`). Leaves [`Store::is_pristine`] true.
    ///
    /// Errors: redb failures.
    pub fn mark_unsure(&self) -> Result<(), StoreError> {
        self.set_meta(UNSURE, true)
    }

    /// Durably removes the record of [`Store::mark_unsure`]: the cluster turned out new.
    ///
    /// Errors: redb failures.
    pub fn clear_unsure(&self) -> Result<(), StoreError> {
        self.set_meta(UNSURE, false)
    }

    /// One stream's metadata, or `None` if it does not exist.
    pub fn stream(&self, name: &str) -> Result<Option<StreamMeta>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(STREAMS)?;
        t.get(name)?.map(|v| decode(v.value())).transpose()
    }

    /// The token named `name`, or `None`. A read of one key: cheap enough to run on the async
    /// executor for every authenticated request.
    ///
    /// Errors: redb failures or a stored value that does not decode.
    pub fn token(&self, name: &str) -> Result<Option<crate::auth::TokenRecord>, StoreError> {
        if name == TOKENS_BOOTSTRAPPED {
            return Ok(None);
        }
        let txn = self.db.begin_read()?;
        let t = txn.open_table(TOKENS)?;
        t.get(name)?.map(|v| decode(v.value())).transpose()
    }

    /// Every token, in name order, and whether the bootstrap token was made.
    ///
    /// Errors: redb failures or a stored value that does not decode.
    pub fn tokens(&self) -> Result<(Vec<(String, crate::auth::TokenRecord)>, bool), StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(TOKENS)?;
        let mut out = Vec::new();
        let mut bootstrapped = false;
        for row in t.iter()? {
            let (k, v) = row?;
            if k.value() == TOKENS_BOOTSTRAPPED {
                bootstrapped = true;
            } else {
                out.push((k.value().to_string(), decode(v.value())?));
            }
        }
        Ok((out, bootstrapped))
    }

    /// Every stream, in name order.
    pub fn streams(&self) -> Result<Vec<StreamInfo>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(STREAMS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            out.push(StreamInfo { name: k.value().to_string(), meta: decode(v.value())? });
        }
        Ok(out)
    }

    /// Batches of `name` with seq > `after`: at most `limit` of them and, past the first, at most
    /// `bytes_max` payload bytes. `None` if the stream does not exist.
    pub fn read_batches(
        &self,
        name: &str,
        after: u64,
        limit: usize,
        bytes_max: usize,
    ) -> Result<Option<BatchesView>, StoreError> {
        self.visit_batches(
            name,
            after,
            limit,
            bytes_max,
            |meta| BatchesView { meta: *meta, batches: Vec::new() },
            |view, b| view.batches.push(StoredBatch { seq: b.seq, ts: b.ts, index: b.index, data: b.data.to_vec() }),
        )
    }

    /// The same read as [`Store::read_batches`] without a copy per batch: `start` gets the
    /// stream's metadata and makes the accumulator, then `each` gets every batch, in seq order,
    /// borrowed from the buffer its records were read into (one read per run of adjacent
    /// records: a stream's batches follow each other in its payload segment).
    ///
    /// Only applied entries are in the database, so nothing here is uncommitted. The payload
    /// segments' read gate is held from before the database read to the last payload read, so
    /// retention cannot remove a segment this read's index rows point at. `None` if the stream
    /// does not exist.
    ///
    /// Errors: redb failures, file I/O, or [`StoreError::Corrupt`] for an index row or a
    /// payload record that fails its checksum or disagrees with the other.
    pub fn visit_batches<T>(
        &self,
        name: &str,
        after: u64,
        limit: usize,
        bytes_max: usize,
        start: impl FnOnce(&StreamMeta) -> T,
        mut each: impl FnMut(&mut T, BatchRef<'_>),
    ) -> Result<Option<T>, StoreError> {
        let gate = self.payloads.read_gate();
        let txn = self.db.begin_read()?;
        let streams = txn.open_table(STREAMS)?;
        let Some(meta) = streams.get(name)?.map(|v| decode::<StreamMeta>(v.value())).transpose()? else {
            return Ok(None);
        };
        let mut acc = start(&meta);
        let Some(from) = after.checked_add(1) else { return Ok(Some(acc)) };
        let Some(id) = txn.open_table(STREAM_IDS)?.get(name)?.map(|v| v.value()) else {
            if meta.batches > 0 {
                return Err(StoreError::Corrupt(format!(
                    "stream {name} counts {} batches but has no id",
                    meta.batches
                )));
            }
            return Ok(Some(acc));
        };
        let table = txn.open_table(BATCH_INDEX)?;
        let (mut bytes, mut rows) = (0usize, Vec::new());
        for row in table.range((id, from)..=(id, u64::MAX))? {
            if rows.len() >= limit {
                break;
            }
            let (k, v) = row?;
            let seq = k.value().1;
            let row = IndexRow::decode(id, seq, v.value())?;
            let len = row.loc.len as usize;
            if !rows.is_empty() && bytes.saturating_add(len) > bytes_max {
                break;
            }
            bytes = bytes.saturating_add(len);
            rows.push((seq, row));
        }
        self.read_payloads(&gate, name, id, &rows, |b| each(&mut acc, b))?;
        Ok(Some(acc))
    }

    /// Reads the payloads of `rows` (of stream `name`, id `id`, in seq order) and lends each
    /// batch to `each`: one read per run of records adjacent in one segment, each record
    /// checked against its row.
    ///
    /// Errors: file I/O, or [`StoreError::Corrupt`] (a record that fails its checksum, is not
    /// the batch its row names, or disagrees with the row's `ts` or log index), naming the
    /// stream and seq.
    pub(crate) fn read_payloads(
        &self,
        gate: &payloads::ReadGate<'_>,
        name: &str,
        id: u64,
        rows: &[(u64, IndexRow)],
        mut each: impl FnMut(BatchRef<'_>),
    ) -> Result<(), StoreError> {
        let mut rest = rows;
        while let Some(((_, first), _)) = rest.split_first() {
            let mut run = 1;
            while let Some((_, next)) = rest.get(run) {
                let prev = rest[run - 1].1.loc;
                if next.loc.segment != prev.segment || next.loc.offset != prev.end() {
                    break;
                }
                run += 1;
            }
            let (this, after) = rest.split_at(run);
            let last = this[run - 1].1.loc;
            let span = last.end().saturating_sub(first.loc.offset);
            let span =
                usize::try_from(span).map_err(|_| StoreError::Corrupt(format!("a payload run of {span} bytes")))?;
            let buf = self.payloads.read(gate, id, first.loc.segment, first.loc.offset, span)?;
            for (seq, row) in this {
                let at = row.loc.offset.saturating_sub(first.loc.offset) as usize;
                let record = payloads::parse_record(id, *seq, row.loc.len, &buf[at..]).map_err(|e| match e {
                    StoreError::Corrupt(m) => StoreError::Corrupt(format!("stream {name}, seq {seq}: {m}")),
                    e => e,
                })?;
                if (record.ts, record.index) != (row.ts, row.index) {
                    return Err(StoreError::Corrupt(format!(
                        "stream {name}, seq {seq}: its index row says ts {} index {}, its record ts {} index {}",
                        row.ts, row.index, record.ts, record.index
                    )));
                }
                each(BatchRef { seq: *seq, ts: row.ts, index: row.index, data: record.payload });
            }
            rest = after;
        }
        Ok(())
    }
}

impl Drop for Store {
    /// redb makes pending non-durable commits durable when the database closes: the payload
    /// bytes their index rows point at must be on disk first (`Store::commit_durably`).
    fn drop(&mut self) {
        if let Err(e) = self.payloads.sync() {
            tracing::error!(error = %e, "fsync of payload segments at close failed; the next start replays the log from the last durable state");
        }
    }
}

/// One batch as [`Store::visit_batches`] lends it, valid during the call.
#[derive(Debug, Clone, Copy)]
pub struct BatchRef<'a> {
    /// Its seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// Raft log index of the entry that stored it.
    pub index: u64,
    /// The payload, byte for byte.
    pub data: &'a [u8],
}

pub use io::blocking;

/// A received snapshot's install under way ([`Store::begin_install`]); dropping it ends it.
pub struct InstallGuard {
    store: Arc<Store>,
    last_index: u64,
}

impl Drop for InstallGuard {
    fn drop(&mut self) {
        let mut installs = self.store.installs.lock().unwrap_or_else(|p| p.into_inner());
        let at = installs.iter().position(|&i| i == self.last_index);
        debug_assert!(at.is_some(), "an install guard of {} with no install recorded", self.last_index);
        if let Some(at) = at {
            installs.swap_remove(at);
        }
    }
}

/// Creates every table the store uses that `db` lacks, in one durable commit (at every open: a
/// database of an older build may lack a newer table).
///
/// Errors: redb failures.
fn create_tables(db: &Database) -> Result<(), StoreError> {
    let txn = begin_durable_write(db)?;
    {
        txn.open_table(RAFT_META)?;
        txn.open_table(SM_META)?;
        txn.open_table(STREAMS)?;
        txn.open_table(TOMBSTONES)?;
        txn.open_table(STREAM_IDS)?;
        txn.open_table(BATCH_INDEX)?;
        txn.open_table(TOKENS)?;
    }
    txn.commit()?;
    Ok(())
}

/// The id of stream `name` in [`STREAM_IDS`], assigned now from `*next` (which advances) if it
/// has none. Ids are local to a node and never reused ([`STREAM_IDS`]).
///
/// Errors: redb failures; [`StoreError::Corrupt`] when the node's 2^64 ids are exhausted.
pub(crate) fn stream_id_or_assign(
    ids: &mut redb::Table<'_, &'static str, u64>,
    next: &mut u64,
    name: &str,
) -> Result<u64, StoreError> {
    if let Some(id) = ids.get(name)? {
        return Ok(id.value());
    }
    let id = *next;
    *next = id.checked_add(1).ok_or_else(|| StoreError::Corrupt("this node's stream ids are exhausted".into()))?;
    ids.insert(name, id)?;
    Ok(id)
}

/// What the durable state says of every stream's payloads ([`payloads::PayloadStore::open`]):
/// for each stream id with a batch, the segment of its oldest and the location of its newest.
///
/// Errors: redb failures, or an index row that does not decode.
fn payload_extents(db: &Database) -> Result<Vec<payloads::Extent>, StoreError> {
    let txn = db.begin_read()?;
    let ids = txn.open_table(STREAM_IDS)?;
    let index = txn.open_table(BATCH_INDEX)?;
    let mut out = Vec::new();
    for row in ids.iter()? {
        let id = row?.1.value();
        let mut rows = index.range((id, 0)..=(id, u64::MAX))?;
        let Some(first) = rows.next() else { continue };
        let (k, v) = first?;
        let first = IndexRow::decode(id, k.value().1, v.value())?;
        let last = match rows.next_back() {
            Some(r) => {
                let (k, v) = r?;
                IndexRow::decode(id, k.value().1, v.value())?
            }
            None => first,
        };
        out.push(payloads::Extent { stream: id, first_segment: first.loc.segment, last: last.loc });
    }
    Ok(out)
}

fn begin_durable_write(db: &Database) -> Result<redb::WriteTransaction, StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_quick_repair(true);
    Ok(txn)
}

/// Converts a storage failure into openraft's error for a write (`true`) or read (`false`).
pub(crate) fn raft_err(e: StoreError, write: bool) -> openraft::StorageError<crate::raft::NodeId> {
    let any = openraft::AnyError::new(&e);
    let io = if write { openraft::StorageIOError::write(any) } else { openraft::StorageIOError::read(any) };
    io.into()
}

/// A Raft log entry in Runnev's configuration, as stored in [`segments`].
pub(crate) type Entry = openraft::Entry<TypeConfig>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoding is postcard's, byte for byte (the log and snapshots written by older builds
    /// are read back), counted exactly before it is written, and appended after what `out` holds.
    #[test]
    fn encoding_is_postcard_s_counted_first_and_appended_in_place() {
        let cmd = crate::raft::Command::PublishFrames {
            stream: "s".into(),
            seq: Some(9),
            ts: 1,
            auto_create: true,
            frames: vec![vec![1; 100 << 10].into(), bytes::Bytes::new(), vec![2; 3].into()],
        };
        let reference = postcard::to_stdvec(&cmd).unwrap();
        assert_eq!(encoded_len(&cmd).unwrap(), reference.len());
        let body = encode(&cmd).unwrap();
        assert_eq!(body, reference);
        assert_eq!(body.capacity(), body.len(), "one allocation of the final size");
        let mut out = b"head".to_vec();
        encode_append(&cmd, &mut out).unwrap();
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[4..], &reference[..]);
        assert_eq!(encode(&()).unwrap(), Vec::<u8>::new());
    }

    /// A data directory the node makes is its owner's only (mode 0700; it was 0755 under the
    /// usual umask, and a fresh user's trial found every payload file readable by any user);
    /// one that exists keeps its mode.
    #[test]
    fn a_new_data_directory_is_private_and_an_existing_one_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("a/b/data");
        drop(Store::open(&fresh).unwrap());
        assert_eq!((mode(&fresh), mode(&root.path().join("a"))), (0o700, 0o700));
        let existing = root.path().join("existing");
        std::fs::create_dir(&existing).unwrap();
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o750)).unwrap();
        drop(Store::open(&existing).unwrap());
        assert_eq!(mode(&existing), 0o750);
    }

    #[test]
    fn batch_value_round_trips_every_byte() {
        let payload: Vec<u8> = (0..=255u8).collect();
        let v = BatchValue::encode("orders", 7, 1_764_430_000_123, 42, &payload);
        let (ts, index, data) = BatchValue::decode("orders", 7, &v).unwrap();
        assert_eq!((ts, index, data), (1_764_430_000_123, 42, &payload[..]));
        assert!(BatchValue::decode("orders", 7, &v[..15]).is_err());
        assert!(BatchValue::decode("orders", 7, &v[..20]).is_err());
        for index in [0, (1 << 56) - 1, 1 << 56, u64::MAX] {
            let v = BatchValue::encode("orders", 9, u64::MAX, index, b"x");
            assert_eq!(BatchValue::decode("orders", 9, &v).unwrap(), (u64::MAX, index, &b"x"[..]));
        }
        let empty = BatchValue::encode("orders", 8, 0, 0, &[]);
        assert_eq!(BatchValue::decode("orders", 8, &empty).unwrap(), (0, 0, &[] as &[u8]));
    }

    #[test]
    fn a_flipped_bit_anywhere_in_a_batch_value_is_detected() {
        let payload: Vec<u8> = (0..64u8).collect();
        let v = BatchValue::encode("orders", 7, 1_764_430_000_123, 42, &payload);
        for bit in 0..v.len() * 8 {
            let mut flipped = v.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            match BatchValue::decode("orders", 7, &flipped) {
                Err(StoreError::Corrupt(msg)) => assert!(msg.contains("orders/7"), "{msg}"),
                other => panic!("bit {bit} flipped: {other:?}"),
            }
        }
        // The same value under another key fails too.
        assert!(matches!(BatchValue::decode("orders", 8, &v), Err(StoreError::Corrupt(_))));
        assert!(matches!(BatchValue::decode("order", 7, &v), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_format_1_batch_value_is_read_as_it_is() {
        let mut v = Vec::new();
        v.extend_from_slice(&1_764_430_000_123u64.to_le_bytes());
        v.extend_from_slice(&42u64.to_le_bytes());
        v.extend_from_slice(b"payload");
        assert_eq!(BatchValue::decode("orders", 7, &v).unwrap(), (1_764_430_000_123, 42, &b"payload"[..]));
    }

    /// Issue 15, room for many Raft groups: two groups in one data directory are two stores,
    /// each in its own directory under `groups/`, beside the node's one `FORMAT`; what one
    /// records (a vote, a catch-up marker, a formation) the other does not see, across a
    /// restart of both.
    #[test]
    fn two_groups_in_one_data_directory_keep_apart() {
        let dir = tempfile::tempdir().unwrap();
        let other = layout::GroupId(1);
        {
            let a = Store::open_group(dir.path(), layout::GroupId::CLUSTER).unwrap();
            let b = Store::open_group(dir.path(), other).unwrap();
            assert_eq!((a.group(), b.group()), (layout::GroupId::CLUSTER, other));
            assert_ne!(a.dir(), b.dir());
            a.mark_formed().unwrap();
            b.seed_wiped_vote(&openraft::Vote::new(7, 3)).unwrap();
        }
        let a = Store::open_group(dir.path(), layout::GroupId::CLUSTER).unwrap();
        let b = Store::open_group(dir.path(), other).unwrap();
        assert!(a.formed().unwrap() && !a.catching_up().unwrap(), "group 0 kept its own state only");
        assert!(!b.formed().unwrap() && b.catching_up().unwrap(), "group 1 kept its own state only");
        let mut top: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        top.sort();
        assert_eq!(top, [format::FORMAT_FILE, layout::GROUPS_DIR]);
        for g in [layout::GroupId::CLUSTER, other] {
            assert!(layout::group_dir(dir.path(), g).join(db_dir::DB_FILE).exists(), "group {g}");
        }
    }

    /// A start that fails leaves the directory in the format it found: here the database is held
    /// by a running node (of an earlier build, whose directory says format 1), and this build's
    /// open fails on redb's lock. It used to mark the directory format 2 first, so the running
    /// node would have refused its own directory at its next start.
    #[test]
    fn a_failed_open_leaves_the_format_it_found() {
        let dir = tempfile::tempdir().unwrap();
        let running = Store::open(dir.path()).unwrap();
        let format_file = dir.path().join(format::FORMAT_FILE);
        std::fs::write(&format_file, "runnev data format 1\n").unwrap();
        assert!(Store::open(dir.path()).is_err(), "the database is held");
        assert_eq!(std::fs::read_to_string(&format_file).unwrap(), "runnev data format 1\n");
        drop(running);
        drop(Store::open(dir.path()).unwrap());
        assert_eq!(
            std::fs::read_to_string(&format_file).unwrap(),
            format!("runnev data format {}\n", format::FORMAT_VERSION),
            "marked once it opened"
        );
    }
}

/// openraft's own storage test suite (`openraft::testing::Suite`), run against the redb stores:
/// log consistency, vote persistence, truncate and purge, membership, snapshot round trips.
#[cfg(test)]
mod openraft_suite {
    use openraft::testing::{StoreBuilder, Suite};

    use super::log_store::LogStore;
    use super::state_machine::StateMachine;
    use super::Store;
    use crate::raft::{StorageError, TypeConfig};

    struct RedbBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Store::open(dir.path()).expect("open store");
            Ok((dir, LogStore::new(store.clone()), StateMachine::new(store)))
        }
    }

    #[test]
    fn redb_store_passes_openraft_suite() {
        if let Err(e) = Suite::test_all(RedbBuilder) {
            panic!("openraft storage suite failed: {e}");
        }
    }
}
