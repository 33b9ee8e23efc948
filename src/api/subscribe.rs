//! `GET /v1/streams/{name}/subscribe`: a live subscription as Server-Sent Events (SPEC §4).
//!
//! Owns: turning the applied state into an ordered event stream: a `gap` event when the cursor
//! is behind `evicted_through`, then `batch` events whose `id` is the seq, so any standard SSE
//! client resumes with `Last-Event-ID`. Must never: skip a retained batch, send a batch that is
//! not applied, or announce a gap because this node is behind (a node behind the cursor waits).
//!
//! A subscription follows its stream's name: it reads the stream afresh after every change of
//! the applied index, never from a view it kept. When the stream is deleted it keeps waiting
//! (keep-alives go on); when a stream of that name exists again, it goes on after its cursor, a
//! gap first for the seqs the deletion removed that it had not sent (a stream created again
//! continues after the deleted one's last seq, which counts as evicted). It ends when the node
//! stops, on a storage error, or, after an `unavailable` event, when the node has not heard from
//! a leader for [`LEADER_SILENCE_MAX_MS`](crate::limits::LEADER_SILENCE_MAX_MS): a node cut off
//! cannot tell that it is behind, and its keep-alives would keep the client from failing over.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use super::streams::{param_u64, query, stream_name};
use super::AppState;
use crate::error::ApiError;
use crate::limits::{
    READ_ANSWER_BYTES_MAX, SUBSCRIBE_CONTACT_CHECK_MS, SUBSCRIBE_KEEPALIVE_MS, SUBSCRIBE_READ_BATCHES,
    SUBSCRIBE_STREAM_WAIT_MS,
};
use crate::storage::blocking;
use crate::stream;
use crate::wire;

/// Where a subscription stands.
struct Cursor {
    s: AppState,
    name: String,
    /// The seq of the last event sent (or the gap's `to`).
    after: u64,
    pending: VecDeque<Event>,
    applied: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    /// Set once the `unavailable` event is queued: the subscription ends after sending it.
    ending: bool,
    /// This subscription's place under `--max-subscribers`, given back when it ends.
    _slot: Slot,
}

/// A subscription's permit, counted in the gauge `runnev_subscribers` while held.
struct Slot(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

impl Slot {
    /// A place for one more subscription.
    ///
    /// Errors: `503 overloaded` when the node serves `--max-subscribers` already.
    fn take(s: &AppState) -> Result<Slot, ApiError> {
        let permit = s.subscribers.clone().try_acquire_owned().map_err(|_| {
            metrics::counter!("runnev_overloaded_total", "bound" => "subscribers").increment(1);
            ApiError::Overloaded("this node serves as many subscriptions as it may (--max-subscribers); subscribe on another node or retry later".into())
        })?;
        metrics::gauge!("runnev_subscribers").increment(1.0);
        Ok(Slot(permit))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!("runnev_subscribers").decrement(1.0);
    }
}

fn start_cursor(headers: &HeaderMap, q: &HashMap<String, String>) -> Result<u64, ApiError> {
    // `after` is checked even when Last-Event-ID overrides it: a bad parameter is refused, never
    // ignored (a request the OpenAPI document calls invalid is answered 400).
    let after = param_u64(q, "after", true)?.unwrap_or(0);
    // SPEC §4: Last-Event-ID takes precedence over `after`; -1 and 0 both mean the start.
    match headers.get("last-event-id") {
        Some(v) => {
            // A value that is not visible ASCII is no seq (it used to read as empty: the start).
            let raw = v
                .to_str()
                .map_err(|_| ApiError::InvalidParameter("Last-Event-ID is not a seq (not visible ASCII)".into()))?
                .trim();
            if raw.is_empty() || raw == "-1" {
                return Ok(0);
            }
            raw.parse::<u64>().map_err(|_| ApiError::InvalidParameter(format!("Last-Event-ID {raw:?} is not a seq")))
        }
        None => Ok(after),
    }
}

/// Fills `c.pending` with the next events, waiting for new applied entries when there are none.
/// Returns false when the subscription must end (node stopping, storage error, Raft core stopped
/// — this node will never apply more, the subscriber resumes elsewhere — or the `unavailable`
/// event already queued). A stream that does not exist (deleted, not created again yet) is
/// waited for like one with nothing new.
async fn refill(c: &mut Cursor) -> bool {
    if c.ending {
        return false;
    }
    loop {
        if let Some(silence) = c.s.contact.cut_off(&c.s.raft, c.s.node_id) {
            let message = format!(
                "node {} {silence}: it cannot tell whether it is behind; resume on another node after the last seq received",
                c.s.node_id
            );
            tracing::info!(stream = %c.name, %silence, "ending a subscription: no leader heard");
            c.pending.push_back(
                Event::default().event("unavailable").json_data(wire::Unavailable { message }).unwrap_or_default(),
            );
            c.ending = true;
            return true;
        }
        c.applied.borrow_and_update();
        let store = c.s.store.clone();
        let (name, after) = (c.name.clone(), c.after);
        let found =
            blocking(move || store.read_batches(&name, after, SUBSCRIBE_READ_BATCHES, READ_ANSWER_BYTES_MAX)).await;
        match found {
            Ok(Some(view)) => {
                if let Some((from, to)) = stream::gap_for(&view.meta, c.after) {
                    metrics::counter!("runnev_gaps_delivered_total", "via" => "subscribe").increment(1);
                    c.pending
                        .push_back(Event::default().event("gap").json_data(wire::Gap { from, to }).unwrap_or_default());
                    c.after = to;
                }
                for b in view.batches {
                    c.after = b.seq;
                    let id = b.seq.to_string();
                    c.pending.push_back(
                        Event::default()
                            .event("batch")
                            .id(id)
                            .json_data(wire::BatchBody::encode(b.seq, b.ts, &b.data))
                            .unwrap_or_default(),
                    );
                }
            }
            // Deleted (and not created again yet): the subscription follows the name and waits.
            Ok(None) => {}
            Err(e) => {
                tracing::error!(stream = %c.name, error = %e, "subscription read failed");
                return false;
            }
        }
        if !c.pending.is_empty() {
            return true;
        }
        tokio::select! {
            changed = c.applied.changed() => if changed.is_err() { return false },
            _ = c.stopping.changed() => return false,
            why = super::raft_stops(&c.s.raft) => {
                tracing::warn!(stream = %c.name, reason = %why, "ending a subscription: raft has stopped on this node");
                return false;
            }
            _ = tokio::time::sleep(Duration::from_millis(SUBSCRIBE_CONTACT_CHECK_MS)) => {}
        }
    }
}

/// Waits up to [`SUBSCRIBE_STREAM_WAIT_MS`] for this node to know the stream: a node that has not
/// applied the stream's creation yet must not turn a subscriber away.
///
/// Errors: `404 stream_not_found` when it is still unknown after the wait.
async fn wait_for_stream(s: &AppState, name: &str) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(SUBSCRIBE_STREAM_WAIT_MS);
    let mut applied = s.store.watch_applied();
    loop {
        applied.borrow_and_update();
        let (store, n) = (s.store.clone(), name.to_string());
        if blocking(move || store.stream(&n)).await?.is_some() {
            return Ok(());
        }
        let _waiting = super::Waiting::start("subscribe");
        tokio::select! {
            waited = tokio::time::timeout_at(deadline, applied.changed()) => if waited.is_err() {
                return Err(ApiError::StreamNotFound(name.to_string()));
            },
            why = super::raft_stops(&s.raft) => return Err(super::raft_stopped_error(&why)),
        }
    }
}

/// `GET /v1/streams/{name}/subscribe?after=C`.
#[utoipa::path(
    get,
    path = "/v1/streams/{name}/subscribe",
    operation_id = "subscribe",
    summary = "Live subscription (Server-Sent Events)",
    tag = "subscribe",
    params(
        super::openapi::StreamPath,
        super::openapi::SubscribeQuery,
        ("Last-Event-ID" = Option<String>, Header, pattern = r"^(|-1|[0-9]{1,20})$",
            description = "The seq of the last batch received, as a standard SSE client sends it when it reconnects: empty or `-1` mean 0, otherwise 0 to 2⁶⁴−1; takes precedence over `after`"),
    ),
    responses(
        (status = 200, description = "A live event stream (SPEC §4), open until the node stops or is cut off from the leader: `gap` events (data: `Gap`), `batch` events (`id`: the seq; data: `BatchBody`), an `unavailable` event (data: `Unavailable`) before it ends, and a `: ping` comment every 10 s", content_type = "text/event-stream", body = String),
        (status = 400, description = "`invalid_stream_name`; `invalid_parameter` (a bad `after` or `Last-Event-ID`)", body = crate::wire::ErrorBody),
        (status = 404, description = "`stream_not_found` (the node still does not know the stream after waiting 2 s)", body = crate::wire::ErrorBody),
        super::openapi::AuthErrors,
        (status = 500, description = "`internal`: a fault of the node (a storage failure), never of the request", body = crate::wire::ErrorBody),
        (status = 503, description = "`not_ready` (the node is stopping, has not heard from a leader for 2,000 ms, or its Raft core stopped); `overloaded` (at `--max-subscribers`, with `Retry-After: 1`)", body = crate::wire::ErrorBody),
    )
)]
pub(super) async fn subscribe(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = stream_name(path)?;
    let q = query(q)?;
    let after = start_cursor(&headers, &q)?;
    let slot = Slot::take(&s)?;
    if let Some(silence) = s.contact.cut_off(&s.raft, s.node_id) {
        return Err(ApiError::NotReady(format!(
            "node {} {silence}: it cannot tell whether it is behind; subscribe on another node",
            s.node_id
        )));
    }
    wait_for_stream(&s, &name).await?;
    let applied = s.store.watch_applied();
    let stopping = s.stopping.clone();
    if *stopping.borrow() {
        return Err(ApiError::NotReady("this node is stopping; subscribe to another".into()));
    }
    let cursor = Cursor { s, name, after, pending: VecDeque::new(), applied, stopping, ending: false, _slot: slot };
    let events = futures::stream::unfold(cursor, |mut c| async move {
        if c.pending.is_empty() && !refill(&mut c).await {
            return None;
        }
        let ev = c.pending.pop_front()?;
        Some((Ok::<_, Infallible>(ev), c))
    });
    let keep_alive = KeepAlive::new().interval(Duration::from_millis(SUBSCRIBE_KEEPALIVE_MS)).text("ping");
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn cursor(last_event_id: Option<&[u8]>, after: Option<&str>) -> Result<u64, String> {
        let mut headers = HeaderMap::new();
        if let Some(v) = last_event_id {
            headers.insert("last-event-id", HeaderValue::from_bytes(v).unwrap());
        }
        let q: HashMap<String, String> = after.map(|a| ("after".to_string(), a.to_string())).into_iter().collect();
        start_cursor(&headers, &q).map_err(|e| e.status_and_code().1.to_string())
    }

    #[test]
    fn last_event_id_takes_precedence_over_after() {
        assert_eq!(cursor(Some(b"7"), Some("3")), Ok(7));
        assert_eq!(cursor(Some(b"-1"), Some("3")), Ok(0));
        assert_eq!(cursor(Some(b""), None), Ok(0));
        assert_eq!(cursor(None, Some("3")), Ok(3));
        assert_eq!(cursor(None, Some("-1")), Ok(0));
        assert_eq!(cursor(None, None), Ok(0));
    }

    /// A bad `after` was ignored when Last-Event-ID was sent (found by Schemathesis from
    /// docs/openapi.json), and a Last-Event-ID that is not visible ASCII read as the start
    /// (found next to it).
    #[test]
    fn a_bad_cursor_is_refused_even_when_overridden() {
        assert_eq!(cursor(Some(b"-1"), Some("-570880")), Err("invalid_parameter".into()));
        assert_eq!(cursor(Some(b"5"), Some("x")), Err("invalid_parameter".into()));
        assert_eq!(cursor(Some(b"\xa4"), None), Err("invalid_parameter".into()));
        assert_eq!(cursor(Some(b"x"), None), Err("invalid_parameter".into()));
    }
}
