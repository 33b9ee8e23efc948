//! The disk guard: whether this node's data directory has room for new Raft log entries, and a
//! reserved ballast file that keeps room for the node to recover when it has not.
//!
//! A node whose disk fills under an append or a state-machine write gets `ENOSPC` from inside
//! openraft's storage calls, and openraft 0.9 stops its Raft core for good on any storage error:
//! the node then serves nothing until a restart, even once space is freed. The guard keeps the
//! node from getting there: while the file system holding the data directory has less free space
//! than the node keeps ([`Thresholds::min_free`]), the node takes no new entries before they
//! reach openraft (a follower answers the leader's appends as heartbeats, `crate::api::raft_rpc`;
//! a leader refuses proposals with `507 storage_full`, `crate::api::write`). What was accepted
//! before still has room to be applied, and the node goes on by itself once space is back.
//!
//! The ballast ([`RESERVE_FILE`], [`Thresholds::reserve`] bytes, as CockroachDB keeps
//! `auxiliary/EMERGENCY_BALLAST`): created while there is room, deleted the moment the disk is
//! low, so that writes already in flight (entries accepted just before, their application, votes)
//! find space even if something else filled the disk at once; created again when space is back.
//! The verdict has hysteresis through it: without the ballast the node needs
//! `min_free + reserve` bytes free to take writes, so deleting the ballast never flips the node
//! back to "has room" by itself. While low, the state machine also defers its periodic durable
//! commit (`Store::disk_low_flag`), which would write out at once every batch applied since the
//! last one.
//!
//! Owns: measuring free space (statvfs, through `rustix`), the low/has-room verdict
//! ([`decide`]), and the ballast file. Must never: block for longer than a statvfs and a
//! ballast-sized `fallocate`, touch any other file of the data directory, or fail a caller on a
//! measurement error (the last verdict stands, and the error is logged).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::limits::{DISK_RECHECK_MARGIN_BYTES, DISK_RECHECK_MS, DISK_RESERVE_BYTES_MAX};

/// Name of the ballast file in the data directory.
pub const RESERVE_FILE: &str = "RESERVE";

/// What the guard keeps free on one file system, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Free bytes below which the node takes no new writes (0: the guard is off).
    pub min_free: u64,
    /// Size of the ballast file, in bytes (0: none).
    pub reserve: u64,
}

impl Thresholds {
    /// The thresholds for `--min-free-disk-bytes` `min_free_flag` on a file system of `total`
    /// bytes: `min_free` is the flag, but at most a quarter of the file system (a small disk
    /// would otherwise never have room for anything), and the ballast is
    /// [`DISK_RESERVE_BYTES_MAX`] but at most half of `min_free`. A flag of 0 turns both off.
    pub fn for_fs(min_free_flag: u64, total: u64) -> Thresholds {
        if min_free_flag == 0 {
            return Thresholds { min_free: 0, reserve: 0 };
        }
        let min_free = min_free_flag.min(total / 4).max(1);
        Thresholds { min_free, reserve: DISK_RESERVE_BYTES_MAX.min(min_free / 2) }
    }
}

/// What to do with the ballast file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReserveAction {
    /// Leave it as it is.
    Keep,
    /// Delete it: the disk is low, and its bytes are the room to recover.
    Release,
    /// Create it: there is room again.
    Restore,
}

/// The guard's verdict for one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the node must take no new writes.
    pub low: bool,
    /// What to do with the ballast.
    pub reserve: ReserveAction,
}

/// The verdict for `free` bytes available on the file system, given the thresholds and whether
/// the ballast is present. With the ballast, the node is low below `min_free` (and releases it);
/// without it, below `min_free + reserve` (so releasing it does not end "low" by itself), and
/// it is restored at or above that. Pure: the unit tests drive it.
pub fn decide(free: u64, t: Thresholds, reserve_present: bool) -> Decision {
    use ReserveAction::*;
    if t.min_free == 0 {
        return Decision { low: false, reserve: Keep };
    }
    if reserve_present {
        return match free < t.min_free {
            true => Decision { low: true, reserve: Release },
            false => Decision { low: false, reserve: Keep },
        };
    }
    match free >= t.min_free.saturating_add(t.reserve) {
        true => Decision { low: false, reserve: if t.reserve > 0 { Restore } else { Keep } },
        false => Decision { low: true, reserve: Keep },
    }
}

/// One measurement, for messages and `/v1/cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStatus {
    /// Bytes available to this process on the data directory's file system.
    pub free_bytes: u64,
    /// What the guard keeps free, in bytes (0: off).
    pub min_free_bytes: u64,
    /// Whether the node takes no new writes.
    pub low: bool,
}

impl DiskStatus {
    /// Says what is wrong and how to fix it, for a `507 storage_full` message.
    pub fn describe(&self) -> String {
        format!(
            "{} bytes free on the data directory's file system, below the {} bytes this node keeps free \
             (--min-free-disk-bytes); free space on it (the node takes writes again by itself)",
            self.free_bytes, self.min_free_bytes
        )
    }
}

/// The guard of one data directory. Cheap to query; shared by the node's tasks.
pub struct DiskGuard {
    /// `None`: off (the simulation, whose storage is not a real file system).
    dir: Option<PathBuf>,
    thresholds: Thresholds,
    /// The verdict, shared with the store (`Store::disk_low_flag`).
    low: Arc<AtomicBool>,
    free: AtomicU64,
    /// Serialises measurements with the ballast's creation and removal; when the last one was.
    checking: Mutex<Option<tokio::time::Instant>>,
    /// Measurements taken, for the tests.
    measured: AtomicU64,
}

/// Bytes available to an unprivileged writer on the file system holding `dir`, and its size.
fn measure(dir: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir).map_err(io::Error::from)?;
    let unit = st.f_frsize.max(1);
    Ok((st.f_bavail.saturating_mul(unit), st.f_blocks.saturating_mul(unit)))
}

impl DiskGuard {
    /// The guard of `dir` keeping `min_free_flag` bytes free (`--min-free-disk-bytes`; see
    /// [`Thresholds::for_fs`]), keeping its verdict in `low` (the store's
    /// `Store::disk_low_flag`); measures once, creating the ballast if there is room.
    ///
    /// Errors: the file system of `dir` cannot be measured (it does not exist, say).
    pub fn open(dir: &Path, min_free_flag: u64, low: Arc<AtomicBool>) -> io::Result<DiskGuard> {
        let (free, total) = measure(dir)?;
        let guard = DiskGuard {
            dir: Some(dir.to_path_buf()),
            thresholds: Thresholds::for_fs(min_free_flag, total),
            low,
            free: AtomicU64::new(free),
            checking: Mutex::new(None),
            measured: AtomicU64::new(0),
        };
        tracing::info!(
            min_free_bytes = guard.thresholds.min_free,
            reserve_bytes = guard.thresholds.reserve,
            free_bytes = free,
            file_system_bytes = total,
            "disk guard"
        );
        guard.check();
        Ok(guard)
    }

    /// A guard that never finds the disk low and keeps no ballast.
    pub fn off() -> DiskGuard {
        DiskGuard {
            dir: None,
            thresholds: Thresholds { min_free: 0, reserve: 0 },
            low: Arc::default(),
            free: AtomicU64::new(u64::MAX),
            checking: Mutex::new(None),
            measured: AtomicU64::new(0),
        }
    }

    /// What the guard keeps free.
    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// The last verdict, without measuring.
    pub fn last(&self) -> DiskStatus {
        DiskStatus {
            free_bytes: self.free.load(Ordering::Relaxed),
            min_free_bytes: self.thresholds.min_free,
            low: self.low.load(Ordering::Relaxed),
        }
    }

    /// Measures now, acts on the ballast, and returns the verdict. A measurement that fails
    /// keeps the last verdict (logged).
    pub fn check(&self) -> DiskStatus {
        let Some(dir) = &self.dir else { return self.last() };
        if self.thresholds.min_free == 0 {
            return self.last();
        }
        let mut checked_at = self.checking.lock().unwrap_or_else(|p| p.into_inner());
        self.measured.fetch_add(1, Ordering::Relaxed);
        *checked_at = Some(tokio::time::Instant::now());
        let free = match measure(dir) {
            Ok((free, _)) => free,
            Err(e) => {
                tracing::warn!(error = %e, dir = %dir.display(), "measuring free disk space failed; keeping the last verdict");
                return self.last();
            }
        };
        let reserve = dir.join(RESERVE_FILE);
        let present = std::fs::metadata(&reserve).is_ok_and(|m| m.len() >= self.thresholds.reserve);
        let d = decide(free, self.thresholds, present);
        match d.reserve {
            ReserveAction::Keep => {}
            ReserveAction::Release => match std::fs::remove_file(&reserve) {
                Ok(()) => tracing::warn!(
                    bytes = self.thresholds.reserve,
                    "disk low: deleted the ballast file to keep room to recover"
                ),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::error!(error = %e, "deleting the ballast file"),
            },
            ReserveAction::Restore => {
                if let Err(e) = create_reserve(dir, self.thresholds.reserve) {
                    tracing::warn!(error = %e, "creating the ballast file failed; will retry");
                }
            }
        }
        let was_low = self.low.swap(d.low, Ordering::Relaxed);
        self.free.store(free, Ordering::Relaxed);
        let status = self.last();
        if d.low && !was_low {
            tracing::warn!(
                free_bytes = free,
                min_free_bytes = self.thresholds.min_free,
                "disk low: this node takes no new writes (leader: 507 storage_full; follower: appends answered as heartbeats) until space is freed"
            );
        } else if was_low && !d.low {
            tracing::info!(free_bytes = free, "disk has room again: this node takes writes again");
        }
        metrics::gauge!("runnev_disk_free_bytes").set(free as f64);
        metrics::gauge!("runnev_disk_low").set(if d.low { 1.0 } else { 0.0 });
        status
    }

    /// `Some(status)` when the node must take no new writes: asked on every write (each
    /// publish on the leader, each append on a follower). It measures again (a `statvfs` and a
    /// `stat` of the ballast) unless the last measurement is younger than
    /// [`DISK_RECHECK_MS`] and found more than [`DISK_RECHECK_MARGIN_BYTES`] above the line:
    /// a node far from full does not pay a measurement per write (about 4 % of a leader's CPU
    /// per publish, profiled), and one near it measures at every write as before.
    pub fn refusal(&self) -> Option<DiskStatus> {
        let last = self.last();
        let far = !last.low && last.free_bytes > self.thresholds.min_free.saturating_add(DISK_RECHECK_MARGIN_BYTES);
        let recent = || {
            let at = *self.checking.lock().unwrap_or_else(|p| p.into_inner());
            at.is_some_and(|at| at.elapsed() < std::time::Duration::from_millis(DISK_RECHECK_MS))
        };
        let status = if far && recent() { last } else { self.check() };
        Some(status).filter(|s| s.low)
    }

    /// Measurements taken so far ([`DiskGuard::check`]).
    pub fn measurements(&self) -> u64 {
        self.measured.load(Ordering::Relaxed)
    }
}

/// Creates the ballast: written under a temporary name, allocated, synced, then renamed, so a
/// crash never leaves a short ballast under its real name.
fn create_reserve(dir: &Path, bytes: u64) -> io::Result<()> {
    let tmp = dir.join(format!("{RESERVE_FILE}.tmp"));
    let made = (|| {
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, bytes).map_err(io::Error::from)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(RESERVE_FILE))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    /// The verdict at and around both lines, with and without the ballast: releasing the
    /// ballast never ends "low" by itself, and the ballast comes back only with room for it.
    #[test]
    fn the_guard_refuses_below_the_line_and_recovers_above_it_plus_the_ballast() {
        let t = Thresholds { min_free: 64 * MIB, reserve: 4 * MIB };
        use ReserveAction::*;
        let d = |free, present| decide(free, t, present);
        assert_eq!(d(64 * MIB, true), Decision { low: false, reserve: Keep });
        assert_eq!(d(64 * MIB - 1, true), Decision { low: true, reserve: Release });
        assert_eq!(d(0, true), Decision { low: true, reserve: Release });
        // The ballast's bytes came back as free space: still low.
        assert_eq!(d(64 * MIB - 1 + 4 * MIB, false), Decision { low: true, reserve: Keep });
        assert_eq!(d(68 * MIB, false), Decision { low: false, reserve: Restore });
        assert_eq!(d(u64::MAX, false), Decision { low: false, reserve: Restore });
        // Off: never low, the ballast is left alone.
        let off = Thresholds { min_free: 0, reserve: 0 };
        assert_eq!(decide(0, off, false), Decision { low: false, reserve: Keep });
        assert_eq!(decide(0, off, true), Decision { low: false, reserve: Keep });
        // No ballast configured: one line, nothing to restore.
        let bare = Thresholds { min_free: 10, reserve: 0 };
        assert_eq!(decide(9, bare, false), Decision { low: true, reserve: Keep });
        assert_eq!(decide(10, bare, false), Decision { low: false, reserve: Keep });
        // Saturation at the top of the range.
        let top = Thresholds { min_free: u64::MAX, reserve: 4 * MIB };
        assert!(decide(u64::MAX - 1, top, false).low);
    }

    #[test]
    fn thresholds_fit_small_file_systems() {
        let big = Thresholds::for_fs(64 * MIB, 100 * 1024 * MIB);
        assert_eq!(big, Thresholds { min_free: 64 * MIB, reserve: DISK_RESERVE_BYTES_MAX });
        let small = Thresholds::for_fs(64 * MIB, 32 * MIB);
        assert_eq!(small, Thresholds { min_free: 8 * MIB, reserve: 4 * MIB });
        let tiny = Thresholds::for_fs(64 * MIB, 4 * MIB);
        assert_eq!(tiny, Thresholds { min_free: MIB, reserve: MIB / 2 });
        assert_eq!(Thresholds::for_fs(0, 32 * MIB), Thresholds { min_free: 0, reserve: 0 });
    }

    /// On a real directory: the ballast is created when there is room, and a guard that is off
    /// creates none.
    #[test]
    fn the_ballast_is_made_when_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = measure(dir.path()).unwrap();
        if free < 64 * MIB {
            panic!("the temp dir's file system has only {free} bytes free; this test needs 64 MiB");
        }
        let g = DiskGuard::open(dir.path(), MIB, Arc::default()).unwrap();
        assert!(!g.last().low);
        let len = std::fs::metadata(dir.path().join(RESERVE_FILE)).unwrap().len();
        assert_eq!(len, g.thresholds().reserve);
        assert!(g.refusal().is_none());
        let off_dir = tempfile::tempdir().unwrap();
        let off = DiskGuard::open(off_dir.path(), 0, Arc::default()).unwrap();
        assert!(!off.check().low);
        assert!(!off_dir.path().join(RESERVE_FILE).exists());
    }

    /// A node far from the line does not measure on every write, but again once the last
    /// measurement is [`DISK_RECHECK_MS`] old; a node near the line measures on every write.
    #[tokio::test(start_paused = true)]
    async fn a_write_far_from_the_line_reuses_a_recent_measurement() {
        let dir = tempfile::tempdir().unwrap();
        let g = DiskGuard::open(dir.path(), MIB, Arc::default()).unwrap();
        let after_open = g.measurements();
        for _ in 0..100 {
            assert!(g.refusal().is_none());
        }
        assert_eq!(g.measurements(), after_open, "far from the line: no measurement per write");
        tokio::time::advance(std::time::Duration::from_millis(DISK_RECHECK_MS)).await;
        assert!(g.refusal().is_none());
        assert_eq!(g.measurements(), after_open + 1, "measured again once the last is old");

        let near_dir = tempfile::tempdir().unwrap();
        let (free, _) = measure(near_dir.path()).unwrap();
        // The line half the margin below what is free (whatever the file system's size).
        let line = free.saturating_sub(DISK_RECHECK_MARGIN_BYTES / 2);
        let near = DiskGuard {
            dir: Some(near_dir.path().to_path_buf()),
            thresholds: Thresholds { min_free: line, reserve: 0 },
            low: Arc::default(),
            free: AtomicU64::new(free),
            checking: Mutex::new(None),
            measured: AtomicU64::new(0),
        };
        near.check();
        let before = near.measurements();
        for _ in 0..10 {
            near.refusal();
        }
        assert_eq!(near.measurements(), before + 10, "near the line: a measurement per write");
    }
}
