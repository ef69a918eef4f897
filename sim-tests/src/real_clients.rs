//! Scenarios whose client nodes run the production client driver (`drover_io_real::client`,
//! the core `Client` machine included) on simulated hosts: no hand-written client logic. The
//! clients register, heartbeat and sync allocations themselves, start and stop tasks on their
//! hosts, survive agent kills (tasks keep running on the host and are recovered), and must
//! leave nothing behind once the job stops.
//!
//! The end checks read only the leader's state and the hosts' process tables, so they are
//! independent of the client code they judge.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use drover_core::client::services::TASK_SERVICE_PREFIX;
use drover_core::fsm::ServerState;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClientStatus, ConfigValue, CsiCapability, CsiPluginType, CsiVolume,
    DesiredStatus, Job, JobType, RestartMode, RestartPolicy, Service, Task, TaskCsiPluginConfig, TaskGroup,
    TaskResources, VolumeMount, VolumeRequest, VolumeType,
};
use drover_io_sim::cluster::{SimCluster, retry_request};
use drover_io_sim::trace::Recorder;

pub const JOB_ID: &str = "web";
/// The CSI plugin, run as a system job on every client (a monolith: controller and node).
pub const PLUGIN_JOB_ID: &str = "csi-plugin";
pub const PLUGIN_ID: &str = "p";
pub const VOLUME_ID: &str = "vol0";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(250);

/// The job the real clients run.
#[derive(Clone, Debug)]
pub struct RealClientPlan {
    pub clients: usize,
    pub count: u32,
    /// Every task exits (successfully) after this long and is restarted by its restart policy
    /// (`None`: tasks run until stopped).
    pub run_for: Option<Duration>,
    /// Every allocation mounts one CSI volume through the plugin job.
    pub volume: bool,
    /// The volume's access mode (a single writer makes every update hand the volume over
    /// from the allocation it replaces: Nomad #8609).
    pub access: AccessMode,
}

/// The plugin job: one monolith CSI plugin task per client node.
pub fn plugin_job() -> Job {
    Job {
        id: PLUGIN_JOB_ID.into(),
        name: PLUGIN_JOB_ID.into(),
        namespace: "default".into(),
        job_type: JobType::System,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "plugin".into(),
            count: 1,
            tasks: vec![Task {
                name: "plugin".into(),
                driver: "raw_exec".into(),
                resources: TaskResources {
                    cpu: 50,
                    memory_mb: 32,
                    devices: Vec::new(),
                },
                csi_plugin: Some(TaskCsiPluginConfig {
                    id: PLUGIN_ID.into(),
                    plugin_type: CsiPluginType::Monolith,
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

pub fn volume(access: AccessMode) -> CsiVolume {
    CsiVolume {
        id: VOLUME_ID.into(),
        namespace: "default".into(),
        name: VOLUME_ID.into(),
        plugin_id: PLUGIN_ID.into(),
        requested_capabilities: vec![CsiCapability {
            access_mode: access,
            attachment_mode: AttachmentMode::FileSystem,
        }],
        ..CsiVolume::default()
    }
}

/// Version `version` of the job: each version is a destructive update (its env changes).
pub fn job(plan: &RealClientPlan, version: u64) -> Job {
    let mut config = BTreeMap::new();
    if let Some(run_for) = plan.run_for {
        config.insert(
            "run_for".to_string(),
            ConfigValue::String(format!("{}ms", run_for.as_millis())),
        );
    }
    let volumes = plan.volume.then(|| {
        (
            "data".to_string(),
            VolumeRequest {
                name: "data".into(),
                volume_type: VolumeType::Csi,
                source: VOLUME_ID.into(),
                read_only: false,
                access_mode: plan.access,
                attachment_mode: AttachmentMode::FileSystem,
                mount_options: None,
                per_alloc: false,
            },
        )
    });
    let volume_mounts = plan
        .volume
        .then(|| VolumeMount {
            volume: "data".into(),
            destination: "/data".into(),
            read_only: false,
            propagation_mode: Default::default(),
        })
        .into_iter()
        .collect();
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
            volumes: volumes.into_iter().collect(),
            tasks: vec![Task {
                name: "server".into(),
                // raw_exec cannot bind a volume into its task (Nomad #8030): `exec` can.
                driver: if plan.volume { "exec" } else { "raw_exec" }.into(),
                config,
                env: BTreeMap::from([("VERSION".to_string(), version.to_string())]),
                volume_mounts,
                services: vec![Service {
                    name: "web".into(),
                    port_label: "8080".into(),
                    address_mode: "driver".into(),
                    ..Service::default()
                }],
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    devices: Vec::new(),
                },
                ..Task::default()
            }],
            // Tasks that exit are restarted for as long as the run lasts: the servers do not
            // reschedule failed allocations yet, so a group failed by its restart policy would
            // stay failed.
            restart_policy: Some(RestartPolicy {
                attempts: 1_000,
                interval: Duration::from_secs(1_800),
                delay: Duration::from_secs(15),
                mode: RestartMode::Fail,
            }),
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// Sends `request` through the live servers until one answers other than "try again".
pub async fn request(cluster: &SimCluster, request: ServerRequest, attempts: u32) -> ServerReply {
    retry_request(|| cluster.gateways(), 0, request, attempts, REQUEST_TIMEOUT).await
}

pub async fn register(cluster: &SimCluster, plan: &RealClientPlan) -> Result<(), String> {
    if plan.volume {
        match request(
            cluster,
            ServerRequest::JobRegister {
                job: Box::new(plugin_job()),
            },
            40,
        )
        .await
        {
            ServerReply::JobRegistered { .. } => {}
            other => return Err(format!("register the plugin job: {other:?}")),
        }
        // The servers refuse a volume of a plugin they have not heard of: register it once the
        // clients have started the plugin and fingerprinted it, as an operator would.
        let mut attempts = 0;
        loop {
            let register = ServerRequest::VolumeRegister {
                volumes: vec![volume(plan.access)],
            };
            match request(cluster, register, 40).await {
                ServerReply::Done { .. } => break,
                ServerReply::Error(error) if error.message.contains("no CSI plugin named") && attempts < 120 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => return Err(format!("register the volume: {other:?}")),
            }
        }
    }
    match request(
        cluster,
        ServerRequest::JobRegister {
            job: Box::new(job(plan, 0)),
        },
        40,
    )
    .await
    {
        ServerReply::JobRegistered { .. } => Ok(()),
        other => Err(format!("register job: {other:?}")),
    }
}

/// Registers version `version` of the job (a destructive update); a failure is noted, not a
/// violation (the servers may be without a leader right then).
pub async fn update(cluster: &SimCluster, plan: &RealClientPlan, version: u64) {
    let reply = request(
        cluster,
        ServerRequest::JobRegister {
            job: Box::new(job(plan, version)),
        },
        10,
    )
    .await;
    cluster.recorder().note(format!(
        "job version {version} registered: {}",
        matches!(reply, ServerReply::JobRegistered { .. })
    ));
}

fn leader_state(cluster: &SimCluster, leader: u64) -> Option<ServerState> {
    (0..cluster.len())
        .filter_map(|index| cluster.agent(index))
        .find(|agent| agent.node_id() == leader)
        .and_then(|agent| agent.read_state(Clone::clone))
}

/// The client index that runs `alloc`, from the node's name.
fn client_of(cluster: &SimCluster, state: &ServerState, alloc: &Allocation) -> Option<usize> {
    let name = &state.node(&alloc.node_id)?.name;
    (0..cluster.client_count()).find(|index| cluster.client_name(*index) == name)
}

/// Whether the job runs as it should: `count` allocations the servers want running, each seen
/// running (`seen` keeps those already seen). `Err` says what is missing.
fn job_running(
    cluster: &SimCluster,
    state: &ServerState,
    plan: &RealClientPlan,
    seen: &mut BTreeSet<String>,
) -> Result<(), String> {
    let version = state.job("default", JOB_ID).map(|job| job.version);
    let wanted: Vec<&Allocation> = state
        .allocs()
        .filter(|alloc| alloc.job_id == JOB_ID && alloc.desired_status == DesiredStatus::Run)
        .filter(|alloc| !alloc.client_terminal())
        .collect();
    if let Some(stale) = wanted.iter().find(|alloc| Some(alloc.job_version) != version) {
        return Err(format!(
            "{} still runs version {} of the job, not {version:?}",
            stale.id, stale.job_version
        ));
    }
    if wanted.len() != plan.count as usize {
        let evals: Vec<String> = state
            .evals()
            .filter(|eval| eval.job_id == JOB_ID)
            .map(|eval| {
                format!(
                    "{} {} {:?} {:?}",
                    eval.triggered_by, eval.status, eval.status_description, eval.failed_tg_allocs
                )
            })
            .collect();
        let allocs: Vec<String> = state
            .allocs()
            .filter(|alloc| alloc.job_id == JOB_ID)
            .map(|alloc| {
                let node = state.node(&alloc.node_id).map_or("?", |node| node.name.as_str());
                format!(
                    "{} on {node} {:?}/{:?} {:?}",
                    &alloc.id[..8],
                    alloc.desired_status,
                    alloc.client_status,
                    alloc.desired_description
                )
            })
            .collect();
        return Err(format!(
            "{} live allocations, want {} (allocations: {}; evaluations: {})",
            wanted.len(),
            plan.count,
            allocs.join(", "),
            evals.join("; ")
        ));
    }
    // Tasks that exit on their own are pending between restarts, so each allocation only has
    // to have been seen running (reported so, its task in its host's process table, its volume
    // mounted, its service in its node's Consul agent) at some moment of the quiet phase, not
    // all at once.
    for alloc in &wanted {
        let Some(client) = client_of(cluster, state, alloc) else {
            continue;
        };
        let host = cluster.host(client);
        let task_runs = host
            .running_tasks()
            .iter()
            .any(|(id, task)| id == &alloc.id && task == "server");
        let mounted = !plan.volume
            || host
                .mounts()
                .iter()
                .any(|mount| mount.contains(&format!("/per-alloc/{}/", alloc.id)));
        let service = format!("{TASK_SERVICE_PREFIX}{}-server-web-8080", alloc.id);
        let registered = cluster
            .consul()
            .task_services()
            .contains(&(cluster.client_name(client).to_string(), service));
        if alloc.client_status == ClientStatus::Running && task_runs && mounted && registered {
            seen.insert(alloc.id.clone());
        }
    }
    match wanted.iter().find(|alloc| !seen.contains(&alloc.id)) {
        Some(alloc) => Err(format!(
            "{} not seen running yet (reported {:?}, on {})",
            alloc.id,
            alloc.client_status,
            client_of(cluster, state, alloc).map_or("an unknown node", |client| cluster.client_name(client))
        )),
        None => Ok(()),
    }
}

/// Tasks on the hosts whose allocation the servers do not want running.
fn strays(cluster: &SimCluster, state: &ServerState) -> Vec<String> {
    let mut out = Vec::new();
    for client in 0..cluster.client_count() {
        for (alloc_id, task) in cluster.host(client).running_tasks() {
            let wanted = state
                .alloc(&alloc_id)
                .is_some_and(|alloc| alloc.desired_status == DesiredStatus::Run && !alloc.client_terminal());
            if !wanted {
                out.push(format!("{alloc_id}/{task} on {}", cluster.client_name(client)));
            }
        }
    }
    out
}

/// Once quiet: the job converges on the real clients with no stray task anywhere, and after
/// `job stop` every task is gone from every host and every allocation is finished.
pub async fn check_end(
    cluster: &SimCluster,
    recorder: &Recorder,
    plan: &RealClientPlan,
    leader: u64,
    deadline: tokio::time::Instant,
) {
    let deadline = deadline.max(tokio::time::Instant::now() + Duration::from_secs(120));
    let mut seen = BTreeSet::new();
    loop {
        let verdict = match leader_state(cluster, leader) {
            Some(state) => job_running(cluster, &state, plan, &mut seen).and_then(|()| {
                let strays = strays(cluster, &state);
                if strays.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "tasks of allocations the servers stopped: {}",
                        strays.join(", ")
                    ))
                }
            }),
            None => Err("the leader's state cannot be read".into()),
        };
        match verdict {
            Ok(()) => break,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                recorder.violate("liveness: the job runs on the real clients", why);
                return;
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
    let starts: u64 = (0..cluster.client_count())
        .map(|client| cluster.host(client).starts())
        .sum();
    recorder.note(format!(
        "the job runs on the real clients ({starts} task starts in all)"
    ));
    let stop = ServerRequest::JobStop {
        namespace: "default".into(),
        job_id: JOB_ID.into(),
        purge: false,
    };
    match request(cluster, stop, 40).await {
        ServerReply::JobRegistered { .. } | ServerReply::Done { .. } => {}
        other => {
            recorder.violate("the job can be stopped", format!("{other:?}"));
            return;
        }
    }
    loop {
        let state = leader_state(cluster, leader);
        let (running, unfinished) = leftovers(cluster, state.as_ref(), plan);
        if running.is_empty() && unfinished.is_empty() {
            let freed = if plan.volume {
                ", every service, mount and claim released"
            } else {
                ", every service deregistered"
            };
            recorder.note(format!(
                "job stopped: no task left on any host, every allocation finished{freed}"
            ));
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            recorder.violate(
                "nothing is left behind after a job stop",
                format!(
                    "still running: [{}]; not finished: [{}]",
                    running.join(", "),
                    unfinished.join(", ")
                ),
            );
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// After a job stop: tasks of the job still running on a host, and what is not finished yet
/// (allocations, task services in Consul, mounts, volume claims).
fn leftovers(cluster: &SimCluster, state: Option<&ServerState>, plan: &RealClientPlan) -> (Vec<String>, Vec<String>) {
    let ours = |alloc_id: &str| {
        state
            .and_then(|state| state.alloc(alloc_id))
            .is_none_or(|alloc| alloc.job_id == JOB_ID)
    };
    let running: Vec<String> = (0..cluster.client_count())
        .flat_map(|client| {
            cluster
                .host(client)
                .running_tasks()
                .into_iter()
                .filter(|(alloc, _)| ours(alloc))
                .map(move |(alloc, task)| format!("{alloc}/{task}"))
        })
        .collect();
    let services = cluster
        .consul()
        .task_services()
        .into_iter()
        .filter(|(_, id)| {
            id.strip_prefix(TASK_SERVICE_PREFIX)
                .and_then(|rest| rest.get(..36))
                .is_none_or(ours)
        })
        .map(|(node, id)| format!("consul service {id} on {node}"));
    let mut unfinished: Vec<String> = state
        .map(|state| {
            state
                .allocs()
                .filter(|alloc| alloc.job_id == JOB_ID && !alloc.client_terminal())
                .map(|alloc| {
                    let node = state.node(&alloc.node_id).map_or("?", |node| node.name.as_str());
                    format!(
                        "{} on {node} ({:?}/{:?}, version {})",
                        alloc.id, alloc.desired_status, alloc.client_status, alloc.job_version
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    unfinished.extend(services);
    if plan.volume {
        let mounts = (0..cluster.client_count()).flat_map(|client| cluster.host(client).mounts());
        unfinished.extend(mounts.map(|mount| format!("mount {mount}")));
        let claims = state
            .and_then(|state| state.volume("default", VOLUME_ID))
            .map(|volume| volume.read_claims.len() + volume.write_claims.len() + volume.past_claims.len())
            .unwrap_or(0);
        if claims > 0 {
            unfinished.push(format!("{claims} claims on {VOLUME_ID}"));
        }
    }
    (running, unfinished)
}
