//! The write path: find the leader, propose there, or forward the client's request to it.
//!
//! Owns: the bounded wait for a leader (`503 no_leader` with `Retry-After` after
//! [`LEADER_WAIT_MS`]) and forwarding (SPEC §2.6: the client sees the leader's answer). Must
//! never: propose on a node that is not leader, or retry a request whose outcome is unknown
//! (only a forward that could not connect is retried; the request never reached the leader).

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;
use std::future::Future;
use tokio::time::Instant;

use super::AppState;
use crate::error::ApiError;
use crate::limits::{
    FORWARDED_ANSWER_BYTES_MAX, FORWARD_HOPS_MAX, FORWARD_TIMEOUT_MS, LEADER_RECHECK_MS, LEADER_WAIT_MS,
};
use crate::raft::{Command, NodeId, Outcome};

/// Header counting how many times a request has been forwarded.
pub(super) const HOPS_HEADER: &str = "runnev-forward-hops";

/// The client request as received, kept so it can be forwarded to the leader verbatim.
pub(crate) struct Forwardable {
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Forwardable {
    /// Keeps a request's method, path and query, headers and body.
    pub(crate) fn new(method: Method, uri: &axum::http::Uri, headers: HeaderMap, body: Bytes) -> Self {
        let path_and_query =
            uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| uri.path().to_string());
        Forwardable { method, path_and_query, headers, body }
    }

    fn hops(&self) -> u32 {
        self.headers.get(HOPS_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// What an operation that must run on the leader produced.
pub(crate) enum Led<T> {
    /// It ran here, as leader.
    Here(T),
    /// The leader ran it; its answer, to be returned as is.
    Forwarded(Response),
}

/// Why an operation on the leader did not produce a value.
#[derive(Clone)]
pub(crate) enum OpError {
    /// This node turned out not to be leader (or lost leadership); look for the leader again.
    NotLeader,
    /// This node leads but no majority acknowledges it (the reason): nothing was proposed; wait
    /// for a quorum or another leader like for a leader not known.
    NoQuorum(String),
    /// A definitive error to answer.
    Fail(ApiError),
}

/// Maps openraft's write errors: leadership lost means "look again"; the rest are answers. A
/// fatal error means the Raft core stopped while the write was with it: the entry may have
/// been appended and replicated before, so its outcome is unknown (`503`, retried elsewhere
/// with the same seq), not a definitive `500`.
pub(crate) fn op_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> OpError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => OpError::NotLeader,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => OpError::Fail(ApiError::NotReady(format!(
            "the membership change cannot proceed now ({e}); retry once the previous change has finished"
        ))),
        RaftError::Fatal(e) => OpError::Fail(ApiError::OutcomeUnknown(format!(
            "raft stopped on this node while handling the write ({e}); its outcome is unknown: retry on another node, with the same seq"
        ))),
    }
}

enum ForwardError {
    /// The leader could not be reached; the request was not delivered.
    Unreachable(String),
    /// The request may have been delivered; its outcome is unknown.
    Unknown(String),
}

/// Proposes `make(ts)` through Raft on the leader (here, or by forwarding `req` to it) and
/// returns the applied outcome and log index. `ts` is the leader's stamp, the median of the
/// voters' clocks ([`crate::clock`]). See [`on_leader`] for the waiting and errors.
///
/// Errors: also `503 not_ready` from a leader whose clock is out of bounds (or that could not
/// measure a majority's clocks in time): it stamps nothing and proposes nothing; `507
/// storage_full` from a leader that cannot store the write or have it stored by a majority
/// ([`storage_refusal`]); a follower forwards whatever its own disk holds, since the leader
/// decides.
pub(crate) async fn write(
    s: &AppState,
    req: &Forwardable,
    make: impl Fn(u64) -> Command,
) -> Result<Led<(Outcome, u64)>, ApiError> {
    let make = &make;
    on_leader(s, req, || async move {
        if let Some(alone) = without_quorum(s) {
            return Err(OpError::NoQuorum(alone));
        }
        if let Some(full) = storage_refusal(s) {
            return Err(OpError::Fail(full));
        }
        let ts =
            s.clock.stamp(&s.raft, s.node_id).await.map_err(|e| OpError::Fail(ApiError::NotReady(e.to_string())))?;
        s.proposer.propose(make(ts)).await
    })
    .await
}

/// Why this leader cannot commit a write now, if it cannot: it is cut off from a majority of the
/// voters for longer than [`crate::limits::LEADER_SILENCE_MAX_MS`]
/// ([`super::contact::LeaderContact::cut_off`]: openraft's `millis_since_quorum_ack`, or, while
/// no majority has acknowledged it since its election, its last contact with a leader). A leader
/// cut off from the others keeps its role, as openraft 0.9 steps down only when a membership
/// without it commits; proposing would only wait out the commit timeout and answer "outcome
/// unknown". Checked before anything reaches openraft, so nothing is proposed.
///
/// A leader whose voters went down right after they elected it has no acknowledgement at all;
/// it used to take every write up to the clock check and answer `not_ready` ("cannot tell
/// whether its own clock is right") for as long as the client retried, instead of `no_leader`
/// (`tests/cli.rs`, `a_cluster_without_a_majority_says_no_leader_with_exit_6`).
fn without_quorum(s: &AppState) -> Option<String> {
    s.contact.cut_off(&s.raft, s.node_id).map(|silence| no_quorum_message(s.node_id, silence))
}

/// The `no_leader` message of [`without_quorum`] for leader `node_id` and its `silence`.
fn no_quorum_message(node_id: NodeId, silence: super::contact::Silence) -> String {
    use super::contact::Silence;
    let why = match silence {
        Silence::NoQuorum(d) => format!("no majority of the voters has acknowledged it for {} ms", d.as_millis()),
        Silence::For(_) | Silence::Never => {
            format!("no majority of the voters has acknowledged it since it was elected, and this node {silence}")
        }
    };
    format!("node {node_id} is leader but {why}: a majority of nodes is down or partitioned; nothing was proposed")
}

/// Why the leader cannot take a write for lack of disk, if it cannot: `507 storage_full` when
/// its own disk is low ([`crate::disk`]: the entry would be appended to its log first), or when
/// the voters that did not report a low disk ([`crate::raft::network::PeerDisks`]) are not a
/// majority of every configuration (a joint one has two): the entry could not commit, and the
/// client would wait for nothing. Checked before anything reaches openraft.
fn storage_refusal(s: &AppState) -> Option<ApiError> {
    if let Some(low) = s.disk.refusal() {
        metrics::counter!("runnev_writes_refused_disk_low_total").increment(1);
        return Some(ApiError::StorageFull(format!(
            "the leader, node {}, takes no writes: {}",
            s.node_id,
            low.describe()
        )));
    }
    let configs = s.raft.metrics().borrow().membership_config.membership().get_joint_config().clone();
    for voters in configs {
        let low: Vec<NodeId> = voters.iter().copied().filter(|v| *v != s.node_id && s.peer_disks.is_low(*v)).collect();
        if !low.is_empty() && voters.len() - low.len() <= voters.len() / 2 {
            metrics::counter!("runnev_writes_refused_disk_low_total").increment(1);
            return Some(ApiError::StorageFull(format!(
                "a majority of the voters {voters:?} cannot store the write: nodes {low:?} report a low disk; \
                 free space on them (the cluster takes writes again by itself)"
            )));
        }
    }
    None
}

/// Runs `op` if this node is leader, else forwards `req` to the leader, waiting up to
/// [`LEADER_WAIT_MS`] for one to be known, heard from (an RPC from it within
/// [`crate::limits::LEADER_SILENCE_MAX_MS`], [`super::contact::LeaderContact::follower_silence`])
/// and reachable.
///
/// Errors: `503 no_leader` when no leader answered in time, or the leader failed or fell
/// silent mid-request (outcome unknown: retry, with the same seq to stay idempotent); `503 not_ready` at once when
/// this node's Raft core has stopped (it can no longer tell who leads, nor propose); whatever
/// `op` fails with.
pub(crate) async fn on_leader<T, F, Fut>(s: &AppState, req: &Forwardable, mut op: F) -> Result<Led<T>, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OpError>>,
{
    let deadline = Instant::now() + Duration::from_millis(LEADER_WAIT_MS);
    let mut metrics = s.raft.metrics();
    let mut last_problem = String::from("no leader is known");
    loop {
        if let Some(why) = super::raft_stopped(&s.raft) {
            return Err(super::raft_stopped_error(&why));
        }
        let (leader, leader_addr, seen) = {
            let m = metrics.borrow_and_update();
            let leader = super::known_leader(&m, s.node_id);
            let addr = leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
            (leader, addr, leader_view(&m, s.node_id))
        };
        match (leader, leader_addr) {
            (Some(l), _) if l == s.node_id => match op().await {
                Ok(v) => return Ok(Led::Here(v)),
                Err(OpError::NotLeader) => last_problem = "leadership moved while proposing".into(),
                Err(OpError::NoQuorum(why)) => last_problem = why,
                Err(OpError::Fail(e)) => return Err(e),
            },
            // A leader that sends this node nothing (stopped, frozen, cut off from it) would
            // not answer the write either: wait for one that does, rather than hold the client
            // on a connection that a frozen process accepts and never answers.
            (Some(l), Some(addr)) if req.hops() < FORWARD_HOPS_MAX => match s.contact.follower_silence() {
                Some(silence) => last_problem = format!("leader {l} is not heard from here: this node {silence}"),
                None => match forward_while_heard(s, &addr, req).await {
                    Ok(resp) => return Ok(Led::Forwarded(resp)),
                    Err(ForwardError::Unreachable(e)) => {
                        last_problem = format!("leader {l} at {addr} is unreachable: {e}")
                    }
                    Err(ForwardError::Unknown(e)) => {
                        return Err(ApiError::OutcomeUnknown(format!(
                            "leader {l} failed while handling the request ({e}); its outcome is unknown: retry, with the same seq"
                        )))
                    }
                },
            },
            (Some(l), _) => last_problem = format!("leader {l} is not reachable from here"),
            (None, _) => {}
        }
        // A node removed without being told hears from no leader again: rather than wait out
        // LEADER_WAIT_MS, say so at once, so the client tries a current member.
        if let Some(why) = super::not_a_member(s) {
            return Err(ApiError::NoLeader(why));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ApiError::NoLeader(format!(
                "no leader could take the request within {LEADER_WAIT_MS} ms ({last_problem}); retry later"
            )));
        }
        // Wake when this node's view of the leader changes, and re-check at least every
        // LEADER_RECHECK_MS. Not at every metrics change: a refused proposal changes the metrics
        // itself, and waking on that retried a proposal that openraft refuses at once without
        // a pause (simulation seed 6 with `--membership`). A closed channel means the core has
        // stopped: the check at the top answers then (waiting on a closed channel would spin;
        // simulation seed 4).
        let pause = (deadline - now).min(Duration::from_millis(LEADER_RECHECK_MS));
        let _ = tokio::time::timeout(pause, async {
            while metrics.changed().await.is_ok() {
                if leader_view(&metrics.borrow_and_update(), s.node_id) != seen {
                    return;
                }
            }
        })
        .await;
    }
}

/// What [`on_leader`] acts on in this node's Raft metrics: the leader it knows
/// ([`super::known_leader`]), its own role and term, and the membership that gives the leader's
/// address. A change of any of them may let a request through; nothing else can.
fn leader_view(
    m: &openraft::RaftMetrics<NodeId, BasicNode>,
    me: NodeId,
) -> (Option<NodeId>, openraft::ServerState, u64, Option<openraft::LogId<NodeId>>) {
    (super::known_leader(m, me), m.state, m.current_term, *m.membership_config.log_id())
}

/// [`forward`], given up (outcome unknown) once this node stops hearing from a leader: a
/// leader that froze or was cut off while it held the request sends no more heartbeats, and
/// the client then hears within about [`crate::limits::LEADER_SILENCE_MAX_MS`] instead of
/// [`FORWARD_TIMEOUT_MS`], which is longer than a client waits for one answer.
async fn forward_while_heard(s: &AppState, addr: &str, req: &Forwardable) -> Result<Response, ForwardError> {
    tokio::select! {
        answer = forward(s, addr, req) => answer,
        silence = s.contact.silent(Duration::from_millis(LEADER_RECHECK_MS)) => {
            Err(ForwardError::Unknown(format!("it went silent while it held the request: this node {silence}")))
        }
    }
}

async fn forward(s: &AppState, addr: &str, req: &Forwardable) -> Result<Response, ForwardError> {
    let mut builder = hyper::Request::builder()
        .method(req.method.clone())
        .uri(format!("http://{addr}{}", req.path_and_query))
        .header(HOPS_HEADER, HeaderValue::from(req.hops() + 1));
    // The client's token goes with its request: the leader checks it too.
    for name in [axum::http::header::CONTENT_TYPE, axum::http::header::AUTHORIZATION] {
        if let Some(v) = req.headers.get(&name) {
            builder = builder.header(name, v);
        }
    }
    let request = builder.body(Full::new(req.body.clone())).map_err(|e| ForwardError::Unknown(e.to_string()))?;
    let exchange = async {
        let resp = s.http.request(request).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::Unreachable(e.to_string())
            } else {
                ForwardError::Unknown(e.to_string())
            }
        })?;
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, FORWARDED_ANSWER_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| ForwardError::Unknown(format!("reading the leader's answer: {e}")))?
            .to_bytes();
        let mut out = Response::new(Body::from(bytes));
        *out.status_mut() = parts.status;
        for name in [axum::http::header::CONTENT_TYPE, axum::http::header::RETRY_AFTER] {
            if let Some(v) = parts.headers.get(&name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        for name in ["runnev-node", "runnev-leader", crate::error::OUTCOME_HEADER] {
            if let Some(v) = parts.headers.get(name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        Ok(out)
    };
    match tokio::time::timeout(Duration::from_millis(FORWARD_TIMEOUT_MS), exchange).await {
        Ok(r) => r,
        Err(_) => Err(ForwardError::Unknown(format!("no answer within {FORWARD_TIMEOUT_MS} ms"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::contact::Silence;

    /// The no_leader message says which silence cut the leader off: a majority's last
    /// acknowledgement, or none since its election and none from a leader either.
    #[test]
    fn the_no_quorum_message_says_which_silence_cut_the_leader_off() {
        let cut = no_quorum_message(1, Silence::NoQuorum(Duration::from_millis(2_500)));
        assert!(
            cut.starts_with("node 1 is leader but no majority of the voters has acknowledged it for 2500 ms"),
            "{cut}"
        );
        assert!(cut.contains("a majority of nodes is down or partitioned; nothing was proposed"), "{cut}");
        let since = no_quorum_message(1, Silence::For(Duration::from_secs(17)));
        assert!(since.contains("since it was elected"), "{since}");
        assert!(since.contains("has not heard from a leader for 17000 ms"), "{since}");
        assert!(since.contains("a majority of nodes is down or partitioned"), "{since}");
        let never = no_quorum_message(1, Silence::Never);
        assert!(
            never.contains("since it was elected, and this node has not heard from a leader since it started"),
            "{never}"
        );
    }
}
