//! The production socket seams over turmoil's simulated TCP: a [`Dialer`] for the nodes' Raft
//! transport and forwarding (and for the clients), and an [`axum::serve::Listener`] so the
//! production router serves simulated connections.
//!
//! Owns: nothing but the adaptation. Must never: add behaviour the production sockets do not
//! have (no retries, no mock delivery): the network's faults come from turmoil.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use runnev::net::{BoxFuture, Dialer, Io};

/// How long a simulated `connect` may hang (a SYN into a partition gets no answer) before it
/// fails with `TimedOut`, in ms. A real kernel gives up after about two minutes; callers here
/// all have shorter deadlines of their own, so this only bounds leaked connect attempts.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// Dials `host:port` over turmoil's TCP.
pub struct SimDialer;

impl Dialer for SimDialer {
    fn dial(&self, addr: String) -> BoxFuture<io::Result<Box<dyn Io>>> {
        Box::pin(async move {
            let connect = turmoil::net::TcpStream::connect(addr.clone());
            match tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect).await {
                Ok(Ok(s)) => Ok(Box::new(s) as Box<dyn Io>),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {addr} timed out"))),
            }
        })
    }
}

/// A turmoil listener that axum can serve.
pub struct SimListener(turmoil::net::TcpListener);

impl SimListener {
    /// Binds `0.0.0.0:port` on the current simulated host.
    ///
    /// Errors: the port is already bound on this host.
    pub async fn bind(port: u16) -> io::Result<Self> {
        Ok(SimListener(turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?))
    }
}

impl axum::serve::Listener for SimListener {
    type Io = turmoil::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok(pair) => return pair,
                // As axum does for real sockets: back off and keep accepting.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}
