//! The supervision loop of the `csi_plugin_supervisor` task hook (§1.3, today's behaviour),
//! started at poststart: probe every 5 s (5 s deadline) until the plugin is ready or
//! `health_timeout` passes — then `Plugin became unhealthy` and a task restart; once ready,
//! `GetPluginInfo` and register (two entries for a monolith); then heartbeat every 30 s,
//! emitting task events only on health transitions (probe failures no longer restart the
//! task). Stopping deregisters this allocation's entries.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

use crate::client::registry::{PluginInfo, PluginKind};
use crate::client::restarts::go_duration;
use crate::client::{CsiCall, CsiReply, IoError, Outcome, Reply, events};
use crate::op::{OpId, OpIds};
use crate::structs::TaskCsiPluginConfig;
use crate::time::Instant;

pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
const _: () = assert!(
    PROBE_TIMEOUT.as_nanos() <= PROBE_INTERVAL.as_nanos() && PROBE_INTERVAL.as_nanos() < HEARTBEAT_INTERVAL.as_nanos(),
    "a probe ends before the next one, and probes run between heartbeats"
);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupervisorOut {
    Call {
        op: OpId,
        socket: String,
        call: CsiCall,
    },
    Event {
        kind: &'static str,
        message: String,
    },
    Register(PluginInfo),
    Deregister {
        kind: PluginKind,
        name: String,
        alloc_id: String,
    },
    RestartTask {
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    WaitingReady { deadline: Instant },
    Registering,
    Running { healthy: bool },
    Stopped,
}

impl Phase {
    /// The state's name, for coverage ([`crate::cover`]).
    fn name(&self) -> &'static str {
        match self {
            Phase::WaitingReady { .. } => "waiting_ready",
            Phase::Registering => "registering",
            Phase::Running { .. } => "running",
            Phase::Stopped => "stopped",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PluginSupervisor {
    /// The last `now` handed in: time never runs back inside the machine.
    clock: crate::time::Monotonic,
    config: TaskCsiPluginConfig,
    alloc_id: String,
    socket: String,
    mount_point: String,
    container_mount_point: String,
    phase: Phase,
    /// The call in flight and its deadline.
    pending: Option<(OpId, Instant)>,
    next_probe: Option<Instant>,
    registered: Vec<(PluginKind, String)>,
}

impl PluginSupervisor {
    /// Moves to `phase`, counted as a transition of the plugin_supervisor machine.
    fn set_phase(&mut self, phase: Phase) {
        crate::cover::transition("plugin_supervisor", self.phase.name(), phase.name());
        self.phase = phase;
    }
    pub fn start(
        now: Instant,
        config: TaskCsiPluginConfig,
        alloc_id: String,
        socket: String,
        mount_point: String,
        container_mount_point: String,
    ) -> Self {
        let deadline = now + config.health_timeout;
        PluginSupervisor {
            clock: crate::time::Monotonic::default(),
            config,
            alloc_id,
            socket,
            mount_point,
            container_mount_point,
            phase: Phase::WaitingReady { deadline },
            pending: None,
            next_probe: Some(now),
            registered: Vec::new(),
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    pub fn owns(&self, op: OpId) -> bool {
        self.pending.is_some_and(|(pending, _)| pending == op)
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.phase == Phase::Stopped {
            return None;
        }
        match self.pending {
            Some((_, deadline)) => Some(deadline),
            None => self.next_probe,
        }
    }

    pub fn handle_timeout(&mut self, now: Instant, ops: &mut OpIds, out: &mut Vec<SupervisorOut>) {
        self.clock.observe(now);
        if let Some((op, deadline)) = self.pending
            && now >= deadline
        {
            self.outcome(
                now,
                op,
                Err(IoError::new(crate::client::ErrorKind::Timeout, "probe timed out")),
                ops,
                out,
            );
            return;
        }
        if self.pending.is_none() && self.next_probe.is_some_and(|at| now >= at) {
            self.next_probe = None;
            self.call(now, CsiCall::Probe, ops, out);
        }
    }

    fn call(&mut self, now: Instant, call: CsiCall, ops: &mut OpIds, out: &mut Vec<SupervisorOut>) {
        let op = ops.allocate();
        self.pending = Some((op, now + PROBE_TIMEOUT));
        out.push(SupervisorOut::Call {
            op,
            socket: self.socket.clone(),
            call,
        });
    }

    pub fn outcome(&mut self, now: Instant, op: OpId, outcome: Outcome, ops: &mut OpIds, out: &mut Vec<SupervisorOut>) {
        if !self.owns(op) {
            return;
        }
        self.pending = None;
        match self.phase.clone() {
            Phase::WaitingReady { deadline } => {
                if probe_ready(&outcome).is_ok() {
                    out.push(SupervisorOut::Event {
                        kind: events::PLUGIN_HEALTHY,
                        message: format!("plugin: {}", self.config.id),
                    });
                    self.set_phase(Phase::Registering);
                    self.call(now, CsiCall::GetPluginInfo, ops, out);
                } else if now >= deadline {
                    let reason = format!(
                        "CSI plugin did not become healthy before configured {} health timeout",
                        go_duration(self.config.health_timeout)
                    );
                    out.push(SupervisorOut::Event {
                        kind: events::PLUGIN_UNHEALTHY,
                        message: reason.clone(),
                    });
                    out.push(SupervisorOut::RestartTask { reason });
                    self.set_phase(Phase::Stopped);
                } else {
                    self.next_probe = Some((now + PROBE_INTERVAL).min(deadline));
                }
            }
            Phase::Registering => match outcome {
                Ok(Reply::Csi(CsiReply::PluginInfo { name, version })) => {
                    for kind in self.kinds() {
                        let info = PluginInfo {
                            kind,
                            name: self.config.id.clone(),
                            version: version.clone(),
                            provider: name.clone(),
                            socket_path: self.socket.clone(),
                            alloc_id: self.alloc_id.clone(),
                            mount_point: self.mount_point.clone(),
                            container_mount_point: self.container_mount_point.clone(),
                        };
                        self.registered.push((kind, self.config.id.clone()));
                        out.push(SupervisorOut::Register(info));
                    }
                    self.set_phase(Phase::Running { healthy: true });
                    self.next_probe = Some(now + HEARTBEAT_INTERVAL);
                }
                other => {
                    let reason = format!("failed to register CSI plugin {}: {}", self.config.id, describe(&other));
                    out.push(SupervisorOut::Event {
                        kind: events::PLUGIN_UNHEALTHY,
                        message: reason.clone(),
                    });
                    out.push(SupervisorOut::RestartTask { reason });
                    self.set_phase(Phase::Stopped);
                }
            },
            Phase::Running { healthy } => {
                let now_healthy = probe_ready(&outcome);
                match (healthy, &now_healthy) {
                    (true, Err(reason)) => out.push(SupervisorOut::Event {
                        kind: events::PLUGIN_UNHEALTHY,
                        message: reason.clone(),
                    }),
                    (false, Ok(())) => out.push(SupervisorOut::Event {
                        kind: events::PLUGIN_HEALTHY,
                        message: format!("plugin: {}", self.config.id),
                    }),
                    _ => {}
                }
                self.set_phase(Phase::Running {
                    healthy: now_healthy.is_ok(),
                });
                self.next_probe = Some(now + HEARTBEAT_INTERVAL);
            }
            Phase::Stopped => {}
        }
    }

    fn kinds(&self) -> Vec<PluginKind> {
        let mut kinds = Vec::new();
        if self.config.plugin_type.is_controller() {
            kinds.push(PluginKind::CsiController);
        }
        if self.config.plugin_type.is_node() {
            kinds.push(PluginKind::CsiNode);
        }
        kinds
    }

    /// Stops supervising and deregisters this allocation's entries. A plugin last seen
    /// healthy is recorded unhealthy: its task is gone (it died, or is being stopped), and the
    /// operator reading the task's events should not be left believing it still serves.
    pub fn stop(&mut self, out: &mut Vec<SupervisorOut>) {
        if matches!(self.phase, Phase::Registering | Phase::Running { healthy: true }) {
            out.push(SupervisorOut::Event {
                kind: events::PLUGIN_UNHEALTHY,
                message: format!("plugin: {}: task exited", self.config.id),
            });
        }
        for (kind, name) in core::mem::take(&mut self.registered) {
            out.push(SupervisorOut::Deregister {
                kind,
                name,
                alloc_id: self.alloc_id.clone(),
            });
        }
        self.pending = None;
        self.next_probe = None;
        self.set_phase(Phase::Stopped);
    }
}

fn probe_ready(outcome: &Outcome) -> Result<(), String> {
    match outcome {
        Ok(Reply::Csi(CsiReply::Probe { ready: true })) => Ok(()),
        Ok(_) => Err("Unknown Reason".into()),
        Err(error) => Err(format!("error: {error}")),
    }
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Ok(reply) => format!("unexpected reply {reply:?}"),
        Err(error) => error.message.clone(),
    }
}
