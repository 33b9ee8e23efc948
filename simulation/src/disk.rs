//! A simulated disk for redb: a redb [`StorageBackend`] that keeps only what was synced when
//! the power goes out.
//!
//! Owns: the durability model of a node's database. The disk outlives the node's incarnations
//! (the host factory captures it); every write lands in a volatile layer of dirty pages (the
//! page cache), `sync_data` makes the volatile layer durable, and a crash decides what survives:
//! - [`CrashKind::Kill`] (the process dies, the machine stays up): the page cache survives, so
//!   unsynced writes stay visible to the next incarnation, still unsynced;
//! - [`CrashKind::PowerLoss`]: the page cache is lost; optionally a seeded random subset of the
//!   dirty pages reached the platter first (torn, unordered writes, as a real disk may do).
//!
//! Each incarnation gets a handle stamped with the disk's epoch; a crash bumps the epoch, so a
//! crashed incarnation's handle (its redb `Database` is dropped while turmoil tears the host
//! down, and would flush) fails every operation from then on.
//!
//! Two more faults: a crash can be armed to strike *inside* a sequence of writes (between a
//! commit's page writes and its fsync, [`SimDisk::arm_cut`]); the process that was cut does not
//! know it died until the driver tears its host down at the end of the step, so until then its
//! handle works on a private copy (a ghost) that nothing else ever sees. And the disk can fail
//! ([`SimDisk::set_failing`]): every write, resize and sync returns an I/O error, as a dying or
//! full disk does. Must never: let a write reach the durable image without a `sync_data`, or let
//! a crashed incarnation touch the disk.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::StorageBackend;

use crate::rng::SimRng;

/// Granularity of the volatile layer, in bytes: what a torn power loss keeps or loses as a unit.
pub const PAGE_BYTES: usize = 4096;

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
    /// `sync_data` calls that succeeded.
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
}

/// Bytes as one incarnation sees them: a durable image plus the dirty pages over it.
#[derive(Debug, Clone, Default)]
struct Image {
    /// What survives a power loss. Its length is the durable length.
    durable: Vec<u8>,
    /// Current length as the running incarnation sees it.
    len: u64,
    /// Pages written since the last sync: page number → the page's current content.
    dirty: BTreeMap<u64, Box<[u8]>>,
}

fn out_of_range(what: &str, offset: u64, n: usize, len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("simulated disk: {what} of {n} bytes at {offset} past length {len}"),
    )
}

impl Image {
    fn page(&self, p: u64) -> Box<[u8]> {
        if let Some(d) = self.dirty.get(&p) {
            return d.clone();
        }
        let mut page = vec![0u8; PAGE_BYTES].into_boxed_slice();
        let start = p as usize * PAGE_BYTES;
        if start < self.durable.len() {
            let end = (start + PAGE_BYTES).min(self.durable.len());
            page[..end - start].copy_from_slice(&self.durable[start..end]);
        }
        page
    }

    fn dirty_page(&mut self, p: u64) -> &mut Box<[u8]> {
        if !self.dirty.contains_key(&p) {
            let page = self.page(p);
            self.dirty.insert(p, page);
        }
        self.dirty.get_mut(&p).expect("inserted above")
    }

    /// Copies a page into the durable image, extending it up to `limit` bytes at most.
    fn persist_page(durable: &mut Vec<u8>, p: u64, page: &[u8], limit: u64) {
        let start = p as usize * PAGE_BYTES;
        let end = (start + PAGE_BYTES).min(limit as usize);
        if end <= start {
            return;
        }
        if durable.len() < end {
            durable.resize(end, 0);
        }
        durable[start..end].copy_from_slice(&page[..end - start]);
    }

    /// Loses the volatile layer as `kind` says; returns (pages kept, pages lost).
    fn crash(&mut self, kind: CrashKind, rng: &mut SimRng) -> (u64, u64) {
        let CrashKind::PowerLoss { keep_per_mille } = kind else { return (0, 0) };
        let dirty = std::mem::take(&mut self.dirty);
        let (mut kept, mut lost) = (0, 0);
        for (p, page) in dirty {
            if keep_per_mille > 0 && rng.chance(keep_per_mille) {
                Image::persist_page(&mut self.durable, p, &page, self.len);
                kept += 1;
            } else {
                lost += 1;
            }
        }
        self.len = self.durable.len() as u64;
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
            let p = pos / PAGE_BYTES as u64;
            let in_page = (pos % PAGE_BYTES as u64) as usize;
            let n = (PAGE_BYTES - in_page).min(out.len() - done);
            if let Some(d) = self.dirty.get(&p) {
                out[done..done + n].copy_from_slice(&d[in_page..in_page + n]);
            } else {
                let from = pos as usize;
                for (i, b) in out[done..done + n].iter_mut().enumerate() {
                    *b = self.durable.get(from + i).copied().unwrap_or(0);
                }
            }
            done += n;
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            // Zero what lies past the new end in the volatile layer, so growing again reads zeros
            // (the durable image keeps the old bytes until a sync makes the truncation durable).
            let first = len / PAGE_BYTES as u64;
            let last = (self.len - 1) / PAGE_BYTES as u64;
            for p in first..=last {
                let start = (p * PAGE_BYTES as u64).max(len);
                let page = self.dirty_page(p);
                let from = (start - p * PAGE_BYTES as u64) as usize;
                page[from..].fill(0);
            }
        }
        self.len = len;
    }

    fn sync(&mut self) {
        let len = self.len;
        let dirty = std::mem::take(&mut self.dirty);
        self.durable.resize(len as usize, 0);
        for (p, page) in dirty {
            Image::persist_page(&mut self.durable, p, &page, len);
        }
        self.durable.truncate(len as usize);
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
            let p = pos / PAGE_BYTES as u64;
            let in_page = (pos % PAGE_BYTES as u64) as usize;
            let n = (PAGE_BYTES - in_page).min(data.len() - done);
            self.dirty_page(p)[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }
}

/// A crash armed to strike in the middle of the disk's next writes.
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
    /// The disk's bytes.
    image: Image,
    /// The private copy a cut incarnation keeps using until its host is torn down: (its epoch,
    /// its view).
    ghost: Option<(u64, Image)>,
    /// An armed mid-write crash, if any.
    cut: Option<Cut>,
    /// A mid-write crash struck and the host has not been torn down yet.
    cut_fired: bool,
    /// Writes, resizes and syncs fail with an I/O error.
    failing: bool,
    stats: DiskStats,
}

impl DiskState {
    fn crash(&mut self, kind: CrashKind, rng: &mut SimRng) {
        self.epoch += 1;
        self.stats.crashes += 1;
        let (kept, lost) = self.image.crash(kind, rng);
        self.stats.pages_torn_in += kept;
        self.stats.pages_lost += lost;
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
        self.ghost = Some((self.epoch, self.image.clone()));
        self.crash(kind, &mut rng);
        self.cut_fired = true;
    }
}

/// One node's disk, shared by all its incarnations.
#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> Self {
        SimDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A backend for the incarnation starting now.
    pub fn handle(&self) -> DiskHandle {
        DiskHandle { state: self.state.clone(), epoch: self.lock().epoch }
    }

    /// The node crashed: the current incarnation's handle is dead from now on, and unsynced
    /// writes survive or not according to `kind` (`rng` draws the torn pages).
    pub fn crash(&self, kind: CrashKind, rng: &mut SimRng) {
        let mut s = self.lock();
        s.cut = None;
        s.ghost = None;
        s.crash(kind, rng);
    }

    /// Arms a crash of `kind` that strikes at the `after_ops`-th write, `set_len` or sync from
    /// now, in the middle of whatever redb is doing (a commit cut between its page writes and
    /// its fsync). The driver then tears the host down ([`SimDisk::take_fired_cut`]).
    pub fn arm_cut(&self, after_ops: u64, kind: CrashKind, rng: SimRng) {
        self.lock().cut = Some(Cut { ops_left: after_ops.max(1), kind, rng });
    }

    /// Disarms a cut that has not struck; returns whether one was armed.
    pub fn disarm_cut(&self) -> bool {
        self.lock().cut.take().is_some()
    }

    /// Whether an armed cut struck since the last call. The struck incarnation's ghost is
    /// dropped: its handle fails from now on.
    pub fn take_fired_cut(&self) -> bool {
        let mut s = self.lock();
        if std::mem::take(&mut s.cut_fired) {
            s.ghost = None;
            return true;
        }
        false
    }

    /// Makes every write, resize and sync fail with an I/O error (`true`), or work again.
    pub fn set_failing(&self, failing: bool) {
        self.lock().failing = failing;
    }

    /// The disk's counters.
    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// A copy of what the next incarnation would find on this disk (for inspection; the copy
    /// shares nothing with this disk).
    pub fn fork(&self) -> SimDisk {
        let image = self.lock().image.clone();
        let state = DiskState { image, ..Default::default() };
        SimDisk { state: Arc::new(Mutex::new(state)) }
    }

    /// Pages written but not yet synced.
    pub fn dirty_pages(&self) -> usize {
        self.lock().image.dirty.len()
    }
}

/// The redb backend of one incarnation.
#[derive(Debug)]
pub struct DiskHandle {
    state: Arc<Mutex<DiskState>>,
    epoch: u64,
}

fn stale() -> io::Error {
    io::Error::other("simulated disk: this incarnation crashed; its handle is dead")
}

impl DiskHandle {
    /// Runs `f` on the image this incarnation may use: the disk's, or its ghost after a cut.
    fn with<R>(&self, write: bool, f: impl FnOnce(&mut Image) -> io::Result<R>) -> io::Result<R> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.epoch == self.epoch && write {
            if s.failing {
                s.stats.failed_ops += 1;
                return Err(io::Error::other("simulated disk: I/O error (the disk is failing)"));
            }
            s.count_cut();
        }
        if s.epoch == self.epoch {
            return f(&mut s.image);
        }
        match &mut s.ghost {
            Some((e, ghost)) if *e == self.epoch => f(ghost),
            _ => {
                s.stats.stale_ops += 1;
                Err(stale())
            }
        }
    }
}

impl StorageBackend for DiskHandle {
    fn len(&self) -> io::Result<u64> {
        self.with(false, |i| Ok(i.len))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.with(false, |i| i.read(offset, out))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(true, |i| {
            i.set_len(len);
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let synced = self.with(true, |i| {
            i.sync();
            Ok(())
        });
        if synced.is_ok() {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).stats.syncs += 1;
        }
        synced
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.with(true, |i| i.write(offset, data))
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
}
