//! Deterministic simulation of a three-node Runnev cluster.
//!
//! The production node (`runnev::node::run`: the same axum router, Raft transport, state
//! machine, Raft log segments and redb storage) runs on three turmoil hosts over turmoil's simulated TCP, with a
//! simulated disk that loses unsynced writes on a power cut. A seed draws a [`plan::Plan`]:
//! the workload (publishers with and without seq, subscribers, a stream with small retention)
//! and a fault schedule (partitions, one-way links, packet loss, latency spikes, crashes and
//! restarts, duplicated and replayed Raft RPCs). After the fault phase every fault ends and the
//! cluster must converge; then the [`invariants`] check the recorded [`history::History`].
//!
//! Module map: [`rng`] (seeded randomness) → [`plan`] (what happens) → [`runner`] (steps
//! turmoil, applies faults) with [`nodes`] (node hosts), [`workload`] (client hosts), [`net`]
//! and [`disk`] (the seams' simulated implementations), [`world`] (what hosts share) →
//! [`history`] → [`invariants`]. See `README.md` for replaying a seed and for what is and is
//! not deterministic.
#![deny(missing_docs)]

pub mod disk;
pub mod history;
pub mod inspect;
pub mod invariants;
pub mod net;
pub mod nodes;
pub mod plan;
pub mod rng;
pub mod runner;
pub mod workload;
pub mod world;

pub use plan::{Knobs, Plan};
pub use runner::{replay_command, run_seed, RunReport};
