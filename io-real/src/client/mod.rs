//! The client driver: runs the core's [`Client`] machine against an executor (the host's
//! drivers, filesystem and CSI plugins in production, [`HostExecutor`]; simulated ones under
//! madsim), the servers (through the agent's own request path) and the client's redb store,
//! so a restarted agent reattaches to its tasks and still knows its mounts and plugins. The
//! same driver runs in both worlds.
//!
//! The loop only plumbs: it executes the core's I/O requests within the deadlines the core
//! sets ([`deadlines`]), feeds outcomes and task exits back, and persists records. Every
//! retry, backoff and stale-reply filter (registration, heartbeats, the alloc sync) is the
//! core's ([`drover_core::client::server_link`]).

pub mod hoststats;
mod store;
pub use store::{CLIENT_STATE_FILE, ClientStore, ClientStoreError};
pub mod stats;

use drover_core::error::{AllocCallError, CsiCallError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::client::{Client, ClientAction, ClientInput, ClientSettings, Fingerprint};
use drover_core::client::deadlines;
use drover_core::client::devices::{DeviceInstance, DevicePick, DeviceReservations};
use drover_core::client::services::{RegisteredService, TaskServiceRegistration};
use drover_core::client::task_runner::{LocalTaskState, TaskStatus};
use drover_core::client::{
    ConsulOp, DriverCapabilities, ErrorKind, ExitResult, Io, IoError, Outcome, Reply, TaskHandle,
};
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest};
use drover_core::structs::{DriverInfo, Node, NodeStatus};
use tokio::sync::{mpsc, oneshot};

use crate::buggify;
use crate::devices::DeviceStats;
use crate::driver::AgentHandle;
use crate::drivers::TaskResourceUsage;
use crate::io::{AgentEvent, BoxFuture, ClientCsi};

/// Executes the core's I/O requests on this host (or a simulated one).
pub trait ClientExecutor: Send + Sync + 'static {
    fn execute(&self, io: Io) -> BoxFuture<Outcome>;
    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult>;
    /// Every driver's fingerprint: its capabilities when detected and healthy, and its
    /// attributes (taken again at the core's cadence, `client::client::DRIVER_FINGERPRINT_INTERVAL`).
    fn fingerprint(&self) -> Vec<(String, DriverCapabilities, DriverInfo)>;
    /// Node attributes that do not belong to a driver (device fingerprints).
    fn node_attributes(&self) -> BTreeMap<String, String>;
    /// Every device plugin's instances (fingerprinted again with the drivers).
    fn device_inventory(&self) -> BTreeMap<String, Vec<DeviceInstance>>;
    /// Usage of the device instances one task holds.
    fn device_stats(&self, picks: &[DevicePick]) -> Vec<DeviceStats>;
    /// CPU and memory of one running task, from its driver.
    fn task_stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage>;
    /// The host's own counters (`/v1/client/stats`); `None` where none are measured.
    fn host_counters(&self) -> Option<hoststats::HostCounters> {
        None
    }
    /// A server's `ClientCSI` controller call, to the controller plugin at `socket`.
    fn controller(&self, socket: String, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, CsiCallError>>;
    /// Starts `command` in a running task's context (`alloc exec`) as a session of its own
    /// (with its stdin as the controlling terminal when `tty`); the session's id.
    fn exec_start(
        &self,
        _handle: &TaskHandle,
        _command: &[String],
        _tty: bool,
    ) -> BoxFuture<Result<u64, AllocCallError>> {
        Box::pin(async { Err(AllocCallError::invalid("exec is not supported on this client")) })
    }
    /// A later step of a session [`Self::exec_start`] started.
    fn exec_step(
        &self,
        _request: crate::exec::ExecRequest,
    ) -> BoxFuture<Result<crate::exec::ExecReply, AllocCallError>> {
        Box::pin(async { Err(AllocCallError::invalid("exec is not supported on this client")) })
    }
}

/// The local Consul agent's service API, as the client's service sync uses it.
pub trait TaskServices: Send + Sync + 'static {
    /// The services the agent holds, by id.
    fn agent_services(&self) -> BoxFuture<Result<BTreeMap<String, RegisteredService>, String>>;
    fn register(
        &self,
        registration: TaskServiceRegistration,
        address: std::net::IpAddr,
    ) -> BoxFuture<Result<(), String>>;
    fn deregister(&self, id: String) -> BoxFuture<Result<(), String>>;
    /// The status of each check the agent runs, by check id (`GET /v1/agent/checks`).
    fn agent_checks(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>>;
    /// The agent fingerprinted as Nomad's consul fingerprinter does (`consul.version`,
    /// `consul.server`, `unique.consul.name`, ...).
    fn fingerprint(&self) -> BoxFuture<Result<BTreeMap<String, String>, String>>;
    /// The proxy versions the agent supports, newest first, by proxy (`envoy`): its
    /// `xDS.SupportedProxies`, empty when it names none (before Consul 1.9).
    fn supported_proxies(&self) -> BoxFuture<Result<BTreeMap<String, Vec<String>>, String>>;
}

/// How long one fingerprint may take before Consul counts as unreachable.
const CONSUL_FINGERPRINT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The agent's attributes, or none when it does not answer in time.
async fn consul_attributes(services: &Arc<dyn TaskServices>) -> BTreeMap<String, String> {
    match tokio::time::timeout(CONSUL_FINGERPRINT_TIMEOUT, services.fingerprint()).await {
        Ok(Ok(attributes)) => attributes,
        Ok(Err(error)) => {
            tracing::debug!(%error, "consul agent is unavailable");
            BTreeMap::new()
        }
        Err(_) => BTreeMap::new(),
    }
}

enum Message {
    Outcome(drover_core::op::OpId, Outcome),
    Exited {
        alloc_id: String,
        task: String,
        exit: ExitResult,
    },
    NodeDetach {
        request: drover_core::csi::unpublish::NodeDetachRequest,
        reply: oneshot::Sender<Result<ClientCsiReply, CsiCallError>>,
    },
    NodeExpand {
        request: drover_core::rpc::NodeExpandRequest,
        reply: oneshot::Sender<Result<ClientCsiReply, CsiCallError>>,
    },
    /// An operator's restart or signal of one of this client's allocations.
    Control {
        request: drover_core::client::AllocControl,
        reply: oneshot::Sender<Result<(), AllocCallError>>,
    },
    /// An operator's client GC: every eligible allocation, or the one named.
    Gc {
        alloc_id: Option<String>,
        reply: oneshot::Sender<Result<Vec<String>, drover_core::client::client::GcRefused>>,
    },
    /// A server's controller call, for the newest controller registration of its plugin.
    Controller {
        request: ClientCsiRequest,
        reply: oneshot::Sender<Result<ClientCsiReply, CsiCallError>>,
    },
    /// A controller call the core started returned (`None`: its caller had gone, so it was
    /// never made).
    ControllerDone {
        req: u64,
        result: Option<Result<ClientCsiReply, CsiCallError>>,
    },
    /// One fingerprint round of every driver.
    Drivers(Vec<(String, DriverCapabilities, DriverInfo)>),
    /// One fingerprint round of the device plugins.
    Devices(BTreeMap<String, Vec<DeviceInstance>>),
    /// The local Consul agent's attributes (empty: unreachable).
    Consul(BTreeMap<String, String>),
    /// Dev mode's shutdown: destroy every allocation, then answer and stop.
    Shutdown {
        done: oneshot::Sender<()>,
    },
}

/// Answers the servers' `ClientCSI` calls for this client: node detach through the client's
/// volume manager, controller calls to the newest controller registration. Both go through
/// the client's loop, which knows the registry.
#[derive(Clone)]
pub struct ClientCsiRouter {
    inbox: mpsc::UnboundedSender<Message>,
    /// What the client exposes for reading (task logs), once it has started.
    view: Arc<std::sync::OnceLock<ClientView>>,
}

pub struct ClientInbox {
    receiver: mpsc::UnboundedReceiver<Message>,
    sender: mpsc::UnboundedSender<Message>,
    view: Arc<std::sync::OnceLock<ClientView>>,
}

impl ClientCsiRouter {
    pub fn new() -> (ClientCsiRouter, ClientInbox) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let view = Arc::new(std::sync::OnceLock::new());
        (
            ClientCsiRouter {
                inbox: sender.clone(),
                view: view.clone(),
            },
            ClientInbox { receiver, sender, view },
        )
    }
}

impl ClientCsiRouter {
    /// Dev mode's shutdown (`ClientInput::Shutdown`): the client destroys every allocation —
    /// tasks, their log collectors, volumes, directories — and stops; returns once it has,
    /// or when `limit` runs out first (`false`).
    pub async fn destroy_allocations(&self, limit: Duration) -> bool {
        let (done, finished) = oneshot::channel();
        if self.inbox.send(Message::Shutdown { done }).is_err() {
            return true;
        }
        tokio::time::timeout(limit, finished).await.is_ok()
    }
}

impl ClientCsi for ClientCsiRouter {
    fn call(&self, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, CsiCallError>> {
        let inbox = self.inbox.clone();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let message = match request {
                ClientCsiRequest::NodeDetach(request) => Message::NodeDetach { request, reply },
                ClientCsiRequest::NodeExpand(request) => Message::NodeExpand { request, reply },
                request => Message::Controller { request, reply },
            };
            inbox.send(message).map_err(|_| "client is shutting down".to_string())?;
            answer.await.map_err(|_| "client is shutting down".to_string())?
        })
    }

    fn logs(
        &self,
        request: crate::logstream::LogsRequest,
    ) -> BoxFuture<Result<crate::logstream::LogsReply, AllocCallError>> {
        let view = self.view.get().cloned();
        Box::pin(async move {
            let unknown = || AllocCallError::unknown_alloc(&request.alloc_id);
            let view = view.ok_or_else(unknown)?;
            let Some(dir) = view.log_dir(&request.alloc_id, &request.task) else {
                return Err(if view.has_alloc(&request.alloc_id) {
                    AllocCallError::unknown_task(&request.task)
                } else {
                    unknown()
                });
            };
            let task_dead = view.task_dead(&request.alloc_id, &request.task);
            Ok(request.read(&dir, task_dead))
        })
    }

    fn stats(&self, alloc_id: String) -> BoxFuture<Result<serde_json::Value, AllocCallError>> {
        let view = self.view.get().cloned();
        Box::pin(async move {
            let view = view.ok_or_else(|| AllocCallError::unknown_alloc(&alloc_id))?;
            stats::alloc_stats_json(&view, &alloc_id)
        })
    }

    fn exec(&self, request: crate::exec::ExecRequest) -> BoxFuture<Result<crate::exec::ExecReply, AllocCallError>> {
        let view = self.view.get().cloned();
        Box::pin(async move {
            let view = view.ok_or_else(|| AllocCallError::unknown_alloc(request.alloc_id()))?;
            view.exec(request).await
        })
    }

    fn gauges(&self) -> Vec<crate::io::LabelledGauge> {
        let Some(view) = self.view.get() else {
            return Vec::new();
        };
        view.gauges()
            .into_iter()
            .map(|(name, value)| (name, Vec::new(), value))
            .chain(view.resource_gauges())
            .collect()
    }

    fn fs(&self, request: crate::allocfs::FsRequest) -> BoxFuture<Result<crate::allocfs::FsReply, AllocCallError>> {
        let view = self.view.get().cloned();
        Box::pin(async move {
            let unknown = || AllocCallError::unknown_alloc(&request.alloc_id);
            let view = view.ok_or_else(unknown)?;
            let root = view.alloc_dir(&request.alloc_id).ok_or_else(unknown)?;
            crate::allocfs::serve(&root, &request)
        })
    }

    fn node_id(&self) -> Option<String> {
        self.view.get().map(|view| view.node_id().to_string())
    }

    fn host_stats(&self) -> BoxFuture<Result<serde_json::Value, drover_core::rpc::RpcError>> {
        let view = self.view.get().cloned();
        Box::pin(async move {
            let view = view.ok_or_else(|| drover_core::rpc::RpcError::unavailable("the client has not started"))?;
            view.host_stats()
        })
    }

    fn gc(&self, alloc_id: Option<String>) -> BoxFuture<Result<Vec<String>, drover_core::rpc::RpcError>> {
        let inbox = self.inbox.clone();
        let view = self.view.get().cloned();
        Box::pin(async move {
            if let Some(id) = &alloc_id
                && !view.is_some_and(|view| view.has_alloc(id))
            {
                return Err(drover_core::rpc::RpcError::not_found(format!(
                    "Unknown allocation {id:?}"
                )));
            }
            let (reply, answer) = oneshot::channel();
            let gone = || drover_core::rpc::RpcError::unavailable("client is shutting down");
            inbox.send(Message::Gc { alloc_id, reply }).map_err(|_| gone())?;
            let collected = answer.await.map_err(|_| gone())?;
            collected.map_err(|refused| drover_core::rpc::RpcError::invalid(refused.to_string()))
        })
    }

    fn control(&self, request: drover_core::client::AllocControl) -> BoxFuture<Result<(), AllocCallError>> {
        let inbox = self.inbox.clone();
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let gone = || AllocCallError::failed("client is shutting down");
            inbox.send(Message::Control { request, reply }).map_err(|_| gone())?;
            answer.await.map_err(|_| gone())?
        })
    }
}

/// A failed write to the client store, handed to the core as a fact (it decides what the
/// operator hears of it), never only logged here.
fn persist_failed(client: &mut Client, epoch: tokio::time::Instant, record: String, error: impl std::fmt::Display) {
    let error = error.to_string();
    client.handle(core_now(epoch), ClientInput::PersistFailed { record, error });
}

/// What the HTTP API may read of the client: task states as last persisted and device usage.
#[derive(Clone)]
pub struct ClientView {
    tasks: Arc<Mutex<BTreeMap<String, BTreeMap<String, LocalTaskState>>>>,
    /// Each allocation's namespace, job and group (the labels of its tasks' metrics).
    labels: Arc<Mutex<BTreeMap<String, AllocLabels>>>,
    /// The last resource sample of each running task, by (allocation, task), and when it
    /// was taken: shared by `alloc status -stats` and `/v1/metrics`, so neither shortens the
    /// other's CPU window to nothing.
    samples: Arc<Mutex<TaskSamples>>,
    devices: Arc<Mutex<DeviceReservations>>,
    executor: Arc<dyn ClientExecutor>,
    /// The node's CPU (MHz) per core: Nomad's `TotalTicks` is a task's CPU percent of one
    /// core in these units (MHz consumed).
    mhz_per_core: f64,
    /// Where allocation directories are.
    paths: drover_core::client::paths::ClientPaths,
    /// This client's node.
    node_id: String,
    /// The previous host reading, for `/v1/client/stats`' CPU percentages.
    host_stats: Arc<hoststats::HostStatsSampler>,
}

/// Each running task's last resource sample and when it was taken, by (allocation, task).
type TaskSamples = BTreeMap<(String, String), (tokio::time::Instant, TaskResourceUsage)>;

/// An allocation's namespace, job and task group.
#[derive(Clone, Debug, Default)]
pub struct AllocLabels {
    pub namespace: String,
    pub job: String,
    pub group: String,
}

impl AllocLabels {
    fn of(alloc: &drover_core::structs::Allocation) -> Self {
        AllocLabels {
            namespace: alloc.namespace.clone(),
            job: alloc.job_id.clone(),
            group: alloc.task_group.clone(),
        }
    }
}

/// A task's resource sample younger than this is reused rather than taken again (Nomad's
/// client samples every `collection_interval`, 1 s by default).
pub const SAMPLE_REUSE: Duration = Duration::from_secs(1);

/// One task's resource usage: CPU and memory from its driver (when it measures them and the
/// task runs) and its devices.
#[derive(Clone, Debug)]
pub struct TaskUsage {
    pub state: LocalTaskState,
    pub resources: Option<TaskResourceUsage>,
    pub devices: Vec<DeviceStats>,
}

/// The node's fingerprinted compute divided by its cores (`cpu.numcores`, else one).
fn mhz_per_core(node: &Node) -> f64 {
    node.resources.cpu as f64 / f64::from(node.cores())
}

impl ClientView {
    /// The log directory of `task` of `alloc_id`, when this client runs (or ran) it.
    pub fn log_dir(&self, alloc_id: &str, task: &str) -> Option<std::path::PathBuf> {
        let tasks = self.tasks.lock().unwrap();
        tasks.get(alloc_id)?.get(task)?;
        Some(self.paths.log_dir(alloc_id).into())
    }

    /// The allocation's directory, when this client runs it.
    pub fn alloc_dir(&self, alloc_id: &str) -> Option<std::path::PathBuf> {
        self.has_alloc(alloc_id).then(|| self.paths.alloc(alloc_id).into())
    }

    /// One step of an `alloc exec` session on this client.
    pub async fn exec(&self, request: crate::exec::ExecRequest) -> Result<crate::exec::ExecReply, AllocCallError> {
        let crate::exec::ExecRequest::Start {
            alloc_id,
            task,
            command,
            tty,
        } = request
        else {
            return self.executor.exec_step(request).await;
        };
        let handle = {
            let tasks = self.tasks.lock().unwrap();
            let alloc = tasks
                .get(&alloc_id)
                .ok_or_else(|| AllocCallError::unknown_alloc(&alloc_id))?;
            let state = alloc.get(&task).ok_or_else(|| AllocCallError::unknown_task(&task))?;
            state
                .handle
                .clone()
                .filter(|_| state.state.state == TaskStatus::Running)
                .ok_or_else(|| AllocCallError::invalid(drover_core::client::task_runner::TASK_NOT_RUNNING))?
        };
        let session = self.executor.exec_start(&handle, &command, tty).await?;
        Ok(crate::exec::ExecReply {
            session,
            ..Default::default()
        })
    }

    /// Its allocations by state (running: a task runs; terminal: every task is dead;
    /// pending: the rest) and its tasks by state, as `/v1/metrics` gauges.
    pub fn gauges(&self) -> Vec<(&'static str, f64)> {
        let tasks = self.tasks.lock().unwrap();
        let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
        for alloc in tasks.values() {
            let states: Vec<TaskStatus> = alloc.values().map(|task| task.state.state).collect();
            let alloc_state = if states.contains(&TaskStatus::Running) {
                "nomad.client.allocations.running"
            } else if !states.is_empty() && states.iter().all(|state| *state == TaskStatus::Dead) {
                "nomad.client.allocations.terminal"
            } else {
                "nomad.client.allocations.pending"
            };
            *counts.entry(alloc_state).or_default() += 1;
            for state in states {
                let name = match state {
                    TaskStatus::Pending => "nomad.client.tasks.pending",
                    TaskStatus::Running => "nomad.client.tasks.running",
                    TaskStatus::Dead => "nomad.client.tasks.dead",
                };
                *counts.entry(name).or_default() += 1;
            }
        }
        [
            "nomad.client.allocations.running",
            "nomad.client.allocations.pending",
            "nomad.client.allocations.terminal",
            "nomad.client.tasks.pending",
            "nomad.client.tasks.running",
            "nomad.client.tasks.dead",
        ]
        .into_iter()
        .map(|name| (name, counts.get(name).copied().unwrap_or(0) as f64))
        .collect()
    }

    /// Whether this client runs the allocation.
    /// This client's node ID.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Nomad's `HostStats` of this node, CPU over the interval since the last reading.
    pub fn host_stats(&self) -> Result<serde_json::Value, drover_core::rpc::RpcError> {
        let counters = self
            .executor
            .host_counters()
            .ok_or_else(|| drover_core::rpc::RpcError::refused("host stats are not measured on this client"))?;
        Ok(self.host_stats.json(&counters, self.mhz_per_core))
    }

    pub fn has_alloc(&self, alloc_id: &str) -> bool {
        self.tasks.lock().unwrap().contains_key(alloc_id)
    }

    /// Whether the task has finished for good (or is gone with its allocation).
    pub fn task_dead(&self, alloc_id: &str, task: &str) -> bool {
        let tasks = self.tasks.lock().unwrap();
        tasks
            .get(alloc_id)
            .and_then(|tasks| tasks.get(task))
            .is_none_or(|state| state.state.state == TaskStatus::Dead)
    }

    /// MHz consumed by a task using `percent` of one core (Nomad's `TotalTicks`).
    pub fn ticks_consumed(&self, percent: f64) -> f64 {
        percent / 100.0 * self.mhz_per_core
    }

    /// `None`: this client does not run the allocation.
    /// The task's resource usage: the last sample when younger than [`SAMPLE_REUSE`], else
    /// a new one from its driver.
    fn sample(&self, alloc_id: &str, task: &str, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        let key = (alloc_id.to_string(), task.to_string());
        let now = tokio::time::Instant::now();
        if let Some((at, usage)) = self.samples.lock().unwrap().get(&key)
            && now.saturating_duration_since(*at) < SAMPLE_REUSE
        {
            return Some(usage.clone());
        }
        let usage = self.executor.task_stats(handle)?;
        let mut samples = self.samples.lock().unwrap();
        // Tasks no longer known are forgotten as new samples are taken.
        let tasks = self.tasks.lock().unwrap();
        samples.retain(|(alloc, task), _| tasks.get(alloc).is_some_and(|tasks| tasks.contains_key(task)));
        samples.insert(key, (now, usage.clone()));
        Some(usage)
    }

    /// Nomad's per-task resource gauges (`nomad.client.allocs.memory.*`, `.cpu.*`) of every
    /// running task, labelled with its job, group, allocation, task and namespace.
    pub fn resource_gauges(&self) -> Vec<crate::io::LabelledGauge> {
        let running: Vec<(String, String, TaskHandle)> = {
            let tasks = self.tasks.lock().unwrap();
            tasks
                .iter()
                .flat_map(|(alloc, tasks)| {
                    tasks.iter().filter_map(move |(task, state)| {
                        let handle = state
                            .handle
                            .clone()
                            .filter(|_| state.state.state == TaskStatus::Running)?;
                        Some((alloc.clone(), task.clone(), handle))
                    })
                })
                .collect()
        };
        let mut out = Vec::new();
        for (alloc, task, handle) in running {
            let Some(usage) = self.sample(&alloc, &task, &handle) else {
                continue;
            };
            let labels = self.labels.lock().unwrap().get(&alloc).cloned().unwrap_or_default();
            let labels = vec![
                ("job", labels.job),
                ("task_group", labels.group),
                ("alloc_id", alloc.clone()),
                ("task", task.clone()),
                ("namespace", labels.namespace),
            ];
            let total = usage.user_percent + usage.system_percent;
            let mut gauges = vec![
                ("nomad.client.allocs.memory.rss", usage.rss_bytes as f64),
                ("nomad.client.allocs.cpu.total_percent", total),
                ("nomad.client.allocs.cpu.user", usage.user_percent),
                ("nomad.client.allocs.cpu.system", usage.system_percent),
                ("nomad.client.allocs.cpu.total_ticks", total / 100.0 * self.mhz_per_core),
            ];
            if let Some(cgroup) = usage.cgroup {
                let known = [
                    ("nomad.client.allocs.memory.usage", cgroup.usage_bytes),
                    ("nomad.client.allocs.memory.max_usage", cgroup.max_usage_bytes),
                    ("nomad.client.allocs.memory.cache", cgroup.cache_bytes),
                    ("nomad.client.allocs.memory.swap", cgroup.swap_bytes),
                    ("nomad.client.allocs.cpu.throttled_periods", cgroup.throttled_periods),
                    ("nomad.client.allocs.cpu.throttled_time", cgroup.throttled_time_ns),
                ];
                gauges.extend(
                    known
                        .into_iter()
                        .filter_map(|(name, value)| Some((name, value? as f64))),
                );
            }
            out.extend(gauges.into_iter().map(|(name, value)| (name, labels.clone(), value)));
        }
        out
    }

    pub fn alloc_usage(&self, alloc_id: &str) -> Option<BTreeMap<String, TaskUsage>> {
        let tasks = self.tasks.lock().unwrap().get(alloc_id).cloned()?;
        Some(
            tasks
                .into_iter()
                .map(|(task, state)| {
                    let picks = self
                        .devices
                        .lock()
                        .unwrap()
                        .get(alloc_id)
                        .and_then(|tasks| tasks.get(&task))
                        .cloned()
                        .unwrap_or_default();
                    let devices = self.executor.device_stats(&picks);
                    let resources = state
                        .handle
                        .as_ref()
                        .filter(|_| state.state.state == drover_core::client::task_runner::TaskStatus::Running)
                        .and_then(|handle| self.sample(alloc_id, &task, handle));
                    (
                        task,
                        TaskUsage {
                            state,
                            resources,
                            devices,
                        },
                    )
                })
                .collect(),
        )
    }
}

pub struct ClientParts {
    pub agent: AgentHandle,
    pub settings: ClientSettings,
    pub executor: Arc<dyn ClientExecutor>,
    pub store: ClientStore,
    pub inbox: ClientInbox,
    /// The node record to register (id, name, datacenter, addresses).
    pub node: Node,
    /// The local Consul agent (`consul { address }`): running tasks' `service` blocks are
    /// registered there. `None`: services are stored with the job but not registered.
    pub services: Option<Arc<dyn TaskServices>>,
}

/// Starts the client loop; it runs until the runtime stops.
pub fn start_client(mut parts: ClientParts) -> Result<ClientView, ClientStoreError> {
    parts.node.secret_id = parts.store.secret_id()?;
    let registry = parts.store.registry()?;
    let allocs = parts.store.allocs()?;
    let devices = parts.store.devices()?;
    let view = ClientView {
        devices: Arc::new(Mutex::new(devices.clone())),
        tasks: Arc::new(Mutex::new(
            allocs
                .iter()
                .map(|(alloc, _, _, tasks)| (alloc.id.clone(), tasks.clone()))
                .collect(),
        )),
        labels: Arc::new(Mutex::new(
            allocs
                .iter()
                .map(|(alloc, _, _, _)| (alloc.id.clone(), AllocLabels::of(alloc)))
                .collect(),
        )),
        samples: Arc::default(),
        executor: parts.executor.clone(),
        mhz_per_core: mhz_per_core(&parts.node),
        paths: parts.settings.paths.clone(),
        node_id: parts.node.id.clone(),
        host_stats: Arc::default(),
    };
    let _ = parts.inbox.view.set(view.clone());
    tokio::spawn(run(parts, (registry, allocs, devices), view.clone()));
    Ok(view)
}

use crate::clock::core_now;

/// This agent's node id, shaped like Nomad's (a UUID), derived from its persisted agent id.
pub fn node_uuid(node_id: u64) -> String {
    let hex = format!(
        "{:016x}{:016x}",
        node_id,
        node_id.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15
    );
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The timeout error of a request the core gave a deadline.
fn timed_out(io: &Io) -> IoError {
    let what = match io {
        Io::StartTask(_) => "task start".to_string(),
        Io::Csi { call, .. } => call.name().to_string(),
        Io::AllocSync(_) => "alloc sync".to_string(),
        Io::Consul(_) => "consul call".to_string(),
        Io::Server(_) => "server call".to_string(),
        Io::DestroyTask { .. } => "task destroy".to_string(),
        Io::RenderTemplate(_) => "template render".to_string(),
        Io::SignalTask { .. } => "task signal".to_string(),
        // Never the arguments: they may carry a token.
        Io::RunCommand { program, .. } => format!("{program} run"),
        _ => "filesystem call".to_string(),
    };
    IoError::new(ErrorKind::Timeout, format!("{what} timed out"))
}

/// What carries out the core's I/O: the agent (servers), the executor (the host), the Consul
/// agent.
#[derive(Clone)]
struct World {
    agent: AgentHandle,
    executor: Arc<dyn ClientExecutor>,
    services: Option<Arc<dyn TaskServices>>,
}

/// Carries out one I/O request of the core; a started or recovered task is watched for its
/// exit from then on.
async fn perform(io: Io, world: World, sender: mpsc::UnboundedSender<Message>) -> Outcome {
    let World {
        agent,
        executor,
        services,
    } = world;
    match io {
        Io::Consul(call) => {
            let Some(services) = services else {
                return Err(IoError::other("no consul agent is configured"));
            };
            match call {
                ConsulOp::Services => services.agent_services().await.map(Reply::Services),
                ConsulOp::Register { registration, address } => {
                    let ip = address
                        .parse()
                        .map_err(|_| IoError::other(format!("service address {address:?} is not an IP address")))?;
                    let id = registration.id.clone();
                    services.register(*registration, ip).await.map(|()| {
                        tracing::info!(%id, "service registered in consul");
                        Reply::Unit
                    })
                }
                ConsulOp::Deregister { id } => services.deregister(id.clone()).await.map(|()| {
                    tracing::info!(%id, "service deregistered from consul");
                    Reply::Unit
                }),
                ConsulOp::Checks => services.agent_checks().await.map(Reply::Checks),
                ConsulOp::SupportedProxies => services.supported_proxies().await.map(Reply::Proxies),
            }
            .map_err(|error| IoError::new(ErrorKind::Unavailable, error))
        }
        Io::Server(request) => Ok(Reply::Server(agent.request(request).await)),
        Io::AllocSync(request) => agent
            .node_allocs(request)
            .await
            .map(Reply::Allocs)
            .map_err(|error| IoError::new(ErrorKind::Unavailable, error.message)),
        Io::StartTask(config) => {
            let outcome = executor.execute(Io::StartTask(config)).await;
            if let Ok(Reply::Started(handle)) = &outcome {
                watch_task(executor.clone(), handle.clone(), sender);
            }
            outcome
        }
        Io::RecoverTask { handle } => {
            if buggify::fires(buggify::RECOVER_SLOW) {
                tokio::time::sleep(buggify::delay_millis(500..3_000)).await;
            }
            if buggify::fires(buggify::RECOVER_FAILS) {
                // The task's process lives on; only reattaching to it failed.
                return Err(IoError::other("failed to reattach to the task (injected)"));
            }
            let outcome = executor.execute(Io::RecoverTask { handle: handle.clone() }).await;
            if outcome.is_ok() {
                watch_task(executor.clone(), handle, sender);
            }
            outcome
        }
        io @ Io::Csi { .. } => {
            if buggify::fires(buggify::CSI_SLOW) {
                tokio::time::sleep(buggify::delay_millis(200..2_000)).await;
            }
            if buggify::fires(buggify::CSI_UNAVAILABLE) {
                return Err(IoError::new(ErrorKind::Unavailable, "transport is closing (injected)"));
            }
            executor.execute(io).await
        }
        io => executor.execute(io).await,
    }
}

/// What the store held when the client started: the plugin registry, the allocations and the
/// device reservations.
type Saved = (
    drover_core::client::registry::Registry,
    Vec<drover_core::client::client::SavedAlloc>,
    DeviceReservations,
);

async fn run(parts: ClientParts, (registry, saved, devices): Saved, view: ClientView) {
    let ClientParts {
        agent,
        settings,
        executor,
        store,
        inbox,
        mut node,
        services,
    } = parts;
    let ClientInbox {
        mut receiver, sender, ..
    } = inbox;
    let epoch = tokio::time::Instant::now();
    let observer = agent.observer();
    let mut client = Client::new(settings);
    // Task event times are told on the wall clock (the simulator's, in simulation).
    client.set_wall_epoch(crate::driver::unix_millis() as i64 * 1_000_000);
    node.attributes.extend(executor.node_attributes());
    let drivers = executor.fingerprint();
    for (name, _, info) in &drivers {
        if info.detected {
            node.attributes.extend(info.attributes.clone());
        }
        node.drivers.insert(name.clone(), info.clone());
    }
    client.handle(core_now(epoch), ClientInput::Drivers { drivers });
    client.restore_devices(devices);
    client.handle(
        core_now(epoch),
        ClientInput::Devices {
            inventory: executor.device_inventory(),
        },
    );
    node.status = NodeStatus::Ready;
    if let Some(services) = &services {
        node.attributes.extend(consul_attributes(services).await);
        client.enable_consul_fingerprint(core_now(epoch));
    }
    // The core registers the node (retrying until a server takes it), restores what the
    // store holds once it is registered, then heartbeats and syncs allocations.
    let address = node
        .http_addr
        .parse::<std::net::SocketAddr>()
        .map(|addr| addr.ip())
        .or_else(|_| node.http_addr.parse::<std::net::IpAddr>())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    client.connect(core_now(epoch), node, registry, saved);
    if services.is_some() {
        client.enable_service_sync(core_now(epoch), address.to_string());
    }
    let world = World {
        agent,
        executor: executor.clone(),
        services,
    };
    let mut detaches: BTreeMap<u64, oneshot::Sender<Result<ClientCsiReply, CsiCallError>>> = BTreeMap::new();
    let mut next_detach = 0u64;
    // Controller calls waiting for their answer; the core decides when each runs.
    let mut controller_replies: BTreeMap<u64, oneshot::Sender<Result<ClientCsiReply, CsiCallError>>> = BTreeMap::new();
    let mut next_controller = 0u64;
    let mut controls: BTreeMap<u64, oneshot::Sender<Result<(), AllocCallError>>> = BTreeMap::new();
    let mut next_control = 0u64;
    let mut shut_down: Option<oneshot::Sender<()>> = None;
    // The ops the core handed out for I/O, each answered exactly once (checked in debug and
    // simulation builds; the core checks that each answer is for an op it issued).
    let mut outstanding = drover_core::op::Outstanding::default();
    loop {
        // Execute everything the core asked for.
        while let Some(action) = client.poll_action() {
            match action {
                // The core's cadence: the driver manager's round (drivers, then devices), or
                // the local Consul agent's attributes.
                ClientAction::Fingerprint(Fingerprint::Drivers) => {
                    let (executor, sender) = (world.executor.clone(), sender.clone());
                    tokio::spawn(async move {
                        let (fingerprints, devices) = fingerprint_off_loop(executor).await;
                        let _ = sender.send(Message::Drivers(fingerprints));
                        let _ = sender.send(Message::Devices(devices));
                    });
                }
                ClientAction::Fingerprint(Fingerprint::Consul) => {
                    if let Some(services) = world.services.clone() {
                        let sender = sender.clone();
                        tokio::spawn(async move {
                            let _ = sender.send(Message::Consul(consul_attributes(&services).await));
                        });
                    }
                }
                ClientAction::Io { op, io } => {
                    outstanding.started(op);
                    let (sender, world) = (sender.clone(), world.clone());
                    tokio::spawn(async move {
                        let outcome = match deadlines::deadline(&io) {
                            Some(deadline) => {
                                let error = timed_out(&io);
                                tokio::time::timeout(deadline, perform(io, world, sender.clone()))
                                    .await
                                    .unwrap_or(Err(error))
                            }
                            None => perform(io, world, sender.clone()).await,
                        };
                        let _ = sender.send(Message::Outcome(op, outcome));
                    });
                }
                ClientAction::PersistSpec { alloc, job } => {
                    view.labels
                        .lock()
                        .unwrap()
                        .insert(alloc.id.clone(), AllocLabels::of(&alloc));
                    let record = format!("spec/{}", alloc.id);
                    if let Err(error) = store.put(&record, &(&*alloc, &*job)) {
                        persist_failed(&mut client, epoch, record, error);
                    }
                }
                ClientAction::PersistAlloc { alloc_id, state } => {
                    let record = format!("alloc/{alloc_id}");
                    if let Err(error) = store.put(&record, &*state) {
                        persist_failed(&mut client, epoch, record, error);
                    }
                }
                ClientAction::PersistTask { alloc_id, task, state } => {
                    let previous = view
                        .tasks
                        .lock()
                        .unwrap()
                        .entry(alloc_id.clone())
                        .or_default()
                        .insert(task.clone(), (*state).clone());
                    let running = |state: &LocalTaskState| state.state.state == TaskStatus::Running;
                    if running(&state) != previous.as_ref().is_some_and(running) {
                        observer.record(AgentEvent::TaskRunning {
                            alloc_id: alloc_id.clone(),
                            task: task.clone(),
                            running: running(&state),
                        });
                    }
                    let dead = |state: &LocalTaskState| state.state.state == TaskStatus::Dead;
                    if dead(&state) && !previous.as_ref().is_some_and(dead) {
                        observer.record(AgentEvent::TaskDead {
                            alloc_id: alloc_id.clone(),
                            task: task.clone(),
                        });
                    }
                    let record = format!("task/{alloc_id}/{task}");
                    if let Err(error) = store.put(&record, &*state) {
                        persist_failed(&mut client, epoch, record, error);
                    }
                }
                ClientAction::PersistRegistry(registry) => {
                    if let Err(error) = store.put("registry", &*registry) {
                        persist_failed(&mut client, epoch, "registry".into(), error);
                    }
                }
                ClientAction::PersistDevices(devices) => {
                    *view.devices.lock().unwrap() = (*devices).clone();
                    if let Err(error) = store.put("devices", &*devices) {
                        persist_failed(&mut client, epoch, "devices".into(), error);
                    }
                }
                ClientAction::TaskEvent { alloc_id, task, event } => {
                    tracing::info!(alloc = %alloc_id, %task, kind = %event.kind, message = %event.message, "task event");
                }
                ClientAction::NodeEvent(event) => {
                    tracing::info!(subsystem = %event.subsystem, message = %event.message, details = ?event.details, "node event");
                }
                ClientAction::Hook {
                    alloc_id,
                    hook,
                    phase,
                    result,
                } => {
                    tracing::debug!(alloc = %alloc_id, hook, phase, ?result, "alloc hook");
                }
                ClientAction::Forget { alloc_id } => {
                    view.tasks.lock().unwrap().remove(&alloc_id);
                    view.labels.lock().unwrap().remove(&alloc_id);
                    if let Err(error) = store.forget(&alloc_id) {
                        persist_failed(&mut client, epoch, format!("alloc/{alloc_id} (forget)"), error);
                    }
                }
                ClientAction::NodeDetached { req, result } => {
                    if let Some(reply) = detaches.remove(&req) {
                        let _ = reply.send(result.map(|()| ClientCsiReply::Done));
                    }
                }
                ClientAction::NodeExpanded { req, result } => {
                    if let Some(reply) = detaches.remove(&req) {
                        let _ = reply.send(result.map(|capacity| ClientCsiReply::Expanded {
                            capacity,
                            node_expansion_required: false,
                        }));
                    }
                }
                ClientAction::AllocControlled { req, result } => {
                    if let Some(reply) = controls.remove(&req) {
                        let _ = reply.send(result);
                    }
                }
                ClientAction::ControllerReply { req, result } => {
                    if let Some(reply) = controller_replies.remove(&req) {
                        let _ = reply.send(result);
                    }
                }
                ClientAction::ControllerAbandoned { req, error } => {
                    if let Some(reply) = controller_replies.remove(&req) {
                        let _ = reply.send(Err(error));
                    }
                }
                ClientAction::ControllerStart { req, socket, request } => {
                    let (executor, sender) = (world.executor.clone(), sender.clone());
                    // A caller that gave up while its call waited for the turn: never made.
                    let gone = controller_replies.get(&req).is_none_or(|reply| reply.is_closed());
                    tokio::spawn(async move {
                        let result = if gone {
                            None
                        } else {
                            let call = tokio::spawn(async move { executor.controller(socket, request).await });
                            Some(match call.await {
                                Ok(result) => result,
                                Err(error) => Err(format!("CSI controller call failed: {error}").into()),
                            })
                        };
                        let _ = sender.send(Message::ControllerDone { req, result });
                    });
                }
            }
        }
        if client.is_drained()
            && let Some(done) = shut_down.take()
        {
            tracing::info!("every allocation destroyed; the client stops");
            let _ = done.send(());
            return;
        }
        let now = core_now(epoch);
        let sleep = client
            .poll_timeout()
            .map(|at| Duration::from_nanos(at.as_nanos().saturating_sub(now.as_nanos())))
            .unwrap_or(Duration::from_secs(3600));
        // `biased`, timer first: a flood of messages cannot starve the core's timeouts, and the
        // order does not depend on tokio's process-seeded generator (the simulation replays it).
        tokio::select! {
            biased;
            _ = tokio::time::sleep(sleep) => client.handle_timeout(core_now(epoch)),
            message = receiver.recv() => {
                let Some(message) = message else { return };
                let now = core_now(epoch);
                match message {
                    Message::Outcome(op, outcome) => {
                        outstanding.answered(op);
                        client.handle(now, ClientInput::Outcome { op, outcome });
                    }
                    Message::Exited { alloc_id, task, exit } => {
                        client.handle(now, ClientInput::TaskExited { alloc_id, task, exit });
                    }
                    Message::Drivers(drivers) => client.handle(now, ClientInput::Drivers { drivers }),
                    Message::Devices(inventory) => client.handle(now, ClientInput::Devices { inventory }),
                    Message::Consul(attributes) => client.handle(now, ClientInput::ConsulAttributes { attributes }),
                    Message::Shutdown { done } => {
                        tracing::info!("dev mode: destroying every allocation before the agent stops");
                        shut_down = Some(done);
                        client.handle(now, ClientInput::Shutdown);
                    }
                    Message::Gc { alloc_id, reply } => {
                        let _ = reply.send(client.garbage_collect(now, alloc_id.as_deref()));
                    }
                    Message::Control { request, reply } => {
                        next_control += 1;
                        controls.insert(next_control, reply);
                        client.handle(now, ClientInput::AllocControl { req: next_control, request });
                    }
                    Message::NodeDetach { request, reply } => {
                        next_detach += 1;
                        detaches.insert(next_detach, reply);
                        client.handle(now, ClientInput::NodeDetach { req: next_detach, request });
                    }
                    // Node calls share one numbering, and one table of waiting answers.
                    Message::NodeExpand { request, reply } => {
                        next_detach += 1;
                        detaches.insert(next_detach, reply);
                        client.handle(now, ClientInput::NodeExpand { req: next_detach, request });
                    }
                    Message::Controller { request, reply } => {
                        next_controller += 1;
                        controller_replies.insert(next_controller, reply);
                        client.handle(now, ClientInput::ControllerCall { req: next_controller, request });
                    }
                    Message::ControllerDone { req, result } => {
                        if let (Some(result), Some(reply)) = (result, controller_replies.remove(&req)) {
                            let _ = reply.send(result);
                        }
                        client.handle(now, ClientInput::ControllerFinished { req });
                    }
                }
            }
        }
    }
}

type Fingerprints = (
    Vec<(String, DriverCapabilities, DriverInfo)>,
    BTreeMap<String, Vec<DeviceInstance>>,
);

/// One fingerprint round of every driver and device plugin. Real fingerprints read files and
/// run commands, so production takes them on a blocking thread; a simulated host answers from
/// memory.
async fn fingerprint_off_loop(executor: Arc<dyn ClientExecutor>) -> Fingerprints {
    crate::runtime::blocking(move || (executor.fingerprint(), executor.device_inventory()))
        .await
        .unwrap_or_default()
}

/// The driver's task-event stream for one task: its exit goes back to the core.
fn watch_task(executor: Arc<dyn ClientExecutor>, handle: TaskHandle, sender: mpsc::UnboundedSender<Message>) {
    tokio::spawn(async move {
        let exit = executor.wait(handle.clone()).await;
        let _ = sender.send(Message::Exited {
            alloc_id: handle.alloc_id,
            task: handle.task,
            exit,
        });
    });
}
