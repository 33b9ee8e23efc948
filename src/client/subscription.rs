//! A subscription that survives node failures: SSE from one node at a time, reconnecting to the
//! next node from the last seq delivered.
//!
//! Owns: reconnection, resume and client-side dedupe. Must never: yield a batch at or below the
//! cursor it has already delivered, or turn a gap into silence (a gap is its own item).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use tokio::time::Instant;

use super::{api_error, decode_batch, Backoff, Batch, Client, ClientError, Gap};
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

type Events = Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, String>> + Send>>;

struct State {
    client: Client,
    stream: String,
    cursor: u64,
    events: Option<Events>,
    last_bytes: Arc<Mutex<Instant>>,
    failing_since: Option<Instant>,
    backoff: Backoff,
    done: bool,
}

enum Connect {
    Retry(String),
    Fail(ClientError),
}

/// A live subscription: an async [`Stream`] of [`Delivery`] in seq order, each seq at most once.
///
/// On a node failure, or when its node ends the stream because it hears from no leader (an
/// `unavailable` event), it reconnects to the next node and resumes after the last seq it
/// yielded (repeats the server sends at or below it are dropped). A stream deleted while
/// subscribed is waited for: the server keeps the subscription open until a stream of that name
/// exists again. When no node has answered for
/// [`RetryPolicy::give_up_after`](super::RetryPolicy) it yields [`ClientError::Unavailable`]
/// and keeps trying; a `404` (the stream does not exist) ends it after yielding the error.
pub struct Subscription {
    inner: Pin<Box<dyn Stream<Item = Result<Delivery, ClientError>> + Send>>,
}

impl Subscription {
    pub(super) fn new(client: Client, stream: String, cursor: u64) -> Subscription {
        let backoff = Backoff::new(client.policy().backoff_min, client.policy().backoff_max);
        let state = State {
            client,
            stream,
            cursor,
            events: None,
            last_bytes: Arc::new(Mutex::new(Instant::now())),
            failing_since: None,
            backoff,
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
    stream: &str,
    cursor: u64,
    last_bytes: Arc<Mutex<Instant>>,
) -> Result<Events, Connect> {
    let node = client.nodes()[client.pick()].clone();
    let req = hyper::Request::get(format!("{node}/v1/streams/{stream}/subscribe?after={cursor}"))
        .header("last-event-id", cursor.to_string())
        .header("accept", "text/event-stream")
        .body(Full::new(bytes::Bytes::new()))
        .map_err(|e| Connect::Fail(ClientError::Config(e.to_string())))?;
    let timeout = client.policy().request_timeout;
    let resp = match tokio::time::timeout(timeout, client.http().request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(Connect::Retry(format!("{node}: {e}"))),
        Err(_) => return Err(Connect::Retry(format!("{node}: no answer within {timeout:?}"))),
    };
    let status = resp.status();
    if status != StatusCode::OK {
        let body = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        if status.is_server_error() {
            return Err(Connect::Retry(format!("{node}: {status} {}", String::from_utf8_lossy(&body))));
        }
        return Err(Connect::Fail(api_error(&node, status, &body)));
    }
    *last_bytes.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    let bytes = resp.into_body().into_data_stream().map(move |chunk| {
        *last_bytes.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        chunk
    });
    Ok(Box::pin(bytes.eventsource().map(|r| r.map_err(|e| e.to_string()))))
}

async fn next(st: &mut State) -> Option<Result<Delivery, ClientError>> {
    if st.done {
        return None;
    }
    let policy = st.client.policy();
    loop {
        let Some(events) = st.events.as_mut() else {
            match connect(&st.client, &st.stream, st.cursor, st.last_bytes.clone()).await {
                Ok(ev) => {
                    st.events = Some(ev);
                    st.failing_since = None;
                    st.backoff.reset();
                }
                Err(Connect::Fail(e)) => {
                    st.done = true;
                    return Some(Err(e));
                }
                Err(Connect::Retry(why)) => {
                    let since = *st.failing_since.get_or_insert_with(Instant::now);
                    tokio::time::sleep(st.backoff.next_delay()).await;
                    if since.elapsed() >= policy.give_up_after {
                        st.failing_since = None;
                        return Some(Err(ClientError::Unavailable { after: since.elapsed(), last: why }));
                    }
                }
            }
            continue;
        };
        let ev = match tokio::time::timeout(Duration::from_millis(SUBSCRIPTION_IDLE_CHECK_MS), events.next()).await {
            Err(_) => {
                let silent = st.last_bytes.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                if silent >= Duration::from_millis(IDLE_MS) {
                    tracing::info!(?silent, "subscription connection silent; reconnecting");
                    st.events = None;
                }
                continue;
            }
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(why))) => {
                tracing::info!(%why, "subscription connection broke; reconnecting");
                st.events = None;
                continue;
            }
            Ok(None) => {
                st.events = None;
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
