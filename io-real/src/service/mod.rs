//! The agent RPC service: what an agent answers on its RPC port, and how it submits requests
//! to the servers' write endpoints.
//!
//! - Raft messages and `Status.Peers` go to openraft.
//! - `Apply` (a state-machine command) is proposed locally; the caller forwards on NOT_LEADER.
//! - `Server` (a [`ServerRequest`]) is handed to the core's `RpcEndpoints` when this server
//!   leads, else forwarded once to the leader.
//! - `ClientCsi` is answered by this agent's CSI plugins through [`ClientCsi`].
//! - `NodeAllocs` (`Node.GetClientAllocs`) is a blocking read any server answers from its own
//!   applied state.
//!
//! A client-only agent has no Raft: its server requests and alloc syncs go to the servers of
//! its `client { servers = [...] }`, sticking to the one that last answered and moving on to
//! the next when the transport fails.

mod relay;
use crate::allocfs::FsRequest;
use crate::exec::ExecRequest;
use crate::logstream::LogsRequest;
use drover_core::client::AllocControl;
use drover_core::client::servers::{Next, ServerList};
use drover_core::error::{CsiCallError, CsiCallFailure};
pub use relay::{ClientCall, GcRequest, NodeCall, NodeCallKind, StatsRequest};

mod acl;
pub mod auth;
mod keyring;
mod rootkeys;
pub use acl::{AclResolveReply, AclResolveRequest};
pub use keyring::KeyringSummary;
pub use rootkeys::RootKeyRequest;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::agent;
use drover_core::fsm::{Entry, Table};
use drover_core::rpc::authz::Authority;
use drover_core::rpc::{
    self, ClientCsiReply, ClientCsiRequest, NodeAllocsReply, NodeAllocsRequest, ReqId, RpcError as CoreRpcError,
    ServerReply, ServerRequest,
};
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::rpc_error::Kind as ErrorKind;
use drover_proto::agent::v1::{
    AgentRequest, AgentResponse, ApplyResponse, JsonPayload, RaftPayload, RpcError, StatusPeersResponse,
};
use openraft::error::{ClientWriteError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};

use crate::io::{BoxFuture, Caller, CallerRole, ClientCsi, TransportError};
use crate::raft::changes::Changes;
use crate::raft::store::AppliedState;
use crate::raft::{Raft, TypeConfig};

/// The agent envelope version this build speaks (`AgentRequest.version`): the shapes of the
/// JSON payloads it carries. Bumped when a payload type changes in a way an earlier build would
/// misread (a new `Command` variant, say); requests of a newer version are refused by name.
pub const ENVELOPE_VERSION: u32 = 1;

/// How long a caller waits for the leader's endpoints to answer.
pub const SERVER_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends one request to another agent.
pub type Forwarder =
    Arc<dyn Fn(SocketAddr, AgentRequest, Duration) -> BoxFuture<Result<AgentResponse, TransportError>> + Send + Sync>;

/// Reply slots for requests handed to the core, by request id.
pub type Replies = Arc<Mutex<BTreeMap<ReqId, oneshot::Sender<ServerReply>>>>;

#[derive(Clone)]
pub struct Service {
    /// RPC counts and timings go here (`nomad.nomad.rpc.request`).
    pub metrics: Arc<crate::metrics::Metrics>,
    pub raft: Option<Raft>,
    pub node_id: u64,
    pub region: String,
    pub inbox: mpsc::UnboundedSender<agent::Input>,
    pub replies: Replies,
    pub next_req: Arc<AtomicU64>,
    pub forward: Forwarder,
    pub client_csi: Option<Arc<dyn ClientCsi>>,
    /// A server's applied state and its change counter (for blocking reads).
    pub state: Option<(AppliedState, Changes)>,
    /// A client-only agent's servers (`client { servers }`, or found through Consul), and
    /// the one to try first.
    pub servers: Arc<Mutex<ServerList<SocketAddr>>>,
    /// Finds servers in Consul's catalog (`consul { client_auto_join }`) when none is
    /// configured or none of those known answers.
    pub discover: Option<Discover>,
    /// Sends a request down the stream a client keeps attached to this server (`attach`);
    /// `None` from it when that client has none here.
    pub attached: Option<AttachedCall>,
    /// Whether clients attach over this transport at all (`Transport::can_attach`).
    pub clients_attach: bool,
    /// This agent's HTTP API, once it serves one: answers requests client-only agents hand on.
    pub http: Arc<std::sync::OnceLock<HttpHandler>>,
    /// When a leader's `AppendEntries` (its heartbeat) last reached this server.
    pub leader_contact: Arc<Mutex<Option<tokio::time::Instant>>>,
    /// A server's Raft store (its last log id answers pre-votes).
    pub raft_store: Option<crate::raft::store::Store>,
    /// A pre-vote is refused while the leader was heard within this long.
    pub pre_vote_quiet: Duration,
    /// Concurrent read indexes share one quorum round.
    pub read_index: crate::driver::ReadIndexBatcher,
    /// This server's gossip keyring (empty on clients).
    pub keyring: Arc<Mutex<crate::keyring::Keyring>>,
    /// This server's root keys (empty on clients): seal and open variables and volume secrets.
    pub keystore: crate::rootkeys::Keystore,
    /// Where the direct writes served are recorded.
    pub observer: Arc<dyn crate::io::Observer>,
    /// Regression switch: serve every call whoever made it (`RaftFaults::skip_caller_check`).
    pub skip_caller_check: bool,
    /// `acl { enabled }`: server requests are checked against their caller's token.
    pub acl_enabled: bool,
    /// Regression switch: serve server calls with no token check (`RaftFaults::skip_token_check`).
    pub skip_token_check: bool,
}

/// A Raft pre-vote request: the candidate and its last log id as (term, index).
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PreVoteRequest {
    pub candidate: u64,
    pub last_log: Option<(u64, u64)>,
}

/// An HTTP API request handed from one agent to another.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct HttpForward {
    pub method: String,
    /// Path and query.
    pub uri: String,
    #[serde(with = "crate::logstream::base64_bytes")]
    pub body: Vec<u8>,
    /// The request's ACL token, checked by the server that answers it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// Handed to the leader because only it may answer (`http/forward.rs`'s `to_leader`):
    /// answered where it lands, never handed on again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub to_leader: bool,
}

/// Its answer: status, the headers that matter (content type, Nomad's index headers) and body.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct HttpAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(with = "crate::logstream::base64_bytes")]
    pub body: Vec<u8>,
}

/// [`Service::http`].
pub type HttpHandler = Arc<dyn Fn(HttpForward) -> crate::io::BoxFuture<HttpAnswer> + Send + Sync>;

/// How long a forwarded HTTP request may take: a blocking query waits up to 5 minutes.
pub const HTTP_FORWARD_TIMEOUT: Duration = Duration::from_secs(330);

/// [`Service::attached`].
pub type AttachedCall = Arc<
    dyn Fn(String, AgentRequest, Duration) -> crate::io::BoxFuture<Option<Result<AgentResponse, String>>> + Send + Sync,
>;

/// A lookup of the servers' RPC addresses (the `rpc`-tagged server service in Consul).
pub type Discover = Arc<dyn Fn() -> crate::io::BoxFuture<Result<Vec<SocketAddr>, String>> + Send + Sync>;

/// The longest a blocking alloc sync may wait (Nomad's default blocking-query wait is 5 min;
/// a shorter one keeps a client's view of a silent server fresh).
pub const NODE_ALLOCS_MAX_WAIT: Duration = Duration::from_secs(60);

fn error_response(kind: ErrorKind, message: impl Into<String>, leader_addr: String) -> AgentResponse {
    AgentResponse {
        version: ENVELOPE_VERSION,
        body: Some(ResponseBody::Error(RpcError {
            kind: kind as i32,
            message: message.into(),
            leader_addr,
        })),
    }
}

fn raft_response<R: Serialize>(result: R) -> AgentResponse {
    AgentResponse {
        version: ENVELOPE_VERSION,
        body: Some(ResponseBody::Raft(RaftPayload {
            json: serde_json::to_vec(&result).expect("raft response serializes"),
        })),
    }
}

fn json_payload<T: Serialize>(value: &T) -> JsonPayload {
    JsonPayload {
        json: serde_json::to_vec(value).expect("payload serializes"),
    }
}

fn decode<R: DeserializeOwned>(json: &[u8]) -> Result<R, AgentResponse> {
    serde_json::from_slice(json)
        .map_err(|error| error_response(ErrorKind::Invalid, format!("malformed request: {error}"), String::new()))
}

fn server_error(message: impl Into<String>, retryable: bool) -> ServerReply {
    let kind = if retryable {
        rpc::ErrorKind::Unavailable
    } else {
        rpc::ErrorKind::Refused
    };
    ServerReply::Error(CoreRpcError::new(kind, message, retryable))
}

/// Builds the envelope for a server request.
pub fn server_envelope(region: &str, request: &ServerRequest, token: &str, forwarded: bool) -> AgentRequest {
    AgentRequest {
        forwarded,
        auth_token: token.to_string(),
        ..envelope(region, RequestBody::Server(json_payload(request)))
    }
}

/// An envelope of this build's version carrying `body`, not forwarded, for no attached node.
pub fn envelope(region: &str, body: RequestBody) -> AgentRequest {
    AgentRequest {
        attached_node: String::new(),
        region: region.to_string(),
        forwarded: false,
        version: ENVELOPE_VERSION,
        auth_token: String::new(),
        body: Some(body),
    }
}

/// Reads a server reply out of a response envelope.
pub fn server_reply(response: AgentResponse) -> ServerReply {
    match response.body {
        Some(ResponseBody::Server(payload)) => serde_json::from_slice(&payload.json)
            .unwrap_or_else(|error| server_error(format!("malformed reply: {error}"), false)),
        Some(ResponseBody::Error(error)) => {
            let retryable = !matches!(
                error.kind(),
                ErrorKind::Invalid | ErrorKind::UnsupportedVersion | ErrorKind::PermissionDenied
            );
            server_error(error.message, retryable)
        }
        other => server_error(format!("unexpected response {other:?}"), false),
    }
}

/// Builds the envelope for a `ClientCSI` call.
pub fn client_csi_envelope(region: &str, request: &ClientCsiRequest) -> AgentRequest {
    AgentRequest {
        attached_node: String::new(),
        region: region.to_string(),
        forwarded: false,
        version: crate::service::ENVELOPE_VERSION,
        auth_token: String::new(),
        body: Some(RequestBody::ClientCsi(json_payload(request))),
    }
}

/// Reads a `ClientCSI` outcome out of a response envelope.
pub fn client_csi_reply(response: AgentResponse) -> Result<ClientCsiReply, CsiCallError> {
    match response.body {
        Some(ResponseBody::ClientCsi(payload)) => {
            serde_json::from_slice::<Result<ClientCsiReply, CsiCallError>>(&payload.json)
                .unwrap_or_else(|error| Err(CsiCallError::other(format!("malformed reply: {error}"))))
        }
        Some(ResponseBody::Error(error)) => Err(CsiCallError::other(error.message)),
        other => Err(CsiCallError::other(format!("unexpected response {other:?}"))),
    }
}

/// An agent request read off the RPC port: its envelope checked and its JSON payload decoded
/// into the request it carries ([`parse_request`]).
#[derive(Debug)]
pub enum Incoming {
    /// For a client attached to this server: delivered to it as it came.
    Attached(Box<AgentRequest>),
    ClientCsi(ClientCsiRequest),
    ClientAlloc(AllocControl),
    ClientLogs(LogsRequest),
    ClientFs(FsRequest),
    ClientExec(ExecRequest),
    ClientStats(StatsRequest),
    ClientNode(relay::NodeCall),
    ClientGc(relay::GcRequest),
    Http(HttpForward),
    NodeAllocs(NodeAllocsRequest),
    Server(Box<ServerRequest>),
    AppendEntries(Box<AppendEntriesRequest<TypeConfig>>),
    PreVote(PreVoteRequest),
    ReadIndex,
    /// The leaving leader named this server its successor (its own id, if readable).
    Stand(Option<u64>),
    Keyring(crate::keyring::KeyringRequest),
    RootKey(RootKeyRequest),
    AclResolve(AclResolveRequest),
    Vote(VoteRequest<u64>),
    InstallSnapshot(Box<InstallSnapshotRequest<TypeConfig>>),
    StatusPeers,
    /// A direct write, already checked to be one a server would propose for a caller.
    Apply(Box<Entry>),
}

impl Incoming {
    /// What the call asks of its caller's certificate: servers alone drive Raft, forward to
    /// the leader and call down to clients; a client node makes the calls of a node.
    pub fn needs(&self) -> CallerRole {
        match self {
            Incoming::ClientAlloc(_)
            | Incoming::ClientLogs(_)
            | Incoming::ClientFs(_)
            | Incoming::ClientExec(_)
            | Incoming::ClientStats(_)
            | Incoming::ClientNode(_)
            | Incoming::ClientGc(_)
            | Incoming::Http(_)
            | Incoming::NodeAllocs(_)
            | Incoming::Server(_)
            | Incoming::AclResolve(_)
            | Incoming::StatusPeers => CallerRole::Node,
            Incoming::Attached(_)
            | Incoming::ClientCsi(_)
            | Incoming::AppendEntries(_)
            | Incoming::PreVote(_)
            | Incoming::ReadIndex
            | Incoming::Stand(_)
            | Incoming::Vote(_)
            | Incoming::InstallSnapshot(_)
            | Incoming::Keyring(_)
            | Incoming::RootKey(_)
            | Incoming::Apply(_) => CallerRole::Server,
        }
    }
}

/// Checks an envelope (version, region) and decodes its payload: everything an agent reads
/// from the network before acting on it, with no agent (what the fuzz targets drive). Returns
/// the request and whether it was forwarded, or the error response to send back.
pub fn parse_request(request: AgentRequest, region: &str) -> Result<(Incoming, bool), AgentResponse> {
    if request.version > ENVELOPE_VERSION {
        return Err(error_response(
            ErrorKind::UnsupportedVersion,
            format!(
                "request in agent envelope v{}; this agent reads up to v{ENVELOPE_VERSION}: upgrade it",
                request.version
            ),
            String::new(),
        ));
    }
    if request.region != region {
        return Err(error_response(
            ErrorKind::WrongRegion,
            format!(
                "request for region {:?} reached an agent of region {region:?}",
                request.region
            ),
            String::new(),
        ));
    }
    if !request.attached_node.is_empty() {
        return Ok((Incoming::Attached(Box::new(request)), false));
    }
    let forwarded = request.forwarded;
    let Some(body) = request.body else {
        return Err(error_response(ErrorKind::Invalid, "empty request", String::new()));
    };
    let incoming = match body {
        RequestBody::ClientCsi(payload) => Incoming::ClientCsi(decode(&payload.json)?),
        RequestBody::ClientAlloc(payload) => Incoming::ClientAlloc(decode(&payload.json)?),
        RequestBody::ClientLogs(payload) => Incoming::ClientLogs(decode(&payload.json)?),
        RequestBody::ClientFs(payload) => Incoming::ClientFs(decode(&payload.json)?),
        RequestBody::ClientExec(payload) => Incoming::ClientExec(decode(&payload.json)?),
        RequestBody::ClientStats(payload) => Incoming::ClientStats(decode(&payload.json)?),
        RequestBody::ClientNode(payload) => Incoming::ClientNode(decode(&payload.json)?),
        RequestBody::ClientGc(payload) => Incoming::ClientGc(decode(&payload.json)?),
        RequestBody::Http(payload) => Incoming::Http(decode(&payload.json)?),
        RequestBody::NodeAllocs(payload) => Incoming::NodeAllocs(decode(&payload.json)?),
        RequestBody::Server(payload) => Incoming::Server(decode(&payload.json)?),
        RequestBody::RaftAppendEntries(payload) => Incoming::AppendEntries(decode(&payload.json)?),
        RequestBody::RaftPreVote(payload) => Incoming::PreVote(decode(&payload.json)?),
        RequestBody::RaftReadIndex(_) => Incoming::ReadIndex,
        RequestBody::Keyring(payload) => Incoming::Keyring(decode(&payload.json)?),
        RequestBody::AclResolve(payload) => Incoming::AclResolve(decode(&payload.json)?),
        RequestBody::RootKey(payload) => Incoming::RootKey(decode(&payload.json)?),
        RequestBody::RaftStand(payload) => Incoming::Stand(serde_json::from_slice(&payload.json).ok()),
        RequestBody::RaftVote(payload) => Incoming::Vote(decode(&payload.json)?),
        RequestBody::RaftInstallSnapshot(payload) => Incoming::InstallSnapshot(decode(&payload.json)?),
        RequestBody::StatusPeers(_) => Incoming::StatusPeers,
        RequestBody::Apply(apply) => {
            let entry: Entry = decode(&apply.command_json)?;
            // Only the direct writes a server would itself propose for a caller.
            if let Err(error) = entry.command.check_direct_write() {
                return Err(error_response(ErrorKind::Invalid, error.to_string(), String::new()));
            }
            Incoming::Apply(Box::new(entry))
        }
    };
    Ok((incoming, forwarded))
}

/// An RPC's kind, for its metrics.
fn body_name(body: &RequestBody) -> &'static str {
    match body {
        RequestBody::ClientCsi(_) => "ClientCSI",
        RequestBody::ClientAlloc(_) => "ClientAlloc",
        RequestBody::ClientLogs(_) => "ClientLogs",
        RequestBody::ClientFs(_) => "ClientFS",
        RequestBody::ClientExec(_) => "ClientExec",
        RequestBody::ClientStats(_) => "ClientStats",
        RequestBody::ClientNode(_) => "ClientNode",
        RequestBody::ClientGc(_) => "ClientGC",
        RequestBody::Http(_) => "HTTP",
        RequestBody::NodeAllocs(_) => "Node.GetClientAllocs",
        RequestBody::Server(_) => "Server",
        RequestBody::RaftAppendEntries(_) => "Raft.AppendEntries",
        RequestBody::RaftPreVote(_) => "Raft.PreVote",
        RequestBody::RaftReadIndex(_) => "Raft.ReadIndex",
        RequestBody::Keyring(_) => "Keyring",
        RequestBody::AclResolve(_) => "ACL.ResolveToken",
        RequestBody::RootKey(_) => "Keyring.RootKey",
        RequestBody::RaftStand(_) => "Raft.Stand",
        RequestBody::RaftVote(_) => "Raft.Vote",
        RequestBody::RaftInstallSnapshot(_) => "Raft.InstallSnapshot",
        RequestBody::StatusPeers(_) => "Status.Peers",
        RequestBody::Apply(_) => "Raft.Apply",
    }
}

impl Service {
    pub async fn handle(&self, caller: Caller, request: AgentRequest) -> AgentResponse {
        let method = request.body.as_ref().map_or("empty", body_name);
        let started = tokio::time::Instant::now();
        let mut response = self.answer(caller, request).await;
        self.metrics.increment("nomad.nomad.rpc.request", &[("method", method)]);
        self.metrics
            .sample("nomad.nomad.rpc.request_time", &[("method", method)], started.elapsed());
        response.version = ENVELOPE_VERSION;
        response
    }

    /// Refuses a call the caller's certificate does not allow (a client certificate driving
    /// Raft or calling down to another client), before anything is decoded further or done.
    fn authorize(&self, caller: Caller, incoming: &Incoming) -> Result<(), AgentResponse> {
        let needs = incoming.needs();
        if self.skip_caller_check || caller.identity.may(needs) {
            return Ok(());
        }
        tracing::warn!(identity = ?caller.identity, ?needs, "refused an RPC: the caller's certificate does not allow it");
        Err(error_response(
            ErrorKind::PermissionDenied,
            format!(
                "Permission denied: a {:?} certificate may not make {needs:?} calls (tls {{ verify_server_hostname }})",
                caller.identity
            ),
            String::new(),
        ))
    }

    async fn answer(&self, caller: Caller, request: AgentRequest) -> AgentResponse {
        let token = request.auth_token.clone();
        let (incoming, forwarded) = match parse_request(request, &self.region) {
            Ok(parsed) => parsed,
            Err(response) => return response,
        };
        if let Err(response) = self.authorize(caller, &incoming) {
            return response;
        }
        if let Incoming::Apply(entry) = &incoming {
            if let Err(error) = self.check_direct_write(&entry.command, &token) {
                tracing::warn!(command = entry.command.name(), error = %error.message, "refused a direct write its caller may not make");
                return error_response(ErrorKind::PermissionDenied, error.message, String::new());
            }
            let response = self.answer_raft_or_refuse(incoming).await;
            if let Some(ResponseBody::Apply(apply)) = &response.body {
                self.observer.record(crate::io::AgentEvent::DirectWrite {
                    caller: caller.identity,
                    index: apply.index,
                });
            }
            return response;
        }
        let respond = |body| AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(body),
        };
        // Requests any agent answers; Raft's need a server.
        let incoming = match incoming {
            Incoming::Attached(request) => return self.deliver_attached(*request).await,
            Incoming::Keyring(request) if self.raft.is_some() => return self.keyring_local(&request),
            Incoming::RootKey(request) if self.raft.is_some() => return self.root_key_local(request),
            Incoming::AclResolve(request) => {
                return self.acl_resolve_local(&request).unwrap_or_else(|| {
                    error_response(ErrorKind::Invalid, "this agent is not a server", String::new())
                });
            }
            Incoming::ClientCsi(request) => return self.client_csi(request).await,
            // An operator's request for one of a client's allocations (`relay.rs`).
            Incoming::ClientAlloc(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientLogs(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientFs(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientExec(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientStats(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientGc(request) => return self.relayed(request, forwarded).await,
            Incoming::ClientNode(call) => return self.node_relayed(call, forwarded).await,
            Incoming::Http(request) => {
                let Some(handler) = self.http.get() else {
                    return error_response(ErrorKind::Invalid, "this agent serves no HTTP API", String::new());
                };
                let answer = handler(request).await;
                return respond(ResponseBody::Http(json_payload(&answer)));
            }
            Incoming::NodeAllocs(request) => {
                let reply = self.local_node_allocs(request).await;
                return respond(ResponseBody::NodeAllocs(json_payload(&reply)));
            }
            Incoming::Server(request) => {
                let reply = self.server_request(*request, &token, forwarded).await;
                return respond(ResponseBody::Server(json_payload(&reply)));
            }
            raft_request => raft_request,
        };
        self.answer_raft_or_refuse(incoming).await
    }

    async fn answer_raft_or_refuse(&self, incoming: Incoming) -> AgentResponse {
        let Some(raft) = &self.raft else {
            return error_response(ErrorKind::Invalid, "this agent is not a server", String::new());
        };
        self.answer_raft(raft, incoming).await
    }

    async fn answer_raft(&self, raft: &Raft, incoming: Incoming) -> AgentResponse {
        let respond = |body| AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(body),
        };
        match incoming {
            Incoming::AppendEntries(rpc) => {
                *self.leader_contact.lock().expect("contact lock") = Some(tokio::time::Instant::now());
                raft_response(raft.append_entries(*rpc).await)
            }
            Incoming::PreVote(request) => {
                let granted = self.pre_vote(raft, &request);
                tracing::debug!(candidate = request.candidate, granted, "pre-vote");
                respond(ResponseBody::RaftPreVote(json_payload(&granted)))
            }
            Incoming::ReadIndex => respond(ResponseBody::RaftReadIndex(json_payload(
                &self
                    .read_index
                    .read_index(raft)
                    .await
                    .map_err(|error| error.to_string()),
            ))),
            Incoming::Stand(leader) => {
                tracing::info!(?leader, "the leaving leader named this server its successor");
                let _ = self
                    .inbox
                    .send(agent::Input::Server(drover_core::server::Input::StandForElection));
                respond(ResponseBody::RaftStand(json_payload(&Ok::<(), String>(()))))
            }
            Incoming::Vote(rpc) => raft_response(raft.vote(rpc).await),
            Incoming::InstallSnapshot(rpc) => raft_response(raft.install_snapshot(*rpc).await),
            Incoming::StatusPeers => {
                let metrics = raft.metrics().borrow().clone();
                let peers = metrics
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(_, node)| node.rpc_addr.clone())
                    .collect();
                respond(ResponseBody::StatusPeers(StatusPeersResponse { peers }))
            }
            Incoming::Apply(entry) => {
                // Stamped with this leader's clock rather than the caller's.
                let entry = Entry {
                    at_unix_ms: crate::driver::unix_millis(),
                    command: entry.command,
                };
                match raft.client_write(entry).await {
                    Ok(response) => respond(ResponseBody::Apply(ApplyResponse {
                        index: response.log_id.index,
                        response_json: serde_json::to_vec(&response.data).expect("response serializes"),
                    })),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => error_response(
                        ErrorKind::NotLeader,
                        "not the leader",
                        forward.leader_node.map(|node| node.rpc_addr).unwrap_or_default(),
                    ),
                    Err(error) => error_response(ErrorKind::Internal, error.to_string(), String::new()),
                }
            }
            Incoming::Attached(_)
            | Incoming::ClientCsi(_)
            | Incoming::ClientAlloc(_)
            | Incoming::ClientLogs(_)
            | Incoming::ClientFs(_)
            | Incoming::ClientExec(_)
            | Incoming::ClientStats(_)
            | Incoming::ClientNode(_)
            | Incoming::ClientGc(_)
            | Incoming::Http(_)
            | Incoming::NodeAllocs(_)
            | Incoming::AclResolve(_)
            | Incoming::Server(_) => unreachable!("answered by Service::answer"),
            Incoming::Keyring(_) | Incoming::RootKey(_) => {
                error_response(ErrorKind::Invalid, "this agent is not a server", String::new())
            }
        }
    }

    async fn client_csi(&self, request: ClientCsiRequest) -> AgentResponse {
        let result = match &self.client_csi {
            Some(plugins) => plugins.call(request).await,
            None => Err(CsiCallError::new(
                CsiCallFailure::UnknownNode,
                "Unknown node: this agent runs no CSI plugins",
            )),
        };
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::ClientCsi(json_payload(&result))),
        }
    }

    /// Submits a request to the write endpoints: to the core when this server leads or no
    /// server is known to (the core holds it until one is), else to the leader (once: a
    /// forwarded request that finds yet another leader here fails as retryable).
    /// A server request with the caller's ACL `token` (empty for none), answered by the
    /// leader, which checks the token against what the request needs.
    pub async fn server_request(&self, request: ServerRequest, token: &str, forwarded: bool) -> ServerReply {
        let Some(raft) = &self.raft else {
            if forwarded || !self.knows_servers() {
                return server_error("this agent is not a server", true);
            }
            let envelope = server_envelope(&self.region, &request, token, false);
            return match self.call_servers(envelope, SERVER_REQUEST_TIMEOUT).await {
                Ok(response) => server_reply(response),
                Err(message) => server_error(message, true),
            };
        };
        let metrics = raft.metrics().borrow().clone();
        // Led here, or by no one yet: the core serves it, or holds it until a leader is known
        // (Nomad's RPC hold; `rpc::RpcEndpoints::set_holding`).
        if metrics.current_leader.is_none_or(|leader| leader == self.node_id) {
            return self.submit_local(request, token).await;
        }
        if forwarded {
            return server_error("No cluster leader", true);
        }
        let leader_addr = metrics.current_leader.and_then(|leader| {
            metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.rpc_addr.clone())
        });
        let Some(addr) = leader_addr.and_then(|addr| addr.parse().ok()) else {
            return server_error("No cluster leader", true);
        };
        let envelope = server_envelope(&self.region, &request, token, true);
        match (self.forward)(addr, envelope, SERVER_REQUEST_TIMEOUT).await {
            Ok(response) => server_reply(response),
            Err(error) => server_error(format!("forwarding to the leader failed: {error}"), true),
        }
    }

    /// Raft's pre-vote rule as the core decides it (`election::may_pre_vote`, then
    /// `election::candidate_up_to_date` against our log, read only when the first allows).
    fn pre_vote(&self, raft: &Raft, request: &PreVoteRequest) -> bool {
        let metrics = raft.metrics().borrow().clone();
        let heard = drover_core::election::LeaderHeard {
            leading: metrics.state == openraft::ServerState::Leader,
            following: metrics.current_leader.is_some_and(|leader| leader != self.node_id),
            silent_for: self.leader_contact.lock().expect("contact lock").map(|at| at.elapsed()),
            quiet: self.pre_vote_quiet,
        };
        if !drover_core::election::may_pre_vote(&heard) {
            return false;
        }
        let Some(store) = &self.raft_store else { return false };
        let Ok(mine) = store.last_log_id() else { return false };
        drover_core::election::candidate_up_to_date(request.last_log, mine.map(|log| (log.leader_id.term, log.index)))
    }

    /// `Node.GetClientAllocs`: from this server's state, else from the configured servers.
    pub async fn node_allocs(&self, request: NodeAllocsRequest) -> Result<NodeAllocsReply, CoreRpcError> {
        if self.state.is_some() {
            return self.local_node_allocs(request).await;
        }
        if !self.knows_servers() {
            return Err(CoreRpcError::unavailable(
                "this agent is not a server and knows no servers",
            ));
        }
        let wait = Duration::from_millis(request.max_wait_ms).min(NODE_ALLOCS_MAX_WAIT);
        let envelope = AgentRequest {
            attached_node: String::new(),
            region: self.region.clone(),
            forwarded: false,
            version: crate::service::ENVELOPE_VERSION,
            auth_token: String::new(),
            body: Some(RequestBody::NodeAllocs(json_payload(&request))),
        };
        let unavailable = |message: String| CoreRpcError::unavailable(message);
        match self.call_servers(envelope, wait + Duration::from_secs(10)).await {
            Ok(AgentResponse {
                body: Some(ResponseBody::NodeAllocs(payload)),
                ..
            }) => serde_json::from_slice::<Result<NodeAllocsReply, CoreRpcError>>(&payload.json)
                .unwrap_or_else(|error| Err(unavailable(format!("malformed reply: {error}")))),
            Ok(AgentResponse {
                body: Some(ResponseBody::Error(error)),
                ..
            }) => Err(unavailable(error.message)),
            Ok(other) => Err(unavailable(format!("unexpected response {other:?}"))),
            Err(message) => Err(unavailable(message)),
        }
    }

    /// The blocking read itself: waits until the applied index passes `min_index` (or the
    /// wait ends), then lists the node's allocations with their jobs.
    async fn local_node_allocs(&self, request: NodeAllocsRequest) -> Result<NodeAllocsReply, CoreRpcError> {
        let Some((applied, changes)) = &self.state else {
            return Err(CoreRpcError::unavailable("this agent is not a server"));
        };
        let index = || applied.last_applied_index();
        let wait = Duration::from_millis(request.max_wait_ms).min(NODE_ALLOCS_MAX_WAIT);
        let deadline = tokio::time::Instant::now() + wait;
        // Nomad's client pulls only the allocations whose modify index moved; here the
        // whole view goes, so the wait also skips changes that leave it as the client has it.
        // The view is made of the allocations and jobs tables alone: it is worked out again
        // (a pass over the node's allocations) only when one of them moved, not on every
        // applied entry — with 15,000 allocations on a node and ~1,000 entries a second
        // that pass was a busy server's largest cost.
        let mut checked: Option<((u64, u64), bool)> = None;
        let mut unchanged = |known: u64| {
            applied.read(|applied| {
                let tables = (
                    applied.state.table_index(Table::Allocs),
                    applied.state.table_index(Table::Jobs),
                );
                match checked {
                    Some((at, same)) if at == tables => same,
                    _ => {
                        let same = applied.state.node_allocs_view(&request.node_id) == known;
                        checked = Some((tables, same));
                        same
                    }
                }
            })
        };
        loop {
            let seen = changes.count();
            if index() > request.min_index && !request.known_view.is_some_and(&mut unchanged) {
                break;
            }
            if !changes.changed_since(seen, deadline).await {
                break;
            }
        }
        Ok(applied.read(|applied| {
            let (allocs, jobs, finished_elsewhere) = applied.state.node_allocs(&request.node_id);
            NodeAllocsReply {
                index: applied.last_applied.map(|log| log.index).unwrap_or(0),
                allocs,
                jobs,
                finished_elsewhere,
                view: applied.state.node_allocs_view(&request.node_id),
            }
        }))
    }

    /// A client-only agent's HTTP API request, answered by a server's API.
    pub async fn forward_http(&self, request: HttpForward) -> Result<HttpAnswer, String> {
        let envelope = AgentRequest {
            attached_node: String::new(),
            region: self.region.clone(),
            forwarded: false,
            version: ENVELOPE_VERSION,
            auth_token: String::new(),
            body: Some(RequestBody::Http(json_payload(&request))),
        };
        match self.call_servers(envelope, HTTP_FORWARD_TIMEOUT).await?.body {
            Some(ResponseBody::Http(payload)) => {
                serde_json::from_slice(&payload.json).map_err(|error| format!("malformed reply: {error}"))
            }
            Some(ResponseBody::Error(error)) => Err(error.message),
            other => Err(format!("unexpected response {other:?}")),
        }
    }

    /// Hands an HTTP API request to the server at `addr`.
    pub async fn forward_http_to(&self, addr: SocketAddr, request: HttpForward) -> Result<HttpAnswer, String> {
        let envelope = AgentRequest {
            attached_node: String::new(),
            region: self.region.clone(),
            forwarded: true,
            version: ENVELOPE_VERSION,
            auth_token: String::new(),
            body: Some(RequestBody::Http(json_payload(&request))),
        };
        match (self.forward)(addr, envelope, HTTP_FORWARD_TIMEOUT).await {
            Ok(AgentResponse {
                body: Some(ResponseBody::Http(payload)),
                ..
            }) => serde_json::from_slice(&payload.json).map_err(|error| format!("malformed reply: {error}")),
            Ok(AgentResponse {
                body: Some(ResponseBody::Error(error)),
                ..
            }) => Err(error.message),
            Ok(other) => Err(format!("unexpected response {other:?}")),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Sends `envelope` to the servers in the order the core's [`ServerList`] decides (the
    /// last one that answered first, a Consul lookup when none is known or none answered).
    /// Errors only when none answered.
    async fn call_servers(&self, envelope: AgentRequest, timeout: Duration) -> Result<AgentResponse, String> {
        if crate::buggify::fires(crate::buggify::CLIENT_RPC_UNREACHABLE) {
            return Err("no server reachable (injected)".into());
        }
        let mut failures = Vec::new();
        let mut round = self.servers.lock().expect("servers lock").round();
        loop {
            let next = self.servers.lock().expect("servers lock").next(&mut round);
            match next {
                Next::Call(addr) => match (self.forward)(addr, envelope.clone(), timeout).await {
                    Ok(response) => {
                        self.servers.lock().expect("servers lock").answered(&round);
                        return Ok(response);
                    }
                    Err(error) => failures.push(format!("{addr}: {error}")),
                },
                Next::Discover => {
                    let found = self.discover_servers(&mut failures).await;
                    self.servers.lock().expect("servers lock").discovered(&mut round, found);
                }
                Next::Exhausted => break,
            }
        }
        Err(format!("no server reachable ({})", failures.join("; ")))
    }

    /// Whether this agent can reach servers: configured ones, or Consul to find them.
    fn knows_servers(&self) -> bool {
        self.servers.lock().expect("servers lock").is_known()
    }

    /// Asks Consul for the servers' RPC addresses (`client_auto_join`).
    async fn discover_servers(&self, failures: &mut Vec<String>) -> Vec<SocketAddr> {
        let Some(discover) = &self.discover else {
            return Vec::new();
        };
        match discover().await {
            Ok(found) if !found.is_empty() => {
                tracing::info!(servers = ?found, "found servers through Consul");
                found
            }
            Ok(_) => {
                failures.push("Consul lists no servers".into());
                Vec::new()
            }
            Err(error) => {
                failures.push(format!("Consul: {error}"));
                Vec::new()
            }
        }
    }

    /// What `token` proves on this server: everything with ACLs off, else its ACL resolved
    /// from the applied state (expiry by the wall clock, as the HTTP gate's).
    fn authority(&self, token: &str) -> Authority {
        let (true, false, Some((applied, _))) = (self.acl_enabled, self.skip_token_check, &self.state) else {
            return Authority::Open;
        };
        applied.read(|applied| {
            let now = crate::clock::unix_millis().max(applied.state.last_applied_time_ms());
            match applied.state.acl().resolve(token, now) {
                Ok(acl) => Authority::Acl(acl),
                Err(error) => Authority::Unresolved(error),
            }
        })
    }

    /// Whether the caller of the HTTP request a direct write was made for may have it applied:
    /// its token, forwarded with the write, against what the write needs
    /// ([`drover_core::rpc::authz::check_command`]).
    fn check_direct_write(&self, command: &drover_core::fsm::Command, token: &str) -> Result<(), CoreRpcError> {
        let authority = self.authority(token);
        let Some((applied, _)) = &self.state else {
            return Ok(());
        };
        applied.read(|applied| drover_core::rpc::authz::check_command(command, &authority, token, &applied.state))
    }

    async fn submit_local(&self, request: ServerRequest, token: &str) -> ServerReply {
        let authority = self.authority(token);
        let req = self.next_req.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.replies.lock().expect("replies lock").insert(req, tx);
        if self
            .inbox
            .send(agent::Input::Rpc(rpc::Input::Request {
                req,
                request,
                authority,
            }))
            .is_err()
        {
            self.replies.lock().expect("replies lock").remove(&req);
            return server_error("agent is shutting down", true);
        }
        match tokio::time::timeout(SERVER_REQUEST_TIMEOUT, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => server_error("agent is shutting down", true),
            Err(_) => {
                self.replies.lock().expect("replies lock").remove(&req);
                server_error("timed out waiting for the leader", true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Identity;
    use prost::Message;

    const UNVERIFIED: Caller = Caller::new(Identity::Unverified);

    fn client_only_service() -> Service {
        let (inbox, _) = mpsc::unbounded_channel();
        Service {
            raft: None,
            node_id: 1,
            region: "global".into(),
            inbox,
            replies: Replies::default(),
            next_req: Arc::default(),
            forward: Arc::new(|addr, _, _| {
                Box::pin(async move {
                    Err(TransportError::Unreachable {
                        addr,
                        reason: "no network in this test".into(),
                    })
                })
            }),
            client_csi: None,
            state: None,
            servers: Arc::new(Mutex::new(ServerList::new(Vec::new(), false))),
            discover: None,
            attached: None,
            http: Arc::default(),
            leader_contact: Arc::default(),
            raft_store: None,
            pre_vote_quiet: Duration::from_millis(100),
            read_index: crate::driver::ReadIndexBatcher::default(),
            clients_attach: false,
            keystore: crate::rootkeys::Keystore::in_memory(),
            keyring: Arc::default(),
            observer: Arc::new(crate::io::TracingObserver),
            skip_caller_check: false,
            acl_enabled: false,
            skip_token_check: false,
            metrics: crate::metrics::Metrics::new(),
        }
    }

    fn client_csi_request(version: u32, json: &[u8]) -> AgentRequest {
        AgentRequest {
            attached_node: String::new(),
            region: "global".into(),
            forwarded: false,
            version,
            auth_token: String::new(),
            body: Some(RequestBody::ClientCsi(JsonPayload { json: json.to_vec() })),
        }
    }

    fn node_detach() -> Vec<u8> {
        let request = ClientCsiRequest::NodeDetach(drover_core::csi::unpublish::NodeDetachRequest {
            node_id: "n1".into(),
            plugin_id: "p".into(),
            volume_id: "v".into(),
            volume_namespace: "default".into(),
            external_id: "v".into(),
            alloc_id: "a".into(),
            attachment_mode: drover_core::structs::AttachmentMode::FileSystem,
            access_mode: drover_core::structs::AccessMode::SingleNodeWriter,
            read_only: false,
        });
        serde_json::to_vec(&request).unwrap()
    }

    /// An `AgentRequest` exactly as builds before envelope versions encoded it (region
    /// "global", a `ClientCsi` body of `{}`): it still decodes, as version 0, and is answered.
    const UNVERSIONED_REQUEST_HEX: &str = "0a06676c6f62616c8201040a027b7d";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn envelopes_of_earlier_versions_are_answered_and_newer_ones_refused_by_name() {
        let old = AgentRequest::decode(hex(UNVERSIONED_REQUEST_HEX).as_slice()).unwrap();
        assert_eq!(old, client_csi_request(0, b"{}"));
        let service = client_only_service();

        let answered = service.handle(UNVERIFIED, client_csi_request(0, &node_detach())).await;
        assert_eq!(answered.version, ENVELOPE_VERSION);
        assert!(
            matches!(answered.body, Some(ResponseBody::ClientCsi(_))),
            "{answered:?}"
        );

        let newer = service
            .handle(UNVERIFIED, client_csi_request(ENVELOPE_VERSION + 1, &node_detach()))
            .await;
        let Some(ResponseBody::Error(error)) = newer.body else {
            panic!("{newer:?}")
        };
        assert_eq!(error.kind(), ErrorKind::UnsupportedVersion);
        assert_eq!(
            error.message,
            "request in agent envelope v2; this agent reads up to v1: upgrade it"
        );
        assert_eq!(
            server_reply(AgentResponse {
                version: ENVELOPE_VERSION,
                body: Some(ResponseBody::Error(error)),
            }),
            server_error(
                "request in agent envelope v2; this agent reads up to v1: upgrade it",
                false
            ),
            "a refused version is not retried"
        );
    }
}
