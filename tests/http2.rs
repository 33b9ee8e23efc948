//! HTTP/2 to nodes (RFC 9113): a client that speaks it — over TLS by ALPN `h2`, over plain TCP
//! with prior knowledge — sends all its requests in flight to a node on one connection, and a
//! subscription streams over it; HTTP/1.1 clients keep working beside it, one connection per
//! request in flight. The witness is the node's `runnev_connections` gauge.

mod common;

use std::time::Duration;

use common::*;
use futures::StreamExt;
use runnev::client::{Client, Delivery};
use runnev::net::HttpVersion;

const IN_FLIGHT: usize = 64;

/// A client of node 1 speaking `version`, secured as the cluster is.
fn client_speaking(c: &Cluster, version: HttpVersion) -> Client {
    let urls = vec![c.url(1)];
    let (ca, token) = match security().filter(|_| c.secure()) {
        Some(s) => (Some(s.ca.as_path()), Some(runnev::auth::Token::parse(&s.admin).expect("the admin token"))),
        None => (None, None),
    };
    Client::secure_speaking(&urls, ca, token, version).expect("a client")
}

/// Publishes [`IN_FLIGHT`] batches at once on `client`; answers the node's open connections
/// while they were all pooled (just after the last acknowledgement), and the seqs.
async fn burst(c: &Cluster, client: &Client, stream: &str) -> (f64, Vec<u64>) {
    let acks = futures::future::join_all((0..IN_FLIGHT).map(|i| client.publish(stream, None, format!("b{i}")))).await;
    let open = c.metric(1, "runnev_connections", None).await.expect("metrics").expect("runnev_connections");
    let mut seqs: Vec<u64> = acks.into_iter().map(|a| a.expect("publish acknowledged").seq).collect();
    seqs.sort_unstable();
    (open, seqs)
}

/// `auto_is_http2`: whether the default client ([`HttpVersion::Auto`]) should get HTTP/2 here.
async fn requests_in_flight_share_one_connection(c: &Cluster, auto_is_http2: bool) {
    create_stream(&c.http, &c.url(1), "h2").await;
    let before = c.metric(1, "runnev_connections", None).await.expect("metrics").expect("runnev_connections");

    let h2 = client_speaking(c, HttpVersion::Http2);
    let (with_h2, seqs) = burst(c, &h2, "h2").await;
    assert_eq!(seqs, (1..=IN_FLIGHT as u64).collect::<Vec<_>>(), "every publish over HTTP/2 got its own seq");
    // One connection for the client's 64 requests; the gauge counts every connection, so one
    // more is allowed for the harness's own scrape, should it need a new one.
    assert!(
        with_h2 - before <= 2.0,
        "{IN_FLIGHT} publishes in flight over HTTP/2 opened {} connections (before {before}, after {with_h2}); expected one",
        with_h2 - before
    );

    // The same burst over HTTP/1.1 opens a connection per request in flight: the gauge sees them.
    let h1 = client_speaking(c, HttpVersion::Http1);
    let (with_h1, seqs) = burst(c, &h1, "h2").await;
    assert_eq!(seqs.first(), Some(&(IN_FLIGHT as u64 + 1)));
    assert!(
        with_h1 - with_h2 >= (IN_FLIGHT / 4) as f64,
        "{IN_FLIGHT} publishes in flight over HTTP/1.1 opened only {} connections",
        with_h1 - with_h2
    );

    // The default client: HTTP/2 over TLS (ALPN offers both, the node picks `h2`), HTTP/1.1 plain.
    let auto = client_speaking(c, HttpVersion::Auto);
    let (with_auto, seqs) = burst(c, &auto, "h2").await;
    assert_eq!(seqs.first(), Some(&(2 * IN_FLIGHT as u64 + 1)));
    let opened = with_auto - with_h1;
    if auto_is_http2 {
        // Requests that start together before the first handshake has said `h2` may each open
        // a connection (only `Http2` knows in advance); still far fewer than one per request.
        assert!(
            opened < (IN_FLIGHT / 4) as f64,
            "the default client over TLS opened {opened} connections for {IN_FLIGHT} publishes"
        );
    } else {
        assert!(opened >= (IN_FLIGHT / 4) as f64, "the default plain client opened only {opened} connections");
    }

    // A subscription streams over HTTP/2 from the start of the stream.
    let mut sub = h2.subscribe("h2", 0);
    for want in 1..=3u64 {
        match tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("an event").expect("item") {
            Ok(Delivery::Batch(b)) => assert_eq!(b.seq, want),
            other => panic!("expected batch {want}, got {other:?}"),
        }
    }
}

/// Over TLS: the client offers `h2` by ALPN and the node takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_requests_in_flight_share_one_http2_connection() {
    let c = Cluster::start(1, &[]).await;
    if !c.secure() {
        skipped("http2::over_tls_requests_in_flight_share_one_http2_connection: the harness runs plain (RUNNEV_TEST_INSECURE=1)");
        return;
    }
    requests_in_flight_share_one_connection(&c, true).await;
}

/// Over plain TCP: the client speaks HTTP/2 with prior knowledge ("h2c") and the node tells it
/// from HTTP/1.1 by the connection preface.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_requests_in_flight_share_one_http2_connection() {
    let c = Cluster::start_insecure(1, &[]).await;
    requests_in_flight_share_one_connection(&c, false).await;
}
