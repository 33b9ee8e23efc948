//! The Raft log on disk: segment files of length-prefixed, checksummed records, appended in log
//! index order and fsynced once per append.
//!
//! Owns: the log's byte layout, its recovery after a crash, and the in-memory index from log
//! index to record. Must never: hand out an entry whose record failed its checksum, leave a hole
//! between the first and the last index it reports, or let bytes of a truncated entry come back
//! after a restart.
//!
//! Why not a redb table: a redb durable commit rewrites B-tree pages all over its file and costs
//! several times an `fdatasync` of an append into preallocated space (0.07–0.1 ms here), and the
//! state machine's commits would queue behind it on redb's single writer. The layout is the
//! classic write-ahead log (etcd's WAL, LevelDB's log): segments preallocated (from
//! [`SEGMENT_BYTES_MIN`], doubling up to [`SEGMENT_BYTES`], so a fresh node on a small disk can
//! start), so an fsync flushes data, not file-size metadata.
//!
//! Layout of a segment named by the log index of its first record (`log/<index:020>.seg`):
//! records back to back from offset 0, then zeros. A record is a 16-byte header — body length
//! (`u32` LE, bytes), CRC-32 of index and body (`u32` LE), log index (`u64` LE) — then the body,
//! a postcard-encoded `openraft::Entry`. A zero length ends the segment.
//!
//! Recovery ([`SegmentLog::open`]) keeps the longest valid prefix: a record with a bad checksum,
//! a length past the segment or an index out of sequence ends the log, and only the newest
//! segment may end that way (older segments were fsynced whole before a newer one was written),
//! and only as a torn write does (a damaged record followed by an intact next one with no zeroed
//! sector between is a flipped bit, `intact_record_after`); anything else is corruption and the
//! node refuses to start.
//!
//! What openraft is told ([`SegmentLog::purged`], [`SegmentLog::last_log_id`]) must be a log it
//! can continue: the entries held are contiguous, start right after the purge point and follow
//! it. An entry right after the purge point follows it exactly when its log id is greater: the
//! purge point is committed, so every leader of its term or a later one holds it (Raft paper
//! §5.4.1, Leader Completeness) and appends after it, while an entry of an older term after it
//! belongs to a history that lost (terms never decrease along a log, §5.3) and can never
//! commit. Such a stale tail is discarded, durably, wherever a purge point is set: at
//! [`SegmentLog::open`] and at [`SegmentLog::purge`] (§7: a snapshot the log does not lead to
//! replaces the log). Every mutation checks these invariants with `debug_assert!`
//! ([`SegmentLog::invariant_violation`]).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::RaftLogId;

use super::{decode, encode, encode_append, encoded_len, Entry, StoreError};
use crate::raft::LogId;

/// Most bytes preallocated for a segment (segments grow to it from
/// [`SEGMENT_BYTES_MIN`]); a record larger than this gets a segment of its own size.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

pub use crate::limits::SEGMENT_BYTES_MIN;

/// The size of the next segment after one of `newest` bytes (none: the log has no segment), for
/// a record of `need` bytes: double, within [`SEGMENT_BYTES_MIN`]..=[`SEGMENT_BYTES`], and at
/// least `need`.
fn next_segment_bytes(newest: Option<u64>, need: u64) -> u64 {
    let grown = newest.map_or(SEGMENT_BYTES_MIN, |c| c.saturating_mul(2)).clamp(SEGMENT_BYTES_MIN, SEGMENT_BYTES);
    grown.max(need)
}

/// Encoded bytes of the newest entries kept in memory for readers.
pub const CACHE_BYTES: u64 = 64 * 1024 * 1024;

const HEADER_BYTES: usize = 16;

/// One segment file as the log uses it.
pub trait SegmentFile: Send + Sync {
    /// Reads exactly `out.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()>;
    /// Writes all of `data` at `offset` (within the preallocated size).
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the bytes from `offset` to the segment's preallocated end read as zeros, durably
    /// (crash recovery and truncation use it so a stale record never returns).
    fn zero_from(&self, offset: u64) -> io::Result<()>;
    /// The preallocated size, in bytes.
    fn capacity(&self) -> io::Result<u64>;
    /// Starts writing the file's dirty pages back without waiting for them and without making
    /// anything durable (`sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`): a hint that lets a
    /// later sync find less to write. By default nothing.
    ///
    /// Errors: I/O from the call; a write-back error itself is reported by the later sync.
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }
}

/// The directory holding the segments. Creating and removing are durable when they return.
pub trait SegmentDir: Send + Sync {
    /// The first log index of every segment present, in any order.
    fn list(&self) -> io::Result<Vec<u64>>;
    /// Opens segment `first`.
    fn open(&self, first: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Creates (or replaces) segment `first`, `bytes` long and reading as zeros.
    fn create(&self, first: u64, bytes: u64) -> io::Result<Arc<dyn SegmentFile>>;
    /// Removes segment `first`.
    fn remove(&self, first: u64) -> io::Result<()>;
    /// Removes segment `first`, which a purge retired, from a thread nobody waits on
    /// ([`Retired::remove`]): it may take its time so as not to hold up the log's own fsyncs.
    /// By default [`SegmentDir::remove`].
    fn remove_retired(&self, first: u64) -> io::Result<()> {
        self.remove(first)
    }
    /// Overwrites the commit hint (a few dozen bytes) without fsync: it survives a process crash
    /// in the page cache and may be lost or torn by a power loss ([`SegmentLog::save_commit_hint`]).
    fn save_commit_hint(&self, bytes: &[u8]) -> io::Result<()>;
    /// The commit hint's bytes, if the file exists.
    fn load_commit_hint(&self) -> io::Result<Option<Vec<u8>>>;
}

/// Segments as files in a directory of the real file system.
pub struct FsSegments {
    dir: PathBuf,
    hint: std::sync::OnceLock<std::fs::File>,
}

/// Bytes a retired segment is shortened by at a time before it is removed
/// ([`FsSegments::remove_retired`]): on a file system mounted with `discard`, freeing a whole
/// 64 MiB segment at once sends the device one large discard that every fsync queued behind
/// it waits for (10–12 ms for one concurrent fsync here, up to 70 ms of publish latency when
/// the three nodes purged together). In 4 MiB steps a concurrent fsync waited at most 1–3 ms.
/// RocksDB deletes files in chunks for the same reason (`bytes_max_delete_chunk`).
pub const RETIRE_CHUNK_BYTES: u64 = 4 << 20;

/// Pause after each [`RETIRE_CHUNK_BYTES`] step, in ms, so that queued fsyncs go first.
pub const RETIRE_PAUSE_MS: u64 = 2;

/// The suffix of a retired segment's name while [`FsSegments::remove_retired`] shortens it:
/// not a segment's name, so [`SegmentDir::list`] never shows a shortened segment, and
/// [`FsSegments::new`] removes one a crash left.
const RETIRED_SUFFIX: &str = ".seg.retired";

impl FsSegments {
    /// Segments under `dir`, which is created if missing; a retired segment whose removal a
    /// crash cut short is removed.
    ///
    /// Errors: the directory cannot be created or read, or a leftover cannot be removed.
    pub fn new(dir: PathBuf) -> io::Result<FsSegments> {
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)? {
            let path = e?.path();
            if path.to_string_lossy().ends_with(RETIRED_SUFFIX) {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(FsSegments { dir, hint: std::sync::OnceLock::new() })
    }

    fn path(&self, first: u64) -> PathBuf {
        self.dir.join(format!("{first:020}.seg"))
    }

    fn sync_dir(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

/// Reserves blocks so later writes do not change file metadata an fsync must flush.
fn preallocate(f: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let (off, n) = (i64::try_from(offset).map_err(io::Error::other)?, i64::try_from(len).map_err(io::Error::other)?);
    // SAFETY: a plain system call on a descriptor this `File` owns for the call's duration.
    match unsafe { libc::posix_fallocate(f.as_raw_fd(), off, n) } {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => f.set_len(offset + len), // no fallocate: sparse file
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// One segment file of the real file system: a Raft log segment (preallocated, so appends do
/// not change the metadata an fsync must flush, and zeroed past a cut) or a payload segment
/// ([`super::payloads`]: nothing preallocated, it grows as records are appended and is cut by
/// shortening it).
pub(crate) struct FsSegment {
    file: std::fs::File,
    preallocated: bool,
    /// The histogram each `fdatasync` is timed into, seconds.
    fsync_metric: &'static str,
}

impl FsSegment {
    /// A Raft log segment, its fsyncs timed into `runnev_log_fsync_seconds`, the durability
    /// cost of every append.
    fn log(file: std::fs::File) -> FsSegment {
        FsSegment { file, preallocated: true, fsync_metric: "runnev_log_fsync_seconds" }
    }

    /// A payload segment, its fsyncs timed into `runnev_payload_fsync_seconds` (one per
    /// segment appended to, before each durable state-machine commit).
    pub(crate) fn payload(file: std::fs::File) -> FsSegment {
        FsSegment { file, preallocated: false, fsync_metric: "runnev_payload_fsync_seconds" }
    }
}

impl SegmentFile for FsSegment {
    fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, out, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        let started = std::time::Instant::now();
        let synced = self.file.sync_data();
        metrics::histogram!(self.fsync_metric).record(started.elapsed().as_secs_f64());
        synced
    }
    fn zero_from(&self, offset: u64) -> io::Result<()> {
        let cap = self.file.metadata()?.len();
        self.file.set_len(offset)?;
        if self.preallocated {
            preallocate(&self.file, offset, cap.saturating_sub(offset))?;
        }
        self.file.sync_all()
    }
    fn capacity(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn start_writeback(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a descriptor this `File` owns for the call's duration;
        // offset 0 and length 0 name the whole file.
        match unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

impl SegmentDir for FsSegments {
    fn list(&self) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            if let Some(first) = name.strip_suffix(".seg").and_then(|s| s.parse().ok()) {
                out.push(first);
            }
        }
        Ok(out)
    }
    fn open(&self, first: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.path(first))?;
        Ok(Arc::new(FsSegment::log(f)))
    }
    fn create(&self, first: u64, bytes: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let f =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(self.path(first))?;
        preallocate(&f, 0, bytes)?;
        f.sync_all()?;
        self.sync_dir()?;
        Ok(Arc::new(FsSegment::log(f)))
    }
    fn remove(&self, first: u64) -> io::Result<()> {
        std::fs::remove_file(self.path(first))?;
        self.sync_dir()
    }
    /// Renames the segment out of the log (durably, so a crash never leaves a shortened file
    /// under a segment's name), then shortens it by [`RETIRE_CHUNK_BYTES`] at a time with
    /// [`RETIRE_PAUSE_MS`] between, then removes it.
    fn remove_retired(&self, first: u64) -> io::Result<()> {
        let retired = self.dir.join(format!("{first:020}{RETIRED_SUFFIX}"));
        std::fs::rename(self.path(first), &retired)?;
        self.sync_dir()?;
        let file = std::fs::OpenOptions::new().write(true).open(&retired)?;
        let mut len = file.metadata()?.len();
        while len > 0 {
            len = len.saturating_sub(RETIRE_CHUNK_BYTES);
            file.set_len(len)?;
            std::thread::sleep(std::time::Duration::from_millis(RETIRE_PAUSE_MS));
        }
        drop(file);
        std::fs::remove_file(&retired)?;
        self.sync_dir()
    }
    fn save_commit_hint(&self, bytes: &[u8]) -> io::Result<()> {
        let f = match self.hint.get() {
            Some(f) => f,
            None => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(self.dir.join(HINT_FILE))?;
                self.hint.get_or_init(|| f)
            }
        };
        std::os::unix::fs::FileExt::write_all_at(f, bytes, 0)
    }
    fn load_commit_hint(&self) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.dir.join(HINT_FILE)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Name of the commit hint's file beside the segments.
pub const HINT_FILE: &str = "committed";

/// Where one entry's record lives.
#[derive(Debug, Clone, Copy)]
struct Loc {
    log_id: LogId,
    /// The segment's first log index (its name).
    segment: u64,
    /// Offset of the record's header, in bytes.
    offset: u64,
    /// Header plus body, in bytes.
    len: u64,
}

struct Segment {
    file: Arc<dyn SegmentFile>,
    capacity: u64,
    /// Offset just past its last live record, in bytes.
    end: u64,
}

/// The Raft log: entries from [`SegmentLog::first_index`] to the last, contiguous, each in one
/// record of some segment.
pub struct SegmentLog {
    dir: Arc<dyn SegmentDir>,
    segments: BTreeMap<u64, Segment>,
    /// Log index of `locs[0]`.
    first: u64,
    locs: VecDeque<Loc>,
    /// Entries up to this log id are covered by a snapshot and never written again; the
    /// entries held follow it.
    purged: Option<LogId>,
    /// The newest entries as appended, with their encoded sizes: replication and apply read
    /// what was just appended, and serving it from memory spares a read, a checksum and a
    /// decode per reader. Bounded by [`CACHE_BYTES`].
    cache: VecDeque<(Entry, u64)>,
    cache_bytes: u64,
}

/// Segments a purge left with no entry to serve ([`SegmentLog::purge`]), still on disk until
/// [`Retired::remove`] runs, which the caller does after releasing the log's lock and without
/// holding up the Raft core ([`Retired::remove_behind`]). Removing a full segment frees 64 MiB
/// of blocks: it took 3–48 ms under load here, and every append (and, through openraft 0.9's
/// purge command, which its core awaits, all replication) used to wait for it
/// (BENCHMARKS.md, "Snapshots and the open-loop tail"). A crash before the removal leaves them
/// to [`SegmentLog::open`], which removes segments wholly at or below the purge point.
#[must_use = "retired segments stay on disk until `remove` runs (or the next start)"]
pub struct Retired {
    dir: Arc<dyn SegmentDir>,
    /// Each retired segment's name (its first log index) and handle.
    segments: Vec<(u64, Arc<dyn SegmentFile>)>,
}

impl Retired {
    /// How many segments were retired.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether no segment was retired.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Removes the retired segments' files, oldest first, each durably and gently
    /// ([`SegmentDir::remove_retired`]), then closes its handle. Takes tens of ms a segment on
    /// a real file system: run it where nothing waits for it.
    ///
    /// Errors: I/O of a removal; the segments not yet removed then stay until the next start.
    pub fn remove(self) -> Result<(), StoreError> {
        for (name, file) in self.segments {
            self.dir.remove_retired(name)?;
            drop(file);
        }
        Ok(())
    }

    /// [`Retired::remove`] on tokio's blocking pool, not waited for (inline under the
    /// simulation, [`super::io::behind`]); its time goes to `runnev_log_segment_remove_seconds`,
    /// a failure to the log (the next start removes what is left). `upto` is the purge point,
    /// for the log.
    pub fn remove_behind(self, upto: LogId) {
        if self.is_empty() {
            return;
        }
        super::io::behind(move || {
            let started = std::time::Instant::now();
            let segments = self.len();
            match self.remove() {
                Ok(()) => {
                    metrics::histogram!("runnev_log_segment_remove_seconds").record(started.elapsed().as_secs_f64());
                    tracing::debug!(upto = %upto, segments, "removed the log segments a purge emptied");
                }
                Err(e) => tracing::warn!(
                    upto = %upto,
                    error = %e,
                    "removing log segments a purge emptied failed; the next start removes them"
                ),
            }
        });
    }
}

/// Written but not yet durable: [`SegmentLog::append`]'s second half, run without the log's
/// lock so readers are not held up by the fsync.
#[must_use = "the entries are not durable until `sync` returns"]
pub struct PendingSync(Vec<Arc<dyn SegmentFile>>);

impl PendingSync {
    /// fsyncs every segment the append wrote to.
    ///
    /// Errors: I/O (the entries must then be treated as lost: the node stops).
    pub fn sync(self) -> Result<(), StoreError> {
        for f in self.0 {
            f.sync_data()?;
        }
        Ok(())
    }
}

fn crc(index: u64, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(body);
    h.finalize()
}

fn corrupt(msg: String) -> StoreError {
    StoreError::Corrupt(format!("raft log: {msg}"))
}

/// The leading field of an encoded `openraft::Entry` (postcard encodes fields in order and
/// ignores trailing bytes, so this decodes a record's log id without copying its payload).
#[derive(serde::Deserialize)]
struct EntryHead {
    log_id: LogId,
}

/// A segment's valid records as recovery found them, and whether it ended cleanly (a header
/// of zeros or the end of the file) rather than on a damaged record.
struct Scan {
    locs: Vec<Loc>,
    end: u64,
    clean: bool,
}

/// The commit hint as saved, if it is intact ([`SegmentLog::save_commit_hint`]).
fn read_hint(dir: &dyn SegmentDir) -> Result<Option<LogId>, StoreError> {
    let Some(bytes) = dir.load_commit_hint()? else { return Ok(None) };
    if bytes.len() < 8 {
        return Ok(None);
    }
    let sum = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]) as usize;
    let Some(body) = bytes.get(8..8 + len) else { return Ok(None) };
    let Ok(hint) = decode::<LogId>(body) else { return Ok(None) };
    Ok((crc(hint.index, body) == sum).then_some(hint))
}

/// A record's header: body length (bytes), CRC-32 of index and body, log index.
struct Header {
    len: u64,
    sum: u32,
    index: u64,
}

impl Header {
    fn parse(b: &[u8]) -> Header {
        let word = |at: usize, n: usize| b[at..at + n].iter().rev().fold(0u64, |v, x| (v << 8) | u64::from(*x));
        Header { len: word(0, 4), sum: word(4, 4) as u32, index: word(8, 8) }
    }
}

fn scan(file: &dyn SegmentFile, segment: u64, capacity: u64) -> Result<Scan, StoreError> {
    let mut locs: Vec<Loc> = Vec::new();
    let mut off = 0u64;
    let mut header = [0u8; HEADER_BYTES];
    while off + HEADER_BYTES as u64 <= capacity {
        file.read_at(off, &mut header)?;
        let Header { len, sum, index } = Header::parse(&header);
        if header.iter().all(|b| *b == 0) {
            return Ok(Scan { locs, end: off, clean: true });
        }
        // A zero length under a header that is not all zeros is damage, not the end: a flipped
        // bit of a length with one bit set (32, 64, … bytes) read as the log's clean end, and the
        // node restarted without the acknowledged entries after it (simulation seed 69595).
        if len == 0 {
            return Ok(Scan { locs, end: off, clean: false });
        }
        let expected = locs.last().map_or(segment, |l| l.log_id.index + 1);
        let body_end = off + HEADER_BYTES as u64 + len;
        if body_end > capacity || index != expected {
            return Ok(Scan { locs, end: off, clean: false });
        }
        let mut body = vec![0u8; len as usize];
        file.read_at(off + HEADER_BYTES as u64, &mut body)?;
        if crc(index, &body) != sum {
            return Ok(Scan { locs, end: off, clean: false });
        }
        // Only the log id is needed to index the record; the payload is decoded when read.
        let Ok(head) = decode::<EntryHead>(&body) else { return Ok(Scan { locs, end: off, clean: false }) };
        if head.log_id.index != index {
            return Ok(Scan { locs, end: off, clean: false });
        }
        locs.push(Loc { log_id: head.log_id, segment, offset: off, len: body_end - off });
        off = body_end;
    }
    Ok(Scan { locs, end: off, clean: true })
}

/// Bytes of the unit a disk writes whole: a torn write keeps or loses whole sectors.
const SECTOR_BYTES: u64 = 512;

/// Bytes read at a time when looking past a damaged record.
const LOOK_AHEAD_BYTES: u64 = 1024 * 1024;

/// Tells a flipped bit from a torn tail at the damaged record at `off` of the newest segment,
/// whose index should have been `index`: returns the offset of an intact record of index
/// `index + 1` further on when no sector between the two reads as zeros — damage *inside*
/// data that was written whole, so not a torn write but a disk returning wrong bytes. `None`
/// when the damage may be a torn tail: no such record (a damaged last record cannot be told from
/// a torn one), or a zeroed sector before it (unordered writeback kept a later page of the last
/// append and lost an earlier one: the kept records were never acknowledged).
///
/// A torn write leaves whole sectors as they were before the write (zeros, past the log's
/// end); a flipped bit leaves every sector of the record written. The same test as etcd's WAL
/// (`isTornEntry`), with the next record found by its index rather than by the damaged
/// record's length, which the flip may have hit. A record whose payload holds a whole aligned
/// sector of zeros looks torn: it is then discarded as before.
///
/// Errors: I/O.
fn intact_record_after(file: &dyn SegmentFile, off: u64, capacity: u64, index: u64) -> Result<Option<u64>, StoreError> {
    let Some(next) = index.checked_add(1) else { return Ok(None) };
    let want = next.to_le_bytes();
    let mut at = off + HEADER_BYTES as u64;
    let mut header = [0u8; HEADER_BYTES];
    while at + HEADER_BYTES as u64 <= capacity {
        let n = LOOK_AHEAD_BYTES.min(capacity - at);
        let mut chunk = vec![0u8; n as usize];
        file.read_at(at, &mut chunk)?;
        if chunk.iter().all(|b| *b == 0) {
            // A megabyte of zeros: the end of what was written.
            return Ok(None);
        }
        for p in 0..chunk.len().saturating_sub(HEADER_BYTES - 1) {
            if chunk[p + 8..p + HEADER_BYTES] != want {
                continue;
            }
            let start = at + p as u64;
            file.read_at(start, &mut header)?;
            let Header { len, sum, .. } = Header::parse(&header);
            let end = start + HEADER_BYTES as u64 + len;
            if len == 0 || end > capacity {
                continue;
            }
            let mut body = vec![0u8; len as usize];
            file.read_at(start + HEADER_BYTES as u64, &mut body)?;
            if crc(next, &body) != sum {
                continue;
            }
            return Ok((!zeroed_sector(file, off, start)?).then_some(start));
        }
        // Overlap so that a header across two chunks is seen.
        at += n.saturating_sub(HEADER_BYTES as u64 - 1).max(1);
    }
    Ok(None)
}

/// Whether some sector overlapping `from..to` reads as zeros over all of its part in that range.
fn zeroed_sector(file: &dyn SegmentFile, from: u64, to: u64) -> Result<bool, StoreError> {
    let mut sector = from - from % SECTOR_BYTES;
    while sector < to {
        let (a, b) = (sector.max(from), (sector + SECTOR_BYTES).min(to));
        let mut bytes = vec![0u8; (b - a) as usize];
        file.read_at(a, &mut bytes)?;
        if bytes.iter().all(|x| *x == 0) {
            return Ok(true);
        }
        sector += SECTOR_BYTES;
    }
    Ok(false)
}

impl SegmentLog {
    /// Opens the log in `dir`, recovering from a crash: the longest valid prefix of records
    /// survives, damaged bytes after it are zeroed, segments wholly at or below `purged` (the
    /// purge point's log id, as saved before any entry was dropped) are removed, and entries at
    /// or below it are not served. Entries after `purged` that do not follow it (a stale tail,
    /// module doc) are discarded durably, as [`SegmentLog::purge`] does.
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] when damage is found anywhere but at the end of the
    /// newest segment, or the segments do not follow one another.
    pub fn open(dir: Arc<dyn SegmentDir>, purged: Option<LogId>) -> Result<SegmentLog, StoreError> {
        let mut names = dir.list()?;
        names.sort_unstable();
        let mut log = SegmentLog {
            dir: dir.clone(),
            segments: BTreeMap::new(),
            first: 0,
            locs: VecDeque::new(),
            purged,
            cache: VecDeque::new(),
            cache_bytes: 0,
        };
        let count = names.len();
        for (i, name) in names.into_iter().enumerate() {
            let file = dir.open(name)?;
            let capacity = file.capacity()?;
            let found = scan(file.as_ref(), name, capacity)?;
            let newest = i + 1 == count;
            if !found.clean && !newest {
                return Err(corrupt(format!("damaged record at byte {} of segment {name}", found.end)));
            }
            if newest {
                if !found.clean {
                    let next = found.locs.last().map_or(name, |l| l.log_id.index + 1);
                    if let Some(at) = intact_record_after(file.as_ref(), found.end, capacity, next)? {
                        // Discarding from here would drop entries this node acknowledged
                        // (simulation seed 40: two nodes each dropped a tail of committed
                        // entries this way, and acknowledged batches were lost).
                        return Err(corrupt(format!(
                            "damaged record at byte {} of segment {name} (index {next}), followed by an intact \
                             record of index {} at byte {at}: the disk returned wrong bytes, this is not a torn \
                             write",
                            found.end,
                            next + 1
                        )));
                    }
                    match read_hint(dir.as_ref())? {
                        // Entries this node knew committed were fsynced before: losing them is
                        // a damaged disk, unless a power loss kept the hint and not the log.
                        Some(h) if h.index >= next => tracing::error!(
                            segment = name,
                            offset = found.end,
                            from_index = next,
                            committed_index = h.index,
                            "raft log: damaged below the commit index; discarding from here (after a power loss this can be a torn tail; otherwise check the disk)"
                        ),
                        _ => tracing::warn!(segment = name, offset = found.end, "raft log: discarding a torn tail"),
                    }
                }
                // A torn power loss can keep pages past a clean end too (unordered writeback):
                // zero them, or a later append of the same size lines up with stale records.
                // zero_from also fsyncs what was found: after a kill, records still only in the
                // page cache, or a truncation's resize cut short, are what the log serves from
                // here on, so they must be durable first. Even at the file's end (simulation
                // seed 324: a segment shrunk by a cut truncation, never synced, came back whole
                // after a power loss, stale entries and all).
                file.zero_from(found.end)?;
            }
            let live: Vec<Loc> =
                found.locs.into_iter().filter(|l| purged.is_none_or(|p| l.log_id.index > p.index)).collect();
            if live.is_empty() {
                // Nothing to serve in it: wholly purged, or created and never written.
                drop(file);
                dir.remove(name)?;
                continue;
            }
            if let (Some(last), Some(next)) = (log.locs.back(), live.first()) {
                if next.log_id.index != last.log_id.index + 1 {
                    return Err(corrupt(format!(
                        "segment {name} starts at index {} after index {}",
                        next.log_id.index, last.log_id.index
                    )));
                }
            }
            if log.locs.is_empty() {
                log.first = live.first().map_or(name, |l| l.log_id.index);
            }
            log.locs.extend(live);
            log.segments.insert(name, Segment { file, capacity, end: found.end });
        }
        if log.locs.is_empty() {
            log.first = purged.map_or(0, |p| p.index + 1);
        } else if let Some(p) = purged {
            if log.first != p.index + 1 {
                return Err(corrupt(format!(
                    "the log starts at index {} but the snapshot ends at {}",
                    log.first, p.index
                )));
            }
            log.drop_stale_tail(p)?;
        }
        debug_assert_eq!(log.invariant_violation(), None, "segment log after open");
        Ok(log)
    }

    /// Discards, durably, the entries after purge point `p` when they do not follow it: the
    /// first of them has a log id below `p`'s (an older leader: module doc). Kept, they would
    /// report a last log id below the purge point, which openraft takes for a log that ends at
    /// the purge point ("snapshot installed but logs not cleaned"), and its next append would
    /// not follow what the log holds (simulation seed 200860: "append of index 160 where
    /// Some(162) was next", and the Raft core stopped for good).
    fn drop_stale_tail(&mut self, p: LogId) -> Result<(), StoreError> {
        let Some(next) = self.locs.front().map(|l| l.log_id) else { return Ok(()) };
        if next > p {
            return Ok(());
        }
        tracing::warn!(
            purged = %p,
            first_after = %next,
            last = ?self.last_log_id(),
            "raft log: discarding entries after the purge point that do not follow it (uncommitted entries of an older leader)"
        );
        self.truncate(p.index + 1)
    }

    /// Log index of the first entry held (or of the next to append, when empty).
    pub fn first_index(&self) -> u64 {
        self.first
    }

    /// The purge point: entries up to this log id are covered by a snapshot, and the entries
    /// held follow it.
    pub fn purged(&self) -> Option<LogId> {
        self.purged
    }

    /// The last entry's log id, if any entry is held.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.locs.back().map(|l| l.log_id)
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.locs.is_empty()
    }

    /// Writes `entries` (consecutive log indexes) after the last one held; they are readable
    /// at once and durable once the returned [`PendingSync`] has synced (Raft paper §5.3,
    /// "persistent state": only then may the caller report them flushed). Entries at or below
    /// the purge point are skipped: a snapshot already covers them.
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] when the entries do not follow the last one held.
    pub fn append(&mut self, entries: Vec<Entry>) -> Result<PendingSync, StoreError> {
        let purged = self.purged;
        // Each entry with its encoded length, counted first: the records are then encoded
        // straight into the run written to the segment (no buffer per entry, no regrowth).
        let mut pending: Vec<(LogId, Entry, u32)> = Vec::with_capacity(entries.len());
        for e in entries {
            let id = *e.get_log_id();
            if purged.is_some_and(|p| id.index <= p.index) {
                continue;
            }
            // An empty log continues its purge point (without one, openraft starts anywhere:
            // index 0 in a cluster, other indexes in its storage test suite).
            let expected = pending
                .last()
                .map(|(l, _, _)| l.index + 1)
                .or(self.last_log_id().map(|l| l.index + 1))
                .or(purged.map(|_| self.first));
            if expected.is_some_and(|x| x != id.index) {
                return Err(corrupt(format!("append of index {} where {expected:?} was next", id.index)));
            }
            let size = encoded_len(&e)?;
            let len = u32::try_from(size).map_err(|_| corrupt(format!("entry of {size} bytes")))?;
            pending.push((id, e, len));
        }
        if pending.is_empty() {
            return Ok(PendingSync(Vec::new()));
        }
        if let (Some(p), Some((id, _, _))) = (purged, pending.first()) {
            if id.index == p.index + 1 && id.leader_id < p.leader_id {
                return Err(corrupt(format!("append of {id}, which does not follow the purge point {p}")));
            }
        }
        if self.locs.is_empty() {
            self.first = pending[0].0.index;
        }
        // Lay records out segment by segment: one write and one fsync per segment touched.
        let mut kept: Vec<Entry> = Vec::with_capacity(pending.len());
        let mut touched: Vec<u64> = Vec::new();
        let total: usize = pending.iter().map(|(_, _, len)| HEADER_BYTES + *len as usize).sum();
        let mut run: Vec<u8> = Vec::with_capacity(total);
        let mut run_start = 0u64;
        for (id, e, len) in pending {
            let need = (HEADER_BYTES + len as usize) as u64;
            let active =
                if self.locs.is_empty() && run.is_empty() { None } else { self.segments.keys().next_back().copied() };
            let fits = active.and_then(|a| self.segments.get(&a)).is_some_and(|s| s.end + need <= s.capacity);
            if !fits {
                self.flush_run(&mut run, run_start, &mut touched)?;
                // The older segment is durable before the newer one is written: recovery relies
                // on only the newest segment ending early.
                if let Some(pos) = active.and_then(|a| touched.iter().position(|n| *n == a)) {
                    let older = touched.remove(pos);
                    if let Some(seg) = self.segments.get(&older) {
                        seg.file.sync_data()?;
                    }
                }
                let file = self.create_segment(id.index, need)?;
                let capacity = file.capacity()?;
                self.segments.insert(id.index, Segment { file, capacity, end: 0 });
            }
            let (&name, seg) = self.segments.iter_mut().next_back().ok_or_else(|| corrupt("no segment".into()))?;
            if run.is_empty() {
                run_start = seg.end;
            }
            // The record: length, CRC-32 of index and body, index, then the body, encoded in place.
            let at = run.len();
            run.extend_from_slice(&len.to_le_bytes());
            run.extend_from_slice(&[0; 4]);
            run.extend_from_slice(&id.index.to_le_bytes());
            encode_append(&e, &mut run)?;
            let body = run.get(at + HEADER_BYTES..).unwrap_or_default();
            debug_assert_eq!(body.len(), len as usize, "the counting pass and the encoding agree");
            if body.len() != len as usize {
                return Err(corrupt(format!("entry {id} encoded to {} bytes, counted {len}", body.len())));
            }
            let sum = crc(id.index, body).to_le_bytes();
            run[at + 4..at + 8].copy_from_slice(&sum);
            self.locs.push_back(Loc { log_id: id, segment: name, offset: seg.end, len: need });
            seg.end += need;
            kept.push(e);
        }
        self.flush_run(&mut run, run_start, &mut touched)?;
        let sizes: Vec<u64> = self.locs.iter().rev().take(kept.len()).map(|l| l.len).collect();
        for (e, size) in kept.into_iter().zip(sizes.into_iter().rev()) {
            self.cache_bytes += size;
            self.cache.push_back((e, size));
        }
        while self.cache_bytes > CACHE_BYTES && self.cache.len() > 1 {
            if let Some((_, size)) = self.cache.pop_front() {
                self.cache_bytes -= size;
            }
        }
        debug_assert_eq!(self.invariant_violation(), None, "segment log after append");
        Ok(PendingSync(touched.iter().filter_map(|n| self.segments.get(n)).map(|s| s.file.clone()).collect()))
    }

    /// Creates the segment starting at log index `first` for a record of `need` bytes: twice
    /// the newest segment's size, from [`SEGMENT_BYTES_MIN`] up to [`SEGMENT_BYTES`] (a fresh
    /// node needs no 64 MiB at once), and at least `need`. On a full disk, one of `need` bytes
    /// is tried before giving up: the file system may have room for the record, if not for a
    /// whole preallocated segment.
    ///
    /// Errors: I/O, `ENOSPC` when not even `need` bytes fit.
    fn create_segment(&self, first: u64, need: u64) -> Result<Arc<dyn SegmentFile>, StoreError> {
        let bytes = next_segment_bytes(self.segments.values().next_back().map(|s| s.capacity), need);
        match self.dir.create(first, bytes) {
            Err(e) if e.kind() == io::ErrorKind::StorageFull && bytes > need => {
                tracing::warn!(
                    first,
                    bytes,
                    need,
                    "raft log: no room for a preallocated segment; making one the size of the record"
                );
                Ok(self.dir.create(first, need)?)
            }
            r => Ok(r?),
        }
    }

    /// Writes the pending run into the newest segment at `start`.
    fn flush_run(&mut self, run: &mut Vec<u8>, start: u64, touched: &mut Vec<u64>) -> Result<(), StoreError> {
        if run.is_empty() {
            return Ok(());
        }
        let (&name, seg) = self.segments.iter().next_back().ok_or_else(|| corrupt("no segment".into()))?;
        seg.file.write_at(start, run)?;
        if !touched.contains(&name) {
            touched.push(name);
        }
        run.clear();
        Ok(())
    }

    /// The entries with log index in `start..=end` that are held, in order.
    ///
    /// Errors: I/O; [`StoreError::Corrupt`] if a record no longer matches its checksum.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<Entry>, StoreError> {
        let Some((from, to, cached_from)) = self.held(start, end) else { return Ok(Vec::new()) };
        let mut out = if from < cached_from { self.read_disk(from, to.min(cached_from - 1))? } else { Vec::new() };
        if to >= cached_from {
            out.extend(self.cached(from.max(cached_from), to, cached_from));
        }
        Ok(out)
    }

    /// The part of `start..=end` the log holds, as `(from, to, cached_from)`: the entries from
    /// `cached_from` on are in memory. `None` when it holds none of them.
    fn held(&self, start: u64, end: u64) -> Option<(u64, u64, u64)> {
        let last = self.last_log_id()?.index;
        let (from, to) = (start.max(self.first), end.min(last));
        (from <= to).then(|| (from, to, last + 1 - self.cache.len() as u64))
    }

    /// Clones of the cached entries `from..=to`, all at or after `cached_from` ([`Self::held`]).
    fn cached(&self, from: u64, to: u64, cached_from: u64) -> impl Iterator<Item = Entry> + '_ {
        debug_assert!(cached_from <= from && from <= to, "{cached_from} <= {from} <= {to}");
        self.cache.iter().skip((from - cached_from) as usize).take((to - from + 1) as usize).map(|(e, _)| e.clone())
    }

    /// [`SegmentLog::read`] when every entry it would return is in memory (the newest
    /// [`CACHE_BYTES`] of entries), `None` when some must be read from the segment files. A
    /// leader reads each new entry once per follower's append and once for the apply, all from
    /// the cache: served without a file read, they need no hand-off to a blocking thread.
    pub fn read_cached(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        match self.held(start, end) {
            None => Some(Vec::new()),
            Some((from, _, cached_from)) if from < cached_from => None,
            Some((from, to, cached_from)) => Some(self.cached(from, to, cached_from).collect()),
        }
    }

    /// [`SegmentLog::read`] from the segment files, for `from..=to` within the log.
    fn read_disk(&self, from: u64, to: u64) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::with_capacity((to - from + 1) as usize);
        let mut i = (from - self.first) as usize;
        let stop = (to - self.first) as usize;
        // Read each segment's stretch of records with one read.
        while i <= stop {
            let head = self.locs[i];
            let mut j = i;
            while j < stop && self.locs[j + 1].segment == head.segment {
                j += 1;
            }
            let tail = self.locs[j];
            let seg =
                self.segments.get(&head.segment).ok_or_else(|| corrupt(format!("segment {} gone", head.segment)))?;
            let mut buf = vec![0u8; (tail.offset + tail.len - head.offset) as usize];
            seg.file.read_at(head.offset, &mut buf)?;
            for loc in self.locs.range(i..=j) {
                let at = (loc.offset - head.offset) as usize;
                let rec = &buf[at..at + loc.len as usize];
                let h = Header::parse(rec);
                let body = &rec[HEADER_BYTES..];
                if h.index != loc.log_id.index || crc(loc.log_id.index, body) != h.sum {
                    return Err(corrupt(format!("record of index {} fails its checksum", loc.log_id.index)));
                }
                out.push(decode(body)?);
            }
            i = j + 1;
        }
        Ok(out)
    }

    /// Removes the entries at and after log index `from` (a conflict with the leader's log,
    /// Raft paper §5.3), durably: their bytes read as zeros from now on.
    ///
    /// Errors: I/O.
    pub fn truncate(&mut self, from: u64) -> Result<(), StoreError> {
        let Some(last) = self.last_log_id().map(|l| l.index) else { return Ok(()) };
        if from > last {
            return Ok(());
        }
        // Entries before `first` are purged (or were never held): truncating from below it
        // removes every entry held, and the next one to append is still `first`.
        let from = from.max(self.first);
        let keep = (from - self.first) as usize;
        let cut = self.locs[keep];
        self.locs.truncate(keep);
        while self.cache.back().is_some_and(|(e, _)| e.log_id.index >= from) {
            if let Some((_, size)) = self.cache.pop_back() {
                self.cache_bytes -= size;
            }
        }
        let later: Vec<u64> = self.segments.range(cut.segment + 1..).map(|(k, _)| *k).collect();
        for name in later {
            self.segments.remove(&name);
            self.dir.remove(name)?;
        }
        if cut.offset == 0 {
            self.segments.remove(&cut.segment);
            self.dir.remove(cut.segment)?;
        } else if let Some(seg) = self.segments.get_mut(&cut.segment) {
            seg.file.zero_from(cut.offset)?;
            seg.end = cut.offset;
        }
        if self.locs.is_empty() {
            self.first = from;
        }
        debug_assert_eq!(self.invariant_violation(), None, "segment log after truncate");
        Ok(())
    }

    /// Forgets the entries up to and including log id `upto` (a snapshot covers them) and
    /// retires the segments that hold nothing else: the returned [`Retired`] removes their
    /// files, to be run once the log's lock is released. Entries after it that do not follow it
    /// (an older leader's, module doc) are discarded durably (Raft paper §7: the snapshot
    /// replaces a log that conflicts with it). The caller has made the new purge point durable
    /// first, so recovery skips whatever of them remains in a kept segment, removes a retired
    /// segment whose removal a crash cut short (it is wholly at or below the purge point), and
    /// discards a stale tail again if a crash came first. A purge point at or below the current
    /// one changes nothing.
    ///
    /// Errors: I/O.
    pub fn purge(&mut self, upto: LogId) -> Result<Retired, StoreError> {
        let mut retired = Retired { dir: self.dir.clone(), segments: Vec::new() };
        if self.purged.is_some_and(|p| p.index >= upto.index) {
            return Ok(retired);
        }
        let upto_index = upto.index;
        self.purged = Some(upto);
        while self.locs.front().is_some_and(|l| l.log_id.index <= upto_index) {
            self.locs.pop_front();
        }
        while self.cache.front().is_some_and(|(e, _)| e.log_id.index <= upto_index) {
            if let Some((_, size)) = self.cache.pop_front() {
                self.cache_bytes -= size;
            }
        }
        self.first = self.first.max(upto_index + 1);
        self.drop_stale_tail(upto)?;
        let live: Option<u64> = self.locs.front().map(|l| l.segment);
        let dead: Vec<u64> = self.segments.keys().copied().filter(|k| live.is_none_or(|s| *k < s)).collect();
        for name in dead {
            if let Some(segment) = self.segments.remove(&name) {
                retired.segments.push((name, segment.file));
            }
        }
        debug_assert_eq!(self.invariant_violation(), None, "segment log after purge");
        debug_assert!(
            retired.segments.iter().all(|(name, _)| *name <= upto_index),
            "a retired segment starts at or below the purge point, so no later append can make one of its name"
        );
        Ok(retired)
    }

    /// Records `committed` (a log id this node learned is committed) as a hint for the next
    /// start, without fsync: openraft re-applies the log up to it before the node serves
    /// (`RaftLogStorage::read_committed`), so a node restarted after `kill -9` serves at least
    /// what it served before, although the state machine commits without fsync. Framed as
    /// CRC-32 (`u32` LE), length (`u32` LE), postcard `LogId`.
    ///
    /// Errors: I/O.
    pub fn save_commit_hint(&self, committed: LogId) -> Result<(), StoreError> {
        let body = encode(&committed)?;
        let mut bytes = Vec::with_capacity(8 + body.len());
        bytes.extend_from_slice(&crc(committed.index, &body).to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&body);
        Ok(self.dir.save_commit_hint(&bytes)?)
    }

    /// The commit hint, when it survived intact and names an entry this log holds (same log
    /// id: by Raft's Log Matching property that entry and all before it are committed, §5.3);
    /// `None` otherwise (a power loss may lose the hint or the log's unsynced tail).
    ///
    /// Errors: I/O.
    pub fn commit_hint(&self) -> Result<Option<LogId>, StoreError> {
        let Some(hint) = read_hint(self.dir.as_ref())? else { return Ok(None) };
        let held = hint.index >= self.first
            && self.last_log_id().is_some_and(|l| hint.index <= l.index)
            && self.locs.get((hint.index - self.first) as usize).is_some_and(|l| l.log_id == hint);
        Ok(held.then_some(hint))
    }

    /// How many segment files are held (for tests and metrics).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The first broken invariant of the in-memory log, if any (checked with `debug_assert!`
    /// after every mutation, so the simulation checks it on every step): the entries held are
    /// contiguous and start at `first`; `first` is past the purge point, right after it when
    /// entries are held, and the first entry follows it (a greater log id); every record lies
    /// in a segment held, within its written end, back to back with the one before it in the
    /// same segment; the cache holds exactly the newest entries held, and its byte count is
    /// their sum. Costs one pass over the entries held.
    pub fn invariant_violation(&self) -> Option<String> {
        if let Some(p) = self.purged {
            if p.index >= self.first {
                return Some(format!("first {} is not past the purge point {p}", self.first));
            }
        }
        if let Some(head) = self.locs.front() {
            if head.log_id.index != self.first {
                return Some(format!("first {} but the first entry held is {}", self.first, head.log_id));
            }
            if let Some(p) = self.purged {
                if self.first != p.index + 1 || head.log_id <= p {
                    return Some(format!("the first entry held, {}, does not follow the purge point {p}", head.log_id));
                }
            }
        }
        let mut prev: Option<&Loc> = None;
        for loc in &self.locs {
            let Some(seg) = self.segments.get(&loc.segment) else {
                return Some(format!("entry {} in segment {}, which is not held", loc.log_id, loc.segment));
            };
            if loc.offset + loc.len > seg.end || loc.segment > loc.log_id.index {
                return Some(format!("entry {} lies outside segment {}", loc.log_id, loc.segment));
            }
            if let Some(prev) = prev {
                if loc.log_id.index != prev.log_id.index + 1 {
                    return Some(format!("entry {} follows entry {}: not contiguous", loc.log_id, prev.log_id));
                }
                if loc.segment == prev.segment && loc.offset != prev.offset + prev.len {
                    return Some(format!(
                        "entry {} is not right after entry {} in its segment",
                        loc.log_id, prev.log_id
                    ));
                }
                if loc.segment < prev.segment {
                    return Some(format!("entry {} is in an older segment than entry {}", loc.log_id, prev.log_id));
                }
            }
            prev = Some(loc);
        }
        if self.cache.len() > self.locs.len() {
            return Some(format!("{} cached entries for {} held", self.cache.len(), self.locs.len()));
        }
        let tail = self.locs.range(self.locs.len() - self.cache.len()..);
        for ((entry, size), loc) in self.cache.iter().zip(tail) {
            if entry.log_id != loc.log_id || *size != loc.len {
                return Some(format!("cached entry {} where entry {} is held", entry.log_id, loc.log_id));
            }
        }
        let bytes: u64 = self.cache.iter().map(|(_, size)| size).sum();
        if bytes != self.cache_bytes {
            return Some(format!("cache counts {} bytes but holds {bytes}", self.cache_bytes));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Command, TypeConfig};
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64, bytes: usize) -> Entry {
        openraft::Entry::<TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Command::Publish {
                stream: "s".into(),
                seq: None,
                ts: 0,
                auto_create: true,
                data: vec![index as u8; bytes].into(),
            }),
        }
    }

    /// The log id of `entry(term, index, _)`.
    fn id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn open(dir: &tempfile::TempDir, purged: Option<LogId>) -> SegmentLog {
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        SegmentLog::open(Arc::new(fs), purged).unwrap()
    }

    fn indexes(log: &SegmentLog) -> Vec<u64> {
        log.read(0, u64::MAX).unwrap().iter().map(|e| e.log_id.index).collect()
    }

    #[test]
    fn the_head_of_an_encoded_entry_is_its_log_id() {
        let e = entry(7, 42, 300);
        let head: EntryHead = decode(&encode(&e).unwrap()).unwrap();
        assert_eq!(head.log_id, e.log_id);
    }

    /// Regression: the cluster's first entry has log index 0, and a reopen without any purge
    /// took "nothing purged" for "purged through 0" and dropped it (found by `runnev bench
    /// failover`: a killed first leader could not restart).
    #[test]
    fn the_entry_at_log_index_zero_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        assert_eq!(log.first_index(), 0);
        log.append((0..=2).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        drop(log);
        let log = open(&dir, None);
        assert_eq!(indexes(&log), vec![0, 1, 2]);
        assert_eq!(log.first_index(), 0);
        let log = open(&dir, Some(id(1, 0)));
        assert_eq!(indexes(&log), vec![1, 2]);
    }

    #[test]
    fn the_commit_hint_is_used_only_when_the_log_holds_that_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        assert_eq!(log.commit_hint().unwrap(), None);
        log.append((1..=4).map(|i| entry(2, i, 10)).collect()).unwrap().sync().unwrap();
        let third = log.read(3, 3).unwrap()[0].log_id;
        log.save_commit_hint(third).unwrap();
        drop(log);
        let mut log = open(&dir, None);
        assert_eq!(log.commit_hint().unwrap(), Some(third));
        // Another term at that index (the log was truncated and rewritten): not this entry.
        log.truncate(3).unwrap();
        log.append(vec![entry(3, 3, 10)]).unwrap().sync().unwrap();
        assert_eq!(log.commit_hint().unwrap(), None);
        // Past the end, and a torn hint file: no hint.
        log.save_commit_hint(LogId::new(openraft::CommittedLeaderId::new(3, 1), 9)).unwrap();
        assert_eq!(log.commit_hint().unwrap(), None);
        std::fs::write(dir.path().join("log").join(HINT_FILE), [1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        assert_eq!(log.commit_hint().unwrap(), None);
    }

    /// Reads served from memory without a hand-off to a blocking thread return what a read
    /// returns, and decline (`None`) any range that reaches entries only the files hold.
    #[test]
    fn cached_reads_match_reads_and_decline_what_only_the_files_hold() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        assert_eq!(log.read_cached(1, 5).map(|v| v.len()), Some(0), "an empty log reads nothing");
        log.append((1..=5).map(|i| entry(1, i, 100)).collect()).unwrap().sync().unwrap();
        let shown = |v: Vec<Entry>| v.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>();
        for (a, b) in [(1, 5), (2, 3), (5, 9), (0, u64::MAX), (6, 9), (4, 2)] {
            let cached = log.read_cached(a, b).map(shown);
            assert_eq!(cached, Some(shown(log.read(a, b).unwrap())), "{a}..={b}");
        }
        drop(log);
        let mut log = open(&dir, None);
        assert!(log.read_cached(1, 5).is_none(), "after a restart the entries are only in the files");
        assert!(log.read_cached(4, 4).is_none());
        log.append(vec![entry(1, 6, 10)]).unwrap().sync().unwrap();
        assert_eq!(log.read_cached(6, 9).map(shown), Some(shown(log.read(6, 9).unwrap())));
        assert!(log.read_cached(5, 6).is_none(), "a range reaching past the cache goes to the files");
        assert_eq!(log.read(1, 6).unwrap().len(), 6);
    }

    #[test]
    fn appended_entries_survive_reopen_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=5).map(|i| entry(1, i, 100)).collect()).unwrap().sync().unwrap();
        log.append(vec![entry(2, 6, 10)]).unwrap().sync().unwrap();
        drop(log);
        let mut log = open(&dir, None);
        assert_eq!(indexes(&log), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(log.last_log_id().unwrap().leader_id.term, 2);
        assert_eq!(log.read(3, 4).unwrap().len(), 2);
        assert!(log.append(vec![entry(2, 9, 1)]).is_err(), "a gap is refused");
    }

    #[test]
    fn reads_span_the_files_and_the_in_memory_tail_alike() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        // Entries of a third of the cache each: only the newest few stay in memory.
        let big = (CACHE_BYTES / 3) as usize;
        log.append((1..=6).map(|i| entry(1, i, big)).collect()).unwrap().sync().unwrap();
        assert!(log.cache.len() < 6 && !log.cache.is_empty());
        let all = log.read(1, 6).unwrap();
        assert_eq!(all.iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
        for e in &all {
            let Some(crate::raft::Command::Publish { data, .. }) = (match &e.payload {
                EntryPayload::Normal(c) => Some(c),
                _ => None,
            }) else {
                panic!("entry {} lost its command", e.log_id.index)
            };
            assert_eq!(data.len(), big);
            assert!(data.iter().all(|b| *b == e.log_id.index as u8));
        }
        assert_eq!(log.read(5, 5).unwrap()[0].log_id.index, 5);
        log.truncate(5).unwrap();
        assert_eq!(log.read(1, 10).unwrap().len(), 4);
        log.purge(id(1, 2)).unwrap().remove().unwrap();
        assert_eq!(log.read(0, 10).unwrap().iter().map(|e| e.log_id.index).collect::<Vec<_>>(), vec![3, 4]);
    }

    #[test]
    fn truncated_entries_never_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=6).map(|i| entry(1, i, 50)).collect()).unwrap().sync().unwrap();
        log.truncate(4).unwrap();
        // The replacement is the same size as what it replaces: stale records would line up.
        log.append(vec![entry(2, 4, 50)]).unwrap().sync().unwrap();
        drop(log);
        let log = open(&dir, None);
        assert_eq!(indexes(&log), vec![1, 2, 3, 4]);
        assert_eq!(log.last_log_id().unwrap().leader_id.term, 2);
    }

    /// XORs the byte at `offset` of segment 1 under `dir` with `mask` (twice restores it).
    fn flip_byte(dir: &tempfile::TempDir, offset: u64, mask: u8) {
        let f = FsSegments::new(dir.path().join("log")).unwrap().open(1).unwrap();
        let mut b = [0u8; 1];
        f.read_at(offset, &mut b).unwrap();
        f.write_at(offset, &[b[0] ^ mask]).unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_and_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=3).map(|i| entry(1, i, 64)).collect()).unwrap().sync().unwrap();
        let third = log.locs[2];
        drop(log);
        // Flip a body byte of the last record, as a torn write would leave it.
        flip_byte(&dir, third.offset + 20, 0xff);
        let mut log = open(&dir, None);
        assert_eq!(indexes(&log), vec![1, 2]);
        log.append(vec![entry(1, 3, 8)]).unwrap().sync().unwrap();
        assert_eq!(indexes(&open(&dir, None)), vec![1, 2, 3]);
    }

    /// Asserts that the log in `dir` does not open, refused as damage the disk returned rather
    /// than cut as a torn write; `what` says why it must be refused.
    fn assert_refused_as_damage(dir: &tempfile::TempDir, what: &str) {
        let err = SegmentLog::open(Arc::new(FsSegments::new(dir.path().join("log")).unwrap()), None).err().expect(what);
        assert!(err.to_string().contains("not a torn write"), "{what}: {err}");
    }

    #[test]
    fn a_flipped_bit_before_the_last_record_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=4).map(|i| entry(1, i, 700)).collect()).unwrap().sync().unwrap();
        let second = log.locs[1];
        drop(log);
        // One bit of the second record's body, then (separately) of its length.
        for at in [second.offset + 300, second.offset] {
            flip_byte(&dir, at, 0x04);
            assert_refused_as_damage(&dir, "a flipped bit is refused");
            flip_byte(&dir, at, 0x04);
        }
        assert_eq!(indexes(&open(&dir, None)), vec![1, 2, 3, 4], "the log is whole again");
    }

    /// Simulation seed 69595: a flipped bit left a record's length at zero (a length with one
    /// bit set), and recovery took the zero for the log's clean end: the node restarted without
    /// the acknowledged entries from there on, led its term again and wrote other entries under
    /// the same log ids. A header of zeros is the end; a zero length in any other header is
    /// damage, refused like any flipped bit when an intact record follows.
    #[test]
    fn a_flipped_bit_that_zeroes_a_length_is_refused_not_taken_for_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=4).map(|i| entry(1, i, 40)).collect()).unwrap().sync().unwrap();
        let second = log.locs[1];
        drop(log);
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        let f = fs.open(1).unwrap();
        let mut len = [0u8; 4];
        f.read_at(second.offset, &mut len).unwrap();
        f.write_at(second.offset, &[0u8; 4]).unwrap();
        assert_refused_as_damage(&dir, "a record whose length reads zero, followed by intact records, is refused");
        f.write_at(second.offset, &len).unwrap();
        assert_eq!(indexes(&open(&dir, None)), vec![1, 2, 3, 4], "the log is whole again");
    }

    #[test]
    fn a_torn_append_that_kept_a_later_sector_is_still_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=2).map(|i| entry(1, i, 100)).collect()).unwrap().sync().unwrap();
        log.append((3..=5).map(|i| entry(1, i, 2000)).collect()).unwrap().sync().unwrap();
        let (third, fourth) = (log.locs[2], log.locs[3]);
        drop(log);
        // Unordered writeback lost a sector inside record 3 and kept records 4 and 5.
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        let f = fs.open(1).unwrap();
        let lost = (third.offset + 600).next_multiple_of(SECTOR_BYTES);
        assert!(lost + SECTOR_BYTES <= fourth.offset);
        f.write_at(lost, &[0u8; SECTOR_BYTES as usize]).unwrap();
        assert_eq!(indexes(&open(&dir, None)), vec![1, 2], "cut as a torn tail, and the node starts");
    }

    #[test]
    fn purge_removes_whole_segments_and_reopen_skips_purged_entries() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        // Entries of half a full segment each: the first segment is made the size of one (it
        // starts small), then they double to the full size, two entries each.
        let big = (SEGMENT_BYTES / 2 - 64) as usize;
        log.append((1..=5).map(|i| entry(1, i, big)).collect()).unwrap().sync().unwrap();
        assert_eq!(log.segment_count(), 3);
        assert_eq!(log.locs.iter().map(|l| l.segment).collect::<Vec<_>>(), vec![1, 2, 2, 4, 4]);
        log.purge(id(1, 3)).unwrap().remove().unwrap();
        assert_eq!(log.segment_count(), 1, "the segments holding 1 to 3 are gone");
        assert_eq!(segment_files(&dir), vec![4]);
        assert_eq!(indexes(&log), vec![4, 5]);
        drop(log);
        let log = open(&dir, Some(id(1, 3)));
        assert_eq!(indexes(&log), vec![4, 5]);
        assert_eq!(log.first_index(), 4);
    }

    fn segment_files(dir: &tempfile::TempDir) -> Vec<u64> {
        let mut names = FsSegments::new(dir.path().join("log")).unwrap().list().unwrap();
        names.sort_unstable();
        names
    }

    /// A purge only retires the segments it empties: their files stay until `Retired::remove`
    /// runs (after the log's lock is released, off the Raft core's path). A crash in between
    /// leaves them to the next start, which removes them and serves exactly the entries after
    /// the purge point; and appends go on meanwhile.
    #[test]
    fn retired_segments_stay_until_removed_and_a_crash_before_leaves_them_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        let big = (SEGMENT_BYTES / 2 - 64) as usize;
        log.append((1..=5).map(|i| entry(1, i, big)).collect()).unwrap().sync().unwrap();
        let retired = log.purge(id(1, 3)).unwrap();
        assert_eq!(retired.len(), 2);
        assert_eq!(segment_files(&dir), vec![1, 2, 4], "nothing removed under the log's lock");
        assert_eq!(indexes(&log), vec![4, 5], "yet the purged entries are no longer served");
        log.append(vec![entry(1, 6, 10)]).unwrap().sync().unwrap();
        drop(retired); // the crash: the removal never ran
        drop(log);
        let log = open(&dir, Some(id(1, 3)));
        assert_eq!(indexes(&log), vec![4, 5, 6]);
        assert_eq!(segment_files(&dir), vec![4], "the next start removed what the purge retired");
        let mut log = log;
        let retired = log.purge(id(1, 5)).unwrap();
        assert!(retired.is_empty(), "segment 4 still holds entry 6");
        let nothing = log.purge(id(1, 4)).unwrap();
        assert!(nothing.is_empty(), "a purge point below the current one changes nothing");
    }

    /// A retired segment is renamed out of the log before it is shortened, so a crash mid-way
    /// never leaves a shortened file under a segment's name (the next start would take it for
    /// damage); the next start removes such a leftover.
    #[test]
    fn a_retired_segment_is_shortened_under_another_name_and_a_leftover_is_removed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        let file = fs.create(7, 3 * RETIRE_CHUNK_BYTES + 5).unwrap();
        file.write_at(0, b"record").unwrap();
        fs.create(9, SEGMENT_BYTES_MIN).unwrap();
        fs.remove_retired(7).unwrap();
        assert_eq!(segment_files(&dir), vec![9]);
        let names = |d: &std::path::Path| {
            let mut n: Vec<String> =
                std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            n.sort();
            n
        };
        let log_dir = dir.path().join("log");
        assert_eq!(names(&log_dir), [format!("{:020}.seg", 9)], "nothing left of segment 7");
        // A crash while segment 3 was being shortened: it is under its retired name.
        std::fs::write(log_dir.join(format!("{:020}{RETIRED_SUFFIX}", 3)), b"part").unwrap();
        assert_eq!(fs.list().unwrap(), vec![9], "a retired segment is not part of the log");
        drop(fs);
        FsSegments::new(log_dir.clone()).unwrap();
        assert_eq!(names(&log_dir), [format!("{:020}.seg", 9)], "the leftover was removed at start");
    }

    /// Segments start at SEGMENT_BYTES_MIN and double up to SEGMENT_BYTES; a record larger than
    /// that gets its own size. A fresh node's first segment takes 1 MiB, not 64.
    #[test]
    fn segments_grow_from_small_to_the_full_size() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(next_segment_bytes(None, 100), SEGMENT_BYTES_MIN);
        assert_eq!(next_segment_bytes(Some(SEGMENT_BYTES_MIN), 100), 2 * SEGMENT_BYTES_MIN);
        assert_eq!(next_segment_bytes(Some(32 * MIB), 100), SEGMENT_BYTES);
        assert_eq!(next_segment_bytes(Some(SEGMENT_BYTES), 100), SEGMENT_BYTES);
        assert_eq!(next_segment_bytes(Some(100 * MIB), 100), SEGMENT_BYTES, "after an oversized record");
        assert_eq!(next_segment_bytes(None, 3 * MIB), 3 * MIB);
        assert_eq!(next_segment_bytes(Some(SEGMENT_BYTES), 80 * MIB), 80 * MIB);
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append(vec![entry(1, 1, 10)]).unwrap().sync().unwrap();
        let first = std::fs::metadata(dir.path().join("log").join(format!("{:020}.seg", 1))).unwrap().len();
        assert_eq!(first, SEGMENT_BYTES_MIN);
    }

    /// A directory whose file system has room for a record but not for a preallocated segment.
    struct Cramped {
        inner: FsSegments,
        room: u64,
    }

    impl SegmentDir for Cramped {
        fn list(&self) -> io::Result<Vec<u64>> {
            self.inner.list()
        }
        fn open(&self, first: u64) -> io::Result<Arc<dyn SegmentFile>> {
            self.inner.open(first)
        }
        fn create(&self, first: u64, bytes: u64) -> io::Result<Arc<dyn SegmentFile>> {
            if bytes > self.room {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.inner.create(first, bytes)
        }
        fn remove(&self, first: u64) -> io::Result<()> {
            self.inner.remove(first)
        }
        fn save_commit_hint(&self, bytes: &[u8]) -> io::Result<()> {
            self.inner.save_commit_hint(bytes)
        }
        fn load_commit_hint(&self) -> io::Result<Option<Vec<u8>>> {
            self.inner.load_commit_hint()
        }
    }

    #[test]
    fn a_disk_without_room_for_a_segment_still_takes_a_record_that_fits() {
        let dir = tempfile::tempdir().unwrap();
        let cramped = Cramped { inner: FsSegments::new(dir.path().join("log")).unwrap(), room: 4096 };
        let mut log = SegmentLog::open(Arc::new(cramped), None).unwrap();
        log.append(vec![entry(1, 1, 100)]).unwrap().sync().unwrap();
        log.append(vec![entry(1, 2, 100)]).unwrap().sync().unwrap();
        assert_eq!(indexes(&log), vec![1, 2]);
        let too_big = log.append(vec![entry(1, 3, 8192)]).map(|_| ()).unwrap_err();
        assert!(too_big.is_storage_full(), "{too_big}");
    }

    #[test]
    fn appending_after_purging_everything_starts_a_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=3).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        // A snapshot beyond the log (installed from the leader) purges past its end.
        log.purge(id(3, 10)).unwrap().remove().unwrap();
        assert!(log.is_empty());
        assert_eq!(log.first_index(), 11);
        log.append(vec![entry(3, 11, 10), entry(3, 12, 10)]).unwrap().sync().unwrap();
        drop(log);
        let log = open(&dir, Some(id(3, 10)));
        assert_eq!(indexes(&log), vec![11, 12]);
    }

    #[test]
    fn entries_at_or_below_the_purge_point_are_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, Some(id(1, 5)));
        log.append((4..=7).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        assert_eq!(indexes(&log), vec![6, 7]);
    }

    /// A purge point of a newer term than the entries after it (openraft's start-up repair
    /// purging to the applied log id, or a snapshot restored or installed over a stale log):
    /// the stale entries are discarded for good, the log reports nothing after the purge point,
    /// and the leader's next entry is accepted (simulation seed 200860).
    #[test]
    fn a_purge_point_of_a_newer_term_discards_the_stale_entries_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=6).map(|i| entry(1, i, 50)).collect()).unwrap().sync().unwrap();
        log.purge(id(3, 4)).unwrap().remove().unwrap();
        assert_eq!((log.purged(), log.last_log_id(), log.first_index()), (Some(id(3, 4)), None, 5));
        log.append(vec![entry(3, 5, 50)]).unwrap().sync().unwrap();
        drop(log);
        let log = open(&dir, Some(id(3, 4)));
        assert_eq!(log.read(0, u64::MAX).unwrap().iter().map(|e| e.log_id).collect::<Vec<_>>(), vec![id(3, 5)]);
    }

    /// The same stale tail found at start-up (a crash after the new purge point was saved and
    /// before the log was purged, or a snapshot ahead of the log): recovery discards it, durably.
    #[test]
    fn reopening_on_a_newer_purge_point_discards_the_stale_tail_durably() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=6).map(|i| entry(1, i, 50)).collect()).unwrap().sync().unwrap();
        drop(log);
        let mut log = open(&dir, Some(id(3, 4)));
        assert_eq!((log.last_log_id(), log.first_index()), (None, 5));
        log.append(vec![entry(3, 5, 10), entry(4, 6, 10)]).unwrap().sync().unwrap();
        drop(log);
        let log = open(&dir, Some(id(3, 4)));
        assert_eq!(
            log.read(0, u64::MAX).unwrap().iter().map(|e| e.log_id).collect::<Vec<_>>(),
            vec![id(3, 5), id(4, 6)]
        );
        // Entries that do follow the purge point are kept, as ever.
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=6).map(|i| entry(2, i, 50)).collect()).unwrap().sync().unwrap();
        drop(log);
        assert_eq!(indexes(&open(&dir, Some(id(2, 4)))), vec![5, 6]);
    }

    /// Truncating from below the first entry held (at or below the purge point) empties the
    /// log but keeps its next index right after the purge point; an empty log with a purge
    /// point accepts only the entry right after it.
    #[test]
    fn an_emptied_log_continues_right_after_its_purge_point() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=6).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        log.purge(id(1, 3)).unwrap().remove().unwrap();
        log.truncate(2).unwrap();
        assert_eq!((log.last_log_id(), log.first_index()), (None, 4));
        assert!(log.append(vec![entry(2, 6, 10)]).is_err(), "a gap after the purge point is refused");
        log.append(vec![entry(2, 4, 10)]).unwrap().sync().unwrap();
        assert_eq!(indexes(&log), vec![4]);
    }

    /// The invariant check is not vacuous: it names a cache out of line with the entries held,
    /// a hole, and a first entry that does not follow the purge point.
    #[test]
    fn the_invariant_check_finds_a_broken_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=4).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        assert_eq!(log.invariant_violation(), None);
        let (e, size) = log.cache.pop_back().unwrap();
        assert!(log.invariant_violation().unwrap().contains("cached entry"));
        log.cache.push_back((e, size));
        log.locs.remove(1);
        assert!(log.invariant_violation().unwrap().contains("not contiguous"));
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        log.append((1..=4).map(|i| entry(1, i, 10)).collect()).unwrap().sync().unwrap();
        log.purged = Some(id(2, 0));
        assert!(log.invariant_violation().unwrap().contains("does not follow the purge point"));
    }

    #[test]
    fn damage_inside_an_older_segment_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(&dir, None);
        let big = (SEGMENT_BYTES / 2 - 64) as usize;
        log.append((1..=3).map(|i| entry(1, i, big)).collect()).unwrap().sync().unwrap();
        let first = log.locs[0];
        drop(log);
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        fs.open(1).unwrap().write_at(first.offset + 30, &[1, 2, 3]).unwrap();
        let fs = FsSegments::new(dir.path().join("log")).unwrap();
        assert!(matches!(SegmentLog::open(Arc::new(fs), None), Err(StoreError::Corrupt(_))));
    }
}
