//! Snapshots (Raft paper §7): the current one this node keeps, and the whole file one node sends
//! another, both streamed record by record so building, sending and installing one takes memory
//! bounded by a record, not by the state.
//!
//! Owns: both file formats, making one from the other, and the atomic replacement of the
//! current snapshot with the pinning of the payload segments it names. Must never: hold the
//! state in memory; expose a half-written file as the current snapshot (files are written to a
//! temporary name, fsynced, then renamed); or let a payload segment the current snapshot names
//! leave the disk (its spans stay pinned until another snapshot replaces it).
//!
//! The whole snapshot (`RUNNEVS2`, what is sent and installed, and what a backup holds): the
//! 8-byte magic, then records, each a u32 LE length and that many bytes of a postcard-encoded
//! `Record`: one `Header`, the `Clock` (the cluster clock of the state machine; a snapshot
//! without one, from an older build, installs clock 0), then every `Stream`, every `Tombstone`,
//! every `Token` (salted hashes, never secrets), every `Batch` in (stream, seq) order, then `End`
//! with the counts, which detects a truncated file. A `Batch` carries the batch in the checked
//! encoding of data format 2 (`BatchValue`, keyed by the stream's name), whatever the node
//! keeps on disk, so nodes of data formats 2 to 4 exchange snapshots. (`RUNNEVS1`, of data
//! format 1, is still read.)
//!
//! The manifest (`RUNNEVM1`, data format 4): what a node keeps as its current snapshot. The same
//! records, but a `Span` per stream in place of its batches ([`Span`]: where its oldest and
//! newest payload records are in this node's segments, and how many batches and bytes lie
//! between), so building one writes a record per stream, not the payloads (Kafka and Redpanda
//! likewise keep immutable segments rather than copy them). Payload segments are append-only
//! and retention removes whole ones, so the bytes a span names do not change while its segments
//! are pinned. A manifest is made whole (`materialize`) only when it is sent, into a file
//! without a name that is gone once sent; installing a received snapshot appends its payloads
//! to the node's own segments and replaces it by a manifest of them.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable};
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use super::io::SnapshotFile;
use super::payloads::{PinId, ReadGate, Span};
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
    /// In a manifest only: one stream's retained batches, by the span of payload records that
    /// holds them on this node ([`Span`]).
    Span {
        stream: &'a str,
        span: Span,
    },
}

/// The magic of a snapshot manifest (data format 4): the file this node keeps as its current
/// snapshot, which names its payloads by [`Span`] instead of holding them, and which only this
/// node reads (stream ids and locations are its own). What is sent to another node is the
/// `RUNNEVS2` file made from it ([`materialize`]).
const MAGIC_MANIFEST: &[u8; 8] = b"RUNNEVM1";

/// The current snapshot as [`open_current`] finds it.
pub(crate) enum Current {
    /// A whole snapshot (`RUNNEVS1`/`RUNNEVS2`: one received and not yet replaced, or one of
    /// data format 3 or older), positioned at its start.
    Full(File),
    /// A manifest (`RUNNEVM1`), positioned at its start, with its spans pinned until it has been
    /// read ([`Current::into_data`]).
    Manifest(File, SnapshotPin),
}

impl Current {
    /// The snapshot as openraft sends it: a whole file as it is, a manifest made whole
    /// ([`materialize`]) into an unnamed spool file on the first read or seek, not before
    /// (openraft asks for the current snapshot at start-up and reads it only to send it).
    pub(crate) fn into_data(self, store: Arc<Store>) -> SnapshotFile {
        match self {
            Current::Full(f) => SnapshotFile::from_std(f),
            Current::Manifest(f, pin) => SnapshotFile::lazy(Box::new(move || {
                let spool = spool(&store, f).map_err(std::io::Error::other);
                drop(pin);
                spool
            })),
        }
    }
}

/// Spans of payload segments pinned for a snapshot ([`super::payloads::PayloadStore::pin`]),
/// released when dropped.
pub(crate) struct SnapshotPin {
    store: Arc<Store>,
    pin: Option<PinId>,
}

impl Drop for SnapshotPin {
    fn drop(&mut self) {
        if let Some(pin) = self.pin.take() {
            self.store.payloads().unpin(pin);
        }
    }
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

/// Makes the state machine, as of one read transaction, the current snapshot: a manifest
/// ([`write_manifest`]) whose spans stay pinned, so its cost is a record per stream, not a copy
/// of the payloads (a 1 GiB state is not rewritten; Kafka's and Redpanda's snapshots likewise
/// refer to their immutable segments). Returns its metadata and the snapshot, pinned for reading.
/// The id is `{term}-{index}` of the last applied log id.
///
/// Errors: redb or file I/O failures; the previous snapshot stays in place.
pub(crate) fn build(store: &Arc<Store>) -> Result<(SnapshotMeta, Current), StoreError> {
    store.snapshot_begun();
    let gate = store.payloads().read_gate();
    let txn = store.db().begin_read()?;
    // State-machine commits are not fsynced (the log is the durable record). Make everything this
    // read sees durable before a snapshot of it exists: otherwise a crash could leave the snapshot
    // ahead of the durable state machine and openraft refuses to start (simulation seed 4). This
    // also makes the payload records the manifest names durable (`Store::commit_durably`).
    durable_barrier(store)?;
    let (meta, current, streams) = publish_manifest(store, &txn, None)?;
    drop((txn, gate));
    tracing::info!(snapshot = %meta.snapshot_id, streams, "built snapshot");
    Ok((meta, current))
}

/// Writes the manifest of the state `txn` sees (with `meta` if given, else the state's own),
/// pins its spans, and makes it the current snapshot. Returns its metadata, the snapshot
/// (pinned for reading) and its stream count. The caller holds a read gate taken before `txn`,
/// and the state `txn` sees is durable.
fn publish_manifest(
    store: &Arc<Store>,
    txn: &redb::ReadTransaction,
    meta: Option<&SnapshotMeta>,
) -> Result<(SnapshotMeta, Current, u64), StoreError> {
    let tmp = building_path(store.dir());
    let mut w = BufWriter::new(File::create(&tmp)?);
    let (meta, streams, spans) = write_manifest(txn, meta, &mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    let reading = SnapshotPin { store: store.clone(), pin: Some(store.payloads().pin(spans.clone())) };
    let current = store.payloads().pin(spans);
    let file = publish_pinned(store, &tmp, Some(current))?;
    Ok((meta, Current::Manifest(file, reading), streams))
}

/// The snapshot's metadata for the state `txn` sees: its last applied log id and membership;
/// the id is `{term}-{index}` of that log id.
fn state_meta(txn: &redb::ReadTransaction) -> Result<(SnapshotMeta, u64), StoreError> {
    let sm = txn.open_table(SM_META)?;
    let last_applied: Option<LogId> = sm.get("last_applied")?.map(|v| decode(v.value())).transpose()?.flatten();
    let membership: StoredMembership =
        sm.get("membership")?.map(|v| decode(v.value())).transpose()?.unwrap_or_default();
    let clock_ms: u64 = sm.get(CLOCK_KEY)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
    let snapshot_id = match &last_applied {
        Some(l) => format!("{}-{}", l.leader_id.term, l.index),
        None => "0-0".to_string(),
    };
    Ok((SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id }, clock_ms))
}

/// Writes what starts both formats: `magic`, the header, the clock, then every stream,
/// tombstone and token `txn` sees. Returns the stream count.
///
/// Errors: redb, encoding, `w`'s failures.
fn write_head(
    txn: &redb::ReadTransaction,
    magic: &[u8; 8],
    meta: &SnapshotMeta,
    clock_ms: u64,
    w: &mut impl Write,
) -> Result<u64, StoreError> {
    w.write_all(magic)?;
    write_record(w, &Record::Header { meta: meta.clone() })?;
    write_record(w, &Record::Clock { clock_ms })?;
    let mut streams = 0u64;
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
    Ok(streams)
}

/// Writes the manifest of the state `txn` sees to `w`: magic `RUNNEVM1`, header (`meta` if
/// given, else the state's), clock, streams, tombstones, tokens, then a `Span` per stream that
/// holds batches (its oldest and newest rows and its counts from the stream's metadata), then
/// `End` with the stream count and the span count. A record per stream, whatever the batches.
/// Returns the metadata, the stream count and the spans.
///
/// Errors: redb, encoding, `w`'s failures; a stream whose rows disagree with its metadata.
fn write_manifest(
    txn: &redb::ReadTransaction,
    meta: Option<&SnapshotMeta>,
    w: &mut impl Write,
) -> Result<(SnapshotMeta, u64, Vec<Span>), StoreError> {
    let (own, clock_ms) = state_meta(txn)?;
    let meta = meta.cloned().unwrap_or(own);
    let streams = write_head(txn, MAGIC_MANIFEST, &meta, clock_ms, w)?;
    let ids = txn.open_table(STREAM_IDS)?;
    let index = txn.open_table(BATCH_INDEX)?;
    let mut spans = Vec::new();
    for row in txn.open_table(STREAMS)?.iter()? {
        let (k, v) = row?;
        let (stream, stream_meta): (&str, StreamMeta) = (k.value(), decode(v.value())?);
        let Some(id) = ids.get(stream)?.map(|v| v.value()) else { continue };
        let mut rows = index.range((id, 0)..=(id, u64::MAX))?;
        let Some(first) = rows.next().transpose()? else { continue };
        let last = rows.next_back().transpose()?;
        let (first_seq, first_row) = (first.0.value().1, IndexRow::decode(id, first.0.value().1, first.1.value())?);
        let (last_seq, last_row) = match &last {
            Some((k, v)) => (k.value().1, IndexRow::decode(id, k.value().1, v.value())?),
            None => (first_seq, first_row),
        };
        if (stream_meta.first_seq, stream_meta.last_seq) != (first_seq, last_seq) {
            return Err(StoreError::Corrupt(format!(
                "stream {stream}: its rows run from seq {first_seq} to {last_seq}, its metadata from {} to {}",
                stream_meta.first_seq, stream_meta.last_seq
            )));
        }
        let span = Span {
            stream: id,
            first_seq,
            first: first_row.loc,
            last_seq,
            last: last_row.loc,
            batches: stream_meta.batches,
            bytes: stream_meta.bytes,
        };
        write_record(w, &Record::Span { stream, span })?;
        spans.push(span);
    }
    write_record(w, &Record::End { streams, batches: spans.len() as u64 })?;
    Ok((meta, streams, spans))
}

/// Writes the whole snapshot (`RUNNEVS2`, what another node installs) that the manifest read
/// from `manifest` names: its records as they are, each `Span` as the batches it holds, read
/// from this node's payload segments and checked (checksums, order, counts). Returns the stream
/// and batch counts. The manifest's spans must be pinned meanwhile.
///
/// Errors: not a complete manifest, a payload that fails its checks or is missing, I/O.
pub(crate) fn materialize(store: &Store, manifest: File, w: &mut impl Write) -> Result<(u64, u64), StoreError> {
    let mut r = BufReader::new(manifest);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC_MANIFEST {
        return Err(StoreError::Snapshot("not a snapshot manifest (no magic)".into()));
    }
    w.write_all(MAGIC)?;
    let mut buf = Vec::new();
    let (mut streams, mut spans, mut batches) = (0u64, 0u64, 0u64);
    let mut first = true;
    loop {
        read_record(&mut r, &mut buf)?;
        let record = postcard::from_bytes::<Record<'_>>(&buf)?;
        if first != matches!(record, Record::Header { .. }) {
            return Err(StoreError::Snapshot("a manifest starts with its header, and has one".into()));
        }
        first = false;
        match record {
            Record::Span { stream, span } => {
                let gate = store.payloads().read_gate();
                store.payloads().read_span(&gate, &span, |b| {
                    let value = BatchValue::encode(stream, b.seq, b.ts, b.index, b.payload);
                    write_record(w, &Record::Batch { stream, seq: b.seq, value: &value })
                })?;
                spans += 1;
                batches = batches.saturating_add(span.batches);
            }
            Record::Batch { .. } => return Err(StoreError::Snapshot("a manifest holds no batch".into())),
            Record::End { streams: s, batches: n } => {
                if (s, n) != (streams, spans) {
                    return Err(StoreError::Snapshot(format!(
                        "the manifest's end says {s} streams and {n} spans; read {streams} and {spans}"
                    )));
                }
                write_record(w, &Record::End { streams, batches })?;
                return Ok((streams, batches));
            }
            other => {
                if matches!(other, Record::Stream { .. }) {
                    streams += 1;
                }
                write_record(w, &other)?;
            }
        }
    }
}

/// [`materialize`]s `manifest` into a new file of the data directory that has no name (removed
/// as soon as it is created; its space is freed when the last handle closes), returned
/// positioned at its start.
fn spool(store: &Store, manifest: File) -> Result<File, StoreError> {
    static SPOOLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SPOOLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = store.dir().join(format!("snapshot.send.{n}.tmp"));
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
    std::fs::remove_file(&path)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let (streams, batches) = materialize(store, manifest, &mut w)?;
    let mut file = w.into_inner().map_err(|e| e.into_error())?;
    file.seek(SeekFrom::Start(0))?;
    tracing::debug!(streams, batches, "made the whole snapshot from its manifest, to send");
    Ok(file)
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
    let (meta, clock_ms) = state_meta(txn)?;
    let streams = write_head(txn, MAGIC, &meta, clock_ms, w)?;
    let mut batches = 0u64;
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

/// Makes `tmp`, a whole snapshot, the current snapshot ([`publish_pinned`] without a pin).
pub(crate) fn publish(store: &Store, tmp: &Path) -> Result<File, StoreError> {
    publish_pinned(store, tmp, None)
}

/// Makes `tmp` the current snapshot: rename over the old one, then fsync the directory; `pin`
/// (the new snapshot's spans, for a manifest) replaces the old one's, which is released. Returns
/// the new current file opened for reading, so a concurrent replacement cannot swap it.
///
/// Errors: I/O; then `pin` is released and the old snapshot stays current.
fn publish_pinned(store: &Store, tmp: &Path, pin: Option<PinId>) -> Result<File, StoreError> {
    let mut current = store.snapshot_pin.lock().unwrap_or_else(|p| p.into_inner());
    let published = std::fs::rename(tmp, current_path(store.dir()))
        .map_err(StoreError::from)
        .and_then(|()| super::sync_dir(store.dir()))
        .and_then(|()| Ok(File::open(current_path(store.dir()))?));
    let release = match published {
        Ok(_) => std::mem::replace(&mut *current, pin),
        Err(_) => pin,
    };
    drop(current);
    if let Some(old) = release {
        store.payloads().unpin(old);
    }
    published
}

/// Opens the current snapshot and reads its header; `None` if there is none. The file is
/// returned positioned at its start, a manifest with its spans pinned.
pub(crate) fn open_current(store: &Arc<Store>) -> Result<Option<(SnapshotMeta, Current)>, StoreError> {
    let path = current_path(store.dir());
    // Under the lock publishing takes: the spans pinned are those of the file opened.
    let _current = store.snapshot_pin.lock().unwrap_or_else(|p| p.into_inner());
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let head = read_head(&mut BufReader::new(&mut file))
        .map_err(|e| StoreError::Snapshot(format!("{}: {e}", path.display())))?;
    file.seek(SeekFrom::Start(0))?;
    Ok(Some(match head {
        Head::Full(meta) => (meta, Current::Full(file)),
        Head::Manifest(meta, spans) => {
            let pin = SnapshotPin { store: store.clone(), pin: Some(store.payloads().pin(spans)) };
            (meta, Current::Manifest(file, pin))
        }
    }))
}

/// The spans the current snapshot of `dir` refers to (none for a whole snapshot, or none at
/// all): what a store pins when it opens ([`super::payloads::PayloadStore::open_pinned`]).
///
/// Errors: the file cannot be read, or is not a snapshot.
pub(crate) fn current_spans(dir: &Path) -> Result<Vec<Span>, StoreError> {
    let path = current_path(dir);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    match read_head(&mut BufReader::new(file)).map_err(|e| StoreError::Snapshot(format!("{}: {e}", path.display())))? {
        Head::Full(_) => Ok(Vec::new()),
        Head::Manifest(_, spans) => Ok(spans),
    }
}

/// What starts a snapshot file: a whole snapshot's metadata, or a manifest's with its spans.
enum Head {
    Full(SnapshotMeta),
    Manifest(SnapshotMeta, Vec<Span>),
}

/// Reads the magic and the `Header` record that start every snapshot, and a manifest's spans
/// (the whole manifest: a record per stream).
fn read_head(r: &mut impl Read) -> Result<Head, StoreError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    let manifest = &magic == MAGIC_MANIFEST;
    if !manifest && &magic != MAGIC && &magic != MAGIC_FORMAT_1 {
        return Err(StoreError::Snapshot("not a Runnev snapshot (no magic)".into()));
    }
    let mut buf = Vec::new();
    read_record(r, &mut buf)?;
    let meta = match postcard::from_bytes::<Record<'_>>(&buf)? {
        Record::Header { meta } => meta,
        _ => return Err(StoreError::Snapshot("it does not start with a header".into())),
    };
    if !manifest {
        return Ok(Head::Full(meta));
    }
    let mut spans = Vec::new();
    loop {
        read_record(r, &mut buf)?;
        match postcard::from_bytes::<Record<'_>>(&buf)? {
            Record::Span { span, .. } => spans.push(span),
            Record::End { batches, .. } if batches == spans.len() as u64 => return Ok(Head::Manifest(meta, spans)),
            Record::End { batches, .. } => {
                return Err(StoreError::Snapshot(format!("its end says {batches} spans; read {}", spans.len())))
            }
            Record::Header { .. } | Record::Batch { .. } => {
                return Err(StoreError::Snapshot("a manifest with a second header or a batch".into()))
            }
            _ => {}
        }
    }
}

/// Reads the magic and the `Header` record that start a whole snapshot ([`read_head`]; a
/// manifest is refused).
fn read_header(r: &mut impl Read) -> Result<SnapshotMeta, StoreError> {
    match read_head(r)? {
        Head::Full(meta) => Ok(meta),
        Head::Manifest(..) => Err(StoreError::Snapshot("a manifest, not a whole snapshot".into())),
    }
}

/// Replaces the whole state machine with the snapshot read from `file`, in one durable redb
/// transaction, sets the last applied log id and membership from `meta`, and purges the log the
/// snapshot covers (Raft paper §7: the snapshot replaces the state and the log behind it).
///
/// Errors: the file is not a complete snapshot for `meta`, or redb fails; the state is unchanged.
/// The received bytes are copied, as they are read, to a new file that becomes the current
/// snapshot once the install has committed: openraft hands over a file handle, not a path.
pub(crate) fn install(store: &Arc<Store>, file: File, meta: &SnapshotMeta) -> Result<(u64, u64), StoreError> {
    let mut r = BufReader::with_capacity(1 << 20, file);
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
                Record::Span { .. } => {
                    return Err(StoreError::Snapshot("a manifest's span in a whole snapshot".into()))
                }
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
    store.commit_durably(txn)?;
    for id in retired {
        store.payloads().retire(id, None);
    }
    if let Some(last) = meta.last_log_id {
        let retired = store.log().purge(last)?;
        retired.remove_behind(last);
    }
    // The installed state, now durable, becomes the current snapshot as a manifest of this
    // node's own segments (the received file is not kept: it would hold every payload twice).
    let gate = store.payloads().read_gate();
    let txn = store.db().begin_read()?;
    publish_manifest(store, &txn, Some(meta))?;
    drop((txn, gate));
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
            Record::Span { .. } => return Err(StoreError::Snapshot("a manifest's span in a whole snapshot".into())),
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

/// Brings the state machine up to the current snapshot when it is behind it, before Raft
/// starts: after a crash that lost the (unsynced or damaged) state machine but left the
/// snapshot file, openraft cannot start from a snapshot ahead of the applied state. Returns the
/// log index restored to, if any.
///
/// Errors: the snapshot file cannot be read, or redb fails.
pub fn restore_state_machine(store: &Arc<Store>) -> Result<Option<u64>, StoreError> {
    let Some((meta, current)) = open_current(store)? else { return Ok(None) };
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
    // A manifest's payloads are this node's own segments, pinned since the store opened (and
    // not cut below the manifest's spans); made whole, then installed like a received one.
    let file = match current {
        Current::Full(file) => file,
        Current::Manifest(manifest, pin) => {
            let whole = spool(store, manifest)?;
            drop(pin);
            whole
        }
    };
    install(store, file, &meta)?;
    store.set_applied(snap.index);
    Ok(Some(snap.index))
}
