//! The client half end to end against a scripted world: a node plugin task registers and is
//! fingerprinted, a consumer allocation claims, stages, publishes and runs with the bind
//! mount, and stopping it unpublishes, unstages and releases the claim — in that order.

use drover_core::error::{AllocCallError, AllocCallFailure};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use drover_core::Instant;
use drover_core::client::client::{Client, ClientAction, ClientInput, ClientSettings};
use drover_core::client::paths::ClientPaths;
use drover_core::client::{
    ClientNodeEvent, CsiCall, CsiReply, DriverCapabilities, ExitResult, Io, IoError, MountConfigSupport, Outcome,
    Reply, TaskHandle,
};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, CsiPluginType, CsiVolume, DesiredStatus, DriverInfo, Job, JobType, Task,
    TaskCsiPluginConfig, TaskGroup, VolumeMount, VolumeRequest, VolumeType,
};

#[derive(Default)]
struct World {
    /// CSI node calls in order, as `Call volume`.
    calls: Vec<String>,
    server: Vec<String>,
    mounts: BTreeSet<String>,
    running: BTreeMap<(String, String), Vec<String>>,
    stops: Vec<(String, String)>,
    /// Task stops and CSI node calls together, in the order they happened.
    order: Vec<String>,
    /// Plugins answer their probe "not ready".
    plugins_not_ready: bool,
    /// Registrations and heartbeats are taken with this TTL (0: answered as any other call,
    /// which the link counts a failure).
    heartbeat_ttl_ms: u64,
    /// No server answers.
    servers_unreachable: bool,
}

impl World {
    fn answer(&mut self, io: &Io) -> Outcome {
        Ok(match io {
            Io::Mkdir { .. } | Io::RemoveAll { .. } | Io::Rmdir { .. } => Reply::Unit,
            Io::IsMountPoint { path } => Reply::Bool(self.mounts.contains(path)),
            Io::StartTask(config) => {
                let mounts = config.mounts.iter().map(|m| m.to_string()).collect();
                self.running
                    .insert((config.alloc_id.clone(), config.task.clone()), mounts);
                Reply::Started(TaskHandle {
                    driver: config.driver.clone(),
                    alloc_id: config.alloc_id.clone(),
                    task: config.task.clone(),
                    state: "pid=1".into(),
                })
            }
            Io::StopTask { handle, .. } => {
                self.stops.push((handle.alloc_id.clone(), handle.task.clone()));
                self.order.push(format!("stop {}", handle.alloc_id));
                Reply::Unit
            }
            Io::RecoverTask { .. } => return Err(IoError::other("gone")),
            Io::DestroyTask { .. }
            | Io::SignalTask { .. }
            | Io::DestroyNetwork { .. }
            | Io::ProxySocket { .. }
            | Io::StopProxySocket { .. } => Reply::Unit,
            Io::CreateNetwork { alloc_id, driver, .. } => Reply::Network(drover_core::client::AllocNetwork {
                driver: driver.clone(),
                id: format!("pause-{alloc_id}"),
            }),
            Io::RenderTemplate(_) => Reply::Rendered(Default::default()),
            Io::ReadFile { .. } => Reply::File(None),
            Io::WriteFile { .. } | Io::WriteBytes { .. } | Io::RunCommand { .. } => Reply::Unit,
            Io::ReserveDevices { .. } | Io::PrepareDevices { .. } => Reply::Reserved(Default::default()),
            Io::Csi { call, .. } => Reply::Csi(match call {
                CsiCall::Probe => CsiReply::Probe {
                    ready: !self.plugins_not_ready,
                },
                CsiCall::GetPluginInfo => CsiReply::PluginInfo {
                    name: "fake.drover.dev".into(),
                    version: "0.1.0".into(),
                },
                CsiCall::GetPluginCapabilities => CsiReply::PluginCapabilities {
                    controller_service: false,
                    accessibility_constraints: false,
                },
                CsiCall::NodeGetInfo => CsiReply::NodeInfo {
                    node_id: "ext-n1".into(),
                    max_volumes: 0,
                    topology: None,
                },
                CsiCall::NodeGetCapabilities => CsiReply::NodeCapabilities {
                    stage_unstage: true,
                    stats: false,
                    expand: false,
                    condition: false,
                },
                CsiCall::ControllerGetCapabilities => CsiReply::ControllerCapabilities(Default::default()),
                CsiCall::NodeStageVolume {
                    volume_id,
                    staging_target_path,
                    ..
                } => {
                    self.calls.push(format!("NodeStageVolume {volume_id}"));
                    self.mounts
                        .insert(staging_target_path.replace("/local/csi", "/s/csi/node/hp"));
                    CsiReply::Done
                }
                CsiCall::NodePublishVolume {
                    volume_id, target_path, ..
                } => {
                    self.calls.push(format!("NodePublishVolume {volume_id}"));
                    self.mounts.insert(target_path.replace("/local/csi", "/s/csi/node/hp"));
                    CsiReply::Done
                }
                CsiCall::NodeUnpublishVolume { volume_id, target_path } => {
                    self.calls.push(format!("NodeUnpublishVolume {volume_id}"));
                    self.order.push("NodeUnpublishVolume".into());
                    self.mounts.remove(&target_path.replace("/local/csi", "/s/csi/node/hp"));
                    CsiReply::Done
                }
                CsiCall::NodeUnstageVolume {
                    volume_id,
                    staging_target_path,
                } => {
                    self.calls.push(format!("NodeUnstageVolume {volume_id}"));
                    self.order.push("NodeUnstageVolume".into());
                    self.mounts
                        .remove(&staging_target_path.replace("/local/csi", "/s/csi/node/hp"));
                    CsiReply::Done
                }
                CsiCall::NodeExpandVolume {
                    volume_id,
                    volume_path,
                    staging_target_path,
                    capacity_min,
                    ..
                } => {
                    self.calls.push(format!(
                        "NodeExpandVolume {volume_id} {volume_path} {staging_target_path}"
                    ));
                    CsiReply::Expanded {
                        capacity: *capacity_min,
                    }
                }
            }),
            Io::AllocSync(_) => return Err(IoError::other("this world hands allocations in directly")),
            Io::Consul(_) => return Err(IoError::other("this world has no consul")),
            Io::Server(_) if self.servers_unreachable => {
                return Err(IoError::new(
                    drover_core::client::ErrorKind::Unavailable,
                    "no server answers",
                ));
            }
            Io::Server(ServerRequest::NodeRegister { .. } | ServerRequest::NodeUpdateStatus { .. })
                if self.heartbeat_ttl_ms > 0 =>
            {
                Reply::Server(ServerReply::Heartbeat {
                    index: 1,
                    heartbeat_ttl_ms: self.heartbeat_ttl_ms,
                })
            }
            Io::Server(request) => Reply::Server(match request {
                ServerRequest::VolumeClaim { volume_id, claim, .. } => {
                    self.server.push(format!("claim {volume_id} {}", claim.allocation_id));
                    ServerReply::Claimed {
                        index: 1,
                        volume: Box::new(CsiVolume {
                            id: volume_id.clone(),
                            namespace: "default".into(),
                            plugin_id: "hp".into(),
                            access_mode: AccessMode::SingleNodeWriter,
                            attachment_mode: AttachmentMode::FileSystem,
                            ..CsiVolume::default()
                        }),
                        publish_context: BTreeMap::new(),
                    }
                }
                ServerRequest::VolumeUnpublish { volume_id, claim, .. } => {
                    self.server
                        .push(format!("unpublish {volume_id} {}", claim.allocation_id));
                    ServerReply::Done { index: 2 }
                }
                ServerRequest::NodeUpdateCsiInfo { nodes, .. } => {
                    self.server.push(format!(
                        "csi-info healthy={}",
                        nodes.values().filter(|i| i.healthy).count()
                    ));
                    ServerReply::Done { index: 3 }
                }
                _ => ServerReply::Done { index: 4 },
            }),
            Io::Volume(_) => unreachable!("answered inside the client"),
        })
    }
}

/// Runs the client until it has nothing more to do right now; returns its hook events.
fn settle(client: &mut Client, world: &mut World, now: Instant, hooks: &mut Vec<String>) {
    while let Some(action) = client.poll_action() {
        match action {
            ClientAction::Io { op, io } => {
                let outcome = world.answer(&io);
                client.handle(now, ClientInput::Outcome { op, outcome });
            }
            ClientAction::Hook {
                alloc_id, hook, phase, ..
            } => hooks.push(format!("{alloc_id} {hook} {phase}")),
            _ => {}
        }
    }
}

fn plugin_job() -> Job {
    let mut plugin = TaskCsiPluginConfig::new("hp", CsiPluginType::Node);
    plugin.health_timeout = Duration::from_secs(30);
    Job {
        id: "plugin".into(),
        namespace: "default".into(),
        job_type: JobType::System,
        task_groups: vec![TaskGroup {
            name: "nodes".into(),
            count: 1,
            tasks: vec![Task {
                name: "plugin".into(),
                driver: "raw_exec".into(),
                csi_plugin: Some(plugin),
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn app_job() -> Job {
    let mut volumes = BTreeMap::new();
    volumes.insert(
        "data".to_string(),
        VolumeRequest {
            name: "data".into(),
            volume_type: VolumeType::Csi,
            source: "vol0".into(),
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            ..VolumeRequest::default()
        },
    );
    Job {
        id: "app".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: 1,
            volumes,
            tasks: vec![Task {
                name: "web".into(),
                driver: "exec".into(),
                volume_mounts: vec![VolumeMount {
                    volume: "data".into(),
                    destination: "/data".into(),
                    ..VolumeMount::default()
                }],
                ..Task::default()
            }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

/// A client of node `n1` whose random choices come from `seed`.
fn new_client(seed: u64) -> Client {
    Client::new(client_settings(seed))
}

/// The settings of [`new_client`], for a test that changes some first.
pub(crate) fn client_settings(seed: u64) -> ClientSettings {
    ClientSettings {
        node_id: "n1".into(),
        paths: ClientPaths::new("/s", "/a"),
        host_volumes: BTreeMap::new(),
        region: "global".into(),
        seed,
        faults: Default::default(),
        consul: Default::default(),
        max_kill_timeout: drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT,
    }
}

/// The `exec` driver fingerprints detected and healthy.
fn exec_driver(client: &mut Client, now: Instant) {
    client.handle(
        now,
        ClientInput::Driver {
            name: "exec".into(),
            capabilities: DriverCapabilities {
                mount_configs: MountConfigSupport::All,
                fs_isolation: true,
            },
            info: DriverInfo {
                detected: true,
                healthy: true,
                health_description: "Healthy".into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            },
        },
    );
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

#[test]
fn plugin_then_consumer_then_release() {
    let mut client = new_client(9);
    let mut world = World::default();
    let mut hooks = Vec::new();
    let mut now = Instant::ZERO;
    for (name, mounts) in [
        ("raw_exec", MountConfigSupport::None),
        ("exec", MountConfigSupport::All),
    ] {
        client.handle(
            now,
            ClientInput::Driver {
                name: name.into(),
                capabilities: DriverCapabilities {
                    mount_configs: mounts,
                    fs_isolation: name == "exec",
                },
                info: DriverInfo {
                    detected: true,
                    healthy: true,
                    health_description: "Healthy".into(),
                    attributes: BTreeMap::new(),
                    update_time_ms: 0,
                },
            },
        );
    }
    let (plugin, app) = (plugin_job(), app_job());
    // The consumer arrives together with the plugin: its mount waits for the plugin.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![
                (alloc("p1", &plugin), Arc::new(plugin.clone())),
                (alloc("a1", &app), Arc::new(app.clone())),
            ],
            finished_elsewhere: Vec::new(),
        },
    );
    for _ in 0..5 {
        settle(&mut client, &mut world, now, &mut hooks);
        now = now + Duration::from_secs(1);
        client.handle_timeout(now);
    }
    settle(&mut client, &mut world, now, &mut hooks);
    assert!(
        client
            .registry()
            .get(drover_core::client::registry::PluginKind::CsiNode, "hp")
            .is_some()
    );
    assert_eq!(client.node_csi().1["hp"].node_info.as_ref().unwrap().id, "ext-n1");
    assert_eq!(world.calls, ["NodeStageVolume vol0", "NodePublishVolume vol0"]);
    let web = &world.running[&("a1".to_string(), "web".to_string())];
    assert_eq!(
        web,
        &["/s/csi/node/hp/per-alloc/a1/vol0/rw-file-system-single-node-writer->/data(rw,private)".to_string()]
    );
    assert_eq!(
        hooks
            .iter()
            .filter(|h| h.starts_with("a1"))
            .cloned()
            .collect::<Vec<_>>(),
        [
            "a1 alloc_dir prerun",
            "a1 await_previous_allocations prerun",
            "a1 network prerun",
            "a1 consul_grpc_socket prerun",
            "a1 csi_hook prerun"
        ]
    );

    // The servers expand the volume on this node after its controller did: the plugin is
    // asked for the allocation's own publication, staged where the mount staged it.
    client.handle(
        now,
        ClientInput::NodeExpand {
            req: 7,
            request: drover_core::rpc::NodeExpandRequest {
                plugin_id: "hp".into(),
                node_id: "n1".into(),
                namespace: "default".into(),
                volume_id: "vol0".into(),
                external_id: "vol0".into(),
                alloc_id: "a1".into(),
                claim: drover_core::rpc::ClaimUsage {
                    access_mode: AccessMode::SingleNodeWriter,
                    attachment_mode: AttachmentMode::FileSystem,
                    read_only: false,
                },
                capacity_min: 4 << 30,
                capacity_max: 0,
            },
        },
    );
    let mut expanded = None;
    while let Some(action) = client.poll_action() {
        match action {
            ClientAction::Io { op, io } => {
                let outcome = world.answer(&io);
                client.handle(now, ClientInput::Outcome { op, outcome });
            }
            ClientAction::NodeExpanded { req, result } => expanded = Some((req, result)),
            _ => {}
        }
    }
    assert_eq!(expanded, Some((7, Ok(4 << 30))));
    // The same paths the mount staged and published at (a raw_exec plugin sees host paths).
    let (target, staging) = (
        "/s/csi/node/hp/per-alloc/a1/vol0/rw-file-system-single-node-writer",
        "/s/csi/node/hp/staging/default/vol0/rw-file-system-single-node-writer",
    );
    assert!(
        world.mounts.contains(target) && world.mounts.contains(staging),
        "{:?}",
        world.mounts
    );
    assert_eq!(
        world.calls.pop().unwrap(),
        format!("NodeExpandVolume vol0 {target} {staging}")
    );

    // The servers stop the consumer: kill, then unmount locally, then unpublish.
    let mut stopped = alloc("a1", &app);
    stopped.desired_status = DesiredStatus::Stop;
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![
                (alloc("p1", &plugin), Arc::new(plugin.clone())),
                (stopped, Arc::new(app.clone())),
            ],
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    client.handle(
        now,
        ClientInput::TaskExited {
            alloc_id: "a1".into(),
            task: "web".into(),
            exit: ExitResult::default(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    assert_eq!(
        world.calls,
        [
            "NodeStageVolume vol0",
            "NodePublishVolume vol0",
            "NodeUnpublishVolume vol0",
            "NodeUnstageVolume vol0"
        ]
    );
    assert!(world.mounts.is_empty(), "no mount left: {:?}", world.mounts);
    assert_eq!(
        world
            .server
            .iter()
            .filter(|s| !s.starts_with("csi-info"))
            .cloned()
            .collect::<Vec<_>>(),
        ["claim vol0 a1", "unpublish vol0 a1"]
    );
    assert!(client.alloc("a1").unwrap().is_done());
    assert!(hooks.contains(&"a1 csi_hook postrun".to_string()));

    // The servers garbage-collect the allocation: its dir is removed and its records go.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![(alloc("p1", &plugin), Arc::new(plugin.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut removed = Vec::new();
    let mut forgotten = Vec::new();
    while let Some(action) = client.poll_action() {
        match action {
            ClientAction::Io { op, io } => {
                if let Io::RemoveAll { path } = &io {
                    removed.push(path.clone());
                }
                let outcome = world.answer(&io);
                client.handle(now, ClientInput::Outcome { op, outcome });
            }
            ClientAction::Forget { alloc_id } => forgotten.push(alloc_id),
            _ => {}
        }
    }
    assert_eq!(removed, ["/a/a1"]);
    assert_eq!(forgotten, ["a1"]);
    assert!(client.alloc("a1").is_none());
    assert!(
        client.alloc("p1").is_some(),
        "the plugin alloc is still listed and kept"
    );
}

/// Reports to the servers go one at a time per subject and always carry the latest value: a
/// task that starts and finishes while the first report is still in flight is reported as
/// `Complete` next, never as a late `Running`.
#[test]
fn status_reports_never_go_backwards() {
    use drover_core::structs::ClientStatus;

    let mut client = new_client(3);
    let now = Instant::ZERO;
    exec_driver(&mut client, now);
    let mut job = app_job();
    job.job_type = JobType::Batch;
    job.task_groups[0].volumes.clear();
    job.task_groups[0].tasks[0].volume_mounts.clear();
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![(alloc("a1", &job), Arc::new(job.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut world = World::default();
    let mut held: Vec<(drover_core::op::OpId, ClientStatus)> = Vec::new();
    let mut sent = Vec::new();
    // Answer everything except status reports, which are held back.
    for _ in 0..50 {
        let Some(action) = client.poll_action() else { break };
        if let ClientAction::Io { op, io } = action {
            if let Io::Server(ServerRequest::AllocClientUpdates { updates, .. }) = &io {
                assert_eq!(updates.len(), 1, "{updates:?}");
                sent.push(updates[0].client_status);
                held.push((op, updates[0].client_status));
                continue;
            }
            let outcome = world.answer(&io);
            client.handle(now, ClientInput::Outcome { op, outcome });
        }
    }
    assert_eq!(sent, [ClientStatus::Running], "one report in flight");
    client.handle(
        now,
        ClientInput::TaskExited {
            alloc_id: "a1".into(),
            task: "web".into(),
            exit: ExitResult::default(),
        },
    );
    // The exit is followed through (the task destroyed, its stop hooks run).
    while let Some(action) = client.poll_action() {
        if let ClientAction::Io { op, io } = action {
            if let Io::Server(ServerRequest::AllocClientUpdates { .. }) = &io {
                panic!("a second report while the first is in flight");
            }
            let outcome = world.answer(&io);
            client.handle(now, ClientInput::Outcome { op, outcome });
        }
    }
    // The first report is acknowledged: the latest value follows.
    let (op, _) = held.remove(0);
    client.handle(
        now,
        ClientInput::Outcome {
            op,
            outcome: Ok(Reply::Server(ServerReply::Done { index: 9 })),
        },
    );
    let reports = |client: &mut Client| -> Vec<drover_core::structs::AllocClientReport> {
        std::iter::from_fn(|| client.poll_action())
            .filter_map(|action| match action {
                ClientAction::Io {
                    io: Io::Server(ServerRequest::AllocClientUpdates { updates, .. }),
                    ..
                } => Some(updates),
                _ => None,
            })
            .flatten()
            .collect()
    };
    // Coalesced: the next batch goes once the interval since the last one has passed.
    let mut next = reports(&mut client);
    if next.is_empty() {
        let later = now + drover_core::client::client::ALLOC_UPDATE_INTERVAL;
        assert_eq!(client.poll_timeout(), Some(later));
        client.handle_timeout(later);
        next = reports(&mut client);
    }
    assert_eq!(next.len(), 1, "{next:?}");
    assert_eq!(next[0].client_status, ClientStatus::Complete);
    // With the task's state, its events (Nomad's last ten) and times on the client's clock.
    let web = &next[0].task_states["web"];
    assert_eq!(web.state, drover_core::structs::TaskStatus::Dead);
    let kinds: Vec<&str> = web.events.iter().map(|event| event.kind.as_str()).collect();
    assert_eq!(kinds, ["Received", "Task Setup", "Started", "Terminated"]);
    assert_eq!(web.events[3].details["exit_code"], "0");
}

/// Driver fingerprints: the node's driver table is reported when it changes (not on every
/// fingerprint), a health change becomes a `Driver` node event sent with `Node.EmitEvents`, a
/// driver that turns unhealthy is no longer offered to tasks, and events that fail to reach
/// the servers are sent again.
/// An allocation the servers stopped before this client ever ran it (replaced while the client
/// was down) runs nothing and is reported complete, or it would stay pending on the servers.
#[test]
fn a_stopped_allocation_that_never_ran_here_is_reported_complete() {
    let mut client = new_client(3);
    let mut job = app_job();
    job.task_groups[0].volumes.clear();
    job.task_groups[0].tasks[0].volume_mounts.clear();
    let mut stopped = alloc("a1", &job);
    stopped.desired_status = drover_core::structs::DesiredStatus::Stop;
    let now = Instant::ZERO;
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![(stopped, Arc::new(job.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut reports = Vec::new();
    while let Some(action) = client.poll_action() {
        match action {
            ClientAction::Io {
                io: Io::Server(ServerRequest::AllocClientUpdates { updates, .. }),
                ..
            } => reports.extend(
                updates
                    .into_iter()
                    .map(|update| (update.alloc_id, update.client_status)),
            ),
            ClientAction::Io { io, .. } => panic!("nothing runs for a stopped allocation: {io:?}"),
            ClientAction::PersistSpec { .. } => panic!("a stopped allocation is not kept"),
            _ => {}
        }
    }
    assert_eq!(
        reports,
        [("a1".to_string(), drover_core::structs::ClientStatus::Complete)]
    );
    assert!(client.alloc("a1").is_none(), "no runner for it");
}

#[test]
fn driver_fingerprints_report_changes_and_health_events() {
    let mut client = new_client(3);
    let capabilities = DriverCapabilities {
        mount_configs: MountConfigSupport::All,
        fs_isolation: true,
    };
    let info = |healthy: bool, description: &str| DriverInfo {
        detected: true,
        healthy,
        health_description: description.into(),
        attributes: BTreeMap::from([("driver.exec".to_string(), "1".to_string())]),
        update_time_ms: 0,
    };
    let fingerprint = |client: &mut Client, now: Instant, healthy: bool, description: &str| {
        client.handle(
            now,
            ClientInput::Driver {
                name: "exec".into(),
                capabilities,
                info: info(healthy, description),
            },
        )
    };
    // Requests to the servers, as (op, request).
    let drain = |client: &mut Client| -> Vec<(drover_core::op::OpId, ServerRequest)> {
        std::iter::from_fn(|| client.poll_action())
            .filter_map(|action| match action {
                ClientAction::Io {
                    op,
                    io: Io::Server(request),
                } => Some((op, request)),
                _ => None,
            })
            .collect()
    };
    let done = |client: &mut Client, now: Instant, op| {
        client.handle(
            now,
            ClientInput::Outcome {
                op,
                outcome: Ok(Reply::Server(ServerReply::Done { index: 1 })),
            },
        )
    };

    let now = Instant::ZERO;
    fingerprint(&mut client, now, true, "Healthy");
    let sent = drain(&mut client);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let ServerRequest::NodeUpdateDrivers { drivers, .. } = &sent[0].1 else {
        panic!("{sent:?}")
    };
    assert!(drivers["exec"].healthy);
    done(&mut client, now, sent[0].0);
    assert!(drain(&mut client).is_empty());

    // The same fingerprint again: nothing to tell.
    fingerprint(&mut client, now, true, "Healthy");
    assert!(drain(&mut client).is_empty());

    // Unhealthy: the table and an event; the event fails once and is sent again.
    fingerprint(&mut client, now, false, "exec driver must run as root");
    let sent = drain(&mut client);
    let kinds: Vec<&str> = sent
        .iter()
        .map(|(_, request)| match request {
            ServerRequest::NodeUpdateDrivers { .. } => "drivers",
            ServerRequest::NodeEmitEvents { .. } => "events",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["events", "drivers"]);
    let ServerRequest::NodeEmitEvents { events, .. } = &sent[0].1 else {
        unreachable!()
    };
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].subsystem, "Driver");
    assert_eq!(events[0].message, "exec driver must run as root");
    assert_eq!(events[0].details["driver"], "exec");
    client.handle(
        now,
        ClientInput::Outcome {
            op: sent[0].0,
            outcome: Err(IoError::new(drover_core::client::ErrorKind::Unavailable, "no server")),
        },
    );
    done(&mut client, now, sent[1].0);
    assert!(drain(&mut client).is_empty(), "waits before retrying");
    let later = now + Duration::from_secs(2);
    client.handle_timeout(later);
    let retried = drain(&mut client);
    assert!(
        matches!(&retried[..], [(_, ServerRequest::NodeEmitEvents { events, .. })] if events.len() == 1),
        "{retried:?}"
    );
    done(&mut client, later, retried[0].0);
    assert!(drain(&mut client).is_empty(), "an accepted event is not sent twice");

    // A task for the unhealthy driver does not start: the driver is not offered.
    let mut job = app_job();
    job.job_type = JobType::Batch;
    job.task_groups[0].volumes.clear();
    job.task_groups[0].tasks[0].volume_mounts.clear();
    client.handle(
        later,
        ClientInput::Allocs {
            allocs: vec![(alloc("a1", &job), Arc::new(job.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut world = World::default();
    for _ in 0..50 {
        let Some(action) = client.poll_action() else { break };
        if let ClientAction::Io { op, io } = action {
            let outcome = world.answer(&io);
            client.handle(later, ClientInput::Outcome { op, outcome });
        }
    }
    assert!(
        world.running.is_empty(),
        "started on an unhealthy driver: {:?}",
        world.running
    );
}

/// A report that timed out may still be applied later (its leader commits it once it has a
/// quorum again): the client sends its latest value once more, even when that equals what
/// the servers last acknowledged (servers_away seed 158).
#[test]
fn a_report_that_timed_out_is_followed_by_the_latest_even_if_acknowledged_before() {
    let mut client = new_client(3);
    let capabilities = DriverCapabilities {
        mount_configs: MountConfigSupport::All,
        fs_isolation: true,
    };
    let fingerprint = |client: &mut Client, now: Instant, healthy: bool| {
        client.handle(
            now,
            ClientInput::Driver {
                name: "exec".into(),
                capabilities,
                info: DriverInfo {
                    detected: true,
                    healthy,
                    health_description: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                    attributes: BTreeMap::new(),
                    update_time_ms: 0,
                },
            },
        )
    };
    let drivers_sent = |client: &mut Client| -> Vec<(drover_core::op::OpId, bool)> {
        std::iter::from_fn(|| client.poll_action())
            .filter_map(|action| match action {
                ClientAction::Io {
                    op,
                    io: Io::Server(ServerRequest::NodeUpdateDrivers { drivers, .. }),
                } => Some((op, drivers["exec"].healthy)),
                _ => None,
            })
            .collect()
    };
    let answer = |client: &mut Client, now: Instant, op, outcome: Outcome| {
        client.handle(now, ClientInput::Outcome { op, outcome });
    };
    let now = Instant::ZERO;
    fingerprint(&mut client, now, true);
    let sent = drivers_sent(&mut client);
    assert_eq!(sent.iter().map(|(_, healthy)| *healthy).collect::<Vec<_>>(), [true]);
    answer(
        &mut client,
        now,
        sent[0].0,
        Ok(Reply::Server(ServerReply::Done { index: 1 })),
    );

    // Unhealthy: sent, and it times out; healthy again meanwhile.
    fingerprint(&mut client, now, false);
    let sent = drivers_sent(&mut client);
    assert_eq!(sent.iter().map(|(_, healthy)| *healthy).collect::<Vec<_>>(), [false]);
    fingerprint(&mut client, now, true);
    answer(
        &mut client,
        now,
        sent[0].0,
        Err(IoError::new(drover_core::client::ErrorKind::Timeout, "timed out")),
    );
    assert!(drivers_sent(&mut client).is_empty(), "waits before retrying");

    // The retry sends the healthy table, though the servers acknowledged it before.
    let later = now + Duration::from_secs(2);
    client.handle_timeout(later);
    let sent = drivers_sent(&mut client);
    assert_eq!(
        sent.iter().map(|(_, healthy)| *healthy).collect::<Vec<_>>(),
        [true],
        "the timed-out unhealthy report may yet be applied: the healthy one must follow it"
    );
    answer(
        &mut client,
        later,
        sent[0].0,
        Ok(Reply::Server(ServerReply::Done { index: 2 })),
    );
    assert!(drivers_sent(&mut client).is_empty(), "once accepted, not sent again");
}

/// A fingerprint round of several drivers is reported as one whole table: reported driver by
/// driver, the first update would replace the node's table with a partial one (the scheduler
/// then saw `missing drivers` for a moment).
#[test]
fn a_fingerprint_round_is_reported_whole() {
    let mut client = new_client(3);
    let healthy = DriverInfo {
        detected: true,
        healthy: true,
        health_description: "Healthy".into(),
        attributes: BTreeMap::new(),
        update_time_ms: 0,
    };
    let capabilities = DriverCapabilities {
        mount_configs: MountConfigSupport::All,
        fs_isolation: true,
    };
    client.handle(
        Instant::ZERO,
        ClientInput::Drivers {
            drivers: vec![
                ("exec".into(), capabilities, healthy.clone()),
                ("raw_exec".into(), capabilities, healthy.clone()),
            ],
        },
    );
    let tables: Vec<Vec<String>> = std::iter::from_fn(|| client.poll_action())
        .filter_map(|action| match action {
            ClientAction::Io {
                io: Io::Server(ServerRequest::NodeUpdateDrivers { drivers, .. }),
                ..
            } => Some(drivers.into_keys().collect()),
            _ => None,
        })
        .collect();
    assert_eq!(tables, [vec!["exec".to_string(), "raw_exec".to_string()]]);
}

/// The client side of heartbeats: one `Node.UpdateStatus` per TTL the servers hand back, a
/// retry a second after a failure, and a re-registration (then every report again) when the
/// servers no longer know the node.
#[test]
fn heartbeats_follow_the_servers_ttl_and_reregister_a_forgotten_node() {
    let mut client = new_client(3);
    let healthy = DriverInfo {
        detected: true,
        healthy: true,
        health_description: "Healthy".into(),
        attributes: BTreeMap::new(),
        update_time_ms: 0,
    };
    let capabilities = DriverCapabilities {
        mount_configs: MountConfigSupport::All,
        fs_isolation: true,
    };
    client.handle(
        Instant::ZERO,
        ClientInput::Drivers {
            drivers: vec![("exec".into(), capabilities, healthy)],
        },
    );
    // The driver table is reported and acknowledged.
    let drain = |client: &mut Client, at: Instant, reply: &dyn Fn(&ServerRequest) -> ServerReply| {
        let mut sent = Vec::new();
        let mut other = Vec::new();
        while let Some(action) = client.poll_action() {
            match action {
                ClientAction::Io {
                    op,
                    io: Io::Server(request),
                } => {
                    sent.push(match &request {
                        ServerRequest::NodeRegister { .. } => "register".to_string(),
                        ServerRequest::NodeUpdateStatus { .. } => "heartbeat".to_string(),
                        ServerRequest::NodeUpdateDrivers { .. } => "drivers".to_string(),
                        ServerRequest::NodeUpdateCsiInfo { .. } => "csi".to_string(),
                        other => format!("{other:?}"),
                    });
                    let answer = reply(&request);
                    client.handle(
                        at,
                        ClientInput::Outcome {
                            op,
                            outcome: Ok(Reply::Server(answer)),
                        },
                    );
                }
                ClientAction::Io {
                    io: Io::AllocSync(_), ..
                } => other.push("alloc-sync"),
                _ => {}
            }
        }
        (sent, other)
    };
    let ok = |_: &ServerRequest| ServerReply::Heartbeat {
        index: 5,
        heartbeat_ttl_ms: 12_000,
    };
    let done = |_: &ServerRequest| ServerReply::Done { index: 5 };
    assert_eq!(drain(&mut client, Instant::ZERO, &done).0, ["drivers"]);
    assert_eq!(
        client.poll_timeout(),
        None,
        "no heartbeats before the node is registered"
    );

    let t0 = Instant::ZERO + Duration::from_secs(1);
    let node = drover_core::structs::Node {
        id: "n1".into(),
        ..Default::default()
    };
    client.connect(t0, node, Default::default(), Vec::new());
    let registered = |_: &ServerRequest| ServerReply::Heartbeat {
        index: 5,
        heartbeat_ttl_ms: 15_000,
    };
    assert_eq!(
        drain(&mut client, t0, &registered),
        (vec!["register".to_string()], vec!["alloc-sync"])
    );
    assert_eq!(client.poll_timeout(), Some(t0 + Duration::from_secs(15)));
    client.handle_timeout(t0 + Duration::from_secs(14));
    assert!(drain(&mut client, t0, &ok).0.is_empty(), "not before the TTL");
    let t1 = t0 + Duration::from_secs(15);
    client.handle_timeout(t1);
    assert_eq!(drain(&mut client, t1, &ok).0, ["heartbeat"]);
    assert_eq!(client.heartbeat_ttl(), Duration::from_secs(12));
    assert_eq!(client.poll_timeout(), Some(t1 + Duration::from_secs(12)));

    // A failed heartbeat is retried a second later.
    let t2 = t1 + Duration::from_secs(12);
    client.handle_timeout(t2);
    let unreachable =
        |_: &ServerRequest| ServerReply::Error(drover_core::rpc::RpcError::unavailable("No cluster leader"));
    assert_eq!(drain(&mut client, t2, &unreachable).0, ["heartbeat"]);
    assert_eq!(client.poll_timeout(), Some(t2 + Duration::from_secs(1)));

    // The servers forgot the node: register again, then report everything again.
    let t3 = t2 + Duration::from_secs(1);
    client.handle_timeout(t3);
    let forgotten = |_: &ServerRequest| ServerReply::Error(drover_core::rpc::RpcError::not_found("node not found: n1"));
    let reregistered = |request: &ServerRequest| match request {
        ServerRequest::NodeUpdateStatus { .. } => forgotten(request),
        ServerRequest::NodeRegister { .. } => ServerReply::Heartbeat {
            index: 6,
            heartbeat_ttl_ms: 10_000,
        },
        _ => ServerReply::Done { index: 6 },
    };
    let (sent, _) = drain(&mut client, t3, &reregistered);
    assert_eq!(sent, ["heartbeat", "register", "csi", "drivers"]);
    // The next heartbeat in 10 s, unless the drivers' fingerprint round comes first.
    let fingerprint = t0 + drover_core::client::client::DRIVER_FINGERPRINT_INTERVAL;
    assert_eq!(
        client.poll_timeout(),
        Some((t3 + Duration::from_secs(10)).min(fingerprint))
    );

    // Consul is fingerprinted: the node registers again carrying `consul.*` (Connect jobs
    // are constrained on `${attr.consul.version}`); the same values again change nothing.
    let consul = BTreeMap::from([("consul.version".to_string(), "1.9.5".to_string())]);
    let carried = std::cell::RefCell::new(Vec::new());
    let recording = |request: &ServerRequest| {
        if let ServerRequest::NodeRegister { node } = request {
            carried
                .borrow_mut()
                .push(node.attributes.get("consul.version").cloned());
        }
        reregistered(request)
    };
    client.handle(
        t3,
        ClientInput::ConsulAttributes {
            attributes: consul.clone(),
        },
    );
    assert_eq!(drain(&mut client, t3, &recording).0, ["register", "csi", "drivers"]);
    client.handle(t3, ClientInput::ConsulAttributes { attributes: consul });
    assert!(drain(&mut client, t3, &recording).0.is_empty());
    // Consul became unreachable: the attributes go, as Nomad's fingerprinter drops them.
    client.handle(
        t3,
        ClientInput::ConsulAttributes {
            attributes: BTreeMap::new(),
        },
    );
    assert_eq!(drain(&mut client, t3, &recording).0, ["register", "csi", "drivers"]);
    assert_eq!(*carried.borrow(), [Some("1.9.5".to_string()), None]);
}

/// A fingerprint report in flight when the node registers again is sent again once answered:
/// the registration replaces the node record, and may be applied after the report was (swarm
/// seed 193: the CSI plugins, acknowledged at index 48, were wiped by a registration at 50,
/// and the job stayed blocked on "CSI plugin p is missing").
#[test]
fn a_report_in_flight_across_a_registration_is_sent_again() {
    let mut client = new_client(5);
    let drivers = |healthy: bool| ClientInput::Drivers {
        drivers: vec![(
            "exec".into(),
            DriverCapabilities {
                mount_configs: MountConfigSupport::All,
                fs_isolation: true,
            },
            DriverInfo {
                detected: true,
                healthy,
                health_description: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            },
        )],
    };
    // Registrations and driver reports sent, with their ops; nothing answered yet.
    let sent = |client: &mut Client| {
        let mut sent = Vec::new();
        while let Some(action) = client.poll_action() {
            if let ClientAction::Io {
                op,
                io: Io::Server(request),
            } = action
            {
                // Node events (a driver turning unhealthy raises one) are left unanswered.
                let kind = match request {
                    ServerRequest::NodeRegister { .. } => "register",
                    ServerRequest::NodeUpdateDrivers { .. } => "drivers",
                    _ => continue,
                };
                sent.push((kind, op));
            }
        }
        sent
    };
    let answer = |client: &mut Client, op, reply: ServerReply| {
        client.handle(
            Instant::ZERO,
            ClientInput::Outcome {
                op,
                outcome: Ok(Reply::Server(reply)),
            },
        )
    };
    let registered = ServerReply::Heartbeat {
        index: 5,
        heartbeat_ttl_ms: 10_000,
    };
    client.handle(Instant::ZERO, drivers(true));
    let node = drover_core::structs::Node {
        id: "n1".into(),
        ..Default::default()
    };
    client.connect(Instant::ZERO, node, Default::default(), Vec::new());
    for (kind, op) in sent(&mut client) {
        let reply = match kind {
            "register" => registered.clone(),
            _ => ServerReply::Done { index: 5 },
        };
        answer(&mut client, op, reply);
    }
    let _ = sent(&mut client);

    // The driver turns unhealthy: its report goes out and stays unanswered while Consul's
    // attributes make the node register again.
    client.handle(Instant::ZERO, drivers(false));
    let report = sent(&mut client);
    assert_eq!(report.iter().map(|(kind, _)| *kind).collect::<Vec<_>>(), ["drivers"]);
    client.handle(
        Instant::ZERO,
        ClientInput::ConsulAttributes {
            attributes: BTreeMap::from([("consul.version".to_string(), "1.9.5".to_string())]),
        },
    );
    let register = sent(&mut client);
    assert_eq!(register.iter().map(|(kind, _)| *kind).collect::<Vec<_>>(), ["register"]);
    answer(&mut client, register[0].1, registered.clone());
    assert!(sent(&mut client).is_empty(), "the report in flight is not duplicated");

    // The report is answered (it was applied before the registration): it goes out again.
    answer(&mut client, report[0].1, ServerReply::Done { index: 6 });
    let again = sent(&mut client);
    assert_eq!(again.iter().map(|(kind, _)| *kind).collect::<Vec<_>>(), ["drivers"]);
    answer(&mut client, again[0].1, ServerReply::Done { index: 8 });
    assert!(
        sent(&mut client).is_empty(),
        "and once answered after the registration, no more"
    );
}

/// A failed write to the client store reaches the operator as a `Storage` node event, at most
/// one per interval, with the number of failures it stands for.
#[test]
fn persist_failures_become_rate_limited_storage_events() {
    use drover_core::client::client::PERSIST_EVENT_INTERVAL;
    let mut client = new_client(3);
    let storage_events = |client: &mut Client| -> Vec<ClientNodeEvent> {
        let mut events = Vec::new();
        while let Some(action) = client.poll_action() {
            if let ClientAction::NodeEvent(event) = action {
                assert_eq!(event.subsystem, "Storage");
                events.push(event);
            }
        }
        events
    };
    let fail = |client: &mut Client, now: Instant, record: &str| {
        client.handle(
            now,
            ClientInput::PersistFailed {
                record: record.into(),
                error: "No space left on device".into(),
            },
        );
    };
    let start = Instant::from_nanos(0);
    fail(&mut client, start, "task/a1/web");
    let first = storage_events(&mut client);
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].message,
        "client state could not be persisted: No space left on device"
    );
    assert_eq!(first[0].details["record"], "task/a1/web");
    assert_eq!(first[0].details["failures"], "1");

    for second in 1..=3 {
        fail(&mut client, start + Duration::from_secs(second), "alloc/a1");
    }
    assert!(
        storage_events(&mut client).is_empty(),
        "within the interval: counted, not raised"
    );

    fail(&mut client, start + PERSIST_EVENT_INTERVAL, "registry");
    let next = storage_events(&mut client);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].details["failures"], "4");
    assert_eq!(next[0].details["record"], "registry");
}

/// An allocation the servers stop and this client collects while an earlier report of it is
/// still in flight: the client forgets the allocation, but its last status (complete) is still
/// sent once the earlier report is answered, or the servers would keep it running forever.
#[test]
fn the_last_report_of_a_collected_allocation_is_still_sent() {
    use drover_core::structs::ClientStatus;

    let mut client = new_client(3);
    let now = Instant::ZERO;
    exec_driver(&mut client, now);
    let mut job = app_job();
    job.task_groups[0].volumes.clear();
    job.task_groups[0].tasks[0].volume_mounts.clear();
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![(alloc("a1", &job), Arc::new(job.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut world = World::default();
    let mut held = None;
    // Runs everything, holding back the status reports.
    let mut drive = |client: &mut Client, held: &mut Option<drover_core::op::OpId>| {
        let mut statuses = Vec::new();
        for _ in 0..100 {
            let Some(action) = client.poll_action() else { break };
            if let ClientAction::Io { op, io } = action {
                if let Io::Server(ServerRequest::AllocClientUpdates { updates, .. }) = &io {
                    statuses.extend(updates.iter().map(|u| (u.alloc_id.clone(), u.client_status)));
                    *held = Some(op);
                    continue;
                }
                let outcome = world.answer(&io);
                client.handle(now, ClientInput::Outcome { op, outcome });
            }
        }
        statuses
    };
    assert_eq!(
        drive(&mut client, &mut held),
        [("a1".to_string(), ClientStatus::Running)]
    );
    // The servers no longer list it: stopped and collected while the report is in flight.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: Vec::new(),
            finished_elsewhere: Vec::new(),
        },
    );
    assert!(drive(&mut client, &mut held).is_empty(), "one report at a time");
    assert!(client.alloc("a1").is_none(), "collected");
    let op = held.take().expect("the first report");
    client.handle(
        now,
        ClientInput::Outcome {
            op,
            outcome: Ok(Reply::Server(ServerReply::Done { index: 9 })),
        },
    );
    let later = now + drover_core::client::client::ALLOC_UPDATE_INTERVAL;
    client.handle_timeout(later);
    assert_eq!(
        drive(&mut client, &mut held),
        [("a1".to_string(), ClientStatus::Complete)],
        "the collected allocation's last word"
    );
}

/// [`app_job`] without its volume.
fn app_job_without_volumes() -> Job {
    let mut job = app_job();
    job.task_groups[0].volumes.clear();
    job.task_groups[0].tasks[0].volume_mounts.clear();
    job
}

/// A client with the `exec` driver and allocation `a1` of `job` placed on it, at time zero.
fn placed_app(job: Job) -> Client {
    let mut client = new_client(3);
    exec_driver(&mut client, Instant::ZERO);
    client.handle(
        Instant::ZERO,
        ClientInput::Allocs {
            allocs: vec![(alloc("a1", &job), Arc::new(job.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    client
}

/// An operator restarts and signals a running allocation's task (`alloc restart`, `alloc
/// signal`): a signal is sent through the driver and answered once delivered; a restart kills
/// the task and starts it again at once, outside its restart policy; bad requests are refused
/// with Nomad's words.
#[test]
fn operators_restart_and_signal_a_running_task() {
    use drover_core::client::AllocControl;

    let now = Instant::ZERO;
    let mut client = placed_app(app_job_without_volumes());
    let mut world = World::default();
    // Answers every I/O; returns the task I/O seen and the control answers.
    let mut drive = |client: &mut Client| {
        let (mut seen, mut answers) = (Vec::new(), Vec::new());
        while let Some(action) = client.poll_action() {
            match action {
                ClientAction::Io { op, io } => {
                    match &io {
                        Io::SignalTask { signal, .. } => seen.push(format!("signal {signal}")),
                        Io::StopTask { .. } => seen.push("stop".to_string()),
                        Io::StartTask(_) => seen.push("start".to_string()),
                        _ => {}
                    }
                    let outcome = world.answer(&io);
                    client.handle(now, ClientInput::Outcome { op, outcome });
                }
                ClientAction::AllocControlled { req, result } => answers.push((req, result)),
                _ => {}
            }
        }
        (seen, answers)
    };
    assert_eq!(drive(&mut client).0, ["start"]);
    let control = |client: &mut Client, req: u64, request: AllocControl| {
        client.handle(now, ClientInput::AllocControl { req, request });
    };
    let signal = |task: Option<&str>, signal: &str| AllocControl::Signal {
        alloc_id: "a1".into(),
        task: task.map(String::from),
        signal: signal.into(),
    };

    control(&mut client, 1, signal(None, "SIGUSR1"));
    assert_eq!(drive(&mut client), (vec!["signal 10".to_string()], vec![(1, Ok(()))]));
    let web = &client.alloc("a1").unwrap().task_states()["web"];
    let last = web.events.last().unwrap();
    assert_eq!(last.kind, "Signaling");
    assert_eq!(last.message, "Task being sent signal SIGUSR1: User requested signal");

    control(&mut client, 2, signal(Some("web"), "SIGNOPE"));
    control(&mut client, 3, signal(Some("nope"), "SIGHUP"));
    control(
        &mut client,
        4,
        AllocControl::Restart {
            alloc_id: "gone".into(),
            task: None,
        },
    );
    assert_eq!(
        drive(&mut client).1,
        [
            (2, Err(AllocCallError::invalid("Invalid signal \"SIGNOPE\""))),
            (
                3,
                Err(AllocCallError::new(
                    AllocCallFailure::UnknownTask,
                    "Could not find task runner for task: nope"
                ))
            ),
            (4, Err(AllocCallError::unknown_alloc("gone"))),
        ]
    );

    control(
        &mut client,
        5,
        AllocControl::Restart {
            alloc_id: "a1".into(),
            task: Some("web".into()),
        },
    );
    // The driver's stop returns once the task is gone: started again at once.
    assert_eq!(
        drive(&mut client),
        (vec!["stop".to_string(), "start".to_string()], vec![(5, Ok(()))])
    );
    let web = &client.alloc("a1").unwrap().task_states()["web"];
    assert_eq!(web.restarts, 1);
    let kinds: Vec<&str> = web.events.iter().map(|event| event.kind.as_str()).collect();
    assert!(
        kinds.ends_with(&[
            "Restart Signaled",
            "Killing",
            "Killed",
            "Restarting",
            "Task Setup",
            "Started"
        ]),
        "{kinds:?}"
    );
}

/// A task's `kill_timeout` is capped at the client's `max_kill_timeout` (Nomad's
/// `SetKillTimeout`), in the kill it sends and the event it records; and a task being killed
/// still takes an operator's signal, so a SIGKILL need not wait the timeout out (issue 54 §9).
#[test]
fn kill_timeout_is_capped_and_a_task_being_killed_takes_a_sigkill() {
    use drover_core::client::AllocControl;

    let now = Instant::ZERO;
    let mut job = app_job_without_volumes();
    job.task_groups[0].tasks[0].kill_timeout = Duration::from_secs(3_600);
    let mut client = placed_app(job);
    let mut world = World::default();
    // Answers every I/O but the stop, which stays pending (the task ignores its signal): the
    // stops' kill timeouts, the signals sent and the control answers.
    let mut drive = |client: &mut Client| {
        let (mut stops, mut signals, mut answers) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(action) = client.poll_action() {
            match action {
                ClientAction::Io {
                    io: Io::StopTask { kill_timeout, .. },
                    ..
                } => stops.push(kill_timeout),
                ClientAction::Io { op, io } => {
                    if let Io::SignalTask { signal, .. } = &io {
                        signals.push(*signal);
                    }
                    let outcome = world.answer(&io);
                    client.handle(now, ClientInput::Outcome { op, outcome });
                }
                ClientAction::AllocControlled { req, result } => answers.push((req, result)),
                _ => {}
            }
        }
        (stops, signals, answers)
    };
    drive(&mut client);
    let restart = AllocControl::Restart {
        alloc_id: "a1".into(),
        task: None,
    };
    client.handle(
        now,
        ClientInput::AllocControl {
            req: 1,
            request: restart,
        },
    );
    let (stops, _, _) = drive(&mut client);
    assert_eq!(stops, [drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT]);
    let web = &client.alloc("a1").unwrap().task_states()["web"];
    let killing = web.events.iter().rev().find(|event| event.kind == "Killing").unwrap();
    assert_eq!(killing.message, "Sent interrupt. Waiting 30s before force killing");
    assert_eq!(killing.details.get("kill_timeout").map(String::as_str), Some("30s"));

    let sigkill = AllocControl::Signal {
        alloc_id: "a1".into(),
        task: Some("web".into()),
        signal: "SIGKILL".into(),
    };
    client.handle(
        now,
        ClientInput::AllocControl {
            req: 2,
            request: sigkill,
        },
    );
    let (_, signals, answers) = drive(&mut client);
    assert_eq!((signals, answers), (vec![9], vec![(2, Ok(()))]));
}

/// Dev mode's shutdown (Nomad's client destroys its allocations when it stops in dev mode):
/// the consumer is killed, its volume unpublished and unstaged through the plugin, its dir
/// removed, and only then is the plugin stopped and destroyed; nothing the servers send
/// afterwards starts again, and the client says when it is drained.
#[test]
fn a_dev_shutdown_destroys_every_allocation_plugins_last() {
    let mut client = new_client(9);
    let mut world = World::default();
    let mut hooks = Vec::new();
    let mut now = Instant::ZERO;
    for name in ["raw_exec", "exec"] {
        client.handle(
            now,
            ClientInput::Driver {
                name: name.into(),
                capabilities: DriverCapabilities {
                    mount_configs: MountConfigSupport::All,
                    fs_isolation: name == "exec",
                },
                info: DriverInfo {
                    detected: true,
                    healthy: true,
                    health_description: "Healthy".into(),
                    attributes: BTreeMap::new(),
                    update_time_ms: 0,
                },
            },
        );
    }
    let (plugin, app) = (plugin_job(), app_job());
    let listed = vec![
        (alloc("p1", &plugin), Arc::new(plugin.clone())),
        (alloc("a1", &app), Arc::new(app.clone())),
    ];
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed.clone(),
            finished_elsewhere: Vec::new(),
        },
    );
    for _ in 0..5 {
        settle(&mut client, &mut world, now, &mut hooks);
        now = now + Duration::from_secs(1);
        client.handle_timeout(now);
    }
    settle(&mut client, &mut world, now, &mut hooks);
    assert_eq!(world.running.len(), 2, "both run");
    assert!(!client.is_drained());

    client.handle(now, ClientInput::Shutdown);
    // The servers still list both: nothing starts again, nothing is kept.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed,
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    for task in [("a1", "web"), ("p1", "plugin")] {
        client.handle(
            now,
            ClientInput::TaskExited {
                alloc_id: task.0.into(),
                task: task.1.into(),
                exit: ExitResult::default(),
            },
        );
        settle(&mut client, &mut world, now, &mut hooks);
    }
    assert_eq!(
        world.order,
        ["stop a1", "NodeUnpublishVolume", "NodeUnstageVolume", "stop p1"],
        "the consumer is stopped and unmounted through the plugin, then the plugin goes"
    );
    assert_eq!(world.running.len(), 2, "nothing started again");
    assert!(client.alloc("a1").is_none());
    assert!(client.alloc("p1").is_none());
    assert!(client.is_drained());
    assert!(world.mounts.is_empty(), "{:?}", world.mounts);
}

/// A task event that changes nothing else — a plugin turning healthy — reaches the servers
/// with the next batch of allocation updates (Nomad's 200 ms), not whenever some other
/// allocation on the node next changes (seen: 2 min 11 s); the plugin's death is recorded
/// unhealthy and reaches them the same way.
#[test]
fn a_plugins_health_events_reach_the_servers_within_one_batch() {
    let mut client = new_client(5);
    let mut now = Instant::ZERO;
    client.handle(
        now,
        ClientInput::Driver {
            name: "raw_exec".into(),
            capabilities: DriverCapabilities {
                mount_configs: MountConfigSupport::None,
                fs_isolation: false,
            },
            info: DriverInfo {
                detected: true,
                healthy: true,
                health_description: "Healthy".into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            },
        },
    );
    let plugin = plugin_job();
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: vec![(alloc("p1", &plugin), Arc::new(plugin.clone()))],
            finished_elsewhere: Vec::new(),
        },
    );
    let mut world = World {
        plugins_not_ready: true,
        ..World::default()
    };
    // Every event the servers were sent for task `plugin`, with the time it was sent.
    let mut sent: Vec<(Instant, String)> = Vec::new();
    fn run_until(
        client: &mut Client,
        world: &mut World,
        sent: &mut Vec<(Instant, String)>,
        now: &mut Instant,
        until: Instant,
    ) {
        loop {
            while let Some(action) = client.poll_action() {
                if let ClientAction::Io { op, io } = action {
                    if let Io::Server(ServerRequest::AllocClientUpdates { updates, .. }) = &io {
                        for update in updates {
                            for event in &update.task_states["plugin"].events {
                                let seen = sent.iter().any(|(_, kind)| kind == &event.kind);
                                if !seen || event.kind.starts_with("Plugin became") {
                                    sent.push((*now, event.kind.clone()));
                                }
                            }
                        }
                    }
                    let outcome = world.answer(&io);
                    client.handle(*now, ClientInput::Outcome { op, outcome });
                }
            }
            match client.poll_timeout() {
                Some(at) if at <= until => {
                    *now = at.max(*now);
                    client.handle_timeout(*now);
                }
                _ => {
                    *now = until;
                    return;
                }
            }
        }
    }
    run_until(
        &mut client,
        &mut world,
        &mut sent,
        &mut now,
        Instant::ZERO + Duration::from_secs(3),
    );
    assert_eq!(
        client.alloc("p1").unwrap().task_states()["plugin"].state,
        drover_core::structs::TaskStatus::Running
    );
    assert!(!sent.iter().any(|(_, kind)| kind.starts_with("Plugin became")));
    // The plugin answers its next probe: healthy, and the servers hear of it at once.
    world.plugins_not_ready = false;
    let healthy_at = client.poll_timeout().expect("the next probe");
    run_until(
        &mut client,
        &mut world,
        &mut sent,
        &mut now,
        healthy_at + Duration::from_secs(10),
    );
    let reported = sent
        .iter()
        .find(|(_, kind)| kind == "Plugin became healthy")
        .map(|(at, _)| *at)
        .expect("the healthy event is reported");
    assert!(
        reported <= healthy_at + drover_core::client::client::ALLOC_UPDATE_INTERVAL,
        "reported {:?} after the probe",
        reported.saturating_duration_since(healthy_at)
    );
    // The plugin dies: recorded unhealthy, and reported as promptly.
    let died_at = now;
    client.handle(
        died_at,
        ClientInput::TaskExited {
            alloc_id: "p1".into(),
            task: "plugin".into(),
            exit: ExitResult {
                exit_code: 137,
                signal: 9,
                ..ExitResult::default()
            },
        },
    );
    run_until(
        &mut client,
        &mut world,
        &mut sent,
        &mut now,
        died_at + Duration::from_secs(1),
    );
    let unhealthy = sent
        .iter()
        .find(|(_, kind)| kind == "Plugin became unhealthy")
        .map(|(at, _)| *at)
        .expect("the plugin's death is recorded unhealthy and reported");
    assert!(unhealthy <= died_at + drover_core::client::client::ALLOC_UPDATE_INTERVAL);
}

/// An operator's client GC (`/v1/client/gc`): only what is done here and listed by the
/// servers as finished is destroyed and forgotten; a running allocation, or one the servers
/// still count as running, is kept, and one named that is not eligible is refused. A
/// collected allocation the servers list again as finished does not come back.
#[test]
fn a_client_gc_collects_only_what_is_done_and_listed_finished() {
    let mut client = new_client(9);
    let mut world = World::default();
    let mut hooks = Vec::new();
    let now = Instant::ZERO;
    exec_driver(&mut client, now);
    let job = app_job_without_volumes();
    let listed = |done: &[&str], finished: &[&str]| {
        ["a1", "a2", "a3"]
            .iter()
            .map(|id| {
                let mut alloc = alloc(id, &job);
                if done.contains(id) {
                    alloc.desired_status = drover_core::structs::DesiredStatus::Stop;
                }
                if finished.contains(id) {
                    alloc.client_status = drover_core::structs::ClientStatus::Complete;
                }
                (alloc, Arc::new(job.clone()))
            })
            .collect::<Vec<_>>()
    };
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed(&[], &[]),
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    // a1 and a2 are stopped by the servers; a1's stop is reported and listed back finished,
    // a2's is not yet.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed(&["a1", "a2"], &[]),
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    for id in ["a1", "a2"] {
        client.handle(
            now,
            ClientInput::TaskExited {
                alloc_id: id.into(),
                task: "web".into(),
                exit: ExitResult::default(),
            },
        );
        settle(&mut client, &mut world, now, &mut hooks);
    }
    assert!(client.alloc("a1").unwrap().is_done() && client.alloc("a2").unwrap().is_done());
    // Before the servers list anything finished, nothing is eligible.
    assert_eq!(client.garbage_collect(now, None), Ok(vec![]));
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed(&["a1", "a2"], &["a1"]),
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    // One named: a3 runs, a2 is not listed finished, a4 is not here.
    for id in ["a3", "a2", "a4"] {
        assert_eq!(
            client.garbage_collect(now, Some(id)),
            Err(drover_core::client::client::GcRefused),
            "{id}"
        );
    }
    assert_eq!(client.garbage_collect(now, None), Ok(vec!["a1".to_string()]));
    settle(&mut client, &mut world, now, &mut hooks);
    assert!(client.alloc("a1").is_none(), "collected and forgotten");
    assert!(client.alloc("a2").is_some() && client.alloc("a3").is_some());
    // Listed again, finished: it stays gone.
    client.handle(
        now,
        ClientInput::Allocs {
            allocs: listed(&["a1", "a2"], &["a1", "a2"]),
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, now, &mut hooks);
    assert!(client.alloc("a1").is_none());
    assert_eq!(client.garbage_collect(now, Some("a2")), Ok(vec!["a2".to_string()]));
    settle(&mut client, &mut world, now, &mut hooks);
    assert!(client.alloc("a2").is_none());
    assert!(client.alloc("a3").is_some(), "a running allocation is never collected");
}

/// `stop_after_client_disconnect`: a client out of touch with the servers for that long stops
/// the group's allocations (and only those), counting from the last heartbeat the servers took.
#[test]
fn a_client_out_of_touch_stops_what_says_stop_after_client_disconnect() {
    let mut client = new_client(9);
    let mut world = World {
        heartbeat_ttl_ms: 10_000,
        ..World::default()
    };
    let mut hooks = Vec::new();
    let t0 = Instant::ZERO + Duration::from_secs(1);
    exec_driver(&mut client, t0);
    let node = drover_core::structs::Node {
        id: "n1".into(),
        ..Default::default()
    };
    client.connect(t0, node, Default::default(), Vec::new());
    settle(&mut client, &mut world, t0, &mut hooks);
    let mut careful = app_job_without_volumes();
    careful.id = "careful".into();
    careful.task_groups[0].stop_after_client_disconnect = Some(Duration::from_secs(30));
    let plain = app_job_without_volumes();
    client.handle(
        t0,
        ClientInput::Allocs {
            allocs: vec![
                (alloc("c1", &careful), Arc::new(careful.clone())),
                (alloc("p1", &plain), Arc::new(plain.clone())),
            ],
            finished_elsewhere: Vec::new(),
        },
    );
    settle(&mut client, &mut world, t0, &mut hooks);
    assert_eq!(world.running.len(), 2, "both run");
    // The servers go away right after the registration: heartbeats fail from then on.
    world.servers_unreachable = true;
    let deadline = t0 + Duration::from_secs(30);
    let mut now = t0;
    while now < deadline {
        now = client.poll_timeout().expect("something is due").min(deadline);
        client.handle_timeout(now);
        settle(&mut client, &mut world, now, &mut hooks);
        if now < deadline {
            assert!(world.stops.is_empty(), "nothing stopped at {now:?}");
        }
    }
    assert_eq!(
        world.stops,
        [("c1".to_string(), "web".to_string())],
        "only the careful group's"
    );
    assert!(client.alloc("p1").is_some_and(|runner| !runner.is_stopping()));
}
