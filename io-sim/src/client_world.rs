//! A simulated client host for the core client machine: a CSI plugin process that can crash on
//! a named call, never become ready or leave a stale socket behind; consumer tasks; a host
//! mount table; servers that claim, and that node-detach through the client before they free
//! a claim (as the real release walk does); and agent restarts that rebuild the client from
//! its persisted records while tasks and mounts survive.
//!
//! It is a discrete-event simulation on a virtual clock driven by one seeded generator, so a
//! seed replays exactly. The invariants run on every event: stage before publish, unpublish
//! before unstage (per staging path), alloc hooks in order, and — once the host is quiet — no
//! mount left behind by an allocation that is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use drover_core::Instant;
use drover_core::client::alloc_runner::LocalAllocState;
use drover_core::client::client::{Client, ClientAction, ClientInput, ClientSettings, SavedAlloc};
use drover_core::client::hooks::ALLOC_HOOKS;
use drover_core::client::paths::ClientPaths;
use drover_core::client::registry::Registry;
use drover_core::client::task_runner::LocalTaskState;
use drover_core::client::{
    CsiCall, CsiReply, DriverCapabilities, ErrorKind, ExitResult, Io, IoError, MountConfigSupport, Outcome, Reply,
    TaskHandle,
};
use drover_core::csi::unpublish::NodeDetachRequest;
use drover_core::op::OpId;
use drover_core::rpc::{RpcError, ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, CsiPluginType, CsiVolume, DesiredStatus, DriverInfo, Job, JobType, Task,
    TaskCsiPluginConfig, TaskGroup, VolumeMount, VolumeRequest, VolumeType,
};
use rand::Rng;
use rand_chacha_03::ChaCha8Rng;
use rand_chacha_03::rand_core::SeedableRng;

/// A fault the plugin process suffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginFault {
    /// The process dies when the `nth` call named `call` arrives (the call is not answered).
    CrashOn { call: &'static str, nth: u32 },
    /// The plugin never answers a probe with ready.
    NeverReady,
}

#[derive(Clone, Debug)]
pub struct Consumer {
    pub alloc: String,
    pub start_at: Duration,
    pub stop_at: Duration,
}

#[derive(Clone, Debug)]
pub struct WorldPlan {
    pub stage_unstage: bool,
    pub consumers: Vec<Consumer>,
    pub faults: Vec<PluginFault>,
    /// Agent restarts (tasks and mounts survive).
    pub agent_restarts: Vec<Duration>,
    /// The first claims are refused with `volume max claims reached`.
    pub refused_claims: u32,
    pub end: Duration,
}

pub struct WorldReport {
    pub trace: String,
    pub violations: Vec<(&'static str, String)>,
    pub virtual_secs: u64,
}

const PLUGIN_ALLOC: &str = "plugin-1";
const VOLUME: &str = "vol0";

#[derive(Debug)]
enum Event {
    Outcome(OpId, Outcome, u64),
    Exited {
        alloc: String,
        task: String,
        exit: ExitResult,
        generation: u64,
    },
    PluginReady {
        generation: u64,
    },
    Desired,
    AgentRestart,
    NodeDetached {
        req: u64,
        result: Result<(), String>,
    },
}

struct Proc {
    generation: u64,
    alive: bool,
}

struct World {
    plan: WorldPlan,
    now: Instant,
    seq: u64,
    queue: BTreeMap<(Instant, u64), Event>,
    rng: ChaCha8Rng,
    client: Client,
    /// Bumped on every agent restart: outcomes of a dead agent's ops are dropped.
    agent_generation: u64,
    /// The agent generation that registered the node last.
    registered: Option<u64>,
    // Persisted records.
    registry: Registry,
    alloc_states: BTreeMap<String, LocalAllocState>,
    task_states: BTreeMap<String, BTreeMap<String, LocalTaskState>>,
    // The servers' view.
    allocs: BTreeMap<String, (Allocation, Job)>,
    refused: u32,
    next_req: u64,
    /// Unpublish requests waiting for the node detach they caused.
    detaching: BTreeMap<u64, (OpId, u64)>,
    // The host.
    mounts: BTreeSet<String>,
    procs: BTreeMap<(String, String), Proc>,
    generation: u64,
    plugin_ready: Option<u64>,
    calls: BTreeMap<&'static str, u32>,
    staged: BTreeSet<String>,
    published: BTreeMap<String, String>,
    hooks: BTreeMap<String, Vec<String>>,
    trace: String,
    violations: Vec<(&'static str, String)>,
}

fn settings() -> ClientSettings {
    ClientSettings {
        node_id: "n1".into(),
        paths: ClientPaths::new("/s", "/a"),
        host_volumes: BTreeMap::new(),
        seed: 7,
    }
}

fn drivers(client: &mut Client, now: Instant) {
    for (name, mount_configs, fs_isolation) in [
        ("raw_exec", MountConfigSupport::None, false),
        ("exec", MountConfigSupport::All, true),
    ] {
        client.handle(
            now,
            ClientInput::Driver {
                name: name.into(),
                capabilities: DriverCapabilities {
                    mount_configs,
                    fs_isolation,
                },
                info: DriverInfo {
                    detected: true,
                    healthy: true,
                    health_description: "Healthy".into(),
                    attributes: BTreeMap::new(),
                },
            },
        );
    }
}

/// Links the client to the simulated servers: it registers (answered with [`HEARTBEAT_TTL`])
/// and restores `saved` once registered, as the production driver does.
fn connect(client: &mut Client, now: Instant, registry: Registry, saved: Vec<SavedAlloc>) {
    let node = drover_core::structs::Node {
        id: settings().node_id,
        ..Default::default()
    };
    client.connect(now, node, registry, saved);
}

/// The TTL the simulated servers hand back.
const HEARTBEAT_TTL: Duration = Duration::from_secs(10);

fn plugin_job() -> Job {
    Job {
        id: "plugin".into(),
        namespace: "default".into(),
        job_type: JobType::System,
        task_groups: vec![TaskGroup {
            name: "plugin".into(),
            count: 1,
            tasks: vec![Task {
                name: "plugin".into(),
                driver: "raw_exec".into(),
                csi_plugin: Some(TaskCsiPluginConfig::new("fake", CsiPluginType::Node)),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn consumer_job() -> Job {
    let mut group = TaskGroup {
        name: "web".into(),
        count: 1,
        ..TaskGroup::default()
    };
    group.volumes.insert(
        "data".into(),
        VolumeRequest {
            name: "data".into(),
            volume_type: VolumeType::Csi,
            source: VOLUME.into(),
            access_mode: AccessMode::MultiNodeMultiWriter,
            attachment_mode: AttachmentMode::FileSystem,
            ..VolumeRequest::default()
        },
    );
    group.tasks.push(Task {
        name: "web".into(),
        driver: "exec".into(),
        volume_mounts: vec![VolumeMount {
            volume: "data".into(),
            destination: "/data".into(),
            ..VolumeMount::default()
        }],
        ..Task::default()
    });
    Job {
        id: "app".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        task_groups: vec![group],
        ..Job::default()
    }
}

fn alloc(id: &str, job: &Job) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: "default".into(),
        name: format!("{}.{}[0]", job.id, job.task_groups[0].name),
        node_id: "n1".into(),
        job_id: job.id.clone(),
        task_group: job.task_groups[0].name.clone(),
        ..Allocation::default()
    }
}

impl World {
    fn at(&mut self, delay: Duration, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), event);
    }

    fn latency(&mut self) -> Duration {
        Duration::from_millis(self.rng.gen_range(1..20))
    }

    fn note(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(
            self.trace,
            "{:>10.3}s {}",
            self.now.as_millis() as f64 / 1000.0,
            text.as_ref()
        );
    }

    fn violate(&mut self, invariant: &'static str, detail: String) {
        self.note(format!("!! {invariant}: {detail}"));
        self.violations.push((invariant, detail));
    }

    /// Runs the client's actions until it has none.
    fn drain(&mut self) {
        while let Some(action) = self.client.poll_action() {
            match action {
                ClientAction::Io { op, io } => self.io(op, io),
                ClientAction::PersistAlloc { alloc_id, state } => {
                    self.alloc_states.insert(alloc_id, *state);
                }
                ClientAction::PersistTask { alloc_id, task, state } => {
                    self.task_states.entry(alloc_id).or_default().insert(task, *state);
                }
                ClientAction::PersistRegistry(registry) => self.registry = *registry,
                ClientAction::TaskEvent { alloc_id, task, event } => {
                    self.note(format!("task {alloc_id}/{task}: {}: {}", event.kind, event.message));
                }
                ClientAction::NodeEvent(event) => {
                    let details: Vec<String> = event.details.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    self.note(format!(
                        "node event {}: {} {}",
                        event.subsystem,
                        event.message,
                        details.join(" ")
                    ));
                }
                ClientAction::Hook {
                    alloc_id,
                    hook,
                    phase,
                    result,
                } => self.hook(alloc_id, hook, phase, result),
                ClientAction::Forget { alloc_id } => {
                    self.alloc_states.remove(&alloc_id);
                    self.task_states.remove(&alloc_id);
                }
                ClientAction::NodeDetached { req, result } => {
                    let latency = self.latency();
                    self.at(latency, Event::NodeDetached { req, result });
                }
                ClientAction::PersistSpec { .. } | ClientAction::PersistDevices(_) => {}
            }
        }
    }

    /// Alloc hooks: prerun hooks in the data order, none after postrun began.
    fn hook(&mut self, alloc: String, hook: &'static str, phase: &'static str, result: Result<(), String>) {
        self.note(format!("hook {alloc} {hook} {phase} {result:?}"));
        if !matches!(phase, "prerun" | "postrun") {
            return;
        }
        let seen = self.hooks.get(&alloc).cloned().unwrap_or_default();
        if phase == "prerun" {
            if seen.iter().any(|entry| entry.ends_with(" postrun")) {
                let detail = format!("{alloc}: {hook} prerun after postrun began");
                self.violate("hooks in order", detail);
                return;
            }
            let order: Vec<&str> = ALLOC_HOOKS
                .iter()
                .filter(|(_, phases)| phases.prerun)
                .map(|(hook, _)| hook.name())
                .collect();
            let position = order.iter().position(|name| *name == hook);
            let last = seen
                .iter()
                .filter_map(|entry| entry.strip_suffix(" prerun"))
                .filter_map(|name| order.iter().position(|known| *known == name))
                .next_back();
            if let (Some(position), Some(last)) = (position, last)
                && position <= last
            {
                let detail = format!("{alloc}: {hook} prerun after {}", order[last]);
                self.violate("hooks in order", detail);
            }
        }
        self.hooks.entry(alloc).or_default().push(format!("{hook} {phase}"));
    }

    fn io(&mut self, op: OpId, io: Io) {
        let latency = self.latency();
        let outcome = match io {
            Io::Mkdir { .. } | Io::RemoveAll { .. } => Ok(Reply::Unit),
            Io::Rmdir { path } => {
                if self.mounts.contains(&path) {
                    Err(IoError::other(format!("rmdir {path}: device or resource busy")))
                } else {
                    Ok(Reply::Unit)
                }
            }
            Io::IsMountPoint { path } => Ok(Reply::Bool(self.mounts.contains(&path))),
            Io::StartTask(config) => {
                self.generation += 1;
                let generation = self.generation;
                self.procs.insert(
                    (config.alloc_id.clone(), config.task.clone()),
                    Proc {
                        generation,
                        alive: true,
                    },
                );
                if config.task == "plugin" {
                    // The new process removes a stale socket and listens after a while.
                    if !self.plan.faults.contains(&PluginFault::NeverReady) {
                        let startup = Duration::from_millis(self.rng.gen_range(50..3000));
                        self.at(startup, Event::PluginReady { generation });
                    }
                    self.plugin_ready = None;
                }
                Ok(Reply::Started(TaskHandle {
                    driver: config.driver.clone(),
                    alloc_id: config.alloc_id.clone(),
                    task: config.task.clone(),
                    state: generation.to_string(),
                }))
            }
            Io::StopTask { handle, .. } => {
                let key = (handle.alloc_id.clone(), handle.task.clone());
                if let Some(proc) = self.procs.get(&key)
                    && proc.alive
                {
                    let generation = proc.generation;
                    self.kill_proc(&key, 130, 2, generation, latency);
                }
                Ok(Reply::Unit)
            }
            Io::RecoverTask { handle } => {
                let key = (handle.alloc_id.clone(), handle.task.clone());
                match self.procs.get(&key) {
                    Some(proc) if proc.alive && proc.generation.to_string() == handle.state => Ok(Reply::Unit),
                    _ => Err(IoError::new(ErrorKind::NotFound, "process gone")),
                }
            }
            Io::ReserveDevices { .. } | Io::PrepareDevices { .. } => Err(IoError::other("no devices in this world")),
            Io::Csi { call, .. } => self.csi(call),
            Io::Server(request) => match self.server(op, request) {
                Some(outcome) => outcome,
                // Answered after the node detach it causes.
                None => return,
            },
            Io::Volume(_) => unreachable!("answered inside the client"),
            // This world hands the allocations in itself (`Event::Desired`): the blocking
            // query stays open, as one does while nothing changes.
            Io::AllocSync(_) => return,
            Io::Consul(_) => Err(IoError::other("this host has no consul")),
        };
        let generation = self.agent_generation;
        self.at(latency, Event::Outcome(op, outcome, generation));
    }

    fn kill_proc(&mut self, key: &(String, String), exit_code: i32, signal: i32, generation: u64, delay: Duration) {
        if let Some(proc) = self.procs.get_mut(key) {
            proc.alive = false;
        }
        if key.1 == "plugin" {
            // The socket file stays behind: calls now get "connection refused".
            self.plugin_ready = None;
        }
        self.at(
            delay,
            Event::Exited {
                alloc: key.0.clone(),
                task: key.1.clone(),
                exit: ExitResult {
                    exit_code,
                    signal,
                    ..ExitResult::default()
                },
                generation,
            },
        );
    }

    fn csi(&mut self, call: CsiCall) -> Outcome {
        let name = call.name();
        let Some(generation) = self.plugin_ready else {
            return Err(IoError::new(
                ErrorKind::Unavailable,
                "connection refused (stale socket)",
            ));
        };
        let count = self.calls.entry(name).or_default();
        *count += 1;
        let count = *count;
        let crash = self
            .plan
            .faults
            .iter()
            .any(|fault| matches!(fault, PluginFault::CrashOn { call, nth } if *call == name && *nth == count));
        if crash {
            self.note(format!("plugin crashes on {name} #{count}"));
            let key = (PLUGIN_ALLOC.to_string(), "plugin".to_string());
            self.kill_proc(&key, 137, 9, generation, Duration::ZERO);
            return Err(IoError::new(ErrorKind::Unavailable, "transport is closing"));
        }
        let reply = match call {
            CsiCall::Probe => CsiReply::Probe { ready: true },
            CsiCall::GetPluginInfo => CsiReply::PluginInfo {
                name: "sim.csi".into(),
                version: "1.0".into(),
            },
            CsiCall::GetPluginCapabilities => CsiReply::PluginCapabilities {
                controller_service: false,
                accessibility_constraints: false,
            },
            CsiCall::ControllerGetCapabilities => CsiReply::ControllerCapabilities(Default::default()),
            CsiCall::NodeGetInfo => CsiReply::NodeInfo {
                node_id: "ext-n1".into(),
                max_volumes: 0,
                topology: None,
            },
            CsiCall::NodeGetCapabilities => CsiReply::NodeCapabilities {
                stage_unstage: self.plan.stage_unstage,
                stats: false,
                expand: false,
                condition: false,
            },
            CsiCall::NodeStageVolume {
                staging_target_path, ..
            } => {
                self.note(format!("NodeStageVolume {staging_target_path}"));
                self.staged.insert(staging_target_path.clone());
                self.mounts.insert(staging_target_path);
                CsiReply::Done
            }
            CsiCall::NodePublishVolume {
                staging_target_path,
                target_path,
                ..
            } => {
                self.note(format!("NodePublishVolume {target_path}"));
                if self.plan.stage_unstage && !self.staged.contains(&staging_target_path) {
                    self.violate(
                        "stage before publish",
                        format!("{target_path} published from unstaged {staging_target_path:?}"),
                    );
                    return Err(IoError::new(ErrorKind::FailedPrecondition, "volume not staged"));
                }
                self.published.insert(target_path.clone(), staging_target_path);
                self.mounts.insert(target_path);
                CsiReply::Done
            }
            CsiCall::NodeUnpublishVolume { target_path, .. } => {
                self.note(format!("NodeUnpublishVolume {target_path}"));
                self.published.remove(&target_path);
                self.mounts.remove(&target_path);
                CsiReply::Done
            }
            CsiCall::NodeUnstageVolume {
                staging_target_path, ..
            } => {
                self.note(format!("NodeUnstageVolume {staging_target_path}"));
                let users: Vec<String> = self
                    .published
                    .iter()
                    .filter(|(_, staging)| **staging == staging_target_path)
                    .map(|(target, _)| target.clone())
                    .collect();
                if !users.is_empty() {
                    self.violate(
                        "unpublish before unstage",
                        format!("{staging_target_path} unstaged while {users:?} still published"),
                    );
                }
                self.staged.remove(&staging_target_path);
                self.mounts.remove(&staging_target_path);
                CsiReply::Done
            }
        };
        Ok(Reply::Csi(reply))
    }

    /// The servers: claims (maybe refused at first), and an unpublish that node-detaches
    /// through the client before it answers.
    fn server(&mut self, op: OpId, request: ServerRequest) -> Option<Outcome> {
        if matches!(request, ServerRequest::NodeRegister { .. })
            && self.registered.replace(self.agent_generation) == Some(self.agent_generation)
        {
            self.violate(
                "the node stays registered",
                "the client re-registered although the servers never forgot it".into(),
            );
        }
        let reply = match request {
            ServerRequest::VolumeClaim { volume_id, claim, .. } => {
                if self.refused < self.plan.refused_claims {
                    self.refused += 1;
                    ServerReply::Error(RpcError::refused("volume max claims reached"))
                } else {
                    self.note(format!("server: claim {volume_id} for {}", claim.allocation_id));
                    ServerReply::Claimed {
                        index: 1,
                        volume: Box::new(CsiVolume {
                            id: volume_id,
                            namespace: "default".into(),
                            plugin_id: "fake".into(),
                            access_mode: AccessMode::MultiNodeMultiWriter,
                            attachment_mode: AttachmentMode::FileSystem,
                            ..CsiVolume::default()
                        }),
                        publish_context: BTreeMap::new(),
                    }
                }
            }
            ServerRequest::VolumeUnpublish {
                namespace,
                volume_id,
                claim,
            } => {
                self.note(format!("server: unpublish {volume_id} for {}", claim.allocation_id));
                self.next_req += 1;
                let req = self.next_req;
                self.detaching.insert(req, (op, self.agent_generation));
                let request = NodeDetachRequest {
                    node_id: "n1".into(),
                    plugin_id: "fake".into(),
                    volume_id,
                    volume_namespace: namespace,
                    external_id: String::new(),
                    alloc_id: claim.allocation_id,
                    attachment_mode: claim.attachment_mode,
                    access_mode: claim.access_mode,
                    read_only: claim.mode == drover_core::structs::ClaimMode::Read,
                };
                self.client.handle(self.now, ClientInput::NodeDetach { req, request });
                return None;
            }
            ServerRequest::NodeUpdateStatus { .. } | ServerRequest::NodeRegister { .. } => ServerReply::Heartbeat {
                index: 1,
                heartbeat_ttl_ms: HEARTBEAT_TTL.as_millis() as u64,
            },
            _ => ServerReply::Done { index: 1 },
        };
        Some(Ok(Reply::Server(reply)))
    }

    fn sync_allocs(&mut self) {
        let allocs = self.allocs.values().cloned().collect();
        self.client.handle(
            self.now,
            ClientInput::Allocs {
                allocs,
                finished_elsewhere: Vec::new(),
            },
        );
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::Outcome(op, outcome, generation) => {
                if generation == self.agent_generation {
                    self.client.handle(self.now, ClientInput::Outcome { op, outcome });
                }
            }
            Event::Exited {
                alloc,
                task,
                exit,
                generation,
            } => {
                let current = self.procs.get(&(alloc.clone(), task.clone())).map(|p| p.generation);
                if current == Some(generation) {
                    self.client.handle(
                        self.now,
                        ClientInput::TaskExited {
                            alloc_id: alloc,
                            task,
                            exit,
                        },
                    );
                }
            }
            Event::PluginReady { generation } => {
                let key = (PLUGIN_ALLOC.to_string(), "plugin".to_string());
                if self
                    .procs
                    .get(&key)
                    .is_some_and(|p| p.alive && p.generation == generation)
                {
                    self.note("plugin listening");
                    self.plugin_ready = Some(generation);
                }
            }
            Event::Desired => self.sync_allocs(),
            Event::AgentRestart => {
                self.note("agent restart: the client is rebuilt from its records");
                self.agent_generation += 1;
                // Hooks run again from the start in the new agent.
                self.hooks.clear();
                // Unpublishes in flight die with the agent that asked; the servers retry.
                self.detaching.clear();
                let mut client = Client::new(settings());
                drivers(&mut client, self.now);
                let saved: Vec<SavedAlloc> = self
                    .allocs
                    .values()
                    .filter(|(alloc, _)| {
                        self.alloc_states.contains_key(&alloc.id) || self.task_states.contains_key(&alloc.id)
                    })
                    .map(|(alloc, job)| {
                        (
                            alloc.clone(),
                            job.clone(),
                            self.alloc_states.get(&alloc.id).cloned().unwrap_or_default(),
                            self.task_states.get(&alloc.id).cloned().unwrap_or_default(),
                        )
                    })
                    .collect();
                connect(&mut client, self.now, self.registry.clone(), saved);
                self.client = client;
                // The first alloc sync after the restart opens the server-contact gate.
                self.at(Duration::from_millis(500), Event::Desired);
            }
            Event::NodeDetached { req, result } => {
                if let Some((op, generation)) = self.detaching.remove(&req) {
                    let reply = match result {
                        Ok(()) => ServerReply::Done { index: 2 },
                        Err(message) => ServerReply::Error(RpcError::unavailable(format!("node detach: {message}"))),
                    };
                    if generation == self.agent_generation {
                        self.client.handle(
                            self.now,
                            ClientInput::Outcome {
                                op,
                                outcome: Ok(Reply::Server(reply)),
                            },
                        );
                    }
                }
            }
        }
        self.drain();
    }

    fn check_quiet(&mut self) {
        let mut left = Vec::new();
        for consumer in self.plan.consumers.clone() {
            let prefix = format!("/s/csi/node/fake/per-alloc/{}/", consumer.alloc);
            left.extend(self.mounts.iter().filter(|m| m.starts_with(&prefix)).cloned());
        }
        if self.plan.consumers.iter().all(|c| c.stop_at < self.plan.end) {
            left.extend(self.staged.iter().cloned());
        }
        if !left.is_empty() {
            self.violate(
                "no mount left after the alloc is gone once the cluster is quiet",
                format!("{left:?}"),
            );
        }
    }
}

pub fn run(plan: WorldPlan, seed: u64) -> WorldReport {
    let now = Instant::ZERO;
    let mut client = Client::new(settings());
    drivers(&mut client, now);
    connect(&mut client, now, Registry::default(), Vec::new());
    let end = plan.end;
    let mut world = World {
        plan: plan.clone(),
        now,
        seq: 0,
        queue: BTreeMap::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
        client,
        agent_generation: 0,
        registered: None,
        registry: Registry::default(),
        alloc_states: BTreeMap::new(),
        task_states: BTreeMap::new(),
        allocs: BTreeMap::new(),
        refused: 0,
        next_req: 0,
        detaching: BTreeMap::new(),
        mounts: BTreeSet::new(),
        procs: BTreeMap::new(),
        generation: 0,
        plugin_ready: None,
        calls: BTreeMap::new(),
        staged: BTreeSet::new(),
        published: BTreeMap::new(),
        hooks: BTreeMap::new(),
        trace: String::new(),
        violations: Vec::new(),
    };
    let plugin = plugin_job();
    world
        .allocs
        .insert(PLUGIN_ALLOC.into(), (alloc(PLUGIN_ALLOC, &plugin), plugin));
    world.at(Duration::ZERO, Event::Desired);
    // Placements and stops become visible to the client as alloc syncs at their times.
    let mut desired: Vec<(Duration, String, DesiredStatus)> = Vec::new();
    for consumer in &plan.consumers {
        desired.push((consumer.start_at, consumer.alloc.clone(), DesiredStatus::Run));
        desired.push((consumer.stop_at, consumer.alloc.clone(), DesiredStatus::Stop));
    }
    desired.sort();
    for at in &plan.agent_restarts {
        world.seq += 1;
        world.queue.insert((now + *at, world.seq), Event::AgentRestart);
    }
    let job = consumer_job();
    let mut pending = desired.into_iter().peekable();
    loop {
        // Whichever comes first: a world event, a client timer, or a change the servers make.
        let next_event = world.queue.keys().next().copied();
        let timer = world.client.poll_timeout();
        let next_desired = pending.peek().map(|(at, ..)| now + *at);
        let candidates = [
            next_event.map(|(at, _)| (at, 0u8)),
            timer.map(|at| (at, 1u8)),
            next_desired.map(|at| (at, 2u8)),
        ];
        let Some((at, which)) = candidates.into_iter().flatten().min() else {
            break;
        };
        if at > now + end {
            break;
        }
        world.now = world.now.max(at);
        match which {
            0 => {
                let key = next_event.expect("event");
                let event = world.queue.remove(&key).expect("present");
                world.step(event);
            }
            1 => {
                world.client.handle_timeout(world.now);
                world.drain();
            }
            _ => {
                let (_, id, status) = pending.next().expect("peeked");
                let entry = world
                    .allocs
                    .entry(id.clone())
                    .or_insert_with(|| (alloc(&id, &job), job.clone()));
                entry.0.desired_status = status;
                world.note(format!("servers: {id} desired {status:?}"));
                world.sync_allocs();
                world.drain();
            }
        }
    }
    world.now = now + end;
    world.check_quiet();
    WorldReport {
        trace: world.trace,
        violations: world.violations,
        virtual_secs: end.as_secs(),
    }
}
