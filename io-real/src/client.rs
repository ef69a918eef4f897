//! The production client runtime: runs the core's [`Client`] machine against real task
//! drivers, the host filesystem, CSI plugins over their unix sockets and the servers (through
//! the agent's own write path), and keeps the client's state in its own redb file so a
//! restarted agent reattaches to its tasks and still knows its mounts and plugins.
//!
//! The loop only plumbs: it executes the core's I/O requests, feeds outcomes and task exits
//! back, persists records, and hands the core the allocations the servers placed on this node
//! (read from the local server's state store; a client-only agent's remote alloc sync arrives
//! with the scheduling work).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::Instant;
use drover_core::client::alloc_runner::LocalAllocState;
use drover_core::client::client::{Client, ClientAction, ClientInput, ClientSettings};
use drover_core::client::registry::{PluginKind, Registry};
use drover_core::client::task_runner::LocalTaskState;
use drover_core::client::{DriverCapabilities, ErrorKind, ExitResult, Io, IoError, Outcome, Reply, TaskHandle};
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest, NodeAllocsRequest, ServerReply, ServerRequest};
use drover_core::structs::{Allocation, DriverInfo, Job, Node, NodeStatus, Service};
use redb::{ReadableDatabase, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use crate::consul::ConsulHttp;
use crate::csi::CsiClient;
use crate::devices::{DeviceManager, DeviceStats};
use crate::driver::AgentHandle;
use crate::drivers::{Drivers, TaskResourceUsage};
use crate::io::{BoxFuture, ClientCsi};

const CLIENT: TableDefinition<&str, &[u8]> = TableDefinition::new("client_state");
pub const CLIENT_STATE_FILE: &str = "client.redb";

/// Deadlines for the requests the core does not time itself.
const FS_TIMEOUT: Duration = Duration::from_secs(30);
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Per-try deadline of a node CSI call (`DefaultMountActionTimeout`).
const CSI_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ClientStoreError {
    #[error("cannot open client state {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("client state {key}: {reason}")]
    Io { key: String, reason: String },
}

/// The client's durable records: the plugin registry, each allocation (with its job) and its
/// runner state, and each task's runner state.
#[derive(Clone)]
pub struct ClientStore {
    db: Arc<redb::Database>,
}

impl ClientStore {
    pub fn open(state_dir: &Path) -> Result<ClientStore, ClientStoreError> {
        let open = |reason: String| ClientStoreError::Open {
            path: state_dir.join(CLIENT_STATE_FILE),
            reason,
        };
        std::fs::create_dir_all(state_dir).map_err(|error| open(error.to_string()))?;
        let db = redb::Database::create(state_dir.join(CLIENT_STATE_FILE)).map_err(|error| open(error.to_string()))?;
        Ok(ClientStore { db: Arc::new(db) })
    }

    fn put<T: serde::Serialize>(&self, key: &str, value: &T) -> Result<(), ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: key.to_string(),
            reason,
        };
        let bytes = drover_core::codec::encode(value);
        let txn = self.db.begin_write().map_err(|error| fail(error.to_string()))?;
        {
            let mut table = txn.open_table(CLIENT).map_err(|error| fail(error.to_string()))?;
            table
                .insert(key, bytes.as_slice())
                .map_err(|error| fail(error.to_string()))?;
        }
        txn.commit().map_err(|error| fail(error.to_string()))
    }

    /// Every record whose key starts with `prefix`, decoded; undecodable records are reported
    /// and skipped, never overwritten. Records of the unversioned form an earlier agent wrote
    /// are rewritten in the current format once read, so the next upgrade still reads them.
    fn scan<T: serde::de::DeserializeOwned + serde::Serialize>(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, T)>, ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: prefix.to_string(),
            reason,
        };
        let txn = self.db.begin_read().map_err(|error| fail(error.to_string()))?;
        let table = match txn.open_table(CLIENT) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(fail(error.to_string())),
        };
        let mut out = Vec::new();
        let mut unversioned = Vec::new();
        for entry in table.range(prefix..).map_err(|error| fail(error.to_string()))? {
            let (key, value) = entry.map_err(|error| fail(error.to_string()))?;
            let key = key.value().to_string();
            if !key.starts_with(prefix) {
                break;
            }
            match drover_core::codec::decode(value.value()) {
                Ok(decoded) => {
                    if !value.value().starts_with(&drover_core::codec::MAGIC) {
                        unversioned.push(out.len());
                    }
                    out.push((key, decoded));
                }
                Err(error) => tracing::error!(%key, %error, "client state record cannot be read; skipped"),
            }
        }
        drop(table);
        drop(txn);
        for at in unversioned {
            let (key, value) = &out[at];
            self.put(key, value)?;
            tracing::info!(%key, "client state record rewritten in the versioned state format");
        }
        Ok(out)
    }

    /// Drops every record of an allocation that is gone from the servers and this host.
    pub fn forget(&self, alloc_id: &str) -> Result<(), ClientStoreError> {
        let fail = |reason: String| ClientStoreError::Io {
            key: format!("alloc {alloc_id}"),
            reason,
        };
        let txn = self.db.begin_write().map_err(|error| fail(error.to_string()))?;
        {
            let mut table = txn.open_table(CLIENT).map_err(|error| fail(error.to_string()))?;
            for key in [format!("spec/{alloc_id}"), format!("alloc/{alloc_id}")] {
                table.remove(key.as_str()).map_err(|error| fail(error.to_string()))?;
            }
            let prefix = format!("task/{alloc_id}/");
            table
                .retain_in(prefix.as_str()..format!("task/{alloc_id}0").as_str(), |_, _| false)
                .map_err(|error| fail(error.to_string()))?;
        }
        txn.commit().map_err(|error| fail(error.to_string()))
    }

    pub fn registry(&self) -> Result<Registry, ClientStoreError> {
        Ok(self
            .scan::<Registry>("registry")?
            .into_iter()
            .next()
            .map(|(_, registry)| registry)
            .unwrap_or_default())
    }

    /// Allocations with their jobs, runner states and task states.
    #[allow(clippy::type_complexity)]
    pub fn allocs(
        &self,
    ) -> Result<Vec<(Allocation, Job, LocalAllocState, BTreeMap<String, LocalTaskState>)>, ClientStoreError> {
        let specs: Vec<(String, (Allocation, Job))> = self.scan("spec/")?;
        let states: BTreeMap<String, LocalAllocState> = self
            .scan::<LocalAllocState>("alloc/")?
            .into_iter()
            .map(|(key, state)| (key["alloc/".len()..].to_string(), state))
            .collect();
        let mut tasks: BTreeMap<String, BTreeMap<String, LocalTaskState>> = BTreeMap::new();
        for (key, state) in self.scan::<LocalTaskState>("task/")? {
            if let Some((alloc, task)) = key["task/".len()..].split_once('/') {
                tasks
                    .entry(alloc.to_string())
                    .or_default()
                    .insert(task.to_string(), state);
            }
        }
        Ok(specs
            .into_iter()
            .map(|(_, (alloc, job))| {
                let state = states.get(&alloc.id).cloned().unwrap_or_default();
                let tasks = tasks.remove(&alloc.id).unwrap_or_default();
                (alloc, job, state, tasks)
            })
            .collect())
    }
}

/// Executes the core's I/O requests on this host.
pub trait ClientExecutor: Send + Sync + 'static {
    fn execute(&self, io: Io) -> BoxFuture<Outcome>;
    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult>;
    /// Every driver with its capabilities when detected and healthy, and its attributes.
    /// Every driver's fingerprint (taken again every `DRIVER_FINGERPRINT_INTERVAL`).
    fn fingerprint(&self) -> Vec<(String, DriverCapabilities, DriverInfo)>;
    /// Node attributes that do not belong to a driver (device fingerprints).
    fn node_attributes(&self) -> BTreeMap<String, String>;
    /// Usage of the devices reserved for one task.
    fn device_stats(&self, alloc_id: &str, task: &str) -> Vec<DeviceStats>;
    /// CPU and memory of one running task, from its driver.
    fn task_stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage>;
}

/// The production executor: host filesystem, process drivers, CSI over unix sockets.
#[derive(Clone, Debug)]
pub struct HostExecutor {
    pub drivers: Drivers,
    pub devices: DeviceManager,
}

fn fs_error(context: &str, error: std::io::Error) -> IoError {
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        _ => ErrorKind::Other,
    };
    IoError::new(kind, format!("{context}: {error}"))
}

/// Whether `path` is a mount point, from the kernel's own table.
fn is_mount_point(path: &str) -> Result<bool, IoError> {
    let canonical = match std::fs::canonicalize(path) {
        Ok(path) => path,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(fs_error(&format!("resolve {path}"), error)),
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(|error| fs_error("read mountinfo", error))?;
    Ok(table
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .any(|point| Path::new(point) == canonical))
}

impl ClientExecutor for HostExecutor {
    fn execute(&self, io: Io) -> BoxFuture<Outcome> {
        let drivers = self.drivers.clone();
        let devices = self.devices.clone();
        Box::pin(async move {
            let driver = |name: &str| {
                drivers
                    .get(name)
                    .cloned()
                    .ok_or_else(|| IoError::other(format!("driver \"{name}\" is not available")))
            };
            match io {
                Io::Mkdir { path } => {
                    let mut builder = std::fs::DirBuilder::new();
                    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
                    builder
                        .recursive(true)
                        .create(&path)
                        .map_err(|error| fs_error(&format!("mkdir {path}"), error))?;
                    Ok(Reply::Unit)
                }
                Io::RemoveAll { path } => match std::fs::remove_dir_all(&path) {
                    Ok(()) => Ok(Reply::Unit),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Reply::Unit),
                    Err(error) => Err(fs_error(&format!("remove {path}"), error)),
                },
                Io::Rmdir { path } => std::fs::remove_dir(&path)
                    .map(|()| Reply::Unit)
                    .map_err(|error| fs_error(&format!("rmdir {path}"), error)),
                Io::IsMountPoint { path } => is_mount_point(&path).map(Reply::Bool),
                Io::StartTask(config) => {
                    let driver = driver(&config.driver)?;
                    let started = tokio::time::timeout(START_TIMEOUT, driver.start(*config))
                        .await
                        .map_err(|_| IoError::new(ErrorKind::Timeout, "task start timed out"))??;
                    Ok(Reply::Started(started))
                }
                Io::StopTask { handle, kill_timeout } => {
                    let driver = driver(&handle.driver)?;
                    let (alloc_id, task) = (handle.alloc_id.clone(), handle.task.clone());
                    driver.stop(handle, kill_timeout).await?;
                    devices.release(&alloc_id, &task);
                    Ok(Reply::Unit)
                }
                Io::RecoverTask { handle } => {
                    let driver = driver(&handle.driver)?;
                    driver.recover(handle).await?;
                    Ok(Reply::Unit)
                }
                Io::ReserveDevices {
                    alloc_id,
                    task,
                    devices: requested,
                } => devices.reserve(&alloc_id, &task, &requested).map(Reply::Reserved),
                Io::Csi { socket, call } => {
                    let name = call.name();
                    let attempt = async {
                        let client = CsiClient::connect(&socket, Duration::from_secs(5))
                            .await
                            .map_err(|error| IoError::new(ErrorKind::Unavailable, error.to_string()))?;
                        client.execute(&call).await
                    };
                    tokio::time::timeout(CSI_TIMEOUT, attempt)
                        .await
                        .map_err(|_| IoError::new(ErrorKind::Timeout, format!("{name} timed out")))?
                }
                Io::Server(_) | Io::Volume(_) => Err(IoError::other("not an executor request")),
            }
        })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        match self.drivers.get(&handle.driver) {
            Some(driver) => {
                let devices = self.devices.clone();
                let wait = driver.wait(handle.clone());
                Box::pin(async move {
                    let exit = wait.await;
                    // The task is gone: its devices are free again (a restart reserves anew).
                    devices.release(&handle.alloc_id, &handle.task);
                    exit
                })
            }
            None => Box::pin(async move {
                ExitResult {
                    err: Some(format!("driver \"{}\" is not available", handle.driver)),
                    ..ExitResult::default()
                }
            }),
        }
    }

    fn fingerprint(&self) -> Vec<(String, DriverCapabilities, DriverInfo)> {
        self.drivers
            .iter()
            .map(|driver| (driver.name().to_string(), driver.capabilities(), driver.fingerprint()))
            .collect()
    }

    fn node_attributes(&self) -> BTreeMap<String, String> {
        self.devices.attributes()
    }

    fn device_stats(&self, alloc_id: &str, task: &str) -> Vec<DeviceStats> {
        self.devices.task_stats(alloc_id, task)
    }

    fn task_stats(&self, handle: &TaskHandle) -> Option<TaskResourceUsage> {
        self.drivers.get(&handle.driver)?.stats(handle)
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
        reply: oneshot::Sender<Result<ClientCsiReply, String>>,
    },
    /// The node's allocations from an alloc sync.
    Allocs(Vec<(Allocation, Job)>, Vec<String>),
    /// One fingerprint round of every driver.
    Drivers(Vec<(String, DriverCapabilities, DriverInfo)>),
    /// The node was registered (again); heartbeats go out within this TTL.
    Registered(Duration),
}

/// Answers the servers' `ClientCSI` calls for this client: node detach through the client's
/// volume manager, controller calls straight to the newest controller registration.
#[derive(Clone)]
pub struct ClientCsiRouter {
    inbox: mpsc::UnboundedSender<Message>,
    registry: Arc<Mutex<Registry>>,
}

pub struct ClientInbox {
    receiver: mpsc::UnboundedReceiver<Message>,
    sender: mpsc::UnboundedSender<Message>,
    registry: Arc<Mutex<Registry>>,
}

impl ClientCsiRouter {
    pub fn new() -> (ClientCsiRouter, ClientInbox) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let registry = Arc::new(Mutex::new(Registry::default()));
        (
            ClientCsiRouter {
                inbox: sender.clone(),
                registry: registry.clone(),
            },
            ClientInbox {
                receiver,
                sender,
                registry,
            },
        )
    }
}

impl ClientCsi for ClientCsiRouter {
    fn call(&self, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, String>> {
        let router = self.clone();
        Box::pin(async move {
            match request {
                ClientCsiRequest::NodeDetach(request) => {
                    let (reply, answer) = oneshot::channel();
                    router
                        .inbox
                        .send(Message::NodeDetach { request, reply })
                        .map_err(|_| "client is shutting down".to_string())?;
                    answer.await.map_err(|_| "client is shutting down".to_string())?
                }
                request => {
                    let socket = router
                        .registry
                        .lock()
                        .unwrap()
                        .get(PluginKind::CsiController, request.plugin_id())
                        .map(|info| info.socket_path.clone())
                        .ok_or_else(|| {
                            format!(
                                "CSI client error (retryable): plugin {} for type csi-controller not found",
                                request.plugin_id()
                            )
                        })?;
                    let client = CsiClient::connect(&socket, Duration::from_secs(5))
                        .await
                        .map_err(|error| format!("CSI client error (retryable): {error}"))?;
                    client.controller_request(&request).await
                }
            }
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
    executor: Arc<dyn ClientExecutor>,
}

/// One task's resource usage: CPU and memory from its driver (when it measures them and the
/// task runs) and its devices.
#[derive(Clone, Debug)]
pub struct TaskUsage {
    pub state: LocalTaskState,
    pub resources: Option<TaskResourceUsage>,
    pub devices: Vec<DeviceStats>,
}

impl ClientView {
    /// `None`: this client does not run the allocation.
    pub fn alloc_usage(&self, alloc_id: &str) -> Option<BTreeMap<String, TaskUsage>> {
        let tasks = self.tasks.lock().unwrap().get(alloc_id).cloned()?;
        Some(
            tasks
                .into_iter()
                .map(|(task, state)| {
                    let devices = self.executor.device_stats(alloc_id, &task);
                    let resources = state
                        .handle
                        .as_ref()
                        .filter(|_| state.state.state == drover_core::client::task_runner::TaskStatus::Running)
                        .and_then(|handle| self.executor.task_stats(handle));
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
    pub consul: Option<ConsulHttp>,
}

/// Task `service` blocks of the allocations this client knows: alloc → task → services.
type ServiceSpecs = Arc<Mutex<BTreeMap<String, BTreeMap<String, Vec<Service>>>>>;

/// Consul anti-entropy: the agent is compared with what should be there at least this often,
/// and at once after any change (Nomad's service client syncs every 30 s).
const SERVICE_SYNC_PERIOD: Duration = Duration::from_secs(30);

fn remember_services(specs: &ServiceSpecs, alloc: &Allocation, job: &Job) {
    let tasks: BTreeMap<String, Vec<Service>> = job
        .task_groups
        .iter()
        .filter(|group| group.name == alloc.task_group)
        .flat_map(|group| group.tasks.iter())
        .filter(|task| !task.services.is_empty())
        .map(|task| (task.name.clone(), task.services.clone()))
        .collect();
    let mut specs = specs.lock().unwrap();
    if tasks.is_empty() {
        specs.remove(&alloc.id);
    } else {
        specs.insert(alloc.id.clone(), tasks);
    }
}

/// Keeps the Consul agent's task services equal to the running tasks' `service` blocks: on
/// every change of a task's state or of the allocations, and every [`SERVICE_SYNC_PERIOD`].
/// Consul being down fails nothing: the next pass tries again.
async fn sync_services(
    consul: ConsulHttp,
    tasks: Arc<Mutex<BTreeMap<String, BTreeMap<String, LocalTaskState>>>>,
    specs: ServiceSpecs,
    changed: Arc<tokio::sync::Notify>,
    address: std::net::IpAddr,
) {
    use drover_core::client::services::{plan_sync, registrations};
    loop {
        let desired: BTreeMap<String, drover_core::client::services::TaskServiceRegistration> = {
            let tasks = tasks.lock().unwrap();
            let specs = specs.lock().unwrap();
            tasks
                .iter()
                .flat_map(|(alloc_id, states)| {
                    states
                        .iter()
                        .filter(|(_, state)| state.state.state == drover_core::client::task_runner::TaskStatus::Running)
                        .filter_map(|(task, _)| {
                            let services = specs.get(alloc_id)?.get(task)?;
                            Some(registrations(alloc_id, task, services))
                        })
                        .flatten()
                        .collect::<Vec<_>>()
                })
                .map(|registration| (registration.id.clone(), registration))
                .collect()
        };
        match consul.agent_services().await {
            Ok(registered) => {
                let plan = plan_sync(&desired, &registered);
                for registration in &plan.register {
                    match consul.register_task_service(registration, address).await {
                        Ok(()) => {
                            tracing::info!(id = %registration.id, name = %registration.name, "service registered in consul")
                        }
                        Err(error) => {
                            tracing::warn!(id = %registration.id, %error, "registering a service in consul failed")
                        }
                    }
                }
                for id in &plan.deregister {
                    match consul.deregister_service(id).await {
                        Ok(()) => tracing::info!(%id, "service deregistered from consul"),
                        Err(error) => tracing::warn!(%id, %error, "deregistering a service from consul failed"),
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "reading the consul agent's services failed; retrying"),
        }
        let _ = tokio::time::timeout(SERVICE_SYNC_PERIOD, changed.notified()).await;
    }
}

/// Starts the client loop; it runs until the runtime stops.
pub fn start_client(parts: ClientParts) -> Result<ClientView, ClientStoreError> {
    let registry = parts.store.registry()?;
    let allocs = parts.store.allocs()?;
    let view = ClientView {
        tasks: Arc::new(Mutex::new(
            allocs
                .iter()
                .map(|(alloc, _, _, tasks)| (alloc.id.clone(), tasks.clone()))
                .collect(),
        )),
        executor: parts.executor.clone(),
    };
    tokio::spawn(run(parts, registry, allocs, view.clone()));
    Ok(view)
}

fn core_now(epoch: tokio::time::Instant) -> Instant {
    Instant::from_nanos(tokio::time::Instant::now().saturating_duration_since(epoch).as_nanos() as u64)
}

#[allow(clippy::type_complexity)]
async fn run(
    parts: ClientParts,
    registry: Registry,
    saved: Vec<(Allocation, Job, LocalAllocState, BTreeMap<String, LocalTaskState>)>,
    view: ClientView,
) {
    let ClientParts {
        agent,
        settings,
        executor,
        store,
        inbox,
        mut node,
        consul,
    } = parts;
    let service_specs: ServiceSpecs = Arc::default();
    let services_changed = Arc::new(tokio::sync::Notify::new());
    for (alloc, job, ..) in &saved {
        remember_services(&service_specs, alloc, job);
    }
    if let Some(consul) = consul {
        let address = node
            .http_addr
            .parse::<std::net::SocketAddr>()
            .map(|addr| addr.ip())
            .or_else(|_| node.http_addr.parse::<std::net::IpAddr>())
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        tokio::spawn(sync_services(
            consul,
            view.tasks.clone(),
            service_specs.clone(),
            services_changed.clone(),
            address,
        ));
    }
    let ClientInbox {
        mut receiver,
        sender,
        registry: shared_registry,
    } = inbox;
    let epoch = tokio::time::Instant::now();
    let node_id = settings.node_id.clone();
    let mut client = Client::new(settings);
    node.attributes.extend(executor.node_attributes());
    let drivers = executor.fingerprint();
    for (name, _, info) in &drivers {
        if info.detected {
            node.attributes.extend(info.attributes.clone());
        }
        node.drivers.insert(name.clone(), info.clone());
    }
    client.handle(core_now(epoch), ClientInput::Drivers { drivers });
    node.status = NodeStatus::Ready;
    // Register before the client reports anything: a node registration replaces the node
    // record (CSI info included), so a CSI report that landed first would be wiped — or
    // refused with "node not found" — and not sent again until it changed.
    let heartbeat_ttl = register_node(&agent, &node).await;
    client.handle(core_now(epoch), ClientInput::Registered { heartbeat_ttl });
    let mut known: std::collections::BTreeSet<String> = saved.iter().map(|(alloc, ..)| alloc.id.clone()).collect();
    *shared_registry.lock().unwrap() = registry.clone();
    client.restore(core_now(epoch), registry, saved);
    tokio::spawn(watch_allocs(agent.clone(), node_id.clone(), sender.clone()));
    tokio::spawn(fingerprint_drivers(executor.clone(), sender.clone()));
    let mut detaches: BTreeMap<u64, oneshot::Sender<Result<ClientCsiReply, String>>> = BTreeMap::new();
    let mut next_detach = 0u64;
    loop {
        // Execute everything the core asked for.
        while let Some(action) = client.poll_action() {
            match action {
                ClientAction::Io { op, io } => {
                    let sender = sender.clone();
                    let executor = executor.clone();
                    let agent = agent.clone();
                    tokio::spawn(async move {
                        let outcome = match io {
                            Io::Server(request) => Ok(Reply::Server(agent.request(request).await)),
                            Io::StartTask(config) => {
                                let outcome = executor.execute(Io::StartTask(config)).await;
                                if let Ok(Reply::Started(handle)) = &outcome {
                                    watch_task(executor.clone(), handle.clone(), sender.clone());
                                }
                                outcome
                            }
                            Io::RecoverTask { handle } => {
                                let outcome = executor.execute(Io::RecoverTask { handle: handle.clone() }).await;
                                if outcome.is_ok() {
                                    watch_task(executor.clone(), handle, sender.clone());
                                }
                                outcome
                            }
                            io @ (Io::Mkdir { .. }
                            | Io::RemoveAll { .. }
                            | Io::Rmdir { .. }
                            | Io::IsMountPoint { .. }) => tokio::time::timeout(FS_TIMEOUT, executor.execute(io))
                                .await
                                .unwrap_or_else(|_| Err(IoError::new(ErrorKind::Timeout, "filesystem call timed out"))),
                            io => executor.execute(io).await,
                        };
                        let _ = sender.send(Message::Outcome(op, outcome));
                    });
                }
                ClientAction::PersistAlloc { alloc_id, state } => {
                    let record = format!("alloc/{alloc_id}");
                    if let Err(error) = store.put(&record, &*state) {
                        persist_failed(&mut client, epoch, record, error);
                    }
                }
                ClientAction::PersistTask { alloc_id, task, state } => {
                    view.tasks
                        .lock()
                        .unwrap()
                        .entry(alloc_id.clone())
                        .or_default()
                        .insert(task.clone(), (*state).clone());
                    services_changed.notify_one();
                    let record = format!("task/{alloc_id}/{task}");
                    if let Err(error) = store.put(&record, &*state) {
                        persist_failed(&mut client, epoch, record, error);
                    }
                }
                ClientAction::PersistRegistry(registry) => {
                    *shared_registry.lock().unwrap() = (*registry).clone();
                    if let Err(error) = store.put("registry", &*registry) {
                        persist_failed(&mut client, epoch, "registry".into(), error);
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
                    service_specs.lock().unwrap().remove(&alloc_id);
                    services_changed.notify_one();
                    known.remove(&alloc_id);
                    if let Err(error) = store.forget(&alloc_id) {
                        persist_failed(&mut client, epoch, format!("alloc/{alloc_id} (forget)"), error);
                    }
                }
                ClientAction::Register => {
                    tracing::info!("the servers do not know this node; registering it again");
                    let (agent, node, sender) = (agent.clone(), node.clone(), sender.clone());
                    tokio::spawn(async move {
                        let ttl = register_node(&agent, &node).await;
                        let _ = sender.send(Message::Registered(ttl));
                    });
                }
                ClientAction::NodeDetached { req, result } => {
                    if let Some(reply) = detaches.remove(&req) {
                        let _ = reply.send(result.map(|()| ClientCsiReply::Done));
                    }
                }
            }
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
                    Message::Outcome(op, outcome) => client.handle(now, ClientInput::Outcome { op, outcome }),
                    Message::Exited { alloc_id, task, exit } => {
                        client.handle(now, ClientInput::TaskExited { alloc_id, task, exit });
                    }
                    Message::Drivers(drivers) => client.handle(now, ClientInput::Drivers { drivers }),
                    Message::Registered(heartbeat_ttl) => client.handle(now, ClientInput::Registered { heartbeat_ttl }),
                    Message::Allocs(allocs, finished_elsewhere) => {
                        for (alloc, job) in &allocs {
                            remember_services(&service_specs, alloc, job);
                            let record = format!("spec/{}", alloc.id);
                            if known.insert(alloc.id.clone())
                                && let Err(error) = store.put(&record, &(alloc, job))
                            {
                                persist_failed(&mut client, epoch, record, error);
                            }
                        }
                        client.handle(
                            now,
                            ClientInput::Allocs {
                                allocs,
                                finished_elsewhere,
                            },
                        );
                    }
                    Message::NodeDetach { request, reply } => {
                        next_detach += 1;
                        detaches.insert(next_detach, reply);
                        client.handle(now, ClientInput::NodeDetach { req: next_detach, request });
                    }
                }
            }
        }
    }
}

/// `Node.Register`, retried every second until a server takes it; returns the heartbeat TTL.
async fn register_node(agent: &AgentHandle, node: &Node) -> Duration {
    loop {
        match agent
            .request(ServerRequest::NodeRegister {
                node: Box::new(node.clone()),
            })
            .await
        {
            ServerReply::Heartbeat { heartbeat_ttl_ms, .. } => return Duration::from_millis(heartbeat_ttl_ms),
            ServerReply::Error(error) => {
                tracing::warn!(error = %error.message, "node registration failed; retrying");
            }
            other => tracing::warn!(reply = ?other, "unexpected reply to a node registration; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How often drivers are fingerprinted again (Nomad's driver plugins re-check every 30 s).
pub const DRIVER_FINGERPRINT_INTERVAL: Duration = Duration::from_secs(30);

/// The driver manager's fingerprint stream: every driver, again and again; the core decides
/// what changed and what to tell the servers.
async fn fingerprint_drivers(executor: Arc<dyn ClientExecutor>, sender: mpsc::UnboundedSender<Message>) {
    loop {
        tokio::time::sleep(DRIVER_FINGERPRINT_INTERVAL).await;
        let executor = executor.clone();
        let Ok(fingerprints) = tokio::task::spawn_blocking(move || executor.fingerprint()).await else {
            continue;
        };
        if sender.send(Message::Drivers(fingerprints)).is_err() {
            return;
        }
    }
}

/// How long one alloc sync may block on the servers.
const ALLOC_SYNC_WAIT: Duration = Duration::from_secs(30);

/// The client's alloc sync (Nomad's `watchAllocations`): a blocking `Node.GetClientAllocs`
/// loop. A reply is used only when its index moved past the last one used, so a lagging
/// server (reads are stale) can never hand back an older list — one that would make the
/// client stop an allocation a newer state still has.
async fn watch_allocs(agent: AgentHandle, node_id: String, sender: mpsc::UnboundedSender<Message>) {
    let mut last: Option<u64> = None;
    let mut backoff = Duration::from_millis(500);
    loop {
        let request = NodeAllocsRequest {
            node_id: node_id.clone(),
            min_index: last.unwrap_or(0),
            max_wait_ms: ALLOC_SYNC_WAIT.as_millis() as u64,
        };
        match agent.node_allocs(request).await {
            Ok(reply) => {
                backoff = Duration::from_millis(500);
                if last.is_some_and(|last| reply.index <= last) {
                    continue;
                }
                last = Some(reply.index);
                if sender
                    .send(Message::Allocs(reply.allocs, reply.finished_elsewhere))
                    .is_err()
                {
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(error = %error.message, "alloc sync failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(15));
            }
        }
    }
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

/// The client's settings and node record for an agent whose data lives in `data_dir`:
/// client state under `<data_dir>/client`, allocations under `<data_dir>/alloc`.
pub fn client_identity(
    config: &drover_core::config::AgentConfig,
    node_id: u64,
    data_dir: &Path,
    host_volumes: BTreeMap<String, drover_core::client::volume_hook::HostVolumeConfig>,
) -> (ClientSettings, Node) {
    let id = node_uuid(node_id);
    let settings = ClientSettings {
        node_id: id.clone(),
        paths: drover_core::client::paths::ClientPaths::new(
            data_dir.join("client").display().to_string(),
            data_dir.join("alloc").display().to_string(),
        ),
        host_volumes: host_volumes.clone(),
        seed: node_id,
    };
    let node = Node {
        id,
        name: config.name.clone(),
        datacenter: config.datacenter.clone(),
        rpc_addr: config.advertise.rpc.to_string(),
        http_addr: config.advertise.http.to_string(),
        status: NodeStatus::Ready,
        host_volumes,
        resources: host_resources(),
        ..Node::default()
    };
    (settings, node)
}

/// The host's CPU (cores × MHz, as Nomad counts it) and memory (MB), from /proc.
pub fn host_resources() -> drover_core::structs::NodeResources {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mhz: Vec<f64> = cpuinfo
        .lines()
        .filter(|line| line.starts_with("cpu MHz"))
        .filter_map(|line| line.split(':').nth(1)?.trim().parse().ok())
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // Without a clock rate (some VMs and ARM hosts) Nomad's fallback: 1 GHz per core.
    let per_core = if mhz.is_empty() {
        1000.0
    } else {
        mhz.iter().sum::<f64>() / mhz.len() as f64
    };
    let memory_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    drover_core::structs::NodeResources {
        cpu: (per_core * cores as f64) as u64,
        memory_mb: memory_kb / 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_round_trips_and_forgets_one_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let store = ClientStore::open(dir.path()).unwrap();
        for id in ["a1", "a10"] {
            let alloc = Allocation {
                id: id.into(),
                ..Allocation::default()
            };
            store.put(&format!("spec/{id}"), &(alloc, Job::default())).unwrap();
            store.put(&format!("alloc/{id}"), &LocalAllocState::default()).unwrap();
            store
                .put(&format!("task/{id}/web"), &LocalTaskState::default())
                .unwrap();
        }
        assert_eq!(store.allocs().unwrap().len(), 2);
        store.forget("a1").unwrap();
        let left = store.allocs().unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.id, "a10", "a prefix-sharing id is untouched");
        assert_eq!(left[0].3.len(), 1, "its task record is kept");
        // Reopening sees the same records (they are on disk, not in memory).
        drop(store);
        assert_eq!(ClientStore::open(dir.path()).unwrap().allocs().unwrap().len(), 1);
    }

    #[test]
    fn records_of_an_agent_from_before_the_versioned_format_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = ClientStore::open(dir.path()).unwrap();
        let alloc = Allocation {
            id: "old".into(),
            ..Allocation::default()
        };
        let mut task = LocalTaskState::default();
        task.state.restarts = 2;
        let records = [
            ("spec/old", postcard::to_allocvec(&(alloc, Job::default())).unwrap()),
            ("alloc/old", postcard::to_allocvec(&LocalAllocState::default()).unwrap()),
            ("task/old/web", postcard::to_allocvec(&task).unwrap()),
        ];
        let txn = store.db.begin_write().unwrap();
        {
            let mut table = txn.open_table(CLIENT).unwrap();
            for (key, bytes) in &records {
                table.insert(*key, bytes.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
        let allocs = store.allocs().unwrap();
        assert_eq!(allocs.len(), 1);
        assert_eq!(allocs[0].0.id, "old");
        assert_eq!(allocs[0].3["web"].state.restarts, 2);
        // Reading rewrote them in the current format, so a later build still reads them.
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(CLIENT).unwrap();
        for (key, _) in &records {
            let stored = table.get(*key).unwrap().unwrap();
            assert!(
                stored.value().starts_with(&drover_core::codec::MAGIC),
                "{key} not rewritten"
            );
        }
        drop(table);
        drop(txn);
        assert_eq!(store.allocs().unwrap()[0].3["web"].state.restarts, 2);
    }
}
