//! Cluster formation (SPEC §5): three fresh nodes given the same `--peers` form one cluster
//! exactly once, whatever the start order.
//!
//! A fresh node that is listed in `--peers` probes the other peers (`GET /raft/formation`); once
//! a majority (itself included) answers fresh and none of them is already part of a cluster, it
//! calls openraft's `initialize` with every listed peer as a voter. Several nodes may do this at
//! once: they all write the same membership entry at log index 0, which openraft documents as
//! safe. Until then it grants no vote ([`super::vote_gate`]): an empty data dir may be a wiped
//! one. Must never: initialise a node that holds Raft state (a restarted node rejoins on its log),
//! or one whose peers already formed a cluster (a wiped node waits to be caught up by the leader);
//! take a cluster for new on anything but the word of the peer that formed it.
//!
//! How a pristine node that did not form the cluster itself learns that it is new: a probe names
//! its sender (`?from=ID`, checked against the node certificate when peer TLS is on), and a
//! pristine node records durably, before it answers `fresh`, which peer asked
//! ([`Store::mark_counted_fresh_by`]). The node that initialises the cluster records that it did
//! ([`Store::mark_formed`]) and says so in its answers (`member`, `formed: true`). The cluster is
//! new to a pristine node only when a peer whose probe it answered says it formed the cluster: a
//! probe of someone else (a peer that lost its disk too, an operator's `curl`) and a cluster
//! formed by another node prove nothing, as an empty data dir may be a wiped one.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};
use openraft::BasicNode;

use super::vote_gate::{HeardVote, ReportedMembership, VoteGate};
use super::{NodeId, Raft};
use crate::limits::{FORMATION_PROBE_MS, PEER_PROBE_BYTES_MAX, PEER_PROBE_MS};
use crate::net::HttpClient;
use crate::storage::Store;
use crate::wire::FormationAnswer;

/// The path of the formation probe.
pub const FORMATION_PATH: &str = "/raft/formation";

/// What a probe learned about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Peer {
    /// No answer (down, or an answer that does not decode): not counted.
    Down,
    Fresh,
    /// Holds Raft state but no membership: not counted.
    Joining,
    /// Part of a formed cluster; `vote`: its durable vote (term, and whom for when it said);
    /// `formed`: that peer initialised it;
    /// `membership`: its effective membership, when it said ([`FormationAnswer::Member`]);
    /// `nodes`: the addresses of that membership's nodes.
    InCluster {
        vote: HeardVote,
        formed: bool,
        membership: Option<ReportedMembership>,
        nodes: BTreeMap<NodeId, String>,
    },
}

/// The formation answer of the node at `addr` (`HOST:PORT`), asked on behalf of node `from`
/// (`None`: a probe that names no sender, which the node answers and records nothing of);
/// `None` when it does not answer within [`PEER_PROBE_MS`], or not with a success that decodes.
pub async fn probe_answer(http: &HttpClient, addr: &str, from: Option<NodeId>) -> Option<FormationAnswer> {
    let url = match from {
        Some(from) => format!("http://{addr}{FORMATION_PATH}?from={from}"),
        None => format!("http://{addr}{FORMATION_PATH}"),
    };
    let answer = crate::net::get(http, &url, Duration::from_millis(PEER_PROBE_MS), PEER_PROBE_BYTES_MAX).await;
    let answer = answer.ok().filter(|(status, _)| status.is_success());
    answer.and_then(|(_, body)| serde_json::from_slice::<FormationAnswer>(&body).ok())
}

/// Probes the peer at `addr` on behalf of node `from`.
async fn probe(http: &HttpClient, addr: &str, from: NodeId) -> Peer {
    match probe_answer(http, addr, Some(from)).await {
        Some(FormationAnswer::Fresh) => Peer::Fresh,
        Some(FormationAnswer::Joining) => Peer::Joining,
        Some(FormationAnswer::Member { term, voted_for, formed, voters, committed, nodes, .. }) => {
            let membership = voters.map(|voters| ReportedMembership { voters, committed });
            let nodes = nodes.into_iter().map(|n| (n.id, n.addr)).collect();
            Peer::InCluster { vote: HeardVote { term, node: voted_for }, formed, membership, nodes }
        }
        None => Peer::Down,
    }
}

/// How this node answers a formation probe of node `from` (`None`: a probe that names no
/// sender, which is answered but records nothing). A pristine node records, durably and before
/// it answers, that `from` saw it fresh: `from` may count it in the majority it forms the
/// cluster with, and then needs its vote ([`super::vote_gate`]).
///
/// Errors: the store could not be read or the record written.
pub fn answer_probe(
    store: &Store,
    raft: &Raft,
    from: Option<NodeId>,
) -> Result<FormationAnswer, crate::storage::StoreError> {
    let m = raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    if membership.nodes().next().is_some() {
        // The durable term, not the metrics': a peer whose vote gate is closed counts this
        // answer as a term this node will never go below (simulation seed 6177: a vote for term
        // 27 refused by a full disk was reported, the node restarted at 26, and the peer never
        // counted it again).
        let vote = store.saved_vote()?;
        let term = vote.map_or(0, |v| v.leader_id().term);
        let voted_for = vote.and_then(|v| v.leader_id().voted_for());
        let voters = Some(membership.get_joint_config().clone());
        let applied = m.last_applied.map(|l| l.index);
        let committed = m.membership_config.log_id().is_none_or(|l| applied.is_some_and(|a| a >= l.index));
        let nodes = membership.nodes().map(|(id, n)| crate::wire::NodeAddr { id: *id, addr: n.addr.clone() }).collect();
        let formed = store.formed()?;
        let membership_index = m.membership_config.log_id().map(|l| l.index);
        return Ok(FormationAnswer::Member { term, voted_for, formed, voters, committed, membership_index, nodes });
    }
    if !store.is_pristine()? {
        return Ok(FormationAnswer::Joining);
    }
    if let Some(prober) = from {
        if !store.counted_fresh_by(prober)? {
            store.mark_counted_fresh_by(prober)?;
        }
    }
    Ok(FormationAnswer::Fresh)
}

/// Whether peer `peer`'s answer proves to this pristine node that the cluster is new: `peer`
/// initialised the cluster it is in, and this node had answered `peer`'s probe as fresh (so
/// `peer` may have counted it). Nothing else does (module doc).
///
/// Errors: the store could not be read.
fn proves_new(store: &Store, peer: NodeId, answer: &Peer) -> Result<bool, crate::storage::StoreError> {
    match answer {
        Peer::InCluster { formed: true, .. } => store.counted_fresh_by(peer),
        _ => Ok(false),
    }
}

/// [`proves_new`] off the async executor; a store error is logged and proves nothing.
async fn proves_new_async(store: &std::sync::Arc<Store>, peer: NodeId, answer: Peer) -> bool {
    if !matches!(answer, Peer::InCluster { formed: true, .. }) {
        return false;
    }
    let st = store.clone();
    match crate::storage::blocking(move || proves_new(&st, peer, &answer)).await {
        Ok(proof) => proof,
        Err(e) => {
            tracing::warn!(error = %e, "reading whether this node was counted fresh");
            false
        }
    }
}

/// Forms the cluster if this node is fresh and listed in `peers`; returns once the node is
/// initialised or has learned it must wait to be caught up by an existing cluster. Opens `gate`
/// when it learns the cluster is new: it initialises it, or a peer it answered as fresh formed it.
pub async fn form(
    raft: Raft,
    self_id: NodeId,
    peers: BTreeMap<NodeId, String>,
    http: HttpClient,
    store: std::sync::Arc<Store>,
    gate: std::sync::Arc<VoteGate>,
) {
    match raft.is_initialized().await {
        Ok(true) => {
            tracing::info!("raft state found on disk: rejoining the cluster");
            return;
        }
        Ok(false) => {}
        Err(e) => {
            tracing::error!(error = %e, "raft stopped before cluster formation");
            return;
        }
    }
    if !peers.contains_key(&self_id) {
        tracing::info!(
            "this node is not in --peers: waiting to be added with POST /v1/cluster/members; with an empty data dir \
             it grants no vote until a leader has caught it up"
        );
        return;
    }
    let majority = peers.len() / 2 + 1;
    let mut attempt: u64 = 0;
    loop {
        if matches!(raft.is_initialized().await, Ok(true)) {
            return;
        }
        let mut up = 1;
        for (id, addr) in peers.iter().filter(|(id, _)| **id != self_id) {
            match probe(&http, addr, self_id).await {
                Peer::Down | Peer::Joining => {}
                Peer::Fresh => up += 1,
                answer @ Peer::InCluster { .. } => {
                    if proves_new_async(&store, *id, answer).await {
                        known_fresh(&store, &gate).await;
                        tracing::info!(
                            peer = id,
                            "a peer formed the cluster after seeing this node fresh: voting, \
                             waiting for the leader's first entries"
                        );
                    } else {
                        tracing::info!(
                            peer = id,
                            "peer already belongs to a cluster this node did not see formed: granting no vote \
                             until its leader has caught this node up or the peer that formed it says so"
                        );
                    }
                    return;
                }
            }
        }
        if up >= majority {
            let st = store.clone();
            if let Err(e) = crate::storage::blocking(move || st.mark_formed()).await {
                tracing::warn!(error = %e, "recording that this node forms the cluster; trying again");
                tokio::time::sleep(Duration::from_millis(FORMATION_PROBE_MS)).await;
                continue;
            }
            known_fresh(&store, &gate).await;
            let members: BTreeMap<NodeId, BasicNode> =
                peers.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(voters = peers.len(), "initialised the cluster"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                    tracing::info!("already initialised by a peer's leader")
                }
                Err(e) => tracing::error!(error = %e, "cluster initialisation failed"),
            }
            return;
        }
        attempt += 1;
        if attempt % 10 == 1 {
            tracing::info!(up, majority, "waiting for a majority of peers to form the cluster");
        }
        tokio::time::sleep(Duration::from_millis(FORMATION_PROBE_MS)).await;
    }
}

/// Whether this node's empty data dir may be a wiped one: it holds no Raft state. Such a node
/// starts with its vote gate closed ([`super::vote_gate`]) and is what [`guard_wiped_node`]
/// protects, whether `--peers` lists it or not: a node started to be added (not in `--peers`)
/// may be a member whose disk was lost and that is started again the way it was first added,
/// and its vote could elect a leader lacking what it had acknowledged (a fresh operator's trial
/// lost ten acknowledged batches so). Having answered a probe as fresh does not clear it (anyone
/// may have probed: a peer that lost its disk too, an operator): only the word of the peer that
/// formed the cluster does, later ([`form`], [`learn_peer_terms`]).
///
/// Errors: the store could not be read.
pub fn may_be_wiped(store: &Store) -> Result<bool, crate::storage::StoreError> {
    store.is_pristine()
}

/// The vote gate this node starts with ([`super::vote_gate`]): closed as wiped while a leader has
/// not caught up a node known to have lost its disk ([`Store::catching_up`]); closed as unsure
/// for a node whose empty data dir may be a wiped one ([`may_be_wiped`]). The second is recorded
/// durably before Raft starts ([`Store::mark_unsure`]), so that it survives a restart after a
/// leader's first appends made the directory non-empty but before that leader caught the node
/// up.
///
/// Errors: the store could not be read or the record written.
pub fn gate_at_start(
    store: &Store,
    self_id: NodeId,
    peers: &BTreeMap<NodeId, String>,
) -> Result<VoteGate, crate::storage::StoreError> {
    if may_be_wiped(store)? && !store.unsure()? {
        store.mark_unsure()?;
    }
    // The voters of `--peers`, and this node among them when they do not list it (it may be a
    // voter that lost its disk): never fewer terms asked for than a listed node asks for.
    let voters = peers.len() + usize::from(!peers.contains_key(&self_id));
    Ok(VoteGate::new(store.catching_up()?, store.unsure()?).for_voters(voters))
}

/// While `gate` is closed, probes the other peers every [`FORMATION_PROBE_MS`] and records the
/// current term of each that belongs to a cluster ([`VoteGate::heard`], with the membership it reports): a closed gate
/// follows a leader only once it knows enough of them ([`VoteGate::admits_leader`]). A peer
/// that says it formed the cluster after this node, pristine, answered its probe as fresh
/// proves the cluster new (`proves_new`): the gate opens as if this node had formed it (a
/// wiped node's stays closed). Returns once the gate is open.
pub async fn learn_peer_terms(
    gate: std::sync::Arc<VoteGate>,
    self_id: NodeId,
    peers: BTreeMap<NodeId, String>,
    http: HttpClient,
    store: std::sync::Arc<Store>,
) {
    // `--peers`, and every node a peer reports in its membership: `--peers` may be older than
    // the membership (nodes added and removed since this node's command line was written).
    let mut targets = peers;
    while gate.closed().is_some() {
        let round: Vec<(NodeId, String)> =
            targets.iter().filter(|(id, _)| **id != self_id).map(|(id, a)| (*id, a.clone())).collect();
        for (id, addr) in round {
            let answer = probe(&http, &addr, self_id).await;
            tracing::debug!(peer = id, ?answer, "formation probe while the vote gate is closed");
            if let Peer::InCluster { vote, membership, nodes, .. } = &answer {
                for (n, a) in nodes {
                    targets.entry(*n).or_insert_with(|| a.clone());
                }
                gate.heard(id, *vote, membership.clone());
                if gate.closed() == Some(super::vote_gate::Closed::Unsure) && proves_new_async(&store, id, answer).await
                {
                    tracing::info!(peer = id, "the peer that formed the cluster saw this node fresh: voting");
                    known_fresh(&store, &gate).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(FORMATION_PROBE_MS)).await;
    }
}

/// Opens `gate` for a node that learned the cluster is new, after durably removing the record
/// that it was unsure ([`gate_at_start`]); a failed write leaves the gate closed (a leader still
/// opens it when it catches the node up).
async fn known_fresh(store: &std::sync::Arc<Store>, gate: &VoteGate) {
    let st = store.clone();
    match crate::storage::blocking(move || st.clear_unsure()).await {
        Ok(()) => gate.known_fresh(),
        Err(e) => tracing::warn!(error = %e, "recording that the cluster is new; the vote waits for a leader"),
    }
}

/// Protects the vote of a node whose data dir was wiped (Raft paper §5.2: a server votes at most
/// once per term, which needs the vote to survive), and the entries it had acknowledged. A
/// pristine node listed in `peers` whose peers already formed a cluster may have voted before
/// it lost its disk, in a term up to the highest term they report; it records, before Raft
/// starts, the highest vote they report (openraft's order: term, then node id; [`HeardVote`]),
/// so it grants no vote in an earlier term, nor one in that term for a lower node id, and
/// takes the entries of no leader below it. Not a vote for itself at that term (earlier builds
/// did so): when its id is above the leader's, that vote outranks the leader's own, and the
/// leader, refused by it, stepped down as it rejoined (a fresh operator's trial; a peer of an
/// earlier build that does not say whom it voted for still gets it). It may also have been one of the majority that committed entries its empty log no
/// longer holds (Raft §5.4.1 counts on every voter keeping them): with its vote it could elect a
/// node that lacks them, and they would be lost. So it also records that it is catching up,
/// and grants no vote until a leader has caught it up past an entry that leader committed in its
/// own term ([`crate::api::raft_rpc`]), as if it were down meanwhile. Returns the term recorded.
///
/// A pristine node not listed in `peers` (one started to be added) records nothing here: its
/// vote gate is closed as unsure all the same ([`gate_at_start`]), which is what keeps an added
/// member that lost its disk from voting; a vote for itself at the cluster's term would rank
/// above the leader's own vote in openraft's order whenever its id is the higher (a term's
/// votes are ordered by node id), and the leader, seeing it, would step down as the new node
/// joins.
///
/// Errors: the vote could not be stored.
pub async fn guard_wiped_node(
    store: &crate::storage::Store,
    self_id: NodeId,
    peers: &BTreeMap<NodeId, String>,
    http: &HttpClient,
) -> Result<Option<u64>, crate::storage::StoreError> {
    if !peers.contains_key(&self_id) || !may_be_wiped(store)? {
        return Ok(None);
    }
    let mut max_vote: Option<HeardVote> = None;
    // `--peers`, then the nodes their memberships name that `--peers` does not (one hop).
    let mut targets: BTreeMap<NodeId, String> = peers.clone();
    let mut probed = std::collections::BTreeSet::from([self_id]);
    while let Some((id, addr)) = targets.iter().find(|(id, _)| !probed.contains(*id)).map(|(i, a)| (*i, a.clone())) {
        probed.insert(id);
        let answer = probe(http, &addr, self_id).await;
        if let Peer::InCluster { vote, ref nodes, .. } = answer {
            if proves_new(store, id, &answer)? {
                // Counted fresh by the peer that formed the cluster, then restarted before it
                // learned so: a new member, not a wiped one (formation opens its gate).
                return Ok(None);
            }
            if peers.contains_key(&id) {
                for (n, a) in nodes {
                    targets.entry(*n).or_insert_with(|| a.clone());
                }
            }
            max_vote = max_vote.max(Some(vote));
        }
    }
    let Some(HeardVote { term, node }) = max_vote else { return Ok(None) };
    let held = node.unwrap_or(self_id);
    store.seed_wiped_vote(&openraft::Vote::new(term, held))?;
    tracing::warn!(
        term,
        voted_for = held,
        "empty data dir but the peers form a cluster: rejoining as a wiped node, vote held at term {term} for node \
         {held}; granting no vote until a leader has caught this node up"
    );
    Ok(Some(term))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::vote_gate::Closed;

    fn peers() -> BTreeMap<NodeId, String> {
        (1..=3).map(|id| (id, format!("127.0.0.1:{}", 7000 + id))).collect()
    }

    /// A node that started unsure, received a leader's first appends (a stored vote) and
    /// restarted before that leader caught it up is still unsure: its log is no longer empty,
    /// but it may still lack entries it acknowledged before a wipe.
    #[test]
    fn an_unsure_node_stays_unsure_across_a_restart_until_caught_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(gate_at_start(&store, 2, &peers()).unwrap().closed(), Some(Closed::Unsure));
        store.seed_vote(&openraft::Vote::new(7, 1)).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert!(!store.is_pristine().unwrap());
        assert_eq!(gate_at_start(&store, 2, &peers()).unwrap().closed(), Some(Closed::Unsure));
        store.caught_up().unwrap();
        assert_eq!(gate_at_start(&store, 2, &peers()).unwrap().closed(), None);
    }

    #[tokio::test]
    async fn a_node_that_learned_the_cluster_is_new_starts_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(Store::open(dir.path()).unwrap());
        let gate = gate_at_start(&store, 2, &peers()).unwrap();
        known_fresh(&store, &gate).await;
        assert_eq!(gate.closed(), None);
        store.seed_vote(&openraft::Vote::new(1, 1)).unwrap();
        assert_eq!(gate_at_start(&store, 2, &peers()).unwrap().closed(), None);
    }

    /// An empty data dir that answered probes as fresh is still unsure at its start: a wiped
    /// node answers them too, whoever asks (it opened its vote at its next start before, so a
    /// probe by another node that had lost its disk, or an operator's look, let it elect a
    /// leader lacking what it had acknowledged). One not listed in `--peers` is unsure too: it
    /// may be an added member started again on a lost disk (its vote was open, and elected a
    /// leader lacking ten acknowledged batches in an operator's trial).
    #[test]
    fn a_node_counted_fresh_is_still_unsure_and_so_is_one_not_in_peers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let _ = gate_at_start(&store, 2, &peers()).unwrap();
        store.mark_counted_fresh_by(1).unwrap();
        store.mark_counted_fresh_by(3).unwrap();
        assert!(may_be_wiped(&store).unwrap());
        assert_eq!(gate_at_start(&store, 2, &peers()).unwrap().closed(), Some(Closed::Unsure));
        let other = tempfile::tempdir().unwrap();
        let store = Store::open(other.path()).unwrap();
        assert_eq!(gate_at_start(&store, 9, &peers()).unwrap().closed(), Some(Closed::Unsure));
        assert!(store.unsure().unwrap());
    }

    /// The cluster is new to a pristine node only on the word of a peer whose probe it answered
    /// as fresh and that says it formed the cluster.
    #[test]
    fn only_the_peer_that_counted_this_node_and_formed_the_cluster_proves_it_new() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let member = |formed| Peer::InCluster {
            vote: HeardVote { term: 3, node: Some(2) },
            formed,
            membership: None,
            nodes: BTreeMap::new(),
        };
        assert!(!proves_new(&store, 1, &member(true)).unwrap(), "never counted");
        store.mark_counted_fresh_by(1).unwrap();
        assert!(!proves_new(&store, 1, &member(false)).unwrap(), "counted by n1, but n1 did not form it");
        assert!(!proves_new(&store, 3, &member(true)).unwrap(), "n3 formed it, but never saw this node");
        assert!(!proves_new(&store, 1, &Peer::Fresh).unwrap());
        assert!(proves_new(&store, 1, &member(true)).unwrap());
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert!(proves_new(&store, 1, &member(true)).unwrap(), "the record survives a restart");
    }

    /// Earlier builds answer `member` without `formed`: read as `false`, which proves nothing.
    #[test]
    fn a_member_answer_without_formed_reads_as_not_formed() {
        let old: FormationAnswer = serde_json::from_str(r#"{"state":"member","term":3}"#).unwrap();
        assert_eq!(
            old,
            FormationAnswer::Member {
                term: 3,
                voted_for: None,
                formed: false,
                voters: None,
                committed: false,
                membership_index: None,
                nodes: Vec::new()
            }
        );
        let voters = Some(vec![std::collections::BTreeSet::from([1, 2]), std::collections::BTreeSet::from([2])]);
        let new = FormationAnswer::Member {
            term: 3,
            voted_for: None,
            formed: true,
            voters,
            committed: true,
            membership_index: None,
            nodes: Vec::new(),
        };
        let json = serde_json::to_string(&new).unwrap();
        assert_eq!(json, r#"{"state":"member","term":3,"formed":true,"voters":[[1,2],[2]],"committed":true}"#);
        assert_eq!(serde_json::from_str::<FormationAnswer>(&json).unwrap(), new);
        // With the membership's addresses, as this build answers: they read back.
        let nodes = vec![crate::wire::NodeAddr { id: 1, addr: "h:1".into() }];
        let with = FormationAnswer::Member {
            term: 3,
            voted_for: Some(2),
            formed: true,
            voters: None,
            committed: true,
            membership_index: Some(7),
            nodes,
        };
        let json = serde_json::to_string(&with).unwrap();
        assert_eq!(
            json,
            r#"{"state":"member","term":3,"voted_for":2,"formed":true,"committed":true,"membership_index":7,"nodes":[{"id":1,"addr":"h:1"}]}"#
        );
        assert_eq!(serde_json::from_str::<FormationAnswer>(&json).unwrap(), with);
    }
}
