//! The run's trace: every agent event and every scenario action, stamped with virtual time,
//! in the order they happened. Safety invariants run after each recorded event; the first
//! violation is kept with the trace position where it happened.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_io_real::io::{AgentEvent, Observer};

use crate::invariants::{self, Invariant};

/// A plugin-side observation: what a simulated CSI plugin did, on which client node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginEvent {
    /// The client mounted the volume for an allocation (node stage + publish).
    NodePublished { volume: String, alloc: String },
    /// `NodeUnpublishVolume` (+ unstage) for an allocation, asked by a server.
    NodeUnpublished { volume: String, alloc: String },
    ControllerPublished {
        plugin: String,
        volume: String,
        external_node: String,
    },
    ControllerUnpublished {
        plugin: String,
        volume: String,
        external_node: String,
    },
    /// The client node died: everything it had mounted is gone with it.
    NodeLost,
    /// The client's agent was killed (its machine may live on): the simulated plugins answer
    /// controller calls inside the agent's process, so a call in flight there died with it.
    AgentKilled,
    /// A controller RPC reached the plugin (from whichever server sent it).
    ControllerCallStarted { plugin: String, call: String },
    /// The plugin answered a controller RPC (a hanging call never does).
    ControllerCallEnded { plugin: String, call: String },
    /// `CreateVolume` made a new volume in the plugin's storage (a repeat of a name made
    /// before makes nothing).
    VolumeCreated {
        plugin: String,
        name: String,
        external_id: String,
    },
    /// `DeleteVolume` removed a volume from the plugin's storage.
    VolumeDeleted { plugin: String, external_id: String },
}

/// A host-side observation: what the simulated host's process table did, on which client
/// node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// A task's leader process started.
    TaskStarted { alloc: String, task: String },
    /// No process of the task is left: its leader and everything it started are gone.
    TaskProcessesGone { alloc: String, task: String },
    /// A container of the task started on the host's engine.
    ContainerRunning { alloc: String, task: String },
    /// The task's running container ended (exited, killed, stopped with its daemon, removed).
    ContainerGone { alloc: String, task: String },
    /// The host's container engine answers calls again (`true`), or stopped answering
    /// (stopped or hung).
    EngineAnswers { answers: bool },
    /// The machine's monotonic clock jumped ahead (a paused VM resumed).
    MonotonicJumped { by_ms: u64 },
}

/// Everything the invariants see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimEvent {
    Agent(AgentEvent),
    Plugin(PluginEvent),
    Host(HostEvent),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
    pub at_line: usize,
}

struct State {
    start: tokio::time::Instant,
    /// The run's own clock, when the tokio clock is not one clock for the whole run (turmoil
    /// gives every host its own runtime and clock).
    clock: Option<fn() -> Option<Duration>>,
    /// The last stamp, kept when the run's clock cannot be read (between turmoil's steps).
    last: Duration,
    lines: Vec<String>,
    invariants: Vec<Box<dyn Invariant>>,
    violations: Vec<Violation>,
    /// Checks made, by invariant name (the coverage table's).
    checks: BTreeMap<&'static str, u64>,
}

/// Shared by every node of one run.
#[derive(Clone)]
pub struct Recorder {
    state: Arc<Mutex<State>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Recorder::with_optional_clock(None)
    }

    /// A recorder stamping events with `clock` (virtual time since the run began; `None` when
    /// it cannot be read right now, and the last stamp is kept).
    pub fn with_clock(clock: fn() -> Option<Duration>) -> Self {
        Recorder::with_optional_clock(Some(clock))
    }

    fn with_optional_clock(clock: Option<fn() -> Option<Duration>>) -> Self {
        Recorder {
            state: Arc::new(Mutex::new(State {
                start: tokio::time::Instant::now(),
                clock,
                last: Duration::ZERO,
                lines: Vec::new(),
                invariants: invariants::all(),
                violations: Vec::new(),
                checks: BTreeMap::new(),
            })),
        }
    }

    fn now(state: &mut State) -> Duration {
        let now = match state.clock {
            None => tokio::time::Instant::now().saturating_duration_since(state.start),
            Some(clock) => clock().unwrap_or(state.last).max(state.last),
        };
        state.last = now;
        now
    }

    fn stamp(state: &mut State) -> String {
        let elapsed = Self::now(state);
        format!("{:>6}.{:03}", elapsed.as_secs(), elapsed.subsec_millis())
    }

    /// Adds an invariant the scenario asks for on top of [`invariants::all`].
    pub fn add_invariant(&self, invariant: Box<dyn invariants::Invariant>) {
        self.state.lock().expect("trace lock").invariants.push(invariant);
    }

    /// Records a scenario action (fault injected, write acknowledged, phase change).
    pub fn note(&self, text: impl AsRef<str>) {
        let mut state = self.state.lock().expect("trace lock");
        let line = format!("{} -- {}", Self::stamp(&mut state), text.as_ref());
        state.lines.push(line);
    }

    pub fn record(&self, node: &str, event: AgentEvent) {
        self.record_event(node, SimEvent::Agent(event));
    }

    pub fn record_plugin(&self, node: &str, event: PluginEvent) {
        self.record_event(node, SimEvent::Plugin(event));
    }

    pub fn record_host(&self, node: &str, event: HostEvent) {
        self.record_event(node, SimEvent::Host(event));
    }

    fn record_event(&self, node: &str, event: SimEvent) {
        let mut state = self.state.lock().expect("trace lock");
        let at = Self::now(&mut state);
        let stamp = Self::stamp(&mut state);
        let line = match &event {
            SimEvent::Agent(event) => format!("{stamp} {node} {event:?}"),
            SimEvent::Plugin(event) => format!("{stamp} {node} plugin {event:?}"),
            SimEvent::Host(event) => format!("{stamp} {node} host {event:?}"),
        };
        state.lines.push(line);
        let at_line = state.lines.len();
        let mut found = Vec::new();
        let State { invariants, checks, .. } = &mut *state;
        for invariant in invariants.iter_mut() {
            if invariant.checks(&event) {
                *checks.entry(invariant.name()).or_default() += 1;
            }
            if let Err(detail) = invariant.observe_at(at, node, &event) {
                found.push(Violation {
                    invariant: invariant.name(),
                    detail,
                    at_line,
                });
            }
        }
        state.violations.extend(found);
    }

    /// A violation found outside the event stream (liveness).
    pub fn violate(&self, invariant: &'static str, detail: String) {
        let mut state = self.state.lock().expect("trace lock");
        let at_line = state.lines.len();
        let line = format!("{} !! {invariant}: {detail}", Self::stamp(&mut state));
        state.lines.push(line);
        state.violations.push(Violation {
            invariant,
            detail,
            at_line,
        });
    }

    /// Counts `count` checks of an invariant made outside the event stream (liveness, state
    /// equality, linearizability, after the run).
    pub fn checked(&self, invariant: &'static str, count: u64) {
        *self
            .state
            .lock()
            .expect("trace lock")
            .checks
            .entry(invariant)
            .or_default() += count;
    }

    /// Checks made so far, by invariant.
    pub fn checks(&self) -> BTreeMap<&'static str, u64> {
        self.state.lock().expect("trace lock").checks.clone()
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.state.lock().expect("trace lock").violations.clone()
    }

    pub fn text(&self) -> String {
        let state = self.state.lock().expect("trace lock");
        let mut text = state.lines.join("\n");
        text.push('\n');
        text
    }

    pub fn observer(&self, node: &str) -> Arc<NodeObserver> {
        Arc::new(NodeObserver {
            node: node.to_string(),
            recorder: self.clone(),
        })
    }
}

/// One node's view of the recorder.
pub struct NodeObserver {
    node: String,
    recorder: Recorder,
}

impl Observer for NodeObserver {
    fn record(&self, event: AgentEvent) {
        self.recorder.record(&self.node, event);
    }
}
