//! Whether this node stands for election: openraft's runtime switches `elect` and `heartbeat`,
//! which two rules share.
//!
//! A candidate votes for itself (Raft paper §5.2), so the rule that keeps a node from granting a
//! vote keeps it from standing too. A node whose vote gate is closed ([`super::vote_gate`]: it
//! lost its disk, or its empty data dir may be a lost one) may have acknowledged entries its log
//! no longer holds; standing, its own vote and that of one voter further behind than itself make
//! a majority of three that lacks entries committed on its lost disk, and the leader they elect
//! overwrites them (simulation seed 16436: a wiped node, caught up to a snapshot older than the
//! commit index, was elected with the vote of a node that had been down, and the third node,
//! the only one left holding the committed entries, was asked to replace them). So it stands
//! only once its gate is open. The other rule is the clock's ([`crate::clock`]): a node whose
//! wall clock is out of bounds must not lead, so it neither stands nor sends heartbeats.
//!
//! Owns: the two switches and the two inputs that set them. Must never: let the node stand while
//! either input says no; decide a vote (openraft's, behind the gate), or start an election
//! itself. openraft's `initialize` elects whatever the switch says; formation initializes only
//! once the gate is open ([`super::formation`]).

use std::sync::{Arc, Mutex};

use super::vote_gate::VoteGate;
use super::Raft;

/// What each rule allows, and the switches they set on `raft`.
pub struct Candidacy {
    raft: Raft,
    allows: Mutex<Allows>,
}

#[derive(Debug, Clone, Copy)]
struct Allows {
    /// The vote gate is open.
    gate: bool,
    /// The wall clock is fit to lead.
    clock: bool,
}

impl Allows {
    fn stands(self) -> bool {
        self.gate && self.clock
    }
}

impl Candidacy {
    /// The candidacy of `raft`, whose gate is open or not (`gate_open`) and whose clock is
    /// taken as fit until [`Candidacy::clock_allows`] says otherwise. Sets the switches now;
    /// the node's Raft config should already start with `enable_elect` as
    /// [`Candidacy::stands_at_start`] says, so no election timeout fires before this.
    pub fn new(raft: Raft, gate_open: bool) -> Arc<Self> {
        let c = Arc::new(Candidacy { raft, allows: Mutex::new(Allows { gate: gate_open, clock: true }) });
        c.set(|_| {});
        c
    }

    /// Whether a node whose gate is open or not stands for election at start (openraft's
    /// `Config::enable_elect`).
    pub fn stands_at_start(gate_open: bool) -> bool {
        Allows { gate: gate_open, clock: true }.stands()
    }

    /// The gate opened: the node stands, if its clock allows.
    pub fn gate_opened(&self) {
        self.set(|a| a.gate = true);
    }

    /// The clock's verdict ([`crate::clock::should_step_down`]): `false` stops both the
    /// candidacy and this node's heartbeats as leader, so the followers elect another leader
    /// (openraft 0.9 has no leadership transfer; these runtime switches are how it steps down).
    pub fn clock_allows(&self, fit: bool) {
        self.set(|a| a.clock = fit);
    }

    /// Changes the inputs and sets both switches from them under one lock, so two rules
    /// changing at once cannot leave a switch as only one of them said.
    fn set(&self, change: impl FnOnce(&mut Allows)) {
        let mut allows = self.allows.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut allows);
        self.raft.runtime_config().elect(allows.stands());
        self.raft.runtime_config().heartbeat(allows.clock);
    }
}

/// Waits until `gate` opens and lets the node stand then; meanwhile checks (`debug_assert!`)
/// that the node is neither candidate nor leader. Runs until the gate opens (at once when it is
/// open) or it is aborted.
pub async fn follow_gate(candidacy: Arc<Candidacy>, gate: Arc<VoteGate>) {
    let mut open = gate.watch_open();
    let mut metrics = candidacy.raft.metrics();
    loop {
        // The gate opens before anything can make the node a candidate (formation opens it
        // before `initialize`, a leader's catch-up before the node stands), so it is read first.
        if *open.borrow_and_update() {
            candidacy.gate_opened();
            tracing::info!("vote gate open: this node stands for election");
            return;
        }
        let state = metrics.borrow_and_update().state;
        debug_assert!(
            !matches!(state, openraft::ServerState::Candidate | openraft::ServerState::Leader),
            "a node whose vote gate is closed is {state:?}"
        );
        tokio::select! {
            changed = open.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = metrics.changed() => {
                if changed.is_err() {
                    // The core stopped: nothing can elect this node any more; wait for the gate.
                    let _ = open.wait_for(|o| *o).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_stands_only_when_its_gate_and_its_clock_allow() {
        assert!(Allows { gate: true, clock: true }.stands());
        assert!(!Allows { gate: false, clock: true }.stands(), "a closed gate: its own vote is a vote");
        assert!(!Allows { gate: true, clock: false }.stands(), "a clock out of bounds must not lead");
        assert!(!Allows { gate: false, clock: false }.stands());
        assert!(Candidacy::stands_at_start(true));
        assert!(!Candidacy::stands_at_start(false));
    }
}
