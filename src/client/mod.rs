//! The Rust client: a list of nodes with failover, idempotent publish with retries, reads, stream
//! administration, and subscriptions that survive node failures.
//!
//! Owns: how a program talks to a cluster (the CLI, the bench, the outbox relay use it). Must
//! never: change a publisher's seq between retries (that is what makes a retry idempotent, SPEC
//! §2.3), or hand a consumer a batch at or below its cursor twice in one subscription.
//!
//! Retries: a publish with a `seq` that gets a connection error, a timeout or `503` is retried on
//! the next node with exponential backoff until [`RetryPolicy::give_up_after`]; the retry is
//! exactly-once (the server answers `duplicate: true`). A publish without a seq is retried only
//! when it certainly was not applied (the connection was refused, or a `503` before any
//! proposal); when its outcome is unknown it fails with [`ClientError::OutcomeUnknown`] rather
//! than risk storing the batch twice.

mod cursor;
mod subscription;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, StatusCode};

pub use cursor::{CursorStore, FileCursor};
pub use subscription::{Delivery, Subscription};

use crate::net::{http_client, Dialer, HttpClient, TcpDialer};
use crate::stream::Retention;
use crate::wire::{self, BatchBody, ClusterView};
pub use crate::wire::{Gap, PublishAck, StreamInfo};

/// Default node list (SPEC §5), used when neither `--nodes` nor `RUNNEV_NODES` is given.
pub const DEFAULT_NODES: &str = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003";

use crate::limits::{
    CLIENT_ANSWER_BYTES_MAX as ANSWER_BYTES_MAX, CLIENT_BACKOFF_MAX_MS, CLIENT_BACKOFF_MIN_MS, CLIENT_GIVE_UP_MS,
    CLIENT_MEMBER_CHANGE_EXTRA_MS, CLIENT_REQUEST_TIMEOUT_MS,
};

/// Extra time a membership change may take beyond the request timeout (catch-up and two commits).
const MEMBER_CHANGE_EXTRA: Duration = Duration::from_millis(CLIENT_MEMBER_CHANGE_EXTRA_MS);

/// How the client retries.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Deadline of one HTTP exchange (long polls add their `wait_ms`).
    pub request_timeout: Duration,
    /// First backoff between attempts; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Largest backoff between attempts.
    pub backoff_max: Duration,
    /// Total time a call keeps retrying before [`ClientError::Unavailable`].
    pub give_up_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            request_timeout: Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS),
            backoff_min: Duration::from_millis(CLIENT_BACKOFF_MIN_MS),
            backoff_max: Duration::from_millis(CLIENT_BACKOFF_MAX_MS),
            give_up_after: Duration::from_millis(CLIENT_GIVE_UP_MS),
        }
    }
}

/// Exponential backoff between retries: `min`, doubling, capped at `max`, without end and
/// without jitter; [`Backoff::reset`] after a success. The one the client, its subscriptions and
/// the outbox relay and sink wait with. (backon's exponential backoff multiplies in `f32`, so its
/// delays drift off whole milliseconds; these stay exact.)
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff from `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { min, max, next: min }
    }

    /// The delay to wait now; the next one doubles (saturating, capped at `max`).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// Back to `min` after a success.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// A client error.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error of SPEC §3 (not retried: retrying cannot change it).
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// SPEC §3 error code, e.g. `seq_conflict`.
        code: String,
        /// The server's explanation.
        message: String,
    },
    /// A publish without a seq reached the cluster but its outcome is unknown (a timeout, a
    /// connection lost mid-request, or `503` with `Runnev-Outcome: unknown`). It was not retried,
    /// because a retry without a seq could store the batch twice; publish with a seq to retry
    /// safely.
    #[error("the outcome is unknown (not retried, as a publish without seq is not idempotent): {0}")]
    OutcomeUnknown(String),
    /// No node gave a definitive answer before the retry deadline; the last problem is given.
    #[error("no node took the request within {after:?}; last problem: {last}")]
    Unavailable {
        /// How long the client tried.
        after: Duration,
        /// The last failure seen.
        last: String,
    },
    /// The node list is empty or a URL is malformed.
    #[error("client configuration: {0}")]
    Config(String),
    /// An answer did not have the shape SPEC §3 gives it.
    #[error("unexpected answer from {node}: {what}")]
    Protocol {
        /// The node that answered.
        node: String,
        /// What was wrong.
        what: String,
    },
}

impl ClientError {
    /// The SPEC §3 error code, if the cluster answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// One batch as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Its seq.
    pub seq: u64,
    /// Leader-assigned time, ms since the Unix epoch.
    pub ts: u64,
    /// The payload, byte for byte.
    pub data: Bytes,
}

/// The answer to a read (SPEC §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAnswer {
    /// Batches after the cursor, in seq order.
    pub batches: Vec<Batch>,
    /// The gap before them, if retention evicted seqs the consumer asked for.
    pub gap: Option<Gap>,
    /// The stream's last seq on the node that answered.
    pub last_seq: u64,
    /// Pass back as `after` to continue without loss.
    pub next_after: u64,
}

pub(crate) fn decode_batch(node: &str, b: BatchBody<'_>) -> Result<Batch, ClientError> {
    let data = b
        .payload()
        .map_err(|e| ClientError::Protocol { node: node.to_string(), what: format!("batch {} data: {e}", b.seq) })?;
    Ok(Batch { seq: b.seq, ts: b.ts, data: data.into() })
}

/// An attempt's failure, classified for the retry loop.
enum Attempt {
    /// The request never reached a node (connection refused): try another.
    NotSent(String),
    /// Try another node (timeout, broken connection, 503); the request may have been applied.
    Retry(String),
    /// Stop: a definitive answer or a local problem.
    Fail(ClientError),
}

/// A Runnev client over a list of nodes. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<String>,
    http: HttpClient,
    next: AtomicUsize,
    /// Index in `nodes` of the leader, learned from the `Runnev-Leader` header; `usize::MAX`
    /// when unknown. Writes go there first, saving the forwarding hop.
    leader: AtomicUsize,
    policy: RetryPolicy,
}

impl Client {
    /// A client over `nodes` (base URLs like `http://127.0.0.1:7001`), dialing over TCP.
    ///
    /// Errors: [`ClientError::Config`] if `nodes` is empty or a URL is not `http://host:port`.
    pub fn new(nodes: &[String]) -> Result<Client, ClientError> {
        Client::with_dialer(nodes, Arc::new(TcpDialer), RetryPolicy::default())
    }

    /// A client over `nodes` with its own dialer (the simulation's) and retry policy.
    ///
    /// Errors: as [`Client::new`].
    pub fn with_dialer(nodes: &[String], dialer: Arc<dyn Dialer>, policy: RetryPolicy) -> Result<Client, ClientError> {
        if nodes.is_empty() {
            return Err(ClientError::Config("no node given".into()));
        }
        let mut clean = Vec::new();
        for n in nodes {
            let n = n.trim().trim_end_matches('/');
            let uri: hyper::Uri = n.parse().map_err(|e| ClientError::Config(format!("{n:?}: {e}")))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return Err(ClientError::Config(format!("{n:?} is not http://HOST:PORT")));
            }
            clean.push(n.to_string());
        }
        Ok(Client {
            inner: Arc::new(Inner {
                nodes: clean,
                http: http_client(dialer),
                next: AtomicUsize::new(0),
                leader: AtomicUsize::new(usize::MAX),
                policy,
            }),
        })
    }

    /// Parses a comma-separated node list, as in `--nodes` or `RUNNEV_NODES`.
    pub fn parse_nodes(list: &str) -> Vec<String> {
        list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
    }

    /// The nodes this client knows.
    pub fn nodes(&self) -> &[String] {
        &self.inner.nodes
    }

    /// The retry policy.
    pub fn policy(&self) -> RetryPolicy {
        self.inner.policy
    }

    pub(crate) fn http(&self) -> &HttpClient {
        &self.inner.http
    }

    /// The node to try next, rotating.
    pub(crate) fn pick(&self) -> usize {
        self.inner.next.fetch_add(1, Ordering::Relaxed) % self.inner.nodes.len()
    }

    /// The node for a write: the known leader, else the next in rotation.
    fn pick_for_write(&self) -> usize {
        match self.inner.leader.load(Ordering::Relaxed) {
            i if i < self.inner.nodes.len() => i,
            _ => self.pick(),
        }
    }

    /// Remembers which configured node the `Runnev-Leader` header names, if any.
    fn learn_leader(&self, headers: &hyper::HeaderMap) {
        let Some(addr) = headers.get("runnev-leader").and_then(|v| v.to_str().ok()) else { return };
        let found = self.inner.nodes.iter().position(|n| n.strip_prefix("http://").is_some_and(|a| a == addr));
        self.inner.leader.store(found.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    async fn exchange(
        &self,
        node: &str,
        method: &Method,
        path: &str,
        body: &Bytes,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes, bool), Attempt> {
        let req = hyper::Request::builder()
            .method(method.clone())
            .uri(format!("{node}{path}"))
            .body(Full::new(body.clone()))
            .map_err(|e| Attempt::Fail(ClientError::Config(e.to_string())))?;
        let run = async {
            let resp = self.inner.http.request(req).await.map_err(|e| {
                if e.is_connect() {
                    Attempt::NotSent(format!("{node}: {e}"))
                } else {
                    Attempt::Retry(format!("{node}: {e}"))
                }
            })?;
            let status = resp.status();
            self.learn_leader(resp.headers());
            let unknown = resp.headers().get(crate::error::OUTCOME_HEADER).is_some();
            let bytes = Limited::new(resp.into_body(), ANSWER_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| Attempt::Retry(format!("{node}: reading the answer: {e}")))?
                .to_bytes();
            Ok((status, bytes, unknown))
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| Err(Attempt::Retry(format!("{node}: no answer within {timeout:?}"))))
    }

    /// Sends a request, failing over between nodes and backing off, until a definitive answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        extra_timeout: Duration,
    ) -> Result<(String, StatusCode, Bytes), ClientError> {
        self.call_with(method, path, body, extra_timeout, true).await
    }

    /// [`Client::call`]; when `idempotent` is false, only a request that never reached a node
    /// (or was refused before it was proposed) is retried.
    async fn call_with(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        extra_timeout: Duration,
        idempotent: bool,
    ) -> Result<(String, StatusCode, Bytes), ClientError> {
        let policy = self.inner.policy;
        let started = tokio::time::Instant::now();
        let mut backoff = Backoff::new(policy.backoff_min, policy.backoff_max);
        let write = method != Method::GET;
        loop {
            let node = self.inner.nodes[if write { self.pick_for_write() } else { self.pick() }].clone();
            let last = match self.exchange(&node, &method, path, &body, policy.request_timeout + extra_timeout).await {
                Ok((status, bytes, unknown)) if status == StatusCode::SERVICE_UNAVAILABLE => {
                    let why = format!("{node}: 503 {}", String::from_utf8_lossy(&bytes));
                    if unknown && !idempotent {
                        return Err(ClientError::OutcomeUnknown(why));
                    }
                    why
                }
                Ok((status, bytes, _)) if status.is_success() => return Ok((node, status, bytes)),
                Ok((status, bytes, _)) => return Err(api_error(&node, status, &bytes)),
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::NotSent(why)) => why,
                Err(Attempt::Retry(why)) if idempotent => why,
                Err(Attempt::Retry(why)) => return Err(ClientError::OutcomeUnknown(why)),
            };
            // The leader we knew failed us: rotate until a response names the new one.
            self.inner.leader.store(usize::MAX, Ordering::Relaxed);
            let elapsed = started.elapsed();
            let delay = backoff.next_delay();
            if elapsed + delay > policy.give_up_after {
                return Err(ClientError::Unavailable { after: elapsed, last });
            }
            tracing::debug!(problem = %last, backoff = ?delay, "retrying on another node");
            tokio::time::sleep(delay).await;
        }
    }

    fn body<T: serde::Serialize>(value: &T) -> Result<String, ClientError> {
        serde_json::to_string(value).map_err(|e| ClientError::Config(format!("encoding a request body: {e}")))
    }

    fn json<T: serde::de::DeserializeOwned>(node: &str, bytes: &[u8]) -> Result<T, ClientError> {
        serde_json::from_slice(bytes).map_err(|e| ClientError::Protocol { node: node.to_string(), what: e.to_string() })
    }

    /// Publishes one batch; with `seq`, idempotently (SPEC §2.3). Retries keep the same seq.
    ///
    /// Errors: [`ClientError::Api`] for `404 stream_not_found`, `409 seq_*`, `413`, `400`;
    /// [`ClientError::Unavailable`] when no node took it before the deadline.
    pub async fn publish(
        &self,
        stream: &str,
        seq: Option<u64>,
        payload: impl Into<Bytes>,
    ) -> Result<PublishAck, ClientError> {
        let path = match seq {
            Some(s) => format!("/v1/streams/{stream}/batches?seq={s}"),
            None => format!("/v1/streams/{stream}/batches"),
        };
        let (node, _, bytes) =
            self.call_with(Method::POST, &path, payload.into(), Duration::ZERO, seq.is_some()).await?;
        Self::json(&node, &bytes)
    }

    /// Reads batches after `after` (SPEC §3), waiting up to `wait_ms` for new ones.
    ///
    /// Errors: as [`Client::publish`].
    pub async fn read(&self, stream: &str, after: u64, limit: usize, wait_ms: u64) -> Result<ReadAnswer, ClientError> {
        self.read_at(stream, after, limit, wait_ms, None).await
    }

    /// Like [`Client::read`], on a node that has applied at least `min_index` (read-your-writes).
    ///
    /// Errors: as [`Client::publish`].
    pub async fn read_at(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
        wait_ms: u64,
        min_index: Option<u64>,
    ) -> Result<ReadAnswer, ClientError> {
        let mut path = format!("/v1/streams/{stream}/batches?after={after}&limit={limit}&wait_ms={wait_ms}");
        if let Some(i) = min_index {
            path.push_str(&format!("&min_index={i}"));
        }
        let (node, _, bytes) = self.call(Method::GET, &path, Bytes::new(), Duration::from_millis(wait_ms)).await?;
        let wire: wire::ReadAnswer<'_> = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol { node: node.to_string(), what: e.to_string() })?;
        let batches = wire.batches.into_iter().map(|b| decode_batch(&node, b)).collect::<Result<_, _>>()?;
        Ok(ReadAnswer { batches, gap: wire.gap, last_seq: wire.last_seq, next_after: wire.next_after })
    }

    /// Creates a stream, or replaces its retention when `retention` is given.
    /// Returns the stream info and whether it was created.
    ///
    /// Errors: as [`Client::publish`].
    pub async fn put_stream(
        &self,
        stream: &str,
        retention: Option<Retention>,
    ) -> Result<(StreamInfo, bool), ClientError> {
        let body = match retention {
            Some(retention) => Bytes::from(Self::body(&wire::PutStream { retention })?),
            None => Bytes::new(),
        };
        let (node, status, bytes) =
            self.call(Method::PUT, &format!("/v1/streams/{stream}"), body, Duration::ZERO).await?;
        Ok((Self::json(&node, &bytes)?, status == StatusCode::CREATED))
    }

    /// Stream info from one node.
    ///
    /// Errors: as [`Client::publish`].
    pub async fn stream(&self, stream: &str) -> Result<StreamInfo, ClientError> {
        let (node, _, bytes) =
            self.call(Method::GET, &format!("/v1/streams/{stream}"), Bytes::new(), Duration::ZERO).await?;
        Self::json(&node, &bytes)
    }

    /// Every stream, from one node.
    ///
    /// Errors: as [`Client::publish`].
    pub async fn streams(&self) -> Result<Vec<StreamInfo>, ClientError> {
        let (node, _, bytes) = self.call(Method::GET, "/v1/streams", Bytes::new(), Duration::ZERO).await?;
        Ok(Self::json::<wire::StreamList>(&node, &bytes)?.streams)
    }

    /// Deletes a stream and its batches.
    ///
    /// Errors: as [`Client::publish`].
    pub async fn delete_stream(&self, stream: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/v1/streams/{stream}"), Bytes::new(), Duration::ZERO).await.map(|_| ())
    }

    /// `GET /v1/cluster` from one given node (no failover: the caller asks each node it cares
    /// about).
    ///
    /// Errors: [`ClientError::Unavailable`] if that node does not answer within the request
    /// timeout; [`ClientError::Protocol`] if its answer is not a cluster view.
    pub async fn cluster_view(&self, node: &str) -> Result<ClusterView, ClientError> {
        let timeout = self.inner.policy.request_timeout;
        match self.exchange(node, &Method::GET, "/v1/cluster", &Bytes::new(), timeout).await {
            Ok((s, bytes, _)) if s.is_success() => Self::json(node, &bytes),
            Ok((s, bytes, _)) => Err(api_error(node, s, &bytes)),
            Err(Attempt::Fail(e)) => Err(e),
            Err(Attempt::Retry(last) | Attempt::NotSent(last)) => {
                Err(ClientError::Unavailable { after: timeout, last })
            }
        }
    }

    /// Adds node `id` at `addr` (`host:port`): as a learner, then promoted to voter once caught
    /// up when `voter` (SPEC §3). Returns the cluster view after the change.
    ///
    /// Errors: [`ClientError::Api`] with `not_ready` if the node did not catch up (it stays a
    /// learner) or another change is in progress; `invalid_parameter` if it is already a voter
    /// with another address.
    pub async fn add_member(&self, id: u64, addr: &str, voter: bool) -> Result<ClusterView, ClientError> {
        let body = Bytes::from(Self::body(&wire::AddMember { id, addr: addr.to_string(), voter })?);
        let (node, _, bytes) = self.call(Method::POST, "/v1/cluster/members", body, MEMBER_CHANGE_EXTRA).await?;
        Self::json(&node, &bytes)
    }

    /// Removes node `id` from the cluster (SPEC §3). Returns the cluster view after the change.
    ///
    /// Errors: [`ClientError::Api`] with `not_found` for an unknown id, `not_ready` when the
    /// voters left could not form a live quorum.
    pub async fn remove_member(&self, id: u64) -> Result<ClusterView, ClientError> {
        let path = format!("/v1/cluster/members/{id}");
        let (node, _, bytes) = self.call(Method::DELETE, &path, Bytes::new(), MEMBER_CHANGE_EXTRA).await?;
        Self::json(&node, &bytes)
    }

    /// Subscribes to `stream` after `cursor` (the last seq fully processed; 0 for the start).
    /// See [`Subscription`].
    pub fn subscribe(&self, stream: &str, cursor: u64) -> Subscription {
        Subscription::new(self.clone(), stream.to_string(), cursor)
    }
}

pub(crate) fn api_error(node: &str, status: StatusCode, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<wire::ErrorBody>(bytes) {
        Ok(e) => ClientError::Api { status: status.as_u16(), code: e.error.code, message: e.error.message },
        Err(_) => ClientError::Protocol {
            node: node.to_string(),
            what: format!("status {status} with body {:?}", String::from_utf8_lossy(bytes)),
        },
    }
}
