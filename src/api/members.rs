//! Membership endpoints (SPEC §3): `POST /v1/cluster/members` and `DELETE /v1/cluster/members/{id}`.
//!
//! Owns: adding a node as a learner and promoting it once caught up, removing nodes through
//! openraft's joint consensus (Raft paper §6), and refusing changes that would strand the
//! cluster. Must never: run two membership changes at once on this leader (they are serialised
//! by a lock), propose one from a node that is not both leader and member ([`membership_to_change`]),
//! or remove a voter when the voters left could not form a live quorum.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use http_body_util::BodyExt;
use openraft::{BasicNode, ChangeMembers, Membership, ServerState};

use super::write::{on_leader, op_error, Forwardable, Led, OpError};
use super::{cluster, json, read_request_body, AppState};
use crate::error::ApiError;
use crate::limits::{ADMIN_BODY_BYTES_MAX, MEMBER_CATCHUP_MS, PEER_PROBE_BYTES_MAX, PEER_PROBE_MS};
use crate::raft::{NodeId, Raft};

/// The effective membership (the newest appended, committed or not) if this node may propose a
/// change to it now, else `None`: it must lead and still be a member, voter or learner
/// ([`leads_as_member`]). openraft 0.9 keeps a leader that a committed change removed in the
/// leader state until another is elected, but a membership entry proposed there would come from
/// outside the cluster, and openraft asserts against it (`append_membership`'s `debug_assert!`;
/// simulation seed 40939: the joint-config finisher, its target read before it waited for the
/// membership lock, proposed on a leader that the change holding the lock had just removed).
///
/// Read inside the Raft core (`Raft::with_raft_state`: the engine's own state, where the metrics
/// lag it). Callers hold the membership lock, so no change of this node's comes between this
/// read and their proposal; a change by another leader needs a newer vote, which ends this
/// node's leadership first (openraft then answers the proposal `ForwardToLeader`). `None` also
/// when the Raft core has stopped.
pub(crate) async fn membership_to_change(raft: &Raft, me: NodeId) -> Option<Membership<NodeId, BasicNode>> {
    raft.with_raft_state(move |st| {
        let m = st.membership_state.effective().membership();
        leads_as_member(st.server_state, m, me).then(|| m.clone())
    })
    .await
    .ok()
    .flatten()
}

/// Whether a node in `state` with effective membership `m` may propose a membership change as
/// node `me`: it is the leader and a member (voter or learner) of `m`.
fn leads_as_member(state: ServerState, m: &Membership<NodeId, BasicNode>, me: NodeId) -> bool {
    state == ServerState::Leader && m.get_node(&me).is_some()
}

/// The voters a joint configuration `m` is moving to (its last voter set), if `m` is joint: the
/// change a leader finishes when the leader that began it was lost between its two steps
/// (`node::finish_joint_changes`).
pub(crate) fn joint_target(m: &Membership<NodeId, BasicNode>) -> Option<BTreeSet<NodeId>> {
    let configs = m.get_joint_config();
    if configs.len() < 2 {
        return None;
    }
    configs.last().cloned()
}

/// Refuses a change while `m` is a joint configuration: one membership change at a time. A
/// change begun from a joint configuration `[old, new]` starts from `new`, so a leader that is
/// only in `old` would propose openraft's second step from outside the cluster (simulation seed
/// 60360; openraft asserts against it); `node::finish_joint_changes` completes the change in
/// progress within [`crate::limits::JOINT_REPAIR_MS`], and the client retries (`503`).
fn refuse_while_joint(m: &Membership<NodeId, BasicNode>) -> Result<(), OpError> {
    match joint_target(m) {
        Some(target) => Err(OpError::Fail(ApiError::NotReady(format!(
            "a membership change to voters {target:?} is still in progress; retry once it has finished"
        )))),
        None => Ok(()),
    }
}

fn answer(s: &AppState, led: Led<()>) -> Response {
    match led {
        Led::Here(()) => json(StatusCode::OK, &cluster::view_of(s)),
        Led::Forwarded(r) => r,
    }
}

/// Waits until the leader has replicated to `id` everything up to its last log index, for at
/// most [`MEMBER_CATCHUP_MS`]. True if it caught up.
async fn caught_up(s: &AppState, id: NodeId) -> bool {
    let mut rx = s.raft.metrics();
    let reached = tokio::time::timeout(Duration::from_millis(MEMBER_CATCHUP_MS), async {
        loop {
            {
                let m = rx.borrow_and_update();
                let last = m.last_log_index.unwrap_or(0);
                let matched = m.replication.as_ref().and_then(|r| r.get(&id).cloned().flatten()).map(|l| l.index);
                if matched.is_some_and(|i| i >= last) {
                    return true;
                }
            }
            if rx.changed().await.is_err() {
                return false;
            }
        }
    })
    .await;
    matches!(reached, Ok(true))
}

/// `POST /v1/cluster/members`: add a node as a learner, then (with `"voter": true`) promote it
/// once it has caught up.
#[utoipa::path(
    post,
    path = "/v1/cluster/members",
    operation_id = "add_member",
    summary = "Add a node to the cluster",
    tag = "cluster",
    request_body(content = crate::wire::AddMember, description = "The node to add (a JSON object of at most 64 KiB); start it first"),
    responses(
        (status = 200, description = "The leader's view of the cluster after the change", body = crate::wire::ClusterView),
        (status = 400, description = "`invalid_body` (not a JSON object of these fields, an unknown field, an `id` of 0, an `addr` without `:`); `invalid_parameter` (the node is already a voter and the request asks for another address or a learner)", body = crate::wire::ErrorBody),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::WriteErrors,
    )
)]
pub(super) async fn add(
    State(s): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_request_body(&headers, body, ADMIN_BODY_BYTES_MAX).await?;
    let shape = r#"{"id": N, "addr": "HOST:PORT", "voter": bool}"#;
    let b: crate::wire::AddMember = super::json_object(&bytes, shape, &[])?;
    if b.id == 0 {
        return Err(ApiError::InvalidBody(format!("expected {shape}: node ids are positive integers; 0 is not one")));
    }
    if b.addr.trim().is_empty() || !b.addr.contains(':') {
        return Err(ApiError::InvalidBody(format!("addr {:?} is not HOST:PORT", b.addr)));
    }
    let req = Forwardable::new(method, &uri, headers, bytes);
    let led = on_leader(&s, &req, || async {
        let _serial = s.membership_lock.lock().await;
        let membership = membership_to_change(&s.raft, s.node_id).await.ok_or(OpError::NotLeader)?;
        refuse_while_joint(&membership)?;
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known = membership.get_node(&b.id).map(|n| n.addr.clone());
        if voters.contains(&b.id) {
            return match known {
                Some(a) if a == b.addr && b.voter => Ok(()),
                _ => Err(OpError::Fail(ApiError::InvalidParameter(format!(
                    "node {} is already a voter at {}; remove it first to change its address or role",
                    b.id,
                    known.unwrap_or_default()
                )))),
            };
        }
        if known.as_deref() != Some(b.addr.as_str()) {
            s.raft.add_learner(b.id, BasicNode { addr: b.addr.clone() }, false).await.map_err(op_error)?;
        }
        if !b.voter {
            return Ok(());
        }
        if !caught_up(&s, b.id).await {
            return Err(OpError::Fail(ApiError::NotReady(format!(
                "node {} at {} did not catch up within {MEMBER_CATCHUP_MS} ms; it stays a learner (retry to promote it, or remove it)",
                b.id, b.addr
            ))));
        }
        s.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([b.id])), false).await.map_err(op_error)?;
        tracing::info!(node = b.id, addr = %b.addr, "added voter");
        Ok(())
    })
    .await?;
    Ok(answer(&s, led))
}

/// Counts the voters in `voters` that answer `/healthz` within [`PEER_PROBE_MS`] (this node
/// counts without asking).
async fn live_voters(s: &AppState, voters: &BTreeSet<NodeId>, addrs: &HashMap<NodeId, String>) -> usize {
    let mut live = 0;
    for id in voters {
        if *id == s.node_id {
            live += 1;
            continue;
        }
        let Some(addr) = addrs.get(id) else { continue };
        let url = format!("http://{addr}/healthz");
        let answer = crate::net::get(&s.http, &url, Duration::from_millis(PEER_PROBE_MS), PEER_PROBE_BYTES_MAX).await;
        if answer.is_ok_and(|(status, _)| status.is_success()) {
            live += 1;
        }
    }
    live
}

/// `DELETE /v1/cluster/members/{id}`: remove a voter (through a joint config) or a learner.
#[utoipa::path(
    delete,
    path = "/v1/cluster/members/{id}",
    operation_id = "remove_member",
    summary = "Remove a node from the cluster",
    tag = "cluster",
    params(super::openapi::MemberPath),
    responses(
        (status = 200, description = "The leader's view of the cluster after the change", body = crate::wire::ClusterView),
        (status = 400, description = "`invalid_parameter`: `id` is not an integer, or it is the last voter", body = crate::wire::ErrorBody),
        (status = 404, description = "`not_found`: no member has that id", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::WriteErrors,
    )
)]
pub(super) async fn remove(
    State(s): State<AppState>,
    path: Result<Path<NodeId>, PathRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::InvalidParameter(format!("node id: {e}")))?;
    let _ = body.collect().await;
    let req = Forwardable::new(method, &uri, headers, bytes::Bytes::new());
    let led = on_leader(&s, &req, || async {
        let _serial = s.membership_lock.lock().await;
        let membership = membership_to_change(&s.raft, s.node_id).await.ok_or(OpError::NotLeader)?;
        refuse_while_joint(&membership)?;
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if membership.get_node(&id).is_none() {
            return Err(OpError::Fail(ApiError::NotFound(format!("node {id} is not a member"))));
        }
        if !voters.contains(&id) {
            s.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await.map_err(op_error)?;
            tracing::info!(node = id, "removed learner");
            return Ok(());
        }
        let remaining: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != id).collect();
        if remaining.is_empty() {
            return Err(OpError::Fail(ApiError::InvalidParameter(format!("node {id} is the last voter"))));
        }
        let addrs: HashMap<NodeId, String> = membership.nodes().map(|(i, n)| (*i, n.addr.clone())).collect();
        let live = live_voters(&s, &remaining, &addrs).await;
        let quorum = remaining.len() / 2 + 1;
        if live < quorum {
            return Err(OpError::Fail(ApiError::NotReady(format!(
                "removing node {id} would leave {} voters of which {live} answer; a quorum needs {quorum}: bring voters back first",
                remaining.len()
            ))));
        }
        s.raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await.map_err(op_error)?;
        tracing::info!(node = id, "removed voter");
        Ok(())
    })
    .await?;
    Ok(answer(&s, led))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(configs: Vec<Vec<NodeId>>, learners: &[NodeId]) -> Membership<NodeId, BasicNode> {
        let configs: Vec<BTreeSet<NodeId>> = configs.into_iter().map(|c| c.into_iter().collect()).collect();
        let mut ids: BTreeSet<NodeId> = configs.iter().flatten().copied().collect();
        ids.extend(learners);
        let nodes = ids
            .into_iter()
            .map(|id| (id, BasicNode { addr: format!("n{id}:7000") }))
            .collect::<std::collections::BTreeMap<_, _>>();
        Membership::new(configs, nodes)
    }

    /// Only a leader that is still a member proposes a membership change (seed 40939: a leader
    /// its own change had just removed proposed another, which openraft asserts against).
    #[test]
    fn only_a_leader_that_is_still_a_member_proposes_a_membership_change() {
        let three = membership(vec![vec![1, 2, 3]], &[]);
        assert!(leads_as_member(ServerState::Leader, &three, 2));
        assert!(!leads_as_member(ServerState::Follower, &three, 2), "a follower");
        assert!(!leads_as_member(ServerState::Candidate, &three, 2), "a candidate");
        let without_2 = membership(vec![vec![1, 3]], &[]);
        assert!(!leads_as_member(ServerState::Leader, &without_2, 2), "a leader its change removed");
        let learner_2 = membership(vec![vec![1, 3]], &[2]);
        assert!(leads_as_member(ServerState::Leader, &learner_2, 2), "a leader kept as learner still leads the change");
        let joint = membership(vec![vec![1, 2, 3], vec![1, 3]], &[]);
        assert!(leads_as_member(ServerState::Leader, &joint, 2), "in the old half of a joint config");
    }

    /// A joint configuration is finished towards its last voter set; a uniform one needs nothing.
    #[test]
    fn a_joint_configuration_is_finished_towards_its_last_voter_set() {
        assert_eq!(joint_target(&membership(vec![vec![1, 2, 3], vec![1, 3]], &[])), Some(BTreeSet::from([1, 3])));
        assert_eq!(joint_target(&membership(vec![vec![1, 3]], &[2])), None);
    }

    /// A change is refused (`503`, retried by the client) while another is in progress: begun
    /// from `[{1, 2, 3}, {2, 3}]`, a removal of 3 would start from `{2, 3}`, and its second step
    /// would be proposed by leader 1 from outside the cluster (simulation seed 60360).
    #[test]
    fn a_change_waits_while_another_is_in_progress() {
        let joint = membership(vec![vec![1, 2, 3], vec![2, 3]], &[]);
        assert!(
            matches!(refuse_while_joint(&joint), Err(OpError::Fail(ApiError::NotReady(m))) if m.contains("in progress"))
        );
        assert!(refuse_while_joint(&membership(vec![vec![1, 2, 3]], &[4])).is_ok());
    }
}
