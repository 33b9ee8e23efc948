//! Serving connections: each connection a listener hands over is served by hyper's HTTP/1.1
//! server with a deadline for every request head, and all of them end gracefully when the node
//! stops.
//!
//! Owns: the accept loop, each connection's hyper settings (`header_read_timeout` on tokio's
//! timer), telling the router who connected (axum's `ConnectInfo<Peer>`), counting connections
//! cut at the head deadline, and graceful shutdown. Must never: read or answer a request itself
//! (the router does; the body deadline is the router's, [`crate::api`]), or keep a connection
//! that has waited longer than its deadline for a request head.
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
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
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
        let (mut stop, open) = (stop_rx.clone(), open_rx.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            match ended {
                Err(e) if e.is_timeout() => {
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
