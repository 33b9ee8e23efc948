//! The socket seam: how a node accepts connections and dials its peers.
//!
//! Owns: the [`Dialer`] trait, its TCP implementation, and the HTTP client built on any dialer.
//! Production passes a `tokio::net::TcpListener` and [`TcpDialer`]; the simulation passes
//! turmoil's listener and a dialer over turmoil's TCP, so the same router, Raft transport and
//! forwarding code run in both. Must never: name a concrete socket type outside this module and
//! `main`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

/// A bidirectional byte stream to a peer.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A boxed future, as dialers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A dialled byte stream, and whether its TLS handshake chose HTTP/2 (ALPN `h2`, RFC 7301).
pub struct Dialed {
    /// The stream.
    pub io: Box<dyn Io>,
    /// ALPN chose `h2`: HTTP/2 must be spoken on it.
    pub http2: bool,
}

/// Opens byte streams to `host:port` addresses.
pub trait Dialer: Send + Sync + 'static {
    /// Connects to `addr` (`host:port`).
    ///
    /// Errors: the connection could not be established.
    fn dial(&self, addr: String) -> BoxFuture<io::Result<Box<dyn Io>>>;

    /// As [`Dialer::dial`], also saying whether the handshake chose HTTP/2; a dialer without
    /// ALPN (plain TCP) never does.
    ///
    /// Errors: as [`Dialer::dial`].
    fn dial_negotiated(&self, addr: String) -> BoxFuture<io::Result<Dialed>> {
        let dialing = self.dial(addr);
        Box::pin(async move { Ok(Dialed { io: dialing.await?, http2: false }) })
    }
}

/// Dials over the operating system's TCP, with Nagle off (Raft and publish answers are small).
pub struct TcpDialer;

impl Dialer for TcpDialer {
    fn dial(&self, addr: String) -> BoxFuture<io::Result<Box<dyn Io>>> {
        Box::pin(async move {
            let s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as Box<dyn Io>)
        })
    }
}

/// A hyper connector over any [`Dialer`].
#[derive(Clone)]
pub struct DialConnector(Arc<dyn Dialer>);

/// A connection made by [`DialConnector`], and whether ALPN chose HTTP/2 on it.
pub struct DialedIo(TokioIo<Box<dyn Io>>, bool);

impl Connection for DialedIo {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        if self.1 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl hyper::rt::Read for DialedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

/// Vectored writes are forwarded: without them hyper copies every request body into its own
/// write buffer before sending it (5 % of a leader's CPU in its append RPCs, 100 KiB entries).
impl hyper::rt::Write for DialedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.0)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tower::Service<Uri> for DialConnector {
    type Response = DialedIo;
    type Error = io::Error;
    type Future = BoxFuture<io::Result<DialedIo>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dialer = self.0.clone();
        Box::pin(async move {
            let auth = uri
                .authority()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
            let port = auth.port_u16().unwrap_or(80);
            let addr = format!("{}:{port}", auth.host());
            let limit = Duration::from_millis(crate::limits::DIAL_TIMEOUT_MS);
            let dialed = tokio::time::timeout(limit, dialer.dial_negotiated(addr.clone())).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {addr}: no answer within {}", crate::units::format_duration(limit)),
                )
            })??;
            Ok(DialedIo(TokioIo::new(dialed.io), dialed.http2))
        })
    }
}

/// The HTTP client nodes use for Raft RPCs and forwarding (HTTP/1.1: their dialer offers no
/// ALPN), and the Rust client for its requests, with pooled keep-alive connections: HTTP/1.1
/// (a connection per request in flight) or HTTP/2 (every request on one connection per node),
/// see [`HttpVersion`].
pub type HttpClient = hyper_util::client::legacy::Client<DialConnector, Full<Bytes>>;

/// The HTTP version a client speaks to nodes (every node serves both, [`crate::serve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpVersion {
    /// What the connection agrees on: over TLS the dialer offers `h2` and `http/1.1` by ALPN
    /// ([`crate::tls::offering`]) and the node picks HTTP/2; over plain TCP, HTTP/1.1 (a proxy
    /// between client and node may not know HTTP/2 without TLS).
    #[default]
    Auto,
    /// HTTP/1.1 only: one request at a time per connection, so as many connections as
    /// requests in flight.
    Http1,
    /// HTTP/2 only (RFC 9113): all requests to a node multiplexed on one connection. Over TLS
    /// the dialer offers only `h2`; over plain TCP it is spoken with prior knowledge ("h2c",
    /// RFC 9113 §3.3).
    Http2,
}

impl HttpVersion {
    /// The ALPN protocol ids (RFC 7301) a TLS dialer for this version offers, most wanted
    /// first; empty for none (the node then speaks HTTP/1.1).
    pub fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            HttpVersion::Auto => &[b"h2", b"http/1.1"],
            HttpVersion::Http1 => &[],
            HttpVersion::Http2 => &[b"h2"],
        }
    }
}

/// Builds an [`HttpClient`] over `dialer` that speaks HTTP/1.1, or HTTP/2 where the dialer's
/// TLS handshake chose it ([`HttpVersion::Auto`]). Idle pooled connections close after
/// [`crate::limits::HTTP_POOL_IDLE_MS`].
pub fn http_client(dialer: Arc<dyn Dialer>) -> HttpClient {
    http_client_speaking(dialer, HttpVersion::Auto)
}

/// Builds an [`HttpClient`] over `dialer` that speaks `version`. Idle pooled connections close
/// after [`crate::limits::HTTP_POOL_IDLE_MS`].
pub fn http_client_speaking(dialer: Arc<dyn Dialer>, version: HttpVersion) -> HttpClient {
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder.pool_timer(TokioTimer::new()).pool_idle_timeout(Duration::from_millis(crate::limits::HTTP_POOL_IDLE_MS));
    if version == HttpVersion::Http2 {
        builder.http2_only(true).timer(TokioTimer::new());
    }
    builder.build(DialConnector(dialer))
}

/// The innermost cause of a transport error, which says what happened (`Connection refused
/// (os error 111)`), where hyper's own text says only where (`client error (Connect)`).
pub fn cause_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// GETs `url` and reads its answer (at most `body_bytes_max` bytes), all within `timeout`.
/// For probes between nodes and health checks; the client API has its own retrying client.
///
/// Errors: a text saying what failed (bad URL, connection, timeout, body over the limit).
pub async fn get(
    http: &HttpClient,
    url: &str,
    timeout: Duration,
    body_bytes_max: usize,
) -> Result<(hyper::StatusCode, Bytes), String> {
    get_as(http, url, timeout, body_bytes_max, None).await
}

/// [`get`], sending `token` as `Authorization: Bearer` when given.
///
/// Errors: as [`get`].
pub async fn get_as(
    http: &HttpClient,
    url: &str,
    timeout: Duration,
    body_bytes_max: usize,
    token: Option<&str>,
) -> Result<(hyper::StatusCode, Bytes), String> {
    let mut req = hyper::Request::get(url);
    if let Some(t) = token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::new())).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let exchange = async {
        let resp = http.request(req).await.map_err(|e| format!("{url}: {}", cause_text(&e)))?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), body_bytes_max)
            .collect()
            .await
            .map_err(|e| format!("{url}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("{url}: no answer within {timeout:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dials a host that is down: the handshake never completes.
    struct Silent;

    impl Dialer for Silent {
        fn dial(&self, _addr: String) -> BoxFuture<io::Result<Box<dyn Io>>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dial_to_a_silent_host_fails_as_a_connection_error_in_time() {
        let client = http_client(Arc::new(Silent));
        let req = hyper::Request::get("http://down:7000/healthz").body(Full::new(Bytes::new())).unwrap();
        let t = tokio::time::Instant::now();
        let err = client.request(req).await.expect_err("nothing answers");
        assert!(err.is_connect(), "a connection error, so callers know nothing was sent: {err:?}");
        assert_eq!(t.elapsed(), Duration::from_millis(crate::limits::DIAL_TIMEOUT_MS));
    }
}
