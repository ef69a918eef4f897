//! The CSI workload: allocations on client nodes claim volumes, use them, finish, and their
//! claims are released (by the client or by the leader's volume watcher), while the scenario
//! injects faults. Every request goes through a random live server, as a client would.
//!
//! The model here is the *client's* view; the safety checks are the trace invariants, and the
//! end checks compare against the leader's state store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiCapability, CsiControllerInfo,
    CsiInfo, CsiNodeInfo, CsiVolume, CsiVolumeClaim, Node, NodeStatus,
};
use drover_io_sim::cluster::{Gateway, SimCluster};
use drover_io_sim::trace::{PluginEvent, Recorder};
use rand::{Rng, SeedableRng};
use rand_chacha_03::ChaCha8Rng;

use crate::job_workload::{self, JobPlan};
use crate::scenarios::CsiPlan;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
const CLAIM_ATTEMPTS: u32 = 12;
const ACTIVE_MAX: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Claiming,
    Claimed,
    Releasing,
    Done,
}

#[derive(Clone, Debug)]
struct AllocModel {
    client: usize,
    volume: String,
    access: AccessMode,
    write: bool,
    phase: Phase,
}

#[derive(Default)]
struct Model {
    allocs: BTreeMap<String, AllocModel>,
    next_alloc: u64,
}

pub struct CsiWorkload {
    plan: CsiPlan,
    model: Arc<Mutex<Model>>,
    rng: ChaCha8Rng,
    next_tick: tokio::time::Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Per client: whether it still heartbeats (a dead client's node is left to time out).
    heartbeating: Vec<Arc<std::sync::atomic::AtomicBool>>,
    start: tokio::time::Instant,
    /// The live servers, refreshed on every tick (heartbeats and job clients use them).
    gateways: Arc<Mutex<Vec<Gateway>>>,
    /// With a job plan: the clients' shared view, and the job's next version.
    jobs: Option<Arc<job_workload::Shared>>,
    job_version: u64,
}

fn plugin_info(client: &str, controller: bool) -> CsiInfo {
    CsiInfo {
        plugin_id: "p".into(),
        alloc_id: format!("plugin-{client}"),
        healthy: true,
        health_description: "healthy".into(),
        provider: "sim.csi.drover".into(),
        provider_version: "1.0".into(),
        requires_controller_plugin: true,
        controller_info: controller.then(|| CsiControllerInfo {
            supports_attach_detach: true,
            ..CsiControllerInfo::default()
        }),
        node_info: (!controller).then(|| CsiNodeInfo {
            id: client.to_string(),
            max_volumes: 100,
            ..CsiNodeInfo::default()
        }),
        ..CsiInfo::default()
    }
}

/// Retries a request through the gateways until it is done or refused for good.
async fn request(gateways: &[Gateway], rng_pick: usize, request: ServerRequest, attempts: u32) -> ServerReply {
    let mut reply = ServerReply::Error(drover_core::rpc::RpcError::unavailable("no live server"));
    for attempt in 0..attempts {
        if gateways.is_empty() {
            break;
        }
        let gateway = &gateways[(rng_pick + attempt as usize) % gateways.len()];
        reply = gateway.request(request.clone(), REQUEST_TIMEOUT).await;
        match &reply {
            ServerReply::Error(error) if error.retryable => tokio::time::sleep(Duration::from_millis(500)).await,
            _ => return reply,
        }
    }
    reply
}

fn claim(alloc: &str, model: &AllocModel, state: ClaimState) -> CsiVolumeClaim {
    CsiVolumeClaim {
        allocation_id: alloc.to_string(),
        node_id: format!("c{}", model.client + 1),
        external_node_id: String::new(),
        mode: if model.write { ClaimMode::Write } else { ClaimMode::Read },
        access_mode: model.access,
        attachment_mode: AttachmentMode::FileSystem,
        state,
    }
}

impl CsiWorkload {
    pub fn new(plan: CsiPlan, seed: u64, start: tokio::time::Instant) -> Self {
        CsiWorkload {
            plan,
            model: Arc::new(Mutex::new(Model::default())),
            rng: ChaCha8Rng::seed_from_u64(seed.rotate_left(29)),
            next_tick: start,
            tasks: Vec::new(),
            heartbeating: Vec::new(),
            start,
            gateways: Arc::new(Mutex::new(Vec::new())),
            jobs: None,
            job_version: 0,
        }
    }

    /// Refreshes the live servers the heartbeats and job clients go through.
    pub fn refresh(&self, cluster: &SimCluster) {
        *self.gateways.lock().expect("gateways lock") = cluster.gateways();
    }

    /// Registers the client nodes (with a healthy monolith plugin; the late ones wait for
    /// `join_late_clients`) and the volumes.
    pub async fn setup(&mut self, cluster: &SimCluster) -> Result<(), String> {
        self.refresh(cluster);
        let gateways = cluster.gateways();
        for client in 0..cluster.client_count() - self.plan.late_clients {
            self.register_client(cluster, client).await?;
        }
        let volumes: Vec<CsiVolume> = self
            .plan
            .volumes
            .iter()
            .map(|(id, access)| CsiVolume {
                id: id.clone(),
                namespace: "default".into(),
                name: id.clone(),
                plugin_id: "p".into(),
                requested_capabilities: vec![CsiCapability {
                    access_mode: *access,
                    attachment_mode: AttachmentMode::FileSystem,
                }],
                secrets: [("token".to_string(), "sim-secret".to_string())].into(),
                ..CsiVolume::default()
            })
            .collect();
        if volumes.is_empty() {
            return Ok(());
        }
        expect_done(
            request(&gateways, 0, ServerRequest::VolumeRegister { volumes }, 20).await,
            "register volumes",
        )
    }

    /// The clients held back by the plan register now (a node joining late).
    pub async fn join_late_clients(&mut self, cluster: &SimCluster) {
        self.refresh(cluster);
        for client in cluster.client_count() - self.plan.late_clients..cluster.client_count() {
            cluster
                .recorder()
                .note(format!("{} joins late", cluster.client_name(client)));
            if let Err(error) = self.register_client(cluster, client).await {
                cluster.recorder().note(format!("late client: {error}"));
            }
        }
    }

    /// Registers one client node, starts its heartbeats (and, with a job plan, its alloc sync).
    async fn register_client(&mut self, cluster: &SimCluster, client: usize) -> Result<(), String> {
        let gateways = cluster.gateways();
        {
            let name = cluster.client_name(client).to_string();
            let node = Node {
                id: name.clone(),
                name: name.clone(),
                datacenter: "dc1".into(),
                rpc_addr: cluster.client_rpc_addr(client),
                status: NodeStatus::Ready,
                csi_controller_plugins: [("p".to_string(), plugin_info(&name, true))].into(),
                csi_node_plugins: [("p".to_string(), plugin_info(&name, false))].into(),
                drivers: [(
                    "mock".to_string(),
                    drover_core::structs::DriverInfo {
                        detected: true,
                        healthy: true,
                        health_description: "Healthy".into(),
                        ..Default::default()
                    },
                )]
                .into(),
                resources: drover_core::structs::NodeResources {
                    cpu: 4_000,
                    memory_mb: 8_192,
                },
                ..Node::default()
            };
            let reply = request(
                &gateways,
                client,
                ServerRequest::NodeRegister { node: Box::new(node) },
                20,
            )
            .await;
            let ServerReply::Heartbeat { heartbeat_ttl_ms, .. } = reply else {
                return Err(format!("register node: {reply:?}"));
            };
            let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
            if self.heartbeating.len() <= client {
                self.heartbeating.resize_with(client + 1, Default::default);
            }
            self.heartbeating[client] = alive.clone();
            tokio::spawn(heartbeat(
                self.gateways.clone(),
                client,
                name.clone(),
                Duration::from_millis(heartbeat_ttl_ms),
                alive.clone(),
            ));
            if self.plan.jobs.is_some() {
                let (recorder, gateways) = (cluster.recorder().clone(), self.gateways.clone());
                let shared = self
                    .jobs
                    .get_or_insert_with(|| job_workload::Shared::new(recorder, gateways))
                    .clone();
                tokio::spawn(job_workload::client_node(shared, client, name, alive));
            }
        }
        Ok(())
    }

    /// Runs the workload until `until`, one operation per tick.
    pub async fn drive(&mut self, cluster: &SimCluster, until: tokio::time::Instant) {
        loop {
            if self.next_tick > until {
                tokio::time::sleep_until(until).await;
                return;
            }
            tokio::time::sleep_until(self.next_tick).await;
            self.next_tick += Duration::from_millis(self.rng.gen_range(200..800));
            self.refresh(cluster);
            if self.jobs.is_some() {
                self.job_tick(cluster);
            } else {
                self.tick(cluster);
            }
        }
    }

    /// Registers the job's first version (job plans only).
    pub async fn register_job(&mut self, cluster: &SimCluster) -> Result<(), String> {
        let (Some(plan), Some(shared)) = (&self.plan.jobs, &self.jobs) else {
            return Ok(());
        };
        self.refresh(cluster);
        let mut jobs = vec![job_workload::job(plan, 0)];
        if plan.system {
            jobs.push(job_workload::system_job(plan.plugin));
        }
        for job in jobs {
            match shared
                .request(0, ServerRequest::JobRegister { job: Box::new(job) }, 20)
                .await
            {
                ServerReply::JobRegistered { .. } => {}
                other => return Err(format!("register job: {other:?}")),
            }
        }
        Ok(())
    }

    /// Job plans: keep the clients' server list fresh and register each scheduled version.
    fn job_tick(&mut self, cluster: &SimCluster) {
        let (Some(plan), Some(shared)) = (self.plan.jobs.clone(), self.jobs.clone()) else {
            return;
        };
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.start);
        let due = plan.updates.iter().filter(|at| **at <= elapsed).count() as u64;
        if due > self.job_version {
            self.job_version = due;
            let job = job_workload::job(&plan, due);
            let recorder = cluster.recorder().clone();
            self.tasks.push(tokio::spawn(async move {
                let reply = shared
                    .request(0, ServerRequest::JobRegister { job: Box::new(job) }, 20)
                    .await;
                recorder.note(format!("job update {due}: {reply:?}"));
            }));
        }
    }

    /// The job plan's clients' shared view (for the end checks).
    pub fn job_shared(&self) -> Option<(&JobPlan, &Arc<job_workload::Shared>)> {
        Some((self.plan.jobs.as_ref()?, self.jobs.as_ref()?))
    }

    /// The node running the job's live allocation is drained (job plans), through a live
    /// server as an operator would: no deadline, system jobs included.
    pub fn drain_job_node(&mut self, cluster: &SimCluster) {
        let Some(node_id) = self.job_node(cluster) else {
            cluster.recorder().note("no running allocation to drain a node under");
            return;
        };
        let Some(shared) = self.jobs.clone() else {
            return;
        };
        cluster.recorder().note(format!("draining {node_id}"));
        let recorder = cluster.recorder().clone();
        let request = ServerRequest::NodeUpdateDrain {
            node_id,
            strategy: Some(drover_core::structs::DrainStrategy::default()),
            mark_eligible: false,
        };
        self.tasks.push(tokio::spawn(async move {
            // Retried through whichever servers are live (a leader may be down).
            let reply = shared.request(0, request, 40).await;
            recorder.note(format!("drain set: {reply:?}"));
        }));
    }

    /// The node of the job's running allocation, as a live server sees it.
    fn job_node(&self, cluster: &SimCluster) -> Option<String> {
        cluster.gateways().iter().find_map(|gateway| {
            gateway
                .read_state(|state| {
                    state
                        .allocs()
                        .find(|alloc| {
                            alloc.job_id == job_workload::JOB_ID
                                && !alloc.terminal()
                                && alloc.client_status == ClientStatus::Running
                        })
                        .map(|alloc| alloc.node_id.clone())
                })
                .flatten()
        })
    }

    /// The client running the job's live allocation dies (job plans).
    pub fn lose_job_node(&mut self, cluster: &mut SimCluster) {
        let running = self.job_node(cluster);
        match running.and_then(|node| (0..cluster.client_count()).find(|index| cluster.client_name(*index) == node)) {
            Some(client) => self.node_down(cluster, client),
            None => cluster.recorder().note("no running allocation to lose a node under"),
        }
    }

    fn tick(&mut self, cluster: &SimCluster) {
        let gateways = cluster.gateways();
        let pick = self.rng.r#gen::<u16>() as usize;
        let (active, claimed): (usize, Vec<String>) = {
            let model = self.model.lock().expect("model lock");
            let active = model.allocs.values().filter(|alloc| alloc.phase != Phase::Done).count();
            let claimed = model
                .allocs
                .iter()
                .filter(|(_, alloc)| alloc.phase == Phase::Claimed)
                .map(|(id, _)| id.clone())
                .collect();
            (active, claimed)
        };
        let roll = self.rng.gen_range(0..100);
        if self.plan.deregister_attempts && roll < 10 && !claimed.is_empty() {
            let alloc = claimed[pick % claimed.len()].clone();
            let volume = self.model.lock().expect("model lock").allocs[&alloc].volume.clone();
            let recorder = cluster.recorder().clone();
            self.tasks.push(tokio::spawn(async move {
                let reply = request(
                    &gateways,
                    pick,
                    ServerRequest::VolumeDeregister {
                        namespace: "default".into(),
                        volume_ids: vec![volume.clone()],
                        force: false,
                    },
                    3,
                )
                .await;
                match reply {
                    ServerReply::Error(error) if error.message.contains("volume in use") => {
                        recorder.note(format!("deregister {volume} refused: volume in use"));
                    }
                    ServerReply::Error(_) => {}
                    other => recorder.violate(
                        "a claimed volume cannot be deregistered",
                        format!("deregister of {volume} claimed by {alloc} returned {other:?}"),
                    ),
                }
            }));
        } else if roll < 55 && active < ACTIVE_MAX {
            let starts = if self.plan.bursts { 3 } else { 1 };
            let volume_index = self.rng.gen_range(0..self.plan.volumes.len());
            for _ in 0..starts {
                let live: Vec<usize> = (0..cluster.client_count())
                    .filter(|c| cluster.client_alive(*c))
                    .collect();
                if live.is_empty() {
                    return;
                }
                let client = live[self.rng.gen_range(0..live.len())];
                let (volume, access) = self.plan.volumes[volume_index].clone();
                let write = access.is_writer() && self.rng.gen_bool(0.7);
                self.start_alloc(cluster, gateways.clone(), pick, client, volume, access, write);
            }
        } else if !claimed.is_empty() {
            let alloc = claimed[pick % claimed.len()].clone();
            let client_driven = self.rng.gen_bool(0.5);
            self.finish_alloc(gateways, pick, alloc, client_driven);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_alloc(
        &mut self,
        cluster: &SimCluster,
        gateways: Vec<Gateway>,
        pick: usize,
        client: usize,
        volume: String,
        access: AccessMode,
        write: bool,
    ) {
        let alloc_id = {
            let mut model = self.model.lock().expect("model lock");
            model.next_alloc += 1;
            let id = format!("alloc-{}", model.next_alloc);
            model.allocs.insert(
                id.clone(),
                AllocModel {
                    client,
                    volume: volume.clone(),
                    access,
                    write,
                    phase: Phase::Claiming,
                },
            );
            id
        };
        let model = self.model.clone();
        let recorder = cluster.recorder().clone();
        let client_name = cluster.client_name(client).to_string();
        self.tasks.push(tokio::spawn(async move {
            let alloc = Allocation {
                id: alloc_id.clone(),
                namespace: "default".into(),
                name: format!("app.web[{alloc_id}]"),
                node_id: client_name.clone(),
                job_id: "app".into(),
                task_group: "web".into(),
                ..Allocation::default()
            };
            let placed = request(&gateways, pick, ServerRequest::AllocUpsert { allocs: vec![alloc] }, 10).await;
            let snapshot = model.lock().expect("model lock").allocs[&alloc_id].clone();
            if !matches!(placed, ServerReply::Done { .. }) || snapshot.phase != Phase::Claiming {
                mark(&model, &alloc_id, Phase::Done);
                return;
            }
            for attempt in 0..CLAIM_ATTEMPTS {
                if model.lock().expect("model lock").allocs[&alloc_id].phase != Phase::Claiming {
                    return;
                }
                let request_claim = ServerRequest::VolumeClaim {
                    namespace: "default".into(),
                    volume_id: snapshot.volume.clone(),
                    claim: claim(&alloc_id, &snapshot, ClaimState::Taken),
                };
                match request(&gateways, pick + attempt as usize, request_claim, 2).await {
                    ServerReply::Claimed { .. } => {
                        let mut guard = model.lock().expect("model lock");
                        let entry = guard.allocs.get_mut(&alloc_id).expect("alloc");
                        if entry.phase == Phase::Claiming {
                            entry.phase = Phase::Claimed;
                            drop(guard);
                            recorder.record_plugin(
                                &client_name,
                                PluginEvent::NodePublished {
                                    volume: snapshot.volume.clone(),
                                    alloc: alloc_id.clone(),
                                },
                            );
                        }
                        return;
                    }
                    // "volume max claims reached", unschedulable, no leader: the client retries.
                    _ => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            // Gave up: the allocation fails; the watcher releases anything that was claimed.
            mark(&model, &alloc_id, Phase::Releasing);
            let update = ServerRequest::AllocClientUpdate {
                alloc_id: alloc_id.clone(),
                client_status: ClientStatus::Failed,
            };
            if matches!(request(&gateways, pick, update, 10).await, ServerReply::Done { .. }) {
                mark(&model, &alloc_id, Phase::Done);
            }
        }));
    }

    fn finish_alloc(&mut self, gateways: Vec<Gateway>, pick: usize, alloc_id: String, client_driven: bool) {
        let snapshot = {
            let mut model = self.model.lock().expect("model lock");
            let entry = model.allocs.get_mut(&alloc_id).expect("alloc");
            entry.phase = Phase::Releasing;
            entry.clone()
        };
        let model = self.model.clone();
        self.tasks.push(tokio::spawn(async move {
            if client_driven {
                let unpublish = ServerRequest::VolumeUnpublish {
                    namespace: "default".into(),
                    volume_id: snapshot.volume.clone(),
                    claim: claim(&alloc_id, &snapshot, ClaimState::Unpublishing),
                };
                let _ = request(&gateways, pick, unpublish, 2).await;
            }
            let update = ServerRequest::AllocClientUpdate {
                alloc_id: alloc_id.clone(),
                client_status: ClientStatus::Complete,
            };
            if matches!(request(&gateways, pick, update, 10).await, ServerReply::Done { .. }) {
                mark(&model, &alloc_id, Phase::Done);
            }
        }));
    }

    /// A client died: it stops heartbeating, the leader marks its node down when the TTL
    /// runs out, and its allocations are then reported lost.
    pub fn node_down(&mut self, cluster: &mut SimCluster, client: usize) {
        cluster.kill_client(client);
        self.heartbeating[client].store(false, std::sync::atomic::Ordering::SeqCst);
        let gateways = cluster.gateways();
        let name = cluster.client_name(client).to_string();
        let lost: Vec<String> = {
            let mut model = self.model.lock().expect("model lock");
            model
                .allocs
                .iter_mut()
                .filter(|(_, alloc)| alloc.client == client && alloc.phase != Phase::Done)
                .map(|(id, alloc)| {
                    alloc.phase = Phase::Releasing;
                    id.clone()
                })
                .collect()
        };
        let model = self.model.clone();
        self.tasks.push(tokio::spawn(async move {
            // Wait (bounded) for a server to see the node down; the leader's heartbeat timer
            // is the only thing that marks it.
            for _ in 0..240 {
                let down = gateways.iter().any(|gateway| {
                    gateway
                        .read_state(|state| state.node(&name).is_some_and(|node| node.status == NodeStatus::Down))
                        .unwrap_or(false)
                });
                if down {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            for alloc_id in lost {
                let update = ServerRequest::AllocClientUpdate {
                    alloc_id: alloc_id.clone(),
                    client_status: ClientStatus::Lost,
                };
                if matches!(request(&gateways, 0, update, 20).await, ServerReply::Done { .. }) {
                    mark(&model, &alloc_id, Phase::Done);
                }
            }
        }));
    }

    /// The quiet phase: no new work; every unfinished allocation finishes. Returns when all
    /// workload tasks have ended.
    pub async fn wind_down(&mut self, cluster: &SimCluster) {
        self.refresh(cluster);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        let gateways = cluster.gateways();
        let unfinished: Vec<String> = {
            let model = self.model.lock().expect("model lock");
            model
                .allocs
                .iter()
                .filter(|(_, alloc)| alloc.phase != Phase::Done)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for alloc_id in unfinished {
            let update = ServerRequest::AllocClientUpdate {
                alloc_id: alloc_id.clone(),
                client_status: ClientStatus::Complete,
            };
            let reply = request(&gateways, 0, update, 40).await;
            if matches!(reply, ServerReply::Done { .. })
                || matches!(&reply, ServerReply::Error(e) if e.message.starts_with("Unknown allocation"))
            {
                mark(&self.model, &alloc_id, Phase::Done);
            }
        }
    }

    pub fn allocs(&self) -> usize {
        self.model.lock().expect("model lock").allocs.len()
    }
}

fn mark(model: &Arc<Mutex<Model>>, alloc: &str, phase: Phase) {
    if let Some(entry) = model.lock().expect("model lock").allocs.get_mut(alloc) {
        entry.phase = phase;
    }
}

/// A live client's heartbeats (`Node.UpdateStatus`) at the TTL the servers hand back, until
/// the client dies.
async fn heartbeat(
    gateways: Arc<Mutex<Vec<Gateway>>>,
    client: usize,
    node_id: String,
    mut ttl: Duration,
    alive: Arc<std::sync::atomic::AtomicBool>,
) {
    loop {
        tokio::time::sleep(ttl).await;
        if !alive.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let status = ServerRequest::NodeUpdateStatus {
            node_id: node_id.clone(),
            status: NodeStatus::Ready,
        };
        let live = gateways.lock().expect("gateways lock").clone();
        ttl = match request(&live, client, status, 3).await {
            ServerReply::Heartbeat { heartbeat_ttl_ms, .. } if heartbeat_ttl_ms > 0 => {
                Duration::from_millis(heartbeat_ttl_ms)
            }
            _ => Duration::from_secs(1),
        };
    }
}

fn expect_done(reply: ServerReply, what: &str) -> Result<(), String> {
    match reply {
        ServerReply::Done { .. } => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    }
}

/// Deregisters every volume once the quiet phase has released all claims (must succeed).
pub async fn deregister_all(cluster: &SimCluster, plan: &CsiPlan, recorder: &Recorder) {
    let gateways = cluster.gateways();
    for (volume, _) in &plan.volumes {
        let reply = request(
            &gateways,
            0,
            ServerRequest::VolumeDeregister {
                namespace: "default".into(),
                volume_ids: vec![volume.clone()],
                force: false,
            },
            20,
        )
        .await;
        if !matches!(reply, ServerReply::Done { .. }) {
            recorder.violate(
                "a released volume can be deregistered",
                format!("deregister of {volume} after every claim was released: {reply:?}"),
            );
        }
    }
}
