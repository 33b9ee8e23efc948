//! Payload segments: every stream's batch payloads in append-only files, written once when the
//! state machine applies a publish and deleted whole by retention.
//!
//! Owns: the byte layout of payload segments, appending a batch's record, reading records back
//! by their location, making appended records durable ([`PayloadStore::sync`], which the state
//! machine calls before each durable commit of the rows that point at them), and recovery after
//! a crash ([`PayloadStore::open`]: cut each stream's newest segment back to what the durable
//! state refers to, remove segments it no longer refers to). Must never: let a durable state
//! refer to bytes that were not fsynced first; remove a segment that a durable state, or a
//! reader that started before the removal was decided, still refers to; or hand out a record
//! that fails its checksum or is not the one its location names.
//!
//! The idea is Kafka's and Redpanda's log segments (and WiscKey's split of keys from values,
//! FAST '16): the B-tree keeps the index, seq → [`Location`] (a few dozen bytes a batch), and
//! the payload bytes are written once, in seq order, to a file of their stream; retention
//! deletes whole files instead of rewriting B-tree pages, and a read of consecutive batches is
//! one sequential read. The Raft log still holds each payload until a snapshot lets it be
//! purged, so a payload is on disk twice only between a publish and the next snapshot.
//!
//! Layout (`payloads/` of the data directory, one directory per Raft group): a segment is named
//! by its stream's id and the seq of its first record, `<stream:016x>-<first seq:020>.seg`. A
//! record is a 32-byte header, then the payload: payload length (`u32` LE, bytes), CRC-32 (IEEE,
//! `u32` LE) of the stream id, seq, `ts`, log index and payload, the seq (`u64` LE), `ts` (ms
//! since the Unix epoch, `u64` LE), the log index of the entry that applied it (`u64` LE).
//! Records follow each other from offset 0 in seq order; a stream starts a new segment once its
//! current one holds [`crate::limits::PAYLOAD_SEGMENT_BYTES`]. Nothing is preallocated: a stream
//! with one small batch takes one small file.
//!
//! Durability: appends are written to the page cache only. [`PayloadStore::sync`] fsyncs every
//! segment appended to since the last sync; the state machine calls it before each durable
//! commit, so a durable state never points past the durable bytes. After a crash the database
//! opens at its last durable commit, which may be older than the files' tails:
//! [`PayloadStore::open`] cuts each stream's newest segment back to the end of the newest record
//! the database refers to and removes newer segments, and replaying the Raft log writes those
//! records again at the same offsets. Removal is deferred the same way
//! ([`PayloadStore::retire`], [`PayloadStore::durable`]): a segment leaves the disk only once the
//! state that stopped referring to it is durable, and only when no reader holds a
//! [`ReadGate`] taken before that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use super::segments::{FsSegment, SegmentFile};
use super::{le_u32, le_u64, StoreError};

/// Bytes of a record's header before its payload.
pub const HEADER_BYTES: u64 = 32;

/// Segment handles kept open besides those of segments appended to since the last sync, by
/// default ([`HandleBudget`]; a real directory sizes it from the open-file limit); past this
/// many, the least recently used are closed.
pub const OPEN_SEGMENTS_MAX: usize = 256;

/// Handles of segments appended to since the last sync kept open, by default
/// ([`HandleBudget`]): an append that needs one more closes them all, unsynced (they stay
/// dirty: the next sync makes them durable with one `syncfs(2)`, which needs no handle), so a
/// node appending to many streams keeps a bounded number of payload files open and syncs no
/// sooner than its durable commits ask (syncing here, inside the apply, once took a fifth of
/// the 10,000-stream benchmark's time on each node).
pub const DIRTY_SEGMENTS_MAX: usize = 256;

/// How many payload segment handles a store keeps open, in files: `cached` (the least recently
/// used closed first) and `dirty` (appended to since the last sync; past it they are closed
/// unsynced and handed to [`PayloadDir::write_behind`], which may hold
/// [`WRITE_BEHIND_BATCHES`] such batches). At most `cached + dirty × (1 + WRITE_BEHIND_BATCHES)`
/// payload files are open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleBudget {
    /// Handles of segments kept for reads and appends.
    pub cached: usize,
    /// Handles of segments appended to since the last sync.
    pub dirty: usize,
}

impl Default for HandleBudget {
    /// [`OPEN_SEGMENTS_MAX`] and [`DIRTY_SEGMENTS_MAX`]: what a directory that names no budget
    /// (the simulation's) gets.
    fn default() -> HandleBudget {
        HandleBudget { cached: OPEN_SEGMENTS_MAX, dirty: DIRTY_SEGMENTS_MAX }
    }
}

impl HandleBudget {
    /// Fewest handles of either kind, whatever the limit.
    const FLOOR: usize = 16;
    /// Most cached handles, whatever the limit (a closed handle costs one `open`, not more).
    const CACHED_CEILING: usize = 16_384;

    /// The budget for a process whose soft limit on open files is `soft` (files): half of it
    /// for payload segments (the rest for connections, the Raft log, redb and snapshots), of
    /// which half cached, and dirty handles a sixth so that with the write-behind's batches
    /// they stay within the other half. 1,024 gives 256 cached and 85 dirty; 20,000 gives
    /// 5,000 and 1,666.
    pub fn for_open_file_limit(soft: u64) -> HandleBudget {
        let half = usize::try_from(soft / 2).unwrap_or(usize::MAX);
        let cached = (half / 2).clamp(Self::FLOOR, Self::CACHED_CEILING);
        let dirty = (half / 2 / (1 + WRITE_BEHIND_BATCHES)).clamp(Self::FLOOR, Self::CACHED_CEILING / 4);
        HandleBudget { cached, dirty }
    }
}

/// A payload segment's name: its stream's id and the seq of its first record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentKey {
    /// The stream's id (assigned by the state machine when the stream is created; never reused).
    pub stream: u64,
    /// The seq of the segment's first record.
    pub first: u64,
}

impl SegmentKey {
    /// The file name of this segment, `<stream:016x>-<first:020>.seg`.
    pub fn file_name(&self) -> String {
        format!("{:016x}-{:020}.seg", self.stream, self.first)
    }

    /// The key a file name made by [`SegmentKey::file_name`] names, or `None` for any other name.
    pub fn parse(name: &str) -> Option<SegmentKey> {
        let (stream, first) = name.strip_suffix(".seg")?.split_once('-')?;
        if stream.len() != 16 || first.len() != 20 {
            return None;
        }
        Some(SegmentKey { stream: u64::from_str_radix(stream, 16).ok()?, first: first.parse().ok()? })
    }
}

/// The directory of payload segments: the seam between [`PayloadStore`] and a file system (the
/// real one, [`FsPayloads`]; the simulation's, which loses unsynced writes on a crash).
pub trait PayloadDir: Send + Sync {
    /// Every segment present, in any order.
    fn list(&self) -> io::Result<Vec<SegmentKey>>;
    /// Opens segment `key` for reading and writing.
    fn open(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>>;
    /// Creates segment `key` empty, replacing any file of that name. Not durable by itself:
    /// the next [`PayloadDir::sync_files`] and [`PayloadDir::sync_dir`] make it so, before any
    /// durable state refers to it (a segment created per new stream costs no fsync of its own).
    fn create(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>>;
    /// Removes segment `key`. Not durable by itself, and need not be: a segment is removed
    /// only once no durable state refers to it, so one that a crash brings back is removed again
    /// at the next open ([`PayloadStore::open`]).
    fn remove(&self, key: SegmentKey) -> io::Result<()>;
    /// Sets segment `key`'s length to `len` bytes, durably (recovery cuts a tail that the
    /// durable state does not refer to).
    fn truncate(&self, key: SegmentKey, len: u64) -> io::Result<()>;
    /// Makes every write so far to the segments `dirty` names durable; each comes with its
    /// handle when one is still open (`None`: it was closed unsynced, [`HandleBudget::dirty`]).
    /// By default each file's `fdatasync` in turn, opening the closed ones again;
    /// [`FsPayloads`] syncs the whole file system once when there are many or any was closed.
    fn sync_files(&self, dirty: &[(SegmentKey, Option<&Arc<dyn SegmentFile>>)]) -> io::Result<()> {
        dirty.iter().try_for_each(|(key, file)| match file {
            Some(f) => f.sync_data(),
            None => self.open(*key)?.sync_data(),
        })
    }
    /// Makes the segments created so far durable in the directory (`fsync` of the directory).
    fn sync_dir(&self) -> io::Result<()>;
    /// Takes handles of segments appended to and not synced that the store closes
    /// ([`HandleBudget::dirty`]), or that had [`WRITE_BEHIND_AFTER_BYTES`] appended since their
    /// last hint (the store keeps those open), to start their write-back away from the caller
    /// ([`SegmentFile::start_writeback`]): only a hint, so the next sync finds less to write.
    /// By default they are dropped at once.
    fn write_behind(&self, files: Vec<Arc<dyn SegmentFile>>) {
        drop(files);
    }
    /// How many handles a store over this directory keeps open. By default
    /// [`HandleBudget::default`].
    fn handle_budget(&self) -> HandleBudget {
        HandleBudget::default()
    }
}

/// Bytes [`PayloadStore::read_span`] reads at a time.
pub const SPAN_READ_BYTES: u64 = 4 << 20;

/// Above this many segments appended to since the last sync, [`FsPayloads`] makes them durable
/// with one `syncfs(2)` of the payload directory's file system instead of an `fdatasync` each:
/// with many streams a durable commit may find thousands of segments appended to, and each
/// `fdatasync` of a grown file commits the file system's journal (about 0.1–3 ms here), where
/// one `syncfs` commits it once.
pub const SYNCFS_ABOVE_FILES: usize = 16;

/// Batches of closed handles [`FsPayloads`]' write-behind thread may hold, each of at most
/// [`HandleBudget::dirty`] handles: past them a batch is closed without the hint (open files
/// stay bounded).
pub const WRITE_BEHIND_BATCHES: usize = 2;

/// Bytes appended to one payload segment after which the store hands its handle to
/// [`PayloadDir::write_behind`] to start its write-back, though it stays open and dirty: the
/// durable commit's fsync (every 1,000 entries or 64 MiB applied, inside the apply) then finds
/// little left to write. PostgreSQL starts the write-back of its checkpoint writes every 256 kB
/// the same way (`checkpoint_flush_after`, `sync_file_range(2)`).
pub const WRITE_BEHIND_AFTER_BYTES: u64 = 256 * 1024;

/// The write-behind thread's end of [`FsPayloads`]' hand-off: batches of closed handles.
type WriteBehindSender = std::sync::mpsc::SyncSender<Vec<Arc<dyn SegmentFile>>>;

/// Payload segments as files in a directory of the real file system.
pub struct FsPayloads {
    dir: PathBuf,
    /// The directory, open since [`FsPayloads::new`]: `syncfs` on it reports a write-back error
    /// of the file system since it was opened (an error's first reader sees it; a descriptor
    /// opened later would miss one that another reader saw first), and `fsync` on it makes
    /// created segments' names durable.
    dir_file: std::fs::File,
    /// Hands closed handles to the write-behind thread, started on first use.
    write_behind: Mutex<Option<WriteBehindSender>>,
    /// From the soft open-file limit when it was made ([`crate::open_files`]).
    budget: HandleBudget,
}

impl FsPayloads {
    /// Segments under `dir`, which is created if missing; the handles a store keeps open are
    /// sized from the process's soft open-file limit now ([`HandleBudget::for_open_file_limit`];
    /// the default budget when it cannot be read).
    ///
    /// Errors: the directory cannot be created or opened.
    pub fn new(dir: PathBuf) -> io::Result<FsPayloads> {
        std::fs::create_dir_all(&dir)?;
        let dir_file = std::fs::File::open(&dir)?;
        let budget =
            crate::open_files::limits().map(|(soft, _)| HandleBudget::for_open_file_limit(soft)).unwrap_or_default();
        Ok(FsPayloads { dir, dir_file, write_behind: Mutex::new(None), budget })
    }

    /// The sender to the write-behind thread, starting it if it is not running. The thread
    /// ends when the sender is dropped with this `FsPayloads`.
    fn write_behind_sender(&self) -> io::Result<WriteBehindSender> {
        let mut slot = self.write_behind.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = slot.as_ref() {
            return Ok(tx.clone());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Arc<dyn SegmentFile>>>(WRITE_BEHIND_BATCHES);
        std::thread::Builder::new().name("runnev-write-behind".into()).spawn(move || {
            for files in rx {
                for f in files {
                    if let Err(e) = f.start_writeback() {
                        tracing::debug!(error = %e, "starting a payload segment's write-back failed; its sync will write it");
                    }
                }
            }
        })?;
        *slot = Some(tx.clone());
        Ok(tx)
    }

    fn path(&self, key: SegmentKey) -> PathBuf {
        self.dir.join(key.file_name())
    }
}

impl PayloadDir for FsPayloads {
    fn list(&self) -> io::Result<Vec<SegmentKey>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            if let Some(key) = SegmentKey::parse(&e?.file_name().to_string_lossy()) {
                out.push(key);
            }
        }
        Ok(out)
    }
    fn open(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.path(key))?;
        Ok(Arc::new(FsSegment::payload(f)))
    }
    fn create(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(self.path(key))?;
        Ok(Arc::new(FsSegment::payload(f)))
    }
    fn remove(&self, key: SegmentKey) -> io::Result<()> {
        std::fs::remove_file(self.path(key))
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.dir_file.sync_all()
    }
    fn handle_budget(&self) -> HandleBudget {
        self.budget
    }
    /// Sends `files` to the write-behind thread; when it is busy with
    /// [`WRITE_BEHIND_BATCHES`] batches already, or cannot start, closes them here.
    fn write_behind(&self, files: Vec<Arc<dyn SegmentFile>>) {
        match self.write_behind_sender() {
            Ok(tx) => drop(tx.try_send(files)),
            Err(e) => tracing::debug!(error = %e, "the payload write-behind thread did not start"),
        }
    }
    fn truncate(&self, key: SegmentKey, len: u64) -> io::Result<()> {
        self.open(key)?.zero_from(len)
    }
    /// One `syncfs(2)` above [`SYNCFS_ABOVE_FILES`] files or when any was closed unsynced
    /// (timed into `runnev_payload_syncfs_seconds`): it writes back and waits for every dirty
    /// page of the file system, closed files' included, then commits its journal, and reports a
    /// write-back error of any file since Linux 5.8 (the file system's error sequence, not the
    /// descriptor's). Otherwise an `fdatasync` per file.
    fn sync_files(&self, dirty: &[(SegmentKey, Option<&Arc<dyn SegmentFile>>)]) -> io::Result<()> {
        if dirty.len() <= SYNCFS_ABOVE_FILES && dirty.iter().all(|(_, f)| f.is_some()) {
            return dirty.iter().filter_map(|(_, f)| *f).try_for_each(|f| f.sync_data());
        }
        use std::os::fd::AsRawFd;
        let started = std::time::Instant::now();
        // SAFETY: a plain system call on a descriptor `self` owns for the call's duration.
        let rc = unsafe { libc::syncfs(self.dir_file.as_raw_fd()) };
        metrics::histogram!("runnev_payload_syncfs_seconds").record(started.elapsed().as_secs_f64());
        match rc {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// Where a batch's record lives: the part of the state machine's row for (stream, seq) that
/// names its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Location {
    /// The seq of the first record of the segment holding it (the segment's name).
    pub segment: u64,
    /// Offset of the record's header in the segment, in bytes.
    pub offset: u64,
    /// The payload's length, in bytes (the record takes [`HEADER_BYTES`] more).
    pub len: u32,
}

impl Location {
    /// Bytes of [`Location::encode`]'s output.
    pub const ENCODED_BYTES: usize = 20;

    /// Fixed-width little-endian encoding: segment, offset, len.
    pub fn encode(&self) -> [u8; Self::ENCODED_BYTES] {
        let mut out = [0u8; Self::ENCODED_BYTES];
        out[..8].copy_from_slice(&self.segment.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes [`Location::encode`]'s output; `None` when `b` is not [`Location::ENCODED_BYTES`]
    /// long.
    pub fn decode(b: &[u8]) -> Option<Location> {
        if b.len() != Self::ENCODED_BYTES {
            return None;
        }
        Some(Location { segment: le_u64(&b[..8]), offset: le_u64(&b[8..16]), len: le_u32(&b[16..]) })
    }

    /// The offset just past the record, in bytes (saturating: a location read from disk is not
    /// trusted to be sane).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(HEADER_BYTES).saturating_add(u64::from(self.len))
    }
}

/// One record as read back, borrowing its payload from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The batch's seq.
    pub seq: u64,
    /// The batch's `ts`, ms since the Unix epoch.
    pub ts: u64,
    /// The log index of the entry that applied it.
    pub index: u64,
    /// The payload, byte for byte.
    pub payload: &'a [u8],
}

fn checksum(stream: u64, seq: u64, ts: u64, index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for word in [stream, seq, ts, index] {
        h.update(&word.to_le_bytes());
    }
    h.update(payload);
    h.finalize()
}

/// The seq of record `k` of a run starting at `first_seq`.
fn seq_at(stream: u64, first_seq: u64, k: usize) -> Result<u64, StoreError> {
    (k as u64).checked_add(first_seq).ok_or_else(|| {
        StoreError::Corrupt(format!("payload stream {stream:x}: a run from seq {first_seq} passes u64::MAX"))
    })
}

fn encode_header(stream: u64, seq: u64, ts: u64, index: u64, payload: &[u8]) -> Result<[u8; 32], StoreError> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        StoreError::Corrupt(format!("a payload of {} bytes is over the 4 GiB a record frames", payload.len()))
    })?;
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[4..8].copy_from_slice(&checksum(stream, seq, ts, index, payload).to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..24].copy_from_slice(&ts.to_le_bytes());
    h[24..32].copy_from_slice(&index.to_le_bytes());
    Ok(h)
}

/// Checks the record at the start of `buf` against what its row says (`seq`, `len`) and its
/// checksum, and returns it.
///
/// Errors: [`StoreError::Corrupt`] when `buf` is shorter than the record, or the record is not
/// the one the row names, or its bytes changed since they were written.
pub fn parse_record(stream: u64, seq: u64, len: u32, buf: &[u8]) -> Result<Record<'_>, StoreError> {
    let total = HEADER_BYTES as usize + len as usize;
    let Some(rec) = buf.get(..total) else {
        return Err(StoreError::Corrupt(format!(
            "payload {stream:x}/{seq}: {} bytes read, the record takes {total}",
            buf.len()
        )));
    };
    let (stored_len, sum) = (le_u32(&rec[..4]), le_u32(&rec[4..8]));
    let (rec_seq, ts, index) = (le_u64(&rec[8..16]), le_u64(&rec[16..24]), le_u64(&rec[24..32]));
    let payload = &rec[HEADER_BYTES as usize..];
    if stored_len != len || rec_seq != seq {
        return Err(StoreError::Corrupt(format!(
            "payload {stream:x}/{seq}: the record there is seq {rec_seq} of {stored_len} bytes, not seq {seq} of {len}"
        )));
    }
    let computed = checksum(stream, seq, ts, index, payload);
    if computed != sum {
        return Err(StoreError::Corrupt(format!(
            "payload {stream:x}/{seq} fails its checksum (stored {sum:08x}, computed {computed:08x}): \
             its bytes changed since they were written"
        )));
    }
    Ok(Record { seq, ts, index, payload })
}

/// What the durable state says of one stream's payloads, for [`PayloadStore::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The stream's id.
    pub stream: u64,
    /// The segment of its oldest retained batch.
    pub first_segment: u64,
    /// The location of its newest batch.
    pub last: Location,
}

/// One stream's retained batches as a snapshot refers to them (a snapshot manifest's entry,
/// [`super::snapshot`]): the records from `first` through `last`, adjacent in seq order across
/// the stream's segments from `first.segment` through `last.segment`. Retention and deletion
/// remove a stream's oldest batches only, and records are appended in seq order, so every
/// record between the two is a retained batch and the span alone names them all, whatever their
/// number. Its segments are pinned ([`PayloadStore::pin`]) while a snapshot refers to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Span {
    /// The stream's id.
    pub stream: u64,
    /// The seq of its oldest retained batch.
    pub first_seq: u64,
    /// Where that batch's record is.
    pub first: Location,
    /// The seq of its newest batch.
    pub last_seq: u64,
    /// Where that batch's record is; the span's bytes end at `last.end()`.
    pub last: Location,
    /// How many batches the span holds (the stream's retained batches): checked on reading, so
    /// a segment missing from the middle of a span is not taken for a gap in sparse seqs.
    pub batches: u64,
    /// The sum of their payload lengths, in bytes (checked likewise).
    pub bytes: u64,
}

impl Span {
    /// Whether segment `key` holds records of this span.
    pub fn covers(&self, key: SegmentKey) -> bool {
        key.stream == self.stream && (self.first.segment..=self.last.segment).contains(&key.first)
    }
}

/// A set of pinned spans ([`PayloadStore::pin`]), to hand back to [`PayloadStore::unpin`].
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
pub struct PinId(u64);

/// The segment a stream appends to (its handle, when open, is in the handle cache or the
/// dirty set: a node with many streams keeps a bounded number of files open).
struct Active {
    first: u64,
    /// Offset just past its last record, in bytes.
    end: u64,
}

#[derive(Default)]
struct Inner {
    /// Every segment on disk that is not retired.
    live: BTreeSet<SegmentKey>,
    /// Each stream's newest segment, once appended to or recovered.
    active: HashMap<u64, Active>,
    /// Segments appended to since the last [`PayloadStore::sync`], with their handles while
    /// open (closed unsynced past [`HandleBudget::dirty`]).
    dirty: BTreeMap<SegmentKey, Option<Arc<dyn SegmentFile>>>,
    /// The segments of `dirty` whose handles are open, at most `budget.dirty`.
    dirty_open: Vec<SegmentKey>,
    /// Bytes appended to each segment of `dirty` since its last write-back hint, while under
    /// [`WRITE_BEHIND_AFTER_BYTES`].
    unhinted: HashMap<SegmentKey, u64>,
    /// How many handles to keep open ([`PayloadDir::handle_budget`]).
    budget: HandleBudget,
    /// Retired segments that a state not yet durable may still refer to.
    retired: BTreeSet<SegmentKey>,
    /// Retired segments that no durable state refers to: removed once no reader is in.
    removable: BTreeSet<SegmentKey>,
    /// Open handles of sealed segments, with the tick of their last use.
    handles: HashMap<SegmentKey, (Arc<dyn SegmentFile>, u64)>,
    /// An fsync failed: nothing appended since the last good sync can be trusted on disk.
    sync_failed: bool,
    /// A segment was created since the last [`PayloadStore::sync`]: its directory entry is not
    /// durable yet.
    created: bool,
    tick: u64,
    /// Spans that snapshots (the current one, and any being sent) refer to: their segments are
    /// not removed, even once retired ([`PayloadStore::pin`]).
    pins: BTreeMap<PinId, Vec<Span>>,
    next_pin: u64,
}

impl Inner {
    fn pinned(&self, key: SegmentKey) -> bool {
        self.pins.values().flatten().any(|s| s.covers(key))
    }

    /// Notes that `file`, segment `key`, was appended to: it stays dirty until the next sync,
    /// and open unless `budget.dirty` others are (then those are closed, unsynced,
    /// and their handles returned for [`PayloadDir::write_behind`]).
    #[must_use = "hand the closed handles to PayloadDir::write_behind"]
    fn appended(&mut self, key: SegmentKey, file: Arc<dyn SegmentFile>) -> Vec<Arc<dyn SegmentFile>> {
        if let Some(Some(_)) = self.dirty.get(&key) {
            return Vec::new();
        }
        let mut closed = Vec::new();
        if self.dirty_open.len() >= self.budget.dirty {
            closed.reserve(self.dirty_open.len());
            for k in self.dirty_open.drain(..) {
                if let Some(f) = self.dirty.get_mut(&k).and_then(Option::take) {
                    closed.push(f);
                }
            }
        }
        self.dirty.insert(key, Some(file));
        self.dirty_open.push(key);
        debug_assert!(self.dirty_open.len() <= self.budget.dirty);
        closed
    }

    fn pin(&mut self, spans: Vec<Span>) -> PinId {
        self.next_pin = self.next_pin.wrapping_add(1);
        let id = PinId(self.next_pin);
        self.pins.insert(id, spans);
        id
    }
}

/// The payload segments of one Raft group.
pub struct PayloadStore {
    dir: Arc<dyn PayloadDir>,
    /// A stream starts a new segment once its current one holds this many bytes.
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// Readers hold it shared from before their database read until their last file read;
    /// removing segments takes it exclusively, without waiting.
    gate: RwLock<()>,
}

/// Held by a reader from before it opens its database read until it has read the records that
/// read named: no segment is removed meanwhile ([`PayloadStore::read_gate`]). The last reader
/// out removes what became removable while readers were in.
pub struct ReadGate<'a> {
    guard: Option<RwLockReadGuard<'a, ()>>,
    store: &'a PayloadStore,
}

impl Drop for ReadGate<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.store.remove_removable();
    }
}

/// The segments retired before a durable commit began ([`PayloadStore::seal`]): removable once
/// that commit is durable ([`PayloadStore::durable`]), retired again if it fails
/// ([`PayloadStore::unseal`]).
#[must_use = "hand it to durable() after the commit, or to unseal() if the commit failed"]
pub struct Sealed(BTreeSet<SegmentKey>);

impl PayloadStore {
    /// Opens the segments in `dir` against the durable state's `extents` (one per stream that
    /// holds at least one batch): for each stream, its newest segment is cut back to the end of
    /// its newest record; segments of streams with no extent, and segments before an extent's
    /// first or after its last, are removed (the durable state does not refer to them: they
    /// were retired, or written after its commit and will be written again by the log's replay).
    /// New segments are started once they hold `segment_bytes`.
    ///
    /// Errors: I/O on the directory; [`StoreError::Corrupt`] when a segment an extent refers to
    /// is missing, or shorter than the extent's last record (the durable state refers to bytes
    /// that are gone).
    pub fn open(dir: Arc<dyn PayloadDir>, segment_bytes: u64, extents: &[Extent]) -> Result<PayloadStore, StoreError> {
        Ok(PayloadStore::open_pinned(dir, segment_bytes, extents, Vec::new())?.0)
    }

    /// [`PayloadStore::open`], with the spans of the current snapshot pinned from the start
    /// ([`PayloadStore::pin`]): their segments stay on disk even where the durable state no
    /// longer refers to them (retired since the snapshot, or the state is behind it), and no
    /// newest segment is cut below a pinned span's end. Returns the pin of `pins`.
    ///
    /// Errors: as [`PayloadStore::open`].
    pub fn open_pinned(
        dir: Arc<dyn PayloadDir>,
        segment_bytes: u64,
        extents: &[Extent],
        pins: Vec<Span>,
    ) -> Result<(PayloadStore, PinId), StoreError> {
        let by_stream: HashMap<u64, &Extent> = extents.iter().map(|e| (e.stream, e)).collect();
        let mut inner = Inner { budget: dir.handle_budget(), ..Inner::default() };
        let pin = inner.pin(pins);
        for key in dir.list()? {
            let keep =
                by_stream.get(&key.stream).is_some_and(|e| (e.first_segment..=e.last.segment).contains(&key.first));
            if keep {
                inner.live.insert(key);
            } else if inner.pinned(key) {
                // Removed once no snapshot refers to it.
                inner.removable.insert(key);
            } else {
                tracing::debug!(segment = %key.file_name(), "removing a payload segment the durable state does not refer to");
                dir.remove(key)?;
            }
        }
        // The end of each span's last record, by its segment: looked up once per extent.
        let mut pinned_ends: HashMap<SegmentKey, u64> = HashMap::new();
        for s in inner.pins.values().flatten() {
            let end = pinned_ends.entry(SegmentKey { stream: s.stream, first: s.last.segment }).or_default();
            *end = (*end).max(s.last.end());
        }
        for e in extents {
            for first in [e.first_segment, e.last.segment] {
                if !inner.live.contains(&SegmentKey { stream: e.stream, first }) {
                    return Err(StoreError::Corrupt(format!(
                        "payload segment {} is missing; the state machine refers to it",
                        SegmentKey { stream: e.stream, first }.file_name()
                    )));
                }
            }
            let key = SegmentKey { stream: e.stream, first: e.last.segment };
            let end = e.last.end();
            let len = dir.open(key)?.capacity()?;
            if len < end {
                return Err(StoreError::Corrupt(format!(
                    "payload segment {} holds {len} bytes; the state machine refers to {end}",
                    key.file_name()
                )));
            }
            // Never below what a snapshot refers to (a state behind its snapshot is restored
            // from it before anything is appended: `snapshot::restore_state_machine`).
            let pinned_end = pinned_ends.get(&key).copied().unwrap_or(0);
            let cut = end.max(pinned_end.min(len));
            if len > cut {
                dir.truncate(key, cut)?;
            }
            inner.active.insert(e.stream, Active { first: key.first, end });
        }
        let store =
            PayloadStore { dir, segment_bytes: segment_bytes.max(1), inner: Mutex::new(inner), gate: RwLock::new(()) };
        Ok((store, pin))
    }

    /// Pins `spans`: no segment holding their records is removed until [`PayloadStore::unpin`],
    /// even once retired (a snapshot refers to them: the current one, or one being sent).
    /// Returns the pin to hand back.
    pub fn pin(&self, spans: Vec<Span>) -> PinId {
        self.inner().pin(spans)
    }

    /// Releases a pin of [`PayloadStore::pin`]; retired segments it alone kept are handed for
    /// removal now (or once no reader is in; [`PayloadStore::durable`]).
    pub fn unpin(&self, pin: PinId) {
        self.inner().pins.remove(&pin);
        self.remove_removable();
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends the record of batch `seq` of `stream` to the stream's newest segment (a new one
    /// when there is none or it is full) and returns its location. Written to the page cache
    /// only: durable after the next [`PayloadStore::sync`]. Seqs of a stream must be appended in
    /// increasing order (the state machine applies them so).
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] for a payload over 4 GiB (the state machine's limits
    /// keep payloads far smaller).
    pub fn append(&self, stream: u64, seq: u64, ts: u64, index: u64, payload: &[u8]) -> Result<Location, StoreError> {
        let mut locations = self.append_run(stream, seq, ts, index, &[payload])?;
        match (locations.pop(), locations.is_empty()) {
            (Some(location), true) => Ok(location),
            _ => Err(StoreError::Corrupt(format!("payload {stream:x}/{seq}: one record appended, not one location"))),
        }
    }

    /// Appends batches `first_seq`, `first_seq + 1`, … of `stream`, one per payload, all with
    /// `ts` (ms since the Unix epoch) and log `index` (a frames publish, SPEC §6), and returns
    /// their locations in order. The records going to one segment are written with one `pwrite`:
    /// a record per call left the kernel zeroing the rest of each new file block before the
    /// next record filled it, and took one system call per 1 KiB batch (a third of a node's
    /// CPU in a profile of 100 frames per request). Otherwise as [`PayloadStore::append`]: the
    /// stream rolls to a new segment wherever the next record would pass
    /// [`crate::limits::PAYLOAD_SEGMENT_BYTES`], and nothing is durable before the next sync.
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] for a payload over 4 GiB or seqs past `u64::MAX`.
    /// After an error some of the records may be in the page cache; the caller's transaction
    /// does not commit, and recovery cuts what no durable row points at.
    pub fn append_run(
        &self,
        stream: u64,
        first_seq: u64,
        ts: u64,
        index: u64,
        payloads: &[&[u8]],
    ) -> Result<Vec<Location>, StoreError> {
        let mut locations = Vec::with_capacity(payloads.len());
        // Handles whose write-back to start (closed past the budget, or written past the hint).
        let mut write_back = Vec::new();
        // Record bytes not yet written: with the room left in a segment, the size of its run.
        let mut left = payloads.iter().fold(0u64, |sum, p| sum.saturating_add(HEADER_BYTES + p.len() as u64));
        let mut inner = self.inner();
        let mut next = 0usize;
        while let Some(&head) = payloads.get(next) {
            let seq = seq_at(stream, first_seq, next)?;
            let roll = match inner.active.get(&stream) {
                None => true,
                Some(a) => a.end > 0 && a.end.saturating_add(HEADER_BYTES + head.len() as u64) > self.segment_bytes,
            };
            let created = match roll {
                false => None,
                true => {
                    let key = SegmentKey { stream, first: seq };
                    debug_assert!(
                        inner.active.get(&stream).is_none_or(|a| a.first < seq),
                        "a stream's segments start at increasing seqs"
                    );
                    let file = self.dir.create(key)?;
                    inner.created = true;
                    inner.live.insert(key);
                    inner.active.insert(stream, Active { first: seq, end: 0 });
                    Some(file)
                }
            };
            let Some(&Active { first, end: start }) = inner.active.get(&stream) else {
                return Err(StoreError::Corrupt(format!(
                    "payload stream {stream:x} has no segment after one was made"
                )));
            };
            let key = SegmentKey { stream, first };
            let file = match (created, inner.dirty.get(&key)) {
                (Some(f), _) => f,
                (None, Some(Some(f))) => f.clone(),
                (None, _) => self.handle_in(&mut inner, key)?,
            };
            // The records from `next` on that this segment takes: the first always (the roll
            // above made room, or the segment is empty), the rest while they fit.
            let left_before = left;
            let room = self.segment_bytes.saturating_sub(start).max(HEADER_BYTES + head.len() as u64);
            let mut run = Vec::with_capacity(usize::try_from(left.min(room)).unwrap_or(0));
            let mut end = start;
            while let Some(&payload) = payloads.get(next) {
                let len = HEADER_BYTES + payload.len() as u64;
                if !run.is_empty() && end.saturating_add(len) > self.segment_bytes {
                    break;
                }
                let seq = seq_at(stream, first_seq, next)?;
                run.extend_from_slice(&encode_header(stream, seq, ts, index, payload)?);
                run.extend_from_slice(payload);
                locations.push(Location { segment: first, offset: end, len: payload.len() as u32 });
                end = end.saturating_add(len);
                left = left.saturating_sub(len);
                next += 1;
            }
            debug_assert_eq!(start.saturating_add(run.len() as u64), end, "a run's records are adjacent");
            debug_assert!(run.len() as u64 <= left_before.min(room), "the run was sized for its records");
            file.write_at(start, &run)?;
            if let Some(a) = inner.active.get_mut(&stream) {
                a.end = end;
            }
            let written = inner.unhinted.entry(key).or_default();
            *written = written.saturating_add(run.len() as u64);
            if *written >= WRITE_BEHIND_AFTER_BYTES {
                inner.unhinted.remove(&key);
                write_back.push(file.clone());
            }
            write_back.extend(inner.appended(key, file));
        }
        drop(inner);
        if !write_back.is_empty() {
            self.dir.write_behind(write_back);
        }
        debug_assert_eq!(locations.len(), payloads.len());
        Ok(locations)
    }

    /// Makes every record appended so far durable (`fdatasync` of each segment appended to since
    /// the last call). Call it before a durable commit of rows that point at those records.
    ///
    /// Errors: I/O. A failed fsync poisons the store: every later call fails too, until the
    /// node restarts and recovers from the durable state and the log. After a failed fsync the
    /// kernel may have dropped the dirty pages and cleared the error, so a retry that succeeds
    /// proves nothing (PostgreSQL's "fsyncgate", 2018).
    pub fn sync(&self) -> Result<(), StoreError> {
        let dirty = {
            let mut inner = self.inner();
            if inner.sync_failed {
                return Err(StoreError::Io(io::Error::other(
                    "an earlier fsync of a payload segment failed; restart the node to recover",
                )));
            }
            inner.dirty_open.clear();
            inner.unhinted.clear();
            (std::mem::take(&mut inner.dirty), std::mem::take(&mut inner.created))
        };
        let (dirty, created) = dirty;
        let files: Vec<(SegmentKey, Option<&Arc<dyn SegmentFile>>)> =
            dirty.iter().map(|(k, f)| (*k, f.as_ref())).collect();
        let synced = self.dir.sync_files(&files).and_then(|()| if created { self.dir.sync_dir() } else { Ok(()) });
        if let Err(e) = synced {
            self.inner().sync_failed = true;
            return Err(e.into());
        }
        Ok(())
    }

    /// Retires every segment of `stream` before the one whose first seq is `keep_from` (`None`:
    /// every segment, for a stream deleted or left with no batch). A retired segment is removed
    /// once the state that no longer refers to it is durable ([`PayloadStore::durable`]).
    pub fn retire(&self, stream: u64, keep_from: Option<u64>) {
        let mut inner = self.inner();
        let end = keep_from.unwrap_or(u64::MAX);
        let doomed: Vec<SegmentKey> = inner
            .live
            .range(SegmentKey { stream, first: 0 }..=SegmentKey { stream, first: u64::MAX })
            .filter(|k| k.first < end || keep_from.is_none())
            .copied()
            .collect();
        for key in doomed {
            inner.live.remove(&key);
            inner.handles.remove(&key);
            // Its bytes appended since the last sync need not become durable: the states that
            // refer to them are not durable, and the one that retired it drops them.
            if inner.dirty.remove(&key).is_some() {
                inner.dirty_open.retain(|k| *k != key);
            }
            inner.unhinted.remove(&key);
            if inner.active.get(&stream).is_some_and(|a| a.first == key.first) {
                inner.active.remove(&stream);
            }
            inner.retired.insert(key);
        }
    }

    /// Takes the segments retired so far, to be removed once the durable commit about to be
    /// made has committed. Call it while holding the database's write transaction: every
    /// retirement so far followed the commit that stopped referring to its segment, so that
    /// commit precedes the durable one and is persisted by it. (Retirements after this call wait
    /// for the next durable commit.)
    pub fn seal(&self) -> Sealed {
        Sealed(std::mem::take(&mut self.inner().retired))
    }

    /// Puts back the segments of a durable commit that failed: they wait for the next one.
    pub fn unseal(&self, sealed: Sealed) {
        self.inner().retired.extend(sealed.0);
    }

    /// Tells the store that the durable commit `sealed` was taken for has committed: its
    /// segments may go, and are handed for removal now unless a reader is in (then when the
    /// last reader leaves, or at a later call). Nobody waits for the removal itself
    /// ([`PayloadStore::remove_removable`]).
    pub fn durable(&self, sealed: Sealed) {
        self.inner().removable.extend(sealed.0);
        self.remove_removable();
    }

    /// Hands the removable segments no pin holds to tokio's blocking pool for removal, unless
    /// a reader is in (then the last reader out, or a later call, does). Nothing waits for the
    /// removal ([`super::io::behind`]; inline under the simulation and outside a runtime): it
    /// used to run inside the durable commit of the apply, or in a reader's drop, and unlinking a
    /// 16 MiB segment on a file system that discards freed blocks takes milliseconds, so a
    /// deleted stream of a few GiB held every write for seconds. Removing them after the read
    /// gate is released is safe: a reader that takes the gate later makes its database read
    /// after the commit that retired them, which no longer refers to them. Its time goes to
    /// `runnev_payload_segment_remove_seconds`; a failure to the log, and the next start removes
    /// what is left ([`PayloadStore::open`] removes every segment the durable state does not
    /// refer to).
    fn remove_removable(&self) {
        if self.inner().removable.is_empty() {
            return;
        }
        let Ok(_excl) = self.gate.try_write() else { return };
        let removable = {
            let mut inner = self.inner();
            let (pinned, free): (BTreeSet<SegmentKey>, BTreeSet<SegmentKey>) =
                std::mem::take(&mut inner.removable).into_iter().partition(|k| inner.pinned(*k));
            inner.removable = pinned;
            free
        };
        if removable.is_empty() {
            return;
        }
        let dir = Arc::clone(&self.dir);
        super::io::behind(move || {
            let started = std::time::Instant::now();
            for key in removable {
                match dir.remove(key) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(
                        segment = %key.file_name(),
                        error = %e,
                        "removing a retired payload segment failed; the next start removes it"
                    ),
                }
            }
            metrics::histogram!("runnev_payload_segment_remove_seconds").record(started.elapsed().as_secs_f64());
        });
    }

    /// Takes the read gate: hold it from before the database read whose locations the caller
    /// will read until the last [`PayloadStore::read`] of them.
    pub fn read_gate(&self) -> ReadGate<'_> {
        ReadGate { guard: Some(self.gate.read().unwrap_or_else(|p| p.into_inner())), store: self }
    }

    /// Reads `bytes` bytes of segment `segment` of `stream` from `offset` (the records of
    /// consecutive batches are adjacent, so one call reads a run of them; split them with
    /// [`parse_record`]).
    ///
    /// Errors: I/O, or [`StoreError::Corrupt`] when the segment is missing or shorter.
    pub fn read(
        &self,
        _gate: &ReadGate<'_>,
        stream: u64,
        segment: u64,
        offset: u64,
        bytes: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let key = SegmentKey { stream, first: segment };
        let file = self.handle(key)?;
        let mut out = vec![0u8; bytes];
        file.read_at(offset, &mut out).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => StoreError::Corrupt(format!(
                "payload segment {} ends before offset {offset} + {bytes} bytes",
                key.file_name()
            )),
            _ => e.into(),
        })?;
        Ok(out)
    }

    /// Reads every record of `span` in seq order and hands each to `each`, checking each as it
    /// goes: its checksum, seqs strictly increasing, the first at the span's start and the last
    /// where the span ends. Reads sequentially, [`SPAN_READ_BYTES`] at a time (a larger record
    /// whole). Returns the number of records. Hold `_gate`, or a pin of the span, meanwhile.
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] when a segment of the span is missing, a record fails
    /// its checks, or the records do not run from the span's first to its last; `each`'s errors.
    pub fn read_span(
        &self,
        _gate: &ReadGate<'_>,
        span: &Span,
        mut each: impl FnMut(Record<'_>) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        let stream = span.stream;
        let corrupt = |what: String| StoreError::Corrupt(format!("payload stream {stream:x}: {what}"));
        let mut keys: Vec<SegmentKey> = self.dir.list()?.into_iter().filter(|k| span.covers(*k)).collect();
        keys.sort_unstable();
        if keys.first().map(|k| k.first) != Some(span.first.segment)
            || keys.last().map(|k| k.first) != Some(span.last.segment)
        {
            return Err(corrupt(format!(
                "the segments holding seqs {} through {} are not all on this node",
                span.first_seq, span.last_seq
            )));
        }
        let (mut count, mut bytes, mut prev) = (0u64, 0u64, None::<u64>);
        let mut buf = Vec::new();
        for key in keys {
            let file = self.handle(key)?;
            let last_segment = key.first == span.last.segment;
            let mut pos = if key.first == span.first.segment { span.first.offset } else { 0 };
            let end = if last_segment { span.last.end() } else { file.capacity()? };
            let read_at = |pos: u64, buf: &mut [u8]| {
                file.read_at(pos, buf).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => {
                        corrupt(format!("segment {} ends before offset {pos} + {} bytes", key.file_name(), buf.len()))
                    }
                    _ => e.into(),
                })
            };
            while pos < end {
                buf.resize(usize::try_from((end - pos).min(SPAN_READ_BYTES)).unwrap_or(usize::MAX), 0);
                read_at(pos, &mut buf)?;
                let mut at = 0usize;
                while let Some(header) = buf.get(at..at + HEADER_BYTES as usize) {
                    let (len, seq) = (le_u32(&header[..4]), le_u64(&header[8..16]));
                    let total = HEADER_BYTES as usize + len as usize;
                    if buf.len() - at < total {
                        if at > 0 {
                            break;
                        }
                        // One record larger than a read: read it whole.
                        if pos.saturating_add(total as u64) > end {
                            return Err(corrupt(format!(
                                "the record at offset {pos} of segment {} runs past the span's end",
                                key.file_name()
                            )));
                        }
                        buf.resize(total, 0);
                        read_at(pos, &mut buf)?;
                        continue;
                    }
                    let record = parse_record(stream, seq, len, &buf[at..])?;
                    let offset = pos + at as u64;
                    let expected_first = prev.is_some() || seq == span.first_seq;
                    let at_last = last_segment && offset == span.last.offset;
                    if !expected_first || prev.is_some_and(|p| p >= seq) || (at_last && seq != span.last_seq) {
                        return Err(corrupt(format!(
                            "seq {seq} at offset {offset} of segment {} is out of order (after {prev:?}; the span runs from {} to {})",
                            key.file_name(),
                            span.first_seq,
                            span.last_seq
                        )));
                    }
                    each(record)?;
                    prev = Some(seq);
                    count = count.saturating_add(1);
                    bytes = bytes.saturating_add(u64::from(len));
                    at += total;
                }
                if at == 0 {
                    return Err(corrupt(format!(
                        "segment {} holds {} bytes at offset {pos} that are not a whole record",
                        key.file_name(),
                        end - pos
                    )));
                }
                pos += at as u64;
            }
        }
        if prev != Some(span.last_seq) || (count, bytes) != (span.batches, span.bytes) {
            return Err(corrupt(format!(
                "its records run to seq {prev:?}: {count} batches of {bytes} bytes; the span says seqs {} through {}: {} batches of {} bytes (are segments missing?)",
                span.first_seq, span.last_seq, span.batches, span.bytes
            )));
        }
        Ok(count)
    }

    /// An open handle of segment `key`: one appended to since the last sync, one cached, or
    /// newly opened (closing the least recently used past [`HandleBudget::cached`]).
    fn handle(&self, key: SegmentKey) -> Result<Arc<dyn SegmentFile>, StoreError> {
        let mut inner = self.inner();
        if let Some(Some(f)) = inner.dirty.get(&key) {
            return Ok(f.clone());
        }
        self.handle_in(&mut inner, key)
    }

    /// [`PayloadStore::handle`] from the cache or the directory, under the caller's lock.
    fn handle_in(&self, inner: &mut Inner, key: SegmentKey) -> Result<Arc<dyn SegmentFile>, StoreError> {
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((file, used)) = inner.handles.get_mut(&key) {
            *used = tick;
            return Ok(file.clone());
        }
        let file = self.dir.open(key).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                StoreError::Corrupt(format!("payload segment {} is not on this node", key.file_name()))
            }
            _ => e.into(),
        })?;
        // A retired segment is read only by readers whose database read began before it was
        // retired (it stays on disk until they leave): not kept open.
        if !inner.live.contains(&key) {
            return Ok(file);
        }
        if inner.handles.len() >= inner.budget.cached {
            let mut by_use: Vec<(u64, SegmentKey)> = inner.handles.iter().map(|(k, (_, used))| (*used, *k)).collect();
            by_use.sort_unstable();
            for (_, k) in by_use.into_iter().take(inner.budget.cached.div_ceil(2)) {
                inner.handles.remove(&k);
            }
        }
        inner.handles.insert(key, (file.clone(), tick));
        Ok(file)
    }

    /// The segments on disk that no state retired, in (stream, first seq) order: what a snapshot
    /// of the current state refers to.
    pub fn live_segments(&self) -> Vec<SegmentKey> {
        self.inner().live.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &tempfile::TempDir, segment_bytes: u64, extents: &[Extent]) -> PayloadStore {
        let fs = Arc::new(FsPayloads::new(dir.path().join("payloads")).unwrap());
        PayloadStore::open(fs, segment_bytes, extents).unwrap()
    }

    fn read_one(s: &PayloadStore, stream: u64, seq: u64, loc: Location) -> (u64, u64, Vec<u8>) {
        let gate = s.read_gate();
        let buf = s.read(&gate, stream, loc.segment, loc.offset, (HEADER_BYTES + u64::from(loc.len)) as usize).unwrap();
        let r = parse_record(stream, seq, loc.len, &buf).unwrap();
        (r.ts, r.index, r.payload.to_vec())
    }

    fn files(dir: &tempfile::TempDir) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path().join("payloads"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn segment_names_round_trip_and_other_names_are_ignored() {
        let k = SegmentKey { stream: 0xab, first: u64::MAX };
        assert_eq!(k.file_name(), "00000000000000ab-18446744073709551615.seg");
        assert_eq!(SegmentKey::parse(&k.file_name()), Some(k));
        for other in ["committed", "ab-1.seg", "00000000000000ab-1.seg", "00000000000000zz-00000000000000000001.seg"] {
            assert_eq!(SegmentKey::parse(other), None, "{other}");
        }
    }

    #[test]
    fn appended_records_read_back_and_consecutive_ones_are_adjacent() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 1 << 20, &[]);
        let a = s.append(7, 1, 100, 10, b"first").unwrap();
        let b = s.append(7, 3, 101, 11, b"").unwrap();
        let c = s.append(9, 3, 102, 11, &[0xff; 300]).unwrap();
        assert_eq!(a, Location { segment: 1, offset: 0, len: 5 });
        assert_eq!(b.offset, a.end(), "records follow each other");
        assert_eq!(c, Location { segment: 3, offset: 0, len: 300 }, "another stream, another segment");
        assert_eq!(read_one(&s, 7, 1, a), (100, 10, b"first".to_vec()));
        assert_eq!(read_one(&s, 7, 3, b), (101, 11, Vec::new()));
        assert_eq!(read_one(&s, 9, 3, c), (102, 11, vec![0xff; 300]));
        // One read of the run of stream 7, split record by record.
        let gate = s.read_gate();
        let run = s.read(&gate, 7, 1, 0, b.end() as usize).unwrap();
        assert_eq!(parse_record(7, 1, 5, &run).unwrap().payload, b"first");
        assert_eq!(parse_record(7, 3, 0, &run[a.end() as usize..]).unwrap().ts, 101);
        assert_eq!(
            files(&dir),
            ["0000000000000007-00000000000000000001.seg", "0000000000000009-00000000000000000003.seg"]
        );
    }

    #[test]
    fn a_record_is_refused_under_another_key_or_with_any_bit_flipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 1 << 20, &[]);
        let loc = s.append(7, 5, 100, 10, &[1, 2, 3, 4]).unwrap();
        let gate = s.read_gate();
        let buf = s.read(&gate, 7, loc.segment, 0, loc.end() as usize).unwrap();
        assert!(parse_record(7, 5, 4, &buf).is_ok());
        assert!(matches!(parse_record(8, 5, 4, &buf), Err(StoreError::Corrupt(_))), "another stream");
        assert!(matches!(parse_record(7, 6, 4, &buf), Err(StoreError::Corrupt(_))), "another seq");
        assert!(matches!(parse_record(7, 5, 3, &buf), Err(StoreError::Corrupt(_))), "another length");
        assert!(matches!(parse_record(7, 5, 4, &buf[..30]), Err(StoreError::Corrupt(_))), "short read");
        for bit in 0..buf.len() * 8 {
            let mut flipped = buf.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(matches!(parse_record(7, 5, 4, &flipped), Err(StoreError::Corrupt(_))), "bit {bit}");
        }
    }

    #[test]
    fn a_stream_starts_a_new_segment_once_its_segment_is_full() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 100, &[]);
        let a = s.append(1, 10, 0, 1, &[0; 50]).unwrap();
        let b = s.append(1, 11, 0, 2, &[0; 10]).unwrap();
        // 82 + 42 > 100: a new segment, named by its first seq.
        assert_eq!((a.segment, b.segment, b.offset), (10, 11, 0));
        // A record larger than a segment still gets one, of its own.
        let c = s.append(1, 12, 0, 3, &[0; 500]).unwrap();
        assert_eq!((c.segment, c.offset), (12, 0));
        assert_eq!(s.live_segments().len(), 3);
    }

    #[test]
    fn open_cuts_the_tail_the_durable_state_does_not_refer_to_and_removes_what_it_does_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b);
        {
            // Records of 92, 52, 42 and 92 bytes in segments of 100.
            let s = store(&dir, 100, &[]);
            s.append(1, 1, 0, 1, &[1; 60]).unwrap(); // segment 1, retired below
            a = s.append(1, 2, 0, 2, &[2; 20]).unwrap(); // segment 2
            b = s.append(1, 3, 0, 3, &[3; 10]).unwrap(); // segment 2, after the durable state
            s.append(1, 4, 0, 4, &[4; 60]).unwrap(); // segment 4, after the durable state
            s.append(2, 1, 0, 1, &[5; 10]).unwrap(); // a stream the durable state does not hold
            s.sync().unwrap();
        }
        assert_eq!(a.segment, 2);
        assert_eq!(b.segment, 2);
        // The durable state: stream 1 retains seq 2 only.
        let s = store(&dir, 100, &[Extent { stream: 1, first_segment: 2, last: a }]);
        assert_eq!(files(&dir), ["0000000000000001-00000000000000000002.seg"]);
        assert_eq!(std::fs::metadata(dir.path().join("payloads").join(files(&dir)[0].clone())).unwrap().len(), a.end());
        assert_eq!(read_one(&s, 1, 2, a), (0, 2, vec![2; 20]));
        // The log's replay writes seq 3 again where it was.
        assert_eq!(s.append(1, 3, 0, 3, &[3; 10]).unwrap(), b);
    }

    #[test]
    fn open_refuses_a_durable_state_that_refers_to_missing_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let a = {
            let s = store(&dir, 1 << 20, &[]);
            s.append(1, 1, 0, 1, &[1; 40]).unwrap()
        };
        let fs = Arc::new(FsPayloads::new(dir.path().join("payloads")).unwrap());
        let longer = Location { len: 41, ..a };
        let e = PayloadStore::open(fs.clone(), 1 << 20, &[Extent { stream: 1, first_segment: 1, last: longer }]);
        assert!(matches!(e, Err(StoreError::Corrupt(m)) if m.contains("holds 72 bytes")));
        let elsewhere = Location { segment: 5, ..a };
        let e = PayloadStore::open(fs, 1 << 20, &[Extent { stream: 1, first_segment: 1, last: elsewhere }]);
        assert!(matches!(e, Err(StoreError::Corrupt(m)) if m.contains("missing")));
    }

    #[test]
    fn a_retired_segment_goes_only_once_durable_and_no_reader_is_in() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 50, &[]);
        let a = s.append(1, 1, 0, 1, &[1; 40]).unwrap();
        s.append(1, 2, 0, 2, &[2; 40]).unwrap();
        // A reader whose database read began before the retirement still points into it.
        let gate = s.read_gate();
        let before = s.seal();
        s.retire(1, Some(2));
        s.durable(before);
        assert_eq!(files(&dir).len(), 2, "not when retired after the durable commit began");
        let failed = s.seal();
        s.unseal(failed);
        assert_eq!(files(&dir).len(), 2, "not when the durable commit failed");
        s.durable(s.seal());
        assert_eq!(files(&dir).len(), 2, "not while a reader that may still refer to it is in");
        let record = s.read(&gate, 1, a.segment, 0, (HEADER_BYTES + 40) as usize).unwrap();
        assert_eq!(parse_record(1, 1, 40, &record).unwrap().payload, [1; 40], "that reader still reads it");
        drop(gate);
        assert_eq!(files(&dir), ["0000000000000001-00000000000000000002.seg"], "the last reader out removes it");
        assert!(
            s.read(&s.read_gate(), 1, a.segment, 0, 8).is_err(),
            "a reader that starts after its removal does not find it"
        );
        // Retiring every segment of a stream: its next append starts a new segment.
        s.retire(1, None);
        s.durable(s.seal());
        assert!(files(&dir).is_empty());
        assert_eq!(s.append(1, 9, 0, 3, b"x").unwrap(), Location { segment: 9, offset: 0, len: 1 });
    }

    /// Seqs 1..=10 of stream 7, records of 82 bytes in segments of 200 (two a segment).
    fn ten_records(dir: &tempfile::TempDir) -> (PayloadStore, Vec<Location>) {
        let s = store(dir, 200, &[]);
        let locs = (1..=10u64).map(|seq| s.append(7, seq, 100 + seq, seq, &[seq as u8; 50]).unwrap()).collect();
        s.sync().unwrap();
        (s, locs)
    }

    fn span(locs: &[Location], first_seq: u64, last_seq: u64) -> Span {
        let at = |seq: u64| locs[seq as usize - 1];
        let batches = last_seq - first_seq + 1;
        Span { stream: 7, first_seq, first: at(first_seq), last_seq, last: at(last_seq), batches, bytes: batches * 50 }
    }

    /// (seq, ts, log index, payload) of each record read.
    type Read = Vec<(u64, u64, u64, Vec<u8>)>;

    fn span_seqs(s: &PayloadStore, span: &Span) -> Result<Read, StoreError> {
        let mut out = Vec::new();
        let gate = s.read_gate();
        let n = s.read_span(&gate, span, |r| {
            out.push((r.seq, r.ts, r.index, r.payload.to_vec()));
            Ok(())
        })?;
        assert_eq!(n, out.len() as u64);
        Ok(out)
    }

    /// A span names every record from its first to its last, across segments, whatever their
    /// number (what a snapshot manifest holds instead of a row per batch).
    #[test]
    fn a_span_reads_every_record_from_its_first_to_its_last_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (s, locs) = ten_records(&dir);
        assert_eq!(locs[2].segment, 3, "seq 3 starts a segment");
        let got = span_seqs(&s, &span(&locs, 4, 9)).unwrap();
        let want: Vec<_> = (4..=9u64).map(|q| (q, 100 + q, q, vec![q as u8; 50])).collect();
        assert_eq!(got, want);
        // A span that says it ends elsewhere than its records do is refused, not trusted.
        let mut wrong = span(&locs, 4, 9);
        wrong.last_seq = 8;
        assert!(matches!(span_seqs(&s, &wrong), Err(StoreError::Corrupt(_))));
        let mut wrong = span(&locs, 4, 9);
        wrong.first_seq = 3;
        assert!(matches!(span_seqs(&s, &wrong), Err(StoreError::Corrupt(_))));
        // A flipped bit in a record inside the span.
        let path = dir.path().join("payloads").join(SegmentKey { stream: 7, first: 5 }.file_name());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[40] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(span_seqs(&s, &span(&locs, 4, 9)), Err(StoreError::Corrupt(m)) if m.contains("checksum")));
        // A segment of the span gone.
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(span_seqs(&s, &span(&locs, 4, 9)), Err(StoreError::Corrupt(m)) if m.contains("segments missing"))
        );
        let path = dir.path().join("payloads").join(SegmentKey { stream: 7, first: 3 }.file_name());
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(span_seqs(&s, &span(&locs, 4, 9)), Err(StoreError::Corrupt(m)) if m.contains("not all")));
    }

    /// Pinned segments stay after retirement until unpinned, and across a restart whose durable
    /// state no longer refers to them (a snapshot still does).
    #[test]
    fn pinned_segments_outlive_retirement_until_unpinned() {
        let dir = tempfile::tempdir().unwrap();
        let (s, locs) = ten_records(&dir);
        let pinned = span(&locs, 4, 9);
        let _held = s.pin(vec![pinned]);
        s.retire(7, Some(9));
        s.durable(s.seal());
        let names: Vec<u64> = files(&dir).iter().map(|f| SegmentKey::parse(f).unwrap().first).collect();
        assert_eq!(names, [3, 5, 7, 9], "segment 1 went; 3 to 7 stay for the pin");
        assert_eq!(span_seqs(&s, &pinned).unwrap().len(), 6);
        drop(s);
        // Restart: the durable state holds seqs 9..=10; the snapshot's span is pinned at open.
        let fs = Arc::new(FsPayloads::new(dir.path().join("payloads")).unwrap());
        let extents = [Extent { stream: 7, first_segment: 9, last: locs[9] }];
        let (s, pin) = PayloadStore::open_pinned(fs.clone(), 200, &extents, vec![pinned]).unwrap();
        assert_eq!(files(&dir).len(), 4, "pinned segments outside the durable state are kept");
        assert_eq!(span_seqs(&s, &pinned).unwrap().len(), 6);
        s.unpin(pin);
        assert_eq!(files(&dir), ["0000000000000007-00000000000000000009.seg"], "unpinned, they go");
        // Without a pin, open removes them at once.
        drop(s);
        let s = PayloadStore::open(fs, 200, &extents).unwrap();
        assert_eq!(s.live_segments(), [SegmentKey { stream: 7, first: 9 }]);
    }

    /// A restart whose durable state is behind the snapshot (it will be restored from it) does
    /// not cut the newest segment below the snapshot's span.
    #[test]
    fn open_does_not_cut_below_a_pinned_span() {
        let dir = tempfile::tempdir().unwrap();
        let (s, locs) = ten_records(&dir);
        drop(s);
        let fs = Arc::new(FsPayloads::new(dir.path().join("payloads")).unwrap());
        let behind = [Extent { stream: 7, first_segment: 1, last: locs[8] }];
        let (s, _pin) = PayloadStore::open_pinned(fs, 200, &behind, vec![span(&locs, 1, 10)]).unwrap();
        assert_eq!(span_seqs(&s, &span(&locs, 1, 10)).unwrap().len(), 10);
    }

    /// The durable commit (inside the apply) hands retired segments to the blocking pool and
    /// returns without waiting for their removal: unlinking a 16 MiB segment takes milliseconds
    /// on a file system that discards freed blocks, and a deleted stream of a few GiB held
    /// every write for seconds. The removal still happens.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_durable_commit_does_not_wait_for_the_removal_of_retired_segments() {
        let dir = tempfile::tempdir().unwrap();
        let released = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let slow = InstrumentedDir { removals_held: Some(released.clone()), ..InstrumentedDir::new(&dir) };
        let s = Arc::new(PayloadStore::open(Arc::new(slow), 50, &[]).unwrap());
        s.append(1, 1, 0, 1, &[1; 40]).unwrap();
        s.append(1, 2, 0, 2, &[2; 40]).unwrap();
        s.retire(1, Some(2));
        let durable = tokio::task::spawn_blocking({
            let s = s.clone();
            move || s.durable(s.seal())
        });
        let returned = tokio::time::timeout(std::time::Duration::from_secs(5), durable).await;
        let (flag, changed) = &*released;
        *flag.lock().unwrap() = true;
        changed.notify_all();
        assert!(returned.is_ok(), "the durable commit waited for the removal");
        for _ in 0..500 {
            if files(&dir).len() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(files(&dir), ["0000000000000001-00000000000000000002.seg"], "the retired segment is removed");
    }

    /// Payload segments with injected faults and counters: an fsync fails while `fail` is set,
    /// each file's fsyncs are counted (through the trait's default `sync_files`: one
    /// `sync_data` per dirty segment), as are writes and handles given to `write_behind`, and a
    /// removal waits, when `removals_held` is given, until its flag is set.
    struct InstrumentedDir {
        inner: FsPayloads,
        fail: Arc<std::sync::atomic::AtomicBool>,
        syncs: Arc<Mutex<BTreeMap<SegmentKey, u32>>>,
        /// Handles given to `write_behind`.
        behind: Arc<std::sync::atomic::AtomicUsize>,
        budget: HandleBudget,
        /// `write_at` calls, all files together.
        writes: Arc<std::sync::atomic::AtomicUsize>,
        /// When given, a removal waits until the flag is set (the condvar tells it changed).
        removals_held: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    }

    impl InstrumentedDir {
        fn new(dir: &tempfile::TempDir) -> InstrumentedDir {
            InstrumentedDir {
                inner: FsPayloads::new(dir.path().join("payloads")).unwrap(),
                fail: Arc::default(),
                syncs: Arc::default(),
                behind: Arc::default(),
                budget: HandleBudget::default(),
                writes: Arc::default(),
                removals_held: None,
            }
        }

        fn file(&self, key: SegmentKey, inner: Arc<dyn SegmentFile>) -> Arc<dyn SegmentFile> {
            let (fail, syncs, writes) = (self.fail.clone(), self.syncs.clone(), self.writes.clone());
            Arc::new(FailingFile { inner, key, fail, syncs, writes })
        }
    }

    struct FailingFile {
        inner: Arc<dyn SegmentFile>,
        key: SegmentKey,
        fail: Arc<std::sync::atomic::AtomicBool>,
        syncs: Arc<Mutex<BTreeMap<SegmentKey, u32>>>,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl SegmentFile for FailingFile {
        fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            self.inner.read_at(offset, out)
        }
        fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.write_at(offset, data)
        }
        fn sync_data(&self) -> io::Result<()> {
            *self.syncs.lock().unwrap().entry(self.key).or_default() += 1;
            match self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                true => Err(io::Error::other("injected fsync failure")),
                false => self.inner.sync_data(),
            }
        }
        fn zero_from(&self, offset: u64) -> io::Result<()> {
            self.inner.zero_from(offset)
        }
        fn capacity(&self) -> io::Result<u64> {
            self.inner.capacity()
        }
    }

    impl PayloadDir for InstrumentedDir {
        fn list(&self) -> io::Result<Vec<SegmentKey>> {
            self.inner.list()
        }
        fn open(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
            Ok(self.file(key, self.inner.open(key)?))
        }
        fn create(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
            Ok(self.file(key, self.inner.create(key)?))
        }
        fn remove(&self, key: SegmentKey) -> io::Result<()> {
            if let Some(held) = &self.removals_held {
                let (released, changed) = &**held;
                let mut r = released.lock().unwrap();
                while !*r {
                    r = changed.wait(r).unwrap();
                }
            }
            self.inner.remove(key)
        }
        fn truncate(&self, key: SegmentKey, len: u64) -> io::Result<()> {
            self.inner.truncate(key, len)
        }
        fn sync_dir(&self) -> io::Result<()> {
            self.inner.sync_dir()
        }
        fn write_behind(&self, files: Vec<Arc<dyn SegmentFile>>) {
            self.behind.fetch_add(files.len(), std::sync::atomic::Ordering::SeqCst);
            self.inner.write_behind(files);
        }
        fn handle_budget(&self) -> HandleBudget {
            self.budget
        }
    }

    /// A run of records (a frames publish, SPEC §6) lands where one append per record would
    /// have put it, rolling segments at the same records, with one write per segment touched
    /// instead of one per record (a write per 1 KiB record left the kernel zeroing the rest of
    /// each new file block: a third of a node's CPU with 100 frames per request).
    #[test]
    fn a_run_of_records_is_one_write_per_segment_where_single_appends_would_put_them() {
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 40 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let single_dir = tempfile::tempdir().unwrap();
        let single = store(&single_dir, 200, &[]);
        single.append(7, 1, 90, 8, b"before").unwrap();
        let expected: Vec<Location> =
            refs.iter().zip(5u64..).map(|(p, seq)| single.append(7, seq, 100, 9, p).unwrap()).collect();

        let dir = tempfile::tempdir().unwrap();
        let fs = InstrumentedDir::new(&dir);
        let writes = fs.writes.clone();
        let s = PayloadStore::open(Arc::new(fs), 200, &[]).unwrap();
        s.append(7, 1, 90, 8, b"before").unwrap();
        let before = writes.load(std::sync::atomic::Ordering::SeqCst);
        let got = s.append_run(7, 5, 100, 9, &refs).unwrap();
        let run_writes = writes.load(std::sync::atomic::Ordering::SeqCst) - before;

        assert_eq!(got, expected, "the same segments and offsets as one append per record");
        let segments: BTreeSet<u64> = got.iter().map(|l| l.segment).collect();
        assert!(segments.len() >= 3, "the run rolls segments: {segments:?}");
        assert_eq!(run_writes, segments.len(), "one write per segment touched");
        assert_eq!(files(&dir), files(&single_dir));
        for ((loc, seq), p) in got.iter().zip(5u64..).zip(&payloads) {
            assert_eq!(read_one(&s, 7, seq, *loc), (100, 9, p.clone()), "seq {seq}");
        }
        // The stream goes on after the run as after single appends.
        assert_eq!(s.append(7, 15, 1, 1, b"after").unwrap(), single.append(7, 15, 1, 1, b"after").unwrap());
        assert!(s.append_run(7, u64::MAX, 1, 1, &[b"a", b"b"]).is_err(), "seqs past u64::MAX are refused");
    }

    /// After one failed fsync no later sync succeeds: the kernel may have dropped the pages it
    /// could not write and cleared the error, so a durable commit must not follow a retry.
    #[test]
    fn a_failed_fsync_fails_every_later_sync() {
        let dir = tempfile::tempdir().unwrap();
        let fs = InstrumentedDir::new(&dir);
        let fail = fs.fail.clone();
        let s = PayloadStore::open(Arc::new(fs), 1 << 20, &[]).unwrap();
        s.append(1, 1, 0, 1, b"one").unwrap();
        s.sync().unwrap();
        s.append(1, 2, 0, 2, b"two").unwrap();
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(s.sync().is_err());
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(s.sync().is_err(), "a retry after a failed fsync proves nothing");
        s.append(1, 3, 0, 3, b"three").unwrap();
        assert!(s.sync().is_err(), "nor does a later one");
        // A restart recovers from the durable state (here: batch 1) and syncs again.
        drop(s);
        let one = Location { segment: 1, offset: 0, len: 3 };
        let s = store(&dir, 1 << 20, &[Extent { stream: 1, first_segment: 1, last: one }]);
        s.append(1, 2, 0, 2, b"two").unwrap();
        s.sync().unwrap();
    }

    /// Past [`SYNCFS_ABOVE_FILES`] dirty segments the real file system's sync takes its
    /// `syncfs` path; it must succeed and leave nothing dirty (its durability is the kernel's).
    #[test]
    fn many_dirty_segments_are_synced_in_one_call() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir, 1 << 20, &[]);
        let n = SYNCFS_ABOVE_FILES as u64 * 3;
        for stream in 0..n {
            s.append(stream, 1, 0, stream, &stream.to_le_bytes()).unwrap();
        }
        assert_eq!(s.inner().dirty.len(), n as usize);
        s.sync().unwrap();
        assert!(s.inner().dirty.is_empty());
        let loc = Location { segment: 1, offset: 0, len: 8 };
        assert_eq!(read_one(&s, n - 1, 1, loc).2, (n - 1).to_le_bytes());
    }

    /// A segment's write-back is started (its open handle handed to the write-behind) each time
    /// WRITE_BEHIND_AFTER_BYTES have been appended to it since the last hint, and a sync starts
    /// the count again: the durable commit's fsync, inside the apply, then finds little to write.
    #[test]
    fn a_segment_s_write_back_starts_every_write_behind_after_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(InstrumentedDir::new(&dir));
        let behind = fs.behind.clone();
        let hints = || behind.load(std::sync::atomic::Ordering::SeqCst);
        let s = PayloadStore::open(fs, 16 << 20, &[]).unwrap();
        let record = (WRITE_BEHIND_AFTER_BYTES / 4) as usize - HEADER_BYTES as usize;
        for seq in 1..=3 {
            s.append(1, seq, 0, seq, &vec![1; record]).unwrap();
        }
        assert_eq!(hints(), 0, "three quarters of the bytes: no hint yet");
        s.append(1, 4, 0, 4, &vec![1; record]).unwrap();
        assert_eq!(hints(), 1, "the fourth quarter starts the write-back");
        s.append_run(1, 5, 0, 5, &[&[2u8; 100][..]; 10]).unwrap();
        assert_eq!(hints(), 1, "the count starts again after a hint");
        s.sync().unwrap();
        for seq in 15..=17 {
            s.append(1, seq, 0, seq, &vec![1; record]).unwrap();
        }
        assert_eq!(hints(), 1, "a sync starts the count again: the bytes before it are on disk");
        assert!(s.inner().dirty.values().all(Option::is_some), "the hinted segment stays open");
    }

    /// Appends to many streams (each its own segment) keep a bounded number of files open, and
    /// every record reads back.
    #[test]
    fn appends_to_many_streams_keep_a_bounded_number_of_open_files() {
        let dir = tempfile::tempdir().unwrap();
        let budget = HandleBudget { cached: 40, dirty: 24 };
        let s = PayloadStore::open(Arc::new(InstrumentedDir { budget, ..InstrumentedDir::new(&dir) }), 1 << 20, &[])
            .unwrap();
        let streams = (budget.dirty + budget.cached) as u64 * 2;
        for round in 1..=2u64 {
            for stream in 0..streams {
                s.append(stream, round, 0, round, &[round as u8; 16]).unwrap();
                let inner = s.inner();
                let open = inner.dirty.values().filter(|f| f.is_some()).count();
                assert!(open <= budget.dirty, "{open} dirty segments open");
                assert_eq!(open, inner.dirty_open.len());
                assert!(inner.handles.len() <= budget.cached, "{} cached", inner.handles.len());
            }
        }
        for stream in 0..streams {
            for round in 1..=2u64 {
                let loc = Location { segment: 1, offset: (round - 1) * (HEADER_BYTES + 16), len: 16 };
                assert_eq!(read_one(&s, stream, round, loc).2, [round as u8; 16]);
            }
        }
    }

    /// Appending to more streams than its dirty budget closes handles, handing them to
    /// the write-behind, but syncs nothing (the apply must not wait for the disk between
    /// durable commits), and the next sync makes
    /// every segment appended to durable, the closed ones too, each once; a segment retired
    /// meanwhile is not synced.
    #[test]
    fn appends_to_many_streams_sync_nothing_until_asked_then_everything() {
        let dir = tempfile::tempdir().unwrap();
        let fs = InstrumentedDir::new(&dir);
        let (syncs, behind) = (fs.syncs.clone(), fs.behind.clone());
        let dirty_max = fs.budget.dirty;
        let s = PayloadStore::open(Arc::new(fs), 1 << 20, &[]).unwrap();
        let streams = dirty_max as u64 * 3;
        for stream in 0..=dirty_max as u64 {
            s.append(stream, 1, 0, 1, &[1; 16]).unwrap();
            let expected = if stream == dirty_max as u64 { dirty_max } else { 0 };
            assert_eq!(behind.load(std::sync::atomic::Ordering::SeqCst), expected, "after stream {stream}");
        }
        for round in 1..=2u64 {
            let first = if round == 1 { dirty_max as u64 + 1 } else { 0 };
            for stream in first..streams {
                s.append(stream, round, 0, round, &[round as u8; 16]).unwrap();
            }
        }
        assert!(syncs.lock().unwrap().is_empty(), "appends synced {} segments", syncs.lock().unwrap().len());
        assert_eq!(s.inner().dirty.len(), streams as usize);
        s.retire(0, None);
        s.sync().unwrap();
        let synced = std::mem::take(&mut *syncs.lock().unwrap());
        let expected: BTreeMap<SegmentKey, u32> =
            (1..streams).map(|stream| (SegmentKey { stream, first: 1 }, 1)).collect();
        assert_eq!(synced, expected);
        assert!(s.inner().dirty.is_empty() && s.inner().dirty_open.is_empty());
        s.sync().unwrap();
        assert!(syncs.lock().unwrap().is_empty(), "a sync with nothing appended syncs nothing");
    }

    #[test]
    fn many_sealed_segments_are_read_with_a_bounded_number_of_open_files() {
        let dir = tempfile::tempdir().unwrap();
        let budget = HandleBudget { cached: 32, dirty: 16 };
        let s = PayloadStore::open(Arc::new(InstrumentedDir { budget, ..InstrumentedDir::new(&dir) }), 1, &[]).unwrap();
        let locs: Vec<(u64, Location)> = (1..=(budget.cached as u64 * 4))
            .map(|seq| (seq, s.append(3, seq, 0, seq, &seq.to_le_bytes()).unwrap()))
            .collect();
        for (seq, loc) in &locs {
            assert_eq!(read_one(&s, 3, *seq, *loc).2, seq.to_le_bytes());
        }
        assert!(s.inner().handles.len() <= budget.cached);
    }

    /// The budget is half the open-file limit, never below its floor nor above its ceiling,
    /// and what it opens stays within that half with the write-behind's batches.
    #[test]
    fn the_handle_budget_is_half_the_open_file_limit() {
        assert_eq!(HandleBudget::for_open_file_limit(1024), HandleBudget { cached: 256, dirty: 85 });
        assert_eq!(HandleBudget::for_open_file_limit(20_000), HandleBudget { cached: 5_000, dirty: 1_666 });
        assert_eq!(HandleBudget::for_open_file_limit(0), HandleBudget { cached: 16, dirty: 16 });
        assert_eq!(HandleBudget::for_open_file_limit(u64::MAX), HandleBudget { cached: 16_384, dirty: 4_096 });
        for soft in [64u64, 1024, 4096, 20_000, 65_536, 1 << 20] {
            let b = HandleBudget::for_open_file_limit(soft);
            let most = b.cached + b.dirty * (1 + WRITE_BEHIND_BATCHES);
            assert!(most as u64 <= (soft / 2).max(64), "{soft}: {b:?} opens {most}");
        }
    }
}
