//! The replicated state machine on redb: openraft's [`RaftStateMachine`].
//!
//! Owns: applying committed log entries to streams and batches (through the pure rules in
//! [`crate::stream`]), the cluster's clock (`clock_ms`, below), and building and installing
//! snapshots. A batch's payload is appended once to its stream's payload segment
//! ([`super::payloads`]) and the batch index row points at it; retention and deletion retire
//! whole segments once no row points into them, after the commit that dropped the rows. Must never: read a clock, draw randomness or consult local configuration while
//! applying: every replica applies the same log to the same state (SPEC §2.7); nor wrap or panic
//! on any entry: a rule that refuses a change ([`stream::MetaError`]) rejects the command, or
//! stops the eviction it was asked for, and leaves the metadata as it was.
//!
//! Cluster time is monotonic in the replicated state: the state machine keeps the highest `ts`
//! it has applied (`clock_ms` in `SM_META`, carried by snapshots), and the effective `ts` of an
//! entry that carries one (publish, stream create or update, tick) is
//! `max(proposed ts, clock_ms)`. So a batch's `ts` never goes backwards, within a stream or
//! across streams, and a leader whose clock is behind can neither stamp batches in the past nor
//! make retention evict early. It is computed from the log alone.

use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, StoredMembership};
use redb::{ReadableDatabase, ReadableTable, Table};

use super::io::{self, SnapshotFile};
use super::snapshot::{self, SnapshotMeta};
use super::{
    blocking, decode, encode, raft_err, Entry, IndexRow, Store, StoreError, BATCH_INDEX, NEXT_STREAM_ID, SM_META,
    STREAMS, STREAM_IDS, TOKENS, TOKENS_BOOTSTRAPPED, TOMBSTONES,
};
use crate::limits::{SM_DURABLE_EVERY_BYTES, SM_DURABLE_EVERY_ENTRIES};
use crate::raft::{Command, LogId, NodeId, Outcome, StorageError, StreamInfo, TypeConfig};
use crate::stream::{
    self, Existing, FramesDecision, FramesRejection, Oldest, PublishDecision, PublishRejection, Retention, StreamMeta,
};

type Membership = StoredMembership<NodeId, openraft::BasicNode>;

/// openraft's state machine over the node's [`Store`].
pub struct StateMachine {
    store: Arc<Store>,
    /// Entries and payload bytes applied since the last durable commit.
    undurable: (u64, u64),
}

impl StateMachine {
    /// A state machine over `store`.
    pub fn new(store: Arc<Store>) -> Self {
        StateMachine { store, undurable: (0, 0) }
    }
}

/// The key of the cluster clock in [`SM_META`]: the highest `ts` applied, ms since the Unix
/// epoch (absent: 0).
pub(crate) const CLOCK_KEY: &str = "clock_ms";

/// The tables a command writes, the payload segments, and the cluster clock.
struct Tables<'t> {
    streams: Table<'t, &'static str, &'static [u8]>,
    tombstones: Table<'t, &'static str, &'static [u8]>,
    ids: Table<'t, &'static str, u64>,
    index: Table<'t, (u64, u64), &'static [u8]>,
    tokens: Table<'t, &'static str, &'static [u8]>,
    store: &'t Store,
    /// The highest `ts` applied so far, ms since the Unix epoch.
    clock_ms: u64,
    /// The next stream id to assign ([`NEXT_STREAM_ID`]).
    next_stream_id: u64,
    /// Segments to retire once this transaction has committed: (stream id, first seq kept or
    /// `None` for all). Retiring before the commit could remove a segment that the state,
    /// were the commit to fail, still points at.
    retire: Vec<(u64, Option<u64>)>,
}

impl Tables<'_> {
    /// The effective `ts` of an entry proposed with `proposed`: never below any `ts` applied
    /// before it. Advances the cluster clock.
    fn tick_clock(&mut self, proposed: u64) -> u64 {
        self.clock_ms = self.clock_ms.max(proposed);
        self.clock_ms
    }

    /// A new stream's metadata, continuing a deleted stream of the same name if there was one.
    fn create(&mut self, name: &str, retention: Retention) -> Result<StreamMeta, StoreError> {
        match self.tombstones.remove(name)? {
            Some(t) => Ok(stream::reincarnate(&decode(t.value())?, retention)),
            None => Ok(StreamMeta::new(retention)),
        }
    }

    /// What a new stream named `name` would start as ([`Tables::create`]), without changing
    /// anything: a command that may still be refused must not consume the tombstone.
    fn would_create(&self, name: &str, retention: Retention) -> Result<StreamMeta, StoreError> {
        match self.tombstones.get(name)? {
            Some(t) => Ok(stream::reincarnate(&decode(t.value())?, retention)),
            None => Ok(StreamMeta::new(retention)),
        }
    }

    fn meta(&self, name: &str) -> Result<Option<StreamMeta>, StoreError> {
        self.streams.get(name)?.map(|v| decode(v.value())).transpose()
    }

    fn put_meta(&mut self, name: &str, meta: &StreamMeta) -> Result<(), StoreError> {
        debug_assert!(meta.is_consistent(), "stream {name}: {meta:?}");
        self.streams.insert(name, encode(meta)?.as_slice())?;
        Ok(())
    }

    /// The id of stream `name`, `None` before its first batch.
    fn stream_id(&self, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.ids.get(name)?.map(|v| v.value()))
    }

    /// The id of stream `name`, assigned now if it has none ([`STREAM_IDS`]).
    fn stream_id_or_assign(&mut self, name: &str) -> Result<u64, StoreError> {
        super::stream_id_or_assign(&mut self.ids, &mut self.next_stream_id, name)
    }

    /// The index row of batch `seq` of stream `name`, if it is retained.
    fn row(&self, name: &str, seq: u64) -> Result<Option<IndexRow>, StoreError> {
        let Some(id) = self.stream_id(name)? else { return Ok(None) };
        self.index.get((id, seq))?.map(|v| IndexRow::decode(id, seq, v.value())).transpose()
    }

    /// Whether the retained batch `seq` of `name`, whose row is `row`, holds `payload`: its
    /// record is read back from its segment (a duplicate publish is rare; the row alone does
    /// not say).
    fn same_payload(&self, name: &str, seq: u64, row: IndexRow, payload: &[u8]) -> Result<bool, StoreError> {
        if row.loc.len as usize != payload.len() {
            return Ok(false);
        }
        let Some(id) = self.stream_id(name)? else { return Ok(false) };
        let gate = self.store.payloads().read_gate();
        let mut same = false;
        self.store.read_payloads(&gate, name, id, &[(seq, row)], |b| same = b.data == payload)?;
        Ok(same)
    }

    /// Appends `payloads` as batches `first_seq`, `first_seq + 1`, … of `name`: one publish, or
    /// the frames of one (one write per payload segment, then an index row per batch).
    fn append(
        &mut self,
        name: &str,
        first_seq: u64,
        ts: u64,
        index: u64,
        payloads: &[&[u8]],
    ) -> Result<(), StoreError> {
        let id = self.stream_id_or_assign(name)?;
        let locations = self.store.payloads().append_run(id, first_seq, ts, index, payloads)?;
        for (k, loc) in locations.into_iter().enumerate() {
            let seq = first_seq.checked_add(k as u64).ok_or_else(|| {
                StoreError::Corrupt(format!("stream {name}: batches from seq {first_seq} pass u64::MAX"))
            })?;
            self.index.insert((id, seq), IndexRow { ts, index, loc }.encode(id, seq).as_slice())?;
        }
        Ok(())
    }

    fn first_batch(&self, id: u64, from: u64) -> Result<Option<(Oldest, IndexRow)>, StoreError> {
        let mut range = self.index.range((id, from)..=(id, u64::MAX))?;
        match range.next() {
            Some(row) => {
                let (k, v) = row?;
                let seq = k.value().1;
                let row = IndexRow::decode(id, seq, v.value())?;
                Ok(Some((Oldest { seq, ts_ms: row.ts, len: u64::from(row.loc.len) }, row)))
            }
            None => Ok(None),
        }
    }

    /// Evicts from the front of `name` while retention says so (SPEC §2.7), `now_ms` being the
    /// ts of the entry being applied, and retires the payload segments before the oldest batch
    /// kept (all of them when none is).
    fn enforce_retention(&mut self, name: &str, meta: &mut StreamMeta, now_ms: u64) -> Result<(), StoreError> {
        // Most streams evict nothing on most publishes: no lookup of the oldest batch for them.
        if !stream::may_evict(meta) {
            return Ok(());
        }
        let id = self.stream_id(name)?.ok_or_else(|| {
            StoreError::Corrupt(format!("stream {name} counts {} batches but has no id", meta.batches))
        })?;
        let mut evicted = false;
        while meta.batches > 0 {
            let (oldest, _) = self.first_batch(id, meta.first_seq)?.ok_or_else(|| {
                StoreError::Corrupt(format!("stream {name} counts {} batches but has none", meta.batches))
            })?;
            if oldest.seq != meta.first_seq {
                return Err(StoreError::Corrupt(format!(
                    "stream {name} first_seq {} but oldest batch {}",
                    meta.first_seq, oldest.seq
                )));
            }
            if !stream::must_evict(meta, &oldest, now_ms) {
                break;
            }
            let next = match oldest.seq.checked_add(1) {
                Some(from) if meta.batches > 1 => self.first_batch(id, from)?.map(|(o, _)| o.seq),
                _ => None,
            };
            let mut after = *meta;
            if let Err(e) = stream::record_eviction(&mut after, &oldest, next) {
                // Only metadata written by an older build can refuse (a last seq of 2^64-1):
                // the batch stays, and the stream stays as it was.
                tracing::warn!(stream = name, seq = oldest.seq, error = %e, "retention cannot evict the oldest batch; it is kept");
                break;
            }
            self.index.remove((id, oldest.seq))?;
            *meta = after;
            evicted = true;
        }
        if evicted {
            let keep = match meta.batches {
                0 => None,
                _ => self.first_batch(id, meta.first_seq)?.map(|(_, row)| row.loc.segment),
            };
            self.retire.push((id, keep));
        }
        Ok(())
    }

    /// Applies a frames publish (SPEC §6) at effective `ts`: decided by
    /// [`stream::decide_frames`] and recorded by [`stream::record_frames`] before anything is
    /// written, so a refusal (or a missing stream) changes nothing: no batch, no metadata, and
    /// no tombstone consumed by an auto-create.
    fn publish_frames(
        &mut self,
        name: &str,
        seq: Option<u64>,
        ts: u64,
        auto_create: bool,
        frames: &[bytes::Bytes],
        index: u64,
    ) -> Result<Outcome, StoreError> {
        let (mut meta, created) = match self.meta(name)? {
            Some(m) => (m, false),
            None if auto_create => (self.would_create(name, Retention::default())?, true),
            None => return Ok(Outcome::StreamNotFound),
        };
        let count = frames.len() as u64;
        let this = &*self;
        let decision = stream::decide_frames(&meta, seq, count, |frame, s| {
            let Some(row) = this.row(name, s)? else { return Ok::<_, StoreError>(Existing::Absent) };
            Ok(match usize::try_from(frame).ok().and_then(|k| frames.get(k)) {
                Some(f) if this.same_payload(name, s, row, f)? => Existing::SamePayload,
                _ => Existing::OtherPayload,
            })
        })?;
        match decision {
            FramesDecision::Append { first_seq, last_seq } => {
                if let Err((frame, e)) =
                    stream::record_frames(&mut meta, first_seq, frames.iter().map(|f| f.len() as u64))
                {
                    let rejection = PublishRejection::Unrepresentable(e);
                    return Ok(Outcome::FramesRejected(FramesRejection::Frame { frame, rejection }));
                }
                if created {
                    self.tombstones.remove(name)?;
                }
                let payloads: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
                self.append(name, first_seq, ts, index, &payloads)?;
                debug_assert_eq!(last_seq - first_seq + 1, count, "one seq per frame");
                self.enforce_retention(name, &mut meta, ts)?;
                self.put_meta(name, &meta)?;
                Ok(Outcome::FramesPublished { first_seq, last_seq, count, ts, duplicate: false, index })
            }
            FramesDecision::Duplicate { first_seq, last_seq } => {
                let IndexRow { ts, index, .. } = self
                    .row(name, last_seq)?
                    .ok_or_else(|| StoreError::Corrupt(format!("duplicate of {name}/{last_seq} vanished")))?;
                Ok(Outcome::FramesPublished { first_seq, last_seq, count, ts, duplicate: true, index })
            }
            FramesDecision::Reject(r) => Ok(Outcome::FramesRejected(r)),
        }
    }

    fn apply(&mut self, cmd: Command, index: u64) -> Result<Outcome, StoreError> {
        match cmd {
            Command::PutStream { name, retention, ts } => {
                let ts = self.tick_clock(ts);
                let (created, mut meta) = match self.meta(&name)? {
                    Some(mut m) => {
                        if let Some(r) = retention {
                            m.retention = r;
                        }
                        (false, m)
                    }
                    None => (true, self.create(&name, retention.unwrap_or_default())?),
                };
                self.enforce_retention(&name, &mut meta, ts)?;
                self.put_meta(&name, &meta)?;
                Ok(Outcome::Stream { created, info: StreamInfo { name, meta } })
            }
            Command::DeleteStream { name } => {
                let Some(meta) = self.streams.remove(name.as_str())?.map(|v| v.value().to_vec()) else {
                    return Ok(Outcome::StreamNotFound);
                };
                self.tombstones.insert(name.as_str(), meta.as_slice())?;
                if let Some(id) = self.ids.remove(name.as_str())?.map(|v| v.value()) {
                    self.index.retain_in((id, 0)..=(id, u64::MAX), |_, _| false)?;
                    self.retire.push((id, None));
                }
                Ok(Outcome::Deleted)
            }
            Command::Publish { stream, seq, ts, auto_create, data } => {
                let ts = self.tick_clock(ts);
                // An auto-create consumes the name's tombstone only when the batch is appended: a
                // refused publish must leave the deleted stream's seqs unreusable.
                let (mut meta, created) = match self.meta(&stream)? {
                    Some(m) => (m, false),
                    None if auto_create => (self.would_create(&stream, Retention::default())?, true),
                    None => return Ok(Outcome::StreamNotFound),
                };
                let existing = match seq {
                    Some(s) if s <= meta.last_seq => match self.row(&stream, s)? {
                        Some(row) if self.same_payload(&stream, s, row, &data)? => Existing::SamePayload,
                        Some(_) => Existing::OtherPayload,
                        None => Existing::Absent,
                    },
                    _ => Existing::Absent,
                };
                match stream::decide_publish(&meta, seq, existing) {
                    PublishDecision::Append(s) => {
                        // Decided before anything is written: a refusal changes nothing.
                        if let Err(e) = stream::record_append(&mut meta, s, data.len() as u64) {
                            return Ok(Outcome::Rejected(PublishRejection::Unrepresentable(e)));
                        }
                        if created {
                            self.tombstones.remove(stream.as_str())?;
                        }
                        self.append(&stream, s, ts, index, &[&data])?;
                        self.enforce_retention(&stream, &mut meta, ts)?;
                        self.put_meta(&stream, &meta)?;
                        Ok(Outcome::Published { seq: s, ts, duplicate: false, index })
                    }
                    PublishDecision::Duplicate(s) => {
                        let IndexRow { ts, index, .. } = self
                            .row(&stream, s)?
                            .ok_or_else(|| StoreError::Corrupt(format!("duplicate of {stream}/{s} vanished")))?;
                        Ok(Outcome::Published { seq: s, ts, duplicate: true, index })
                    }
                    PublishDecision::Reject(r) => Ok(Outcome::Rejected(r)),
                }
            }
            Command::PublishFrames { stream, seq, ts, auto_create, frames } => {
                let ts = self.tick_clock(ts);
                self.publish_frames(&stream, seq, ts, auto_create, &frames, index)
            }
            Command::Batch(cmds) => {
                let mut outcomes = Vec::with_capacity(cmds.len());
                for cmd in cmds {
                    outcomes.push(self.apply(cmd, index)?);
                }
                Ok(Outcome::Batch(outcomes))
            }
            Command::PutToken { name, record, bootstrap } => {
                use crate::raft::TokenOutcome;
                // A name that is not a token's (the bootstrap marker among them) changes nothing.
                if crate::auth::validate_name(&name).is_err() {
                    return Ok(Outcome::Token(TokenOutcome::NotFound));
                }
                if bootstrap {
                    if self.tokens.get(TOKENS_BOOTSTRAPPED)?.is_some() {
                        return Ok(Outcome::Token(TokenOutcome::AlreadyBootstrapped));
                    }
                    self.tokens.insert(TOKENS_BOOTSTRAPPED, [1u8].as_slice())?;
                } else if self.tokens.get(name.as_str())?.is_some() {
                    return Ok(Outcome::Token(TokenOutcome::Exists));
                }
                self.tokens.insert(name.as_str(), encode(&record)?.as_slice())?;
                Ok(Outcome::Token(TokenOutcome::Created))
            }
            Command::DeleteToken { name } => {
                use crate::raft::TokenOutcome;
                if name == TOKENS_BOOTSTRAPPED || self.tokens.remove(name.as_str())?.is_none() {
                    return Ok(Outcome::Token(TokenOutcome::NotFound));
                }
                Ok(Outcome::Token(TokenOutcome::Deleted))
            }
            Command::Tick { ts } => {
                let ts = self.tick_clock(ts);
                let mut aging = Vec::new();
                for row in self.streams.iter()? {
                    let (k, v) = row?;
                    let meta: StreamMeta = decode(v.value())?;
                    if meta.retention.max_age_ms.is_some() && meta.batches > 0 {
                        aging.push((k.value().to_string(), meta));
                    }
                }
                for (name, mut meta) in aging {
                    let before = meta;
                    self.enforce_retention(&name, &mut meta, ts)?;
                    if meta != before {
                        self.put_meta(&name, &meta)?;
                    }
                }
                Ok(Outcome::Nothing)
            }
        }
    }
}

/// Applies `entries` in one transaction and returns one outcome per entry.
///
/// The commit is not fsynced: the Raft log is the durable record. The state machine shares the
/// database with the log, so the next durable log commit (an append, a vote, a purge) persists
/// it too; after a crash the state machine is at an older applied index and openraft re-applies
/// the log from there. Purge is itself a durable commit made after the snapshot it follows, so
/// the log is never purged past what the durable state machine holds.
/// Applies `entries` in one redb transaction. Without fsync unless `durable`: the Raft log is
/// the durable record, and after a crash openraft replays it from the last durable apply.
fn apply_entries(
    store: &Store,
    entries: Vec<Entry>,
    durable: bool,
) -> Result<(Vec<Outcome>, Option<LogId>), StoreError> {
    let mut txn = if durable { store.begin_durable_write()? } else { store.db().begin_write()? };
    if !durable {
        txn.set_durability(redb::Durability::None)?;
    }
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut last = None;
    let retire;
    {
        let mut sm = txn.open_table(SM_META)?;
        let clock_ms: u64 = sm.get(CLOCK_KEY)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
        let next_stream_id: u64 = sm.get(NEXT_STREAM_ID)?.map(|v| decode(v.value())).transpose()?.unwrap_or(0);
        let mut tables = Tables {
            streams: txn.open_table(STREAMS)?,
            tombstones: txn.open_table(TOMBSTONES)?,
            ids: txn.open_table(STREAM_IDS)?,
            index: txn.open_table(BATCH_INDEX)?,
            tokens: txn.open_table(TOKENS)?,
            store,
            clock_ms,
            next_stream_id,
            retire: Vec::new(),
        };
        for entry in entries {
            last = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => Outcome::Nothing,
                EntryPayload::Membership(m) => {
                    let stored = Membership::new(Some(entry.log_id), m);
                    sm.insert("membership", encode(&stored)?.as_slice())?;
                    Outcome::Nothing
                }
                EntryPayload::Normal(cmd) => tables.apply(cmd, entry.log_id.index)?,
            };
            outcomes.push(outcome);
        }
        if let Some(l) = &last {
            sm.insert("last_applied", encode(&Some(*l))?.as_slice())?;
        }
        if tables.clock_ms != clock_ms {
            sm.insert(CLOCK_KEY, encode(&tables.clock_ms)?.as_slice())?;
        }
        if tables.next_stream_id != next_stream_id {
            sm.insert(NEXT_STREAM_ID, encode(&tables.next_stream_id)?.as_slice())?;
        }
        retire = tables.retire;
    }
    match durable {
        true => store.commit_durably(txn)?,
        false => txn.commit()?,
    }
    for (id, keep_from) in retire {
        store.payloads().retire(id, keep_from);
    }
    Ok((outcomes, last))
}

/// Whether applying `entry` is page-cache work only (publishes and blanks), so it may run on
/// the calling task ([`io::on_caller`]) when no durable commit is due.
fn brief_to_apply(entry: &Entry) -> bool {
    fn publish(cmd: &Command) -> bool {
        match cmd {
            Command::Publish { .. } | Command::PublishFrames { .. } => true,
            Command::Batch(cmds) => cmds.iter().all(publish),
            _ => false,
        }
    }
    match &entry.payload {
        EntryPayload::Blank => true,
        EntryPayload::Normal(cmd) => publish(cmd),
        EntryPayload::Membership(_) => false,
    }
}

fn applied_state(store: &Store) -> Result<(Option<LogId>, Membership), StoreError> {
    let txn = store.db().begin_read()?;
    let sm = txn.open_table(SM_META)?;
    let applied = sm.get("last_applied")?.map(|v| decode(v.value())).transpose()?.flatten();
    let membership = sm.get("membership")?.map(|v| decode(v.value())).transpose()?.unwrap_or_default();
    Ok((applied, membership))
}

/// Builds snapshots from a consistent read of the state machine.
pub struct SnapshotBuilder {
    store: Arc<Store>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let store = self.store.clone();
        let built = store.clone();
        let (meta, current) = blocking(move || snapshot::build(&built)).await.map_err(|e| raft_err(e, true))?;
        Ok(Snapshot { meta, snapshot: Box::new(current.into_data(store)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError> {
        let store = self.store.clone();
        blocking(move || applied_state(&store)).await.map_err(|e| raft_err(e, false))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        // Saturating: counters of local bookkeeping that must not panic on any log.
        let bytes = entries.iter().map(crate::raft::entry_payload_bytes).fold(0u64, u64::saturating_add);
        self.undurable.0 = self.undurable.0.saturating_add(entries.len() as u64);
        self.undurable.1 = self.undurable.1.saturating_add(bytes);
        self.store.note_applied_bytes(bytes);
        // A durable commit now and then bounds how much of the log a restart replays; not while
        // the disk is low (`Store::disk_low_flag`): it would write everything since the last.
        let due = self.undurable.0 >= SM_DURABLE_EVERY_ENTRIES || self.undurable.1 >= SM_DURABLE_EVERY_BYTES;
        let durable = due && !self.store.disk_low();
        if durable {
            self.undurable = (0, 0);
        }
        let store = self.store.clone();
        // Publishes applied without a durable commit write redb's pages and the payload
        // segments in the page cache only: a few µs a batch, less than the hand-off to the
        // blocking pool and back. Anything else (a durable commit's fsync, a stream deleted or
        // created, a tick walking every stream) goes to the pool.
        let (outcomes, last) = if !durable && entries.iter().all(brief_to_apply) {
            io::on_caller(move || apply_entries(&store, entries, false)).await
        } else {
            blocking(move || apply_entries(&store, entries, durable)).await
        }
        .map_err(|e| raft_err(e, true))?;
        if let Some(l) = last {
            self.store.set_applied(l.index);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { store: self.store.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        let path = snapshot::receiving_path(self.store.dir());
        let file = blocking(move || {
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)
        })
        .await
        .map_err(|e| raft_err(e.into(), true))?;
        Ok(Box::new(SnapshotFile::from_std(file)))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), StorageError> {
        let file = snapshot.into_synced_std().await.map_err(|e| raft_err(e.into(), true))?;
        let store = self.store.clone();
        let m = meta.clone();
        let counts = blocking(move || -> Result<(u64, u64), StoreError> {
            let counts = snapshot::install(&store, file, &m)?;
            let _ = std::fs::remove_file(snapshot::receiving_path(store.dir()));
            Ok(counts)
        })
        .await
        .map_err(|e| raft_err(e, true))?;
        if let Some(l) = meta.last_log_id {
            self.store.set_applied(l.index);
        }
        metrics::counter!("runnev_snapshots_installed_total", "group" => self.store.group().to_string()).increment(1);
        tracing::info!(snapshot = %meta.snapshot_id, streams = counts.0, batches = counts.1, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let store = self.store.clone();
        let opened = store.clone();
        let current = blocking(move || snapshot::open_current(&opened)).await.map_err(|e| raft_err(e, false))?;
        Ok(current.map(|(meta, current)| Snapshot { meta, snapshot: Box::new(current.into_data(store)) }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, RaftSnapshotBuilder};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::raft::{Command, LogId};

    fn entry(index: u64, cmd: Command) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(cmd) }
    }

    fn publish(stream: &str, seq: Option<u64>, ts: u64, data: &[u8]) -> Command {
        Command::Publish { stream: stream.into(), seq, ts, auto_create: false, data: data.to_vec().into() }
    }

    fn dump(store: &Store) -> Vec<(StreamInfo, Vec<crate::storage::StoredBatch>)> {
        store
            .streams()
            .unwrap()
            .into_iter()
            .map(|i| {
                let b = store.read_batches(&i.name, 0, usize::MAX, usize::MAX).unwrap().unwrap().batches;
                (i, b)
            })
            .collect()
    }

    /// Only publishes (alone, in frames or batched) and blanks are applied on the calling task;
    /// a change of membership, a stream created, deleted or retained anew, a tick walking every
    /// stream, and a batch holding any of them go to the blocking pool.
    #[test]
    fn only_publishes_and_blanks_are_applied_on_the_calling_task() {
        let frames = Command::PublishFrames { stream: "s".into(), seq: None, ts: 1, auto_create: true, frames: vec![] };
        let blank = Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), 1), payload: EntryPayload::Blank };
        let membership = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Membership(openraft::Membership::new(
                vec![std::collections::BTreeSet::from([1])],
                None,
            )),
        };
        assert!(brief_to_apply(&entry(1, publish("s", Some(3), 1, b"x"))));
        assert!(brief_to_apply(&entry(1, frames.clone())));
        assert!(brief_to_apply(&entry(1, Command::Batch(vec![publish("s", None, 1, b"x"), frames.clone()]))));
        assert!(brief_to_apply(&blank));
        assert!(!brief_to_apply(&membership));
        for other in [
            Command::Tick { ts: 1 },
            Command::DeleteStream { name: "s".into() },
            Command::PutStream { name: "s".into(), retention: None, ts: 1 },
            Command::Batch(vec![publish("s", None, 1, b"x"), Command::Tick { ts: 1 }]),
        ] {
            assert!(!brief_to_apply(&entry(1, other.clone())), "{other:?}");
        }
    }

    /// A snapshot built on one state machine and installed on another reproduces every stream,
    /// batch (bytes, ts, log index) and tombstone, and the applied log id (Raft paper §7).
    #[tokio::test]
    async fn snapshot_round_trip_reproduces_the_state() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Store::open(a_dir.path()).unwrap();
        let mut sm_a = StateMachine::new(a.clone());
        let all_bytes: Vec<u8> = (0..=255u8).collect();
        let cmds = vec![
            Command::PutStream {
                name: "kept".into(),
                retention: Some(Retention { max_batches: Some(2), ..Default::default() }),
                ts: 1,
            },
            publish("kept", None, 10, b"one"),
            publish("kept", Some(5), 11, &all_bytes),
            publish("kept", None, 12, b""),
            Command::PutStream { name: "gone".into(), retention: None, ts: 13 },
            publish("gone", None, 14, b"x"),
            Command::DeleteStream { name: "gone".into() },
        ];
        let entries: Vec<Entry> = cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        let outcomes = sm_a.apply(entries).await.unwrap();
        assert_eq!(outcomes[3], Outcome::Published { seq: 6, ts: 12, duplicate: false, index: 4 });

        let snap = sm_a.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let mut bytes = Vec::new();
        let mut file = snap.snapshot;
        file.read_to_end(&mut bytes).await.unwrap();

        let b = Store::open(b_dir.path()).unwrap();
        let mut sm_b = StateMachine::new(b.clone());
        let mut incoming = sm_b.begin_receiving_snapshot().await.unwrap();
        incoming.write_all(&bytes).await.unwrap();
        sm_b.install_snapshot(&snap.meta, incoming).await.unwrap();

        assert_eq!(dump(&a), dump(&b));
        assert_eq!(sm_b.applied_state().await.unwrap().0, snap.meta.last_log_id);
        let kept = b.stream("kept").unwrap().unwrap();
        assert_eq!((kept.first_seq, kept.last_seq, kept.evicted_through, kept.batches), (5, 6, 1, 2));
        // The tombstone travelled too: "gone" comes back after its last seq.
        let again =
            sm_b.apply(vec![entry(8, Command::PutStream { name: "gone".into(), retention: None, ts: 15 })]).await;
        let Outcome::Stream { info, .. } = &again.unwrap()[0] else { panic!("not a stream outcome") };
        assert_eq!((info.meta.last_seq, info.meta.evicted_through, info.meta.first_seq), (1, 1, 2));
        assert_eq!(b.applied_index(), 8);
        // The cluster clock travelled too: an entry stamped before it takes its time.
        let late = sm_b.apply(vec![entry(9, publish("kept", None, 3, b"late"))]).await.unwrap();
        assert_eq!(late[0], Outcome::Published { seq: 7, ts: 15, duplicate: false, index: 9 });
    }

    /// Tokens: the bootstrap token is made once, a taken name is refused, a delete removes, and
    /// a snapshot carries the tokens (salted hashes) and the bootstrap mark to a new replica.
    #[tokio::test]
    async fn tokens_apply_once_and_travel_in_snapshots() {
        use crate::auth::{Grant, Permission, TokenRecord};
        use crate::raft::TokenOutcome;
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Store::open(a_dir.path()).unwrap();
        let mut sm = StateMachine::new(a.clone());
        let admin = vec![Grant { permission: Permission::Admin, streams: "*".into() }];
        let rec = |secret: &str| TokenRecord::new(secret, admin.clone()).unwrap();
        let put = |name: &str, secret: &str, bootstrap| Command::PutToken {
            name: name.into(),
            record: rec(secret),
            bootstrap,
        };
        let cmds = vec![
            put("admin", "first", true),
            put("admin", "second", true),
            put("ci", "c", false),
            put("ci", "other", false),
            put("", "x", false),
            Command::DeleteToken { name: "ci".into() },
            Command::DeleteToken { name: "ci".into() },
            Command::DeleteToken { name: "".into() },
            put("ops", "o", false),
        ];
        let entries: Vec<Entry> = cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        let got: Vec<Outcome> = sm.apply(entries).await.unwrap();
        use TokenOutcome::*;
        let want = [Created, AlreadyBootstrapped, Created, Exists, NotFound, Deleted, NotFound, NotFound, Created];
        assert_eq!(got, want.iter().map(|o| Outcome::Token(*o)).collect::<Vec<_>>());
        let (tokens, bootstrapped) = a.tokens().unwrap();
        assert!(bootstrapped);
        assert_eq!(tokens.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["admin", "ops"]);
        assert!(a.token("admin").unwrap().unwrap().verifies("first"), "the first bootstrap token stays");
        assert_eq!(a.token("").unwrap(), None);

        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let mut bytes = Vec::new();
        let mut file = snap.snapshot;
        file.read_to_end(&mut bytes).await.unwrap();
        assert!(!bytes.windows(5).any(|w| w == b"first"), "a secret in the snapshot");
        let b = Store::open(b_dir.path()).unwrap();
        let mut sm_b = StateMachine::new(b.clone());
        let mut incoming = sm_b.begin_receiving_snapshot().await.unwrap();
        incoming.write_all(&bytes).await.unwrap();
        sm_b.install_snapshot(&snap.meta, incoming).await.unwrap();
        assert_eq!(b.tokens().unwrap(), a.tokens().unwrap());
        let again = sm_b.apply(vec![entry(10, put("admin", "third", true))]).await.unwrap();
        assert_eq!(again, [Outcome::Token(AlreadyBootstrapped)], "the bootstrap mark travelled");
    }

    /// Cluster time is monotonic: an entry proposed with a ts below one already applied takes
    /// the applied one, so a slow leader stamps no batch in the past and its ticks evict
    /// nothing early (the effective ts is the max, computed from the log alone).
    #[tokio::test]
    async fn cluster_time_never_goes_backwards() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let aged = Retention { max_age_ms: Some(100), ..Default::default() };
        let out = sm
            .apply(vec![
                entry(1, Command::PutStream { name: "s".into(), retention: Some(aged), ts: 1_000 }),
                entry(2, publish("s", None, 2_000, b"a")),
                entry(3, publish("s", None, 500, b"b")),
                entry(4, Command::Tick { ts: 0 }),
                entry(5, Command::Batch(vec![publish("s", Some(9), 1_500, b"c"), Command::Tick { ts: 10 }])),
            ])
            .await
            .unwrap();
        assert_eq!(out[1], Outcome::Published { seq: 1, ts: 2_000, duplicate: false, index: 2 });
        assert_eq!(out[2], Outcome::Published { seq: 2, ts: 2_000, duplicate: false, index: 3 });
        let Outcome::Batch(inner) = &out[4] else { panic!("{:?}", out[4]) };
        assert_eq!(inner[0], Outcome::Published { seq: 9, ts: 2_000, duplicate: false, index: 5 });
        assert_eq!(store.stream("s").unwrap().unwrap().batches, 3, "no tick evicted anything early");
        sm.apply(vec![entry(6, Command::Tick { ts: 2_100 })]).await.unwrap();
        assert_eq!(store.stream("s").unwrap().unwrap().batches, 3, "100 ms old is not older than 100 ms");
        sm.apply(vec![entry(7, Command::Tick { ts: 2_101 })]).await.unwrap();
        let m = store.stream("s").unwrap().unwrap();
        assert_eq!((m.batches, m.first_seq, m.evicted_through), (0, 10, 9));
    }

    fn payload_files(dir: &tempfile::TempDir) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(crate::storage::layout::group0(dir.path()).join(crate::storage::layout::PAYLOADS_DIR))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
        v.sort();
        v
    }

    /// [`payload_files`] once the removals the last durable commit handed to the blocking pool
    /// are done ([`crate::storage::payloads::PayloadStore::durable`]): polled until there are
    /// `n`, for at most 5 s.
    async fn payload_files_once(dir: &tempfile::TempDir, n: usize) -> Vec<String> {
        for _ in 0..500 {
            if payload_files(dir).len() == n {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        payload_files(dir)
    }

    /// A payload is written once, to its stream's segment; retention and deletion free disk by
    /// whole segments once the state that dropped their batches is durable (here: the durable
    /// commit before a snapshot), and what is retained reads back byte for byte.
    #[tokio::test]
    async fn retention_and_delete_remove_whole_payload_segments() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        // Four records fill a segment; the fifth starts the next.
        let len = crate::limits::PAYLOAD_SEGMENT_BYTES as usize / 4 - 64;
        let mut cmds = vec![Command::PutStream {
            name: "s".into(),
            retention: Some(Retention { max_batches: Some(6), ..Default::default() }),
            ts: 1,
        }];
        cmds.extend((1..=20u8).map(|i| publish("s", None, 10, &vec![i; len])));
        let entries: Vec<Entry> = cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c)).collect();
        sm.apply(entries).await.unwrap();
        assert_eq!(payload_files(&dir).len(), 5, "retired segments stay until the state is durable");
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        // Batches 15..=20 are retained: segments from seq 13 (13..=16) and 17 (17..=20).
        let files = payload_files_once(&dir, 2).await;
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(files[0].ends_with("-00000000000000000013.seg"), "{files:?}");
        let view = store.read_batches("s", 0, usize::MAX, usize::MAX).unwrap().unwrap();
        assert_eq!(view.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), (15..=20).collect::<Vec<_>>());
        assert!(view.batches.iter().all(|b| b.data == vec![b.seq as u8; len]));
        // A read from the middle of a segment, limited by bytes, starts and stops where asked.
        let some = store.read_batches("s", 16, usize::MAX, len).unwrap().unwrap();
        assert_eq!(some.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), [17]);

        sm.apply([entry(22, Command::DeleteStream { name: "s".into() })]).await.unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let files = payload_files_once(&dir, 0).await;
        assert!(files.is_empty(), "{files:?}");
        // Created again, it continues after its last seq in a segment of a new stream id.
        let cmds = [Command::PutStream { name: "s".into(), retention: None, ts: 30 }, publish("s", None, 31, b"again")];
        sm.apply(cmds.into_iter().enumerate().map(|(i, c)| entry(23 + i as u64, c))).await.unwrap();
        let view = store.read_batches("s", 0, usize::MAX, usize::MAX).unwrap().unwrap();
        assert_eq!(view.batches.iter().map(|b| (b.seq, b.data.as_slice())).collect::<Vec<_>>(), [(21, &b"again"[..])]);
        assert_eq!(payload_files(&dir), ["0000000000000001-00000000000000000021.seg"]);
    }

    /// The whole snapshot a state machine's current snapshot makes, read as openraft reads it
    /// to send it, installed on a fresh store: its dump.
    async fn send_current_to_a_new_node(sm: &mut StateMachine) -> Vec<(StreamInfo, Vec<crate::storage::StoredBatch>)> {
        let snap = sm.get_current_snapshot().await.unwrap().expect("a current snapshot");
        let mut bytes = Vec::new();
        let mut data = snap.snapshot;
        data.read_to_end(&mut bytes).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let other = Store::open(dir.path()).unwrap();
        let mut sm_other = StateMachine::new(other.clone());
        let mut incoming = sm_other.begin_receiving_snapshot().await.unwrap();
        incoming.write_all(&bytes).await.unwrap();
        sm_other.install_snapshot(&snap.meta, incoming).await.unwrap();
        dump(&other)
    }

    /// Issue 15: a snapshot of a state does not rewrite its payloads. The current snapshot is a
    /// manifest of a record per stream; the payload segments it names stay on disk, pinned,
    /// after the state drops them, so the snapshot can still be sent whole; the next snapshot
    /// releases them. A node that installs a snapshot keeps a manifest of its own segments, not
    /// the received file.
    #[tokio::test]
    async fn a_snapshot_names_the_payload_segments_instead_of_copying_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let mut cmds = vec![Command::PutStream { name: "s".into(), retention: None, ts: 1 }];
        cmds.extend((1..=64u64).map(|i| publish("s", None, 1 + i, &vec![i as u8; 16 << 10])));
        cmds.push(Command::PutStream { name: "t".into(), retention: None, ts: 70 });
        cmds.push(publish("t", Some(9), 71, b"tee"));
        sm.apply(cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c))).await.unwrap();
        let before = dump(&store);
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let snapshot_bytes = std::fs::metadata(crate::storage::snapshot::current_path(store.dir())).unwrap().len();
        assert!(snapshot_bytes < 2_048, "a snapshot of 1 MiB of payloads takes {snapshot_bytes} bytes");
        let files = payload_files(&dir);
        assert_eq!(send_current_to_a_new_node(&mut sm).await, before, "sent whole, it reproduces the state");

        // The state drops every payload: the snapshot still names them, so they stay, and it
        // is still sent whole.
        let gone = [Command::DeleteStream { name: "s".into() }, Command::DeleteStream { name: "t".into() }];
        sm.apply(gone.into_iter().enumerate().map(|(i, c)| entry(70 + i as u64, c))).await.unwrap();
        durable_barrier(&store);
        assert_eq!(payload_files(&dir), files, "segments the current snapshot names are kept");
        assert_eq!(send_current_to_a_new_node(&mut sm).await, before);
        // The next snapshot no longer names them: they go.
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let files = payload_files_once(&dir, 0).await;
        assert!(files.is_empty(), "{files:?}");
        assert!(send_current_to_a_new_node(&mut sm).await.is_empty());
    }

    fn durable_barrier(store: &Store) {
        let w = store.begin_durable_write().unwrap();
        w.open_table(crate::storage::SM_META).unwrap().insert("test_barrier", [1u8].as_slice()).unwrap();
        store.commit_durably(w).unwrap();
    }

    /// A state machine found behind its snapshot at start-up (its durable state older than the
    /// manifest's) is restored from the manifest, whose payloads are this node's own segments:
    /// open keeps them (pinned, not cut back to the older state) and restoring reads them.
    #[tokio::test]
    async fn a_state_machine_behind_its_manifest_is_restored_from_its_own_segments() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::storage::layout::group0(dir.path()).join(crate::storage::db_dir::DB_FILE);
        let early = dir.path().join("early.redb");
        let cmds = |from: u64, to: u64| (from..=to).map(|i| entry(i, publish("s", None, i, &[i as u8; 3000])));
        {
            let store = Store::open(dir.path()).unwrap();
            let mut sm = StateMachine::new(store.clone());
            sm.apply([entry(1, Command::PutStream { name: "s".into(), retention: None, ts: 1 })]).await.unwrap();
            sm.apply(cmds(2, 5)).await.unwrap();
            durable_barrier(&store);
        }
        std::fs::copy(&db, &early).unwrap();
        let later = {
            let store = Store::open(dir.path()).unwrap();
            let mut sm = StateMachine::new(store.clone());
            sm.apply(cmds(6, 12)).await.unwrap();
            sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
            dump(&store)
        };
        // The database as it was at log index 5; the manifest and the segments of index 12.
        std::fs::rename(&early, &db).unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.applied_index(), 5);
        assert_eq!(crate::storage::snapshot::restore_state_machine(&store).unwrap(), Some(12));
        assert_eq!(dump(&store), later);
        let mut sm = StateMachine::new(store.clone());
        assert_eq!(send_current_to_a_new_node(&mut sm).await, later);
    }

    /// A data directory of format 2 (payloads inline in the `batches` table) is upgraded at its
    /// first start: its files, at the top of the directory as format 2 kept them, moved into
    /// group 0's directory, marked with the current format, every batch moved to payload
    /// segments, the old table dropped, and every stream reads back as it was and goes on from
    /// there.
    #[tokio::test]
    async fn a_format_2_directory_is_upgraded_at_its_first_start() {
        let dir = tempfile::tempdir().unwrap();
        let before = {
            let store = Store::open(dir.path()).unwrap();
            let mut sm = StateMachine::new(store.clone());
            let all_bytes: Vec<u8> = (0..=255u8).collect();
            let cmds = vec![
                Command::PutStream { name: "a".into(), retention: None, ts: 1 },
                publish("a", None, 2, b"one"),
                publish("a", Some(7), 3, &all_bytes),
                publish("a", None, 4, b""),
                Command::PutStream { name: "b".into(), retention: None, ts: 5 },
                publish("b", None, 6, b"bee"),
                Command::PutStream { name: "empty".into(), retention: None, ts: 7 },
            ];
            sm.apply(cmds.into_iter().enumerate().map(|(i, c)| entry(i as u64 + 1, c))).await.unwrap();
            dump(&store)
        };
        // Rewrite it as a node of format 2 left it: its files at the top of the data directory.
        let group = crate::storage::layout::group0(dir.path());
        for name in [crate::storage::layout::LOG_DIR, super::super::db_dir::DB_FILE] {
            std::fs::rename(group.join(name), dir.path().join(name)).unwrap();
        }
        std::fs::remove_dir_all(&group).unwrap();
        {
            let db = redb::Database::open(dir.path().join(super::super::db_dir::DB_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut old = txn.open_table(super::super::BATCHES).unwrap();
                for (info, batches) in &before {
                    for b in batches {
                        let v = super::super::BatchValue::encode(&info.name, b.seq, b.ts, b.index, &b.data);
                        old.insert((info.name.as_str(), b.seq), v.as_slice()).unwrap();
                    }
                }
                txn.open_table(SM_META).unwrap().remove(NEXT_STREAM_ID).unwrap();
            }
            txn.delete_table(STREAM_IDS).unwrap();
            txn.delete_table(BATCH_INDEX).unwrap();
            txn.commit().unwrap();
        }
        let format_file = dir.path().join(super::super::format::FORMAT_FILE);
        std::fs::write(&format_file, "runnev data format 2\n").unwrap();

        let store = Store::open(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&format_file).unwrap(), "runnev data format 5\n");
        assert!(group.join(super::super::db_dir::DB_FILE).exists() && !dir.path().join("log").exists());
        assert_eq!(dump(&store), before);
        assert_eq!(payload_files(&dir).len(), 2, "one segment per stream with batches");
        {
            let txn = store.db().begin_read().unwrap();
            assert!(matches!(txn.open_table(super::super::BATCHES), Err(redb::TableError::TableDoesNotExist(_))));
        }
        let mut sm = StateMachine::new(store.clone());
        let out = sm.apply([entry(8, publish("a", None, 9, b"next"))]).await.unwrap();
        assert_eq!(out[0], Outcome::Published { seq: 9, ts: 9, duplicate: false, index: 8 });
        let a = store.read_batches("a", 7, 10, usize::MAX).unwrap().unwrap();
        assert_eq!(a.batches.iter().map(|b| b.data.as_slice()).collect::<Vec<_>>(), [&b""[..], b"next"]);
    }

    /// Duplicates are answered from the stored batch, not re-written, and keep the original's
    /// ts and log index (SPEC §2.3, §3 `index`).
    #[tokio::test]
    async fn a_duplicate_answers_with_the_original() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let out = sm
            .apply(vec![
                entry(1, Command::PutStream { name: "s".into(), retention: None, ts: 0 }),
                entry(2, publish("s", Some(7), 100, b"a")),
                entry(3, publish("s", Some(7), 200, b"a")),
                entry(4, publish("s", Some(7), 300, b"b")),
                entry(5, publish("missing", None, 300, b"b")),
            ])
            .await
            .unwrap();
        assert_eq!(out[2], Outcome::Published { seq: 7, ts: 100, duplicate: true, index: 2 });
        assert_eq!(out[3], Outcome::Rejected(crate::stream::PublishRejection::SeqConflict { seq: 7 }));
        assert_eq!(out[4], Outcome::StreamNotFound);
        assert_eq!(store.stream("s").unwrap().unwrap().batches, 1);
    }

    fn frames(stream: &str, seq: Option<u64>, ts: u64, auto_create: bool, payloads: &[&[u8]]) -> Command {
        Command::PublishFrames {
            stream: stream.into(),
            seq,
            ts,
            auto_create,
            frames: payloads.iter().map(|p| bytes::Bytes::copy_from_slice(p)).collect(),
        }
    }

    /// A frames publish (SPEC §6) stores every frame from one entry, with consecutive seqs and
    /// the entry's ts and index; a retry is a duplicate answered from the last frame's original;
    /// a conflict in the middle or a partial duplicate writes nothing.
    #[tokio::test]
    async fn frames_apply_all_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let out = sm
            .apply(vec![
                entry(1, Command::PutStream { name: "s".into(), retention: None, ts: 0 }),
                entry(2, frames("s", None, 100, false, &[b"a", b"b", b"c"])),
                entry(3, frames("s", Some(4), 200, false, &[b"d", b"e"])),
                entry(4, frames("s", Some(1), 300, false, &[b"a", b"b", b"c", b"d", b"e"])),
                entry(5, frames("s", Some(2), 400, false, &[b"b", b"X", b"d"])),
                entry(6, frames("s", Some(4), 500, false, &[b"d", b"e", b"f"])),
                entry(7, frames("missing", None, 600, false, &[b"a"])),
            ])
            .await
            .unwrap();
        let published = |first_seq, last_seq, ts, duplicate, index| Outcome::FramesPublished {
            first_seq,
            last_seq,
            count: last_seq - first_seq + 1,
            ts,
            duplicate,
            index,
        };
        assert_eq!(out[1], published(1, 3, 100, false, 2));
        assert_eq!(out[2], published(4, 5, 200, false, 3));
        // Originals from two entries: ts and index of the last frame's.
        assert_eq!(out[3], published(1, 5, 200, true, 3));
        assert_eq!(
            out[4],
            Outcome::FramesRejected(FramesRejection::Frame {
                frame: 1,
                rejection: PublishRejection::SeqConflict { seq: 3 }
            })
        );
        assert_eq!(
            out[5],
            Outcome::FramesRejected(FramesRejection::PartialDuplicate { first_new: 2, first_new_seq: 6 })
        );
        assert_eq!(out[6], Outcome::StreamNotFound);
        let view = store.read_batches("s", 0, usize::MAX, usize::MAX).unwrap().unwrap();
        let seen: Vec<(u64, u64, u64, &[u8])> =
            view.batches.iter().map(|b| (b.seq, b.ts, b.index, b.data.as_slice())).collect();
        assert_eq!(
            seen,
            vec![
                (1, 100, 2, b"a".as_slice()),
                (2, 100, 2, b"b"),
                (3, 100, 2, b"c"),
                (4, 200, 3, b"d"),
                (5, 200, 3, b"e")
            ]
        );
        assert_eq!(store.stream("s").unwrap().unwrap().last_seq, 5);
    }

    /// Regression: a refused single-batch publish that would have auto-created a deleted stream
    /// (here `seq_evicted`) removed the name's tombstone, so the next publish started again at
    /// seq 1 and reused the deleted stream's seqs. It leaves the tombstone now.
    #[tokio::test]
    async fn a_refused_auto_create_publish_keeps_the_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let publish = |seq: Option<u64>, ts: u64, data: &[u8]| Command::Publish {
            stream: "s".into(),
            seq,
            ts,
            auto_create: true,
            data: bytes::Bytes::copy_from_slice(data),
        };
        let out = sm
            .apply(vec![
                entry(1, Command::PutStream { name: "s".into(), retention: None, ts: 0 }),
                entry(2, publish(None, 1, b"a")),
                entry(3, publish(None, 1, b"b")),
                entry(4, Command::DeleteStream { name: "s".into() }),
                entry(5, publish(Some(1), 2, b"a")),
                entry(6, publish(None, 3, b"c")),
            ])
            .await
            .unwrap();
        assert_eq!(out[4], Outcome::Rejected(PublishRejection::SeqEvicted { seq: 1, evicted_through: 2 }));
        assert_eq!(out[5], Outcome::Published { seq: 3, ts: 3, duplicate: false, index: 6 });
        assert_eq!(store.stream("s").unwrap().unwrap().last_seq, 3);
    }

    /// A refused frames publish that would have auto-created a deleted stream leaves its
    /// tombstone, so the name still continues after the deleted stream's seqs.
    #[tokio::test]
    async fn a_refused_auto_create_keeps_the_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = StateMachine::new(store.clone());
        let out = sm
            .apply(vec![
                entry(1, Command::PutStream { name: "s".into(), retention: None, ts: 0 }),
                entry(2, frames("s", None, 1, false, &[b"a", b"b"])),
                entry(3, Command::DeleteStream { name: "s".into() }),
                entry(4, frames("s", Some(1), 2, true, &[b"a"])),
                entry(5, frames("s", None, 3, true, &[b"c"])),
            ])
            .await
            .unwrap();
        assert_eq!(
            out[3],
            Outcome::FramesRejected(FramesRejection::Frame {
                frame: 0,
                rejection: PublishRejection::SeqEvicted { seq: 1, evicted_through: 2 }
            })
        );
        assert_eq!(
            out[4],
            Outcome::FramesPublished { first_seq: 3, last_seq: 3, count: 1, ts: 3, duplicate: false, index: 5 }
        );
    }
}

/// Property test of the state machine at the limits of seq, log index and ts: any sequence of
/// commands applies without a panic, keeps every stream's invariants and its seqs in
/// `1..=SEQ_MAX`, and never lets a batch's ts go below one applied before it.
#[cfg(test)]
mod properties {
    use openraft::{CommittedLeaderId, EntryPayload};
    use proptest::prelude::*;

    use super::*;
    use crate::stream::SEQ_MAX;

    fn edgy(near: u64) -> impl Strategy<Value = u64> {
        prop_oneof![0..4u64, near.saturating_sub(3)..=near, (u64::MAX - 3)..=u64::MAX, (SEQ_MAX - 2)..=SEQ_MAX]
    }

    fn command() -> impl Strategy<Value = Command> {
        let name = prop_oneof![Just("a".to_string()), Just("b".to_string())];
        let retention = proptest::option::of(
            (proptest::option::of(1..3u64), proptest::option::of(edgy(4).prop_map(|v| v.max(1))))
                .prop_map(|(max_batches, max_age_ms)| Retention { max_batches, max_bytes: None, max_age_ms }),
        );
        prop_oneof![
            4 => (name.clone(), proptest::option::of(edgy(5)), edgy(100), any::<bool>(), 0..3usize).prop_map(
                |(stream, seq, ts, auto_create, len)| Command::Publish { stream, seq, ts, auto_create, data: vec![7; len].into() }
            ),
            1 => (name.clone(), retention, edgy(100)).prop_map(|(name, retention, ts)| Command::PutStream { name, retention, ts }),
            1 => name.clone().prop_map(|name| Command::DeleteStream { name }),
            1 => edgy(100).prop_map(|ts| Command::Tick { ts }),
            2 => (name, proptest::option::of(edgy(5)), edgy(100), any::<bool>(), proptest::collection::vec(0..3usize, 0..4))
                .prop_map(|(stream, seq, ts, auto_create, lens)| Command::PublishFrames {
                    stream,
                    seq,
                    ts,
                    auto_create,
                    frames: lens.into_iter().map(|len| bytes::Bytes::from(vec![7; len])).collect(),
                }),
        ]
    }

    /// Every stream, tombstone and batch (ts, index, bytes).
    fn dump_all(store: &Store) -> String {
        let txn = store.db().begin_read().unwrap();
        let mut out = String::new();
        for table in [STREAMS, TOMBSTONES] {
            for row in txn.open_table(table).unwrap().iter().unwrap() {
                let (k, v) = row.unwrap();
                out.push_str(&format!("{}={:?};", k.value(), v.value()));
            }
        }
        for info in store.streams().unwrap() {
            for b in store.read_batches(&info.name, 0, usize::MAX, usize::MAX).unwrap().unwrap().batches {
                out.push_str(&format!("{}/{}={},{},{:?};", info.name, b.seq, b.ts, b.index, b.data));
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn applying_any_log_keeps_the_state_consistent(
            cmds in proptest::collection::vec(command(), 1..24),
            first_index in edgy(1 << 20),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let mut clock = 0u64;
            for (i, cmd) in cmds.into_iter().enumerate() {
                let index = first_index.saturating_add(i as u64);
                if let Command::Publish { ts, .. }
                | Command::PublishFrames { ts, .. }
                | Command::PutStream { ts, .. }
                | Command::Tick { ts } = &cmd
                {
                    clock = clock.max(*ts);
                }
                let before = dump_all(&store);
                let frames_cmd = matches!(cmd, Command::PublishFrames { .. });
                let entry = Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(cmd) };
                let (outcomes, _) = apply_entries(&store, vec![entry], false).unwrap();
                if let Outcome::Published { ts, duplicate: false, .. } = outcomes[0] {
                    prop_assert_eq!(ts, clock, "a new batch takes the cluster clock");
                }
                match &outcomes[0] {
                    Outcome::FramesPublished { first_seq, last_seq, count, ts, duplicate: false, .. } => {
                        prop_assert_eq!(*ts, clock, "new frames take the cluster clock");
                        prop_assert_eq!(u128::from(*last_seq) + 1 - u128::from(*first_seq), u128::from(*count));
                    }
                    Outcome::FramesPublished { duplicate: true, .. }
                    | Outcome::FramesRejected(_)
                    | Outcome::StreamNotFound
                        if frames_cmd =>
                    {
                        prop_assert_eq!(&dump_all(&store), &before, "a refused or duplicate frames publish changes nothing");
                    }
                    _ => {}
                }
                for info in store.streams().unwrap() {
                    let m = info.meta;
                    prop_assert!(m.is_consistent(), "{}: {m:?}", info.name);
                    prop_assert!(m.last_seq <= SEQ_MAX, "{}: {m:?}", info.name);
                    let view = store.read_batches(&info.name, 0, usize::MAX, usize::MAX).unwrap().unwrap();
                    prop_assert_eq!(view.batches.len() as u64, m.batches);
                    prop_assert!(view.batches.windows(2).all(|w| w[0].ts <= w[1].ts), "ts goes backwards in {}", info.name);
                    prop_assert!(view.batches.iter().all(|b| b.ts <= clock));
                }
            }
        }
    }
}
