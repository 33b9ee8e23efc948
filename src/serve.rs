//! Serving connections: each connection a listener hands over is served by hyper's HTTP/1.1 or
//! HTTP/2 server, told apart by its first bytes, with a deadline for every request head, and all
//! of them end gracefully when the node stops.
//!
//! Owns: the accept loop, telling HTTP/2 (its connection preface, over TLS or plain TCP) from
//! HTTP/1.1, each connection's hyper settings (`header_read_timeout` on tokio's timer, the
//! HTTP/2 stream bound and pings), telling the router who connected (axum's
//! `ConnectInfo<Peer>`), counting connections cut at the head deadline, and graceful shutdown.
//! Must never: read or answer a request itself (the router does; the body deadline is the
//! router's, [`crate::api`]), or keep a connection that has waited longer than its deadline for
//! a request head.
//!
//! HTTP/2 lets a client keep many requests in flight on one connection (64 publishes: one
//! connection, not 64). A TLS client that offers `h2` by ALPN (RFC 7301) gets it; a plain one
//! speaks it with prior knowledge (RFC 9113 §3.3). Either way the client's first bytes are the
//! preface of RFC 9113 §3.4, so one check serves both, and a client that sends nothing is cut at
//! the header read timeout before any protocol is chosen.
//!
//! Why not `axum::serve`: it sets no timer on hyper's connection builder, so hyper's header read
//! timeout never runs there, and a client that sends its head one byte a second (the
//! "slowloris" attack) holds its connection slot for as long as it likes. hyper starts the
//! deadline whenever a connection waits for a request head: after the connection is handed over
//! (after its TLS handshake, which has its own deadline, [`crate::tls::HANDSHAKE_TIMEOUT_MS`])
//! and after each answer on a kept-alive connection. So a connection idle between requests is
//! closed at the same deadline; an answer being streamed (a subscription, a long poll) is not a
//! wait for a head and is never cut.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tower::ServiceExt;

use crate::tls::Peer;

/// Serves `router` on every connection `listener` accepts until `shutdown` resolves; then stops
/// accepting, lets each connection finish the request it is serving (hyper's graceful shutdown:
/// kept-alive connections close after their current answer) and returns once all have closed.
///
/// `header_read_timeout` bounds every wait for a request head (see the module doc); a
/// connection cut by it counts in `runnev_read_timeouts_total{kind="header"}`. Each request
/// carries `ConnectInfo<Peer>`: who connected, as the listener says.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) where
    L: Listener<Addr = Peer>,
{
    // Dropping `stop_tx` tells every connection to shut down gracefully; each connection holds
    // a clone of `open_rx`, so `open_tx.closed()` resolves once all of them have ended.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let mut req = req.map(axum::body::Body::new);
            req.extensions_mut().insert(ConnectInfo(peer.clone()));
            let router = router.clone();
            async move {
                let answered: Result<axum::response::Response, Infallible> = router.oneshot(req).await;
                answered
            }
        });
        let (stop, open) = (stop_rx.clone(), open_rx.clone());
        tokio::spawn(async move {
            let ended = match sniff_version(io, header_read_timeout).await {
                Ok((Version::Http1, io)) => {
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
                    let conn = builder.serve_connection(TokioIo::new(io), service);
                    until_stopped(conn, stop, |c| c.graceful_shutdown()).await
                }
                Ok((Version::Http2, io)) => {
                    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    builder
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(HTTP2_STREAMS_MAX)
                        .keep_alive_interval(Duration::from_millis(HTTP2_PING_MS))
                        .keep_alive_timeout(header_read_timeout);
                    let conn = builder.serve_connection(TokioIo::new(io), service);
                    until_stopped(conn, stop, |c| c.graceful_shutdown()).await
                }
                Err(e) => Err(e),
            };
            match ended {
                Err(Ended::Timeout) => {
                    metrics::counter!("runnev_read_timeouts_total", "kind" => "header").increment(1);
                }
                Err(Ended::Hyper(e)) if e.is_timeout() => {
                    metrics::counter!("runnev_read_timeouts_total", "kind" => "header").increment(1);
                }
                Err(e) => tracing::trace!(error = %e, "connection ended"),
                Ok(()) => {}
            }
            drop(open);
        });
    }
    drop(listener);
    drop(stop_tx);
    drop(open_rx);
    open_tx.closed().await;
}

/// Requests served at once on one HTTP/2 connection (its `SETTINGS_MAX_CONCURRENT_STREAMS`,
/// RFC 9113 §6.5.2): a client with more in flight queues them on its side. Every one of them is
/// still bounded by the node's proposer queue (`--max-queued-proposals`).
pub const HTTP2_STREAMS_MAX: u32 = 256;

/// How often an HTTP/2 connection with nothing to read is pinged (RFC 9113 §6.7), in ms; a peer
/// that does not answer within the header read timeout is cut, as an idle HTTP/1.1 connection is.
pub const HTTP2_PING_MS: u64 = 10_000;

/// The HTTP/2 connection preface every HTTP/2 client sends first, over TLS (after ALPN chose
/// `h2`) as over plain TCP (prior knowledge, "h2c"): RFC 9113 §3.4.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    Http1,
    Http2,
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
enum Ended {
    /// Its first bytes did not arrive within the header read timeout.
    #[error("no request within the header read timeout")]
    Timeout,
    #[error("reading the first bytes: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
}

/// Reads a connection's first bytes (within `timeout`) until they either are the HTTP/2
/// preface or differ from it; answers which, with the connection that hands those bytes over
/// again. A client that sends nothing is cut at `timeout`, as hyper cuts a slow request head.
///
/// Errors: [`Ended::Timeout`]; [`Ended::Io`] if reading fails or the connection closes first.
async fn sniff_version<I: AsyncRead + Unpin>(mut io: I, timeout: Duration) -> Result<(Version, Rewound<I>), Ended> {
    let mut head = Vec::with_capacity(HTTP2_PREFACE.len());
    let read = async {
        while head.len() < HTTP2_PREFACE.len() && HTTP2_PREFACE.starts_with(&head) {
            let mut buf = [0u8; 24];
            let want = HTTP2_PREFACE.len() - head.len();
            let n = io.read(&mut buf[..want]).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    tokio::time::timeout(timeout, read).await.map_err(|_| Ended::Timeout)??;
    let version = if head == HTTP2_PREFACE { Version::Http2 } else { Version::Http1 };
    Ok((version, Rewound { head: bytes::Bytes::from(head), io }))
}

/// A connection whose first bytes were read already: they are read again first.
struct Rewound<I> {
    head: bytes::Bytes,
    io: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Rewound<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.head.is_empty() {
            let n = this.head.len().min(buf.remaining());
            buf.put_slice(&this.head.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Rewound<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Drives `conn` to its end; once the node stops (`stop` changes or is dropped), asks it to
/// end gracefully with `graceful` (finish the requests in flight, take no new ones) and waits.
async fn until_stopped<C>(
    conn: C,
    mut stop: tokio::sync::watch::Receiver<()>,
    graceful: impl FnOnce(Pin<&mut C>),
) -> Result<(), Ended>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        _ = stop.changed() => {
            graceful(conn.as_mut());
            conn.await
        }
    };
    ended.map_err(Ended::from)
}
