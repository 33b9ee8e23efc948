//! The production Raft log (`runnev::storage::segments::SegmentLog`) on the simulated disk: what
//! survives a kill, a power loss, a cut in the middle of an append and a torn power loss.
//!
//! The simulation does not depend on openraft, so entries are made the way a restarted node
//! finds them: records written byte for byte in the log's documented layout (16-byte header,
//! then a postcard-encoded blank `openraft::Entry`), read back through `SegmentLog`.

use runnev::raft::LogId;
use runnev::storage::segments::SegmentLog;
use simulation::disk::{CrashKind, SimDisk, PAGE_BYTES};
use simulation::rng::SimRng;

const PAGE: u64 = PAGE_BYTES as u64;

/// CRC-32 (IEEE), as `crc32fast` computes it.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut c = !0u32;
    for part in parts {
        for &b in *part {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            }
        }
    }
    !c
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// The record `SegmentLog` writes for a blank entry of `term` (leader node 1) at `index`:
/// body length, CRC-32 of index and body, index, then the body (`LogId { leader_id: { term,
/// node_id }, index }`, then `EntryPayload::Blank`, variant 0).
fn record(term: u64, index: u64) -> Vec<u8> {
    let mut body = Vec::new();
    varint(term, &mut body);
    varint(1, &mut body);
    varint(index, &mut body);
    body.push(0);
    let mut rec = Vec::new();
    rec.extend_from_slice(&(body.len() as u32).to_le_bytes());
    rec.extend_from_slice(&crc32(&[&index.to_le_bytes(), &body]).to_le_bytes());
    rec.extend_from_slice(&index.to_le_bytes());
    rec.extend_from_slice(&body);
    rec
}

fn records(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<u8> {
    indexes.flat_map(|i| record(term, i)).collect()
}

/// Blank entries of `term` at `first..=last`, as openraft values: written on a scratch disk
/// and read back through the log.
macro_rules! blank_entries {
    ($term:expr, $first:expr, $last:expr) => {{
        let scratch = SimDisk::new();
        let seg = scratch.segments().create($first, 1 << 20).unwrap();
        seg.write_at(0, &records($term, $first..=$last)).unwrap();
        let log = SegmentLog::open(scratch.segments(), purged($first - 1)).unwrap();
        let entries = log.read(0, u64::MAX).unwrap();
        assert_eq!(entries.len() as u64, $last - $first + 1, "the fabricated records decode");
        entries
    }};
}

/// A purge point at `index`, of term 1 (leader node 1): what `raft_meta` holds after a
/// snapshot of the fabricated history. Built field by field: the simulation names no openraft
/// type.
fn purged(index: u64) -> Option<LogId> {
    Some(log_id(1, index))
}

fn log_id(term: u64, index: u64) -> LogId {
    let mut id = LogId::default();
    id.leader_id.term = term;
    id.leader_id.node_id = 1;
    id.index = index;
    id
}

fn last(log: &SegmentLog) -> Option<(u64, u64)> {
    log.last_log_id().map(|l| (l.leader_id.term, l.index))
}

fn indexes(log: &SegmentLog) -> Vec<u64> {
    log.read(0, u64::MAX).unwrap().iter().map(|e| e.log_id.index).collect()
}

/// openraft writes its first entry (the initial membership, `Raft::initialize`) at index 0, and
/// a log never purged starts there. Regression: `SegmentLog::open` once took "nothing purged"
/// for "purged through 0", and every restart of a node that had not purged yet failed with
/// `'LogIndex(0)' violates: 'try to get log at index 0 but got None'` (CI seeds 30 and 36).
#[test]
fn a_log_never_purged_keeps_index_0() {
    let disk = SimDisk::new();
    let seg = disk.segments().create(0, 1 << 20).unwrap();
    seg.write_at(0, &records(1, 0..=3)).unwrap();
    seg.sync_data().unwrap();
    let log = SegmentLog::open(disk.segments(), None).unwrap();
    assert_eq!(indexes(&log), vec![0, 1, 2, 3]);
    assert_eq!(log.first_index(), 0);
}

// The logs below start after a purge point (9, 199), away from index 0.

#[test]
fn an_append_not_synced_vanishes_on_power_loss() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(1);
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 14)).unwrap().sync().unwrap();
    let pending = log.append(blank_entries!(1, 15, 16)).unwrap();
    drop(pending);
    drop(log);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(indexes(&log), (10..=14).collect::<Vec<_>>(), "the unsynced append is gone");
}

#[test]
fn an_append_not_synced_survives_a_kill() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(1);
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 14)).unwrap().sync().unwrap();
    drop(log.append(blank_entries!(1, 15, 16)).unwrap());
    drop(log);
    disk.crash(CrashKind::Kill, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 16)), "a kill keeps the page cache");
}

/// After a kill the page cache still holds an append that was never fsynced; the restarted log
/// serves it, and openraft takes everything the log reports as persisted (it may acknowledge
/// those entries to a leader, which counts them toward a commit). A power loss before the next
/// fsync of that segment then loses entries the node reported durable (Raft paper §5.3,
/// "persistent state"). Recovery must make what it serves durable (fsync what it found).
#[test]
fn what_a_restarted_log_serves_is_durable() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(1);
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 14)).unwrap().sync().unwrap();
    drop(log.append(blank_entries!(1, 15, 16)).unwrap());
    drop(log);
    disk.crash(CrashKind::Kill, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 16)));
    drop(log);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 16)), "entries the restarted log served were lost");
}

#[test]
fn a_cut_strikes_inside_a_log_append() {
    // Struck at the write: nothing of the append reaches the disk, whatever the victim saw.
    let disk = SimDisk::new();
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 12)).unwrap().sync().unwrap();
    disk.arm_cut(1, CrashKind::PowerLoss { keep_per_mille: 1000 }, SimRng::new(2));
    log.append(blank_entries!(1, 13, 14)).unwrap().sync().unwrap();
    assert_eq!(last(&log), Some((1, 14)), "the victim's ghost");
    assert!(disk.take_fired_cut());
    assert!(log.append(blank_entries!(1, 15, 15)).is_err(), "the victim's handles are dead");
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 12)));

    // Struck at the fsync with every dirty page torn in: the write reached the platter anyway.
    let disk = SimDisk::new();
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 12)).unwrap().sync().unwrap();
    disk.arm_cut(2, CrashKind::PowerLoss { keep_per_mille: 1000 }, SimRng::new(3));
    log.append(blank_entries!(1, 13, 14)).unwrap().sync().unwrap();
    assert!(disk.take_fired_cut());
    let log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 14)));
}

/// Records of `rec` bytes from offset 0: how many fit before the first page boundary with some
/// room left, so that the next record straddles it.
fn records_before_boundary(rec: u64) -> u64 {
    let m = PAGE / rec;
    if m * rec == PAGE {
        m - 1
    } else {
        m
    }
}

/// A power loss tears an unsynced append: the page holding the append's second part reaches
/// the platter, the page holding its start does not. Recovery then stops at a zero header
/// ("clean" end) and leaves the bytes after it; the next append of a record the same size lines
/// up with the stale records behind it, which come back at the next restart, older term after
/// newer. A log must never let bytes it did not keep come back (`segments.rs`, "Must never").
#[test]
fn a_torn_power_loss_never_brings_stale_records_back() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(4);
    let rec = record(1, 200).len() as u64;
    let m = records_before_boundary(rec);
    let head = records(1, 200..=199 + m);
    let tail = records(1, 200 + m..=204 + m);
    let seg = disk.segments().create(200, 1 << 20).unwrap();
    seg.write_at(0, &head).unwrap();
    seg.sync_data().unwrap();
    // The unsynced append of 200+m..=204+m, torn: only its part in the second page survived.
    let in_first_page = (PAGE - head.len() as u64) as usize;
    seg.write_at(PAGE, &tail[in_first_page..]).unwrap();
    seg.sync_data().unwrap();
    drop(seg);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);

    let mut log = SegmentLog::open(disk.segments(), purged(199)).unwrap();
    assert_eq!(last(&log), Some((1, 199 + m)), "recovery ends at the lost record");
    // A new leader's entry at the same index, the same size.
    log.append(blank_entries!(2, 200 + m, 200 + m)).unwrap().sync().unwrap();
    assert_eq!(last(&log), Some((2, 200 + m)));
    drop(log);
    disk.crash(CrashKind::Kill, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(199)).unwrap();
    assert_eq!(last(&log), Some((2, 200 + m)), "entries of term 1 came back after the term-2 entry");
}

/// An append that crosses into a new segment writes the old segment's tail and the new
/// segment's head before fsyncing either; a torn power loss can keep the new segment's page and
/// lose the old one's. Recovery then finds an older segment that ends early and refuses to open
/// ("segment … starts at index … after index …"): the node can never restart.
#[test]
fn a_torn_power_loss_across_a_segment_rollover_leaves_a_log_that_opens() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(5);
    let rec = record(1, 200).len() as u64;
    let m = records_before_boundary(rec);
    // A segment with room for exactly one more record (its size comes from the file, as after a
    // restart), so that the next append of two entries rolls over.
    let seg = disk.segments().create(200, (m + 1) * rec).unwrap();
    seg.write_at(0, &records(1, 200..=199 + m)).unwrap();
    seg.sync_data().unwrap();
    drop(seg);
    let mut log = SegmentLog::open(disk.segments(), purged(199)).unwrap();
    let pending = log.append(blank_entries!(1, 200 + m, 201 + m)).unwrap();
    // Torn: the new segment's page reached the platter, the old segment's did not.
    disk.segments().open(201 + m).unwrap().sync_data().unwrap();
    drop(pending);
    drop(log);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
    let log = match SegmentLog::open(disk.segments(), purged(199)) {
        Ok(log) => log,
        Err(e) => panic!("the node cannot restart: {e}"),
    };
    let got = indexes(&log);
    assert_eq!(got.first(), Some(&200));
    assert!(got.windows(2).all(|w| w[1] == w[0] + 1), "contiguous: {got:?}");
    assert!(*got.last().unwrap() >= 199 + m);
}

/// Simulation seed 324: a crash cut a truncation between its shrink and its grow (the segment
/// stays short, unsynced); the restarted log then rolled over to a new segment at the next
/// append, and a power loss brought the old segment back whole, truncated entries and all, in
/// front of the new one: the log refused to open. Recovery now syncs the newest segment as found.
#[test]
fn a_truncation_cut_short_then_a_power_loss_leaves_a_log_that_opens() {
    let disk = SimDisk::new();
    let mut rng = SimRng::new(7);
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 17)).unwrap().sync().unwrap();
    // Operation 1 (the shrink) happens; operation 2 (the grow back) is where the kill strikes.
    disk.arm_cut(2, CrashKind::Kill, SimRng::new(8));
    let _ = log.truncate(14);
    assert!(disk.take_fired_cut());
    drop(log);
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    assert_eq!(last(&log), Some((1, 13)));
    log.append(blank_entries!(2, 14, 15)).unwrap().sync().unwrap();
    drop(log);
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut rng);
    let log = SegmentLog::open(disk.segments(), purged(9)).expect("the log opens after the power loss");
    assert_eq!(last(&log), Some((2, 15)));
    assert_eq!(indexes(&log), (10..=15).collect::<Vec<_>>());
}

/// Simulation seed 200860, on the disk: a follower's truncation of its uncommitted term-1
/// entries 14..=17 is cut at its first step by a power loss, so they come back; meanwhile the
/// new leader's entry 14 (term 2) committed, and the restart's purge point is there (the
/// simulation keeps snapshot files off the simulated disk, so a snapshot the cut node built
/// survives the cut and is restored into the state machine at start-up). The log must not
/// report the stale 15..=17 after the purge point T2-14 (openraft takes a last log id below
/// the purge point for a log that ends there, and its next append, of 15, was refused: the
/// Raft core stopped for good); it discards them, durably, and takes the leader's 15.
#[test]
fn a_lost_truncation_behind_a_newer_purge_point_is_discarded_at_restart() {
    let disk = SimDisk::new();
    let mut log = SegmentLog::open(disk.segments(), purged(9)).unwrap();
    log.append(blank_entries!(1, 10, 17)).unwrap().sync().unwrap();
    disk.arm_cut(1, CrashKind::PowerLoss { keep_per_mille: 0 }, SimRng::new(9));
    let _ = log.truncate(14);
    assert!(disk.take_fired_cut());
    drop(log);
    let mut log = SegmentLog::open(disk.segments(), Some(log_id(2, 14))).unwrap();
    assert_eq!((last(&log), log.first_index()), (None, 15), "the stale tail is gone");
    log.append(blank_entries!(2, 15, 16)).unwrap().sync().unwrap();
    drop(log);
    let log = SegmentLog::open(disk.segments(), Some(log_id(2, 14))).unwrap();
    assert_eq!(indexes(&log), vec![15, 16]);
    assert_eq!(last(&log), Some((2, 16)));
}
