//! Jobs placed by the scheduler on simulated client nodes.
//!
//! One service job uses a CSI volume. Each client node runs the client's side of the story
//! against the real servers: a blocking alloc sync (`Node.GetClientAllocs` through a random
//! live server, a reply used only when its index moved on), and per allocation: wait for the
//! allocation it replaces to finish (locally, or as the servers say for other nodes), claim the
//! volume (retried while it is held), report `running`, and when the servers stop it, release
//! the claim and report `complete`. A killed client does nothing more; its node is left to the
//! leader's heartbeat timer. New job versions are registered at scheduled times (destructive
//! updates), so a replacement has to take the volume over from the allocation it replaces —
//! Nomad #8609, where the replacement's first placement failed for good.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::rpc::{NodeAllocsRequest, ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiPluginType, CsiVolumeClaim,
    DesiredStatus, Job, JobType, Task, TaskCsiPluginConfig, TaskGroup, TaskResources, VolumeRequest, VolumeType,
};
use drover_io_sim::cluster::{Gateway, retry_request};
use drover_io_sim::trace::Recorder;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
const SYNC_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(250);

pub const JOB_ID: &str = "app";
/// The system job of plans with `system`: one allocation on every ready node.
pub const SYSTEM_JOB_ID: &str = "node-agent";

/// The job and its updates.
#[derive(Clone, Debug)]
pub struct JobPlan {
    pub count: u32,
    /// The CSI volume every allocation claims ("" for none).
    pub volume: String,
    pub access: AccessMode,
    /// When a new version is registered (each one a destructive update).
    pub updates: Vec<Duration>,
    /// Also run a system job (no volumes) that must reach every eligible node, late ones
    /// included.
    pub system: bool,
    /// The system job runs the volume's node plugin (a `csi_plugin` task): a drain must stop
    /// it last.
    pub plugin: bool,
}

#[derive(Default)]
struct NodeView {
    /// The latest copy of each allocation the servers placed here.
    allocs: BTreeMap<String, Allocation>,
    /// Allocations known finished: ours that ended, and others the servers say finished.
    finished: BTreeSet<String>,
    started: BTreeSet<String>,
}

/// What the client tasks share.
pub struct Shared {
    /// The live servers, refreshed by the workload's driver as servers die and come back.
    pub gateways: Arc<Mutex<Vec<Gateway>>>,
    recorder: Recorder,
    nodes: Mutex<BTreeMap<String, NodeView>>,
}

impl Shared {
    pub fn new(recorder: Recorder, gateways: Arc<Mutex<Vec<Gateway>>>) -> Arc<Self> {
        Arc::new(Shared {
            gateways,
            recorder,
            nodes: Mutex::new(BTreeMap::new()),
        })
    }

    fn gateways(&self) -> Vec<Gateway> {
        self.gateways.lock().expect("gateways lock").clone()
    }

    /// Retries a request through the live servers until it is done or refused for good.
    pub async fn request(&self, pick: usize, request: ServerRequest, attempts: u32) -> ServerReply {
        retry_request(|| self.gateways(), pick, request, attempts, REQUEST_TIMEOUT).await
    }

    fn desired(&self, node: &str, alloc: &str) -> Option<Allocation> {
        self.nodes
            .lock()
            .expect("nodes lock")
            .get(node)?
            .allocs
            .get(alloc)
            .cloned()
    }

    fn finished(&self, node: &str, alloc: &str) -> bool {
        self.nodes
            .lock()
            .expect("nodes lock")
            .get(node)
            .is_some_and(|view| view.finished.contains(alloc))
    }

    fn finish(&self, node: &str, alloc: &str) {
        if let Some(view) = self.nodes.lock().expect("nodes lock").get_mut(node) {
            view.finished.insert(alloc.to_string());
        }
    }
}

/// The job as registered: version `version` differs from the last in its env, so every
/// update replaces the allocations.
pub fn job(plan: &JobPlan, version: u64) -> Job {
    Job {
        id: JOB_ID.into(),
        name: JOB_ID.into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: plan.count,
            volumes: BTreeMap::from_iter((!plan.volume.is_empty()).then(|| {
                (
                    "data".to_string(),
                    VolumeRequest {
                        name: "data".into(),
                        volume_type: VolumeType::Csi,
                        source: plan.volume.clone(),
                        read_only: false,
                        access_mode: plan.access,
                        attachment_mode: AttachmentMode::FileSystem,
                        mount_options: None,
                        per_alloc: false,
                    },
                )
            })),
            tasks: vec![Task {
                name: "server".into(),
                driver: "mock".into(),
                env: BTreeMap::from([("VERSION".to_string(), version.to_string())]),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    devices: Vec::new(),
                },
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// The system job: a tiny task on every node; with `plugin`, the node half of the volume's
/// CSI plugin, as Nomad recommends running node plugins.
pub fn system_job(plugin: bool) -> Job {
    Job {
        id: SYSTEM_JOB_ID.into(),
        name: SYSTEM_JOB_ID.into(),
        namespace: "default".into(),
        job_type: JobType::System,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "agent".into(),
            count: 1,
            tasks: vec![Task {
                name: "agent".into(),
                driver: "mock".into(),
                resources: TaskResources {
                    cpu: 50,
                    memory_mb: 32,
                    devices: Vec::new(),
                },
                csi_plugin: plugin.then(|| TaskCsiPluginConfig {
                    id: "p".into(),
                    plugin_type: CsiPluginType::Node,
                    mount_dir: "/csi".into(),
                    stage_publish_base_dir: "/local/csi".into(),
                    health_timeout: Duration::from_secs(30),
                }),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// One client node's alloc sync, until the node dies.
pub async fn client_node(shared: Arc<Shared>, pick: usize, node_id: String, alive: Arc<AtomicBool>) {
    shared
        .nodes
        .lock()
        .expect("nodes lock")
        .insert(node_id.clone(), NodeView::default());
    let mut index = 0u64;
    let mut attempt = pick;
    loop {
        if !alive.load(Ordering::SeqCst) {
            return;
        }
        let gateways = shared.gateways();
        if gateways.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let gateway = gateways[attempt % gateways.len()].clone();
        let request = NodeAllocsRequest {
            node_id: node_id.clone(),
            min_index: index,
            max_wait_ms: SYNC_WAIT.as_millis() as u64,
        };
        let reply = match gateway.node_allocs(request, SYNC_WAIT + Duration::from_secs(5)).await {
            Ok(reply) => reply,
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if reply.index <= index || !alive.load(Ordering::SeqCst) {
            continue;
        }
        index = reply.index;
        let mut start = Vec::new();
        {
            let mut nodes = shared.nodes.lock().expect("nodes lock");
            let view = nodes.entry(node_id.clone()).or_default();
            view.finished.extend(reply.finished_elsewhere.iter().cloned());
            for (alloc, job) in reply.allocs {
                if alloc.job_id != JOB_ID && alloc.job_id != SYSTEM_JOB_ID {
                    continue;
                }
                if !alloc.terminal() && view.started.insert(alloc.id.clone()) {
                    start.push((alloc.clone(), job));
                }
                view.allocs.insert(alloc.id.clone(), alloc);
            }
        }
        for (alloc, job) in start {
            tokio::spawn(run_alloc(
                shared.clone(),
                pick,
                node_id.clone(),
                alloc,
                job,
                alive.clone(),
            ));
        }
    }
}

/// One allocation's life on a simulated client.
async fn run_alloc(
    shared: Arc<Shared>,
    pick: usize,
    node: String,
    alloc: Allocation,
    job: Job,
    alive: Arc<AtomicBool>,
) {
    let id = alloc.id.clone();
    let live = || alive.load(Ordering::SeqCst);
    let stopped = |shared: &Shared| {
        shared
            .desired(&node, &id)
            .is_none_or(|alloc| alloc.desired_status != DesiredStatus::Run)
    };
    // await_previous_allocations.
    if let Some(previous) = &alloc.previous_allocation {
        while !shared.finished(&node, previous) {
            if !live() {
                return;
            }
            if stopped(&shared) {
                report(&shared, pick, &node, &id, ClientStatus::Complete, &alive).await;
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }
    // csi_hook: claim every volume, retried while it is held elsewhere.
    let requests: Vec<VolumeRequest> = job
        .task_groups
        .iter()
        .find(|group| group.name == alloc.task_group)
        .map(|group| group.volumes.values().cloned().collect())
        .unwrap_or_default();
    let claim = |request: &VolumeRequest, state: ClaimState| CsiVolumeClaim {
        allocation_id: id.clone(),
        node_id: node.clone(),
        external_node_id: String::new(),
        mode: if request.read_only {
            ClaimMode::Read
        } else {
            ClaimMode::Write
        },
        access_mode: request.access_mode,
        attachment_mode: request.attachment_mode,
        state,
    };
    let mut claimed = Vec::new();
    for request in &requests {
        loop {
            if !live() {
                return;
            }
            if stopped(&shared) {
                release(&shared, pick, &claimed, &claim).await;
                report(&shared, pick, &node, &id, ClientStatus::Complete, &alive).await;
                return;
            }
            let reply = shared
                .request(
                    pick,
                    ServerRequest::VolumeClaim {
                        namespace: alloc.namespace.clone(),
                        volume_id: request.source.clone(),
                        claim: claim(request, ClaimState::Taken),
                    },
                    3,
                )
                .await;
            match reply {
                ServerReply::Claimed { .. } | ServerReply::Done { .. } => break,
                ServerReply::Error(error) => {
                    shared.recorder.note(format!(
                        "{node}: claim of {} for {id} refused: {}",
                        request.source, error.message
                    ));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                _ => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
        claimed.push(request.clone());
    }
    shared.recorder.note(format!("{node}: {id} runs"));
    report(&shared, pick, &node, &id, ClientStatus::Running, &alive).await;
    while !stopped(&shared) {
        if !live() {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    // postrun: unmount and ask the servers to release; the allocation is complete. Clients
    // differ in order: a status update can race ahead of postrun, and a release that fails
    // is left to the leader's volume watcher — so the servers see finished allocations whose
    // claims are still held (what a drain must wait out before stopping the node plugin).
    match id.bytes().map(u32::from).sum::<u32>() % 3 {
        0 => {
            release(&shared, pick, &claimed, &claim).await;
            report(&shared, pick, &node, &id, ClientStatus::Complete, &alive).await;
        }
        1 => {
            report(&shared, pick, &node, &id, ClientStatus::Complete, &alive).await;
            release(&shared, pick, &claimed, &claim).await;
        }
        _ => {
            shared
                .recorder
                .note(format!("{node}: {id} leaves its release to the servers"));
            report(&shared, pick, &node, &id, ClientStatus::Complete, &alive).await;
        }
    }
}

async fn release(
    shared: &Shared,
    pick: usize,
    claimed: &[VolumeRequest],
    claim: &impl Fn(&VolumeRequest, ClaimState) -> CsiVolumeClaim,
) {
    for request in claimed {
        // Best effort, as Nomad's client: the leader's volume watcher finishes the job.
        let _ = shared
            .request(
                pick,
                ServerRequest::VolumeUnpublish {
                    namespace: "default".into(),
                    volume_id: request.source.clone(),
                    claim: claim(request, ClaimState::Unpublishing),
                },
                3,
            )
            .await;
    }
}

async fn report(shared: &Shared, pick: usize, node: &str, id: &str, status: ClientStatus, alive: &AtomicBool) {
    loop {
        if !alive.load(Ordering::SeqCst) {
            return;
        }
        let reply = shared
            .request(
                pick,
                ServerRequest::AllocClientUpdate {
                    alloc_id: id.to_string(),
                    client_status: status,
                },
                3,
            )
            .await;
        match reply {
            ServerReply::Error(error) if error.retryable => tokio::time::sleep(Duration::from_secs(1)).await,
            _ => break,
        }
    }
    if status.is_terminal() {
        shared.finish(node, id);
    }
}
