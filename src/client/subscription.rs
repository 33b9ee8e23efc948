//! A subscription that survives node failures: SSE from one node at a time, reconnecting to the
//! next node from the last seq delivered.
//!
//! Owns: reconnection, resume and client-side dedupe. Must never: yield a batch at or below the
//! cursor it has already delivered, or turn a gap into silence (a gap is its own item).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use tokio::time::Instant;

use super::sse::{self, SseEvent};
use super::{api_error, decode_batch, segment, unavailable_text, Backoff, Batch, Client, ClientError, Gap};
use crate::net::cause_text;
use crate::units::format_duration;
use crate::wire::BatchBody;

use crate::limits::{SUBSCRIPTION_IDLE_CHECK_MS, SUBSCRIPTION_IDLE_MS as IDLE_MS};

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The next batch after the cursor.
    Batch(Batch),
    /// Retention evicted these seqs before they could be delivered (SPEC §2.5): an alert for the
    /// caller, who must decide what losing them means.
    Gap(Gap),
}

/// A change of a subscription's connection, told to [`SubscribeOptions::on_connection`] (the
/// command line notes each on stderr).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Connected to `node`; `outage` is how long the subscription had no connection before
    /// (zero for the first connection, or a reconnection that succeeded at once).
    Connected {
        /// The node's base URL.
        node: String,
        /// Time without a connection before this one.
        outage: Duration,
    },
    /// The connection broke or fell silent; the subscription reconnects, to the next node.
    Lost {
        /// What happened.
        why: String,
    },
    /// An attempt to connect failed; the next one is made after `retry_in`.
    Failed {
        /// What happened, naming the node.
        why: String,
        /// Time without a connection so far.
        outage: Duration,
        /// The backoff before the next attempt.
        retry_in: Duration,
    },
}

/// A callback told of each [`Connection`] change.
pub type ConnectionHook = Arc<dyn Fn(&Connection) + Send + Sync>;

/// Options of [`Client::subscribe_with`](super::Client::subscribe_with).
#[derive(Clone, Default)]
pub struct SubscribeOptions {
    /// End the subscription, after yielding [`ClientError::Unreachable`] (no node answered) or
    /// [`ClientError::Unavailable`] (nodes answered `5xx`), once it has had no connection for
    /// this long. `None`: never end for want of a connection (an error is still yielded after
    /// each [`RetryPolicy::give_up_after`](super::RetryPolicy) without one, and it keeps trying).
    pub max_outage: Option<Duration>,
    /// Told of every connection change, as it happens.
    pub on_connection: Option<ConnectionHook>,
}

impl std::fmt::Debug for SubscribeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscribeOptions")
            .field("max_outage", &self.max_outage)
            .field("on_connection", &self.on_connection.as_ref().map(|_| "…"))
            .finish()
    }
}

type Events = Pin<Box<dyn Stream<Item = Result<SseEvent, String>> + Send>>;

struct State {
    client: Client,
    stream: String,
    cursor: u64,
    events: Option<Events>,
    last_bytes: Arc<Mutex<Instant>>,
    /// When the subscription last lost (or never had) a connection, while it has none.
    failing_since: Option<Instant>,
    /// When the current outage was last reported as an error item (every `give_up_after`).
    reported_at: Option<Instant>,
    /// Whether a node answered (with `5xx`) during the current outage.
    answered: bool,
    /// Connection attempts in a row whose TLS handshake failed for good
    /// ([`crate::tls::refusal`]): a round of them over every node ends the subscription.
    tls_refused_in_a_row: usize,
    backoff: Backoff,
    options: SubscribeOptions,
    done: bool,
}

impl State {
    fn tell(&self, c: Connection) {
        if let Some(hook) = &self.options.on_connection {
            hook(&c);
        }
    }
}

enum Connect {
    /// Try again; `answered` when a node answered (a `5xx`) rather than failing to.
    Retry {
        why: String,
        answered: bool,
    },
    /// The TLS handshake failed in a way no retry mends ([`crate::tls::refusal`]).
    Tls {
        node: String,
        why: String,
    },
    Fail(ClientError),
}

/// A live subscription: an async [`Stream`] of [`Delivery`] in seq order, each seq at most once.
///
/// On a node failure, or when its node ends the stream because it hears from no leader (an
/// `unavailable` event), it reconnects to the next node and resumes after the last seq it
/// yielded (repeats the server sends at or below it are dropped), backing off between attempts.
/// A stream deleted while subscribed is waited for: the server keeps the subscription open until
/// a stream of that name exists again. After each [`RetryPolicy::give_up_after`](super::RetryPolicy)
/// without a connection it yields [`ClientError::Unreachable`] (no node answered) or
/// [`ClientError::Unavailable`] (nodes answered `5xx`) and keeps trying, unless
/// [`SubscribeOptions::max_outage`] is reached, which ends it after that error. A `4xx` (the
/// stream does not exist) ends it after yielding the error, and so does a stream name that
/// breaks SPEC §1.
pub struct Subscription {
    inner: Pin<Box<dyn Stream<Item = Result<Delivery, ClientError>> + Send>>,
}

impl Subscription {
    pub(super) fn new(client: Client, stream: String, cursor: u64, options: SubscribeOptions) -> Subscription {
        let backoff = Backoff::new(client.policy().backoff_min, client.policy().backoff_max);
        let state = State {
            client,
            stream,
            cursor,
            events: None,
            last_bytes: Arc::new(Mutex::new(Instant::now())),
            failing_since: Some(Instant::now()),
            reported_at: None,
            answered: false,
            tls_refused_in_a_row: 0,
            backoff,
            options,
            done: false,
        };
        let inner = futures::stream::unfold(state, |mut st| async move {
            let item = next(&mut st).await?;
            Some((item, st))
        });
        Subscription { inner: Box::pin(inner) }
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

async fn connect(
    client: &Client,
    node: &str,
    stream: &str,
    cursor: u64,
    last_bytes: Arc<Mutex<Instant>>,
) -> Result<Events, Connect> {
    let name = segment(stream).map_err(Connect::Fail)?;
    // The token too: a subscription is a read like any other on a node that runs `--auth`.
    let req = client
        .authorized(hyper::Request::get(format!("{node}/v1/streams/{name}/subscribe?after={cursor}")))
        .header("last-event-id", cursor.to_string())
        .header("accept", "text/event-stream")
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| Connect::Fail(ClientError::Config(e.to_string())))?;
    let timeout = client.policy().request_timeout;
    let resp = match tokio::time::timeout(timeout, client.http().request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            if let Some(why) = crate::tls::refusal(&e) {
                return Err(Connect::Tls { node: node.to_string(), why });
            }
            return Err(Connect::Retry { why: format!("{node}: {}", cause_text(&e)), answered: false });
        }
        Err(_) => {
            let why = format!("{node}: no answer within {}", format_duration(timeout));
            return Err(Connect::Retry { why, answered: false });
        }
    };
    let status = resp.status();
    if status != StatusCode::OK {
        let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        if status.is_server_error() {
            return Err(Connect::Retry { why: unavailable_text(node, &body), answered: true });
        }
        return Err(Connect::Fail(api_error(node, status, &body)));
    }
    *last_bytes.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    let bytes = resp.into_body().into_data_stream().map(move |chunk| {
        *last_bytes.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        chunk
    });
    Ok(sse::events(bytes))
}

/// Marks the connection lost: the outage starts now.
fn lose(st: &mut State, why: String) {
    tracing::debug!(%why, "subscription connection lost; reconnecting");
    st.events = None;
    st.failing_since = Some(Instant::now());
    st.reported_at = None;
    st.answered = false;
    st.tell(Connection::Lost { why });
}

async fn next(st: &mut State) -> Option<Result<Delivery, ClientError>> {
    if st.done {
        return None;
    }
    let policy = st.client.policy();
    loop {
        let Some(events) = st.events.as_mut() else {
            let node = st.client.nodes()[st.client.pick()].clone();
            let attempt = connect(&st.client, &node, &st.stream, st.cursor, st.last_bytes.clone()).await;
            // A configuration that does not fit the cluster (its CA, its node names) is not an
            // outage: once every node has refused so in a row, the subscription ends.
            st.tls_refused_in_a_row = match &attempt {
                Err(Connect::Tls { .. }) => st.tls_refused_in_a_row + 1,
                _ => 0,
            };
            let attempt = match attempt {
                Err(Connect::Tls { node, why }) if st.tls_refused_in_a_row < st.client.nodes().len() => {
                    Err(Connect::Retry { why: format!("{node}: {why}"), answered: false })
                }
                other => other,
            };
            match attempt {
                Ok(ev) => {
                    st.events = Some(ev);
                    let outage = st.failing_since.take().map_or(Duration::ZERO, |t| t.elapsed());
                    st.reported_at = None;
                    st.answered = false;
                    st.backoff.reset();
                    st.tell(Connection::Connected { node, outage });
                }
                Err(Connect::Fail(e)) => {
                    st.done = true;
                    return Some(Err(e));
                }
                Err(Connect::Tls { node, why }) => {
                    st.done = true;
                    return Some(Err(ClientError::Tls { node, why }));
                }
                Err(Connect::Retry { why, answered }) => {
                    let since = *st.failing_since.get_or_insert_with(Instant::now);
                    st.answered |= answered;
                    let delay = st.backoff.next_delay();
                    st.tell(Connection::Failed { why: why.clone(), outage: since.elapsed(), retry_in: delay });
                    tokio::time::sleep(delay).await;
                    let outage = since.elapsed();
                    let ended = st.options.max_outage.is_some_and(|max| outage >= max);
                    let report_due = st.reported_at.unwrap_or(since).elapsed() >= policy.give_up_after;
                    if ended || report_due {
                        st.reported_at = Some(Instant::now());
                        st.done = ended;
                        let e = if st.answered {
                            ClientError::Unavailable { after: outage, last: why }
                        } else {
                            ClientError::Unreachable { nodes: st.client.nodes().to_vec(), after: outage, last: why }
                        };
                        return Some(Err(e));
                    }
                }
            }
            continue;
        };
        let ev = match tokio::time::timeout(Duration::from_millis(SUBSCRIPTION_IDLE_CHECK_MS), events.next()).await {
            Err(_) => {
                let silent = st.last_bytes.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                if silent >= Duration::from_millis(IDLE_MS) {
                    lose(st, format!("nothing heard for {}, not even a keep-alive", format_duration(silent)));
                }
                continue;
            }
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(why))) => {
                lose(st, format!("the connection broke: {why}"));
                continue;
            }
            Ok(None) => {
                lose(st, "the node closed the connection".to_string());
                continue;
            }
        };
        match ev.event.as_str() {
            "batch" => {
                let wire: BatchBody<'_> = match serde_json::from_str(&ev.data) {
                    Ok(w) => w,
                    Err(e) => return Some(Err(protocol(&format!("batch event: {e}")))),
                };
                if wire.seq <= st.cursor {
                    continue;
                }
                let batch: Batch = match decode_batch("subscription", wire) {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                st.cursor = batch.seq;
                return Some(Ok(Delivery::Batch(batch)));
            }
            "gap" => {
                let gap: Gap = match serde_json::from_str(&ev.data) {
                    Ok(g) => g,
                    Err(e) => return Some(Err(protocol(&format!("gap event: {e}")))),
                };
                if gap.to <= st.cursor {
                    continue;
                }
                st.cursor = gap.to;
                return Some(Ok(Delivery::Gap(gap)));
            }
            // The node hears from no leader: it ends the stream; go on on another node.
            "unavailable" => {
                tracing::info!(data = %ev.data, "subscription node is cut off from the leader; reconnecting elsewhere");
                st.events = None;
                continue;
            }
            _ => continue,
        }
    }
}

fn protocol(what: &str) -> ClientError {
    ClientError::Protocol { node: "subscription".into(), what: what.to_string() }
}
