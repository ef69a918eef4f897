//! The task runner (§2.4): runs a task's prestart hooks in order, starts the task through its
//! driver, runs poststart hooks, watches it, restarts it under the group's restart policy,
//! kills it on request, and runs the stop hooks once it is gone for good.
//!
//! Hook progress (`prestart done`, data, env), the driver handle and the task state are
//! persisted as one record on every change ([`TaskAction::Persist`]); a runner rebuilt from
//! that record after an agent restart skips finished hooks (re-applying their env) and
//! reattaches to the task instead of starting it again. If reattaching fails for a task that
//! was running, the runner waits for the server-contact gate before starting it anew, so a
//! task the servers already moved elsewhere is not restarted here (#1795).

mod envoy;
mod exit;
mod prestart;
mod sids;
mod templates;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::hooks::{AllocHookResources, HookError, HookResponse, HookState, TaskHook, TaskPhases, task_hooks};
use crate::client::paths::{self, ClientPaths};
use crate::client::plugin_supervisor::{PluginSupervisor, SupervisorOut};
use crate::client::registry::{PluginInfo, PluginKind};
use crate::client::restarts::{self, Decision, RestartTracker, go_duration};
use crate::client::volume_hook::{self, HostVolumeConfig};
use crate::client::{
    DeviceConfig, DriverCapabilities, ExitResult, Io, MountConfig, Outcome, Reply, TaskConfig, TaskEvent, TaskHandle,
    events,
};
use crate::op::{OpId, OpIds};
use crate::structs::{JobType, Propagation, Task, TaskGroup};
use crate::taskenv::{NodeEnv, TaskDirs, TaskEnv, TaskEnvSpec};
use crate::time::Instant;

/// Nomad keeps the last ten events per task.
pub const MAX_EVENTS: usize = crate::structs::MAX_TASK_EVENTS;
/// Nomad's `ErrTaskNotRunning`, for a restart or signal of a task that is not running.
pub const TASK_NOT_RUNNING: &str = "Task not running";

pub use crate::structs::{TaskState, TaskStatus};

/// Everything of a task runner that survives an agent restart.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalTaskState {
    pub hooks: BTreeMap<String, HookState>,
    pub handle: Option<TaskHandle>,
    pub state: TaskState,
}

/// The fixed facts a task runner is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    /// What the task's environment is built from (directories and hook variables are filled
    /// in when it starts).
    pub env: TaskEnvSpec,
    pub node: Arc<NodeEnv>,
    pub alloc_id: String,
    pub alloc_index: u32,
    pub job_type: JobType,
    pub group: TaskGroup,
    pub task: Task,
    pub paths: ClientPaths,
    pub host_volumes: BTreeMap<String, HostVolumeConfig>,
    /// `None`: the driver is not detected on this node.
    pub driver: Option<DriverCapabilities>,
    pub seed: u64,
    pub faults: crate::config::ClientFaults,
    /// Consul as Connect tasks use it (`ClientSettings::consul`).
    pub consul: crate::connect::ClientConsul,
    /// The client's cap on `kill_timeout` (`ClientSettings::max_kill_timeout`).
    pub max_kill_timeout: Duration,
    /// The client's wall clock at its `Instant` zero, in Unix nanoseconds: event times.
    pub wall_epoch: i64,
    /// The job's dispatch payload (empty unless it was dispatched with one).
    pub payload: Vec<u8>,
}

pub use crate::config::DEFAULT_MAX_KILL_TIMEOUT;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskAction {
    Io {
        op: OpId,
        io: Io,
    },
    Persist(Box<LocalTaskState>),
    Event(TaskEvent),
    Register(PluginInfo),
    Deregister {
        kind: PluginKind,
        name: String,
        alloc_id: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Restoring {
        op: OpId,
    },
    WaitingOnServers,
    Prestart {
        index: usize,
        io: usize,
        op: Option<OpId>,
    },
    Starting {
        op: OpId,
    },
    Running,
    RestartDelay {
        until: Instant,
    },
    Killing {
        op: OpId,
    },
    /// Killed with a `shutdown_delay`: the task still runs, its services are out of Consul,
    /// and its kill signal goes at `until`.
    ShutdownDelay {
        until: Instant,
    },
    /// The template hook (prestart hook `index`) renders; its machine owns the I/O.
    Rendering {
        index: usize,
    },
    /// The `consul_si_token` hook (prestart hook `index`) reads, derives or writes the task's
    /// service identity token.
    SiToken {
        index: usize,
        step: sids::Step,
    },
    /// The `envoy_bootstrap` hook (prestart hook `index`) writes the sidecar's bootstrap.
    Envoy {
        index: usize,
        step: envoy::Step,
    },
    /// The task's leader is gone; what it left behind is being destroyed, then `after`.
    Destroying {
        op: OpId,
        after: exit::AfterDestroy,
        /// Earlier attempts that failed for want of an answer, if any.
        failed: Option<exit::DestroyFailures>,
    },
    /// A destroy failed for want of an answer (a daemon down or hung): it is asked again at
    /// `until`.
    DestroyPause {
        until: Instant,
        after: exit::AfterDestroy,
        failed: exit::DestroyFailures,
    },
    Stopping {
        index: usize,
        op: Option<OpId>,
    },
    Dead,
}

impl Phase {
    /// The state's name, for coverage ([`crate::cover`]).
    fn name(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Restoring { .. } => "restoring",
            Phase::WaitingOnServers => "waiting_on_servers",
            Phase::Prestart { .. } => "prestart",
            Phase::Starting { .. } => "starting",
            Phase::Running => "running",
            Phase::RestartDelay { .. } => "restart_delay",
            Phase::Killing { .. } => "killing",
            Phase::ShutdownDelay { .. } => "shutdown_delay",
            Phase::Rendering { .. } => "rendering",
            Phase::SiToken { .. } => "si_token",
            Phase::Envoy { .. } => "envoy",
            Phase::Destroying { .. } => "destroying",
            Phase::DestroyPause { .. } => "destroy_pause",
            Phase::Stopping { .. } => "stopping",
            Phase::Dead => "dead",
        }
    }
}

#[derive(Debug)]
pub struct TaskRunner {
    /// The allocation's shared network namespace (bridge mode), for the task to join.
    network: Option<crate::client::AllocNetwork>,
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    spec: TaskSpec,
    hooks: Vec<(TaskHook, TaskPhases)>,
    local: LocalTaskState,
    phase: Phase,
    tracker: RestartTracker,
    resources: AllocHookResources,
    servers_contacted: bool,
    kill_requested: bool,
    /// The task is being killed to be restarted (its plugin never became healthy).
    restart_after_kill: bool,
    /// The task is being killed to be restarted at once (a template changed).
    restart_requested: bool,
    /// The template hook's machine, for a task with `template` blocks.
    templates: Option<crate::client::templates::TemplateRunner>,
    /// Mounts, devices and env gathered by this round of prestart hooks.
    mounts: Vec<MountConfig>,
    devices: Vec<DeviceConfig>,
    hook_env: BTreeMap<String, String>,
    /// Replies of the current hook's I/O, in order.
    replies: Vec<Reply>,
    supervisor: Option<PluginSupervisor>,
    actions: Vec<TaskAction>,
}

impl TaskRunner {
    /// Moves to `phase`, counted as a transition of the task_runner machine.
    fn set_phase(&mut self, phase: Phase) {
        crate::cover::transition("task_runner", self.phase.name(), phase.name());
        self.phase = phase;
    }
    /// The allocation's shared network namespace, once made (bridge mode).
    pub fn set_network(&mut self, network: Option<crate::client::AllocNetwork>) {
        self.network = network;
    }

    pub fn new(spec: TaskSpec) -> Self {
        Self::restore(spec, LocalTaskState::default(), false)
    }

    /// A runner rebuilt from its persisted record after an agent restart.
    pub fn restore(spec: TaskSpec, local: LocalTaskState, servers_contacted: bool) -> Self {
        let hooks = task_hooks(&spec.task, spec.consul.acl);
        let templates = (!spec.task.templates.is_empty()).then(|| {
            crate::client::templates::TemplateRunner::new(
                spec.task.templates.clone(),
                spec.paths.task_dir(&spec.alloc_id, &spec.task.name),
            )
        });
        let policy = spec
            .task
            .restart_policy
            .unwrap_or_else(|| spec.group.restart_policy(spec.job_type));
        // Batch tasks are not restarted after a success, nor are prestart tasks other than
        // sidecars (Nomad's `NewRestartTracker`): they ran to completion.
        let on_success = match &spec.task.lifecycle {
            Some(lifecycle) if lifecycle.hook == "prestart" => lifecycle.sidecar,
            _ => spec.job_type != JobType::Batch,
        };
        let tracker = RestartTracker::new(policy, on_success, spec.seed);
        TaskRunner {
            network: None,
            clock: crate::time::Monotonic::default(),
            spec,
            hooks,
            local,
            phase: Phase::Idle,
            tracker,
            resources: AllocHookResources::default(),
            servers_contacted,
            kill_requested: false,
            restart_after_kill: false,
            restart_requested: false,
            templates,
            mounts: Vec::new(),
            devices: Vec::new(),
            hook_env: BTreeMap::new(),
            replies: Vec::new(),
            supervisor: None,
            actions: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.spec.task.name
    }

    /// The task's `service` blocks, interpolated with its environment as Nomad registers them.
    pub fn services(&self) -> Vec<crate::structs::Service> {
        if self.spec.task.services.is_empty() {
            return Vec::new();
        }
        let env = self.task_env();
        self.spec
            .task
            .services
            .iter()
            .map(|service| env.interpolate_service(service))
            .collect()
    }

    /// `lifecycle { hook = "prestart" }`: the task starts before the others, which wait for it
    /// to run (a sidecar) or to finish successfully.
    pub fn is_prestart(&self) -> bool {
        self.spec
            .task
            .lifecycle
            .as_ref()
            .is_some_and(|lifecycle| lifecycle.hook == "prestart")
    }

    /// `lifecycle { sidecar = true }`: runs beside the main tasks and ends with them.
    /// Whether this is the group's `leader` task.
    pub fn is_leader(&self) -> bool {
        self.spec.task.leader
    }

    pub fn is_sidecar(&self) -> bool {
        self.spec
            .task
            .lifecycle
            .as_ref()
            .is_some_and(|lifecycle| lifecycle.sidecar)
    }

    /// A prestart task the others may start after: a sidecar running, or a task finished
    /// successfully.
    pub fn prestart_ready(&self) -> bool {
        let sidecar = self
            .spec
            .task
            .lifecycle
            .as_ref()
            .is_some_and(|lifecycle| lifecycle.sidecar);
        if sidecar {
            self.local.state.state == TaskStatus::Running
        } else {
            self.local.state.state == TaskStatus::Dead && !self.local.state.failed
        }
    }

    /// Whether the task has begun at some point (a handle, a state past pending, events).
    pub fn has_begun(&self) -> bool {
        self.local.handle.is_some() || self.local.state.state != TaskStatus::Pending
    }

    /// Services interpolated with this task's environment.
    pub fn interpolate_services(&self, services: &[crate::structs::Service]) -> Vec<crate::structs::Service> {
        let env = self.task_env();
        services
            .iter()
            .map(|service| env.interpolate_service(service))
            .collect()
    }

    pub fn state(&self) -> &TaskState {
        &self.local.state
    }

    pub fn local(&self) -> &LocalTaskState {
        &self.local
    }

    pub fn is_dead(&self) -> bool {
        self.phase == Phase::Dead
    }

    /// The hooks this task runs, in order (for traces and tests).
    pub fn hook_names(&self) -> Vec<&'static str> {
        self.hooks.iter().map(|(hook, _)| hook.name()).collect()
    }

    pub fn set_resources(&mut self, resources: AllocHookResources) {
        self.resources = resources;
    }

    /// Begins (or, for a restored runner, resumes) the task.
    pub fn start(&mut self, now: Instant, ops: &mut OpIds) {
        if self.phase != Phase::Idle {
            return;
        }
        if self.local.state.state == TaskStatus::Dead {
            // Finished before the agent restarted; nothing to run again.
            self.set_phase(Phase::Dead);
            return;
        }
        if let Some(handle) = self.local.handle.clone() {
            let op = ops.allocate();
            self.set_phase(Phase::Restoring { op });
            self.actions.push(TaskAction::Io {
                op,
                io: Io::RecoverTask { handle },
            });
            return;
        }
        if self.local.state.events.is_empty() {
            self.event(now, events::RECEIVED, "Task received by client");
        }
        self.begin_prestart(now, ops);
    }

    /// The client heard from servers for the first time since it started.
    pub fn servers_contacted(&mut self, now: Instant, ops: &mut OpIds) {
        self.servers_contacted = true;
        if self.phase == Phase::WaitingOnServers {
            self.begin_prestart(now, ops);
        }
    }

    /// Stop the task for good (the allocation is stopping).
    pub fn kill(&mut self, now: Instant, ops: &mut OpIds) {
        if self.kill_requested || matches!(self.phase, Phase::Dead | Phase::Stopping { .. }) {
            return;
        }
        self.kill_requested = true;
        match self.phase {
            Phase::Running => self.send_kill(now, ops),
            // A restored runner that has not reattached yet may still hold a process from
            // before the agent restarted: it is stopped through its handle, never abandoned
            // (found by the real-client simulation: a client restarted after its allocations
            // were lost left their tasks running for good).
            // (`send_kill` without a handle runs the stop hooks at once.)
            Phase::Idle
            | Phase::WaitingOnServers
            | Phase::RestartDelay { .. }
            | Phase::Rendering { .. }
            | Phase::SiToken {
                step: sids::Step::Waiting { .. },
                ..
            }
            | Phase::Envoy {
                step: envoy::Step::Waiting { .. },
                ..
            } => self.send_kill(now, ops),
            // An operation is in flight; its outcome finishes the kill.
            _ => {}
        }
    }

    /// Another task of the allocation failed for good: this one is killed too.
    pub fn sibling_failed(&mut self, now: Instant, sibling: &str, ops: &mut OpIds) {
        if self.kill_requested || matches!(self.phase, Phase::Dead | Phase::Stopping { .. }) {
            return;
        }
        self.event_with(
            now,
            events::SIBLING_FAILED,
            &format!("Task's sibling \"{sibling}\" failed"),
            details([("failed_sibling", sibling.to_string())]),
        );
        self.kill(now, ops);
    }

    /// The allocation's prerun failed before this task could start (Nomad's
    /// `MarkFailedDead`): the task is failed and dead, with a "Setup Failure" event saying why,
    /// so `alloc status` explains the failed allocation.
    pub fn setup_failed(&mut self, now: Instant, reason: &str, ops: &mut OpIds) {
        if self.kill_requested || self.has_begun() || matches!(self.phase, Phase::Dead | Phase::Stopping { .. }) {
            return;
        }
        self.local.state.failed = true;
        let message = format!("failed to setup alloc: {reason}");
        self.event_with(
            now,
            events::SETUP_FAILURE,
            &message,
            details([("setup_error", message.clone()), ("fails_task", "true".into())]),
        );
        self.kill(now, ops);
    }

    fn decide(&mut self, now: Instant, decision: Decision, ops: &mut OpIds) {
        match decision {
            Decision::Restart { delay, reason } => {
                self.local.state.restarts += 1;
                self.local.state.last_restart = self.wall(now);
                self.local.state.state = TaskStatus::Pending;
                self.event_with(
                    now,
                    events::RESTARTING,
                    &format!("Task restarting in {}", go_duration(delay)),
                    details([
                        ("restart_reason", reason),
                        ("start_delay", delay.as_nanos().to_string()),
                    ]),
                );
                self.set_phase(Phase::RestartDelay { until: now + delay });
                self.persist();
            }
            Decision::NotRestarting { reason } => {
                self.local.state.failed = true;
                self.event_with(
                    now,
                    events::NOT_RESTARTING,
                    &reason,
                    details([("restart_reason", reason.clone()), ("fails_task", "true".into())]),
                );
                self.begin_stop(now, ops);
            }
            Decision::Terminated { .. } => self.begin_stop(now, ops),
        }
    }

    /// Routes an I/O outcome; returns false when the op is not this runner's.
    pub fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome, ops: &mut OpIds) -> bool {
        if let Some(supervisor) = &mut self.supervisor
            && supervisor.owns(op)
        {
            let mut out = Vec::new();
            supervisor.outcome(now, op, outcome, ops, &mut out);
            self.supervisor_out(now, out, ops);
            return true;
        }
        if self.templates.as_ref().is_some_and(|templates| templates.owns(op)) {
            self.templates_outcome(now, op, outcome, ops);
            return true;
        }
        match self.phase.clone() {
            Phase::Restoring { op: pending } if pending == op => self.restore_outcome(now, outcome, ops),
            Phase::Prestart {
                index,
                io,
                op: Some(pending),
            } if pending == op => self.prestart_io_outcome(now, index, io, outcome, ops),
            Phase::Starting { op: pending } if pending == op => self.start_outcome(now, outcome, ops),
            Phase::Killing { op: pending } if pending == op => self.kill_outcome(now, outcome, ops),
            Phase::Destroying {
                op: pending,
                after,
                failed,
            } if pending == op => self.destroy_outcome(now, after, failed, outcome, ops),
            Phase::Stopping {
                index,
                op: Some(pending),
            } if pending == op => self.stop_hook_outcome(now, index, outcome, ops),
            Phase::SiToken { index, step } if step.op() == Some(op) => {
                self.si_token_outcome(now, index, step, outcome, ops)
            }
            Phase::Envoy { index, step } if step.op() == Some(op) => self.envoy_outcome(now, index, step, outcome, ops),
            _ => return false,
        }
        true
    }

    /// One I/O step of the prestart hook at `index` came back.
    fn prestart_io_outcome(&mut self, now: Instant, index: usize, io: usize, outcome: Outcome, ops: &mut OpIds) {
        match outcome {
            Ok(reply) => {
                self.replies.push(reply);
                self.set_phase(Phase::Prestart {
                    index,
                    io: io + 1,
                    op: None,
                });
                self.run_prestart(now, ops);
            }
            Err(error) => {
                let hook = self.hooks[index].0;
                self.prestart_failed(
                    now,
                    HookError::recoverable(format!("prestart hook \"{}\" failed: {error}", hook.name())),
                    ops,
                );
            }
        }
    }

    /// The driver's answer to `StartTask`.
    fn start_outcome(&mut self, now: Instant, outcome: Outcome, ops: &mut OpIds) {
        let (message, recoverable) = match outcome {
            Ok(Reply::Started(handle)) => {
                debug_assert!(
                    self.local.handle.is_none(),
                    "task {} started while its previous process is still held",
                    self.spec.task.name
                );
                self.local.handle = Some(handle);
                self.local.state.state = TaskStatus::Running;
                self.local.state.started_at = self.wall(now);
                self.event(now, events::STARTED, "Task started by client");
                self.persist();
                if self.kill_requested {
                    self.send_kill(now, ops);
                } else {
                    self.set_phase(Phase::Running);
                    self.poststart(now, ops);
                }
                return;
            }
            Err(error) => (error.message, restarts::start_error_recoverable(error.kind)),
            Ok(reply) => (format!("unexpected reply {reply:?}"), true),
        };
        self.event_with(
            now,
            events::DRIVER_FAILURE,
            &message,
            details([("driver_error", message.clone())]),
        );
        if self.kill_requested {
            self.begin_stop(now, ops);
        } else {
            let decision = self.tracker.on_start_error(now, recoverable);
            self.decide(now, decision, ops);
        }
    }

    /// Stop hooks are best effort: a failure is recorded, the next hook still runs.
    fn stop_hook_outcome(&mut self, now: Instant, index: usize, outcome: Outcome, ops: &mut OpIds) {
        if let Err(error) = outcome {
            let hook = self.hooks[index].0;
            self.event(
                now,
                events::SETUP_FAILURE,
                &format!("stop hook \"{}\" failed: {error}", hook.name()),
            );
        }
        self.set_phase(Phase::Stopping {
            index: index + 1,
            op: None,
        });
        self.run_stop(now, ops);
    }

    pub fn handle_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        self.clock.observe(now);
        if let Phase::RestartDelay { until } = self.phase
            && now >= until
        {
            self.begin_prestart(now, ops);
        }
        if let Phase::ShutdownDelay { until } = self.phase
            && now >= until
        {
            self.send_kill_now(now, ops);
        }
        if let Phase::DestroyPause { until, after, failed } = self.phase.clone()
            && now >= until
        {
            self.destroy_again(now, after, failed, ops);
        }
        if let Some(supervisor) = &mut self.supervisor {
            let mut out = Vec::new();
            supervisor.handle_timeout(now, ops, &mut out);
            self.supervisor_out(now, out, ops);
        }
        self.templates_timeout(now, ops);
        self.si_token_timeout(now, ops);
        self.envoy_timeout(now, ops);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let delay = match self.phase {
            Phase::RestartDelay { until } | Phase::ShutdownDelay { until } | Phase::DestroyPause { until, .. } => {
                Some(until)
            }
            Phase::SiToken {
                step: sids::Step::Waiting { until, .. },
                ..
            }
            | Phase::Envoy {
                step: envoy::Step::Waiting { until, .. },
                ..
            } => Some(until),
            _ => None,
        };
        let supervisor = self.supervisor.as_ref().and_then(PluginSupervisor::poll_timeout);
        let templates = self.templates.as_ref().and_then(|templates| templates.poll_timeout());
        delay.into_iter().chain(supervisor).chain(templates).min()
    }

    pub fn poll_action(&mut self) -> Option<TaskAction> {
        if self.actions.is_empty() {
            None
        } else {
            Some(self.actions.remove(0))
        }
    }

    // --- prestart -------------------------------------------------------------------------

    fn begin_prestart(&mut self, now: Instant, ops: &mut OpIds) {
        if self.kill_requested {
            // A task reattached after an agent restart is stopped through its handle.
            self.send_kill(now, ops);
            return;
        }
        self.mounts.clear();
        self.devices.clear();
        self.hook_env.clear();
        self.replies.clear();
        self.set_phase(Phase::Prestart {
            index: 0,
            io: 0,
            op: None,
        });
        self.run_prestart(now, ops);
    }

    /// Advances prestart hooks until one needs I/O or all are done.
    fn run_prestart(&mut self, now: Instant, ops: &mut OpIds) {
        loop {
            let Phase::Prestart { index, io, op: None } = self.phase else {
                return;
            };
            if self.kill_requested {
                self.send_kill(now, ops);
                return;
            }
            if index == self.hooks.len() {
                self.start_task(now, ops);
                return;
            }
            let (hook, phases) = self.hooks[index];
            let name = hook.name();
            let saved = self.local.hooks.get(name).cloned().unwrap_or_default();
            if !phases.prestart || saved.prestart_done {
                // A finished hook is not run again; its env still applies.
                self.hook_env.extend(saved.env);
                self.next_hook(index);
                continue;
            }
            if hook == TaskHook::Template {
                self.set_phase(Phase::Rendering { index });
                self.templates_prestart(now, ops);
                return;
            }
            if hook == TaskHook::SiToken {
                self.si_token_prestart(index, ops);
                return;
            }
            if hook == TaskHook::EnvoyBootstrap {
                self.envoy_prestart(now, index, ops);
                return;
            }
            let needed = self.prestart_io(hook);
            if io < needed.len() {
                let op = ops.allocate();
                self.set_phase(Phase::Prestart {
                    index,
                    io,
                    op: Some(op),
                });
                self.actions.push(TaskAction::Io {
                    op,
                    io: needed[io].clone(),
                });
                return;
            }
            match self.prestart_finish(hook) {
                Ok(response) => {
                    self.hook_env.extend(response.env.clone());
                    for mount in response.mounts {
                        volume_hook::add_mount(&mut self.mounts, mount);
                    }
                    self.devices.extend(response.devices);
                    let state = HookState {
                        prestart_done: response.done,
                        data: response.data,
                        env: response.env,
                    };
                    if self.local.hooks.get(name).cloned().unwrap_or_default() != state {
                        self.local.hooks.insert(name.to_string(), state);
                        self.persist();
                    }
                    self.next_hook(index);
                }
                Err(error) => {
                    self.prestart_failed(now, error, ops);
                    return;
                }
            }
        }
    }

    fn next_hook(&mut self, index: usize) {
        self.replies.clear();
        self.set_phase(Phase::Prestart {
            index: index + 1,
            io: 0,
            op: None,
        });
    }

    fn prestart_failed(&mut self, now: Instant, error: HookError, ops: &mut OpIds) {
        let mut fields = details([("setup_error", error.message.clone())]);
        if !error.recoverable {
            fields.insert("fails_task".into(), "true".into());
        }
        self.event_with(now, events::SETUP_FAILURE, &error.message, fields);
        if self.kill_requested {
            self.begin_stop(now, ops);
            return;
        }
        let decision = self.tracker.on_start_error(now, error.recoverable);
        self.decide(now, decision, ops);
    }

    fn start_task(&mut self, now: Instant, ops: &mut OpIds) {
        if self.local.handle.is_some() {
            // Reattached after a restart: the task is already running.
            self.local.state.state = TaskStatus::Running;
            self.set_phase(Phase::Running);
            self.persist();
            self.poststart(now, ops);
            return;
        }
        let env = self.task_env();
        let spec = &self.spec;
        let mut task_config = env.interpolate_config(&spec.task.config);
        // A Connect sidecar's image with the Envoy version Consul prefers (`envoy_version`).
        if let Some(image) = self
            .local
            .hooks
            .get(TaskHook::EnvoyVersion.name())
            .and_then(|state| state.data.get(prestart::ENVOY_IMAGE))
        {
            task_config.insert("image".into(), crate::structs::ConfigValue::String(image.clone()));
        }
        let config = TaskConfig {
            alloc_id: spec.alloc_id.clone(),
            task: spec.task.name.clone(),
            driver: spec.task.driver.clone(),
            config: task_config,
            env: env.vars().clone(),
            mounts: self.mounts.clone(),
            devices: self.devices.clone(),
            task_dir: spec.paths.task_dir(&spec.alloc_id, &spec.task.name),
            log_dir: spec.paths.log_dir(&spec.alloc_id),
            kill_timeout: self.kill_timeout(),
            cpu_mhz: spec.env.cpu_mhz,
            memory_mb: spec.task.resources.memory_mb,
            memory_max_mb: spec.task.resources.memory_max_mb,
            logs: spec.task.logs,
            node_cpu_mhz: spec.node.node.resources.cpu,
            node_cores: spec.node.node.cores(),
            reserved_cores: spec.env.cores.clone(),
            network: self.network.clone(),
        };
        let op = ops.allocate();
        self.set_phase(Phase::Starting { op });
        self.event(now, events::SETUP, "Building Task Directory");
        self.actions.push(TaskAction::Io {
            op,
            io: Io::StartTask(Box::new(config)),
        });
    }

    fn poststart(&mut self, now: Instant, ops: &mut OpIds) {
        for (hook, phases) in self.hooks.clone() {
            if !phases.poststart {
                continue;
            }
            if hook == TaskHook::Template
                && let Some(templates) = &mut self.templates
            {
                templates.watch(now);
            }
            if hook == TaskHook::CsiPluginSupervisor
                && self.supervisor.is_none()
                && let Some(plugin) = self.spec.task.csi_plugin.clone()
            {
                let socket = self.spec.paths.plugin_socket(&self.spec.alloc_id);
                let root = self.spec.paths.plugin_root(plugin.plugin_type, &plugin.id);
                // Without filesystem isolation the plugin sees host paths, so the paths it is
                // sent must be host paths too.
                let container = if self.spec.driver.is_some_and(|caps| caps.fs_isolation) {
                    plugin.stage_publish_base_dir.clone()
                } else {
                    root.clone()
                };
                let mut supervisor =
                    PluginSupervisor::start(now, plugin, self.spec.alloc_id.clone(), socket, root, container);
                let mut out = Vec::new();
                supervisor.handle_timeout(now, ops, &mut out);
                self.supervisor = Some(supervisor);
                self.supervisor_out(now, out, ops);
            }
        }
    }

    fn supervisor_out(&mut self, now: Instant, out: Vec<SupervisorOut>, ops: &mut OpIds) {
        for item in out {
            match item {
                SupervisorOut::Call { op, socket, call } => {
                    self.actions.push(TaskAction::Io {
                        op,
                        io: Io::Csi { socket, call },
                    });
                }
                SupervisorOut::Event { kind, message } => self.event(now, kind, &message),
                SupervisorOut::Register(info) => self.actions.push(TaskAction::Register(info)),
                SupervisorOut::Deregister { kind, name, alloc_id } => {
                    self.actions.push(TaskAction::Deregister { kind, name, alloc_id })
                }
                SupervisorOut::RestartTask { .. } => {
                    if self.phase == Phase::Running {
                        self.event(now, events::RESTART_SIGNALED, "healthcheck: plugin not healthy");
                        // Not a kill of the allocation: once the task is gone, restart it
                        // (unless the #25293 switch re-creates the old defect).
                        self.restart_after_kill = !self.spec.faults.plugin_timeout_kills;
                        self.send_kill(now, ops);
                    }
                }
            }
        }
    }

    fn stop_supervisor(&mut self, now: Instant) {
        if let Some(mut supervisor) = self.supervisor.take() {
            let mut out = Vec::new();
            supervisor.stop(&mut out);
            for item in out {
                match item {
                    SupervisorOut::Deregister { kind, name, alloc_id } => {
                        self.actions.push(TaskAction::Deregister { kind, name, alloc_id })
                    }
                    SupervisorOut::Event { kind, message } => self.event(now, kind, &message),
                    SupervisorOut::Call { .. } | SupervisorOut::Register(_) | SupervisorOut::RestartTask { .. } => {}
                }
            }
        }
    }

    // --- kill and stop --------------------------------------------------------------------

    /// An operator's restart (`alloc restart`): the task is killed and started again at once,
    /// outside its restart policy, as Nomad's `Restart` does. Only a running task restarts.
    pub fn restart_by_user(&mut self, now: Instant, ops: &mut OpIds) -> Result<(), String> {
        if self.phase != Phase::Running || self.kill_requested || self.restart_requested {
            return Err(TASK_NOT_RUNNING.into());
        }
        self.event(now, events::RESTART_SIGNALED, "User requested restart");
        self.restart_requested = true;
        self.send_kill(now, ops);
        Ok(())
    }

    /// An operator's signal (`alloc signal`): recorded as Nomad records it; the handle to send
    /// it to is returned. A running task is signalled, and so is one being killed: a SIGKILL
    /// need not wait out a long `kill_timeout` (Nomad signals any task with a driver handle).
    pub fn signal_by_user(&mut self, now: Instant, signal: &str) -> Result<TaskHandle, String> {
        let handle = self
            .local
            .handle
            .clone()
            .filter(|_| {
                matches!(
                    self.phase,
                    Phase::Running | Phase::Killing { .. } | Phase::ShutdownDelay { .. }
                )
            })
            .ok_or_else(|| TASK_NOT_RUNNING.to_string())?;
        self.event_with(
            now,
            events::SIGNALING,
            &format!("Task being sent signal {signal}: User requested signal"),
            details([
                ("task_signal", signal.to_string()),
                ("task_signal_reason", "User requested signal".into()),
            ]),
        );
        Ok(handle)
    }

    /// How long the task has between its kill signal and SIGKILL: its `kill_timeout`, capped
    /// at the client's `max_kill_timeout` (Nomad's `SetKillTimeout`).
    fn kill_timeout(&self) -> Duration {
        self.spec.task.kill_timeout.min(self.spec.max_kill_timeout)
    }

    /// The wait between taking a killed task's services out of Consul and signalling it: its
    /// group's `shutdown_delay`, then its own (Nomad runs them one after the other).
    fn shutdown_delay(&self) -> Duration {
        self.spec.group.shutdown_delay.unwrap_or_default() + self.spec.task.shutdown_delay
    }

    /// Whether the task waits out its `shutdown_delay` (its services are no longer wanted).
    pub fn is_shutting_down(&self) -> bool {
        matches!(self.phase, Phase::ShutdownDelay { .. })
    }

    fn send_kill(&mut self, now: Instant, ops: &mut OpIds) {
        if let Some(templates) = &mut self.templates {
            templates.cancel();
        }
        if self.local.handle.is_none() {
            self.begin_stop(now, ops);
            return;
        }
        let delay = self.shutdown_delay();
        if !delay.is_zero() && !matches!(self.phase, Phase::ShutdownDelay { .. }) {
            self.event_with(
                now,
                events::WAITING_SHUTDOWN_DELAY,
                &format!(
                    "Waiting for shutdown_delay of {} before killing the task.",
                    go_duration(delay)
                ),
                details([("shutdown_delay", go_duration(delay))]),
            );
            self.set_phase(Phase::ShutdownDelay { until: now + delay });
            // Persisted: the client's service sync takes the task's services out now.
            self.persist();
            return;
        }
        self.send_kill_now(now, ops);
    }

    /// The kill signal, now (the shutdown delay, if any, is over).
    fn send_kill_now(&mut self, now: Instant, ops: &mut OpIds) {
        let Some(handle) = self.local.handle.clone() else {
            self.begin_stop(now, ops);
            return;
        };
        let timeout = self.kill_timeout();
        self.event_with(
            now,
            events::KILLING,
            &format!("Sent interrupt. Waiting {} before force killing", go_duration(timeout)),
            details([("kill_timeout", go_duration(timeout))]),
        );
        let op = ops.allocate();
        self.set_phase(Phase::Killing { op });
        let signal = crate::structs::signal_number(&self.spec.task.kill_signal)
            .unwrap_or_else(|| crate::driverspec::default_kill_signal(&self.spec.task.driver));
        self.actions.push(TaskAction::Io {
            op,
            io: Io::StopTask {
                handle,
                kill_timeout: timeout,
                signal,
            },
        });
    }

    /// The group's leader task finished: this one is stopped too (Nomad's "Leader Task Dead").
    pub fn leader_dead(&mut self, now: Instant, ops: &mut OpIds) {
        if self.kill_requested || matches!(self.phase, Phase::Dead | Phase::Stopping { .. }) {
            return;
        }
        self.event(now, events::LEADER_DEAD, "Leader Task in Group dead");
        self.kill(now, ops);
    }

    fn begin_stop(&mut self, now: Instant, ops: &mut OpIds) {
        self.stop_supervisor(now);
        self.set_phase(Phase::Stopping { index: 0, op: None });
        self.run_stop(now, ops);
    }

    fn run_stop(&mut self, now: Instant, ops: &mut OpIds) {
        loop {
            let Phase::Stopping { index, op: None } = self.phase else {
                return;
            };
            if index == self.hooks.len() {
                self.local.state.state = TaskStatus::Dead;
                self.local.state.finished_at = self.wall(now);
                self.set_phase(Phase::Dead);
                self.persist();
                return;
            }
            let (hook, phases) = self.hooks[index];
            if phases.stop && hook == TaskHook::CsiPluginSupervisor {
                let op = ops.allocate();
                self.set_phase(Phase::Stopping { index, op: Some(op) });
                self.actions.push(TaskAction::Io {
                    op,
                    io: Io::RemoveAll {
                        path: self.spec.paths.plugin_socket_dir(&self.spec.alloc_id),
                    },
                });
                return;
            }
            let _ = now;
            self.set_phase(Phase::Stopping {
                index: index + 1,
                op: None,
            });
        }
    }

    /// `now` on the client's wall clock, in Unix nanoseconds.
    fn wall(&self, now: Instant) -> i64 {
        self.spec.wall_epoch.saturating_add(now.as_nanos() as i64)
    }

    fn event(&mut self, now: Instant, kind: &str, message: &str) {
        self.event_with(now, kind, message, BTreeMap::new());
    }

    /// An event with the details Nomad sets for its type.
    fn event_with(&mut self, now: Instant, kind: &str, message: &str, details: BTreeMap<String, String>) {
        let event = TaskEvent {
            kind: kind.to_string(),
            message: message.to_string(),
            time: self.wall(now),
            details,
        };
        self.local.state.push_event(event.clone());
        self.actions.push(TaskAction::Event(event));
    }

    fn persist(&mut self) {
        self.actions.push(TaskAction::Persist(Box::new(self.local.clone())));
    }
}

/// An event's details (Nomad's `TaskEvent.Details`).
fn details<const N: usize>(fields: [(&str, String); N]) -> BTreeMap<String, String> {
    fields
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect()
}
