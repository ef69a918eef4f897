//! The driver: runs the core [`Agent`] machine against the I/O traits.
//!
//! Written once, used twice: production wires it to tonic, UDP, redb files and Consul's HTTP
//! API (this crate); the simulation wires it to madsim's network, a crash-prone disk and a
//! faulty Consul (`drover-io-sim`). Everything here is plumbing: each action the core emits is
//! started as a task whose outcome is posted back to the core as an input with the same
//! operation id. Deadlines belong to the core; the driver only sleeps until `poll_timeout`.

use drover_core::error::Failure;
use drover_core::error::{AllocCallError, CsiCallError};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::agent::{self, Agent, Boot};
use drover_core::bootstrap::Peer;
use drover_core::config::AgentConfig;
use drover_core::fsm::{Command, Entry, Response};
use drover_core::rpc::{self, ClientCsiRequest, NodeAllocsReply, NodeAllocsRequest, ServerReply, ServerRequest};
use drover_core::server::{self, RaftRole, RaftView, ServerStatus};
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::rpc_error::Kind as ErrorKind;
use drover_proto::agent::v1::{AgentRequest, ApplyRequest, StatusPeersRequest};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use tokio::sync::{mpsc, watch};

use crate::io::{AgentEvent, ClientCsi, Consul, GossipSocket, Observer, RpcHandler, ServiceRegistration, Transport};
use crate::keyring::{Keyring, Opened};
use crate::raft::changes::Changes;
use crate::raft::network::NetworkFactory;
use crate::raft::store::{AppliedState, ApplyHook, LogStore, StateMachine, Store, StoreError, VoteHook};
use crate::raft::{Raft, RaftMetrics, ServerNode};
use crate::service::{Replies, Service, client_csi_envelope, client_csi_reply};

/// Deadline for one forwarded write or `Status.Peers` call at the transport level; the core's
/// own deadlines are usually shorter and win.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
const GOSSIP_PACKET_MAX: usize = 65_536;

/// Everything the driver needs from the outside world.
pub struct AgentParts<T, C, O> {
    pub config: AgentConfig,
    pub db: redb::Database,
    pub transport: T,
    pub consul: C,
    pub observer: Arc<O>,
    /// This agent's CSI plugins, when it is a client that runs any.
    pub client_csi: Option<Arc<dyn ClientCsi>>,
    /// How slow the disk under `db` is, when something other than redb's own I/O says so
    /// (the simulation's slow disks); `None` in production.
    pub disk_latency: Option<crate::raft::store::DiskLatency>,
    /// A server's root keystore kept by the caller (a simulation keeps one per server beside
    /// its disk, so a restart finds its keys as a real one finds its files); `None`: the one
    /// under `<data_dir>/server/keystore`.
    pub keystore: Option<crate::rootkeys::Keystore>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("invalid Raft configuration: {0}")]
    RaftConfig(String),
    #[error("failed to start Raft: {0}")]
    Raft(String),
    #[error("gossip keyring: {0}")]
    Keyring(#[from] crate::keyring::KeyringError),
    #[error("root keyring: {0}")]
    RootKeys(#[from] crate::rootkeys::RootKeyError),
    #[error("failed to bind {what} on {addr}: {error}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("No cluster leader")]
    NoLeader,
    #[error("this agent is not a server")]
    NotServer,
    #[error("forwarding to the leader failed: {0}")]
    Forward(String),
    #[error("{0}")]
    Raft(String),
    /// The command is not a valid direct write (`Command::check_direct_write`).
    #[error("{0}")]
    Invalid(String),
}

/// What the HTTP API shows about this agent; republished after every step.
#[derive(Clone, Debug, Default)]
pub struct AgentStatus {
    pub server: Option<ServerStatus>,
    pub raft: Option<RaftSummary>,
}

/// The servers of a Raft configuration by id, each with whether it votes.
pub type Peers = Arc<BTreeMap<u64, (ServerNode, bool)>>;

/// A follower as its leader sees it: the last log index it matched, and how long ago it last
/// answered.
pub type Replication = (Option<u64>, Option<Duration>);

#[derive(Clone, Debug, Default)]
pub struct RaftSummary {
    pub role: Option<RaftRole>,
    pub term: u64,
    pub leader: Option<(u64, ServerNode)>,
    /// Every server in the Raft configuration (voters and non-voters), by id; shared by
    /// every status published under the same configuration.
    pub peers: Peers,
    pub last_log_index: Option<u64>,
    pub last_applied: Option<u64>,
    pub commit_index: Option<u64>,
    pub millis_since_quorum_ack: Option<u64>,
}

mod reads;
mod sealed;
pub use reads::ReadIndexBatcher;
pub use reads::{READ_BARRIER_TIMEOUT, ReadError};

/// A running agent.
#[derive(Clone)]
pub struct AgentHandle {
    inner: Arc<Inner>,
}

struct Inner {
    config: AgentConfig,
    node_id: u64,
    status: watch::Receiver<AgentStatus>,
    raft: Option<Raft>,
    applied: Option<AppliedState>,
    changes: Option<Changes>,
    service: Service,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// Where the agent's events go; the client half records its own there too.
    observer: Arc<dyn Observer>,
    /// Who answered this server's Raft RPCs, and when (`None` on client-only agents).
    reachability: Option<crate::raft::network::Reachability>,
    /// The event stream's buffer (`None` on client-only agents).
    events: Option<Arc<crate::events::EventBroker>>,
    /// This agent's metrics (`/v1/metrics`).
    metrics: Arc<crate::metrics::Metrics>,
    started: tokio::time::Instant,
}

impl AgentHandle {
    pub fn config(&self) -> &AgentConfig {
        &self.inner.config
    }

    /// The servers this agent's client talks to: those configured or found, else (a server
    /// that is its own client) this server. `None` without a client.
    pub fn client_servers(&self) -> Option<Vec<String>> {
        let config = &self.inner.config;
        if !(config.client.enabled || config.dev_mode) {
            return None;
        }
        let known: Vec<String> = self
            .inner
            .service
            .servers
            .lock()
            .expect("servers lock")
            .servers()
            .iter()
            .map(ToString::to_string)
            .collect();
        if !known.is_empty() || !config.server.enabled {
            return Some(known);
        }
        let advertise = config.advertise.rpc;
        Some(vec![advertise.to_string()])
    }

    /// Replaces the client's server list (`PUT /v1/agent/servers`); the next call starts at
    /// the first.
    pub fn set_client_servers(&self, servers: Vec<std::net::SocketAddr>) {
        self.inner
            .service
            .servers
            .lock()
            .expect("servers lock")
            .replace(servers);
    }

    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// The agent's event observer (tracing in production, the trace in the simulation).
    pub fn observer(&self) -> Arc<dyn Observer> {
        self.inner.observer.clone()
    }

    pub fn status(&self) -> AgentStatus {
        self.inner.status.borrow().clone()
    }

    /// Resolves when the status changes.
    pub fn status_watch(&self) -> watch::Receiver<AgentStatus> {
        self.inner.status.clone()
    }

    /// What the leader knows of its followers' replication: each one's matched log index
    /// and how long ago it last answered (`None` unless this server leads).
    pub fn replication(&self) -> Option<BTreeMap<u64, Replication>> {
        let raft = self.inner.raft.as_ref()?;
        let replication = raft.metrics().borrow().replication.clone()?;
        let contacts = self
            .inner
            .reachability
            .as_ref()
            .map(|reachability| reachability.last_contacts())
            .unwrap_or_default();
        Some(
            replication
                .into_iter()
                .map(|(id, matched)| (id, (matched.map(|log| log.index), contacts.get(&id).copied())))
                .collect(),
        )
    }

    /// `server join`: this server announces itself to each gossip address (`false` on a
    /// client-only agent, which has no gossip).
    pub fn gossip_join(&self, addrs: Vec<SocketAddr>) -> bool {
        if !self.is_server() {
            return false;
        }
        let input = agent::Input::Server(server::Input::Join { addrs });
        self.inner.service.inbox.send(input).is_ok()
    }

    /// Hands an HTTP API request to one server (the leader, for what only it knows).
    pub async fn forward_http_to(
        &self,
        addr: SocketAddr,
        request: crate::service::HttpForward,
    ) -> Result<crate::service::HttpAnswer, String> {
        self.inner.service.forward_http_to(addr, request).await
    }

    /// This agent's metrics, and how long it has run.
    pub fn metrics(&self) -> (Arc<crate::metrics::Metrics>, Duration) {
        (self.inner.metrics.clone(), self.inner.started.elapsed())
    }

    /// Gauges of what this agent's client runs (none without a client).
    pub fn client_gauges(&self) -> Vec<crate::io::LabelledGauge> {
        self.inner
            .service
            .client_csi
            .as_ref()
            .map(|client| client.gauges())
            .unwrap_or_default()
    }

    /// The event stream's buffer: what each applied entry changed (`None` on client-only
    /// agents).
    pub fn events(&self) -> Option<Arc<crate::events::EventBroker>> {
        self.inner.events.clone()
    }

    /// Reads the applied server state.
    pub fn read_state<R>(&self, read: impl FnOnce(&drover_core::fsm::ServerState) -> R) -> Option<R> {
        let applied = self.inner.applied.as_ref()?;
        Some(applied.read(|applied| read(&applied.state)))
    }

    /// The applied state as it is now, an immutable version to read for as long as one likes
    /// (`None` on client-only agents).
    pub fn state_version(&self) -> Option<std::sync::Arc<crate::raft::store::Applied>> {
        Some(self.inner.applied.as_ref()?.snapshot())
    }

    /// Changes whenever the applied server state changes (`None` on client-only agents).
    pub fn state_changes(&self) -> Option<Changes> {
        self.inner.changes.clone()
    }

    /// Proposes `command` through Raft (forwarding to the leader when needed) and waits until it
    /// is applied. Returns the log index and the state machine's response.
    pub async fn apply(&self, command: Command) -> Result<(u64, Response), ApplyError> {
        let raft = self.inner.raft.as_ref().ok_or(ApplyError::NotServer)?;
        command
            .check_direct_write()
            .map_err(|error| ApplyError::Invalid(error.to_string()))?;
        let entry = Entry {
            at_unix_ms: unix_millis(),
            command,
        };
        match raft.client_write(entry.clone()).await {
            Ok(response) => Ok((response.log_id.index, response.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                let Some(node) = forward.leader_node else {
                    return Err(ApplyError::NoLeader);
                };
                let addr: SocketAddr = node
                    .rpc_addr
                    .parse()
                    .map_err(|_| ApplyError::Forward(format!("bad leader address {}", node.rpc_addr)))?;
                let request = AgentRequest {
                    attached_node: String::new(),
                    region: self.inner.config.region.clone(),
                    forwarded: true,
                    version: crate::service::ENVELOPE_VERSION,
                    auth_token: crate::service::auth::caller_token(),
                    body: Some(RequestBody::Apply(ApplyRequest {
                        command_json: serde_json::to_vec(&entry).expect("entry serializes"),
                    })),
                };
                let response = (self.inner.service.forward)(addr, request, RPC_TIMEOUT)
                    .await
                    .map_err(|error| ApplyError::Forward(error.to_string()))?;
                match response.body {
                    Some(ResponseBody::Apply(apply)) => {
                        let data = serde_json::from_slice(&apply.response_json)
                            .map_err(|error| ApplyError::Forward(error.to_string()))?;
                        // Read-your-writes: what the caller reads back next comes from this
                        // server's state, which may not have applied the leader's entry yet.
                        self.applied_locally(apply.index).await;
                        Ok((apply.index, data))
                    }
                    Some(ResponseBody::Error(error)) if error.kind() == ErrorKind::NotLeader => {
                        Err(ApplyError::NoLeader)
                    }
                    Some(ResponseBody::Error(error)) if error.kind() == ErrorKind::Invalid => {
                        Err(ApplyError::Invalid(error.message))
                    }
                    Some(ResponseBody::Error(error)) => Err(ApplyError::Forward(error.message)),
                    other => Err(ApplyError::Forward(format!("unexpected response {other:?}"))),
                }
            }
            Err(error) => Err(ApplyError::Raft(error.to_string())),
        }
    }

    /// Submits a request to the servers' write endpoints (through the leader) and waits for
    /// its reply.
    /// The request carries the ACL token of the HTTP request this task serves (none outside
    /// one: a client's own node calls prove themselves by the node secret they carry).
    pub async fn request(&self, request: ServerRequest) -> ServerReply {
        let token = crate::service::auth::caller_token();
        self.inner.service.server_request(request, &token, false).await
    }

    /// [`AgentHandle::request`], then, on a server, waits until this server has applied the
    /// write itself (at most [`READ_YOUR_WRITES_WAIT`]): a write forwarded to the leader is
    /// answered once the leader applied it, and a read through this same agent right after
    /// must see it. The HTTP API's writes go through here.
    pub async fn request_applied(&self, request: ServerRequest) -> ServerReply {
        let reply = self.request(request).await;
        if let Some(index) = reply.index() {
            self.applied_locally(index).await;
        }
        reply
    }

    /// Waits until this server has applied `index` (at most [`READ_YOUR_WRITES_WAIT`]); at
    /// once on an agent without state.
    async fn applied_locally(&self, index: u64) {
        let (Some(applied), Some(changes)) = (&self.inner.applied, &self.inner.changes) else {
            return;
        };
        let deadline = tokio::time::Instant::now() + READ_YOUR_WRITES_WAIT;
        loop {
            let seen = changes.count();
            if applied.last_applied_index() >= index || !changes.changed_since(seen, deadline).await {
                return;
            }
        }
    }

    /// An operator's restart or signal of an allocation, carried to the client that runs it
    /// (see `service::relay`).
    pub async fn alloc_control(&self, request: drover_core::client::AllocControl) -> Result<(), AllocCallError> {
        self.inner.service.client_call(request, false).await
    }

    /// Whether this server knows a live leader, and how long ago it last heard from it
    /// (Nomad's `X-Nomad-KnownLeader` and `X-Nomad-LastContact`). A follower that has not
    /// heard the leader's heartbeat for `raft_failure_timeout` (when it stands for election
    /// itself) no longer counts it as known: it never names a dead leader.
    pub fn leader_contact(&self) -> (bool, u64) {
        let status = self.status();
        let Some((leader, _)) = status.raft.as_ref().and_then(|raft| raft.leader.as_ref()) else {
            return (false, 0);
        };
        if *leader == self.inner.node_id {
            return (true, 0);
        }
        let last = *self.inner.service.leader_contact.lock().expect("contact lock");
        let Some(last) = last else {
            return (true, 0);
        };
        let since = last.elapsed();
        let lost = self.inner.config.server.timing.raft_failure_timeout;
        (since <= lost, since.as_millis() as u64)
    }

    /// Whether this agent is a server (holds the cluster state).
    /// `operator gossip keyring`: `request` applied on this server and every other live
    /// server of its region that gossip knows; `None` on a client-only agent.
    pub async fn keyring(&self, request: crate::keyring::KeyringRequest) -> Option<crate::service::KeyringSummary> {
        let status = self.status();
        let server = status.server.as_ref()?;
        let region = &self.inner.config.region;
        let mut me = format!("{}.{region}", self.inner.config.name);
        let mut peers = Vec::new();
        for member in &server.members {
            let Some(tags) = member.id.tags.as_ref().filter(|tags| &tags.region == region) else {
                continue;
            };
            if tags.id == server.node_id {
                me = member.id.name.clone();
            } else if member.status.as_serf_str() == "alive" {
                peers.push((member.id.name.clone(), tags.rpc_addr));
            }
        }
        Some(self.inner.service.keyring_everywhere(&me, &peers, request).await)
    }

    pub fn is_server(&self) -> bool {
        self.inner.applied.is_some()
    }

    /// Answers HTTP requests other agents hand to this one with `handler` (this agent's API).
    pub fn serve_forwarded_http(&self, handler: crate::service::HttpHandler) {
        let _ = self.inner.service.http.set(handler);
    }

    /// Hands an HTTP API request to a server (a client-only agent's reads and writes).
    pub async fn forward_http(
        &self,
        request: crate::service::HttpForward,
    ) -> Result<crate::service::HttpAnswer, String> {
        self.inner.service.forward_http(request).await
    }

    /// An allocation's resource usage (Nomad's JSON), from the client that runs it.
    pub async fn client_stats(&self, alloc_id: String) -> Result<serde_json::Value, AllocCallError> {
        self.inner
            .service
            .client_call(crate::service::StatsRequest { alloc_id }, false)
            .await
    }

    /// This agent's client node ID, when it runs a client.
    pub fn node_id_text(&self) -> Option<String> {
        self.inner.service.client_node_id()
    }

    /// A call about a client node itself (host stats, a GC), on that node's client.
    pub async fn node_call(&self, call: crate::service::NodeCall) -> Result<serde_json::Value, rpc::RpcError> {
        self.inner.service.node_call(call, false).await
    }

    /// A GC of one finished allocation, on the client that ran it: the relay's failure, or
    /// the client's answer.
    pub async fn client_gc(&self, alloc_id: String) -> Result<Result<Vec<String>, rpc::RpcError>, AllocCallError> {
        self.inner
            .service
            .client_call(crate::service::GcRequest { alloc_id }, false)
            .await
    }

    /// One step of an `alloc exec` session, on the client that runs the allocation.
    pub async fn client_exec(
        &self,
        request: crate::exec::ExecRequest,
    ) -> Result<crate::exec::ExecReply, AllocCallError> {
        self.inner.service.client_call(request, false).await
    }

    /// A listing, stat or read in an allocation dir, from the client that runs it.
    pub async fn client_fs(
        &self,
        request: crate::allocfs::FsRequest,
    ) -> Result<crate::allocfs::FsReply, AllocCallError> {
        self.inner.service.client_call(request, false).await
    }

    /// One read of a task's log, from the client that runs the allocation.
    pub async fn client_logs(
        &self,
        request: crate::logstream::LogsRequest,
    ) -> Result<crate::logstream::LogsReply, AllocCallError> {
        self.inner.service.client_call(request, false).await
    }

    /// `Node.GetClientAllocs` as a blocking query: this server's state, or a client-only
    /// agent's servers.
    /// `ACL.ResolveToken` through a server (what a client-only agent's ACL gate asks).
    pub async fn acl_resolve(&self, secret: &str) -> Result<crate::service::AclResolveReply, String> {
        self.inner.service.acl_resolve(secret).await
    }

    pub async fn node_allocs(&self, request: NodeAllocsRequest) -> Result<NodeAllocsReply, rpc::RpcError> {
        self.inner.service.node_allocs(request).await
    }

    /// Resolves, with the reason, when Raft stopped without being asked to: a storage error
    /// (a failed fsync, a full disk, a torn record) or a panic applying an entry. A server
    /// cannot go on then, and must not pretend to: after a failed fsync not even its page
    /// cache can be trusted. Its caller exits, so the supervisor restarts the agent, which
    /// recovers from what is durable (fail-stop). Never resolves on client-only agents.
    pub async fn failed(&self) -> String {
        let Some(raft) = &self.inner.raft else {
            return std::future::pending().await;
        };
        if self.inner.config.server.raft_faults.linger_on_storage_error {
            return std::future::pending().await;
        }
        let mut metrics = raft.metrics();
        loop {
            match &metrics.borrow_and_update().running_state {
                Err(openraft::error::Fatal::Stopped) => return std::future::pending().await,
                Err(fatal) => return format!("Raft stopped: {fatal}"),
                Ok(()) => {}
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Stops the agent's loop and Raft; a leader hands its leadership over.
    pub async fn shutdown(&self) {
        if let Some(stop) = self.inner.stop.lock().expect("stop lock").take() {
            let _ = stop.send(());
        }
        if let Some(raft) = &self.inner.raft {
            self.await_a_caught_up_voter(raft).await;
            let successor = self.successor(raft);
            let _ = raft.shutdown().await;
            if let Some((id, addr)) = successor {
                self.name_successor(id, addr).await;
            }
        }
    }

    /// A leader stopping gracefully picks the voter whose log has the most of its own as its
    /// successor (openraft 0.9 has no leadership transfer; this is its effect within the lease
    /// rule). Raft is shut down before the successor is named, so nothing — no heartbeat, no
    /// replication of a write still in flight — reaches a voter after that: the voters' leases
    /// all run out by the time the successor's does, give or take the network's latency skew
    /// (`election::HANDOVER_MARGIN`).
    fn successor(&self, raft: &Raft) -> Option<(u64, SocketAddr)> {
        if self.inner.config.server.raft_faults.skip_handover {
            return None;
        }
        let metrics = raft.metrics().borrow().clone();
        if metrics.current_leader != Some(self.inner.node_id) {
            return None;
        }
        let (id, _) = self.most_caught_up_voter(&metrics)?;
        let addr = metrics
            .membership_config
            .membership()
            .get_node(&id)?
            .rpc_addr
            .parse()
            .ok()?;
        Some((id, addr))
    }

    /// Of the other voters this leader replicates to, the one that acknowledged the most of
    /// its log (ties: the lowest id), with the index it acknowledged.
    fn most_caught_up_voter(&self, metrics: &openraft::RaftMetrics<u64, ServerNode>) -> Option<(u64, Option<u64>)> {
        let voters: std::collections::BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
        let replication: Vec<(u64, Option<u64>)> = metrics
            .replication
            .iter()
            .flatten()
            .map(|(id, matched)| (*id, matched.map(|log| log.index)))
            .collect();
        drover_core::election::successor(self.inner.node_id, &voters, &replication)
    }

    /// A leaving leader first waits, for at most a few heartbeats, until some voter has
    /// acknowledged its whole log. Otherwise a write still in flight can sit in one voter's
    /// log and not yet in the successor's, and that voter refuses the successor's vote (the
    /// simulation's `leader_stops_gracefully` seed 833: a normal election 240 ms later).
    async fn await_a_caught_up_voter(&self, raft: &Raft) {
        if self.inner.config.server.raft_faults.skip_handover {
            return;
        }
        let mut metrics = raft.metrics();
        let patience = self.inner.config.server.timing.raft_heartbeat * 4;
        // Not the leader (no replication) or no other voter: nothing to wait for.
        let caught_up = |metrics: &openraft::RaftMetrics<u64, ServerNode>| {
            drover_core::election::successor_caught_up(self.most_caught_up_voter(metrics), metrics.last_log_index)
        };
        let _ = tokio::time::timeout(patience, async {
            while !caught_up(&metrics.borrow_and_update()) {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    /// Tells the successor to stand as soon as the lease has run out.
    async fn name_successor(&self, id: u64, addr: SocketAddr) {
        let envelope = crate::service::envelope(
            &self.inner.config.region,
            RequestBody::RaftStand(drover_proto::agent::v1::JsonPayload {
                json: serde_json::to_vec(&self.inner.node_id).expect("an id serializes"),
            }),
        );
        match (self.inner.service.forward)(addr, envelope, Duration::from_secs(1)).await {
            Ok(_) => tracing::info!(successor = id, %addr, "leaving: stopped Raft and named a successor"),
            Err(error) => tracing::warn!(successor = id, %addr, %error, "leaving: could not name a successor"),
        }
    }
}

/// How long an HTTP write waits for its own server to catch up with the leader.
pub const READ_YOUR_WRITES_WAIT: Duration = Duration::from_secs(5);

pub(crate) use crate::clock::unix_millis;

/// Opens the store, starts Raft, the gossip socket, the RPC server and the core loop.
pub async fn start_agent<T: Transport, C: Consul, O: Observer>(
    parts: AgentParts<T, C, O>,
) -> Result<AgentHandle, StartError> {
    let AgentParts {
        config,
        db,
        transport,
        consul,
        observer,
        client_csi,
        disk_latency,
        keystore,
    } = parts;
    let store = Store::new(db)?.with_latency(disk_latency);
    let fresh_node_id = loop {
        let id: u64 = crate::runtime::random();
        if id != 0 {
            break id;
        }
    };
    let record = store.boot(fresh_node_id)?;
    observer.record(AgentEvent::Started {
        node_id: record.node_id,
        boot_count: record.boot_count,
        boot: record.boot,
    });
    tracing::info!(node_id = record.node_id, boot_count = record.boot_count, boot = ?record.boot, "agent starting");

    let is_server = config.server.enabled || config.dev_mode;
    let (inbox_tx, inbox_rx) = mpsc::unbounded_channel::<agent::Input>();
    let (status_tx, status_rx) = watch::channel(AgentStatus::default());

    let events = crate::events::EventBroker::new(crate::events::BUFFER_ENTRIES);
    let metrics = crate::metrics::Metrics::new();
    let (raft, applied, changes, reachability) = if is_server {
        let (raft, applied, changes, reachability) = start_raft(
            &config,
            record.node_id,
            &store,
            transport.clone(),
            observer.clone(),
            events.clone(),
            metrics.clone(),
        )
        .await?;
        (Some(raft), Some(applied), Some(changes), Some(reachability))
    } else {
        (None, None, None, None)
    };
    let replies: Replies = Arc::new(Mutex::new(BTreeMap::new()));
    let consul = Arc::new(consul);
    // A client-only agent with no servers configured finds them in Consul's catalog
    // (`consul { client_auto_join }`), as Nomad's client does.
    let discover = (!is_server
        && config.client.servers.is_empty()
        && config.consul.address.is_some()
        && config.consul.client_auto_join)
        .then(|| {
            let consul = consul.clone();
            let service = config.consul.server_service_name.clone();
            Arc::new(move || {
                let (consul, service) = (consul.clone(), service.clone());
                Box::pin(async move { consul.catalog_service(&service, "rpc").await })
                    as crate::io::BoxFuture<Result<Vec<SocketAddr>, String>>
            }) as crate::service::Discover
        });
    let keyring = Arc::new(Mutex::new(if is_server {
        gossip_keyring(&config)?
    } else {
        Keyring::default()
    }));
    let keystore = if let Some(kept) = keystore {
        kept
    } else if is_server {
        root_keystore(&config)?
    } else {
        crate::rootkeys::Keystore::in_memory()
    };
    let forward_transport = transport.clone();
    let attached_transport = transport.clone();
    let leader_contact: Arc<Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let service = Service {
        raft: raft.clone(),
        node_id: record.node_id,
        region: config.region.clone(),
        inbox: inbox_tx.clone(),
        replies: replies.clone(),
        next_req: Arc::new(AtomicU64::new(1)),
        forward: Arc::new(move |addr, request, timeout| {
            let transport = forward_transport.clone();
            Box::pin(async move { transport.call(addr, request, timeout).await })
        }),
        client_csi,
        state: applied.clone().zip(changes.clone()),
        servers: Arc::new(Mutex::new(drover_core::client::servers::ServerList::new(
            config
                .client
                .servers
                .iter()
                .filter_map(|addr| addr.parse().ok())
                .collect(),
            discover.is_some(),
        ))),
        discover,
        http: Arc::default(),
        leader_contact: leader_contact.clone(),
        raft_store: raft.is_some().then(|| store.clone()),
        pre_vote_quiet: config.server.timing.raft_failure_timeout / 2,
        read_index: ReadIndexBatcher::new(config.server.raft_faults),
        keyring: keyring.clone(),
        keystore,
        metrics: metrics.clone(),
        observer: observer.clone(),
        skip_caller_check: config.server.raft_faults.skip_caller_check,
        acl_enabled: config.acl.enabled,
        skip_token_check: config.server.raft_faults.skip_token_check,
        clients_attach: transport.can_attach(),
        attached: is_server.then(|| {
            Arc::new(move |node_id: String, request, timeout| {
                let transport = attached_transport.clone();
                Box::pin(async move { transport.call_attached(&node_id, request, timeout).await })
                    as crate::io::BoxFuture<Option<Result<drover_proto::agent::v1::AgentResponse, String>>>
            }) as crate::service::AttachedCall
        }),
    };

    if raft.is_some() || service.client_csi.is_some() {
        let rpc_addr = SocketAddr::new(config.bind_addr, config.ports.rpc);
        let rpc_service = service.clone();
        let handler: RpcHandler = Arc::new(move |caller, request| {
            let service = rpc_service.clone();
            Box::pin(async move { service.handle(caller, request).await })
        });
        transport
            .serve(rpc_addr, handler.clone())
            .await
            .map_err(|error| StartError::Bind {
                what: "RPC",
                addr: rpc_addr,
                error,
            })?;
        // A client-only agent keeps itself attached to the server it talks to.
        if !is_server && transport.can_attach() {
            let node_id = crate::client::node_uuid(record.node_id);
            tokio::spawn(stay_attached(transport.clone(), service.clone(), node_id, handler));
        }
    }
    if let Some(raft) = &raft {
        tokio::spawn(watch_raft(
            raft.clone(),
            inbox_tx.clone(),
            observer.clone(),
            metrics.clone(),
        ));
    }

    let gossip = if is_server {
        let serf_addr = SocketAddr::new(config.bind_addr, config.ports.serf);
        let socket = transport
            .bind_gossip(serf_addr)
            .await
            .map_err(|error| StartError::Bind {
                what: "gossip",
                addr: serf_addr,
                error,
            })?;
        let socket = Arc::new(socket);
        tokio::spawn(receive_gossip(socket.clone(), inbox_tx.clone(), keyring.clone()));
        Some(socket)
    } else {
        None
    };

    let epoch = tokio::time::Instant::now();
    let boot = Boot {
        node_id: record.node_id,
        boot_count: record.boot_count,
        state: record.boot,
        seed: crate::runtime::random(),
    };
    let agent =
        Agent::new(core_now(epoch), &config, boot).with_calendar(std::sync::Arc::new(crate::periodic::CronCalendar));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let handle = AgentHandle {
        inner: Arc::new(Inner {
            config: config.clone(),
            node_id: record.node_id,
            status: status_rx,
            raft: raft.clone(),
            applied: applied.clone(),
            changes,
            service: service.clone(),
            stop: Mutex::new(Some(stop_tx)),
            observer: observer.clone(),
            reachability,
            events: is_server.then_some(events),
            metrics: metrics.clone(),
            started: tokio::time::Instant::now(),
        }),
    };
    let driver = Driver {
        agent,
        applied: applied.unwrap_or_default(),
        replies,
        client_calls: BTreeMap::new(),
        server_ops: Default::default(),
        rpc_ops: Default::default(),
        consul_calls: BTreeMap::new(),
        region: config.region.clone(),
        epoch,
        inbox: inbox_tx,
        store,
        raft,
        gossip,
        keyring: keyring.clone(),
        transport,
        consul,
        observer,
        status: status_tx,
        leader_contact,
        peers: None,
        service,
    };
    tokio::spawn(driver.run(inbox_rx, stop_rx));
    Ok(handle)
}

async fn start_raft<T: Transport, O: Observer>(
    config: &AgentConfig,
    node_id: u64,
    store: &Store,
    transport: T,
    observer: Arc<O>,
    events: Arc<crate::events::EventBroker>,
    metrics: Arc<crate::metrics::Metrics>,
) -> Result<(Raft, AppliedState, Changes, crate::raft::network::Reachability), StartError> {
    let timing = &config.server.timing;
    let raft_config = openraft::Config {
        cluster_name: config.region.clone(),
        heartbeat_interval: timing.raft_heartbeat.as_millis() as u64,
        election_timeout_min: timing.raft_election_timeout_min.as_millis() as u64,
        election_timeout_max: timing.raft_election_timeout_max.as_millis() as u64,
        install_snapshot_timeout: 5_000,
        // The core runs the election timer (`drover_core::election`) and says when to stand.
        enable_elect: false,
        // Snapshots are taken by `raft::snapshots` on Nomad's interval-and-threshold policy.
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: timing.snapshot_threshold / 2,
        ..Default::default()
    }
    .validate()
    .map_err(|error| StartError::RaftConfig(error.to_string()))?;
    let vote_observer = observer.clone();
    let hook: ApplyHook = Arc::new(move |index, entry, before, state| {
        if let openraft::EntryPayload::Normal(Entry { command, .. }) = &entry.payload {
            events.publish(index, drover_core::fsm::events::events(command, before, state));
        }
        // Each event costs work on every server for every entry (the digest encodes it whole).
        if !observer.enabled() {
            return;
        }
        let members = match &entry.payload {
            openraft::EntryPayload::Normal(Entry { command, .. }) => command.members(),
            _ => &[],
        };
        // A batch's members, each as if committed alone (read from the state after the batch).
        for command in members {
            match command {
                Command::CsiVolumeClaim {
                    namespace, volume_id, ..
                } => {
                    if let Some(volume) = state.volume_raw(namespace, volume_id) {
                        observer.record(AgentEvent::VolumeClaims {
                            volume: format!("{namespace}/{volume_id}"),
                            access_mode: volume.access_mode.as_str().to_string(),
                            writers: volume.write_claims.keys().cloned().collect(),
                            readers: volume.read_claims.len(),
                        });
                    }
                }
                Command::PlanApply { allocs, .. } => {
                    for event in crate::facts::rollouts(state, allocs) {
                        observer.record(event);
                    }
                }
                Command::AllocUpdateDesiredTransition { transitions, .. } => {
                    for alloc_id in transitions.keys() {
                        if let Some(event) = crate::facts::drain_migration(state, alloc_id) {
                            observer.record(event);
                        }
                    }
                }
                _ => {}
            }
            if let Some(event) = crate::facts::periodic_launch(state, index, command) {
                observer.record(event);
            }
        }
        observer.record(AgentEvent::Applied {
            index,
            term: entry.log_id.leader_id.term,
            digest: entry_digest(entry),
        });
    });
    let state_machine = StateMachine::open(store.clone(), Some(hook))?.with_metrics(metrics.clone());
    let vote_hook: VoteHook = Arc::new(move |vote| {
        vote_observer.record(AgentEvent::VoteSaved {
            term: vote.leader_id.term,
            voted_for: vote.leader_id.voted_for,
            committed: vote.committed,
        });
    });
    let applied = state_machine.applied();
    let changes = state_machine.changes();
    let network = NetworkFactory::new(transport, config.region.clone(), timing.raft_heartbeat);
    let reachability = network.reachability();
    let raft = Raft::new(
        node_id,
        Arc::new(raft_config),
        network,
        LogStore::new(store.clone())
            .with_vote_hook(vote_hook)
            .with_faults(config.server.raft_faults),
        state_machine,
    )
    .await
    .map_err(|error| StartError::Raft(error.to_string()))?;
    Ok((raft, applied, changes, reachability))
}

/// A stable digest of an entry's payload (FNV-1a over its JSON), for cross-server comparison.
fn entry_digest(entry: &openraft::Entry<crate::raft::TypeConfig>) -> u64 {
    let bytes = serde_json::to_vec(&entry.payload).expect("payload serializes");
    drover_core::hash::Fnv1a::default().bytes(&bytes).finish()
}

use crate::clock::core_now;

struct Driver<T: Transport, C, O> {
    agent: Agent,
    /// The applied state store, read-only context for the core (empty on client-only agents).
    applied: AppliedState,
    replies: Replies,
    /// `ClientCSI` calls in flight, so the core can abandon them.
    client_calls: BTreeMap<drover_core::op::OpId, (tokio::task::JoinHandle<()>, String, String)>,
    /// The server machine's and the endpoints' ops in flight (two id spaces).
    server_ops: drover_core::op::Outstanding,
    rpc_ops: drover_core::op::Outstanding,
    /// Consul ACL calls in flight, abandoned when the core says so.
    consul_calls: BTreeMap<drover_core::op::OpId, tokio::task::JoinHandle<()>>,
    region: String,
    epoch: tokio::time::Instant,
    inbox: mpsc::UnboundedSender<agent::Input>,
    store: Store,
    raft: Option<Raft>,
    gossip: Option<Arc<T::Gossip>>,
    /// Seals every gossip packet sent (`server { encrypt }`).
    keyring: Arc<Mutex<Keyring>>,
    transport: T,
    consul: Arc<C>,
    observer: Arc<O>,
    status: watch::Sender<AgentStatus>,
    /// When the last AppendEntries arrived (the election timer asks).
    leader_contact: Arc<Mutex<Option<tokio::time::Instant>>>,
    /// The Raft configuration's servers as last published, by the log id that set it.
    peers: Option<(Option<openraft::LogId<u64>>, Peers)>,
    /// Opens the sealed values in what leaves this server (`sealed.rs`).
    service: Service,
}

impl<T: Transport, C: Consul, O: Observer> Driver<T, C, O> {
    async fn run(
        mut self,
        mut inbox: mpsc::UnboundedReceiver<agent::Input>,
        mut stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        self.step(None);
        self.execute_actions().await;
        loop {
            let deadline = self
                .agent
                .poll_timeout()
                .map(|at| self.epoch + Duration::from_nanos(at.as_nanos()))
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                            biased;
                            input = inbox.recv() => {
                                let Some(input) = input else { break };
                                self.step(Some(input));
                            }
                            () = tokio::time::sleep_until(deadline) => {
                                self.step(None);
            }
                            _ = &mut stop => break,
                        }
            self.execute_actions().await;
        }
        tracing::info!("agent loop stopped");
    }

    /// This driver's side of the op-id seam: each outcome it hands the core answers an op the
    /// core gave it, once (debug and simulation builds assert it; the core asserts that it
    /// issued the op).
    fn answered(&mut self, input: &agent::Input) {
        use drover_core::server::Input as S;
        match input {
            agent::Input::Server(
                S::JoinResolved { op, .. }
                | S::PeersAnswered { op, .. }
                | S::RaftInitialized { op, .. }
                | S::ServerAdded { op, .. }
                | S::ServerRemoved { op, .. }
                | S::Proposed { op, .. }
                | S::ConsulServersFound { op, .. }
                | S::ConsulRegistered { op, .. },
            ) => self.server_ops.answered(*op),
            agent::Input::Rpc(
                rpc::Input::Proposed { op, .. }
                | rpc::Input::ClientReplied { op, .. }
                | rpc::Input::ConsulReplied { op, .. },
            ) => self.rpc_ops.answered(*op),
            _ => {}
        }
    }

    /// One step of the core: an input, or the timeout when `None`.
    fn step(&mut self, input: Option<agent::Input>) {
        let now = core_now(self.epoch);
        // Cron specs name wall-clock times: the leader's periodic dispatcher reads it here.
        self.agent.set_wall_clock(now, unix_millis());
        if let Some(input) = &input {
            self.answered(input);
        }
        let agent = &mut self.agent;
        self.applied.read(|applied| match input {
            Some(input) => agent.handle(now, input, &applied.state),
            None => agent.handle_timeout(now, &applied.state),
        });
    }

    async fn execute_actions(&mut self) {
        while let Some(action) = self.agent.poll_action() {
            match action {
                agent::Action::Server(action) => self.execute_server(action).await,
                agent::Action::Rpc(action) => self.execute_rpc(action),
            }
        }
        self.publish_status();
    }

    fn execute_rpc(&mut self, action: rpc::Action) {
        match action {
            rpc::Action::Propose { op, command } => {
                self.rpc_ops.started(op);
                let Some(raft) = self.raft.clone() else { return };
                let inbox = self.inbox.clone();
                let metrics = self.service.metrics.clone();
                tokio::spawn(async move {
                    let entry = Entry {
                        at_unix_ms: unix_millis(),
                        command: *command,
                    };
                    // Nomad's `nomad.raft.apply` count and commit time; here from the
                    // proposal until the entry is committed and applied on this leader.
                    let started = tokio::time::Instant::now();
                    let written = raft.client_write(entry).await;
                    if written.is_ok() {
                        metrics.increment("nomad.raft.apply", &[]);
                        metrics.sample("nomad.raft.commitTime", &[], started.elapsed());
                    }
                    let result = written
                        .map(|response| (response.log_id.index, response.data))
                        .map_err(|error| match error {
                            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
                                Failure::unavailable("not the leader")
                            }
                            other => Failure::unavailable(other.to_string()),
                        });
                    let _ = inbox.send(agent::Input::Rpc(rpc::Input::Proposed { op, result }));
                });
            }
            rpc::Action::CallClient {
                op,
                node_id,
                rpc_addr,
                request,
            } => {
                self.rpc_ops.started(op);
                let inbox = self.inbox.clone();
                let observer = self.observer.clone();
                let region = self.region.clone();
                let service = self.service.clone();
                let call = describe_call(&request);
                let (task_node, task_call) = (node_id.clone(), call.clone());
                self.client_calls.retain(|_, (task, _, _)| !task.is_finished());
                observer.record(AgentEvent::ClientCsiCall {
                    node_id: node_id.clone(),
                    call: call.clone(),
                });
                let task = tokio::spawn(async move {
                    // The core's deadline is the real one; this only bounds the task.
                    let timeout = agent::CLIENT_CSI_TIMEOUT + Duration::from_secs(5);
                    let result = match sealed::open_request(&service, request).await {
                        Err(error) => Err(CsiCallError::other(error)),
                        // Over the client's own connection where it keeps one (see
                        // `Service::call_node`), else dialed.
                        Ok(request) => {
                            let envelope = client_csi_envelope(&region, &request);
                            service
                                .call_node(&node_id, &rpc_addr, envelope, timeout)
                                .await
                                .and_then(client_csi_reply)
                        }
                    };
                    observer.record(AgentEvent::ClientCsiDone {
                        node_id,
                        call,
                        result: result.as_ref().map(|_| ()).map_err(|error| error.message.clone()),
                    });
                    let _ = inbox.send(agent::Input::Rpc(rpc::Input::ClientReplied { op, result }));
                });
                self.client_calls.insert(op, (task, task_node, task_call));
            }
            rpc::Action::CancelClientCall { op } => {
                self.rpc_ops.cancelled(op);
                if let Some((task, node_id, call)) = self.client_calls.remove(&op)
                    && !task.is_finished()
                {
                    task.abort();
                    self.observer.record(AgentEvent::ClientCsiDone {
                        node_id,
                        call,
                        result: Err("abandoned by the server".to_string()),
                    });
                }
            }
            rpc::Action::Consul { op, call } => {
                self.rpc_ops.started(op);
                let consul = self.consul.clone();
                let inbox = self.inbox.clone();
                self.consul_calls.retain(|_, task| !task.is_finished());
                let task = tokio::spawn(async move {
                    let result = consul.acl_call(call).await;
                    let _ = inbox.send(agent::Input::Rpc(rpc::Input::ConsulReplied { op, result }));
                });
                self.consul_calls.insert(op, task);
            }
            rpc::Action::CancelConsulCall { op } => {
                self.rpc_ops.cancelled(op);
                if let Some(task) = self.consul_calls.remove(&op) {
                    task.abort();
                }
            }
            rpc::Action::Reply { req, mut reply } => {
                let slot = self.replies.lock().expect("replies lock").remove(&req);
                if let Some(slot) = slot {
                    if sealed::reply_is_sealed(&mut reply) {
                        let service = self.service.clone();
                        tokio::spawn(async move {
                            let _ = slot.send(sealed::open_reply(&service, reply).await);
                        });
                    } else {
                        let _ = slot.send(reply);
                    }
                }
            }
        }
    }

    fn publish_status(&mut self) {
        let server = self.agent.server().map(|server| server.status());
        let raft = self.raft.as_ref().map(|raft| {
            let receiver = raft.metrics();
            let metrics = receiver.borrow();
            let configuration = *metrics.membership_config.log_id();
            let peers = match &self.peers {
                Some((at, peers)) if *at == configuration => peers.clone(),
                _ => {
                    let peers = Arc::new(peers_of(&metrics));
                    self.peers = Some((configuration, peers.clone()));
                    peers
                }
            };
            summarize(&metrics, peers)
        });
        self.status.send_replace(AgentStatus { server, raft });
    }

    async fn execute_server(&mut self, action: server::Action) {
        use server::Action as A;
        use server::Input as I;
        match action {
            A::SendGossip { to, data } => {
                let data = self.keyring.lock().expect("keyring lock").seal(&data);
                if let Some(socket) = &self.gossip
                    && let Err(error) = socket.send_to(&data, to).await
                {
                    tracing::debug!(%to, %error, "gossip send failed");
                }
            }
            A::ResolveJoin {
                op,
                target,
                default_port,
            } => {
                self.server_ops.started(op);
                let transport = self.transport.clone();
                let inbox = self.inbox.clone();
                tokio::spawn(async move {
                    let result = transport.resolve(&target, default_port).await;
                    let _ = inbox.send(agent::Input::Server(I::JoinResolved {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::QueryPeers { op, peer } => {
                self.server_ops.started(op);
                let transport = self.transport.clone();
                let inbox = self.inbox.clone();
                let region = self.region.clone();
                tokio::spawn(async move {
                    let result = query_peers(&transport, region, &peer).await;
                    let _ = inbox.send(agent::Input::Server(I::PeersAnswered {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::InitializeRaft { op, servers } => {
                self.server_ops.started(op);
                let Some(raft) = self.raft.clone() else {
                    return;
                };
                let voters: BTreeMap<u64, ServerNode> = servers
                    .iter()
                    .filter(|peer| !peer.nonvoter)
                    .map(|peer| (peer.id, server_node(peer)))
                    .collect();
                self.observer.record(AgentEvent::BootstrapRequested {
                    voters: voters.keys().copied().collect(),
                });
                let inbox = self.inbox.clone();
                let observer = self.observer.clone();
                tokio::spawn(async move {
                    let result = raft.initialize(voters).await.map_err(|error| error.to_string());
                    observer.record(AgentEvent::BootstrapFinished { result: result.clone() });
                    let _ = inbox.send(agent::Input::Server(I::RaftInitialized {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::PersistBootstrapped => match self.store.set_bootstrapped() {
                Ok(()) => self.observer.record(AgentEvent::BootstrappedPersisted),
                Err(error) => tracing::error!(%error, "failed to persist the bootstrapped flag"),
            },
            A::AddRaftServer { op, peer } => {
                self.server_ops.started(op);
                let Some(raft) = self.raft.clone() else {
                    return;
                };
                let inbox = self.inbox.clone();
                let observer = self.observer.clone();
                tokio::spawn(async move {
                    let result = add_server(&raft, &peer).await;
                    observer.record(AgentEvent::ServerAdded {
                        id: peer.id,
                        result: result.clone(),
                    });
                    let _ = inbox.send(agent::Input::Server(I::ServerAdded {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::RemoveRaftServer { op, id, voter } => {
                self.server_ops.started(op);
                let Some(raft) = self.raft.clone() else {
                    return;
                };
                let inbox = self.inbox.clone();
                let observer = self.observer.clone();
                tokio::spawn(async move {
                    let result = remove_server(&raft, id, voter).await;
                    observer.record(AgentEvent::ServerRemoved {
                        id,
                        result: result.clone(),
                    });
                    let _ = inbox.send(agent::Input::Server(I::ServerRemoved {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            // The agent hands operators' answers out as endpoint replies.
            A::Reply { .. } => unreachable!("agent::Agent::poll_action maps server replies"),
            A::Propose { op, command } => {
                self.server_ops.started(op);
                let Some(raft) = self.raft.clone() else {
                    return;
                };
                let inbox = self.inbox.clone();
                tokio::spawn(async move {
                    let entry = Entry {
                        at_unix_ms: unix_millis(),
                        command: *command,
                    };
                    let result = raft
                        .client_write(entry)
                        .await
                        .map(|response| response.log_id.index)
                        .map_err(|error| error.to_string());
                    let _ = inbox.send(agent::Input::Server(I::Proposed {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::Elect => {
                if let Some(raft) = self.raft.clone() {
                    tokio::spawn(async move {
                        if let Err(error) = raft.trigger().elect().await {
                            tracing::warn!(%error, "could not start an election");
                        }
                    });
                }
            }
            A::PreVote => {
                let Some(raft) = self.raft.clone() else { return };
                let metrics = raft.metrics().borrow().clone();
                let me = metrics.id;
                let membership = metrics.membership_config.membership();
                let voters: Vec<(u64, String)> = membership
                    .voter_ids()
                    .filter(|id| *id != me)
                    .filter_map(|id| membership.get_node(&id).map(|node| (id, node.rpc_addr.clone())))
                    .collect();
                // Every configuration in force: two while a joint configuration is.
                let configs = membership.get_joint_config().clone();
                let request = crate::service::PreVoteRequest {
                    candidate: me,
                    last_log: self
                        .store
                        .last_log_id()
                        .ok()
                        .flatten()
                        .map(|log| (log.leader_id.term, log.index)),
                };
                let (transport, inbox, region) = (self.transport.clone(), self.inbox.clone(), self.region.clone());
                tokio::spawn(async move {
                    let granted = pre_vote(transport, region, voters, request, me, configs).await;
                    let _ = inbox.send(agent::Input::Server(I::PreVoteAnswered { granted }));
                });
            }
            A::AskLogProgress => {
                let Some(raft) = &self.raft else { return };
                let metrics = raft.metrics().borrow().clone();
                if metrics.running_state.is_err() {
                    return;
                }
                let applied = metrics.last_applied.map_or(0, |log| log.index);
                let snapshot = metrics.snapshot.map_or(0, |log| log.index);
                let _ = self
                    .inbox
                    .send(agent::Input::Server(I::LogProgress { applied, snapshot }));
            }
            A::Snapshot => {
                if let Some(raft) = self.raft.clone() {
                    tokio::spawn(async move {
                        if let Err(error) = raft.trigger().snapshot().await {
                            tracing::debug!(%error, "no snapshot: Raft has stopped");
                        }
                    });
                }
            }
            A::AskLeaderContact => {
                let last = *self.leader_contact.lock().expect("contact lock");
                let silent_for_ms = last.map(|at| at.elapsed().as_millis() as u64);
                let _ = self
                    .inbox
                    .send(agent::Input::Server(I::LeaderContact { silent_for_ms }));
            }
            A::LookupConsul { op, service, tag } => {
                self.server_ops.started(op);
                let consul = self.consul.clone();
                let inbox = self.inbox.clone();
                tokio::spawn(async move {
                    let result = consul.catalog_service(&service, &tag).await;
                    let _ = inbox.send(agent::Input::Server(I::ConsulServersFound {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
            A::RegisterConsul {
                op,
                service,
                tags,
                addr,
                id,
            } => {
                self.server_ops.started(op);
                let consul = self.consul.clone();
                let inbox = self.inbox.clone();
                tokio::spawn(async move {
                    let registration = ServiceRegistration {
                        id,
                        name: service,
                        tags,
                        addr,
                    };
                    let result = consul.register_service(registration).await;
                    let _ = inbox.send(agent::Input::Server(I::ConsulRegistered {
                        op,
                        result: result.map_err(Failure::unavailable),
                    }));
                });
            }
        }
    }
}

fn server_node(peer: &Peer) -> ServerNode {
    ServerNode {
        name: peer.name.clone(),
        rpc_addr: peer.rpc_addr.to_string(),
    }
}

/// `Status.Peers` on one server: `Ok(peers)` (possibly empty) or why it could not be asked.
async fn query_peers<T: Transport>(transport: &T, region: String, peer: &Peer) -> Result<Vec<String>, String> {
    let request = AgentRequest {
        attached_node: String::new(),
        region,
        forwarded: false,
        version: crate::service::ENVELOPE_VERSION,
        auth_token: String::new(),
        body: Some(RequestBody::StatusPeers(StatusPeersRequest {})),
    };
    let response = transport
        .call(peer.rpc_addr, request, RPC_TIMEOUT)
        .await
        .map_err(|error| error.to_string())?;
    match response.body {
        Some(ResponseBody::StatusPeers(peers)) => Ok(peers.peers),
        Some(ResponseBody::Error(error)) => Err(error.message),
        other => Err(format!("unexpected response to Status.Peers: {other:?}")),
    }
}

/// Adds `peer` as a learner, waits for it to catch up, then promotes it unless it is a
/// non-voter.
async fn add_server(raft: &Raft, peer: &Peer) -> Result<(), String> {
    raft.add_learner(peer.id, server_node(peer), true)
        .await
        .map_err(|error| error.to_string())?;
    if !peer.nonvoter {
        raft.change_membership(ChangeMembers::AddVoterIds([peer.id].into()), false)
            .await
            .map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// Removes a server from the Raft configuration altogether (not kept as a learner).
async fn remove_server(raft: &Raft, id: u64, voter: bool) -> Result<(), String> {
    let change = if voter {
        ChangeMembers::RemoveVoters([id].into())
    } else {
        ChangeMembers::RemoveNodes([id].into())
    };
    raft.change_membership(change, false)
        .await
        .map(|_| ())
        .map_err(|error| error.to_string())
}

fn raft_role(state: ServerState) -> RaftRole {
    match state {
        ServerState::Leader => RaftRole::Leader,
        ServerState::Candidate => RaftRole::Candidate,
        ServerState::Follower => RaftRole::Follower,
        ServerState::Learner => RaftRole::Learner,
        ServerState::Shutdown => RaftRole::Shutdown,
    }
}

/// How long a voter may take to answer a pre-vote (a dead one is not waited for once a
/// majority granted).
const PRE_VOTE_TIMEOUT: Duration = Duration::from_millis(250);

/// Asks `voters` for a pre-vote; granted once the votes in (ours, `me`, included) win every
/// configuration in `configs` (`election::pre_vote_won`).
async fn pre_vote<T: Transport>(
    transport: T,
    region: String,
    voters: Vec<(u64, String)>,
    request: crate::service::PreVoteRequest,
    me: u64,
    configs: Vec<std::collections::BTreeSet<u64>>,
) -> bool {
    use futures::stream::{FuturesUnordered, StreamExt};
    let json = serde_json::to_vec(&request).expect("a pre-vote serializes");
    let mut answers: FuturesUnordered<_> = voters
        .iter()
        .filter_map(|(id, addr)| addr.parse::<SocketAddr>().ok().map(|addr| (*id, addr)))
        .map(|(id, addr)| {
            let envelope = crate::service::envelope(
                &region,
                RequestBody::RaftPreVote(drover_proto::agent::v1::JsonPayload { json: json.clone() }),
            );
            let transport = transport.clone();
            async move {
                match transport.call(addr, envelope, PRE_VOTE_TIMEOUT).await {
                    Ok(drover_proto::agent::v1::AgentResponse {
                        body: Some(drover_proto::agent::v1::agent_response::Body::RaftPreVote(payload)),
                        ..
                    }) => (id, serde_json::from_slice::<bool>(&payload.json).unwrap_or(false)),
                    _ => (id, false),
                }
            }
        })
        .collect();
    let mut granted = std::collections::BTreeSet::from([me]);
    while !drover_core::election::pre_vote_won(&configs, &granted) {
        match answers.next().await {
            Some((id, true)) => {
                granted.insert(id);
            }
            Some((_, false)) => {}
            None => break,
        }
    }
    drover_core::election::pre_vote_won(&configs, &granted)
}

fn raft_view(metrics: &RaftMetrics) -> RaftView {
    let membership = metrics.membership_config.membership();
    RaftView {
        role: raft_role(metrics.state),
        term: metrics.current_term,
        leader: metrics.current_leader,
        voted_for: metrics.vote.leader_id.voted_for,
        last_log_index: metrics.last_log_index,
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
    }
}

/// Every server of the Raft configuration, and whether it votes.
fn peers_of(metrics: &RaftMetrics) -> BTreeMap<u64, (ServerNode, bool)> {
    let membership = metrics.membership_config.membership();
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| (*id, (node.clone(), voters.contains(id))))
        .collect()
}

fn summarize(metrics: &RaftMetrics, peers: Peers) -> RaftSummary {
    let leader = metrics
        .current_leader
        .and_then(|id| peers.get(&id).map(|(node, _)| (id, node.clone())));
    RaftSummary {
        role: Some(raft_role(metrics.state)),
        term: metrics.current_term,
        leader,
        peers,
        last_log_index: metrics.last_log_index,
        last_applied: metrics.last_applied.map(|log_id| log_id.index),
        commit_index: metrics.last_applied.map(|log_id| log_id.index),
        millis_since_quorum_ack: metrics.millis_since_quorum_ack,
    }
}

/// Feeds Raft's observable state to the core whenever it changes in a way the core cares about.
async fn watch_raft<O: Observer>(
    raft: Raft,
    inbox: mpsc::UnboundedSender<agent::Input>,
    observer: Arc<O>,
    meters: Arc<crate::metrics::Metrics>,
) {
    let mut metrics = raft.metrics();
    let mut last: Option<RaftView> = None;
    // openraft reports metrics after every heartbeat; most reports change nothing the view
    // holds, and these fields (the membership by the log id that set it) say so without
    // building it.
    let mut last_key = None;
    loop {
        let view = {
            let current = metrics.borrow_and_update();
            let key = (
                current.state,
                current.current_term,
                current.current_leader,
                current.vote,
                current.last_log_index,
                *current.membership_config.log_id(),
            );
            if last_key == Some(key) {
                None
            } else {
                last_key = Some(key);
                Some(raft_view(&current))
            }
        };
        if let Some(view) = view
            && last.as_ref() != Some(&view)
        {
            let changed_shape = last.as_ref().is_none_or(|last| {
                (last.role, last.term, last.leader, &last.voters) != (view.role, view.term, view.leader, &view.voters)
            });
            if last
                .as_ref()
                .is_none_or(|last| (last.role, last.term) != (view.role, view.term))
            {
                // hashicorp/raft's `raft.state.<role>`: each time this server takes the role.
                let role = match view.role {
                    RaftRole::Leader => Some("nomad.raft.state.leader"),
                    RaftRole::Candidate => Some("nomad.raft.state.candidate"),
                    RaftRole::Follower => Some("nomad.raft.state.follower"),
                    RaftRole::Learner | RaftRole::Shutdown => None,
                };
                if let Some(name) = role {
                    meters.increment(name, &[]);
                }
            }
            if changed_shape {
                observer.record(AgentEvent::RaftChanged {
                    role: view.role,
                    term: view.term,
                    leader: view.leader,
                    voters: view.voters.iter().copied().collect(),
                });
            }
            if inbox
                .send(agent::Input::Server(server::Input::RaftObserved(view.clone())))
                .is_err()
            {
                return;
            }
            last = Some(view);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

async fn receive_gossip<G: GossipSocket>(
    socket: Arc<G>,
    inbox: mpsc::UnboundedSender<agent::Input>,
    keyring: Arc<Mutex<Keyring>>,
) {
    let mut buf = vec![0u8; GOSSIP_PACKET_MAX];
    // Peers' notices that they dropped our packets, logged once per peer per interval.
    let mut told: BTreeMap<SocketAddr, tokio::time::Instant> = BTreeMap::new();
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((len, from)) => {
                let now = tokio::time::Instant::now();
                let opened = keyring.lock().expect("keyring lock").open(&buf[..len], from, now);
                match opened {
                    Opened::Packet(data) => {
                        if inbox
                            .send(agent::Input::Server(server::Input::GossipReceived { data }))
                            .is_err()
                        {
                            return;
                        }
                    }
                    // Said (and answered) at most once per sender per interval.
                    Opened::Dropped {
                        why,
                        notice: Some(notice),
                    } => {
                        tracing::warn!("{}", why.seen(from));
                        let _ = socket.send_to(&notice, from).await;
                    }
                    Opened::Dropped { notice: None, .. } => {}
                    Opened::Notice(why) => {
                        let due = told
                            .get(&from)
                            .is_none_or(|last| now.saturating_duration_since(*last) >= GOSSIP_NOTICE_LOG_EVERY);
                        if due && told.len() < 1024 {
                            told.insert(from, now);
                            tracing::error!("{}", why.told(from));
                        }
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "gossip receive failed"),
        }
    }
}

/// How often a peer's refusal of our gossip is logged.
const GOSSIP_NOTICE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The gossip keyring of a server: the one kept under its data dir, else `server { encrypt }`'s
/// key, else none (plaintext gossip). A simulation keeps it in memory.
fn gossip_keyring(config: &AgentConfig) -> Result<Keyring, crate::keyring::KeyringError> {
    let configured = config.server.encrypt.as_ref().map(|key| key.expose());
    #[cfg(not(madsim))]
    if let Some(dir) = &config.data_dir {
        return Keyring::load(&std::path::Path::new(dir).join("server"), configured);
    }
    match configured {
        Some(key) => Keyring::with_key(key),
        None => Ok(Keyring::default()),
    }
}

/// A server's root keystore: `<data_dir>/server/keystore`; a simulation keeps it in memory.
fn root_keystore(config: &AgentConfig) -> Result<crate::rootkeys::Keystore, StartError> {
    #[cfg(not(madsim))]
    if let Some(dir) = &config.data_dir {
        let dir = std::path::Path::new(dir)
            .join("server")
            .join(crate::rootkeys::KEYSTORE_DIR);
        return Ok(crate::rootkeys::Keystore::open(&dir)?);
    }
    let _ = config;
    Ok(crate::rootkeys::Keystore::in_memory())
}

/// A short description of a `ClientCSI` call for the event trace.
fn describe_call(request: &ClientCsiRequest) -> String {
    match request {
        ClientCsiRequest::ControllerAttach(r) => format!(
            "controller-attach {} {} on {}",
            r.plugin_id, r.volume_id, r.client_csi_node_id
        ),
        ClientCsiRequest::ControllerDetach(r) => format!(
            "controller-detach {} {} on {}",
            r.plugin_id, r.volume_id, r.client_csi_node_id
        ),
        ClientCsiRequest::ControllerValidate(r) => format!("controller-validate {} {}", r.plugin_id, r.volume_id),
        ClientCsiRequest::NodeDetach(r) => format!("node-detach {} {} alloc {}", r.plugin_id, r.volume_id, r.alloc_id),
        ClientCsiRequest::ControllerCreate(r) => format!("controller-create {} {}", r.plugin_id, r.name),
        ClientCsiRequest::ControllerDelete(r) => format!("controller-delete {} {}", r.plugin_id, r.external_id),
        ClientCsiRequest::ControllerCreateSnapshot(r) => {
            format!("controller-create-snapshot {} {}", r.plugin_id, r.source_external_id)
        }
        ClientCsiRequest::ControllerDeleteSnapshot(r) => {
            format!("controller-delete-snapshot {} {}", r.plugin_id, r.snapshot_id)
        }
        ClientCsiRequest::ControllerListSnapshots(r) => format!("controller-list-snapshots {}", r.plugin_id),
        ClientCsiRequest::ControllerListVolumes(r) => format!("controller-list-volumes {}", r.plugin_id),
        ClientCsiRequest::ControllerExpand(r) => format!("controller-expand {} {}", r.plugin_id, r.external_id),
        ClientCsiRequest::NodeExpand(r) => format!("node-expand {} {} alloc {}", r.plugin_id, r.volume_id, r.alloc_id),
    }
}

/// Keeps the client attached (`Agent.Attach`) to the server it talks to: the one that last
/// answered it, or the next one after a stream ends.
async fn stay_attached<T: Transport>(transport: T, service: Service, node_id: String, handler: RpcHandler) {
    // How long to wait between attempts is the core's (`client::servers::AttachPause`).
    let mut pause = drover_core::client::servers::AttachPause::default();
    loop {
        let preferred = service.servers.lock().expect("servers lock").preferred().copied();
        if let Some(addr) = preferred {
            match transport.attach(addr, node_id.clone(), handler.clone()).await {
                // A stream that was up and ended: attach again at once.
                Ok(()) => pause.stream_ended(),
                Err(error) => tracing::debug!(%addr, %error, "attaching to a server failed"),
            }
        }
        tokio::time::sleep(pause.next_pause()).await;
    }
}
