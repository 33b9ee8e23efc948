//! Every bound Runnev enforces, in one place, each with its unit in the name.
//!
//! Owns: the numbers. Must never: hold logic; a limit lives here so a reader can audit them together.

use std::time::Duration;

/// Longest stream name, in characters (SPEC §1).
pub const STREAM_NAME_CHARS_MAX: usize = 128;

/// Default largest batch payload, in bytes (SPEC §1; `--max-batch-bytes`).
pub const BATCH_BYTES_DEFAULT: usize = 1024 * 1024;

/// Largest `--max-batch-bytes` accepted, in bytes: a batch must fit one snapshot record and,
/// with a full proposal, one Raft RPC.
pub const BATCH_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Content type of a publish body that carries many batches as frames (SPEC §6).
pub const FRAMES_CONTENT_TYPE: &str = "application/vnd.runnev.frames";

/// Bytes of one frame's header: its payload length, a `u32` big-endian (SPEC §6).
pub const FRAME_HEADER_BYTES: usize = 4;

/// Most frames (batches) one frames publish may carry (SPEC §6: 1 to 10 000).
pub const FRAMES_PER_APPEND_MAX: usize = 10_000;

/// Default largest body of a frames publish, in bytes, frame headers included (SPEC §6
/// `max_append_bytes`; `--max-append-bytes`).
///
/// A frames publish is one log entry, and an entry travels whole in one append RPC, which
/// openraft 0.9 gives [`RAFT_HEARTBEAT_MS`] as its deadline (see [`RAFT_APPEND_BYTES_MAX`]): a
/// follower must receive, write and fsync the largest request within it, or the entry is resent
/// until it does. 8 MiB does on local SSDs; on a slower disk, lower `--max-append-bytes` (as
/// `--max-batch-bytes`, whose largest batch is an entry too).
pub const APPEND_BYTES_DEFAULT: usize = 8 * 1024 * 1024;

/// Largest `--max-append-bytes` accepted, in bytes: a whole frames publish, with a full proposal
/// beside it, fits one Raft RPC (its log entry is replicated whole), and each of its frames is a
/// batch, which fits one snapshot record.
pub const APPEND_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Bytes a log entry adds per frame of a frames publish (postcard's length of each payload, at
/// most 10 bytes for a u64, rounded up), counted when sizing entries.
pub const FRAME_ENTRY_FRAMING_BYTES: usize = 16;

/// Bytes of a request body over its limit that a node still reads, and drops, before it answers
/// `413 payload_too_large`: the client, which is still sending, then reads the answer instead of
/// a connection reset in the middle of its write (the staged close of RFC 9112 §9.6). A body
/// declared or found larger than this is answered at once and its connection closed.
pub const DISCARD_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Largest body accepted by `PUT /v1/streams/{name}` (a retention document), in bytes.
pub const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;

/// Default and largest `limit` of `GET …/batches`, in batches (SPEC §3).
pub const READ_BATCHES_DEFAULT: usize = 100;
/// See [`READ_BATCHES_DEFAULT`].
pub const READ_BATCHES_MAX: usize = 10_000;

/// Soft cap on the payload bytes one read answer carries; at least one batch is always returned,
/// so a consumer makes progress whatever the batch size. Keeps a read's memory bounded.
pub const READ_ANSWER_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Largest `wait_ms` of a long-poll read, in ms (SPEC §3).
pub const READ_WAIT_MS_MAX: u64 = 60_000;

/// How long a read with `min_index` waits for this node to apply that log index, in ms (SPEC §3).
pub const MIN_INDEX_WAIT_MS: u64 = 10_000;

/// How long a write waits for a leader to be known (or reachable) before `503 no_leader`, in ms.
pub const LEADER_WAIT_MS: u64 = 5_000;

/// `Retry-After` sent with `503 no_leader`, in seconds (RFC 9110 §10.2.3).
pub const RETRY_AFTER_SECS: u64 = 1;

/// How many times a write may be forwarded between nodes before it stops hopping.
pub const FORWARD_HOPS_MAX: u32 = 2;

/// Deadline of one forwarded client request, in ms.
pub const FORWARD_TIMEOUT_MS: u64 = 30_000;

/// Largest body of a Raft RPC between nodes, in bytes: `RAFT_ENTRIES_PER_APPEND_MAX` batches of
/// at most the batch limit, plus framing. Checked before decoding.
pub const RAFT_RPC_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Most log entries in one append-entries RPC (openraft `max_payload_entries`); fewer when
/// batches are large, so an RPC stays under [`RAFT_RPC_BYTES_MAX`].
pub const RAFT_ENTRIES_PER_APPEND_MAX: u64 = 64;

/// Payload bytes past which the transport sends only a prefix of an append-entries RPC's
/// entries (at least one) and reports a partial success (openraft's `PartialSuccess`). openraft
/// 0.9 gives every append the heartbeat interval as its deadline, so an append must be written
/// and fsynced by the follower well within [`RAFT_HEARTBEAT_MS`]; a lagging follower that got
/// 64 large entries at once would time out, forever.
pub const RAFT_APPEND_BYTES_MAX: u64 = 2 * 1024 * 1024;

/// Raft heartbeat interval, in ms (Raft paper §5.2).
pub const RAFT_HEARTBEAT_MS: u64 = 100;
/// Election timeout range, in ms (Raft paper §5.2: randomised to split votes rarely).
///
/// openraft 0.9 adds a leader lease of the maximum on top: a follower that knew a leader waits
/// `max + random(min..max)` after its last heartbeat (600–800 ms here) before it stands, and
/// refuses votes for `max` after one; its election tick runs every 1.5 heartbeats. That is most
/// of the `kill -9` → next acknowledged publish window (BENCHMARKS.md); `max + min` stays six
/// heartbeats, so a loaded node does not call needless elections.
pub const RAFT_ELECTION_TIMEOUT_MIN_MS: u64 = 200;
/// See [`RAFT_ELECTION_TIMEOUT_MIN_MS`].
pub const RAFT_ELECTION_TIMEOUT_MAX_MS: u64 = 400;

/// Default number of applied log entries between two snapshots (`--snapshot-logs`).
pub const SNAPSHOT_LOGS_DEFAULT: u64 = 5_000;
/// Default number of log entries kept behind a snapshot when purging (`--snapshot-keep-logs`),
/// so a follower slightly behind catches up from the log rather than a whole snapshot.
pub const SNAPSHOT_KEEP_LOGS_DEFAULT: u64 = 1_000;
/// How long a free-space measurement stands for a write far from the line
/// ([`crate::disk::DiskGuard::refusal`]), in ms.
pub const DISK_RECHECK_MS: u64 = 250;
/// How far above `--min-free-disk-bytes` (plus nothing of the ballast) the last measurement must
/// be for a write to reuse it, in bytes: more than a node writes in [`DISK_RECHECK_MS`] at any
/// rate measured here (about 400 MB/s of payload and log together).
pub const DISK_RECHECK_MARGIN_BYTES: u64 = 256 << 20;

/// Default payload bytes applied since the last snapshot that make the next one due
/// (`--snapshot-log-bytes`), whatever the entry count: the log the snapshot lets the node purge
/// holds about as many bytes, so this bounds the log's share of the disk when batches are large
/// (5,000 entries of 1 MiB would be 5 GiB of log). A snapshot costs a record per stream (data
/// format 4), so frequent ones are cheap.
pub const SNAPSHOT_LOG_BYTES_DEFAULT: u64 = 64 << 20;
/// Largest snapshot chunk sent in one install-snapshot RPC, in bytes (Raft paper §7).
pub const SNAPSHOT_CHUNK_BYTES: u64 = 1024 * 1024;

/// Period at which the leader proposes a clock tick while any stream has `max_age_ms`, in ms
/// (SPEC §2.7: idle streams age out too).
pub const RETENTION_TICK_MS: u64 = 1_000;

/// Default bound on how far a node's wall clock may be from the median of the voters' clocks, in
/// ms (`--max-clock-offset-ms`); past it the node does not lead ([`crate::clock`]).
pub const MAX_CLOCK_OFFSET_MS_DEFAULT: u64 = 500;
/// Smallest `--max-clock-offset-ms` accepted, in ms: twice the largest measurement error
/// (half of [`CLOCK_PROBE_RTT_MAX_MS`]), so measurement noise alone never puts a clock out.
pub const MAX_CLOCK_OFFSET_MS_MIN: u64 = CLOCK_PROBE_RTT_MAX_MS;
/// Interval at which every node measures the other members' wall clocks, in ms.
pub const CLOCK_PROBE_MS: u64 = 1_000;
/// Longest a connection may take to open (TCP handshake, and TLS when dialed with it), in ms,
/// for clients and nodes alike ([`crate::net::DialConnector`]). A host that is down answers
/// nothing (no reset), and the OS would keep retrying the handshake for minutes; past this the
/// dial fails as a connection error, which means nothing was sent, so even a publish without
/// seq moves on to the next node. Two seconds covers one SYN retransmission (Linux's first is
/// after 1 s) and stays below the client's request timeouts. Found by the simulation (a node
/// retired for good made every seq-less publish that tried it first end "outcome unknown").
pub const DIAL_TIMEOUT_MS: u64 = 2_000;
/// Largest round trip of a clock measurement kept, in ms (its error is at most half of it); also
/// the deadline of one measurement.
pub const CLOCK_PROBE_RTT_MAX_MS: u64 = 200;
/// Age past which a clock measurement counts as unknown, in ms.
pub const CLOCK_SAMPLE_FRESH_MS: u64 = 5_000;
/// How long a leader that has not yet measured a majority's clocks waits to, before answering a
/// write `503 not_ready`, in ms.
pub const CLOCK_VERIFY_WAIT_MS: u64 = 3_000;
/// Least interval between two warnings that this node's clock is out of bounds, in ms.
pub const CLOCK_WARN_EVERY_MS: u64 = 10_000;

/// Most often a node logs that it refused Raft RPCs of another protocol version, ms.
pub const PROTOCOL_WARN_EVERY_MS: u64 = 10_000;

/// Interval between probes of the peers while a fresh node waits to form the cluster, in ms.
pub const FORMATION_PROBE_MS: u64 = 300;

/// Interval between the probes a node that hears from no leader sends the other nodes of its
/// membership, to learn whether it was removed ([`crate::raft::removal`]), in ms.
pub const REMOVAL_PROBE_MS: u64 = 2_000;

/// Interval of `: ping` keep-alive comments on a subscription, in ms (SPEC §4: at most 15 s).
pub const SUBSCRIBE_KEEPALIVE_MS: u64 = 10_000;

/// How long a node may go without hearing from a leader (a follower: an accepted append or
/// snapshot RPC; a leader: a quorum's acknowledgement) before it counts as cut off, in ms: then
/// its subscriptions end with an `unavailable` event and new ones get `503 not_ready`, so clients
/// fail over (SPEC §4); a leader's writes are refused `503 no_leader` and its `/readyz` answers
/// `leader without a quorum`. Five election timeouts: a normal election (lease, timeout, one vote
/// round) fits well within it, so a leader change does not end subscriptions.
pub const LEADER_SILENCE_MAX_MS: u64 = 2_000;

/// How often an open subscription checks that its node still hears from a leader, in ms.
pub const SUBSCRIBE_CONTACT_CHECK_MS: u64 = 500;

/// Batches read from storage per step of a subscription.
pub const SUBSCRIBE_READ_BATCHES: usize = 1_000;

/// Most subscription reads of storage a node runs at once; the others wait their turn. Each read
/// runs on tokio's blocking pool, where every thread keeps its own stack and allocator heap:
/// 1,000 SSE subscriptions woken by each applied entry grew a follower's pool to about 200
/// threads and its memory past 800 MiB (`runnev bench subscribers`, BENCHMARKS.md). A read
/// takes well under a millisecond when the batches are in the page cache.
pub const SUBSCRIBE_READS_CONCURRENT_MAX: usize = 8;

/// Payload bytes the open subscriptions of a node read per step, all together: each reads at
/// most its share (this over the subscriptions open, within [`SUBSCRIBE_READ_BYTES_MIN`] and
/// [`READ_ANSWER_BYTES_MAX`]). A step's events wait in memory until the client's connection takes
/// them, and the next step may be read meanwhile, so this bounds a node's memory for lagging
/// subscribers to about three times it (the events are base64 text, two steps per
/// subscription): 1,000 subscriptions that each read 1,000 batches of 1 KiB a step held over
/// 1.5 GiB on a busy follower (`runnev bench subscribers`, BENCHMARKS.md). One subscription
/// alone still reads [`READ_ANSWER_BYTES_MAX`] a step, as fast catch-up needs.
pub const SUBSCRIBE_READ_BYTES_TOTAL: usize = 128 * 1024 * 1024;

/// Fewest payload bytes a subscription reads per step however many are open (at least one batch
/// is always read).
pub const SUBSCRIBE_READ_BYTES_MIN: usize = 64 * 1024;

/// How long `POST /v1/cluster/members` waits for a new node to catch up before promoting it to
/// voter, in ms; past it the node stays a learner and the answer is `503 not_ready`.
pub const MEMBER_CATCHUP_MS: u64 = 10_000;

/// Period at which a leader checks for a membership change left in a joint config, in ms.
pub const JOINT_REPAIR_MS: u64 = 1_000;

/// How long the leader waits for a proposed entry to commit before answering `503 no_leader`
/// (outcome unknown), in ms.
pub const COMMIT_WAIT_MS: u64 = 10_000;

/// Fewest tokio worker threads a node runs, whatever its CPUs (`TOKIO_WORKER_THREADS`, when
/// set, decides instead). The Raft core writes and fsyncs each log append on its own worker
/// ([`crate::storage::io::on_caller`]); a second worker keeps answering requests meanwhile, and on a
/// one-CPU host lets the CPU work while the disk does.
pub const RUNTIME_WORKERS_MIN: usize = 2;
/// Most commands the leader's proposer packs into one log entry.
pub const PROPOSAL_COMMANDS_MAX: usize = 512;
/// Payload bytes past which the proposer closes a batch (a batch always takes one command),
/// keeping entries well under [`RAFT_RPC_BYTES_MAX`] / [`RAFT_ENTRIES_PER_APPEND_MAX`].
pub const PROPOSAL_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Entries the proposer keeps in flight at once; more requests wait and join the next batch.
/// Two: one entry is replicated while the next is appended on the leader. Each entry costs
/// about 0.9 ms of CPU over the three nodes whatever it carries, so more entries in flight
/// split the same requests into more, smaller entries: against four, two gave 11 % more
/// publishes per second at 64 in flight (7 % less CPU per publish) and the same open-loop p99;
/// one gave 3 % more again, but a third worse open-loop p99, as every stall of the one entry
/// holds every request (BENCHMARKS.md, "Wake-ups per entry").
pub const PROPOSALS_IN_FLIGHT_MAX: usize = 2;

/// How long a subscription to a stream this node does not know waits for it to appear (the node
/// may be behind the stream's creation) before `404 stream_not_found`, in ms.
pub const SUBSCRIBE_STREAM_WAIT_MS: u64 = 2_000;

/// The state machine commits durably (fsync) after this many applied log entries since its last
/// durable commit; in between it commits without fsync, and a restart replays at most this much
/// of the log (storage module doc).
pub const SM_DURABLE_EVERY_ENTRIES: u64 = 1_000;

/// The state machine also commits durably after this many applied payload bytes (whichever of
/// the two limits comes first).
pub const SM_DURABLE_EVERY_BYTES: u64 = 64 * 1024 * 1024;

/// Largest body a node reads back from a forwarded write's leader, in bytes (answers to writes
/// are small JSON documents).
pub const FORWARDED_ANSWER_BYTES_MAX: usize = 1024 * 1024;

/// While a write waits for a leader, how often it looks again even when Raft reports no change,
/// in ms.
pub const LEADER_RECHECK_MS: u64 = 100;

/// Deadline of one probe of a peer (cluster formation's `/v1/cluster`, a membership change's
/// `/healthz`), in ms.
pub const PEER_PROBE_MS: u64 = 1_000;
/// Largest probe answer read from a peer, in bytes.
pub const PEER_PROBE_BYTES_MAX: usize = 1024 * 1024;

/// Deadline of one member's `GET /v1/cluster` asked for `GET /v1/cluster/nodes` (the status
/// page polls it every second), in ms: a member that has not answered by then is shown
/// unreachable.
pub const STATUS_PEER_MS: u64 = 800;

/// How long an idle pooled HTTP connection between nodes (or of a client) is kept, in ms. Below
/// [`HEADER_READ_TIMEOUT_MIN`]: a node closes a connection that has waited that long for a
/// request ([`crate::serve`]), so a pooled connection is dropped by its client first and never
/// reused while the node is closing it (the request would be lost with an unknown outcome).
pub const HTTP_POOL_IDLE_MS: u64 = 4_000;

/// Bytes a log entry adds around its payloads (postcard framing of the entry and its commands),
/// counted when sizing appends so that one entry always fits one Raft RPC.
pub const ENTRY_FRAMING_BYTES: usize = 4096;

/// Largest answer `runnev probe` reads, in bytes.
pub const CLI_PROBE_BYTES_MAX: usize = 64 * 1024;

/// Largest record accepted when reading a snapshot, in bytes: a batch of the largest allowed size
/// plus its key, with room to spare. Guards against a corrupt length.
pub const SNAPSHOT_RECORD_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// The chunk a backup is streamed in, bytes (`GET /v1/backup`); with the 4-chunk channel it
/// bounds the memory of one backup in flight.
pub const BACKUP_CHUNK_BYTES: usize = 256 * 1024;

/// Largest answer body the client reads, in bytes: a read of [`READ_BATCHES_MAX`] batches,
/// base64-encoded.
pub const CLIENT_ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Extra time the client gives a membership change beyond its request timeout, in ms (catch-up
/// and two commits).
pub const CLIENT_MEMBER_CHANGE_EXTRA_MS: u64 = 30_000;

/// The client's default deadline of one HTTP exchange, in ms.
pub const CLIENT_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// The client's default first backoff between attempts, in ms; it doubles up to
/// [`CLIENT_BACKOFF_MAX_MS`].
pub const CLIENT_BACKOFF_MIN_MS: u64 = 50;
/// The client's default largest backoff between attempts, in ms.
pub const CLIENT_BACKOFF_MAX_MS: u64 = 2_000;
/// How long the client keeps retrying a call by default, in ms.
pub const CLIENT_GIVE_UP_MS: u64 = 30_000;
/// How long the client keeps retrying by default while every connection is refused (no node
/// listens), in ms: a few rounds over the nodes (backoff 50, 100, 200, 400 ms between them),
/// so a stopped cluster is reported in about a second rather than after
/// [`CLIENT_GIVE_UP_MS`].
pub const CLIENT_UNREACHABLE_MS: u64 = 1_000;

/// A subscription connection silent (not even a keep-alive) for this long is presumed dead and
/// the client reconnects, in ms: three server keep-alive intervals.
pub const SUBSCRIPTION_IDLE_MS: u64 = 30_000;
/// How often a subscription checks its connection for silence, in ms.
pub const SUBSCRIPTION_IDLE_CHECK_MS: u64 = 5_000;

/// Longest stream name, in bytes (each of its characters is ASCII).
const STREAM_NAME_BYTES_MAX: usize = STREAM_NAME_CHARS_MAX;

// The relations between the limits, checked when the crate compiles.

// A batch of the largest size, with its key, fits one snapshot record.
const _: () = assert!(BATCH_BYTES_MAX + STREAM_NAME_BYTES_MAX + 64 <= SNAPSHOT_RECORD_BYTES_MAX as usize);
// The default frames limit is one a node accepts, and SPEC §6's default of 8 MiB.
const _: () = assert!(APPEND_BYTES_DEFAULT <= APPEND_BYTES_MAX);
const _: () = assert!(APPEND_BYTES_DEFAULT == 8 * 1024 * 1024);
// A full proposal plus the largest frames publish (its payloads and their framing in the
// entry) fits one Raft RPC: its one entry always travels.
const _: () = assert!(
    PROPOSAL_BYTES_MAX + APPEND_BYTES_MAX + FRAMES_PER_APPEND_MAX * FRAME_ENTRY_FRAMING_BYTES + ENTRY_FRAMING_BYTES
        <= RAFT_RPC_BYTES_MAX
);
// A log entry carrying the largest frames publish and a full proposal fits one log record,
// whose length is a u32.
const _: () = assert!(
    PROPOSAL_BYTES_MAX + APPEND_BYTES_MAX + FRAMES_PER_APPEND_MAX * FRAME_ENTRY_FRAMING_BYTES + ENTRY_FRAMING_BYTES
        <= u32::MAX as usize
);
// Every frame's length fits its u32 header, and every frame is at most a batch, which fits one
// snapshot record (asserted below for BATCH_BYTES_MAX).
const _: () = assert!(BATCH_BYTES_MAX <= u32::MAX as usize);
// SPEC §6 allows 1 to 10 000 frames; the count fits the seq arithmetic of any u64.
const _: () = assert!(FRAMES_PER_APPEND_MAX == 10_000);
// The default batch limit is one a node accepts.
const _: () = assert!(BATCH_BYTES_DEFAULT <= BATCH_BYTES_MAX);
// A full proposal plus one batch of the largest size, framed, fits one Raft RPC: an entry
// always travels.
const _: () = assert!(PROPOSAL_BYTES_MAX + BATCH_BYTES_MAX + ENTRY_FRAMING_BYTES <= RAFT_RPC_BYTES_MAX);
// A full proposal is sent whole in one append (the transport cuts appends past the budget).
const _: () = assert!(PROPOSAL_BYTES_MAX as u64 <= RAFT_APPEND_BYTES_MAX);
// A snapshot chunk fits one Raft RPC.
const _: () = assert!(SNAPSHOT_CHUNK_BYTES <= RAFT_RPC_BYTES_MAX as u64);
// SPEC §4: a subscription hears something at least every 15 s.
const _: () = assert!(SUBSCRIBE_KEEPALIVE_MS < 15_000);
// A node counts as cut off only after several election timeouts without a leader (a normal
// election takes one lease plus one timeout), and checks often enough to notice it promptly.
const _: () = assert!(LEADER_SILENCE_MAX_MS >= 3 * RAFT_ELECTION_TIMEOUT_MAX_MS);
const _: () = assert!(SUBSCRIBE_CONTACT_CHECK_MS < LEADER_SILENCE_MAX_MS);
// The client gives up on a cluster that refuses every connection before one that answers.
const _: () = assert!(CLIENT_UNREACHABLE_MS <= CLIENT_GIVE_UP_MS);
// A client presumes a subscription dead only after missing three keep-alives.
const _: () = assert!(SUBSCRIPTION_IDLE_MS >= 3 * SUBSCRIBE_KEEPALIVE_MS);
// Raft paper §5.2, §9: heartbeats come well within the election timeout, whose range is not
// empty.
const _: () = assert!(RAFT_HEARTBEAT_MS < RAFT_ELECTION_TIMEOUT_MIN_MS);
const _: () = assert!(RAFT_ELECTION_TIMEOUT_MIN_MS < RAFT_ELECTION_TIMEOUT_MAX_MS);
// The largest bucket of the proposal histogram is the most commands an entry takes.
const _: () = assert!(PROPOSAL_COMMANDS_BUCKETS[PROPOSAL_COMMANDS_BUCKETS.len() - 1] == PROPOSAL_COMMANDS_MAX as f64);
// The default read size is one the API accepts.
const _: () = assert!(READ_BATCHES_DEFAULT <= READ_BATCHES_MAX);
// The largest read answer (its payload capped at the soft cap or one largest batch, base64,
// plus each batch's JSON) fits what the client reads.
const _: () = {
    let payload = if READ_ANSWER_BYTES_MAX > BATCH_BYTES_MAX { READ_ANSWER_BYTES_MAX } else { BATCH_BYTES_MAX };
    assert!((payload / 3 + 1) * 4 + READ_BATCHES_MAX * 64 <= CLIENT_ANSWER_BYTES_MAX);
};
// A measurement stays fresh over several probe rounds, so a lost probe does not make a node
// unverified; a write waits for at least two rounds before it gives up on verifying.
const _: () = assert!(CLOCK_SAMPLE_FRESH_MS >= 4 * CLOCK_PROBE_MS);
const _: () = assert!(CLOCK_VERIFY_WAIT_MS >= 2 * CLOCK_PROBE_MS);
const _: () = assert!(MAX_CLOCK_OFFSET_MS_MIN <= MAX_CLOCK_OFFSET_MS_DEFAULT);
// The leader gives up on a commit before the node that forwarded the write gives up on it.
const _: () = assert!(LEADER_WAIT_MS + CLOCK_VERIFY_WAIT_MS + COMMIT_WAIT_MS < FORWARD_TIMEOUT_MS);
// A stream name fits a forwarded answer many times over (answers name the stream).
const _: () = assert!(ADMIN_BODY_BYTES_MAX <= FORWARDED_ANSWER_BYTES_MAX);

/// Default `--min-free-disk-bytes`: free bytes below which a node takes no new writes
/// ([`crate::disk`]; at most a quarter of the file system). Room for one full segment of the
/// log ([`crate::storage::segments::SEGMENT_BYTES`]) and the state machine's growth meanwhile.
pub const MIN_FREE_DISK_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// Largest ballast file a node keeps in its data directory to recover from a full disk, in
/// bytes ([`crate::disk`]; at most half of what it keeps free).
pub const DISK_RESERVE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// How often a node measures its data directory's free space even without traffic, in ms
/// ([`crate::disk`]; writes measure it themselves).
pub const DISK_CHECK_MS: u64 = 500;

/// How long a leader takes a follower's "my disk is low" answer as current, in ms: a follower
/// says it on every append answer while low (heartbeats every [`RAFT_HEARTBEAT_MS`]), so an
/// older report means it stopped answering, not that its disk is still low.
pub const PEER_DISK_LOW_FRESH_MS: u64 = 1_000;

/// How often a leader still sends its entries to a follower whose disk is low, in ms; in
/// between it sends heartbeats only (the follower would refuse the entries).
pub const PEER_DISK_LOW_RETRY_MS: u64 = 1_000;

/// How long a node waits, in ms, before it reports an append or snapshot chunk that a live peer
/// refused with an error status (`raft::network`): openraft 0.9 resends at once, so without it a
/// peer that keeps refusing (a certificate that does not fit, not ready) is asked thousands of
/// times a second. One heartbeat interval ([`RAFT_HEARTBEAT_MS`]): a peer that just became
/// ready gets its entries at most that much later.
pub const REFUSED_RPC_PAUSE_MS: u64 = RAFT_HEARTBEAT_MS;

/// Segments of the Raft log start at this size, in bytes, and double up to
/// [`crate::storage::segments::SEGMENT_BYTES`]: a fresh node needs no 64 MiB at once.
pub const SEGMENT_BYTES_MIN: u64 = 1024 * 1024;

/// A stream's payload segment ([`crate::storage::payloads`]) is closed, and the next batch
/// starts a new one, once it holds this many bytes: the granularity at which retention frees
/// disk (a stream keeps up to this much past its retention limit), and nothing is preallocated.
pub const PAYLOAD_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

/// One repeated warning or error line of openraft's replication is logged at most once per
/// call site in this many ms; the rest are counted in `runnev_log_lines_suppressed_total`.
pub const LOG_REPEAT_MS: u64 = 10_000;

/// Bucket bounds of every latency histogram in `/metrics` (the metrics named `…_seconds`), in
/// seconds: from 100 µs (an fsync on a fast disk) to 10 s (a request that waited out its
/// commit), about three per decade.
pub const LATENCY_BUCKETS_SECONDS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Bucket bounds of `runnev_proposal_commands` (commands the leader packed into one log entry):
/// 1 to [`PROPOSAL_COMMANDS_MAX`], about three per decade.
pub const PROPOSAL_COMMANDS_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 512.0];
/// How often a node with `--admin-token-file` checks, until one is applied, whether the
/// cluster's bootstrap admin token must still be proposed, in ms.
pub const BOOTSTRAP_TOKEN_RETRY_MS: u64 = 500;

/// How long a node whose Raft core stopped for good keeps answering `503 not_ready` (and
/// failing `/healthz`, with the reason in `/v1/cluster`) before it stops and `runnev serve`
/// exits with status 1, for its supervisor to restart it on the same data directory: long
/// enough for clients in flight to be told and moved to another node, short against an
/// election timeout's worth of unavailability ([`RAFT_ELECTION_TIMEOUT_MAX_MS`]) repeated.
pub const RAFT_STOPPED_EXIT_AFTER_DEFAULT: Duration = Duration::from_secs(2);

/// Default most connections one node holds open at once (`--max-connections`); past it a new
/// connection is answered `503 overloaded` and closed.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4_096;
/// Default most subscriptions one node serves at once (`--max-subscribers`); past it a new one
/// is answered `503 overloaded`.
pub const SUBSCRIBERS_MAX_DEFAULT: usize = 1_024;

/// Default deadline for a request's head (request line and headers) to arrive, counted from the
/// moment the connection waits for it: after it is accepted (and its TLS handshake done), or
/// after the previous answer on a kept-alive connection (`--header-read-timeout`). Past it the
/// connection is closed without an answer (hyper's `header_read_timeout`; [`crate::serve`]),
/// so a client sending one byte a second, or nothing, does not hold a connection slot. Ten
/// seconds is ample for a head of a few hundred bytes on any link that can carry the service.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Smallest `--header-read-timeout` accepted: above [`HTTP_POOL_IDLE_MS`], with a second to
/// spare, so nodes and clients drop their idle pooled connections before a node cuts them.
pub const HEADER_READ_TIMEOUT_MIN: Duration = Duration::from_millis(HTTP_POOL_IDLE_MS + 1_000);
/// Default deadline for a request's whole body to arrive, counted from the end of its head
/// (`--body-read-timeout`). Past it the request is answered `408 request_timeout` and the
/// connection closed (RFC 9110 §15.5.9; [`crate::api`]). Thirty seconds carries the default
/// largest body, an 8 MiB frames publish ([`APPEND_BYTES_DEFAULT`]), at 280 KB/s; a node that
/// takes larger bodies over slow links needs a longer deadline.
pub const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Smallest `--body-read-timeout` accepted.
pub const BODY_READ_TIMEOUT_MIN: Duration = Duration::from_secs(1);
/// Default most proposals waiting on the leader for a log entry to carry them
/// (`--max-queued-proposals`; [`crate::api::proposer`]); past it a write is answered `503
/// overloaded` and nothing is proposed. Two full entries ([`PROPOSAL_COMMANDS_MAX`]) behind the
/// [`PROPOSALS_IN_FLIGHT_MAX`] in flight: a queued request waits for at most four commits.
pub const PROPOSALS_QUEUED_MAX_DEFAULT: usize = 2 * PROPOSAL_COMMANDS_MAX;

// The client side of a connection gives it up before the node that serves it does.
const _: () = assert!(HTTP_POOL_IDLE_MS < HEADER_READ_TIMEOUT_MIN.as_millis() as u64);
const _: () = assert!(HEADER_READ_TIMEOUT_MIN.as_millis() <= HEADER_READ_TIMEOUT_DEFAULT.as_millis());
const _: () = assert!(BODY_READ_TIMEOUT_MIN.as_millis() <= BODY_READ_TIMEOUT_DEFAULT.as_millis());
