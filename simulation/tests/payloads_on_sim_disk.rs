//! Payload segments (`runnev::storage::payloads`) on the simulated disk, with their index in a
//! redb database on the same disk, driven the way the state machine drives them: records
//! appended and their rows inserted in commits without fsync, and every few steps
//! `PayloadStore::sync` then a durable commit then `PayloadStore::durable`; retention removes
//! the oldest rows and retires the segments they leave unreferenced.
//!
//! A crash (a kill, or a power loss keeping none, some or all of the unsynced pages) at any disk
//! operation of that workload must leave a disk where the database opens at its last durable
//! commit, `PayloadStore::open` accepts the extents that commit describes, every row it holds
//! reads back as the payload written for it, and replaying the rest of the workload (as the Raft
//! log's replay does) puts each record where the first run put it.

use std::collections::BTreeMap;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use runnev::storage::payloads::{parse_record, Extent, Location, PayloadStore, SegmentKey, HEADER_BYTES};
use simulation::disk::{CrashKind, SimDisk};
use simulation::rng::SimRng;

/// The index: (stream id, seq) → the record's location.
const ROWS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("rows");

/// Small segments, so the workload starts new ones and retention retires whole ones.
const SEGMENT_BYTES: u64 = 512;
const STREAMS: u64 = 3;
const STEPS: usize = 36;
/// A durable commit every this many steps.
const DURABLE_EVERY: usize = 4;
/// Retention: a stream keeps at most this many batches.
const KEEP: usize = 5;

/// One step of the workload: batches appended to one stream (seq, payload), in one commit.
#[derive(Debug, Clone)]
struct Step {
    stream: u64,
    batches: Vec<(u64, Vec<u8>)>,
}

/// The workload of `seed`: payloads of 0 to 200 bytes, seqs increasing per stream with gaps.
fn workload(seed: u64) -> Vec<Step> {
    let mut rng = SimRng::new(seed);
    let mut next_seq = [1u64; STREAMS as usize];
    (0..STEPS)
        .map(|_| {
            let stream = rng.below(STREAMS);
            let batches = (0..rng.between(1, 3))
                .map(|_| {
                    let seq = next_seq[stream as usize];
                    next_seq[stream as usize] += rng.between(1, 3);
                    let len = rng.below(201) as usize;
                    let fill = (seq as u8).wrapping_mul(31).wrapping_add(stream as u8);
                    (seq, vec![fill; len])
                })
                .collect();
            Step { stream, batches }
        })
        .collect()
}

fn open_db(disk: &SimDisk) -> Database {
    let db = Database::builder().create_with_backend(disk.handle()).expect("the database opens");
    let txn = db.begin_write().unwrap();
    txn.open_table(ROWS).unwrap();
    txn.commit().unwrap();
    db
}

/// Every row of the index, in (stream, seq) order.
fn rows(db: &Database) -> BTreeMap<(u64, u64), Location> {
    let txn = db.begin_read().unwrap();
    let t = txn.open_table(ROWS).unwrap();
    t.iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value(), Location::decode(v.value()).expect("a row decodes"))
        })
        .collect()
}

/// What the rows say of each stream: its oldest retained batch's segment, its newest batch.
fn extents(rows: &BTreeMap<(u64, u64), Location>) -> Vec<Extent> {
    let mut by_stream: BTreeMap<u64, Extent> = BTreeMap::new();
    for (&(stream, _), &loc) in rows {
        by_stream.entry(stream).and_modify(|e| e.last = loc).or_insert(Extent {
            stream,
            first_segment: loc.segment,
            last: loc,
        });
    }
    by_stream.into_values().collect()
}

/// Runs steps `from..` of `steps` on `db` and `payloads` as the state machine would, and
/// returns where each record was put. Retention runs in the step's commit; the durable commit
/// every [`DURABLE_EVERY`] steps syncs the payloads first and lets retired segments go after.
fn run(db: &Database, payloads: &PayloadStore, steps: &[Step], from: usize) -> BTreeMap<(u64, u64), Location> {
    let mut placed = BTreeMap::new();
    for (i, step) in steps.iter().enumerate().skip(from) {
        let durable = (i + 1) % DURABLE_EVERY == 0;
        let mut txn = db.begin_write().unwrap();
        if !durable {
            txn.set_durability(redb::Durability::None).unwrap();
        }
        {
            let mut t = txn.open_table(ROWS).unwrap();
            for (seq, payload) in &step.batches {
                let loc = payloads.append(step.stream, *seq, i as u64, i as u64 + 1, payload).unwrap();
                t.insert((step.stream, *seq), loc.encode().as_slice()).unwrap();
                placed.insert((step.stream, *seq), loc);
            }
            let held: Vec<(u64, Location)> = t
                .range((step.stream, 0)..=(step.stream, u64::MAX))
                .unwrap()
                .map(|r| {
                    let (k, v) = r.unwrap();
                    (k.value().1, Location::decode(v.value()).unwrap())
                })
                .collect();
            if held.len() > KEEP {
                let evicted = held.len() - KEEP;
                for (seq, _) in &held[..evicted] {
                    t.remove((step.stream, *seq)).unwrap();
                }
                payloads.retire(step.stream, Some(held[evicted].1.segment));
            }
        }
        // The batches' payloads must be synced before a durable commit refers to them: the
        // appends of this very step too.
        if durable {
            payloads.sync().unwrap();
            let sealed = payloads.seal();
            txn.commit().unwrap();
            payloads.durable(sealed);
        } else {
            txn.commit().unwrap();
        }
    }
    placed
}

/// Every row reads back as the payload the workload wrote for it, and the files on disk are
/// exactly the segments the rows span.
fn check(case: &str, payloads: &PayloadStore, rows: &BTreeMap<(u64, u64), Location>, steps: &[Step]) {
    let written: BTreeMap<(u64, u64), &Vec<u8>> =
        steps.iter().flat_map(|s| s.batches.iter().map(move |(seq, p)| ((s.stream, *seq), p))).collect();
    let gate = payloads.read_gate();
    for (&(stream, seq), loc) in rows {
        let buf = payloads
            .read(&gate, stream, loc.segment, loc.offset, (HEADER_BYTES + u64::from(loc.len)) as usize)
            .unwrap_or_else(|e| panic!("{case}: {stream}/{seq} at {loc:?}: {e}"));
        let record = parse_record(stream, seq, loc.len, &buf).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(record.payload, written[&(stream, seq)].as_slice(), "{case}: {stream}/{seq}");
    }
}

fn crashes() -> Vec<(CrashKind, u64)> {
    vec![
        (CrashKind::Kill, 0),
        (CrashKind::PowerLoss { keep_per_mille: 0 }, 0),
        (CrashKind::PowerLoss { keep_per_mille: 500 }, 1),
        (CrashKind::PowerLoss { keep_per_mille: 1000 }, 0),
    ]
}

/// Cuts the workload at its `op`-th disk operation; returns `false` when it took fewer.
/// What a run without a crash ends with: where each record was put, and the rows held at the end.
struct Clean {
    placed: BTreeMap<(u64, u64), Location>,
    rows: BTreeMap<(u64, u64), Location>,
}

fn clean_run(steps: &[Step]) -> Clean {
    let disk = SimDisk::new();
    let db = open_db(&disk);
    let payloads = PayloadStore::open(disk.payloads(), SEGMENT_BYTES, &[]).unwrap();
    let placed = run(&db, &payloads, steps, 0);
    Clean { placed, rows: rows(&db) }
}

fn cut_at(op: u64, kind: CrashKind, draw: u64, steps: &[Step], clean: &Clean) -> bool {
    let disk = SimDisk::new();
    drop(open_db(&disk));
    disk.arm_cut(op, kind, SimRng::new(7 + draw));
    {
        let db = open_db(&disk);
        let payloads = PayloadStore::open(disk.payloads(), SEGMENT_BYTES, &[]).unwrap();
        run(&db, &payloads, steps, 0);
    }
    if !disk.take_fired_cut() {
        assert!(disk.disarm_cut());
        return false;
    }
    let case = format!("{kind:?} (draw {draw}) at operation {op}");
    let db = open_db(&disk);
    let held = rows(&db);
    let payloads = PayloadStore::open(disk.payloads(), SEGMENT_BYTES, &extents(&held))
        .unwrap_or_else(|e| panic!("{case}: the payloads do not open: {e}"));
    check(&case, &payloads, &held, steps);
    for e in extents(&held) {
        let newest = disk.payloads().open(SegmentKey { stream: e.stream, first: e.last.segment }).unwrap();
        assert_eq!(newest.capacity().unwrap(), e.last.end(), "{case}: {e:?}: the tail past the newest record is cut");
    }
    let mut spanned: Vec<String> = Vec::new();
    for e in extents(&held) {
        for key in payloads.live_segments().into_iter().filter(|k| k.stream == e.stream) {
            assert!((e.first_segment..=e.last.segment).contains(&key.first), "{case}: {key:?} outside {e:?}");
            spanned.push(simulation::disk::payload_name(key));
        }
    }
    let mut on_disk: Vec<String> = disk.file_names().into_iter().filter(|n| n.starts_with("payloads/")).collect();
    on_disk.sort();
    spanned.sort();
    assert_eq!(on_disk, spanned, "{case}: the files on disk are the segments the rows span");
    // Replay: the steps after the newest one the durable state holds, as the log replays them.
    let done = steps
        .iter()
        .rposition(|s| s.batches.iter().any(|(seq, _)| held.keys().any(|&(st, q)| st == s.stream && q >= *seq)))
        .map_or(0, |i| i + 1);
    let replayed = run(&db, &payloads, steps, done);
    for (key, loc) in &replayed {
        assert_eq!(clean.placed.get(key), Some(loc), "{case}: {key:?} replayed elsewhere than the first run put it");
    }
    let end = rows(&db);
    assert_eq!(end, clean.rows, "{case}: the replay ends with the rows of a run without a crash");
    check(&case, &payloads, &end, steps);
    true
}

/// A run with no crash: every record reads back, retention retired segments, and the disk holds
/// only the segments the rows span.
#[test]
fn the_workload_reads_back_and_retention_frees_whole_segments() {
    let steps = workload(11);
    let disk = SimDisk::new();
    let db = open_db(&disk);
    let payloads = PayloadStore::open(disk.payloads(), SEGMENT_BYTES, &[]).unwrap();
    let placed = run(&db, &payloads, &steps, 0);
    let held = rows(&db);
    assert!(held.len() < placed.len(), "retention evicted batches");
    check("no crash", &payloads, &held, &steps);
    let created: std::collections::BTreeSet<(u64, u64)> = placed.iter().map(|(k, l)| (k.0, l.segment)).collect();
    assert!(payloads.live_segments().len() < created.len(), "whole segments were removed");
    let on_disk = disk.file_names().into_iter().filter(|n| n.starts_with("payloads/")).count();
    assert_eq!(on_disk, payloads.live_segments().len(), "retired segments left the disk");
    drop((payloads, db));
    disk.crash(CrashKind::PowerLoss { keep_per_mille: 0 }, &mut SimRng::new(1));
    // The last step's commit was durable (36 steps, a durable commit every 4): nothing is lost.
    let db = open_db(&disk);
    let again = rows(&db);
    assert_eq!(again, held, "the last step's commit was durable");
    let payloads = PayloadStore::open(disk.payloads(), SEGMENT_BYTES, &extents(&again)).unwrap();
    check("after a power loss", &payloads, &again, &steps);
}

/// Every disk operation of the workload, cut by each kind of crash: the store recovers to the
/// last durable commit with every payload it refers to, and the replay lands where the first
/// run did. Fails if `sync` is skipped before a durable commit (rows pointing at lost bytes), if
/// retired segments are removed before the commit that retires them is durable (rows pointing
/// at removed files), or if `open` does not cut the tails it does not refer to (the bytes of
/// lost records would stay on disk past the newest one).
#[test]
fn a_crash_at_any_operation_leaves_payloads_that_match_the_durable_index() {
    let steps = workload(11);
    let clean = clean_run(&steps);
    let mut ops = 0;
    for op in 1.. {
        assert!(op <= 5_000, "the workload takes a bounded number of operations");
        let mut struck = false;
        for (kind, draw) in crashes() {
            struck |= cut_at(op, kind, draw, &steps, &clean);
        }
        if !struck {
            break;
        }
        ops = op;
    }
    println!("the workload takes {ops} disk operations; cut at each, {} ways", crashes().len());
    assert!(ops >= STEPS as u64, "the workload took {ops} operations: it was not cut at each step");
}
