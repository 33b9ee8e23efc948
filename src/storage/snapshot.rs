//! Snapshot files: the whole state machine as one file, streamed record by record so building,
//! sending and installing one takes memory bounded by a record, not by the state (Raft paper §7).
//!
//! Owns: the file format and its atomic replacement. Must never: hold the state in memory, or
//! expose a half-written file as the current snapshot (files are written to a temporary name,
//! fsynced, then renamed).
//!
//! Format (version 1): the 8-byte magic `RUNNEVS1`, then records, each a u32 LE length and that
//! many bytes of a postcard-encoded [`Record`]: one `Header`, the `Clock` (the cluster clock of
//! the state machine; a snapshot without one, from an older build, installs clock 0), then every
//! `Stream`, every `Tombstone`, every `Token` (salted hashes, never secrets), every `Batch` in
//! (stream, seq) order, then `End` with the counts, which detects a truncated file. A `Batch`
//! carries the batch in the checked encoding of data format 2 ([`BatchValue`], keyed by the
//! stream's name), whatever the node keeps on disk: building reads each payload from its
//! segment, installing appends it to the installing node's own segments (stream ids are local
//! to a node). So nodes of data formats 2 and 3 exchange snapshots.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use super::payloads::ReadGate;
use super::state_machine::CLOCK_KEY;
use super::{
    decode, encode, stream_id_or_assign, BatchValue, IndexRow, Store, StoreError, BATCH_INDEX, NEXT_STREAM_ID,
    RAFT_META, SM_META, STREAMS, STREAM_IDS, TOKENS, TOMBSTONES,
};
use crate::limits::SNAPSHOT_RECORD_BYTES_MAX;
use crate::raft::{LogId, NodeId};
use crate::stream::StreamMeta;

/// The magic a snapshot starts with: `RUNNEVS2` since data format 2, whose batch values carry a
/// checksum (a build of format 1 reads `RUNNEVS1` only, so it refuses these instead of
/// misreading their values); `RUNNEVS1` snapshots are still read.
const MAGIC: &[u8; 8] = b"RUNNEVS2";
/// The magic of a snapshot written in data format 1 (batch values without a checksum).
const MAGIC_FORMAT_1: &[u8; 8] = b"RUNNEVS1";

/// openraft's snapshot metadata in Runnev's configuration.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;

#[derive(Serialize, Deserialize)]
enum Record<'a> {
    Header {
        meta: SnapshotMeta,
    },
    Stream {
        name: &'a str,
        meta: StreamMeta,
    },
    Batch {
        stream: &'a str,
        seq: u64,
        #[serde(with = "serde_bytes")]
        value: &'a [u8],
    },
    Tombstone {
        name: &'a str,
        meta: StreamMeta,
    },
    End {
        streams: u64,
        batches: u64,
    },
    /// The state machine's cluster clock (last, so that older snapshots still decode).
    Clock {
        clock_ms: u64,
    },
    /// A row of the tokens table (after `Clock`, for the same reason).
    Token {
        name: &'a str,
        #[serde(with = "serde_bytes")]
        value: &'a [u8],
    },
}

/// Path of the current snapshot.
pub(crate) fn current_path(dir: &Path) -> PathBuf {
    dir.join("snapshot.bin")
}

/// Path a snapshot being received from the leader is written to.
pub(crate) fn receiving_path(dir: &Path) -> PathBuf {
    dir.join("snapshot.recv.tmp")
}

fn building_path(dir: &Path) -> PathBuf {
    dir.join("snapshot.build.tmp")
}

fn write_record(w: &mut impl Write, r: &Record<'_>) -> Result<(), StoreError> {
    let bytes = encode(r)?;
    let len = u32::try_from(bytes.len()).map_err(|_| StoreError::RecordTooLarge(bytes.len()))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&bytes)?;
    Ok(())
}

fn read_record(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<(), StoreError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > SNAPSHOT_RECORD_BYTES_MAX {
        return Err(StoreError::Snapshot(format!("a record of {len} bytes, over {SNAPSHOT_RECORD_BYTES_MAX}")));
    }
    buf.resize(len as usize, 0);
    r.read_exact(buf)?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Writes the state machine, as of one read transaction, to the current snapshot file, and
/// returns its metadata. The id is `{term}-{index}` of the last applied log id.
///
/// Errors: redb or file I/O failures; the previous snapshot stays in place.
pub(crate) fn build(store: &Store) -> Result<(SnapshotMeta, File), StoreError> {
    let gate = store.payloads().read_gate();
    let txn = store.db().begin_read()?;
    // State-machine commits are not fsynced (the log is the durable record). Make everything this
    // read sees durable before a snapshot of it exists: otherwise a crash could leave the snapshot
    // ahead of the durable state machine and openraft refuses to start (simulation seed 4).
    durable_barrier(store)?;
    let tmp = building_path(store.dir());
    let mut w = BufWriter::new(File::create(&tmp)?);
    let (meta, streams, batches) = write_state(store, &txn, &gate, &mut w)?;
    drop((txn, gate));
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    let current = publish(store, &tmp)?;
    tracing::info!(snapshot = %meta.snapshot_id, streams, batches, "built snapshot");
    Ok((meta, current))
}

/// Writes the state machine as `txn` sees it, in the snapshot format (magic, header, clock,
/// streams, tombstones, tokens, batches, end), to `w`; returns its metadata and the stream and batch
/// counts. The id is `{term}-{index}` of the last applied log id. One read transaction is one
/// consistent cut of the applied state: what a snapshot and a backup need. `gate`, taken before
/// `txn` began, keeps the payload segments `txn` points at on disk.
///
/// Errors: redb, encoding, file I/O, a payload that fails its checks, or `w`'s failures.
pub(crate) fn write_state(
    store: &Store,
    txn: &redb::ReadTransaction,
    gate: &ReadGate<'_>,
    w: &mut impl Write,
) -> Result<(SnapshotMeta, u64, u64), StoreError> {
    let sm = txn.open_table(SM_META)?;
    let last_applied: Option<LogId> = sm.get("last_applied")?.map(|v| decode(v.value())).transpose()?.flatten();
    let membership: StoredMembership =
        sm.get("membership")?.map(|v| decode(v.value())).transpose()?.unwrap_or_default();
    let clock_ms: u64 = sm.get(CLOCK_KEY)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
    let snapshot_id = match &last_applied {
        Some(l) => format!("{}-{}", l.leader_id.term, l.index),
        None => "0-0".to_string(),
    };
    let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
    w.write_all(MAGIC)?;
    write_record(w, &Record::Header { meta: meta.clone() })?;
    write_record(w, &Record::Clock { clock_ms })?;
    let (mut streams, mut batches) = (0u64, 0u64);
    for row in txn.open_table(STREAMS)?.iter()? {
        let (k, v) = row?;
        write_record(w, &Record::Stream { name: k.value(), meta: decode(v.value())? })?;
        streams += 1;
    }
    for row in txn.open_table(TOMBSTONES)?.iter()? {
        let (k, v) = row?;
        write_record(w, &Record::Tombstone { name: k.value(), meta: decode(v.value())? })?;
    }
    for row in txn.open_table(TOKENS)?.iter()? {
        let (k, v) = row?;
        write_record(w, &Record::Token { name: k.value(), value: v.value() })?;
    }
    let ids = txn.open_table(STREAM_IDS)?;
    let index = txn.open_table(BATCH_INDEX)?;
    for row in txn.open_table(STREAMS)?.iter()? {
        let (k, _) = row?;
        let stream = k.value();
        let Some(id) = ids.get(stream)?.map(|v| v.value()) else { continue };
        let mut rows = index.range((id, 0)..=(id, u64::MAX))?;
        loop {
            // A run of rows at a time, their payloads read in as few reads as they allow.
            let mut chunk = Vec::new();
            for row in rows.by_ref().take(SNAPSHOT_READ_ROWS) {
                let (k, v) = row?;
                let seq = k.value().1;
                chunk.push((seq, IndexRow::decode(id, seq, v.value())?));
            }
            if chunk.is_empty() {
                break;
            }
            let mut failed = None;
            // A payload that fails its checks is not sent on to another node (read_payloads).
            store.read_payloads(gate, stream, id, &chunk, |b| {
                if failed.is_none() {
                    let value = BatchValue::encode(stream, b.seq, b.ts, b.index, b.data);
                    match write_record(w, &Record::Batch { stream, seq: b.seq, value: &value }) {
                        Ok(()) => batches += 1,
                        Err(e) => failed = Some(e),
                    }
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
    }
    write_record(w, &Record::End { streams, batches })?;
    Ok((meta, streams, batches))
}

/// Index rows read at a time while writing a snapshot's batches.
const SNAPSHOT_READ_ROWS: usize = 1_024;

/// A durable commit: redb then persists every earlier non-durable commit too.
fn durable_barrier(store: &Store) -> Result<(), StoreError> {
    let w = store.begin_durable_write()?;
    w.open_table(SM_META)?.insert("durable_barrier", [1u8].as_slice())?;
    store.commit_durably(w)
}

/// Makes `tmp` the current snapshot: rename over the old one, then fsync the directory. Returns
/// the new current file opened for reading, so a concurrent replacement cannot swap it.
pub(crate) fn publish(store: &Store, tmp: &Path) -> Result<File, StoreError> {
    let _guard = store.snapshot_files.lock().unwrap_or_else(|p| p.into_inner());
    std::fs::rename(tmp, current_path(store.dir()))?;
    sync_dir(store.dir())?;
    Ok(File::open(current_path(store.dir()))?)
}

/// Opens the current snapshot and reads its header; `None` if there is none. The file is
/// returned positioned at its start.
pub(crate) fn open_current(store: &Store) -> Result<Option<(SnapshotMeta, File)>, StoreError> {
    let path = current_path(store.dir());
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = read_header(&mut BufReader::new(&mut file))
        .map_err(|e| StoreError::Snapshot(format!("{}: {e}", path.display())))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(Some((meta, file)))
}

/// Reads the magic and the `Header` record that start every snapshot.
fn read_header(r: &mut impl Read) -> Result<SnapshotMeta, StoreError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC && &magic != MAGIC_FORMAT_1 {
        return Err(StoreError::Snapshot("not a Runnev snapshot (no magic)".into()));
    }
    let mut buf = Vec::new();
    read_record(r, &mut buf)?;
    match postcard::from_bytes::<Record<'_>>(&buf)? {
        Record::Header { meta } => Ok(meta),
        _ => Err(StoreError::Snapshot("it does not start with a header".into())),
    }
}

/// Replaces the whole state machine with the snapshot read from `file`, in one durable redb
/// transaction, sets the last applied log id and membership from `meta`, and purges the log the
/// snapshot covers (Raft paper §7: the snapshot replaces the state and the log behind it).
///
/// Errors: the file is not a complete snapshot for `meta`, or redb fails; the state is unchanged.
/// The received bytes are copied, as they are read, to a new file that becomes the current
/// snapshot once the install has committed: openraft hands over a file handle, not a path.
pub(crate) fn install(store: &Store, file: File, meta: &SnapshotMeta) -> Result<(u64, u64), StoreError> {
    let copy_path = store.dir().join("snapshot.install.tmp");
    let mut r = Tee { from: BufReader::new(file), to: BufWriter::new(File::create(&copy_path)?) };
    if read_header(&mut r)?.last_log_id != meta.last_log_id {
        return Err(StoreError::Snapshot("the received header does not match its metadata".into()));
    }
    let mut buf = Vec::new();
    let txn = store.begin_durable_write()?;
    let counts;
    let retired: Vec<u64>;
    {
        let mut streams = txn.open_table(STREAMS)?;
        let mut ids = txn.open_table(STREAM_IDS)?;
        let mut index = txn.open_table(BATCH_INDEX)?;
        let mut tombstones = txn.open_table(TOMBSTONES)?;
        let mut tokens = txn.open_table(TOKENS)?;
        let mut sm = txn.open_table(SM_META)?;
        // The streams of the state replaced: their segments go once the install is durable.
        retired = ids.iter()?.map(|r| r.map(|(_, v)| v.value())).collect::<Result<_, _>>()?;
        let mut next_id: u64 = sm.get(NEXT_STREAM_ID)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
        tokens.retain(|_, _| false)?;
        streams.retain(|_, _| false)?;
        ids.retain(|_, _| false)?;
        index.retain(|_, _| false)?;
        tombstones.retain(|_, _| false)?;
        let (mut n_streams, mut n_batches) = (0u64, 0u64);
        let mut clock_ms = 0u64;
        loop {
            read_record(&mut r, &mut buf)?;
            match postcard::from_bytes::<Record<'_>>(&buf)? {
                Record::Header { .. } => return Err(StoreError::Snapshot("a second header".into())),
                Record::Stream { name, meta } => {
                    streams.insert(name, encode(&meta)?.as_slice())?;
                    n_streams += 1;
                }
                Record::Batch { stream, seq, value } => {
                    // A value damaged on its way (or on the sender's disk) is refused here.
                    let (ts, log_index, payload) = BatchValue::decode(stream, seq, value)?;
                    let id = stream_id_or_assign(&mut ids, &mut next_id, stream)?;
                    let loc = store.payloads().append(id, seq, ts, log_index, payload)?;
                    index.insert((id, seq), IndexRow { ts, index: log_index, loc }.encode(id, seq).as_slice())?;
                    n_batches += 1;
                }
                Record::Tombstone { name, meta } => {
                    tombstones.insert(name, encode(&meta)?.as_slice())?;
                }
                Record::Clock { clock_ms: c } => clock_ms = c,
                Record::Token { name, value } => {
                    tokens.insert(name, value)?;
                }
                Record::End { streams, batches } => {
                    if (streams, batches) != (n_streams, n_batches) {
                        return Err(StoreError::Snapshot(format!(
                            "its end says {streams} streams and {batches} batches; read {n_streams} and {n_batches}"
                        )));
                    }
                    counts = (streams, batches);
                    break;
                }
            }
        }
        sm.insert(NEXT_STREAM_ID, encode(&next_id)?.as_slice())?;
        sm.insert("last_applied", encode(&meta.last_log_id)?.as_slice())?;
        sm.insert("membership", encode(&meta.last_membership)?.as_slice())?;
        sm.insert(CLOCK_KEY, encode(&clock_ms)?.as_slice())?;
        // Move the purge point with the state it replaces, in one transaction: a crash between
        // installing and openraft's own purge would otherwise leave old entries below a gap,
        // which openraft cannot start from (simulation seed 112). The log skips entries at or
        // below the purge point from then on; openraft's purge that follows is idempotent.
        if let Some(last) = meta.last_log_id {
            let mut raft_meta = txn.open_table(RAFT_META)?;
            let purged: Option<crate::raft::LogId> =
                raft_meta.get("last_purged")?.map(|v| decode(v.value())).transpose()?;
            if purged.is_none_or(|p| p.index < last.index) {
                raft_meta.insert("last_purged", encode(&last)?.as_slice())?;
            }
        }
    }
    let copy = r.to.into_inner().map_err(|e| e.into_error())?;
    copy.sync_all()?;
    drop(copy);
    store.commit_durably(txn)?;
    for id in retired {
        store.payloads().retire(id, None);
    }
    if let Some(last) = meta.last_log_id {
        store.log().purge(last)?;
    }
    publish(store, &copy_path)?;
    Ok(counts)
}

/// Copies the snapshot read from `r` to `w` record by record, with its header's metadata
/// replaced by `edit(&meta)`, and checks that it is complete (its end's counts match what was
/// read). Reads exactly through the end record, nothing after it. Memory is one record.
/// Returns the original metadata and the stream and batch counts.
///
/// Errors: [`StoreError::Snapshot`] (no magic, no header first, a second header, counts that do
/// not match), [`StoreError::Io`] (`UnexpectedEof` for a truncated snapshot), decoding errors.
pub(crate) fn copy_with_meta(
    r: &mut impl Read,
    w: &mut impl Write,
    edit: impl FnOnce(&SnapshotMeta) -> SnapshotMeta,
) -> Result<(SnapshotMeta, u64, u64), StoreError> {
    let meta = read_header(r)?;
    w.write_all(MAGIC)?;
    write_record(w, &Record::Header { meta: edit(&meta) })?;
    let mut buf = Vec::new();
    let (mut n_streams, mut n_batches) = (0u64, 0u64);
    loop {
        read_record(r, &mut buf)?;
        let record = postcard::from_bytes::<Record<'_>>(&buf)?;
        match &record {
            Record::Header { .. } => return Err(StoreError::Snapshot("a second header".into())),
            Record::Stream { .. } => n_streams = n_streams.saturating_add(1),
            Record::Batch { stream, seq, value } => {
                BatchValue::decode(stream, *seq, value)?;
                n_batches = n_batches.saturating_add(1)
            }
            Record::Tombstone { .. } | Record::Clock { .. } | Record::Token { .. } => {}
            Record::End { streams, batches } => {
                if (*streams, *batches) != (n_streams, n_batches) {
                    return Err(StoreError::Snapshot(format!(
                        "its end says {streams} streams and {batches} batches; read {n_streams} and {n_batches}"
                    )));
                }
            }
        }
        write_record(w, &record)?;
        if matches!(record, Record::End { .. }) {
            return Ok((meta, n_streams, n_batches));
        }
    }
}

/// A reader that writes everything it reads to `to`.
struct Tee {
    from: BufReader<File>,
    to: BufWriter<File>,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.from.read(buf)?;
        self.to.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// Brings the state machine up to the current snapshot when it is behind it, before Raft
/// starts: after a crash that lost the (unsynced or damaged) state machine but left the
/// snapshot file, openraft cannot start from a snapshot ahead of the applied state. Returns the
/// log index restored to, if any.
///
/// Errors: the snapshot file cannot be read, or redb fails.
pub fn restore_state_machine(store: &Store) -> Result<Option<u64>, StoreError> {
    let Some((meta, file)) = open_current(store)? else { return Ok(None) };
    let applied: Option<LogId> = {
        let txn = store.db().begin_read()?;
        let sm = txn.open_table(SM_META)?;
        sm.get("last_applied")?.map(|v| decode(v.value())).transpose()?.flatten()
    };
    let Some(snap) = meta.last_log_id else { return Ok(None) };
    if applied.is_some_and(|a| a.index >= snap.index) {
        return Ok(None);
    }
    tracing::warn!(snapshot = %meta.snapshot_id, applied = ?applied, "state machine behind its snapshot: restoring it from the snapshot");
    install(store, file, &meta)?;
    store.set_applied(snap.index);
    Ok(Some(snap.index))
}
