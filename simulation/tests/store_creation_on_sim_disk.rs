//! The production store's creation (`runnev::storage::Store::open_with`, which creates a missing
//! database through `runnev::storage::db_dir`) on the simulated disk, without a cluster: a crash
//! at any disk operation of a new store's first open leaves a disk on which the store opens.
//!
//! Simulation seed 5101 found the creation was not atomic: n2, restarted on a wiped disk, lost
//! power at the fourth disk operation of its first open, while redb created `runnev.redb` in
//! place; the file held a header without redb's magic number, and every later start failed
//! with `Not a redb database: magic number mismatch`.

use std::path::Path;
use std::sync::Arc;

use redb::StorageBackend;
use runnev::storage::db_dir::DatabaseDir;
use runnev::storage::{Store, StoreError};
use simulation::disk::{CrashKind, SimDisk, REDB_FILE, REDB_FILE_NEW};
use simulation::rng::SimRng;

/// Opens the store on `disk` (its `FORMAT` and snapshots under `data`), as a node does.
fn open(data: &Path, disk: &SimDisk) -> Result<Arc<Store>, StoreError> {
    Store::open_with(data, &disk.db_dir(), disk.segments(), disk.payloads())
}

/// The crashes tried at each operation: a kill, power losses that keep none, some and all of
/// the unsynced pages, the torn ones with several draws of which pages (the seed's 188‰ among
/// them).
fn crashes() -> Vec<(CrashKind, u64)> {
    let mut kinds = vec![(CrashKind::Kill, 0), (CrashKind::PowerLoss { keep_per_mille: 0 }, 0)];
    for keep_per_mille in [188, 500, 1000] {
        kinds.extend((1..=4).map(|draw| (CrashKind::PowerLoss { keep_per_mille }, draw)));
    }
    kinds
}

/// Where the files stood when a cut struck: the database not yet renamed into place, or there.
#[derive(Debug, Default)]
struct Seen {
    before_rename: bool,
    after_rename: bool,
}

/// A new store's first open is cut at its `op`-th disk operation by `kind` (`draw` seeds which
/// unsynced pages a torn power loss keeps); the next start must open it, leave no temporary file
/// behind and find a store that never held Raft state, and a durable write to that store must
/// survive a power loss and the start after it. Returns `false` when the open took fewer than
/// `op` operations (the cut never struck).
fn cut_at(op: u64, kind: CrashKind, draw: u64, seen: &mut Seen) -> bool {
    let data = tempfile::tempdir().unwrap();
    let disk = SimDisk::new();
    disk.arm_cut(op, kind, SimRng::new(5101 + draw));
    let ghost = open(data.path(), &disk);
    if !disk.take_fired_cut() {
        assert!(disk.disarm_cut(), "a cut that did not strike is still armed");
        ghost.expect("a first open with no crash");
        return false;
    }
    // The cut incarnation carried on alone; its store dies with its host.
    drop(ghost);
    let files = disk.file_names();
    seen.before_rename |= !files.iter().any(|f| f == REDB_FILE);
    seen.after_rename |= files.iter().any(|f| f == REDB_FILE);
    let case = format!("{kind:?} (draw {draw}) at operation {op}, leaving {files:?}");
    let store = open(data.path(), &disk).unwrap_or_else(|e| panic!("{case}: the next start failed: {e}"));
    assert!(store.is_pristine().unwrap(), "{case}");
    assert_eq!(disk.file_names(), vec![REDB_FILE.to_string()], "{case}: the temporary file is gone");
    store.mark_formed().unwrap();
    drop(store);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut SimRng::new(draw));
    let store = open(data.path(), &disk).unwrap_or_else(|e| panic!("{case}: the start after that failed: {e}"));
    assert!(store.formed().unwrap(), "{case}: a durable write to the recovered store survives");
    true
}

/// Every operation of a new store's first open (the temporary database's creation, redb's
/// writes and fsyncs, the tables' durable commit, the close, the rename into place, the open
/// under the final name and its first commit), cut by each kind of crash: the store opens
/// at the next start. Fails without the atomic creation: a crash between redb's sizing of the
/// new file and the fsync of its magic number (written last) leaves `runnev.redb` with a header
/// but no magic number (`Not a redb database: magic number mismatch`); a kill at the third
/// operation already does.
#[test]
fn a_crash_at_any_operation_of_a_new_store_s_creation_leaves_a_store_that_opens() {
    let mut seen = Seen::default();
    let mut ops = 0;
    for op in 1.. {
        assert!(op <= 200, "a first open takes a bounded number of operations");
        let mut struck = false;
        for (kind, draw) in crashes() {
            struck |= cut_at(op, kind, draw, &mut seen);
        }
        if !struck {
            break;
        }
        ops = op;
    }
    println!("a new store's first open takes {ops} disk operations; cut at each, {} ways", crashes().len());
    assert!(ops >= 6, "the first open took {ops} operations: the creation was not cut at each step");
    assert!(seen.before_rename && seen.after_rename, "cuts struck on both sides of the rename: {seen:?}");
}

/// A leftover temporary database (a crash during a creation) beside a database that is in
/// place is removed, and the database is kept as it was.
#[test]
fn a_leftover_temporary_database_beside_the_real_one_is_removed() {
    let data = tempfile::tempdir().unwrap();
    let disk = SimDisk::new();
    let store = open(data.path(), &disk).unwrap();
    store.mark_formed().unwrap();
    drop(store);
    let dir = disk.db_dir();
    {
        let junk = dir.backend(REDB_FILE_NEW).unwrap();
        junk.set_len(8192).unwrap();
        junk.write(0, &[0xa5; 8192]).unwrap();
        junk.sync_data().unwrap();
    }
    assert_eq!(disk.file_names(), vec![REDB_FILE.to_string(), REDB_FILE_NEW.to_string()]);
    disk.crash(CrashKind::Kill, &mut SimRng::new(1));
    let store = open(data.path(), &disk).unwrap();
    assert!(store.formed().unwrap(), "the database in place is the one opened");
    assert_eq!(disk.file_names(), vec![REDB_FILE.to_string()]);
}
