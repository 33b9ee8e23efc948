//! A simulated file system per node: the redb file and the Raft log's segment files, which keep
//! only what was synced when the power goes out.
//!
//! Owns: the durability model of a node's files. The disk outlives the node's incarnations (the
//! host factory captures it) and holds named files: [`REDB_FILE`] (and [`REDB_FILE_NEW`] while
//! it is created: `runnev::storage::db_dir` creates it under that name and renames it, through
//! [`SimDbDir`], a [`DatabaseDir`]; each is served to redb through [`DiskHandle`], a redb
//! [`StorageBackend`]) and the segments `log/<first:020>.seg` (served to
//! `runnev::storage::segments::SegmentLog` through [`SimSegments`], a [`SegmentDir`]). Every
//! write to any file lands in a volatile layer of dirty pages (the page cache); a file's
//! `sync_data` makes *that file's* volatile layer durable (other files' dirty pages stay
//! volatile), and a crash decides what survives, in every file at once:
//! - [`CrashKind::Kill`] (the process dies, the machine stays up): the page cache survives, so
//!   unsynced writes stay visible to the next incarnation, still unsynced;
//! - [`CrashKind::PowerLoss`]: the page cache is lost; optionally a seeded random subset of the
//!   dirty pages reached the platter first (torn, unordered writes, as a real disk may do).
//!
//! Each incarnation gets handles stamped with the disk's epoch; a crash bumps the epoch, so a
//! crashed incarnation's handles (its redb `Database` is dropped while turmoil tears the host
//! down, and would flush) fail every operation from then on.
//!
//! Two more faults: a crash can be armed to strike *inside* a sequence of disk operations
//! ([`SimDisk::arm_cut`]): one counter over every file counts writes, resizes, syncs, file
//! creations, renames and removals, so a cut can fall between a redb commit's page writes and its fsync
//! as well as between a segment append's write and its fsync, or inside a segment's
//! [`SegmentFile::zero_from`] (three operations: shrink, grow, sync). The process that was cut
//! does not know it died until the driver tears its host down at the end of the step, so until
//! then its handles work on a private copy of the whole file system (a ghost) that nothing else
//! ever sees. And the disk can fail ([`SimDisk::set_failing`]): every write-side operation on
//! any file returns an I/O error, as a dying or full disk does.
//!
//! Simplification, on purpose: **creating, renaming and removing a file are durable at once**
//! (a crash never loses a creation, a rename or a removal, never brings a removed file back,
//! and a created file reads as zeros whatever happens). The real
//! [`runnev::storage::segments::FsSegments`] fsyncs the new file and the directory before
//! `create` returns and the directory after `remove`, and `runnev::storage::db_dir` fsyncs the
//! directory after renaming a new database into place, so this models only their completed
//! calls; a crash inside those calls (a missing or half-allocated new segment, a removed one
//! that comes back, a rename not yet durable) is not simulated, and a directory's fsync
//! ([`SimDbDir`]'s `sync`) does nothing and is not counted. A removed or replaced file stays
//! usable through the handles already open on it (as an unlinked file does) until the next
//! crash.
//!
//! Must never: let a write reach the durable image without a sync of its file, or let a crashed
//! incarnation touch the disk.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::StorageBackend;
use runnev::storage::db_dir::DatabaseDir;
use runnev::storage::payloads::{PayloadDir, SegmentKey};
use runnev::storage::segments::{SegmentDir, SegmentFile};

use crate::rng::SimRng;

/// Granularity of the volatile layer, in bytes: what a torn power loss keeps or loses as a unit.
pub const PAGE_BYTES: usize = 4096;

const PAGE: u64 = PAGE_BYTES as u64;

/// The redb database's file name on a simulated disk (`runnev::storage::db_dir::DB_FILE`).
pub const REDB_FILE: &str = runnev::storage::db_dir::DB_FILE;

/// The name a new database is created under before it is renamed to [`REDB_FILE`]
/// (`runnev::storage::db_dir::DB_FILE_NEW`).
pub const REDB_FILE_NEW: &str = runnev::storage::db_dir::DB_FILE_NEW;

/// The name of the segment whose first log index is `first` (as `FsSegments` names it, under
/// the data directory).
pub fn segment_name(first: u64) -> String {
    format!("log/{first:020}.seg")
}

fn segment_first(name: &str) -> Option<u64> {
    name.strip_prefix("log/")?.strip_suffix(".seg")?.parse().ok()
}

/// How a node goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    /// `kill -9`: the process dies, the OS page cache (unsynced writes) survives.
    Kill,
    /// Power cut: unsynced writes are lost, except that each dirty page independently reached
    /// the disk with probability `keep_per_mille / 1000` (0 = all lost).
    PowerLoss {
        /// Chance, in thousandths, that one unsynced page survives.
        keep_per_mille: u64,
    },
}

/// Counters for the run report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// `sync_data` calls that succeeded (redb's and the segments', `zero_from`'s included).
    pub syncs: u64,
    /// Crashes suffered (driver crashes and mid-write cuts).
    pub crashes: u64,
    /// Dirty pages a power loss discarded.
    pub pages_lost: u64,
    /// Dirty pages a torn power loss kept.
    pub pages_torn_in: u64,
    /// Operations refused to a crashed incarnation.
    pub stale_ops: u64,
    /// Operations failed with an I/O error while the disk was failing.
    pub failed_ops: u64,
    /// Operations refused with `ENOSPC` while the disk was full.
    pub full_refusals: u64,
    /// `sync_data` calls made slow by a slow disk.
    pub slow_syncs: u64,
    /// Simulated latency those slow syncs added, in ms.
    pub slow_ms: u64,
    /// Bits flipped in stored data.
    pub bits_flipped: u64,
}

/// One file's bytes as one incarnation sees them: a durable image plus the dirty pages over it.
/// Sparse: a page that was never written reads as zeros and takes no memory (a segment is
/// preallocated to 64 MiB and mostly empty).
#[derive(Debug, Clone, Default)]
struct Image {
    /// What survives a power loss, by page; an absent page reads as zeros, and every byte at or
    /// past `durable_len` is zero.
    durable: BTreeMap<u64, Box<[u8]>>,
    /// The durable length.
    durable_len: u64,
    /// Current length as the running incarnation sees it.
    len: u64,
    /// Pages written since the last sync: page number → the page's current content.
    dirty: BTreeMap<u64, Box<[u8]>>,
    /// The shortest length the file was cut to since the last sync: durable bytes at or past it
    /// read as zeros (they are still on the platter until a sync makes the truncation durable).
    shrunk_to: Option<u64>,
}

fn out_of_range(what: &str, offset: u64, n: usize, len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("simulated disk: {what} of {n} bytes at {offset} past length {len}"),
    )
}

fn zero_page() -> Box<[u8]> {
    vec![0u8; PAGE_BYTES].into_boxed_slice()
}

impl Image {
    /// A file of `len` zero bytes, durable.
    fn zeros(len: u64) -> Image {
        Image { durable_len: len, len, ..Default::default() }
    }

    /// Copies bytes `in_page..in_page + out.len()` of page `p`, as the running incarnation sees
    /// them, into `out`.
    fn read_page(&self, p: u64, in_page: usize, out: &mut [u8]) {
        let range = in_page..in_page + out.len();
        if let Some(d) = self.dirty.get(&p) {
            out.copy_from_slice(&d[range]);
            return;
        }
        match self.durable.get(&p) {
            Some(d) => out.copy_from_slice(&d[range]),
            None => out.fill(0),
        }
        if let Some(s) = self.shrunk_to {
            let start = p * PAGE + in_page as u64;
            let keep = s.saturating_sub(start).min(out.len() as u64) as usize;
            out[keep..].fill(0);
        }
    }

    fn dirty_page(&mut self, p: u64) -> &mut Box<[u8]> {
        if !self.dirty.contains_key(&p) {
            let mut page = zero_page();
            self.read_page(p, 0, &mut page);
            self.dirty.insert(p, page);
        }
        self.dirty.get_mut(&p).expect("inserted above")
    }

    /// Copies the bytes of `page` below `limit` into durable page `p` (bytes at or past `limit`
    /// keep their durable content), extending the durable length up to `limit` at most.
    fn persist_page(&mut self, p: u64, page: &[u8], limit: u64) {
        let start = p * PAGE;
        let end = (start + PAGE).min(limit);
        if end <= start {
            return;
        }
        let n = (end - start) as usize;
        let d = self.durable.entry(p).or_insert_with(zero_page);
        d[..n].copy_from_slice(&page[..n]);
        self.durable_len = self.durable_len.max(end);
    }

    /// Zeros every durable byte at or past `at` (the durable length is the caller's business).
    fn zero_durable_from(&mut self, at: u64) {
        drop(self.durable.split_off(&at.div_ceil(PAGE)));
        if !at.is_multiple_of(PAGE) {
            if let Some(d) = self.durable.get_mut(&(at / PAGE)) {
                d[(at % PAGE) as usize..].fill(0);
            }
        }
    }

    /// Loses the volatile layer as `kind` says; returns (pages kept, pages lost).
    fn crash(&mut self, kind: CrashKind, rng: &mut SimRng) -> (u64, u64) {
        let CrashKind::PowerLoss { keep_per_mille } = kind else { return (0, 0) };
        let dirty = std::mem::take(&mut self.dirty);
        let (mut kept, mut lost) = (0, 0);
        for (p, page) in dirty {
            if keep_per_mille > 0 && rng.chance(keep_per_mille) {
                self.persist_page(p, &page, self.len);
                kept += 1;
            } else {
                lost += 1;
            }
        }
        self.shrunk_to = None;
        self.len = self.durable_len;
        (kept, lost)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let end =
            offset.checked_add(out.len() as u64).ok_or_else(|| out_of_range("read", offset, out.len(), self.len))?;
        if end > self.len {
            return Err(out_of_range("read", offset, out.len(), self.len));
        }
        let mut done = 0usize;
        while done < out.len() {
            let pos = offset + done as u64;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE_BYTES - in_page).min(out.len() - done);
            self.read_page(pos / PAGE, in_page, &mut out[done..done + n]);
            done += n;
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            // What lies past the new end reads as zeros from now on (growing again included);
            // the durable image keeps the old bytes until a sync makes the truncation durable.
            self.shrunk_to = Some(self.shrunk_to.map_or(len, |s| s.min(len)));
            drop(self.dirty.split_off(&len.div_ceil(PAGE)));
            if !len.is_multiple_of(PAGE) {
                if let Some(d) = self.dirty.get_mut(&(len / PAGE)) {
                    d[(len % PAGE) as usize..].fill(0);
                }
            }
        }
        self.len = len;
    }

    fn sync(&mut self) {
        if let Some(s) = self.shrunk_to.take() {
            self.zero_durable_from(s);
        }
        let len = self.len;
        for (p, page) in std::mem::take(&mut self.dirty) {
            self.persist_page(p, &page, len);
        }
        self.zero_durable_from(len);
        self.durable_len = len;
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let end =
            offset.checked_add(data.len() as u64).ok_or_else(|| out_of_range("write", offset, data.len(), self.len))?;
        if end > self.len {
            return Err(out_of_range("write", offset, data.len(), self.len));
        }
        let mut done = 0usize;
        while done < data.len() {
            let pos = offset + done as u64;
            let in_page = (pos % PAGE) as usize;
            let n = (PAGE_BYTES - in_page).min(data.len() - done);
            self.dirty_page(pos / PAGE)[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }
}

/// The files of one node: names → inodes. An inode no name points to (a removed or replaced
/// file) lives on while handles may still use it, until the next crash.
#[derive(Debug, Clone, Default)]
struct Files {
    names: BTreeMap<String, u64>,
    inodes: BTreeMap<u64, Image>,
    next_inode: u64,
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("simulated disk: no file {name}"))
}

impl Files {
    /// Creates (or replaces) `name` as `len` zero bytes, durably; returns its inode.
    fn create(&mut self, name: &str, len: u64) -> u64 {
        let ino = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(ino, Image::zeros(len));
        self.names.insert(name.to_string(), ino);
        ino
    }

    fn lookup(&self, name: &str) -> io::Result<u64> {
        self.names.get(name).copied().ok_or_else(|| not_found(name))
    }

    fn image(&mut self, ino: u64) -> io::Result<&mut Image> {
        self.inodes.get_mut(&ino).ok_or_else(|| io::Error::other(format!("simulated disk: inode {ino} is gone")))
    }

    /// Renames `from` to `to`, replacing `to` (whose inode lives on for its handles).
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let ino = self.names.remove(from).ok_or_else(|| not_found(from))?;
        self.names.insert(to.to_string(), ino);
        Ok(())
    }

    /// Frees the inodes no name points to (their handles died with the process).
    fn drop_orphans(&mut self) {
        let named: std::collections::BTreeSet<u64> = self.names.values().copied().collect();
        self.inodes.retain(|ino, _| named.contains(ino));
    }
}

/// A crash armed to strike in the middle of the disk's next operations.
#[derive(Debug)]
struct Cut {
    ops_left: u64,
    kind: CrashKind,
    rng: SimRng,
}

#[derive(Debug, Default)]
struct DiskState {
    /// Incarnation allowed to use the disk.
    epoch: u64,
    /// The disk's files.
    files: Files,
    /// The private copy a cut incarnation keeps using until its host is torn down: (its epoch,
    /// its view of every file).
    ghost: Option<(u64, Files)>,
    /// An armed mid-write crash, if any.
    cut: Option<Cut>,
    /// A mid-write crash struck and the host has not been torn down yet.
    cut_fired: bool,
    /// The node's data dir on the real file system (its `FORMAT` and snapshot files), which a
    /// cut rolls back to what it held when the cut struck ([`SimDisk::set_real_dir`]).
    real_dir: Option<PathBuf>,
    /// The regular files under [`DiskState::real_dir`] when the last cut struck: (path relative
    /// to it, bytes).
    real_at_cut: Option<Vec<(PathBuf, Vec<u8>)>>,
    /// Write-side operations fail with an I/O error.
    failing: bool,
    /// Write-side operations fail with `ENOSPC` (the disk is full).
    full: bool,
    /// Each `sync_data` takes a latency drawn from this range, in ms (a slow disk).
    slow: Option<Slow>,
    stats: DiskStats,
}

/// A slow disk: each fsync takes `min_ms..=max_ms` of simulated time.
#[derive(Debug)]
struct Slow {
    min_ms: u64,
    max_ms: u64,
    rng: SimRng,
}

impl DiskState {
    fn crash(&mut self, kind: CrashKind, rng: &mut SimRng) {
        self.epoch += 1;
        self.stats.crashes += 1;
        // The process is gone: so are the files only its open handles kept alive.
        self.files.drop_orphans();
        for image in self.files.inodes.values_mut() {
            let (kept, lost) = image.crash(kind, rng);
            self.stats.pages_torn_in += kept;
            self.stats.pages_lost += lost;
        }
    }

    /// Counts one write-side operation against an armed cut; when it strikes, the disk crashes
    /// under the running incarnation, which carries on on a ghost of what it saw.
    fn count_cut(&mut self) {
        let Some(cut) = self.cut.as_mut() else { return };
        cut.ops_left = cut.ops_left.saturating_sub(1);
        if cut.ops_left > 0 {
            return;
        }
        let Cut { kind, mut rng, .. } = self.cut.take().expect("checked above");
        self.ghost = Some((self.epoch, self.files.clone()));
        self.crash(kind, &mut rng);
        self.cut_fired = true;
        self.real_at_cut = self.real_dir.as_deref().map(read_regular_files);
    }
}

/// The paths, relative to `dir`, of the regular files under it, in it and in its subdirectories
/// (a data dir keeps its snapshots in its group's directory, `groups/0/`), sorted.
fn regular_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, under: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            let rel = under.join(e.file_name());
            if kind.is_dir() {
                walk(&e.path(), &rel, files);
            } else if kind.is_file() {
                files.push(rel);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, Path::new(""), &mut files);
    files.sort();
    files
}

/// The regular files under `dir` ([`regular_files`]) with their bytes; a file that cannot be
/// read is left out (none is expected: the run's own temporary directory).
fn read_regular_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    regular_files(dir).into_iter().filter_map(|rel| std::fs::read(dir.join(&rel)).ok().map(|b| (rel, b))).collect()
}

/// Puts the regular files under `dir` back to `files` (paths relative to `dir`): removes the
/// others, writes these (creating `dir` and their directories if they are gone).
fn restore_regular_files(dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for rel in regular_files(dir) {
        if !files.iter().any(|(name, _)| *name == rel) {
            std::fs::remove_file(dir.join(&rel))?;
        }
    }
    for (rel, bytes) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    Ok(())
}

/// One node's disk, shared by all its incarnations.
#[derive(Debug, Clone)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk::new()
    }
}

impl SimDisk {
    /// An empty disk: no file (a node's first start creates the database, through
    /// [`SimDisk::db_dir`]).
    pub fn new() -> Self {
        SimDisk { state: Arc::new(Mutex::new(DiskState::default())) }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn access(&self) -> Access {
        Access { state: self.state.clone(), epoch: self.lock().epoch }
    }

    /// The redb backend of [`REDB_FILE`] for the incarnation starting now, the file created
    /// empty (durably, not counted against a cut) if it does not exist: for inspections and
    /// tests that open redb by hand. A node opens its store through [`SimDisk::db_dir`], which
    /// creates the database as production does.
    pub fn handle(&self) -> DiskHandle {
        let ino = {
            let mut s = self.lock();
            match s.files.lookup(REDB_FILE) {
                Ok(ino) => ino,
                Err(_) => s.files.create(REDB_FILE, 0),
            }
        };
        DiskHandle { access: self.access(), ino }
    }

    /// The directory holding the database file, for the incarnation starting now: what
    /// `runnev::storage::Store::open_with` creates and opens the database through.
    pub fn db_dir(&self) -> SimDbDir {
        SimDbDir { access: self.access() }
    }

    /// The segment directory for the incarnation starting now.
    pub fn segments(&self) -> Arc<dyn SegmentDir> {
        Arc::new(SimSegments { access: self.access() })
    }

    /// The payload segments' directory for the incarnation starting now.
    pub fn payloads(&self) -> Arc<dyn PayloadDir> {
        Arc::new(SimPayloads { access: self.access() })
    }

    /// The node crashed: the current incarnation's handles are dead from now on, and unsynced
    /// writes survive or not according to `kind` (`rng` draws the torn pages).
    pub fn crash(&self, kind: CrashKind, rng: &mut SimRng) {
        let mut s = self.lock();
        s.cut = None;
        s.ghost = None;
        s.crash(kind, rng);
    }

    /// The disk is replaced by an empty one (an operator swapped a failed disk, or wiped the
    /// data dir): every file is gone, redb's too, the current incarnation's handles are dead (as
    /// after a crash; call it with the node down), and an armed cut is disarmed. The counters
    /// stay.
    pub fn wipe(&self) {
        let mut s = self.lock();
        s.cut = None;
        s.ghost = None;
        s.cut_fired = false;
        s.real_at_cut = None;
        s.epoch += 1;
        s.files = Files::default();
    }

    /// Arms a crash of `kind` that strikes at the `after_ops`-th write-side operation from now
    /// (a write, resize or sync of any file, a file's creation, rename or removal), in the middle of
    /// whatever the node is doing (a redb commit cut between its page writes and its fsync, a
    /// log append cut before its fsync). The driver then tears the host down
    /// ([`SimDisk::take_fired_cut`]).
    pub fn arm_cut(&self, after_ops: u64, kind: CrashKind, rng: SimRng) {
        self.lock().cut = Some(Cut { ops_left: after_ops.max(1), kind, rng });
    }

    /// Disarms a cut that has not struck; returns whether one was armed.
    pub fn disarm_cut(&self) -> bool {
        self.lock().cut.take().is_some()
    }

    /// Whether an armed cut struck since the last call. The struck incarnation's ghost is
    /// dropped: its handles fail from now on; and the node's data dir on the real file system
    /// ([`SimDisk::set_real_dir`]) is put back to what it held when the cut struck, so what the
    /// ghost wrote there (a snapshot it received or built after the cut) is gone with the rest of
    /// what it wrote. (Without this, a snapshot the ghost installed survived while the vote it
    /// saved before installing it did not: a restart found a snapshot of a term past its vote,
    /// which a real crash cannot leave, since openraft saves the vote first; seed 6935.)
    pub fn take_fired_cut(&self) -> bool {
        let mut s = self.lock();
        if std::mem::take(&mut s.cut_fired) {
            s.ghost = None;
            if let (Some(dir), Some(files)) = (s.real_dir.clone(), s.real_at_cut.take()) {
                if let Err(e) = restore_regular_files(&dir, &files) {
                    panic!("putting {} back as it was at the cut: {e}", dir.display());
                }
            }
            return true;
        }
        false
    }

    /// Names the node's data dir on the real file system (`FORMAT`, the snapshot files: what
    /// the simulated disk does not hold), which a cut rolls back ([`SimDisk::take_fired_cut`]).
    pub fn set_real_dir(&self, dir: PathBuf) {
        self.lock().real_dir = Some(dir);
    }

    /// Makes every write-side operation fail with an I/O error (`true`), or work again.
    pub fn set_failing(&self, failing: bool) {
        self.lock().failing = failing;
    }

    /// Makes every write-side operation (a write, resize or sync of any file, a file's
    /// creation, rename or removal) fail with `ENOSPC` (`io::ErrorKind::StorageFull`, raw OS error 28)
    /// while `full`, as a disk that another process filled does; reads keep working.
    /// Pessimistic: a real file system still takes overwrites of allocated blocks (a
    /// preallocated segment's), this one takes nothing.
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// Makes every `sync_data` take `min_ms..=max_ms` of simulated time, drawn from `rng`
    /// (`Some`), or none (`None`). The latency is owed to the inline storage operation running
    /// (`runnev::storage::io::owe_simulated_latency`): the node's `storage::blocking` call waits
    /// it out in tokio time before it returns, while the node's other tasks run on.
    pub fn set_slow(&self, slow: Option<(u64, u64, SimRng)>) {
        self.lock().slow = slow.map(|(min_ms, max_ms, rng)| Slow { min_ms, max_ms: max_ms.max(min_ms), rng });
    }

    /// Flips one bit of a stored record of the Raft log, drawn by `rng`: a byte of any record
    /// (header or body) but the log's last one, in the durable image (bit rot, or a disk that
    /// returns a wrong sector). Records are found by walking the documented layout (a 16-byte
    /// header whose first 4 bytes are the body length, little-endian) from each segment's start
    /// to its first zero length. The last record is spared: damage there cannot be told from a
    /// torn write (`runnev::storage::segments`, module doc), and recovery discards it. Returns
    /// where (file and byte offset), or `None` if the log holds fewer than two records. Call it
    /// after a power loss (nothing unsynced left), so that the next incarnation reads the
    /// rotten byte.
    pub fn flip_segment_bit(&self, rng: &mut SimRng) -> Option<(String, u64)> {
        let mut s = self.lock();
        // (file, inode, record start, record end), in log order.
        let mut records: Vec<(String, u64, u64, u64)> = Vec::new();
        for (name, ino) in &s.files.names {
            if segment_first(name).is_none() {
                continue;
            }
            let Some(image) = s.files.inodes.get(ino) else { continue };
            let mut off = 0u64;
            let mut header = [0u8; 16];
            while off + 16 <= image.len && image.read(off, &mut header).is_ok() {
                let len = u64::from(u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
                let end = off + 16 + len;
                if len == 0 || end > image.len {
                    break;
                }
                records.push((name.clone(), *ino, off, end));
                off = end;
            }
        }
        records.pop()?;
        if records.is_empty() {
            return None;
        }
        let (name, ino, start, end) = records.get(rng.below(records.len() as u64) as usize)?.clone();
        let at = rng.between(start, end - 1);
        let bit = rng.below(8);
        let image = s.files.inodes.get_mut(&ino)?;
        let mut byte = [0u8];
        image.read(at, &mut byte).ok()?;
        byte[0] ^= 1 << bit;
        image.write(at, &byte).ok()?;
        image.sync();
        s.stats.bits_flipped += 1;
        Some((name, at))
    }

    /// The disk's counters.
    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// A copy of what the next incarnation would find on this disk (for inspection; the copy
    /// shares nothing with this disk).
    pub fn fork(&self) -> SimDisk {
        let mut files = self.lock().files.clone();
        files.drop_orphans();
        let state = DiskState { files, ..Default::default() };
        SimDisk { state: Arc::new(Mutex::new(state)) }
    }

    /// Pages written but not yet synced, over every file.
    pub fn dirty_pages(&self) -> usize {
        self.lock().files.inodes.values().map(|i| i.dirty.len()).sum()
    }

    /// The names of the files present, in order.
    pub fn file_names(&self) -> Vec<String> {
        self.lock().files.names.keys().cloned().collect()
    }
}

/// One incarnation's right to use the disk.
#[derive(Debug, Clone)]
struct Access {
    state: Arc<Mutex<DiskState>>,
    epoch: u64,
}

fn stale() -> io::Error {
    io::Error::other("simulated disk: this incarnation crashed; its handle is dead")
}

impl Access {
    /// Runs `f` on the files this incarnation may use: the disk's, or its ghost after a cut.
    /// A write-side operation (`write`) may fail (failing disk) or trip an armed cut first.
    fn with<R>(&self, write: bool, f: impl FnOnce(&mut Files) -> io::Result<R>) -> io::Result<R> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.epoch == self.epoch && write {
            if s.failing {
                s.stats.failed_ops += 1;
                return Err(io::Error::other("simulated disk: I/O error (the disk is failing)"));
            }
            if s.full {
                s.stats.full_refusals += 1;
                return Err(io::Error::from_raw_os_error(28));
            }
            s.count_cut();
        }
        if s.epoch == self.epoch {
            return f(&mut s.files);
        }
        match &mut s.ghost {
            Some((e, ghost)) if *e == self.epoch => f(ghost),
            _ => {
                s.stats.stale_ops += 1;
                Err(stale())
            }
        }
    }

    /// Runs `f` on inode `ino`.
    fn on<R>(&self, write: bool, ino: u64, f: impl FnOnce(&mut Image) -> io::Result<R>) -> io::Result<R> {
        self.with(write, |files| f(files.image(ino)?))
    }

    fn sync(&self, ino: u64) -> io::Result<()> {
        self.on(true, ino, |i| {
            i.sync();
            Ok(())
        })?;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.stats.syncs += 1;
        if s.epoch == self.epoch {
            if let Some(slow) = s.slow.as_mut() {
                let ms = slow.rng.between(slow.min_ms, slow.max_ms);
                s.stats.slow_syncs += 1;
                s.stats.slow_ms += ms;
                runnev::storage::io::owe_simulated_latency(ms);
            }
        }
        Ok(())
    }
}

/// The redb backend of one incarnation: one file of the data directory ([`REDB_FILE`], or
/// [`REDB_FILE_NEW`] while the database is created).
#[derive(Debug)]
pub struct DiskHandle {
    access: Access,
    ino: u64,
}

impl StorageBackend for DiskHandle {
    fn len(&self) -> io::Result<u64> {
        self.access.on(false, self.ino, |i| Ok(i.len))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.access.on(false, self.ino, |i| i.read(offset, out))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.access.on(true, self.ino, |i| {
            i.set_len(len);
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.access.sync(self.ino)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.access.on(true, self.ino, |i| i.write(offset, data))
    }
}

/// The directory holding the database file, of one incarnation (the data directory's top
/// level on the simulated disk; the segments under `log/` are [`SimSegments`]'s).
///
/// Creating a file (a missing one in [`DatabaseDir::backend`]), renaming and removing are
/// write-side operations: each counts once against an armed cut (which strikes before it, so a
/// cut can fall just before or just after the rename of a new database), fails on a failing or
/// full disk, and is durable at once (module doc: a simplification). `sync` only checks that the
/// incarnation is alive: the entries are durable already.
#[derive(Debug)]
pub struct SimDbDir {
    access: Access,
}

impl DatabaseDir for SimDbDir {
    type Backend = DiskHandle;

    fn exists(&self, name: &str) -> io::Result<bool> {
        self.access.with(false, |files| Ok(files.names.contains_key(name)))
    }

    fn backend(&self, name: &str) -> io::Result<DiskHandle> {
        let ino = match self.access.with(false, |files| Ok(files.names.get(name).copied()))? {
            Some(ino) => ino,
            None => self.access.with(true, |files| Ok(files.create(name, 0)))?,
        };
        Ok(DiskHandle { access: self.access.clone(), ino })
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.access.with(true, |files| files.rename(from, to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.access.with(true, |files| files.names.remove(name).map(|_| ()).ok_or_else(|| not_found(name)))
    }

    fn sync(&self) -> io::Result<()> {
        self.access.with(false, |_| Ok(()))
    }
}

/// The Raft log's segment directory of one incarnation (`log/` on the simulated disk).
#[derive(Debug)]
pub struct SimSegments {
    access: Access,
}

/// One open segment file of one incarnation.
#[derive(Debug)]
pub struct SimSegment {
    access: Access,
    ino: u64,
}

impl SegmentDir for SimSegments {
    fn list(&self) -> io::Result<Vec<u64>> {
        self.access.with(false, |files| Ok(files.names.keys().filter_map(|n| segment_first(n)).collect()))
    }

    fn open(&self, first: u64) -> io::Result<Arc<dyn SegmentFile>> {
        let ino = self.access.with(false, |files| files.lookup(&segment_name(first)))?;
        Ok(Arc::new(SimSegment { access: self.access.clone(), ino }))
    }

    fn create(&self, first: u64, bytes: u64) -> io::Result<Arc<dyn SegmentFile>> {
        // Durable at once, directory entry included (module doc: a simplification).
        let ino = self.access.with(true, |files| Ok(files.create(&segment_name(first), bytes)))?;
        Ok(Arc::new(SimSegment { access: self.access.clone(), ino }))
    }

    fn remove(&self, first: u64) -> io::Result<()> {
        let name = segment_name(first);
        self.access.with(true, |files| files.names.remove(&name).map(|_| ()).ok_or_else(|| not_found(&name)))
    }

    /// An unsynced overwrite of `log/committed` (created, durably, on first use).
    fn save_commit_hint(&self, bytes: &[u8]) -> io::Result<()> {
        let ino = self.access.with(true, |files| {
            Ok(match files.lookup(HINT_NAME) {
                Ok(ino) => ino,
                Err(_) => files.create(HINT_NAME, HINT_BYTES),
            })
        })?;
        self.access.on(true, ino, |i| i.write(0, &bytes[..bytes.len().min(HINT_BYTES as usize)]))
    }

    fn load_commit_hint(&self) -> io::Result<Option<Vec<u8>>> {
        let Ok(ino) = self.access.with(false, |files| files.lookup(HINT_NAME)) else { return Ok(None) };
        let mut out = vec![0u8; HINT_BYTES as usize];
        self.access.on(false, ino, |i| i.read(0, &mut out))?;
        Ok(Some(out))
    }
}

/// Payload segments' directory of one incarnation (`payloads/` on the simulated disk), as
/// `runnev::storage::payloads::FsPayloads` keeps them: files that grow as records are appended
/// (nothing preallocated), so a write past a file's end extends it first, in the same counted
/// operation (a `pwrite` past the end does both). Creation and removal are durable at once (the
/// module doc's simplification); `truncate` is a resize and a sync, two counted operations.
#[derive(Debug)]
pub struct SimPayloads {
    access: Access,
}

/// The name of payload segment `key` on the simulated disk.
pub fn payload_name(key: SegmentKey) -> String {
    format!("{PAYLOADS_DIR}{}", key.file_name())
}

const PAYLOADS_DIR: &str = "payloads/";

/// One open payload segment of one incarnation.
#[derive(Debug)]
pub struct SimPayloadFile {
    access: Access,
    ino: u64,
}

impl PayloadDir for SimPayloads {
    fn list(&self) -> io::Result<Vec<SegmentKey>> {
        self.access.with(false, |files| {
            Ok(files.names.keys().filter_map(|n| SegmentKey::parse(n.strip_prefix(PAYLOADS_DIR)?)).collect())
        })
    }

    fn open(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
        let ino = self.access.with(false, |files| files.lookup(&payload_name(key)))?;
        Ok(Arc::new(SimPayloadFile { access: self.access.clone(), ino }))
    }

    fn create(&self, key: SegmentKey) -> io::Result<Arc<dyn SegmentFile>> {
        let ino = self.access.with(true, |files| Ok(files.create(&payload_name(key), 0)))?;
        Ok(Arc::new(SimPayloadFile { access: self.access.clone(), ino }))
    }

    fn remove(&self, key: SegmentKey) -> io::Result<()> {
        let name = payload_name(key);
        self.access.with(true, |files| files.names.remove(&name).map(|_| ()).ok_or_else(|| not_found(&name)))
    }

    fn truncate(&self, key: SegmentKey, len: u64) -> io::Result<()> {
        let ino = self.access.with(false, |files| files.lookup(&payload_name(key)))?;
        self.access.on(true, ino, |i| {
            i.set_len(len);
            Ok(())
        })?;
        self.access.sync(ino)
    }

    /// Names on the simulated disk are durable when made: nothing to do.
    fn sync_dir(&self) -> io::Result<()> {
        Ok(())
    }
}

impl SegmentFile for SimPayloadFile {
    fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.access.on(false, self.ino, |i| i.read(offset, out))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.access.on(true, self.ino, |i| {
            let end = offset.saturating_add(data.len() as u64);
            if end > i.len {
                i.set_len(end);
            }
            i.write(offset, data)
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.access.sync(self.ino)
    }

    fn zero_from(&self, offset: u64) -> io::Result<()> {
        self.access.on(true, self.ino, |i| {
            i.set_len(offset);
            Ok(())
        })?;
        self.access.sync(self.ino)
    }

    fn capacity(&self) -> io::Result<u64> {
        self.access.on(false, self.ino, |i| Ok(i.len))
    }
}

/// The commit hint's file on the simulated disk, and its fixed size (bytes past the hint's
/// frame are zeros; the log reads only the frame).
const HINT_NAME: &str = "log/committed";
const HINT_BYTES: u64 = 64;

impl SegmentFile for SimSegment {
    fn read_at(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.access.on(false, self.ino, |i| i.read(offset, out))
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.access.on(true, self.ino, |i| i.write(offset, data))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.access.sync(self.ino)
    }

    /// As `FsSegments` does it: shrink to `offset`, grow back to the old length (reading as
    /// zeros), sync the file. Three operations, so a cut can strike between them.
    fn zero_from(&self, offset: u64) -> io::Result<()> {
        let capacity = self.capacity()?;
        self.access.on(true, self.ino, |i| {
            i.set_len(offset);
            Ok(())
        })?;
        self.access.on(true, self.ino, |i| {
            i.set_len(capacity.max(offset));
            Ok(())
        })?;
        self.access.sync(self.ino)
    }

    fn capacity(&self) -> io::Result<u64> {
        self.access.on(false, self.ino, |i| Ok(i.len))
    }
}

#[cfg(test)]
mod tests {
    use redb::{ReadableDatabase, TableDefinition};

    use super::*;

    fn read(h: &DiskHandle, offset: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        h.read(offset, &mut v).unwrap();
        v
    }

    #[test]
    fn unsynced_writes_vanish_on_power_loss_and_survive_a_kill() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(1);
        let h = disk.handle();
        h.set_len(10_000).unwrap();
        h.write(5000, b"synced").unwrap();
        h.sync_data().unwrap();
        h.write(5000, b"SYNCED").unwrap();
        h.set_len(20_000).unwrap();
        h.write(15_000, b"late").unwrap();

        disk.crash(CrashKind::Kill, &mut rng);
        assert!(h.len().is_err(), "a crashed incarnation's handle is dead");
        assert!(h.write(0, b"x").is_err());
        let h2 = disk.handle();
        assert_eq!(h2.len().unwrap(), 20_000, "a kill keeps the page cache");
        assert_eq!(read(&h2, 5000, 6), b"SYNCED");

        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        let h3 = disk.handle();
        assert_eq!(h3.len().unwrap(), 10_000, "length falls back to the synced one");
        assert_eq!(read(&h3, 5000, 6), b"synced");
        assert!(h2.sync_data().is_err());
        assert_eq!(disk.stats().crashes, 2);
    }

    #[test]
    fn an_armed_cut_strikes_mid_sequence_and_the_victim_carries_on_alone() {
        let disk = SimDisk::new();
        let h = disk.handle();
        h.set_len(PAGE_BYTES as u64 * 2).unwrap();
        h.sync_data().unwrap();
        disk.arm_cut(2, CrashKind::PowerLoss { keep_per_mille: 0 }, SimRng::new(9));
        h.write(0, b"first").unwrap();
        // The cut strikes before the second write: the process does not notice (ghost) ...
        h.write(PAGE_BYTES as u64, b"second").unwrap();
        h.sync_data().unwrap();
        assert_eq!(read(&h, 0, 5), b"first");
        // ... but none of it reached the disk, and once reaped its handle is dead.
        assert!(disk.take_fired_cut());
        assert!(!disk.take_fired_cut());
        assert!(h.write(0, b"x").is_err());
        let h2 = disk.handle();
        assert_eq!(read(&h2, 0, 5), vec![0; 5], "the unsynced first write was lost");
        assert_eq!(read(&h2, PAGE_BYTES as u64, 6), vec![0; 6], "the ghost's synced write never happened");
        assert!(!disk.disarm_cut());
    }

    /// Seed 6935: what the cut incarnation writes to the node's files on the real file system
    /// after the cut (a snapshot it installs on its ghost) is gone once the host is torn down,
    /// as its writes to the simulated disk are; what was there when the cut struck stays. The
    /// snapshots live in the group's directory under the data dir (`groups/0/`): the roll-back
    /// reaches into it.
    #[test]
    fn a_cut_rolls_back_the_node_s_files_on_the_real_file_system() {
        let real = tempfile::tempdir().unwrap();
        let group = real.path().join("groups").join("0");
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(real.path().join("FORMAT"), b"format").unwrap();
        std::fs::write(group.join("snapshot.bin"), b"before").unwrap();
        let disk = SimDisk::new();
        disk.set_real_dir(real.path().to_path_buf());
        let h = disk.handle();
        h.set_len(PAGE_BYTES as u64).unwrap();
        disk.arm_cut(1, CrashKind::Kill, SimRng::new(3));
        h.write(0, b"x").unwrap();
        // The ghost goes on: a new snapshot replaces the old one, a temporary file appears.
        std::fs::write(group.join("snapshot.bin"), b"after the cut").unwrap();
        std::fs::write(group.join("snapshot.install.tmp"), b"half").unwrap();
        assert!(disk.take_fired_cut());
        assert_eq!(std::fs::read(group.join("snapshot.bin")).unwrap(), b"before");
        assert!(!group.join("snapshot.install.tmp").exists());
        assert_eq!(std::fs::read(real.path().join("FORMAT")).unwrap(), b"format");
        // Without a cut, nothing is rolled back.
        std::fs::write(group.join("snapshot.bin"), b"later").unwrap();
        assert!(!disk.take_fired_cut());
        assert_eq!(std::fs::read(group.join("snapshot.bin")).unwrap(), b"later");
    }

    #[test]
    fn a_wiped_disk_is_empty_and_the_old_handles_are_dead() {
        let disk = SimDisk::new();
        disk.segments().create(0, 4096).unwrap();
        let h = disk.handle();
        for step in [h.set_len(10_000), h.write(0, b"state"), h.sync_data()] {
            step.unwrap();
        }
        disk.arm_cut(5, CrashKind::Kill, SimRng::new(3));
        assert_eq!(disk.file_names().len(), 2);
        disk.wipe();
        assert!(h.len().is_err(), "the wiped incarnation's handle is dead");
        assert_eq!(disk.file_names(), Vec::<String>::new(), "no file is left");
        assert_eq!(disk.handle().len().unwrap(), 0);
        assert_eq!(disk.segments().list().unwrap(), Vec::<u64>::new());
        assert!(!disk.disarm_cut(), "the armed cut went with the old disk");
    }

    #[test]
    fn a_failing_disk_refuses_writes_but_serves_reads() {
        let disk = SimDisk::new();
        let h = disk.handle();
        h.set_len(100).unwrap();
        h.write(0, b"ok").unwrap();
        disk.set_failing(true);
        assert!(h.write(0, b"no").is_err());
        assert!(h.sync_data().is_err());
        assert_eq!(read(&h, 0, 2), b"ok");
        disk.set_failing(false);
        h.sync_data().unwrap();
        assert_eq!(disk.stats().failed_ops, 2);
    }

    #[test]
    fn a_full_disk_refuses_writes_with_enospc_until_space_is_back() {
        let disk = SimDisk::new();
        let h = disk.handle();
        let seg = disk.segments().create(1, PAGE).unwrap();
        h.set_len(100).unwrap();
        disk.set_full(true);
        for e in [h.write(0, b"no").unwrap_err(), h.sync_data().unwrap_err(), seg.write_at(0, b"no").unwrap_err()] {
            assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
            assert_eq!(e.raw_os_error(), Some(28));
        }
        assert!(disk.segments().create(2, PAGE).is_err());
        assert_eq!(read(&h, 0, 2), vec![0, 0], "reads work");
        disk.set_full(false);
        h.write(0, b"ok").unwrap();
        h.sync_data().unwrap();
        assert_eq!(disk.stats().full_refusals, 4);
    }

    #[test]
    fn a_slow_disk_makes_storage_calls_wait_in_simulated_time() {
        runnev::storage::io::set_inline_io(true);
        let disk = SimDisk::new();
        disk.set_slow(Some((100, 300, SimRng::new(4))));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let (waited, r) = rt.block_on(async {
            let h = disk.handle();
            let t = tokio::time::Instant::now();
            let r = runnev::storage::blocking(move || {
                h.write(0, b"").and_then(|_| h.sync_data()).and_then(|_| h.sync_data())
            })
            .await;
            (t.elapsed(), r)
        });
        r.unwrap();
        let s = disk.stats();
        assert_eq!(s.slow_syncs, 2);
        assert!((200..=600).contains(&s.slow_ms), "{s:?}");
        assert_eq!(waited.as_millis() as u64, s.slow_ms, "the caller waited out exactly what the fsyncs took");
        disk.set_slow(None);
        let h = disk.handle();
        h.sync_data().unwrap();
        assert_eq!(disk.stats().slow_syncs, 2);
    }

    #[test]
    fn a_flipped_bit_rots_one_byte_of_a_record_but_the_last() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(12);
        let seg = disk.segments().create(3, 2 * PAGE).unwrap();
        // Two records in the documented layout: a 16-byte header (body length first), a body.
        let record = |body: &[u8]| {
            let mut r = (body.len() as u32).to_le_bytes().to_vec();
            r.extend([7u8; 12]);
            r.extend_from_slice(body);
            r
        };
        let (first, last) = (record(&[1; 100]), record(&[2; 50]));
        seg.write_at(0, &first).unwrap();
        assert_eq!(disk.flip_segment_bit(&mut rng), None, "one record: nothing but the last");
        seg.write_at(first.len() as u64, &last).unwrap();
        seg.sync_data().unwrap();
        let before = seg_read(seg.as_ref(), 0, first.len() + last.len());
        for _ in 0..20 {
            let (file, at) = disk.flip_segment_bit(&mut rng).unwrap();
            assert_eq!(file, segment_name(3));
            assert!(at < first.len() as u64, "never in the last record: {at}");
            let now = seg_read(seg.as_ref(), 0, before.len());
            let diff: u32 = now.iter().zip(&before).map(|(a, b)| (a ^ b).count_ones()).sum();
            assert_eq!(diff, 1, "exactly one bit differs");
            seg.write_at(0, &before).unwrap();
            seg.sync_data().unwrap();
        }
        assert_eq!(disk.stats().bits_flipped, 20);
    }

    #[test]
    fn shrinking_then_growing_reads_zeros_and_writes_span_pages() {
        let disk = SimDisk::new();
        let h = disk.handle();
        h.set_len(3 * PAGE_BYTES as u64).unwrap();
        let data: Vec<u8> = (0..(PAGE_BYTES + 100)).map(|i| (i % 251) as u8 + 1).collect();
        h.write(PAGE_BYTES as u64 - 50, &data).unwrap();
        h.sync_data().unwrap();
        assert_eq!(read(&h, PAGE_BYTES as u64 - 50, data.len()), data);
        h.set_len(PAGE_BYTES as u64).unwrap();
        h.set_len(3 * PAGE_BYTES as u64).unwrap();
        assert!(read(&h, PAGE_BYTES as u64, PAGE_BYTES).iter().all(|b| *b == 0));
        assert_eq!(read(&h, PAGE_BYTES as u64 - 50, 50), data[..50]);
        assert!(h.read(3 * PAGE_BYTES as u64 - 1, &mut [0, 0]).is_err());
    }

    #[test]
    fn redb_recovers_the_last_durable_commit_after_power_loss() {
        const T: TableDefinition<u64, u64> = TableDefinition::new("t");
        let disk = SimDisk::new();
        let mut rng = SimRng::new(3);
        {
            let db = redb::Database::builder().create_with_backend(disk.handle()).unwrap();
            let w = db.begin_write().unwrap();
            w.open_table(T).unwrap().insert(1, 10).unwrap();
            w.commit().unwrap();
            let mut w = db.begin_write().unwrap();
            w.set_durability(redb::Durability::None).unwrap();
            w.open_table(T).unwrap().insert(2, 20).unwrap();
            w.commit().unwrap();
            // redb keeps non-durable commits in memory: nothing reached the disk yet.
            assert_eq!(disk.dirty_pages(), 0);
            disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
            // `db` drops here and tries to flush through its dead handle.
        }
        let db = redb::Database::builder().create_with_backend(disk.handle()).unwrap();
        let r = db.begin_read().unwrap();
        let t = r.open_table(T).unwrap();
        assert_eq!(t.get(1).unwrap().map(|v| v.value()), Some(10));
        assert_eq!(t.get(2).unwrap().map(|v| v.value()), None, "the non-durable commit is lost");
    }

    trait ReadVec {
        fn read_vec(&self, offset: u64, n: usize) -> Vec<u8>;
    }

    impl ReadVec for DiskHandle {
        fn read_vec(&self, offset: u64, n: usize) -> Vec<u8> {
            read(self, offset, n)
        }
    }

    fn seg_read(f: &dyn SegmentFile, offset: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        f.read_at(offset, &mut v).unwrap();
        v
    }

    #[test]
    fn an_unsynced_segment_write_vanishes_on_power_loss_and_survives_a_kill() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(5);
        let dir = disk.segments();
        let f = dir.create(7, 1 << 20).unwrap();
        assert_eq!(f.capacity().unwrap(), 1 << 20);
        assert_eq!(disk.file_names(), vec![segment_name(7)]);
        f.write_at(0, b"synced").unwrap();
        f.sync_data().unwrap();
        f.write_at(6, b"-late").unwrap();
        assert!(f.write_at((1 << 20) - 2, b"abc").is_err(), "writes stay within the file");

        disk.crash(CrashKind::Kill, &mut rng);
        assert!(f.read_at(0, &mut [0]).is_err(), "a crashed incarnation's segment is dead");
        assert!(dir.list().is_err());
        let dir2 = disk.segments();
        assert_eq!(dir2.list().unwrap(), vec![7]);
        let f2 = dir2.open(7).unwrap();
        assert_eq!(seg_read(f2.as_ref(), 0, 11), b"synced-late", "a kill keeps the page cache");

        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        let f3 = disk.segments().open(7).unwrap();
        assert_eq!(seg_read(f3.as_ref(), 0, 11), b"synced\0\0\0\0\0");
        assert_eq!(f3.capacity().unwrap(), 1 << 20, "a created segment keeps its size");
        assert!(disk.segments().open(8).is_err());
    }

    #[test]
    fn a_sync_makes_only_its_own_file_durable() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(6);
        let h = disk.handle();
        let seg = disk.segments().create(1, 2 * PAGE).unwrap();
        h.set_len(2 * PAGE).unwrap();
        h.write(0, b"db").unwrap();
        seg.write_at(PAGE - 1, b"log").unwrap();
        assert_eq!(disk.dirty_pages(), 3);
        seg.sync_data().unwrap();
        assert_eq!(disk.dirty_pages(), 1, "redb's page is still dirty");
        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        assert_eq!(disk.handle().len().unwrap(), 0, "redb's unsynced growth is lost");
        let seg = disk.segments().open(1).unwrap();
        assert_eq!(seg_read(seg.as_ref(), PAGE - 1, 3), b"log");
        assert_eq!(disk.stats().syncs, 1);
    }

    #[test]
    fn a_cut_can_strike_a_segment_write() {
        let disk = SimDisk::new();
        let h = disk.handle();
        h.set_len(PAGE).unwrap();
        h.sync_data().unwrap();
        let seg = disk.segments().create(1, PAGE).unwrap();
        seg.write_at(0, b"a").unwrap();
        seg.sync_data().unwrap();
        disk.arm_cut(2, CrashKind::PowerLoss { keep_per_mille: 0 }, SimRng::new(9));
        h.write(0, b"redb page").unwrap();
        // The second operation is the log append: the cut strikes before it reaches the disk;
        // the process carries on on its ghost (the append and its fsync "succeed") ...
        seg.write_at(1, b"b").unwrap();
        seg.sync_data().unwrap();
        assert_eq!(seg_read(seg.as_ref(), 0, 2), b"ab");
        assert_eq!(h.read_vec(0, 9), b"redb page");
        // ... but none of it happened on the disk, in either file.
        assert!(disk.take_fired_cut());
        assert!(seg.read_at(0, &mut [0]).is_err());
        let seg2 = disk.segments().open(1).unwrap();
        assert_eq!(seg_read(seg2.as_ref(), 0, 2), b"a\0");
        assert_eq!(disk.handle().read_vec(0, 9), vec![0; 9]);
    }

    #[test]
    fn a_cut_can_strike_a_segment_creation_and_removal() {
        let disk = SimDisk::new();
        let dir = disk.segments();
        dir.create(1, PAGE).unwrap();
        disk.arm_cut(2, CrashKind::Kill, SimRng::new(1));
        dir.remove(1).unwrap();
        dir.create(5, PAGE).unwrap();
        assert_eq!(dir.list().unwrap(), vec![5], "the ghost's view");
        assert!(disk.take_fired_cut());
        assert_eq!(disk.segments().list().unwrap(), Vec::<u64>::new(), "the removal happened, the creation did not");
    }

    #[test]
    fn zero_from_is_durable_and_syncs_the_whole_file() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(7);
        let seg = disk.segments().create(1, 3 * PAGE).unwrap();
        let data: Vec<u8> = (0..(2 * PAGE_BYTES + 10)).map(|i| (i % 251) as u8 + 1).collect();
        seg.write_at(0, &data).unwrap();
        seg.sync_data().unwrap();
        seg.write_at(10, b"x").unwrap();
        seg.zero_from(50).unwrap();
        assert_eq!(seg.capacity().unwrap(), 3 * PAGE);
        assert!(seg_read(seg.as_ref(), 50, 3 * PAGE_BYTES - 50).iter().all(|b| *b == 0));
        assert_eq!(disk.dirty_pages(), 0);
        disk.crash(CrashKind::PowerLoss { keep_per_mille: 1000 }, &mut rng);
        let seg = disk.segments().open(1).unwrap();
        assert_eq!(seg.capacity().unwrap(), 3 * PAGE);
        let mut want = data[..50].to_vec();
        want[10] = b'x';
        assert_eq!(seg_read(seg.as_ref(), 0, 50), want, "the write before the offset was synced with it");
        assert!(seg_read(seg.as_ref(), 50, 3 * PAGE_BYTES - 50).iter().all(|b| *b == 0), "stale bytes never return");
        // Written again past the offset, unsynced, then lost: zeros, not the old bytes.
        seg.write_at(60, b"new").unwrap();
        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        let seg = disk.segments().open(1).unwrap();
        assert_eq!(seg_read(seg.as_ref(), 50, 20), vec![0; 20]);
    }

    #[test]
    fn a_cut_inside_zero_from_leaves_what_a_real_crash_would() {
        // Struck at the grow step after a kill: the file stays short (the shrink happened).
        let disk = SimDisk::new();
        let seg = disk.segments().create(1, 2 * PAGE).unwrap();
        seg.write_at(0, &[7; 200]).unwrap();
        seg.sync_data().unwrap();
        disk.arm_cut(2, CrashKind::Kill, SimRng::new(2));
        seg.zero_from(100).unwrap();
        assert!(disk.take_fired_cut());
        let after_kill = disk.segments().open(1).unwrap();
        assert_eq!(after_kill.capacity().unwrap(), 100);
        // The same with a power loss: the truncation was never synced, the old bytes are back.
        let disk = SimDisk::new();
        let seg = disk.segments().create(1, 2 * PAGE).unwrap();
        seg.write_at(0, &[7; 200]).unwrap();
        seg.sync_data().unwrap();
        disk.arm_cut(3, CrashKind::PowerLoss { keep_per_mille: 0 }, SimRng::new(2));
        seg.zero_from(100).unwrap();
        assert!(disk.take_fired_cut());
        let after_loss = disk.segments().open(1).unwrap();
        assert_eq!(after_loss.capacity().unwrap(), 2 * PAGE);
        assert_eq!(seg_read(after_loss.as_ref(), 100, 100), vec![7; 100]);
    }

    #[test]
    fn creation_and_removal_are_durable_at_once_and_open_handles_outlive_removal() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(8);
        let dir = disk.segments();
        let old = dir.create(5, PAGE).unwrap();
        old.write_at(0, b"old").unwrap();
        old.sync_data().unwrap();
        let new = dir.create(5, 2 * PAGE).unwrap();
        assert_eq!(seg_read(new.as_ref(), 0, 3), vec![0; 3], "a replaced segment reads as zeros");
        assert_eq!(seg_read(old.as_ref(), 0, 3), b"old", "the replaced file lives on for its handle");
        let gone = dir.create(9, PAGE).unwrap();
        dir.remove(9).unwrap();
        assert!(dir.remove(9).is_err());
        gone.write_at(0, b"unlinked").unwrap();
        gone.sync_data().unwrap();
        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        let dir = disk.segments();
        assert_eq!(dir.list().unwrap(), vec![5]);
        let five = dir.open(5).unwrap();
        assert_eq!(five.capacity().unwrap(), 2 * PAGE);
        assert_eq!(seg_read(five.as_ref(), 0, 3), vec![0; 3]);
    }

    #[test]
    fn a_database_file_is_created_renamed_and_removed_durably_each_one_counted_operation() {
        let disk = SimDisk::new();
        let mut rng = SimRng::new(10);
        let dir = disk.db_dir();
        assert!(!dir.exists(REDB_FILE_NEW).unwrap());
        let new = dir.backend(REDB_FILE_NEW).unwrap();
        new.set_len(PAGE).unwrap();
        new.write(0, b"db").unwrap();
        new.sync_data().unwrap();
        dir.rename(REDB_FILE_NEW, REDB_FILE).unwrap();
        dir.sync().unwrap();
        assert_eq!(new.read_vec(0, 2), b"db", "a renamed file's handle still works");
        disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
        assert_eq!(disk.file_names(), vec![REDB_FILE.to_string()], "the rename was durable at once");
        assert_eq!(disk.handle().read_vec(0, 2), b"db");
        assert!(dir.exists(REDB_FILE).is_err(), "a crashed incarnation's directory is dead");

        // A cut at the rename strikes before it: only the ghost saw it.
        let dir = disk.db_dir();
        let fresh = dir.backend(REDB_FILE_NEW).unwrap();
        fresh.set_len(PAGE).unwrap();
        fresh.sync_data().unwrap();
        disk.arm_cut(1, CrashKind::Kill, SimRng::new(11));
        dir.rename(REDB_FILE_NEW, REDB_FILE).unwrap();
        assert!(!dir.exists(REDB_FILE_NEW).unwrap(), "the ghost's view");
        assert!(disk.take_fired_cut());
        assert_eq!(disk.file_names(), vec![REDB_FILE.to_string(), REDB_FILE_NEW.to_string()]);
        assert_eq!(disk.handle().read_vec(0, 2), b"db", "the old file is still the database");

        // A cut at the operation after it: the rename happened. A directory's fsync is no
        // operation of its own.
        let dir = disk.db_dir();
        disk.arm_cut(2, CrashKind::Kill, SimRng::new(12));
        dir.rename(REDB_FILE_NEW, REDB_FILE).unwrap();
        dir.sync().unwrap();
        dir.remove(REDB_FILE).unwrap();
        assert!(disk.take_fired_cut());
        assert_eq!(disk.file_names(), vec![REDB_FILE.to_string()]);
        assert_eq!(disk.handle().read_vec(0, 2), vec![0, 0], "the new (blank) file replaced the old one");

        // A missing file's creation counts too; opening an existing one does not.
        let dir = disk.db_dir();
        disk.arm_cut(1, CrashKind::Kill, SimRng::new(13));
        dir.backend(REDB_FILE).unwrap();
        assert!(!disk.take_fired_cut());
        dir.backend(REDB_FILE_NEW).unwrap();
        assert!(disk.take_fired_cut());
        assert_eq!(disk.file_names(), vec![REDB_FILE.to_string()]);
    }

    #[test]
    fn a_failing_disk_refuses_every_segment_operation_but_reads() {
        let disk = SimDisk::new();
        let dir = disk.segments();
        let seg = dir.create(1, PAGE).unwrap();
        seg.write_at(0, b"ok").unwrap();
        disk.set_failing(true);
        assert!(seg.write_at(0, b"no").is_err());
        assert!(seg.sync_data().is_err());
        assert!(seg.zero_from(1).is_err());
        assert!(dir.create(2, PAGE).is_err());
        assert!(dir.remove(1).is_err());
        assert_eq!(seg_read(seg.as_ref(), 0, 2), b"ok");
        assert_eq!(dir.list().unwrap(), vec![1]);
        assert_eq!(disk.stats().failed_ops, 5);
    }

    #[test]
    fn a_fork_copies_every_file_and_shares_nothing() {
        let disk = SimDisk::new();
        let seg = disk.segments().create(3, PAGE).unwrap();
        seg.write_at(0, b"unsynced").unwrap();
        let copy = disk.fork();
        let cseg = copy.segments().open(3).unwrap();
        assert_eq!(seg_read(cseg.as_ref(), 0, 8), b"unsynced");
        cseg.write_at(0, b"changed!").unwrap();
        copy.segments().remove(3).unwrap();
        assert_eq!(seg_read(seg.as_ref(), 0, 8), b"unsynced");
        assert_eq!(disk.segments().list().unwrap(), vec![3]);
    }
}
