//! The HTTP API of SPEC §3 and the Raft RPC endpoints, on one axum router.
//!
//! Owns: routing, request parsing and validation, and response shapes. Must never: change state
//! except by proposing a [`Command`](crate::raft::Command) through Raft, or answer from state that
//! is not applied (reads come from [`Store`], which holds only committed entries).
//!
//! A publish flows: `streams::publish` validates → `write::write` finds the leader (forwarding
//! the HTTP request to it if that is another node) → `Raft::client_write` replicates the entry to
//! a majority, each fsyncing it → the state machine applies it → the outcome is answered.
//!
//! A node whose Raft core has stopped for good (`raft_stopped`: a storage failure, a panic,
//! an internal error of openraft) can neither commit nor apply again until its process
//! restarts. It then answers every client request on streams and members at once with `503
//! not_ready` (so clients go to another node), ends its subscriptions and waits, and fails
//! `/healthz` and `/readyz`; `/v1/cluster` and `/metrics` still describe it. 2 s later
//! (`crate::limits::RAFT_STOPPED_EXIT_AFTER_DEFAULT`) the node stops and the process exits
//! for its supervisor to restart it (`crate::node::run`).

pub mod auth;
mod backup;
mod cluster;
pub mod contact;
pub(crate) mod members;
pub mod openapi;
pub mod proposer;
pub mod raft_rpc;
mod status;
mod streams;
mod subscribe;
mod write;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::error::ApiError;
use crate::net::HttpClient;
use crate::raft::{NodeId, Raft};
use crate::storage::Store;

/// A wall clock: ms since the Unix epoch. The seam through which a node reads wall time (the
/// simulation supplies simulated time); never read while applying. The `ts` a leader stamps is
/// not its own clock but the median of the voters' ([`crate::clock`]).
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The wall clock, in ms since the Unix epoch.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    })
}

/// Everything a handler needs: one shared [`NodeState`], so a clone is one reference count
/// (axum clones the state for every middleware layer and extractor of every request; as a
/// struct of some fifteen handles and the HTTP client it took about 5 % of a leader's CPU per
/// publish, profiled at c=64).
#[derive(Clone)]
pub struct AppState(Arc<NodeState>);

impl AppState {
    /// The state of a node, shared by its handlers.
    pub fn new(state: NodeState) -> AppState {
        AppState(Arc::new(state))
    }
}

impl std::ops::Deref for AppState {
    type Target = NodeState;

    fn deref(&self) -> &NodeState {
        &self.0
    }
}

/// What a node's handlers share ([`AppState`]).
pub struct NodeState {
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
    /// Largest body of a frames publish (SPEC §6), frame headers included, in bytes.
    pub max_append_bytes: usize,
    /// Whether a publish to a missing stream creates it.
    pub auto_create_streams: bool,
    /// This node's clock measurements: the `ts` it stamps on proposals as leader, and whether its
    /// own clock is fit to lead.
    pub clock: Arc<crate::clock::ClusterClock>,
    /// Renders `/metrics`, when a Prometheus recorder is installed in this process.
    pub prometheus: Option<PrometheusHandle>,
    /// Serialises membership changes on this node.
    pub membership_lock: Arc<tokio::sync::Mutex<()>>,
    /// Batches proposals on the leader.
    pub proposer: proposer::Proposer,
    /// Turns true when the node begins to stop, so long polls and subscriptions end and
    /// graceful shutdown is not held up by them.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// When this node last heard from a leader (subscriptions end when it is cut off).
    pub contact: Arc<contact::LeaderContact>,
    /// Whether this node was removed from the membership without being told
    /// ([`crate::raft::removal`]): writes and `/readyz` then answer at once.
    pub removal: Arc<crate::raft::removal::Removal>,
    /// Whether this node's data directory has room for new writes.
    pub disk: Arc<crate::disk::DiskGuard>,
    /// Which followers said their disk is low (read when leading).
    pub peer_disks: Arc<crate::raft::network::PeerDisks>,
    /// Peer TLS and client authentication settings.
    pub security: auth::Security,
    /// One permit per subscription being served (`--max-subscribers`).
    pub subscribers: Arc<tokio::sync::Semaphore>,
    /// `--max-subscribers`: the permits `subscribers` started with.
    pub max_subscribers: usize,
    /// One permit per subscription read of storage in progress, at most
    /// [`crate::limits::SUBSCRIBE_READS_CONCURRENT_MAX`]: each read runs on tokio's blocking
    /// pool, and a thousand subscriptions woken by one applied entry grew it to hundreds of
    /// threads.
    pub subscribe_reads: Arc<tokio::sync::Semaphore>,
    /// Deadline for a request's body, from the end of its head (`--body-read-timeout`).
    pub body_read_timeout: std::time::Duration,
    /// Whether this node may grant votes ([`crate::raft::vote_gate`]): closed while it may have
    /// lost entries it acknowledged.
    pub vote_gate: Arc<crate::raft::vote_gate::VoteGate>,
}

/// The leader this node knows of, from its Raft metrics: openraft's `current_leader`, except
/// that a node naming itself must also be in the `Leader` state, or it knows no leader (`None`).
///
/// openraft 0.9 derives `current_leader` from the committed vote alone
/// (`RaftCore::current_leader`), so a leader that removed itself from the voters (`DELETE
/// /v1/cluster/members/{its id}`, `retain: false`) goes on naming itself leader as a learner
/// outside the membership: it refuses every proposal with `ForwardToLeader`, and no later
/// leader ever replicates to it to correct the view. Taking that view at its word made every
/// write sent to it retry a proposal at each metrics change its own refusal caused, without a
/// pause (simulation seed 6 with `--membership`: simulated time stopped).
pub(crate) fn known_leader(m: &openraft::RaftMetrics<NodeId, openraft::BasicNode>, me: NodeId) -> Option<NodeId> {
    m.current_leader.filter(|l| *l != me || m.state == openraft::ServerState::Leader)
}

/// Why this node is not a member of the cluster, when it knows so
/// ([`crate::raft::removal`]): only while it does not lead and hears from no leader (a node
/// added back hears from its leader at once).
pub(crate) fn not_a_member(s: &AppState) -> Option<String> {
    s.removal.verdict(|| {
        let leads = known_leader(&s.raft.metrics().borrow(), s.node_id) == Some(s.node_id);
        !leads && s.contact.follower_silence().is_some()
    })
}

/// Why this node's Raft core has stopped for good, if it has. openraft reports the fatal error
/// that ended it (a storage failure; `Stopped` at shutdown) in its last metrics, then drops their
/// sender; a core that panicked drops the sender without a report. Never restarts in-process.
pub(crate) fn raft_stopped(raft: &Raft) -> Option<String> {
    stopped_in(&raft.metrics())
}

fn stopped_in(rx: &tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, openraft::BasicNode>>) -> Option<String> {
    if let Err(e) = &rx.borrow().running_state {
        return Some(e.to_string());
    }
    rx.has_changed().is_err().then(|| "the Raft core ended without reporting why".to_string())
}

/// Resolves, with the reason, once this node's Raft core has stopped for good: for waits on
/// the applied index, which a stopped core never moves again.
///
/// It waits on openraft's server metrics (vote, role, leader, membership), which change with
/// elections and membership changes only; the core drops their sender when it ends, after it
/// reported why in its full metrics. The full metrics change several times per log entry
/// (append, flush, replication, commit, apply), and a waiter on them was woken as often: every
/// open subscription, every read waiting for an index and the node's own stop watch, on each
/// node, at each entry. At one publish in flight that was a fifth of the cluster's CPU
/// (BENCHMARKS.md, "Wake-ups per entry").
pub(crate) async fn raft_stops(raft: &Raft) -> String {
    let mut server = raft.server_metrics();
    loop {
        if let Some(why) = raft_stopped(raft) {
            return why;
        }
        if server.changed().await.is_err() {
            return raft_stopped(raft).unwrap_or_else(|| "the Raft core ended".into());
        }
    }
}

/// The answer of a client request on a node whose Raft core has stopped: `503 not_ready`, so
/// a client takes it to another node.
pub(crate) fn raft_stopped_error(why: &str) -> ApiError {
    ApiError::NotReady(format!(
        "raft has stopped on this node ({why}); it serves no reads or writes until it is restarted: use another node"
    ))
}

/// Answers `503` at once, before the handler, when the Raft core has stopped.
async fn refuse_without_raft(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match raft_stopped(&s.raft) {
        Some(why) => raft_stopped_error(&why).into_response(),
        None => next.run(req).await,
    }
}

/// Registers the series that count rare events (refusals, gaps) and the gauges of connections
/// and subscribers at 0, so `/metrics` shows them before the first event: a dashboard then
/// draws 0 instead of nothing, and `rate` or `increase` over them has a start.
pub(crate) fn export_zeroes() {
    for code in ["unauthorized", "forbidden"] {
        metrics::counter!("runnev_auth_refused_total", "code" => code).increment(0);
    }
    for bound in ["connections", "subscribers", "proposals"] {
        metrics::counter!("runnev_overloaded_total", "bound" => bound).increment(0);
    }
    for kind in ["header", "body"] {
        metrics::counter!("runnev_read_timeouts_total", "kind" => kind).increment(0);
    }
    for via in ["read", "subscribe"] {
        metrics::counter!("runnev_gaps_delivered_total", "via" => via).increment(0);
    }
    for kind in ["read", "subscribe"] {
        metrics::counter!("runnev_request_waits_total", "kind" => kind).increment(0);
        metrics::gauge!("runnev_waiting_requests", "kind" => kind).increment(0.0);
    }
    metrics::counter!("runnev_writes_refused_disk_low_total").increment(0);
    metrics::counter!("runnev_appends_refused_disk_low_total").increment(0);
    metrics::gauge!("runnev_subscribers").increment(0.0);
    metrics::gauge!("runnev_proposal_queue").increment(0.0);
    metrics::gauge!("runnev_connections").increment(0.0);
}

/// The router serving SPEC §3 and the Raft RPCs.
pub fn router(state: AppState) -> Router {
    let envelope = Arc::new(Envelope {
        node: state.node_id,
        node_header: HeaderValue::from(state.node_id),
        next_request_id: std::sync::atomic::AtomicU64::new(0),
        body_read_timeout: state.body_read_timeout,
        raft: state.raft.clone(),
    });
    Router::new()
        .route("/v1/streams", get(streams::list))
        .route("/v1/streams/{name}", put(streams::put).get(streams::info).delete(streams::delete))
        .route("/v1/streams/{name}/batches", post(streams::publish).get(streams::read))
        .route("/v1/streams/{name}/subscribe", get(subscribe::subscribe))
        .route("/v1/cluster/members", post(members::add))
        .route("/v1/cluster/members/{id}", axum::routing::delete(members::remove))
        .route("/v1/auth/tokens", post(auth::create).get(auth::list))
        .route("/v1/auth/tokens/{name}", axum::routing::delete(auth::delete))
        // The routes above serve clients from Raft's state; the ones below describe the node.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), refuse_without_raft))
        .route("/v1/cluster", get(cluster::view))
        .route("/v1/cluster/nodes", get(status::nodes))
        .route("/", get(status::page))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/v1/backup", get(backup::backup))
        .route("/healthz", get(cluster::health))
        .route("/readyz", get(cluster::ready))
        .route("/metrics", get(cluster::metrics))
        .route(crate::raft::network::APPEND_PATH, post(raft_rpc::append))
        .route(crate::raft::network::VOTE_PATH, post(raft_rpc::vote))
        .route(crate::raft::network::SNAPSHOT_PATH, post(raft_rpc::snapshot))
        .route(crate::raft::network::GROUP_RPC_ROUTE, post(raft_rpc::group))
        .route(crate::clock::CLOCK_PATH, get(raft_rpc::clock))
        .route(crate::raft::formation::FORMATION_PATH, get(raft_rpc::formation))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(envelope, around_request))
        .with_state(state)
}

/// The leader's address as this node knows it, sent as `Runnev-Leader` so clients can send
/// writes straight to the leader instead of through a forwarding hop. None once the Raft core
/// has stopped: its last view may name this very node.
fn leader_addr(raft: &Raft) -> Option<String> {
    let m = raft.metrics();
    if stopped_in(&m).is_some() {
        return None;
    }
    let m = m.borrow();
    let leader = known_leader(&m, m.id)?;
    m.membership_config.membership().get_node(&leader).map(|n| n.addr.clone())
}

/// What [`around_request`] needs of the node: its id, its request counter, the body deadline
/// and its Raft handle (for the leader's address).
struct Envelope {
    node: NodeId,
    node_header: HeaderValue,
    /// The count in the next request id this node makes (`n<node>-<count>`, from 0 at each
    /// start of the process).
    next_request_id: std::sync::atomic::AtomicU64,
    body_read_timeout: std::time::Duration,
    raft: Raft,
}

/// Everything every request goes through before its route and its answer after, in one layer
/// (it was five, and each layer of axum boxes the request's future and clones its state; the
/// profile of a publish counted them among the HTTP stack's cost on every node, Raft RPCs
/// included):
/// - gives a request without an `X-Request-Id` header the id `n<node>-<count>` (a client's own
///   id is kept as sent); the answer carries the same header, and the request's log span names
///   it;
/// - refuses a transfer coding other than `chunked` alone ([`transfer_coding_refusal`]);
/// - gives the request body a deadline of `--body-read-timeout` from now, the end of its head
///   ([`DeadlineBody`]);
/// - counts the request by method, route and status, and times it (`/metrics`:
///   `runnev_http_requests_total`, `runnev_http_request_seconds`);
/// - names this node in `Runnev-Node` and the leader it knows in `Runnev-Leader`, so clients can
///   send writes straight to the leader (a forwarded answer keeps the headers of the leader that
///   decided it).
async fn around_request(
    State(e): State<Arc<Envelope>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use tracing::Instrument as _;
    const REQUEST_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("x-request-id");
    let id = match req.headers().get(&REQUEST_ID) {
        Some(v) => Some(v.clone()),
        None => {
            let n = e.next_request_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let made = HeaderValue::try_from(format!("n{}-{n}", e.node)).ok();
            if let Some(v) = &made {
                req.headers_mut().insert(REQUEST_ID, v.clone());
            }
            made
        }
    };
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    // Every line logged while the request is handled names it (in JSON: "span": {"id", …}).
    let span = tracing::info_span!(
        "request",
        id = id.as_ref().map(|v| String::from_utf8_lossy(v.as_bytes())).as_deref().unwrap_or_default(),
        method = %method,
        route = %route
    );
    let started = std::time::Instant::now();
    let mut resp = match transfer_coding_refusal(req.headers()) {
        Some(refused) => refused.into_response(),
        None => {
            let timeout = e.body_read_timeout;
            next.run(req.map(|body| Body::new(DeadlineBody::new(body, timeout)))).instrument(span).await
        }
    };
    let status = resp.status().as_u16().to_string();
    metrics::counter!("runnev_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("runnev_http_request_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    let headers = resp.headers_mut();
    if let Some(id) = id {
        headers.entry(REQUEST_ID).or_insert(id);
    }
    headers.entry("runnev-node").or_insert_with(|| e.node_header.clone());
    if let Some(addr) = leader_addr(&e.raft).and_then(|a| HeaderValue::from_str(&a).ok()) {
        headers.entry("runnev-leader").or_insert(addr);
    }
    resp
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no such path: {}", uri.path()))
}

/// A path that does not serve the method: `405`. axum's method router adds the `Allow` header,
/// listing the methods the path serves (RFC 9110 §15.5.6).
async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not served on {}; the Allow header lists what is", uri.path()))
}

/// The refusal of a request whose `Transfer-Encoding` is anything but `chunked` alone: `501
/// not_implemented` (RFC 9112 §6.1), answered by [`around_request`] before any handler reads
/// its body. hyper removes the
/// `chunked` framing and hands over what is inside, so a body sent as `gzip, chunked` would
/// otherwise be stored still compressed, as if it were the payload. (A `Transfer-Encoding` whose
/// last coding is not `chunked` never gets here: hyper answers it `400` itself, RFC 9112 §6.3.)
fn transfer_coding_refusal(headers: &axum::http::HeaderMap) -> Option<ApiError> {
    let mut codings = headers
        .get_all(axum::http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| c.trim_ascii())
        .filter(|c| !c.is_empty());
    let chunked_alone = match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(c), None) => c.eq_ignore_ascii_case(b"chunked"),
        _ => false,
    };
    if chunked_alone {
        return None;
    }
    let header = headers
        .get_all(axum::http::header::TRANSFER_ENCODING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(", ");
    Some(ApiError::NotImplemented(format!(
        "Transfer-Encoding {header:?} is not implemented: only \"chunked\" alone is; send the payload as it is to be stored"
    )))
}

/// A request body's deadline passed before the whole body arrived.
#[derive(Debug, thiserror::Error)]
#[error("the body did not arrive within {timeout:?} (--body-read-timeout)")]
pub(crate) struct BodyReadTimeout {
    timeout: std::time::Duration,
}

/// A body that fails with [`BodyReadTimeout`] once its deadline has passed ([`around_request`]
/// gives every request body a deadline of `--body-read-timeout` from the end of its head:
/// whatever reads a body, a publish, a frames publish, a Raft RPC or an admin document, is
/// bounded alike, so a client sending its body one byte a second holds its connection for that
/// long at most; [`read_body`] answers it `408`), and counts that in
/// `runnev_read_timeouts_total{kind="body"}`. Frames that are already there are still handed
/// over; the deadline only ends a wait for more.
struct DeadlineBody {
    inner: Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: std::time::Duration,
    expired: bool,
}

impl DeadlineBody {
    fn new(inner: Body, timeout: std::time::Duration) -> DeadlineBody {
        DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout, expired: false }
    }
}

impl axum::body::HttpBody for DeadlineBody {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        if self.expired {
            return Poll::Ready(Some(Err(BodyReadTimeout { timeout: self.timeout }.into())));
        }
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if std::future::Future::poll(self.deadline.as_mut(), cx).is_pending() {
            return Poll::Pending;
        }
        self.expired = true;
        metrics::counter!("runnev_read_timeouts_total", "kind" => "body").increment(1);
        Poll::Ready(Some(Err(BodyReadTimeout { timeout: self.timeout }.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `e`, or any error behind it, is a [`BodyReadTimeout`].
fn is_body_read_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<BodyReadTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Reads the whole body of an API request whose headers are `headers`, at most `limit_bytes`.
///
/// A declared length (`Content-Length`) over the limit is refused before any of the body is
/// buffered. If the request also asks `Expect: 100-continue` (RFC 9110 §10.1.1) the `413` goes
/// out at once, before any of its body is read: hyper answers `100 Continue` when a handler
/// first reads the body, so the client then sends none of it (curl asks so for bodies over
/// 1 MiB; it used to be told to go on and upload all of it to be refused).
///
/// Errors: `413 payload_too_large` past the limit, answered once the rest of the body was read
/// and dropped ([`refuse_too_large`]) unless the client waits for `100 Continue`;
/// `408 request_timeout` when the body's deadline passed first ([`DeadlineBody`]);
/// `400 invalid_body` if the body breaks off.
pub(crate) async fn read_request_body(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit_bytes: usize,
) -> Result<bytes::Bytes, ApiError> {
    let expects_continue = headers
        .get(axum::http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
    read_body(body, limit_bytes, expects_continue).await
}

/// [`read_request_body`] with its `Expect: 100-continue` already read: `waits_for_continue`
/// (always false for Raft RPCs, which come from the peers' own client and never ask it).
pub(crate) async fn read_body(
    mut body: Body,
    limit_bytes: usize,
    waits_for_continue: bool,
) -> Result<bytes::Bytes, ApiError> {
    let declared = axum::body::HttpBody::size_hint(&body).lower();
    if declared > limit_bytes as u64 {
        if waits_for_continue {
            return Err(ApiError::PayloadTooLarge { limit_bytes });
        }
        return Err(refuse_too_large(body, declared, limit_bytes).await);
    }
    // One chunk (the usual small publish) is handed over as it came, without a copy.
    let mut first: Option<bytes::Bytes> = None;
    let mut more = bytes::BytesMut::new();
    let mut read: u64 = 0;
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_trailers) => continue,
            },
            Err(e) if is_body_read_timeout(&e) => {
                return Err(ApiError::RequestTimeout(format!(
                    "{}; nothing was done: send the request again, on a new connection",
                    crate::net::cause_text(&e)
                )))
            }
            Err(e) => return Err(ApiError::InvalidBody(format!("reading the body failed: {e}"))),
        };
        read = read.saturating_add(data.len() as u64);
        if read > limit_bytes as u64 {
            return Err(refuse_too_large(body, read, limit_bytes).await);
        }
        match first.take() {
            None if more.is_empty() => first = Some(data),
            None => more.extend_from_slice(&data),
            Some(f) => {
                more.extend_from_slice(&f);
                more.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| more.freeze()))
}

/// The `413 payload_too_large` for a body of which `seen` bytes (declared or read) are over
/// `limit_bytes`. If the whole body is at most [`DISCARD_BODY_BYTES_MAX`], the rest of it is
/// read and dropped first (within the body's deadline), so the client finishes its write and
/// reads the answer; a larger one is not read, and the connection closes under the client.
///
/// [`DISCARD_BODY_BYTES_MAX`]: crate::limits::DISCARD_BODY_BYTES_MAX
async fn refuse_too_large(mut body: Body, seen: u64, limit_bytes: usize) -> ApiError {
    let cap = crate::limits::DISCARD_BODY_BYTES_MAX as u64;
    let mut total = seen.max(axum::body::HttpBody::size_hint(&body).lower());
    while total <= cap {
        match body.frame().await {
            Some(Ok(frame)) => {
                total = total.saturating_add(frame.data_ref().map_or(0, |d| d.len() as u64));
            }
            // The end, a deadline or a broken body: nothing more to wait for.
            Some(Err(_)) | None => break,
        }
    }
    ApiError::PayloadTooLarge { limit_bytes }
}

/// Decodes `bytes` as the JSON object `T`, whose shape `shape` names in the error. `objects`
/// are the JSON pointers (RFC 6901) of the members that `T` reads as structs, each of which
/// must be an object when present and not `null`; a pointer ending in `/*` names every item of
/// the array there.
///
/// Errors: `400 invalid_body` for anything else, including a JSON array for the body or for one
/// of `objects` (serde would otherwise take a struct's fields from an array, in order), and a
/// member named twice in one object (RFC 8259 §4 leaves such a body's meaning to the reader:
/// `{"retention": {"max_batches": 5, "max_batches": 1}}` must not evict by the last one).
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    shape: &str,
    objects: &[&str],
) -> Result<T, ApiError> {
    let expected = |e: String| ApiError::InvalidBody(format!("expected {shape}: {e}"));
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| expected(e.to_string()))?;
    if !value.is_object() {
        return Err(expected("the body is not a JSON object".into()));
    }
    for pointer in objects {
        let (at, items) = match pointer.strip_suffix("/*") {
            Some(array) => (array, true),
            None => (*pointer, false),
        };
        let members: Vec<&serde_json::Value> = match value.pointer(at) {
            Some(serde_json::Value::Array(all)) if items => all.iter().collect(),
            Some(one) if !items => vec![one],
            _ => Vec::new(),
        };
        if members.iter().any(|m| !(m.is_object() || m.is_null())) {
            return Err(expected(format!("{pointer} must be a JSON object")));
        }
    }
    // From the bytes, not from `value`: a `serde_json::Value` keeps the last of two members of
    // one name, while a struct's derived decoder refuses the second (`duplicate field`).
    serde_json::from_slice(bytes).map_err(|e| expected(whole_number_text(e.to_string())))
}

/// serde's text for a number that is not a whole number in range where one is expected, in
/// the client's terms. serde_json reads an integer past 2^64 − 1 as a float, so `2^64` for a
/// `u64` field used to be refused as "invalid type: floating point `1.8446744073709552e19`,
/// expected u64", which names neither the rule nor the range. Any other text is kept.
fn whole_number_text(serde_text: String) -> String {
    let Some(rest) = serde_text.strip_prefix("invalid type: floating point `") else {
        return serde_text;
    };
    let Some((number, after)) = rest.split_once('`') else {
        return serde_text;
    };
    let Some(where_) = after.strip_prefix(", expected u64") else {
        return serde_text;
    };
    format!("{number} is not a whole number from 0 to {}{where_}", u64::MAX)
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::future::Future;
    use std::time::Duration;

    /// Counts the wakes of a future it is the waker of.
    #[derive(Default)]
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl CountingWaker {
        fn wakes(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    /// A one-node Raft group on a fresh store in `dir`, formed and leading.
    async fn one_node_raft(dir: &std::path::Path) -> Raft {
        let store = crate::storage::Store::open(dir).unwrap();
        let config = openraft::Config { cluster_name: "test".into(), ..Default::default() }.validate().unwrap();
        let network = crate::raft::network::Network::new(
            store.group(),
            crate::net::http_client(Arc::new(crate::net::TcpDialer)),
            None,
            Default::default(),
        );
        let raft = Raft::new(
            1,
            Arc::new(config),
            network,
            crate::storage::log_store::LogStore::new(store.clone()),
            crate::storage::state_machine::StateMachine::new(store),
        )
        .await
        .unwrap();
        raft.initialize(std::collections::BTreeMap::from([(1, openraft::BasicNode::new("127.0.0.1:1"))]))
            .await
            .unwrap();
        raft.wait(Some(Duration::from_secs(10))).state(openraft::ServerState::Leader, "leads").await.unwrap();
        raft
    }

    fn publish(i: u8) -> crate::raft::Command {
        crate::raft::Command::Publish {
            stream: "s".into(),
            seq: None,
            ts: 0,
            auto_create: true,
            data: bytes::Bytes::from(vec![i; 100]),
        }
    }

    /// A wait for the Raft core's stop (every subscription and every read waiting for an index
    /// holds one) sleeps through log entries and wakes when the core stops. It waited on the
    /// full metrics, which change several times per entry, and was woken at each: at one
    /// publish in flight a fifth of the cluster's CPU went to such wake-ups.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_for_the_core_s_stop_sleeps_through_entries_and_wakes_at_the_stop() {
        let dir = tempfile::tempdir().unwrap();
        let raft = one_node_raft(dir.path()).await;
        let first = raft.client_write(publish(0)).await.unwrap().log_id.index;
        let counter = Arc::new(CountingWaker::default());
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut stops = Box::pin(raft_stops(&raft));
        assert!(stops.as_mut().poll(&mut cx).is_pending(), "the core runs");
        let mut last = first;
        for i in 1..=20 {
            last = raft.client_write(publish(i)).await.unwrap().log_id.index;
        }
        assert_eq!(last, first + 20, "twenty entries were committed and applied");
        assert_eq!(counter.wakes(), 0, "woken by log entries");
        raft.shutdown().await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while counter.wakes() == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not woken by the core's stop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match stops.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(why) => assert!(!why.is_empty()),
            std::task::Poll::Pending => panic!("woken at the stop but still waiting"),
        }
    }

    /// A JSON body that names a member twice is `400 invalid_body`, at the top and inside a
    /// nested object, rather than read as its last value (a fresh user's trial set
    /// `max_batches` to the second of two values and evicted 29 batches); one naming each once
    /// is read, and an array where an object belongs is still refused.
    #[test]
    fn a_json_body_that_names_a_member_twice_is_refused() {
        let put = |body: &str| json_object::<crate::wire::PutStream>(body.as_bytes(), "a stream", &["/retention"]);
        let twice = put(r#"{"retention": {"max_batches": 1}, "retention": {"max_batches": 2}}"#);
        assert!(matches!(&twice, Err(ApiError::InvalidBody(m)) if m.contains("duplicate field")), "{twice:?}");
        let nested = put(r#"{"retention": {"max_batches": 5, "max_batches": 1}}"#);
        assert!(matches!(&nested, Err(ApiError::InvalidBody(m)) if m.contains("duplicate field")), "{nested:?}");
        let once = put(r#"{"retention": {"max_batches": 5}}"#).expect("a body naming each member once");
        assert_eq!(once.retention.max_batches, Some(5));
        assert!(matches!(put(r#"{"retention": [5]}"#), Err(ApiError::InvalidBody(_))));
    }

    /// A number past 2^64 − 1 (or with a fraction) where a `u64` belongs is refused with the
    /// rule and the range, not serde's "invalid type: floating point", and changes nothing
    /// (a fresh user's trial sent `max_age_ms: 18446744073709551616`); other errors keep
    /// serde's words.
    #[test]
    fn a_number_out_of_range_is_refused_in_the_client_s_terms() {
        let put = |body: &str| json_object::<crate::wire::PutStream>(body.as_bytes(), "a stream", &["/retention"]);
        let past = put(r#"{"retention": {"max_age_ms": 18446744073709551616}}"#);
        assert!(
            matches!(&past, Err(ApiError::InvalidBody(m))
                if m.contains("1.8446744073709552e+19 is not a whole number from 0 to 18446744073709551615")),
            "{past:?}"
        );
        let fraction = put(r#"{"retention": {"max_batches": 1.5}}"#);
        assert!(
            matches!(&fraction, Err(ApiError::InvalidBody(m)) if m.contains("1.5 is not a whole number")),
            "{fraction:?}"
        );
        let negative = put(r#"{"retention": {"max_batches": -1}}"#);
        assert!(matches!(&negative, Err(ApiError::InvalidBody(m)) if m.contains("invalid value")), "{negative:?}");
        let max = put(r#"{"retention": {"max_age_ms": 18446744073709551615}}"#).expect("2^64 - 1 is a u64");
        assert_eq!(max.retention.max_age_ms, Some(u64::MAX));
    }

    /// A leader that removed itself keeps a committed vote for itself as a learner: openraft 0.9
    /// still names it `current_leader`; this node must not take itself for the leader then
    /// (simulation seed 6 with `--membership`). Another node named leader is taken at its word.
    #[test]
    fn a_node_names_itself_leader_only_in_the_leader_state() {
        let mut m = openraft::RaftMetrics::<NodeId, openraft::BasicNode>::new_initial(2);
        m.current_leader = Some(2);
        m.state = openraft::ServerState::Learner;
        assert_eq!(known_leader(&m, 2), None, "a removed leader, now a learner");
        m.state = openraft::ServerState::Follower;
        assert_eq!(known_leader(&m, 2), None, "a deposed leader");
        m.state = openraft::ServerState::Leader;
        assert_eq!(known_leader(&m, 2), Some(2));
        m.state = openraft::ServerState::Follower;
        m.current_leader = Some(3);
        assert_eq!(known_leader(&m, 2), Some(3));
        m.current_leader = None;
        assert_eq!(known_leader(&m, 2), None);
    }

    /// A body that sends `first` and then nothing, without ending.
    fn stalled_after(first: &'static [u8]) -> Body {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(first))])
            .chain(futures::stream::pending());
        Body::from_stream(chunks)
    }

    /// A body whose sender stops is `408` at its deadline, not a wait forever; a body that
    /// arrives in time is read whole.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_is_408_at_its_deadline() {
        let timeout = std::time::Duration::from_secs(2);
        let started = tokio::time::Instant::now();
        let cut = read_body(Body::new(DeadlineBody::new(stalled_after(b"abc"), timeout)), 1024, false).await;
        assert!(matches!(cut, Err(ApiError::RequestTimeout(_))), "{cut:?}");
        assert_eq!(started.elapsed(), timeout);
        let whole = read_body(Body::new(DeadlineBody::new(Body::from("abc"), timeout)), 1024, false).await;
        assert_eq!(whole.expect("a body in time").as_ref(), b"abc");
    }

    /// A body of `chunks` chunks of `chunk` bytes each, counting in `polled` how many were read.
    fn counted(chunks: usize, chunk: usize, polled: Arc<std::sync::atomic::AtomicUsize>) -> Body {
        let data = bytes::Bytes::from(vec![7u8; chunk]);
        Body::from_stream(futures::stream::iter(0..chunks).map(move |_| {
            polled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, std::io::Error>(data.clone())
        }))
    }

    /// A body over its limit is `413`, but only after the rest of it was read (so a client still
    /// writing it reads the answer); past `DISCARD_BODY_BYTES_MAX` the reading stops.
    #[tokio::test]
    async fn an_oversized_body_is_read_to_its_end_before_413_up_to_the_discard_bound() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let polled = Arc::new(AtomicUsize::new(0));
        let refused = read_body(counted(100, 10, polled.clone()), 25, false).await;
        assert!(matches!(refused, Err(ApiError::PayloadTooLarge { limit_bytes: 25 })), "{refused:?}");
        assert_eq!(polled.load(Ordering::Relaxed), 100, "every chunk of the refused body was read");

        let chunk = 1024 * 1024;
        let chunks = crate::limits::DISCARD_BODY_BYTES_MAX / chunk + 10;
        let polled = Arc::new(AtomicUsize::new(0));
        let refused = read_body(counted(chunks, chunk, polled.clone()), 25, false).await;
        assert!(matches!(refused, Err(ApiError::PayloadTooLarge { .. })), "{refused:?}");
        let read = polled.load(Ordering::Relaxed);
        assert!(read < chunks, "a body past the discard bound is not read to its end ({read} of {chunks})");
        assert!(read * chunk > crate::limits::DISCARD_BODY_BYTES_MAX, "read up to the bound first ({read} chunks)");

        let whole = read_body(counted(3, 10, Arc::new(AtomicUsize::new(0))), 30, false).await;
        assert_eq!(whole.expect("a body at its limit").len(), 30);
    }
}
