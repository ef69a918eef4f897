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

use drover_core::client::alloc_runner::CLAIM_BACKOFF_MAX;
use drover_core::client::deadlines::CSI_TIMEOUT;
use drover_core::client::services::{SIDECAR_SUFFIX, TASK_SERVICE_PREFIX};
use drover_core::config::ClientFaults;
use drover_core::connect::{ConsulConnect, ConsulSidecarService, SidecarTask};
use drover_core::fsm::ServerState;
use drover_core::rpc::SWEEP_INTERVAL;
use drover_core::rpc::{RpcError, ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClientStatus, ConfigValue, CsiCapability, CsiPluginType, CsiVolume,
    DesiredStatus, DrainStrategy, Job, JobType, NodeStatus, RestartMode, RestartPolicy, Service, Task,
    TaskCsiPluginConfig, TaskGroup, TaskResources, VolumeMount, VolumeRequest, VolumeType,
};
use drover_io_sim::cluster::{SimCluster, retry_request};
use drover_io_sim::consul::ConsulMode;
use drover_io_sim::host::PluginFaults;
use drover_io_sim::invariants::claims_freed;
use drover_io_sim::task_files::HostFaults;
use drover_io_sim::trace::Recorder;

/// The CSI plugin, run as a system job on every client (a monolith: controller and node).
pub const PLUGIN_JOB_ID: &str = "csi-plugin";
pub const PLUGIN_ID: &str = "p";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(250);

/// One service job the real clients run.
#[derive(Clone, Debug)]
pub struct RealJob {
    pub id: String,
    pub count: u32,
    /// Every task exits (successfully) after this long and is restarted by its restart policy
    /// (`None`: tasks run until stopped).
    pub run_for: Option<Duration>,
    /// The CSI volume every allocation mounts (one of the plan's volumes).
    pub volume: Option<String>,
    pub read_only: bool,
    /// Processes each task starts that ignore the stop signal and outlive it (only the
    /// client's `DestroyTask` ends them).
    pub children: u32,
    /// The group has a Consul Connect service (`<id>-mesh`) with a sidecar: the clients
    /// derive a service identity token for it and bootstrap Envoy.
    pub connect: bool,
    /// The group's `update` block: its versions roll out through deployments.
    pub update: Option<drover_core::structs::UpdateStrategy>,
}

/// The image every simulated container engine holds (`RealClientPlan::containers`).
pub const CONTAINER_IMAGE: &str = "busybox:1.36";

/// The real clients and what they run.
#[derive(Clone, Debug)]
pub struct RealClientPlan {
    /// Client nodes, the late ones included.
    pub clients: usize,
    /// The last `late_clients` start only at a `JoinLateClients` step.
    pub late_clients: usize,
    /// A monolith CSI plugin system job on every client, and `volumes` registered for it.
    pub plugin: bool,
    /// CSI volumes and their access modes.
    pub volumes: Vec<(String, AccessMode)>,
    pub jobs: Vec<RealJob>,
    /// Operators now and then try to deregister a volume a running allocation holds (must be
    /// refused with "volume in use").
    pub deregister_attempts: bool,
    /// The plan's volumes are made through the cluster (`volume create`) instead of
    /// registered, and deleted through it (`volume delete`) once the jobs stop.
    pub create_volumes: bool,
    /// Scratch volumes are created and deleted through the cluster all through the fault
    /// phase ([`crate::volume_churn`]).
    pub volume_churn: bool,
    /// Each client's zone (`zone` segment of its node plugin's topology), by client index;
    /// empty: no topology ([`crate::zones`]).
    pub zones: Vec<String>,
    /// Volumes requested in one zone (`topology_request { required { zone } }`).
    pub volume_zones: BTreeMap<String, String>,
    /// How every client's CSI plugin process misbehaves.
    pub plugin_faults: PluginFaults,
    /// Client defects re-created on purpose (regression switches).
    pub client_faults: ClientFaults,
    /// Job versions whose tasks fail at once (exit 1, no restarts): their deployments fail.
    pub broken_versions: BTreeSet<u64>,
    /// The cron spec of a periodic batch job (`cron`) beside the jobs: the leaders launch a
    /// child of it at every time the spec names, whose task runs a second.
    pub periodic: Option<String>,
    /// Consul is down while the jobs stop, and back once their tasks are gone: every
    /// deregistration fails, and only the client's anti-entropy pass (every 30 s) removes the
    /// services afterwards, nothing else changing on the node by then.
    pub consul_down_at_stop: bool,
    /// Hostile tasks: every job's task plants links to host files in its allocation as it
    /// starts, and renders two templates (into `local/` and `secrets/`) at every start; the
    /// clients' allocation directories are real files, with these host defects
    /// ([`drover_io_sim::task_files`]). Such tasks are not expected to keep running.
    pub planted_links: Option<HostFaults>,
    /// Every job's task is a container (`driver = "docker"`): every client host runs a
    /// simulated container engine holding [`CONTAINER_IMAGE`], under the production driver.
    pub containers: bool,
}

impl RealClientPlan {
    /// `count` allocations of one job, no volume (the plan of the `real_clients_job` family).
    pub fn one_job(clients: usize, count: u32, run_for: Option<Duration>) -> Self {
        RealClientPlan {
            clients,
            late_clients: 0,
            plugin: false,
            volumes: Vec::new(),
            jobs: vec![RealJob {
                id: "web".into(),
                count,
                run_for,
                volume: None,
                read_only: false,
                children: 1,
                connect: false,
                update: None,
            }],
            deregister_attempts: false,
            create_volumes: false,
            volume_churn: false,
            zones: Vec::new(),
            volume_zones: BTreeMap::new(),
            plugin_faults: PluginFaults::default(),
            client_faults: ClientFaults::default(),
            broken_versions: BTreeSet::new(),
            periodic: None,
            consul_down_at_stop: false,
            planted_links: None,
            containers: false,
        }
    }

    /// Every allocation of every job mounts `volume` (registered with `access`).
    pub fn with_volume(mut self, volume: &str, access: AccessMode) -> Self {
        self.plugin = true;
        self.volumes = vec![(volume.to_string(), access)];
        for job in &mut self.jobs {
            job.volume = Some(volume.to_string());
        }
        self
    }

    /// Every job gets a Connect service with a sidecar (and the clients a Consul token).
    pub fn with_connect(mut self) -> Self {
        for job in &mut self.jobs {
            job.connect = true;
        }
        self
    }

    pub fn connect(&self) -> bool {
        self.jobs.iter().any(|job| job.connect)
    }

    fn access(&self, volume: &str) -> AccessMode {
        self.volumes
            .iter()
            .find(|(id, _)| id == volume)
            .map_or(AccessMode::Unknown, |(_, access)| *access)
    }

    /// What the plan runs, for the schedule printed with a failing seed.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "{} real clients ({} late), CSI plugin {} {:?}, volumes {:?}{}{}{}",
            self.clients,
            self.late_clients,
            self.plugin,
            self.plugin_faults,
            self.volumes,
            if self.deregister_attempts {
                ", deregister attempts"
            } else {
                ""
            },
            if self.create_volumes {
                ", made by volume create"
            } else {
                ""
            },
            if self.volume_churn {
                ", scratch volumes created and deleted throughout"
            } else {
                ""
            }
        )];
        if !self.zones.is_empty() {
            lines.push(format!(
                "client zones {:?}, volume zones {:?}",
                self.zones, self.volume_zones
            ));
        }
        if let Some(spec) = &self.periodic {
            lines.push(format!(
                "periodic job {PERIODIC_JOB}: cron {spec:?}, each child runs 1s"
            ));
        }
        lines.extend(self.jobs.iter().map(|job| {
            format!(
                "job {}: count {}, tasks run for {:?} leaving {} processes behind, volume {:?}{}{}",
                job.id,
                job.count,
                job.run_for,
                job.children,
                job.volume,
                if job.read_only { " read-only" } else { "" },
                if job.connect { ", Connect sidecar" } else { "" }
            )
        }));
        lines
    }
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
                    ..TaskResources::default()
                },
                // It takes a while to exit once interrupted, finishing what it was doing, as
                // real plugins do: a replacement can come up meanwhile.
                config: BTreeMap::from([("stop_after".to_string(), ConfigValue::String("2s".into()))]),
                csi_plugin: Some(TaskCsiPluginConfig {
                    id: PLUGIN_ID.into(),
                    plugin_type: CsiPluginType::Monolith,
                    mount_dir: "/csi".into(),
                    stage_publish_base_dir: "/local/csi".into(),
                    health_timeout: Duration::from_secs(30),
                }),
                ..Task::default()
            }],
            // A node plugin is a daemon its operator keeps running: a task that fails to
            // start or is OOM killed is restarted, not left failed (the servers do not replace
            // a failed system allocation, as Nomad's do not).
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

pub fn volume(id: &str, access: AccessMode) -> CsiVolume {
    CsiVolume {
        id: id.into(),
        namespace: "default".into(),
        name: id.into(),
        plugin_id: PLUGIN_ID.into(),
        requested_capabilities: vec![CsiCapability {
            access_mode: access,
            attachment_mode: AttachmentMode::FileSystem,
        }],
        ..CsiVolume::default()
    }
}

/// The Consul service id of a job's task in `alloc`.
fn service_id(job: &RealJob, alloc: &str) -> String {
    format!("{TASK_SERVICE_PREFIX}{alloc}-server-{}-http", job.id)
}

/// The Connect service of a job's group.
fn mesh_service(job: &RealJob) -> String {
    format!("{}-mesh", job.id)
}

/// The sidecar task the servers inject for it.
fn sidecar_task(job: &RealJob) -> String {
    format!("connect-proxy-{}", mesh_service(job))
}

/// The Consul id of a job's Connect group service in `alloc`.
fn mesh_service_id(job: &RealJob, alloc: &str) -> String {
    format!("{TASK_SERVICE_PREFIX}{alloc}-group-web-{}-http", mesh_service(job))
}

/// The group `service` with a Connect sidecar run by `raw_exec` (there is no Docker here).
fn connect_service(job: &RealJob) -> Service {
    Service {
        name: mesh_service(job),
        port_label: "http".into(),
        address_mode: "auto".into(),
        connect: Some(ConsulConnect {
            sidecar_service: Some(ConsulSidecarService::default()),
            sidecar_task: Some(SidecarTask {
                driver: "raw_exec".into(),
                ..SidecarTask::default()
            }),
            ..ConsulConnect::default()
        }),
        ..Service::default()
    }
}

/// Version `version` of a job: each version is a destructive update (its env changes).
pub fn job(plan: &RealClientPlan, spec: &RealJob, version: u64) -> Job {
    let mut config = BTreeMap::new();
    if plan.containers {
        config.insert("image".to_string(), ConfigValue::String(CONTAINER_IMAGE.into()));
        // `sleep N` exits by itself (the simulated engine runs it for N seconds).
        if let Some(run_for) = spec.run_for {
            config.insert("command".to_string(), ConfigValue::String("sleep".into()));
            config.insert(
                "args".to_string(),
                ConfigValue::List(vec![ConfigValue::String(run_for.as_secs().max(1).to_string())]),
            );
        }
    } else if spec.children > 0 {
        config.insert("children".to_string(), ConfigValue::Int(i64::from(spec.children)));
    }
    if let Some(run_for) = spec.run_for.filter(|_| !plan.containers) {
        config.insert(
            "run_for".to_string(),
            ConfigValue::String(format!("{}ms", run_for.as_millis())),
        );
    }
    let templates = if plan.planted_links.is_some() {
        config.insert("plant_links".to_string(), ConfigValue::Bool(true));
        ["local/out.txt", "secrets/env.txt"]
            .into_iter()
            .map(|dest| drover_core::structs::Template {
                dest_path: dest.into(),
                embedded_tmpl: format!("version {version}\n"),
                ..Default::default()
            })
            .collect()
    } else {
        Vec::new()
    };
    let broken = plan.broken_versions.contains(&version);
    if broken {
        config.insert("run_for".to_string(), ConfigValue::String("500ms".into()));
        config.insert("exit_code".to_string(), ConfigValue::Int(1));
    }
    let volumes = spec.volume.as_ref().map(|source| {
        (
            "data".to_string(),
            VolumeRequest {
                name: "data".into(),
                volume_type: VolumeType::Csi,
                source: source.clone(),
                read_only: spec.read_only,
                access_mode: plan.access(source),
                attachment_mode: AttachmentMode::FileSystem,
                mount_options: None,
                per_alloc: false,
            },
        )
    });
    let volume_mounts = spec
        .volume
        .as_ref()
        .map(|_| VolumeMount {
            volume: "data".into(),
            destination: "/data".into(),
            read_only: spec.read_only,
            propagation_mode: Default::default(),
        })
        .into_iter()
        .collect();
    Job {
        id: spec.id.clone(),
        name: spec.id.clone(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: spec.count,
            volumes: volumes.into_iter().collect(),
            tasks: vec![Task {
                name: "server".into(),
                // raw_exec cannot bind a volume into its task (Nomad #8030): `exec` can.
                driver: if plan.containers {
                    "docker"
                } else if spec.volume.is_some() {
                    "exec"
                } else {
                    "raw_exec"
                }
                .into(),
                config,
                env: BTreeMap::from([("VERSION".to_string(), version.to_string())]),
                volume_mounts,
                templates,
                // Registered at the dynamic port the allocation was given. A job rolled by
                // deployments has a check, so its allocations' health waits on Consul
                // (`health_check = "checks"`, the default).
                services: vec![Service {
                    name: spec.id.clone(),
                    port_label: "http".into(),
                    address_mode: "auto".into(),
                    checks: spec
                        .update
                        .iter()
                        .map(|_| drover_core::structs::ServiceCheck {
                            name: "alive".into(),
                            check_type: "tcp".into(),
                            interval: Duration::from_secs(10),
                            timeout: Duration::from_secs(2),
                            ..Default::default()
                        })
                        .collect(),
                    ..Service::default()
                }],
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            // Tasks that exit are restarted for as long as the run lasts: the servers do not
            // reschedule failed allocations yet, so a group failed by its restart policy would
            // stay failed.
            restart_policy: Some(RestartPolicy {
                attempts: if broken { 0 } else { 1_000 },
                interval: Duration::from_secs(1_800),
                delay: Duration::from_secs(15),
                mode: RestartMode::Fail,
            }),
            update: spec.update.clone().map(Box::new),
            networks: vec![drover_core::structs::NetworkResource {
                mode: if spec.connect { "host" } else { "" }.into(),
                dynamic_ports: vec![drover_core::structs::Port {
                    label: "http".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            services: if spec.connect {
                vec![connect_service(spec)]
            } else {
                Vec::new()
            },
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// The periodic job's ID.
pub const PERIODIC_JOB: &str = "cron";

/// The periodic batch job: a child at every time `spec` names, whose task runs a second.
pub fn periodic_job(plan: &RealClientPlan, spec: &str) -> Job {
    let task = RealJob {
        id: PERIODIC_JOB.into(),
        count: 1,
        run_for: Some(Duration::from_secs(1)),
        volume: None,
        read_only: false,
        children: 0,
        connect: false,
        update: None,
    };
    Job {
        job_type: JobType::Batch,
        periodic: Some(Box::new(drover_core::structs::PeriodicConfig {
            spec: spec.to_string(),
            ..Default::default()
        })),
        ..job(plan, &task, 0)
    }
}

/// Once the cluster is quiet, the periodic job is launching on time again: nothing its spec
/// names is overdue by more than `slack` (a failover or a clock step is over). The launch
/// record is the leader's; the wall clock is the harness's (every server's is true again).
fn periodic_current(state: &ServerState, spec: &str, slack: Duration) -> Result<String, String> {
    use drover_core::periodic::Calendar as _;
    let record = state
        .periodic_launch("default", PERIODIC_JOB)
        .ok_or("the periodic job has no launch record")?;
    let config = drover_core::structs::PeriodicConfig {
        spec: spec.to_string(),
        ..Default::default()
    };
    let now = drover_io_real::clock::unix_millis();
    let next = drover_io_real::periodic::CronCalendar
        .next_after(&config, record.launch_ms)
        .ok_or("the spec names no later time")?;
    if next + slack.as_millis() as u64 <= now {
        return Err(format!(
            "the last launch was at {} ms; {next} ms is {} ms overdue",
            record.launch_ms,
            now - next
        ));
    }
    let children = state.children("default", PERIODIC_JOB).count();
    Ok(format!("periodic job launching on time ({children} children launched)"))
}

/// Sends `request` through the live servers until one answers other than "try again".
pub async fn request(cluster: &SimCluster, request: ServerRequest, attempts: u32) -> ServerReply {
    retry_request(|| cluster.gateways(), 0, request, attempts, REQUEST_TIMEOUT).await
}

pub async fn register(cluster: &SimCluster, plan: &RealClientPlan) -> Result<(), String> {
    if plan.plugin {
        let register = ServerRequest::JobRegister {
            job: Box::new(plugin_job()),
            enforce_index: None,
        };
        match request(cluster, register, 40).await {
            ServerReply::JobRegistered { .. } => {}
            other => return Err(format!("register the plugin job: {other:?}")),
        }
    }
    for (id, access) in &plan.volumes {
        // The servers refuse a volume of a plugin they have not heard of: register it once the
        // clients have started the plugin and fingerprinted it, as an operator would.
        let mut attempts = 0;
        loop {
            let volumes = vec![crate::zones::zoned(volume(id, *access), plan)];
            let register = if plan.create_volumes {
                ServerRequest::VolumeCreate { volumes }
            } else {
                ServerRequest::VolumeRegister { volumes }
            };
            match request(cluster, register, 40).await {
                ServerReply::Done { .. } => break,
                // Likewise while no controller is healthy yet (a plugin slow to start), which
                // the servers answer as retryable; a create needs the plugin's controller
                // fingerprinted first.
                ServerReply::Error(error)
                    if (error.message.contains("no CSI plugin named")
                        || error.retryable
                        || (plan.create_volumes && error.message.starts_with("CSI plugin")))
                        && attempts < 120 =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => return Err(format!("register volume {id}: {other:?}")),
            }
        }
    }
    for spec in &plan.jobs {
        let register = ServerRequest::JobRegister {
            job: Box::new(job(plan, spec, 0)),
            enforce_index: None,
        };
        match request(cluster, register, 40).await {
            ServerReply::JobRegistered { .. } => {}
            other => return Err(format!("register job {}: {other:?}", spec.id)),
        }
    }
    if let Some(spec) = &plan.periodic {
        let register = ServerRequest::JobRegister {
            job: Box::new(periodic_job(plan, spec)),
            enforce_index: None,
        };
        match request(cluster, register, 40).await {
            ServerReply::JobRegistered { .. } => {}
            other => return Err(format!("register job {PERIODIC_JOB}: {other:?}")),
        }
    }
    Ok(())
}

/// How long an operator's command (`job run`, `system gc`) keeps trying before it gives up,
/// as a CLI facing a cluster without a leader does. The fault schedule waits for the command:
/// were it to keep trying for as long as the servers stay without a quorum (10 attempts of
/// up to 10 s each), every fault after it would be shifted to the end of the outage, all at
/// once (a targeted swarm's shapes, timed against each other, fell apart that way).
const OPERATOR_DEADLINE: Duration = Duration::from_secs(10);

/// `request`, given up after [`OPERATOR_DEADLINE`].
async fn operator_request(cluster: &SimCluster, request: ServerRequest) -> ServerReply {
    match tokio::time::timeout(OPERATOR_DEADLINE, self::request(cluster, request, 10)).await {
        Ok(reply) => reply,
        Err(_) => ServerReply::Error(RpcError::unavailable(format!(
            "the operator gave up: no answer within {OPERATOR_DEADLINE:?}"
        ))),
    }
}

/// Registers version `version` of every job (a destructive update); a failure is noted, not
/// a violation (the servers may be without a leader right then).
pub async fn update(cluster: &SimCluster, plan: &RealClientPlan, version: u64) {
    for spec in &plan.jobs {
        let reply = operator_request(
            cluster,
            ServerRequest::JobRegister {
                job: Box::new(job(plan, spec, version)),
                enforce_index: None,
            },
        )
        .await;
        cluster.recorder().note(format!(
            "job {} version {version} registered: {}",
            spec.id,
            matches!(reply, ServerReply::JobRegistered { .. })
        ));
    }
}

/// An operator's `system gc`: every allocation the servers stopped and its client finished is
/// deleted (Nomad's eligibility: a failed allocation still due to be rescheduled is kept),
/// whether or not its volume claims are released yet (they still must be: Nomad #10052).
pub async fn gc_allocs(cluster: &SimCluster) {
    let Some(state) = any_state(cluster) else {
        cluster.recorder().note("system gc: no live server to read");
        return;
    };
    let alloc_ids: Vec<String> = state
        .allocs()
        .filter(|alloc| alloc.server_terminal() && alloc.client_terminal())
        .map(|alloc| alloc.id.clone())
        .collect();
    if alloc_ids.is_empty() {
        cluster.recorder().note("system gc: no finished allocation");
        return;
    }
    let count = alloc_ids.len();
    let reply = operator_request(cluster, ServerRequest::AllocDelete { alloc_ids }).await;
    cluster.recorder().note(format!(
        "system gc: {count} finished allocations deleted: {}",
        matches!(reply, ServerReply::Done { .. })
    ));
}

/// The state of a live server (whichever answers first), for operator actions.
fn any_state(cluster: &SimCluster) -> Option<ServerState> {
    cluster
        .gateways()
        .iter()
        .find_map(|gateway| gateway.read_state(Clone::clone))
}

/// The client running an allocation of the first job, as a live server sees it.
pub fn job_client(cluster: &SimCluster, plan: &RealClientPlan) -> Option<usize> {
    let job_id = &plan.jobs.first()?.id;
    let state = any_state(cluster)?;
    let alloc = state.allocs().find(|alloc| {
        &alloc.job_id == job_id
            && alloc.desired_status == DesiredStatus::Run
            && alloc.client_status == ClientStatus::Running
    })?;
    client_of(cluster, &state, alloc)
}

/// The node running the first job's allocation is drained through a live server, as an
/// operator would: no deadline, system jobs included.
pub fn drain_job_node(cluster: &SimCluster, plan: &RealClientPlan) {
    let Some(client) = job_client(cluster, plan) else {
        cluster.recorder().note("no running allocation to drain a node under");
        return;
    };
    let Some(node_id) = any_state(cluster).and_then(|state| {
        state
            .nodes()
            .find(|node| node.name == cluster.client_name(client))
            .map(|node| node.id.clone())
    }) else {
        return;
    };
    cluster
        .recorder()
        .note(format!("draining {}", cluster.client_name(client)));
    let gateways = cluster.gateways();
    let recorder = cluster.recorder().clone();
    let drain = ServerRequest::NodeUpdateDrain {
        node_id,
        strategy: Some(DrainStrategy::default()),
        mark_eligible: false,
    };
    tokio::spawn(async move {
        // Retried through whichever servers are live (a leader may be down).
        let reply = retry_request(|| gateways.clone(), 0, drain, 40, REQUEST_TIMEOUT).await;
        recorder.note(format!("drain set: {}", matches!(reply, ServerReply::Done { .. })));
    });
}

/// An operator tries to deregister a volume a running allocation holds: it must be refused.
pub async fn deregister_attempt(cluster: &SimCluster, pick: usize) {
    let Some(state) = any_state(cluster) else { return };
    let held: Vec<(String, String)> = state
        .volume_keys()
        .filter_map(|(namespace, id)| state.volume(namespace, id))
        .filter_map(|volume| {
            let holder = volume
                .read_claims
                .keys()
                .chain(volume.write_claims.keys())
                .find(|alloc| {
                    state.alloc(alloc).is_some_and(|alloc| {
                        alloc.desired_status == DesiredStatus::Run && alloc.client_status == ClientStatus::Running
                    })
                })?;
            Some((volume.id.clone(), holder.clone()))
        })
        .collect();
    let Some((volume, holder)) = held.get(pick % held.len().max(1)).cloned() else {
        return;
    };
    let deregister = ServerRequest::VolumeDeregister {
        namespace: "default".into(),
        volume_ids: vec![volume.clone()],
        force: false,
    };
    match request(cluster, deregister, 3).await {
        ServerReply::Error(error) if error.message.contains("volume in use") => {
            cluster
                .recorder()
                .note(format!("deregister {volume} refused: volume in use"));
        }
        ServerReply::Error(_) => {}
        other => cluster.recorder().violate(
            "a claimed volume cannot be deregistered",
            format!("deregister of {volume} held by running allocation {holder} returned {other:?}"),
        ),
    }
}

pub fn leader_state(cluster: &SimCluster, leader: u64) -> Option<ServerState> {
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

fn describe_allocs(state: &ServerState, job_id: &str) -> String {
    let allocs: Vec<String> = state
        .allocs()
        .filter(|alloc| alloc.job_id == job_id)
        .map(|alloc| {
            let node = state.node(&alloc.node_id).map_or("?", |node| node.name.as_str());
            format!(
                "{} v{} on {node} {:?}/{:?} {:?}",
                &alloc.id[..8],
                alloc.job_version,
                alloc.desired_status,
                alloc.client_status,
                alloc.desired_description
            )
        })
        .collect();
    let evals: Vec<String> = state
        .evals()
        .filter(|eval| eval.job_id == job_id)
        .map(|eval| {
            let node = state.node(&eval.node_id).map_or("", |node| node.name.as_str());
            format!(
                "{} {node} at {} (snapshot {}) {} {:?} {:?}",
                eval.triggered_by,
                eval.create_index,
                eval.snapshot_index,
                eval.status,
                eval.status_description,
                eval.failed_tg_allocs
            )
        })
        .collect();
    let nodes: Vec<String> = state
        .nodes()
        .map(|node| {
            format!(
                "{} {:?} eligible={} (modified at {})",
                node.name,
                node.status,
                node.eligible(),
                node.modify_index
            )
        })
        .collect();
    format!(
        "allocations: {}; evaluations: {}; nodes: {}",
        allocs.join(", "),
        evals.join("; "),
        nodes.join(", ")
    )
}

/// Whether every job runs as it should: `count` allocations the servers want running at its
/// latest version, each seen running (`seen` keeps those already seen); the plugin on every
/// ready, eligible node. `Err` says what is missing.
fn jobs_running(
    cluster: &SimCluster,
    state: &ServerState,
    plan: &RealClientPlan,
    seen: &mut BTreeSet<String>,
) -> Result<(), String> {
    let draining: Vec<&str> = state
        .nodes()
        .filter(|node| node.drain_strategy.is_some())
        .map(|node| node.name.as_str())
        .collect();
    if !draining.is_empty() {
        return Err(format!("nodes {draining:?} are still draining"));
    }
    let eligible = state
        .nodes()
        .filter(|node| node.status == NodeStatus::Ready && node.eligible())
        .count();
    let mut expected: Vec<(String, usize, Option<&RealJob>)> = plan
        .jobs
        .iter()
        .map(|job| (job.id.clone(), job.count as usize, Some(job)))
        .collect();
    if plan.plugin {
        expected.push((PLUGIN_JOB_ID.to_string(), eligible, None));
    }
    for (job_id, count, spec) in expected {
        let version = state.job("default", &job_id).map(|job| job.version);
        let wanted: Vec<&Allocation> = state
            .allocs()
            .filter(|alloc| alloc.job_id == job_id && alloc.desired_status == DesiredStatus::Run)
            .filter(|alloc| !alloc.client_terminal())
            .collect();
        if let Some(stale) = wanted.iter().find(|alloc| Some(alloc.job_version) != version) {
            return Err(format!(
                "{} of {job_id} still runs version {} of the job, not {version:?}",
                stale.id, stale.job_version
            ));
        }
        if wanted.len() != count {
            return Err(format!(
                "{job_id}: {} live allocations, want {count} ({})",
                wanted.len(),
                describe_allocs(state, &job_id)
            ));
        }
        // Tasks that exit on their own are pending between restarts, so each allocation only
        // has to have been seen running (reported so, its task in its host's process table,
        // its volume mounted, its service in its node's Consul agent) at some moment of the
        // quiet phase, not all at once.
        for alloc in &wanted {
            let Some(client) = client_of(cluster, state, alloc) else {
                continue;
            };
            let host = cluster.host(client);
            let task = if spec.is_some() { "server" } else { "plugin" };
            let task_runs = host
                .running_tasks()
                .iter()
                .any(|(id, name)| id == &alloc.id && name == task);
            let mounted = spec.is_none_or(|spec| {
                spec.volume.is_none()
                    || host
                        .mounts()
                        .iter()
                        .any(|mount| mount.contains(&format!("/per-alloc/{}/", alloc.id)))
            });
            let registered = spec.is_none_or(|spec| {
                cluster
                    .consul()
                    .task_services()
                    .contains(&(cluster.client_name(client).to_string(), service_id(spec, &alloc.id)))
            });
            let meshed = spec.is_none_or(|spec| !spec.connect || connect_ready(cluster, client, spec, &alloc.id));
            // A plugin allocation runs for its node's fingerprint: the servers hear that node's
            // plugin healthy, from this allocation (#12744: a stopping predecessor took the
            // registration with it and the node had no plugin while its task ran).
            let fingerprinted = spec.is_some()
                || state
                    .node(&alloc.node_id)
                    .and_then(|node| node.csi_node_plugins.get(PLUGIN_ID))
                    .is_some_and(|info| info.healthy && info.alloc_id == alloc.id);
            // The task states converge too: the servers hear the task running (issue 18).
            let reported = alloc
                .task_states
                .get(task)
                .is_some_and(|state| state.state == drover_core::structs::TaskStatus::Running);
            if alloc.client_status == ClientStatus::Running
                && task_runs
                && mounted
                && registered
                && meshed
                && reported
                && fingerprinted
            {
                seen.insert(alloc.id.clone());
            }
        }
        if let Some(alloc) = wanted.iter().find(|alloc| !seen.contains(&alloc.id)) {
            return Err(format!(
                "{} of {job_id} not seen running yet (reported {:?}, on {})",
                alloc.id,
                alloc.client_status,
                client_of(cluster, state, alloc).map_or("an unknown node", |client| cluster.client_name(client))
            ));
        }
    }
    Ok(())
}

/// A Connect allocation is ready when its sidecar runs with a token and a bootstrap, and its
/// group service and the sidecar Consul derived from it are in its node's agent.
fn connect_ready(cluster: &SimCluster, client: usize, spec: &RealJob, alloc: &str) -> bool {
    let host = cluster.host(client);
    let sidecar = sidecar_task(spec);
    let runs = host
        .running_tasks()
        .iter()
        .any(|(id, name)| id == alloc && *name == sidecar);
    let secrets = format!("/{alloc}/{sidecar}/secrets/");
    let token = host.files_ending(&format!("{secrets}si_token"));
    let bootstrap = host.files_ending(&format!("{secrets}envoy_bootstrap.json"));
    let node = cluster.client_name(client).to_string();
    let services = cluster.consul().task_services();
    let parent = mesh_service_id(spec, alloc);
    let registered = services.contains(&(node.clone(), parent.clone()))
        && services.contains(&(node, format!("{parent}{SIDECAR_SUFFIX}")));
    runs && token.len() == 1 && bootstrap.len() == 1 && registered
}

/// Safety, checked whenever the jobs are inspected: a token file holds a token Consul made for
/// that allocation and task, never another's; and once a bootstrap is written it carries the
/// same token as the task's file.
fn check_token_files(cluster: &SimCluster, recorder: &Recorder) {
    let tokens = cluster.consul().tokens();
    for client in 0..cluster.client_count() {
        let host = cluster.host(client);
        for (path, secret) in host.files_ending("/secrets/si_token") {
            let mut parts = path.rsplit('/').skip(2);
            let (Some(task), Some(alloc)) = (parts.next(), parts.next()) else {
                continue;
            };
            let owner = format!("[{alloc}] [{task}]");
            if let Some(token) = tokens.values().find(|token| token.secret_id == secret)
                && !token.description.ends_with(&owner)
            {
                recorder.violate(
                    "no SI token is handed to a task of another allocation",
                    format!("{path} holds the token of {:?}", token.description),
                );
            }
        }
    }
}

/// Once quiet, the accessors in Raft and the tokens alive in Consul are the same set (for
/// allocations the servers still want; finished ones' are being revoked).
fn tokens_agree(cluster: &SimCluster, state: &ServerState) -> Result<(), String> {
    let cluster_id = state
        .cluster()
        .map(|cluster| cluster.cluster_id.clone())
        .unwrap_or_default();
    let prefix = format!("_nomad_si [{cluster_id}] ");
    let in_consul: BTreeSet<String> = cluster
        .consul()
        .tokens()
        .into_iter()
        .filter(|(_, token)| token.description.starts_with(&prefix))
        .map(|(accessor, _)| accessor)
        .collect();
    let in_raft: BTreeSet<String> = state
        .si_accessors()
        .map(|accessor| accessor.accessor_id.clone())
        .collect();
    if in_consul != in_raft {
        return Err(format!(
            "SI tokens in Consul {in_consul:?} differ from the accessors in Raft {in_raft:?}"
        ));
    }
    Ok(())
}

/// Tasks on the hosts whose allocation the servers do not want running.
fn strays(cluster: &SimCluster, state: &ServerState) -> Vec<String> {
    let mut out = Vec::new();
    for client in 0..cluster.client_count() {
        for (alloc_id, task) in cluster.host(client).task_processes() {
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

/// How long after the quiet phase begins the jobs get to converge. With volumes: a node plugin
/// call hung just before the quiet phase holds its volume until the client's deadline for it
/// (Nomad's two-minute mount action timeout), and an allocation waiting for that volume asks
/// again only at its next claim retry (backing off to a minute).
fn convergence_bound(plan: &RealClientPlan) -> Duration {
    let base = Duration::from_secs(120);
    let base = if plan.volumes.is_empty() {
        base
    } else {
        base.max(CSI_TIMEOUT + CLAIM_BACKOFF_MAX + Duration::from_secs(60))
    };
    // Tokens leaked by a lost leader or a lost answer are swept at the second listing that
    // finds them, up to two sweep intervals after the leader took over.
    if plan.connect() {
        base + SWEEP_INTERVAL * 3
    } else {
        base
    }
}

/// Once quiet: every job converges on the real clients with no stray task anywhere; after
/// `job stop` of every job no task, service, mount or claim of theirs is left, and then every
/// volume can be deregistered.
pub async fn check_end(
    cluster: &SimCluster,
    recorder: &Recorder,
    plan: &RealClientPlan,
    leader: u64,
    deadline: tokio::time::Instant,
) {
    let deadline = deadline.max(tokio::time::Instant::now() + convergence_bound(plan));
    if plan.plugin_faults.never_ready {
        check_never_ready(cluster, recorder, leader, deadline).await;
        return;
    }
    if plan.planted_links.is_some() {
        // A hostile task whose links the agent refused to follow fails its starts for good
        // (its directory is not as it must be): only what the agent did, and that a job stop
        // still clears everything, are judged.
        recorder.note("hostile tasks: their jobs are not expected to keep running");
        stop_jobs(cluster, recorder, plan, leader, deadline).await;
        return;
    }
    let mut seen = BTreeSet::new();
    loop {
        if plan.connect() {
            check_token_files(cluster, recorder);
        }
        let verdict = match leader_state(cluster, leader) {
            Some(state) => jobs_running(cluster, &state, plan, &mut seen)
                .and_then(|()| {
                    if plan.connect() {
                        tokens_agree(cluster, &state)
                    } else {
                        Ok(())
                    }
                })
                .and_then(|()| {
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
                let invariant = if why.starts_with("SI tokens in Consul") {
                    "SI tokens alive in Consul are the accessors in Raft once the cluster is quiet"
                } else {
                    "liveness: the jobs run on the real clients"
                };
                recorder.violate(invariant, why);
                report_leaks(cluster, recorder, leader);
                return;
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
    let starts: u64 = (0..cluster.client_count())
        .map(|client| cluster.host(client).starts())
        .sum();
    recorder.note(format!(
        "the jobs run on the real clients ({starts} task starts in all)"
    ));
    if let Some(spec) = &plan.periodic {
        loop {
            let verdict = leader_state(cluster, leader)
                .ok_or_else(|| "the leader's state cannot be read".to_string())
                .and_then(|state| periodic_current(&state, spec, Duration::from_secs(3)));
            match verdict {
                Ok(note) => {
                    recorder.note(note);
                    break;
                }
                Err(why) if tokio::time::Instant::now() >= deadline => {
                    recorder.violate(
                        "liveness: a periodic job launches on time once the cluster is quiet",
                        why,
                    );
                    break;
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }
    if let Some(state) = leader_state(cluster, leader) {
        let refused = failed_on_capacity(&state, plan);
        if !refused.is_empty() {
            recorder.violate(
                "a claim refused for capacity is waited out, never fails its allocation (#8609)",
                refused.join("; "),
            );
        }
        if !plan.broken_versions.is_empty() {
            match rollbacks(&state, plan) {
                Ok(note) => recorder.note(note),
                Err(why) => recorder.violate(
                    "a broken version's deployment fails and rolls back to the last stable version",
                    why,
                ),
            }
        }
    }
    if plan.connect() {
        recorder.note(format!(
            "{} SI tokens alive in Consul, equal to the accessors in Raft ({} created in all)",
            cluster.consul().tokens().len(),
            cluster.consul().tokens_made()
        ));
    }
    if stop_jobs(cluster, recorder, plan, leader, deadline).await {
        deregister_all(cluster, recorder, plan).await;
    }
}

/// `job stop` of every job, then nothing of theirs may be left (tasks, allocations, services,
/// mounts, claims, SI tokens) by `deadline`. `false` when something was.
async fn stop_jobs(
    cluster: &SimCluster,
    recorder: &Recorder,
    plan: &RealClientPlan,
    leader: u64,
    deadline: tokio::time::Instant,
) -> bool {
    let periodic = plan.periodic.as_ref().map(|_| PERIODIC_JOB.to_string());
    if plan.consul_down_at_stop {
        cluster.consul().set_mode(ConsulMode::Down);
        recorder.note("consul Down while the jobs stop");
    }
    for id in plan.jobs.iter().map(|spec| spec.id.clone()).chain(periodic) {
        let stop = ServerRequest::JobStop {
            namespace: "default".into(),
            job_id: id.clone(),
            purge: false,
        };
        match request(cluster, stop, 40).await {
            ServerReply::JobRegistered { .. } | ServerReply::Done { .. } => {}
            other => {
                recorder.violate("a job can be stopped", format!("{id}: {other:?}"));
                return false;
            }
        }
    }
    if plan.consul_down_at_stop {
        consul_back_once_tasks_are_gone(cluster, recorder, deadline).await;
    }
    loop {
        let state = leader_state(cluster, leader);
        let (running, unfinished) = leftovers(cluster, state.as_ref(), plan);
        let unsettled = state
            .as_ref()
            .map(|state| task_states_unsettled(state, plan))
            .unwrap_or_default();
        if running.is_empty() && unfinished.is_empty() && unsettled.is_empty() {
            let freed = if plan.volumes.is_empty() {
                ", every service deregistered"
            } else {
                ", every service, mount and claim released"
            };
            recorder.note(format!(
                "jobs stopped: no task left on any host, every allocation finished{freed}"
            ));
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            report_leaks(cluster, recorder, leader);
            let tokens: Vec<&String> = unfinished.iter().filter(|what| what.starts_with("SI token")).collect();
            if !tokens.is_empty() {
                recorder.violate(
                    "no SI token outlives its allocation once the cluster is quiet",
                    format!("{tokens:?}"),
                );
            }
            if !unsettled.is_empty() {
                recorder.violate("task states converge to what the client ran", unsettled.join("; "));
                return false;
            }
            recorder.violate(
                "nothing is left behind after a job stop",
                format!(
                    "still running: [{}]; not finished: [{}]",
                    running.join(", "),
                    unfinished.join(", ")
                ),
            );
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
    true
}

/// Every job with an `update` block saw its broken versions' deployments fail and roll back
/// (the `VERSION` each job version's task was given names the plan's version).
fn rollbacks(state: &ServerState, plan: &RealClientPlan) -> Result<String, String> {
    let mut notes = Vec::new();
    for spec in plan.jobs.iter().filter(|spec| spec.update.is_some()) {
        let label = |version: u64| {
            state
                .job_version("default", &spec.id, version)
                .and_then(|job| job.task_groups.first())
                .and_then(|group| group.tasks.first())
                .and_then(|task| task.env.get("VERSION").cloned())
        };
        let deployments = state.job_deployments("default", &spec.id);
        for broken in &plan.broken_versions {
            let failed = deployments
                .iter()
                .find(|d| label(d.job_version).as_deref() == Some(broken.to_string().as_str()));
            match failed {
                Some(d)
                    if d.status == drover_core::structs::DeploymentStatus::Failed
                        && d.status_description.contains("rolling back to job version") =>
                {
                    notes.push(format!("{}: {}", spec.id, d.status_description));
                }
                Some(d) => {
                    return Err(format!(
                        "{}: the deployment of broken version {broken} is {} ({})",
                        spec.id, d.status, d.status_description
                    ));
                }
                None => return Err(format!("{}: no deployment of broken version {broken}", spec.id)),
            }
        }
    }
    Ok(format!("broken versions rolled back: {}", notes.join("; ")))
}

/// Allocations of the plan's jobs that failed because a claim met a volume whose claims
/// were all taken. That refusal is what a replacement meets while the allocation it replaces
/// still releases the volume (an update, a drain); the client must wait it out (#8609).
fn failed_on_capacity(state: &ServerState, plan: &RealClientPlan) -> Vec<String> {
    state
        .allocs()
        .filter(|alloc| plan.jobs.iter().any(|job| job.id == alloc.job_id))
        .filter(|alloc| alloc.client_status == ClientStatus::Failed)
        .filter_map(|alloc| {
            let event = alloc
                .task_states
                .values()
                .flat_map(|task| task.events.iter())
                .find(|event| {
                    event.kind == drover_core::client::events::SETUP_FAILURE
                        && event.message.contains("volume max claims reached")
                })?;
            Some(format!("{} of {}: {}", alloc.id, alloc.job_id, event.message))
        })
        .collect()
}

/// Task states that did not converge to what the client ran: an allocation its client
/// finished (complete or failed) whose reported task states still show a task alive. Lost
/// allocations are the servers' word, not the client's, and are left out.
fn task_states_unsettled(state: &ServerState, plan: &RealClientPlan) -> Vec<String> {
    state
        .allocs()
        .filter(|alloc| plan.jobs.iter().any(|job| job.id == alloc.job_id))
        .filter(|alloc| matches!(alloc.client_status, ClientStatus::Complete | ClientStatus::Failed))
        .flat_map(|alloc| {
            alloc
                .task_states
                .iter()
                .filter(|(_, task)| task.state != drover_core::structs::TaskStatus::Dead)
                .map(move |(name, task)| {
                    format!(
                        "task states of {} ({:?}): {name} still {:?} on the servers",
                        alloc.id, alloc.client_status, task.state
                    )
                })
        })
        .collect()
}

/// Claims of finished allocations the servers never released (#10927, #13416), reported as
/// their own violation: they explain a job that cannot run again or a stop that never ends.
fn report_leaks(cluster: &SimCluster, recorder: &Recorder, leader: u64) {
    if let Some(Err(leak)) = leader_state(cluster, leader).map(|state| claims_freed::no_leaked_claims(&state)) {
        recorder.violate("no leaked claims once the cluster is quiet", leak);
    }
}

/// A plugin that never answers a probe with ready: its task is restarted once its health
/// timeout passes, the servers never see it healthy, and stopping its job leaves nothing.
/// Waits (until `deadline` at most) for every task process on every host to be gone, their
/// services' deregistrations failing against the Consul that is down, then brings Consul back.
async fn consul_back_once_tasks_are_gone(cluster: &SimCluster, recorder: &Recorder, deadline: tokio::time::Instant) {
    while tokio::time::Instant::now() < deadline
        && (0..cluster.client_count()).any(|client| !cluster.host(client).task_processes().is_empty())
    {
        tokio::time::sleep(POLL).await;
    }
    // A moment for the clients' sync passes after the last task stopped to fail too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.consul().set_mode(ConsulMode::Healthy);
    recorder.note("consul Healthy again, every task of the stopped jobs gone");
}

async fn check_never_ready(cluster: &SimCluster, recorder: &Recorder, leader: u64, deadline: tokio::time::Instant) {
    let healthy = |state: &ServerState| {
        state.nodes().any(|node| {
            node.csi_node_plugins
                .get(PLUGIN_ID)
                .or_else(|| node.csi_controller_plugins.get(PLUGIN_ID))
                .is_some_and(|plugin| plugin.healthy)
        })
    };
    loop {
        let starts = cluster.host(0).starts();
        let state = leader_state(cluster, leader);
        if state.as_ref().is_some_and(healthy) {
            recorder.violate(
                "a plugin that never becomes ready is never healthy",
                "the servers list the plugin as healthy".into(),
            );
            return;
        }
        if starts >= 2 {
            recorder.note(format!("the never-ready plugin was restarted ({starts} starts)"));
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            recorder.violate(
                "a plugin that never becomes ready is restarted after its health timeout",
                format!("{starts} task starts"),
            );
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    let stop = ServerRequest::JobStop {
        namespace: "default".into(),
        job_id: PLUGIN_JOB_ID.into(),
        purge: false,
    };
    if !matches!(request(cluster, stop, 40).await, ServerReply::JobRegistered { .. }) {
        recorder.violate("a job can be stopped", PLUGIN_JOB_ID.into());
        return;
    }
    loop {
        let running: Vec<(String, String)> = (0..cluster.client_count())
            .flat_map(|client| cluster.host(client).task_processes())
            .collect();
        if running.is_empty() {
            recorder.note("the plugin job stopped: no task left");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            recorder.violate("nothing is left behind after a job stop", format!("{running:?}"));
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Once every claim is released, every volume deregisters (or, made through the cluster, is
/// deleted).
async fn deregister_all(cluster: &SimCluster, recorder: &Recorder, plan: &RealClientPlan) {
    for (id, _) in &plan.volumes {
        let deregister = if plan.create_volumes {
            ServerRequest::VolumeDelete {
                namespace: "default".into(),
                volume_id: id.clone(),
                secrets: Default::default(),
            }
        } else {
            ServerRequest::VolumeDeregister {
                namespace: "default".into(),
                volume_ids: vec![id.clone()],
                force: false,
            }
        };
        let reply = request(cluster, deregister, 20).await;
        if !matches!(reply, ServerReply::Done { .. }) {
            recorder.violate(
                "a released volume can be deregistered",
                format!("deregister of {id} after every claim was released: {reply:?}"),
            );
        }
    }
}

/// After the jobs stop: their tasks still running on a host, and what is not finished yet
/// (allocations, task services in Consul, mounts, volume claims).
fn leftovers(cluster: &SimCluster, state: Option<&ServerState>, plan: &RealClientPlan) -> (Vec<String>, Vec<String>) {
    let is_job = |job_id: &str| plan.jobs.iter().any(|job| job.id == job_id);
    let ours = |alloc_id: &str| {
        state
            .and_then(|state| state.alloc(alloc_id))
            .is_none_or(|alloc| is_job(&alloc.job_id))
    };
    let running: Vec<String> = (0..cluster.client_count())
        .flat_map(|client| {
            cluster
                .host(client)
                .task_processes()
                .into_iter()
                .filter(|(alloc, _)| ours(alloc))
                .map(move |(alloc, task)| format!("{alloc}/{task}"))
        })
        // A container of theirs, running or not, is left too (the driver removes a stopped
        // task's container when the task is destroyed).
        .chain((0..cluster.client_count()).flat_map(|client| {
            let name = cluster.client_name(client).to_string();
            cluster
                .engine(client)
                .map(|engine| engine.containers())
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, alloc)| ours(alloc))
                .map(move |(id, alloc)| format!("container {id} of {alloc} on {name}"))
        }))
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
                .filter(|alloc| is_job(&alloc.job_id) && !alloc.client_terminal())
                .map(|alloc| {
                    let node = state.node(&alloc.node_id).map_or("?", |node| node.name.as_str());
                    format!(
                        "{} of {} on {node} ({:?}/{:?}, version {})",
                        alloc.id, alloc.job_id, alloc.desired_status, alloc.client_status, alloc.job_version
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    unfinished.extend(services);
    // Service identity tokens of this cluster, in Consul or in Raft.
    let tokens = cluster.consul().tokens();
    unfinished.extend(
        tokens
            .iter()
            .filter(|(_, token)| token.description.starts_with("_nomad_si ["))
            .map(|(accessor, token)| format!("SI token {accessor} ({})", token.description)),
    );
    if let Some(state) = state {
        unfinished.extend(
            state
                .si_accessors()
                .filter(|accessor| !tokens.contains_key(&accessor.accessor_id))
                .map(|accessor| format!("SI token accessor {} in Raft only", accessor.accessor_id)),
        );
    }
    let mounts = (0..cluster.client_count()).flat_map(|client| cluster.host(client).mounts());
    unfinished.extend(mounts.map(|mount| format!("mount {mount}")));
    if let Some(state) = state {
        for (id, _) in &plan.volumes {
            let claims = state
                .volume("default", id)
                .map(|volume| volume.read_claims.len() + volume.write_claims.len() + volume.past_claims.len())
                .unwrap_or(0);
            if claims > 0 {
                unfinished.push(format!("{claims} claims on {id}"));
            }
        }
    }
    (running, unfinished)
}
