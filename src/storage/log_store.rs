//! openraft's [`RaftLogStorage`] over the node's [`Store`]: entries in [`super::segments`], the
//! vote and the purge point in redb.
//!
//! Owns: the mapping of openraft's log calls onto storage. Must never: report an append or a
//! vote as persisted before its fsync has returned; that is what makes an acknowledged publish
//! survive a crash (Raft paper §5.3, figure 2 "persistent state"). An append of many entries
//! costs one fsync.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{RaftLogReader, Vote};
use redb::ReadableDatabase;

use super::{blocking, decode, encode, raft_err, Entry, Store, StoreError, RAFT_META};
use crate::raft::{LogId, NodeId, StorageError, TypeConfig};

/// openraft's log store over the node's [`Store`]. Cheap to clone; clones share the log.
#[derive(Clone)]
pub struct LogStore {
    store: Arc<Store>,
}

impl LogStore {
    /// A log store over `store`.
    pub fn new(store: Arc<Store>) -> Self {
        LogStore { store }
    }

    fn read_meta<T: serde::de::DeserializeOwned>(store: &Store, key: &str) -> Result<Option<T>, StoreError> {
        let txn = store.db().begin_read()?;
        let t = txn.open_table(RAFT_META)?;
        t.get(key)?.map(|v| decode(v.value())).transpose()
    }

    fn write_meta(store: &Store, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let txn = store.begin_durable_write()?;
        txn.open_table(RAFT_META)?.insert(key, bytes)?;
        store.commit_durably(txn)
    }
}

fn to_bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => Some(*e),
        Bound::Excluded(0) => return (1, Some(0)),
        Bound::Excluded(e) => Some(e - 1),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let (start, end) = to_bounds(&range);
        let end = end.unwrap_or(u64::MAX);
        // Entries still in memory are cloned here (their payloads are shared, not copied); a
        // hand-off to the blocking pool and back cost more than that. Only a read of the files,
        // or a log busy with an append, goes to the pool.
        if let Some(entries) = self.store.try_log().and_then(|log| log.read_cached(start, end)) {
            return Ok(entries);
        }
        let store = self.store.clone();
        blocking(move || store.log().read(start, end)).await.map_err(|e| raft_err(e, false))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let store = self.store.clone();
        blocking(move || -> Result<LogState<TypeConfig>, StoreError> {
            // Both from the log, under one lock: its purge point is redb's as loaded at open
            // and advanced by every purge after redb's, and the entries it holds follow it
            // (`segments`), so the last log id is never below the purge point.
            let log = store.log();
            let last_purged = log.purged();
            let last = log.last_log_id().or(last_purged);
            debug_assert!(last >= last_purged, "last log id {last:?} below the purge point {last_purged:?}");
            Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
        })
        .await
        .map_err(|e| raft_err(e, false))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let store = self.store.clone();
        let bytes = encode(vote).map_err(|e| raft_err(e, true))?;
        blocking(move || Self::write_meta(&store, "vote", &bytes)).await.map_err(|e| raft_err(e, true))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let store = self.store.clone();
        blocking(move || store.saved_vote()).await.map_err(|e| raft_err(e, false))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // For /readyz and /v1/cluster, and as a hint (no fsync) for the next start, so a node
        // restarted after a crash re-applies what it had applied before serving anything.
        if let Some(c) = committed {
            self.store.set_committed(c.index);
            self.store.log().save_commit_hint(c).map_err(|e| raft_err(e, true))?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let store = self.store.clone();
        blocking(move || store.log().commit_hint()).await.map_err(|e| raft_err(e, false))
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let store = self.store.clone();
        // Written under the log's lock, fsynced after releasing it (readers need not wait). On
        // this task: openraft 0.9's core awaits the append before anything else, so a trip to
        // the blocking pool would only add two thread wake-ups (`io::on_caller`).
        let res = super::io::on_caller(move || {
            let pending = store.log().append(entries)?;
            pending.sync()
        })
        .await;
        // Report completion only now that the fsync has returned.
        match res {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(raft_err(e, true))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        blocking(move || store.log().truncate(log_id.index)).await.map_err(|e| raft_err(e, true))
    }

    /// Moves the purge point durably, then hands the segments it emptied to tokio's blocking
    /// pool for removal without waiting (`segments::Retired::remove_behind`, after the log's
    /// lock is released): openraft 0.9's core awaits this call, and while it waited for a
    /// 64 MiB file's removal no entry was replicated or committed.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        let bytes = encode(&log_id).map_err(|e| raft_err(e, true))?;
        blocking(move || -> Result<(), StoreError> {
            // openraft 0.9 purges the log a received snapshot covers as soon as it hands the
            // install to the state machine's worker, before the install has committed
            // (`FollowingHandler::install_full_snapshot`). A crash in between left a purge point
            // past the applied log id: the node restarted needing entries its log no longer held,
            // and its Raft core stopped for good ("try to get log at index 352 but got
            // Some(505)", simulation seed 5101 once a crash no longer kept the snapshot file the
            // cut incarnation wrote). The install moves the purge point itself, in its own
            // transaction, when it commits (`snapshot::install`): while one is under way, a purge
            // past the applied state is left to it.
            if store.install_pending_through().is_some_and(|through| through >= log_id.index)
                && store.last_applied()?.is_none_or(|a| a.index < log_id.index)
            {
                tracing::debug!(upto = %log_id, "purge past the applied log id left to the snapshot install under way");
                return Ok(());
            }
            // The purge point is durable before any entry is dropped: recovery skips entries
            // at or below it, so a crash in between leaves no gap below the log.
            let current: Option<LogId> = Self::read_meta(&store, "last_purged")?;
            if current.is_none_or(|c| c.index < log_id.index) {
                Self::write_meta(&store, "last_purged", &bytes)?;
            }
            let retired = store.log().purge(log_id)?;
            retired.remove_behind(log_id);
            Ok(())
        })
        .await
        .map_err(|e| raft_err(e, true))
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::{RaftLogStorage, RaftStateMachine, StorageHelper};
    use openraft::{CommittedLeaderId, EntryPayload, RaftSnapshotBuilder};

    use super::{to_bounds, LogStore};
    use crate::raft::LogId;
    use crate::storage::state_machine::StateMachine;
    use crate::storage::{snapshot, Entry, Store};

    fn id(term: u64, leader: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, leader), index)
    }

    fn blank(term: u64, leader: u64, index: u64) -> Entry {
        Entry { log_id: id(term, leader, index), payload: EntryPayload::Blank }
    }

    /// The state simulation seed 200860 restarted a follower on, rebuilt on the real stores:
    /// node 3 led term 1 and appended 1..=8 (6..=8 never committed); the state machine durably
    /// holds 1..=5 and `snapshot.bin` covers term 17's entry 6 (its commit of 6 under another
    /// leader; the log's truncation of 6..=8 was lost with a crash). At start-up the snapshot
    /// is restored into the state machine, then openraft reads the log state
    /// (`StorageHelper::get_initial_state`, which is what `Raft::new` runs). Before the fix, the
    /// store kept the stale entries 7..=8 of term 1 behind the purge point T17-6 and reported
    /// them as its last log id, below the purge point; openraft took the log for one that ends
    /// at the snapshot, and the next append from the leader, at index 7, was refused ("append
    /// of index 7 where Some(9) was next"): the Raft core stopped for good.
    #[tokio::test]
    async fn a_snapshot_restored_over_a_stale_log_tail_leaves_a_log_openraft_can_append_to() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Store::open(a_dir.path()).unwrap();
        a.log().append((1..=8).map(|i| blank(1, 3, i)).collect()).unwrap().sync().unwrap();
        let mut sm_a = StateMachine::new(a.clone());
        sm_a.apply((1..=5).map(|i| blank(1, 3, i)).collect::<Vec<_>>()).await.unwrap();
        // Another node's state machine at term 17's entry 6, and its snapshot, in a's directory.
        let b = Store::open(b_dir.path()).unwrap();
        let mut sm_b = StateMachine::new(b.clone());
        let history: Vec<Entry> = (1..=5).map(|i| blank(1, 3, i)).chain([blank(17, 1, 6)]).collect();
        sm_b.apply(history).await.unwrap();
        let snap = sm_b.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id, Some(id(17, 1, 6)));
        drop(snap);
        std::fs::copy(snapshot::current_path(b.dir()), snapshot::current_path(a.dir())).unwrap();

        assert_eq!(snapshot::restore_state_machine(&a).unwrap(), Some(6));
        let mut log_store = LogStore::new(a.clone());
        let state = StorageHelper::new(&mut log_store, &mut sm_a).get_initial_state().await.unwrap();
        assert_eq!(state.committed, Some(id(17, 1, 6)));
        let told = log_store.get_log_state().await.unwrap();
        assert_eq!(told.last_purged_log_id, Some(id(17, 1, 6)));
        assert_eq!(told.last_log_id, Some(id(17, 1, 6)), "the store agrees with openraft: the stale 7..=8 are gone");
        // The leader's next entries follow the snapshot.
        a.log().append(vec![blank(18, 2, 7), blank(18, 2, 8)]).unwrap().sync().unwrap();
        let read: Vec<LogId> = a.log().read(0, u64::MAX).unwrap().iter().map(|e| e.log_id).collect();
        assert_eq!(read, vec![id(18, 2, 7), id(18, 2, 8)]);
    }

    /// openraft's own start-up repair (`last_log_id < last_applied`: "snapshot installed but
    /// logs not cleaned") purges to the applied log id, which may be of a newer term than the
    /// log's stale tail after it; the store must then report the log as ending there, as
    /// openraft assumes, and accept the entry after it.
    #[tokio::test]
    async fn a_purge_point_of_a_newer_term_drops_the_stale_entries_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.log().append((1..=8).map(|i| blank(1, 3, i)).collect()).unwrap().sync().unwrap();
        let mut log_store = LogStore::new(store.clone());
        log_store.purge(id(17, 1, 6)).await.unwrap();
        let told = log_store.get_log_state().await.unwrap();
        assert_eq!((told.last_purged_log_id, told.last_log_id), (Some(id(17, 1, 6)), Some(id(17, 1, 6))));
        store.log().append(vec![blank(18, 2, 7)]).unwrap().sync().unwrap();
        // And after a restart on that purge point.
        drop((log_store, store));
        let store = Store::open(dir.path()).unwrap();
        let read: Vec<LogId> = store.log().read(0, u64::MAX).unwrap().iter().map(|e| e.log_id).collect();
        assert_eq!(read, vec![id(18, 2, 7)]);
    }

    /// A store in `dir` whose log holds entries 1..=8 of term 1 and whose state machine has
    /// applied 1..=3, and its log store.
    async fn applied_3_of_8(dir: &std::path::Path) -> (std::sync::Arc<Store>, LogStore) {
        let store = Store::open(dir).unwrap();
        store.log().append((1..=8).map(|i| blank(1, 3, i)).collect()).unwrap().sync().unwrap();
        StateMachine::new(store.clone()).apply((1..=3).map(|i| blank(1, 3, i)).collect::<Vec<_>>()).await.unwrap();
        (store.clone(), LogStore::new(store))
    }

    /// Simulation seed 5101 (once a cut rolled back the snapshot files the cut incarnation
    /// wrote): openraft asked to purge the log through a received snapshot's last entry before
    /// the state machine had installed it, and a crash came in between. The purge point was
    /// durable at 504 and the state machine at 351: the restarted node needed 352, which was
    /// gone. While an install is under way, a purge past the applied log id is left to it (the
    /// install moves the purge point with the state it replaces).
    #[tokio::test]
    async fn a_purge_past_the_applied_state_is_left_to_the_snapshot_install_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut log_store) = applied_3_of_8(dir.path()).await;
        let install = store.begin_install(6);
        log_store.purge(id(1, 3, 6)).await.unwrap();
        // A crash now, before the install committed: the node restarts on what it stored.
        drop((install, log_store, store));
        let store = Store::open(dir.path()).unwrap();
        let mut log_store = LogStore::new(store.clone());
        let told = log_store.get_log_state().await.unwrap();
        assert_eq!(told.last_purged_log_id, None, "nothing purged past the applied entry 3");
        let read: Vec<u64> = store.log().read(4, u64::MAX).unwrap().iter().map(|e| e.log_id.index).collect();
        assert_eq!(read, vec![4, 5, 6, 7, 8], "the entries the state machine needs next are there");
        // With no install under way, a purge is a purge (openraft's contract, its suite).
        log_store.purge(id(1, 3, 6)).await.unwrap();
        assert_eq!(log_store.get_log_state().await.unwrap().last_purged_log_id, Some(id(1, 3, 6)));
        // A purge of applied entries goes through during an install too.
        let _install = store.begin_install(8);
        log_store.purge(id(1, 3, 6)).await.unwrap();
    }

    /// Two installs can overlap (a duplicated install RPC, or a newer snapshot sent while the
    /// first was installing): the end of one must not end the other's hold on the purge. Before,
    /// one atomic held the last install begun, and whichever guard dropped first cleared it.
    #[tokio::test]
    async fn an_install_that_ends_leaves_an_overlapping_install_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let (store, mut log_store) = applied_3_of_8(dir.path()).await;
        let newer = store.begin_install(7);
        let older = store.begin_install(5);
        assert_eq!(store.install_pending_through(), Some(7));
        drop(older);
        assert_eq!(store.install_pending_through(), Some(7), "the newer install is still under way");
        log_store.purge(id(1, 3, 7)).await.unwrap();
        assert_eq!(log_store.get_log_state().await.unwrap().last_purged_log_id, None, "left to the install");
        drop(newer);
        assert_eq!(store.install_pending_through(), None);
    }

    #[test]
    fn range_bounds_are_inclusive_pairs() {
        assert_eq!(to_bounds(&(3..7)), (3, Some(6)));
        assert_eq!(to_bounds(&(3..=7)), (3, Some(7)));
        assert_eq!(to_bounds(&(3..)), (3, None));
        assert_eq!(to_bounds(&(..0)), (1, Some(0)));
    }
}
