//! Storage: per node, the Raft log in segment files, and one redb database holding the vote and
//! the state machine, and the snapshot file beside them.
//!
//! Owns: the on-disk layout, its encodings, and the read side of the state machine that the API
//! serves. Must never: acknowledge a write before it is fsynced, or serve a batch that is not
//! applied (everything in the state-machine tables is committed by Raft).
//!
//! Layout (`--data-dir`):
//! - `log/<index>.seg`: the Raft log (see [`segments`]);
//! - `runnev.redb`: tables [`RAFT_META`], [`SM_META`], [`STREAMS`], [`TOMBSTONES`], [`BATCHES`],
//!   [`TOKENS`];
//! - `snapshot.bin`: the newest snapshot (see [`snapshot`]), replaced atomically by rename.
//!
//! The state machine commits without fsync (the log is the durable record and replays it) and
//! durably every [`crate::limits::SM_DURABLE_EVERY_ENTRIES`] entries or
//! [`crate::limits::SM_DURABLE_EVERY_BYTES`] bytes, which bounds the replay after a crash.

pub mod backup;
pub mod format;
pub mod io;
pub mod log_store;
pub mod segments;
pub mod snapshot;
pub mod state_machine;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};
use tokio::sync::watch;

use crate::raft::{StreamInfo, TypeConfig};
use crate::stream::StreamMeta;

/// Where the Raft log lived before it moved to [`segments`]; a database that still has it is
/// refused rather than silently started without its log.
const LEGACY_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: `"vote"` → `Vote`, `"last_purged"` → `LogId`, postcard-encoded.
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
/// Key in [`RAFT_META`] present while a node that lost its disk has not been caught up by a
/// leader (`raft::formation::guard_wiped_node`): it grants no vote meanwhile.
const CATCHING_UP: &str = "catching_up";
/// State-machine metadata: `"last_applied"` → `Option<LogId>`, `"membership"` → `StoredMembership`,
/// `"clock_ms"` → u64, the cluster clock (see [`state_machine`]).
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
/// Streams: name → postcard-encoded [`StreamMeta`].
pub(crate) const STREAMS: TableDefinition<&str, &[u8]> = TableDefinition::new("streams");
/// Deleted streams: name → the postcard-encoded [`StreamMeta`] it had when deleted, so a stream
/// created again under the name continues after its last seq (seqs are never reused, SPEC §1).
pub(crate) const TOMBSTONES: TableDefinition<&str, &[u8]> = TableDefinition::new("tombstones");
/// Client tokens: name → postcard-encoded [`crate::auth::TokenRecord`] (salt and hash, never
/// the secret); the key [`TOKENS_BOOTSTRAPPED`] (not a token name) marks that the cluster's
/// bootstrap token was made.
pub(crate) const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
/// The key in [`TOKENS`] recording that the bootstrap admin token was made (empty: no token
/// can have this name).
pub(crate) const TOKENS_BOOTSTRAPPED: &str = "";
/// Batches: (stream, seq) → [`BatchValue`] encoding (`ts` u64 LE, log index u64 LE, payload).
pub(crate) const BATCHES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("batches");

/// A storage failure. Never caused by client input: callers validate before reaching storage.
/// [`StoreError::is_storage_full`] tells a full disk (the one failure a client is told about as
/// such, `507`; `crate::error` maps every variant to HTTP).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb failed (I/O, corruption, transaction).
    #[error("database: {0}")]
    Db(#[from] redb::Error),
    /// A stored value did not decode.
    #[error("decoding a stored value: {0}")]
    Codec(#[from] postcard::Error),
    /// File I/O on the log, the snapshot or the data directory failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A stored structure of the Raft log or the state machine broke an invariant.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A snapshot file, built here or received from the leader, is not a complete snapshot (no
    /// magic, no header, a record over the limit, counts or metadata that do not match).
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// A snapshot record is larger than its u32 length can frame (4 GiB).
    #[error("a snapshot record of {0} bytes is over the 4 GiB its length can frame")]
    RecordTooLarge(usize),
    /// redb refused the durability asked of a transaction: a fault of this build, not damage.
    #[error("setting a transaction's durability: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// The data directory keeps its Raft log in redb, an older Runnev layout this build does not
    /// read.
    #[error("this data directory keeps its Raft log in redb (an older Runnev layout); start from an empty directory")]
    LegacyLayout,
    /// The data directory's `FORMAT` file names a format this build does not read
    /// ([`format::FORMAT_VERSION`]).
    #[error(
        "this data directory is in data format {found}; this runnev reads format {supported} only: run the runnev that wrote it, or start from an empty directory"
    )]
    UnsupportedFormat {
        /// The format the directory was written in.
        found: u32,
        /// The one format this build reads.
        supported: u32,
    },
    /// A backup file is not a complete, undamaged backup, or a restore cannot lay out its
    /// directory (see [`backup::restore`]).
    #[error("{0}")]
    Backup(String),
}

impl StoreError {
    /// Whether the failure is a full disk (`ENOSPC`, [`std::io::ErrorKind::StorageFull`]), from
    /// file I/O or wrapped by redb.
    pub fn is_storage_full(&self) -> bool {
        let io = match self {
            StoreError::Io(e) | StoreError::Db(redb::Error::Io(e)) => e,
            _ => return false,
        };
        io.kind() == std::io::ErrorKind::StorageFull
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(impl From<$t> for StoreError { fn from(e: $t) -> Self { StoreError::Db(e.into()) } })*};
}
from_redb!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

/// Encodes a value for storage or the wire (postcard: compact, schema-less, serde-driven).
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    Ok(postcard::to_stdvec(value)?)
}

/// Decodes a value written by [`encode`].
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// A stored batch value: fixed-width header then the payload.
pub(crate) struct BatchValue;

impl BatchValue {
    const HEADER_BYTES: usize = 16;

    /// Encodes (`ts` ms, log index, payload).
    pub(crate) fn encode(ts: u64, index: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::HEADER_BYTES + payload.len());
        v.extend_from_slice(&ts.to_le_bytes());
        v.extend_from_slice(&index.to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    /// Splits a stored value into (`ts` ms, log index, payload).
    pub(crate) fn decode(v: &[u8]) -> Result<(u64, u64, &[u8]), StoreError> {
        if v.len() < Self::HEADER_BYTES {
            return Err(StoreError::Corrupt(format!("batch value of {} bytes", v.len())));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Ok((word(0), word(8), &v[Self::HEADER_BYTES..]))
    }
}

/// One batch as read back for a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBatch {
    /// Its seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// Raft log index of the entry that stored it.
    pub index: u64,
    /// The payload, byte for byte.
    pub data: Vec<u8>,
}

/// The answer of [`Store::read_batches`]: the stream's metadata and the batches after a cursor,
/// both from one consistent read transaction.
#[derive(Debug, Clone)]
pub struct BatchesView {
    /// The stream as of the read.
    pub meta: StreamMeta,
    /// Batches with seq > `after`, in seq order.
    pub batches: Vec<StoredBatch>,
}

/// A node's storage: the redb database, the data directory, and the applied-index signal that
/// readers wait on.
pub struct Store {
    db: Database,
    log: std::sync::Mutex<segments::SegmentLog>,
    dir: PathBuf,
    applied_tx: watch::Sender<u64>,
    committed_index: AtomicU64,
    snapshot_files: std::sync::Mutex<()>,
    disk_low: Arc<AtomicBool>,
}

impl Store {
    /// Opens (or creates) the store under `dir`, creating the directory and every table.
    ///
    /// Errors: the directory cannot be created; its `FORMAT` names another data format
    /// ([`StoreError::UnsupportedFormat`], checked before anything else is opened); or redb cannot
    /// open the database (another process holds it, or it is corrupt).
    pub fn open(dir: &Path) -> Result<Arc<Store>, StoreError> {
        std::fs::create_dir_all(dir)?;
        format::check_or_write(dir)?;
        let db = Database::create(dir.join("runnev.redb"))?;
        let segments = segments::FsSegments::new(dir.join("log"))?;
        Store::init(db, Arc::new(segments), dir)
    }

    /// Opens the store on a redb storage backend and a segment directory (the simulation's,
    /// which lose unsynced writes on a crash); snapshots still live under `dir`.
    ///
    /// Errors: as [`Store::open`].
    pub fn open_with_backend(
        dir: &Path,
        backend: impl redb::StorageBackend,
        segments: Arc<dyn segments::SegmentDir>,
    ) -> Result<Arc<Store>, StoreError> {
        std::fs::create_dir_all(dir)?;
        format::check_or_write(dir)?;
        let db = Database::builder().create_with_backend(backend)?;
        Store::init(db, segments, dir)
    }

    fn init(db: Database, segments: Arc<dyn segments::SegmentDir>, dir: &Path) -> Result<Arc<Store>, StoreError> {
        {
            let txn = db.begin_read()?;
            match txn.open_table(LEGACY_LOG) {
                Ok(t) if t.first()?.is_some() => return Err(StoreError::LegacyLayout),
                Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let txn = begin_durable_write(&db)?;
        {
            txn.open_table(RAFT_META)?;
            txn.open_table(SM_META)?;
            txn.open_table(STREAMS)?;
            txn.open_table(TOMBSTONES)?;
            txn.open_table(BATCHES)?;
            txn.open_table(TOKENS)?;
        }
        txn.commit()?;
        let purged: Option<crate::raft::LogId> = {
            let txn = db.begin_read()?;
            let t = txn.open_table(RAFT_META)?;
            t.get("last_purged")?.map(|v| decode(v.value())).transpose()?
        };
        let log = segments::SegmentLog::open(segments, purged)?;
        let store = Store {
            db,
            log: std::sync::Mutex::new(log),
            dir: dir.to_path_buf(),
            applied_tx: watch::Sender::new(0),
            committed_index: AtomicU64::new(0),
            snapshot_files: std::sync::Mutex::new(()),
            disk_low: Arc::default(),
        };
        let applied = store.last_applied()?.map(|l| l.index).unwrap_or(0);
        store.applied_tx.send_replace(applied);
        Ok(Arc::new(store))
    }

    pub(crate) fn db(&self) -> &Database {
        &self.db
    }

    /// A write transaction that commits durably and saves redb's allocator state (redb's
    /// "quick repair"): after a crash redb opens at once instead of verifying and walking the
    /// whole file (seconds per GiB). It costs a second fsync per durable commit, and durable
    /// commits are rare: votes, purges, snapshots, and the state machine's periodic one.
    ///
    /// Errors: redb could not start a transaction.
    pub(crate) fn begin_durable_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        begin_durable_write(&self.db)
    }

    /// The Raft log. Held only for in-memory work and page-cache I/O, never across an fsync of
    /// an append ([`segments::PendingSync`]).
    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, segments::SegmentLog> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log index up to which the state machine has applied (0 before any).
    pub fn applied_index(&self) -> u64 {
        *self.applied_tx.borrow()
    }

    /// A receiver that changes whenever the applied index advances.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    pub(crate) fn set_applied(&self, index: u64) {
        self.applied_tx.send_if_modified(|cur| {
            let advanced = index != *cur;
            *cur = index;
            advanced
        });
    }

    /// The flag the disk guard ([`crate::disk`]) sets while the data directory is low on space:
    /// the state machine then defers its periodic durable commit, which would write out every
    /// batch applied since the last one at once (up to
    /// [`crate::limits::SM_DURABLE_EVERY_BYTES`]) and stop the Raft core on `ENOSPC`. The log
    /// holds those entries durably meanwhile; the commit happens once space is back.
    pub fn disk_low_flag(&self) -> Arc<AtomicBool> {
        self.disk_low.clone()
    }

    pub(crate) fn disk_low(&self) -> bool {
        self.disk_low.load(Ordering::Relaxed)
    }

    /// The highest log index this node knows to be committed (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.committed_index.load(Ordering::Acquire)
    }

    pub(crate) fn set_committed(&self, index: u64) {
        self.committed_index.fetch_max(index, Ordering::AcqRel);
    }

    fn last_applied(&self) -> Result<Option<crate::raft::LogId>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(SM_META)?;
        match t.get("last_applied")? {
            Some(v) => decode(v.value()),
            None => Ok(None),
        }
    }

    /// True when this store has never held Raft state: no vote, no log entry, nothing purged.
    ///
    /// Errors: redb failures.
    pub fn is_pristine(&self) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(RAFT_META)?;
        Ok(meta.get("vote")?.is_none() && meta.get("last_purged")?.is_none() && self.log().is_empty())
    }

    /// Durably records `vote` before Raft starts (see `raft::formation::guard_wiped_node`).
    ///
    /// Errors: redb failures.
    pub fn seed_vote(&self, vote: &openraft::Vote<crate::raft::NodeId>) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        txn.open_table(RAFT_META)?.insert("vote", encode(vote)?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// Durably records `vote` for a node that lost its disk, and that it must not vote until a
    /// leader has caught it up ([`Store::catching_up`]), in one transaction (see
    /// `raft::formation::guard_wiped_node`).
    ///
    /// Errors: redb failures.
    pub fn seed_wiped_vote(&self, vote: &openraft::Vote<crate::raft::NodeId>) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        {
            let mut meta = txn.open_table(RAFT_META)?;
            meta.insert("vote", encode(vote)?.as_slice())?;
            meta.insert(CATCHING_UP, [1u8].as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Whether this node lost its disk and has not yet been caught up by a leader: it must not
    /// grant votes meanwhile (it may have acknowledged entries its empty log no longer holds).
    /// Survives restarts until [`Store::caught_up`].
    ///
    /// Errors: redb failures.
    pub fn catching_up(&self) -> Result<bool, StoreError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(RAFT_META)?.get(CATCHING_UP)?.is_some())
    }

    /// Durably ends [`Store::catching_up`].
    ///
    /// Errors: redb failures.
    pub fn caught_up(&self) -> Result<(), StoreError> {
        let txn = self.begin_durable_write()?;
        txn.open_table(RAFT_META)?.remove(CATCHING_UP)?;
        txn.commit()?;
        Ok(())
    }

    /// One stream's metadata, or `None` if it does not exist.
    pub fn stream(&self, name: &str) -> Result<Option<StreamMeta>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(STREAMS)?;
        t.get(name)?.map(|v| decode(v.value())).transpose()
    }

    /// The token named `name`, or `None`. A read of one key: cheap enough to run on the async
    /// executor for every authenticated request.
    ///
    /// Errors: redb failures or a stored value that does not decode.
    pub fn token(&self, name: &str) -> Result<Option<crate::auth::TokenRecord>, StoreError> {
        if name == TOKENS_BOOTSTRAPPED {
            return Ok(None);
        }
        let txn = self.db.begin_read()?;
        let t = txn.open_table(TOKENS)?;
        t.get(name)?.map(|v| decode(v.value())).transpose()
    }

    /// Every token, in name order, and whether the bootstrap token was made.
    ///
    /// Errors: redb failures or a stored value that does not decode.
    pub fn tokens(&self) -> Result<(Vec<(String, crate::auth::TokenRecord)>, bool), StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(TOKENS)?;
        let mut out = Vec::new();
        let mut bootstrapped = false;
        for row in t.iter()? {
            let (k, v) = row?;
            if k.value() == TOKENS_BOOTSTRAPPED {
                bootstrapped = true;
            } else {
                out.push((k.value().to_string(), decode(v.value())?));
            }
        }
        Ok((out, bootstrapped))
    }

    /// Every stream, in name order.
    pub fn streams(&self) -> Result<Vec<StreamInfo>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(STREAMS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            out.push(StreamInfo { name: k.value().to_string(), meta: decode(v.value())? });
        }
        Ok(out)
    }

    /// Batches of `name` with seq > `after`: at most `limit` of them and, past the first, at most
    /// `bytes_max` payload bytes. `None` if the stream does not exist.
    pub fn read_batches(
        &self,
        name: &str,
        after: u64,
        limit: usize,
        bytes_max: usize,
    ) -> Result<Option<BatchesView>, StoreError> {
        let txn = self.db.begin_read()?;
        let streams = txn.open_table(STREAMS)?;
        let Some(meta) = streams.get(name)?.map(|v| decode::<StreamMeta>(v.value())).transpose()? else {
            return Ok(None);
        };
        let mut batches = Vec::new();
        if let Some(from) = after.checked_add(1) {
            let table = txn.open_table(BATCHES)?;
            let mut bytes = 0usize;
            for row in table.range((name, from)..=(name, u64::MAX))? {
                let (k, v) = row?;
                let (ts, index, data) = BatchValue::decode(v.value())?;
                if !batches.is_empty() && bytes + data.len() > bytes_max {
                    break;
                }
                bytes += data.len();
                batches.push(StoredBatch { seq: k.value().1, ts, index, data: data.to_vec() });
                if batches.len() >= limit {
                    break;
                }
            }
        }
        Ok(Some(BatchesView { meta, batches }))
    }
}

pub use io::blocking;

fn begin_durable_write(db: &Database) -> Result<redb::WriteTransaction, StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_quick_repair(true);
    Ok(txn)
}

/// Converts a storage failure into openraft's error for a write (`true`) or read (`false`).
pub(crate) fn raft_err(e: StoreError, write: bool) -> openraft::StorageError<crate::raft::NodeId> {
    let any = openraft::AnyError::new(&e);
    let io = if write { openraft::StorageIOError::write(any) } else { openraft::StorageIOError::read(any) };
    io.into()
}

/// A Raft log entry in Runnev's configuration, as stored in [`segments`].
pub(crate) type Entry = openraft::Entry<TypeConfig>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_value_round_trips_every_byte() {
        let payload: Vec<u8> = (0..=255u8).collect();
        let v = BatchValue::encode(1_764_430_000_123, 42, &payload);
        let (ts, index, data) = BatchValue::decode(&v).unwrap();
        assert_eq!((ts, index, data), (1_764_430_000_123, 42, &payload[..]));
        assert!(BatchValue::decode(&v[..15]).is_err());
        let empty = BatchValue::encode(0, 0, &[]);
        assert_eq!(BatchValue::decode(&empty).unwrap().2, &[] as &[u8]);
    }
}

/// openraft's own storage test suite (`openraft::testing::Suite`), run against the redb stores:
/// log consistency, vote persistence, truncate and purge, membership, snapshot round trips.
#[cfg(test)]
mod openraft_suite {
    use openraft::testing::{StoreBuilder, Suite};

    use super::log_store::LogStore;
    use super::state_machine::StateMachine;
    use super::Store;
    use crate::raft::{StorageError, TypeConfig};

    struct RedbBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().expect("temp dir");
            let store = Store::open(dir.path()).expect("open store");
            Ok((dir, LogStore::new(store.clone()), StateMachine::new(store)))
        }
    }

    #[test]
    fn redb_store_passes_openraft_suite() {
        if let Err(e) = Suite::test_all(RedbBuilder) {
            panic!("openraft storage suite failed: {e}");
        }
    }
}
