//! The OpenAPI 3.1 document of the client-facing HTTP API (SPEC §3, §4, §6, §7), derived with
//! utoipa from the handlers' `#[utoipa::path]` attributes and the wire types' `ToSchema`
//! derives, served at `GET /v1/openapi.json` and committed as `docs/openapi.json`.
//!
//! Owns: the list of documented operations, the parameter and body shapes that exist only for the
//! document (the handlers parse their query strings by hand), and the document's description.
//! Must never: document the Raft RPCs between nodes (`/raft/*`), which are not for clients, or
//! be built from anything but the types and attributes the handlers use, so that it cannot drift
//! from them (a test compares the committed copy with the generated one).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::wire::{self, ErrorBody};

/// A stream's name in a path: 1 to 128 characters of `A–Z a–z 0–9 . _ -`, neither `.` nor
/// `..` (SPEC §1), percent-encoded as RFC 3986 §3.3 requires.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct StreamPath {
    /// The stream's name: 1 to 128 characters of `A–Z a–z 0–9 . _ -`, neither `.` nor `..`.
    #[param(
        pattern = r"^([A-Za-z0-9_-][A-Za-z0-9._-]{0,127}|\.[A-Za-z0-9_-][A-Za-z0-9._-]{0,126}|\.\.[A-Za-z0-9._-]{1,126})$"
    )]
    name: String,
}

/// The query of a publish (SPEC §3).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct PublishQuery {
    /// The seq to publish at, 1 to 2⁶⁴−2 (for frames: the first frame's). Without it the batch
    /// takes the stream's `last_seq + 1`. `400 invalid_seq` otherwise.
    #[param(minimum = 1)]
    seq: Option<u64>,
}

/// The query of a read (SPEC §3).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct ReadQuery {
    /// The cursor: batches with seq > `after` are returned. 0 to 2⁶⁴−1, or `-1` (read as 0).
    /// Default 0.
    #[param(minimum = -1)]
    after: Option<i128>,
    /// Most batches returned, 1 to 10,000. Default 100.
    #[param(minimum = 1, maximum = 10_000)]
    limit: Option<u32>,
    /// When there is nothing to report yet, wait up to this long for it, in ms: 0 to 60,000.
    /// Default 0.
    #[param(minimum = 0, maximum = 60_000)]
    wait_ms: Option<u32>,
    /// First wait (up to 10 s) until this node has applied this Raft log index; `503 not_ready`
    /// if it has not by then. 0 to 2⁶⁴−1.
    #[param(minimum = 0)]
    min_index: Option<u64>,
}

/// The start of a subscription (SPEC §4).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct SubscribeQuery {
    /// The cursor, as for a read: 0 to 2⁶⁴−1, or `-1` (read as 0). Default 0. `Last-Event-ID`
    /// takes precedence.
    #[param(minimum = -1)]
    after: Option<i128>,
}

/// A member's node id in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct MemberPath {
    /// The node id, an integer from 0 to 2⁶⁴−1 (ids of members start at 1).
    #[param(minimum = 0)]
    id: u64,
}

/// A token's name in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(super) struct TokenPath {
    /// The token's name: 1 to 64 characters of `A–Z a–z 0–9 . -`.
    #[param(pattern = r"^[A-Za-z0-9.-]{1,64}$")]
    name: String,
}

/// The body of a frames publish (SPEC §6): frames, each a 4-byte big-endian payload length
/// followed by that many bytes; 1 to 10,000 frames.
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = String, format = Binary, content_media_type = "application/vnd.runnev.frames")]
pub(super) struct Frames(#[allow(dead_code)] Vec<u8>);

/// A read answered as binary records (`Accept: application/vnd.runnev.batches`): a 36-byte head
/// (`last_seq`, `next_after`, `gap_from`, `gap_to` as u64, `count` as u32; no gap is 0, 0), then
/// `count` records of `seq`, `ts` (u64), payload length (u32) and the payload; big-endian.
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = String, format = Binary, content_media_type = "application/vnd.runnev.batches")]
pub(super) struct Batches(#[allow(dead_code)] Vec<u8>);

/// One batch's payload: the request body, byte for byte, whatever its `Content-Type` (but the
/// frames one); 0 bytes to `--max-batch-bytes`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = String, format = Binary)]
pub(super) struct Payload(#[allow(dead_code)] Vec<u8>);

/// A backup file (docs/contract.md, "Backup and restore").
#[derive(Debug, Serialize, ToSchema)]
#[schema(value_type = String, format = Binary, content_media_type = "application/vnd.runnev.backup")]
pub(super) struct BackupFile(#[allow(dead_code)] Vec<u8>);

/// The answer of a publish: one batch's [`wire::PublishAck`] (any content type but frames), or
/// a frames publish's [`wire::FramesAck`].
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(super) enum PublishAnswer {
    /// One batch published.
    Batch(wire::PublishAck),
    /// Many batches published in one request.
    Frames(wire::FramesAck),
}

/// The answers every request needing a token may get when the node runs with `--auth` (SPEC §7).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum AuthErrors {
    /// `unauthorized`: no token, not `Bearer rnv_…`, an unknown or deleted token, or a wrong
    /// secret; with `WWW-Authenticate: Bearer realm="runnev"`. Only with `--auth`.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `forbidden`: no grant of the token covers the request (only with `--auth`); or a token
    /// asked of a node without `--auth` (`POST /v1/auth/tokens`).
    #[response(status = 403)]
    Forbidden(ErrorBody),
}

/// The answers of a node that cannot serve a read now.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum ReadErrors {
    /// `internal`: a fault of the node (a storage failure), never of the request.
    #[response(status = 500)]
    Internal(ErrorBody),
    /// `not_ready`: this node's Raft core has stopped, or it knows it is no longer a member of
    /// the cluster (use another node), or, where the operation says so, it cannot answer yet.
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// The answers every write (through the leader) may get (docs/http-api.md, "Write errors").
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub(super) enum WriteErrors {
    /// `internal`: a fault of the node (its Raft stopped, a storage failure), never of the
    /// request.
    #[response(status = 500)]
    Internal(ErrorBody),
    /// `no_leader` (with `Retry-After: 1`; with `Runnev-Outcome: unknown` when the write may
    /// still commit); `not_ready` (a leader whose clock is out of bounds or unverified, a
    /// membership change that cannot proceed now, a stopped Raft core); `overloaded`.
    #[response(status = 503)]
    Unavailable(ErrorBody),
    /// `storage_full`: the leader's disk, or a majority's, is low; nothing was proposed.
    #[response(status = 507)]
    StorageFull(ErrorBody),
}

/// The description of the whole document.
const DESCRIPTION: &str = "\
Runnev's client-facing HTTP API: streams, publishing and reading batches, live subscriptions \
(Server-Sent Events), the cluster's view and membership, client tokens, backup, probes and \
metrics. docs/http-api.md describes every endpoint in words; this document is generated from \
the handlers and the wire types of the node that serves it.\n\n\
Every node serves the whole API. Writes sent to a follower are forwarded to the leader. \
Every answer carries `Runnev-Node` (the id of the node that produced it) and, when the \
node knows a leader, `Runnev-Leader` (its `HOST:PORT`). `HEAD` is answered on every `GET` \
path; a method a path does not serve is `405 method_not_allowed` with an `Allow` header. \
Every error answer is `{\"error\": {\"code\", \"message\"}}` (with `\"frame\"` for an error \
about one frame of a frames publish); the codes are listed in docs/http-api.md.\n\n\
With `--auth`, every path but `/healthz`, `/readyz` and `/v1/openapi.json` needs \
`Authorization: Bearer rnv_…` (`401 unauthorized` without a valid token, `403 forbidden` \
without a grant that covers the request; docs/security.md).\n\n\
Left out on purpose: the Raft RPCs between nodes (`POST /raft/append`, `/raft/vote`, \
`/raft/snapshot`, `GET /raft/clock`, `GET /raft/formation`), which are internal to the cluster (postcard bodies, \
node certificates) and not for clients.";

/// The document: every client-facing operation and the schemas they use.
#[derive(OpenApi)]
#[openapi(
    info(title = "Runnev HTTP API", description = DESCRIPTION),
    paths(
        super::streams::list,
        super::streams::put,
        super::streams::info,
        super::streams::delete,
        super::streams::publish,
        super::streams::read,
        super::subscribe::subscribe,
        super::cluster::view,
        super::status::nodes,
        super::members::add,
        super::members::remove,
        super::auth::create,
        super::auth::list,
        super::auth::delete,
        super::backup::backup,
        super::cluster::health,
        super::cluster::ready,
        super::cluster::metrics,
        super::status::page,
        document,
    ),
    components(schemas(ErrorBody, wire::ErrorDetail)),
    tags(
        (name = "streams", description = "Streams, publishing and reading (SPEC §3, §6)"),
        (name = "subscribe", description = "Live subscriptions as Server-Sent Events (SPEC §4)"),
        (name = "cluster", description = "The cluster's view and membership"),
        (name = "auth", description = "Client tokens (SPEC §7)"),
        (name = "backup", description = "A backup of a node's applied state"),
        (name = "node", description = "Probes, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// The document as pretty JSON, ending in a newline: what `GET /v1/openapi.json` answers and
/// `docs/openapi.json` holds.
pub fn document_json() -> String {
    // Serialising a document of plain values cannot fail; an empty answer would fail the test
    // that compares it with docs/openapi.json.
    let mut doc = ApiDoc::openapi();
    // utoipa marks a body optional only through `Option<T>`, which would also allow a JSON
    // `null`. A stream's PUT takes no body or an object, never `null`; a publish with no body
    // publishes a batch of 0 bytes.
    let paths = &mut doc.paths.paths;
    let put = paths.get_mut("/v1/streams/{name}").and_then(|item| item.put.as_mut());
    if let Some(body) = put.and_then(|op| op.request_body.as_mut()) {
        body.required = Some(utoipa::openapi::Required::False);
    }
    let publish = paths.get_mut("/v1/streams/{name}/batches").and_then(|item| item.post.as_mut());
    if let Some(body) = publish.and_then(|op| op.request_body.as_mut()) {
        body.required = Some(utoipa::openapi::Required::False);
    }
    let mut text = unsigned_formats(&doc.to_pretty_json().unwrap_or_default());
    text.push('\n');
    text
}

/// Spells utoipa's formats of unsigned integers (`u-int64`, `u-int32`: its kebab-case of
/// `UInt64`) as `uint64` and `uint32`, in the pretty JSON `text`. Done on the text, not on a
/// `serde_json::Value`, whose map would sort the keys and lose the order of the fields.
fn unsigned_formats(text: &str) -> String {
    text.replace(r#""format": "u-int64""#, r#""format": "uint64""#)
        .replace(r#""format": "u-int32""#, r#""format": "uint32""#)
        .replace(r#""format": "u-int16""#, r#""format": "uint16""#)
        .replace(r#""format": "u-int8""#, r#""format": "uint8""#)
}

/// `GET /v1/openapi.json`: this document. Open like `/healthz` (no token needed with `--auth`).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    summary = "This OpenAPI document",
    tag = "node",
    responses(
        (status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json", body = Object),
    )
)]
pub(super) async fn document() -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], document_json()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/openapi.json` is the document the handlers generate.
    #[test]
    fn openapi_matches_the_committed_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
        let generated = document_json();
        if std::env::var_os("RUNNEV_WRITE_REFERENCE").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} differs from the OpenAPI document the handlers generate; regenerate it with \
             `RUNNEV_WRITE_REFERENCE=1 cargo test -p runnev --lib openapi`",
            path.display()
        );
    }

    #[test]
    fn unsigned_formats_are_spelled_as_the_registry_does() {
        let text = document_json();
        assert!(text.contains(r#""format": "uint64""#), "{text}");
        assert!(!text.contains("u-int"), "{text}");
    }

    /// Every client route of the router is documented, and the Raft RPCs are not.
    #[test]
    fn every_client_path_is_documented() {
        let doc = ApiDoc::openapi();
        let paths: Vec<&str> = doc.paths.paths.keys().map(String::as_str).collect();
        for p in [
            "/v1/streams",
            "/v1/streams/{name}",
            "/v1/streams/{name}/batches",
            "/v1/streams/{name}/subscribe",
            "/v1/cluster",
            "/v1/cluster/nodes",
            "/v1/cluster/members",
            "/v1/cluster/members/{id}",
            "/v1/auth/tokens",
            "/v1/auth/tokens/{name}",
            "/v1/backup",
            "/healthz",
            "/readyz",
            "/metrics",
            "/v1/openapi.json",
            "/",
        ] {
            assert!(paths.contains(&p), "{p} is not documented: {paths:?}");
        }
        assert!(paths.iter().all(|p| !p.starts_with("/raft/")), "{paths:?}");
        // Operation ids are unique (OpenAPI 3.1 §4.8.10.1); utoipa takes the handler's name,
        // which repeats across modules (`list`, `delete`), unless the path names one.
        let mut ids: Vec<String> = doc
            .paths
            .paths
            .values()
            .flat_map(|item| [&item.get, &item.put, &item.post, &item.delete])
            .flatten()
            .map(|op| op.operation_id.clone().unwrap_or_default())
            .collect();
        let count = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), count, "operation ids repeat: {ids:?}");
        assert_eq!(paths.len(), 16, "{paths:?}");
    }
}
