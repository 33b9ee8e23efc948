//! The Rust client: a list of nodes with failover, idempotent publish with retries, reads, stream
//! administration, and subscriptions that survive node failures.
//!
//! Owns: how a program talks to a cluster (the CLI, the bench, the outbox relay use it). Must
//! never: change a publisher's seq between retries (that is what makes a retry idempotent, SPEC
//! §2.3), or hand a consumer a batch at or below its cursor twice in one subscription.
//!
//! Retries: a refused connection moves on to the next node at once; after a round of refusals
//! the client backs off exponentially. When nothing but refused connections is seen for
//! [`RetryPolicy::unreachable_after`] (about a second), the call fails with
//! [`ClientError::Unreachable`]: no cluster is there, and waiting will not make one. Once a node
//! has answered (a `503`) or accepted a connection, the call keeps trying until
//! [`RetryPolicy::give_up_after`]. A publish with a `seq` that gets a connection error, a timeout
//! or `503` is retried on the next node; the retry is exactly-once (the server answers
//! `duplicate: true`). A publish without a seq is retried only when it certainly was not applied
//! (the connection was refused, or a `503` before any proposal); when its outcome is unknown it
//! fails with [`ClientError::OutcomeUnknown`] rather than risk storing the batch twice. Stream
//! names are checked here with the server's rule (SPEC §1) and percent-encoded into the path.

mod catch_up;
mod cursor;
pub(crate) mod sse;
mod subscription;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, StatusCode};

pub use catch_up::CatchUp;
pub use cursor::{CursorStore, FileCursor};
pub use subscription::{Connection, Delivery, SubscribeOptions, Subscription};

use crate::net::{cause_text, http_client, http_client_speaking, Dialer, HttpClient, HttpVersion, TcpDialer};
use crate::stream::{NameError, Retention};
use crate::units::format_duration;
use crate::wire::{self, BatchBody, ClusterView};
pub use crate::wire::{FramesAck, Gap, PublishAck, StreamInfo};

/// Default node list (SPEC §5), used when neither `--nodes` nor `RUNNEV_NODES` is given.
pub const DEFAULT_NODES: &str = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003";

use crate::limits::{
    CLIENT_ANSWER_BYTES_MAX as ANSWER_BYTES_MAX, CLIENT_BACKOFF_MAX_MS, CLIENT_BACKOFF_MIN_MS, CLIENT_GIVE_UP_MS,
    CLIENT_MEMBER_CHANGE_EXTRA_MS, CLIENT_REQUEST_TIMEOUT_MS, CLIENT_UNREACHABLE_MS,
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
    /// Total time a call keeps retrying before [`ClientError::Unavailable`] (or
    /// [`ClientError::Unreachable`] when no node ever answered).
    pub give_up_after: Duration,
    /// How long a call keeps retrying while every attempt is a refused connection (no node is
    /// listening) before [`ClientError::Unreachable`]; at least one round over every node is
    /// always made. Set it to `give_up_after` to wait as long for a cluster that is starting.
    pub unreachable_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            request_timeout: Duration::from_millis(CLIENT_REQUEST_TIMEOUT_MS),
            backoff_min: Duration::from_millis(CLIENT_BACKOFF_MIN_MS),
            backoff_max: Duration::from_millis(CLIENT_BACKOFF_MAX_MS),
            give_up_after: Duration::from_millis(CLIENT_GIVE_UP_MS),
            unreachable_after: Duration::from_millis(CLIENT_UNREACHABLE_MS),
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
    #[error("{code} ({status}): {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// SPEC §3 error code, e.g. `seq_conflict`.
        code: String,
        /// The server's explanation.
        message: String,
        /// For a frames publish: the 0-based index of the frame the error is about (for
        /// `partial_duplicate`, the first new frame).
        frame: Option<u64>,
    },
    /// A publish without a seq reached the cluster but its outcome is unknown (a timeout, a
    /// connection lost mid-request, or `503` with `Runnev-Outcome: unknown`). It was not retried,
    /// because a retry without a seq could store the batch twice; publish with a seq to retry
    /// safely.
    #[error(
        "the outcome is unknown: the batch may or may not be stored (not retried, as a publish \
         without seq is not idempotent; publish with --seq to retry safely): {0}"
    )]
    OutcomeUnknown(String),
    /// No node answered at all before the deadline: every connection was refused (for
    /// [`RetryPolicy::unreachable_after`]), or accepted and then lost without an answer.
    #[error("no Runnev node reachable at {} (tried for {}); last problem: {last}{}", .nodes.join(", "), format_duration(*.after), tls_hint(.last))]
    Unreachable {
        /// The nodes tried.
        nodes: Vec<String>,
        /// How long the client tried.
        after: Duration,
        /// The last failure seen, in words.
        last: String,
    },
    /// Nodes answered, but none took the request before the retry deadline (`503 no_leader` or
    /// `not_ready` throughout); the last problem is given in words.
    #[error("the cluster did not take the request within {}: {last}", format_duration(*.after))]
    Unavailable {
        /// How long the client tried.
        after: Duration,
        /// The last failure seen, in words (`no leader: …` with the server's message).
        last: String,
    },
    /// The stream name breaks SPEC §1 (checked before anything is sent, in the server's words).
    #[error("{0}")]
    InvalidStreamName(#[from] NameError),
    /// The node list is empty or a URL is malformed.
    #[error("client configuration: {0}")]
    Config(String),
    /// This client refused every node's TLS in a way that trying again cannot mend (a
    /// certificate of another CA, not for the address dialed, expired; a node that answers in
    /// plain HTTP): the client's `--ca-file` or `--nodes` do not fit the cluster (its words name
    /// the fix; [`crate::tls::refusal`]). Not retried beyond one round of the nodes.
    #[error("TLS with {node} failed: {why}")]
    Tls {
        /// The last node tried.
        node: String,
        /// What does not fit, and what to do.
        why: String,
    },
    /// Writing what the cluster sent to a local file or pipe failed.
    #[error("writing locally: {0}")]
    Io(#[from] std::io::Error),
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

/// How a delete ended. A delete whose first answer was lost is retried; if the retry finds the
/// stream or member gone (`404`), the lost attempt most likely removed it, and the delete counts
/// as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// This call removed it (the answer said so).
    Now,
    /// An attempt of this call whose answer was lost may have removed it; the retry found it gone.
    Already,
}

/// The words for a `503` answer: its code and message in a sentence, never its JSON.
fn unavailable_text(node: &str, bytes: &[u8]) -> String {
    match serde_json::from_slice::<wire::ErrorBody>(bytes) {
        Ok(e) if e.error.code == "no_leader" => {
            format!("no leader: a majority of nodes is down or partitioned ({node} said: {})", e.error.message)
        }
        Ok(e) if e.error.code == "not_ready" => format!("not ready ({node} said: {})", e.error.message),
        Ok(e) => format!("{} ({node} said: {})", e.error.code, e.error.message),
        Err(_) => format!("{node} answered 503: {}", String::from_utf8_lossy(bytes).trim()),
    }
}

/// A stream name checked with the server's rule (SPEC §1) and percent-encoded as one path
/// segment (RFC 3986 §3.3). Every name the rule allows is already unreserved, so the encoding
/// changes nothing today; it keeps the URL well-formed if the rule ever widens.
fn segment(stream: &str) -> Result<String, ClientError> {
    crate::stream::validate_name(stream)?;
    Ok(percent_encoding::utf8_percent_encode(stream, SEGMENT).to_string())
}

/// Everything but RFC 3986's unreserved characters is encoded in a path segment.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

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
    /// Try another node (timeout, broken connection): the request may have been applied.
    Retry(String),
    /// Stop: a definitive answer or a local problem.
    Fail(ClientError),
    /// The TLS handshake failed in a way another try cannot mend ([`crate::tls::refusal`]):
    /// try the other nodes, and stop when all of them fail so.
    Tls {
        /// The node.
        node: String,
        /// Why, in words.
        why: String,
    },
}

/// One node's answer: a definitive answer to a call, or one attempt's ([`Client::exchange`]).
struct Answer {
    /// The node that gave it.
    node: String,
    /// Its status (2xx, or `404` when the call accepts "already gone").
    status: StatusCode,
    /// Its body.
    bytes: Bytes,
    /// It carries `Runnev-Outcome: unknown` (a `503` whose write may have been applied).
    unknown: bool,
    /// Its `Content-Type`, when it has one.
    content_type: Option<hyper::header::HeaderValue>,
    /// The body of a success answer, unread, when the call asked for it so
    /// ([`Media::stream_success`]; `bytes` is then empty).
    stream: Option<hyper::body::Incoming>,
}

/// The media headers a call sets (besides its token): the body's `Content-Type` and the
/// `Accept` of the answer, each only when given; and how a success answer's body is taken.
#[derive(Debug, Clone, Copy, Default)]
struct Media {
    content_type: Option<&'static str>,
    accept: Option<&'static str>,
    /// Hand a success answer's body over unread ([`Answer::stream`]) instead of reading it whole:
    /// a body of any length (a backup), read as it arrives. The request timeout then covers the
    /// answer's head only.
    stream_success: bool,
    /// Send to the known leader first, as a write is (a backup: the leader's applied state is
    /// the freshest).
    to_leader: bool,
}

/// What a read asks for with `Accept`: binary records first, JSON (which every node can give,
/// also one of a build from before the binary form) second (RFC 9110 §12.5.1).
const READ_ACCEPT: &str = "application/vnd.runnev.batches, application/json;q=0.5";

/// A read's answer as it came, undecoded.
pub(crate) struct RawRead {
    /// The node that gave it.
    node: String,
    /// Its body.
    bytes: Bytes,
    /// Whether the body is binary records ([`wire::BATCHES_CONTENT_TYPE`]) rather than JSON.
    binary: bool,
}

/// A read's answer parsed far enough to know where the next read starts: a JSON answer with its
/// payloads still base64 text borrowed from the body, or a binary one, which needs no more work.
pub(crate) enum ParsedRead<'b> {
    Json(wire::ReadAnswer<'b>),
    Binary(ReadAnswer),
}

impl ParsedRead<'_> {
    /// The answer's `next_after`: the cursor the next read starts after.
    pub(crate) fn next_after(&self) -> u64 {
        match self {
            ParsedRead::Json(w) => w.next_after,
            ParsedRead::Binary(a) => a.next_after,
        }
    }

    /// Whether the answer carries batches or a gap (the stream may then hold more).
    pub(crate) fn carries_any(&self) -> bool {
        match self {
            ParsedRead::Json(w) => !w.batches.is_empty() || w.gap.is_some(),
            ParsedRead::Binary(a) => !a.batches.is_empty() || a.gap.is_some(),
        }
    }
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
    /// Sent as `Authorization: Bearer` on every request (nodes run with `--auth`).
    token: Option<crate::auth::Token>,
}

/// A hint for a failure that a TLS mismatch explains: plain HTTP sent to a node that serves TLS.
/// Empty otherwise. (This client's refusals of a node's TLS never get here: they end the call as
/// [`ClientError::Tls`], with their own words, [`crate::tls::refusal`].)
fn tls_hint(last: &str) -> &'static str {
    if last.contains("invalid HTTP version parsed") {
        " (the node seems to serve TLS: give the cluster CA's certificate with --ca-file or RUNNEV_CA_FILE)"
    } else {
        ""
    }
}

/// How the nodes are reached: the scheme of their URLs in a [`Client`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// Plain HTTP.
    Http,
    /// TLS, verified against the cluster CA.
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// `HOST:PORT` of a node's base URL (`http://HOST:PORT` or `https://HOST:PORT`).
fn authority_of(node: &str) -> &str {
    node.strip_prefix("http://").or_else(|| node.strip_prefix("https://")).unwrap_or(node)
}

impl Client {
    /// A client over `nodes` (base URLs like `http://127.0.0.1:7001`, or `127.0.0.1:7001`, which
    /// means the same), dialing over TCP.
    ///
    /// Errors: [`ClientError::Config`] if `nodes` is empty or an entry is not `HOST:PORT` or
    /// `http://HOST:PORT`.
    pub fn new(nodes: &[String]) -> Result<Client, ClientError> {
        Client::over(nodes, http_client(Arc::new(TcpDialer)), RetryPolicy::default(), Some(Scheme::Http))
    }

    /// A client over `nodes` that speaks TLS to them when `ca` (the cluster CA's certificate)
    /// is given, verifying each node's certificate against it, and sends `token` on every
    /// request when given.
    ///
    /// Errors: as [`Client::new`], and [`ClientError::Config`] if the CA file is unusable, or a
    /// node is `https://` or a token is given without a CA (a token goes only over TLS).
    pub fn secure(
        nodes: &[String],
        ca: Option<&std::path::Path>,
        token: Option<crate::auth::Token>,
    ) -> Result<Client, ClientError> {
        Client::secure_speaking(nodes, ca, token, HttpVersion::default())
    }

    /// As [`Client::secure`] (which speaks [`HttpVersion::Auto`]: HTTP/2 over TLS, HTTP/1.1
    /// plain), speaking `version` to the nodes. On HTTP/2 every request in flight to a node
    /// shares one connection.
    ///
    /// Errors: as [`Client::secure`].
    pub fn secure_speaking(
        nodes: &[String],
        ca: Option<&std::path::Path>,
        token: Option<crate::auth::Token>,
        version: HttpVersion,
    ) -> Result<Client, ClientError> {
        let dialer: Arc<dyn Dialer> = match ca {
            Some(ca) => {
                let config = crate::tls::client_config(ca, None).map_err(|e| ClientError::Config(e.to_string()))?;
                Arc::new(crate::tls::TlsDialer::new(Arc::new(TcpDialer), crate::tls::offering(&config, version)))
            }
            None => Arc::new(TcpDialer),
        };
        let scheme = if ca.is_some() { Scheme::Https } else { Scheme::Http };
        let client = Client::over(nodes, http_client_speaking(dialer, version), RetryPolicy::default(), Some(scheme))?;
        // Only a node that serves TLS checks tokens (`--auth` needs `--tls-ca`): over plain
        // HTTP a token would only be exposed on the way, to be ignored or refused.
        if token.is_some() && ca.is_none() {
            return Err(ClientError::Config(
                "a token is sent only over TLS (nodes that check tokens serve TLS): give the cluster CA's \
                 certificate with --ca-file or RUNNEV_CA_FILE, or leave the token out"
                    .into(),
            ));
        }
        Ok(client.with_token(token))
    }

    /// This client, sending `token` as `Authorization: Bearer` on every request (nodes run with
    /// `--auth`); for clients made with [`Client::with_dialer`] (a TLS dialer, a retry policy of
    /// their own). A clone made before keeps the token it had.
    pub fn with_token(mut self, token: Option<crate::auth::Token>) -> Client {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.token = token,
            None => self = self.derived(self.inner.policy, token),
        }
        self
    }

    /// The client every command builds from its flags: `nodes` as `--nodes` spells them
    /// (comma-separated, see [`Client::parse_nodes`]), `ca_file` from `--ca-file` /
    /// `RUNNEV_CA_FILE` (TLS to the nodes, verified against that CA), `token` from `--token` /
    /// `RUNNEV_TOKEN` (sent on every request). The one place the client commands, the outbox
    /// relay and the sink turn those flags into a [`Client`].
    ///
    /// Errors: [`ClientError::Config`] for a token that is not `rnv_<name>_<secret>`, and the
    /// errors of [`Client::secure`].
    pub fn from_flags(
        nodes: &str,
        ca_file: Option<&std::path::Path>,
        token: Option<&str>,
    ) -> Result<Client, ClientError> {
        Client::from_flags_speaking(nodes, ca_file, token, HttpVersion::default())
    }

    /// As [`Client::from_flags`], speaking `version` to the nodes ([`Client::secure_speaking`]).
    ///
    /// Errors: as [`Client::from_flags`].
    pub fn from_flags_speaking(
        nodes: &str,
        ca_file: Option<&std::path::Path>,
        token: Option<&str>,
        version: HttpVersion,
    ) -> Result<Client, ClientError> {
        let token = token
            .map(crate::auth::Token::parse)
            .transpose()
            .map_err(|e| ClientError::Config(format!("--token (or RUNNEV_TOKEN): {e}")))?;
        Client::secure_speaking(&Client::parse_nodes(nodes), ca_file, token, version)
    }

    /// A client over `nodes` with its own dialer (the simulation's) and retry policy.
    ///
    /// Errors: as [`Client::new`].
    pub fn with_dialer(nodes: &[String], dialer: Arc<dyn Dialer>, policy: RetryPolicy) -> Result<Client, ClientError> {
        Client::over(nodes, http_client(dialer), policy, None)
    }

    /// A client over `nodes` sending its requests on `http`. With `scheme` (the transport is
    /// known: TLS or not), every node is written with it, so that messages show how the node
    /// is reached: `HOST:PORT` and `http://HOST:PORT` become `https://HOST:PORT` over TLS, and
    /// `https://` without TLS is refused. Without (a dialer of the caller's), `http://` and
    /// `https://` are kept as given and `HOST:PORT` means `http://HOST:PORT`; the dialer decides
    /// TLS either way.
    ///
    /// Errors: as [`Client::new`].
    fn over(
        nodes: &[String],
        http: HttpClient,
        policy: RetryPolicy,
        scheme: Option<Scheme>,
    ) -> Result<Client, ClientError> {
        if nodes.is_empty() {
            return Err(ClientError::Config("no node given".into()));
        }
        let mut clean = Vec::new();
        for n in nodes {
            let n = n.trim().trim_end_matches('/');
            let bare = n.strip_prefix("http://").or_else(|| n.strip_prefix("https://"));
            let n = match (scheme, bare) {
                (None, Some(_)) => n.to_string(),
                (None, None) if !n.contains("://") => format!("http://{n}"),
                (Some(Scheme::Http), Some(_)) if n.starts_with("https://") => {
                    return Err(ClientError::Config(format!(
                        "{n:?}: https:// needs the cluster CA's certificate (--ca-file or RUNNEV_CA_FILE)"
                    )))
                }
                (Some(scheme), Some(rest)) => format!("{}://{rest}", scheme.as_str()),
                (Some(scheme), None) if !n.contains("://") => format!("{}://{n}", scheme.as_str()),
                (_, None) => {
                    return Err(ClientError::Config(format!(
                    "{n:?}: a node is reached over http:// (or https:// with the cluster CA's certificate: --ca-file)"
                )))
                }
            };
            let bad = || {
                ClientError::Config(format!(
                    "{n:?} is not a node address: write HOST:PORT, http://HOST:PORT or https://HOST:PORT"
                ))
            };
            let uri: hyper::Uri = n.parse().map_err(|_| bad())?;
            match uri.authority() {
                Some(a) if a.port_u16().is_some() && !a.host().is_empty() => {}
                _ => return Err(bad()),
            }
            if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
                return Err(bad());
            }
            clean.push(n);
        }
        Ok(Client {
            inner: Arc::new(Inner {
                nodes: clean,
                http,
                next: AtomicUsize::new(0),
                leader: AtomicUsize::new(usize::MAX),
                policy,
                token: None,
            }),
        })
    }

    /// The same nodes, transport (TLS and its CA, if any) and token, with another retry policy
    /// (a caller that does its own waiting).
    pub fn with_policy(&self, policy: RetryPolicy) -> Client {
        self.derived(policy, self.inner.token.clone())
    }

    /// A new client on this one's nodes and transport with `policy` and `token`; it starts at
    /// the first node, with no leader known.
    fn derived(&self, policy: RetryPolicy, token: Option<crate::auth::Token>) -> Client {
        let i = &self.inner;
        Client {
            inner: Arc::new(Inner {
                nodes: i.nodes.clone(),
                http: i.http.clone(),
                next: AtomicUsize::new(0),
                leader: AtomicUsize::new(usize::MAX),
                policy,
                token,
            }),
        }
    }

    /// The HTTP client the requests go over: its dialer speaks TLS when the client was made
    /// with a CA ([`Client::secure`]), so a `http://HOST:PORT` URL reaches a TLS node through it.
    pub fn transport(&self) -> &HttpClient {
        &self.inner.http
    }

    /// Parses a comma-separated node list, as in `--nodes` or `RUNNEV_NODES`.
    pub fn parse_nodes(list: &str) -> Vec<String> {
        list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
    }

    /// The nodes this client knows.
    pub fn nodes(&self) -> &[String] {
        &self.inner.nodes
    }

    /// The URL of the node at `addr` (`HOST:PORT`, as membership lists it) the way this client
    /// reaches its nodes: `https://HOST:PORT` over TLS, else `http://HOST:PORT`.
    pub fn url_of(&self, addr: &str) -> String {
        let scheme = self.inner.nodes.first().and_then(|n| n.split_once("://")).map_or("http", |(s, _)| s);
        format!("{scheme}://{addr}")
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
        self.remember_leader(addr);
    }

    /// Remembers the configured node at `addr` (`HOST:PORT`) as the leader; none when no
    /// configured node is at that address (the next attempts rotate).
    fn remember_leader(&self, addr: &str) {
        let found = self.inner.nodes.iter().position(|n| authority_of(n) == addr);
        self.inner.leader.store(found.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// `req` with this client's token, if it has one, as `Authorization: Bearer`.
    pub(crate) fn authorized(&self, req: hyper::http::request::Builder) -> hyper::http::request::Builder {
        match &self.inner.token {
            Some(token) => req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.expose())),
            None => req,
        }
    }

    async fn exchange(
        &self,
        node: &str,
        method: &Method,
        path: &str,
        body: &Bytes,
        media: Media,
        timeout: Duration,
    ) -> Result<Answer, Attempt> {
        let mut req = self.authorized(hyper::Request::builder().method(method.clone()).uri(format!("{node}{path}")));
        if let Some(ct) = media.content_type {
            req = req.header(hyper::header::CONTENT_TYPE, ct);
        }
        if let Some(accept) = media.accept {
            req = req.header(hyper::header::ACCEPT, accept);
        }
        let req = req.body(Full::new(body.clone())).map_err(|e| Attempt::Fail(ClientError::Config(e.to_string())))?;
        let run = async {
            let resp = self.inner.http.request(req).await.map_err(|e| {
                if let Some(why) = crate::tls::refusal(&e) {
                    Attempt::Tls { node: node.to_string(), why }
                } else if e.is_connect() {
                    Attempt::NotSent(format!("{node}: {}", cause_text(&e)))
                } else {
                    Attempt::Retry(format!("{node}: {}", cause_text(&e)))
                }
            })?;
            let status = resp.status();
            self.learn_leader(resp.headers());
            let unknown = resp.headers().get(crate::error::OUTCOME_HEADER).is_some();
            let content_type = resp.headers().get(hyper::header::CONTENT_TYPE).cloned();
            if media.stream_success && status.is_success() {
                let (node, stream) = (node.to_string(), Some(resp.into_body()));
                return Ok(Answer { node, status, bytes: Bytes::new(), unknown, content_type, stream });
            }
            let bytes = Limited::new(resp.into_body(), ANSWER_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| Attempt::Retry(format!("{node}: reading the answer: {e}")))?
                .to_bytes();
            Ok(Answer { node: node.to_string(), status, bytes, unknown, content_type, stream: None })
        };
        tokio::time::timeout(timeout, run)
            .await
            .unwrap_or_else(|_| Err(Attempt::Retry(format!("{node}: no answer within {}", format_duration(timeout)))))
    }

    /// Sends a request, failing over between nodes and backing off, until a definitive answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        extra_timeout: Duration,
    ) -> Result<(String, StatusCode, Bytes), ClientError> {
        let a = self.call_with(method, path, (body, Media::default()), extra_timeout, true, false).await?;
        Ok((a.node, a.status, a.bytes))
    }

    /// [`Client::call`]; when `idempotent` is false, only a request that never reached a node
    /// (or was refused before it was proposed) is retried. When `gone_is_done`, a `404` answered
    /// to a retry of an attempt that may have been applied (its answer was lost) is handed back
    /// as an answer rather than an error: the lost attempt most likely did the delete.
    async fn call_with(
        &self,
        method: Method,
        path: &str,
        (body, media): (Bytes, Media),
        extra_timeout: Duration,
        idempotent: bool,
        gone_is_done: bool,
    ) -> Result<Answer, ClientError> {
        let policy = self.inner.policy;
        let started = tokio::time::Instant::now();
        let mut backoff = Backoff::new(policy.backoff_min, policy.backoff_max);
        let write = method != Method::GET || media.to_leader;
        let nodes = self.inner.nodes.len();
        // Whether any node answered over HTTP, and whether an attempt may have been applied.
        let (mut answered, mut maybe_applied) = (false, false);
        // Whether any connection was accepted (an answer, or one lost after the request left).
        let mut reached = false;
        // Refused connections since the last pause: a full round of them earns a backoff.
        let mut refused_in_a_row = 0usize;
        // TLS handshakes failed for good in a row: a full round of them ends the call.
        let mut tls_refused_in_a_row = 0usize;
        loop {
            let node = self.inner.nodes[if write { self.pick_for_write() } else { self.pick() }].clone();
            let attempt =
                self.exchange(&node, &method, path, &body, media, policy.request_timeout + extra_timeout).await;
            let mut refused = false;
            if !matches!(attempt, Err(Attempt::Tls { .. })) {
                tls_refused_in_a_row = 0;
            }
            let last = match attempt {
                Ok(Answer { status, bytes, unknown, .. }) if status == StatusCode::SERVICE_UNAVAILABLE => {
                    answered = true;
                    reached = true;
                    let why = unavailable_text(&node, &bytes);
                    if unknown && !idempotent {
                        return Err(ClientError::OutcomeUnknown(why));
                    }
                    maybe_applied |= unknown;
                    why
                }
                Ok(a) if a.status.is_success() => return Ok(a),
                Ok(a) if a.status == StatusCode::NOT_FOUND && gone_is_done && maybe_applied => return Ok(a),
                Ok(Answer { status, bytes, .. }) => return Err(api_error(&node, status, &bytes)),
                Err(Attempt::Fail(e)) => return Err(e),
                Err(Attempt::Tls { node, why }) => {
                    tls_refused_in_a_row += 1;
                    if tls_refused_in_a_row >= nodes {
                        return Err(ClientError::Tls { node, why });
                    }
                    refused = true;
                    format!("{node}: {why}")
                }
                Err(Attempt::NotSent(why)) => {
                    refused = true;
                    why
                }
                Err(Attempt::Retry(why)) if idempotent => {
                    reached = true;
                    maybe_applied = true;
                    why
                }
                Err(Attempt::Retry(why)) => return Err(ClientError::OutcomeUnknown(why)),
            };
            // The leader we knew failed us: rotate until a response names the new one.
            self.inner.leader.store(usize::MAX, Ordering::Relaxed);
            if refused {
                refused_in_a_row += 1;
                if refused_in_a_row < nodes {
                    // Nothing listens there and nothing was sent: the next node, at once.
                    continue;
                }
            }
            refused_in_a_row = 0;
            let elapsed = started.elapsed();
            let delay = backoff.next_delay();
            let deadline =
                if reached { policy.give_up_after } else { policy.unreachable_after.min(policy.give_up_after) };
            if elapsed + delay > deadline {
                return Err(if answered {
                    ClientError::Unavailable { after: elapsed, last }
                } else {
                    ClientError::Unreachable { nodes: self.inner.nodes.clone(), after: elapsed, last }
                });
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

    /// Publishes one batch; with `seq`, idempotently (SPEC §2.3).
    ///
    /// With a seq, every failure that is not a definitive answer (a refused connection, a
    /// timeout, a broken connection, a `503`) is retried on the next node with the same seq, and
    /// a batch that was stored by a lost attempt is answered `duplicate: true`. Without a seq,
    /// only a refused connection or a `503` that says nothing was proposed is retried; a timeout,
    /// a connection lost after the request left, or a `503` with `Runnev-Outcome: unknown` ends
    /// the call with [`ClientError::OutcomeUnknown`].
    ///
    /// Errors: [`ClientError::InvalidStreamName`] before anything is sent; [`ClientError::Api`]
    /// for `404 stream_not_found`, `409 seq_*`, `413`, `400`; [`ClientError::OutcomeUnknown`] as
    /// above; [`ClientError::Unreachable`] when no node answered; [`ClientError::Unavailable`]
    /// when nodes answered but none took it before the deadline.
    pub async fn publish(
        &self,
        stream: &str,
        seq: Option<u64>,
        payload: impl Into<Bytes>,
    ) -> Result<PublishAck, ClientError> {
        let name = segment(stream)?;
        let path = match seq {
            Some(s) => format!("/v1/streams/{name}/batches?seq={s}"),
            None => format!("/v1/streams/{name}/batches"),
        };
        let a = self
            .call_with(Method::POST, &path, (payload.into(), Media::default()), Duration::ZERO, seq.is_some(), false)
            .await?;
        Self::json(&a.node, &a.bytes)
    }

    /// Publishes `payloads` as many batches in one request (SPEC §6): one Raft entry, all or
    /// none, frame k at seq `seq + k` (or consecutive server-assigned seqs). Retried as
    /// [`Client::publish`] is: with `seq`, a retry whose lost first attempt was stored is answered
    /// `duplicate: true` for the whole request.
    ///
    /// Errors: [`ClientError::Config`] for no payload, more than
    /// [`crate::limits::FRAMES_PER_APPEND_MAX`], or one of 2³² bytes or more (nothing sent);
    /// [`ClientError::Api`] as for [`Client::publish`], where the message names the frame at
    /// fault, plus `409 partial_duplicate` when some frames are stored and some new (nothing
    /// written; resend from the frame named); the availability errors of [`Client::publish`].
    pub async fn publish_many<P: AsRef<[u8]>>(
        &self,
        stream: &str,
        seq: Option<u64>,
        payloads: &[P],
    ) -> Result<wire::FramesAck, ClientError> {
        let name = segment(stream)?;
        if payloads.is_empty() || payloads.len() > crate::limits::FRAMES_PER_APPEND_MAX {
            return Err(ClientError::Config(format!(
                "a frames publish carries 1 to {} batches, not {}",
                crate::limits::FRAMES_PER_APPEND_MAX,
                payloads.len()
            )));
        }
        let body = wire::encode_frames(payloads)
            .map_err(|i| ClientError::Config(format!("batch {i} is too large for a frame (2^32 bytes or more)")))?;
        let path = match seq {
            Some(s) => format!("/v1/streams/{name}/batches?seq={s}"),
            None => format!("/v1/streams/{name}/batches"),
        };
        let media = Media { content_type: Some(crate::limits::FRAMES_CONTENT_TYPE), ..Media::default() };
        let a = self
            .call_with(Method::POST, &path, (Bytes::from(body), media), Duration::ZERO, seq.is_some(), false)
            .await?;
        Self::json(&a.node, &a.bytes)
    }

    /// Reads batches after `after` (SPEC §3), waiting up to `wait_ms` for new ones.
    ///
    /// Errors: as [`Client::publish`] (a read is always retried: it changes nothing).
    pub async fn read(&self, stream: &str, after: u64, limit: usize, wait_ms: u64) -> Result<ReadAnswer, ClientError> {
        self.read_at(stream, after, limit, wait_ms, None).await
    }

    /// Like [`Client::read`], on a node that has applied at least `min_index` (read-your-writes).
    ///
    /// Errors: as [`Client::read`].
    pub async fn read_at(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
        wait_ms: u64,
        min_index: Option<u64>,
    ) -> Result<ReadAnswer, ClientError> {
        let raw = self.read_raw(stream, after, limit, wait_ms, min_index).await?;
        let parsed = Self::parse_read(&raw, after)?;
        Self::decode_read(&raw.node, parsed)
    }

    /// Reads `stream` from `after` as fast as its nodes answer, with the next read asked for
    /// while this one's payloads are decoded ([`CatchUp`]): for a consumer far behind, such as
    /// one that starts from 0. `limit` batches per read (1 to 10,000).
    ///
    /// Errors: each [`CatchUp::next`] fails as [`Client::read`] would; a bad stream name fails
    /// there too.
    pub fn catch_up(&self, stream: &str, after: u64, limit: usize) -> CatchUp {
        CatchUp::new(self.clone(), stream.to_string(), after, limit)
    }

    /// One read's answer, undecoded. Asks for binary records ([`READ_ACCEPT`]); a node that
    /// answers JSON instead (one of an older build) is read as well.
    pub(crate) async fn read_raw(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
        wait_ms: u64,
        min_index: Option<u64>,
    ) -> Result<RawRead, ClientError> {
        let name = segment(stream)?;
        let mut path = format!("/v1/streams/{name}/batches?after={after}&limit={limit}&wait_ms={wait_ms}");
        if let Some(i) = min_index {
            path.push_str(&format!("&min_index={i}"));
        }
        let media = Media { accept: Some(READ_ACCEPT), ..Media::default() };
        let a = self
            .call_with(Method::GET, &path, (Bytes::new(), media), Duration::from_millis(wait_ms), true, false)
            .await?;
        let binary = a
            .content_type
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| wire::media_type_is(v, wire::BATCHES_CONTENT_TYPE));
        Ok(RawRead { node: a.node, bytes: a.bytes, binary })
    }

    /// A read's answer (of a read after `after`) parsed: a binary one whole (its payloads are
    /// slices of the body), a JSON one with its payloads still base64 text borrowed from it.
    ///
    /// Errors: [`ClientError::Protocol`] for a body that is not the answer its type says.
    pub(crate) fn parse_read(raw: &RawRead, after: u64) -> Result<ParsedRead<'_>, ClientError> {
        let protocol = |what: String| ClientError::Protocol { node: raw.node.clone(), what };
        if !raw.binary {
            return serde_json::from_slice(&raw.bytes).map(ParsedRead::Json).map_err(|e| protocol(e.to_string()));
        }
        let (head, batches) = wire::decode_batches(after, &raw.bytes).map_err(|e| protocol(e.to_string()))?;
        let batches = batches.into_iter().map(|b| Batch { seq: b.seq, ts: b.ts, data: b.data }).collect();
        Ok(ParsedRead::Binary(ReadAnswer {
            batches,
            gap: head.gap,
            last_seq: head.last_seq,
            next_after: head.next_after,
        }))
    }

    /// A parsed read with its payloads decoded.
    ///
    /// Errors: [`ClientError::Protocol`] for a JSON payload that is not base64.
    pub(crate) fn decode_read(node: &str, parsed: ParsedRead<'_>) -> Result<ReadAnswer, ClientError> {
        match parsed {
            ParsedRead::Binary(answer) => Ok(answer),
            ParsedRead::Json(wire) => {
                let batches = wire.batches.into_iter().map(|b| decode_batch(node, b)).collect::<Result<_, _>>()?;
                Ok(ReadAnswer { batches, gap: wire.gap, last_seq: wire.last_seq, next_after: wire.next_after })
            }
        }
    }

    /// Creates a stream, or replaces its retention when `retention` is given (a plain resend on
    /// retry: a `PUT` is idempotent). Returns the stream info and whether it was created.
    ///
    /// Errors: [`ClientError::InvalidStreamName`], [`ClientError::Api`] (`400 invalid_body` for
    /// a limit of 0), and the availability errors of [`Client::publish`].
    pub async fn put_stream(
        &self,
        stream: &str,
        retention: Option<Retention>,
    ) -> Result<(StreamInfo, bool), ClientError> {
        let name = segment(stream)?;
        let body = match retention {
            Some(retention) => Bytes::from(Self::body(&wire::PutStream { retention })?),
            None => Bytes::new(),
        };
        let (node, status, bytes) =
            self.call(Method::PUT, &format!("/v1/streams/{name}"), body, Duration::ZERO).await?;
        Ok((Self::json(&node, &bytes)?, status == StatusCode::CREATED))
    }

    /// Stream info from one node.
    ///
    /// Errors: as [`Client::read`].
    pub async fn stream(&self, stream: &str) -> Result<StreamInfo, ClientError> {
        let name = segment(stream)?;
        let (node, _, bytes) =
            self.call(Method::GET, &format!("/v1/streams/{name}"), Bytes::new(), Duration::ZERO).await?;
        Self::json(&node, &bytes)
    }

    /// Every stream, from one node.
    ///
    /// Errors: the availability errors of [`Client::publish`].
    pub async fn streams(&self) -> Result<Vec<StreamInfo>, ClientError> {
        let (node, _, bytes) = self.call(Method::GET, "/v1/streams", Bytes::new(), Duration::ZERO).await?;
        Ok(Self::json::<wire::StreamList>(&node, &bytes)?.streams)
    }

    /// Deletes a stream and its batches, retried like every write but publish without seq (a
    /// plain resend). If an attempt's answer was lost and the retry finds no stream (`404`), the
    /// lost attempt most likely deleted it: [`Deleted::Already`].
    ///
    /// Errors: [`ClientError::Api`] `404 stream_not_found` when the stream did not exist, and the
    /// errors of [`Client::put_stream`].
    pub async fn delete_stream(&self, stream: &str) -> Result<Deleted, ClientError> {
        let path = format!("/v1/streams/{}", segment(stream)?);
        let a =
            self.call_with(Method::DELETE, &path, (Bytes::new(), Media::default()), Duration::ZERO, true, true).await?;
        Ok(if a.status == StatusCode::NOT_FOUND { Deleted::Already } else { Deleted::Now })
    }

    /// `GET /v1/cluster` from one given node, once (no failover and no retry: the caller asks
    /// each node it cares about).
    ///
    /// Errors: [`ClientError::Unreachable`] if that node does not answer within the request
    /// timeout (the problem says why: refused, timed out…); [`ClientError::Protocol`] if its
    /// answer is not a cluster view.
    pub async fn cluster_view(&self, node: &str) -> Result<ClusterView, ClientError> {
        let (status, bytes) = self.get_once(node, "/v1/cluster").await?;
        if status.is_success() {
            Self::json(node, &bytes)
        } else {
            Err(api_error(node, status, &bytes))
        }
    }

    /// `GET /readyz` from one given node, once: `Ok(None)` when it is ready, `Ok(Some(reason))`
    /// with the reason it answered `503` (`leader without a quorum`, `no leader known`, …).
    ///
    /// Errors: as [`Client::cluster_view`]; [`ClientError::Api`] for any other answer.
    pub async fn readiness(&self, node: &str) -> Result<Option<String>, ClientError> {
        match self.get_once(node, "/readyz").await? {
            (s, _) if s.is_success() => Ok(None),
            (s, bytes) if s == StatusCode::SERVICE_UNAVAILABLE => {
                Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string()))
            }
            (s, bytes) => Err(api_error(node, s, &bytes)),
        }
    }

    /// One `GET path` to one given node, not retried and not redirected: its status and body.
    ///
    /// Errors: [`ClientError::Unreachable`] naming `node` when no answer came within the request
    /// timeout; a TLS or protocol failure as it came.
    async fn get_once(&self, node: &str, path: &str) -> Result<(StatusCode, Bytes), ClientError> {
        let timeout = self.inner.policy.request_timeout;
        let started = tokio::time::Instant::now();
        match self.exchange(node, &Method::GET, path, &Bytes::new(), Media::default(), timeout).await {
            Ok(Answer { status, bytes, .. }) => Ok((status, bytes)),
            Err(Attempt::Fail(e)) => Err(e),
            Err(Attempt::Tls { node, why }) => Err(ClientError::Tls { node, why }),
            Err(Attempt::Retry(last) | Attempt::NotSent(last)) => {
                Err(ClientError::Unreachable { nodes: vec![node.to_string()], after: started.elapsed(), last })
            }
        }
    }

    /// `POST /v1/auth/tokens`: creates token `name` with `grants`; returns the server's answer
    /// (`{"name", "token", "index"}`: the only time the secret is shown). Not retried once sent
    /// (a retry would meet `409 token_exists`).
    ///
    /// Errors: [`ClientError::Api`] (`401`, `403`, `409 token_exists`, `400 invalid_body`) and
    /// the availability errors of [`Client::publish`].
    pub async fn create_token(
        &self,
        name: &str,
        grants: &[crate::auth::Grant],
    ) -> Result<serde_json::Value, ClientError> {
        let body = Bytes::from(Self::body(&serde_json::json!({ "name": name, "grants": grants }))?);
        let a = self
            .call_with(Method::POST, "/v1/auth/tokens", (body, Media::default()), Duration::ZERO, false, false)
            .await?;
        Self::json(&a.node, &a.bytes)
    }

    /// `GET /v1/auth/tokens`: names and grants.
    ///
    /// Errors: as [`Client::create_token`].
    pub async fn tokens(&self) -> Result<serde_json::Value, ClientError> {
        let (node, _, bytes) = self.call(Method::GET, "/v1/auth/tokens", Bytes::new(), Duration::ZERO).await?;
        Self::json(&node, &bytes)
    }

    /// `DELETE /v1/auth/tokens/{name}`; [`Deleted::Already`] when a retry finds it gone.
    ///
    /// Errors: [`ClientError::Api`] `404 not_found` for an unknown name, and those of
    /// [`Client::create_token`].
    pub async fn delete_token(&self, name: &str) -> Result<Deleted, ClientError> {
        crate::auth::validate_name(name).map_err(ClientError::Config)?;
        let path = format!("/v1/auth/tokens/{name}");
        let a =
            self.call_with(Method::DELETE, &path, (Bytes::new(), Media::default()), Duration::ZERO, true, true).await?;
        Ok(if a.status == StatusCode::NOT_FOUND { Deleted::Already } else { Deleted::Now })
    }

    /// `GET /v1/cluster` from any node, with failover.
    ///
    /// Errors: the availability errors of [`Client::publish`].
    pub async fn any_cluster_view(&self) -> Result<ClusterView, ClientError> {
        let (node, _, bytes) = self.call(Method::GET, "/v1/cluster", Bytes::new(), Duration::ZERO).await?;
        Self::json(&node, &bytes)
    }

    /// Adds node `id` at `addr` (`host:port`) as a learner, then, when `voter`, promotes it to
    /// voter once it has caught up (SPEC §3). Returns the cluster view after the change.
    ///
    /// The server waits up to 10 s for the catch-up and answers `503 not_ready` when the node
    /// did not catch up (it stays a learner); like every `503`, that is retried (a resend: the
    /// learner is already added) until [`RetryPolicy::give_up_after`], so a node that never
    /// catches up (it is not running) ends in [`ClientError::Unavailable`] after that long. Add
    /// with `voter = false` to return once the learner is added, then promote it with a second
    /// call.
    ///
    /// Errors: [`ClientError::Api`] `invalid_parameter` if it is already a voter with another
    /// address; [`ClientError::Unavailable`] as above, or while another change is in progress;
    /// [`ClientError::Unreachable`] when no node answered.
    pub async fn add_member(&self, id: u64, addr: &str, voter: bool) -> Result<ClusterView, ClientError> {
        let body = Bytes::from(Self::body(&wire::AddMember { id, addr: addr.to_string(), voter })?);
        let (node, _, bytes) = self.call(Method::POST, "/v1/cluster/members", body, MEMBER_CHANGE_EXTRA).await?;
        Self::json(&node, &bytes)
    }

    /// Removes node `id` from the cluster (SPEC §3). Returns the cluster view after the change,
    /// and whether this call removed it or a lost attempt of it most likely did (the retry found
    /// no such member, see [`Deleted`]; the view is then asked from any node).
    ///
    /// A `503 not_ready` (the voters left could not form a live quorum, or another change is in
    /// progress) is retried until [`RetryPolicy::give_up_after`], then ends in
    /// [`ClientError::Unavailable`] with the server's message.
    ///
    /// Errors: [`ClientError::Api`] `not_found` for an id that was never a member (or was removed
    /// before this call); [`ClientError::Unavailable`] as above; [`ClientError::Unreachable`].
    pub async fn remove_member(&self, id: u64) -> Result<(ClusterView, Deleted), ClientError> {
        let path = format!("/v1/cluster/members/{id}");
        let a = self
            .call_with(Method::DELETE, &path, (Bytes::new(), Media::default()), MEMBER_CHANGE_EXTRA, true, true)
            .await?;
        if a.status == StatusCode::NOT_FOUND {
            return Ok((self.any_cluster_view().await?, Deleted::Already));
        }
        Ok((Self::json(&a.node, &a.bytes)?, Deleted::Now))
    }

    /// `GET /v1/backup` from the leader (the node with the freshest applied state; any node
    /// when none is known), written to `w` as it arrives. Returns the node that sent it and the
    /// bytes written. Until a node starts sending, the request fails over between the
    /// configured nodes and backs off like every call ([`RetryPolicy`]): a leader that just
    /// died, or a node cut off from its leader (`503 not_ready`), sends it on to the next node.
    /// Once bytes were written it is not retried (`w` cannot take them back): the file is
    /// checked by its reader (`runnev backup` checks it before keeping it), and a body cut short
    /// by a failure on the node is a truncated backup.
    ///
    /// Errors: [`ClientError::Unreachable`] when no node answered and
    /// [`ClientError::Unavailable`] when none sent a backup within [`RetryPolicy::give_up_after`];
    /// [`ClientError::Api`] for a refusal (`403` for a token without the admin grant);
    /// [`ClientError::Unavailable`] when the node stops sending for longer than the request
    /// timeout or the connection breaks; [`ClientError::Io`] when `w` fails.
    pub async fn backup(&self, w: &mut (impl tokio::io::AsyncWrite + Unpin)) -> Result<(String, u64), ClientError> {
        use tokio::io::AsyncWriteExt;
        let view = self.any_cluster_view().await?;
        if let Some(leader) = view.leader_id.and_then(|l| view.members.iter().find(|m| m.id == l)) {
            self.remember_leader(&leader.addr);
        }
        let media = Media { stream_success: true, to_leader: true, ..Media::default() };
        let answer =
            self.call_with(Method::GET, "/v1/backup", (Bytes::new(), media), Duration::ZERO, true, false).await?;
        let node = answer.node;
        let Some(mut body) = answer.stream else {
            return Err(ClientError::Protocol { node, what: "the backup's answer had no body".into() });
        };
        let timeout = self.inner.policy.request_timeout;
        let broken = |why: String| ClientError::Unavailable { after: timeout, last: format!("{node}: {why}") };
        let mut written = 0u64;
        loop {
            let frame = match tokio::time::timeout(timeout, body.frame()).await {
                Ok(Some(Ok(f))) => f,
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(broken(format!("the backup broke off after {written} bytes: {e}"))),
                Err(_) => return Err(broken(format!("the backup stalled after {written} bytes"))),
            };
            if let Ok(data) = frame.into_data() {
                w.write_all(&data).await?;
                written = written.saturating_add(data.len() as u64);
            }
        }
        w.flush().await?;
        Ok((node, written))
    }

    /// Subscribes to `stream` after `cursor` (the last seq fully processed; 0 for the start).
    /// See [`Subscription`]; it retries without end and yields an availability error after each
    /// [`RetryPolicy::give_up_after`] without a connection.
    pub fn subscribe(&self, stream: &str, cursor: u64) -> Subscription {
        self.subscribe_with(stream, cursor, SubscribeOptions::default())
    }

    /// [`Client::subscribe`] with options: an outage limit, and a callback told of every
    /// connection change.
    pub fn subscribe_with(&self, stream: &str, cursor: u64, options: SubscribeOptions) -> Subscription {
        Subscription::new(self.clone(), stream.to_string(), cursor, options)
    }
}

pub(crate) fn api_error(node: &str, status: StatusCode, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<wire::ErrorBody>(bytes) {
        Ok(e) => ClientError::Api {
            status: status.as_u16(),
            code: e.error.code,
            message: e.error.message,
            frame: e.error.frame,
        },
        Err(_) => ClientError::Protocol {
            node: node.to_string(),
            what: format!("status {status} with body {:?}", String::from_utf8_lossy(bytes)),
        },
    }
}

#[cfg(test)]
mod tests {
    //! The retry loop on tokio's paused clock, over a fake dialer: nodes that refuse, answer, or
    //! take a request and lose the answer. Timings are virtual, so they are exact.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use http_body_util::Full;
    use hyper_util::rt::TokioIo;
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::net::{BoxFuture, Io};

    /// What a fake node does with its n-th request (from 0).
    #[derive(Clone, Copy)]
    enum Reply {
        /// Refuses the connection.
        Refuse,
        /// Fails the TLS handshake: the node's certificate is from another CA.
        OtherCa,
        /// Reads the request, then closes without answering (an answer lost on the way).
        Lose,
        /// Answers with this status and a SPEC error body of this code (or `{}` for 2xx).
        Answer(u16, &'static str),
    }

    type Script = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

    /// Dials in memory; each node follows `script`. Records every request it saw per node.
    struct Fake {
        script: Script,
        seen: Arc<Mutex<HashMap<String, usize>>>,
    }

    impl Fake {
        fn new(
            script: impl Fn(&str, usize) -> Reply + Send + Sync + 'static,
        ) -> (Arc<Fake>, Arc<Mutex<HashMap<String, usize>>>) {
            let seen = Arc::new(Mutex::new(HashMap::new()));
            (Arc::new(Fake { script: Arc::new(script), seen: seen.clone() }), seen)
        }

        /// Counts a request (or a connection attempt) to `addr`; returns its number.
        fn count(seen: &Mutex<HashMap<String, usize>>, addr: &str) -> usize {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(addr.to_string()).or_insert(0);
            *n += 1;
            *n - 1
        }
    }

    impl Dialer for Fake {
        fn dial(&self, addr: String) -> BoxFuture<std::io::Result<Box<dyn Io>>> {
            let (script, seen) = (self.script.clone(), self.seen.clone());
            Box::pin(async move {
                // The number the next request would get decides whether the connection is taken.
                let next = *seen.lock().unwrap().get(&addr).unwrap_or(&0);
                match script(&addr, next) {
                    Reply::Refuse => {
                        Fake::count(&seen, &addr);
                        return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
                    }
                    // As tokio-rustls reports a certificate it refused.
                    Reply::OtherCa => {
                        Fake::count(&seen, &addr);
                        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, refused));
                    }
                    _ => {}
                }
                let (client, mut server) = tokio::io::duplex(64 * 1024);
                tokio::spawn(async move {
                    if matches!(script(&addr, next), Reply::Lose) {
                        Fake::count(&seen, &addr);
                        let mut buf = [0u8; 4096];
                        let _ = server.read(&mut buf).await;
                        return;
                    }
                    let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                        let n = Fake::count(&seen, &addr);
                        let (status, code) = match script(&addr, n) {
                            Reply::Answer(s, c) => (s, c),
                            _ => (503, "no_leader"),
                        };
                        let body = if status < 300 {
                            r#"{"streams":[]}"#.to_string()
                        } else {
                            format!(r#"{{"error":{{"code":"{code}","message":"said {addr}"}}}}"#)
                        };
                        let resp = hyper::Response::builder().status(status).body(Full::new(Bytes::from(body)));
                        async move { resp }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(server), svc).await;
                });
                Ok(Box::new(client) as Box<dyn Io>)
            })
        }
    }

    const NODES: [&str; 3] = ["http://a:1", "http://b:1", "http://c:1"];

    fn client(dialer: Arc<Fake>) -> Client {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        Client::with_dialer(&nodes, dialer, RetryPolicy::default()).unwrap()
    }

    /// Every node refusing: the call ends as unreachable within `unreachable_after` (about a
    /// second), after several full rounds over the nodes, not after `give_up_after`.
    #[tokio::test(start_paused = true)]
    async fn refused_everywhere_fails_fast_as_unreachable() {
        let (fake, seen) = Fake::new(|_, _| Reply::Refuse);
        let started = tokio::time::Instant::now();
        let err = client(fake).streams().await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
        assert!(err.to_string().starts_with("no Runnev node reachable at http://a:1, http://b:1, http://c:1"), "{err}");
        let tls = ClientError::Unreachable {
            nodes: vec!["http://a:1".into()],
            after: Duration::from_secs(1),
            last: "GET http://a:1/v1/streams: invalid HTTP version parsed".into(),
        };
        assert!(
            tls.to_string().ends_with("give the cluster CA's certificate with --ca-file or RUNNEV_CA_FILE)"),
            "{tls}"
        );
        let policy = RetryPolicy::default();
        assert!(took <= policy.unreachable_after, "gave up after {took:?}");
        let seen = seen.lock().unwrap();
        for node in ["a:1", "b:1", "c:1"] {
            assert!(seen.get(node).copied().unwrap_or(0) >= 2, "{node} tried {seen:?}");
        }
    }

    /// Every node's certificate refused (another CA): the call ends after one round over the
    /// nodes, at once, as a TLS error naming the fix; one node refused and another fine: the
    /// call goes to the other.
    #[tokio::test(start_paused = true)]
    async fn a_certificate_of_another_ca_ends_the_call_after_one_round() {
        let (fake, seen) = Fake::new(|_, _| Reply::OtherCa);
        let started = tokio::time::Instant::now();
        let err = client(fake).streams().await.unwrap_err();
        assert!(matches!(err, ClientError::Tls { .. }), "{err}");
        assert!(err.to_string().contains("not signed by the CA given with --ca-file"), "{err}");
        assert_eq!(started.elapsed(), Duration::ZERO, "no backoff");
        let tries: usize = seen.lock().unwrap().values().sum();
        assert_eq!(tries, NODES.len(), "one try a node: {seen:?}");
        let (fake, _) = Fake::new(|addr, _| if addr == "a:1" { Reply::OtherCa } else { Reply::Answer(200, "") });
        let answer = client(fake).call(Method::GET, "/v1/streams", Bytes::new(), Duration::ZERO).await.unwrap();
        assert_ne!(answer.0, "http://a:1");
    }

    /// A subscription whose every node refuses its TLS for good ends with the TLS error after
    /// one round, instead of retrying for ever (found by a fresh user's trial of the Python
    /// client, which had the same loop).
    #[tokio::test(start_paused = true)]
    async fn a_subscription_ends_when_every_node_refuses_its_tls() {
        use futures::StreamExt;
        let (fake, seen) = Fake::new(|_, _| Reply::OtherCa);
        let mut sub = client(fake).subscribe("s", 0);
        let first = tokio::time::timeout(Duration::from_secs(60), sub.next()).await.expect("an item in time");
        assert!(matches!(first, Some(Err(ClientError::Tls { .. }))), "{first:?}");
        assert!(sub.next().await.is_none(), "the subscription ended");
        let tries: usize = seen.lock().unwrap().values().sum();
        assert_eq!(tries, NODES.len(), "one try a node: {seen:?}");
    }

    /// A node answering `503 no_leader` keeps the call going until `give_up_after`, and the
    /// error says so in words, never as the server's JSON.
    #[tokio::test(start_paused = true)]
    async fn a_503_is_retried_until_the_deadline_and_told_in_words() {
        let (fake, _) =
            Fake::new(|addr, _| if addr == "b:1" { Reply::Answer(503, "no_leader") } else { Reply::Refuse });
        let started = tokio::time::Instant::now();
        let err = client(fake).streams().await.unwrap_err();
        let policy = RetryPolicy::default();
        assert!(started.elapsed() + policy.backoff_max >= policy.give_up_after, "{:?}", started.elapsed());
        let text = err.to_string();
        assert!(matches!(err, ClientError::Unavailable { .. }), "{text}");
        assert!(
            text.contains("no leader: a majority of nodes is down or partitioned (http://b:1 said: said b:1)"),
            "{text}"
        );
        assert!(!text.contains('{'), "{text}");
    }

    /// A delete whose first answer was lost and whose retry finds nothing is done; a delete of
    /// what never existed is refused.
    #[tokio::test(start_paused = true)]
    async fn a_delete_whose_answer_was_lost_counts_as_done() {
        let (fake, _) = Fake::new(|addr, n| match (addr, n) {
            ("a:1", 0) => Reply::Lose,
            _ => Reply::Answer(404, "stream_not_found"),
        });
        assert_eq!(client(fake).delete_stream("s").await.unwrap(), Deleted::Already);
        let (fake, _) = Fake::new(|_, _| Reply::Answer(404, "stream_not_found"));
        let err = client(fake).delete_stream("s").await.unwrap_err();
        assert_eq!(err.code(), Some("stream_not_found"), "{err}");
        let (fake, _) = Fake::new(|_, _| Reply::Answer(204, ""));
        assert_eq!(client(fake).delete_stream("s").await.unwrap(), Deleted::Now);
    }

    /// A publish without seq whose answer was lost is not retried: its outcome is unknown.
    #[tokio::test(start_paused = true)]
    async fn a_publish_without_seq_whose_answer_was_lost_is_unknown() {
        let (fake, seen) = Fake::new(|addr, _| if addr == "a:1" { Reply::Lose } else { Reply::Answer(201, "") });
        let err = client(fake).publish("s", None, &b"x"[..]).await.unwrap_err();
        assert!(matches!(err, ClientError::OutcomeUnknown(_)), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1, "not retried elsewhere");
    }

    /// Names are checked before anything is sent, in the server's words; node lists take
    /// `HOST:PORT` without a scheme.
    #[tokio::test(start_paused = true)]
    async fn names_and_node_lists_are_checked_here() {
        let (fake, seen) = Fake::new(|_, _| Reply::Answer(200, ""));
        let err = client(fake).publish("bad name", None, &b"x"[..]).await.unwrap_err();
        assert_eq!(err.to_string(), crate::stream::validate_name("bad name").unwrap_err().to_string());
        assert!(seen.lock().unwrap().is_empty());
        let c = Client::new(&["127.0.0.1:7001".to_string(), "http://h:2/".to_string()]).unwrap();
        assert_eq!(c.nodes(), ["http://127.0.0.1:7001", "http://h:2"]);
        assert_eq!(c.url_of("h:3"), "http://h:3");
        for bad in ["https://h:1", "h", "http://h:1/x", "ftp://h:1", ""] {
            assert!(Client::new(&[bad.to_string()]).is_err(), "{bad:?}");
        }
        let https = Client::new(&["https://h:1".to_string()]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(https.contains("needs the cluster CA's certificate"), "{https}");
        // Over TLS every node is shown as https://, however it was written.
        let tls = Client::over(
            &["h:1".to_string(), "http://h:2".to_string(), "https://h:3/".to_string()],
            http_client(Arc::new(TcpDialer)),
            RetryPolicy::default(),
            Some(Scheme::Https),
        )
        .unwrap();
        assert_eq!(tls.nodes(), ["https://h:1", "https://h:2", "https://h:3"]);
        assert_eq!(tls.url_of("h:4"), "https://h:4");
        tls.remember_leader("h:2");
        assert_eq!(tls.pick_for_write(), 1);
        assert_eq!(segment("a.b_c-1").unwrap(), "a.b_c-1");
    }
}

#[cfg(test)]
mod read_form_tests {
    use super::*;

    /// A JSON answer (a node of a build without binary records) and the binary one of the same
    /// read decode to the same [`ReadAnswer`].
    #[test]
    fn a_json_and_a_binary_answer_of_one_read_decode_alike() {
        let json = r#"{"batches":[{"seq":5,"ts":17,"data":"aGk="},{"seq":6,"ts":18,"data":""}],"gap":{"from":3,"to":4},"last_seq":9,"next_after":6}"#;
        let mut body = vec![0u8; wire::BATCHES_HEAD_BYTES];
        wire::push_batch_record(&mut body, 5, 17, b"hi").unwrap();
        wire::push_batch_record(&mut body, 6, 18, b"").unwrap();
        let head = wire::BatchesHead { last_seq: 9, next_after: 6, gap: Some(wire::Gap { from: 3, to: 4 }), count: 2 };
        wire::encode_batches_head(&mut body, &head);
        let want = ReadAnswer {
            batches: vec![
                Batch { seq: 5, ts: 17, data: Bytes::from_static(b"hi") },
                Batch { seq: 6, ts: 18, data: Bytes::new() },
            ],
            gap: Some(wire::Gap { from: 3, to: 4 }),
            last_seq: 9,
            next_after: 6,
        };
        for (bytes, binary) in [(Bytes::from_static(json.as_bytes()), false), (Bytes::from(body), true)] {
            let raw = RawRead { node: "n".into(), bytes, binary };
            let parsed = Client::parse_read(&raw, 2).unwrap();
            assert_eq!((parsed.next_after(), parsed.carries_any()), (6, true));
            assert_eq!(Client::decode_read(&raw.node, parsed).unwrap(), want, "binary={binary}");
        }
        // A binary body that is not one is a protocol error naming the node, not an answer.
        let raw = RawRead { node: "n".into(), bytes: Bytes::from_static(b"{}"), binary: true };
        assert!(matches!(Client::parse_read(&raw, 0), Err(ClientError::Protocol { node, .. }) if node == "n"));
    }
}
