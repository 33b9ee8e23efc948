//! Reading a stream from a cursor far behind its end, one read ahead.
//!
//! A consumer catching up asks for the batches after its cursor, `limit` at a time (SPEC §3).
//! Read one after the other, each read waits for the node to gather and encode its batches,
//! then for the client to parse and decode them: the node idles while the client decodes, and
//! the client while the node reads. [`CatchUp`] asks for the next read as soon as it knows where
//! that read starts (the answer's `next_after`: in a binary answer once its records are split,
//! which copies nothing; in a JSON one once the JSON is parsed, before the payloads' base64 is
//! decoded), so the node answers it while this one is handed out. The
//! answers, their order and the cursor are exactly those of calling [`Client::read`] with each
//! answer's `next_after`; only the timing differs. At most one read is ahead, and only after an
//! answer that carried batches or a gap (the stream may hold more); after an empty answer (the
//! consumer has caught up) the next call reads afresh.
//!
//! Owns: the read-ahead of one consumer. Must never: hand out an answer out of order, skip one,
//! or keep a read in flight once dropped (the task is aborted).

use tokio::task::JoinHandle;

use super::{Client, ClientError, RawRead, ReadAnswer};

/// A read in flight: the task fetching the answer for the cursor `after`.
struct Ahead {
    after: u64,
    task: JoinHandle<Result<RawRead, ClientError>>,
}

/// A stream read from a cursor with one read ahead ([`Client::catch_up`]).
pub struct CatchUp {
    client: Client,
    stream: String,
    /// The cursor the next answer starts after (a seq).
    after: u64,
    /// Batches per read.
    limit: usize,
    ahead: Option<Ahead>,
}

impl CatchUp {
    pub(super) fn new(client: Client, stream: String, after: u64, limit: usize) -> CatchUp {
        CatchUp { client, stream, after, limit, ahead: None }
    }

    /// The cursor the next answer starts after: the `next_after` of the last answer handed out
    /// (the `after` given at the start before any).
    pub fn cursor(&self) -> u64 {
        self.after
    }

    /// The answer for the batches after [`CatchUp::cursor`] (up to `limit`, no wait), as
    /// [`Client::read`] would give it; the cursor then moves to its `next_after`. An answer
    /// with no batches and no gap means the consumer has caught up with the node.
    ///
    /// Errors: as [`Client::read`]; a failed read is not retried beyond what the client's
    /// policy does, and the cursor stays where it was (call again to retry).
    pub async fn next(&mut self) -> Result<ReadAnswer, ClientError> {
        let fetched = match self.ahead.take() {
            Some(ahead) if ahead.after == self.after => match ahead.task.await {
                Ok(r) => r,
                Err(e) => Err(ClientError::Config(format!("the read ahead of {} ended: {e}", self.stream))),
            },
            stale => {
                if let Some(a) = stale {
                    a.task.abort();
                }
                self.client.read_raw(&self.stream, self.after, self.limit, 0, None).await
            }
        };
        let raw = fetched?;
        let parsed = Client::parse_read(&raw, self.after)?;
        debug_assert!(parsed.next_after() >= self.after, "a read moved the cursor back");
        if parsed.carries_any() {
            let (client, stream, after, limit) =
                (self.client.clone(), self.stream.clone(), parsed.next_after(), self.limit);
            let task = tokio::spawn(async move { client.read_raw(&stream, after, limit, 0, None).await });
            self.ahead = Some(Ahead { after, task });
        }
        let answer = Client::decode_read(&raw.node, parsed)?;
        self.after = answer.next_after;
        Ok(answer)
    }
}

impl Drop for CatchUp {
    fn drop(&mut self) {
        if let Some(a) = self.ahead.take() {
            a.task.abort();
        }
    }
}
