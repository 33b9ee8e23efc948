//! Whether this node was removed from the cluster's membership without being told (Raft paper
//! §6; openraft 0.9).
//!
//! An openraft 0.9 leader stops replicating to a node as soon as its effective membership leaves
//! the node out, so a removed node usually never receives the entry that removes it: it keeps a
//! membership that still names it, hears from no leader again, and stands for election in vain.
//! A write sent to it waited [`crate::limits::LEADER_WAIT_MS`] for `503 no_leader`, so a client
//! (or every CLI run) whose node list starts with it paid that wait before trying the next node
//! (a fresh operator's trial).
//!
//! A node whose own membership already leaves it out (it applied its own removal, as a leader
//! that removed itself does) knows so without asking. Otherwise, while this node hears from no
//! leader, it asks the other nodes of its membership (of its `--peers` when it has none: an
//! empty data dir, which may also be a node started to be added and not yet added) for theirs
//! (`GET /raft/formation`, the probe [`super::formation`] answers, sent without `from` so that
//! it records nothing). One whose membership is *committed* (it applied the entry, so a majority
//! accepted it: Raft §5.4) and names this node neither as voter nor as learner, and whose entry
//! is later in the log than the one of this node's own membership, shows that the node was
//! removed. (Not its term: a removed node stands for election in vain, so its own term climbs
//! past the cluster's. A peer that was down long enough to hold an older membership than this
//! node's shows nothing.) The verdict then lets writes, reads and `/readyz` answer at once with
//! what happened ([`Removal::verdict`], through `api::not_a_member`).
//!
//! Owns: that probe and its verdict. Must never: change Raft state, a vote or the node's
//! candidacy (a removed node added back is caught up by its leader as any follower is); hold a
//! verdict while a leader is heard from: it lapses at once when one is, since a node added back
//! hears from its leader.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::formation;
use super::{NodeId, Raft};
use crate::limits::REMOVAL_PROBE_MS;
use crate::net::HttpClient;

/// The verdict, shared by the probe task, the write and read paths and `/readyz`.
#[derive(Debug, Default)]
pub struct Removal {
    /// Why this node counts as removed (which peer showed it, with its voter sets); `None`:
    /// nothing shows it.
    removed: Mutex<Option<String>>,
}

impl Removal {
    /// Why this node was removed from the cluster, while it hears from no leader (`silent()`:
    /// it does not lead and [`crate::api::contact::LeaderContact::follower_silence`] reports a
    /// silence; asked only when there is a verdict, so a request on a member pays one
    /// uncontended lock); `None` otherwise. The sentence names the peer and its membership,
    /// and what to do.
    pub fn verdict(&self, silent: impl FnOnce() -> bool) -> Option<String> {
        let why = self.removed.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        silent().then_some(why)
    }

    fn set(&self, why: Option<String>) {
        *self.removed.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }
}

/// What one peer's formation answer shows about `me`, whose own membership's entry is at log
/// index `mine` (`None`: it has none): `Some(why)` when the peer's committed membership, whose
/// entry is at a later log index, names `me` neither as voter nor as learner. Its `nodes` (every
/// node of that membership) and `membership_index` are absent from the answers of earlier
/// builds, which therefore show nothing: a learner is named only in `nodes`.
fn shows_removed(me: NodeId, mine: Option<u64>, peer: NodeId, answer: &crate::wire::FormationAnswer) -> Option<String> {
    let crate::wire::FormationAnswer::Member {
        voters: Some(voters),
        committed: true,
        membership_index: Some(at),
        nodes,
        ..
    } = answer
    else {
        return None;
    };
    let named = voters.iter().any(|v| v.contains(&me)) || nodes.iter().any(|n| n.id == me);
    // A node without a membership of its own may also be one started to be added, not yet added.
    let how = if mine.is_some() { "it was removed" } else { "it was removed, or is not yet added" };
    (Some(*at) > mine && !nodes.is_empty() && !named).then(|| {
        format!(
            "this node (n{me}) is not a member of the cluster: node {peer}'s committed membership (log index {at}) \
             has voters {voters:?} and does not name it ({how}); send requests to a current member, and stop a \
             removed node (docs/cli.md, runnev cluster remove)"
        )
    })
}

/// Probes, every [`REMOVAL_PROBE_MS`] while this node does not lead and `silent()` says it
/// hears from no leader, the other nodes of its membership (of `peers`, its `--peers`, when it
/// has none: an empty data dir), unless its own membership already leaves it out, and keeps
/// the verdict in `removal` (module doc). Runs until aborted.
pub async fn watch(
    removal: std::sync::Arc<Removal>,
    raft: Raft,
    me: NodeId,
    peers: BTreeMap<NodeId, String>,
    http: HttpClient,
    silent: impl Fn() -> bool,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(REMOVAL_PROBE_MS)).await;
        let (mine, outside, others) = {
            let m = raft.metrics();
            let m = m.borrow();
            if m.state == openraft::ServerState::Leader || !silent() {
                removal.set(None);
                continue;
            }
            let membership = m.membership_config.membership();
            let mine = m.membership_config.log_id().map(|l| l.index);
            let mut others: BTreeMap<NodeId, String> =
                membership.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
            let outside = match mine {
                Some(at) if !others.is_empty() && !others.contains_key(&me) => Some(format!(
                    "this node (n{me}) is not a member of the cluster: its own membership (log index {at}) has voters \
                     {:?} and does not name it (it was removed); send requests to a current member, and stop this \
                     node (docs/cli.md, runnev cluster remove)",
                    membership.get_joint_config()
                )),
                _ => None,
            };
            if others.is_empty() {
                // No membership of its own (an empty data dir): ask the nodes of `--peers`.
                others = peers.clone();
            }
            others.remove(&me);
            (mine, outside, others)
        };
        // A node whose own membership leaves it out (it applied its own removal, as a leader
        // that removed itself does) knows without asking.
        let mut why = outside;
        for (peer, addr) in others {
            if why.is_some() {
                break;
            }
            if let Some(answer) = formation::probe_answer(&http, &addr, None).await {
                why = shows_removed(me, mine, peer, &answer);
            }
        }
        if why.is_some() && removal.verdict(|| true).is_none() {
            tracing::warn!(reason = why.as_deref().unwrap_or_default(), "this node is not a member of the cluster");
        }
        removal.set(why);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::wire::{FormationAnswer, NodeAddr};

    /// A peer's answer whose membership's entry is at log index `index`.
    fn member(index: u64, voters: &[&[NodeId]], committed: bool, nodes: &[NodeId]) -> FormationAnswer {
        FormationAnswer::Member {
            term: 2,
            voted_for: None,
            formed: false,
            voters: Some(voters.iter().map(|v| v.iter().copied().collect::<BTreeSet<_>>()).collect()),
            committed,
            membership_index: Some(index),
            nodes: nodes.iter().map(|id| NodeAddr { id: *id, addr: format!("h:{id}") }).collect(),
        }
    }

    #[test]
    fn only_a_later_committed_membership_that_names_the_node_nowhere_shows_it_removed() {
        let why = shows_removed(3, Some(4), 1, &member(6, &[&[1, 2]], true, &[1, 2])).expect("removed");
        assert!(why.contains("n3") && why.contains("node 1") && why.contains("[{1, 2}]"), "{why}");
        assert!(why.contains("(it was removed)"), "{why}");
        let why = shows_removed(3, None, 1, &member(6, &[&[1, 2]], true, &[1, 2])).expect("none of its own");
        assert!(why.contains("(it was removed, or is not yet added)"), "{why}");
        assert_eq!(shows_removed(3, Some(4), 1, &member(6, &[&[1, 2]], false, &[1, 2])), None, "not committed");
        assert_eq!(shows_removed(3, Some(6), 1, &member(6, &[&[1, 2]], true, &[1, 2])), None, "not later");
        assert_eq!(shows_removed(3, Some(8), 1, &member(6, &[&[1, 2]], true, &[1, 2])), None, "an older one");
        assert_eq!(shows_removed(3, Some(4), 1, &member(6, &[&[1, 2, 3]], true, &[1, 2, 3])), None, "a voter");
        assert_eq!(shows_removed(3, Some(4), 1, &member(6, &[&[1, 2]], true, &[1, 2, 3])), None, "a learner");
        let joint = member(6, &[&[1, 2, 3], &[1, 2]], true, &[1, 2, 3]);
        assert_eq!(shows_removed(3, Some(4), 1, &joint), None, "joint");
        assert_eq!(shows_removed(3, Some(4), 1, &member(6, &[&[1, 2]], true, &[])), None, "an earlier build");
        let mut unindexed = member(6, &[&[1, 2]], true, &[1, 2]);
        if let FormationAnswer::Member { membership_index, .. } = &mut unindexed {
            *membership_index = None;
        }
        assert_eq!(shows_removed(3, Some(4), 1, &unindexed), None, "an earlier build, without the index");
        assert_eq!(shows_removed(3, Some(4), 1, &FormationAnswer::Fresh), None);
        assert_eq!(shows_removed(3, Some(4), 1, &FormationAnswer::Joining), None);
    }

    #[test]
    fn the_verdict_holds_only_while_no_leader_is_heard() {
        let r = Removal::default();
        assert_eq!(r.verdict(|| true), None);
        r.set(Some("removed".into()));
        assert_eq!(r.verdict(|| true).as_deref(), Some("removed"));
        assert_eq!(r.verdict(|| false), None, "a leader is heard from: added back");
    }
}
