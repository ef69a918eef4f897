//! Operators' requests for one allocation (`alloc restart`, `alloc signal`) reach the client
//! that runs it, through whichever agent they were sent to.
//!
//! An agent whose own client runs the allocation answers it. Otherwise a server looks the
//! allocation's node up in its state and sends the request to that node's agent, marked
//! `forwarded`: a forwarded request is only ever answered locally, so nothing loops. A
//! client-only agent hands it to its servers, which route it so.
//!
//! Gap, documented: Nomad routes through the server the client keeps its own connection to,
//! so it works where a client's RPC port is unreachable; here the server dials the client's
//! RPC address, as its CSI node calls do.

use std::time::Duration;

use drover_core::client::AllocControl;
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

fn envelope(region: &str, request: &AllocControl, forwarded: bool) -> AgentRequest {
    AgentRequest {
        region: region.to_string(),
        forwarded,
        version: ENVELOPE_VERSION,
        body: Some(RequestBody::ClientAlloc(json_payload(request))),
    }
}

/// The answer out of a response envelope.
fn answer(response: AgentResponse) -> Result<(), String> {
    match response.body {
        Some(ResponseBody::ClientAlloc(payload)) => serde_json::from_slice::<Result<(), String>>(&payload.json)
            .unwrap_or_else(|error| Err(format!("malformed reply: {error}"))),
        Some(ResponseBody::Error(error)) => Err(error.message),
        other => Err(format!("unexpected response {other:?}")),
    }
}

impl Service {
    /// Carries out `request` here, or relays it toward the client that runs the allocation.
    pub async fn alloc_control(&self, request: AllocControl, forwarded: bool) -> Result<(), String> {
        let alloc_id = request.alloc_id().to_string();
        if let Some(client) = &self.client_csi {
            match client.control(request.clone()).await {
                Err(error) if error == unknown(&alloc_id) && !forwarded => {}
                result => return result,
            }
        }
        if forwarded {
            return Err(unknown(&alloc_id));
        }
        if let Some((applied, _)) = &self.state {
            let node = applied.read(|applied| {
                let alloc = applied.state.alloc(&alloc_id)?;
                applied.state.node(&alloc.node_id).map(|node| node.rpc_addr.clone())
            });
            let Some(rpc_addr) = node else {
                return Err(unknown(&alloc_id));
            };
            let addr = rpc_addr
                .parse()
                .map_err(|_| format!("the allocation's node has no usable RPC address ({rpc_addr:?})"))?;
            let sent = (self.forward)(addr, envelope(&self.region, &request, true), RELAY_TIMEOUT).await;
            return sent
                .map_err(|error| format!("the allocation's client cannot be reached: {error}"))
                .and_then(answer);
        }
        self.call_servers(envelope(&self.region, &request, false), RELAY_TIMEOUT)
            .await
            .and_then(answer)
    }

    /// A relayed request arriving over RPC.
    pub(super) async fn relayed(&self, request: AllocControl, forwarded: bool) -> AgentResponse {
        let result = self.alloc_control(request, forwarded).await;
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientAlloc(json_payload(&result))),
        }
    }
}
