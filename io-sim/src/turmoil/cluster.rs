//! A cluster of whole server agents on turmoil's network: each server is a turmoil host
//! running the production driver with the production tonic transport and the production HTTP
//! API, on a crash-prone simulated disk. Hosts can be crashed (losing unsynced writes or not),
//! restarted, partitioned, healed and given lossy links; the recorder sees every agent event.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use drover_core::config::{Advertise, AgentConfig, Ports};
use drover_core::fsm::ServerState;
use drover_host::net::GrpcTransport;
use drover_io_real::client::{ClientCsiRouter, ClientParts, ClientStore, start_client};
use drover_io_real::driver::{AgentHandle, AgentParts, AgentStatus, start_agent};
use drover_io_real::io::NoConsul;
use drover_io_real::rootkeys::Keystore;

use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;

use super::sockets::TurmoilSockets;
use crate::csi::PluginControl;
use crate::disk::{Crash, SimDisk, open_db};
use crate::host::{PluginFaults, SimHost};
use crate::trace::Recorder;

/// Where every run's wall clock starts (2026-01-01T00:00:00Z), so stamps replay exactly.
pub const EPOCH_UNIX_MS: u64 = 1_767_225_600_000;

/// One server: its name (also its turmoil host name), its configuration (addresses are filled
/// in on its host) and how long after the run starts its process first starts.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub name: String,
    pub config: AgentConfig,
    pub first_start_delay: Duration,
    /// The `no-keepalive` regression switch: the agent's RPC transport keeps dead connections.
    pub keep_dead_connections: bool,
}

/// One client node: the agent in client mode running the production client driver on a
/// simulated host ([`SimHost`]: its tasks and CSI plugins outlive the agent's process).
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub name: String,
    pub config: AgentConfig,
    pub first_start_delay: Duration,
    /// As [`ServerSpec::keep_dead_connections`].
    pub keep_dead_connections: bool,
}

/// How the simulated network behaves.
#[derive(Clone, Copy, Debug)]
pub struct NetworkSpec {
    /// How much virtual time each step of the simulation moves.
    pub tick: Duration,
    pub min_latency: Duration,
    pub max_latency: Duration,
    /// The share of messages lost on every link (a lost TCP segment breaks its connection,
    /// as turmoil has no retransmission).
    pub fail_rate: f64,
}

impl Default for NetworkSpec {
    fn default() -> Self {
        NetworkSpec {
            tick: Duration::from_millis(1),
            min_latency: Duration::from_millis(1),
            max_latency: Duration::from_millis(5),
            fail_rate: 0.0,
        }
    }
}

/// Pauses of the thread that drives the simulation, in real time, between steps: a run that
/// depends on nothing but its seed replays the same whatever they are, so a replay with them
/// proves that no library under the production stack reads the host's clock to decide
/// something (h2 forgets a reset stream one real second after it was reset, for one). They
/// are drawn from their own seed, so a replay that differs can be repeated exactly.
#[derive(Clone, Copy, Debug)]
pub struct RealTimeJitter {
    pub seed: u64,
    /// Each `(one_in, longest)`: on average one step in `one_in` is followed by a pause of up
    /// to `longest` (short frequent pauses for thresholds of milliseconds, rare long ones for
    /// thresholds of seconds).
    pub pauses: [(u32, Duration); 2],
}

struct ServerHost {
    spec: ServerSpec,
    disk: SimDisk,
    /// The server's root keys, kept across its restarts as a real keystore's files (written
    /// and synced before a key is used) are. In memory: a keystore in a host directory
    /// outlived the run, so a replay started with the keys its run had made, and a server
    /// that had to fetch a key from a peer in the run did not in the replay (leader_kill
    /// seed 45 and csi_claim seed 43 replayed differently on a machine where they had not
    /// run before).
    keystore: Keystore,
    slot: Arc<Mutex<Option<AgentHandle>>>,
    running: bool,
}

struct ClientHost {
    spec: ClientSpec,
    disk: SimDisk,
    client_disk: SimDisk,
    host: SimHost,
    slot: Arc<Mutex<Option<AgentHandle>>>,
}

/// The simulation and its servers.
pub struct TurmoilCluster {
    sim: turmoil::Sim<'static>,
    servers: Vec<ServerHost>,
    clients: Vec<ClientHost>,
    recorder: Recorder,
    sockets: TurmoilSockets,
    jitter: Option<(RealTimeJitter, ChaCha8Rng)>,
}

/// The simulation's wall clock on whichever host is running (the epoch between steps).
fn wall_clock() -> u64 {
    turmoil::since_epoch().map_or(EPOCH_UNIX_MS, |since| since.as_millis() as u64)
}

thread_local! {
    /// Virtual time at the last step, for stamps made between steps (the scenario's own notes).
    static STEPPED: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Virtual time since the run began, for the trace's stamps.
fn trace_clock() -> Option<Duration> {
    Some(turmoil::sim_elapsed().unwrap_or_else(|| STEPPED.with(std::cell::Cell::get)))
}

impl TurmoilCluster {
    /// Builds the simulation for `seed` and registers every server's host (each starts after
    /// its delay). The calling thread is marked as simulating until [`TurmoilCluster::finish`].
    pub fn new(
        seed: u64,
        network: NetworkSpec,
        specs: Vec<ServerSpec>,
        client_specs: Vec<ClientSpec>,
        limit: Duration,
    ) -> Self {
        // This world's files are the host's: a server's data directory would outlive the run,
        // and its replay would start from what the run left there.
        if let Some(spec) = specs.iter().find(|spec| spec.config.data_dir.is_some()) {
            panic!(
                "turmoil server {} has a data_dir: its state belongs on the cluster's simulated disk and keystore",
                spec.name
            );
        }
        align_task_ids();
        drover_io_real::runtime::simulate_on_this_thread(seed, wall_clock);
        STEPPED.with(|at| at.set(Duration::ZERO));
        let recorder = Recorder::with_clock(trace_clock);
        let mut builder = turmoil::Builder::new();
        builder
            .rng_seed(seed)
            .epoch(SystemTime::UNIX_EPOCH + Duration::from_millis(EPOCH_UNIX_MS))
            .simulation_duration(limit)
            .tick_duration(network.tick)
            .min_message_latency(network.min_latency)
            .max_message_latency(network.max_latency)
            .fail_rate(network.fail_rate);
        let mut sim = builder.build();
        let sockets = TurmoilSockets::new(
            specs
                .iter()
                .map(|spec| spec.name.clone())
                .chain(client_specs.iter().map(|spec| spec.name.clone())),
        );
        let mut servers = Vec::new();
        for spec in specs {
            let server = ServerHost {
                spec,
                disk: SimDisk::new(),
                keystore: Keystore::in_memory(),
                slot: Arc::default(),
                running: true,
            };
            register(&mut sim, &server, &recorder, &sockets);
            servers.push(server);
        }
        let mut clients = Vec::new();
        for spec in client_specs {
            let client = ClientHost {
                host: SimHost::new(
                    &spec.name,
                    recorder.clone(),
                    PluginControl::default(),
                    PluginFaults::default(),
                ),
                spec,
                disk: SimDisk::new(),
                client_disk: SimDisk::new(),
                slot: Arc::default(),
            };
            register_client(&mut sim, &client, &recorder, &sockets);
            clients.push(client);
        }
        TurmoilCluster {
            sim,
            servers,
            clients,
            recorder,
            sockets,
            jitter: None,
        }
    }

    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub fn sockets(&self) -> &TurmoilSockets {
        &self.sockets
    }

    /// Virtual time since the run began.
    pub fn elapsed(&self) -> Duration {
        self.sim.elapsed()
    }

    /// Moves the simulation one tick; `Err` when a host's software failed.
    pub fn step(&mut self) -> Result<(), String> {
        let stepped = self.sim.step().map(|_| ()).map_err(|error| error.to_string());
        STEPPED.with(|at| at.set(self.sim.elapsed()));
        if let Some((jitter, rng)) = &mut self.jitter {
            for (one_in, longest) in jitter.pauses {
                if rng.gen_ratio(1, one_in.max(1)) {
                    let nanos = u64::try_from(longest.as_nanos()).unwrap_or(u64::MAX);
                    std::thread::sleep(Duration::from_nanos(rng.gen_range(0..=nanos)));
                }
            }
        }
        stepped
    }

    /// From now on, pauses the driving thread in real time between steps (see
    /// [`RealTimeJitter`]).
    pub fn jitter_real_time(&mut self, jitter: RealTimeJitter) {
        self.jitter = Some((jitter, ChaCha8Rng::seed_from_u64(jitter.seed)));
    }

    /// Steps until `done` holds or `bound` of virtual time has passed; whether it held.
    pub fn step_until(&mut self, bound: Duration, mut done: impl FnMut(&Self) -> bool) -> Result<bool, String> {
        let until = self.elapsed() + bound;
        while self.elapsed() < until {
            if done(self) {
                return Ok(true);
            }
            self.step()?;
        }
        Ok(done(self))
    }

    /// Registers a host that runs `software` once (an operator, a workload).
    pub fn client<F>(&mut self, name: &str, software: F)
    where
        F: std::future::Future<Output = turmoil::Result> + 'static,
    {
        self.sim.client(name, software);
    }

    pub fn server_names(&self) -> Vec<String> {
        self.servers.iter().map(|server| server.spec.name.clone()).collect()
    }

    pub fn is_running(&self, index: usize) -> bool {
        self.servers[index].running
    }

    /// The agent of server `index`, when its process is up and has started.
    pub fn agent(&self, index: usize) -> Option<AgentHandle> {
        self.servers[index].slot.lock().expect("agent slot").clone()
    }

    /// The agent of client `index`, when its process is up and its client has started.
    pub fn client_agent(&self, index: usize) -> Option<AgentHandle> {
        self.clients[index].slot.lock().expect("agent slot").clone()
    }

    /// The simulated host of client `index` (its tasks, mounts and plugin).
    pub fn client_host(&self, index: usize) -> &SimHost {
        &self.clients[index].host
    }

    /// Statuses of the running servers: (name, node id, status).
    pub fn statuses(&self) -> Vec<(String, u64, AgentStatus)> {
        (0..self.servers.len())
            .filter_map(|index| {
                let agent = self.agent(index)?;
                Some((self.servers[index].spec.name.clone(), agent.node_id(), agent.status()))
            })
            .collect()
    }

    /// Applied states of the running servers, by name.
    pub fn states(&self) -> Vec<(String, ServerState)> {
        (0..self.servers.len())
            .filter_map(|index| {
                let agent = self.agent(index)?;
                let state = agent.read_state(ServerState::clone)?;
                Some((self.servers[index].spec.name.clone(), state))
            })
            .collect()
    }

    /// The index of the server whose node id is `node_id`.
    pub fn index_of(&self, node_id: u64) -> Option<usize> {
        (0..self.servers.len()).find(|&index| self.agent(index).is_some_and(|agent| agent.node_id() == node_id))
    }

    /// The HTTP API address of server `index` (its host's address, the configured port).
    pub fn http_addr(&self, index: usize) -> SocketAddr {
        let spec = &self.servers[index].spec;
        SocketAddr::new(self.sim.lookup(spec.name.as_str()), spec.config.ports.http)
    }

    /// Kills server `index`'s process; a power loss also loses its unsynced writes.
    pub fn crash(&mut self, index: usize, crash: Crash) {
        let server = &mut self.servers[index];
        self.recorder.note(format!("{} crashes ({crash:?})", server.spec.name));
        server.slot.lock().expect("agent slot").take();
        self.sim.crash(server.spec.name.as_str());
        server.disk.crash(crash);
        server.running = false;
    }

    /// Starts server `index`'s process again on its disk.
    pub fn restart(&mut self, index: usize) {
        let server = &mut self.servers[index];
        self.recorder.note(format!("{} restarts", server.spec.name));
        self.sim.bounce(server.spec.name.as_str());
        server.running = true;
    }

    /// Cuts every link between the servers in `a` and those in `b`.
    pub fn partition(&mut self, a: &[usize], b: &[usize]) {
        self.recorder
            .note(format!("partition {} | {}", self.names(a), self.names(b)));
        for &x in a {
            for &y in b {
                self.sim
                    .partition(self.servers[x].spec.name.as_str(), self.servers[y].spec.name.as_str());
            }
        }
    }

    /// Heals every partition between servers.
    pub fn heal(&mut self) {
        self.recorder.note("heal every partition");
        for x in 0..self.servers.len() {
            for y in x + 1..self.servers.len() {
                self.sim
                    .repair(self.servers[x].spec.name.as_str(), self.servers[y].spec.name.as_str());
            }
        }
    }

    /// Sets the share of messages lost on every link.
    pub fn set_fail_rate(&mut self, rate: f64) {
        self.recorder.note(format!("message loss {rate}"));
        self.sim.set_fail_rate(rate);
    }

    fn names(&self, indexes: &[usize]) -> String {
        indexes
            .iter()
            .map(|&index| self.servers[index].spec.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Ends the run: the hosts' runtimes are dropped and the thread stops simulating.
    pub fn finish(self) -> Recorder {
        let recorder = self.recorder.clone();
        for server in &self.servers {
            server.slot.lock().expect("agent slot").take();
        }
        for client in &self.clients {
            client.slot.lock().expect("agent slot").take();
        }
        drop(self.sim);
        STEPPED.with(|at| at.set(Duration::ZERO));
        drover_io_real::runtime::stop_simulating_on_this_thread();
        recorder
    }
}

/// tokio numbers tasks from one process-wide counter and files each task of a runtime in one
/// of a few lists by its number; a runtime dropped (a host crashing) drops its tasks list by
/// list, so the order their sockets close in, and with it the run, would depend on how many
/// tasks earlier runs in this process spawned. Every run starts its numbering at the same
/// residue instead.
fn align_task_ids() {
    const ALIGN: u64 = 1024;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    loop {
        let id = runtime.spawn(async {}).id();
        let id: u64 = id.to_string().parse().expect("task ids print as numbers");
        if (id + 1).is_multiple_of(ALIGN) {
            break;
        }
    }
}

fn register(sim: &mut turmoil::Sim<'static>, server: &ServerHost, recorder: &Recorder, sockets: &TurmoilSockets) {
    let (spec, disk, keystore, slot, recorder, sockets) = (
        server.spec.clone(),
        server.disk.clone(),
        server.keystore.clone(),
        server.slot.clone(),
        recorder.clone(),
        sockets.clone(),
    );
    let first_start = Arc::new(std::sync::atomic::AtomicBool::new(true));
    sim.host(server.spec.name.as_str(), move || {
        let (spec, disk, keystore, slot, recorder, sockets) = (
            spec.clone(),
            disk.clone(),
            keystore.clone(),
            slot.clone(),
            recorder.clone(),
            sockets.clone(),
        );
        let first = first_start.swap(false, std::sync::atomic::Ordering::SeqCst);
        async move {
            if first {
                tokio::time::sleep(spec.first_start_delay).await;
            }
            run_server(spec, disk, keystore, slot, recorder, sockets).await
        }
    });
}

/// The configuration with this host's own address filled in.
fn on_this_host(mut config: AgentConfig, name: &str) -> AgentConfig {
    let ip: IpAddr = turmoil::lookup(name);
    let ports: Ports = config.ports;
    config.bind_addr = ip;
    config.advertise = Advertise::on(ip, ports);
    // `client.servers` by host name, resolved as the agent's config loader resolves them.
    config.client.servers = config
        .client
        .servers
        .iter()
        .map(|server| match server.parse::<SocketAddr>() {
            Ok(addr) => addr.to_string(),
            Err(_) => SocketAddr::new(turmoil::lookup(server.as_str()), Ports::default().rpc).to_string(),
        })
        .collect();
    config
}

async fn run_server(
    spec: ServerSpec,
    disk: SimDisk,
    keystore: Keystore,
    slot: Arc<Mutex<Option<AgentHandle>>>,
    recorder: Recorder,
    sockets: TurmoilSockets,
) -> turmoil::Result {
    recorder.note(format!("{} process starts", spec.name));
    let config = on_this_host(spec.config.clone(), &spec.name);
    let Some(db) = open_db(&disk, &recorder, &spec.name) else {
        return Ok(());
    };
    let http = config.advertise.http;
    let transport = transport(&sockets, spec.keep_dead_connections);
    let parts = AgentParts {
        config,
        db,
        transport,
        consul: NoConsul,
        observer: recorder.observer(&spec.name),
        client_csi: None,
        disk_latency: None,
        keystore: Some(keystore),
    };
    let agent = match start_agent(parts).await {
        Ok(agent) => agent,
        Err(error) => {
            recorder.violate("agent starts", format!("{}: {error}", spec.name));
            return Ok(());
        }
    };
    if let Err(error) = drover_http::serve_with(&sockets, agent.clone(), http, drover_http::HttpLimits::default()).await
    {
        recorder.violate("agent starts", format!("{}: HTTP API: {error}", spec.name));
        return Ok(());
    }
    *slot.lock().expect("agent slot") = Some(agent);
    std::future::pending::<()>().await;
    Ok(())
}

/// The production RPC transport on turmoil's sockets (keeping dead connections under the
/// `no-keepalive` switch).
fn transport(sockets: &TurmoilSockets, keep_dead_connections: bool) -> GrpcTransport<TurmoilSockets> {
    let transport = GrpcTransport::new(sockets.clone());
    if keep_dead_connections {
        transport.regress_dead_connection_detection()
    } else {
        transport
    }
}

fn register_client(
    sim: &mut turmoil::Sim<'static>,
    client: &ClientHost,
    recorder: &Recorder,
    sockets: &TurmoilSockets,
) {
    let node = ClientNode {
        spec: client.spec.clone(),
        disk: client.disk.clone(),
        client_disk: client.client_disk.clone(),
        host: client.host.clone(),
        slot: client.slot.clone(),
        recorder: recorder.clone(),
        sockets: sockets.clone(),
    };
    let first_start = Arc::new(std::sync::atomic::AtomicBool::new(true));
    sim.host(client.spec.name.as_str(), move || {
        let node = node.clone();
        let first = first_start.swap(false, std::sync::atomic::Ordering::SeqCst);
        async move {
            if first {
                tokio::time::sleep(node.spec.first_start_delay).await;
            }
            run_client(node).await
        }
    });
}

/// Everything a client host's process needs, kept outside it so a restart finds it.
#[derive(Clone)]
struct ClientNode {
    spec: ClientSpec,
    disk: SimDisk,
    client_disk: SimDisk,
    host: SimHost,
    slot: Arc<Mutex<Option<AgentHandle>>>,
    recorder: Recorder,
    sockets: TurmoilSockets,
}

async fn run_client(node: ClientNode) -> turmoil::Result {
    let ClientNode {
        spec,
        disk,
        client_disk,
        host,
        slot,
        recorder,
        sockets,
    } = node;
    recorder.note(format!("{} process starts", spec.name));
    let config = on_this_host(spec.config.clone(), &spec.name);
    let Some(db) = open_db(&disk, &recorder, &spec.name) else {
        return Ok(());
    };
    let (router, inbox) = ClientCsiRouter::new();
    // Servers' controller and node-detach calls go through the production client's loop.
    let client_csi: Arc<dyn drover_io_real::io::ClientCsi> = Arc::new(router);
    let http = config.advertise.http;
    let transport = transport(&sockets, spec.keep_dead_connections);
    let parts = AgentParts {
        config: config.clone(),
        db,
        transport,
        consul: NoConsul,
        observer: recorder.observer(&spec.name),
        client_csi: Some(client_csi),
        disk_latency: None,
        keystore: None,
    };
    let agent = match start_agent(parts).await {
        Ok(agent) => agent,
        Err(error) => {
            recorder.violate("agent starts", format!("{}: {error}", spec.name));
            return Ok(());
        }
    };
    let Some(client_db) = open_db(&client_disk, &recorder, &format!("{} client store", spec.name)) else {
        return Ok(());
    };
    let (settings, node) = crate::client_node::client_identity(&spec.name, &config, agent.node_id());
    let parts = ClientParts {
        agent: agent.clone(),
        settings,
        executor: Arc::new(host),
        store: ClientStore::new(client_db),
        inbox,
        node,
        services: None,
    };
    if let Err(error) = start_client(parts) {
        recorder.violate("client starts", format!("{}: {error}", spec.name));
        return Ok(());
    }
    if let Err(error) = drover_http::serve_with(&sockets, agent.clone(), http, drover_http::HttpLimits::default()).await
    {
        recorder.violate("agent starts", format!("{}: HTTP API: {error}", spec.name));
        return Ok(());
    }
    *slot.lock().expect("agent slot") = Some(agent);
    std::future::pending::<()>().await;
    Ok(())
}
