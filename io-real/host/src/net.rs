//! Production agent transport: the agent RPC envelope over tonic (HTTP/2 on the RPC port),
//! gossip over UDP on the serf port, and DNS resolution of join targets. Mirrored by
//! `drover-io-sim`'s `net.rs` (madsim). Written against [`Sockets`]: the agent runs it on the
//! host's sockets, the turmoil lane on a simulated network.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_proto::agent::v1::agent_client::AgentClient;
use drover_proto::agent::v1::agent_server::{Agent, AgentServer};
use drover_proto::agent::v1::{AgentRequest, AgentResponse, AttachDown, AttachUp};

use crate::attach::Attachments;
use tonic::transport::{Channel, Endpoint};

use crate::sockets::{Accepted, RpcConnectInfo, Sockets, TokioSockets};
use crate::tls::agent::AgentTls;
use crate::tls::stream::{MaybeTls, Prefixed};
use drover_io_real::io::{Caller, CallerRole, Identity, RpcHandler, Transport, TransportError};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// An idle connection is pinged this often, and dropped when a ping goes unanswered for
/// [`KEEPALIVE_TIMEOUT`]: a connection whose peer vanished without a reset (power lost, a
/// firewall or NAT forgetting the flow) is otherwise used until the kernel gives up
/// retransmitting, many minutes later, every call on it timing out. Nomad's yamux sessions
/// keep alive the same way.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// tonic client connections, one lazily-connected channel per remote address.
#[derive(Clone)]
pub struct GrpcTransport<S: Sockets = TokioSockets> {
    sockets: S,
    /// Keepalive pings and dropping a channel whose call timed out; off only to re-create the
    /// bug they fix (the turmoil lane's `no-keepalive` regression switch).
    detect_dead_connections: bool,
    channels: Arc<Mutex<BTreeMap<SocketAddr, Channel>>>,
    /// Clients attached to this agent's RPC server (`Agent.Attach`).
    attachments: Attachments,
    /// Inbound connections per client address (`limits { rpc_max_conns_per_client }`).
    max_conns_per_client: usize,
    /// Mutual TLS on every connection, both ways (`tls { rpc = true }`).
    tls: Option<Arc<AgentTls>>,
    /// How long a TLS handshake may take (`limits { rpc_handshake_timeout }`).
    handshake_timeout: Duration,
}

/// Nomad's default `rpc_max_conns_per_client`.
pub const RPC_MAX_CONNS_PER_CLIENT: usize = 100;

impl Default for GrpcTransport<TokioSockets> {
    fn default() -> Self {
        GrpcTransport::new(TokioSockets)
    }
}

impl<S: Sockets> GrpcTransport<S> {
    pub fn new(sockets: S) -> Self {
        GrpcTransport {
            sockets,
            detect_dead_connections: true,
            channels: Arc::default(),
            attachments: Attachments::default(),
            max_conns_per_client: RPC_MAX_CONNS_PER_CLIENT,
            tls: None,
            handshake_timeout: crate::tls::stream::HANDSHAKE_TIMEOUT,
        }
    }

    /// Every connection in and out is mutual TLS with `tls`'s certificates.
    pub fn with_tls(mut self, tls: Arc<AgentTls>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A TLS handshake not done within `timeout` closes its connection (0: no limit).
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// At most `max` inbound connections per client address (0: no limit).
    pub fn with_max_conns_per_client(mut self, max: usize) -> Self {
        self.max_conns_per_client = max;
        self
    }

    /// Re-creates the bug of keeping dead connections (no keepalive, a timed-out call's
    /// channel kept): for the simulation's regression switch only.
    pub fn regress_dead_connection_detection(mut self) -> Self {
        self.detect_dead_connections = false;
        self
    }

    fn forget(&self, addr: SocketAddr) {
        self.channels.lock().expect("channel cache lock").remove(&addr);
    }

    fn channel(&self, addr: SocketAddr) -> Channel {
        let mut channels = self.channels.lock().expect("channel cache lock");
        channels
            .entry(addr)
            .or_insert_with(|| {
                let sockets = self.sockets.clone();
                let tls = self.tls.clone();
                let handshake_timeout = self.handshake_timeout;
                // Every connection of this channel goes to `addr`, whatever the URI says.
                let connector = tower::service_fn(move |_: tonic::transport::Uri| {
                    let (sockets, tls) = (sockets.clone(), tls.clone());
                    async move {
                        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, sockets.connect(addr)).await {
                            Ok(stream) => stream?,
                            Err(_) => {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    format!("connecting to {addr} timed out after {CONNECT_TIMEOUT:?}"),
                                ));
                            }
                        };
                        let stream = match &tls {
                            None => MaybeTls::Plain(stream),
                            Some(tls) => {
                                let config = tls.rpc_client_config();
                                crate::tls::stream::connect(stream, config, tls.server_name(), handshake_timeout)
                                    .await
                                    .map_err(|error| {
                                        tracing::warn!(%addr, %error, "RPC TLS handshake failed");
                                        std::io::Error::new(error.kind(), format!("TLS with {addr}: {error}"))
                                    })?
                            }
                        };
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                });
                let endpoint =
                    Endpoint::from_shared(format!("http://{addr}")).expect("a socket address is a valid URI authority");
                let endpoint = if self.detect_dead_connections {
                    endpoint
                        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                        .keep_alive_while_idle(true)
                } else {
                    endpoint
                };
                // h2 remembers a stream this side reset (a call given up on) for one second of
                // the host's clock, ignoring its late frames meanwhile and answering them with a
                // reset after. In a simulation that clock is not the run's (turmoil keeps
                // virtual time), so how fast the host ran decided which late frame got an
                // answer, and a replay could differ (found by `--real-time-jitter`): there none
                // is remembered, and every late frame is answered the same way. (The madsim
                // world has its own clock under every library.)
                #[cfg(not(madsim))]
                let endpoint = if drover_io_real::runtime::in_simulation() {
                    endpoint.http2_max_concurrent_reset_streams(0)
                } else {
                    endpoint
                };
                endpoint.connect_with_connector_lazy(connector)
            })
            .clone()
    }
}

struct Service {
    handler: RpcHandler,
    attachments: Attachments,
}

/// What the connection a request came on proved about its sender.
fn caller_of<T>(request: &tonic::Request<T>) -> Caller {
    let identity = request
        .extensions()
        .get::<RpcConnectInfo>()
        .map_or(Identity::Unverified, |info| info.identity);
    Caller::new(identity)
}

/// Serves the agent RPC on each accepted connection: hyper's HTTP/2 connection with tonic's
/// service, and the connection's peer and proven identity on every request (what
/// [`caller_of`] reads). Not tonic's own server, because that one stamps every answer with a
/// `date` header read from the host's wall clock; HPACK sends an unchanged date as one byte
/// and a new one as thirty, so the bytes on the wire followed real time, and the turmoil lane,
/// whose network draws its delays per segment, did not replay a seed exactly. gRPC has no use
/// for the header.
async fn serve_rpc<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static>(
    incoming: impl futures::Stream<Item = std::io::Result<Accepted<T>>> + Send + 'static,
    service: AgentServer<Service>,
    keepalive: Option<Duration>,
    keepalive_timeout: Option<Duration>,
) {
    use futures::StreamExt;
    let mut builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(keepalive)
        .auto_date_header(false);
    if let Some(timeout) = keepalive_timeout {
        builder.keep_alive_timeout(timeout);
    }
    let mut incoming = std::pin::pin!(incoming);
    while let Some(accepted) = incoming.next().await {
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::debug!(%error, "RPC connection not accepted");
                continue;
            }
        };
        let info = RpcConnectInfo {
            remote_addr: accepted.peer,
            identity: accepted.identity,
        };
        let service = service.clone();
        let service = tower::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(info);
            read_whole_call(request, service.clone())
        });
        let connection = builder.serve_connection(
            hyper_util::rt::TokioIo::new(accepted),
            hyper_util::service::TowerToHyperService::new(service),
        );
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, peer = %info.remote_addr, "RPC connection ended");
            }
        });
    }
    tracing::debug!("RPC server stopped: its listener closed");
}

/// The path of the unary `Call` method (the streaming `Attach` is served as it comes).
const CALL_PATH: &str = "/drover.agent.v1.Agent/Call";
/// tonic's limit on a decoded message, and the gRPC frame's five-byte header.
const MAX_CALL_BYTES: usize = 4 * 1024 * 1024 + 5;

/// A unary call's request is read to its end (the client's END_STREAM) before tonic decodes
/// it. tonic stops at the one message, so an answer could go out while the end of the
/// request was still on its way; h2 then resets the stream with NO_ERROR and remembers it for
/// one second of the host's clock, ignoring the late frame meanwhile and answering it with a
/// reset after. In the turmoil lane that clock is not the run's, so how fast the host ran
/// decided which bytes crossed the simulated network, and a replay could differ (leader_kill
/// seed 45 and csi_claim seed 43 under `--real-time-jitter`). hyper does not let the server
/// forget reset streams as the client does ([`GrpcTransport::channel`]); a stream closed
/// from both sides before the answer is never reset at all.
async fn read_whole_call<S>(
    request: hyper::Request<hyper::body::Incoming>,
    service: S,
) -> Result<hyper::Response<tonic::body::Body>, std::convert::Infallible>
where
    S: tower::Service<
            hyper::Request<tonic::body::Body>,
            Response = hyper::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        >,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = if request.uri().path() == CALL_PATH {
        let (parts, body) = request.into_parts();
        match http_body_util::Limited::new(body, MAX_CALL_BYTES).collect().await {
            Ok(whole) => hyper::Request::from_parts(
                parts,
                tonic::body::Body::new(http_body_util::Full::new(whole.to_bytes())),
            ),
            Err(error) => {
                let status = if error.is::<http_body_util::LengthLimitError>() {
                    tonic::Status::resource_exhausted(format!("request larger than {MAX_CALL_BYTES} bytes"))
                } else {
                    tonic::Status::cancelled(format!("request not read to its end: {error}"))
                };
                return Ok(status.into_http());
            }
        }
    } else {
        request.map(tonic::body::Body::new)
    };
    service.oneshot(request).await
}

#[tonic::async_trait]
impl Agent for Service {
    async fn call(
        &self,
        request: tonic::Request<AgentRequest>,
    ) -> Result<tonic::Response<AgentResponse>, tonic::Status> {
        let caller = caller_of(&request);
        Ok(tonic::Response::new((self.handler)(caller, request.into_inner()).await))
    }

    /// A client attaches: its first message names its node; then requests go down and its
    /// answers come up until either side ends the stream.
    async fn attach(
        &self,
        request: tonic::Request<tonic::Streaming<AttachUp>>,
    ) -> Result<tonic::Response<tonic::codegen::BoxStream<AttachDown>>, tonic::Status> {
        if !caller_of(&request).identity.may(CallerRole::Node) {
            return Err(tonic::Status::permission_denied(
                "Permission denied: only a client or server certificate may attach",
            ));
        }
        let mut up = request.into_inner();
        let hello = up
            .message()
            .await?
            .filter(|hello| !hello.node_id.is_empty())
            .ok_or_else(|| tonic::Status::invalid_argument("the first message names the node"))?;
        let attachment = Arc::new(Mutex::new(Some(self.attachments.attach(hello.node_id))));
        let down = attachment
            .lock()
            .unwrap()
            .as_mut()
            .map(|attached| std::mem::replace(&mut attached.down, tokio::sync::mpsc::channel(1).1));
        let Some(down) = down else {
            return Err(tonic::Status::internal("attachment lost"));
        };
        {
            let attachment = attachment.clone();
            tokio::spawn(async move {
                while let Ok(Some(message)) = up.message().await {
                    if let (Some(attached), Some(response)) = (attachment.lock().unwrap().as_ref(), message.response) {
                        attached.answered(message.id, response);
                    }
                }
                // The client went away: detached.
                attachment.lock().unwrap().take();
            });
        }
        let stream = futures::stream::unfold(down, |mut down| async move {
            let message = down.recv().await?;
            Some((Ok(message), down))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

pub use crate::sockets::UdpGossip;

impl<S: Sockets> Transport for GrpcTransport<S> {
    type Gossip = S::Datagram;

    async fn bind_gossip(&self, addr: SocketAddr) -> std::io::Result<S::Datagram> {
        self.sockets.bind_datagram(addr).await
    }

    async fn call(
        &self,
        addr: SocketAddr,
        request: AgentRequest,
        timeout: Duration,
    ) -> Result<AgentResponse, TransportError> {
        let mut client = AgentClient::new(self.channel(addr));
        match tokio::time::timeout(timeout, client.call(request)).await {
            Err(_) => {
                // The connection may be dead without knowing it: the next call dials anew
                // (calls still in flight keep the old channel until they end).
                if self.detect_dead_connections {
                    self.forget(addr);
                }
                Err(TransportError::Timeout { addr, timeout })
            }
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => Err(TransportError::Unreachable {
                addr,
                reason: status.message().to_string(),
            }),
            Ok(Err(status)) => Err(TransportError::Failed {
                addr,
                reason: format!("{}: {}", status.code(), status.message()),
            }),
        }
    }

    async fn serve(&self, addr: SocketAddr, handler: RpcHandler) -> std::io::Result<()> {
        let listener = self.sockets.listen(addr).await?;
        let incoming = crate::sockets::incoming::<S>(listener, self.max_conns_per_client);
        let incoming = secured(incoming, self.tls.clone(), self.handshake_timeout);
        let service = AgentServer::new(Service {
            handler,
            attachments: self.attachments.clone(),
        });
        let keepalive = self.detect_dead_connections.then_some(KEEPALIVE_INTERVAL);
        let keepalive_timeout = self.detect_dead_connections.then_some(KEEPALIVE_TIMEOUT);
        tokio::spawn(serve_rpc(incoming, service, keepalive, keepalive_timeout));
        Ok(())
    }

    async fn resolve(&self, target: &str, default_port: u16) -> Result<Vec<SocketAddr>, String> {
        resolve_with(&self.sockets, target, default_port).await
    }

    async fn call_attached(
        &self,
        node_id: &str,
        request: AgentRequest,
        timeout: Duration,
    ) -> Option<Result<AgentResponse, String>> {
        self.attachments.call(node_id, request, timeout).await
    }

    async fn attach(&self, addr: SocketAddr, node_id: String, handler: RpcHandler) -> Result<(), String> {
        // What comes down the stream comes from the server dialed, checked as one when TLS
        // names roles.
        let server = Caller::new(match &self.tls {
            None => Identity::Unverified,
            Some(tls) if tls.settings().verify_server_hostname => Identity::Server,
            Some(_) => Identity::Cluster,
        });
        let mut client = AgentClient::new(self.channel(addr));
        let (up, outgoing) = tokio::sync::mpsc::channel::<AttachUp>(16);
        up.send(AttachUp {
            node_id,
            id: 0,
            response: None,
        })
        .await
        .map_err(|_| "attach stream closed".to_string())?;
        let outgoing = tokio_stream_of(outgoing);
        let mut down = client
            .attach(outgoing)
            .await
            .map_err(|status| format!("{}: {}", status.code(), status.message()))?
            .into_inner();
        while let Some(message) = down.message().await.map_err(|status| status.message().to_string())? {
            let Some(request) = message.request else { continue };
            let (up, handler) = (up.clone(), handler.clone());
            tokio::spawn(async move {
                let response = handler(server, request).await;
                let _ = up
                    .send(AttachUp {
                        node_id: String::new(),
                        id: message.id,
                        response: Some(response),
                    })
                    .await;
            });
        }
        Ok(())
    }

    fn can_attach(&self) -> bool {
        true
    }
}

/// The accepted connections, each through its TLS handshake when `tls` is set, with the role
/// its certificate proves. Handshakes run apart, so one slow or silent peer holds up no other;
/// one that fails is logged with the reason (a certificate of another CA, none at all) and
/// closed.
fn secured<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static>(
    incoming: impl futures::Stream<Item = std::io::Result<Accepted<T>>> + Send + 'static,
    tls: Option<Arc<AgentTls>>,
    handshake_timeout: Duration,
) -> impl futures::Stream<Item = std::io::Result<Accepted<MaybeTls<Prefixed<T>>>>> + Send + 'static {
    use futures::StreamExt;
    let (ready, done) = tokio::sync::mpsc::channel::<Accepted<MaybeTls<Prefixed<T>>>>(64);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        while let Some(accepted) = incoming.next().await {
            let Ok(accepted) = accepted else { continue };
            let Accepted { stream, peer, slot, .. } = accepted;
            let (ready, tls) = (ready.clone(), tls.clone());
            tokio::spawn(async move {
                let (stream, identity) = match &tls {
                    // A peer must open with something (HTTP/2's preface) by the handshake
                    // deadline, in plaintext as over TLS: one that connects and says nothing
                    // would otherwise hold its descriptor for good (issue 54 §9: 1,100 silent
                    // connections took the agent's 1,024 and every request failed).
                    None => match crate::tls::stream::sniff(stream, handshake_timeout).await {
                        Ok((_, stream)) => (MaybeTls::Plain(stream), Identity::Unverified),
                        Err(error) => {
                            tracing::debug!(%peer, %error, "closed an RPC connection: nothing sent");
                            return;
                        }
                    },
                    Some(tls) => {
                        // `rpc_upgrade_mode`: a connection that opens without a TLS handshake
                        // is served in plaintext, as before the cluster moved to TLS.
                        let stream = if tls.settings().rpc_upgrade_mode {
                            match crate::tls::stream::sniff(stream, handshake_timeout).await {
                                Ok((true, stream)) => stream,
                                Ok((false, stream)) => {
                                    tracing::debug!(%peer, "plaintext RPC connection accepted (rpc_upgrade_mode)");
                                    let accepted = Accepted {
                                        stream: MaybeTls::Plain(stream),
                                        peer,
                                        slot,
                                        identity: Identity::Unverified,
                                    };
                                    let _ = ready.send(accepted).await;
                                    return;
                                }
                                Err(error) => {
                                    tracing::warn!(%peer, %error, "refused an RPC connection: nothing sent");
                                    return;
                                }
                            }
                        } else {
                            Prefixed::new(stream)
                        };
                        match crate::tls::stream::accept(stream, tls.rpc_server_config(), handshake_timeout).await {
                            Ok(stream) => {
                                let identity = tls.identity(stream.peer_certificates());
                                (stream, identity)
                            }
                            Err(error) => {
                                tracing::warn!(%peer, %error, "refused an RPC connection: TLS handshake failed");
                                return;
                            }
                        }
                    }
                };
                let _ = ready
                    .send(Accepted {
                        stream,
                        peer,
                        slot,
                        identity,
                    })
                    .await;
            });
        }
    });
    tokio_stream_of(done).map(Ok)
}

/// The messages of `receiver` as a stream.
fn tokio_stream_of<T: Send + 'static>(
    receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(receiver, |mut receiver| async move {
        let message = receiver.recv().await?;
        Some((message, receiver))
    })
}

/// "ip", "ip:port", "[v6]:port", "host" or "host:port" to socket addresses, by the host's
/// resolver.
pub async fn resolve(target: &str, default_port: u16) -> Result<Vec<SocketAddr>, String> {
    resolve_with(&TokioSockets, target, default_port).await
}

/// [`resolve`] through `sockets`' name lookup.
pub async fn resolve_with<S: Sockets>(sockets: &S, target: &str, default_port: u16) -> Result<Vec<SocketAddr>, String> {
    let target = target.trim();
    if let Ok(addr) = target.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    if let Ok(ip) = target.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, default_port)]);
    }
    let with_port = if target
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        target.to_string()
    } else {
        format!("{target}:{default_port}")
    };
    let addrs: Vec<SocketAddr> = sockets
        .lookup_host(with_port)
        .await
        .map_err(|error| format!("cannot resolve {target:?}: {error}"))?;
    if addrs.is_empty() {
        return Err(format!("{target:?} resolved to no addresses"));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_every_target_shape() {
        assert_eq!(
            resolve("10.0.0.1", 4648).await.unwrap(),
            vec!["10.0.0.1:4648".parse().unwrap()]
        );
        assert_eq!(
            resolve("10.0.0.1:5000", 4648).await.unwrap(),
            vec!["10.0.0.1:5000".parse().unwrap()]
        );
        assert_eq!(
            resolve("[::1]:5000", 4648).await.unwrap(),
            vec!["[::1]:5000".parse().unwrap()]
        );
        assert_eq!(resolve("::1", 4648).await.unwrap(), vec!["[::1]:4648".parse().unwrap()]);
        assert!(
            resolve("localhost", 4648)
                .await
                .unwrap()
                .iter()
                .all(|addr| addr.port() == 4648)
        );
        assert!(resolve("no-such-host.invalid", 4648).await.is_err());
    }
}
