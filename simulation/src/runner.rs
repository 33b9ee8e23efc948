//! One run: builds the turmoil world from the plan, steps it, applies the fault schedule
//! between steps, heals everything when the fault phase ends, and hands the history to the
//! checker.
//!
//! Owns: the order of events in simulated time, and everything that needs the `Sim` handle
//! (crashes, restarts, partitions, loss, latency). Must never: read the wall clock or iterate a
//! hashed collection; everything here is ordered by time, then by plan position.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, UNIX_EPOCH};

use crate::disk::{CrashKind, DiskStats, SimDisk};
use crate::history::{History, NodeId};
use crate::invariants::{self, Violation};
use crate::plan::{node_host, Fault, Knobs, Plan, NODES};
use crate::rng::SimRng;
use crate::world::Shared;
use crate::{nodes, workload};

/// Simulated start of every run: 2026-06-01T00:00:00Z (fixed, so `ts` values replay).
pub const EPOCH_SECS: u64 = 1_780_272_000;
/// Simulated time per turmoil step.
pub const TICK_MS: u64 = 1;
/// Capacity of each simulated socket's and listener's queue, in segments or pending
/// connections (turmoil's default is 64, and a full listener queue panics).
pub const TCP_CAPACITY: usize = 16_384;

thread_local! {
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records every panic on this thread (a run lives on one thread) for the checker, then lets
/// the previous hook print it.
fn install_panic_recorder() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = turmoil::sim_elapsed().map(|d| d.as_millis()).unwrap_or(0);
            let _ = PANICS.try_with(|p| p.borrow_mut().push(format!("at {at} ms: {info}")));
            // With RUST_LOG set, this line carries the turmoil host's span (which node).
            tracing::error!(target: "simulation", at_ms = at, "panic: {info}");
            previous(info);
        }));
    });
}

/// Counters of a run, for the report.
#[derive(Debug, Clone, Default)]
pub struct RunStats {
    /// Simulated time the run took, in ms.
    pub sim_ms: u64,
    /// Logical publishes (workload and heal).
    pub publishes: usize,
    /// Publish attempts.
    pub attempts: usize,
    /// Acknowledgements (duplicates included).
    pub acks: usize,
    /// Acknowledgements with `duplicate: true`.
    pub duplicate_acks: usize,
    /// Batches delivered to subscribers.
    pub delivered: usize,
    /// Gaps announced to subscribers.
    pub gaps: usize,
    /// Faults started.
    pub faults: usize,
    /// Disk counters summed over the nodes.
    pub disk: DiskStats,
    /// Raft RPCs duplicated.
    pub rpc_duplicated: u64,
    /// Raft RPCs replayed.
    pub rpc_replayed: u64,
    /// What the second round's fault kinds did.
    pub effects: FaultEffects,
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The knobs.
    pub knobs: Knobs,
    /// Digest of the plan (fault schedule and workload): a pure function of seed and knobs.
    pub plan_digest: u64,
    /// Digest of the whole history.
    pub history_digest: u64,
    /// What the checker found.
    pub violations: Vec<Violation>,
    /// Counters.
    pub stats: RunStats,
    /// The history itself.
    pub history: History,
}

impl RunReport {
    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        replay_command(self.seed, self.knobs)
    }
}

/// The cargo profile flag of this build: `--profile sim` when debug assertions are compiled in
/// (the `sim` profile, or a debug build), `--release` otherwise. A failure that is an assertion
/// (seed 66421: openraft's `purge_upto <= committed`) does not reproduce in `--release`, where the
/// assertion is compiled out, so the replay line must name the profile that found it.
pub fn build_profile_flag() -> &'static str {
    if cfg!(debug_assertions) {
        "--profile sim"
    } else {
        "--release"
    }
}

/// The command that replays seed `seed` with `knobs`, in the profile of this build
/// ([`build_profile_flag`]).
pub fn replay_command(seed: u64, knobs: Knobs) -> String {
    let mut cmd = format!("cargo run -p simulation {} -- --seed {seed}", build_profile_flag());
    if knobs.fault_phase_ms != Knobs::default().fault_phase_ms {
        cmd.push_str(&format!(" --fault-ms {}", knobs.fault_phase_ms));
    }
    if !knobs.swarm {
        cmd.push_str(" --classic");
    }
    if knobs.swarm && !knobs.membership {
        cmd.push_str(" --no-membership");
    }
    if knobs.swarm && knobs.membership && !knobs.deletes {
        cmd.push_str(" --no-deletes");
    }
    if knobs.swarm && knobs.membership && !knobs.wipes {
        cmd.push_str(" --no-wipe");
    }
    if knobs.wipes && knobs.replace_after_ms != Knobs::default().replace_after_ms {
        cmd.push_str(&format!(" --replace-after-ms {}", knobs.replace_after_ms));
    }
    cmd
}

/// A fault as applied, with the leader isolation and clock jump resolved to a node.
#[derive(Debug, Clone, Copy)]
struct Active {
    fault: Fault,
    /// For a mid-write cut (or a snapshot crash): whether it has struck (and the node is down
    /// because of it).
    struck: bool,
    /// A counter's value when the fault started: for a full disk, the writes it had refused;
    /// for a snapshot crash, the snapshot chunks sent to the node.
    mark: u64,
    /// For a snapshot crash: whether its cut is armed.
    armed: bool,
    /// For a bit flip or a wipe: passed without effect (see [`Driver::may_lose_a_disk`]).
    skipped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Start(usize),
    End(usize),
}

/// Applies the plan's faults to the simulation.
struct Driver {
    shared: Arc<Shared>,
    disks: Vec<SimDisk>,
    /// Each node's data directory on the real file system (the snapshot files live there).
    dirs: Vec<PathBuf>,
    rng: SimRng,
    clients: Vec<String>,
    events: BTreeMap<(u64, Event), ()>,
    active: BTreeMap<usize, Active>,
    down: BTreeMap<NodeId, u32>,
    blocked: BTreeSet<(String, String)>,
    loss: BTreeMap<(NodeId, NodeId), u64>,
    latency_max_ms: u64,
    healed: bool,
    faults_started: usize,
    /// Nodes that refused their rotten log, and when their disk is replaced (simulated ms).
    replace_at: BTreeMap<NodeId, u64>,
    /// Nodes whose disk was lost, and the highest log index any other node held then: every
    /// entry committed before the loss is at or below it (it is on a majority, so on another
    /// node), and a lost node counts as caught up once its log reaches it.
    lost_target: BTreeMap<NodeId, u64>,
    /// What the new fault kinds did, for the report and the checker tests.
    pub effects: FaultEffects,
}

/// What the fault kinds of the second round did in a run (a fault may be scheduled and never
/// bite: a snapshot crash with no snapshot sent, a full disk on an idle node).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultEffects {
    /// Writes refused with `ENOSPC`.
    pub full_refusals: u64,
    /// Nodes restarted after a full disk stopped their Raft core.
    pub full_restarts: u64,
    /// Slow fsyncs, and the simulated ms they added.
    pub slow_syncs: u64,
    /// Simulated ms the slow fsyncs added.
    pub slow_ms: u64,
    /// Clock jumps applied (to a node).
    pub clock_jumps: u64,
    /// Snapshot chunks cut.
    pub snapshot_chunks_cut: u64,
    /// Crashes armed by a snapshot chunk that struck.
    pub snapshot_crashes: u64,
    /// Bits flipped in stored logs.
    pub bits_flipped: u64,
    /// Nodes that refused to start on a flipped bit (retired for the rest of the run).
    pub refused_rotten_logs: u64,
    /// Membership changes made (removals and re-additions).
    pub membership_changes: u64,
    /// Workload streams deleted (a delete call that succeeded, or found the stream gone after
    /// an attempt whose answer was lost).
    pub stream_deletes: u64,
    /// Deleted workload streams created again.
    pub stream_recreates: u64,
    /// Publishes refused `409 seq_evicted` (the resends of a deleted stream's seqs after its
    /// creation again, among them).
    pub seq_evicted: u64,
    /// Disks wiped by [`Fault::Wipe`] (the node then restarted empty under its old id).
    pub wipes: u64,
    /// Nodes that refused their rotten log and rejoined on a replaced (empty) disk.
    pub rotten_replaced: u64,
    /// Lost disks (wiped or replaced) seen caught up by a leader during the fault phase.
    pub lost_caught_up: u64,
}

impl Driver {
    fn new(shared: Arc<Shared>, disks: Vec<SimDisk>, dirs: Vec<PathBuf>) -> Self {
        let plan = &shared.plan;
        let mut events = BTreeMap::new();
        for (i, f) in plan.faults.iter().enumerate() {
            events.insert((f.at_ms, Event::Start(i)), ());
            events.insert((f.at_ms + f.duration_ms, Event::End(i)), ());
        }
        Driver {
            rng: SimRng::derive(plan.seed, "driver", 0),
            clients: plan.client_hosts(),
            latency_max_ms: plan.latency_ms.1,
            shared,
            disks,
            dirs,
            events,
            active: BTreeMap::new(),
            down: BTreeMap::new(),
            blocked: BTreeSet::new(),
            loss: BTreeMap::new(),
            healed: false,
            faults_started: 0,
            replace_at: BTreeMap::new(),
            lost_target: BTreeMap::new(),
            effects: FaultEffects::default(),
        }
    }

    fn disk(&self, node: NodeId) -> &SimDisk {
        &self.disks[(node - 1) as usize]
    }

    /// Brings the disks (slow, full), the clocks and the snapshot cuts in line with the active
    /// faults: overlapping faults on one node take the worst value (clock jumps add up).
    fn apply_nodes(&mut self) {
        for node in 1..=NODES {
            let mut slow: Option<(u64, u64)> = None;
            let mut full = false;
            let mut offset = 0i64;
            let mut cut = 0u64;
            let mut out = false;
            for a in self.active.values() {
                match a.fault {
                    Fault::SlowDisk { node: n, min_ms, max_ms } if n == node => {
                        slow = Some(slow.map_or((min_ms, max_ms), |(lo, hi)| (lo.max(min_ms), hi.max(max_ms))));
                    }
                    Fault::DiskFull { node: n } if n == node => full = true,
                    Fault::ClockJump { node: n, offset_ms } if n == node => offset = offset.saturating_add(offset_ms),
                    Fault::SnapshotCut { node: n, per_mille } if n == node => cut = cut.max(per_mille),
                    Fault::Membership { node: n } if n == node => out = true,
                    _ => {}
                }
            }
            let rng = slow.map(|_| self.rng.fork());
            self.disk(node).set_slow(slow.zip(rng).map(|((lo, hi), r)| (lo, hi, r)));
            self.disk(node).set_full(full);
            self.shared.clock_offset_ms[node as usize].store(offset, Ordering::SeqCst);
            self.shared.snapshot_cut_per_mille[node as usize].store(cut, Ordering::SeqCst);
            self.shared.membership_out[node as usize].store(out, Ordering::SeqCst);
        }
        for (i, wanted) in self.shared.delete_wanted.iter().enumerate() {
            let gone = self.active.values().any(|a| a.fault == Fault::DeleteStream { stream: i });
            wanted.store(gone, Ordering::SeqCst);
        }
    }

    /// A node is down (crash, cut): one more reason; crashes it if it was up.
    fn hold_down(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, node: NodeId, kind: CrashKind) {
        let count = self.down.entry(node).or_insert(0);
        *count += 1;
        if *count == 1 {
            self.crash(sim, now, node, kind);
        }
    }

    /// One reason less for `node` to be down; restarts it when none is left.
    fn release(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, node: NodeId) {
        if let Some(count) = self.down.get_mut(&node) {
            *count -= 1;
            if *count == 0 {
                self.down.remove(&node);
                self.restart(sim, now, node);
            }
        }
    }

    /// Restarts `node` on its disk. A node whose log had a bit flipped is first checked as its
    /// start-up would: if the production recovery refuses the log (the checksums caught the
    /// flip and it is not a torn tail), the node would refuse to start; the operator replaces
    /// its disk, and it rejoins empty (`formation::guard_wiped_node` keeps its vote safe).
    fn restart(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, node: NodeId) {
        if self.shared.retired[node as usize].load(Ordering::SeqCst) {
            return;
        }
        if self.shared.rotten[node as usize].swap(false, Ordering::SeqCst) {
            if let Err(e) = crate::inspect::log_holes(self.disk(node)) {
                // Detected, never served: the node is out of service until its disk is
                // replaced (`Knobs::replace_after_ms`; docs/cli.md, "How a node starts": it
                // rejoins empty under its old id, no membership change first), or for good
                // without wipes (the plans before them).
                self.effects.refused_rotten_logs += 1;
                self.shared.retired[node as usize].store(true, Ordering::SeqCst);
                let knobs = self.shared.plan.knobs;
                if knobs.wipes {
                    let at = now + knobs.replace_after_ms;
                    self.replace_at.insert(node, at);
                    self.log(
                        now,
                        format!("n{node} refuses to start on its rotten log ({e}); disk replaced at {at} ms"),
                    );
                } else {
                    self.log(now, format!("n{node} refuses to start on its rotten log ({e}); retired"));
                }
                return;
            }
        }
        self.inspect_before_restart(now, node);
        self.log(now, format!("restart n{node}"));
        sim.bounce(node_host(node));
    }

    /// Deletes everything in `node`'s data dir: the simulated disk's files and the snapshot
    /// files on the real one. The node must be down. From now on its disk is lost until it
    /// shows it was caught up ([`Shared::lost_disk`]).
    fn wipe(&mut self, now: u64, node: NodeId) {
        self.disk(node).wipe();
        self.shared.rotten[node as usize].store(false, Ordering::SeqCst);
        let dir = &self.dirs[(node - 1) as usize];
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                let why = format!("n{node} at {now} ms: its data dir {} could not be wiped: {e}", dir.display());
                self.shared.record(|h| h.node_errors.push(why));
            }
        }
        let target = (1..=NODES)
            .filter(|o| *o != node)
            .filter_map(|o| crate::inspect::last_index(self.disk(o)).ok())
            .max()
            .unwrap_or(0);
        self.lost_target.insert(node, target);
        self.shared.lost_disk[node as usize].store(true, Ordering::SeqCst);
        // Half the wipes restart the node without its own id in `--peers`, as the command that
        // first added it reads (a vote it granted so elected a leader lacking acknowledged
        // batches; found by an operator's trial). A coin of its own: the plan is unchanged.
        let unlisted = SimRng::derive(self.shared.plan.seed, "wipe-unlisted", now ^ node).chance(500);
        if unlisted {
            self.shared.unlisted[node as usize].store(true, Ordering::SeqCst);
        }
        let how =
            if self.shared.unlisted[node as usize].load(Ordering::SeqCst) { ", not in its own --peers" } else { "" };
        self.log(
            now,
            format!("n{node}: disk wiped (data dir deleted); the others held up to index {target}; it restarts{how}"),
        );
    }

    /// Whether `node` may lose its disk now (a wipe, or a flipped bit that makes it refuse its
    /// log): not while another node is outside the voters, retired, rotten, or has a lost disk
    /// not yet caught up. Raft keeps every committed entry only while a majority of the voters
    /// keeps its disk: with two of three disks lost, entries committed on exactly those two are
    /// gone, and a node that lost its disk grants no vote until a leader has caught it up
    /// (`runnev::raft::vote_gate`), so two such nodes, or one and a voter short, leave a
    /// cluster that can never elect a leader again. Neither is a fault the cluster can be
    /// asked to survive; the fault passes without effect. `Err` says why not.
    fn may_lose_a_disk(&self, node: NodeId) -> Result<(), String> {
        may_lose_a_disk(node, |o| {
            let i = o as usize;
            if self.shared.not_voter[i].load(Ordering::SeqCst) {
                Some("outside the voters")
            } else if self.shared.retired[i].load(Ordering::SeqCst) || self.shared.rotten[i].load(Ordering::SeqCst) {
                Some("refusing its rotten log")
            } else if self.shared.lost_disk[i].load(Ordering::SeqCst) {
                Some("catching up on a lost disk")
            } else {
                None
            }
        })
    }

    /// Every 500 ms: a node with a lost disk that is up, whose disk shows it caught up (no
    /// catching-up marker, a vote) and whose log reached what the others held when it lost its
    /// disk ([`Driver::lost_target`]) counts as sound again.
    fn watch_lost_disks(&mut self, now: u64) {
        if !now.is_multiple_of(500) {
            return;
        }
        for node in 1..=NODES {
            if !self.shared.lost_disk[node as usize].load(Ordering::SeqCst)
                || self.down.contains_key(&node)
                || self.shared.retired[node as usize].load(Ordering::SeqCst)
            {
                continue;
            }
            let target = self.lost_target.get(&node).copied().unwrap_or(0);
            let pending = crate::inspect::lost_disk_pending(self.disk(node))
                .and_then(|p| Ok(p || crate::inspect::last_index(self.disk(node))? < target));
            match pending {
                Ok(true) => {}
                Ok(false) => {
                    self.shared.lost_disk[node as usize].store(false, Ordering::SeqCst);
                    self.effects.lost_caught_up += 1;
                    self.log(now, format!("n{node} caught up after losing its disk: it votes again"));
                }
                Err(e) => self.log(now, format!("n{node}: its disk could not be inspected: {e}")),
            }
        }
    }

    /// Replaces the disks of the rotten nodes due by `now` (all of them at the heal), and
    /// restarts those nodes empty.
    fn replace_rotten(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, all: bool) {
        let due: Vec<NodeId> = self.replace_at.iter().filter(|(_, at)| all || **at <= now).map(|(n, _)| *n).collect();
        for node in due {
            self.replace_at.remove(&node);
            self.shared.retired[node as usize].store(false, Ordering::SeqCst);
            self.wipe(now, node);
            self.effects.rotten_replaced += 1;
            if !self.down.contains_key(&node) {
                self.restart(sim, now, node);
            }
        }
    }

    /// Checks the log node `node` will restart on; a hole is recorded as a node error.
    fn inspect_before_restart(&self, now: u64, node: NodeId) {
        match crate::inspect::log_holes(&self.disks[(node - 1) as usize]) {
            Ok(Some((first, last, holes))) if !holes.is_empty() => {
                let why = format!("n{node} at {now} ms restarts on a Raft log ({first}..={last}) with holes {holes:?}");
                self.log(now, why.clone());
                self.shared.record(|h| h.node_errors.push(why));
            }
            Ok(Some((first, last, _))) => self.log(now, format!("n{node} restarts on log {first}..={last}")),
            Ok(None) => self.log(now, format!("n{node} restarts on an empty log")),
            Err(e) => self.log(now, format!("n{node}: its disk could not be inspected: {e}")),
        }
    }

    fn log(&self, now: u64, what: String) {
        tracing::info!(target: "simulation", at_ms = now, "{what}");
        self.shared.record(|h| h.fault_log.push(format!("{now:>7} ms {what}")));
    }

    /// Applies every event due at `now`.
    fn tick(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        if self.healed {
            return;
        }
        self.arm_snapshot_crashes(now);
        self.reap_cuts(sim, now);
        self.watch_lost_disks(now);
        if now >= self.shared.plan.knobs.fault_phase_ms {
            self.heal(sim, now);
            return;
        }
        self.replace_rotten(sim, now, false);
        while let Some((&(at, ev), _)) = self.events.first_key_value() {
            if at > now {
                break;
            }
            self.events.pop_first();
            match ev {
                Event::Start(i) => self.start(sim, now, i),
                Event::End(i) => self.end(sim, now, i),
            }
        }
    }

    fn leader_or_any(&mut self) -> NodeId {
        let seen = self.shared.leader_seen.load(Ordering::SeqCst);
        if seen == 0 {
            self.rng.between(1, NODES)
        } else {
            seen
        }
    }

    fn start(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, i: usize) {
        let mut fault = self.shared.plan.faults[i].fault;
        if fault == Fault::IsolateLeader {
            fault = Fault::Isolate { node: self.leader_or_any() };
        }
        if let Fault::ClockJumpLeader { offset_ms } = fault {
            fault = Fault::ClockJump { node: self.leader_or_any(), offset_ms };
            self.effects.clock_jumps += 1;
        }
        self.faults_started += 1;
        self.log(now, format!("start #{i}: {fault:?}"));
        let mut mark = 0;
        let mut skipped = false;
        match fault {
            Fault::Crash { node, kind } => self.hold_down(sim, now, node, kind),
            Fault::CutMidWrite { node, kind, after_ops } => {
                let rng = self.rng.fork();
                self.disk(node).arm_cut(after_ops, kind, rng);
            }
            Fault::DiskFull { node } => mark = self.disk(node).stats().full_refusals,
            Fault::SnapshotCrash { node, .. } => {
                mark = self.shared.snapshot_chunks_to[node as usize].load(Ordering::SeqCst)
            }
            Fault::BitFlip { node }
                if (1..=NODES).any(|o| o != node && self.shared.not_voter[o as usize].load(Ordering::SeqCst)) =>
            {
                // Two voters, one of which would refuse its log for good, is a cluster without a
                // quorum for good (no membership change can be made without one): not a fault
                // the cluster can be asked to survive. The fault passes without effect.
                self.log(now, format!("n{node}: no bit flipped while another node is outside the voters"));
                skipped = true;
            }
            Fault::BitFlip { node } | Fault::Wipe { node } if self.may_lose_a_disk(node).is_err() => {
                let why = self.may_lose_a_disk(node).err().unwrap_or_default();
                self.log(now, format!("n{node} keeps its disk: {why}"));
                skipped = true;
            }
            Fault::Wipe { node } if self.shared.retired[node as usize].load(Ordering::SeqCst) => {
                self.log(now, format!("n{node} keeps its disk: it awaits its replacement already"));
                skipped = true;
            }
            Fault::Wipe { node } => {
                self.hold_down(sim, now, node, CrashKind::PowerLoss { keep_per_mille: 0 });
                self.wipe(now, node);
                self.effects.wipes += 1;
            }
            Fault::BitFlip { node } => {
                // A power loss, so that what the next incarnation reads is the durable image.
                self.hold_down(sim, now, node, CrashKind::PowerLoss { keep_per_mille: 0 });
                let mut rng = self.rng.fork();
                match self.disk(node).flip_segment_bit(&mut rng) {
                    Some((file, at)) => {
                        self.effects.bits_flipped += 1;
                        self.shared.rotten[node as usize].store(true, Ordering::SeqCst);
                        self.log(now, format!("n{node}: flipped a bit of {file} at byte {at}"));
                    }
                    None => self.log(now, format!("n{node}: no stored log byte to flip")),
                }
            }
            _ => {}
        }
        self.active.insert(i, Active { fault, struck: false, mark, armed: false, skipped });
        self.apply_nodes();
        self.apply_network(sim);
    }

    /// Arms the crash of an active snapshot-crash fault once a snapshot chunk was sent to its
    /// node (the install is under way, or about to be).
    fn arm_snapshot_crashes(&mut self, now: u64) {
        let due: Vec<usize> = self
            .active
            .iter()
            .filter_map(|(i, a)| match a.fault {
                Fault::SnapshotCrash { node, .. }
                    if !a.armed
                        && !self.down.contains_key(&node)
                        && self.shared.snapshot_chunks_to[node as usize].load(Ordering::SeqCst) > a.mark =>
                {
                    Some(*i)
                }
                _ => None,
            })
            .collect();
        for i in due {
            let rng = self.rng.fork();
            let Some(a) = self.active.get_mut(&i) else { continue };
            a.armed = true;
            let Fault::SnapshotCrash { node, kind, after_ops } = a.fault else { continue };
            self.disks[(node - 1) as usize].arm_cut(after_ops, kind, rng);
            self.log(now, format!("n{node} receives a snapshot: crash armed at its disk operation {after_ops}"));
        }
    }

    /// Tears down hosts whose disk was cut mid-write during the last step.
    fn reap_cuts(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        let struck: Vec<usize> = self
            .active
            .iter()
            .filter_map(|(i, a)| match a.fault {
                Fault::CutMidWrite { node, .. } | Fault::SnapshotCrash { node, .. }
                    if !a.struck && self.disks[(node - 1) as usize].take_fired_cut() =>
                {
                    Some(*i)
                }
                _ => None,
            })
            .collect();
        for i in struck {
            let Some(a) = self.active.get_mut(&i) else { continue };
            a.struck = true;
            let (node, kind, after_ops) = match a.fault {
                Fault::CutMidWrite { node, kind, after_ops } => (node, kind, after_ops),
                Fault::SnapshotCrash { node, kind, after_ops } => {
                    self.effects.snapshot_crashes += 1;
                    (node, kind, after_ops)
                }
                _ => continue,
            };
            // The node died inside its last step; what it sent in that step after the cut (say,
            // a 500 for a failed commit) must not arrive: drop its packets still in flight.
            // (Latency is at least one step, so nothing it sent has been delivered yet.)
            let host = node_host(node);
            let others: Vec<String> = (1..=NODES)
                .filter(|n| *n != node)
                .map(node_host)
                .chain(self.clients.iter().cloned())
                .chain(["control".to_string()])
                .collect();
            for o in &others {
                sim.partition_oneway(host.as_str(), o.as_str());
                if !self.blocked.contains(&(host.clone(), o.clone())) {
                    sim.repair_oneway(host.as_str(), o.as_str());
                }
            }
            let count = self.down.entry(node).or_insert(0);
            *count += 1;
            if *count == 1 {
                sim.crash(host);
            }
            self.log(now, format!("crash n{node} mid-write ({kind:?}, at disk operation {after_ops})"));
        }
    }

    fn end(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, i: usize) {
        let Some(a) = self.active.remove(&i) else { return };
        self.log(now, format!("end #{i}"));
        if let Fault::CutMidWrite { node, .. } | Fault::SnapshotCrash { node, .. } = a.fault {
            if !a.struck && self.disks[(node - 1) as usize].disarm_cut() {
                self.log(now, format!("the cut of n{node} never struck"));
            }
        }
        self.apply_nodes();
        match a.fault {
            Fault::BitFlip { .. } | Fault::Wipe { .. } if a.skipped => {}
            Fault::Crash { node, .. } | Fault::BitFlip { node } | Fault::Wipe { node } => self.release(sim, now, node),
            Fault::CutMidWrite { node, .. } | Fault::SnapshotCrash { node, .. } if a.struck => {
                self.release(sim, now, node)
            }
            Fault::DiskFull { node } => {
                let refused = self.disk(node).stats().full_refusals.saturating_sub(a.mark);
                self.effects.full_refusals += refused;
                if refused > 0 && !self.down.contains_key(&node) {
                    // openraft stopped the node's Raft core at the first refused write; the node
                    // answers 503 and fails /healthz until restarted: the supervisor restarts it.
                    self.effects.full_restarts += 1;
                    self.log(now, format!("n{node} was refused {refused} writes: restarted (unhealthy)"));
                    self.crash(sim, now, node, CrashKind::Kill);
                    self.restart(sim, now, node);
                }
            }
            _ => {}
        }
        self.apply_network(sim);
    }

    fn crash(&mut self, sim: &mut turmoil::Sim<'_>, now: u64, node: NodeId, kind: CrashKind) {
        let disk = &self.disks[(node - 1) as usize];
        let dirty = disk.dirty_pages();
        // The disk first, so the dying incarnation's redb cannot flush on its way out.
        disk.crash(kind, &mut self.rng);
        sim.crash(node_host(node));
        self.log(now, format!("crash n{node} ({kind:?}, {dirty} unsynced pages)"));
    }

    /// Brings partitions, loss and latency in line with the active faults.
    fn apply_network(&mut self, sim: &mut turmoil::Sim<'_>) {
        let mut blocked = BTreeSet::new();
        let mut loss: BTreeMap<(NodeId, NodeId), u64> = BTreeMap::new();
        let mut latency = self.shared.plan.latency_ms.1;
        for a in self.active.values() {
            match a.fault {
                Fault::Isolate { node } => {
                    for o in (1..=NODES).filter(|o| *o != node) {
                        blocked.insert((node_host(node), node_host(o)));
                        blocked.insert((node_host(o), node_host(node)));
                    }
                }
                Fault::OneWay { from, to } => {
                    blocked.insert((node_host(from), node_host(to)));
                }
                Fault::ClientCut { client, node } => {
                    let c = self.clients[client].clone();
                    blocked.insert((c.clone(), node_host(node)));
                    blocked.insert((node_host(node), c));
                }
                Fault::Loss { a, b, per_mille } => {
                    let key = (a.min(b), a.max(b));
                    let e = loss.entry(key).or_insert(0);
                    *e = (*e).max(per_mille);
                }
                Fault::Slow { max_latency_ms } => latency = latency.max(max_latency_ms),
                Fault::Crash { .. }
                | Fault::CutMidWrite { .. }
                | Fault::IsolateLeader
                | Fault::SlowDisk { .. }
                | Fault::DiskFull { .. }
                | Fault::ClockJumpLeader { .. }
                | Fault::ClockJump { .. }
                | Fault::SnapshotCut { .. }
                | Fault::SnapshotCrash { .. }
                | Fault::DeleteStream { .. }
                | Fault::BitFlip { .. }
                | Fault::Membership { .. }
                | Fault::Wipe { .. } => {}
            }
        }
        for (from, to) in self.blocked.difference(&blocked) {
            sim.repair_oneway(from.as_str(), to.as_str());
        }
        for (from, to) in blocked.difference(&self.blocked) {
            sim.partition_oneway(from.as_str(), to.as_str());
        }
        self.blocked = blocked;
        for (a, b) in self.loss.keys() {
            if !loss.contains_key(&(*a, *b)) {
                sim.set_link_fail_rate(node_host(*a), node_host(*b), 0.0);
            }
        }
        for ((a, b), per_mille) in &loss {
            sim.set_link_fail_rate(node_host(*a), node_host(*b), *per_mille as f64 / 1000.0);
        }
        self.loss = loss;
        if latency != self.latency_max_ms {
            sim.set_max_message_latency(Duration::from_millis(latency));
            self.latency_max_ms = latency;
        }
    }

    /// Ends every fault: repairs the network, restarts crashed nodes, stops RPC faults.
    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, now: u64) {
        self.healed = true;
        // A full disk that refused writes leaves its node unhealthy: restarted below, with the
        // nodes still down (a rotten log is checked at the restart).
        let full: Vec<(NodeId, u64)> = self
            .active
            .values()
            .filter_map(|a| match a.fault {
                Fault::DiskFull { node } => Some((node, a.mark)),
                _ => None,
            })
            .collect();
        for (node, mark) in full {
            let refused = self.disk(node).stats().full_refusals.saturating_sub(mark);
            self.effects.full_refusals += refused;
            if refused > 0 && !self.down.contains_key(&node) {
                self.effects.full_restarts += 1;
                self.log(now, format!("n{node} was refused {refused} writes: restarted (unhealthy)"));
                self.crash(sim, now, node, CrashKind::Kill);
                self.down.insert(node, 1);
            }
        }
        for d in &self.disks {
            d.disarm_cut();
        }
        self.active.clear();
        self.apply_nodes();
        self.apply_network(sim);
        self.shared.rpc_faults_on.store(false, Ordering::SeqCst);
        for a in 1..=NODES {
            for b in (a + 1)..=NODES {
                sim.repair(node_host(a), node_host(b));
                sim.set_link_fail_rate(node_host(a), node_host(b), 0.0);
            }
        }
        for node in std::mem::take(&mut self.down).into_keys() {
            self.restart(sim, now, node);
        }
        // The rotten nodes still waiting get their new disk now.
        self.replace_rotten(sim, now, true);
        self.log(now, "heal: every fault ended".into());
    }
}

/// Whether `node` may lose its disk, given why each other node cannot afford it
/// (`trouble(o)`: `Some(why)` when node `o` is outside the voters, refusing its log, or
/// catching up on a lost disk): `Err` names the first such node. See
/// `Driver::may_lose_a_disk`.
fn may_lose_a_disk(node: NodeId, trouble: impl Fn(NodeId) -> Option<&'static str>) -> Result<(), String> {
    match (1..=NODES).filter(|o| *o != node).find_map(|o| trouble(o).map(|why| (o, why))) {
        Some((o, why)) => Err(format!("n{o} is {why}")),
        None => Ok(()),
    }
}

/// Wall-clock seconds without simulated progress after which the watchdog declares a livelock
/// (overridden by `SIM_WATCHDOG_SECS`). A turmoil step runs each host until its runtime is idle;
/// a task that loops without ever awaiting a timer or I/O keeps its host busy forever, and
/// simulated time stops.
pub const WATCHDOG_SECS_DEFAULT: u64 = 120;

/// Exit status of a process whose run livelocked.
pub const LIVELOCK_EXIT: i32 = 3;

/// Watches a run from another thread: if simulated time stops advancing, prints the replay
/// command and ends the process (a livelocked thread cannot be stopped any other way). Uses
/// the wall clock, which is fine: it never influences the run, it only ends it.
struct Watchdog {
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn start(seed: u64, knobs: Knobs) -> Watchdog {
        let progress = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let secs =
            std::env::var("SIM_WATCHDOG_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(WATCHDOG_SECS_DEFAULT);
        let (p, d) = (progress.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = (u64::MAX, std::time::Instant::now());
            while !d.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(500));
                let now = p.load(Ordering::SeqCst);
                if now != last.0 {
                    last = (now, std::time::Instant::now());
                } else if last.1.elapsed() >= Duration::from_secs(secs) && !d.load(Ordering::SeqCst) {
                    println!(
                        "seed {seed} LIVELOCK: simulated time stuck at {now} ms for {secs} s of wall time (a task \
                         keeps its host busy without awaiting time or I/O)\n    replay: {}",
                        replay_command(seed, knobs)
                    );
                    std::process::exit(LIVELOCK_EXIT);
                }
            }
        });
        Watchdog { progress, done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Installs the log subscriber, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=simulation=info,runnev=debug`; unset: nothing is logged).
///
/// Installed whether or not `RUST_LOG` is set, so that a replay with logs on follows the same
/// history as the sweep that found the seed: the subscriber creates hash maps as it starts, and
/// std derives each `HashMap`'s keys from a per-thread counter of the ones created before, so
/// with the subscriber present in one run and absent in the other, maps on simulated paths
/// (hyper-util's connection pool) iterate in another order and the run can diverge (seed 40331
/// did; test `a_seed_replays_the_same_with_logs_on`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).without_time().with_writer(std::io::stderr).try_init();
}

/// Runs seed `seed` and checks its history.
pub fn run_seed(seed: u64, knobs: Knobs) -> RunReport {
    install_panic_recorder();
    PANICS.with(|p| p.borrow_mut().clear());
    runnev::storage::io::set_inline_io(true);

    let plan = Plan::generate(seed, knobs);
    let plan_digest = plan.digest();
    let data = tempfile::Builder::new().prefix("runnev-sim-").tempdir().expect("a temporary directory");
    let shared = Shared::new(plan.clone());

    let mut sim = turmoil::Builder::new()
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .simulation_duration(Duration::from_millis(knobs.fault_phase_ms + plan.heal_budget_ms + 60_000))
        .tick_duration(Duration::from_millis(TICK_MS))
        .tcp_capacity(TCP_CAPACITY)
        .min_message_latency(Duration::from_millis(plan.latency_ms.0))
        .max_message_latency(Duration::from_millis(plan.latency_ms.1))
        .rng_seed(seed)
        .build();

    let disks: Vec<SimDisk> = (1..=NODES).map(|_| SimDisk::new()).collect();
    let dirs: Vec<PathBuf> = (1..=NODES).map(|id| data.path().join(format!("n{id}"))).collect();
    for id in 1..=NODES {
        let (disk, dir) = (disks[(id - 1) as usize].clone(), dirs[(id - 1) as usize].clone());
        disk.set_real_dir(dir.clone());
        sim.host(node_host(id), nodes::node_software(shared.clone(), id, disk, dir));
    }
    for p in &plan.publishers {
        sim.client(format!("pub{}", p.id), workload::publisher(shared.clone(), p.id));
    }
    for s in &plan.subscribers {
        sim.client(format!("sub{}", s.id), workload::subscriber(shared.clone(), s.id));
    }
    sim.client("control", workload::control(shared.clone()));

    let mut driver = Driver::new(shared.clone(), disks.clone(), dirs);
    let watchdog = Watchdog::start(seed, knobs);
    let sim_error = loop {
        let now = sim.elapsed().as_millis() as u64;
        watchdog.progress.store(now, Ordering::SeqCst);
        if now.is_multiple_of(5_000) {
            tracing::info!(target: "simulation", at_ms = now, "simulated time");
        }
        driver.tick(&mut sim, now);
        // Under `--cfg tokio_unstable` (.cargo/config.toml) turmoil makes a panic in any host
        // task shut that host's runtime down, and the step panics with it. The panic itself is
        // already recorded (`install_panic_recorder`); end the run and check what happened.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step())) {
            Ok(Ok(true)) => break None,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => break Some(e.to_string()),
            Err(_) => break Some(format!("a host's runtime shut down after a panic at {now} ms")),
        }
    };
    let sim_ms = sim.elapsed().as_millis() as u64;
    drop(sim);
    drop(watchdog);

    let mut history = shared.take_history();
    history.sim_error = sim_error;
    history.panics = PANICS.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let violations = invariants::check(&history);

    let mut stats = RunStats {
        sim_ms,
        publishes: history.publishes.len(),
        faults: driver.faults_started,
        rpc_duplicated: shared.rpc_duplicated.load(Ordering::Relaxed),
        rpc_replayed: shared.rpc_replayed.load(Ordering::Relaxed),
        ..Default::default()
    };
    for p in &history.publishes {
        stats.attempts += p.attempts.len();
        for (_, _, dup, _) in p.acks() {
            stats.acks += 1;
            stats.duplicate_acks += usize::from(dup);
        }
    }
    for s in &history.subscribers {
        for (_, e) in &s.events {
            match e {
                crate::history::Seen::Batch(_) => stats.delivered += 1,
                crate::history::Seen::Gap { .. } => stats.gaps += 1,
                _ => {}
            }
        }
    }
    stats.effects = driver.effects.clone();
    stats.effects.snapshot_chunks_cut = shared.snapshot_chunks_cut.load(Ordering::Relaxed);
    stats.effects.membership_changes = shared.membership_changes.load(Ordering::Relaxed);
    stats.effects.stream_deletes = history.deletions.len() as u64;
    stats.effects.stream_recreates = history.deletions.iter().filter(|d| d.recreated.is_some()).count() as u64;
    stats.effects.seq_evicted = history
        .publishes
        .iter()
        .flat_map(|p| &p.attempts)
        .filter(
            |a| matches!(&a.outcome, crate::history::Outcome::Rejected { status: 409, code } if code == "seq_evicted"),
        )
        .count() as u64;
    for d in &disks {
        let s = d.stats();
        stats.effects.slow_syncs += s.slow_syncs;
        stats.effects.slow_ms += s.slow_ms;
        stats.disk.syncs += s.syncs;
        stats.disk.crashes += s.crashes;
        stats.disk.pages_lost += s.pages_lost;
        stats.disk.pages_torn_in += s.pages_torn_in;
        stats.disk.stale_ops += s.stale_ops;
    }
    RunReport { seed, knobs, plan_digest, history_digest: history.digest(), violations, stats, history }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk is lost only while every other node is a sound voter: never a second lost disk
    /// (two of three lose entries committed on exactly those two), never with a voter short.
    #[test]
    fn a_disk_is_lost_only_while_every_other_node_is_a_sound_voter() {
        assert_eq!(may_lose_a_disk(2, |_| None), Ok(()));
        // Trouble on the node itself does not count: wiping a node that is catching up, or
        // outside the voters, loses no second disk.
        assert_eq!(may_lose_a_disk(2, |o| (o == 2).then_some("catching up on a lost disk")), Ok(()));
        assert_eq!(
            may_lose_a_disk(2, |o| (o == 3).then_some("catching up on a lost disk")),
            Err("n3 is catching up on a lost disk".to_string())
        );
        assert_eq!(
            may_lose_a_disk(3, |o| (o == 1).then_some("outside the voters")),
            Err("n1 is outside the voters".to_string())
        );
        assert!(may_lose_a_disk(1, |o| (o == 2).then_some("refusing its rotten log")).is_err());
    }

    /// The replay line builds with the assertions of the run that printed it: a `sim` (or debug)
    /// build prints `--profile sim`, a release build `--release`.
    #[test]
    fn the_replay_line_names_the_profile_of_the_run() {
        let line = replay_command(66421, Knobs::default());
        let expected = if cfg!(debug_assertions) {
            "cargo run -p simulation --profile sim -- --seed 66421"
        } else {
            "cargo run -p simulation --release -- --seed 66421"
        };
        assert_eq!(line, expected);
    }
}
