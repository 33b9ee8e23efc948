//! Whether this node may grant a vote (Raft paper §5.2 and §5.4.1).
//!
//! Raft's safety counts on every voter keeping the entries it acknowledged: a leader needs the
//! votes of a majority, and any majority holds one server that has every committed entry. A node
//! with an empty data dir breaks that when it is a former member whose disk was wiped: it may have
//! been one of the majority that acknowledged entries its empty log no longer holds, and its vote
//! could then elect a node that lacks them. On its own it cannot tell a wiped disk from a
//! first start.
//!
//! Owns: the in-memory gate that `POST /raft/vote` checks, and the rules that open it. The gate is
//! closed for
//! - a node known to have lost its disk ([`crate::storage::Store::catching_up`], recorded by
//!   [`super::formation::guard_wiped_node`]), until a leader caught it up;
//! - a pristine node listed in `--peers` (empty data dir) until it learns it is fresh: it saw a
//!   majority of fresh peers and forms the cluster itself, or it had answered a peer's formation
//!   probe as fresh (that peer may have counted it in the majority it formed the cluster with), or
//!   a leader caught it up. Recorded durably at start (`Store::mark_unsure`, by
//!   [`super::formation::gate_at_start`]) so that a restart before either keeps it closed, also
//!   once a leader's first appends made the directory non-empty.
//!
//! A closed gate also decides which leader the node may follow ([`VoteGate::admits_leader`],
//! checked by `POST /raft/append` and `POST /raft/snapshot`). Acknowledging a leader's entries
//! counts towards its commits as a vote counts towards its election, and a node that lost its
//! disk forgot the term it had reached: it would follow a deposed leader (one that was cut off,
//! or restarted on its own committed vote, as openraft does) whose term is below one this node
//! had accepted, and make up that leader's majority for entries that conflict with entries
//! committed in the later term on the node's lost disk (simulation seeds 147 and 279). So while
//! closed it follows a leader only once it knows the current term of enough of the other voters
//! (`--peers`) that every majority it was part of has one of them among them (`⌈n/2⌉` of the
//! others, the leader included; probed by [`super::formation::learn_peer_terms`]), and none of
//! them is past the leader's term. Until then it answers the leader `503 not_ready`, as if down.
//!
//! Must never: open for a node that may hold less than it acknowledged, or let a closed one
//! follow a leader whose term a peer it heard from is past; decide anything else about Raft (the
//! vote itself is openraft's).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::NodeId;

/// Why a closed [`VoteGate`] refuses to vote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The node lost its disk and rejoins under its old id: no vote until a leader caught it up.
    Wiped,
    /// The node's data dir is empty and it does not know yet whether the cluster is new.
    Unsure,
}

impl Closed {
    /// The sentence a refused candidate gets (`503 not_ready`).
    pub fn describe(self) -> &'static str {
        match self {
            Closed::Wiped => "this node lost its disk and grants no vote until a leader has caught it up",
            Closed::Unsure => {
                "this node's data dir is empty and it grants no vote until it knows whether the cluster is new \
                 (it forms it, or a leader catches it up)"
            }
        }
    }
}

/// The gate; shared by the vote handler, the append handler and cluster formation.
#[derive(Debug, Default)]
pub struct VoteGate {
    wiped: AtomicBool,
    unsure: AtomicBool,
    /// How many of the other voters' current terms a closed gate must know before it follows a
    /// leader: `⌈n/2⌉` of a cluster of `n` voters ([`VoteGate::for_voters`]).
    terms_needed: usize,
    /// The current term each other voter reported while the gate was closed (the highest).
    peer_terms: Mutex<BTreeMap<NodeId, u64>>,
}

impl VoteGate {
    /// A gate closed for the given reasons (both `false`: open), in a cluster of one voter
    /// until [`VoteGate::for_voters`] says otherwise.
    pub fn new(wiped: bool, unsure: bool) -> Self {
        Self { wiped: AtomicBool::new(wiped), unsure: AtomicBool::new(unsure), ..Self::default() }
    }

    /// The same gate in a cluster of `voters` voters (this node included): closed, it follows a
    /// leader once it knows the terms of `⌈voters/2⌉` of the others. Any majority holds
    /// `⌊voters/2⌋` of them besides this node, so that many others meet every one of them.
    pub fn for_voters(mut self, voters: usize) -> Self {
        self.terms_needed = voters.div_ceil(2);
        self
    }

    /// Records that `peer` reported `term` as its current term (a formation probe).
    pub fn heard_term(&self, peer: NodeId, term: u64) {
        raise_term(&mut self.peer_terms.lock().unwrap_or_else(|p| p.into_inner()), peer, term);
    }

    /// Whether this node may take the entries (or snapshot) of `leader` at `term`: always when
    /// the gate is open; when closed, only once it knows the current term of enough other
    /// voters (the leader's own counts) and none is past `term` (module doc). `Err` says why not.
    pub fn admits_leader(&self, leader: NodeId, term: u64) -> Result<(), String> {
        if self.closed().is_none() {
            return Ok(());
        }
        let mut terms = self.peer_terms.lock().unwrap_or_else(|p| p.into_inner()).clone();
        raise_term(&mut terms, leader, term);
        if let Some((peer, past)) = terms.iter().find(|(_, t)| **t > term) {
            return Err(format!(
                "this node may have lost its disk and follows no leader of a term below one a peer is at \
                 (n{peer} is at term {past}, leader n{leader} at term {term})"
            ));
        }
        if terms.len() < self.terms_needed {
            return Err(format!(
                "this node may have lost its disk and follows no leader before it knows the current term of {} \
                 other voters (it knows {})",
                self.terms_needed,
                terms.len()
            ));
        }
        Ok(())
    }

    /// `None` when this node may vote, else why not. A wiped node stays [`Closed::Wiped`] even
    /// after it learns the cluster is not new.
    pub fn closed(&self) -> Option<Closed> {
        if self.wiped.load(Ordering::Acquire) {
            Some(Closed::Wiped)
        } else if self.unsure.load(Ordering::Acquire) {
            Some(Closed::Unsure)
        } else {
            None
        }
    }

    /// Formation learned this pristine node belongs to a new cluster: it saw a majority of fresh
    /// peers, or a peer it had answered as fresh formed the cluster. Leaves a wiped node closed.
    pub fn known_fresh(&self) {
        self.unsure.store(false, Ordering::Release);
    }

    /// A leader caught this node up past an entry it committed in its own term: every committed
    /// entry is now in this node's log (Raft §5.4.2), whatever the node was before.
    pub fn caught_up(&self) {
        self.wiped.store(false, Ordering::Release);
        self.unsure.store(false, Ordering::Release);
    }
}

/// Records that `peer` is at `term` at least: terms only go up (Raft paper §5.1).
fn raise_term(terms: &mut BTreeMap<NodeId, u64>, peer: NodeId, term: u64) {
    let t = terms.entry(peer).or_insert(term);
    *t = (*t).max(term);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pristine_node_votes_once_it_knows_the_cluster_is_new() {
        let g = VoteGate::new(false, true);
        assert_eq!(g.closed(), Some(Closed::Unsure));
        g.known_fresh();
        assert_eq!(g.closed(), None);
    }

    #[test]
    fn a_wiped_node_stays_closed_when_formation_says_fresh_and_opens_when_caught_up() {
        let g = VoteGate::new(true, true);
        g.known_fresh();
        assert_eq!(g.closed(), Some(Closed::Wiped));
        g.caught_up();
        assert_eq!(g.closed(), None);
    }

    /// Seeds 147 and 279: a node that lost its disk (its vote gate closed) was caught up by a
    /// deposed leader it could not tell from the current one, and made up that leader's majority
    /// for entries conflicting with ones committed in a later term. In a cluster of three it
    /// now follows a leader only once it knows the other voter's term too, and not when that
    /// voter is past the leader's term.
    #[test]
    fn a_closed_gate_follows_no_leader_before_it_knows_a_majority_s_terms() {
        let g = VoteGate::new(false, true).for_voters(3);
        // n3 restarted on its committed vote of term 1 and leads; n2 is unreachable.
        g.heard_term(3, 1);
        assert!(g.admits_leader(3, 1).is_err(), "one other voter's term is not enough");
        // n2 answers: it was elected in term 2 (with this node's lost vote).
        g.heard_term(2, 2);
        let why = g.admits_leader(3, 1).unwrap_err();
        assert!(why.contains("n2 is at term 2"), "{why}");
        assert_eq!(g.admits_leader(2, 2), Ok(()), "the leader of the current term");
        assert_eq!(g.admits_leader(2, 3), Ok(()), "a leader past every term heard");
        // Terms only grow: an older answer does not lower what was heard.
        g.heard_term(2, 1);
        assert!(g.admits_leader(3, 1).is_err());
        // Open, the gate leaves the choice of leader to Raft.
        g.caught_up();
        assert_eq!(g.admits_leader(3, 1), Ok(()));
    }

    #[test]
    fn a_closed_gate_in_a_cluster_of_five_needs_three_other_terms() {
        let g = VoteGate::new(true, false).for_voters(5);
        g.heard_term(2, 4);
        assert!(g.admits_leader(3, 4).is_err());
        g.heard_term(4, 3);
        assert_eq!(g.admits_leader(3, 4), Ok(()), "the leader, n2 and n4: three of the four others");
    }

    #[test]
    fn a_node_with_state_is_open() {
        assert_eq!(VoteGate::new(false, false).closed(), None);
        assert_eq!(VoteGate::default().closed(), None);
    }
}
