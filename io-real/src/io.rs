//! The narrow I/O traits the driver is written against. Each has a production implementation
//! in this crate and a simulated one in `drover-io-sim`, in files of the same name
//! (`net.rs`, `consul.rs`, `disk.rs`).
//!

use drover_core::error::AllocCallError;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use drover_core::bootstrap::BootState;
use drover_core::server::RaftRole;
use drover_proto::agent::v1::{AgentRequest, AgentResponse};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Answers one agent RPC envelope from a caller.
pub type RpcHandler = Arc<dyn Fn(Caller, AgentRequest) -> BoxFuture<AgentResponse> + Send + Sync>;

/// Who sent an RPC, as far as the transport could tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub identity: Identity,
}

impl Caller {
    pub const fn new(identity: Identity) -> Self {
        Caller { identity }
    }
}

/// What the transport proved about a caller (Nomad's certificate roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    /// Plaintext RPC: nothing is proved, and (as in Nomad without TLS) every call is taken.
    Unverified,
    /// Mutual TLS without `verify_server_hostname`: a certificate of the cluster's CA, whose
    /// role is not asked.
    Cluster,
    /// A certificate for `server.<region>.nomad`.
    Server,
    /// A certificate for `client.<region>.nomad`.
    Client,
    /// A certificate of the CA that names neither role (a CLI certificate, another region's).
    Other,
}

/// What an RPC asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallerRole {
    /// Raft, leader forwarding, calls down to clients: servers only.
    Server,
    /// What a client node calls (status, alloc sync, CSI, SI tokens): servers or clients.
    Node,
}

impl Identity {
    /// Whether a caller with this identity may make a call that needs `role`.
    pub fn may(self, role: CallerRole) -> bool {
        match self {
            Identity::Unverified | Identity::Cluster | Identity::Server => true,
            Identity::Client => role == CallerRole::Node,
            Identity::Other => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("call to {addr} timed out after {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("call to {addr} failed: {reason}")]
    Failed { addr: SocketAddr, reason: String },
}

/// A datagram socket for gossip.
pub trait GossipSocket: Send + Sync + 'static {
    fn send_to(&self, data: &[u8], to: SocketAddr) -> impl Future<Output = std::io::Result<()>> + Send;
    fn recv_from(&self, buf: &mut [u8]) -> impl Future<Output = std::io::Result<(usize, SocketAddr)>> + Send;
}

/// Moves agent RPC envelopes and gossip datagrams between agents, and resolves join targets.
pub trait Transport: Clone + Send + Sync + 'static {
    type Gossip: GossipSocket;

    /// Binds the gossip socket.
    fn bind_gossip(&self, addr: SocketAddr) -> impl Future<Output = std::io::Result<Self::Gossip>> + Send;

    /// Sends one request and waits for its response, at most `timeout`.
    fn call(
        &self,
        addr: SocketAddr,
        request: AgentRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<AgentResponse, TransportError>> + Send;

    /// Starts answering requests arriving at `addr` in a background task; returns once bound.
    fn serve(&self, addr: SocketAddr, handler: RpcHandler) -> impl Future<Output = std::io::Result<()>> + Send;

    /// Resolves "ip", "ip:port", "host" or "host:port" to addresses, using `default_port`
    /// when the target names none.
    fn resolve(&self, target: &str, default_port: u16) -> impl Future<Output = Result<Vec<SocketAddr>, String>> + Send;

    /// Sends `request` down the stream the client `node_id` keeps attached to this server;
    /// `None` when it has none here (the caller dials the client instead).
    fn call_attached(
        &self,
        _node_id: &str,
        _request: AgentRequest,
        _timeout: Duration,
    ) -> impl Future<Output = Option<Result<AgentResponse, String>>> + Send {
        async { None }
    }

    /// Keeps this client attached to the server at `addr` as `node_id`, answering what comes
    /// down with `handler`, until the stream ends; `false` when this transport cannot attach.
    fn attach(
        &self,
        _addr: SocketAddr,
        _node_id: String,
        _handler: RpcHandler,
    ) -> impl Future<Output = Result<(), String>> + Send {
        async { Err("this transport does not attach clients".to_string()) }
    }

    /// Whether [`Transport::attach`] is supported.
    fn can_attach(&self) -> bool {
        false
    }
}

/// A service registration in Consul's catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRegistration {
    pub id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub addr: SocketAddr,
}

/// The part of Consul's HTTP API the agent uses.
pub trait Consul: Send + Sync + 'static {
    /// Addresses of the healthy instances of `service` carrying `tag`, across datacenters.
    fn catalog_service(&self, service: &str, tag: &str)
    -> impl Future<Output = Result<Vec<SocketAddr>, String>> + Send;

    fn register_service(&self, registration: ServiceRegistration) -> impl Future<Output = Result<(), String>> + Send;

    /// A call to Consul's ACL API (service identity tokens, on the leader).
    fn acl_call(
        &self,
        call: drover_core::rpc::ConsulAclCall,
    ) -> impl Future<Output = Result<drover_core::rpc::ConsulAclReply, drover_core::rpc::ConsulAclError>> + Send;
}

/// For agents configured without Consul: the core never asks, and if it did it would hear no.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoConsul;

impl Consul for NoConsul {
    async fn catalog_service(&self, _service: &str, _tag: &str) -> Result<Vec<SocketAddr>, String> {
        Err("consul is not configured".to_string())
    }

    async fn register_service(&self, _registration: ServiceRegistration) -> Result<(), String> {
        Err("consul is not configured".to_string())
    }

    async fn acl_call(
        &self,
        _call: drover_core::rpc::ConsulAclCall,
    ) -> Result<drover_core::rpc::ConsulAclReply, drover_core::rpc::ConsulAclError> {
        Err(drover_core::rpc::ConsulAclError {
            message: "consul is not configured".to_string(),
            retryable: false,
            not_found: false,
        })
    }
}

/// A client's CSI plugins, answering `ClientCSI` calls from servers. The full client (plugins
/// as tasks, gRPC over unix sockets) implements this; tests and the simulation plug in theirs.
pub trait ClientCsi: Send + Sync + 'static {
    fn call(
        &self,
        request: drover_core::rpc::ClientCsiRequest,
    ) -> BoxFuture<Result<drover_core::rpc::ClientCsiReply, drover_core::error::CsiCallError>>;

    /// An operator's restart or signal of one of this client's allocations.
    fn control(&self, request: drover_core::client::AllocControl) -> BoxFuture<Result<(), AllocCallError>> {
        Box::pin(async move { Err(AllocCallError::unknown_alloc(request.alloc_id())) })
    }

    /// This agent's client node, when it runs one.
    fn node_id(&self) -> Option<String> {
        None
    }

    /// Nomad's `HostStats` of this client's node.
    fn host_stats(&self) -> BoxFuture<Result<serde_json::Value, drover_core::rpc::RpcError>> {
        Box::pin(async { Err(drover_core::rpc::RpcError::not_found("this agent runs no client")) })
    }

    /// An operator's GC of this client's finished allocations (`None`: every eligible one):
    /// the allocations collected.
    fn gc(&self, _alloc_id: Option<String>) -> BoxFuture<Result<Vec<String>, drover_core::rpc::RpcError>> {
        Box::pin(async { Err(drover_core::rpc::RpcError::not_found("this agent runs no client")) })
    }

    /// The resource usage of one of this client's allocations, in Nomad's JSON.
    fn stats(&self, alloc_id: String) -> BoxFuture<Result<serde_json::Value, AllocCallError>> {
        Box::pin(async move { Err(AllocCallError::unknown_alloc(&alloc_id)) })
    }

    /// One step of an `alloc exec` session in one of this client's tasks.
    fn exec(&self, request: crate::exec::ExecRequest) -> BoxFuture<Result<crate::exec::ExecReply, AllocCallError>> {
        Box::pin(async move { Err(AllocCallError::unknown_alloc(request.alloc_id())) })
    }

    /// A listing, stat or read in one of this client's allocation dirs.
    fn fs(&self, request: crate::allocfs::FsRequest) -> BoxFuture<Result<crate::allocfs::FsReply, AllocCallError>> {
        Box::pin(async move { Err(AllocCallError::unknown_alloc(&request.alloc_id)) })
    }

    /// One read of the log of one of this client's tasks.
    fn logs(
        &self,
        request: crate::logstream::LogsRequest,
    ) -> BoxFuture<Result<crate::logstream::LogsReply, AllocCallError>> {
        Box::pin(async move { Err(AllocCallError::unknown_alloc(&request.alloc_id)) })
    }

    /// Gauges of what this client runs (`/v1/metrics`): name, labels, value.
    fn gauges(&self) -> Vec<LabelledGauge> {
        Vec::new()
    }
}

/// One gauge reading: the metric's name, its labels, its value.
pub type LabelledGauge = (&'static str, Vec<(&'static str, String)>, f64);

/// Facts a driver reports as they happen: tracing in production, the trace recorder and
/// invariant checkers in the simulation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentEvent {
    Started {
        node_id: u64,
        boot_count: u64,
        boot: BootState,
    },
    /// About to call Raft initialisation with exactly these voters.
    BootstrapRequested {
        voters: Vec<u64>,
    },
    BootstrapFinished {
        result: Result<(), String>,
    },
    BootstrappedPersisted,
    RaftChanged {
        role: RaftRole,
        term: u64,
        leader: Option<u64>,
        voters: Vec<u64>,
    },
    /// openraft persisted a new vote: `committed` once a quorum granted it, which names
    /// `voted_for` the leader of `term` (every server saves the committed vote of the leader it
    /// follows). Recorded from storage, so no transition is missed between metric samples.
    VoteSaved {
        term: u64,
        voted_for: Option<u64>,
        committed: bool,
    },
    /// A direct write (`Apply`, the server-only RPC of ACL and variable writes) was committed
    /// at `index` on behalf of a caller proving `caller`.
    DirectWrite {
        caller: Identity,
        index: u64,
    },
    /// A log entry was applied; `digest` identifies its content.
    Applied {
        index: u64,
        term: u64,
        digest: u64,
    },
    ServerAdded {
        id: u64,
        result: Result<(), String>,
    },
    /// A server was removed from the Raft configuration (an operator, or autopilot).
    ServerRemoved {
        id: u64,
        result: Result<(), String>,
    },
    /// The client's task runner finished a task for good (its state became dead): from now
    /// on no process of it may run on the host.
    TaskDead {
        alloc_id: String,
        task: String,
    },
    /// The client's state of a task became running (`true`: started, or reattached after a
    /// restart) or stopped being so (restarting, or dead).
    TaskRunning {
        alloc_id: String,
        task: String,
        running: bool,
    },
    /// A claim command was applied: who holds the volume's write claims now.
    VolumeClaims {
        volume: String,
        access_mode: String,
        writers: Vec<String>,
        readers: usize,
    },
    /// A plan was applied for a job with a running deployment: for each of its groups, the
    /// `max_parallel` its spec asks, and the deployment's live allocations that replaced one
    /// stopped for the update and are not healthy yet (see `crate::facts`).
    Rollout {
        deployment: String,
        job: String,
        group: String,
        max_parallel: u32,
        replacing: Vec<String>,
    },
    /// A periodic launch was applied: the parent's spec, the time launched, the due times
    /// the entry says it passed over, and the log index (a restarted server applies entries
    /// again). Raw facts: the simulation's oracle counts the spec's times with its own rule.
    PeriodicLaunched {
        index: u64,
        job: String,
        spec: String,
        time_zone: String,
        launch_ms: u64,
        /// The launch (or registration) the state machine recorded before this one.
        previous_ms: u64,
        skipped: u32,
        forced: bool,
    },
    /// A migration the node drainer marked was applied: the allocation, what kind it is, and
    /// its node as the state shows it (see `crate::facts`). Raw facts only: the simulation's
    /// drain-order oracle judges them with its own rule.
    DrainMigrated {
        node_id: String,
        alloc_id: String,
        /// A system job, or a job running a CSI plugin task (drained last).
        system_or_plugin: bool,
        draining: bool,
        /// The drain's deadline has passed (or it had none: `-1`).
        forced: bool,
        neighbours: Vec<DrainNeighbour>,
        claims: Vec<DrainClaim>,
    },
    /// A server started a `ClientCSI` call on a node.
    ClientCsiCall {
        node_id: String,
        call: String,
    },
    ClientCsiDone {
        node_id: String,
        call: String,
        result: Result<(), String>,
    },
}

/// Another allocation on a node the drainer migrates from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainNeighbour {
    pub alloc_id: String,
    pub system_or_plugin: bool,
    pub client_terminal: bool,
}

/// A volume claim held on a node the drainer migrates from: in which table of the volume
/// (`read`, `write`, `past`) and in which state (`taken`, `unpublishing`, `node-detached`,
/// `controller-detached`, `ready-to-free`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainClaim {
    pub volume: String,
    pub alloc_id: String,
    pub table: &'static str,
    pub state: &'static str,
}

pub trait Observer: Send + Sync + 'static {
    fn record(&self, event: AgentEvent);

    /// Whether recorded events go anywhere: when not, events that cost work to build (an
    /// applied entry's digest) are not built.
    fn enabled(&self) -> bool {
        true
    }
}

/// Production observer: every event is a structured tracing line.
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingObserver;

impl Observer for TracingObserver {
    fn record(&self, event: AgentEvent) {
        tracing::debug!(?event, "agent event");
    }

    fn enabled(&self) -> bool {
        tracing::enabled!(tracing::Level::DEBUG)
    }
}
