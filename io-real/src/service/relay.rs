//! Operators' requests for one allocation (`alloc restart`, `alloc signal`, a read of a task's
//! log) reach the client that runs it, through whichever agent they were sent to.
//!
//! An agent whose own client runs the allocation answers it. Otherwise a server looks the
//! allocation's node up in its state and sends the request to that node's agent, marked
//! `forwarded`: a forwarded request is only ever answered locally, so nothing loops. A
//! client-only agent hands it to its servers, which route it so.
//!
//! A server reaches the node's agent as Nomad does, over the connection the client keeps to
//! its server (`attach.rs`: client-only agents keep a stream attached to the server they talk
//! to), so it works where the client's RPC port cannot be dialed. A server the client is not
//! attached to asks its peers to deliver it down theirs (`attached_node`); only a client
//! attached nowhere is dialed at its RPC address, as CSI node calls are.

use std::time::Duration;

use drover_core::client::AllocControl;

use crate::allocfs::{FsReply, FsRequest};
use crate::exec::{ExecReply, ExecRequest};
use crate::logstream::{LogsReply, LogsRequest};
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::{AgentRequest, AgentResponse, JsonPayload};

use super::{ENVELOPE_VERSION, Service, json_payload};
use crate::io::{BoxFuture, ClientCsi};
use drover_core::error::{AllocCallError, AllocCallFailure, CsiCallError, CsiCallFailure};
use drover_core::rpc::RpcError;

/// How long a relayed request may take end to end (the client answers a restart once begun,
/// a signal once delivered).
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(30);

fn unknown(alloc_id: &str) -> AllocCallError {
    AllocCallError::unknown_alloc(alloc_id)
}

fn envelope(region: &str, body: RequestBody, forwarded: bool) -> AgentRequest {
    AgentRequest {
        attached_node: String::new(),
        region: region.to_string(),
        forwarded,
        version: ENVELOPE_VERSION,
        auth_token: crate::service::auth::caller_token(),
        body: Some(body),
    }
}

/// The answer out of a response envelope.
fn answer<T: serde::de::DeserializeOwned>(
    response: AgentResponse,
    pick: fn(ResponseBody) -> Option<Vec<u8>>,
) -> Result<T, AllocCallError> {
    let body = response.body.ok_or_else(|| AllocCallError::failed("empty response"))?;
    if let ResponseBody::Error(error) = &body {
        return Err(AllocCallError::failed(error.message.clone()));
    }
    let json = pick(body).ok_or_else(|| AllocCallError::failed("unexpected response"))?;
    serde_json::from_slice::<Result<T, AllocCallError>>(&json)
        .unwrap_or_else(|error| Err(AllocCallError::failed(format!("malformed reply: {error}"))))
}

/// A call about a client node itself (`/v1/client/stats`, `/v1/client/gc`): which node
/// (empty: this agent's own client) and what.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeCall {
    pub node_id: String,
    pub kind: NodeCallKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NodeCallKind {
    /// Nomad's `HostStats`.
    HostStats,
    /// A GC of every finished allocation: answered with those collected.
    Gc,
}

impl Service {
    /// This agent's client node, when it runs one.
    pub fn client_node_id(&self) -> Option<String> {
        self.client_csi.as_ref()?.node_id()
    }

    /// Carries out `call` on this agent's client when it is the node named (or none is),
    /// else relays it to that node's agent: from a server down the node's connection (as
    /// [`Service::call_node`] reaches clients), from a client-only agent through its servers.
    pub async fn node_call(&self, call: NodeCall, forwarded: bool) -> Result<serde_json::Value, RpcError> {
        if let Some(client) = &self.client_csi
            && let Some(own) = client.node_id()
            && (call.node_id.is_empty() || call.node_id == own)
        {
            return match call.kind {
                NodeCallKind::HostStats => client.host_stats().await,
                NodeCallKind::Gc => client.gc(None).await.map(|collected| serde_json::json!(collected)),
            };
        }
        if call.node_id.is_empty() {
            return Err(RpcError::invalid("Nomad client not enabled"));
        }
        let unknown_node = || RpcError::not_found(format!("Unknown node {}", call.node_id));
        if forwarded {
            return Err(unknown_node());
        }
        let body = || RequestBody::ClientNode(json_payload(&call));
        let response = match &self.state {
            Some((applied, _)) => {
                let rpc_addr = applied
                    .read(|applied| applied.state.node(&call.node_id).map(|node| node.rpc_addr.clone()))
                    .ok_or_else(unknown_node)?;
                self.call_node(
                    &call.node_id,
                    &rpc_addr,
                    envelope(&self.region, body(), true),
                    RELAY_TIMEOUT,
                )
                .await
                .map_err(|error| error.message)
            }
            None => {
                self.call_servers(envelope(&self.region, body(), false), RELAY_TIMEOUT)
                    .await
            }
        }
        .map_err(|error| RpcError::unavailable(format!("the node's client cannot be reached: {error}")))?;
        match response.body {
            Some(ResponseBody::ClientNode(payload)) => serde_json::from_slice(&payload.json)
                .unwrap_or_else(|error| Err(RpcError::unavailable(format!("malformed reply: {error}")))),
            Some(ResponseBody::Error(error)) => Err(RpcError::unavailable(error.message)),
            other => Err(RpcError::unavailable(format!("unexpected response {other:?}"))),
        }
    }

    /// A relayed node call arriving over RPC, answered.
    pub(super) async fn node_relayed(&self, call: NodeCall, forwarded: bool) -> AgentResponse {
        let result = self.node_call(call, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientNode(json_payload(&result))),
        }
    }

    /// Relays a request this agent's own client could not answer: a server sends it to the
    /// allocation's node, a client-only agent to its servers; a forwarded one goes no further.
    async fn route(&self, alloc_id: &str, forwarded: bool, body: RequestBody) -> Result<AgentResponse, AllocCallError> {
        if forwarded {
            return Err(unknown(alloc_id));
        }
        if let Some((applied, _)) = &self.state {
            let node = applied.read(|applied| {
                let alloc = applied.state.alloc(alloc_id)?;
                applied
                    .state
                    .node(&alloc.node_id)
                    .map(|node| (node.id.clone(), node.rpc_addr.clone()))
            });
            let Some((node_id, rpc_addr)) = node else {
                return Err(unknown(alloc_id));
            };
            // Down the stream the client keeps attached here, or to another server, as
            // Nomad routes over the client's own connection; else dialing its RPC port.
            if let Some(attached) = &self.attached
                && let Some(result) = attached(
                    node_id.clone(),
                    envelope(&self.region, body.clone(), true),
                    RELAY_TIMEOUT,
                )
                .await
            {
                return result.map_err(AllocCallError::failed);
            }
            for peer in self.peer_servers() {
                let mut request = envelope(&self.region, body.clone(), true);
                request.attached_node = node_id.clone();
                if let Ok(response) = (self.forward)(peer, request, RELAY_TIMEOUT).await
                    && !matches!(response.body, Some(ResponseBody::Error(_)) | None)
                {
                    return Ok(response);
                }
            }
            let addr = rpc_addr.parse().map_err(|_| {
                AllocCallError::failed(format!(
                    "the allocation's node has no usable RPC address ({rpc_addr:?})"
                ))
            })?;
            return (self.forward)(addr, envelope(&self.region, body, true), RELAY_TIMEOUT)
                .await
                .map_err(|error| {
                    AllocCallError::failed(format!("the allocation's client cannot be reached: {error}"))
                });
        }
        self.call_servers(envelope(&self.region, body, false), RELAY_TIMEOUT)
            .await
            .map_err(AllocCallError::failed)
    }

    /// A server's call to a client node (its `ClientCSI` calls): down the stream the node keeps
    /// attached here, else through the peer server it is attached to, as Nomad's servers call
    /// clients over the client's own connection (a dial would refuse the client's certificate
    /// under `verify_server_hostname`); else dialing its RPC address. Peers are asked only
    /// where clients attach at all (not in the simulation's transport, which dials).
    pub async fn call_node(
        &self,
        node_id: &str,
        rpc_addr: &str,
        request: AgentRequest,
        timeout: std::time::Duration,
    ) -> Result<AgentResponse, CsiCallError> {
        if let Some(attached) = &self.attached {
            if let Some(result) = attached(node_id.to_string(), request.clone(), timeout).await {
                return result.map_err(CsiCallError::other);
            }
            if self.clients_attach {
                for peer in self.peer_servers() {
                    let mut relayed = request.clone();
                    relayed.attached_node = node_id.to_string();
                    if let Ok(response) = (self.forward)(peer, relayed, timeout).await
                        && !matches!(response.body, Some(ResponseBody::Error(_)) | None)
                    {
                        return Ok(response);
                    }
                }
            }
        }
        let addr: std::net::SocketAddr = rpc_addr.parse().map_err(|_| {
            CsiCallError::new(
                CsiCallFailure::UnknownNode,
                format!("Unknown node {node_id}: bad RPC address {rpc_addr:?}"),
            )
        })?;
        (self.forward)(addr, request, timeout)
            .await
            .map_err(|error| CsiCallError::other(error.to_string()))
    }

    /// The RPC addresses of the other servers of the cluster.
    pub(super) fn peer_servers(&self) -> Vec<std::net::SocketAddr> {
        let Some(raft) = &self.raft else {
            return Vec::new();
        };
        let metrics = raft.metrics().borrow().clone();
        metrics
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != self.node_id)
            .filter_map(|(_, node)| node.rpc_addr.parse().ok())
            .collect()
    }

    /// A peer server's relay for a client attached here (`attached_node`): down its stream,
    /// or an error when it is not attached here.
    pub(super) async fn deliver_attached(&self, request: AgentRequest) -> AgentResponse {
        let node_id = request.attached_node.clone();
        let mut request = request;
        request.attached_node = String::new();
        let attached = match &self.attached {
            Some(attached) => attached(node_id.clone(), request, RELAY_TIMEOUT).await,
            None => None,
        };
        match attached {
            Some(Ok(response)) => response,
            Some(Err(error)) => super::error_response(super::ErrorKind::Internal, error, String::new()),
            None => super::error_response(
                super::ErrorKind::Invalid,
                format!("client {node_id} is not attached to this server"),
                String::new(),
            ),
        }
    }

    /// Carries out `request` on this agent's client, or relays it toward the client that
    /// runs the allocation ([`Service::route`]).
    pub async fn client_call<C: ClientCall>(&self, request: C, forwarded: bool) -> Result<C::Reply, AllocCallError> {
        let alloc_id = request.alloc_id().to_string();
        if let Some(client) = &self.client_csi {
            match request.clone().local(client.as_ref()).await {
                Err(error) if error.kind == AllocCallFailure::UnknownAlloc && !forwarded => {}
                result => return result,
            }
        }
        let response = self
            .route(&alloc_id, forwarded, C::request(json_payload(&request)))
            .await?;
        answer(response, C::response_json)
    }

    /// A relayed client request arriving over RPC, decoded, answered.
    pub(super) async fn relayed<C: ClientCall>(&self, request: C, forwarded: bool) -> AgentResponse {
        let result = self.client_call(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(C::response(json_payload(&result))),
        }
    }
}

/// One kind of request a client answers about one of its allocations: the envelope bodies it
/// travels in, and how the agent's own client answers it.
pub trait ClientCall: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static {
    type Reply: serde::Serialize + serde::de::DeserializeOwned + Send;
    fn alloc_id(&self) -> &str;
    fn request(payload: JsonPayload) -> RequestBody;
    fn response(payload: JsonPayload) -> ResponseBody;
    /// The JSON of this kind's answer in a response body.
    fn response_json(body: ResponseBody) -> Option<Vec<u8>>;
    fn local(self, client: &dyn ClientCsi) -> BoxFuture<Result<Self::Reply, AllocCallError>>;
}

/// `client_stats`: an allocation's resource usage (its JSON is the bare ID).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct StatsRequest {
    pub alloc_id: String,
}

macro_rules! client_call {
    ($request:ty, $reply:ty, $variant:ident, |$this:ident| $alloc_id:expr, $local:expr) => {
        impl ClientCall for $request {
            type Reply = $reply;
            fn alloc_id(&self) -> &str {
                let $this = self;
                $alloc_id
            }
            fn request(payload: JsonPayload) -> RequestBody {
                RequestBody::$variant(payload)
            }
            fn response(payload: JsonPayload) -> ResponseBody {
                ResponseBody::$variant(payload)
            }
            fn response_json(body: ResponseBody) -> Option<Vec<u8>> {
                match body {
                    ResponseBody::$variant(payload) => Some(payload.json),
                    _ => None,
                }
            }
            fn local(self, client: &dyn ClientCsi) -> BoxFuture<Result<$reply, AllocCallError>> {
                $local(client, self)
            }
        }
    };
}

client_call!(
    AllocControl,
    (),
    ClientAlloc,
    |this| this.alloc_id(),
    |client: &dyn ClientCsi, request| client.control(request)
);
client_call!(
    LogsRequest,
    LogsReply,
    ClientLogs,
    |this| &this.alloc_id,
    |client: &dyn ClientCsi, request| client.logs(request)
);
client_call!(
    FsRequest,
    FsReply,
    ClientFs,
    |this| &this.alloc_id,
    |client: &dyn ClientCsi, request| client.fs(request)
);
client_call!(
    ExecRequest,
    ExecReply,
    ClientExec,
    |this| this.alloc_id(),
    |client: &dyn ClientCsi, request| client.exec(request)
);
client_call!(
    StatsRequest,
    serde_json::Value,
    ClientStats,
    |this| &this.alloc_id,
    |client: &dyn ClientCsi, request: StatsRequest| client.stats(request.alloc_id)
);

/// `client_gc`: a GC of one finished allocation (its JSON is the bare ID). The answer is the
/// client's: the allocation collected, or why it may not be (not finished, or still listed
/// as running); only an allocation the client does not have is relayed on.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct GcRequest {
    pub alloc_id: String,
}

client_call!(
    GcRequest,
    Result<Vec<String>, RpcError>,
    ClientGc,
    |this| &this.alloc_id,
    |client: &dyn ClientCsi, request: GcRequest| {
        let gc = client.gc(Some(request.alloc_id.clone()));
        Box::pin(async move {
            match gc.await {
                Err(error) if error.kind == drover_core::error::ErrorKind::NotFound => Err(unknown(&request.alloc_id)),
                answer => Ok(answer),
            }
        }) as BoxFuture<Result<Result<Vec<String>, RpcError>, AllocCallError>>
    }
);
