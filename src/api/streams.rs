//! Stream endpoints of SPEC §3: create/update, info, list, delete, publish and read.
//!
//! Owns: parsing and validating these requests and shaping their answers. Must never: change
//! state before every check on the request has passed (bad input changes nothing), or read a
//! batch that is not applied on this node.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use tokio::time::Instant;

use super::write::{write, Forwardable, Led};
use super::{json, read_request_body, AppState};
use crate::error::ApiError;
use crate::limits::{
    ADMIN_BODY_BYTES_MAX, FRAMES_CONTENT_TYPE, FRAMES_PER_APPEND_MAX, MIN_INDEX_WAIT_MS, READ_ANSWER_BYTES_MAX,
    READ_BATCHES_DEFAULT, READ_BATCHES_MAX, READ_WAIT_MS_MAX,
};
use crate::raft::{Command, Outcome};
use crate::storage::{blocking, BatchRef};
use crate::stream;
use crate::wire;

pub(super) fn stream_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) = path.map_err(|_| stream::NameError::Undecodable)?;
    stream::validate_name(&name)?;
    Ok(name)
}

/// A request's query string as axum decodes it: its `name=value` pairs, in order.
pub(super) type QueryPairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The query string's parameters by name.
///
/// Errors: `400 invalid_parameter` for a query string that does not decode, or one that names
/// a parameter twice (`?seq=1&seq=2` has no one meaning; taking the last, as a map would, could
/// publish at a seq the client did not mean).
pub(super) fn query(q: QueryPairs) -> Result<HashMap<String, String>, ApiError> {
    let Query(pairs) = q.map_err(|e| ApiError::InvalidParameter(format!("bad query string: {e}")))?;
    let mut params = HashMap::with_capacity(pairs.len());
    for (key, value) in pairs {
        if params.contains_key(&key) {
            return Err(ApiError::InvalidParameter(format!("the query string names {key:?} twice")));
        }
        params.insert(key, value);
    }
    Ok(params)
}

/// Parses an optional integer parameter within `min..=max`.
fn param(q: &HashMap<String, String>, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
    let Some(raw) = q.get(key) else { return Ok(None) };
    match raw.parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
        _ => Err(ApiError::InvalidParameter(format!("{key}={raw:?} must be an integer from {min} to {max}"))),
    }
}

/// Parses an optional u64 parameter (cursor or log index); `-1` reads as 0 where allowed.
pub(super) fn param_u64(
    q: &HashMap<String, String>,
    key: &str,
    minus_one_is_zero: bool,
) -> Result<Option<u64>, ApiError> {
    let Some(raw) = q.get(key) else { return Ok(None) };
    if minus_one_is_zero && raw == "-1" {
        return Ok(Some(0));
    }
    let allowed = if minus_one_is_zero { "a non-negative integer or -1" } else { "a non-negative integer" };
    raw.parse::<u64>().map(Some).map_err(|_| ApiError::InvalidParameter(format!("{key}={raw:?} must be {allowed}")))
}

/// Maps an applied outcome to its answer (SPEC §3).
fn answer(name: &str, outcome: Outcome, index: u64) -> Result<Response, ApiError> {
    match outcome {
        Outcome::Stream { created, info } => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(json(status, &wire::StreamInfo::new(&info.name, &info.meta)))
        }
        Outcome::Deleted => Ok(StatusCode::NO_CONTENT.into_response()),
        Outcome::Published { seq, ts, duplicate, index } => {
            let status = if duplicate { StatusCode::OK } else { StatusCode::CREATED };
            Ok(json(status, &wire::PublishAck { duplicate, index, seq, ts }))
        }
        Outcome::FramesPublished { first_seq, last_seq, count, ts, duplicate, index } => {
            let status = if duplicate { StatusCode::OK } else { StatusCode::CREATED };
            Ok(json(status, &wire::FramesAck { first_seq, last_seq, count, ts, index, duplicate }))
        }
        Outcome::StreamNotFound => Err(ApiError::StreamNotFound(name.to_string())),
        Outcome::Rejected(r) => Err(r.into()),
        Outcome::FramesRejected(r) => Err(r.into()),
        Outcome::Nothing | Outcome::Batch(_) | Outcome::Token(_) => {
            Err(ApiError::Internal(format!("log index {index} applied with no outcome for this request")))
        }
    }
}

async fn decide(
    s: &AppState,
    name: &str,
    req: Forwardable,
    make: impl Fn(u64) -> Command,
) -> Result<Response, ApiError> {
    match write(s, &req, make).await? {
        Led::Here((outcome, index)) => answer(name, outcome, index),
        Led::Forwarded(resp) => Ok(resp),
    }
}

/// `PUT /v1/streams/{name}`: create, or replace the retention.
#[utoipa::path(
    put,
    path = "/v1/streams/{name}",
    operation_id = "put_stream",
    summary = "Create a stream, or replace its retention",
    tag = "streams",
    params(super::openapi::StreamPath),
    request_body(
        content = wire::PutStream,
        description = "None (or only whitespace): create with no limits, or leave an existing stream unchanged. A JSON object of at most 64 KiB: create with, or replace, the retention. Any Content-Type."
    ),
    responses(
        (status = 200, description = "The stream existed: unchanged (no body) or its retention replaced", body = wire::StreamInfo),
        (status = 201, description = "The stream was created", body = wire::StreamInfo),
        (status = 400, description = "`invalid_stream_name`; `invalid_body` (not JSON, not an object, an unknown field, a limit of 0, negative or not an integer)", body = crate::wire::ErrorBody),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::WriteErrors,
    )
)]
pub(super) async fn put(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let body = read_request_body(&headers, body, ADMIN_BODY_BYTES_MAX).await?;
    let retention = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let b: wire::PutStream = super::json_object(&body, r#"{"retention": {…}}"#, &["/retention"])?;
        b.retention.validate().map_err(|field| {
            ApiError::InvalidBody(format!("retention.{field} must be at least 1 (omit it for no limit)"))
        })?;
        Some(b.retention)
    };
    let req = Forwardable::new(method, &uri, headers, body);
    decide(&s, &name, req, |ts| Command::PutStream { name: name.clone(), retention, ts }).await
}

/// `DELETE /v1/streams/{name}`.
#[utoipa::path(
    delete,
    path = "/v1/streams/{name}",
    operation_id = "delete_stream",
    summary = "Delete a stream and its batches",
    tag = "streams",
    params(super::openapi::StreamPath),
    responses(
        (status = 204, description = "The stream and its batches were deleted"),
        (status = 400, description = "`invalid_stream_name`", body = crate::wire::ErrorBody),
        (status = 404, description = "`stream_not_found`", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::WriteErrors,
    )
)]
pub(super) async fn delete(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let req = Forwardable::new(method, &uri, headers, bytes::Bytes::new());
    decide(&s, &name, req, |_| Command::DeleteStream { name: name.clone() }).await
}

/// `GET /v1/streams/{name}`: this node's applied view of the stream.
#[utoipa::path(
    get,
    path = "/v1/streams/{name}",
    operation_id = "get_stream",
    summary = "One stream's info",
    tag = "streams",
    params(super::openapi::StreamPath),
    responses(
        (status = 200, description = "This node's applied view of the stream", body = wire::StreamInfo),
        (status = 400, description = "`invalid_stream_name`", body = crate::wire::ErrorBody),
        (status = 404, description = "`stream_not_found`", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::ReadErrors,
    )
)]
pub(super) async fn info(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let store = s.store.clone();
    let n = name.clone();
    match blocking(move || store.stream(&n)).await? {
        Some(meta) => Ok(json(StatusCode::OK, &wire::StreamInfo::new(&name, &meta))),
        None => Err(ApiError::StreamNotFound(name)),
    }
}

/// `GET /v1/streams`.
#[utoipa::path(
    get,
    path = "/v1/streams",
    operation_id = "list_streams",
    summary = "List every stream",
    tag = "streams",
    responses(
        (status = 200, description = "Every stream, in name order, as this node has applied them", body = wire::StreamList),
        super::openapi::AuthErrors,
        super::openapi::ReadErrors,
    )
)]
pub(super) async fn list(State(s): State<AppState>) -> Result<Response, ApiError> {
    let store = s.store.clone();
    let all = blocking(move || store.streams()).await?;
    let streams = all.iter().map(|i| wire::StreamInfo::new(&i.name, &i.meta)).collect();
    Ok(json(StatusCode::OK, &wire::StreamList { streams }))
}

/// Whether a request's `Content-Type` is the frames media type (SPEC §6), parameters and case
/// aside (RFC 9110 §8.3.1).
fn is_frames(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| wire::media_type_is(v, FRAMES_CONTENT_TYPE))
}

/// `POST /v1/streams/{name}/batches[?seq=N]`: publish one batch, or with the frames content
/// type many ([`publish_frames`]).
#[utoipa::path(
    post,
    path = "/v1/streams/{name}/batches",
    operation_id = "publish",
    summary = "Publish one batch, or many as frames",
    tag = "streams",
    params(super::openapi::StreamPath, super::openapi::PublishQuery),
    request_body(
        description = "The payload, byte for byte, whatever its Content-Type (0 bytes is a valid payload; at most `--max-batch-bytes`); or, with `Content-Type: application/vnd.runnev.frames`, many batches as frames (SPEC §6), committed in one Raft entry, all or none.",
        content(
            (super::openapi::Payload = "application/octet-stream"),
            (super::openapi::Frames = "application/vnd.runnev.frames"),
        )
    ),
    responses(
        (status = 200, description = "A retry: every batch was already stored at its seq with the same bytes; nothing was written (`duplicate: true`)", body = super::openapi::PublishAnswer),
        (status = 201, description = "Published: `PublishAck` for one batch, `FramesAck` for frames", body = super::openapi::PublishAnswer),
        (status = 400, description = "`invalid_stream_name`; `invalid_seq`; `invalid_body` (a malformed or empty frames body, with `frame` when one is at fault; a body that broke off)", body = crate::wire::ErrorBody),
        (status = 404, description = "`stream_not_found` (unless the leader runs with `--auto-create-streams`)", body = crate::wire::ErrorBody),
        (status = 409, description = "`seq_conflict`, `seq_not_increasing`, `seq_evicted`; for frames also `partial_duplicate`; with `frame` for frames", body = crate::wire::ErrorBody),
        (status = 413, description = "`payload_too_large`: over `--max-batch-bytes` (frames: over `--max-append-bytes`, a frame over `--max-batch-bytes`, or more than 10,000 frames)", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::WriteErrors,
    )
)]
pub(super) async fn publish(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    q: QueryPairs,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let q = query(q)?;
    let seq = match q.get("seq") {
        None => None,
        Some(raw) => match raw.parse::<u64>() {
            Ok(v) if (1..=stream::SEQ_MAX).contains(&v) => Some(v),
            _ => {
                return Err(ApiError::InvalidSeq(format!(
                    "seq={raw:?} must be an integer from 1 to {} (2^64-2)",
                    stream::SEQ_MAX
                )))
            }
        },
    };
    if is_frames(&headers) {
        return publish_frames(s, name, seq, method, uri, headers, body).await;
    }
    let limit = s.max_batch_bytes;
    let body = read_request_body(&headers, body, limit).await?;
    let auto_create = s.auto_create_streams;
    let req = Forwardable::new(method, &uri, headers, body.clone());
    let stream = name.clone();
    decide(&s, &name, req, move |ts| Command::Publish {
        stream: stream.clone(),
        seq,
        ts,
        auto_create,
        data: body.clone(),
    })
    .await
}

/// A frames publish (SPEC §6): the body is read whole (at most `--max-append-bytes`), split
/// into frames and checked — each within `--max-batch-bytes`, 1 to
/// [`FRAMES_PER_APPEND_MAX`] of them, every seq within `1..=SEQ_MAX` — before anything is
/// proposed; then all frames go into one [`Command::PublishFrames`], one log entry.
///
/// Errors: `400 invalid_body` (malformed frames), `413 payload_too_large` (body, frame count or
/// a frame too large), `400 invalid_seq` (a frame's seq past 2⁶⁴−2), each naming the frame; then
/// what the state machine decides (`409` codes with `"frame"`, `409 partial_duplicate`, `404`).
async fn publish_frames(
    s: AppState,
    name: String,
    seq: Option<u64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_request_body(&headers, body, s.max_append_bytes).await?;
    let ranges = wire::decode_frames(&body, FRAMES_PER_APPEND_MAX, s.max_batch_bytes)?;
    let count = ranges.len() as u64;
    if let Some(first) = seq {
        // The frames take first..first+count-1; the first past SEQ_MAX is refused, by index.
        if let Err(frame) = stream::frames_last_seq(first, count) {
            let rejection = stream::PublishRejection::SeqOutOfRange { seq: first.saturating_add(frame) };
            return Err(stream::FramesRejection::Frame { frame, rejection }.into());
        }
    }
    // Slices of the body: no payload is copied until the entry is encoded into the log.
    // (`decode_frames` returns ranges within the body; one outside it would be a bug there,
    // answered as such rather than a panic.)
    let frames = ranges
        .into_iter()
        .map(|r| match body.get(r.clone()) {
            Some(_) => Ok(body.slice(r)),
            None => Err(ApiError::Internal(format!("frame {r:?} outside a body of {} bytes", body.len()))),
        })
        .collect::<Result<Vec<bytes::Bytes>, ApiError>>()?;
    debug_assert_eq!(frames.len() as u64, count);
    let auto_create = s.auto_create_streams;
    let req = Forwardable::new(method, &uri, headers, body);
    let stream = name.clone();
    decide(&s, &name, req, move |ts| Command::PublishFrames {
        stream: stream.clone(),
        seq,
        ts,
        auto_create,
        frames: frames.clone(),
    })
    .await
}

/// The two forms of a read answer: JSON ([`wire::ReadAnswer`], SPEC §3, the default) and
/// binary records ([`wire::BATCHES_CONTENT_TYPE`], when the request's `Accept` asks for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadForm {
    Json,
    Binary,
}

impl ReadForm {
    /// The form `Accept` asks for (RFC 9110 §12.5.1): binary when a media range names
    /// [`wire::BATCHES_CONTENT_TYPE`] with a weight above 0, else JSON (also for ranges this
    /// API cannot give: a read has always answered JSON to those, and still does).
    fn of(headers: &HeaderMap) -> ReadForm {
        let binary =
            headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
                |range| {
                    let named = wire::media_type_is(range, wire::BATCHES_CONTENT_TYPE);
                    let weight = range
                        .split(';')
                        .skip(1)
                        .filter_map(|p| p.split_once('='))
                        .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                        .map_or(Some(1.0), |(_, v)| v.trim().parse::<f32>().ok());
                    named && weight.is_some_and(|w| w > 0.0)
                },
            );
        if binary {
            ReadForm::Binary
        } else {
            ReadForm::Json
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            ReadForm::Json => "application/json",
            ReadForm::Binary => wire::BATCHES_CONTENT_TYPE,
        }
    }
}

/// The body of a read answer, in either [`ReadForm`], written batch by batch as
/// [`Store::visit_batches`](crate::storage::Store::visit_batches) lends them.
///
/// JSON: `{"batches": [{"seq", "ts", "data"}], "gap", "last_seq", "next_after"}`, `data`
/// standard base64 ([`wire::ReadAnswer`]), written by hand rather than through serde: base64
/// never needs JSON escaping, and serde_json's escape scan of every payload byte was a third of a
/// catch-up read's server time; a test below checks it byte for byte against serde_json's.
/// Binary: the head, then each batch's record ([`wire::encode_batches_head`]): each payload
/// copied once, no encoding.
struct ReadBody {
    out: Vec<u8>,
    form: ReadForm,
    meta: stream::StreamMeta,
    /// The seq of the last batch written.
    last: Option<u64>,
    /// Batches written.
    count: u32,
}

impl ReadBody {
    fn start(meta: &stream::StreamMeta, form: ReadForm) -> ReadBody {
        let mut out = Vec::with_capacity(4096);
        match form {
            ReadForm::Json => out.extend_from_slice(b"{\"batches\":["),
            // Room for the head, written once the batches are known.
            ReadForm::Binary => out.resize(wire::BATCHES_HEAD_BYTES, 0),
        }
        ReadBody { out, form, meta: *meta, last: None, count: 0 }
    }

    fn push(&mut self, b: BatchRef<'_>) {
        use std::io::Write;
        debug_assert!(self.last.is_none_or(|l| l < b.seq), "batches in seq order");
        match self.form {
            ReadForm::Json => {
                if self.last.is_some() {
                    self.out.push(b',');
                }
                let _ = write!(self.out, "{{\"seq\":{},\"ts\":{},\"data\":\"", b.seq, b.ts);
                let at = self.out.len();
                self.out.resize(at + base64::encoded_len(b.data.len(), true).unwrap_or(0), 0);
                let written = base64::engine::general_purpose::STANDARD.encode_slice(b.data, &mut self.out[at..]);
                debug_assert_eq!(written.ok(), Some(self.out.len() - at), "base64 fills what encoded_len reserved");
                self.out.extend_from_slice(b"\"}");
            }
            ReadForm::Binary => {
                // A stored batch is at most BATCH_BYTES_MAX (32 MiB): always within a u32.
                let pushed = wire::push_batch_record(&mut self.out, b.seq, b.ts, b.data);
                debug_assert!(pushed.is_ok(), "a stored batch fits a record");
            }
        }
        self.last = Some(b.seq);
        self.count = self.count.saturating_add(1);
    }

    /// The finished body, and whether it carries a gap or a batch (else it is an empty answer).
    fn finish(mut self, after: u64) -> (Vec<u8>, bool, bool) {
        use std::io::Write;
        let gap = stream::gap_for(&self.meta, after);
        let next_after = match (self.last, &gap) {
            (Some(seq), _) => seq,
            (None, Some((_, to))) => *to,
            (None, None) => after,
        };
        match self.form {
            ReadForm::Json => {
                self.out.extend_from_slice(b"],\"gap\":");
                match gap {
                    Some((from, to)) => {
                        let _ = write!(self.out, "{{\"from\":{from},\"to\":{to}}}");
                    }
                    None => self.out.extend_from_slice(b"null"),
                }
                let _ = write!(self.out, ",\"last_seq\":{},\"next_after\":{next_after}}}", self.meta.last_seq);
            }
            ReadForm::Binary => {
                let head = wire::BatchesHead {
                    last_seq: self.meta.last_seq,
                    next_after,
                    gap: gap.map(|(from, to)| wire::Gap { from, to }),
                    count: self.count,
                };
                wire::encode_batches_head(&mut self.out, &head);
            }
        }
        (self.out, gap.is_some(), self.last.is_some())
    }
}

/// Waits until this node has applied `index`, for at most [`MIN_INDEX_WAIT_MS`], or until its
/// Raft core stops (it would never apply `index` then).
async fn wait_applied(s: &AppState, index: u64) -> Result<(), ApiError> {
    let mut rx = s.store.watch_applied();
    let reached = tokio::time::timeout(Duration::from_millis(MIN_INDEX_WAIT_MS), async {
        tokio::select! {
            reached = rx.wait_for(|applied| *applied >= index) => Ok(reached.is_ok()),
            why = super::raft_stops(&s.raft) => Err(why),
        }
    })
    .await;
    match reached {
        Ok(Ok(true)) => Ok(()),
        Ok(Err(why)) => Err(super::raft_stopped_error(&why)),
        _ => Err(ApiError::NotReady(format!(
            "this node has applied up to log index {}, not yet {index}, after {MIN_INDEX_WAIT_MS} ms; retry or ask another node",
            s.store.applied_index()
        ))),
    }
}

/// `GET /v1/streams/{name}/batches?after=C&limit=L&wait_ms=W&min_index=I`.
#[utoipa::path(
    get,
    path = "/v1/streams/{name}/batches",
    operation_id = "read",
    summary = "Read batches after a cursor",
    tag = "streams",
    params(super::openapi::StreamPath, super::openapi::ReadQuery),
    responses(
        (status = 200, description = "Batches after the cursor, from this node's applied state: JSON, or binary records when `Accept` names `application/vnd.runnev.batches` (no base64; errors stay JSON)",
            content(
                (wire::ReadAnswer = "application/json"),
                (super::openapi::Batches = "application/vnd.runnev.batches"),
            )
        ),
        (status = 400, description = "`invalid_stream_name`; `invalid_parameter` (a parameter out of range or not an integer, a query string that does not parse)", body = crate::wire::ErrorBody),
        (status = 404, description = "`stream_not_found` (after the wait, when `wait_ms` > 0)", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        super::openapi::ReadErrors,
    )
)]
pub(super) async fn read(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    q: QueryPairs,
    headers: HeaderMap,
    token: Option<axum::Extension<super::auth::AuthorizedBy>>,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let q = query(q)?;
    let form = ReadForm::of(&headers);
    let after = param_u64(&q, "after", true)?.unwrap_or(0);
    let limit = param(&q, "limit", 1, READ_BATCHES_MAX as i64)?.map_or(READ_BATCHES_DEFAULT, |v| v as usize);
    let wait_ms = param(&q, "wait_ms", 0, READ_WAIT_MS_MAX as i64)?.unwrap_or(0) as u64;
    let min_index = param_u64(&q, "min_index", false)?;
    // A node that knows it left the cluster would answer from a state that never moves again.
    if let Some(why) = super::not_a_member(&s) {
        return Err(ApiError::NotReady(format!("{why}; read from a current member")));
    }
    if let Some(index) = min_index {
        wait_applied(&s, index).await?;
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut applied = s.store.watch_applied();
    let mut stopping = s.stopping.clone();
    loop {
        applied.borrow_and_update();
        let store = s.store.clone();
        let n = name.clone();
        let found = blocking(move || {
            store.visit_batches(
                &n,
                after,
                limit,
                READ_ANSWER_BYTES_MAX,
                |meta| ReadBody::start(meta, form),
                ReadBody::push,
            )
        })
        .await?;
        // Checked after each read, as a subscription does: a long poll whose token this node
        // has applied the deletion of answers no batch applied after it (docs/security.md).
        if let Some(t) = &token {
            if !t.still_allows(&s, crate::auth::Permission::Read, crate::auth::Scope::Stream(&name)) {
                return Err(ApiError::Unauthorized(format!(
                    "token {} was deleted (or lost its grant) before this read was answered",
                    t.name()
                )));
            }
        }
        let now = Instant::now();
        let done = now >= deadline || *stopping.borrow();
        // A node that has not applied the stream's creation yet waits like one behind the
        // cursor: "not found" is only answered once the wait is over.
        let Some(view) = found else {
            if done {
                return Err(ApiError::StreamNotFound(name));
            }
            let _waiting = super::Waiting::start("read");
            tokio::select! {
                _ = tokio::time::sleep(deadline - now) => {}
                _ = applied.changed() => {}
                _ = stopping.changed() => {}
                why = super::raft_stops(&s.raft) => return Err(super::raft_stopped_error(&why)),
            }
            continue;
        };
        let (body, gap, batches) = view.finish(after);
        if gap {
            metrics::counter!("runnev_gaps_delivered_total", "via" => "read").increment(1);
        }
        if gap || batches || done {
            // The answer depends on `Accept`: caches must key on it (RFC 9110 §12.5.5).
            let headers = [(header::CONTENT_TYPE, form.content_type()), (header::VARY, "accept")];
            return Ok((headers, body).into_response());
        }
        // Long poll: a node behind the cursor waits rather than answering a false "empty"; a
        // node whose Raft core stopped will never catch up, and says so at once.
        let _waiting = super::Waiting::start("read");
        tokio::select! {
            _ = tokio::time::sleep(deadline - now) => {}
            _ = applied.changed() => {}
            _ = stopping.changed() => {}
            why = super::raft_stops(&s.raft) => return Err(super::raft_stopped_error(&why)),
        }
    }
}

#[cfg(test)]
mod read_answer_tests {
    use super::*;
    use crate::storage::{BatchesView, StoredBatch};
    use crate::stream::StreamMeta;

    /// The same answer through serde_json and the wire type, as the hand-written body must read.
    fn through_serde(view: &BatchesView, after: u64) -> String {
        let gap = stream::gap_for(&view.meta, after);
        let next_after = view.batches.last().map(|b| b.seq).or(gap.map(|g| g.1)).unwrap_or(after);
        let answer = wire::ReadAnswer {
            batches: view.batches.iter().map(|b| wire::BatchBody::encode(b.seq, b.ts, &b.data)).collect(),
            gap: gap.map(|(from, to)| wire::Gap { from, to }),
            last_seq: view.meta.last_seq,
            next_after,
        };
        serde_json::to_string(&answer).unwrap()
    }

    /// Reads to answer, each a view and its cursor: with a gap and batches (every byte value, an
    /// empty payload, JSON's special characters), batches alone, a gap alone, nothing.
    fn reads() -> Vec<(BatchesView, u64)> {
        let meta = StreamMeta { last_seq: 9, evicted_through: 4, first_seq: 5, ..Default::default() };
        let batches = vec![
            StoredBatch { seq: 5, ts: 17, index: 3, data: (0..=255u8).collect() },
            StoredBatch { seq: 6, ts: u64::MAX, index: 4, data: Vec::new() },
            StoredBatch { seq: 7, ts: 0, index: 5, data: b"\"\\\n".to_vec() },
        ];
        vec![
            (BatchesView { meta, batches: batches.clone() }, 2),
            (BatchesView { meta, batches }, 4),
            (BatchesView { meta, batches: Vec::new() }, 1),
            (BatchesView { meta, batches: Vec::new() }, 9),
        ]
    }

    #[test]
    fn the_hand_written_read_answer_is_the_json_serde_would_write() {
        for (view, after) in reads() {
            let json = written(&view, after, ReadForm::Json);
            assert_eq!(String::from_utf8(json).unwrap(), through_serde(&view, after), "after={after}");
        }
    }

    /// The body `form` gives for `view` read after `after`.
    fn written(view: &BatchesView, after: u64, form: ReadForm) -> Vec<u8> {
        let mut body = ReadBody::start(&view.meta, form);
        for b in &view.batches {
            body.push(BatchRef { seq: b.seq, ts: b.ts, index: b.index, data: &b.data });
        }
        body.finish(after).0
    }

    #[test]
    fn the_binary_read_answer_carries_what_the_json_one_does() {
        for (view, after) in reads() {
            let text = through_serde(&view, after);
            let json: wire::ReadAnswer = serde_json::from_str(&text).unwrap();
            let body = bytes::Bytes::from(written(&view, after, ReadForm::Binary));
            let (head, got) = wire::decode_batches(after, &body).unwrap();
            assert_eq!((head.last_seq, head.next_after, head.gap), (json.last_seq, json.next_after, json.gap));
            assert_eq!(head.count as usize, json.batches.len());
            let want: Vec<(u64, u64, Vec<u8>)> =
                json.batches.iter().map(|b| (b.seq, b.ts, b.payload().unwrap())).collect();
            let got: Vec<(u64, u64, Vec<u8>)> = got.into_iter().map(|b| (b.seq, b.ts, b.data.to_vec())).collect();
            assert_eq!(got, want, "after={after}");
        }
    }

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn accept_asks_for_binary_only_by_name_and_a_weight_above_zero() {
        for binary in [
            &["application/vnd.runnev.batches"][..],
            &["Application/VND.Runnev.Batches ; q=0.9"],
            &["application/json;q=0.5, application/vnd.runnev.batches"],
            &["text/plain", "application/vnd.runnev.batches;q=1"],
        ] {
            assert_eq!(ReadForm::of(&accept(binary)), ReadForm::Binary, "{binary:?}");
        }
        for json in [
            &[][..],
            &["application/json"],
            &["*/*"],
            &["application/*"],
            &["application/vnd.runnev.batches;q=0"],
            &["application/vnd.runnev.batches; q=0.0, application/json"],
            &["application/vnd.runnev.batches;q=nope"],
            &["application/vnd.runnev.frames"],
        ] {
            assert_eq!(ReadForm::of(&accept(json)), ReadForm::Json, "{json:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> QueryPairs {
        Ok(Query(p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()))
    }

    /// A query string that names a parameter twice is `400 invalid_parameter` (a fresh user's
    /// trial read `?after=1&after=2` as `after=2`; `?seq=1&seq=2` would have published at seq
    /// 2); each named once is read by name.
    #[test]
    fn a_query_string_that_names_a_parameter_twice_is_refused() {
        let twice = query(pairs(&[("seq", "1"), ("seq", "2")]));
        assert!(matches!(&twice, Err(ApiError::InvalidParameter(m)) if m.contains("\"seq\" twice")), "{twice:?}");
        let once = query(pairs(&[("after", "1"), ("limit", "5")])).expect("each named once");
        assert_eq!(param_u64(&once, "after", false).unwrap(), Some(1));
        assert_eq!(once.get("limit").map(String::as_str), Some("5"));
    }
}
