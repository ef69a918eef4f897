//! A fake CSI client node for tests and benches with real processes: it serves `ClientCSI`
//! over real tonic (recording every call in order) and speaks to the servers the way a client
//! does, through the agent RPC envelope.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::rpc::{ClientCsiReply, ClientCsiRequest, ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, CsiControllerInfo, CsiInfo, CsiNodeInfo,
    CsiVolumeClaim, Node, NodeStatus, Secrets,
};
use drover_host::net::GrpcTransport;
use drover_io_real::io::{RpcHandler, Transport};
use drover_io_real::service::{server_envelope, server_reply};
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::{AgentResponse, JsonPayload};

pub struct FakeClient {
    pub node_id: String,
    pub rpc_addr: SocketAddr,
    pub calls: Arc<Mutex<Vec<String>>>,
    /// The secrets each controller call carried, in order.
    pub secrets: Arc<Mutex<Vec<Secrets>>>,
    transport: GrpcTransport,
}

/// The secrets a `ClientCSI` call carries (empty for a node detach).
fn secrets_of(request: &ClientCsiRequest) -> Option<Secrets> {
    match request {
        ClientCsiRequest::ControllerValidate(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerAttach(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerDetach(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerCreate(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerDelete(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerCreateSnapshot(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerDeleteSnapshot(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerListSnapshots(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerExpand(r) => Some(r.secrets.clone()),
        ClientCsiRequest::ControllerListVolumes(_)
        | ClientCsiRequest::NodeDetach(_)
        | ClientCsiRequest::NodeExpand(_) => None,
    }
}

fn answer(request: &ClientCsiRequest) -> (String, ClientCsiReply) {
    match request {
        ClientCsiRequest::ControllerValidate(r) => (format!("validate {}", r.volume_id), ClientCsiReply::Done),
        ClientCsiRequest::ControllerAttach(r) => (
            format!("controller-publish {} {}", r.volume_id, r.client_csi_node_id),
            ClientCsiReply::Attached {
                publish_context: [("device".into(), format!("/dev/{}", r.volume_id))].into(),
            },
        ),
        ClientCsiRequest::ControllerDetach(r) => {
            (format!("controller-unpublish {}", r.volume_id), ClientCsiReply::Done)
        }
        ClientCsiRequest::NodeDetach(r) => (
            format!("node-unpublish {} {}", r.volume_id, r.alloc_id),
            ClientCsiReply::Done,
        ),
        ClientCsiRequest::ControllerCreate(r) => (
            format!("controller-create {}", r.name),
            ClientCsiReply::Created {
                external_id: format!("ext-{}", r.name),
                capacity: r.capacity_min,
                context: Default::default(),
                topologies: Vec::new(),
            },
        ),
        ClientCsiRequest::ControllerDelete(r) => (format!("controller-delete {}", r.external_id), ClientCsiReply::Done),
        other => (
            format!("unanswered {other:?}"),
            ClientCsiReply::Expanded {
                capacity: 0,
                node_expansion_required: false,
            },
        ),
    }
}

impl FakeClient {
    pub async fn start(node_id: &str, port: u16) -> FakeClient {
        let calls: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let secrets: Arc<Mutex<Vec<Secrets>>> = Arc::default();
        let recorded = calls.clone();
        let recorded_secrets = secrets.clone();
        let handler: RpcHandler = Arc::new(move |_caller, request| {
            let recorded = recorded.clone();
            let recorded_secrets = recorded_secrets.clone();
            Box::pin(async move {
                let Some(RequestBody::ClientCsi(payload)) = request.body else {
                    return AgentResponse {
                        version: drover_io_real::service::ENVELOPE_VERSION,
                        body: None,
                    };
                };
                let request: ClientCsiRequest = serde_json::from_slice(&payload.json).expect("client csi request");
                let (name, reply) = answer(&request);
                recorded.lock().unwrap().push(name);
                if let Some(secrets) = secrets_of(&request) {
                    recorded_secrets.lock().unwrap().push(secrets);
                }
                let result: Result<ClientCsiReply, String> = Ok(reply);
                AgentResponse {
                    version: drover_io_real::service::ENVELOPE_VERSION,
                    body: Some(ResponseBody::ClientCsi(JsonPayload {
                        json: serde_json::to_vec(&result).unwrap(),
                    })),
                }
            })
        });
        let rpc_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let transport = GrpcTransport::default();
        transport.serve(rpc_addr, handler).await.expect("fake client binds");
        FakeClient {
            node_id: node_id.to_string(),
            rpc_addr,
            calls,
            secrets,
            transport,
        }
    }

    /// Sends a server request to `server` (any server: followers forward to the leader).
    pub async fn request(&self, server: SocketAddr, request: ServerRequest) -> ServerReply {
        let envelope = server_envelope("global", &request, "", false);
        match self.transport.call(server, envelope, Duration::from_secs(30)).await {
            Ok(response) => server_reply(response),
            Err(error) => ServerReply::Error(drover_core::rpc::RpcError::unavailable(error.to_string())),
        }
    }

    /// Retries over `servers` until the request is done or refused for good.
    pub async fn request_any(&self, servers: &[SocketAddr], request: ServerRequest) -> ServerReply {
        let mut reply = ServerReply::Error(drover_core::rpc::RpcError::unavailable("no server"));
        for attempt in 0..120 {
            reply = self.request(servers[attempt % servers.len()], request.clone()).await;
            match &reply {
                ServerReply::Error(error) if error.retryable => tokio::time::sleep(Duration::from_millis(250)).await,
                _ => return reply,
            }
        }
        reply
    }

    pub fn node(&self) -> Node {
        let info = |controller: bool| CsiInfo {
            plugin_id: "hostpath".into(),
            alloc_id: "plugin-alloc".into(),
            healthy: true,
            health_description: "healthy".into(),
            provider: "hostpath.csi.k8s.io".into(),
            provider_version: "1.9.0".into(),
            requires_controller_plugin: true,
            controller_info: controller.then(|| CsiControllerInfo {
                supports_attach_detach: true,
                ..CsiControllerInfo::default()
            }),
            node_info: (!controller).then(|| CsiNodeInfo {
                id: format!("host-{}", self.node_id),
                max_volumes: 1_000_000,
                ..CsiNodeInfo::default()
            }),
            ..CsiInfo::default()
        };
        Node {
            id: self.node_id.clone(),
            name: self.node_id.clone(),
            rpc_addr: self.rpc_addr.to_string(),
            status: NodeStatus::Ready,
            csi_controller_plugins: [("hostpath".to_string(), info(true))].into(),
            csi_node_plugins: [("hostpath".to_string(), info(false))].into(),
            ..Node::default()
        }
    }

    pub fn alloc(&self, id: &str) -> Allocation {
        Allocation {
            id: id.to_string(),
            namespace: "default".into(),
            node_id: self.node_id.clone(),
            job_id: "app".into(),
            task_group: "web".into(),
            ..Allocation::default()
        }
    }

    pub fn claim(&self, alloc: &str, state: ClaimState) -> CsiVolumeClaim {
        CsiVolumeClaim {
            allocation_id: alloc.to_string(),
            node_id: self.node_id.clone(),
            external_node_id: String::new(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            state,
        }
    }
}

pub fn volume_body(id: &str) -> String {
    format!(
        r#"{{"Volumes":[{{"ID":"{id}","Name":"{id}","PluginID":"hostpath","RequestedCapabilities":[{{"AccessMode":"single-node-writer","AttachmentMode":"file-system"}}],"Secrets":{{"token":"do-not-leak"}}}}]}}"#
    )
}
