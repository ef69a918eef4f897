//! Scenarios whose client nodes run the production client driver (`drover_io_real::client`,
//! the core `Client` machine included) on simulated hosts: no hand-written client logic. The
//! clients register, heartbeat and sync allocations themselves, start and stop tasks on their
//! hosts, survive agent kills (tasks keep running on the host and are recovered), and must
//! leave nothing behind once the job stops.
//!
//! The end checks read only the leader's state and the hosts' process tables, so they are
//! independent of the client code they judge.

use std::collections::BTreeMap;
use std::time::Duration;

use drover_core::fsm::ServerState;
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    Allocation, ClientStatus, ConfigValue, DesiredStatus, Job, JobType, RestartMode, RestartPolicy, Task, TaskGroup,
    TaskResources,
};
use drover_io_sim::cluster::SimCluster;
use drover_io_sim::trace::Recorder;

pub const JOB_ID: &str = "web";
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
}

pub fn job(plan: &RealClientPlan) -> Job {
    let mut config = BTreeMap::new();
    if let Some(run_for) = plan.run_for {
        config.insert(
            "run_for".to_string(),
            ConfigValue::String(format!("{}ms", run_for.as_millis())),
        );
    }
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
            tasks: vec![Task {
                name: "server".into(),
                driver: "raw_exec".into(),
                config,
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
    let mut reply = ServerReply::Error(drover_core::rpc::RpcError::unavailable("no live server"));
    for attempt in 0..attempts {
        let gateways = cluster.gateways();
        if gateways.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let gateway = &gateways[attempt as usize % gateways.len()];
        reply = gateway.request(request.clone(), REQUEST_TIMEOUT).await;
        match &reply {
            ServerReply::Error(error) if error.retryable => tokio::time::sleep(Duration::from_millis(500)).await,
            _ => return reply,
        }
    }
    reply
}

pub async fn register(cluster: &SimCluster, plan: &RealClientPlan) -> Result<(), String> {
    match request(
        cluster,
        ServerRequest::JobRegister {
            job: Box::new(job(plan)),
        },
        40,
    )
    .await
    {
        ServerReply::JobRegistered { .. } => Ok(()),
        other => Err(format!("register job: {other:?}")),
    }
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

/// Whether the job runs as it should: `count` allocations the servers want running, each
/// reported running and with its task in the process table of its host. `Err` says what is
/// missing.
fn job_running(cluster: &SimCluster, state: &ServerState, plan: &RealClientPlan) -> Result<(), String> {
    let wanted: Vec<&Allocation> = state
        .allocs()
        .filter(|alloc| alloc.job_id == JOB_ID && alloc.desired_status == DesiredStatus::Run)
        .filter(|alloc| !alloc.client_terminal())
        .collect();
    if wanted.len() != plan.count as usize {
        return Err(format!("{} live allocations, want {}", wanted.len(), plan.count));
    }
    for alloc in wanted {
        if alloc.client_status != ClientStatus::Running {
            return Err(format!("{} is {:?}", alloc.id, alloc.client_status));
        }
        let Some(client) = client_of(cluster, state, alloc) else {
            return Err(format!("{} is on unknown node {}", alloc.id, alloc.node_id));
        };
        let running = cluster.host(client).running_tasks();
        if !running.iter().any(|(id, task)| id == &alloc.id && task == "server") {
            return Err(format!(
                "{} is running per the servers but not on {}",
                alloc.id,
                cluster.client_name(client)
            ));
        }
    }
    Ok(())
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
    loop {
        let verdict = match leader_state(cluster, leader) {
            Some(state) => job_running(cluster, &state, plan).and_then(|()| {
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
        let running: Vec<String> = (0..cluster.client_count())
            .flat_map(|client| {
                cluster
                    .host(client)
                    .running_tasks()
                    .into_iter()
                    .map(move |(alloc, task)| format!("{alloc}/{task}"))
            })
            .collect();
        let unfinished: Vec<String> = leader_state(cluster, leader)
            .map(|state| {
                state
                    .allocs()
                    .filter(|alloc| alloc.job_id == JOB_ID && !alloc.client_terminal())
                    .map(|alloc| format!("{} ({:?})", alloc.id, alloc.client_status))
                    .collect()
            })
            .unwrap_or_default();
        if running.is_empty() && unfinished.is_empty() {
            recorder.note("job stopped: no task left on any host, every allocation finished");
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
