//! Simulated agent transport: the same prost-encoded envelopes as production (and gossip
//! datagrams), carried over madsim's network, which partitions, clogs, delays and drops them as the scenario says.
//! Mirrors `drover-io-real`'s `net.rs`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use drover_io_real::io::{GossipSocket, RpcHandler, Transport, TransportError};
use drover_proto::agent::v1::{AgentRequest, AgentResponse};
use madsim::net::Endpoint;
use prost::Message;

#[derive(Clone, Copy, Debug, Default)]
pub struct SimTransport;

async fn call_once(addr: SocketAddr, request: AgentRequest) -> Result<AgentResponse, TransportError> {
    let unreachable = |error: std::io::Error| TransportError::Unreachable {
        addr,
        reason: error.to_string(),
    };
    let endpoint = Endpoint::bind("0.0.0.0:0").await.map_err(unreachable)?;
    let (tx, mut rx) = endpoint.connect1(addr).await.map_err(unreachable)?;
    tx.send(Box::new(request.encode_to_vec())).await.map_err(unreachable)?;
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
        match tokio::time::timeout(timeout, call_once(addr, request)).await {
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
                    let Ok(bytes) = payload.downcast::<Vec<u8>>() else {
                        return;
                    };
                    let Ok(request) = AgentRequest::decode(bytes.as_slice()) else {
                        return;
                    };
                    // As with gRPC, a caller that gives up cancels the call: the handler's future
                    // is dropped, so an abandoned operation never takes effect late. `biased`:
                    // an unbiased select draws from tokio's own generator, seeded from a
                    // process-wide counter, so a replay in the same process would poll in another
                    // order.
                    tokio::select! {
                        biased;
                        response = handler(request) => {
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
