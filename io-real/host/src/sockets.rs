//! The sockets the production network stack stands on: TCP for agent RPC (tonic) and the HTTP
//! API (axum), UDP for gossip, and name lookup for join targets.
//!
//! [`net::GrpcTransport`](crate::net::GrpcTransport) and `drover_http::serve_with`
//! are written against [`Sockets`], so the same tonic, hyper and axum code runs over the
//! host's sockets ([`TokioSockets`], what the agent uses) and over a simulated network (the
//! turmoil lane in `drover-io-sim`, where partitions and message loss reach hyper and tonic
//! themselves).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use drover_io_real::io::{GossipSocket, Identity};

/// TCP streams and listeners, datagram sockets and name lookup.
pub trait Sockets: Clone + Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    type Listener: Send + Sync + 'static;
    type Datagram: GossipSocket;

    /// Opens a TCP connection to `addr` (no delay on small writes).
    fn connect(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Stream>> + Send;

    /// Binds a TCP listener on `addr`.
    fn listen(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Listener>> + Send;

    /// The next connection to `listener`, with the peer's address.
    fn accept(listener: &Self::Listener) -> impl Future<Output = io::Result<(Self::Stream, SocketAddr)>> + Send;

    fn local_addr(listener: &Self::Listener) -> io::Result<SocketAddr>;

    /// Binds a datagram socket on `addr`.
    fn bind_datagram(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::Datagram>> + Send;

    /// Resolves "host:port" to addresses.
    fn lookup_host(&self, host_port: String) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send;
}

/// The host's sockets, through tokio.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSockets;

/// Gossip over a UDP socket on the serf port.
pub struct UdpGossip(tokio::net::UdpSocket);

impl GossipSocket for UdpGossip {
    async fn send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<()> {
        self.0.send_to(data, to).await.map(|_| ())
    }

    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.0.recv_from(buf).await
    }
}

impl Sockets for TokioSockets {
    type Stream = tokio::net::TcpStream;
    type Listener = tokio::net::TcpListener;
    type Datagram = UdpGossip;

    async fn connect(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    async fn listen(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::bind(addr).await
    }

    async fn accept(listener: &tokio::net::TcpListener) -> io::Result<(tokio::net::TcpStream, SocketAddr)> {
        let (stream, peer) = listener.accept().await?;
        // A peer gone between accept and this call is not the listener's error.
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }

    fn local_addr(listener: &tokio::net::TcpListener) -> io::Result<SocketAddr> {
        listener.local_addr()
    }

    async fn bind_datagram(&self, addr: SocketAddr) -> io::Result<UdpGossip> {
        tokio::net::UdpSocket::bind(addr).await.map(UdpGossip)
    }

    async fn lookup_host(&self, host_port: String) -> io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host(host_port).await?.collect())
    }
}

/// An accepted connection, as tonic's server takes them (it asks each for its peer).
pub struct Accepted<S> {
    pub stream: S,
    pub peer: SocketAddr,
    /// Counted against its client's connection limit until dropped.
    pub slot: Option<ConnSlot>,
    /// What the peer proved (its certificate's role over mutual TLS).
    pub identity: Identity,
}

/// What each request of a connection carries: its peer and what the peer proved.
#[derive(Clone, Copy, Debug)]
pub struct RpcConnectInfo {
    pub remote_addr: SocketAddr,
    pub identity: Identity,
}

/// Open connections per client address, for `limits { http_max_conns_per_client
/// rpc_max_conns_per_client }`.
#[derive(Clone, Default)]
pub struct ConnLimit(Arc<Mutex<BTreeMap<IpAddr, usize>>>);

/// One connection counted against its client until dropped.
pub struct ConnSlot {
    conns: ConnLimit,
    ip: IpAddr,
}

impl ConnLimit {
    /// A place for one more connection from `ip`, or `None` when it holds `max` already (0:
    /// no limit).
    pub fn take(&self, ip: IpAddr, max: usize) -> Option<ConnSlot> {
        let mut held = self.0.lock().expect("connection counts");
        let count = held.entry(ip).or_default();
        if max > 0 && *count >= max {
            return None;
        }
        *count += 1;
        Some(ConnSlot {
            conns: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut held = self.conns.0.lock().expect("connection counts");
        if let Some(count) = held.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Accepted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Accepted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The connections `listener` accepts, as a stream for the RPC server (`net::serve_rpc`). An
/// accept error (too many open files, a connection reset before it was taken) is logged and
/// retried after a pause, as axum's own listener does, rather than ending the server.
///
/// A client address holding `max_per_client` connections already (0: no limit) has the next
/// one closed at once (Nomad's `rpc_max_conns_per_client`).
pub fn incoming<S: Sockets>(
    listener: S::Listener,
    max_per_client: usize,
) -> impl futures::Stream<Item = io::Result<Accepted<S::Stream>>> + Send + 'static {
    futures::stream::unfold((listener, ConnLimit::default()), move |(listener, conns)| async move {
        loop {
            let mut accepted = accept_retrying::<S>(&listener).await;
            match conns.take(accepted.peer.ip(), max_per_client) {
                Some(slot) => {
                    accepted.slot = Some(slot);
                    return Some((Ok(accepted), (listener, conns)));
                }
                None => {
                    tracing::debug!(peer = %accepted.peer, max_per_client, "refused an RPC connection: the client holds the most it may");
                }
            }
        }
    })
}

pub async fn accept_retrying<S: Sockets>(listener: &S::Listener) -> Accepted<S::Stream> {
    loop {
        match S::accept(listener).await {
            Ok((stream, peer)) => {
                return Accepted {
                    stream,
                    peer,
                    slot: None,
                    identity: Identity::Unverified,
                };
            }
            Err(error) => {
                tracing::warn!(%error, "accepting a connection failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
