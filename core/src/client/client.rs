//! The client half of an agent: one alloc runner per allocation the servers placed here, the
//! dynamic plugin registry, one CSI instance manager per registered plugin (fingerprinting at
//! once and every 30 s), one volume manager per node plugin, and the server-contact gate.
//!
//! It routes every outcome back by operation id, answers volume requests of alloc runners with
//! the right volume manager (waiting up to a minute for the node plugin to appear), serves the
//! servers' `ClientCSI.NodeDetachVolume` through the same volume manager (so unmounts stay
//! serialised per volume), and tells the servers about allocation status and CSI fingerprints
//! through the one narrow RPC interface.

mod cadences;
mod control;
mod controller_turns;
mod plugins;
mod reports;
mod restore;
use crate::client::AllocControl;
pub use cadences::{CONSUL_FINGERPRINT_INTERVAL, DRIVER_FINGERPRINT_INTERVAL, Fingerprint};
use restore::RestoredUser;
mod volumes;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::sync::Arc;
use core::time::Duration;

use crate::client::alloc_runner::{AllocAction, AllocRunner, AllocSpec, LocalAllocState};
use crate::client::devices::{DeviceAllocator, DeviceInstance, DeviceReservations};
use crate::client::paths::ClientPaths;
use crate::client::registry::{PluginInfo, PluginKind, Registry, RegistryEvent};
use crate::client::server_link::{LinkEvent, ServerLink};
use crate::client::service_sync::ServiceSync;
use crate::client::services::{TaskServiceRegistration, Wanted, group_registrations, registrations};
use crate::client::task_runner::{LocalTaskState, TaskAction, TaskStatus};
use crate::client::volume_hook::HostVolumeConfig;
use crate::client::volume_manager::{PluginMounts, VolumeAction, VolumeManager};
use crate::client::{
    ClientNodeEvent, CsiCall, CsiReply, DriverCapabilities, ExitResult, Io, IoError, Outcome, Reply, TaskEvent,
    UsageOptions, VolumeOp,
};
use crate::csi::unpublish::NodeDetachRequest;
use crate::op::{OpId, OpIds};
use crate::rpc::ServerRequest;
use crate::structs::{
    Allocation, ClientStatus, CsiControllerInfo, CsiInfo, CsiNodeInfo, DriverInfo, Job, MAX_RETAINED_NODE_EVENTS, Node,
    NodeEvent,
};
use crate::taskenv::NodeEnv;
use crate::time::Instant;

/// One allocation as an earlier run persisted it: the allocation with its job, its runner's
/// state and its tasks' states.
pub type SavedAlloc = (Allocation, Arc<Job>, LocalAllocState, BTreeMap<String, LocalTaskState>);
/// The registry and allocations [`Client::connect`] restores.
type SavedState = (Registry, Vec<SavedAlloc>);

/// Fingerprint every plugin this often (`managerFingerprintInterval`).
pub const FINGERPRINT_INTERVAL: Duration = Duration::from_secs(30);
pub const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a volume request waits for its node plugin (`WaitForPlugin`, 1 min cap).
pub const PLUGIN_WAIT: Duration = Duration::from_secs(60);
/// Deadline for one server RPC made for the client's own bookkeeping.
pub const SERVER_RPC_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    pub node_id: String,
    pub paths: ClientPaths,
    pub host_volumes: BTreeMap<String, HostVolumeConfig>,
    /// The agent's region (`NOMAD_REGION`, `${node.region}`).
    pub region: String,
    pub seed: u64,
    /// Defects the simulation re-creates on purpose (`ClientConfig::faults`).
    pub faults: crate::config::ClientFaults,
    /// Consul as Connect tasks use it (service identity tokens, Envoy bootstrap).
    pub consul: crate::connect::ClientConsul,
    /// The longest a task's `kill_timeout` may be (`client { max_kill_timeout }`).
    pub max_kill_timeout: core::time::Duration,
}

/// A named allocation a client GC may not collect: not on this client, still running or
/// stopping, or not yet listed by the servers as finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("No such allocation on client or allocation not eligible for GC")]
pub struct GcRefused;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientInput {
    /// The allocations the servers placed on this node, with their jobs (a successful sync).
    Allocs {
        allocs: Vec<(Allocation, Arc<Job>)>,
        /// Allocations elsewhere that these wait for and that finished (see
        /// `ServerState::node_allocs`).
        finished_elsewhere: Vec<String>,
    },
    Outcome {
        op: OpId,
        outcome: Outcome,
    },
    TaskExited {
        alloc_id: String,
        task: String,
        exit: ExitResult,
    },
    /// A task driver was fingerprinted (the driver manager's fingerprint stream). Tasks may
    /// use it while it is detected and healthy; the node's driver table follows `info`.
    Driver {
        name: String,
        capabilities: DriverCapabilities,
        info: DriverInfo,
    },
    /// One fingerprint round of every driver: the node's driver table is reported once, whole
    /// (driver by driver, the first report would carry a partial table).
    Drivers {
        drivers: Vec<(String, DriverCapabilities, DriverInfo)>,
    },
    /// An operator's restart or signal of a running allocation; answered with
    /// `ClientAction::AllocControlled`.
    AllocControl {
        req: u64,
        request: AllocControl,
    },
    /// `ClientCSI.NodeDetachVolume` from a server; answered with `ClientAction::NodeDetached`.
    NodeDetach {
        req: u64,
        request: NodeDetachRequest,
    },
    /// A server's controller call to a controller plugin on this node (`ClientCSI.Controller*`);
    /// answered with `ClientAction::ControllerReply`, or started with `ControllerStart` when
    /// its plugin's turn comes (`controller_turns`).
    ControllerCall {
        req: u64,
        request: crate::rpc::ClientCsiRequest,
    },
    /// A call `ClientAction::ControllerStart` started returned (or was never made: its caller
    /// had gone by then).
    ControllerFinished {
        req: u64,
    },
    /// `ClientCSI.NodeExpandVolume` from a server; answered with `ClientAction::NodeExpanded`.
    NodeExpand {
        req: u64,
        request: crate::rpc::NodeExpandRequest,
    },
    /// The local Consul agent was fingerprinted (Nomad's consul fingerprinter): the node's
    /// `consul.*` attributes become `attributes` (empty: Consul is unreachable, which Nomad
    /// also reports by dropping them). A change registers the node again.
    ConsulAttributes {
        attributes: BTreeMap<String, String>,
    },
    /// One fingerprint round of the device plugins: each plugin's instances.
    Devices {
        inventory: BTreeMap<String, Vec<DeviceInstance>>,
    },
    /// The agent is stopping in dev mode, whose client destroys its allocations on the way
    /// out as Nomad's does (outside dev mode tasks keep running, for a restarted agent to
    /// reattach): every allocation is stopped and destroyed as if the servers had dropped
    /// it — tasks killed, their log collectors ending with them, volumes unmounted,
    /// directories removed — CSI plugins' last, so the volumes they serve are unmounted
    /// through them first; and none starts again. [`Client::is_drained`] says when it is done.
    Shutdown,
    /// Writing a record to the client's store failed: what survives a restart is now behind
    /// what runs. Raised to the operator as a `Storage` node event (at most one per
    /// [`PERSIST_EVENT_INTERVAL`], with the count of failures since the last one).
    PersistFailed {
        record: String,
        error: String,
    },
}

/// The shortest time between two `Storage` node events about failed client state writes.
pub const PERSIST_EVENT_INTERVAL: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientAction {
    /// Take this fingerprint and hand it back (`ClientInput::Drivers` and `Devices`, or
    /// `ConsulAttributes`): the client's cadence says it is due.
    Fingerprint(Fingerprint),
    Io {
        op: OpId,
        io: Io,
    },
    PersistAlloc {
        alloc_id: String,
        state: Box<LocalAllocState>,
    },
    PersistTask {
        alloc_id: String,
        task: String,
        state: Box<LocalTaskState>,
    },
    PersistRegistry(Box<Registry>),
    TaskEvent {
        alloc_id: String,
        task: String,
        event: TaskEvent,
    },
    NodeEvent(ClientNodeEvent),
    /// A hook passed a lifecycle point (traces; the hook-order invariant).
    Hook {
        alloc_id: String,
        hook: &'static str,
        phase: &'static str,
        result: Result<(), String>,
    },
    NodeDetached {
        req: u64,
        result: Result<(), crate::error::CsiCallError>,
    },
    /// The node's capacity of the volume after `NodeExpandVolume` (0: not said).
    NodeExpanded {
        req: u64,
        result: Result<u64, crate::error::CsiCallError>,
    },
    /// Make controller call `req` to the plugin at `socket`, unless its caller has gone;
    /// `ClientInput::ControllerFinished` once it returned.
    ControllerStart {
        req: u64,
        socket: String,
        request: crate::rpc::ClientCsiRequest,
    },
    /// The answer to controller call `req`, made without the plugin.
    ControllerReply {
        req: u64,
        result: Result<crate::rpc::ClientCsiReply, crate::error::CsiCallError>,
    },
    /// Controller call `req` ran past its deadline: its caller gets `error`, and its turn goes
    /// to the next call (the call itself may still end in the plugin).
    ControllerAbandoned {
        req: u64,
        error: crate::error::CsiCallError,
    },
    /// The answer to `ClientInput::AllocControl`.
    AllocControlled {
        req: u64,
        result: Result<(), crate::error::AllocCallError>,
    },
    /// The allocation is gone from the servers and from this host: drop its records.
    Forget {
        alloc_id: String,
    },
    /// Which device instances each task holds (see [`DeviceAllocator`]).
    PersistDevices(Box<DeviceReservations>),
    /// A new allocation placed here, with its job: kept so a restarted agent can rebuild its
    /// runner before the servers answer.
    PersistSpec {
        alloc: Box<Allocation>,
        job: Arc<Job>,
    },
}

/// Who is waiting for an op's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Alloc(String),
    Volume(String),
    Instance(PluginKind, String),
    /// A report to the servers (alloc status, node CSI info): one in flight per subject.
    Report(Report),
    /// A signal an operator asked for (`ClientInput::AllocControl` number `.0`).
    Control(u64),
}

/// What the servers are told; only the latest value matters, sent one at a time per subject
/// so an older report can never land after a newer one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Report {
    /// Every allocation whose status or task states changed since the servers accepted them,
    /// in one request (Nomad's `Node.UpdateAlloc`), at most once per [`ALLOC_UPDATE_INTERVAL`].
    Allocs,
    CsiInfo,
    Drivers,
    /// Node events waiting to be sent (a queue, not a latest value).
    NodeEvents,
}

/// How long a failed report waits before it is sent again.
pub const REPORT_RETRY: Duration = Duration::from_secs(1);
/// Allocation updates are coalesced: one batch is in flight at a time, and everything that
/// changed meanwhile goes in the next, sent when the interval since the last one has passed
/// (Nomad's client waits 200 ms). The wait delays a finished allocation's report, which hid
/// the #8232 regression switch in `jobs_node_drain` until that scenario also slowed the
/// plugin's unmounts: with fast unmounts the claims were released before the drain could
/// see the allocations finished, so the defect's window never opened.
pub const ALLOC_UPDATE_INTERVAL: Duration = Duration::from_millis(200);

/// Who asked a volume manager.
#[derive(Clone, Debug, PartialEq, Eq)]
enum VolumeRequester {
    Alloc(String),
    NodeDetach(u64),
    NodeExpand(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum FingerprintStep {
    Capabilities,
    NodeInfo,
    Probe,
    ServiceCapabilities,
}

#[derive(Clone, Debug)]
struct Instance {
    info: PluginInfo,
    step: Option<FingerprintStep>,
    pending: Option<(OpId, Instant)>,
    next_at: Option<Instant>,
    /// Basic facts, cached after the first success.
    basic: Option<(bool, bool)>,
    node_info: Option<CsiNodeInfo>,
    healthy: bool,
    error: Option<String>,
    controller: Option<CsiControllerInfo>,
}

#[derive(Debug)]
pub struct Client {
    /// When drivers and Consul are fingerprinted next.
    cadences: cadences::Cadences,
    /// Controller calls by plugin: one running at a time.
    controller_turns: controller_turns::ControllerTurns,
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    settings: ClientSettings,
    ops: OpIds,
    /// Operators' signals in flight: how many sends each still waits on, and the first error.
    controls: BTreeMap<u64, (usize, Option<String>)>,
    allocs: BTreeMap<String, AllocRunner>,
    registry: Registry,
    instances: BTreeMap<(PluginKind, String), Instance>,
    volumes: BTreeMap<String, VolumeManager>,
    drivers: BTreeMap<String, DriverCapabilities>,
    driver_infos: BTreeMap<String, DriverInfo>,
    /// Node events not yet accepted by the servers, oldest first.
    pending_events: Vec<ClientNodeEvent>,
    /// When the last `Storage` node event was raised, and failures since (not yet raised).
    persist_event_at: Option<Instant>,
    persist_failures_unreported: u64,
    servers_contacted: bool,
    routes: BTreeMap<OpId, Route>,
    requesters: BTreeMap<OpId, VolumeRequester>,
    /// Volume requests waiting for their node plugin: (request, plugin, op, give up at).
    waiting: Vec<(OpId, String, VolumeOp, Instant)>,
    /// After an agent restart: allocations whose persisted state says they mounted a volume,
    /// by plugin, handed to the plugin's volume manager as users once it exists (so an
    /// unmount never unstages a volume another restored allocation still has published).
    restored_users: Vec<RestoredUser>,
    node_controllers: BTreeMap<String, CsiInfo>,
    node_plugins: BTreeMap<String, CsiInfo>,
    statuses: BTreeMap<String, ClientStatus>,
    /// Allocations the servers no longer list: destroyed (alloc dir removed) once done.
    collect_garbage: BTreeSet<String>,
    /// Allocations the servers' last sync listed as finished here (client-terminal): what an
    /// operator's GC may collect once they are done.
    listed_finished: BTreeSet<String>,
    /// Dev mode's shutdown is under way ([`ClientInput::Shutdown`]).
    shutting_down: bool,
    /// Reports in flight (with the request sent), acknowledged values, and retry times.
    reports_in_flight: BTreeMap<Report, (OpId, ServerRequest)>,
    /// Reports in flight when the node registered again: the registration replaced the node
    /// record, so their answer (possibly applied before it) does not mean the servers hold
    /// them. They are sent again when answered.
    reports_superseded: BTreeSet<Report>,
    reports_acked: BTreeMap<Report, ServerRequest>,
    reports_retry: BTreeMap<Report, Instant>,
    /// What the servers accepted of each allocation; one whose report differs is sent.
    allocs_acked: BTreeMap<String, crate::structs::AllocClientReport>,
    /// The earliest time the next allocation batch may go out.
    allocs_batch_at: Option<Instant>,
    /// The last report of allocations this client forgot (collected, or no longer listed)
    /// before the servers accepted it: sent until they do.
    final_reports: BTreeMap<String, crate::structs::AllocClientReport>,
    link: ServerLink,
    /// Deployment health of the allocations placed by deployments.
    health: super::health::HealthTracker,
    /// Reads Consul's check statuses while deployment health waits on them.
    checks: super::check_poll::CheckPoll,
    services: ServiceSync,
    devices: DeviceAllocator,
    /// What [`Client::connect`] restores once the node is first registered.
    pending_restore: Option<SavedState>,
    /// The node as tasks see it, from the record [`Client::connect`] registers.
    node_env: Arc<NodeEnv>,
    /// The wall clock at `Instant` zero, in Unix nanoseconds ([`Client::set_wall_epoch`]).
    wall_epoch: i64,
    actions: VecDeque<ClientAction>,
}

impl Client {
    pub fn new(settings: ClientSettings) -> Self {
        Client {
            cadences: cadences::Cadences::default(),
            controller_turns: controller_turns::ControllerTurns::default(),
            clock: crate::time::Monotonic::default(),
            settings,
            ops: OpIds::default(),
            controls: BTreeMap::new(),
            allocs: BTreeMap::new(),
            registry: Registry::default(),
            instances: BTreeMap::new(),
            volumes: BTreeMap::new(),
            drivers: BTreeMap::new(),
            driver_infos: BTreeMap::new(),
            pending_events: Vec::new(),
            persist_event_at: None,
            persist_failures_unreported: 0,
            servers_contacted: false,
            routes: BTreeMap::new(),
            requesters: BTreeMap::new(),
            waiting: Vec::new(),
            restored_users: Vec::new(),
            node_controllers: BTreeMap::new(),
            node_plugins: BTreeMap::new(),
            statuses: BTreeMap::new(),
            collect_garbage: BTreeSet::new(),
            listed_finished: BTreeSet::new(),
            shutting_down: false,
            reports_in_flight: BTreeMap::new(),
            reports_superseded: BTreeSet::new(),
            reports_acked: BTreeMap::new(),
            reports_retry: BTreeMap::new(),
            allocs_acked: BTreeMap::new(),
            allocs_batch_at: None,
            final_reports: BTreeMap::new(),
            link: ServerLink::default(),
            health: Default::default(),
            checks: Default::default(),
            services: ServiceSync::default(),
            devices: DeviceAllocator::default(),
            pending_restore: None,
            node_env: Arc::default(),
            wall_epoch: 0,
            actions: VecDeque::new(),
        }
    }

    /// The driver's wall clock at the `Instant` zero it hands the client (Unix nanoseconds):
    /// task event and state times are told on it. The core never reads a clock itself.
    pub fn set_wall_epoch(&mut self, unix_nanos: i64) {
        self.wall_epoch = unix_nanos;
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn alloc(&self, id: &str) -> Option<&AllocRunner> {
        self.allocs.get(id)
    }

    pub fn allocs(&self) -> impl Iterator<Item = &AllocRunner> {
        self.allocs.values()
    }

    pub fn node_csi(&self) -> (&BTreeMap<String, CsiInfo>, &BTreeMap<String, CsiInfo>) {
        (&self.node_controllers, &self.node_plugins)
    }

    fn spec(&self, alloc: &Allocation, job: &Job) -> Option<AllocSpec> {
        let group = job
            .task_groups
            .iter()
            .find(|group| group.name == alloc.task_group)?
            .clone();
        Some(AllocSpec {
            alloc: alloc.clone(),
            job_type: job.job_type,
            job_name: job.name.clone(),
            job_meta: job.meta.clone(),
            group,
            node: self.node_env.clone(),
            node_id: self.settings.node_id.clone(),
            paths: self.settings.paths.clone(),
            host_volumes: self.settings.host_volumes.clone(),
            drivers: self.drivers.clone(),
            seed: self.settings.seed ^ fnv(&alloc.id),
            faults: self.settings.faults,
            consul: self.settings.consul.clone(),
            max_kill_timeout: self.settings.max_kill_timeout,
            wall_epoch: self.wall_epoch,
            job_payload: job.payload.clone(),
        })
    }

    pub fn handle(&mut self, now: Instant, input: ClientInput) {
        self.clock.observe(now);
        match input {
            ClientInput::Allocs {
                allocs,
                finished_elsewhere,
            } => self.sync_allocs(now, allocs, finished_elsewhere),
            ClientInput::Outcome { op, outcome } => {
                debug_assert!(
                    self.ops.issued(op),
                    "an outcome for {op}, which this client never issued"
                );
                self.outcome(now, op, outcome)
            }
            ClientInput::TaskExited { alloc_id, task, exit } => {
                if let Some(runner) = self.allocs.get_mut(&alloc_id) {
                    runner.task_exited(now, &task, exit, &mut self.ops);
                    self.collect(now, &alloc_id);
                }
            }
            ClientInput::Driver {
                name,
                capabilities,
                info,
            } => {
                if self.driver_fingerprint(now, name, capabilities, info) {
                    self.report(now, Report::Drivers);
                }
            }
            ClientInput::Drivers { drivers } => {
                let mut changed = false;
                for (name, capabilities, info) in drivers {
                    changed |= self.driver_fingerprint(now, name, capabilities, info);
                }
                if changed {
                    self.report(now, Report::Drivers);
                }
            }
            ClientInput::NodeDetach { req, request } => self.node_detach(now, req, request),
            ClientInput::ControllerCall { req, request } => self.controller_call(now, req, request),
            ClientInput::ControllerFinished { req } => self.controller_finished(now, req),
            ClientInput::NodeExpand { req, request } => self.node_expand(now, req, request),
            ClientInput::AllocControl { req, request } => self.alloc_control(now, req, request),
            ClientInput::PersistFailed { record, error } => self.persist_failed(now, record, error),
            ClientInput::Devices { inventory } => self.devices.set_inventory(inventory),
            ClientInput::Shutdown => {
                self.shutting_down = true;
                self.shut_down_next(now);
            }
            ClientInput::ConsulAttributes { attributes } => {
                self.link
                    .set_attributes(now, &["consul.", "unique.consul."], attributes)
            }
        }
        self.drive_link(now);
    }

    /// An operator's client GC (Nomad's `/v1/client/gc`, or `/v1/client/allocation/:id/gc`
    /// for one): every allocation that is done here and that the servers list as finished is
    /// destroyed (its dir removed) and forgotten, as the servers dropping it would. What the
    /// servers still count as running, or what is still stopping, is kept. Returns what is
    /// collected; one named allocation that is not eligible is refused.
    pub fn garbage_collect(&mut self, now: Instant, alloc_id: Option<&str>) -> Result<Vec<String>, GcRefused> {
        let eligible = |id: &String, runner: &AllocRunner| {
            runner.is_done() && self.listed_finished.contains(id) && !self.collect_garbage.contains(id)
        };
        let picked: Vec<String> = match alloc_id {
            Some(id) => match self.allocs.get_key_value(id) {
                Some((id, runner)) if eligible(id, runner) => vec![id.clone()],
                _ => return Err(GcRefused),
            },
            None => self
                .allocs
                .iter()
                .filter(|(id, runner)| eligible(id, runner))
                .map(|(id, _)| id.clone())
                .collect(),
        };
        for id in &picked {
            self.collect_garbage.insert(id.clone());
            self.collect(now, id);
        }
        Ok(picked)
    }

    /// Dev mode's shutdown ([`ClientInput::Shutdown`]) destroyed every allocation.
    pub fn is_drained(&self) -> bool {
        self.shutting_down && self.allocs.is_empty()
    }

    /// Stops every allocation that is not a CSI plugin's, then, once those are gone, the
    /// plugins'; each is destroyed when it is done, as garbage.
    fn shut_down_next(&mut self, now: Instant) {
        let serves_volumes = |runner: &AllocRunner| runner.group().tasks.iter().any(|task| task.csi_plugin.is_some());
        let others_left = self.allocs.values().any(|runner| !serves_volumes(runner));
        let ids: Vec<String> = self
            .allocs
            .iter()
            .filter(|(id, runner)| !self.collect_garbage.contains(*id) && (!others_left || !serves_volumes(runner)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(runner) = self.allocs.get_mut(&id) {
                runner.stop(now, &mut self.ops);
            }
            self.collect_garbage.insert(id.clone());
            self.collect(now, &id);
        }
    }

    /// The TTL the servers gave the last heartbeat or registration.
    pub fn heartbeat_ttl(&self) -> Duration {
        self.link.ttl()
    }

    /// Keeps the local Consul agent's task services equal to the running tasks' `service`
    /// blocks, registering them at `address` (see [`ServiceSync`]).
    pub fn enable_service_sync(&mut self, now: Instant, address: String) {
        self.services
            .enable_with(now, address, self.settings.faults.no_service_anti_entropy);
        self.drive_link(now);
    }

    /// Sends the link's and the service sync's requests that are due.
    fn drive_link(&mut self, now: Instant) {
        for (op, io) in self.link.poll(now, &mut self.ops) {
            self.actions.push_back(ClientAction::Io { op, io });
        }
        // Not before the earlier run's allocations are restored: a pass would find none of
        // their services wanted and deregister every one of them, taking running tasks out of
        // Consul until the next pass (Nomad restores allocations before it syncs).
        if self.pending_restore.is_none()
            && let Some((op, io)) = self.services.poll(now, &mut self.ops)
        {
            self.actions.push_back(ClientAction::Io { op, io });
        }
        if let Some((op, io)) = self.checks.poll(now, self.wants_checks(), &mut self.ops) {
            self.actions.push_back(ClientAction::Io { op, io });
        }
    }

    /// Whether Consul's check statuses are to be read: some allocation's health waits on them
    /// and the client has a Consul agent.
    fn wants_checks(&self) -> bool {
        self.services.enabled() && self.health.wants_checks()
    }

    /// Consul's check statuses were read (or the read failed).
    fn checks_outcome(&mut self, now: Instant, outcome: Outcome) {
        if let Some(statuses) = self.checks.outcome(now, outcome) {
            for id in self.health.set_check_statuses(statuses) {
                self.observe_health(now, &id);
            }
        }
        self.drive_link(now);
    }

    fn link_outcome(&mut self, now: Instant, op: OpId, outcome: Outcome) {
        match self.link.outcome(now, op, outcome) {
            Some(LinkEvent::Registered { again: false }) => {
                tracing::info!(node_id = %self.settings.node_id, "node registration complete");
                if let Some((registry, saved)) = self.pending_restore.take() {
                    self.restore(now, registry, saved);
                }
            }
            Some(LinkEvent::Registered { again: true }) => {
                for report in [Report::CsiInfo, Report::Drivers] {
                    self.reports_acked.remove(&report);
                    if self.reports_in_flight.contains_key(&report) {
                        self.reports_superseded.insert(report.clone());
                    }
                    self.report(now, report);
                }
            }
            Some(LinkEvent::Allocs {
                allocs,
                finished_elsewhere,
            }) => self.sync_allocs(now, allocs, finished_elsewhere),
            None => {}
        }
    }

    fn sync_allocs(&mut self, now: Instant, allocs: Vec<(Allocation, Arc<Job>)>, finished_elsewhere: Vec<String>) {
        if self.shutting_down {
            // Nothing starts or stops on the servers' word any more: everything is going.
            return;
        }
        let first = !self.servers_contacted;
        self.servers_contacted = true;
        if first {
            // Nomad's client says when it first hears its allocations; a restarted client that
            // never gets here is stuck before its first sync.
            tracing::info!(
                listed = allocs.len(),
                running_here = self.allocs.len(),
                "first allocation sync from the servers"
            );
        }
        let mut terminal: BTreeSet<String> = finished_elsewhere.into_iter().collect();
        self.listed_finished = allocs
            .iter()
            .filter(|(alloc, _)| alloc.client_terminal())
            .map(|(alloc, _)| alloc.id.clone())
            .collect();
        for (alloc, job) in &allocs {
            if alloc.client_terminal() || alloc.server_terminal() {
                terminal.insert(alloc.id.clone());
            }
            let group = job.task_groups.iter().find(|group| group.name == alloc.task_group);
            self.health.watch(now, alloc, group);
            match self.allocs.get_mut(&alloc.id) {
                Some(runner) => {
                    if alloc.server_terminal() {
                        runner.stop(now, &mut self.ops);
                    }
                    // Promoted: its services trade their canary tags for their tags.
                    if runner.alloc().is_canary() && !alloc.is_canary() {
                        runner.promoted();
                    }
                }
                None => {
                    if alloc.client_terminal() {
                        continue;
                    }
                    if alloc.server_terminal() {
                        // Stopped before it ever ran here (say, replaced while this client
                        // was down): nothing to run or clean up, but the servers must hear it
                        // finished, as Nomad's alloc runner tells them, or it stays pending
                        // for good (found by the real-client simulation, seed 49 of
                        // real_clients_rolling_update).
                        self.statuses.insert(alloc.id.clone(), ClientStatus::Complete);
                        self.report(now, Report::Allocs);
                        continue;
                    }
                    let Some(spec) = self.spec(alloc, job) else { continue };
                    self.actions.push_back(ClientAction::PersistSpec {
                        alloc: Box::new(alloc.clone()),
                        job: job.clone(),
                    });
                    let mut runner = AllocRunner::new(spec);
                    runner.run(now, &mut self.ops);
                    self.allocs.insert(alloc.id.clone(), runner);
                }
            }
        }
        // Allocations the servers no longer list here are stopped.
        let listed: BTreeSet<&String> = allocs.iter().map(|(alloc, _)| &alloc.id).collect();
        let gone: Vec<String> = self.allocs.keys().filter(|id| !listed.contains(id)).cloned().collect();
        for id in gone {
            if let Some(runner) = self.allocs.get_mut(&id) {
                runner.stop(now, &mut self.ops);
            }
            self.collect_garbage.insert(id);
        }
        // Statuses of allocations that never ran here, once the servers stop listing them.
        let unlisted: Vec<String> = self
            .statuses
            .keys()
            .filter(|id| !self.allocs.contains_key(*id) && !listed.contains(id))
            .cloned()
            .collect();
        for id in unlisted {
            self.forget_status(now, &id);
        }
        // Local runners that finished count as terminal for their replacements.
        terminal.extend(
            self.allocs
                .values()
                .filter(|runner| runner.is_done())
                .map(|runner| runner.alloc_id().to_string()),
        );
        let ids: Vec<String> = self.allocs.keys().cloned().collect();
        for id in ids {
            let runner = self.allocs.get_mut(&id).expect("listed");
            if first {
                runner.servers_contacted(now, &mut self.ops);
            }
            runner.allocs_terminal(now, &terminal, &mut self.ops);
            self.collect(now, &id);
        }
    }

    fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome) {
        if self.link.owns(op) {
            return self.link_outcome(now, op, outcome);
        }
        if self.checks.owns(op) {
            return self.checks_outcome(now, outcome);
        }
        if self.services.owns(op) {
            let allocs = &self.allocs;
            return self.services.outcome(now, outcome, || wanted_services(allocs));
        }
        match self.routes.remove(&op) {
            Some(Route::Alloc(id)) => {
                if let Some(runner) = self.allocs.get_mut(&id) {
                    runner.outcome(now, op, outcome, &mut self.ops);
                    self.collect(now, &id);
                }
            }
            Some(Route::Volume(plugin)) => {
                if let Some(manager) = self.volumes.get_mut(&plugin) {
                    manager.outcome(now, op, outcome, &mut self.ops);
                    self.collect_volume(now, &plugin);
                }
            }
            Some(Route::Instance(kind, name)) => self.fingerprint_outcome(now, kind, &name, op, outcome),
            Some(Route::Control(req)) => self.control_outcome(req, outcome),
            Some(Route::Report(report)) => {
                let Some((_, sent)) = self.reports_in_flight.remove(&report) else {
                    return;
                };
                if self.reports_superseded.remove(&report) {
                    // A registration may have been applied after it: send it again.
                    self.report(now, report);
                    return;
                }
                let accepted = match outcome {
                    // Refused for good (the alloc is gone, say): retrying cannot help.
                    Ok(Reply::Server(crate::rpc::ServerReply::Error(error))) if !error.retryable => true,
                    Ok(Reply::Server(crate::rpc::ServerReply::Done { .. })) => true,
                    _ => false,
                };
                match (accepted, sent) {
                    (true, ServerRequest::NodeEmitEvents { events, .. }) => {
                        self.pending_events.drain(..events.len().min(self.pending_events.len()));
                    }
                    (true, ServerRequest::AllocClientUpdates { updates, .. }) => {
                        for update in updates {
                            if self.final_reports.get(&update.alloc_id) == Some(&update) {
                                self.final_reports.remove(&update.alloc_id);
                            }
                            self.allocs_acked.insert(update.alloc_id.clone(), update);
                        }
                    }
                    (true, sent) => {
                        self.reports_acked.insert(report.clone(), sent);
                    }
                    _ => {
                        // A request that failed or timed out may still be applied: the leader
                        // that took it commits it once it has a quorum again. What the servers
                        // hold is unknown until a send is accepted, so the next one goes even if
                        // it says what was last acknowledged (servers_away seed 158: a plugin's
                        // unhealthy report timed out three times while the leader had no
                        // quorum, healthy again it matched the last acknowledgement and was not
                        // sent, and the late commit left the node's plugin unhealthy for good).
                        self.reports_acked.remove(&report);
                        self.reports_retry.insert(report.clone(), now + REPORT_RETRY);
                        return;
                    }
                }
                self.report(now, report);
            }
            None => {}
        }
    }

    // --- routing --------------------------------------------------------------------------

    /// Drains an alloc runner's actions: I/O to the driver (or to a volume manager), records
    /// to persist, registry changes, events, and status changes to report.
    fn collect(&mut self, now: Instant, alloc_id: &str) {
        loop {
            let Some(runner) = self.allocs.get_mut(alloc_id) else {
                return;
            };
            let Some(action) = runner.poll_action() else {
                // Garbage: destroy once postrun is done, then forget.
                if self.collect_garbage.contains(alloc_id) {
                    if runner.is_destroyed() {
                        self.health.forget(alloc_id);
                        self.forget_status(now, alloc_id);
                        self.allocs.remove(alloc_id);
                        self.collect_garbage.remove(alloc_id);
                        if self.devices.release_alloc(alloc_id) {
                            self.persist_devices();
                        }
                        self.actions.push_back(ClientAction::Forget {
                            alloc_id: alloc_id.to_string(),
                        });
                        if self.shutting_down {
                            // The plugins' turn once the allocations they serve are gone.
                            self.shut_down_next(now);
                        }
                        return;
                    }
                    if runner.is_done() && !runner.is_destroying() {
                        runner.destroy(now, &mut self.ops);
                        continue;
                    }
                }
                self.observe_health(now, alloc_id);
                break;
            };
            match action {
                AllocAction::Io { op, io } => self.dispatch(now, op, io, Route::Alloc(alloc_id.to_string())),
                AllocAction::Persist(state) => self.actions.push_back(ClientAction::PersistAlloc {
                    alloc_id: alloc_id.to_string(),
                    state,
                }),
                AllocAction::Hook { hook, phase, result } => self.actions.push_back(ClientAction::Hook {
                    alloc_id: alloc_id.to_string(),
                    hook,
                    phase,
                    result,
                }),
                AllocAction::Status(status) => {
                    self.statuses.insert(alloc_id.to_string(), status);
                    self.report(now, Report::Allocs);
                }
                AllocAction::Task { task, action } => match action {
                    TaskAction::Io { op, io } => self.dispatch(now, op, io, Route::Alloc(alloc_id.to_string())),
                    TaskAction::Persist(state) => {
                        self.services.changed(now);
                        self.report(now, Report::Allocs);
                        if state.state.state == TaskStatus::Dead && self.devices.release_task(alloc_id, &task) {
                            self.persist_devices();
                        }
                        self.actions.push_back(ClientAction::PersistTask {
                            alloc_id: alloc_id.to_string(),
                            task,
                            state,
                        });
                    }
                    TaskAction::Event(event) => {
                        // The event is in the task's state: the servers hear of it with the
                        // next batch (within ALLOC_UPDATE_INTERVAL), not when something else
                        // on the node next changes.
                        self.report(now, Report::Allocs);
                        self.actions.push_back(ClientAction::TaskEvent {
                            alloc_id: alloc_id.to_string(),
                            task,
                            event,
                        });
                    }
                    TaskAction::Register(info) => {
                        if self.registry.register(info).unwrap_or(false) {
                            self.persist_registry();
                        }
                        self.drain_registry(now);
                    }
                    TaskAction::Deregister { kind, name, alloc_id } => {
                        let changed = if self.settings.faults.deregister_plugin_by_name {
                            self.registry.deregister_name(kind, &name)
                        } else {
                            self.registry.deregister(kind, &name, &alloc_id)
                        };
                        if changed {
                            self.persist_registry();
                        }
                        self.drain_registry(now);
                    }
                },
            }
        }
    }

    fn dispatch(&mut self, now: Instant, op: OpId, io: Io, route: Route) {
        match io {
            Io::ReserveDevices {
                alloc_id,
                task,
                devices,
            } => match self.devices.choose(&alloc_id, &task, &devices) {
                Ok(picks) => {
                    self.persist_devices();
                    self.routes.insert(op, route);
                    self.actions.push_back(ClientAction::Io {
                        op,
                        io: Io::PrepareDevices { picks },
                    });
                }
                Err(error) => {
                    self.routes.insert(op, route);
                    self.outcome(now, op, Err(error));
                }
            },
            Io::Volume(volume_op) => {
                let requester = match &route {
                    Route::Alloc(id) => VolumeRequester::Alloc(id.clone()),
                    _ => return,
                };
                self.requesters.insert(op, requester);
                let plugin = match &volume_op {
                    VolumeOp::Mount { plugin_id, .. }
                    | VolumeOp::Unmount { plugin_id, .. }
                    | VolumeOp::HasMount { plugin_id, .. }
                    | VolumeOp::Expand { plugin_id, .. } => plugin_id.clone(),
                };
                self.submit_volume(now, op, plugin, volume_op);
            }
            io => {
                self.routes.insert(op, route);
                self.actions.push_back(ClientAction::Io { op, io });
            }
        }
    }

    // --- time -----------------------------------------------------------------------------

    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock.observe(now);
        self.fingerprint_due(now);
        self.controller_deadlines(now);
        let due: Vec<Report> = self
            .reports_retry
            .iter()
            .filter(|(_, at)| now >= **at)
            .map(|(report, _)| report.clone())
            .collect();
        for report in due {
            self.reports_retry.remove(&report);
            self.report(now, report);
        }
        // Fingerprint deadlines and rounds.
        let keys: Vec<(PluginKind, String)> = self.instances.keys().cloned().collect();
        for (kind, name) in keys {
            let Some(instance) = self.instances.get(&(kind, name.clone())) else {
                continue;
            };
            if let Some((op, deadline)) = instance.pending
                && now >= deadline
            {
                self.routes.remove(&op);
                self.fingerprint_outcome(
                    now,
                    kind,
                    &name,
                    op,
                    Err(IoError::new(crate::client::ErrorKind::Timeout, "fingerprint timed out")),
                );
            } else if instance.pending.is_none() && instance.next_at.is_some_and(|at| now >= at) {
                self.start_fingerprint(now, kind, &name);
            }
        }
        // Volume requests whose plugin never appeared.
        let (expired, rest): (Vec<_>, Vec<_>) = core::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, _, _, at)| now >= *at);
        self.waiting = rest;
        for (request, plugin, _, _) in expired {
            self.volume_reply(
                now,
                request,
                Err(IoError::new(
                    crate::client::ErrorKind::Unavailable,
                    format!("plugin {plugin} for type csi-node not found"),
                )),
            );
        }
        let plugins: Vec<String> = self.volumes.keys().cloned().collect();
        for plugin in plugins {
            if let Some(manager) = self.volumes.get_mut(&plugin) {
                manager.handle_timeout(now, &mut self.ops);
            }
            self.collect_volume(now, &plugin);
        }
        self.stop_disconnected(now);
        let ids: Vec<String> = self.allocs.keys().cloned().collect();
        for id in ids {
            if let Some(runner) = self.allocs.get_mut(&id) {
                runner.handle_timeout(now, &mut self.ops);
            }
            self.collect(now, &id);
        }
        for id in self.health.due(now) {
            self.observe_health(now, &id);
        }
        self.drive_link(now);
    }

    /// When each allocation whose group says `stop_after_client_disconnect` is to be stopped
    /// for want of the servers: that long after the last contact with them.
    fn disconnect_deadlines(&self) -> impl Iterator<Item = (&String, Instant)> + '_ {
        let last = self.link.last_contact();
        self.allocs.iter().filter_map(move |(id, runner)| {
            let after = runner.group().stop_after_client_disconnect?;
            (!runner.is_stopping()).then_some((id, last? + after))
        })
    }

    /// Stops what has been out of touch with the servers for its group's
    /// `stop_after_client_disconnect` (Nomad's heartbeat stop): the servers, which took the
    /// node for down, place replacements only after the same time.
    fn stop_disconnected(&mut self, now: Instant) {
        let due: Vec<String> = self
            .disconnect_deadlines()
            .filter(|(_, at)| now >= *at)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            tracing::warn!(alloc = %id, "no contact with the servers for the group's stop_after_client_disconnect: stopping it");
            if let Some(runner) = self.allocs.get_mut(&id) {
                runner.stop(now, &mut self.ops);
            }
            self.collect(now, &id);
        }
    }

    /// Judges an allocation's deployment health from its tasks now; a verdict is reported.
    fn observe_health(&mut self, now: Instant, alloc_id: &str) {
        let Some(runner) = self.allocs.get(alloc_id) else {
            return;
        };
        let states = runner.task_states();
        let checks = alloc_check_ids(runner);
        if self
            .health
            .observe(now, alloc_id, runner.group(), runner.status(), &states, &checks)
        {
            self.report(now, Report::Allocs);
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let instances = self
            .instances
            .values()
            .filter_map(|instance| instance.pending.map(|(_, deadline)| deadline).or(instance.next_at));
        let waiting = self.waiting.iter().map(|(_, _, _, at)| *at);
        let volumes = self.volumes.values().filter_map(VolumeManager::poll_timeout);
        let allocs = self.allocs.values().filter_map(AllocRunner::poll_timeout);
        let reports = self.reports_retry.values().copied();
        let disconnect = self.disconnect_deadlines().map(|(_, at)| at).min();
        instances
            .chain(disconnect)
            .chain(self.health.poll_timeout())
            .chain(self.checks.poll_timeout(self.wants_checks()))
            .chain(self.link.poll_timeout())
            .chain(self.services.poll_timeout())
            .chain(waiting)
            .chain(volumes)
            .chain(allocs)
            .chain(reports)
            .chain(self.cadences.poll_timeout())
            .chain(self.controller_turns.poll_timeout())
            .min()
    }

    pub fn poll_action(&mut self) -> Option<ClientAction> {
        let mut action = self.actions.pop_front()?;
        // Claims and releases are made by allocation runners, which do not hold the node's
        // secret: it goes on here, as every call a client makes for its node carries it.
        if let ClientAction::Io {
            io: Io::Server(request),
            ..
        } = &mut action
        {
            request.stamp_node(&self.settings.node_id, self.link.secret_id());
        }
        Some(action)
    }
}

/// The Consul registrations the running tasks' and allocations' `service` blocks call for,
/// by id.
fn wanted_services(allocs: &BTreeMap<String, AllocRunner>) -> Wanted {
    Wanted {
        services: allocs
            .values()
            .flat_map(|runner| alloc_registrations(runner, true))
            .map(|registration| (registration.id.clone(), registration))
            .collect(),
        starting: allocs
            .values()
            .filter(|runner| runner.is_starting())
            .map(|runner| runner.alloc_id().to_string())
            .collect(),
    }
}

/// The ids of the Consul checks the allocation's task and group services register.
fn alloc_check_ids(runner: &AllocRunner) -> BTreeSet<String> {
    alloc_registrations(runner, false)
        .into_iter()
        .flat_map(|registration| registration.checks.into_iter().map(|check| check.id))
        .collect()
}

/// The registrations of the allocation's group services and of its tasks' services (only
/// the running tasks' when `running_only`: a task's services are registered while it runs).
fn alloc_registrations(runner: &AllocRunner, running_only: bool) -> Vec<TaskServiceRegistration> {
    let resources = &runner.alloc().resources;
    let canary = runner.alloc().is_canary();
    let group = group_registrations(
        runner.alloc_id(),
        &runner.alloc().task_group,
        &runner.group_services(),
        resources,
        canary,
        runner.has_own_network(),
    );
    runner
        .tasks()
        .filter(|task| !running_only || (task.state().state == TaskStatus::Running && !task.is_shutting_down()))
        .flat_map(|task| registrations(runner.alloc_id(), task.name(), &task.services(), resources, canary))
        .chain(group)
        .collect()
}

/// A stable per-allocation seed.
fn fnv(text: &str) -> u64 {
    crate::hash::Fnv1a::default().bytes(text.as_bytes()).finish()
}
