//! A simulated cluster of whole agents: each server is a madsim node running the production
//! driver (`drover_io_real::driver::start_agent`) over the simulated network, disk and Consul.
//! Nodes can be killed (with or without losing unsynced writes), restarted with their disk,
//! partitioned and healed; the recorder sees everything.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use drover_core::config::AgentConfig;
use drover_core::fsm::Command;
use drover_core::rpc::{RpcError, ServerReply, ServerRequest};
use drover_io_real::client::{ClientCsiRouter, ClientParts, ClientStore, start_client};
use drover_io_real::driver::{AgentHandle, AgentParts, AgentStatus, start_agent};
use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};

use crate::consul::SimConsul;
use crate::csi::{PluginControl, SimStorage};
use crate::disk::{Crash, DiskFault, DiskProbe, SimDisk, open_db};
use crate::host::SimHost;
use crate::net::SimTransport;
use crate::trace::PluginEvent;
use crate::trace::Recorder;
use drover_io_real::io::Identity;

/// How one server is configured and when it first starts.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub name: String,
    pub ip: IpAddr,
    pub config: AgentConfig,
    pub first_start_delay: Duration,
}

/// A client node: the agent in client mode running the production client driver on a simulated
/// host.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub name: String,
    pub ip: IpAddr,
    pub config: AgentConfig,
    /// How its CSI plugin process misbehaves (real clients only).
    pub plugin_faults: crate::host::PluginFaults,
    /// The topology segments its node plugin reports in `NodeGetInfo` (empty: none).
    pub csi_topology: BTreeMap<String, String>,
    /// Its allocation directories are real files, which hostile tasks plant links in, and
    /// the host's defects ([`crate::task_files`]); `None`: they are only modelled.
    pub task_files: Option<crate::task_files::HostFaults>,
    /// The host runs a container engine holding these images, and its client the `docker`
    /// driver; `None`: no engine (the driver is not fingerprinted at all).
    pub container_images: Option<Vec<String>>,
}

struct SimClient {
    spec: ClientSpec,
    disk: SimDisk,
    client_disk: SimDisk,
    host: SimHost,
    node: NodeHandle,
    plugins: PluginControl,
    alive: bool,
}

struct SimServer {
    spec: ServerSpec,
    disk: SimDisk,
    node: NodeHandle,
    agent: Arc<Mutex<Option<AgentHandle>>>,
    alive: bool,
    /// Set when the process exited on its own (fail-stop on a storage error).
    exited: Arc<AtomicBool>,
}

/// One simulated machine: a server (by index) or a client node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    Server(usize),
    Client(usize),
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Machine::Server(index) => write!(f, "s{}", index + 1),
            Machine::Client(index) => write!(f, "c{}", index + 1),
        }
    }
}

pub struct SimCluster {
    handle: Handle,
    recorder: Recorder,
    consul: SimConsul,
    servers: Vec<SimServer>,
    clients: Vec<SimClient>,
    clogged: BTreeSet<(usize, usize)>,
    /// The rogue machine ([`crate::rogue`]) and how many calls it made.
    rogue: Option<(NodeHandle, u64)>,
    /// The storage behind every client's plugin.
    storage: SimStorage,
    /// The ACL token the workload's writes carry (a cluster with ACLs on).
    token: Option<String>,
}

impl SimCluster {
    pub fn new(recorder: Recorder, consul: SimConsul) -> Self {
        // Every clock of a new world agrees until a fault sets one apart.
        drover_io_real::clock::sim::reset();
        SimCluster {
            handle: Handle::current(),
            recorder,
            consul,
            servers: Vec::new(),
            clients: Vec::new(),
            clogged: BTreeSet::new(),
            rogue: None,
            storage: SimStorage::default(),
            token: None,
        }
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub fn consul(&self) -> &SimConsul {
        &self.consul
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn name(&self, index: usize) -> &str {
        &self.servers[index].spec.name
    }

    /// Probes of every server's disk, to check after the run that the world was freed.
    pub fn disk_probes(&self) -> Vec<DiskProbe> {
        self.servers
            .iter()
            .map(|server| server.disk.probe())
            .chain(self.clients.iter().map(|client| client.disk.probe()))
            .chain(self.clients.iter().map(|client| client.client_disk.probe()))
            .collect()
    }

    /// Whether the server's process runs: neither killed nor exited on its own.
    pub fn is_alive(&self, index: usize) -> bool {
        let server = &self.servers[index];
        server.alive && !server.exited.load(Ordering::SeqCst)
    }

    /// Creates the server's node; its process starts after `first_start_delay`.
    pub fn add_server(&mut self, spec: ServerSpec) -> usize {
        let disk = SimDisk::new();
        let agent: Arc<Mutex<Option<AgentHandle>>> = Arc::new(Mutex::new(None));
        let first_boot_done = Arc::new(AtomicBool::new(false));
        let exited = Arc::new(AtomicBool::new(false));
        let node_id: Arc<OnceLock<madsim::task::NodeId>> = Arc::default();
        let init = {
            let process = ServerProcess {
                spec: spec.clone(),
                disk: disk.clone(),
                slot: agent.clone(),
                recorder: self.recorder.clone(),
                consul: self.consul.clone(),
                exited: exited.clone(),
                node_id: node_id.clone(),
                keystore: drover_io_real::rootkeys::Keystore::in_memory(),
            };
            move || {
                let process = process.clone();
                let first_boot_done = first_boot_done.clone();
                async move {
                    if !first_boot_done.swap(true, Ordering::SeqCst) {
                        tokio::time::sleep(process.spec.first_start_delay).await;
                    }
                    process.run().await;
                }
            }
        };
        let node = self
            .handle
            .create_node()
            .name(&spec.name)
            .ip(spec.ip)
            .init(init)
            .build();
        let _ = node_id.set(node.id());
        self.servers.push(SimServer {
            spec,
            disk,
            node,
            agent,
            alive: true,
            exited,
        });
        self.servers.len() - 1
    }

    /// Creates a client node; its process starts at once.
    pub fn add_client(&mut self, spec: ClientSpec) -> usize {
        let disk = SimDisk::new();
        let client_disk = SimDisk::new();
        let plugins = PluginControl::with_storage(self.storage.clone());
        let host = SimHost::new(
            &spec.name,
            self.recorder.clone(),
            plugins.clone(),
            spec.plugin_faults.clone(),
        )
        .with_consul(self.consul.agent(&spec.name))
        .with_topology(spec.csi_topology.clone());
        let host = match spec.task_files {
            Some(faults) => {
                let data_dir = spec
                    .config
                    .data_dir
                    .clone()
                    .unwrap_or_else(|| format!("/sim/{}", spec.name));
                let files = crate::task_files::TaskFiles::new(&spec.name, &format!("{data_dir}/alloc"), faults)
                    .expect("the host's scratch directory");
                host.with_task_files(files)
            }
            None => host,
        };
        let host = match &spec.container_images {
            Some(images) => {
                let images: Vec<&str> = images.iter().map(String::as_str).collect();
                host.with_docker(
                    crate::engine::SimEngine::new(&spec.name, self.recorder.clone(), &images),
                    spec.config.client.faults,
                )
            }
            None => host,
        };
        let init = {
            let node = ClientNode {
                spec: spec.clone(),
                disk: disk.clone(),
                client_disk: client_disk.clone(),
                host: host.clone(),
                recorder: self.recorder.clone(),
                consul: self.consul.clone(),
            };
            move || {
                let node = node.clone();
                async move { run_client(node).await }
            }
        };
        let node = self
            .handle
            .create_node()
            .name(&spec.name)
            .ip(spec.ip)
            .init(init)
            .build();
        self.clients.push(SimClient {
            spec,
            disk,
            client_disk,
            host,
            node,
            plugins,
            alive: true,
        });
        self.clients.len() - 1
    }

    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    pub fn client_name(&self, index: usize) -> &str {
        &self.clients[index].spec.name
    }

    pub fn plugins(&self, index: usize) -> &PluginControl {
        &self.clients[index].plugins
    }

    /// The storage behind every client's plugin (the volumes `CreateVolume` made).
    pub fn storage(&self) -> &SimStorage {
        &self.storage
    }

    /// The simulated host of a client node (its tasks and mounts).
    pub fn host(&self, index: usize) -> &SimHost {
        &self.clients[index].host
    }

    /// Client `index`'s container engine, when its host has one.
    pub fn engine(&self, index: usize) -> Option<&crate::engine::SimEngine> {
        self.clients[index].host.engine()
    }

    fn machine(&self, machine: Machine) -> (madsim::task::NodeId, &str) {
        match machine {
            Machine::Server(index) => (self.servers[index].node.id(), &self.servers[index].spec.name),
            Machine::Client(index) => (self.clients[index].node.id(), &self.clients[index].spec.name),
        }
    }

    /// Sets a machine's wall clock `ms` apart from true time: skew between machines, or a
    /// step either way (NTP, an operator's `date -s`). It stays so across restarts.
    pub fn set_wall_clock(&self, machine: Machine, ms: i64) {
        let (node, name) = self.machine(machine);
        drover_io_real::clock::sim::set_wall_offset(node, ms);
        self.recorder.note(format!("{name}'s wall clock is now {ms:+} ms off"));
    }

    /// Jumps a machine's monotonic clock `by` ahead: a paused VM resumes, and every deadline
    /// it was waiting for has passed at once.
    pub fn jump_clock(&self, machine: Machine, by: Duration) {
        let (node, name) = self.machine(machine);
        drover_io_real::clock::sim::jump_monotonic(node, by);
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.recorder
            .record_host(name, crate::trace::HostEvent::MonotonicJumped { by_ms });
    }

    /// Kills a client node's agent. Its tasks and mounts live on in its host (the agent
    /// recovers them when it restarts).
    pub fn kill_client(&mut self, index: usize) {
        self.kill_client_with(index, Crash::KeepUnsynced);
    }

    fn kill_client_with(&mut self, index: usize, crash: Crash) {
        let client = &mut self.clients[index];
        if !client.alive {
            return;
        }
        client.disk.crash(crash);
        client.client_disk.crash(crash);
        self.handle.kill(client.node.id());
        client.alive = false;
        self.recorder.note(format!("kill client {}", client.spec.name));
        self.recorder.record_plugin(&client.spec.name, PluginEvent::AgentKilled);
    }

    /// The client's machine loses power and boots again later ([`Self::restart_client`]):
    /// the agent dies losing what it had not synced, every task and mount is gone, and the
    /// node keeps its identity (its data dir survives), unlike [`Self::lose_client`].
    pub fn reboot_client(&mut self, index: usize) {
        self.kill_client_with(index, Crash::LoseUnsynced);
        let client = &self.clients[index];
        client.host.power_off();
        self.recorder
            .note(format!("host of client {} loses power", client.spec.name));
        // Its plugin died with it: nothing is mounted there any more.
        self.recorder.record_plugin(&client.spec.name, PluginEvent::NodeLost);
    }

    /// The client's machine dies: its agent, every task and every mount. A later
    /// `restart_client` is a reboot onto the same disk.
    pub fn lose_client(&mut self, index: usize) {
        self.kill_client(index);
        let client = &self.clients[index];
        client.host.power_off();
        self.consul.lose_agent(&client.spec.name);
        self.recorder.note(format!("host of client {} lost", client.spec.name));
        self.recorder.record_plugin(&client.spec.name, PluginEvent::NodeLost);
    }

    pub fn restart_client(&mut self, index: usize) {
        let client = &mut self.clients[index];
        if client.alive {
            return;
        }
        self.handle.restart(client.node.id());
        // madsim gives a restarted node a new incarnation: a handle kept from before would
        // spawn onto the killed one, where tasks never run.
        client.node = self.handle.get_node(client.node.id()).expect("a restarted node exists");
        client.alive = true;
        self.recorder.note(format!("restart client {}", client.spec.name));
    }

    /// Server `index`'s endpoints, following its restarts ([`ServerLink`]).
    pub fn link(&self, index: usize) -> ServerLink {
        let server = &self.servers[index];
        ServerLink {
            name: server.spec.name.clone(),
            node: server.node.clone(),
            agent: server.agent.clone(),
            token: self.token.clone().unwrap_or_default(),
        }
    }

    /// A way into the servers' write endpoints through every live server, for tasks that
    /// outlive a borrow of the cluster.
    pub fn gateways(&self) -> Vec<Gateway> {
        (0..self.servers.len())
            .filter_map(|index| {
                Some(Gateway {
                    agent: self.agent(index)?,
                    node: self.servers[index].node.clone(),
                })
            })
            .collect()
    }

    /// Kills the server's process; `crash` says what happens to its unsynced writes.
    pub fn kill(&mut self, index: usize, crash: Crash) {
        let server = &mut self.servers[index];
        if !server.alive {
            return;
        }
        let lost = server.disk.crash(crash);
        *server.agent.lock().expect("agent slot") = None;
        self.handle.kill(server.node.id());
        server.alive = false;
        self.recorder.note(format!(
            "kill {} ({crash:?}, {lost} unsynced bytes lost)",
            server.spec.name
        ));
    }

    /// An operator's graceful stop (SIGTERM): the agent shuts down as `agent` does on the
    /// signal — a leader names a successor and stops heartbeating first — and then its process
    /// exits, with everything it wrote synced. Returns when the process is gone.
    pub async fn stop_gracefully(&mut self, index: usize) {
        if let Some(agent) = self.agent(index) {
            let shutdown = self.servers[index].node.spawn(async move { agent.shutdown().await });
            let _ = tokio::time::timeout(Duration::from_secs(10), shutdown).await;
        }
        self.recorder
            .note(format!("{} stopped gracefully", self.servers[index].spec.name));
        self.kill(index, Crash::KeepUnsynced);
    }

    /// Starts a killed (or exited) server's process again on its surviving disk.
    pub fn restart(&mut self, index: usize) {
        let server = &mut self.servers[index];
        if server.exited.swap(false, Ordering::SeqCst) && server.alive {
            // It exited: what it wrote is in the page cache, its handles are closed.
            server.disk.crash(Crash::KeepUnsynced);
            server.alive = false;
        }
        if server.alive {
            return;
        }
        self.handle.restart(server.node.id());
        // madsim gives a restarted node a new incarnation: a handle kept from before would
        // spawn onto the killed one, where requests and writes never run ("killed mid-write").
        server.node = self.handle.get_node(server.node.id()).expect("a restarted node exists");
        server.alive = true;
        self.recorder.note(format!("restart {}", server.spec.name));
    }

    /// Makes a server's disk misbehave, or behave again with `DiskFault::default()`.
    pub fn set_disk_fault(&mut self, index: usize, fault: DiskFault) {
        let server = &self.servers[index];
        server.disk.set_fault(fault);
        self.recorder.note(format!("disk of {}: {fault:?}", server.spec.name));
    }

    /// Every server's disk behaves again (the quiet phase).
    pub fn heal_disks(&mut self) {
        for server in &self.servers {
            if server.disk.fault() != DiskFault::default() {
                server.disk.set_fault(DiskFault::default());
                self.recorder.note(format!("disk of {} healed", server.spec.name));
            }
        }
    }

    /// Ends the run: kills every node so the executor drops their tasks (tasks left waiting on
    /// each other would otherwise keep a whole simulated world alive after the run).
    pub async fn shutdown(&mut self) {
        for client in &mut self.clients {
            self.handle.kill(client.node.id());
            client.alive = false;
        }
        for server in &mut self.servers {
            *server.agent.lock().expect("agent slot") = None;
            self.handle.kill(server.node.id());
            server.alive = false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    fn clog(&mut self, from: usize, to: usize) {
        if from != to && self.clogged.insert((from, to)) {
            NetSim::current().clog_link(self.servers[from].node.id(), self.servers[to].node.id());
        }
    }

    /// Cuts every link between `side` and the other servers, both ways.
    pub fn partition(&mut self, side: &[usize]) {
        let others: Vec<usize> = (0..self.servers.len()).filter(|index| !side.contains(index)).collect();
        for &a in side {
            for &b in &others {
                self.clog(a, b);
                self.clog(b, a);
            }
        }
        let names = |set: &[usize]| {
            set.iter()
                .map(|index| self.name(*index).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        self.recorder
            .note(format!("partition {{{}}} | {{{}}}", names(side), names(&others)));
    }

    /// A bridge partition: `a` and `b` cannot reach each other, but both still reach every
    /// other server, which alone sees the whole cluster.
    pub fn bridge(&mut self, a: usize, b: usize) {
        self.clog(a, b);
        self.clog(b, a);
        self.recorder.note(format!(
            "bridge: {} and {} cut apart, both still reach the rest",
            self.name(a),
            self.name(b)
        ));
    }

    /// Cuts the link from `from` to `to` only.
    pub fn clog_one_way(&mut self, from: usize, to: usize) {
        self.clog(from, to);
        self.recorder
            .note(format!("clog {} -> {}", self.name(from), self.name(to)));
    }

    pub fn heal(&mut self) {
        for (from, to) in std::mem::take(&mut self.clogged) {
            NetSim::current().unclog_link(self.servers[from].node.id(), self.servers[to].node.id());
        }
        self.recorder.note("heal all links");
    }

    /// A machine holding a client's certificate sends server `index` a direct write.
    pub fn rogue_direct_write(&mut self, index: usize) {
        let spec = &self.servers[index].spec;
        let to = std::net::SocketAddr::new(spec.ip, spec.config.ports.rpc);
        let region = spec.config.region.clone();
        let handle = &self.handle;
        let (node, sent) = self.rogue.get_or_insert_with(|| (crate::rogue::machine(handle), 0));
        *sent += 1;
        crate::rogue::direct_write(node, to, region, *sent, self.recorder.clone());
    }

    /// A machine holding a client's certificate makes server `index` the calls only a token
    /// may allow ([`crate::rogue::server_calls`]); `victims` are variables it tries to read.
    pub fn rogue_server_calls(&mut self, index: usize, victims: Vec<String>) {
        let spec = &self.servers[index].spec;
        let to = std::net::SocketAddr::new(spec.ip, spec.config.ports.rpc);
        let region = spec.config.region.clone();
        let server = spec.name.clone();
        let handle = &self.handle;
        let (node, sent) = self.rogue.get_or_insert_with(|| (crate::rogue::machine(handle), 0));
        *sent += 1;
        crate::rogue::server_calls(node, to, region, *sent, victims, server, self.recorder.clone());
    }

    /// With ACLs on: makes the first management token, with `secret`, through server `index`
    /// (its leader, or the write fails), and has the workload's writes carry it from then on.
    pub async fn bootstrap_acl(&mut self, index: usize, secret: String) -> Result<u64, String> {
        let agent = self.agent(index).ok_or("the server is down")?;
        let token = drover_core::acl::AclToken {
            accessor_id: format!("{secret}-accessor"),
            secret_id: secret.clone(),
            name: "Bootstrap Token".into(),
            token_type: drover_core::acl::TokenType::Management,
            policies: Vec::new(),
            roles: Vec::new(),
            global: true,
            create_time_ms: 0,
            expiration_time_ms: None,
            create_index: 0,
            modify_index: 0,
        };
        let command = Command::Acl(drover_core::fsm::acl::AclCommand::Bootstrap { token, reset_index: 0 });
        let (index, _) = agent.apply(command).await.map_err(|error| error.to_string())?;
        self.token = Some(secret);
        Ok(index)
    }

    /// Status of every live server whose agent has started: (name, node id, status).
    pub fn live_statuses(&self) -> Vec<(String, u64, AgentStatus)> {
        self.servers
            .iter()
            .filter(|server| server.alive)
            .filter_map(|server| {
                let agent = server.agent.lock().expect("agent slot").clone()?;
                Some((server.spec.name.clone(), agent.node_id(), agent.status()))
            })
            .collect()
    }

    /// The running agent of a live server, if its process has started.
    /// Reads through server `index`, whenever they are made ([`ServerReader`]).
    pub fn reader(&self, index: usize) -> ServerReader {
        let server = &self.servers[index];
        ServerReader {
            node: server.node.clone(),
            agent: server.agent.clone(),
        }
    }

    pub fn agent(&self, index: usize) -> Option<AgentHandle> {
        let server = &self.servers[index];
        if !server.alive {
            return None;
        }
        server.agent.lock().expect("agent slot").clone()
    }

    /// Starts writing `path = value` through server `index` (forwarded to the leader as
    /// needed); `None` when the server is down. The write runs on that server's node, so it
    /// sees that server's network; the returned future resolves to the log index.
    pub fn start_write(
        &self,
        index: usize,
        path: String,
        value: String,
        timeout: Duration,
    ) -> Option<impl std::future::Future<Output = Result<u64, String>> + use<>> {
        self.start_write_sealed(index, path, value, timeout, false)
    }

    /// [`start_write`](Self::start_write), the value sealed first under the cluster's root
    /// key when `sealed` (as the HTTP API seals a variable before Raft; the first sealed
    /// write makes the key and hands it to the other servers).
    pub fn start_write_sealed(
        &self,
        index: usize,
        path: String,
        value: String,
        timeout: Duration,
        sealed: bool,
    ) -> Option<impl std::future::Future<Output = Result<u64, String>> + use<>> {
        let agent = self.agent(index)?;
        let items: drover_core::structs::Secrets = [("v".to_string(), value)].into();
        let token = self.token.clone().unwrap_or_default();
        let task = self.servers[index]
            .node
            .spawn(drover_io_real::service::auth::with_token(token, async move {
                let items = if sealed {
                    agent.seal_secrets(&items).await.map_err(|error| error.to_string())?
                } else {
                    items
                };
                let command = Command::VariableUpsert {
                    path,
                    items,
                    cas: None,
                    lock_id: None,
                };
                agent
                    .apply(command)
                    .await
                    .map(|(index, _)| index)
                    .map_err(|error| error.to_string())
            }));
        Some(async move {
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(error)) if error.is_cancelled() => Err("the server was killed mid-write".to_string()),
                Ok(Err(_)) => Err("the write task panicked".to_string()),
                Err(_) => Err("timed out".to_string()),
            }
        })
    }
}

/// One server's endpoints for a task that outlives a borrow of the cluster and its faults:
/// each call goes to the server's current incarnation (a restart gives madsim's node a new
/// one), carries the cluster's ACL token, and finds nothing while the server is down.
#[derive(Clone)]
pub struct ServerLink {
    name: String,
    /// A handle of some incarnation: only its ID is used.
    node: NodeHandle,
    agent: Arc<Mutex<Option<AgentHandle>>>,
    token: String,
}

/// What a [`ServerLink`] call resolves to.
pub type LinkCall<R> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<R, String>> + Send>>;

impl ServerLink {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `call` with the agent on the server's current incarnation, bounded by `timeout`;
    /// `None` when the server is down.
    fn start<R: Send + 'static, F>(&self, timeout: Duration, call: impl FnOnce(AgentHandle) -> F) -> Option<LinkCall<R>>
    where
        F: std::future::Future<Output = Result<R, String>> + Send + 'static,
    {
        let agent = self.agent.lock().expect("agent slot").clone()?;
        let node = Handle::current().get_node(self.node.id())?;
        let task = node.spawn(drover_io_real::service::auth::with_token(
            self.token.clone(),
            call(agent),
        ));
        Some(Box::pin(async move {
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err("the server was killed mid-call".to_string()),
                Err(_) => Err("timed out".to_string()),
            }
        }))
    }

    /// A consistent read (the read barrier, then this server's own state) of what `read`
    /// takes from the state, as the HTTP API serves a `GET` without `?stale`.
    pub fn start_read<R: Send + 'static>(
        &self,
        read: impl FnOnce(&drover_core::fsm::ServerState) -> R + Send + 'static,
        timeout: Duration,
    ) -> Option<LinkCall<R>> {
        self.start(timeout, |agent| async move {
            agent.read_barrier().await.map_err(|error| error.to_string())?;
            agent
                .read_state(read)
                .ok_or_else(|| "this server holds no state".to_string())
        })
    }

    /// `request` through the server's write endpoints (forwarded to the leader as a
    /// client's RPC would be): the endpoint's answer, or why there was none (the write may
    /// still land).
    pub fn start_request(&self, request: ServerRequest, timeout: Duration) -> Option<LinkCall<ServerReply>> {
        self.start(timeout, |agent| async move { Ok(agent.request(request).await) })
    }

    /// A direct write of `command`: its index and the state machine's response, or why
    /// there was none (the write may still land).
    pub fn start_apply(
        &self,
        command: Command,
        timeout: Duration,
    ) -> Option<LinkCall<(u64, drover_core::fsm::Response)>> {
        self.start(timeout, |agent| async move {
            agent.apply(command).await.map_err(|error| error.to_string())
        })
    }
}

/// What a consistent read through one server needs, kept past the moment it is taken (the
/// workload reads a write back once it is acknowledged).
#[derive(Clone)]
pub struct ServerReader {
    node: NodeHandle,
    agent: Arc<Mutex<Option<AgentHandle>>>,
}

impl ServerReader {
    /// Starts a consistent read of the variable at `path` (the read barrier, then the server's
    /// own state), as the HTTP API serves a `GET` without `?stale`: whether the variable
    /// exists. `None` when the server is not running.
    pub fn start_read(
        &self,
        path: String,
        timeout: Duration,
    ) -> Option<impl std::future::Future<Output = Result<bool, String>> + use<>> {
        let agent = self.agent.lock().expect("agent slot").clone()?;
        let task = self.node.spawn(async move {
            agent.read_barrier().await.map_err(|error| error.to_string())?;
            agent
                .read_state(|state| state.variable(&path).is_some())
                .ok_or_else(|| "this server holds no state".to_string())
        });
        Some(async move {
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err("the server was killed mid-read".to_string()),
                Err(_) => Err("timed out".to_string()),
            }
        })
    }
    /// Starts a consistent read of the variable at `path` that opens its items (fetching the
    /// root key from a peer if this server lacks it): the value of its item `v`, `None` when
    /// there is no such variable.
    pub fn start_open(
        &self,
        path: String,
        timeout: Duration,
    ) -> Option<impl std::future::Future<Output = Result<Option<String>, String>> + use<>> {
        let agent = self.agent.lock().expect("agent slot").clone()?;
        let task = self.node.spawn(async move {
            agent.read_barrier().await.map_err(|error| error.to_string())?;
            let items = agent
                .read_state(|state| state.variable(&path).map(|variable| variable.items.clone()))
                .ok_or_else(|| "this server holds no state".to_string())?;
            let Some(items) = items else { return Ok(None) };
            let opened = agent.open_secrets(&items).await.map_err(|error| error.to_string())?;
            Ok(Some(opened.get("v").cloned().unwrap_or_default()))
        });
        Some(async move {
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err("the server was killed mid-read".to_string()),
                Err(_) => Err("timed out".to_string()),
            }
        })
    }
}

/// Everything a server's process needs, kept outside the node so a restart finds it.
#[derive(Clone)]
struct ServerProcess {
    spec: ServerSpec,
    disk: SimDisk,
    slot: Arc<Mutex<Option<AgentHandle>>>,
    recorder: Recorder,
    consul: SimConsul,
    exited: Arc<AtomicBool>,
    node_id: Arc<OnceLock<madsim::task::NodeId>>,
    /// The server's root keys: kept across its restarts, as the files of a real keystore
    /// (written and synced before a key is used) are.
    keystore: drover_io_real::rootkeys::Keystore,
}

impl ServerProcess {
    /// The agent's process: starts the agent on the disk and runs until killed, or until
    /// Raft fails (a disk fault) and the agent exits, as `agent` does, for the scenario's
    /// supervisor to restart it.
    async fn run(self) {
        let name = &self.spec.name;
        self.recorder.note(format!("{name} process starts"));
        let faulty = self.disk.fault() != DiskFault::default();
        let db = if faulty {
            // A bad disk may refuse to open; that is the fault, not a lost database.
            match redb::Builder::new().create_with_backend(self.disk.backend()) {
                Ok(db) => Some(db),
                Err(error) => return self.exit(format!("cannot open its data dir: {error}")),
            }
        } else {
            open_db(&self.disk, &self.recorder, name)
        };
        let Some(db) = db else {
            return;
        };
        let disk = self.disk.clone();
        let parts = AgentParts {
            config: self.spec.config.clone(),
            db,
            // Servers call as servers, as with `verify_server_hostname` certificates.
            transport: SimTransport::proving(Identity::Server),
            consul: self.consul.clone(),
            observer: self.recorder.observer(name),
            client_csi: None,
            disk_latency: Some(Arc::new(move || disk.latency())),
            keystore: Some(self.keystore.clone()),
        };
        let agent = match start_agent(parts).await {
            Ok(agent) => agent,
            Err(error) if self.disk.fault() != DiskFault::default() => {
                return self.exit(format!("cannot start: {error}"));
            }
            Err(error) => {
                self.recorder.violate("agent starts", format!("{name}: {error}"));
                return;
            }
        };
        *self.slot.lock().expect("agent slot") = Some(agent.clone());
        let reason = agent.failed().await;
        self.exit(reason);
    }

    /// The process exits with `reason`: every task of the node ends, as the OS ends a
    /// process's threads.
    fn exit(&self, reason: String) {
        self.recorder.note(format!("{} exits: {reason}", self.spec.name));
        *self.slot.lock().expect("agent slot") = None;
        self.exited.store(true, Ordering::SeqCst);
        if let Some(id) = self.node_id.get() {
            Handle::current().kill(*id);
        }
    }
}

/// Everything a client node's process needs, kept outside the node so a restart finds it.
#[derive(Clone)]
struct ClientNode {
    spec: ClientSpec,
    disk: SimDisk,
    client_disk: SimDisk,
    host: SimHost,
    recorder: Recorder,
    consul: SimConsul,
}

async fn run_client(node: ClientNode) {
    let ClientNode {
        spec,
        disk,
        client_disk,
        host,
        recorder,
        consul,
    } = node;
    recorder.note(format!("{} process starts", spec.name));
    let Some(db) = open_db(&disk, &recorder, &spec.name) else {
        return;
    };
    let (router, inbox) = ClientCsiRouter::new();
    // Servers' controller and node-detach calls go through the production client's loop.
    let client_csi: Arc<dyn drover_io_real::io::ClientCsi> = Arc::new(router);
    let consul_agent = consul.agent(&spec.name);
    let parts = AgentParts {
        config: spec.config.clone(),
        db,
        transport: SimTransport::proving(if spec.config.server.enabled {
            Identity::Server
        } else {
            Identity::Client
        }),
        consul,
        observer: recorder.observer(&spec.name),
        client_csi: Some(client_csi),
        disk_latency: None,
        keystore: None,
    };
    let agent = match start_agent(parts).await {
        Ok(agent) => agent,
        Err(error) => {
            recorder.violate("agent starts", format!("{}: {error}", spec.name));
            return;
        }
    };
    let Some(client_db) = open_db(&client_disk, &recorder, &format!("{} client store", spec.name)) else {
        return;
    };
    let (settings, node) = crate::client_node::client_identity(&spec.name, &spec.config, agent.node_id());
    let parts = ClientParts {
        agent,
        settings,
        // A new client process: a new driver, reattaching to the engine's containers.
        executor: Arc::new(host.for_a_new_agent()),
        store: ClientStore::new(client_db),
        inbox,
        node,
        services: Some(Arc::new(consul_agent)),
    };
    if let Err(error) = start_client(parts) {
        recorder.violate("client starts", format!("{}: {error}", spec.name));
        return;
    }
    std::future::pending::<()>().await;
}

/// Sends `request` through the servers `gateways()` lists at each attempt (the `pick`-th
/// first, then the next), until one answers other than "try again"; waits 500 ms after a
/// retryable answer or while no server is live.
pub async fn retry_request(
    gateways: impl Fn() -> Vec<Gateway>,
    pick: usize,
    request: ServerRequest,
    attempts: u32,
    timeout: Duration,
) -> ServerReply {
    let mut reply = ServerReply::Error(RpcError::unavailable("no live server"));
    for attempt in 0..attempts {
        let gateways = gateways();
        if gateways.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let gateway = &gateways[(pick + attempt as usize) % gateways.len()];
        reply = gateway.request(request.clone(), timeout).await;
        match &reply {
            ServerReply::Error(error) if error.retryable => tokio::time::sleep(Duration::from_millis(500)).await,
            _ => return reply,
        }
    }
    reply
}

/// Sends requests to the servers' write endpoints through one server (forwarded to the leader
/// there). Requests run on that server's node, so they see its network and die with it.
#[derive(Clone)]
pub struct Gateway {
    agent: AgentHandle,
    node: NodeHandle,
}

impl Gateway {
    pub async fn request(&self, request: ServerRequest, timeout: Duration) -> ServerReply {
        let agent = self.agent.clone();
        let task = self.node.spawn(async move { agent.request(request).await });
        let failed = |message: &str| ServerReply::Error(RpcError::unavailable(message.to_string()));
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => failed("the server was killed mid-request"),
            Err(_) => failed("timed out"),
        }
    }

    /// `Node.GetClientAllocs` answered by this server (a blocking, possibly stale read).
    pub async fn node_allocs(
        &self,
        request: drover_core::rpc::NodeAllocsRequest,
        timeout: Duration,
    ) -> Result<drover_core::rpc::NodeAllocsReply, String> {
        let agent = self.agent.clone();
        let task = self.node.spawn(async move { agent.node_allocs(request).await });
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(Ok(reply))) => Ok(reply),
            Ok(Ok(Err(error))) => Err(error.message),
            Ok(Err(_)) => Err("the server was killed mid-request".into()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// Reads this server's applied state (a stale read, as any follower's is).
    pub fn read_state<R>(&self, read: impl FnOnce(&drover_core::fsm::ServerState) -> R) -> Option<R> {
        self.agent.read_state(read)
    }
}
