//! Transport security: the cluster's CA, the identities certificates name, the TLS listener a
//! node serves on and the TLS dialer it (and the client tools) reach nodes with.
//!
//! Owns: loading PEM files into rustls configurations, reading which node or client a verified
//! certificate names, the accept loop that runs TLS handshakes off the serving loop, the
//! listener that tells the router who connected and bounds the connections held open
//! ([`PeerListener`]), and generating the CA, node and client certificates of `runnev cert …`
//! (rcgen). Must never:
//! parse certificates or do cryptography by hand (rustls verifies chains, x509-parser reads the
//! names, rcgen writes certificates), or hand a connection to the router before its handshake
//! completed and its certificate, if any, verified against the cluster's CA.
//!
//! Identity: a node's certificate carries the URI `runnev://node/<id>` among its subject
//! alternative names, a client's `runnev://client/<name>`; both also carry the DNS names and IP
//! addresses they are reached at, so one certificate serves as server and as client certificate
//! (mutual TLS, RFC 8446 §4.4.2). The idea is CockroachDB's (`cockroach cert create-ca /
//! create-node / create-client`) and etcd's peer certificates.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};

use crate::net::{BoxFuture, Dialed, Dialer, Io};
use crate::raft::NodeId;

/// Prefix of the URI naming a node in its certificate; the node id follows in decimal.
pub const NODE_URI_PREFIX: &str = "runnev://node/";
/// Prefix of the URI naming a client in its certificate; the client's name follows.
pub const CLIENT_URI_PREFIX: &str = "runnev://client/";
/// Longest a TLS handshake may take before its connection is dropped, in ms (a client that
/// stalls its handshake does not hold a slot for longer).
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Most TLS handshakes in progress at once on one node; past it, new connections wait in the
/// kernel's accept queue.
pub const HANDSHAKES_MAX: usize = 256;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{}: {what}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// A certificate that does not fit the node given it (another node's, another CA's, a
    /// client's; [`check_node_files`]).
    #[error("{}: {what}", path.display())]
    Mismatch {
        /// The certificate file.
        path: PathBuf,
        /// What does not fit, and what to do.
        what: String,
    },
    /// rustls refused the configuration (a key that does not match its certificate, say).
    #[error("tls configuration: {0}")]
    Config(String),
    /// rcgen could not make a certificate.
    #[error("making a certificate: {0}")]
    Generate(String),
}

/// The files of a node's TLS: the cluster's CA and this node's certificate and key (`--tls-ca`,
/// `--tls-cert`, `--tls-key`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The cluster CA's certificate (PEM).
    pub ca: PathBuf,
    /// This node's certificate chain (PEM), issued by the CA.
    pub cert: PathBuf,
    /// This node's private key (PEM, PKCS#8 or SEC1 or PKCS#1).
    pub key: PathBuf,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in a PEM file.
///
/// Errors: the file cannot be read, or holds no certificate.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |what: String| TlsError::Pem { path: path.to_path_buf(), what };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(format!("reading: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(pem("holds no certificate".into()));
    }
    Ok(certs)
}

/// The private key in a PEM file.
///
/// Errors: the file cannot be read, or holds no private key.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Pem { path: path.to_path_buf(), what: format!("{e}") })
}

/// A root store holding the CA certificates of `ca`.
///
/// Errors: the file cannot be read or a certificate in it is not usable as a trust anchor.
pub fn roots(ca: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in load_certs(ca)? {
        store.add(cert).map_err(|e| TlsError::Pem { path: ca.to_path_buf(), what: format!("not a CA: {e}") })?;
    }
    Ok(Arc::new(store))
}

/// Checks, before node `id` serves, that its files fit it: the certificate chains to the CA of
/// `files.ca` and is valid now (as its peers will verify it when it dials them), and it names
/// node `id` (`runnev://node/<id>`, [`identity_of`]). Without this a node started with another
/// node's certificate, another cluster's CA or a client certificate ran, refused by every peer,
/// and said only that it was waiting for a majority.
///
/// Errors: [`TlsError::Mismatch`] naming the file and what to use instead; a file that cannot
/// be read or parsed as [`load_certs`] and [`roots`].
pub fn check_node_files(files: &TlsFiles, id: NodeId) -> Result<(), TlsError> {
    let certs = load_certs(&files.cert)?;
    let Some((leaf, chain)) = certs.split_first() else {
        return Err(TlsError::Pem { path: files.cert.clone(), what: "holds no certificate".into() });
    };
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(&files.ca)?, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mismatch = |what: String| TlsError::Mismatch { path: files.cert.clone(), what };
    verifier.verify_client_cert(leaf, chain, rustls::pki_types::UnixTime::now()).map_err(|e| {
        mismatch(format!(
            "is not a valid certificate of the CA in {} ({e}): give every node certificates from the cluster's one CA",
            files.ca.display()
        ))
    })?;
    let names = match identity_of(leaf) {
        Identity::Node(n) if n == id => return Ok(()),
        Identity::Node(n) => format!("node {n}"),
        Identity::Client(c) => format!("a client ({c:?}), not a node"),
        Identity::Anonymous | Identity::Unnamed => "no node".into(),
    };
    Err(mismatch(format!(
        "names {names}, but this node is --id {id}: give it its own certificate (`runnev cert create-node --id {id}`)"
    )))
}

/// The server side of a node: its certificate, and client certificates verified against the
/// cluster's CA when presented (a client without one still connects: it authenticates with a
/// token; a Raft RPC without a node certificate is refused by the router, see
/// [`crate::api::raft_rpc`]). A presented certificate from another CA fails the handshake.
///
/// Errors: a file is unusable, or the key does not match the certificate.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(&files.ca)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs(&files.cert)?, load_key(&files.key)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = config;
    // HTTP/2 for clients that offer it, HTTP/1.1 for the rest (ALPN, RFC 7301; RFC 9113 §3.2).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `config`, offering by ALPN (RFC 7301) the protocols of `version`
/// ([`crate::net::HttpVersion::alpn`]). Every node offers `h2` and `http/1.1`.
pub fn offering(config: &ClientConfig, version: crate::net::HttpVersion) -> Arc<ClientConfig> {
    let mut config = config.clone();
    config.alpn_protocols = version.alpn().iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// The client side: servers verified against `ca` (by the host name or IP address dialled),
/// presenting `identity` (certificate, key) when given — a node's own certificate when it
/// dials its peers.
///
/// Errors: a file is unusable, or the key does not match the certificate.
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| TlsError::Config(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Who a verified certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No certificate (plain TCP, or TLS without a client certificate).
    Anonymous,
    /// A node of the cluster (`runnev://node/<id>`).
    Node(NodeId),
    /// A client (`runnev://client/<name>`).
    Client(String),
    /// A certificate of the cluster's CA that names neither.
    Unnamed,
}

/// The identity `cert` names (see the module documentation). The chain must already have been
/// verified (rustls does so during the handshake); this only reads its names.
pub fn identity_of(cert: &CertificateDer<'_>) -> Identity {
    use x509_parser::extensions::GeneralName;
    let Ok((_, x509)) = x509_parser::parse_x509_certificate(cert.as_ref()) else { return Identity::Unnamed };
    let Ok(Some(san)) = x509.subject_alternative_name() else { return Identity::Unnamed };
    let mut found = Identity::Unnamed;
    for name in &san.value.general_names {
        if let GeneralName::URI(uri) = name {
            if let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) {
                match id.parse::<NodeId>() {
                    // Two node names in one certificate name no node.
                    Ok(id) if found == Identity::Unnamed => found = Identity::Node(id),
                    _ => return Identity::Unnamed,
                }
            } else if let Some(client) = uri.strip_prefix(CLIENT_URI_PREFIX) {
                if found == Identity::Unnamed {
                    found = Identity::Client(client.to_string());
                }
            }
        }
    }
    found
}

/// Who is at the other end of a connection, as the router sees it (axum's `ConnectInfo`).
#[derive(Debug, Clone)]
pub struct Peer {
    /// The remote address.
    pub remote: Option<SocketAddr>,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// Who its certificate names.
    pub identity: Identity,
}

/// A listener address that says who connected: plain addresses name no one.
pub trait PeerAddr {
    /// The [`Peer`] behind this address.
    fn peer(&self) -> Peer;
}

impl PeerAddr for SocketAddr {
    fn peer(&self) -> Peer {
        Peer { remote: Some(*self), tls: false, identity: Identity::Anonymous }
    }
}

impl PeerAddr for Peer {
    fn peer(&self) -> Peer {
        self.clone()
    }
}

/// Wraps any listener whose addresses say who connected, so the router sees a [`Peer`] as
/// axum's `ConnectInfo` (production passes a [`TlsListener`] or TCP, the simulation turmoil's),
/// and bounds the connections held open at once: past the bound a new connection is answered
/// `503 overloaded` (with `Retry-After`) and closed, without reaching the router.
pub struct PeerListener<L> {
    inner: L,
    slots: Arc<tokio::sync::Semaphore>,
}

impl<L> PeerListener<L> {
    /// `inner`, holding at most `max_connections` connections open at once.
    pub fn new(inner: L, max_connections: usize) -> PeerListener<L> {
        PeerListener { inner, slots: Arc::new(tokio::sync::Semaphore::new(max_connections)) }
    }
}

/// The whole answer to a connection over the bound (RFC 9110 §15.6.4): written, then closed.
const OVERLOADED_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 122\r\n\r\n\
{\"error\":{\"code\":\"overloaded\",\"message\":\"this node holds as many connections as it may (--max-connections); retry later\"}}";

/// A connection counted against [`PeerListener`]'s bound while it is open.
pub struct Counted<T> {
    io: T,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        metrics::gauge!("runnev_connections").decrement(1.0);
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<L> Listener for PeerListener<L>
where
    L: Listener,
    L::Addr: PeerAddr,
{
    type Io = Counted<L::Io>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Peer) {
        loop {
            let (mut io, addr) = self.inner.accept().await;
            match self.slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    metrics::gauge!("runnev_connections").increment(1.0);
                    return (Counted { io, _slot: slot }, addr.peer());
                }
                Err(_) => {
                    metrics::counter!("runnev_overloaded_total", "bound" => "connections").increment(1);
                    tokio::spawn(async move {
                        use tokio::io::AsyncWriteExt;
                        let answer = async {
                            io.write_all(OVERLOADED_ANSWER).await?;
                            io.shutdown().await
                        };
                        let _ = tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), answer).await;
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        self.inner.local_addr().map(|a| a.peer())
    }
}

impl<L> axum::extract::connect_info::Connected<IncomingStream<'_, PeerListener<L>>> for Peer
where
    L: Listener,
    L::Addr: PeerAddr,
{
    fn connect_info(stream: IncomingStream<'_, PeerListener<L>>) -> Peer {
        stream.remote_addr().clone()
    }
}

/// A TCP listener that hands over only connections whose TLS handshake completed, each with
/// the [`Peer`] its certificate names. Handshakes run in their own tasks (at most
/// [`HANDSHAKES_MAX`] at once, each within [`HANDSHAKE_TIMEOUT_MS`]), so a slow or silent client
/// never holds up the others.
pub struct TlsListener {
    ready: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, Peer)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `tcp` with `config`.
    ///
    /// Errors: the listener has no local address.
    pub fn start(tcp: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES_MAX);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
        let accepting = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let (stream, remote) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let handshake = tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), async {
                        if sends_plain_http(&stream).await {
                            refuse_plain_http(stream).await;
                            return None;
                        }
                        Some(acceptor.accept(stream).await)
                    });
                    match handshake.await {
                        Ok(None) => {
                            metrics::counter!("runnev_tls_handshakes_failed_total").increment(1);
                            tracing::debug!(%remote, "plain HTTP on the TLS port: answered 400 tls_required");
                        }
                        Ok(Some(Ok(tls))) => {
                            let identity = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map_or(Identity::Anonymous, identity_of);
                            let peer = Peer { remote: Some(remote), tls: true, identity };
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Some(Err(e))) => {
                            metrics::counter!("runnev_tls_handshakes_failed_total").increment(1);
                            tracing::debug!(%remote, error = %e, "tls handshake refused");
                        }
                        Err(_) => {
                            metrics::counter!("runnev_tls_handshakes_failed_total").increment(1);
                            tracing::debug!(%remote, "tls handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(TlsListener { ready, local, accepting })
    }
}

/// Whether a connection's first byte is an ASCII letter: the method of a plain-HTTP request
/// where a TLS record belongs (a TLS connection opens with a handshake record, content type
/// 22, RFC 8446 §5.1). Waits for that byte (the caller bounds the wait).
async fn sends_plain_http(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1) if first[0].is_ascii_alphabetic())
}

/// Answers a plain-HTTP request on the TLS port `400 tls_required`, with the error body of
/// every other error (docs/http-api.md), and closes: a client that forgot `https://` (or
/// `curl --cacert`) reads what to do instead of an unreadable TLS alert ("Received HTTP/0.9").
/// The request's head is read first, so that closing does not reset the connection before
/// the answer arrives. Nothing of the request is looked at.
async fn refuse_plain_http(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = [0u8; 8192];
    let _ = stream.read(&mut head).await;
    let error = crate::wire::ErrorDetail {
        code: "tls_required".into(),
        message: "this node speaks TLS only: use https:// and the cluster CA's certificate (curl --cacert CA.pem; \
                  the CLI's --ca-file or RUNNEV_CA_FILE; the Python client's ca_file=)"
            .into(),
        frame: None,
    };
    let body = serde_json::to_string(&crate::wire::ErrorBody { error }).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Peer) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop ended (it never does while the listener lives): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Peer> {
        Ok(Peer { remote: Some(self.local), tls: true, identity: Identity::Anonymous })
    }
}

/// Dials TLS over another dialer: the server is verified against the CA of its configuration
/// by the host of the address dialled (a DNS name or an IP address in its certificate).
pub struct TlsDialer {
    inner: Arc<dyn Dialer>,
    connector: tokio_rustls::TlsConnector,
}

impl TlsDialer {
    /// TLS with `config` over `inner`.
    pub fn new(inner: Arc<dyn Dialer>, config: Arc<ClientConfig>) -> TlsDialer {
        TlsDialer { inner, connector: tokio_rustls::TlsConnector::from(config) }
    }
}

/// The host part of `host:port` (`[v6]:port` too), without brackets.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

impl Dialer for TlsDialer {
    fn dial(&self, addr: String) -> BoxFuture<io::Result<Box<dyn Io>>> {
        let dialing = self.dial_negotiated(addr);
        Box::pin(async move { Ok(dialing.await?.io) })
    }

    fn dial_negotiated(&self, addr: String) -> BoxFuture<io::Result<Dialed>> {
        let (inner, connector) = (self.inner.clone(), self.connector.clone());
        Box::pin(async move {
            let name = ServerName::try_from(host_of(&addr).to_string())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
            let io = inner.dial(addr).await?;
            let tls = tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), connector.connect(name, io))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "tls handshake timed out"))??;
            let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            Ok(Dialed { io: Box::new(tls), http2 })
        })
    }
}

/// Why a TLS handshake with a node failed in a way that trying again cannot mend, in words
/// that name the fix: the node's certificate is not from the CA the client trusts, not for the
/// address dialed, expired or not yet valid, or the node speaks plain HTTP. `None` for any
/// other failure (a refused connection, a timeout, a reset), which another try may get past.
///
/// `e` is any error whose chain holds the [`rustls::Error`] of the handshake, as tokio-rustls
/// wraps it in an [`io::Error`] and hyper wraps that again.
pub fn refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::CertificateError as C;
    let mut next = Some(e);
    while let Some(err) = next {
        let tls = err
            .downcast_ref::<rustls::Error>()
            .or_else(|| err.downcast_ref::<io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>());
        let why = match tls {
            Some(rustls::Error::InvalidCertificate(c)) => match c {
                C::UnknownIssuer | C::BadSignature => {
                    "the node's certificate is not signed by the CA given with --ca-file or RUNNEV_CA_FILE: \
                     give the cluster CA's certificate (ca.crt)"
                        .to_string()
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "the node's certificate is not issued for the address dialed: give --nodes as the names or \
                     addresses the nodes' certificates were issued for (`runnev cert create-node --host`)"
                        .to_string()
                }
                C::Expired | C::ExpiredContext { .. } => {
                    "the node's certificate has expired: issue it again (`runnev cert create-node`)".to_string()
                }
                C::NotValidYet | C::NotValidYetContext { .. } => {
                    "the node's certificate is not valid yet: is this machine's clock or the CA's wrong?".to_string()
                }
                other => format!("the node's certificate was refused: {other:?}"),
            },
            Some(rustls::Error::InvalidMessage(_)) => {
                "the node seems to serve plain HTTP: leave out --ca-file and RUNNEV_CA_FILE".to_string()
            }
            _ => {
                next = err.source();
                continue;
            }
        };
        return Some(why);
    }
    None
}

/// A certificate and its key, PEM-encoded, as `runnev cert` writes them.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// A new self-signed cluster CA (`runnev cert create-ca`).
///
/// Errors: rcgen failed.
pub fn create_ca(common_name: &str) -> Result<Issued, TlsError> {
    let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(gen)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).map_err(gen)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Who a leaf certificate is for.
#[derive(Debug, Clone)]
pub enum Subject {
    /// Node `id`.
    Node(NodeId),
    /// A client called this.
    Client(String),
}

/// A certificate for `subject`, reachable at `hosts` (DNS names or IP addresses), issued by the
/// CA (`ca` certificate and key, PEM), usable as server and as client certificate.
///
/// Errors: the CA does not parse, a host is not a valid name, or rcgen failed.
pub fn issue(ca: &Issued, subject: &Subject, hosts: &[String]) -> Result<Issued, TlsError> {
    let gen = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem).map_err(gen)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(gen)?;
    let key = rcgen::KeyPair::generate().map_err(gen)?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(gen)?;
    let (uri, cn) = match subject {
        Subject::Node(id) => (format!("{NODE_URI_PREFIX}{id}"), format!("runnev node {id}")),
        Subject::Client(name) => (format!("{CLIENT_URI_PREFIX}{name}"), format!("runnev client {name}")),
    };
    params.subject_alt_names.push(rcgen::SanType::URI(uri.try_into().map_err(gen)?));
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).map_err(gen)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Writes `contents` to a new file at `path` readable by its owner only (mode 0600), refusing
/// to overwrite an existing file.
///
/// Errors: the file exists or cannot be written.
pub fn write_private(path: &Path, contents: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file = |source| TlsError::File { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(file)?;
    f.write_all(contents.as_bytes()).map_err(file)?;
    f.sync_all().map_err(file)
}

/// Writes a public file (a certificate), refusing to overwrite an existing one.
///
/// Errors: the file exists or cannot be written.
pub fn write_public(path: &Path, contents: &str) -> Result<(), TlsError> {
    use std::io::Write;
    let file = |source| TlsError::File { path: path.to_path_buf(), source };
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(file)?;
    f.write_all(contents.as_bytes()).map_err(file)?;
    f.sync_all().map_err(file)
}

/// Reads a CA's certificate and key from `DIR/ca.pem` and `DIR/ca.key`.
///
/// Errors: either file cannot be read.
pub fn read_ca(dir: &Path) -> Result<Issued, TlsError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| TlsError::File { path, source })
    };
    Ok(Issued { cert_pem: read("ca.pem")?, key_pem: read("ca.key")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each handshake failure that no retry mends gets its fix in words, found inside the
    /// `io::Error` tokio-rustls wraps it in; other failures are left to the retry loop.
    #[test]
    fn a_handshake_that_cannot_succeed_is_told_with_its_fix() {
        use rustls::CertificateError as C;
        let wrapped = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        for (e, words) in [
            (rustls::Error::InvalidCertificate(C::UnknownIssuer), "not signed by the CA given with --ca-file"),
            (rustls::Error::InvalidCertificate(C::NotValidForName), "not issued for the address dialed"),
            (rustls::Error::InvalidCertificate(C::Expired), "has expired"),
            (rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType), "serve plain HTTP"),
        ] {
            let why = refusal(&wrapped(e.clone())).unwrap_or_default();
            assert!(why.contains(words), "{e:?}: {why}");
            assert_eq!(refusal(&e).as_deref(), Some(why.as_str()), "{e:?} unwrapped");
        }
        assert_eq!(refusal(&io::Error::from(io::ErrorKind::ConnectionRefused)), None);
        assert_eq!(refusal(&io::Error::new(io::ErrorKind::TimedOut, "tls handshake timed out")), None);
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn issued_certificates_name_their_node_or_client() {
        let ca = create_ca("test ca").unwrap();
        let node = issue(&ca, &Subject::Node(3), &["127.0.0.1".into(), "localhost".into()]).unwrap();
        assert_eq!(identity_of(&der(&node.cert_pem)), Identity::Node(3));
        let client = issue(&ca, &Subject::Client("ops".into()), &[]).unwrap();
        assert_eq!(identity_of(&der(&client.cert_pem)), Identity::Client("ops".into()));
        assert_eq!(identity_of(&der(&ca.cert_pem)), Identity::Unnamed);
        assert_eq!(identity_of(&CertificateDer::from(vec![1u8, 2, 3])), Identity::Unnamed);
    }

    #[test]
    fn hosts_are_taken_from_addresses() {
        assert_eq!(host_of("127.0.0.1:7001"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7001"), "::1");
        assert_eq!(host_of("node-1.example:80"), "node-1.example");
    }
}
