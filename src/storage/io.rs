//! How storage runs blocking I/O: on tokio's blocking pool in production, inline under the
//! simulation (turmoil drives simulated time from one thread, and a blocking-pool task would
//! stall it).
//!
//! Owns: the choice, made once per process by [`set_inline_io`], [`SnapshotFile`], the
//! snapshot handle openraft streams through, and the simulated disk's latency
//! ([`owe_simulated_latency`]: inline work that a slow simulated disk says took time makes its
//! caller wait that long in simulated time). Must never: switch modes while a node runs.

use std::cell::Cell;
use std::future::Future;
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

/// Runs storage work on the calling task, for one of two callers:
///
/// - short work that only writes to the page cache and memory (no fsync, no directory scan),
///   for which a hand-off to tokio's blocking pool and back costs more than the work itself
///   (applying publishes this way took about 5 % off the three nodes' CPU per publish with one
///   batch per request);
/// - a log append and its fsync ([`super::log_store`]), which openraft 0.9's core awaits before
///   it handles anything else: the core gains nothing from the hand-off, and it cost each node
///   two thread wake-ups per entry (inline, c=64 publishes rose 4 % and the CPU per publish fell
///   6 %, c=1's by 10 %; `tokio::task::block_in_place`, which hands the worker's other tasks to
///   a new thread first, was 12 % worse than inline; BENCHMARKS.md). The runtime keeps at least
///   two workers (`limits::RUNTIME_WORKERS_MIN`), so a node whose disk stalls still answers.
///
/// Under the simulation it is [`blocking`] (inline too, and the simulated disk's latency is
/// still owed). It holds a runtime worker for as long as it runs.
pub async fn on_caller<F, R>(f: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    if inline() {
        return blocking(f).await;
    }
    f()
}

/// Runs blocking storage work that nobody waits for, such as removing the log segments a
/// purge emptied: on tokio's blocking pool, or inline under the simulation (where it stays
/// deterministic, and the simulated latency it owes is owed by the [`blocking`] call it runs
/// within, as when the work was part of that call) and outside any tokio runtime (an offline
/// tool). `f` reports its own failures: it has no caller to return them to.
pub fn behind<F>(f: F)
where
    F: FnOnce() + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if !inline() => drop(runtime.spawn_blocking(f)),
        _ => f(),
    }
}

/// A snapshot file as openraft reads and writes it (`SnapshotData`): a tokio file in
/// production, a plain file used synchronously under the simulation, or one not made yet.
#[derive(Debug)]
pub enum SnapshotFile {
    /// Asynchronous, through tokio's blocking pool.
    Tokio(tokio::fs::File),
    /// Synchronous, inline; the second field is the position after the last seek.
    Inline(std::fs::File, u64),
    /// Made by the first read or seek ([`SnapshotFile::lazy`]), then one of the others.
    Lazy(Lazy),
}

/// How a lazy [`SnapshotFile`] is made, and the seek asked of it before it was.
pub struct Lazy {
    make: Option<MakeFile>,
    running: Option<tokio::task::JoinHandle<io::Result<std::fs::File>>>,
    seek: Option<SeekFrom>,
}

/// Makes the file of a lazy [`SnapshotFile`], positioned at its start (blocking work).
pub type MakeFile = Box<dyn FnOnce() -> io::Result<std::fs::File> + Send>;

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy").field("made", &self.make.is_none()).field("seek", &self.seek).finish()
    }
}

impl SnapshotFile {
    /// A file that `make` makes on the first read or seek (on tokio's blocking pool, or inline
    /// under the simulation), not before: openraft asks for the current snapshot at start-up and
    /// whenever it may send it, and reads it only to send it ([`super::snapshot`] makes a whole
    /// snapshot from the manifest it keeps). Writing to it before it is read is an error.
    pub fn lazy(make: MakeFile) -> Self {
        SnapshotFile::Lazy(Lazy { make: Some(make), running: None, seek: None })
    }

    /// Makes a lazy file, applying the seek asked before; `Ready(Ok(position))` once it is a
    /// file (the position after that seek, or 0).
    fn poll_made(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let SnapshotFile::Lazy(lazy) = self else { return Poll::Ready(Ok(0)) };
        let made = if inline() {
            match lazy.make.take() {
                Some(make) => make(),
                None => Err(io::Error::other("making this snapshot failed before")),
            }
        } else {
            if lazy.running.is_none() {
                match lazy.make.take() {
                    Some(make) => lazy.running = Some(tokio::task::spawn_blocking(make)),
                    None => return Poll::Ready(Err(io::Error::other("making this snapshot failed before"))),
                }
            }
            let Some(running) = lazy.running.as_mut() else {
                return Poll::Ready(Err(io::Error::other("making this snapshot failed before")));
            };
            match Pin::new(running).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(made)) => {
                    lazy.running = None;
                    made
                }
                Poll::Ready(Err(e)) => {
                    lazy.running = None;
                    Err(io::Error::other(e))
                }
            }
        };
        let seek = lazy.seek.take();
        let mut file = made?;
        let position = match seek {
            Some(to) => file.seek(to)?,
            None => 0,
        };
        *self = match SnapshotFile::from_std(file) {
            SnapshotFile::Inline(f, _) => SnapshotFile::Inline(f, position),
            other => other,
        };
        Poll::Ready(Ok(position))
    }

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
    pub async fn into_synced_std(mut self) -> io::Result<std::fs::File> {
        std::future::poll_fn(|cx| self.poll_made(cx)).await?;
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
            SnapshotFile::Lazy(_) => return Err(io::Error::other("a snapshot not made")),
        };
        f.seek(SeekFrom::Start(0))?;
        Ok(f)
    }
}

use tokio::io::AsyncWriteExt;

impl AsyncRead for SnapshotFile {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.poll_made(cx)) {
            return Poll::Ready(Err(e));
        }
        match this {
            SnapshotFile::Lazy(_) => Poll::Ready(Err(io::Error::other("a snapshot not made"))),
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
            SnapshotFile::Lazy(_) => Poll::Ready(Err(io::Error::other("a snapshot made from a manifest is read-only"))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_flush(cx),
            SnapshotFile::Inline(f, _) => Poll::Ready(f.flush()),
            SnapshotFile::Lazy(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_shutdown(cx),
            SnapshotFile::Inline(f, _) => Poll::Ready(f.flush()),
            SnapshotFile::Lazy(_) => Poll::Ready(Ok(())),
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
            // Applied once the file is made (`poll_complete`).
            SnapshotFile::Lazy(lazy) => {
                lazy.seek = Some(position);
                Ok(())
            }
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        if let SnapshotFile::Lazy(_) = this {
            return this.poll_made(cx);
        }
        match this {
            SnapshotFile::Tokio(f) => Pin::new(f).poll_complete(cx),
            SnapshotFile::Inline(_, pos) => Poll::Ready(Ok(*pos)),
            SnapshotFile::Lazy(_) => Poll::Ready(Err(io::Error::other("a snapshot not made"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    use super::SnapshotFile;

    /// Work on the caller runs on the task that asks for it; blocking work is handed to the pool, on
    /// another thread (outside the simulation, which runs both inline).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_on_the_caller_runs_on_the_calling_thread_and_blocking_work_on_the_pool() {
        let here = std::thread::current().id();
        assert_eq!(super::on_caller(|| std::thread::current().id()).await, here);
        assert_ne!(super::blocking(|| std::thread::current().id()).await, here);
    }

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

    /// A lazy file is made by its first seek or read, not before, and reads as the file made.
    #[tokio::test]
    async fn a_lazy_file_is_made_by_its_first_seek_or_read() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let dir = tempfile::tempdir().unwrap();
        let made = Arc::new(AtomicUsize::new(0));
        let lazy = |name: &'static str| {
            let (path, made) = (dir.path().join(name), made.clone());
            SnapshotFile::lazy(Box::new(move || {
                made.fetch_add(1, Ordering::SeqCst);
                std::fs::write(&path, b"snapshot bytes")?;
                std::fs::File::open(&path)
            }))
        };
        let mut a = lazy("a");
        tokio::task::yield_now().await;
        assert_eq!(made.load(Ordering::SeqCst), 0, "not made before it is read");
        assert_eq!(a.seek(std::io::SeekFrom::Start(9)).await.unwrap(), 9);
        let mut tail = String::new();
        a.read_to_string(&mut tail).await.unwrap();
        assert_eq!((tail.as_str(), made.load(Ordering::SeqCst)), ("bytes", 1));
        let mut b = lazy("b");
        let mut all = String::new();
        b.read_to_string(&mut all).await.unwrap();
        assert_eq!((all.as_str(), made.load(Ordering::SeqCst)), ("snapshot bytes", 2));
        // A failure to make it is the read's error, and every later one's.
        let mut c = SnapshotFile::lazy(Box::new(|| Err(std::io::Error::other("no payloads"))));
        assert!(c.read_to_string(&mut all).await.unwrap_err().to_string().contains("no payloads"));
        assert!(c.read_to_string(&mut all).await.is_err());
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
