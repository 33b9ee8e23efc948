//! The HTTP API of SPEC §3 and the Raft RPC endpoints, on one axum router.
//!
//! Owns: routing, request parsing and validation, and response shapes. Must never: change state
//! except by proposing a [`Command`](crate::raft::Command) through Raft, or answer from state that
//! is not applied (reads come from [`Store`], which holds only committed entries).
//!
//! A publish flows: `streams::publish` validates → `write::write` finds the leader (forwarding
//! the HTTP request to it if that is another node) → `Raft::client_write` replicates the entry to
//! a majority, each fsyncing it → the state machine applies it → the outcome is answered.

mod cluster;
mod members;
pub mod proposer;
pub mod raft_rpc;
mod streams;
mod subscribe;
mod write;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::error::ApiError;
use crate::net::HttpClient;
use crate::raft::{NodeId, Raft};
use crate::storage::Store;

/// The clock that stamps `ts` on proposed entries: ms since the Unix epoch. A seam so the
/// simulation can supply simulated time; never read while applying.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The wall clock, in ms since the Unix epoch.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    })
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// This node's id.
    pub node_id: NodeId,
    /// The Raft handle.
    pub raft: Raft,
    /// The node's storage (read side).
    pub store: Arc<Store>,
    /// Client for forwarding to the leader.
    pub http: HttpClient,
    /// Largest publish payload, in bytes.
    pub max_batch_bytes: usize,
    /// Whether a publish to a missing stream creates it.
    pub auto_create_streams: bool,
    /// Stamps `ts` on proposals.
    pub clock: Clock,
    /// Renders `/metrics`, when a Prometheus recorder is installed in this process.
    pub prometheus: Option<PrometheusHandle>,
    /// Serialises membership changes on this node.
    pub membership_lock: Arc<tokio::sync::Mutex<()>>,
    /// Batches proposals on the leader.
    pub proposer: proposer::Proposer,
    /// Turns true when the node begins to stop, so long polls and subscriptions end and
    /// graceful shutdown is not held up by them.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// The router serving SPEC §3 and the Raft RPCs.
pub fn router(state: AppState) -> Router {
    let node_header = HeaderValue::from(state.node_id);
    let raft = state.raft.clone();
    Router::new()
        .route("/v1/streams", get(streams::list))
        .route("/v1/streams/{name}", put(streams::put).get(streams::info).delete(streams::delete))
        .route("/v1/streams/{name}/batches", post(streams::publish).get(streams::read))
        .route("/v1/streams/{name}/subscribe", get(subscribe::subscribe))
        .route("/v1/cluster", get(cluster::view))
        .route("/v1/cluster/members", post(members::add))
        .route("/v1/cluster/members/{id}", axum::routing::delete(members::remove))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(cluster::ready))
        .route("/metrics", get(cluster::metrics))
        .route(crate::raft::network::APPEND_PATH, post(raft_rpc::append))
        .route(crate::raft::network::VOTE_PATH, post(raft_rpc::vote))
        .route(crate::raft::network::SNAPSHOT_PATH, post(raft_rpc::snapshot))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(record_request))
        .layer(axum::middleware::map_response(move |mut resp: Response| {
            let v = node_header.clone();
            let leader = leader_addr(&raft);
            async move {
                // A forwarded answer keeps the headers of the leader that decided it.
                resp.headers_mut().entry("runnev-node").or_insert(v);
                if let Some(addr) = leader.and_then(|a| HeaderValue::from_str(&a).ok()) {
                    resp.headers_mut().entry("runnev-leader").or_insert(addr);
                }
                resp
            }
        }))
        .with_state(state)
}

/// The leader's address as this node knows it, sent as `Runnev-Leader` so clients can send
/// writes straight to the leader instead of through a forwarding hop.
fn leader_addr(raft: &Raft) -> Option<String> {
    let m = raft.metrics();
    let m = m.borrow();
    let leader = m.current_leader?;
    m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
}

/// Counts requests by route and status, and times them (`/metrics`).
async fn record_request(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics::counter!("runnev_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("runnev_http_request_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    resp
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no such path: {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("{method} is not served on {}", uri.path()))
}

/// Reads a whole request body of at most `limit_bytes`.
///
/// Errors: `413 payload_too_large` past the limit; `400 invalid_body` if the body breaks off.
pub(crate) async fn read_body(body: Body, limit_bytes: usize) -> Result<bytes::Bytes, ApiError> {
    // A declared length (Content-Length) over the limit is refused before any of the body is
    // read or buffered.
    if axum::body::HttpBody::size_hint(&body).lower() > limit_bytes as u64 {
        return Err(ApiError::PayloadTooLarge { limit_bytes });
    }
    match Limited::new(body, limit_bytes).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::PayloadTooLarge { limit_bytes }),
        Err(e) => Err(ApiError::InvalidBody(format!("reading the body failed: {e}"))),
    }
}

/// Counts one request in the gauge `runnev_waiting_requests{kind}` while it is alive, and once
/// in the counter `runnev_request_waits_total{kind}`: a read or subscription parked to wait for
/// this node to apply what it needs (a stream's creation, a batch after the cursor; SPEC §2.6,
/// a node that is behind waits instead of answering wrongly). Operators see how many long polls
/// are parked; the tests see that a request they sent to a node held behind did park in its
/// wait (the counter cannot be missed between two scrapes), rather than being unanswered by
/// chance.
pub(crate) struct Waiting(&'static str);

impl Waiting {
    /// Counts a waiting request of `kind` (`read` or `subscribe`) until the guard is dropped.
    pub(crate) fn start(kind: &'static str) -> Waiting {
        metrics::counter!("runnev_request_waits_total", "kind" => kind).increment(1);
        metrics::gauge!("runnev_waiting_requests", "kind" => kind).increment(1.0);
        Waiting(kind)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!("runnev_waiting_requests", "kind" => self.0).decrement(1.0);
    }
}

/// A JSON answer with a status.
pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    (status, axum::Json(value)).into_response()
}
