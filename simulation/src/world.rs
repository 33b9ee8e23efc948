//! State shared by the simulated hosts of one run: the plan, the history being recorded, and
//! the few signals the control client and the fault driver exchange.
//!
//! Owns: the recorder and the Raft RPC fault injector. Must never: let a host read another
//! host's private state through it (nodes see only their [`RpcFaults`] injector; clients see
//! the history only to append to it).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runnev::raft::network::{RaftRpc, RpcFault, RpcFaults};
use runnev::raft::NodeId;

use crate::history::History;
use crate::plan::{Plan, RpcFaultRates};
use crate::rng::SimRng;

/// Simulated time since the run started, in ms (0 outside a simulated host).
pub fn now_ms() -> u64 {
    turmoil::sim_elapsed().map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What the hosts of one run share.
pub struct Shared {
    /// The run's plan.
    pub plan: Plan,
    history: Mutex<History>,
    /// The leader the control client last saw (0 = none known); the driver isolates it.
    pub leader_seen: AtomicU64,
    /// Set once the workload's streams exist: publishers and subscribers start.
    pub workload_ready: AtomicBool,
    /// Workload publishers still running.
    pub publishers_active: AtomicUsize,
    /// Set by the control client when subscribers should stop.
    pub stop_subscribers: AtomicBool,
    /// Whether Raft RPC duplication and replay are on (the fault phase only).
    pub rpc_faults_on: Arc<AtomicBool>,
    /// Raft RPCs duplicated so far.
    pub rpc_duplicated: AtomicU64,
    /// Raft RPCs replayed so far.
    pub rpc_replayed: AtomicU64,
    /// Each node's wall-clock offset from simulated time, in ms (clock jumps), by node id
    /// (index 0 unused).
    pub clock_offset_ms: Vec<AtomicI64>,
    /// Chance, in thousandths, that a snapshot chunk sent to a node is cut, by node id.
    pub snapshot_cut_per_mille: Vec<AtomicU64>,
    /// Snapshot chunks sent (or cut) to each node so far, by node id.
    pub snapshot_chunks_to: Vec<AtomicU64>,
    /// Snapshot chunks cut so far.
    pub snapshot_chunks_cut: AtomicU64,
    /// Nodes taken out of service for good, by node id: their log was found corrupt (a flipped
    /// bit) and they refuse to start. They stay down, awaiting a replacement the simulation does
    /// not make (README); the heal phase expects and reads only the others.
    pub retired: Vec<AtomicBool>,
    /// Whether each node should be out of the membership now (an active
    /// [`crate::plan::Fault::Membership`]), by node id; the control client makes it so.
    pub membership_out: Vec<AtomicBool>,
    /// Membership changes the control client completed (removals and re-additions).
    pub membership_changes: AtomicU64,
    /// Nodes outside the voters as the control client last saw them in the leader's view, or
    /// being taken out, by node id: the driver flips no bit on another node meanwhile (two
    /// voters of which one refuses its log for good is a cluster without a quorum for good).
    pub not_voter: Vec<AtomicBool>,
    /// Whether each workload stream should be deleted now (an active
    /// [`crate::plan::Fault::DeleteStream`]), by index into the plan's streams; the control
    /// client makes it so.
    pub delete_wanted: Vec<AtomicBool>,
    /// Nodes whose disk was lost (wiped, or replaced after a rotten log) and that may not have
    /// been caught up yet, by node id (set by the driver, cleared when the node's disk shows it
    /// caught up: `inspect::lost_disk_pending`). The control client takes no node out of the
    /// voters meanwhile.
    pub lost_disk: Vec<AtomicBool>,
    /// Nodes started without their own id in `--peers`, by node id (set by the driver when it
    /// wipes a node and a coin of the wipe says so): an operator who first started the node to
    /// add it (docs/cli.md) starts it so again after its disk is replaced. Kept for the rest of
    /// the run, as that command would be.
    pub unlisted: Vec<AtomicBool>,
    /// Nodes whose log had a bit flipped and that have not restarted on it yet, by node id (set
    /// and cleared by the driver): such a node will refuse its log and lose its disk, so the
    /// control client takes no node out of the voters meanwhile either (simulation seed 6364).
    pub rotten: Vec<AtomicBool>,
}

impl Shared {
    /// Fresh shared state for `plan`.
    pub fn new(plan: Plan) -> Arc<Shared> {
        let history = History {
            seed: plan.seed,
            streams: plan
                .streams
                .iter()
                .cloned()
                .chain(std::iter::once(crate::history::StreamSpec {
                    name: crate::plan::HEAL_STREAM.into(),
                    max_batches: None,
                }))
                .collect(),
            liveness: crate::history::Liveness { heal_started_at_ms: plan.knobs.fault_phase_ms, ..Default::default() },
            ..Default::default()
        };
        let plan_streams = plan.streams.clone();
        Arc::new(Shared {
            publishers_active: AtomicUsize::new(plan.publishers.len()),
            plan,
            history: Mutex::new(history),
            leader_seen: AtomicU64::new(0),
            workload_ready: AtomicBool::new(false),
            stop_subscribers: AtomicBool::new(false),
            rpc_faults_on: Arc::new(AtomicBool::new(true)),
            rpc_duplicated: AtomicU64::new(0),
            rpc_replayed: AtomicU64::new(0),
            clock_offset_ms: (0..=crate::plan::NODES).map(|_| AtomicI64::new(0)).collect(),
            snapshot_cut_per_mille: (0..=crate::plan::NODES).map(|_| AtomicU64::new(0)).collect(),
            snapshot_chunks_to: (0..=crate::plan::NODES).map(|_| AtomicU64::new(0)).collect(),
            snapshot_chunks_cut: AtomicU64::new(0),
            retired: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
            membership_out: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
            membership_changes: AtomicU64::new(0),
            not_voter: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
            delete_wanted: plan_streams.iter().map(|_| AtomicBool::new(false)).collect(),
            lost_disk: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
            unlisted: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
            rotten: (0..=crate::plan::NODES).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Appends to (or reads) the history.
    pub fn record<R>(&self, f: impl FnOnce(&mut History) -> R) -> R {
        f(&mut self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The nodes in service (not [`Shared::retired`]), in order.
    pub fn serving_nodes(&self) -> Vec<NodeId> {
        (1..=crate::plan::NODES).filter(|n| !self.retired[*n as usize].load(Ordering::SeqCst)).collect()
    }

    /// Takes the history out at the end of the run.
    pub fn take_history(&self) -> History {
        std::mem::take(&mut *self.history.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Waits (polling simulated time) until `flag` is set or `deadline_ms` passes; returns
    /// whether it was set.
    pub async fn wait_for(&self, flag: &AtomicBool, deadline_ms: u64) -> bool {
        while !flag.load(Ordering::SeqCst) {
            if now_ms() >= deadline_ms {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }
}

/// The Raft RPC fault injector of one node incarnation: duplicates and replays outgoing RPCs
/// at the plan's rates while the fault phase lasts, drawing from its own seeded generator.
pub struct SimRpcFaults {
    rates: RpcFaultRates,
    shared: Arc<Shared>,
    rng: Mutex<SimRng>,
}

impl SimRpcFaults {
    /// The injector of `node`'s incarnation number `incarnation`.
    pub fn new(shared: Arc<Shared>, node: NodeId, incarnation: u64) -> Self {
        let rng = SimRng::derive(shared.plan.seed, "rpc-faults", node * 1_000 + incarnation);
        let mut rates = shared.plan.rpc;
        // Diagnosis aid: `SIM_NO_RPC_FAULTS=1` keeps the plan but sends every RPC once.
        if std::env::var_os("SIM_NO_RPC_FAULTS").is_some() {
            rates.duplicate_per_mille = 0;
            rates.replay_per_mille = 0;
        }
        SimRpcFaults { rates, shared, rng: Mutex::new(rng) }
    }
}

impl RpcFaults for SimRpcFaults {
    fn on_send(&self, target: NodeId, rpc: RaftRpc) -> RpcFault {
        if !self.shared.rpc_faults_on.load(Ordering::SeqCst) {
            return RpcFault::Deliver;
        }
        let mut r = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        if rpc == RaftRpc::Snapshot {
            let t = target as usize;
            if let Some(sent) = self.shared.snapshot_chunks_to.get(t) {
                sent.fetch_add(1, Ordering::SeqCst);
            }
            let cut = self.shared.snapshot_cut_per_mille.get(t).map_or(0, |c| c.load(Ordering::SeqCst));
            // Drawn only while a cut is on, so that plans without one draw as they always did.
            if cut > 0 && r.chance(cut) {
                self.shared.snapshot_chunks_cut.fetch_add(1, Ordering::Relaxed);
                return RpcFault::Drop;
            }
        }
        if r.chance(self.rates.duplicate_per_mille) {
            self.shared.rpc_duplicated.fetch_add(1, Ordering::Relaxed);
            RpcFault::Duplicate
        } else if r.chance(self.rates.replay_per_mille) {
            self.shared.rpc_replayed.fetch_add(1, Ordering::Relaxed);
            RpcFault::ReplayAfter(Duration::from_millis(r.between(1, self.rates.replay_max_ms)))
        } else {
            RpcFault::Deliver
        }
    }
}
