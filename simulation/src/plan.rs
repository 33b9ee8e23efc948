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
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs { fault_phase_ms: 30_000 }
    }
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
}

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
        let mut payload = format!("p{}:{}:", self.spec.id, self.k).into_bytes();
        let extra = r.below(48) as usize;
        payload.extend(r.bytes(extra));
        let pause_ms = r.between(10, self.spec.pause_max_ms);
        let resend = r.chance(self.spec.resend_per_mille);
        let read_check = r.chance(self.spec.read_check_per_mille).then(|| r.between(1, NODES));
        Some(Intent { seq_step, payload, pause_ms, resend, read_check })
    }
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
}

/// Name of the stream the control client publishes to in the heal phase.
pub const HEAL_STREAM: &str = "heal";

fn node_order(r: &mut SimRng) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = (1..=NODES).collect();
    r.shuffle(&mut v);
    v
}

impl Plan {
    /// Draws the plan of `seed`.
    pub fn generate(seed: u64, knobs: Knobs) -> Plan {
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
            subscribers.push(SubscriberSpec { id, stream, slow_ms, restart_every_ms, nodes: node_order(&mut r) });
        }

        let client_hosts = publishers.len() + subscribers.len();
        let mut faults = Vec::new();
        let density = r.between(600, 5_000);
        let mut t = r.between(2_500, 6_000);
        while t + 500 < fault_ms {
            let duration_ms = r.between(300, 8_000);
            let node = r.between(1, NODES);
            let other = {
                let o = r.between(1, NODES - 1);
                if o >= node {
                    o + 1
                } else {
                    o
                }
            };
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
        writeln!(f, "seed {} (fault phase {} ms)", self.seed, self.knobs.fault_phase_ms)?;
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
                "  pub{} → {} seq {} pause ≤{} ms holes {}‰ resends {}‰ read checks {}‰ nodes {:?}",
                p.id,
                self.streams[p.stream].name,
                p.with_seq,
                p.pause_max_ms,
                p.hole_per_mille,
                p.resend_per_mille,
                p.read_check_per_mille,
                p.nodes
            )?;
        }
        for s in &self.subscribers {
            writeln!(
                f,
                "  sub{} ← {} slow {} ms restart every {} ms nodes {:?}",
                s.id, self.streams[s.stream].name, s.slow_ms, s.restart_every_ms, s.nodes
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
