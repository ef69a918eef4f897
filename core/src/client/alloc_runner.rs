//! The alloc runner (§2.2): prerun hooks in order (`alloc_dir`, `await_previous_allocations`,
//! `csi_hook`), then one task runner per task, then postrun hooks once every task is dead, and
//! destroy hooks when the allocation is garbage collected. Postrun never runs before prerun
//! finished or failed.
//!
//! `csi_hook` claims every CSI volume through the servers (the one narrow RPC interface,
//! [`Io::Server`]), retrying while the answer says a retry can help, mounts each through the
//! node plugin's volume manager, and hands `alias → MountInfo` to the task runners as a
//! message. Its stubs are persisted, so after an agent restart it checks the mounts are still
//! there instead of claiming again. Postrun unmounts locally first (no server needed) and then
//! asks the servers to unpublish, each volume on its own.

mod consul_socket;
mod csi;
mod network;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::sync::Arc;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::hooks::{ALLOC_HOOKS, AllocHook, AllocHookResources};
use crate::client::paths::{self, ClientPaths};
use crate::client::task_runner::{LocalTaskState, TaskAction, TaskRunner, TaskSpec, TaskStatus};
use crate::client::volume_hook::HostVolumeConfig;
use crate::client::{
    DriverCapabilities, ExitResult, Io, MountConfigSupport, MountInfo, Outcome, Reply, TaskHandle, UsageOptions,
    VolumeOp,
};
use crate::error::{AllocCallError, AllocCallFailure};
use crate::op::{OpId, OpIds};
use crate::rpc::{ServerReply, ServerRequest};
use crate::structs::{
    Allocation, ClaimMode, ClaimState, ClientStatus, CsiMountOptions, CsiVolumeClaim, JobType, TaskGroup,
    VolumeRequest, VolumeType,
};
use crate::taskenv::{NodeEnv, TaskDirs, TaskEnvSpec, combined_meta};
use crate::time::Instant;

/// Claim retries back off from 1 s to 1 min, for at most 24 h (§2.3).
pub const CLAIM_BACKOFF_START: Duration = Duration::from_secs(1);
pub const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(60);
pub const CLAIM_RETRY_CAP: Duration = Duration::from_secs(24 * 60 * 60);
const _: () = assert!(
    CLAIM_BACKOFF_START.as_nanos() < CLAIM_BACKOFF_MAX.as_nanos()
        && CLAIM_BACKOFF_MAX.as_nanos() < CLAIM_RETRY_CAP.as_nanos(),
    "claim backoff starts below its cap, which is below the give-up time"
);

/// What `csi_hook` keeps per volume so it can restore instead of claiming again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiVolumeStub {
    pub volume_id: String,
    pub namespace: String,
    pub remote_id: String,
    pub plugin_id: String,
    pub mode: ClaimMode,
    pub usage: UsageOptions,
    /// `None` while claimed but not (yet) mounted.
    pub mount: Option<MountInfo>,
    /// A mount was asked of the node plugin (written before it is): even if it failed or
    /// the agent died before the answer, it may have staged the volume, so postrun unmounts
    /// (Nomad's csi_hook unmounts every claimed volume; swarm seed 937).
    #[serde(default)]
    pub mount_attempted: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalAllocState {
    pub csi_stubs: BTreeMap<String, CsiVolumeStub>,
    pub prerun_failed: Option<String>,
    pub postrun_done: bool,
    pub destroyed: bool,
    /// The shared network namespace of a bridge-mode group, once made (until postrun
    /// removes it).
    #[serde(default)]
    pub network: Option<crate::client::AllocNetwork>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocSpec {
    pub alloc: Allocation,
    pub job_type: JobType,
    pub job_name: String,
    /// The job's `meta {}` (the group's and each task's are in `group`).
    pub job_meta: BTreeMap<String, String>,
    pub group: TaskGroup,
    /// The node, as tasks see it (`${node.*}`, `${attr.*}`, `${meta.*}`).
    /// Shared by every allocation and task of the node (a clone per allocation cost 21 KB).
    pub node: Arc<NodeEnv>,
    pub node_id: String,
    pub paths: ClientPaths,
    pub host_volumes: BTreeMap<String, HostVolumeConfig>,
    /// Detected drivers and their capabilities.
    pub drivers: BTreeMap<String, DriverCapabilities>,
    pub seed: u64,
    pub faults: crate::config::ClientFaults,
    /// Consul as Connect tasks use it (`ClientSettings::consul`).
    pub consul: crate::connect::ClientConsul,
    /// `ClientSettings::max_kill_timeout`.
    pub max_kill_timeout: core::time::Duration,
    /// The client's wall clock at its `Instant` zero (Unix nanoseconds).
    pub wall_epoch: i64,
    /// The job's dispatch payload, for tasks with `dispatch_payload`.
    pub job_payload: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocAction {
    Io {
        op: OpId,
        io: Io,
    },
    Persist(Box<LocalAllocState>),
    Task {
        task: String,
        action: TaskAction,
    },
    /// A hook started or finished a lifecycle point (for traces and the hook-order invariant).
    Hook {
        hook: &'static str,
        phase: &'static str,
        result: Result<(), String>,
    },
    Status(ClientStatus),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Prerun { index: usize },
    Running,
    Postrun { index: usize },
    Done,
    Destroying { op: OpId },
    Destroyed,
}

/// A task's MHz on `node`: its `cpu`, or, when cores are reserved for it, their share of the
/// node's MHz (what the scheduler counted against the node).
fn task_mhz(task: &crate::structs::Task, cores: &[u32], node: &crate::structs::Node) -> u32 {
    if cores.is_empty() {
        return task.resources.cpu;
    }
    let mhz = cores.len() as u64 * node.mhz_per_core();
    u32::try_from(mhz).unwrap_or(u32::MAX)
}

/// `csi_hook`'s progress through prerun: restore checks, claims, mounts — each step for every
/// volume before the next step.
#[derive(Clone, Debug, PartialEq, Eq)]
enum CsiStep {
    Restore { index: usize },
    Claim { index: usize },
    Mount { index: usize },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum VolumeRelease {
    Unmount,
    Unpublish,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Release {
    step: VolumeRelease,
    pending: Option<OpId>,
    retry_at: Option<Instant>,
    backoff: Duration,
    give_up_at: Instant,
}

/// Postrun retries unpublish for at most this long; the servers' volume watcher reaps claims
/// of terminal allocations after that.
pub const UNPUBLISH_RETRY_CAP: Duration = Duration::from_secs(5 * 60);

/// What one prerun I/O outcome means for the hook that asked for it.
#[derive(Debug)]
enum PrerunVerdict {
    /// The step is done: go on with the hook (or stop, if asked to).
    Advance,
    /// The step will be retried on its own timer; the message is recorded.
    Retry(String),
    /// The hook failed for good.
    Failed(String),
}

#[derive(Debug)]
pub struct AllocRunner {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    spec: AllocSpec,
    local: LocalAllocState,
    phase: Phase,
    /// Boxed: a map node holds eleven entries, and a 3 KB runner inline made each allocation's
    /// one-task map cost 34 KB.
    tasks: BTreeMap<String, Box<TaskRunner>>,
    resources: AllocHookResources,
    /// Previous and preempted allocations still to finish (`await_previous_allocations`).
    waiting_for: BTreeSet<String>,
    stop_requested: bool,
    /// The one hook I/O in flight during prerun.
    pending: Option<OpId>,
    csi: Option<CsiStep>,
    claim_backoff: Duration,
    claim_retry_at: Option<Instant>,
    claim_give_up_at: Option<Instant>,
    releases: BTreeMap<String, Release>,
    /// Volumes whose stub survived a restart but whose publish target did not: claimed and
    /// mounted again, while the stub keeps the old mount so a failed claim still unmounts
    /// (and unstages) what the interrupted run left behind (swarm seed 378).
    reclaim: BTreeSet<String>,
    /// Volumes claimed in this prerun, with their publish context, until mounted.
    claimed: BTreeMap<String, (Box<crate::structs::CsiVolume>, BTreeMap<String, String>)>,
    alloc_dir_requested: bool,
    /// The `network` hook asked for the namespace in this prerun.
    network_requested: bool,
    /// The namespace's removal in flight (postrun).
    network_op: Option<OpId>,
    /// The `consul_grpc_socket` hook asked for its socket in this prerun.
    grpc_socket_requested: bool,
    /// The socket's removal in flight (postrun), and whether it was done.
    grpc_socket_op: Option<OpId>,
    grpc_socket_closed: bool,
    /// The tasks without a prestart lifecycle were started (at once when there is no
    /// prestart task, else once every prestart task is ready).
    main_started: bool,
    status: ClientStatus,
    actions: Vec<AllocAction>,
}

impl AllocRunner {
    pub fn new(spec: AllocSpec) -> Self {
        Self::restore(spec, LocalAllocState::default(), BTreeMap::new(), false)
    }

    pub fn restore(
        spec: AllocSpec,
        local: LocalAllocState,
        mut tasks: BTreeMap<String, LocalTaskState>,
        servers_contacted: bool,
    ) -> Self {
        let runners = spec
            .group
            .tasks
            .iter()
            .enumerate()
            .map(|(position, task)| {
                let cores = spec
                    .alloc
                    .resources
                    .task_cores
                    .get(&task.name)
                    .cloned()
                    .unwrap_or_default();
                let task_spec = TaskSpec {
                    env: TaskEnvSpec {
                        alloc_id: spec.alloc.id.clone(),
                        alloc_name: spec.alloc.name.clone(),
                        alloc_index: spec.alloc.index(),
                        job_id: spec.alloc.job_id.clone(),
                        job_name: spec.job_name.clone(),
                        namespace: spec.alloc.namespace.clone(),
                        group: spec.group.name.clone(),
                        task: task.name.clone(),
                        cpu_mhz: task_mhz(task, &cores, &spec.node.node),
                        cores,
                        memory_mb: task.resources.memory_mb,
                        memory_max_mb: task.resources.memory_max_mb,
                        dirs: TaskDirs::default(),
                        meta: combined_meta(&spec.job_meta, &spec.group.meta, &task.meta),
                        hook_env: BTreeMap::new(),
                        task_env: task.env.clone(),
                        ports: spec.alloc.resources.ports.clone(),
                        task_ports: spec.alloc.resources.task_ports.clone(),
                        upstreams: spec
                            .group
                            .services
                            .iter()
                            .filter_map(|service| service.connect.as_ref()?.sidecar_service.as_ref()?.proxy.as_ref())
                            .flat_map(|proxy| {
                                proxy
                                    .upstreams
                                    .iter()
                                    .map(|upstream| (upstream.destination_name.clone(), upstream.local_bind_port))
                            })
                            .collect(),
                    },
                    node: spec.node.clone(),
                    alloc_id: spec.alloc.id.clone(),
                    alloc_index: spec.alloc.index(),
                    job_type: spec.job_type,
                    group: spec.group.clone(),
                    task: task.clone(),
                    paths: spec.paths.clone(),
                    host_volumes: spec.host_volumes.clone(),
                    driver: spec.drivers.get(&task.driver).copied(),
                    seed: spec.seed.wrapping_add(position as u64),
                    faults: spec.faults,
                    consul: spec.consul.clone(),
                    max_kill_timeout: spec.max_kill_timeout,
                    wall_epoch: spec.wall_epoch,
                    payload: spec.job_payload.clone(),
                };
                let saved = tasks.remove(&task.name).unwrap_or_default();
                (
                    task.name.clone(),
                    Box::new(TaskRunner::restore(task_spec, saved, servers_contacted)),
                )
            })
            .collect();
        let mut runners: BTreeMap<String, Box<TaskRunner>> = runners;
        for runner in runners.values_mut() {
            runner.set_network(local.network.clone());
        }
        let mut waiting_for: BTreeSet<String> = spec.alloc.preempted_allocations.iter().cloned().collect();
        waiting_for.extend(spec.alloc.previous_allocation.clone());
        AllocRunner {
            clock: crate::time::Monotonic::default(),
            spec,
            local,
            phase: Phase::Idle,
            tasks: runners,
            resources: AllocHookResources::default(),
            waiting_for,
            stop_requested: false,
            pending: None,
            csi: None,
            claim_backoff: CLAIM_BACKOFF_START,
            claim_retry_at: None,
            claim_give_up_at: None,
            releases: BTreeMap::new(),
            reclaim: BTreeSet::new(),
            claimed: BTreeMap::new(),
            alloc_dir_requested: false,
            network_requested: false,
            network_op: None,
            grpc_socket_requested: false,
            grpc_socket_op: None,
            grpc_socket_closed: false,
            main_started: false,
            status: ClientStatus::Pending,
            actions: Vec::new(),
        }
    }

    pub fn alloc_id(&self) -> &str {
        &self.spec.alloc.id
    }

    pub fn alloc(&self) -> &Allocation {
        &self.spec.alloc
    }

    /// The servers promoted this canary (its deployment's group was promoted).
    pub fn promoted(&mut self) {
        if let Some(status) = &mut self.spec.alloc.deployment_status {
            status.canary = false;
        }
    }

    pub fn group(&self) -> &TaskGroup {
        &self.spec.group
    }

    pub fn status(&self) -> ClientStatus {
        self.status
    }

    pub fn local(&self) -> &LocalAllocState {
        &self.local
    }

    /// Every task's state, as the servers are told it.
    pub fn task_states(&self) -> BTreeMap<String, crate::structs::TaskState> {
        self.tasks
            .iter()
            .map(|(name, runner)| (name.clone(), runner.state().clone()))
            .collect()
    }

    pub fn task(&self, name: &str) -> Option<&TaskRunner> {
        self.tasks.get(name).map(|runner| &**runner)
    }

    pub fn tasks(&self) -> impl Iterator<Item = &TaskRunner> {
        self.tasks.values().map(|runner| &**runner)
    }

    pub fn resources(&self) -> &AllocHookResources {
        &self.resources
    }

    /// Postrun finished: nothing of this allocation runs or is mounted any more.
    /// The group's `service` blocks while the allocation runs (Nomad's group services hook
    /// registers them at prerun and removes them when the allocation is stopped), interpolated
    /// with the first task's environment.
    pub fn group_services(&self) -> Vec<crate::structs::Service> {
        if self.phase != Phase::Running || self.stop_requested || self.spec.group.services.is_empty() {
            return Vec::new();
        }
        match self.tasks.values().next() {
            Some(task) => task.interpolate_services(&self.spec.group.services),
            None => self.spec.group.services.clone(),
        }
    }

    /// Before its tasks run (prerun, also again after an agent restart) and not asked to stop.
    pub fn is_starting(&self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Prerun { .. }) && !self.stop_requested
    }

    /// Asked to stop (by the servers, a drain, a client GC or a disconnect).
    pub fn is_stopping(&self) -> bool {
        self.stop_requested
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Destroying { .. } | Phase::Destroyed)
    }

    pub fn is_destroying(&self) -> bool {
        matches!(self.phase, Phase::Destroying { .. })
    }

    pub fn is_destroyed(&self) -> bool {
        self.phase == Phase::Destroyed
    }

    /// Begins prerun (also after an agent restart; the hooks are idempotent and `csi_hook`
    /// restores its mounts).
    pub fn run(&mut self, now: Instant, ops: &mut OpIds) {
        if self.phase != Phase::Idle {
            return;
        }
        if self.local.postrun_done {
            self.phase = Phase::Done;
            self.refresh_status();
            return;
        }
        self.phase = Phase::Prerun { index: 0 };
        self.advance_prerun(now, ops);
    }

    /// The servers want the allocation stopped.
    pub fn stop(&mut self, now: Instant, ops: &mut OpIds) {
        if self.stop_requested {
            return;
        }
        self.stop_requested = true;
        match self.phase {
            Phase::Idle => {
                self.local.prerun_failed = None;
                self.begin_postrun(now, ops);
            }
            // Waiting (for previous allocs or a claim retry) ends now; an op in flight
            // finishes first.
            Phase::Prerun { .. } if self.pending.is_none() => self.begin_postrun(now, ops),
            Phase::Running => {
                for task in self.tasks.values_mut() {
                    task.kill(now, ops);
                }
                self.collect_tasks(now, ops);
            }
            _ => {}
        }
    }

    /// The tasks an operator's restart or signal is for: `task`, or every running task.
    fn targets(&self, task: Option<&str>) -> Result<Vec<String>, AllocCallError> {
        match task {
            Some(name) if self.tasks.contains_key(name) => Ok(vec![name.to_string()]),
            Some(name) => Err(AllocCallError::new(
                AllocCallFailure::UnknownTask,
                format!("Could not find task runner for task: {name}"),
            )),
            None => {
                let running: Vec<String> = self
                    .tasks
                    .iter()
                    .filter(|(_, runner)| runner.state().state == crate::structs::TaskStatus::Running)
                    .map(|(name, _)| name.clone())
                    .collect();
                if running.is_empty() {
                    return Err(AllocCallError::failed(crate::client::task_runner::TASK_NOT_RUNNING));
                }
                Ok(running)
            }
        }
    }

    /// `alloc restart`: `task`, or every running task, restarts at once.
    pub fn restart_by_user(&mut self, now: Instant, task: Option<&str>, ops: &mut OpIds) -> Result<(), AllocCallError> {
        if self.stop_requested || self.phase != Phase::Running {
            return Err(AllocCallError::failed(crate::client::task_runner::TASK_NOT_RUNNING));
        }
        let mut result = Ok(());
        for name in self.targets(task)? {
            if let Some(runner) = self.tasks.get_mut(&name) {
                result = result.and(runner.restart_by_user(now, ops).map_err(AllocCallError::failed));
            }
        }
        self.collect_tasks(now, ops);
        result
    }

    /// `alloc signal`: the handles of `task` (or every running task) to send `signal` to.
    pub fn signal_by_user(
        &mut self,
        now: Instant,
        task: Option<&str>,
        signal: &str,
        ops: &mut OpIds,
    ) -> Result<Vec<TaskHandle>, AllocCallError> {
        if self.stop_requested || self.phase != Phase::Running {
            return Err(AllocCallError::failed(crate::client::task_runner::TASK_NOT_RUNNING));
        }
        let mut handles = Vec::new();
        for name in self.targets(task)? {
            if let Some(runner) = self.tasks.get_mut(&name) {
                handles.push(runner.signal_by_user(now, signal).map_err(AllocCallError::failed)?);
            }
        }
        self.collect_tasks(now, ops);
        Ok(handles)
    }

    /// Garbage collection: remove the alloc dir once postrun is done.
    pub fn destroy(&mut self, now: Instant, ops: &mut OpIds) {
        if self.phase != Phase::Done {
            self.stop(now, ops);
            return;
        }
        let op = ops.allocate();
        self.hook_event(AllocHook::AllocDir, "destroy", Ok(()));
        self.phase = Phase::Destroying { op };
        self.actions.push(AllocAction::Io {
            op,
            io: Io::RemoveAll {
                path: self.spec.paths.alloc(&self.spec.alloc.id),
            },
        });
    }

    /// Allocations that became terminal (for `await_previous_allocations`).
    pub fn allocs_terminal(&mut self, now: Instant, terminal: &BTreeSet<String>, ops: &mut OpIds) {
        let before = self.waiting_for.len();
        self.waiting_for.retain(|id| !terminal.contains(id));
        if before != self.waiting_for.len() && self.pending.is_none() {
            self.advance_prerun(now, ops);
        }
    }

    pub fn servers_contacted(&mut self, now: Instant, ops: &mut OpIds) {
        for task in self.tasks.values_mut() {
            task.servers_contacted(now, ops);
        }
        self.collect_tasks(now, ops);
    }

    pub fn task_exited(&mut self, now: Instant, task: &str, exit: ExitResult, ops: &mut OpIds) {
        if let Some(runner) = self.tasks.get_mut(task) {
            runner.exited(now, exit, ops);
        }
        self.collect_tasks(now, ops);
    }

    pub fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome, ops: &mut OpIds) -> bool {
        if let Phase::Destroying { op: pending } = self.phase
            && pending == op
        {
            self.phase = Phase::Destroyed;
            self.local.destroyed = true;
            self.persist();
            return true;
        }
        if self.pending == Some(op) {
            self.pending = None;
            self.prerun_outcome(now, outcome, ops);
            return true;
        }
        if self.grpc_socket_op == Some(op) {
            self.grpc_socket_op = None;
            self.grpc_socket_closed = true;
            if let Err(error) = outcome {
                self.hook_event(AllocHook::ConsulGrpcSocket, "postrun", Err(error.to_string()));
            }
            self.advance_postrun(now, ops);
            return true;
        }
        if self.network_op == Some(op) {
            self.network_op = None;
            self.network_removed(outcome);
            self.advance_postrun(now, ops);
            return true;
        }
        let release = self
            .releases
            .iter()
            .find(|(_, release)| release.pending == Some(op))
            .map(|(alias, _)| alias.clone());
        if let Some(alias) = release {
            self.release_outcome(now, &alias, outcome, ops);
            return true;
        }
        let mut consumed = false;
        for runner in self.tasks.values_mut() {
            if runner.outcome(now, op, outcome.clone(), ops) {
                consumed = true;
                break;
            }
        }
        if consumed {
            self.collect_tasks(now, ops);
        }
        consumed
    }

    pub fn handle_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        self.clock.observe(now);
        if self.claim_retry_at.is_some_and(|at| now >= at) {
            self.claim_retry_at = None;
            if self.stop_requested {
                self.begin_postrun(now, ops);
            } else {
                self.advance_prerun(now, ops);
            }
        }
        let due: Vec<String> = self
            .releases
            .iter()
            .filter(|(_, release)| release.retry_at.is_some_and(|at| now >= at))
            .map(|(alias, _)| alias.clone())
            .collect();
        for alias in due {
            if let Some(release) = self.releases.get_mut(&alias) {
                release.retry_at = None;
            }
            self.release_step(now, &alias, ops);
        }
        for runner in self.tasks.values_mut() {
            runner.handle_timeout(now, ops);
        }
        self.collect_tasks(now, ops);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let own = self
            .claim_retry_at
            .into_iter()
            .chain(self.releases.values().filter_map(|release| release.retry_at));
        own.chain(self.tasks().filter_map(TaskRunner::poll_timeout)).min()
    }

    pub fn poll_action(&mut self) -> Option<AllocAction> {
        if self.actions.is_empty() {
            None
        } else {
            Some(self.actions.remove(0))
        }
    }

    // --- prerun ---------------------------------------------------------------------------

    fn advance_prerun(&mut self, now: Instant, ops: &mut OpIds) {
        loop {
            let Phase::Prerun { index } = self.phase else { return };
            if self.pending.is_some() || self.claim_retry_at.is_some() {
                return;
            }
            if self.stop_requested {
                self.begin_postrun(now, ops);
                return;
            }
            let Some((hook, phases)) = ALLOC_HOOKS.get(index) else {
                self.start_tasks(now, ops);
                return;
            };
            if !phases.prerun {
                self.phase = Phase::Prerun { index: index + 1 };
                continue;
            }
            match self.prerun_hook(now, *hook, ops) {
                HookProgress::Waiting => return,
                HookProgress::Done => {
                    self.hook_event(*hook, "prerun", Ok(()));
                    self.phase = Phase::Prerun { index: index + 1 };
                }
                HookProgress::Failed(message) => {
                    let hook = *hook;
                    self.fail_prerun(now, hook, message, ops);
                    return;
                }
            }
        }
    }

    fn prerun_hook(&mut self, now: Instant, hook: AllocHook, ops: &mut OpIds) -> HookProgress {
        match hook {
            AllocHook::AllocDir => {
                // The servers refuse such names; a job stored before they did must still not
                // build a directory outside the allocation's.
                if let Some(problem) = self.unusable_path_component() {
                    return HookProgress::Failed(problem);
                }
                // Two mkdirs, tracked by whether the data dir was asked for yet.
                if !self.alloc_dir_requested {
                    self.alloc_dir_requested = true;
                    let op = ops.allocate();
                    self.pending = Some(op);
                    self.actions.push(AllocAction::Io {
                        op,
                        io: Io::Mkdir {
                            path: self.spec.paths.log_dir(&self.spec.alloc.id),
                        },
                    });
                    return HookProgress::Waiting;
                }
                HookProgress::Done
            }
            AllocHook::AwaitPrevious => {
                if self.waiting_for.is_empty() {
                    HookProgress::Done
                } else {
                    HookProgress::Waiting
                }
            }
            AllocHook::Network => self.network_prerun(ops),
            AllocHook::ConsulGrpcSocket => self.grpc_socket_prerun(ops),
            AllocHook::Csi => self.csi_prerun(now, ops),
        }
    }

    /// The allocation ID or a task name that cannot be a directory under the alloc dir.
    fn unusable_path_component(&self) -> Option<String> {
        paths::check_component("allocation ID", &self.spec.alloc.id)
            .err()
            .or_else(|| {
                self.tasks
                    .keys()
                    .find_map(|task| paths::check_component("task name", task).err())
            })
    }

    fn request(&mut self, ops: &mut OpIds, io: Io) -> HookProgress {
        let op = ops.allocate();
        self.pending = Some(op);
        self.actions.push(AllocAction::Io { op, io });
        HookProgress::Waiting
    }

    fn prerun_outcome(&mut self, now: Instant, outcome: Outcome, ops: &mut OpIds) {
        let Phase::Prerun { index } = self.phase else { return };
        let hook = ALLOC_HOOKS[index].0;
        let verdict = match hook {
            AllocHook::AllocDir => match outcome {
                Ok(_) => PrerunVerdict::Advance,
                Err(error) => PrerunVerdict::Failed(error.message),
            },
            AllocHook::AwaitPrevious => PrerunVerdict::Advance,
            AllocHook::Network => self.network_outcome(outcome),
            AllocHook::ConsulGrpcSocket => self.grpc_socket_outcome(outcome),
            AllocHook::Csi => self.csi_outcome(now, outcome),
        };
        match verdict {
            PrerunVerdict::Advance if self.stop_requested => self.begin_postrun(now, ops),
            PrerunVerdict::Advance => self.advance_prerun(now, ops),
            PrerunVerdict::Retry(message) => self.hook_event(hook, "prerun-retry", Err(message)),
            PrerunVerdict::Failed(message) => {
                self.csi = None;
                self.fail_prerun(now, hook, message, ops);
            }
        }
    }

    /// Nomad's task lifecycle: `prestart` tasks start first, the others once every prestart
    /// sidecar runs and every other prestart task finished successfully. Tasks that had begun
    /// before an agent restart are all resumed at once.
    fn start_tasks(&mut self, now: Instant, ops: &mut OpIds) {
        self.phase = Phase::Running;
        let any_prestart = self.tasks().any(TaskRunner::is_prestart);
        let main_began = self.tasks.values().any(|task| !task.is_prestart() && task.has_begun());
        self.main_started = !any_prestart || main_began;
        let main_started = self.main_started;
        for runner in self.tasks.values_mut() {
            if main_started || runner.is_prestart() {
                runner.set_resources(self.resources.clone());
                runner.start(now, ops);
            }
        }
        self.collect_tasks(now, ops);
    }

    /// The main tasks, once the prestart tasks are ready.
    fn start_main_tasks(&mut self, now: Instant, ops: &mut OpIds) {
        if self.main_started
            || self.phase != Phase::Running
            || self.stop_requested
            || !self
                .tasks()
                .filter(|task| task.is_prestart())
                .all(TaskRunner::prestart_ready)
        {
            return;
        }
        self.main_started = true;
        for runner in self.tasks.values_mut().filter(|task| !task.is_prestart()) {
            runner.set_resources(self.resources.clone());
            runner.start(now, ops);
        }
    }

    /// Forwards task actions and moves on once every task is dead.
    fn collect_tasks(&mut self, now: Instant, ops: &mut OpIds) {
        // A task that failed for good takes its siblings down with it, as in Nomad.
        let failed = self
            .tasks
            .values()
            .find(|task| task.is_dead() && task.state().failed)
            .map(|task| task.name().to_string());
        if let Some(failed) = failed
            && self.phase == Phase::Running
        {
            for runner in self.tasks.values_mut() {
                runner.sibling_failed(now, &failed, ops);
            }
        }
        // A leader task that finished takes the others with it, as Nomad's allocation runner.
        let leader_done = self.tasks.values().any(|task| task.is_leader() && task.is_dead());
        if leader_done && self.phase == Phase::Running {
            for runner in self.tasks.values_mut().filter(|task| !task.is_leader()) {
                runner.leader_dead(now, ops);
            }
        }
        self.start_main_tasks(now, ops);
        // Every other task is done: the sidecars are stopped, as Nomad does.
        if self.phase == Phase::Running
            && self.main_started
            && self.tasks.values().any(|task| task.is_sidecar() && !task.is_dead())
            && self.tasks.values().all(|task| task.is_sidecar() || task.is_dead())
        {
            for runner in self.tasks.values_mut().filter(|task| task.is_sidecar()) {
                runner.kill(now, ops);
            }
        }
        for (name, runner) in &mut self.tasks {
            while let Some(action) = runner.poll_action() {
                self.actions.push(AllocAction::Task {
                    task: name.clone(),
                    action,
                });
            }
        }
        self.refresh_status();
        if self.phase == Phase::Running && self.tasks().all(TaskRunner::is_dead) {
            self.begin_postrun(now, ops);
        }
    }

    fn refresh_status(&mut self) {
        let status = if self.local.prerun_failed.is_some() {
            ClientStatus::Failed
        } else if self
            .tasks
            .values()
            .any(|task| task.state().state == TaskStatus::Running)
        {
            ClientStatus::Running
        } else if matches!(self.phase, Phase::Idle | Phase::Prerun { .. }) {
            ClientStatus::Pending
        } else if self.tasks.values().all(|task| task.state().state == TaskStatus::Dead) {
            if self.tasks.values().any(|task| task.state().failed) {
                ClientStatus::Failed
            } else {
                ClientStatus::Complete
            }
        } else {
            ClientStatus::Pending
        };
        if status != self.status {
            self.status = status;
            self.actions.push(AllocAction::Status(status));
        }
    }

    // --- postrun --------------------------------------------------------------------------

    fn begin_postrun(&mut self, now: Instant, ops: &mut OpIds) {
        if matches!(
            self.phase,
            Phase::Postrun { .. } | Phase::Done | Phase::Destroying { .. } | Phase::Destroyed
        ) {
            return;
        }
        // Tasks that never started are dead without running.
        for runner in self.tasks.values_mut() {
            runner.kill(now, ops);
        }
        if !self.tasks().all(TaskRunner::is_dead) {
            // A task is still being stopped (one from before an agent restart, or one whose
            // start is in flight): postrun hooks (unmounts) wait until it is gone.
            self.phase = Phase::Running;
            self.collect_tasks(now, ops);
            return;
        }
        self.claim_retry_at = None;
        self.phase = Phase::Postrun { index: 0 };
        self.collect_tasks(now, ops);
        self.advance_postrun(now, ops);
    }

    fn advance_postrun(&mut self, now: Instant, ops: &mut OpIds) {
        loop {
            let Phase::Postrun { index } = self.phase else { return };
            let Some((hook, phases)) = ALLOC_HOOKS.get(index) else {
                self.phase = Phase::Done;
                self.local.postrun_done = true;
                self.persist();
                self.refresh_status();
                return;
            };
            if !phases.postrun {
                self.phase = Phase::Postrun { index: index + 1 };
                continue;
            }
            match hook {
                AllocHook::Csi => {
                    if self.releases.is_empty() {
                        for alias in self.local.csi_stubs.keys() {
                            self.releases.insert(
                                alias.clone(),
                                Release {
                                    step: VolumeRelease::Unmount,
                                    pending: None,
                                    retry_at: None,
                                    backoff: CLAIM_BACKOFF_START,
                                    give_up_at: now + UNPUBLISH_RETRY_CAP,
                                },
                            );
                        }
                        for alias in self.releases.keys().cloned().collect::<Vec<_>>() {
                            self.release_step(now, &alias, ops);
                        }
                    }
                    if self
                        .releases
                        .values()
                        .any(|release| release.step != VolumeRelease::Done)
                    {
                        return;
                    }
                    self.releases.clear();
                    self.hook_event(*hook, "postrun", Ok(()));
                }
                AllocHook::Network => {
                    if !self.network_postrun(ops) {
                        return;
                    }
                    self.hook_event(*hook, "postrun", Ok(()));
                }
                AllocHook::ConsulGrpcSocket => {
                    if !self.grpc_socket_postrun(ops) {
                        return;
                    }
                    self.hook_event(*hook, "postrun", Ok(()));
                }
                AllocHook::AllocDir | AllocHook::AwaitPrevious => {
                    self.hook_event(*hook, "postrun", Ok(()));
                }
            }
            self.phase = Phase::Postrun { index: index + 1 };
        }
    }

    /// A prerun hook failed for good: every task that had not begun is failed with the
    /// reason (Nomad's `MarkFailedDead`), and postrun releases what prerun took.
    fn fail_prerun(&mut self, now: Instant, hook: AllocHook, message: String, ops: &mut OpIds) {
        self.hook_event(hook, "prerun", Err(message.clone()));
        let reason = format!("prerun hook \"{}\" failed: {message}", hook.name());
        for runner in self.tasks.values_mut() {
            runner.setup_failed(now, &reason, ops);
        }
        self.local.prerun_failed = Some(reason);
        self.persist();
        self.begin_postrun(now, ops);
    }

    fn hook_event(&mut self, hook: AllocHook, phase: &'static str, result: Result<(), String>) {
        self.actions.push(AllocAction::Hook {
            hook: hook.name(),
            phase,
            result,
        });
    }

    fn persist(&mut self) {
        self.actions.push(AllocAction::Persist(Box::new(self.local.clone())));
    }
}

enum HookProgress {
    Waiting,
    Done,
    Failed(String),
}
