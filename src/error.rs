//! The client-facing error type and its one mapping to the HTTP error body of SPEC §3.
//!
//! Owns: every `{"error": {"code", "message"}}` a client sees, with its status. Must never: let a
//! library's own error text or status reach a client unmapped, or answer `500` for bad input.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::limits::RETRY_AFTER_SECS;
use crate::storage::StoreError;
use crate::stream::{FramesRejection, NameError, PublishRejection};
use crate::wire::{ErrorBody, ErrorDetail, FrameError};

/// Header on a `503` whose write may still commit (see [`ApiError::OutcomeUnknown`]).
pub const OUTCOME_HEADER: &str = "runnev-outcome";

/// An error answered to a client (SPEC §3, "Errors"). Each variant's message says what was wrong
/// and how to fix it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// `400 invalid_stream_name`.
    #[error("{0}")]
    InvalidStreamName(#[from] NameError),
    /// `400 invalid_seq`: `seq` is not an integer from 1 to [`crate::stream::SEQ_MAX`].
    #[error("{0}")]
    InvalidSeq(String),
    /// `400 invalid_parameter`: a query parameter out of range or not an integer.
    #[error("{0}")]
    InvalidParameter(String),
    /// `400 invalid_body`: the request body is not what the endpoint takes.
    #[error("{0}")]
    InvalidBody(String),
    /// `404 stream_not_found`.
    #[error("stream {0:?} does not exist; create it with PUT /v1/streams/{0}")]
    StreamNotFound(String),
    /// `404 not_found`: no such route or resource.
    #[error("{0}")]
    NotFound(String),
    /// `405 method_not_allowed`: the path exists but does not serve this method; the router adds
    /// the `Allow` header listing those it serves (RFC 9110 §15.5.6).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// `409 seq_conflict`, `seq_not_increasing` or `seq_evicted` (SPEC §2.3).
    #[error("{0}")]
    Rejected(#[from] PublishRejection),
    /// A frames publish refused by SPEC §6, nothing written: a frame's SPEC §2.3 code (with
    /// `"frame"`), `409 partial_duplicate` (with `"frame"`: the first new frame), or `400
    /// invalid_body` for no frame.
    #[error("{0}")]
    Frames(#[from] FramesRejection),
    /// A frames body that cannot be read (SPEC §6), with `"frame"` when one is at fault: `400
    /// invalid_body` when malformed, `413 payload_too_large` for too many or too large frames.
    #[error("{0}")]
    BadFrames(#[from] FrameError),
    /// `413 payload_too_large`.
    #[error("the body is larger than {limit_bytes} bytes, the most this node accepts")]
    PayloadTooLarge {
        /// The limit, in bytes.
        limit_bytes: usize,
    },
    /// `503 no_leader`, with `Retry-After`.
    #[error("{0}")]
    NoLeader(String),
    /// `503 no_leader`, with `Retry-After` and `Runnev-Outcome: unknown`: the write was proposed
    /// (or handed to the leader) and may still commit. Only a retry with the same seq is safe.
    #[error("{0}")]
    OutcomeUnknown(String),
    /// `503 not_ready`.
    #[error("{0}")]
    NotReady(String),
    /// `507 storage_full`.
    #[error("{0}")]
    StorageFull(String),
    /// `400 protocol_mismatch`: a Raft RPC from a peer that speaks another protocol version.
    #[error("{0}")]
    ProtocolMismatch(String),
    /// `500 internal`: a fault of this node, never of the request.
    #[error("{0}")]
    Internal(String),
    /// `401 unauthorized`: no token, or one this node does not know (SPEC §7). Answered with
    /// `WWW-Authenticate: Bearer` (RFC 6750 §3).
    #[error("{0}")]
    Unauthorized(String),
    /// `403 forbidden`: the token (or the peer certificate) does not allow the request.
    #[error("{0}")]
    Forbidden(String),
    /// `503 overloaded` (with `Retry-After`): the node is at one of its bounds (connections,
    /// subscribers, queued proposals); nothing was proposed, and another node, or a retry
    /// later, may take the request.
    #[error("{0}")]
    Overloaded(String),
    /// `408 request_timeout`: the body did not arrive within `--body-read-timeout` (RFC 9110
    /// §15.5.9). Nothing was proposed; the connection closes after the answer (its framing is
    /// lost mid-body), and the client may send the request again on a new one.
    #[error("{0}")]
    RequestTimeout(String),
    /// `409 token_exists`: a token of that name exists; delete it first.
    #[error("{0}")]
    TokenExists(String),
    /// `409 last_admin_token`: deleting this token would leave no token with the grant
    /// `admin:*`, and no client could administer the cluster any more.
    #[error("{0}")]
    LastAdminToken(String),
    /// `501 not_implemented`: a transfer coding other than `chunked` (RFC 9112 §6.1); the body is
    /// not read, so the connection closes after the answer.
    #[error("{0}")]
    NotImplemented(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_storage_full() {
            ApiError::StorageFull(format!("this node's disk is full: {e}"))
        } else {
            tracing::error!(error = %e, "storage failure");
            ApiError::Internal(format!("storage failure: {e}"))
        }
    }
}

impl ApiError {
    /// The HTTP status and SPEC §3 code of this error.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        use ApiError::*;
        match self {
            InvalidStreamName(_) => (StatusCode::BAD_REQUEST, "invalid_stream_name"),
            InvalidSeq(_) => (StatusCode::BAD_REQUEST, "invalid_seq"),
            InvalidParameter(_) => (StatusCode::BAD_REQUEST, "invalid_parameter"),
            InvalidBody(_) => (StatusCode::BAD_REQUEST, "invalid_body"),
            ProtocolMismatch(_) => (StatusCode::BAD_REQUEST, "protocol_mismatch"),
            StreamNotFound(_) => (StatusCode::NOT_FOUND, "stream_not_found"),
            NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Rejected(r) | Frames(FramesRejection::Frame { rejection: r, .. }) => rejection_status_and_code(r),
            Frames(FramesRejection::PartialDuplicate { .. }) => (StatusCode::CONFLICT, "partial_duplicate"),
            Frames(FramesRejection::Empty) => (StatusCode::BAD_REQUEST, "invalid_body"),
            BadFrames(FrameError::TooMany { .. } | FrameError::TooLarge { .. }) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            BadFrames(_) => (StatusCode::BAD_REQUEST, "invalid_body"),
            PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            NoLeader(_) | OutcomeUnknown(_) => (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
            NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            StorageFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
            Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, "not_implemented"),
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            TokenExists(_) => (StatusCode::CONFLICT, "token_exists"),
            LastAdminToken(_) => (StatusCode::CONFLICT, "last_admin_token"),
            Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
        }
    }

    /// For an error about one frame of a frames publish (SPEC §6), that frame's 0-based index:
    /// the `"frame"` of the error body.
    pub fn frame(&self) -> Option<u64> {
        match self {
            ApiError::Frames(FramesRejection::Frame { frame, .. }) => Some(*frame),
            ApiError::Frames(FramesRejection::PartialDuplicate { first_new, .. }) => Some(*first_new),
            ApiError::BadFrames(e) => e.frame(),
            _ => None,
        }
    }
}

/// The status and code of a publish refused by SPEC §2.3 (alone, or as a frame of SPEC §6).
fn rejection_status_and_code(r: &PublishRejection) -> (StatusCode, &'static str) {
    match r {
        PublishRejection::SeqConflict { .. } => (StatusCode::CONFLICT, "seq_conflict"),
        PublishRejection::SeqNotIncreasing { .. } | PublishRejection::SeqExhausted => {
            (StatusCode::CONFLICT, "seq_not_increasing")
        }
        PublishRejection::SeqEvicted { .. } => (StatusCode::CONFLICT, "seq_evicted"),
        PublishRejection::SeqOutOfRange { .. } => (StatusCode::BAD_REQUEST, "invalid_seq"),
        PublishRejection::Unrepresentable(_) => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body =
            ErrorBody { error: ErrorDetail { code: code.to_string(), message: self.to_string(), frame: self.frame() } };
        let mut resp = (status, axum::Json(body)).into_response();
        match self {
            ApiError::NoLeader(_) | ApiError::Overloaded(_) => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            ApiError::OutcomeUnknown(_) => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
                resp.headers_mut().insert(OUTCOME_HEADER, HeaderValue::from_static("unknown"));
            }
            // The rest of the body is left unread, so the connection cannot carry another
            // request: say so, instead of letting the client find a closed socket.
            ApiError::Unauthorized(_) => {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"runnev\""));
            }
            ApiError::PayloadTooLarge { .. } | ApiError::NotImplemented(_) | ApiError::RequestTimeout(_) => {
                resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_maps_to_its_409_code() {
        let code = |r| ApiError::Rejected(r).status_and_code();
        assert_eq!(code(PublishRejection::SeqConflict { seq: 1 }), (StatusCode::CONFLICT, "seq_conflict"));
        assert_eq!(
            code(PublishRejection::SeqNotIncreasing { seq: 1, last_seq: 2 }),
            (StatusCode::CONFLICT, "seq_not_increasing")
        );
        assert_eq!(
            code(PublishRejection::SeqEvicted { seq: 1, evicted_through: 2 }),
            (StatusCode::CONFLICT, "seq_evicted")
        );
        assert_eq!(code(PublishRejection::SeqExhausted), (StatusCode::CONFLICT, "seq_not_increasing"));
        assert_eq!(code(PublishRejection::SeqOutOfRange { seq: u64::MAX }), (StatusCode::BAD_REQUEST, "invalid_seq"));
        let full = PublishRejection::Unrepresentable(crate::stream::MetaError::BytesOverflow);
        assert_eq!(code(full), (StatusCode::INSUFFICIENT_STORAGE, "storage_full"));
    }

    /// A full disk is told by its error kind, from file I/O or through redb, whatever the
    /// message; any other storage failure is this node's fault.
    #[test]
    fn a_full_disk_is_507_by_its_kind() {
        let full = || std::io::Error::new(std::io::ErrorKind::StorageFull, "disk quota");
        for e in [
            StoreError::Io(full()),
            StoreError::Db(redb::Error::Io(full())),
            StoreError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)),
        ] {
            assert_eq!(ApiError::from(e).status_and_code(), (StatusCode::INSUFFICIENT_STORAGE, "storage_full"));
        }
        let other = StoreError::Io(std::io::Error::other("No space left, says the message"));
        assert_eq!(ApiError::from(other).status_and_code(), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
        let durability = StoreError::Durability(redb::SetDurabilityError::NonDurableCommitUnsupported);
        assert!(durability.to_string().starts_with("setting a transaction's durability"), "{durability}");
    }

    #[test]
    fn frame_errors_name_their_frame() {
        let at = |e: ApiError| (e.status_and_code(), e.frame());
        let conflict = FramesRejection::Frame { frame: 3, rejection: PublishRejection::SeqConflict { seq: 9 } };
        assert_eq!(at(conflict.into()), ((StatusCode::CONFLICT, "seq_conflict"), Some(3)));
        let partial = FramesRejection::PartialDuplicate { first_new: 2, first_new_seq: 7 };
        assert_eq!(at(partial.into()), ((StatusCode::CONFLICT, "partial_duplicate"), Some(2)));
        assert_eq!(at(FramesRejection::Empty.into()), ((StatusCode::BAD_REQUEST, "invalid_body"), None));
        let past = FrameError::PastEnd { frame: 1, offset: 5, len: 9, left: 2 };
        assert_eq!(at(past.into()), ((StatusCode::BAD_REQUEST, "invalid_body"), Some(1)));
        let many = FrameError::TooMany { frame: 10_000 };
        assert_eq!(at(many.into()), ((StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"), Some(10_000)));
        assert_eq!(at(ApiError::NotFound("x".into())), ((StatusCode::NOT_FOUND, "not_found"), None));
    }

    /// A body cut at its deadline is `408` and closes its connection (its framing is lost);
    /// a refusal at a bound says when to come back.
    #[test]
    fn request_timeout_closes_and_overloaded_carries_retry_after() {
        let resp = ApiError::RequestTimeout("x".into()).into_response();
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        let resp = ApiError::Overloaded("x".into()).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        assert!(resp.headers().get(OUTCOME_HEADER).is_none());
    }

    #[test]
    fn no_leader_carries_retry_after() {
        let resp = ApiError::NoLeader("x".into()).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
