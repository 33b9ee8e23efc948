//! How storage runs blocking I/O: on tokio's blocking pool in production, inline under the
//! simulation (turmoil drives simulated time from one thread, and a blocking-pool task would
//! stall it).
//!
//! Owns: the choice, made once per process by [`set_inline_io`], [`SnapshotFile`], the
//! snapshot handle openraft streams through, and the simulated disk's latency
//! ([`owe_simulated_latency`]: inline work that a slow simulated disk says took time makes its
//! caller wait that long in simulated time). Must never: switch modes while a node runs.

use std::cell::Cell;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

static INLINE_IO: AtomicBool = AtomicBool::new(false);

/// Makes every storage operation in this process run inline on the calling task. For the
/// simulation only; call before starting any node.
pub fn set_inline_io(inline: bool) {
    INLINE_IO.store(inline, Ordering::SeqCst);
}

fn inline() -> bool {
    INLINE_IO.load(Ordering::Relaxed)
}

thread_local! {
    /// Latency owed by the inline storage work running now on this thread, in ms.
    static OWED_MS: Cell<u64> = const { Cell::new(0) };
}

/// Says that the storage operation running inline now (under [`set_inline_io`]) took `ms`
/// milliseconds: [`blocking`] makes its caller wait that long (in tokio time, which the
/// simulation simulates) before it returns. A simulated slow disk calls it from its `fsync`;
/// without inline I/O it does nothing. Inline work runs on the caller's thread, one operation
/// at a time, so a thread-local is exact.
pub fn owe_simulated_latency(ms: u64) {
    if inline() {
        OWED_MS.with(|o| o.set(o.get().saturating_add(ms)));
    }
}

/// Runs blocking storage work off the async executor (redb and std::fs are synchronous), or
/// inline under the simulation.
pub async fn blocking<F, R>(f: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if inline() {
        OWED_MS.with(|o| o.set(0));
        let r = f();
        let owed = OWED_MS.with(|o| o.replace(0));
        if owed > 0 {
            tokio::time::sleep(Duration::from_millis(owed)).await;
        }
        return r;
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// A snapshot file as openraft reads and writes it (`SnapshotData`): a tokio file in
/// production, a plain file used synchronously under the simulation.
#[derive(Debug)]
pub enum SnapshotFile {
    /// Asynchronous, through tokio's blocking pool.
    Tokio(tokio::fs::File),
    /// Synchronous, inline; the second field is the position after the last seek.
    Inline(std::fs::File, u64),
}

impl SnapshotFile {
    /// Wraps an open file in the mode of this process.
    pub fn from_std(f: std::fs::File) -> Self {
        if inline() {
            SnapshotFile::Inline(f, 0)
        } else {
            SnapshotFile::Tokio(tokio::fs::File::from_std(f))
        }
    }

    /// Flushes written data to disk (fsync) and returns the plain file, positioned at its start.
    ///
    /// Errors: the fsync or the seek failed.
    pub async fn into_synced_std(self) -> io::Result<std::fs::File> {
        let mut f = match self {
            SnapshotFile::Tokio(mut t) => {
                t.flush().await?;
                t.sync_all().await?;
                t.into_std().await
            }
            SnapshotFile::Inline(f, _) => {
                f.sync_all()?;
                f
            }
        };
        f.seek(SeekFrom::Start(0))?;
        Ok(f)
    }
}

use tokio::io::AsyncWriteExt;

impl AsyncRead for SnapshotFile {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_read(cx, buf),
            SnapshotFile::Inline(f, _) => {
                let n = f.read(buf.initialize_unfilled())?;
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_write(cx, buf),
            SnapshotFile::Inline(f, _) => Poll::Ready(f.write(buf)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_flush(cx),
            SnapshotFile::Inline(f, _) => Poll::Ready(f.flush()),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_shutdown(cx),
            SnapshotFile::Inline(f, _) => Poll::Ready(f.flush()),
        }
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).start_seek(position),
            SnapshotFile::Inline(f, pos) => {
                *pos = f.seek(position)?;
                Ok(())
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_complete(cx),
            SnapshotFile::Inline(_, pos) => Poll::Ready(Ok(*pos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    use super::SnapshotFile;

    async fn round_trip(mut f: SnapshotFile) {
        f.write_all(b"snapshot bytes").await.unwrap();
        f.seek(std::io::SeekFrom::Start(9)).await.unwrap();
        let mut tail = String::new();
        f.read_to_string(&mut tail).await.unwrap();
        assert_eq!(tail, "bytes");
        let mut std = f.into_synced_std().await.unwrap();
        let mut all = String::new();
        std::io::Read::read_to_string(&mut std, &mut all).unwrap();
        assert_eq!(all, "snapshot bytes");
    }

    #[tokio::test]
    async fn both_modes_read_write_and_seek() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        round_trip(SnapshotFile::Tokio(tokio::fs::File::from_std(open("a")))).await;
        round_trip(SnapshotFile::Inline(open("b"), 0)).await;
    }
}
