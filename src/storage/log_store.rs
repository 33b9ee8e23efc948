//! The Raft log and vote on redb: openraft's [`RaftLogStorage`].
//!
//! Owns: log entries by log index, the vote, the last purged log id. Must never: report an
//! append or a vote as persisted before redb's durable commit (one fsync) has returned; that is
//! what makes an acknowledged publish survive a crash (Raft paper §5.3, figure 2 "persistent
//! state"). Each append is one transaction, so a batch of entries costs one fsync.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{RaftLogId, RaftLogReader, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::{blocking, decode, encode, raft_err, Entry, Store, StoreError, LOG, RAFT_META};
use crate::raft::{LogId, NodeId, StorageError, TypeConfig};

/// openraft's log store over the node's [`Store`]. Cheap to clone; clones share the database.
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

    fn write<F>(store: &Store, f: F) -> Result<(), StoreError>
    where
        F: FnOnce(&redb::WriteTransaction) -> Result<(), StoreError>,
    {
        let txn = store.db().begin_write()?;
        f(&txn)?;
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
        blocking(move || -> Result<Vec<Entry>, StoreError> {
            let end = end.unwrap_or(u64::MAX);
            if start > end {
                return Ok(Vec::new());
            }
            let txn = store.db().begin_read()?;
            let t = txn.open_table(LOG)?;
            let mut out: Vec<Entry> = Vec::new();
            for row in t.range(start..=end)? {
                let (k, v) = row?;
                // openraft checks only a range's ends; a hole inside must be an error, never
                // entries silently skipped (the simulation once produced one).
                if let Some(prev) = out.last() {
                    if k.value() != prev.get_log_id().index + 1 {
                        return Err(StoreError::Corrupt(format!(
                            "raft log hole: index {} follows {}",
                            k.value(),
                            prev.get_log_id().index
                        )));
                    }
                }
                out.push(decode(v.value())?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| raft_err(e, false))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let store = self.store.clone();
        blocking(move || -> Result<LogState<TypeConfig>, StoreError> {
            let last_purged: Option<LogId> = Self::read_meta(&store, "last_purged")?;
            let txn = store.db().begin_read()?;
            let t = txn.open_table(LOG)?;
            let last = match t.last()? {
                Some((_, v)) => Some(*decode::<Entry>(v.value())?.get_log_id()),
                None => last_purged,
            };
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
        blocking(move || {
            Self::write(&store, |txn| {
                txn.open_table(RAFT_META)?.insert("vote", bytes.as_slice())?;
                Ok(())
            })
        })
        .await
        .map_err(|e| raft_err(e, true))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let store = self.store.clone();
        blocking(move || Self::read_meta(&store, "vote")).await.map_err(|e| raft_err(e, false))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Kept in memory for /readyz and /v1/cluster: the leader re-establishes the commit index
        // after a restart, so persisting it would only cost a write.
        if let Some(c) = committed {
            self.store.set_committed(c.index);
        }
        Ok(())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut rows = Vec::new();
        for e in entries {
            rows.push((e.get_log_id().index, encode(&e).map_err(|e| raft_err(e, true))?));
        }
        let store = self.store.clone();
        let res = blocking(move || {
            Self::write(&store, |txn| {
                // Entries at or below the purge point are covered by a snapshot; writing them
                // would put stale entries below a gap (a late, duplicated append can carry them).
                let purged =
                    txn.open_table(RAFT_META)?.get("last_purged")?.map(|v| decode::<LogId>(v.value())).transpose()?;
                let mut t = txn.open_table(LOG)?;
                for (index, bytes) in rows.iter().filter(|(i, _)| purged.is_none_or(|p| *i > p.index)) {
                    t.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            })
        })
        .await;
        // Report completion only now that the commit (and its fsync) has returned.
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
        blocking(move || {
            Self::write(&store, |txn| {
                txn.open_table(LOG)?.retain_in(log_id.index.., |_, _| false)?;
                Ok(())
            })
        })
        .await
        .map_err(|e| raft_err(e, true))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let store = self.store.clone();
        let bytes = encode(&log_id).map_err(|e| raft_err(e, true))?;
        blocking(move || {
            Self::write(&store, |txn| {
                txn.open_table(RAFT_META)?.insert("last_purged", bytes.as_slice())?;
                txn.open_table(LOG)?.retain_in(..=log_id.index, |_, _| false)?;
                Ok(())
            })
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
