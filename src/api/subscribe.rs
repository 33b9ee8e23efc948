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
//! stops, on a storage error, once the node has applied the deletion of the token it was opened
//! with (no batch applied after that is sent; the client's next request is refused), or, after
//! an `unavailable` event, when the node has not heard from a leader for
//! [`LEADER_SILENCE_MAX_MS`](crate::limits::LEADER_SILENCE_MAX_MS): a node cut off cannot tell
//! that it is behind, and its keep-alives would keep the client from failing over.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use tokio::sync::watch;

use super::streams::{param_u64, query, stream_name};
use super::AppState;
use crate::error::ApiError;
use crate::limits::{
    READ_ANSWER_BYTES_MAX, SUBSCRIBE_CONTACT_CHECK_MS, SUBSCRIBE_KEEPALIVE_MS, SUBSCRIBE_READ_BATCHES,
    SUBSCRIBE_READ_BYTES_MIN, SUBSCRIBE_READ_BYTES_TOTAL, SUBSCRIBE_STREAM_WAIT_MS,
};
use crate::storage::{blocking, BatchRef, Store, StoreError};
use crate::stream;
use crate::wire;

/// Where a subscription stands.
struct Cursor {
    s: AppState,
    name: String,
    /// The seq of the last event sent (or the gap's `to`).
    after: u64,
    /// The text of the events not sent yet, sent as one chunk of the answer: one chunk per read
    /// of up to [`SUBSCRIBE_READ_BATCHES`] batches, not one per event.
    pending: String,
    /// When a `: ping` is due if nothing was sent before.
    ping_at: tokio::time::Instant,
    applied: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    /// Set once the `unavailable` event is queued: the subscription ends after sending it.
    ending: bool,
    /// The token the subscription was opened with (nodes run with `--auth`): checked again
    /// after each read, so the subscription ends once this node applies the token's deletion.
    token: Option<super::auth::AuthorizedBy>,
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
            push_unavailable(&mut c.pending, &wire::Unavailable { message });
            c.ending = true;
            return true;
        }
        c.applied.borrow_and_update();
        let store = c.s.store.clone();
        let (name, after) = (c.name.clone(), c.after);
        // A turn among the subscriptions reading now (the semaphore is never closed).
        let Ok(turn) = c.s.subscribe_reads.acquire().await else { return false };
        let open = c.s.max_subscribers.saturating_sub(c.s.subscribers.available_permits());
        let bytes_max = read_bytes_max(open);
        let found = blocking(move || read_events(&store, &name, after, SUBSCRIBE_READ_BATCHES, bytes_max)).await;
        drop(turn);
        // Checked after the read: the token still valid now was valid in the state just read (a
        // deleted token's name made again has another secret), so no batch applied after the
        // token's deletion is sent.
        if let Some(t) = &c.token {
            if !t.still_allows(&c.s, crate::auth::Permission::Read, crate::auth::Scope::Stream(&c.name)) {
                tracing::info!(stream = %c.name, token = %t.name(), "ending a subscription: its token was deleted");
                return false;
            }
        }
        match found {
            Ok(Some(read)) => {
                if read.gap {
                    metrics::counter!("runnev_gaps_delivered_total", "via" => "subscribe").increment(1);
                }
                debug_assert!(read.after >= c.after, "a subscription's cursor never goes back");
                c.after = read.after;
                if c.pending.is_empty() {
                    c.pending = read.text;
                } else {
                    c.pending.push_str(&read.text);
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
            // Nothing sent for SUBSCRIBE_KEEPALIVE_MS (the stream is idle, deleted, or this node
            // is behind the cursor): a comment keeps proxies and the client's idle check content.
            _ = tokio::time::sleep_until(c.ping_at) => {
                c.pending.push_str(PING);
                return true;
            }
        }
    }
}

/// Payload bytes one step of a subscription reads when `open` subscriptions are open on the node
/// (this one included): its share of [`SUBSCRIBE_READ_BYTES_TOTAL`], at least
/// [`SUBSCRIBE_READ_BYTES_MIN`] and at most [`READ_ANSWER_BYTES_MAX`].
fn read_bytes_max(open: usize) -> usize {
    (SUBSCRIBE_READ_BYTES_TOTAL / open.max(1)).clamp(SUBSCRIBE_READ_BYTES_MIN, READ_ANSWER_BYTES_MAX)
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
    q: super::streams::QueryPairs,
    headers: HeaderMap,
    token: Option<axum::Extension<super::auth::AuthorizedBy>>,
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
    let cursor = Cursor {
        s,
        name,
        after,
        pending: String::new(),
        ping_at: tokio::time::Instant::now() + Duration::from_millis(SUBSCRIBE_KEEPALIVE_MS),
        applied,
        stopping,
        ending: false,
        token: token.map(|t| t.0),
        _slot: slot,
    };
    let events = futures::stream::unfold(cursor, |mut c| async move {
        if c.pending.is_empty() && !refill(&mut c).await {
            return None;
        }
        let chunk = Bytes::from(std::mem::take(&mut c.pending).into_bytes());
        c.ping_at = tokio::time::Instant::now() + Duration::from_millis(SUBSCRIBE_KEEPALIVE_MS);
        Some((Ok::<_, Infallible>(chunk), c))
    });
    let headers = [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")];
    Ok((headers, Body::from_stream(events)).into_response())
}

/// The keep-alive comment, sent after [`SUBSCRIBE_KEEPALIVE_MS`] without an event.
const PING: &str = ": ping\n\n";

/// The events of one read of a subscription: the text to send and the cursor after it.
#[derive(Debug)]
struct ReadEvents {
    /// Zero or more events, each ended by a blank line: a `gap` event first when one is due,
    /// then `batch` events in seq order.
    text: String,
    /// The seq of the last batch written, or the gap's `to`, or the cursor read after.
    after: u64,
    /// Whether a `gap` event is among them.
    gap: bool,
}

/// Reads the events that follow cursor `after` on `name`, from one read transaction: a `gap`
/// event when retention evicted seqs after the cursor, then at most `limit` batches (and, past
/// the first, at most `bytes_max` payload bytes) as `batch` events, written straight from the
/// database (no copy of a payload, no event object per batch). `None` when the stream does not
/// exist. Only applied (so committed) batches are in the database.
///
/// The bytes are those axum's `Sse` wrote for one `Event` per batch (`event:`, `id:`, `data:`
/// lines, a blank line); a test below holds them to it.
///
/// Errors: the storage's.
fn read_events(
    store: &Store,
    name: &str,
    after: u64,
    limit: usize,
    bytes_max: usize,
) -> Result<Option<ReadEvents>, StoreError> {
    let start = |meta: &stream::StreamMeta| {
        let mut read = ReadEvents { text: String::new(), after, gap: false };
        if let Some((from, to)) = stream::gap_for(meta, after) {
            push_gap(&mut read.text, wire::Gap { from, to });
            read.after = to;
            read.gap = true;
        }
        read
    };
    let each = |read: &mut ReadEvents, b: BatchRef<'_>| {
        debug_assert!(b.seq > read.after, "batch events in seq order, after the cursor and the gap");
        push_batch(&mut read.text, b.seq, b.ts, b.data);
        read.after = b.seq;
    };
    store.visit_batches(name, after, limit, bytes_max, start, each)
}

/// Appends a `batch` event: `id` the seq, `data` the [`wire::BatchBody`] JSON (written by hand:
/// base64 needs no escaping, as in a read answer).
fn push_batch(out: &mut String, seq: u64, ts: u64, data: &[u8]) {
    out.reserve(data.len().div_ceil(3) * 4 + 96);
    let _ = write!(out, "event: batch\nid: {seq}\ndata: {{\"seq\":{seq},\"ts\":{ts},\"data\":\"");
    base64::engine::general_purpose::STANDARD.encode_string(data, out);
    out.push_str("\"}\n\n");
}

/// Appends a `gap` event (data: [`wire::Gap`]).
fn push_gap(out: &mut String, gap: wire::Gap) {
    let _ = write!(out, "event: gap\ndata: {{\"from\":{},\"to\":{}}}\n\n", gap.from, gap.to);
}

/// Appends the `unavailable` event (data: [`wire::Unavailable`]; JSON in one line, as serde_json
/// escapes every line break).
fn push_unavailable(out: &mut String, u: &wire::Unavailable) {
    out.push_str("event: unavailable\ndata: ");
    out.push_str(&serde_json::to_string(u).unwrap_or_default());
    out.push_str("\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use axum::response::sse::{Event, Sse};
    use http_body_util::BodyExt;

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

    /// One subscription reads a whole answer's worth a step (fast catch-up); many share
    /// SUBSCRIBE_READ_BYTES_TOTAL, down to SUBSCRIBE_READ_BYTES_MIN each.
    #[test]
    fn subscriptions_share_the_node_s_read_budget() {
        assert_eq!(read_bytes_max(0), READ_ANSWER_BYTES_MAX);
        assert_eq!(read_bytes_max(1), READ_ANSWER_BYTES_MAX);
        assert_eq!(read_bytes_max(1_000), SUBSCRIBE_READ_BYTES_TOTAL / 1_000);
        assert_eq!(read_bytes_max(1_000_000), SUBSCRIBE_READ_BYTES_MIN);
        assert!(read_bytes_max(1_000) * 1_000 <= SUBSCRIBE_READ_BYTES_TOTAL);
    }

    /// The events written by hand are, byte for byte, what axum's `Sse` wrote for one `Event` per
    /// batch, gap, `unavailable` and keep-alive (the wire format of docs/http-api.md).
    #[tokio::test]
    async fn hand_written_events_are_the_bytes_axum_sse_wrote() {
        let all: Vec<u8> = (0..=255u8).collect();
        let batches: [(u64, u64, &[u8]); 4] =
            [(1, 17, &all), (u64::MAX, u64::MAX, b""), (118, 1_795_982_672_385, b"hello"), (7, 0, b"\"\\\n\r")];
        let mut mine = String::new();
        let mut events = Vec::new();
        for (seq, ts, data) in batches {
            push_batch(&mut mine, seq, ts, data);
            let body = wire::BatchBody::encode(seq, ts, data);
            events.push(Event::default().event("batch").id(seq.to_string()).json_data(body).unwrap());
        }
        let gap = wire::Gap { from: 1, to: 117 };
        push_gap(&mut mine, gap);
        events.push(Event::default().event("gap").json_data(gap).unwrap());
        let gone = wire::Unavailable { message: "node 2 \"cut off\"\nfor 2013 ms: é".into() };
        push_unavailable(&mut mine, &gone);
        events.push(Event::default().event("unavailable").json_data(&gone).unwrap());
        mine.push_str(PING);
        events.push(Event::default().comment("ping"));

        let stream = futures::stream::iter(events.into_iter().map(Ok::<_, Infallible>));
        let body = Sse::new(stream).into_response().into_body().collect().await.unwrap().to_bytes();
        assert_eq!(std::str::from_utf8(&body).unwrap(), mine);
    }

    fn entry(index: u64, cmd: crate::raft::Command) -> crate::storage::Entry {
        use openraft::{CommittedLeaderId, EntryPayload};
        crate::storage::Entry {
            log_id: crate::raft::LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(cmd),
        }
    }

    /// The payload of batch `seq` in the test below: sizes 0 to 600 bytes, each byte its seq's.
    fn payload(seq: u64) -> Vec<u8> {
        vec![seq as u8; (seq % 7 * 100) as usize]
    }

    /// Applies publishes of `seqs` to stream "s" from log index `index` on.
    async fn publish(
        sm: &mut crate::storage::state_machine::StateMachine,
        index: u64,
        seqs: std::ops::RangeInclusive<u64>,
    ) {
        use openraft::storage::RaftStateMachine;
        let entries: Vec<crate::storage::Entry> = seqs
            .enumerate()
            .map(|(i, seq)| {
                let cmd = crate::raft::Command::Publish {
                    stream: "s".into(),
                    seq: None,
                    ts: 1000 + seq,
                    auto_create: false,
                    data: payload(seq).into(),
                };
                entry(index + i as u64, cmd)
            })
            .collect();
        sm.apply(entries).await.unwrap();
    }

    /// Reads "s" after `after` in chunks of at most `limit` batches and `bytes_max` bytes (past
    /// the first batch) until a read brings nothing, and parses the events as a client does.
    /// Returns the events and the cursor after them.
    fn read_all(store: &Store, mut after: u64, limit: usize, bytes_max: usize) -> (Vec<SseEvent>, u64) {
        use crate::client::sse::{SseEvent, SseParser};
        let mut all: Vec<SseEvent> = Vec::new();
        loop {
            let read = read_events(store, "s", after, limit, bytes_max).unwrap().unwrap();
            let mut parser = SseParser::default();
            parser.push(read.text.as_bytes());
            let mut chunk = Vec::new();
            while let Some(ev) = parser.next_event().unwrap() {
                chunk.push(ev);
            }
            let batches: Vec<&SseEvent> = chunk.iter().filter(|e| e.event == "batch").collect();
            assert!(batches.len() <= limit, "{} batch events in one read of at most {limit}", batches.len());
            let bytes: usize = batches.iter().map(|e| payload(e.id.parse().unwrap()).len()).sum();
            assert!(batches.len() <= 1 || bytes <= bytes_max, "{bytes} payload bytes past the first in one read");
            assert_eq!(read.gap, chunk.iter().any(|e| e.event == "gap"));
            if chunk.is_empty() {
                assert_eq!(read.after, after, "an empty read keeps the cursor");
                return (all, after);
            }
            assert!(read.after > after);
            after = read.after;
            all.extend(chunk);
        }
    }

    use crate::client::sse::SseEvent;

    /// Checks `events` are one gap `from..=to` (when given), then one batch event for each seq of
    /// `seqs`, in order, each with its own payload.
    fn assert_delivers(events: &[SseEvent], gap: Option<(u64, u64)>, seqs: std::ops::RangeInclusive<u64>) {
        let mut events = events.iter();
        if let Some((from, to)) = gap {
            let e = events.next().expect("a gap event");
            assert_eq!(
                (e.event.as_str(), e.data.as_str()),
                ("gap", format!("{{\"from\":{from},\"to\":{to}}}").as_str())
            );
        }
        let got: Vec<(u64, u64, u64, Vec<u8>)> = events
            .map(|e| {
                assert_eq!(e.event, "batch");
                let b: wire::BatchBody<'_> = serde_json::from_str(&e.data).unwrap();
                (e.id.parse().unwrap(), b.seq, b.ts, b.payload().unwrap())
            })
            .collect();
        let want: Vec<(u64, u64, u64, Vec<u8>)> = seqs.map(|seq| (seq, seq, 1000 + seq, payload(seq))).collect();
        assert_eq!(got, want, "every retained batch once, in seq order, with its id, ts and payload");
    }

    /// A subscription's reads, coalesced into one text per read, deliver a gap first and then
    /// every applied batch after the cursor exactly once and in order, whatever the read's
    /// limits; a read past the last applied batch brings nothing (the database holds applied
    /// entries only), and batches applied later follow on from the cursor.
    #[tokio::test]
    async fn reads_deliver_every_applied_batch_once_in_order() {
        use openraft::storage::RaftStateMachine;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut sm = crate::storage::state_machine::StateMachine::new(store.clone());
        let retention = crate::stream::Retention { max_batches: Some(40), ..Default::default() };
        let put = crate::raft::Command::PutStream { name: "s".into(), retention: Some(retention), ts: 1 };
        sm.apply(vec![entry(1, put)]).await.unwrap();
        publish(&mut sm, 2, 1..=50).await;
        assert!(read_events(&store, "missing", 0, 10, 1000).unwrap().is_none());

        // Retention kept 11..=50: a gap for 4..=10, then the batches, across many small reads.
        for (limit, bytes_max) in [(7, 1000), (1, usize::MAX), (1000, 1), (1000, usize::MAX), (3, 650)] {
            let (events, after) = read_all(&store, 3, limit, bytes_max);
            assert_delivers(&events, Some((4, 10)), 11..=50);
            assert_eq!(after, 50, "limit {limit}, bytes {bytes_max}");
        }
        // A cursor inside the retained batches: no gap.
        let (events, after) = read_all(&store, 30, 4, 900);
        assert_delivers(&events, None, 31..=50);
        assert_eq!(after, 50);

        // Nothing past the applied state; what is applied next follows on from the cursor.
        publish(&mut sm, 52, 51..=53).await;
        let (events, after) = read_all(&store, 50, 2, 1000);
        assert_delivers(&events, None, 51..=53);
        assert_eq!(after, 53);
        let (events, _) = read_all(&store, 0, 1000, usize::MAX);
        assert_delivers(&events, Some((1, 13)), 14..=53);
    }
}
