//! The agent's configuration after flags and files are merged and addresses resolved.
//!
//! `bootstrap_expect` lives here and nowhere else: it is immutable for the life of the process.
//! Whether this server has bootstrapped is runtime state owned by [`crate::bootstrap`].
//! [`AgentConfig::validate`] applies Nomad's rules and wording (`command/agent/command.go`).

#[allow(unused_imports)]
use crate::prelude::*;
use alloc::collections::{BTreeMap, BTreeSet};
use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use core::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_HTTP_PORT: u16 = 4646;
pub const DEFAULT_RPC_PORT: u16 = 4647;
pub const DEFAULT_SERF_PORT: u16 = 4648;
pub const DEFAULT_REGION: &str = "global";
pub const DEFAULT_DATACENTER: &str = "dc1";

/// Deadline for one `ClientCSI` call made by a server; the client holds a controller plugin's
/// turn for a call as long (`client::client::controller_turns`).
pub const CLIENT_CSI_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentConfig {
    pub name: String,
    pub region: String,
    pub datacenter: String,
    pub data_dir: Option<String>,
    pub bind_addr: IpAddr,
    pub ports: Ports,
    /// Addresses other agents use to reach this one (resolved by the driver from `advertise {}`
    /// or the bind address).
    pub advertise: Advertise,
    pub server: ServerConfig,
    pub client: ClientConfig,
    pub consul: ConsulConfig,
    pub dev_mode: bool,
    pub acl: AclConfig,
}

/// Nomad's `acl {}` block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclConfig {
    /// Every request needs a token whose policies allow it (no token: the `anonymous` policy).
    pub enabled: bool,
    /// How long a client-only agent keeps a token it had a server resolve (Nomad's
    /// `token_ttl`, 30 s): a deleted token stops working there within this long.
    #[serde(default = "default_token_ttl")]
    pub token_ttl: Duration,
    /// The shortest and longest life a token with an expiry may be given, and the bounds of
    /// an auth method's `MaxTokenTTL` (Nomad's `token_min_expiration_ttl`, 1 m, and
    /// `token_max_expiration_ttl`, 24 h).
    #[serde(default = "default_token_min_ttl")]
    pub token_min_expiration_ttl: Duration,
    #[serde(default = "default_token_max_ttl")]
    pub token_max_expiration_ttl: Duration,
}

fn default_token_ttl() -> Duration {
    Duration::from_secs(30)
}

fn default_token_min_ttl() -> Duration {
    Duration::from_secs(60)
}

fn default_token_max_ttl() -> Duration {
    Duration::from_secs(24 * 3600)
}

impl Default for AclConfig {
    fn default() -> Self {
        AclConfig {
            enabled: false,
            token_ttl: default_token_ttl(),
            token_min_expiration_ttl: default_token_min_ttl(),
            token_max_expiration_ttl: default_token_max_ttl(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    pub http: u16,
    pub rpc: u16,
    pub serf: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            http: DEFAULT_HTTP_PORT,
            rpc: DEFAULT_RPC_PORT,
            serf: DEFAULT_SERF_PORT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertise {
    pub http: SocketAddr,
    pub rpc: SocketAddr,
    pub serf: SocketAddr,
}

impl Advertise {
    pub fn on(ip: IpAddr, ports: Ports) -> Self {
        Advertise {
            http: SocketAddr::new(ip, ports.http),
            rpc: SocketAddr::new(ip, ports.rpc),
            serf: SocketAddr::new(ip, ports.serf),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerConfig {
    pub enabled: bool,
    /// 0 = never self-bootstrap, 1 = single server, N = wait for N voters. Immutable.
    pub bootstrap_expect: u32,
    pub non_voting_server: bool,
    /// `server_join { retry_join }`: addresses ("ip", "ip:port", "host:port") to gossip-join.
    pub retry_join: Vec<String>,
    pub retry_interval: Duration,
    /// 0 = retry forever.
    pub retry_max: u32,
    pub timing: ServerTiming,
    /// `encrypt`: the gossip key (base64 of 16 or 32 bytes) every gossip packet is sealed
    /// with; `None`: plaintext gossip. A keyring kept from an earlier run wins over it.
    #[serde(default)]
    pub encrypt: Option<crate::structs::SecretText>,
    /// What one job may ask (`job_max_group_count`, `job_max_count`, `job_max_groups`,
    /// `job_max_group_tasks`).
    #[serde(default)]
    pub job_limits: crate::jobspec::limits::JobLimits,
    /// `autopilot {}`: what the leader applies until an operator sets the cluster's own.
    #[serde(default)]
    pub autopilot: crate::autopilot::AutopilotConfig,
    /// Test-only fault injection; never set from flags or config files.
    #[serde(skip)]
    pub bootstrap_fault: Option<BootstrapFault>,
    /// Test-only re-creations of historical CSI defects; never set from flags or config files.
    #[serde(skip)]
    pub csi_faults: CsiFaults,
    /// Test-only re-creation of a Connect token defect; never set from flags or config files.
    #[serde(skip)]
    pub connect_faults: ConnectFaults,
    /// Test-only re-creations of read and failover defects; never set from flags or config
    /// files.
    #[serde(skip)]
    pub raft_faults: RaftFaults,
    /// Test-only re-creation of a scheduler defect; never set from flags or config files.
    #[serde(skip)]
    pub scheduler_faults: SchedulerFaults,
}

/// Re-creates a historical defect on purpose so the simulation can prove it detects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapFault {
    /// The pre-0.11 test-knob bug: a server that sees no leader for one election timeout
    /// elects itself alone instead of waiting for `bootstrap_expect` voters.
    SelfElectAfterElectionTimeout,
    /// Bootstrapping as soon as `bootstrap_expect` servers are seen, without asking each
    /// whether it already has Raft peers (Nomad's `maybeBootstrap` before it checked
    /// `Status.Peers`): a server joining a formed cluster bootstraps a second one.
    SkipPeerQuery,
}

/// Historical Nomad CSI defects, re-created on purpose so the simulation can prove it sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CsiFaults {
    /// Nomad #10927: a claim whose release failed once is never retried (it leaks).
    pub abandon_failed_unpublish: bool,
    /// Nomad #13416: node detach is attempted even when the node is down or gone.
    pub node_detach_on_down_node: bool,
    /// Nomad #8232 (fixed by #12324): a drain stops the node's CSI plugin and system
    /// allocations as soon as its other allocations finish, before their volumes are released
    /// on the node, stranding the claims the plugin should have unpublished.
    pub drain_plugins_before_release: bool,
    /// Nomad #8336 (fixed by #15415): controller RPCs are serialised per volume rather than
    /// per plugin, so two volumes' `ControllerPublishVolume` calls race inside one plugin
    /// ("Attachment point /dev/xvdba is already in use").
    pub serialize_per_volume: bool,
    /// Nomad #7200 (fixed by #7328): a claim is not idempotent per allocation. An allocation
    /// claiming a volume it already holds (its client retrying a claim whose answer was lost,
    /// or claiming again after a restart) is refused as one claim too many.
    pub claims_not_idempotent: bool,
    /// A create names the plugin's volume per request (the volume's name and when the request
    /// came), not after the volume's name alone: a retry after a crash between
    /// `ControllerCreateVolume` and the Raft commit makes a second volume in the plugin, the
    /// one the CSI idempotency name exists to prevent.
    pub create_name_per_request: bool,
    /// A created volume is registered without the accessible topology its plugin answered,
    /// and without its topology request: the scheduler then places its consumers on nodes
    /// that cannot reach it.
    pub create_drops_topology: bool,
}

/// Read-path and failover defects the simulation re-creates on purpose (regression switches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftFaults {
    /// Consistent reads are served from the answering server's applied state without the
    /// read barrier (what Drover did before issue 19): a lagging follower answers stale.
    pub local_consistent_reads: bool,
    /// A leader stopping gracefully just stops (what Drover did before issue 19): no
    /// successor is named, and the survivors wait out the election timeout.
    pub skip_handover: bool,
    /// Log entries are written without waiting for the disk, yet acknowledged as durable: a
    /// crash losing unsynced writes on a majority loses committed, acknowledged entries.
    pub unsynced_log: bool,
    /// The leader names its read index from what it has applied, without the heartbeat round
    /// that confirms it still leads (ReadIndex without Raft §8's leadership check): a leader
    /// cut off from its successor answers stale reads.
    pub leader_reads_without_quorum: bool,
    /// A consistent read learns the leader's read index but does not wait for the answering
    /// server to apply up to it: a follower that lags answers stale.
    pub reads_skip_apply_wait: bool,
    /// When Raft stops on a storage error the agent stays up with Raft dead (what Drover
    /// did before fail-stop): a server that can no longer vote or apply, which no
    /// supervisor restarts because nothing exited.
    pub linger_on_storage_error: bool,
    /// A read that arrives while a ReadIndex round is running is answered by that round,
    /// whose index was named before the read began (Raft thesis §6.4: the index must be
    /// taken after the read arrives): a write acknowledged in between is missed.
    pub reads_join_running_round: bool,
    /// Votes are written without waiting for the disk, yet acted on (the vote is granted):
    /// a server that loses power after voting can vote again in the same term.
    pub unsynced_vote: bool,
    /// A failed log write is reported to Raft as durable, the error logged and swallowed
    /// (the fsync-error handling PostgreSQL, among others, had until 2018's "fsyncgate"):
    /// the server acknowledges entries its disk never took.
    pub swallow_log_write_errors: bool,
    /// The log is purged as far as Raft asks, whether or not a durable snapshot covers what
    /// goes: a follower told to install a snapshot purges its log while the snapshot's own
    /// write fails, and restarts with neither (openraft asks for entries that are gone).
    pub purge_beyond_snapshot: bool,
    /// Every agent RPC is served whoever's certificate called it (no role check): a client
    /// can write to the state directly, vote or append Raft entries as if it were a server.
    pub skip_caller_check: bool,
    /// Server calls over agent RPC are served without checking their caller's token, as with
    /// ACLs off (what Drover did before issue 54): a client's certificate reads secret
    /// variables, purges jobs, runs a GC and forces servers out.
    pub skip_token_check: bool,
    /// The leader's reconciliation counts a live server Raft holds as a learner as held, even
    /// one that is no non-voter (what Drover did before the knobs found it): a voter autopilot
    /// removed while it was gone comes back a learner and never votes again.
    pub learner_left_behind: bool,
    /// `retry_join` stops announcing once the server has a gossip peer and knows a Raft leader
    /// (what Drover did before swarm seed 1146): a server on the far side of a partition whose
    /// view still holds a dead member and its old leader, and the restarted leader that never
    /// knew it, stay in two gossip islands, and the removed server is never added back.
    pub no_gossip_reconnect: bool,
}

/// A scheduler defect the simulation re-creates on purpose (regression switch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerFaults {
    /// A rollout's destructive updates are not held to `max_parallel`: every allocation of an
    /// updated group is replaced at once, as before deployments.
    pub ignore_max_parallel: bool,
    /// A new leader's periodic dispatcher counts from when it took office, not from the last
    /// recorded launch: a time that fell due during the election is never launched (what
    /// Nomad's dispatcher does for a job it adds, applied to a failover).
    #[serde(default)]
    pub periodic_from_leadership: bool,
    /// `EnforceIndex` is checked only by the endpoint, against the state it sees when the
    /// request arrives, and the entry applies whatever the state when it lands (Nomad's
    /// `Job.Register`): two writers that read the same version, both in flight, both win.
    #[serde(default)]
    pub enforce_index_at_endpoint_only: bool,
}

/// A Connect defect the simulation re-creates on purpose (regression switch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectFaults {
    /// Tokens of a derivation that failed part-way are never revoked: neither committed as
    /// orphans nor swept (the leak the 0.10.4 design guards against).
    pub keep_failed_derivation_tokens: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerTiming {
    pub raft_heartbeat: Duration,
    pub raft_election_timeout_min: Duration,
    pub raft_election_timeout_max: Duration,
    /// Silence from the leader after which a follower stands for election.
    pub raft_failure_timeout: Duration,
    /// The random extra on top of `raft_failure_timeout`, drawn every time.
    pub raft_election_spread: Duration,
    /// How often an undecided server re-evaluates the bootstrap decision.
    pub bootstrap_retry: Duration,
    /// Deadline for one `Status.Peers` call.
    pub peer_query_timeout: Duration,
    /// First backoff between `Status.Peers` retries; doubles each time (Nomad: 1 s).
    pub peer_retry_base: Duration,
    /// Attempts per server before the bootstrap attempt is abandoned (Nomad: 6).
    pub peer_retries_max: u32,
    /// How often a leader looks for gossip servers missing from the Raft configuration.
    pub reconcile_interval: Duration,
    pub gossip: GossipTiming,
    /// CSI claim and plugin garbage collection (Nomad's intervals by default).
    pub csi_gc: GcConfig,
    /// The leader's periodic GC of finished evaluations, allocations, jobs, deployments and
    /// down nodes (Nomad's intervals and thresholds by default).
    pub core_gc: CoreGcConfig,
    /// Node heartbeat TTLs (Nomad's defaults).
    pub heartbeat: HeartbeatConfig,
    /// Raft log entries between snapshots (Nomad's `raft_snapshot_threshold`, hashicorp/raft's
    /// 8192). A snapshot encodes the whole state: at a million allocations it costs seconds of
    /// CPU (`cargo bench -p drover-io-real --bench state_scale`), so taking one every 1,000
    /// writes would keep a core busy on a large cluster.
    pub snapshot_threshold: u64,
    /// How often a server looks whether `snapshot_threshold` entries were applied since its
    /// last snapshot, staggered at random up to twice this (Nomad's `raft_snapshot_interval`,
    /// hashicorp/raft's `SnapshotInterval`: 120 s). Bounds the CPU a large state's snapshots
    /// take at a high write rate.
    pub snapshot_interval: Duration,
}

impl ServerTiming {
    /// Nomad's `raft_multiplier`: every Raft timing `multiplier` times longer, for slow or
    /// busy networks.
    pub fn scale_raft(&mut self, multiplier: u32) {
        for timing in [
            &mut self.raft_heartbeat,
            &mut self.raft_election_timeout_min,
            &mut self.raft_election_timeout_max,
            &mut self.raft_failure_timeout,
            &mut self.raft_election_spread,
        ] {
            *timing *= multiplier;
        }
    }

    /// The election timer's timings: a round that did not elect anyone is followed by the next
    /// after two to four leases (a round on a LAN takes milliseconds; the pause lets one that
    /// is winning finish).
    pub fn elections(&self) -> crate::election::ElectionTiming {
        crate::election::ElectionTiming {
            failure_timeout: self.raft_failure_timeout,
            spread: self.raft_election_spread,
            retry_min: self.raft_election_timeout_max * 2,
            retry_max: self.raft_election_timeout_max * 4,
            lease: self.raft_election_timeout_max,
        }
    }
}

impl Default for ServerTiming {
    fn default() -> Self {
        ServerTiming {
            // LAN values. The core's election timer (`election`) stands after
            // `raft_failure_timeout` of silence from the leader plus a random spread of up to
            // `raft_election_spread`; openraft's own timer is off. openraft's leader lease is
            // its `election_timeout_max`: voters refuse other candidates for that long after
            // their last heartbeat, which keeps a rejoining server from deposing a healthy
            // leader; it only has to outlast a few heartbeats.
            raft_heartbeat: Duration::from_millis(25),
            raft_election_timeout_min: Duration::from_millis(50),
            raft_election_timeout_max: Duration::from_millis(75),
            raft_failure_timeout: Duration::from_millis(200),
            raft_election_spread: Duration::from_millis(100),
            bootstrap_retry: Duration::from_secs(2),
            peer_query_timeout: Duration::from_secs(5),
            peer_retry_base: Duration::from_secs(1),
            peer_retries_max: 6,
            reconcile_interval: Duration::from_secs(5),
            gossip: GossipTiming::default(),
            csi_gc: GcConfig::default(),
            core_gc: CoreGcConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            snapshot_threshold: 8_192,
            snapshot_interval: Duration::from_secs(120),
        }
    }
}

/// SWIM timing, a LAN profile tuned so a healed partition reconnects within seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GossipTiming {
    pub probe_period: Duration,
    pub probe_rtt: Duration,
    pub suspect_to_down_after: Duration,
    pub gossip_period: Duration,
    pub announce_period: Duration,
    pub announce_down_period: Duration,
    pub remove_down_after: Duration,
}

impl Default for GossipTiming {
    fn default() -> Self {
        GossipTiming {
            probe_period: Duration::from_secs(1),
            probe_rtt: Duration::from_millis(500),
            suspect_to_down_after: Duration::from_secs(4),
            gossip_period: Duration::from_millis(500),
            announce_period: Duration::from_secs(5),
            announce_down_period: Duration::from_secs(5),
            remove_down_after: Duration::from_secs(60),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            enabled: false,
            bootstrap_expect: 0,
            non_voting_server: false,
            retry_join: Vec::new(),
            retry_interval: Duration::from_secs(30),
            retry_max: 0,
            timing: ServerTiming::default(),
            encrypt: None,
            job_limits: Default::default(),
            autopilot: Default::default(),
            bootstrap_fault: None,
            csi_faults: CsiFaults::default(),
            connect_faults: ConnectFaults::default(),
            scheduler_faults: SchedulerFaults::default(),
            raft_faults: RaftFaults::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientConfig {
    pub enabled: bool,
    /// Servers a client-only agent talks to, `ip:port` (RPC port).
    pub servers: Vec<String>,
    /// `host_volume "name" { path read_only }` blocks.
    pub host_volumes: BTreeMap<String, crate::structs::HostVolumeConfig>,
    /// `meta {}`: the node's metadata.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    #[serde(default)]
    pub node_class: String,
    /// `plugin "raw_exec" { config { enabled = true } }`: off by default, as in Nomad (any
    /// job could otherwise run commands as the agent's user); `-dev` turns it on.
    #[serde(default)]
    pub raw_exec_enabled: bool,
    /// `plugin "mock" { config { enabled = true } }`: the scripted `mock` driver, for tests
    /// of jobs without processes. Nomad builds it only into test binaries; here it is off
    /// unless a client enables it.
    #[serde(default)]
    pub mock_driver_enabled: bool,
    /// `plugin "docker" { config { … } }`: the socket, and what docker tasks may do here.
    #[serde(default)]
    pub docker: crate::driverspec::docker_plugin::DockerPluginConfig,
    /// `network_interface`: the interface whose address tasks' ports are allocated on
    /// (empty: the advertised address, or the default route's interface).
    #[serde(default)]
    pub network_interface: String,
    /// `reserved { reserved_ports = "22,80,8000-8100" }`: ports no allocation gets.
    #[serde(default)]
    pub reserved_ports: BTreeSet<u16>,
    /// `min_dynamic_port` / `max_dynamic_port`; 0 for Nomad's 20000–32000.
    #[serde(default)]
    pub min_dynamic_port: u16,
    #[serde(default)]
    pub max_dynamic_port: u16,
    /// `max_kill_timeout`: no task waits longer than this between its kill signal and SIGKILL,
    /// whatever its `kill_timeout` asks (`None`: Nomad's 30 s,
    /// [`DEFAULT_MAX_KILL_TIMEOUT`]).
    #[serde(default)]
    pub max_kill_timeout: Option<core::time::Duration>,
    /// Defects re-created on purpose in the simulation (regression switches); never set by
    /// an operator's config.
    #[serde(default)]
    pub faults: ClientFaults,
}

/// Client defects the simulation must catch, re-created on purpose (regression switches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientFaults {
    /// A task's processes are not destroyed once its leader is gone: children that ignored
    /// the stop signal, or that a task which exited by itself left running, live on (the leak
    /// of issue 16, where a stopped shell's spinning child survived for half an hour).
    pub skip_task_destroy: bool,
    /// Nomad #25293: a CSI plugin task that does not become healthy within its
    /// `health_timeout` is killed and left dead instead of restarted (system allocations are
    /// never replaced, so the node is without its plugin for good).
    pub plugin_timeout_kills: bool,
    /// Task services are synced with the Consul agent only when something changes, never
    /// periodically: a deregistration that fails while Consul is down is never retried, and
    /// the stopped task's service stays in the catalog (Nomad's service client syncs every
    /// 30 s for exactly this).
    pub no_service_anti_entropy: bool,
    /// A volume whose node unmount fails in postrun is not retried (before Nomad's
    /// `unmountWithRetry`): the mount stays on the host once the plugin recovers.
    pub no_unmount_retry: bool,
    /// A task the client cannot reattach to after a restart is started again without the
    /// process its handle names being destroyed first: two copies of the task run (Nomad
    /// destroys the old one before restarting since 0.9's driver rework).
    pub restore_failure_keeps_process: bool,
    /// Nomad #8609 (before #12113): a claim the servers refuse is never retried, even when
    /// the refusal is one to wait out ("volume max claims reached" while the previous
    /// allocation still detaches): the replacement of an allocation fails at its first
    /// placement after a drain or an update.
    pub no_claim_retry: bool,
    /// Nomad #12744 (before alloc-aware deregistration): a plugin allocation that stops
    /// removes every registration of its plugin name, so the replacement that registered
    /// while it was stopping (a node back from down, a client restart) is forgotten and the
    /// node loses its plugin.
    pub deregister_plugin_by_name: bool,
    /// Controller calls reach the plugin as they arrive, with no turn per plugin on the
    /// client (Nomad's clients never had one): only the servers' queue keeps them apart, so
    /// with #8336's queue per volume two volumes' publishes race in one plugin.
    pub no_controller_turn: bool,
    /// A restarted client takes the first allocation list any server sends, however far
    /// behind that server is: a server still catching up after its own restart leaves out an
    /// allocation the client restored, and the client destroys it.
    pub trust_lagging_first_sync: bool,
    /// The docker driver stops watching a container whose wait broke (its daemon stopped,
    /// restarted or hung): the container's exit is never read, and its task is reported
    /// running for as long as the client lives (Nomad's handle logs "failed to wait for
    /// container" and reads the container instead).
    pub abandon_broken_waits: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConsulConfig {
    /// `host:port` of the local Consul agent; `None` disables Consul integration.
    pub address: Option<String>,
    pub server_service_name: String,
    /// Look up servers in Consul's catalog when no leader is known.
    pub server_auto_join: bool,
    /// Register this server in Consul's catalog so others can find it.
    pub auto_advertise: bool,
    /// Deadline for one catalog call.
    pub timeout: Duration,
    /// Interval between catalog lookups while the cluster lacks a leader.
    pub poll_interval: Duration,
    /// `consul { token }`: the ACL token the agent presents (`X-Consul-Token`); servers need
    /// `acl:write` to create and revoke service identity tokens.
    pub token: Option<String>,
    /// `consul { grpc_address }`: Consul's gRPC (xDS) endpoint, handed to Envoy bootstraps.
    pub grpc_address: String,
    /// `consul { client_auto_join }`: clients with no `servers` find them in Consul's catalog.
    pub client_auto_join: bool,
    /// The `consul` CLI the envoy_bootstrap hook runs (Drover's `consul { binary }`; Nomad
    /// runs `consul` from the PATH, which is the default).
    pub binary: String,
    /// `consul { ssl verify_ssl ca_file cert_file key_file auth }`.
    pub transport: crate::connect::ConsulTransport,
}

impl ConsulConfig {
    /// What a client's Connect tasks need of this configuration.
    pub fn for_client(&self) -> crate::connect::ClientConsul {
        crate::connect::ClientConsul {
            acl: self.token.is_some(),
            http_addr: self.address.clone().unwrap_or_else(|| "127.0.0.1:8500".to_string()),
            grpc_addr: self.grpc_address.clone(),
            binary: self.binary.clone(),
            transport: self.transport.clone(),
        }
    }
}

impl Default for ConsulConfig {
    fn default() -> Self {
        ConsulConfig {
            address: None,
            server_service_name: "nomad".to_string(),
            server_auto_join: true,
            auto_advertise: true,
            timeout: Duration::from_secs(5),
            poll_interval: Duration::from_secs(5),
            token: None,
            grpc_address: "127.0.0.1:8502".to_string(),
            client_auto_join: true,
            binary: "consul".to_string(),
            transport: crate::connect::ConsulTransport::default(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        AgentConfig {
            name: "drover".to_string(),
            region: DEFAULT_REGION.to_string(),
            datacenter: DEFAULT_DATACENTER.to_string(),
            data_dir: None,
            bind_addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            ports: Ports::default(),
            advertise: Advertise::on(ip, Ports::default()),
            server: ServerConfig::default(),
            client: ClientConfig::default(),
            consul: ConsulConfig::default(),
            dev_mode: false,
            acl: AclConfig::default(),
        }
    }
}

/// A configuration the agent refuses to start with. Texts follow Nomad's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("Must specify either server, client or dev mode for the agent.")]
    NoMode,
    #[error("Bootstrap requires server mode to be enabled")]
    BootstrapWithoutServer,
    #[error("Must specify \"data_dir\" config option or \"data-dir\" CLI flag")]
    MissingDataDir,
    #[error(
        "client mode without server mode needs servers: set \"servers\" in the client block or the -servers flag, or a consul address with client_auto_join"
    )]
    ClientWithoutServers,
    #[error("invalid client server address {0:?}: want ip:port")]
    BadServerAddress(String),
    #[error("host_volume {name:?}: path {path:?} must be absolute")]
    HostVolumePath { name: String, path: String },
    #[error("{0}")]
    Consul(String),
    #[error("invalid {field} {value:?}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

/// A configuration the agent starts with but an operator should hear about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigWarning {
    #[error("WARNING: Bootstrap mode enabled! Potentially unsafe operation.")]
    BootstrapModeUnsafe,
    #[error("WARNING: Number of bootstrap servers should ideally be set to an odd number.")]
    EvenBootstrapExpect,
}

impl AgentConfig {
    pub fn validate(&self) -> Result<Vec<ConfigWarning>, ConfigError> {
        if !self.server.enabled && !self.client.enabled && !self.dev_mode {
            return Err(ConfigError::NoMode);
        }
        if self.server.bootstrap_expect > 0 && !self.server.enabled {
            return Err(ConfigError::BootstrapWithoutServer);
        }
        if self.data_dir.is_none() && !self.dev_mode {
            return Err(ConfigError::MissingDataDir);
        }
        let consul_finds_servers = self.consul.address.is_some() && self.consul.client_auto_join;
        if self.client.enabled
            && !self.server.enabled
            && !self.dev_mode
            && self.client.servers.is_empty()
            && !consul_finds_servers
        {
            return Err(ConfigError::ClientWithoutServers);
        }
        for addr in &self.client.servers {
            if addr.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::BadServerAddress(addr.clone()));
            }
        }
        for (name, volume) in &self.client.host_volumes {
            if !volume.path.starts_with('/') {
                return Err(ConfigError::HostVolumePath {
                    name: name.clone(),
                    path: volume.path.clone(),
                });
            }
        }
        self.consul.transport.validate().map_err(ConfigError::Consul)?;
        validate_label("name", &self.name)?;
        validate_label("region", &self.region)?;
        validate_label("datacenter", &self.datacenter)?;
        let mut warnings = Vec::new();
        if self.server.enabled && self.server.bootstrap_expect == 1 && !self.dev_mode {
            warnings.push(ConfigWarning::BootstrapModeUnsafe);
        }
        if self.server.enabled && self.server.bootstrap_expect > 1 && self.server.bootstrap_expect.is_multiple_of(2) {
            warnings.push(ConfigWarning::EvenBootstrapExpect);
        }
        Ok(warnings)
    }
}

const LABEL_LEN_MAX: usize = 128;

fn validate_label(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let reason = if value.is_empty() {
        Some("must not be empty")
    } else if value.len() > LABEL_LEN_MAX {
        Some("must be at most 128 bytes")
    } else if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Some("must not contain whitespace or control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(ConfigError::Invalid {
            field,
            value: value.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use crate::prelude::*;

    fn server(expect: u32) -> AgentConfig {
        let mut config = AgentConfig {
            data_dir: Some("/tmp/x".into()),
            ..AgentConfig::default()
        };
        config.server.enabled = true;
        config.server.bootstrap_expect = expect;
        config
    }

    #[test]
    fn bootstrap_expect_rules_follow_nomad() {
        assert_eq!(server(3).validate(), Ok(vec![]));
        assert_eq!(server(0).validate(), Ok(vec![]));
        assert_eq!(server(1).validate(), Ok(vec![ConfigWarning::BootstrapModeUnsafe]));
        assert_eq!(server(4).validate(), Ok(vec![ConfigWarning::EvenBootstrapExpect]));
        assert_eq!(
            ConfigWarning::BootstrapModeUnsafe.to_string(),
            "WARNING: Bootstrap mode enabled! Potentially unsafe operation."
        );

        let mut client = server(3);
        client.server.enabled = false;
        client.client.enabled = true;
        assert_eq!(client.validate(), Err(ConfigError::BootstrapWithoutServer));
        assert_eq!(
            ConfigError::BootstrapWithoutServer.to_string(),
            "Bootstrap requires server mode to be enabled"
        );
    }

    #[test]
    fn a_client_only_agent_needs_servers_and_absolute_host_volumes() {
        let mut client = server(0);
        client.server.enabled = false;
        client.client.enabled = true;
        assert_eq!(client.validate(), Err(ConfigError::ClientWithoutServers));
        // Consul can find them (client_auto_join, on by default), unless told not to.
        client.consul.address = Some("127.0.0.1:8500".into());
        assert_eq!(client.validate(), Ok(vec![]));
        client.consul.client_auto_join = false;
        assert_eq!(client.validate(), Err(ConfigError::ClientWithoutServers));
        client.consul.address = None;
        client.client.servers = vec!["10.0.0.1".into()];
        assert_eq!(client.validate(), Err(ConfigError::BadServerAddress("10.0.0.1".into())));
        client.client.servers = vec!["10.0.0.1:4647".into()];
        assert_eq!(client.validate(), Ok(vec![]));
        client.client.host_volumes.insert(
            "data".into(),
            crate::structs::HostVolumeConfig {
                path: "srv/data".into(),
                read_only: false,
            },
        );
        assert_eq!(
            client.validate().unwrap_err().to_string(),
            "host_volume \"data\": path \"srv/data\" must be absolute"
        );
    }

    #[test]
    fn dev_mode_needs_no_data_dir_and_does_not_warn() {
        let mut dev = server(1);
        dev.dev_mode = true;
        dev.data_dir = None;
        assert_eq!(dev.validate(), Ok(vec![]));
        let mut missing = server(3);
        missing.data_dir = None;
        assert_eq!(missing.validate(), Err(ConfigError::MissingDataDir));
    }

    #[test]
    fn labels_are_checked() {
        let mut bad = server(3);
        bad.region = "eu west".into();
        let err = bad.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid region \"eu west\": must not contain whitespace or control characters"
        );
        let mut none = server(0);
        none.server.enabled = false;
        assert_eq!(none.validate(), Err(ConfigError::NoMode));
    }
}

// --- Settings the subsystems read, defined here so that every layer above `config` may
// read them and `config` itself reads nothing above it.

/// Nomad's server defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeartbeatConfig {
    /// `min_heartbeat_ttl` (10 s).
    pub min_ttl: Duration,
    /// `max_heartbeats_per_second` (50): the TTL grows with the node count past this rate.
    pub max_per_second: u32,
    /// `heartbeat_grace` (10 s): added to the TTL on the server side only.
    pub grace: Duration,
    /// `failover_heartbeat_ttl` (5 min): every node's deadline after a leader change.
    pub failover_ttl: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            min_ttl: Duration::from_secs(10),
            max_per_second: 50,
            grace: Duration::from_secs(10),
            failover_ttl: Duration::from_secs(300),
        }
    }
}

/// Intervals and thresholds of the CSI core jobs (Nomad: 5 min / 5 min, 5 min / 1 h).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GcConfig {
    pub claim_gc_interval: Duration,
    pub claim_gc_threshold: Duration,
    pub plugin_gc_interval: Duration,
    pub plugin_gc_threshold: Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            claim_gc_interval: Duration::from_secs(300),
            claim_gc_threshold: Duration::from_secs(300),
            plugin_gc_interval: Duration::from_secs(300),
            plugin_gc_threshold: Duration::from_secs(3600),
        }
    }
}

/// The periodic GC's settings (`server { job_gc_interval, *_gc_threshold }`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CoreGcConfig {
    /// How often the leader looks (Nomad's `job_gc_interval` and its fellows: 5 minutes).
    pub interval: Duration,
    pub thresholds: GcThresholds,
}

impl Default for CoreGcConfig {
    fn default() -> Self {
        CoreGcConfig {
            interval: Duration::from_secs(300),
            thresholds: GcThresholds::default(),
        }
    }
}

/// How long each kind of object must have been finished before the periodic GC removes it
/// (Nomad's `*_gc_threshold` server settings and their defaults); all zero for a forced GC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GcThresholds {
    /// Evaluations (and the allocations they placed) of service and system jobs.
    pub eval: Duration,
    /// Evaluations (and allocations) of batch jobs.
    pub batch_eval: Duration,
    /// Stopped jobs, counted from their last evaluation.
    pub job: Duration,
    /// Down nodes, counted from when they went down.
    pub node: Duration,
    /// Finished deployments.
    pub deployment: Duration,
}

impl GcThresholds {
    /// A forced GC: everything finished, however recently.
    pub const NONE: GcThresholds = GcThresholds {
        eval: Duration::ZERO,
        batch_eval: Duration::ZERO,
        job: Duration::ZERO,
        node: Duration::ZERO,
        deployment: Duration::ZERO,
    };
}

impl Default for GcThresholds {
    /// Nomad's defaults.
    fn default() -> Self {
        GcThresholds {
            eval: Duration::from_secs(3_600),
            batch_eval: Duration::from_secs(24 * 3_600),
            job: Duration::from_secs(4 * 3_600),
            node: Duration::from_secs(24 * 3_600),
            deployment: Duration::from_secs(3_600),
        }
    }
}

/// Nomad's `max_kill_timeout` default: the longest a task waits between its kill signal and
/// SIGKILL unless the client's config says otherwise.
pub const DEFAULT_MAX_KILL_TIMEOUT: Duration = Duration::from_secs(30);
const _: () = assert!(
    crate::structs::DEFAULT_KILL_TIMEOUT.as_nanos() <= DEFAULT_MAX_KILL_TIMEOUT.as_nanos(),
    "a task's default kill timeout is within the client's maximum"
);
