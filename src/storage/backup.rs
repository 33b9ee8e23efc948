//! Backups: one file holding a consistent cut of a node's whole applied state, and fresh data
//! directories rebuilt from one to form a new cluster (the idea of `etcdctl snapshot save` and
//! `etcdutl snapshot restore`).
//!
//! Format (backup format 1), all integers little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `RUNNEVB1` |
//! | 4 | the data format of the node that wrote it ([`super::format::FORMAT_VERSION`]) |
//! | … | a snapshot of the state machine ([`super::snapshot`]'s format, from one read transaction) |
//! | 8 | end magic `RUNNEVBE` |
//! | 8 | the number of bytes before the end magic |
//! | 4 | CRC-32 (IEEE) of the bytes before the end magic |
//!
//! A truncated file lacks the snapshot's end record or the trailer; a damaged one fails the CRC
//! or the snapshot's own checks. Writing and checking stream record by record: memory stays
//! bounded by one record, not by the state.
//!
//! Owns: the backup file format, writing one from a store, checking one, and laying out a fresh
//! data directory from one. Must never: change a store that already holds Raft state, or leave
//! a half-restored directory looking like a good one (the snapshot becomes current only after
//! the whole file checked out).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use openraft::{BasicNode, Membership, StoredMembership, Vote};
use redb::ReadableDatabase;

use super::format::{FORMAT_VERSION, READABLE};
use super::snapshot::{self, SnapshotMeta};
use super::{Store, StoreError};
use crate::raft::NodeId;

const MAGIC: &[u8; 8] = b"RUNNEVB1";
const END_MAGIC: &[u8; 8] = b"RUNNEVBE";

/// What a backup holds, as written or as checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupInfo {
    /// The last log index applied in the cut (`None` only for a node that applied nothing).
    pub log_index: Option<u64>,
    /// The Raft term of that entry.
    pub term: u64,
    /// Streams in the backup (deleted streams' tombstones not counted).
    pub streams: u64,
    /// Retained batches in the backup.
    pub batches: u64,
    /// The file's size, bytes.
    pub bytes: u64,
}

impl BackupInfo {
    fn of(meta: &SnapshotMeta, streams: u64, batches: u64, bytes: u64) -> BackupInfo {
        BackupInfo {
            log_index: meta.last_log_id.map(|l| l.index),
            term: meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0),
            streams,
            batches,
            bytes,
        }
    }
}

/// Counts and checksums what passes through it.
struct Summing<T> {
    inner: T,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<T> Summing<T> {
    fn new(inner: T) -> Summing<T> {
        Summing { inner, crc: crc32fast::Hasher::new(), bytes: 0 }
    }
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes = self.bytes.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Summing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes = self.bytes.saturating_add(n as u64);
        Ok(n)
    }
}

/// Writes a backup of `store`'s applied state, as one read transaction sees it, to `w`.
///
/// Errors: redb, encoding, or `w`'s failures (a reader that went away ends the write).
pub fn write(store: &Store, w: impl Write) -> Result<BackupInfo, StoreError> {
    let gate = store.payloads().read_gate();
    let txn = store.db().begin_read()?;
    let mut w = Summing::new(w);
    w.write_all(MAGIC)?;
    w.write_all(&FORMAT_VERSION.to_le_bytes())?;
    let (meta, streams, batches) = snapshot::write_state(store, &txn, &gate, &mut w)?;
    drop((txn, gate));
    let (crc, len) = (w.crc.finalize(), w.bytes);
    let mut w = w.inner;
    w.write_all(END_MAGIC)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&crc.to_le_bytes())?;
    w.flush()?;
    Ok(BackupInfo::of(&meta, streams, batches, len.saturating_add(20)))
}

/// Reads a whole backup from `r`, copying its snapshot (with the header edited by `edit`) to
/// `out`, and checks it: magic, data format, snapshot completeness, length, CRC, nothing after.
fn read(
    r: impl Read,
    out: &mut impl Write,
    edit: impl FnOnce(&SnapshotMeta) -> SnapshotMeta,
) -> Result<(SnapshotMeta, BackupInfo), StoreError> {
    let damaged = |why: String| StoreError::Backup(format!("the backup is damaged or truncated: {why}"));
    let eof = |e: StoreError| match e {
        StoreError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => damaged("it ends early".into()),
        StoreError::Snapshot(why) => damaged(why),
        StoreError::Codec(e) => damaged(format!("a record does not decode ({e})")),
        StoreError::Corrupt(why) => damaged(why),
        other => other,
    };
    let mut r = Summing::new(r);
    let mut head = [0u8; 12];
    r.read_exact(&mut head).map_err(|e| eof(e.into()))?;
    if &head[..8] != MAGIC {
        return Err(StoreError::Backup("not a Runnev backup (no RUNNEVB1 magic at its start)".into()));
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&head[8..]);
    let version = u32::from_le_bytes(version);
    if !READABLE.contains(&version) {
        return Err(StoreError::UnsupportedFormat { found: version, supported: FORMAT_VERSION });
    }
    let (meta, streams, batches) = snapshot::copy_with_meta(&mut r, out, edit).map_err(eof)?;
    let (crc, len) = (r.crc.finalize(), r.bytes);
    let mut r = r.inner;
    let mut tail = [0u8; 20];
    r.read_exact(&mut tail).map_err(|e| eof(e.into()))?;
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&tail[8..16]);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(&tail[16..]);
    if &tail[..8] != END_MAGIC || u64::from_le_bytes(len_bytes) != len {
        return Err(damaged("its trailer is missing or does not match its length".into()));
    }
    if u32::from_le_bytes(crc_bytes) != crc {
        return Err(damaged("its CRC does not match its contents".into()));
    }
    if r.read(&mut [0u8; 1])? != 0 {
        return Err(damaged("bytes follow its trailer".into()));
    }
    let info = BackupInfo::of(&meta, streams, batches, len.saturating_add(20));
    Ok((meta, info))
}

/// Checks the backup file at `path` from its first byte to its last.
///
/// Errors: [`StoreError::Backup`] for a file that is not a backup, damaged or truncated;
/// [`StoreError::UnsupportedFormat`] for another data format; I/O errors.
pub fn check(path: &Path) -> Result<BackupInfo, StoreError> {
    let file = open_backup(path)?;
    Ok(read(BufReader::with_capacity(1 << 20, file), &mut std::io::sink(), |m| m.clone())?.1)
}

/// Opens the backup file at `path` for reading.
///
/// Errors: [`StoreError::Backup`] naming the path when it cannot be opened or is not a file (a
/// bare "No such file or directory" did not say which of restore's two paths was missing).
fn open_backup(path: &Path) -> Result<File, StoreError> {
    let named = |why: String| StoreError::Backup(format!("cannot read the backup file {}: {why}", path.display()));
    let file = File::open(path).map_err(|e| named(e.to_string()))?;
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(named("it is not a regular file".into())),
        Err(e) => Err(named(e.to_string())),
    }
}

/// Lays out a fresh data directory `dir` for node `id` of a new cluster whose voters are
/// `peers` (id → `host:port`), holding exactly the state of the backup at `from`: the backup's
/// snapshot becomes the directory's current snapshot, with the new membership, and is installed
/// as the state machine; the vote is seeded at the backup's term, so the new cluster's first
/// election goes past it (Raft paper §5.1: terms only grow along a log).
///
/// The whole file is checked before anything is written; `dir` must not exist or be empty.
///
/// Errors: [`StoreError::Backup`] (damaged file, `dir` not empty, `id` not in `peers`, a backup
/// of a node that applied nothing), [`StoreError::UnsupportedFormat`], storage failures.
pub fn restore(
    from: &Path,
    dir: &Path,
    id: NodeId,
    peers: &BTreeMap<NodeId, String>,
) -> Result<BackupInfo, StoreError> {
    if !peers.contains_key(&id) {
        return Err(StoreError::Backup(format!("node {id} is not among the peers")));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(StoreError::Backup(format!(
            "{} is not a directory: restore makes a fresh data directory there",
            dir.display()
        )));
    }
    if std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(false) {
        return Err(StoreError::Backup(format!(
            "{} is not empty: restore makes a fresh data directory",
            dir.display()
        )));
    }
    let info = check(from)?;
    if info.log_index.is_none() {
        return Err(StoreError::Backup("the backup holds no applied state".into()));
    }
    let store = Store::open(dir)?;
    if !store.is_pristine()? {
        return Err(StoreError::Backup(format!("{} already holds Raft state", dir.display())));
    }
    let voters: BTreeSet<NodeId> = peers.keys().copied().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = peers.iter().map(|(n, a)| (*n, BasicNode { addr: a.clone() })).collect();
    let tmp = store.dir().join("snapshot.restore.tmp");
    let (meta, info) = {
        let mut out = BufWriter::new(File::create(&tmp)?);
        let got = read(BufReader::with_capacity(1 << 20, open_backup(from)?), &mut out, |m| SnapshotMeta {
            last_log_id: m.last_log_id,
            last_membership: StoredMembership::new(m.last_log_id, Membership::new(vec![voters], nodes)),
            snapshot_id: format!("{}-restored", m.snapshot_id),
        })?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        got
    };
    snapshot::publish(&store, &tmp)?;
    let (current, file) = match snapshot::open_current(&store)? {
        Some((meta, snapshot::Current::Full(file))) => (meta, file),
        _ => return Err(StoreError::Backup("the restored snapshot vanished from the data directory".into())),
    };
    snapshot::install(&store, file, &current)?;
    if let Some(last) = current.last_log_id {
        store.set_applied(last.index);
    }
    let term = meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0);
    store.seed_vote(&Vote::new(term, id))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_altered_backup_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("node")).unwrap();
        let mut bytes = Vec::new();
        let info = write(&store, &mut bytes).unwrap();
        assert_eq!(info.bytes, bytes.len() as u64);
        let path = dir.path().join("b");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(check(&path).unwrap(), info);
        for cut in [0, 5, 12, bytes.len() / 2, bytes.len() - 20, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let e = check(&path).expect_err("a truncated backup");
            assert!(matches!(e, StoreError::Backup(_)), "cut at {cut}: {e}");
        }
        for at in [20, bytes.len() - 25, bytes.len() - 3] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            assert!(matches!(check(&path), Err(StoreError::Backup(_))), "a flipped bit at {at}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        std::fs::write(&path, &longer).unwrap();
        assert!(matches!(check(&path), Err(StoreError::Backup(_))), "a byte after the trailer");
        let mut other = bytes;
        other[8] = 9;
        std::fs::write(&path, &other).unwrap();
        assert!(matches!(check(&path), Err(StoreError::UnsupportedFormat { found: 9, .. })));
    }
}
