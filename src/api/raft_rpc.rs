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
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::auth::{check_any_node, check_peer};
use super::{read_body, AppState};
use crate::error::ApiError;
use crate::limits::{PROTOCOL_WARN_EVERY_MS, RAFT_RPC_BYTES_MAX};
use crate::raft::network::{PROTOCOL_HEADER, PROTOCOL_VERSION};
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
pub async fn append(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::AppendEntriesRequest<crate::raft::TypeConfig>| &r.vote).await?;
    let answer = s.raft.append_entries(req).await;
    if matches!(&answer, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
        s.contact.heard();
    }
    Ok(encode_answer(&answer))
}

/// `POST /raft/vote`: request-vote (Raft paper §5.2).
pub async fn vote(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::VoteRequest<crate::raft::NodeId>| &r.vote).await?;
    Ok(encode_answer(&s.raft.vote(req).await))
}

/// `POST /raft/snapshot`: one chunk of install-snapshot (Raft paper §7). One this node accepts
/// (its vote is not above the sender's) counts as hearing from a leader.
pub async fn snapshot(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    let req = admit(&s, req, |r: &openraft::raft::InstallSnapshotRequest<crate::raft::TypeConfig>| &r.vote).await?;
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
