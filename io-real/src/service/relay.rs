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
use drover_proto::agent::v1::{AgentRequest, AgentResponse};

use super::{ENVELOPE_VERSION, Service, json_payload};

/// How long a relayed request may take end to end (the client answers a restart once begun,
/// a signal once delivered).
pub const RELAY_TIMEOUT: Duration = Duration::from_secs(30);

fn unknown(alloc_id: &str) -> String {
    format!("Unknown allocation {alloc_id:?}")
}

fn envelope(region: &str, body: RequestBody, forwarded: bool) -> AgentRequest {
    AgentRequest {
        attached_node: String::new(),
        region: region.to_string(),
        forwarded,
        version: ENVELOPE_VERSION,
        body: Some(body),
    }
}

/// The answer out of a response envelope.
fn answer<T: serde::de::DeserializeOwned>(
    response: AgentResponse,
    pick: fn(ResponseBody) -> Option<Vec<u8>>,
) -> Result<T, String> {
    let body = response.body.ok_or("empty response")?;
    if let ResponseBody::Error(error) = &body {
        return Err(error.message.clone());
    }
    let json = pick(body).ok_or("unexpected response")?;
    serde_json::from_slice::<Result<T, String>>(&json).unwrap_or_else(|error| Err(format!("malformed reply: {error}")))
}

impl Service {
    /// Relays a request this agent's own client could not answer: a server sends it to the
    /// allocation's node, a client-only agent to its servers; a forwarded one goes no further.
    async fn route(&self, alloc_id: &str, forwarded: bool, body: RequestBody) -> Result<AgentResponse, String> {
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
                return result;
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
            let addr = rpc_addr
                .parse()
                .map_err(|_| format!("the allocation's node has no usable RPC address ({rpc_addr:?})"))?;
            return (self.forward)(addr, envelope(&self.region, body, true), RELAY_TIMEOUT)
                .await
                .map_err(|error| format!("the allocation's client cannot be reached: {error}"));
        }
        self.call_servers(envelope(&self.region, body, false), RELAY_TIMEOUT)
            .await
    }

    /// The RPC addresses of the other servers of the cluster.
    fn peer_servers(&self) -> Vec<std::net::SocketAddr> {
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

    /// Carries out `request` here, or relays it toward the client that runs the allocation.
    pub async fn alloc_control(&self, request: AllocControl, forwarded: bool) -> Result<(), String> {
        let alloc_id = request.alloc_id().to_string();
        if let Some(client) = &self.client_csi {
            match client.control(request.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        let body = RequestBody::ClientAlloc(json_payload(&request));
        let response = self.route(&alloc_id, forwarded, body).await?;
        answer(response, |body| match body {
            ResponseBody::ClientAlloc(payload) => Some(payload.json),
            _ => None,
        })
    }

    /// One read of a task's log, here or relayed like [`Service::alloc_control`].
    pub async fn client_logs(&self, request: LogsRequest, forwarded: bool) -> Result<LogsReply, String> {
        let alloc_id = request.alloc_id.clone();
        if let Some(client) = &self.client_csi {
            match client.logs(request.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        let body = RequestBody::ClientLogs(json_payload(&request));
        let response = self.route(&alloc_id, forwarded, body).await?;
        answer(response, |body| match body {
            ResponseBody::ClientLogs(payload) => Some(payload.json),
            _ => None,
        })
    }

    /// A listing, stat or read in an allocation dir, here or relayed.
    pub async fn client_fs(&self, request: FsRequest, forwarded: bool) -> Result<FsReply, String> {
        let alloc_id = request.alloc_id.clone();
        if let Some(client) = &self.client_csi {
            match client.fs(request.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        let body = RequestBody::ClientFs(json_payload(&request));
        let response = self.route(&alloc_id, forwarded, body).await?;
        answer(response, |body| match body {
            ResponseBody::ClientFs(payload) => Some(payload.json),
            _ => None,
        })
    }

    /// One step of an `alloc exec` session, here or relayed.
    pub async fn client_exec(&self, request: ExecRequest, forwarded: bool) -> Result<ExecReply, String> {
        let alloc_id = request.alloc_id().to_string();
        if let Some(client) = &self.client_csi {
            match client.exec(request.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        let body = RequestBody::ClientExec(json_payload(&request));
        let response = self.route(&alloc_id, forwarded, body).await?;
        answer(response, |body| match body {
            ResponseBody::ClientExec(payload) => Some(payload.json),
            _ => None,
        })
    }

    /// An allocation's resource usage, here or relayed.
    pub async fn client_stats(&self, alloc_id: String, forwarded: bool) -> Result<serde_json::Value, String> {
        if let Some(client) = &self.client_csi {
            match client.stats(alloc_id.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        let body = RequestBody::ClientStats(json_payload(&alloc_id));
        let response = self.route(&alloc_id, forwarded, body).await?;
        answer(response, |body| match body {
            ResponseBody::ClientStats(payload) => Some(payload.json),
            _ => None,
        })
    }

    /// A relayed resource usage read arriving over RPC.
    pub(super) async fn relayed_stats(&self, alloc_id: String, forwarded: bool) -> AgentResponse {
        let result = self.client_stats(alloc_id, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientStats(json_payload(&result))),
        }
    }

    /// A relayed exec step arriving over RPC.
    pub(super) async fn relayed_exec(&self, request: ExecRequest, forwarded: bool) -> AgentResponse {
        let result = self.client_exec(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientExec(json_payload(&result))),
        }
    }

    /// A relayed allocation dir request arriving over RPC.
    pub(super) async fn relayed_fs(&self, request: FsRequest, forwarded: bool) -> AgentResponse {
        let result = self.client_fs(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientFs(json_payload(&result))),
        }
    }

    /// A relayed restart or signal arriving over RPC.
    pub(super) async fn relayed(&self, request: AllocControl, forwarded: bool) -> AgentResponse {
        let result = self.alloc_control(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientAlloc(json_payload(&result))),
        }
    }

    /// A relayed log read arriving over RPC.
    pub(super) async fn relayed_logs(&self, request: LogsRequest, forwarded: bool) -> AgentResponse {
        let result = self.client_logs(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientLogs(json_payload(&result))),
        }
    }
}
