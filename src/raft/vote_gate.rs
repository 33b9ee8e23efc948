//! Whether this node may grant a vote (Raft paper §5.2 and §5.4.1).
//!
//! Raft's safety counts on every voter keeping the entries it acknowledged: a leader needs the
//! votes of a majority, and any majority holds one server that has every committed entry. A node
//! with an empty data dir breaks that when it is a former member whose disk was wiped: it may have
//! been one of the majority that acknowledged entries its empty log no longer holds, and its vote
//! could then elect a node that lacks them. On its own it cannot tell a wiped disk from a
//! first start.
//!
//! Owns: the in-memory gate that `POST /raft/vote` checks, and the rules that open it; while it is
//! closed the node does not stand for election either ([`super::candidacy`]: a candidate's vote
//! for itself is a vote). The gate is closed for
//! - a node known to have lost its disk ([`crate::storage::Store::catching_up`], recorded by
//!   [`super::formation::guard_wiped_node`]), until a leader caught it up;
//! - a pristine node (empty data dir, whether `--peers` lists it or not: a node started to be
//!   added may be an added member whose disk was lost) until it learns it is fresh: it saw a
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
//! committed in the later term on the node's lost disk (simulation seeds 147 and 279). The same
//! holds within one term: openraft 0.9 orders votes by term and then node id, so a term may
//! elect a second leader of a higher id after the first, and the first, cut off, leads on. So
//! while closed it follows the leader `L` of term `T` only once it knows that no leader was
//! elected past `(T, L)` in that order before it asked: it knows the durable vote of enough
//! nodes, each at `(T, L)` or below ([`HeardVote`]), that every majority able to elect a leader
//! past it has one of them. Which majorities those are follows from the membership the leader
//! reported at `T` (`GET /raft/formation` answers `voters`, probed by
//! [`super::formation::learn_peer_terms`]): a leader elected past `T` needs a majority of each
//! voter set of that membership, whether it kept it, finished a change the leader had started,
//! or went on to a change the leader's voters acknowledged (Raft paper §6: every change passes
//! through a joint configuration that needs both majorities); of a joint membership whose entry
//! is committed, a majority of the new set ([`ReportedMembership::binding_sets`]). So for each
//! such voter set `V` it must know the votes of `⌈|V|/2⌉` of its members other than itself (the
//! leader counts). A leader whose membership at `T` it has not heard is judged by `--peers`
//! instead: `⌈n/2⌉` of the other peers, none past `(T, L)`. Until then it answers the leader
//! `503 not_ready`, as if down. A single voter left (simulation seed 5039) is a leader nobody
//! can depose without its vote: its own vote is enough.
//!
//! A closed gate grants one kind of vote ([`VoteGate::may_vote_for`]): for a candidate whose
//! reported membership makes it part of every majority of each binding voter set (the
//! candidate alone, or the candidate and one other). Every entry ever committed then needed the
//! candidate's acknowledgement, or precedes the committed joint entry that made that membership
//! (which the candidate holds), so the candidate holds it: this node's vote cannot elect a
//! leader lacking what its lost disk acknowledged. Without it, two voters of which one lost its
//! disk elect no leader for good (simulation seeds 5281 and 6364).
//!
//! Must never: open for a node that may hold less than it acknowledged, or let a closed one
//! follow a leader whose term a peer it heard from is past; decide anything else about Raft (the
//! vote itself is openraft's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::NodeId;

/// A membership as a peer reports it (`GET /raft/formation`): its voter sets, one for a uniform
/// configuration, two (`[old, new]`, openraft's `Membership::get_joint_config`) for a joint one,
/// and whether its entry is committed on that peer (applied there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedMembership {
    /// The voter sets, each a set of node ids.
    pub voters: Vec<BTreeSet<NodeId>>,
    /// Whether the peer had applied (so committed) the membership's log entry.
    pub committed: bool,
}

impl ReportedMembership {
    /// The voter sets of which every leader elected from now on needs a majority (Raft paper
    /// §6): each set, but of a committed joint configuration only the new one. Once the joint
    /// entry is committed every later leader holds it, and leaves it only through a majority
    /// of the new set (finishing the change, or starting the next one from it). A uniform
    /// configuration's entry follows its committed joint one (openraft changes membership only
    /// from a committed one), so its one set binds whether its own entry is committed or not.
    pub fn binding_sets(&self) -> &[BTreeSet<NodeId>] {
        match self.voters.split_last() {
            Some((new, _)) if self.committed && self.voters.len() > 1 => std::slice::from_ref(new),
            _ => &self.voters,
        }
    }
}

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

/// A peer's durable vote as a formation probe reports it: its term and the node it voted for
/// (`None`: an earlier build that reports only the term).
///
/// openraft 0.9 orders votes by `(term, node id)` (its default, non-`single-term-leader` mode:
/// `LeaderId { term, node_id }` derives `Ord`), so two leaders may be elected in one term, the
/// one with the higher id after the other; a voter never goes back down that order. A closed
/// gate therefore compares a leader with what it heard by that order, not by term alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeardVote {
    /// The vote's term.
    pub term: u64,
    /// The node voted for in that term (a candidate's own vote is for itself).
    pub node: Option<NodeId>,
}

impl HeardVote {
    /// Whether a peer holding this vote may have helped elect a leader past `leader` at `term`
    /// in openraft's order: a later term, or the same term for a higher node id. A peer of an
    /// earlier build at the same term does not say whom it voted for and counts as not past,
    /// as it did before builds reported it (a rolling upgrade keeps working).
    fn is_past(self, leader: NodeId, term: u64) -> bool {
        self.term > term || (self.term == term && self.node.is_some_and(|n| n > leader))
    }
}

/// What a closed gate heard from one peer (formation probes).
#[derive(Debug, Clone, Default)]
struct Heard {
    /// The highest vote the peer reported.
    vote: HeardVote,
    /// The membership it reported with that vote's term, when it said (earlier builds do not).
    membership: Option<ReportedMembership>,
}

/// The gate; shared by the vote handler, the append handler, cluster formation and the node's
/// candidacy ([`super::candidacy`]: a closed gate also keeps the node from standing for election).
#[derive(Debug)]
pub struct VoteGate {
    wiped: AtomicBool,
    unsure: AtomicBool,
    /// `true` once the gate is open; watched by [`super::candidacy::follow_gate`].
    open: tokio::sync::watch::Sender<bool>,
    /// How many of the other voters' current terms a closed gate must know before it follows a
    /// leader whose membership it has not heard: `⌈n/2⌉` of the `n` voters of `--peers`
    /// ([`VoteGate::for_voters`]).
    terms_needed: usize,
    /// What each other node reported while the gate was closed.
    heard: Mutex<BTreeMap<NodeId, Heard>>,
}

/// Whether `known` holds, in each voter set of `voters`, a member of every majority of that
/// set: `⌈|V|/2⌉` of its members (a majority is `⌊|V|/2⌋ + 1`, so at most `⌊|V|/2⌋` members
/// can be outside it). An empty set of voter sets covers nothing.
pub fn meets_every_majority(voters: &[BTreeSet<NodeId>], known: &BTreeSet<NodeId>) -> bool {
    !voters.is_empty() && voters.iter().all(|v| v.intersection(known).count() >= v.len().div_ceil(2))
}

/// An open gate (a node with state), in a cluster of one voter.
impl Default for VoteGate {
    fn default() -> Self {
        Self::new(false, false)
    }
}

impl VoteGate {
    /// A gate closed for the given reasons (both `false`: open), in a cluster of one voter
    /// until [`VoteGate::for_voters`] says otherwise.
    pub fn new(wiped: bool, unsure: bool) -> Self {
        Self {
            wiped: AtomicBool::new(wiped),
            unsure: AtomicBool::new(unsure),
            open: tokio::sync::watch::Sender::new(!wiped && !unsure),
            terms_needed: 0,
            heard: Mutex::default(),
        }
    }

    /// Follows the gate: the value is `true` once it is open (it never closes again while the
    /// node runs; only [`VoteGate::new`] closes it, at start).
    pub fn watch_open(&self) -> tokio::sync::watch::Receiver<bool> {
        self.open.subscribe()
    }

    /// The same gate in a cluster of `voters` voters in `--peers` (this node included): closed,
    /// it follows a leader whose membership it has not heard once it knows the terms of
    /// `⌈voters/2⌉` of the others. Any majority holds `⌊voters/2⌋` of them besides this node,
    /// so that many others meet every one of them.
    pub fn for_voters(mut self, voters: usize) -> Self {
        self.terms_needed = voters.div_ceil(2);
        self
    }

    /// Records that `peer` reported `vote` as its durable vote (a formation probe), and with it
    /// the membership it reported (`None`: a build that does not say). Votes only go up (Raft
    /// paper §5.1, in openraft's order: [`HeardVote`]): an answer below the highest vote heard
    /// is ignored.
    pub fn heard(&self, peer: NodeId, vote: HeardVote, membership: Option<ReportedMembership>) {
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        let h = heard.entry(peer).or_default();
        if vote >= h.vote {
            // A report at the same term without a membership keeps the one heard.
            if membership.is_some() || vote.term > h.vote.term {
                h.membership = membership;
            }
            h.vote = vote;
        }
    }

    /// Whether this node may take the entries (or snapshot) of `leader` at `term`: always when
    /// the gate is open; when closed, only once it knows that no leader was elected past `term`
    /// before it asked (module doc). `Err` says why not.
    pub fn admits_leader(&self, leader: NodeId, term: u64) -> Result<(), String> {
        if self.closed().is_none() {
            return Ok(());
        }
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut votes: BTreeMap<NodeId, HeardVote> = heard.iter().map(|(id, h)| (*id, h.vote)).collect();
        let own = HeardVote { term, node: Some(leader) };
        let v = votes.entry(leader).or_insert(own);
        *v = (*v).max(own);
        let leader_membership = heard.get(&leader).filter(|h| h.vote.term == term).and_then(|h| h.membership.clone());
        if let Some(membership) = leader_membership {
            // The leader's membership at `term`: nodes past the leader do not count.
            let known: BTreeSet<NodeId> =
                votes.iter().filter(|(_, v)| !v.is_past(leader, term)).map(|(id, _)| *id).collect();
            let voters = membership.binding_sets();
            if meets_every_majority(voters, &known) {
                return Ok(());
            }
            return Err(format!(
                "this node may have lost its disk and follows no leader before it knows the current vote of \
                 half of each of the leader's voter sets {voters:?} (n{leader} at term {term}; it knows {:?})",
                known
            ));
        }
        if let Some((peer, past)) = votes.iter().find(|(_, v)| v.is_past(leader, term)) {
            let voted = past.node.map_or(String::new(), |n| format!(" for n{n}"));
            return Err(format!(
                "this node may have lost its disk and follows no leader that a peer's vote is past \
                 (n{peer} voted at term {}{voted}, leader n{leader} at term {term})",
                past.term
            ));
        }
        if votes.len() < self.terms_needed {
            return Err(format!(
                "this node may have lost its disk and follows no leader before it knows the current vote of {} \
                 other voters (it knows {})",
                self.terms_needed,
                votes.len()
            ));
        }
        Ok(())
    }

    /// Whether this node may vote for `candidate` (openraft then decides the vote as usual):
    /// always when the gate is open; when closed, only for a candidate whose last reported
    /// membership makes it part of every majority of each voter set (module doc). `Err` says
    /// why not.
    pub fn may_vote_for(&self, candidate: NodeId) -> Result<(), String> {
        let Some(closed) = self.closed() else { return Ok(()) };
        let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        let membership = heard.get(&candidate).and_then(|h| h.membership.as_ref());
        if membership.is_some_and(|m| meets_every_majority(m.binding_sets(), &BTreeSet::from([candidate]))) {
            return Ok(());
        }
        Err(closed.describe().to_string())
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
        self.open.send_replace(self.closed().is_none());
    }

    /// A leader caught this node up past an entry it committed in its own term: every committed
    /// entry is now in this node's log (Raft §5.4.2), whatever the node was before.
    pub fn caught_up(&self) {
        self.wiped.store(false, Ordering::Release);
        self.unsure.store(false, Ordering::Release);
        self.open.send_replace(true);
    }
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
        let open = g.watch_open();
        g.known_fresh();
        assert_eq!(g.closed(), Some(Closed::Wiped));
        assert!(!*open.borrow(), "the watch stays closed with the gate");
        g.caught_up();
        assert_eq!(g.closed(), None);
        assert!(*open.borrow(), "the watch opens with the gate");
    }

    #[test]
    fn the_open_watch_starts_as_the_gate_and_follows_formation() {
        assert!(*VoteGate::new(false, false).watch_open().borrow());
        let g = VoteGate::new(false, true);
        let open = g.watch_open();
        assert!(!*open.borrow());
        g.known_fresh();
        assert!(*open.borrow());
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
        g.heard(3, at(1), None);
        assert!(g.admits_leader(3, 1).is_err(), "one other voter's term is not enough");
        // n2 answers: it was elected in term 2 (with this node's lost vote).
        g.heard(2, at(2), None);
        let why = g.admits_leader(3, 1).unwrap_err();
        assert!(why.contains("n2 voted at term 2,"), "{why}");
        assert_eq!(g.admits_leader(2, 2), Ok(()), "the leader of the current term");
        assert_eq!(g.admits_leader(2, 3), Ok(()), "a leader past every term heard");
        // Terms only grow: an older answer does not lower what was heard.
        g.heard(2, at(1), None);
        assert!(g.admits_leader(3, 1).is_err());
        // Open, the gate leaves the choice of leader to Raft.
        g.caught_up();
        assert_eq!(g.admits_leader(3, 1), Ok(()));
    }

    #[test]
    fn a_closed_gate_in_a_cluster_of_five_needs_three_other_terms() {
        let g = VoteGate::new(true, false).for_voters(5);
        g.heard(2, at(4), None);
        assert!(g.admits_leader(3, 4).is_err());
        g.heard(4, at(3), None);
        assert_eq!(g.admits_leader(3, 4), Ok(()), "the leader, n2 and n4: three of the four others");
    }

    /// A vote at `term` as an earlier build reports it: the term alone.
    fn at(term: u64) -> HeardVote {
        HeardVote { term, node: None }
    }

    /// A vote at `term` for `node`.
    fn voted(term: u64, node: NodeId) -> HeardVote {
        HeardVote { term, node: Some(node) }
    }

    /// openraft 0.9 may elect two leaders in one term, n2 and then n3 (votes are ordered by
    /// term, then node id). A node that lost its disk after making up n3's majority must not
    /// follow n2, still leading at that term where it is cut off from n3: n2's entries would
    /// overwrite ones n3 committed. The other voter's vote for n3 at the same term says so; a
    /// term alone cannot.
    #[test]
    fn a_closed_gate_follows_no_leader_of_its_term_that_a_peer_voted_past() {
        let g = VoteGate::new(true, false).for_voters(3);
        g.heard(2, voted(5, 2), None);
        g.heard(3, voted(5, 3), None);
        let why = g.admits_leader(2, 5).unwrap_err();
        assert!(why.contains("n3 voted at term 5 for n3, leader n2 at term 5"), "{why}");
        assert_eq!(g.admits_leader(3, 5), Ok(()), "n3 is the higher leader of term 5");
        assert_eq!(g.admits_leader(2, 6), Ok(()), "a leader of a later term");
        // The same with the leader's membership known: n3 does not count among those at or
        // below n2.
        let m3 = VoteGate::new(true, false).for_voters(3);
        m3.heard(2, voted(5, 2), m(&[&[1, 2, 3]]));
        m3.heard(3, voted(5, 3), m(&[&[1, 2, 3]]));
        assert!(m3.admits_leader(2, 5).is_err());
        assert_eq!(m3.admits_leader(3, 5), Ok(()));
        // A voter whose vote at term 5 went to n2 (or to a lower id) is no obstacle to n2.
        let low = VoteGate::new(true, false).for_voters(3);
        low.heard(2, voted(5, 2), None);
        low.heard(3, voted(5, 1), None);
        assert_eq!(low.admits_leader(2, 5), Ok(()));
        // Votes only go up: a later answer of a lower vote in the same term changes nothing.
        low.heard(3, voted(5, 3), None);
        low.heard(3, voted(5, 1), None);
        assert!(low.admits_leader(2, 5).is_err());
        // An earlier build says only its term: counted as not past, as before.
        let old = VoteGate::new(true, false).for_voters(3);
        old.heard(3, at(5), None);
        assert_eq!(old.admits_leader(2, 5), Ok(()));
    }

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    /// A reported membership whose entry is committed on the peer.
    fn m(voters: &[&[NodeId]]) -> Option<ReportedMembership> {
        Some(ReportedMembership { voters: voters.iter().map(|v| set(v)).collect(), committed: true })
    }

    /// A reported membership whose entry is not yet committed on the peer.
    fn m_uncommitted(voters: &[&[NodeId]]) -> Option<ReportedMembership> {
        m(voters).map(|r| ReportedMembership { committed: false, ..r })
    }

    #[test]
    fn a_voter_set_is_met_by_half_of_its_members_rounded_up() {
        let one = vec![set(&[2])];
        assert!(meets_every_majority(&one, &set(&[2])));
        assert!(!meets_every_majority(&one, &set(&[3])));
        let three = vec![set(&[1, 2, 3])];
        assert!(!meets_every_majority(&three, &set(&[2])), "{{1, 3}} is a majority without n2");
        assert!(meets_every_majority(&three, &set(&[2, 3])));
        let two = vec![set(&[1, 2])];
        assert!(meets_every_majority(&two, &set(&[2])), "both are needed: any one meets every majority");
        let five = vec![set(&[1, 2, 3, 4, 5])];
        assert!(!meets_every_majority(&five, &set(&[2, 3])));
        assert!(meets_every_majority(&five, &set(&[2, 3, 4])));
        let joint = vec![set(&[1, 2, 3]), set(&[2])];
        assert!(!meets_every_majority(&joint, &set(&[2])), "a joint membership needs both halves met");
        assert!(meets_every_majority(&joint, &set(&[2, 3])));
        assert!(!meets_every_majority(&[], &set(&[1, 2, 3])), "no voter set: nothing is known");
    }

    /// Seed 5039: membership changes left n2 the only voter; n1, wiped and added back as a
    /// learner, knew only n2's term (n3 was silent) and refused n2's appends for good, as
    /// `--peers` asks for two other terms. With n2's membership at its term, n2's own term meets
    /// every majority: no leader can be elected without its vote.
    #[test]
    fn a_closed_gate_follows_the_only_voter_left_on_its_own_term() {
        let g = VoteGate::new(true, false).for_voters(3);
        g.heard(2, at(21), None);
        assert!(g.admits_leader(2, 21).is_err(), "without the membership, --peers asks for two terms");
        g.heard(2, at(21), m(&[&[2]]));
        assert_eq!(g.admits_leader(2, 21), Ok(()));
        // A membership heard at another term says nothing of the leader at this one.
        assert!(g.admits_leader(2, 22).is_err());
        // A silent n3 that comes back above the leader's term is not part of the membership.
        g.heard(3, at(109), m(&[&[1, 2, 3]]));
        assert_eq!(g.admits_leader(2, 21), Ok(()));
    }

    /// The rule of seeds 147 and 279 still holds with the membership known: a leader of three
    /// voters needs the other voter's term too, and a voter past the leader's term meets no
    /// majority.
    #[test]
    fn a_closed_gate_needs_half_of_each_voter_set_of_the_leader_s_membership() {
        let g = VoteGate::new(false, true).for_voters(3);
        g.heard(3, at(1), m(&[&[1, 2, 3]]));
        assert!(g.admits_leader(3, 1).is_err(), "n2 is unknown: {{1, 2}} could have elected a leader past term 1");
        g.heard(2, at(2), m(&[&[1, 2, 3]]));
        let why = g.admits_leader(3, 1).unwrap_err();
        assert!(why.contains("{3}"), "n2 is past term 1 and does not count: {why}");
        g.heard(2, at(2), m(&[&[1, 2, 3]]));
        g.heard(3, at(2), m(&[&[1, 2, 3]]));
        assert_eq!(g.admits_leader(2, 2), Ok(()));
        // A joint membership not yet committed: a later leader may not hold it and be elected
        // by the old set, so both halves.
        let j = VoteGate::new(true, false).for_voters(3);
        j.heard(2, at(4), m_uncommitted(&[&[1, 2, 3], &[2]]));
        assert!(j.admits_leader(2, 4).is_err());
        j.heard(3, at(4), None);
        assert_eq!(j.admits_leader(2, 4), Ok(()));
        // Committed, every later leader holds it and needs a majority of the new set.
        let c = VoteGate::new(true, false).for_voters(3);
        c.heard(2, at(4), m(&[&[1, 2, 3], &[2]]));
        assert_eq!(c.admits_leader(2, 4), Ok(()));
    }

    /// Seed 5281: voters n1 and n2, n1 wiped. Every election needs both votes, and n1 granted
    /// none until caught up: no leader, for good. n2 is in every majority of its membership, so
    /// it holds every committed entry and n1 may vote for it; not for a candidate of three voters.
    #[test]
    fn a_closed_gate_votes_only_for_a_candidate_in_every_majority() {
        let g = VoteGate::new(true, false).for_voters(3);
        assert!(g.may_vote_for(2).is_err(), "nothing heard of n2");
        g.heard(2, at(7), None);
        assert!(g.may_vote_for(2).is_err(), "a report without a membership");
        g.heard(2, at(7), m(&[&[1, 2]]));
        assert_eq!(g.may_vote_for(2), Ok(()));
        g.heard(3, at(7), m(&[&[1, 2]]));
        assert!(g.may_vote_for(3).is_err(), "n3 is not a voter of that membership");
        g.heard(2, at(8), m(&[&[1, 2, 3]]));
        assert!(g.may_vote_for(2).is_err(), "three voters: {{1, 3}} is a majority without n2");
        g.heard(2, at(9), m(&[&[1, 2], &[1, 2, 3]]));
        assert!(g.may_vote_for(2).is_err(), "a committed joint: the new set binds, and {{1, 3}} is a majority of it");
        // Seed 6364: a committed joint change from three voters to n1 and n3, n1 wiped; every
        // election needs n1 and n3, and n3 holds every committed entry.
        g.heard(3, at(11), m(&[&[1, 2, 3], &[1, 3]]));
        assert_eq!(g.may_vote_for(3), Ok(()));
        g.heard(3, at(12), m_uncommitted(&[&[1, 2, 3], &[1, 3]]));
        assert!(g.may_vote_for(3).is_err(), "uncommitted, a leader of the old set may have committed past it");
        g.heard(2, at(10), m(&[&[2]]));
        assert_eq!(g.may_vote_for(2), Ok(()));
        g.caught_up();
        assert_eq!(g.may_vote_for(3), Ok(()), "an open gate leaves the vote to Raft");
    }

    #[test]
    fn a_node_with_state_is_open() {
        assert_eq!(VoteGate::new(false, false).closed(), None);
        assert_eq!(VoteGate::default().closed(), None);
    }
}
