//! Looks inside a node's disk between incarnations: what will the next incarnation find?
//!
//! Owns: a structural check of the Raft log as stored (runnev's `raft_log` table: log index →
//! entry). Raft's Log Matching property (paper §5.3) and openraft's apply path assume the log is
//! contiguous: every index between the first and the last entry present. A hole means a
//! committed entry can be skipped when the state machine applies (openraft 0.9 checks only the
//! first and last index of a range it reads). Must never: touch the node's own disk (it works on
//! a [`SimDisk::fork`]).

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::disk::SimDisk;

/// runnev's Raft log table (`src/storage/mod.rs`, `LOG`).
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");

/// A stored log's shape: its first index, its last index, and the inclusive ranges missing in
/// between.
pub type LogShape = (u64, u64, Vec<(u64, u64)>);

/// The stored log's shape (`None` when it is empty), or why the disk could not be read (redb
/// refused to open it: that is reported by the node itself).
pub fn log_holes(disk: &SimDisk) -> Result<Option<LogShape>, String> {
    let copy = disk.fork();
    let db = redb::Database::builder().create_with_backend(copy.handle()).map_err(|e| e.to_string())?;
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = match txn.open_table(LOG) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut keys = Vec::new();
    for row in table.iter().map_err(|e| e.to_string())? {
        let (k, _) = row.map_err(|e| e.to_string())?;
        keys.push(k.value());
    }
    let (Some(first), Some(last)) = (keys.first().copied(), keys.last().copied()) else { return Ok(None) };
    let holes = keys.windows(2).filter(|w| w[1] != w[0] + 1).map(|w| (w[0] + 1, w[1] - 1)).collect();
    Ok(Some((first, last, holes)))
}
