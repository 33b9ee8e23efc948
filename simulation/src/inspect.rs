//! Looks inside a node's disk between incarnations: what will the next incarnation find?
//!
//! Owns: a structural check of the Raft log as stored (runnev's segment files under `log/`, read
//! back with the production recovery, `runnev::storage::segments::SegmentLog::open`, from the
//! purge point the redb table `raft_meta` holds). Raft's Log Matching property (paper §5.3) and
//! openraft's apply path assume the log is contiguous: every index between the first and the
//! last entry present. A hole means a committed entry can be skipped when the state machine
//! applies (openraft 0.9 checks only the first and last index of a range it reads); a log that
//! does not start right after the purge point (or at index 0, openraft's initial membership
//! entry, when nothing was purged) stops openraft at start-up. The segment log cannot represent
//! a hole inside by construction; the check stays because it is the invariant.
//! Must never: touch the node's own disk (it works on a [`SimDisk::fork`]; recovery may write
//! to the copy).

use redb::{ReadableDatabase, TableDefinition};
use runnev::raft::LogId;
use runnev::storage::segments::SegmentLog;

use crate::disk::SimDisk;

/// runnev's Raft metadata table (`src/storage/mod.rs`, `RAFT_META`): `"last_purged"` → a
/// postcard-encoded `openraft::LogId<u64>`.
const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

/// A stored log's shape: its first index, its last index, and the inclusive ranges missing in
/// between (or claimed by the log but not served by it, or missing between the purge point, or
/// index 0 when nothing was purged, and the first entry).
pub type LogShape = (u64, u64, Vec<(u64, u64)>);

/// Reads one postcard varint (LEB128) `u64`.
fn varint(bytes: &mut std::slice::Iter<'_, u8>) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *bytes.next().ok_or("last_purged: truncated varint")?;
        v |= u64::from(b & 0x7f).checked_shl(shift).ok_or("last_purged: varint overflow")?;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("last_purged: varint too long".into())
}

/// A postcard-encoded `openraft::LogId<u64>`: `leader_id` (openraft 0.9's default `LeaderId {
/// term: u64, node_id: u64 }`) then `index`, three varints. Decoded by hand so the simulation
/// needs no serialization crate of its own; anything but exactly three varints is refused, so
/// a change of layout shows up as an inspection error.
fn log_id_of(bytes: &[u8]) -> Result<LogId, String> {
    let mut it = bytes.iter();
    let (term, node, index) = (varint(&mut it)?, varint(&mut it)?, varint(&mut it)?);
    if it.next().is_some() {
        return Err(format!("last_purged: {} bytes is not a LogId", bytes.len()));
    }
    // Built field by field: the simulation names no openraft type.
    let mut id = LogId::default();
    id.leader_id.term = term;
    id.leader_id.node_id = node;
    id.index = index;
    Ok(id)
}

/// Opens the forked disk's redb and runs `f` on its `raft_meta` table (`None`: there is none).
fn with_raft_meta<R>(
    copy: &SimDisk,
    f: impl FnOnce(Option<&redb::ReadOnlyTable<&str, &[u8]>>) -> Result<R, String>,
) -> Result<R, String> {
    let db = redb::Database::builder().create_with_backend(copy.handle()).map_err(|e| e.to_string())?;
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    match txn.open_table(RAFT_META) {
        Ok(t) => f(Some(&t)),
        Err(redb::TableError::TableDoesNotExist(_)) => f(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The purge point recorded in the forked disk's redb, if any.
fn last_purged(copy: &SimDisk) -> Result<Option<LogId>, String> {
    with_raft_meta(copy, |table| {
        let Some(table) = table else { return Ok(None) };
        let purged = table.get("last_purged").map_err(|e| e.to_string())?;
        purged.map(|v| log_id_of(v.value())).transpose()
    })
}

/// Whether node's disk says it may still lack entries it once acknowledged: its redb holds the
/// marker `runnev::raft::formation::guard_wiped_node` records for a node that lost its disk
/// (`"catching_up"` in `raft_meta`, removed once a leader caught it up), or no vote at all (an
/// empty data dir, whose vote gate stays closed until it learns the cluster is new or is
/// caught up: `runnev::raft::vote_gate`), or the marker `"unsure"`
/// (`runnev::raft::formation::gate_at_start`: a node that restarted empty while its peers were
/// unreachable, still closed after a leader's first append stored a vote; without this check
/// the driver took it for caught up and wiped a second disk, seed 390). The driver also waits
/// for its log to reach what the others held when it lost its disk ([`last_index`], seed 98).
/// Errors: redb could not open the copy.
pub fn lost_disk_pending(disk: &SimDisk) -> Result<bool, String> {
    with_raft_meta(&disk.fork(), |table| {
        let Some(table) = table else { return Ok(true) };
        let has = |key: &str| table.get(key).map(|v| v.is_some()).map_err(|e| e.to_string());
        Ok(has("catching_up")? || has("unsure")? || !has("vote")?)
    })
}

/// The last log index the disk holds: its log's last entry, or its purge point when the log
/// behind it is empty (0 for an empty disk). Errors: redb or the log's recovery refused the copy.
pub fn last_index(disk: &SimDisk) -> Result<u64, String> {
    let copy = disk.fork();
    let purged = last_purged(&copy)?;
    let log = SegmentLog::open(copy.segments(), purged).map_err(|e| format!("raft log: {e}"))?;
    Ok(log.last_log_id().map(|l| l.index).max(purged.map(|p| p.index)).unwrap_or(0))
}

/// The stored log's shape (`None` when it is empty), or why the disk could not be read (redb or
/// the log's recovery refused it: that is reported by the node itself when it restarts).
pub fn log_holes(disk: &SimDisk) -> Result<Option<LogShape>, String> {
    let copy = disk.fork();
    let purged = last_purged(&copy)?;
    let log = SegmentLog::open(copy.segments(), purged).map_err(|e| format!("raft log: {e}"))?;
    let keys: Vec<u64> =
        log.read(0, u64::MAX).map_err(|e| format!("raft log: {e}"))?.iter().map(|e| e.log_id.index).collect();
    let claimed_last = log.last_log_id().map(|l| l.index);
    let (Some(first), Some(last)) = (keys.first().copied(), keys.last().copied()) else {
        return match claimed_last {
            Some(l) => Ok(Some((log.first_index(), l, vec![(log.first_index(), l)]))),
            None => Ok(None),
        };
    };
    // The log starts right after the purge point, or at openraft's initial entry (index 0,
    // written by `Raft::initialize` and replicated from there) when nothing was ever purged.
    let expected_first = purged.map_or(0, |p| p.index + 1).min(log.first_index());
    let mut holes: Vec<(u64, u64)> = Vec::new();
    if expected_first < first {
        holes.push((expected_first, first - 1));
    }
    holes.extend(keys.windows(2).filter(|w| w[1] != w[0] + 1).map(|w| (w[0] + 1, w[1] - 1)));
    if let Some(l) = claimed_last.filter(|l| *l > last) {
        holes.push((last + 1, l));
    }
    Ok(Some((first.min(expected_first), last.max(claimed_last.unwrap_or(last)), holes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postcard_log_id_decodes() {
        // term 3, node 1, index 300 (varint 0xac 0x02).
        let id = log_id_of(&[3, 1, 0xac, 0x02]).unwrap();
        assert_eq!((id.leader_id.term, id.leader_id.node_id, id.index), (3, 1, 300));
        assert!(log_id_of(&[3, 1]).is_err());
        assert!(log_id_of(&[3, 1, 5, 0]).is_err());
    }

    #[test]
    fn an_empty_disk_has_an_empty_log() {
        assert_eq!(log_holes(&SimDisk::new()), Ok(None));
    }

    /// A wiped disk reads as a lost disk until it holds a vote without the catching-up
    /// marker; the marker alone keeps it lost.
    #[test]
    fn a_lost_disk_is_pending_until_it_votes_without_the_marker() {
        let disk = SimDisk::new();
        assert_eq!(lost_disk_pending(&disk), Ok(true));
        let db = redb::Database::builder().create_with_backend(disk.handle()).unwrap();
        let put = |pairs: &[(&str, Option<&[u8]>)]| {
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(RAFT_META).unwrap();
                for (k, v) in pairs {
                    match v {
                        Some(v) => drop(t.insert(*k, *v).unwrap()),
                        None => drop(t.remove(*k).unwrap()),
                    }
                }
            }
            txn.commit().unwrap();
        };
        put(&[("vote", Some(&[1u8][..])), ("catching_up", Some(&[1u8][..]))]);
        assert_eq!(lost_disk_pending(&disk), Ok(true));
        put(&[("catching_up", None)]);
        assert_eq!(lost_disk_pending(&disk), Ok(false));
        put(&[("unsure", Some(&[1u8][..]))]);
        assert_eq!(lost_disk_pending(&disk), Ok(true), "a vote stored while the node is still unsure");
        put(&[("counted_fresh_by/1", Some(&[1u8][..]))]);
        assert_eq!(lost_disk_pending(&disk), Ok(true), "a probe's record is no proof the cluster is new");
        put(&[("unsure", None)]);
        assert_eq!(lost_disk_pending(&disk), Ok(false));
        disk.wipe();
        assert_eq!(lost_disk_pending(&disk), Ok(true));
    }
}
