//! Simulated agent transport: the same prost-encoded envelopes as production (and gossip
//! datagrams), carried over madsim's network, which partitions, clogs, delays and drops them as the scenario says.
//! Mirrors `drover-io-real`'s `net.rs`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use drover_io_real::io::{Caller, GossipSocket, Identity, RpcHandler, Transport, TransportError};
use drover_proto::agent::v1::{AgentRequest, AgentResponse};
use madsim::net::Endpoint;
use prost::Message;

/// One agent's end of the simulated network. `identity` is what its calls prove to the agent
/// called, as a certificate does over mutual TLS: the simulated world hands it out by role,
/// and an agent cannot claim another.
#[derive(Clone, Copy, Debug)]
pub struct SimTransport {
    identity: Identity,
}

impl Default for SimTransport {
    fn default() -> Self {
        SimTransport {
            identity: Identity::Unverified,
        }
    }
}

impl SimTransport {
    /// An agent whose calls carry `identity`.
    pub fn proving(identity: Identity) -> Self {
        SimTransport { identity }
    }
}

/// A request on the simulated wire: the envelope's bytes, and who sent it.
struct Sent {
    caller: Identity,
    bytes: Vec<u8>,
}

async fn call_once(caller: Identity, addr: SocketAddr, request: AgentRequest) -> Result<AgentResponse, TransportError> {
    let unreachable = |error: std::io::Error| TransportError::Unreachable {
        addr,
        reason: error.to_string(),
    };
    let endpoint = Endpoint::bind("0.0.0.0:0").await.map_err(unreachable)?;
    let (tx, mut rx) = endpoint.connect1(addr).await.map_err(unreachable)?;
    tx.send(Box::new(Sent {
        caller,
        bytes: request.encode_to_vec(),
    }))
    .await
    .map_err(unreachable)?;
    let payload = rx.recv().await.map_err(unreachable)?;
    let bytes = payload.downcast::<Vec<u8>>().map_err(|_| TransportError::Failed {
        addr,
        reason: "unexpected payload type".to_string(),
    })?;
    AgentResponse::decode(bytes.as_slice()).map_err(|error| TransportError::Failed {
        addr,
        reason: format!("malformed response: {error}"),
    })
}

/// Gossip over madsim's simulated UDP.
pub struct SimGossip(madsim::net::UdpSocket);

impl GossipSocket for SimGossip {
    async fn send_to(&self, data: &[u8], to: SocketAddr) -> std::io::Result<()> {
        self.0.send_to(to, data).await
    }

    async fn recv_from(&self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        self.0.recv_from(buf).await
    }
}

impl Transport for SimTransport {
    type Gossip = SimGossip;

    async fn bind_gossip(&self, addr: SocketAddr) -> std::io::Result<SimGossip> {
        madsim::net::UdpSocket::bind(addr).await.map(SimGossip)
    }

    async fn call(
        &self,
        addr: SocketAddr,
        request: AgentRequest,
        timeout: Duration,
    ) -> Result<AgentResponse, TransportError> {
        match tokio::time::timeout(timeout, call_once(self.identity, addr, request)).await {
            Ok(result) => result,
            Err(_) => Err(TransportError::Timeout { addr, timeout }),
        }
    }

    async fn serve(&self, addr: SocketAddr, handler: RpcHandler) -> std::io::Result<()> {
        let endpoint = Endpoint::bind(addr).await?;
        tokio::spawn(async move {
            loop {
                let Ok((tx, mut rx, _from)) = endpoint.accept1().await else {
                    return;
                };
                let handler = handler.clone();
                tokio::spawn(async move {
                    let Ok(payload) = rx.recv().await else { return };
                    let Ok(sent) = payload.downcast::<Sent>() else {
                        return;
                    };
                    let caller = Caller::new(sent.caller);
                    let Ok(request) = AgentRequest::decode(sent.bytes.as_slice()) else {
                        return;
                    };
                    // As with gRPC, a caller that gives up cancels the call: the handler's future
                    // is dropped, so an abandoned operation never takes effect late. `biased`:
                    // an unbiased select draws from tokio's own generator, seeded from a
                    // process-wide counter, so a replay in the same process would poll in another
                    // order.
                    tokio::select! {
                        biased;
                        response = handler(caller, request) => {
                            let _ = tx.send(Box::new(response.encode_to_vec())).await;
                        }
                        () = tx.closed() => {}
                    }
                });
            }
        });
        Ok(())
    }

    /// The simulated world has addresses only, no names.
    async fn resolve(&self, target: &str, default_port: u16) -> Result<Vec<SocketAddr>, String> {
        if let Ok(addr) = target.parse::<SocketAddr>() {
            return Ok(vec![addr]);
        }
        match target.parse::<IpAddr>() {
            Ok(ip) => Ok(vec![SocketAddr::new(ip, default_port)]),
            Err(_) => Err(format!("cannot resolve {target:?}: no DNS in the simulation")),
        }
    }
}
