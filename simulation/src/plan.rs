//! A run's plan, drawn from its seed alone: the cluster's settings, the workload, the network
//! conditions and the fault schedule.
//!
//! Owns: every decision made before the run starts. The plan is a pure function of the seed and
//! the [`Knobs`], so `--seed S` rebuilds it exactly; the run then only follows it (the one
//! choice left to run time is *which* node is the leader when a leader isolation starts).
//! Must never: draw from anything but [`SimRng`].

use std::fmt;

use crate::disk::CrashKind;
use crate::history::{NodeId, StreamSpec};
use crate::rng::SimRng;

/// Nodes in the simulated cluster.
pub const NODES: u64 = 3;
/// Port every node listens on.
pub const NODE_PORT: u16 = 7000;

/// Host name of node `id`.
pub fn node_host(id: NodeId) -> String {
    format!("n{id}")
}

/// Base URL of node `id`, as clients use it.
pub fn node_url(id: NodeId) -> String {
    format!("http://n{id}:{NODE_PORT}")
}

/// Knobs that size a run (not drawn from the seed; the command line sets them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// Length of the fault phase, in simulated ms: faults and the workload run from the start
    /// until then; the heal phase follows.
    pub fault_phase_ms: u64,
    /// Swarm plans (the default): the seed also draws which fault kinds are on and a larger,
    /// varied workload ([`Plan::generate`]). Off (`--classic`): the plans of the first rounds,
    /// draw for draw, which the regression seeds pinned before the swarm were found with.
    pub swarm: bool,
    /// Let swarm plans draw [`FaultKind::Membership`] (on by default; `--no-membership` turns
    /// it off, to replay a swarm seed as the sweeps before it ran). Drawn from a generator of
    /// its own, so a plan that does not draw it is the same either way.
    pub membership: bool,
    /// Let swarm plans draw [`FaultKind::StreamDelete`] (on by default; `--no-deletes` turns it
    /// off, and so does `--no-membership`: the swarm plans of the sweeps before either was on).
    /// Drawn, with its whole schedule, from a generator of its own, so a plan that does not draw
    /// it is the same either way.
    pub deletes: bool,
    /// Lost disks (on by default; `--no-wipe` turns them off, to replay a swarm seed as the
    /// sweeps before them ran; `--no-membership` too, as the sweeps before membership ran): swarm plans may draw [`FaultKind::Wipe`] (from a generator of
    /// its own, like `membership`), and a node that refuses its rotten log is replaced
    /// ([`Knobs::replace_after_ms`]) instead of retired for the rest of the run.
    pub wipes: bool,
    /// How long after a node refused its rotten log its disk is replaced (wiped) and it
    /// rejoins empty under its old id, in simulated ms (`--replace-after-ms`; the heal phase
    /// replaces it at once if it comes first). Unused without `wipes`.
    pub replace_after_ms: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fault_phase_ms: 30_000,
            swarm: true,
            membership: true,
            deletes: true,
            wipes: true,
            replace_after_ms: 3_000,
        }
    }
}

/// A kind of fault a swarm plan can turn on or off ([`Plan::kinds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// [`Fault::IsolateLeader`] and [`Fault::Isolate`].
    Partition,
    /// [`Fault::OneWay`].
    OneWay,
    /// [`Fault::Crash`].
    Crash,
    /// [`Fault::CutMidWrite`].
    CutMidWrite,
    /// [`Fault::Loss`].
    Loss,
    /// [`Fault::Slow`].
    Slow,
    /// [`Fault::ClientCut`].
    ClientCut,
    /// Duplicated and replayed Raft RPCs ([`Plan::rpc`]).
    RpcDuplication,
    /// [`Fault::SlowDisk`].
    SlowDisk,
    /// [`Fault::DiskFull`].
    DiskFull,
    /// [`Fault::ClockJumpLeader`].
    ClockJump,
    /// [`Fault::SnapshotCut`].
    SnapshotCut,
    /// [`Fault::SnapshotCrash`].
    SnapshotCrash,
    /// [`Fault::BitFlip`].
    BitFlip,
    /// [`Fault::Membership`].
    Membership,
    /// [`Fault::DeleteStream`]: workload streams deleted and created again (scheduled from a
    /// generator of its own, not by weight).
    StreamDelete,
    /// [`Fault::Wipe`].
    Wipe,
}

impl FaultKind {
    /// Every kind, with its weight in a swarm plan's fault draw (out of the enabled kinds'
    /// total); [`FaultKind::RpcDuplication`] is a rate, not a scheduled fault (weight 0), and
    /// [`FaultKind::StreamDelete`] has a schedule of its own (weight 0).
    pub const ALL: [(FaultKind, u64); 17] = [
        (FaultKind::Partition, 25),
        (FaultKind::OneWay, 10),
        (FaultKind::Crash, 12),
        (FaultKind::CutMidWrite, 10),
        (FaultKind::Loss, 15),
        (FaultKind::Slow, 13),
        (FaultKind::ClientCut, 15),
        (FaultKind::RpcDuplication, 0),
        (FaultKind::SlowDisk, 12),
        (FaultKind::DiskFull, 8),
        (FaultKind::ClockJump, 10),
        (FaultKind::SnapshotCut, 10),
        (FaultKind::SnapshotCrash, 8),
        (FaultKind::BitFlip, 5),
        (FaultKind::Membership, 6),
        (FaultKind::StreamDelete, 0),
        (FaultKind::Wipe, 5),
    ];

    /// How many kinds of [`FaultKind::ALL`], from the first, a swarm plan draws from its main
    /// generator: the kinds of the first swarm sweeps. Those after it each have a generator of
    /// their own, so adding one changed no plan that does not draw it.
    pub const FIRST_DRAWN: usize = 14;
}

/// What a fault does while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Cut whichever node is leader when it starts from the other nodes (both ways); clients
    /// still reach it.
    IsolateLeader,
    /// Cut `node` from the other nodes (a 1/2 split).
    Isolate {
        /// The minority node.
        node: NodeId,
    },
    /// Drop everything `from` sends to `to` (the other direction works).
    OneWay {
        /// Sender whose packets are dropped.
        from: NodeId,
        /// Receiver.
        to: NodeId,
    },
    /// Crash `node`; it restarts when the fault ends.
    Crash {
        /// The node.
        node: NodeId,
        /// What its disk keeps.
        kind: CrashKind,
    },
    /// Crash `node` in the middle of its disk's writes: at the `after_ops`-th write, resize or
    /// sync from the start of the fault (a commit cut between its page writes and its fsync).
    /// It restarts when the fault ends (if the cut struck by then; else the cut is disarmed).
    CutMidWrite {
        /// The node.
        node: NodeId,
        /// What its disk keeps.
        kind: CrashKind,
        /// Which disk operation the crash strikes.
        after_ops: u64,
    },
    /// Lose each packet between `a` and `b` with probability `per_mille / 1000` (turmoil breaks
    /// the link, dropping what is in flight; TCP does not retransmit, so connections stall).
    Loss {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
        /// Loss rate, in thousandths.
        per_mille: u64,
    },
    /// Raise every link's maximum latency (jitter up to this many ms).
    Slow {
        /// Maximum latency while it lasts, in ms.
        max_latency_ms: u64,
    },
    /// Cut client host `client` from node `node`, both ways.
    ClientCut {
        /// Index into [`Plan::client_hosts`].
        client: usize,
        /// The node.
        node: NodeId,
    },
    /// `node`'s disk is slow: every fsync (of redb's file or a log segment) takes
    /// `min_ms..=max_ms` of simulated time while it lasts (`SimDisk::set_slow`).
    SlowDisk {
        /// The node.
        node: NodeId,
        /// Shortest fsync, in ms.
        min_ms: u64,
        /// Longest fsync, in ms.
        max_ms: u64,
    },
    /// `node`'s disk is full: every write, resize and fsync fails with `ENOSPC` while it lasts
    /// (`SimDisk::set_full`). openraft stops a node's Raft core on a storage error, and the node
    /// then answers `503` and fails `/healthz`; when space is back, the driver restarts a node
    /// that was refused a write, as the supervisor restarting an unhealthy node does.
    DiskFull {
        /// The node.
        node: NodeId,
    },
    /// Jump the wall clock of whichever node is leader when it starts by `offset_ms`
    /// (backwards when negative), until it ends.
    ClockJumpLeader {
        /// The jump, in ms.
        offset_ms: i64,
    },
    /// [`Fault::ClockJumpLeader`] as applied: `node`'s wall clock reads `offset_ms` off.
    ClockJump {
        /// The node.
        node: NodeId,
        /// The jump, in ms.
        offset_ms: i64,
    },
    /// Interrupt snapshot transfers to `node`: each install-snapshot chunk sent to it is, with
    /// probability `per_mille / 1000`, not sent, and the sender sees the connection cut.
    SnapshotCut {
        /// The receiver.
        node: NodeId,
        /// Chance, in thousandths, that one chunk is cut.
        per_mille: u64,
    },
    /// Crash `node` while it installs a snapshot: once a snapshot chunk is sent to it, a crash
    /// is armed to strike at its disk's `after_ops`-th operation from then (the install's redb
    /// commit, or the appends around it). It restarts when the fault ends.
    SnapshotCrash {
        /// The node.
        node: NodeId,
        /// What its disk keeps.
        kind: CrashKind,
        /// Which disk operation the crash strikes, counted from the first chunk.
        after_ops: u64,
    },
    /// Crash `node` (a power loss), flip one bit of a stored record of its Raft log (any but
    /// the last), restart it when the fault ends. The log's checksums must catch it: the node
    /// refuses to start, and is retired for the rest of the run (`Shared::retired`).
    BitFlip {
        /// The node.
        node: NodeId,
    },
    /// A membership change during the other faults: the control client removes `node` from the
    /// voters (`DELETE /v1/cluster/members/{id}`, joint consensus) when it starts, and adds it
    /// back, as a learner promoted to voter once caught up (`POST /v1/cluster/members`), when it
    /// ends; each call retried until it succeeds (the heal phase first puts every node back).
    /// The node keeps running, and its data, throughout.
    Membership {
        /// The node taken out and put back.
        node: NodeId,
    },
    /// The control client deletes workload stream `stream` (`DELETE /v1/streams/{name}`, after
    /// reading what it holds) when it starts, and creates it again, with its retention
    /// (`PUT /v1/streams/{name}`), when it ends; each call retried until it succeeds (the heal
    /// phase first creates every deleted stream again). Publishers and subscribers carry on
    /// through it: a publish meanwhile is refused `404` and sent again, a subscription waits.
    DeleteStream {
        /// Index into [`Plan::streams`].
        stream: usize,
    },
    /// `node` loses its disk: it crashes, everything in its data dir is deleted (the simulated
    /// disk's files and the snapshot files), and when the fault ends it restarts empty under
    /// its old id, listed in `--peers` as an operator who replaced the disk does, or for half
    /// the wipes (a coin of the driver's) not, as the command that first added a node reads
    /// (docs/cli.md, "How a node starts"; `formation::guard_wiped_node`). Passes without
    /// effect while another node's disk is lost and not caught up, or another node is outside
    /// the voters or retired (the driver says why).
    Wipe {
        /// The node.
        node: NodeId,
    },
}

impl Fault {
    /// The swarm kind this fault belongs to.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::IsolateLeader | Fault::Isolate { .. } => FaultKind::Partition,
            Fault::OneWay { .. } => FaultKind::OneWay,
            Fault::Crash { .. } => FaultKind::Crash,
            Fault::CutMidWrite { .. } => FaultKind::CutMidWrite,
            Fault::Loss { .. } => FaultKind::Loss,
            Fault::Slow { .. } => FaultKind::Slow,
            Fault::ClientCut { .. } => FaultKind::ClientCut,
            Fault::SlowDisk { .. } => FaultKind::SlowDisk,
            Fault::DiskFull { .. } => FaultKind::DiskFull,
            Fault::ClockJumpLeader { .. } | Fault::ClockJump { .. } => FaultKind::ClockJump,
            Fault::SnapshotCut { .. } => FaultKind::SnapshotCut,
            Fault::SnapshotCrash { .. } => FaultKind::SnapshotCrash,
            Fault::BitFlip { .. } => FaultKind::BitFlip,
            Fault::Membership { .. } => FaultKind::Membership,
            Fault::DeleteStream { .. } => FaultKind::StreamDelete,
            Fault::Wipe { .. } => FaultKind::Wipe,
        }
    }
}

/// A fault and when it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledFault {
    /// Start, in simulated ms since the run started.
    pub at_ms: u64,
    /// How long it lasts, in ms (it also ends when the heal phase starts).
    pub duration_ms: u64,
    /// What it does.
    pub fault: Fault,
}

/// Duplicated and replayed Raft RPCs (through `runnev::raft::network::RpcFaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcFaultRates {
    /// Chance, in thousandths, that an RPC is sent twice at once.
    pub duplicate_per_mille: u64,
    /// Chance, in thousandths, that an RPC is sent again later (a stale replay).
    pub replay_per_mille: u64,
    /// Longest replay delay, in ms.
    pub replay_max_ms: u64,
}

/// One publisher of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherSpec {
    /// Its number.
    pub id: usize,
    /// Index into [`Plan::streams`].
    pub stream: usize,
    /// Supplies seqs (idempotent publish) or lets the server assign them.
    pub with_seq: bool,
    /// Longest pause between two publishes, in ms.
    pub pause_max_ms: u64,
    /// Chance, in thousandths, of leaving a hole in its seqs.
    pub hole_per_mille: u64,
    /// Chance, in thousandths, of resending an acknowledged publish on purpose.
    pub resend_per_mille: u64,
    /// Chance, in thousandths, of a read-your-writes probe after an acknowledgement.
    pub read_check_per_mille: u64,
    /// The node order its client tries (the client rotates from the first).
    pub nodes: Vec<NodeId>,
    /// More streams it publishes to, besides `stream` (indexes into [`Plan::streams`]); each
    /// intent picks one of them all. Empty in classic plans.
    pub more_streams: Vec<usize>,
    /// Most batches in one publish: above 1, an intent may send 1 to this many batches as one
    /// frames publish (SPEC §6, `Client::publish_many`). 1 in classic plans.
    pub frames_max: u64,
    /// Chance, in thousandths, that a batch is large: 0.5 MiB up to just under the batch size
    /// limit. 0 in classic plans.
    pub big_per_mille: u64,
}

/// Bytes of a large batch's payload at most: just under the node's limit
/// (`runnev::limits::BATCH_BYTES_DEFAULT`).
pub const BIG_PAYLOAD_MAX: u64 = runnev::limits::BATCH_BYTES_DEFAULT as u64 - 64;

/// The `k`-th thing a publisher does: fixed by (seed, publisher, k), whatever the timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// How far past the previous seq this one is (1 = no hole). Ignored without seq.
    pub seq_step: u64,
    /// The payload, unique in the run.
    pub payload: Vec<u8>,
    /// Pause after it, in ms.
    pub pause_ms: u64,
    /// Resend it once after the acknowledgement.
    pub resend: bool,
    /// Probe read-your-writes on this node after the acknowledgement.
    pub read_check: Option<NodeId>,
    /// Which of the publisher's streams: 0 = [`PublisherSpec::stream`], `i` =
    /// `more_streams[i - 1]`.
    pub stream_slot: usize,
    /// Further batches sent with `payload` in one frames publish, in order (empty: a plain
    /// publish of `payload`).
    pub more_frames: Vec<Vec<u8>>,
}

/// The deterministic sequence of a publisher's intents.
pub struct Intents {
    rng: SimRng,
    spec: PublisherSpec,
    k: u64,
}

impl Iterator for Intents {
    type Item = Intent;

    fn next(&mut self) -> Option<Intent> {
        self.k += 1;
        let r = &mut self.rng;
        let seq_step = if r.chance(self.spec.hole_per_mille) { r.between(2, 6) } else { 1 };
        let payload = payload_of(r, &self.spec, self.k, 0);
        let pause_ms = r.between(10, self.spec.pause_max_ms);
        let resend = r.chance(self.spec.resend_per_mille);
        let read_check = r.chance(self.spec.read_check_per_mille).then(|| r.between(1, NODES));
        // Swarm draws only: a classic spec draws nothing more, so its intents stay as they were.
        let stream_slot = if self.spec.more_streams.is_empty() {
            0
        } else {
            r.below(self.spec.more_streams.len() as u64 + 1) as usize
        };
        let frames = if self.spec.frames_max > 1 && r.chance(300) { r.between(2, self.spec.frames_max) } else { 1 };
        let mut more_frames: Vec<Vec<u8>> = (1..frames).map(|f| payload_of(r, &self.spec, self.k, f)).collect();
        // One frames publish stays within the node's request limit (large batches add up).
        let limit = runnev::limits::APPEND_BYTES_DEFAULT - 64 * 1024;
        while payload.len() + more_frames.iter().map(Vec::len).sum::<usize>() > limit {
            more_frames.pop();
        }
        Some(Intent { seq_step, payload, pause_ms, resend, read_check, stream_slot, more_frames })
    }
}

/// Frame `frame` of intent `k`'s payload: unique in the run (`p<id>:<k>[.<frame>]:`), then
/// random bytes: a few dozen, or, at the spec's rate, a large batch.
fn payload_of(r: &mut SimRng, spec: &PublisherSpec, k: u64, frame: u64) -> Vec<u8> {
    let mut payload =
        if frame == 0 { format!("p{}:{k}:", spec.id) } else { format!("p{}:{k}.{frame}:", spec.id) }.into_bytes();
    let extra = r.below(48) as usize;
    payload.extend(r.bytes(extra));
    if spec.big_per_mille > 0 && r.chance(spec.big_per_mille) {
        let big = r.between(BIG_PAYLOAD_MAX / 2, BIG_PAYLOAD_MAX) as usize;
        payload.resize(big.max(payload.len()), b'.');
    }
    payload
}

/// One subscriber of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberSpec {
    /// Its number.
    pub id: usize,
    /// Index into [`Plan::streams`].
    pub stream: usize,
    /// Pause after each delivery, in ms (slow consumers fall behind retention: gaps).
    pub slow_ms: u64,
    /// Restart its subscription from its cursor every this many ms (0 = never).
    pub restart_every_ms: u64,
    /// The node order its client tries.
    pub nodes: Vec<NodeId>,
    /// When it subscribes (from cursor 0), in simulated ms (or when the workload starts, if
    /// later): late subscribers
    /// read history that retention, snapshots and crashes have been at. 0 in classic plans.
    pub start_ms: u64,
}

/// The whole plan of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The knobs it was drawn with.
    pub knobs: Knobs,
    /// Longest the heal phase may take to converge and serve, in ms.
    pub heal_budget_ms: u64,
    /// `--snapshot-logs` of every node.
    pub snapshot_logs: u64,
    /// `--snapshot-keep-logs` of every node.
    pub snapshot_keep_logs: u64,
    /// Link latency bounds outside `Slow` faults, in ms.
    pub latency_ms: (u64, u64),
    /// Raft RPC duplication and replay, during the fault phase.
    pub rpc: RpcFaultRates,
    /// The workload's streams.
    pub streams: Vec<StreamSpec>,
    /// The publishers.
    pub publishers: Vec<PublisherSpec>,
    /// The subscribers.
    pub subscribers: Vec<SubscriberSpec>,
    /// The faults, by start time.
    pub faults: Vec<ScheduledFault>,
    /// The fault kinds this plan draws from (swarm testing: a seed turns some off, so that rare
    /// combinations get explored; Groce et al., "Swarm Testing", ISSTA 2012).
    pub kinds: Vec<FaultKind>,
}

/// Name of the stream the control client publishes to in the heal phase.
pub const HEAL_STREAM: &str = "heal";

fn node_order(r: &mut SimRng) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = (1..=NODES).collect();
    r.shuffle(&mut v);
    v
}

/// Draws one fault of `kind` on `node` (`other` is another node).
fn draw_fault(r: &mut SimRng, kind: FaultKind, node: NodeId, other: NodeId, client_hosts: usize) -> Fault {
    let crash_kind = |r: &mut SimRng| match r.below(10) {
        0..=3 => CrashKind::Kill,
        4..=7 => CrashKind::PowerLoss { keep_per_mille: 0 },
        _ => CrashKind::PowerLoss { keep_per_mille: r.between(100, 900) },
    };
    match kind {
        FaultKind::Partition if r.chance(600) => Fault::IsolateLeader,
        FaultKind::Partition => Fault::Isolate { node },
        FaultKind::OneWay => Fault::OneWay { from: node, to: other },
        FaultKind::Crash => Fault::Crash { node, kind: crash_kind(r) },
        FaultKind::CutMidWrite => Fault::CutMidWrite { node, kind: crash_kind(r), after_ops: r.between(1, 40) },
        FaultKind::Loss => Fault::Loss { a: node, b: other, per_mille: r.between(5, 150) },
        FaultKind::Slow | FaultKind::RpcDuplication => Fault::Slow { max_latency_ms: r.between(100, 1_500) },
        FaultKind::ClientCut => Fault::ClientCut { client: r.below(client_hosts as u64) as usize, node },
        FaultKind::SlowDisk => {
            let min_ms = r.between(10, 100);
            Fault::SlowDisk { node, min_ms, max_ms: r.between(min_ms, 500) }
        }
        FaultKind::DiskFull => Fault::DiskFull { node },
        FaultKind::ClockJump => {
            // Seconds to minutes, either way.
            let jump = *r.pick(&[1_000, 5_000, 30_000, 120_000, 300_000]);
            let ms = r.between(jump / 2, jump) as i64;
            Fault::ClockJumpLeader { offset_ms: if r.chance(500) { -ms } else { ms } }
        }
        FaultKind::SnapshotCut => Fault::SnapshotCut { node, per_mille: *r.pick(&[200, 500, 1000]) },
        FaultKind::SnapshotCrash => Fault::SnapshotCrash { node, kind: crash_kind(r), after_ops: r.between(1, 6) },
        FaultKind::BitFlip => Fault::BitFlip { node },
        FaultKind::Membership => Fault::Membership { node },
        // Weight 0: drawn by `draw_deletes` from a generator of its own, never here.
        FaultKind::StreamDelete => Fault::DeleteStream { stream: 0 },
        FaultKind::Wipe => Fault::Wipe { node },
    }
}

/// The stream deletions of a swarm plan that has [`FaultKind::StreamDelete`] on, from its own
/// generator `r`: one to four, each of one of the `streams` workload streams, starting 2 s into
/// the fault phase or later and lasting 0.2–5 s (the stream is gone that long), ending before
/// the fault phase does (the heal phase creates again any stream still deleted anyway).
fn draw_deletes(r: &mut SimRng, streams: usize, fault_ms: u64) -> Vec<ScheduledFault> {
    let mut out = Vec::new();
    if fault_ms < 4_000 {
        return out;
    }
    for _ in 0..r.between(1, 4) {
        let at_ms = r.between(2_000, fault_ms - 1_500);
        let duration_ms = r.between(200, 5_000).min(fault_ms - 500 - at_ms);
        let stream = r.below(streams as u64) as usize;
        out.push(ScheduledFault { at_ms, duration_ms, fault: Fault::DeleteStream { stream } });
    }
    out.sort_by_key(|f| f.at_ms);
    out
}

/// A node other than `node`, drawn.
fn other_node(r: &mut SimRng, node: NodeId) -> NodeId {
    let o = r.between(1, NODES - 1);
    if o >= node {
        o + 1
    } else {
        o
    }
}

impl Plan {
    /// Draws the plan of `seed`: a swarm plan ([`Plan::swarm`]) unless `knobs.swarm` is off
    /// ([`Plan::classic`]).
    pub fn generate(seed: u64, knobs: Knobs) -> Plan {
        if knobs.swarm {
            Plan::swarm(seed, knobs)
        } else {
            Plan::classic(seed, knobs)
        }
    }

    /// The plans of the first rounds, draw for draw: one or two `plain-N` streams, `auto-0`,
    /// `ret-0`, one publisher per stream (two on `auto-0` at most), two to four subscribers,
    /// and the network, crash and cut faults. The regression seeds found before the swarm
    /// replay these (`--classic`).
    pub fn classic(seed: u64, knobs: Knobs) -> Plan {
        let mut r = SimRng::derive(seed, "plan", 0);
        let fault_ms = knobs.fault_phase_ms;

        let mut streams = Vec::new();
        let plain = r.between(1, 2);
        for i in 0..plain {
            streams.push(StreamSpec { name: format!("plain-{i}"), max_batches: None });
        }
        streams.push(StreamSpec { name: "auto-0".into(), max_batches: None });
        streams.push(StreamSpec { name: "ret-0".into(), max_batches: Some(r.between(2, 12)) });

        let mut publishers = Vec::new();
        let mut add_pub = |r: &mut SimRng, stream: usize, with_seq: bool| {
            let id = publishers.len();
            publishers.push(PublisherSpec {
                id,
                stream,
                with_seq,
                pause_max_ms: r.between(50, 600),
                hole_per_mille: if with_seq { *r.pick(&[0, 50, 200]) } else { 0 },
                resend_per_mille: if with_seq { r.between(0, 150) } else { 0 },
                read_check_per_mille: r.between(0, 300),
                nodes: node_order(r),
                more_streams: Vec::new(),
                frames_max: 1,
                big_per_mille: 0,
            });
        };
        for i in 0..plain as usize {
            add_pub(&mut r, i, true);
        }
        let auto = plain as usize;
        for _ in 0..r.between(1, 2) {
            add_pub(&mut r, auto, false);
        }
        add_pub(&mut r, auto + 1, true);

        let mut subscribers = Vec::new();
        for id in 0..r.between(2, 4) as usize {
            // The first subscriber follows the retention stream slowly, so gaps happen.
            let (stream, slow_ms) = if id == 0 {
                (auto + 1, r.between(200, 1500))
            } else {
                (r.below(streams.len() as u64) as usize, *r.pick(&[0, 0, 50, 400]))
            };
            let restart_every_ms = *r.pick(&[0, 2_000, 5_000, 11_000]);
            subscribers.push(SubscriberSpec {
                id,
                stream,
                slow_ms,
                restart_every_ms,
                nodes: node_order(&mut r),
                start_ms: 0,
            });
        }

        let client_hosts = publishers.len() + subscribers.len();
        let mut faults = Vec::new();
        let density = r.between(600, 5_000);
        let mut t = r.between(2_500, 6_000);
        while t + 500 < fault_ms {
            let duration_ms = r.between(300, 8_000);
            let node = r.between(1, NODES);
            let other = other_node(&mut r, node);
            let fault = match r.below(100) {
                0..=14 => Fault::IsolateLeader,
                15..=24 => Fault::Isolate { node },
                25..=34 => Fault::OneWay { from: node, to: other },
                35..=56 => {
                    let kind = match r.below(10) {
                        0..=3 => CrashKind::Kill,
                        4..=7 => CrashKind::PowerLoss { keep_per_mille: 0 },
                        _ => CrashKind::PowerLoss { keep_per_mille: r.between(100, 900) },
                    };
                    if r.chance(500) {
                        Fault::CutMidWrite { node, kind, after_ops: r.between(1, 40) }
                    } else {
                        Fault::Crash { node, kind }
                    }
                }
                57..=71 => Fault::Loss { a: node, b: other, per_mille: r.between(5, 150) },
                72..=84 => Fault::Slow { max_latency_ms: r.between(100, 1_500) },
                _ => Fault::ClientCut { client: r.below(client_hosts as u64) as usize, node },
            };
            faults.push(ScheduledFault { at_ms: t, duration_ms, fault });
            t += r.between(100, density);
        }

        let lat_max = r.between(2, 40);
        Plan {
            seed,
            knobs,
            heal_budget_ms: 90_000,
            snapshot_logs: *r.pick(&[20, 50, 200]),
            snapshot_keep_logs: *r.pick(&[0, 5, 20]),
            // At least one step of latency: the driver relies on it to drop what a node sent in
            // the step it died in (see the runner's mid-write cuts).
            latency_ms: (1, lat_max),
            rpc: RpcFaultRates {
                duplicate_per_mille: *r.pick(&[0, 10, 50]),
                replay_per_mille: *r.pick(&[0, 10, 50]),
                replay_max_ms: r.between(50, 5_000),
            },
            streams,
            publishers,
            subscribers,
            faults,
            kinds: FaultKind::ALL.iter().map(|(k, _)| *k).filter(|k| *k <= FaultKind::RpcDuplication).collect(),
        }
    }

    /// A swarm plan: the seed first draws which fault kinds are on (each with probability
    /// one half, at least one), then a workload of its own size — 2 to 24 plain streams, a
    /// server-assigned stream, one or two retention streams, 3 to 10 publishers (some spread
    /// over several streams, some sending frames publishes of up to 8 batches, some large
    /// batches near the size limit), 2 to 6 subscribers (some joining late) — and a fault
    /// schedule drawn from the kinds that are on.
    pub fn swarm(seed: u64, knobs: Knobs) -> Plan {
        let mut r = SimRng::derive(seed, "swarm-plan", 0);
        let fault_ms = knobs.fault_phase_ms;

        // Membership and the kinds after it are drawn from generators of their own, so that
        // adding them changed no plan without them (the seeds pinned before kept their plans).
        let first = &FaultKind::ALL[..FaultKind::FIRST_DRAWN];
        let mut kinds: Vec<FaultKind> = first.iter().map(|(k, _)| *k).filter(|_| r.chance(500)).collect();
        if kinds.iter().all(|k| *k == FaultKind::RpcDuplication) {
            kinds.push(first[r.below(first.len() as u64) as usize].0);
            kinds.retain(|k| *k != FaultKind::RpcDuplication);
        }
        if knobs.membership && SimRng::derive(seed, "swarm-membership", 0).chance(500) {
            kinds.push(FaultKind::Membership);
        }
        if knobs.wipes && SimRng::derive(seed, "swarm-wipe", 0).chance(500) {
            kinds.push(FaultKind::Wipe);
        }

        let mut streams = Vec::new();
        let plain = *r.pick(&[1, 2, 4, 12, 24]);
        for i in 0..plain {
            streams.push(StreamSpec { name: format!("plain-{i}"), max_batches: None });
        }
        let auto = streams.len();
        streams.push(StreamSpec { name: "auto-0".into(), max_batches: None });
        let ret = streams.len();
        for i in 0..r.between(1, 2) {
            streams.push(StreamSpec { name: format!("ret-{i}"), max_batches: Some(r.between(2, 40)) });
        }

        let mut publishers = Vec::new();
        let mut add_pub = |r: &mut SimRng, stream: usize, more_streams: Vec<usize>, with_seq: bool| {
            let id = publishers.len();
            publishers.push(PublisherSpec {
                id,
                stream,
                with_seq,
                pause_max_ms: *r.pick(&[30, 100, 300, 600]),
                hole_per_mille: if with_seq { *r.pick(&[0, 50, 200]) } else { 0 },
                resend_per_mille: if with_seq { r.between(0, 150) } else { 0 },
                read_check_per_mille: r.between(0, 300),
                nodes: node_order(r),
                more_streams,
                frames_max: *r.pick(&[1, 1, 4, 8]),
                big_per_mille: *r.pick(&[0, 0, 0, 5, 20]),
            });
        };
        // Every stream with a seq publisher owns it alone (its seqs are the publisher's); the
        // plain streams are dealt out to up to six publishers.
        let seq_pubs = (plain as usize).min(r.between(1, 6) as usize);
        for p in 0..seq_pubs {
            let mine: Vec<usize> = (0..plain as usize).filter(|s| s % seq_pubs == p).collect();
            add_pub(&mut r, mine[0], mine[1..].to_vec(), true);
        }
        for _ in 0..r.between(1, 2) {
            add_pub(&mut r, auto, Vec::new(), false);
        }
        for i in ret..streams.len() {
            add_pub(&mut r, i, Vec::new(), true);
        }
        // A frames publish with more batches than a stream keeps evicts its own first batches,
        // and its resend is then rightly refused `409 seq_evicted`: keep within the retention.
        for p in &mut publishers {
            if let Some(max) = streams[p.stream].max_batches {
                p.frames_max = p.frames_max.min(max);
            }
        }

        let mut subscribers = Vec::new();
        for id in 0..r.between(2, 6) as usize {
            let (stream, slow_ms) = if id == 0 {
                (ret, r.between(200, 1500))
            } else {
                (r.below(streams.len() as u64) as usize, *r.pick(&[0, 0, 50, 400]))
            };
            let restart_every_ms = *r.pick(&[0, 2_000, 5_000, 11_000]);
            let start_ms = if id > 0 && r.chance(300) { r.between(1_000, fault_ms) } else { 0 };
            subscribers.push(SubscriberSpec {
                id,
                stream,
                slow_ms,
                restart_every_ms,
                nodes: node_order(&mut r),
                start_ms,
            });
        }

        let client_hosts = publishers.len() + subscribers.len();
        let weights: Vec<(FaultKind, u64)> =
            FaultKind::ALL.iter().copied().filter(|(k, w)| *w > 0 && kinds.contains(k)).collect();
        let total: u64 = weights.iter().map(|(_, w)| w).sum();
        let mut faults = Vec::new();
        let density = r.between(600, 5_000);
        let mut t = r.between(2_500, 6_000);
        while total > 0 && t + 500 < fault_ms {
            let duration_ms = r.between(300, 8_000);
            let node = r.between(1, NODES);
            let other = other_node(&mut r, node);
            let mut pick = r.below(total);
            let kind = weights
                .iter()
                .find(|(_, w)| {
                    let hit = pick < *w;
                    pick = pick.saturating_sub(*w);
                    hit
                })
                .map(|(k, _)| *k)
                .expect("pick < total");
            // One rotten disk per run: the node that refuses its log is retired for the rest of
            // the run, and a second one would leave no majority.
            let kind = if kind == FaultKind::BitFlip && faults.iter().any(|f: &ScheduledFault| f.fault.kind() == kind) {
                FaultKind::Crash
            } else {
                kind
            };
            let fault = draw_fault(&mut r, kind, node, other, client_hosts);
            faults.push(ScheduledFault { at_ms: t, duration_ms, fault });
            t += r.between(100, density);
        }

        let lat_max = r.between(2, 40);
        let dup = kinds.contains(&FaultKind::RpcDuplication);
        let snapshot_logs = *r.pick(&[20, 50, 200]);
        let snapshot_keep_logs = *r.pick(&[0, 5, 20]);
        let rpc = RpcFaultRates {
            duplicate_per_mille: if dup { *r.pick(&[10, 50]) } else { 0 },
            replay_per_mille: if dup { *r.pick(&[0, 10, 50]) } else { 0 },
            replay_max_ms: r.between(50, 5_000),
        };
        if knobs.deletes && knobs.membership {
            let mut d = SimRng::derive(seed, "swarm-deletes", 0);
            if d.chance(500) {
                kinds.push(FaultKind::StreamDelete);
                for f in draw_deletes(&mut d, streams.len(), fault_ms) {
                    // After every fault that starts at the same time: the others' order stays.
                    let at = faults.partition_point(|x: &ScheduledFault| x.at_ms <= f.at_ms);
                    faults.insert(at, f);
                }
            }
        }
        Plan {
            seed,
            knobs,
            heal_budget_ms: 90_000,
            snapshot_logs,
            snapshot_keep_logs,
            latency_ms: (1, lat_max),
            rpc,
            streams,
            publishers,
            subscribers,
            faults,
            kinds,
        }
    }

    /// The simulated hosts that run clients, in order: publishers `pub0…`, then subscribers
    /// `sub0…` (the control client is not partitioned and is not listed).
    pub fn client_hosts(&self) -> Vec<String> {
        let mut v: Vec<String> = self.publishers.iter().map(|p| format!("pub{}", p.id)).collect();
        v.extend(self.subscribers.iter().map(|s| format!("sub{}", s.id)));
        v
    }

    /// The intents of publisher `id`.
    pub fn intents(&self, id: usize) -> Intents {
        Intents { rng: SimRng::derive(self.seed, "publisher", id as u64), spec: self.publishers[id].clone(), k: 0 }
    }

    /// A digest of the plan: the same seed and knobs always give the same digest.
    pub fn digest(&self) -> u64 {
        crate::history::fnv(format!("{self:?}").as_bytes())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} (fault phase {} ms, {} plan)",
            self.seed,
            self.knobs.fault_phase_ms,
            if self.knobs.swarm { "swarm" } else { "classic" }
        )?;
        writeln!(f, "  fault kinds on: {:?}", self.kinds)?;
        writeln!(
            f,
            "  snapshot every {} logs, keep {}; latency {}..{} ms; rpc dup {}‰ replay {}‰ (≤ {} ms)",
            self.snapshot_logs,
            self.snapshot_keep_logs,
            self.latency_ms.0,
            self.latency_ms.1,
            self.rpc.duplicate_per_mille,
            self.rpc.replay_per_mille,
            self.rpc.replay_max_ms
        )?;
        for s in &self.streams {
            writeln!(f, "  stream {} max_batches {:?}", s.name, s.max_batches)?;
        }
        for p in &self.publishers {
            writeln!(
                f,
                "  pub{} → {}{} seq {} pause ≤{} ms holes {}‰ resends {}‰ read checks {}‰ frames ≤{} large {}‰ nodes {:?}",
                p.id,
                self.streams[p.stream].name,
                if p.more_streams.is_empty() { String::new() } else { format!(" (+{} streams)", p.more_streams.len()) },
                p.with_seq,
                p.pause_max_ms,
                p.hole_per_mille,
                p.resend_per_mille,
                p.read_check_per_mille,
                p.frames_max,
                p.big_per_mille,
                p.nodes
            )?;
        }
        for s in &self.subscribers {
            writeln!(
                f,
                "  sub{} ← {} from {} ms slow {} ms restart every {} ms nodes {:?}",
                s.id, self.streams[s.stream].name, s.start_ms, s.slow_ms, s.restart_every_ms, s.nodes
            )?;
        }
        for x in &self.faults {
            writeln!(f, "  at {:>6} ms for {:>5} ms: {:?}", x.at_ms, x.duration_ms, x.fault)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_draws_the_same_plan_and_intents() {
        let a = Plan::generate(42, Knobs::default());
        let b = Plan::generate(42, Knobs::default());
        assert_eq!(a, b);
        assert_ne!(a, Plan::generate(43, Knobs::default()));
        let ia: Vec<Intent> = a.intents(0).take(50).collect();
        let ib: Vec<Intent> = b.intents(0).take(50).collect();
        assert_eq!(ia, ib);
        assert!(!a.faults.is_empty());
        assert!(a.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    }

    /// Stream deletions are drawn from a generator of their own: a swarm plan without them is the
    /// plan the seed drew before they existed (`--no-deletes`), a plan with them only adds its
    /// `DeleteStream` faults (and the kind), `--no-membership` plans never have them, and about
    /// half the swarm plans do.
    #[test]
    fn stream_deletes_leave_every_other_draw_of_a_plan_as_it_was() {
        let off = Knobs { deletes: false, ..Knobs::default() };
        let mut with = 0;
        for seed in 1..=300 {
            let mut plan = Plan::generate(seed, Knobs::default());
            let before = Plan::generate(seed, off);
            assert!(!before.kinds.contains(&FaultKind::StreamDelete));
            let no_membership = Plan::generate(seed, Knobs { membership: false, ..Knobs::default() });
            assert!(!no_membership.kinds.contains(&FaultKind::StreamDelete), "seed {seed}");
            assert!(no_membership.faults.iter().all(|f| f.fault.kind() != FaultKind::StreamDelete));
            let deletes = plan.faults.iter().filter(|f| f.fault.kind() == FaultKind::StreamDelete).count();
            assert_eq!(deletes > 0, plan.kinds.contains(&FaultKind::StreamDelete), "seed {seed}");
            with += usize::from(deletes > 0);
            for f in plan.faults.iter().filter(|f| f.fault.kind() == FaultKind::StreamDelete) {
                let Fault::DeleteStream { stream } = f.fault else { unreachable!() };
                assert!(stream < plan.streams.len() && f.at_ms + f.duration_ms < plan.knobs.fault_phase_ms);
            }
            assert!(plan.faults.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "seed {seed}: faults by start time");
            plan.faults.retain(|f| f.fault.kind() != FaultKind::StreamDelete);
            plan.kinds.retain(|k| *k != FaultKind::StreamDelete);
            plan.knobs = off;
            assert_eq!(plan, before, "seed {seed}");
        }
        assert!((100..=200).contains(&with), "{with} of 300 swarm plans delete streams");
    }

    /// Wipes are drawn from a generator of their own: a plan that does not draw them is the same
    /// with them off (`--no-wipe`), and one that does schedules some.
    #[test]
    fn wipes_change_no_plan_that_does_not_draw_them() {
        let off = Knobs { wipes: false, ..Knobs::default() };
        let (mut without, mut with) = (0, 0);
        for seed in 1..=60 {
            let a = Plan::generate(seed, Knobs::default());
            let b = Plan::generate(seed, off);
            assert!(!b.kinds.contains(&FaultKind::Wipe));
            if a.kinds.contains(&FaultKind::Wipe) {
                with += usize::from(a.faults.iter().any(|f| matches!(f.fault, Fault::Wipe { .. })));
            } else {
                without += 1;
                assert_eq!((&a.faults, &a.kinds, &a.streams), (&b.faults, &b.kinds, &b.streams), "seed {seed}");
                assert_eq!((&a.publishers, &a.subscribers, a.rpc), (&b.publishers, &b.subscribers, b.rpc));
            }
        }
        assert!(without > 10 && with > 10, "{without} plans without wipes, {with} with");
    }

    #[test]
    fn payloads_are_unique_per_publisher() {
        let p = Plan::generate(5, Knobs::default());
        let mut seen = std::collections::BTreeSet::new();
        for id in 0..p.publishers.len() {
            for i in p.intents(id).take(200) {
                assert!(seen.insert(i.payload));
            }
        }
    }
}
