//! Cluster endpoints: `GET /v1/cluster`, `/healthz`, `/readyz` and `/metrics` (SPEC §3).
//!
//! Owns: how this node describes its Raft state and health. Must never: block on Raft; everything
//! comes from openraft's metrics channel and the store's counters.

use super::{json, AppState};
use crate::clock::Verdict;
use crate::raft::NodeId;
use crate::storage::layout::GroupId;
use crate::wire::{ClockView, ClusterView, Member};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// This node's view of the cluster, from openraft's metrics and the store's counters.
pub(super) fn view_of(s: &AppState) -> ClusterView {
    let m = s.raft.metrics().borrow().clone();
    let leader = super::known_leader(&m, s.node_id);
    let leading = leader == Some(s.node_id);
    let membership = m.membership_config.membership();
    let matched = |id: &NodeId| -> Option<u64> {
        if !leading {
            return None;
        }
        if *id == s.node_id {
            return m.last_log_index;
        }
        m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten()).map(|l| l.index)
    };
    // On the leader: entries behind its last log index. One that has matched nothing yet is
    // behind by the whole log.
    let lag = |id: &NodeId| -> Option<u64> {
        if !leading {
            return None;
        }
        let last = m.last_log_index.unwrap_or(0);
        Some(last.saturating_sub(matched(id).unwrap_or(0)))
    };
    let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let offsets = s.clock.peer_offsets();
    let members = membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            addr: node.addr.clone(),
            voter: voters.contains(id),
            matched_index: matched(id),
            clock_offset_ms: if *id == s.node_id { Some(0) } else { offsets.get(id).copied() },
            disk_low: match (leading, *id == s.node_id) {
                (false, _) => None,
                (true, true) => Some(s.disk.last().low),
                (true, false) => Some(s.peer_disks.is_low(*id)),
            },
            lag_entries: lag(id),
        })
        .collect();
    let a = s.clock.assess(s.node_id, &voters);
    let clock = ClockView {
        offset_ms: a.offset_ms,
        max_offset_ms: s.clock.max_offset_ms(),
        state: match a.verdict {
            Verdict::InBounds => "in_bounds",
            Verdict::OutOfBounds => "out_of_bounds",
            Verdict::Unverified => "unverified",
        }
        .to_string(),
        known_voters: a.known as u64,
    };
    let applied = s.store.applied_index();
    let raft_stopped = super::raft_stopped(&s.raft);
    ClusterView {
        node_id: s.node_id,
        // A stopped core's last view of the leader is history, possibly this very node.
        leader_id: leader.filter(|_| raft_stopped.is_none()),
        state: format!("{:?}", m.state),
        term: m.current_term,
        commit_index: s.store.committed_index().max(applied),
        applied_index: applied,
        last_log_index: m.last_log_index,
        snapshot_index: m.snapshot.map(|l| l.index),
        purged_index: m.purged.map(|l| l.index),
        raft_stopped,
        members,
        voter_sets: voter_sets(membership),
        clock: Some(clock),
        disk: Some({
            let d = s.disk.last();
            crate::wire::DiskView { free_bytes: d.free_bytes, min_free_bytes: d.min_free_bytes, low: d.low }
        }),
    }
}

/// The voter sets of `membership`, each in ascending id order: one, or two while a joint
/// configuration is in effect (Raft paper §6: the old voters, then the new; openraft's
/// `Membership::get_joint_config`).
fn voter_sets(membership: &openraft::Membership<NodeId, openraft::BasicNode>) -> Vec<Vec<u64>> {
    membership.get_joint_config().iter().map(|set| set.iter().copied().collect()).collect()
}

/// `GET /v1/cluster`.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    operation_id = "get_cluster",
    summary = "This node's view of the cluster",
    tag = "cluster",
    responses(
        (status = 200, description = "This node's view of the cluster", body = ClusterView),
        super::openapi::AuthErrors,
    )
)]
pub(super) async fn view(State(s): State<AppState>) -> Response {
    json(StatusCode::OK, &view_of(&s))
}

/// `GET /healthz`: `200 ok` while the process can do its work, `503` once its Raft core has
/// stopped for good (a storage failure, a panic or an internal error of openraft stops it and
/// nothing in the process restarts it: the process exits 2 s later for its supervisor to
/// restart it, and a liveness probe that looks first sees this). SPEC §3 says "process is
/// up"; this is stricter on purpose: a process up without Raft serves nothing.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    summary = "Liveness probe",
    tag = "node",
    responses(
        (status = 200, description = "`ok`: the process serves HTTP and its Raft core runs", content_type = "text/plain", body = String),
        (status = 503, description = "`raft stopped: …`: the process exits 2 s later for its supervisor to restart it", content_type = "text/plain", body = String),
    )
)]
pub(super) async fn health(State(s): State<AppState>) -> Response {
    match super::raft_stopped(&s.raft) {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("raft stopped: {why}\n")).into_response(),
        None => (StatusCode::OK, "ok\n").into_response(),
    }
}

/// `GET /readyz`: 200 when this node knows a leader and has applied all it knows is committed;
/// 503 as soon as its Raft core has stopped, and while its disk is low (it takes no new
/// entries, so a follower falls behind without knowing it and a leader refuses writes).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    summary = "Readiness probe",
    tag = "node",
    responses(
        (status = 200, description = "`ready`: a member that knows a leader and has applied everything it knows is committed", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready, with the reason: `no leader known`, `applying: A of C committed`, `not a member of the cluster`, `removed: …` (its peers' committed membership no longer names it), `leader without a quorum`, `leader whose clock is out of bounds`, `disk low: …`, `raft stopped: …`", content_type = "text/plain", body = String),
    )
)]
pub(super) async fn ready(State(s): State<AppState>) -> Response {
    let v = view_of(&s);
    if let Some(why) = &v.raft_stopped {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("raft stopped: {why}\n")).into_response();
    }
    if let Some(d) = v.disk.as_ref().filter(|d| d.low) {
        // A follower whose disk is low is sent heartbeats only, so its commit index stops where
        // its log does: it would look caught up while every read it serves falls further behind.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "disk low: {} bytes free, {} kept free; this node takes no new entries until space is freed\n",
                d.free_bytes, d.min_free_bytes
            ),
        )
            .into_response();
    }
    let quorum_ack_ms = s.raft.metrics().borrow().millis_since_quorum_ack;
    if v.leader_id == Some(s.node_id) && quorum_ack_ms.is_none_or(|ms| ms > crate::limits::LEADER_SILENCE_MAX_MS) {
        // A leader that has not heard from a quorum lately cannot commit: not a place for writes.
        // The bound is the write path's (it answers `no_leader` from the same silence), so a
        // loaded machine's late heartbeats do not make a working leader look cut off.
        return (StatusCode::SERVICE_UNAVAILABLE, "leader without a quorum\n").into_response();
    }
    if v.leader_id == Some(s.node_id) && v.clock.as_ref().is_some_and(|c| c.state == "out_of_bounds") {
        // It refuses writes until another node leads (crate::clock).
        return (StatusCode::SERVICE_UNAVAILABLE, "leader whose clock is out of bounds\n").into_response();
    }
    if !v.members.iter().any(|m| m.id == s.node_id) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not a member of the cluster\n").into_response();
    }
    if let Some(why) = super::not_a_member(&s) {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("removed: {why}\n")).into_response();
    }
    match v.leader_id {
        Some(_) if v.applied_index >= v.commit_index => (StatusCode::OK, "ready\n").into_response(),
        Some(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("applying: {} of {} committed\n", v.applied_index, v.commit_index),
        )
            .into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no leader known\n").into_response(),
    }
}

/// Sets `runnev_raft_follower_lag_entries{group, follower}` from the view's `lag_entries`: on
/// the leader of `group`, each follower's (and learner's) lag in log entries (Raft paper §5.3,
/// `matchIndex`). On any other node every follower it reported while it led that group is set
/// back to 0, so only the leader's figures are ever above 0.
fn record_follower_lag(group: GroupId, v: &ClusterView) {
    use std::collections::BTreeSet;
    use std::sync::{Mutex, OnceLock};
    static REPORTED: OnceLock<Mutex<BTreeSet<(GroupId, u64)>>> = OnceLock::new();
    let lags: Vec<(u64, u64)> =
        v.members.iter().filter(|m| m.id != v.node_id).filter_map(|m| Some((m.id, m.lag_entries?))).collect();
    let mut reported = REPORTED.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner());
    let g = group.to_string();
    for (_, id) in reported.iter().filter(|(of, _)| *of == group) {
        if !lags.iter().any(|(f, _)| f == id) {
            metrics::gauge!("runnev_raft_follower_lag_entries", "group" => g.clone(), "follower" => id.to_string())
                .set(0.0);
        }
    }
    for (id, lag) in &lags {
        metrics::gauge!("runnev_raft_follower_lag_entries", "group" => g.clone(), "follower" => id.to_string())
            .set(*lag as f64);
        reported.insert((group, *id));
    }
}

/// `GET /metrics`: Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    summary = "Prometheus metrics",
    tag = "node",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4 (`text/plain; version=0.0.4`)", content_type = "text/plain", body = String),
        super::openapi::AuthErrors,
    )
)]
pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    let v = view_of(&s);
    let group = s.store.group();
    let g = || group.to_string();
    metrics::gauge!("runnev_raft_term", "group" => g()).set(v.term as f64);
    metrics::gauge!("runnev_raft_commit_index", "group" => g()).set(v.commit_index as f64);
    metrics::gauge!("runnev_raft_applied_index", "group" => g()).set(v.applied_index as f64);
    let leading = if v.leader_id == Some(s.node_id) { 1.0 } else { 0.0 };
    metrics::gauge!("runnev_raft_is_leader", "group" => g()).set(leading);
    // 0 once the Raft core has stopped for good (then /healthz fails too): alert on it.
    metrics::gauge!("runnev_raft_running", "group" => g()).set(if v.raft_stopped.is_none() { 1.0 } else { 0.0 });
    record_follower_lag(group, &v);
    let body = s.prometheus.as_ref().map(|p| p.render()).unwrap_or_default();
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::voter_sets;
    use openraft::{BasicNode, Membership};
    use std::collections::{BTreeMap, BTreeSet};

    fn membership(configs: &[&[u64]]) -> Membership<u64, BasicNode> {
        let nodes: BTreeMap<u64, BasicNode> =
            (1..=3).map(|id| (id, BasicNode { addr: format!("127.0.0.1:700{id}") })).collect();
        Membership::new(configs.iter().map(|c| c.iter().copied().collect::<BTreeSet<u64>>()).collect(), nodes)
    }

    #[test]
    fn a_joint_configuration_shows_both_voter_sets() {
        assert_eq!(voter_sets(&membership(&[&[3, 1, 2]])), vec![vec![1, 2, 3]]);
        // Node 2 being added back to voters 1 and 3 (simulation seed 40331): every leader needs
        // a majority of {1, 3}, both of them, which `members[].voter` alone does not show.
        assert_eq!(voter_sets(&membership(&[&[1, 3], &[1, 2, 3]])), vec![vec![1, 3], vec![1, 2, 3]]);
    }
}
