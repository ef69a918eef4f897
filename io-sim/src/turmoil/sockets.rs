//! [`Sockets`] on turmoil's simulated network: the production tonic and axum code connect,
//! listen and gossip through these.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use drover_host::sockets::Sockets;
use drover_io_real::io::GossipSocket;

/// turmoil's TCP and UDP, and its DNS for the hosts the lane named.
#[derive(Clone, Debug, Default)]
pub struct TurmoilSockets {
    /// The host names lookups may answer (turmoil's own lookup panics on any other).
    known: Arc<BTreeSet<String>>,
}

impl TurmoilSockets {
    pub fn new(known: impl IntoIterator<Item = String>) -> Self {
        TurmoilSockets {
            known: Arc::new(known.into_iter().collect()),
        }
    }
}

/// turmoil binds only the unspecified address (or loopback); a turmoil host has exactly one
/// address besides loopback, so binding its own address means binding the unspecified one.
fn bindable(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_loopback() {
        return addr;
    }
    let unspecified = match addr {
        SocketAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(unspecified, addr.port())
}

/// A gossip socket on turmoil's UDP.
pub struct TurmoilGossip(turmoil::net::UdpSocket);

impl GossipSocket for TurmoilGossip {
    async fn send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<()> {
        self.0.send_to(data, to).await.map(|_| ())
    }

    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.0.recv_from(buf).await
    }
}

impl Sockets for TurmoilSockets {
    type Stream = turmoil::net::TcpStream;
    type Listener = turmoil::net::TcpListener;
    type Datagram = TurmoilGossip;

    async fn connect(&self, addr: SocketAddr) -> io::Result<turmoil::net::TcpStream> {
        turmoil::net::TcpStream::connect(addr).await
    }

    async fn listen(&self, addr: SocketAddr) -> io::Result<turmoil::net::TcpListener> {
        turmoil::net::TcpListener::bind(bindable(addr)).await
    }

    async fn accept(listener: &turmoil::net::TcpListener) -> io::Result<(turmoil::net::TcpStream, SocketAddr)> {
        listener.accept().await
    }

    fn local_addr(listener: &turmoil::net::TcpListener) -> io::Result<SocketAddr> {
        listener.local_addr()
    }

    async fn bind_datagram(&self, addr: SocketAddr) -> io::Result<TurmoilGossip> {
        turmoil::net::UdpSocket::bind(bindable(addr)).await.map(TurmoilGossip)
    }

    async fn lookup_host(&self, host_port: String) -> io::Result<Vec<SocketAddr>> {
        let not_found = || io::Error::new(io::ErrorKind::NotFound, format!("no host {host_port:?}"));
        let (host, port) = host_port.rsplit_once(':').ok_or_else(not_found)?;
        let port: u16 = port.parse().map_err(|_| not_found())?;
        if !self.known.contains(host) {
            return Err(not_found());
        }
        Ok(vec![SocketAddr::new(turmoil::lookup(host), port)])
    }
}
