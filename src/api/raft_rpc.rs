//! The server side of the Raft transport ([`crate::raft::network`]): decode a peer's RPC, hand
//! it to openraft, encode the answer.
//!
//! Owns: nothing but the translation. Must never: panic on a peer's bytes; a body that does not
//! decode gets `400` and reaches no Raft state; nor hand openraft an RPC that, with peer TLS on,
//! did not come over a connection whose verified certificate names the node the RPC claims as
//! its sender (the candidate of a vote, the leader of an append or snapshot): that is `403
//! forbidden` (`super::auth::check_peer`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::auth::{check_any_node, check_peer};
use super::{read_body, AppState};
use crate::error::ApiError;
use crate::limits::{PROTOCOL_WARN_EVERY_MS, RAFT_RPC_BYTES_MAX};
use crate::raft::network::{RaftRpc, DISK_LOW_HEADER, PROTOCOL_HEADER, PROTOCOL_VERSION};
use axum::extract::Request;

/// The node an RPC's vote names: the candidate of a vote request, the leader of an append or
/// snapshot.
fn sender(vote: &openraft::Vote<crate::raft::NodeId>) -> Option<crate::raft::NodeId> {
    vote.leader_id().voted_for()
}

/// When a protocol mismatch was last logged.
static MISMATCH_WARNED: std::sync::Mutex<Option<tokio::time::Instant>> = std::sync::Mutex::new(None);

/// Refuses an RPC that speaks another protocol version than [`PROTOCOL_VERSION`] (a missing
/// header is version 1), before its body is read: an incompatible peer's bytes never reach
/// openraft. Logs the mismatch at most every [`PROTOCOL_WARN_EVERY_MS`].
///
/// Errors: `400 protocol_mismatch`, naming both versions.
fn check_protocol(headers: &HeaderMap) -> Result<(), ApiError> {
    let theirs = match headers.get(PROTOCOL_HEADER) {
        None => return Ok(()),
        Some(v) => v.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()),
    };
    if theirs == Some(PROTOCOL_VERSION) {
        return Ok(());
    }
    let said = theirs.map_or_else(|| "an unreadable version".to_string(), |v| format!("version {v}"));
    let message = format!(
        "this node speaks Raft RPC protocol version {PROTOCOL_VERSION}; the peer sent {said}: \
         run the same runnev release on every node (upgrade one node at a time)"
    );
    let now = tokio::time::Instant::now();
    let mut warned = MISMATCH_WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if warned.is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_millis(PROTOCOL_WARN_EVERY_MS)) {
        *warned = Some(now);
        tracing::warn!(theirs = ?theirs, ours = PROTOCOL_VERSION, "refusing a Raft RPC: {message}");
    }
    Err(ApiError::ProtocolMismatch(message))
}

async fn decode_rpc<T: DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes = read_body(body, RAFT_RPC_BYTES_MAX, false).await?;
    postcard::from_bytes(&bytes).map_err(|e| ApiError::InvalidBody(format!("not a Raft RPC: {e}")))
}

fn encode_answer<T: Serialize>(answer: &T) -> Response {
    match postcard::to_stdvec(answer) {
        Ok(bytes) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(e) => ApiError::Internal(format!("encoding a Raft answer: {e}")).into_response(),
    }
}

/// Takes a peer's RPC of type `T`: checks its protocol version, and (with peer TLS) that the
/// connection presented a node certificate, before the body is read; decodes the body; then
/// checks that the certificate names the node the RPC's `vote` claims as its sender. Only an RPC
/// that passes all of it is handed to openraft.
///
/// Errors: `400 protocol_mismatch`, `403 forbidden`, `400 invalid_body`, `413
/// payload_too_large`.
async fn admit<T: DeserializeOwned>(
    s: &AppState,
    req: Request,
    vote: impl Fn(&T) -> &openraft::Vote<crate::raft::NodeId>,
) -> Result<T, ApiError> {
    let (parts, body) = req.into_parts();
    check_protocol(&parts.headers)?;
    check_any_node(s, &parts.extensions)?;
    let rpc: T = decode_rpc(body).await?;
    check_peer(s, &parts.extensions, sender(vote(&rpc)))?;
    Ok(rpc)
}

/// Refuses the append or snapshot of a leader that this node, its vote gate closed (it may have
/// lost its disk), cannot tell from a deposed one yet ([`crate::raft::vote_gate`]): `503
/// not_ready`, as if it were down, so its acknowledgement makes up no majority for that leader.
fn follows(s: &AppState, vote: &openraft::Vote<crate::raft::NodeId>) -> Result<(), ApiError> {
    let Some(leader) = sender(vote) else { return Ok(()) };
    s.vote_gate.admits_leader(leader, vote.leader_id().term).map_err(ApiError::NotReady)
}

/// `POST /raft/append`: append-entries (Raft paper §5.3). One this node accepts (any answer but
/// "higher vote") counts as hearing from a leader ([`super::contact`]). A node whose vote gate
/// is closed answers a leader it cannot tell from a deposed one `503 not_ready` (`follows`).
///
/// While this node's disk is low ([`crate::disk`]) it takes no new entries, and never lets
/// them reach openraft (whose core would stop for good on the `ENOSPC` they would meet): it
/// hands openraft the request without its entries, a heartbeat, so the leader's term, the
/// log's consistency check and the commit index still apply, and answers that it matched up to
/// the request's `prev_log_id` only (`PartialSuccess`), with [`DISK_LOW_HEADER`]. Every answer
/// while low carries the header, heartbeats too, so the leader knows ([`PeerDisks`]).
///
/// [`DISK_LOW_HEADER`]: crate::raft::network::DISK_LOW_HEADER
/// [`PeerDisks`]: crate::raft::network::PeerDisks
pub async fn append(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    use openraft::raft::AppendEntriesResponse;
    let mut req = admit(&s, req, |r: &openraft::raft::AppendEntriesRequest<crate::raft::TypeConfig>| &r.vote).await?;
    follows(&s, &req.vote)?;
    let low = s.disk.refusal().is_some();
    let refused = low && !req.entries.is_empty();
    if refused {
        metrics::counter!("runnev_appends_refused_disk_low_total").increment(1);
        req.entries.clear();
    }
    let prev = req.prev_log_id;
    let matched = req.entries.last().map(|e| e.log_id).or(prev);
    let (leader_term, leader_commit) = (req.vote.leader_id().term, req.leader_commit);
    let mut answer = s.raft.append_entries(req).await;
    if matches!(&answer, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
        s.contact.heard();
    }
    // A node catching up after losing its disk (or unsure whether it did) votes again once it
    // holds an entry its leader committed in the leader's own term: every entry committed before
    // (the ones it may have acknowledged) precedes that one in the leader's log (Raft §5.4.2), so
    // it now holds them. Either this append matched past such a commit, or an entry of the
    // leader's term was applied already (a snapshot installed, an earlier append).
    if s.vote_gate.closed().is_some()
        && matches!(&answer, Ok(AppendEntriesResponse::Success))
        && (leader_commit
            .is_some_and(|c| c.leader_id.term == leader_term && matched.is_some_and(|m| m.index >= c.index))
            || applied_in_term(&s, leader_term))
    {
        open_gate(&s, leader_term).await;
    }
    if refused {
        if let Ok(r @ AppendEntriesResponse::Success) = &mut answer {
            *r = AppendEntriesResponse::PartialSuccess(prev);
        }
    }
    let mut resp = encode_answer(&answer);
    if low {
        resp.headers_mut().insert(DISK_LOW_HEADER, HeaderValue::from_static("1"));
    }
    Ok(resp)
}

/// `POST /raft/vote`: request-vote (Raft paper §5.2). A node whose vote gate is closed
/// ([`crate::raft::vote_gate`]: it lost its disk, or its data dir is empty and it does not know
/// yet whether the cluster is new) answers `503 not_ready` instead, as if it were down: its vote
/// could elect a node lacking entries it had acknowledged. The exception is a candidate that
/// reported a membership in which every majority includes it ([`VoteGate::may_vote_for`]): it
/// holds every committed entry.
///
/// [`VoteGate::may_vote_for`]: crate::raft::vote_gate::VoteGate::may_vote_for
pub async fn vote(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::VoteRequest<crate::raft::NodeId>| &r.vote).await?;
    if let Some(candidate) = sender(&req.vote) {
        s.vote_gate.may_vote_for(candidate).map_err(ApiError::NotReady)?;
    } else if let Some(closed) = s.vote_gate.closed() {
        return Err(ApiError::NotReady(closed.describe().into()));
    }
    Ok(encode_answer(&s.raft.vote(req).await))
}

/// `POST /raft/snapshot`: one chunk of install-snapshot (Raft paper §7). One this node accepts
/// (its vote is not above the sender's) counts as hearing from a leader. As an append, refused
/// `503 not_ready` from a leader a node with a closed vote gate cannot trust yet (`follows`).
///
/// While this node's disk is low it refuses every chunk with `507 storage_full` and
/// [`DISK_LOW_HEADER`], before openraft sees it: installing writes the whole snapshot.
///
/// [`DISK_LOW_HEADER`]: crate::raft::network::DISK_LOW_HEADER
pub async fn snapshot(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::InstallSnapshotRequest<crate::raft::TypeConfig>| &r.vote).await?;
    follows(&s, &req.vote)?;
    if let Some(low) = s.disk.refusal() {
        let mut resp =
            ApiError::StorageFull(format!("this node takes no snapshot now: {}", low.describe())).into_response();
        resp.headers_mut().insert(DISK_LOW_HEADER, HeaderValue::from_static("1"));
        return Ok(resp);
    }
    let vote = req.vote;
    let answer = match (req.done, req.meta.last_log_id) {
        // From the last chunk until the install has finished (openraft answers it then), the
        // log store leaves the purge through the snapshot to the install (`LogStore::purge`).
        // The guard and openraft's call live in a task of their own, which runs to openraft's
        // answer even when this handler is dropped: the leader's RPC times out on a slow disk
        // and hangs up while openraft's core is still saving the vote ahead of that purge.
        // Dropped with the handler, the guard let the purge through the snapshot become durable
        // ahead of the install, a crash came in between, and the node restarted with its log
        // purged through 507 and nothing applied (simulation seed 66421).
        (true, Some(last)) => {
            let install = s.store.begin_install(last.index);
            let raft = s.raft.clone();
            let task = tokio::spawn(async move {
                let answer = raft.install_snapshot(req).await;
                drop(install);
                answer
            });
            match task.await {
                Ok(answer) => answer,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(ApiError::NotReady("this node is shutting down".into())),
            }
        }
        _ => s.raft.install_snapshot(req).await,
    };
    if matches!(&answer, Ok(r) if r.vote <= vote) {
        s.contact.heard();
        // A snapshot of the leader's own term, installed, is a commit of that term this node
        // holds, as in `append` (a node kept behind by snapshots alone, simulation seed 5281).
        if s.vote_gate.closed().is_some() && applied_in_term(&s, vote.leader_id().term) {
            open_gate(&s, vote.leader_id().term).await;
        }
    }
    Ok(encode_answer(&answer))
}

/// Whether the last entry this node applied was written in `term` (by that term's leader):
/// applied entries are committed, so this node holds an entry committed in `term`.
fn applied_in_term(s: &AppState, term: u64) -> bool {
    s.raft.metrics().borrow().last_applied.is_some_and(|a| a.leader_id.term == term)
}

/// Records durably that a leader of `term` caught this node up, then opens its vote gate
/// ([`crate::raft::vote_gate`]); a failed write leaves it closed (the next append tries again).
/// Both happen in the storage call, which runs to its end even when this handler is dropped
/// while it waits (the leader's RPC timed out on a slow disk): awaited here and then opened,
/// the record was written and the gate left closed, a node whose disk said it votes and which
/// refused every vote (simulation seed 8130: the other voter then lost its disk, and no leader
/// could be elected again).
async fn open_gate(s: &AppState, term: u64) {
    let (store, gate) = (s.store.clone(), s.vote_gate.clone());
    match crate::storage::blocking(move || store.caught_up().map(|()| gate.caught_up())).await {
        Ok(()) => tracing::info!(term, "caught up by a leader: voting again"),
        Err(e) => tracing::warn!(error = %e, "recording that this node caught up"),
    }
}

/// `POST /raft/groups/{group}/{rpc}` ([`crate::raft::network::GROUP_RPC_ROUTE`]): the RPC `rpc`
/// (`append`, `vote` or `snapshot`) of Raft group `group`, served as [`append`], [`vote`] and
/// [`snapshot`] serve the cluster's group when this node hosts `group`
/// ([`crate::storage::layout`]).
///
/// Errors: `404 not_found` for a group this node does not host or an RPC name it does not
/// know, before anything else (the body is not read; no Raft state is touched); then those of
/// the RPC.
pub async fn group(
    State(s): State<AppState>,
    axum::extract::Path((group, rpc)): axum::extract::Path<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    let hosted = s.store.group();
    if group.parse::<u32>().ok() != Some(hosted.0) {
        return Err(ApiError::NotFound(format!("this node hosts no Raft group {group:?} (it hosts group {hosted})")));
    }
    match RaftRpc::from_name(&rpc) {
        Some(RaftRpc::Append) => append(State(s), req).await,
        Some(RaftRpc::Vote) => vote(State(s), req).await,
        Some(RaftRpc::Snapshot) => snapshot(State(s), req).await,
        None => Err(ApiError::NotFound(format!("no Raft RPC {rpc:?}: append, vote or snapshot"))),
    }
}

/// `GET /raft/clock`: this node's wall clock, ms since the Unix epoch, as decimal text, for the
/// other nodes' measurements ([`crate::clock`]).
pub async fn clock(State(s): State<AppState>, req: Request) -> Response {
    if let Err(e) = check_any_node(&s, req.extensions()) {
        return e.into_response();
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], s.clock.wall_ms().to_string()).into_response()
}

/// `GET /raft/formation?from=ID`: what this node is to a fresh peer forming the cluster
/// ([`crate::raft::formation`], SPEC §5), as JSON [`crate::wire::FormationAnswer`]. Nodes only
/// (with peer TLS, a node certificate, which must name node `from` when `from` is given). A
/// pristine node records that node `from` saw it fresh, which later lets it vote in the cluster
/// `from` says it formed; a probe without `from` (an operator's look) records nothing.
///
/// Errors: `400 invalid_parameter` for a `from` that is not a node id; `403` without a node
/// certificate, or with one that names another node than `from`; `500` when the store fails.
pub async fn formation(
    State(s): State<AppState>,
    q: super::streams::QueryPairs,
    req: Request,
) -> Result<Response, ApiError> {
    let from = super::streams::param_u64(&super::streams::query(q)?, "from", false)?;
    match from {
        Some(id) => check_peer(&s, req.extensions(), Some(id))?,
        None => check_any_node(&s, req.extensions())?,
    }
    let (store, raft) = (s.store.clone(), s.raft.clone());
    let answer = crate::storage::blocking(move || crate::raft::formation::answer_probe(&store, &raft, from)).await?;
    Ok(axum::Json(answer).into_response())
}
