//! Cluster formation (SPEC §5): three fresh nodes given the same `--peers` form one cluster
//! exactly once, whatever the start order.
//!
//! A fresh node that is listed in `--peers` probes the other peers; once a majority (itself
//! included) answers and none of them is already part of a cluster, it calls openraft's
//! `initialize` with every listed peer as a voter. Several nodes may do this at once: they all
//! write the same membership entry at log index 0, which openraft documents as safe. Must never:
//! initialise a node that holds Raft state (a restarted node rejoins on its log), or one whose
//! peers already formed a cluster (a wiped node waits to be caught up by the leader).

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::error::{InitializeError, RaftError};
use openraft::BasicNode;

use super::{NodeId, Raft};
use crate::limits::{FORMATION_PROBE_MS, PEER_PROBE_BYTES_MAX, PEER_PROBE_MS};
use crate::net::HttpClient;
use crate::wire::ClusterView;

/// What a probe learned about one peer.
enum Peer {
    Down,
    Fresh,
    /// Part of a formed cluster, at this term.
    InCluster(u64),
}

async fn probe(http: &HttpClient, addr: &str) -> Peer {
    let url = format!("http://{addr}/v1/cluster");
    let answer = crate::net::get(http, &url, Duration::from_millis(PEER_PROBE_MS), PEER_PROBE_BYTES_MAX).await;
    match answer.ok().and_then(|(_, body)| serde_json::from_slice::<ClusterView>(&body).ok()) {
        Some(v) if v.members.is_empty() => Peer::Fresh,
        Some(v) => Peer::InCluster(v.term),
        None => Peer::Down,
    }
}

/// Forms the cluster if this node is fresh and listed in `peers`; returns once the node is
/// initialised or has learned it must wait to be caught up by an existing cluster.
pub async fn form(raft: Raft, self_id: NodeId, peers: BTreeMap<NodeId, String>, http: HttpClient) {
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
        tracing::info!("this node is not in --peers: waiting to be added with POST /v1/cluster/members");
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
            match probe(&http, addr).await {
                Peer::Down => {}
                Peer::Fresh => up += 1,
                Peer::InCluster(_) => {
                    tracing::info!(
                        peer = id,
                        "peer already belongs to a cluster: waiting for its leader to catch this node up"
                    );
                    return;
                }
            }
        }
        if up >= majority {
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

/// Protects the vote of a node whose data dir was wiped (Raft paper §5.2: a server votes at most
/// once per term, which needs the vote to survive), and the entries it had acknowledged. A
/// pristine node listed in `peers` whose peers already formed a cluster may have voted before
/// it lost its disk, in a term up to the highest term they report; it records a vote for itself
/// at that term before Raft starts, so it cannot grant a second vote in any term it might have
/// voted in. It may also have been one of the majority that committed entries its empty log no
/// longer holds (Raft §5.4.1 counts on every voter keeping them): with its vote it could elect a
/// node that lacks them, and they would be lost. So it also records that it is catching up,
/// and grants no vote until a leader has caught it up past an entry that leader committed in its
/// own term ([`crate::api::raft_rpc`]), as if it were down meanwhile. Returns the term recorded.
///
/// Errors: the vote could not be stored.
pub async fn guard_wiped_node(
    store: &crate::storage::Store,
    self_id: NodeId,
    peers: &BTreeMap<NodeId, String>,
    http: &HttpClient,
) -> Result<Option<u64>, crate::storage::StoreError> {
    if !peers.contains_key(&self_id) || !store.is_pristine()? {
        return Ok(None);
    }
    let mut max_term = None;
    for (_, addr) in peers.iter().filter(|(id, _)| **id != self_id) {
        if let Peer::InCluster(term) = probe(http, addr).await {
            max_term = max_term.max(Some(term));
        }
    }
    let Some(term) = max_term else { return Ok(None) };
    store.seed_wiped_vote(&openraft::Vote::new(term, self_id))?;
    tracing::warn!(
        term,
        "empty data dir but the peers form a cluster: rejoining as a wiped node, vote held at term {term}; \
         granting no vote until a leader has caught this node up"
    );
    Ok(Some(term))
}
