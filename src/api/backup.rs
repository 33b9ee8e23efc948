//! `GET /v1/backup`: streams a backup of this node's applied state ([`crate::storage::backup`]).
//!
//! Owns: turning the blocking backup writer into a streamed response. Must never: hold the
//! backup in memory (it goes out in chunks of [`crate::limits::BACKUP_CHUNK_BYTES`] through a
//! bounded channel, so a slow reader slows the writer) or serve a node's state before it has
//! applied what it knows is committed (a node cut off from its leader answers `503`).

use std::io::Write;

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::AppState;
use crate::error::ApiError;
use crate::limits::BACKUP_CHUNK_BYTES;

/// The media type of a backup file.
pub const BACKUP_CONTENT_TYPE: &str = "application/vnd.runnev.backup";

/// A writer that sends what it is given, in chunks, to an async receiver; it fails once the
/// receiver is gone (the client went away), which ends the backup.
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the backup's reader went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `GET /v1/backup`: `200` with the backup file as the body (`application/vnd.runnev.backup`,
/// chunked). A failure after the first byte cuts the body short, which the client sees as a
/// truncated file and refuses.
///
/// Errors: `503 not_ready` when this node has not heard from a leader lately (its state may be
/// behind what was acknowledged).
#[utoipa::path(
    get,
    path = "/v1/backup",
    operation_id = "backup",
    summary = "A backup of this node's applied state",
    tag = "backup",
    responses(
        (status = 200, description = "The backup file of this node's applied state (docs/contract.md, \"Backup and restore\"), streamed", content_type = "application/vnd.runnev.backup", body = super::openapi::BackupFile),
        super::openapi::AuthErrors,
        (status = 503, description = "`not_ready`: this node has not heard from a leader for 2 s", body = crate::wire::ErrorBody),
    )
)]
pub(super) async fn backup(State(s): State<AppState>) -> Result<Response, ApiError> {
    if let Some(silence) = s.contact.cut_off(&s.raft, s.node_id) {
        return Err(ApiError::NotReady(format!(
            "node {} {silence}: it cannot tell whether it is behind; take the backup from another node",
            s.node_id
        )));
    }
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let store = s.store.clone();
    tokio::task::spawn_blocking(move || {
        let fail = tx.clone();
        let mut w = std::io::BufWriter::with_capacity(BACKUP_CHUNK_BYTES, ChannelWriter { tx });
        let written =
            crate::storage::backup::write(&store, &mut w).and_then(|info| w.flush().map(|_| info).map_err(Into::into));
        match written {
            Ok(info) => {
                tracing::info!(log_index = ?info.log_index, streams = info.streams, batches = info.batches, bytes = info.bytes, "backup sent")
            }
            Err(e) => {
                tracing::warn!(error = %e, "backup ended early");
                let _ = fail.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Ok(([(header::CONTENT_TYPE, BACKUP_CONTENT_TYPE)], Body::from_stream(body)).into_response())
}
