//! The server side of the Raft transport ([`crate::raft::network`]): decode a peer's RPC, hand
//! it to openraft, encode the answer.
//!
//! Owns: nothing but the translation. Must never: panic on a peer's bytes; a body that does not
//! decode gets `400` and reaches no Raft state; nor hand openraft an RPC that, with peer TLS on,
//! did not come over a connection whose verified certificate names the node the RPC claims as
//! its sender (the candidate of a vote, the leader of an append or snapshot): that is `403
//! forbidden` ([`super::auth::check_peer`]).

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
use crate::raft::network::{DISK_LOW_HEADER, PROTOCOL_HEADER, PROTOCOL_VERSION};
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
    let bytes = read_body(body, RAFT_RPC_BYTES_MAX).await?;
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

/// `POST /raft/append`: append-entries (Raft paper §5.3). One this node accepts (any answer but
/// "higher vote") counts as hearing from a leader ([`super::contact`]).
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
    // A node catching up after losing its disk votes again once it holds an entry its leader
    // committed in the leader's own term: every entry committed before (the ones it may have
    // acknowledged) precedes that one in the leader's log (Raft §5.4.2), so it now holds them.
    if s.catching_up.load(std::sync::atomic::Ordering::Acquire)
        && matches!(&answer, Ok(AppendEntriesResponse::Success))
        && leader_commit.is_some_and(|c| c.leader_id.term == leader_term && matched.is_some_and(|m| m.index >= c.index))
    {
        let store = s.store.clone();
        match crate::storage::blocking(move || store.caught_up()).await {
            Ok(()) => {
                s.catching_up.store(false, std::sync::atomic::Ordering::Release);
                tracing::info!(term = leader_term, "caught up by a leader after losing the disk: voting again");
            }
            Err(e) => tracing::warn!(error = %e, "recording that this node caught up"),
        }
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

/// `POST /raft/vote`: request-vote (Raft paper §5.2). A node catching up after losing its disk
/// (`raft::formation::guard_wiped_node`) answers `503 not_ready` instead, as if it were down: its
/// vote could elect a node lacking entries it had acknowledged.
pub async fn vote(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::VoteRequest<crate::raft::NodeId>| &r.vote).await?;
    if s.catching_up.load(std::sync::atomic::Ordering::Acquire) {
        return Err(ApiError::NotReady(
            "this node lost its disk and grants no vote until a leader has caught it up".into(),
        ));
    }
    Ok(encode_answer(&s.raft.vote(req).await))
}

/// `POST /raft/snapshot`: one chunk of install-snapshot (Raft paper §7). One this node accepts
/// (its vote is not above the sender's) counts as hearing from a leader.
///
/// While this node's disk is low it refuses every chunk with `507 storage_full` and
/// [`DISK_LOW_HEADER`], before openraft sees it: installing writes the whole snapshot.
///
/// [`DISK_LOW_HEADER`]: crate::raft::network::DISK_LOW_HEADER
pub async fn snapshot(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::InstallSnapshotRequest<crate::raft::TypeConfig>| &r.vote).await?;
    if let Some(low) = s.disk.refusal() {
        let mut resp =
            ApiError::StorageFull(format!("this node takes no snapshot now: {}", low.describe())).into_response();
        resp.headers_mut().insert(DISK_LOW_HEADER, HeaderValue::from_static("1"));
        return Ok(resp);
    }
    let vote = req.vote;
    let answer = s.raft.install_snapshot(req).await;
    if matches!(&answer, Ok(r) if r.vote <= vote) {
        s.contact.heard();
    }
    Ok(encode_answer(&answer))
}

/// `GET /raft/clock`: this node's wall clock, ms since the Unix epoch, as decimal text, for the
/// other nodes' measurements ([`crate::clock`]).
pub async fn clock(State(s): State<AppState>, req: Request) -> Response {
    if let Err(e) = check_any_node(&s, req.extensions()) {
        return e.into_response();
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], s.clock.wall_ms().to_string()).into_response()
}
