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
        txn.commit()?;
        Ok(())
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
        let store = self.store.clone();
        blocking(move || store.log().read(start, end.unwrap_or(u64::MAX))).await.map_err(|e| raft_err(e, false))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let store = self.store.clone();
        blocking(move || -> Result<LogState<TypeConfig>, StoreError> {
            let last_purged: Option<LogId> = Self::read_meta(&store, "last_purged")?;
            let last = store.log().last_log_id().or(last_purged);
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
        blocking(move || Self::read_meta(&store, "vote")).await.map_err(|e| raft_err(e, false))
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
        // Written under the log's lock, fsynced after releasing it (readers need not wait).
        let res = blocking(move || {
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

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        let bytes = encode(&log_id).map_err(|e| raft_err(e, true))?;
        blocking(move || -> Result<(), StoreError> {
            // The purge point is durable before any entry is dropped: recovery skips entries
            // at or below it, so a crash in between leaves no gap below the log.
            let current: Option<LogId> = Self::read_meta(&store, "last_purged")?;
            if current.is_none_or(|c| c.index < log_id.index) {
                Self::write_meta(&store, "last_purged", &bytes)?;
            }
            store.log().purge(log_id.index)
        })
        .await
        .map_err(|e| raft_err(e, true))
    }
}

#[cfg(test)]
mod tests {
    use super::to_bounds;

    #[test]
    fn range_bounds_are_inclusive_pairs() {
        assert_eq!(to_bounds(&(3..7)), (3, Some(6)));
        assert_eq!(to_bounds(&(3..=7)), (3, Some(7)));
        assert_eq!(to_bounds(&(3..)), (3, None));
        assert_eq!(to_bounds(&(..0)), (1, Some(0)));
    }
}
