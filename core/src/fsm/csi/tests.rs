use super::*;
use crate::fsm::Entry;
use crate::structs::MAX_RETAINED_NODE_EVENTS;
use crate::structs::{
    AttachmentMode, ClaimMode, ClientStatus, CsiCapability, CsiControllerInfo, CsiNodeInfo, CsiPluginType,
    DesiredStatus, DriverInfo, NodeEvent, NodeStatus, Task, TaskCsiPluginConfig, TaskGroup,
};

/// A tiny builder: applies commands at increasing indexes.
pub(crate) struct Fixture {
    pub state: ServerState,
    pub index: u64,
}

impl Fixture {
    pub fn new() -> Self {
        Fixture {
            state: ServerState::default(),
            index: 0,
        }
    }

    pub fn apply(&mut self, command: Command) -> Response {
        self.index += 1;
        self.state.apply(
            self.index,
            &Entry {
                at_unix_ms: 1_000 * self.index,
                command,
            },
        )
    }

    pub fn ok(&mut self, command: Command) {
        let response = self.apply(command);
        assert!(!matches!(response, Response::Error(..)), "{response:?}");
    }
}

pub(crate) fn info(plugin: &str, alloc: &str, healthy: bool, controller: bool) -> CsiInfo {
    CsiInfo {
        plugin_id: plugin.into(),
        alloc_id: alloc.into(),
        healthy,
        health_description: if healthy { "healthy".into() } else { "unhealthy".into() },
        provider: "example.com/hostpath".into(),
        provider_version: "1.0".into(),
        requires_controller_plugin: true,
        controller_info: controller.then(|| CsiControllerInfo {
            supports_attach_detach: true,
            supports_create_delete: true,
            supports_create_delete_snapshot: true,
            supports_list_snapshots: true,
            supports_list_volumes: true,
            supports_expand: true,
            ..CsiControllerInfo::default()
        }),
        node_info: (!controller).then(|| CsiNodeInfo {
            id: format!("ext-{alloc}"),
            max_volumes: 100,
            ..CsiNodeInfo::default()
        }),
        ..CsiInfo::default()
    }
}

/// A ready node running a monolith plugin `p` (controller + node halves).
pub(crate) fn node(id: &str, healthy: bool) -> Node {
    Node {
        id: id.into(),
        name: id.into(),
        rpc_addr: format!("10.0.1.{}:4647", id.len()),
        status: NodeStatus::Ready,
        csi_controller_plugins: [("p".to_string(), info("p", &format!("plug-{id}"), healthy, true))].into(),
        csi_node_plugins: [("p".to_string(), info("p", &format!("plug-{id}"), healthy, false))].into(),
        ..Node::default()
    }
}

pub(crate) fn volume(id: &str) -> CsiVolume {
    CsiVolume {
        id: id.into(),
        namespace: "default".into(),
        name: id.into(),
        plugin_id: "p".into(),
        requested_capabilities: vec![CsiCapability {
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
        }],
        secrets: [("token".to_string(), "s3cr3t".to_string())].into(),
        ..CsiVolume::default()
    }
}

pub(crate) fn alloc(id: &str, node: &str) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: "default".into(),
        node_id: node.into(),
        job_id: "app".into(),
        task_group: "web".into(),
        ..Allocation::default()
    }
}

pub(crate) fn claim(alloc: &str, node: &str, mode: ClaimMode, state: ClaimState) -> CsiVolumeClaim {
    CsiVolumeClaim {
        allocation_id: alloc.into(),
        node_id: node.into(),
        external_node_id: String::new(),
        mode,
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        state,
    }
}

fn error(response: Response) -> String {
    match response {
        Response::Error(_, error) => error,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn driver_updates_keep_csi_info_and_events_are_capped() {
    let mut fx = Fixture::new();
    let mut registered = node("n1", true);
    registered.attributes = [
        ("driver.exec".to_string(), "1".to_string()),
        ("driver.exec.version".to_string(), "0.1".to_string()),
        ("kernel.name".to_string(), "linux".to_string()),
    ]
    .into();
    fx.ok(Command::NodeRegister { node: registered });
    let unhealthy = DriverInfo {
        detected: false,
        healthy: false,
        health_description: "exec driver must run as root".into(),
        attributes: BTreeMap::new(),
        update_time_ms: 0,
    };
    fx.ok(Command::NodeUpdateDrivers {
        node_id: "n1".into(),
        drivers: [("exec".to_string(), unhealthy.clone())].into(),
    });
    let node = fx.state.node("n1").unwrap();
    assert!(node.drivers["exec"].same_fingerprint(&unhealthy));
    assert_eq!(
        node.drivers["exec"].update_time_ms, 2_000,
        "stamped with the entry's time"
    );
    // The driver's attributes go with it; the others and the CSI info stay.
    assert_eq!(
        node.attributes.keys().collect::<Vec<_>>(),
        ["kernel.name"],
        "{:?}",
        node.attributes
    );
    assert!(node.csi_node_plugins.contains_key("p"));
    assert_eq!(fx.state.plugin("p").unwrap().nodes_healthy, 1);

    for i in 0..12 {
        fx.ok(Command::NodeEmitEvents {
            node_id: "n1".into(),
            events: vec![NodeEvent {
                message: format!("event {i}"),
                subsystem: "Driver".into(),
                ..NodeEvent::default()
            }],
        });
    }
    let events = &fx.state.node("n1").unwrap().events;
    assert_eq!(events.len(), MAX_RETAINED_NODE_EVENTS);
    assert_eq!(events[0].message, "event 2");
    assert_eq!(events[9].message, "event 11");
    assert!(
        events[9].timestamp_ms > events[0].timestamp_ms,
        "stamped by the proposer's clock"
    );
    assert_eq!(
        error(fx.apply(Command::NodeEmitEvents {
            node_id: "n9".into(),
            events: vec![],
        })),
        "node not found: n9"
    );
}

#[test]
fn plugins_derive_from_node_fingerprints() {
    let mut fx = Fixture::new();
    // An unhealthy fingerprint does not create a plugin.
    fx.ok(Command::NodeRegister {
        node: node("n1", false),
    });
    assert!(fx.state.plugin("p").is_none());
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    fx.ok(Command::NodeRegister { node: node("n2", true) });
    let plugin = fx.state.plugin("p").unwrap();
    assert_eq!((plugin.controllers_healthy, plugin.nodes_healthy), (2, 2));
    assert!(plugin.controller_required && plugin.supports_attach_detach());
    // Going unhealthy keeps the entry, drops the count.
    fx.ok(Command::NodeRegister {
        node: node("n2", false),
    });
    let plugin = fx.state.plugin("p").unwrap();
    assert_eq!(
        (plugin.controllers_healthy, plugin.nodes_healthy, plugin.nodes.len()),
        (1, 1, 2)
    );
    // A node that stops reporting the plugin is removed from it.
    fx.ok(Command::NodeUpdateCsiInfo {
        node_id: "n2".into(),
        controllers: BTreeMap::new(),
        nodes: BTreeMap::new(),
    });
    assert_eq!(fx.state.plugin("p").unwrap().nodes.len(), 1);
    // Deleting the last node deletes the now empty plugin.
    fx.ok(Command::NodeDeregister { node_id: "n1".into() });
    assert!(fx.state.plugin("p").is_none());
    assert!(fx.state.table_index(Table::CsiPlugins) > 0);
}

#[test]
fn expected_counts_come_from_jobs_and_system_allocs() {
    let mut fx = Fixture::new();
    let plugin_task = |kind| Task {
        name: "plugin".into(),
        driver: "raw_exec".into(),
        csi_plugin: Some(TaskCsiPluginConfig::new("p", kind)),
        ..Task::default()
    };
    fx.ok(Command::JobUpsert {
        job: Job {
            id: "controller".into(),
            namespace: "default".into(),
            job_type: JobType::Service,
            task_groups: vec![TaskGroup {
                name: "c".into(),
                count: 2,
                tasks: vec![plugin_task(CsiPluginType::Controller)],
                ..TaskGroup::default()
            }],
            ..Job::default()
        },
    });
    fx.ok(Command::JobUpsert {
        job: Job {
            id: "nodes".into(),
            namespace: "default".into(),
            job_type: JobType::System,
            task_groups: vec![TaskGroup {
                name: "n".into(),
                count: 1,
                tasks: vec![plugin_task(CsiPluginType::Node)],
                ..TaskGroup::default()
            }],
            ..Job::default()
        },
    });
    let plugin = fx.state.plugin("p").expect("created from the job");
    assert_eq!((plugin.controllers_expected(), plugin.nodes_expected()), (2, 0));
    let system_alloc = |id: &str, node: &str| Allocation {
        job_id: "nodes".into(),
        task_group: "n".into(),
        ..alloc(id, node)
    };
    fx.ok(Command::AllocUpsert {
        allocs: vec![system_alloc("s1", "n1"), system_alloc("s2", "n2")],
    });
    assert_eq!(fx.state.plugin("p").unwrap().nodes_expected(), 2);
    fx.ok(Command::AllocClientUpdate {
        alloc_id: "s2".into(),
        client_status: ClientStatus::Failed,
    });
    assert_eq!(fx.state.plugin("p").unwrap().nodes_expected(), 1);
    fx.ok(Command::JobDeregister {
        namespace: "default".into(),
        job_id: "controller".into(),
    });
    fx.ok(Command::JobDeregister {
        namespace: "default".into(),
        job_id: "nodes".into(),
    });
    assert!(fx.state.plugin("p").is_none(), "no instances and nothing expected");
}

#[test]
fn a_stopped_plugin_alloc_no_longer_provides_the_plugin() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    let mut plugin_alloc = alloc("plug-n1", "n1");
    fx.ok(Command::AllocUpsert {
        allocs: vec![plugin_alloc.clone()],
    });
    plugin_alloc.desired_status = DesiredStatus::Stop;
    fx.ok(Command::AllocUpsert {
        allocs: vec![plugin_alloc],
    });
    assert!(fx.state.plugin("p").is_none());
}

#[test]
fn register_validates_and_needs_the_plugin() {
    let mut fx = Fixture::new();
    assert_eq!(
        error(fx.apply(Command::CsiVolumeRegister {
            volumes: vec![volume("v")]
        })),
        "no CSI plugin named: p could be found"
    );
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    let mut bad = volume("");
    bad.requested_capabilities.clear();
    assert_eq!(
        error(fx.apply(Command::CsiVolumeRegister {
            volumes: vec![volume("good"), bad]
        })),
        "validation: missing volume ID; must include at least one capability block"
    );
    assert!(
        fx.state.volume("default", "good").is_none(),
        "nothing stored when one volume is bad"
    );
    fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("v")],
    });
    let stored = fx.state.volume("default", "v").unwrap();
    assert!(stored.plugin_health.schedulable);
    let mut renamed = volume("v");
    renamed.external_id = "other".into();
    assert_eq!(
        error(fx.apply(Command::CsiVolumeRegister { volumes: vec![renamed] })),
        "volume external ID cannot be updated"
    );
    let mut updated = volume("v");
    updated.secrets = [("token".to_string(), "rotated".to_string())].into();
    fx.ok(Command::CsiVolumeRegister { volumes: vec![updated] });
    assert_eq!(
        fx.state.volumes_of_plugin("p").collect::<Vec<_>>(),
        [&("default".to_string(), "v".to_string())]
    );
    let stored = fx.state.volume("default", "v").unwrap();
    assert_eq!(stored.secrets["token"], "rotated");
    // Index 4: refused commands consume a log index too.
    assert_eq!((stored.create_index, stored.modify_index), (4, 6));
}

#[test]
fn claims_release_and_deregister() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("v")],
    });
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a1", "n1"), alloc("a2", "n1")],
    });
    let take = |alloc: &str| Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim(alloc, "n1", ClaimMode::Write, ClaimState::Taken),
    };
    assert!(matches!(fx.apply(take("a1")), Response::Volume(_)));
    assert_eq!(error(fx.apply(take("a2"))), "volume max claims reached");
    assert_eq!(error(fx.apply(take("gone"))), "Unknown allocation: gone");
    assert_eq!(
        error(fx.apply(Command::CsiVolumeDeregister {
            namespace: "default".into(),
            volume_ids: vec!["v".into()],
            force: false
        })),
        "volume in use: v"
    );
    // The alloc finishes: read back as a past claim in state Unpublishing, still holding
    // its write claim until freed.
    fx.ok(Command::AllocClientUpdate {
        alloc_id: "a1".into(),
        client_status: ClientStatus::Complete,
    });
    let vol = fx.state.volume("default", "v").unwrap();
    assert_eq!(vol.past_claims["a1"].state, ClaimState::Unpublishing);
    assert!(vol.write_claims.contains_key("a1"));
    assert!(
        fx.state.volume_raw("default", "v").unwrap().past_claims.is_empty(),
        "derived, not stored"
    );
    assert_eq!(error(fx.apply(take("a2"))), "volume max claims reached");
    // force needs every recorded alloc terminal on both sides.
    assert_eq!(
        error(fx.apply(Command::CsiVolumeDeregister {
            namespace: "default".into(),
            volume_ids: vec!["v".into()],
            force: true
        })),
        "volume in use: v"
    );
    for state in [ClaimState::NodeDetached, ClaimState::ReadyToFree] {
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, state),
        });
    }
    let vol = fx.state.volume("default", "v").unwrap();
    assert!(vol.write_claims.is_empty() && vol.past_claims.is_empty());
    assert!(matches!(fx.apply(take("a2")), Response::Volume(_)));
    let mut a2 = alloc("a2", "n1");
    a2.desired_status = DesiredStatus::Stop;
    a2.client_status = ClientStatus::Complete;
    fx.ok(Command::AllocUpsert { allocs: vec![a2] });
    fx.ok(Command::CsiVolumeDeregister {
        namespace: "default".into(),
        volume_ids: vec!["v".into()],
        force: true,
    });
    assert!(fx.state.volume("default", "v").is_none());
    assert_eq!(
        fx.state.volumes_of_plugin("p").count(),
        0,
        "the plugin index follows deregistration"
    );
    assert_eq!(
        error(fx.apply(Command::CsiVolumeDeregister {
            namespace: "default".into(),
            volume_ids: vec!["v".into()],
            force: false
        })),
        "volume not found"
    );
}

#[test]
fn gc_d_allocs_read_as_past_claims() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("v")],
    });
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a1", "n1")],
    });
    fx.ok(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Taken),
    });
    fx.ok(Command::AllocDelete {
        alloc_ids: vec!["a1".into()],
    });
    assert_eq!(
        fx.state.volume("default", "v").unwrap().past_claims["a1"].state,
        ClaimState::Unpublishing
    );
}

#[test]
fn plugin_delete_refuses_a_plugin_in_use() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    assert_eq!(
        error(fx.apply(Command::CsiPluginDelete { plugin_id: "p".into() })),
        "plugin in use"
    );
    assert_eq!(
        error(fx.apply(Command::CsiPluginDelete { plugin_id: "x".into() })),
        "plugin not found: x"
    );
}

#[test]
fn snapshot_of_every_table_restores_equal() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("v")],
    });
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a1", "n1")],
    });
    fx.ok(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Taken),
    });
    fx.ok(Command::EvalUpsert {
        evals: vec![crate::structs::Evaluation {
            id: "e1".into(),
            ..Default::default()
        }],
    });
    let restored = ServerState::restore(&fx.state.snapshot()).unwrap();
    assert_eq!(restored, fx.state);
}

#[test]
fn node_allocs_name_awaited_allocations_that_finished_on_other_nodes() {
    let mut fx = Fixture::new();
    fx.ok(Command::JobUpsert {
        job: crate::structs::Job {
            id: "j".into(),
            namespace: "default".into(),
            ..Default::default()
        },
    });
    let mut running_elsewhere = alloc("old-running", "n2");
    running_elsewhere.client_status = ClientStatus::Running;
    running_elsewhere.desired_status = crate::structs::DesiredStatus::Stop;
    let mut lost = alloc("old-lost", "n3");
    lost.client_status = ClientStatus::Lost;
    let mut local = alloc("old-local", "n1");
    local.client_status = ClientStatus::Complete;
    let next = |id: &str, previous: &str| {
        let mut placed = alloc(id, "n1");
        placed.job_id = "j".into();
        placed.previous_allocation = Some(previous.into());
        placed
    };
    let mut preempting = next("d", "old-gone");
    preempting.preempted_allocations = vec!["old-running".into()];
    fx.ok(Command::AllocUpsert {
        allocs: vec![
            running_elsewhere,
            lost,
            local,
            next("a", "old-running"),
            next("b", "old-lost"),
            next("c", "old-local"),
            preempting,
        ],
    });
    let (allocs, jobs, finished) = fx.state.node_allocs("n1");
    let ids: Vec<&str> = allocs.iter().map(|placed| placed.id.as_str()).collect();
    assert_eq!(
        ids,
        ["a", "b", "c", "d"],
        "allocations whose job is gone are not listed"
    );
    // Stopping but still running elsewhere: waited for. Local ones: the client knows.
    assert_eq!(finished, ["old-gone", "old-lost"]);
    // Each listed allocation's job is in the answer, once.
    let listed: alloc::collections::BTreeSet<(&str, &str)> = jobs
        .iter()
        .map(|job| (job.namespace.as_str(), job.id.as_str()))
        .collect();
    assert_eq!(listed.len(), jobs.len(), "no job twice");
    assert_eq!(jobs.len(), 1, "four allocations of one job carry it once");
    for placed in &allocs {
        assert!(listed.contains(&(placed.namespace.as_str(), placed.job_id.as_str())));
    }
}

/// A client's batch (`Node.UpdateAlloc`) stores each allocation's status and task states,
/// skips allocations that are gone, and a later plan of the same allocation keeps the states.
#[test]
fn a_client_batch_stores_task_states_that_plans_keep() {
    use crate::structs::{AllocClientReport, TaskState, TaskStatus};
    let mut fx = Fixture::new();
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a1", "n1")],
    });
    let states = BTreeMap::from([(
        "web".to_string(),
        TaskState {
            state: TaskStatus::Running,
            started_at: 7,
            ..TaskState::default()
        },
    )]);
    fx.ok(Command::AllocClientUpdates {
        updates: vec![
            AllocClientReport {
                alloc_id: "a1".into(),
                client_status: ClientStatus::Running,
                task_states: states.clone(),
                ..Default::default()
            },
            AllocClientReport {
                alloc_id: "gone".into(),
                client_status: ClientStatus::Complete,
                task_states: BTreeMap::new(),
                ..Default::default()
            },
        ],
    });
    let stored = fx.state.alloc("a1").unwrap();
    assert_eq!(stored.client_status, ClientStatus::Running);
    assert_eq!(stored.task_states, states);
    assert_eq!(
        stored.client_description, "Tasks are running",
        "Nomad's words for the status"
    );
    assert!(fx.state.alloc("gone").is_none());
    fx.ok(Command::PlanApply {
        allocs: vec![alloc("a1", "n1")],
        evals: Vec::new(),
        deployment: None,
        deployment_updates: Vec::new(),
    });
    assert_eq!(fx.state.alloc("a1").unwrap().task_states, states, "only clients say");
}

#[test]
fn a_plugin_fingerprint_carries_the_time_it_last_changed() {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister { node: node("n1", true) });
    let report = |fx: &mut Fixture, healthy: bool| {
        fx.ok(Command::NodeUpdateCsiInfo {
            node_id: "n1".into(),
            controllers: BTreeMap::new(),
            nodes: BTreeMap::from([("p".to_string(), info("p", "a1", healthy, false))]),
        });
        fx.state.plugin("p").unwrap().nodes["n1"].update_time_ms
    };
    let first = report(&mut fx, true);
    assert_eq!(first, 1_000 * fx.index, "the entry's time, never 1970");
    assert_eq!(report(&mut fx, true), first, "an unchanged fingerprint keeps its time");
    assert_eq!(report(&mut fx, false), 1_000 * fx.index, "a change is stamped anew");
}

/// The node index of volumes names exactly the volumes whose stored claims (current or past)
/// name the node, through claims, releases and deregistration, and after a restore.
#[test]
fn volumes_on_a_node_follow_their_claims() {
    fn scanned(state: &ServerState, node: &str) -> BTreeSet<(String, String)> {
        state
            .volume_keys()
            .filter(|(namespace, id)| {
                let volume = state.volume_raw(namespace, id).unwrap();
                volume
                    .read_claims
                    .values()
                    .chain(volume.write_claims.values())
                    .chain(volume.past_claims.values())
                    .any(|claim| claim.node_id == node)
            })
            .cloned()
            .collect()
    }
    let check = |fx: &Fixture, expected: &[(&str, &[&str])]| {
        for (node, volumes) in expected {
            let want: BTreeSet<(String, String)> = volumes
                .iter()
                .map(|id| ("default".to_string(), id.to_string()))
                .collect();
            assert_eq!(fx.state.volumes_on_node(node), want, "volumes on {node}");
            assert_eq!(scanned(&fx.state, node), want, "scan of {node}");
        }
    };
    let mut fx = Fixture::new();
    for id in ["n1", "n2"] {
        fx.ok(Command::NodeRegister { node: node(id, true) });
    }
    let mut shared = volume("shared");
    shared.requested_capabilities[0].access_mode = AccessMode::MultiNodeMultiWriter;
    fx.ok(Command::CsiVolumeRegister {
        volumes: vec![volume("v1"), shared],
    });
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a1", "n1"), alloc("a2", "n2"), alloc("a3", "n1")],
    });
    let claim_on = |fx: &mut Fixture, volume: &str, alloc: &str, node: &str, state: ClaimState| {
        let mut claim = claim(alloc, node, ClaimMode::Write, state);
        if volume == "shared" {
            claim.access_mode = AccessMode::MultiNodeMultiWriter;
        }
        fx.ok(Command::CsiVolumeClaim {
            namespace: "default".into(),
            volume_id: volume.into(),
            claim,
        });
    };
    check(&fx, &[("n1", &[]), ("n2", &[])]);
    claim_on(&mut fx, "v1", "a1", "n1", ClaimState::Taken);
    claim_on(&mut fx, "shared", "a2", "n2", ClaimState::Taken);
    claim_on(&mut fx, "shared", "a3", "n1", ClaimState::Taken);
    check(&fx, &[("n1", &["shared", "v1"]), ("n2", &["shared"])]);
    assert_eq!(ServerState::restore(&fx.state.snapshot()).unwrap(), fx.state);
    // a2's claim is released step by step: n2 leaves the shared volume's nodes at the end.
    for state in [ClaimState::NodeDetached, ClaimState::ReadyToFree] {
        claim_on(&mut fx, "shared", "a2", "n2", state);
    }
    check(&fx, &[("n1", &["shared", "v1"]), ("n2", &[])]);
    for state in [ClaimState::NodeDetached, ClaimState::ReadyToFree] {
        claim_on(&mut fx, "v1", "a1", "n1", state);
    }
    fx.ok(Command::CsiVolumeDeregister {
        namespace: "default".into(),
        volume_ids: vec!["v1".into()],
        force: false,
    });
    check(&fx, &[("n1", &["shared"]), ("n2", &[])]);
    assert_eq!(ServerState::restore(&fx.state.snapshot()).unwrap(), fx.state);
}

/// The digest a client's alloc sync waits on moves with every write to the node's view and
/// with nothing else.
#[test]
fn the_node_view_digest_moves_only_with_the_nodes_view() {
    let mut fx = Fixture::new();
    let job = |version: u64| crate::structs::Job {
        id: "app".into(),
        namespace: "default".into(),
        version,
        ..Default::default()
    };
    fx.ok(Command::JobUpsert { job: job(0) });
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("a", "n1"), alloc("b", "n2")],
    });
    let view = |fx: &Fixture| fx.state.node_allocs_view("n1");
    let first = view(&fx);
    // Another node's allocation changes: n1's view does not.
    fx.ok(Command::AllocClientUpdate {
        alloc_id: "b".into(),
        client_status: ClientStatus::Running,
    });
    assert_eq!(view(&fx), first);
    // Its own allocation's status, its job, a new allocation, a deletion: each moves it.
    fx.ok(Command::AllocClientUpdate {
        alloc_id: "a".into(),
        client_status: ClientStatus::Running,
    });
    let second = view(&fx);
    assert_ne!(second, first);
    fx.ok(Command::JobUpsert { job: job(1) });
    let third = view(&fx);
    assert_ne!(third, second);
    fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("c", "n1")],
    });
    let fourth = view(&fx);
    assert_ne!(fourth, third);
    fx.ok(Command::AllocDelete {
        alloc_ids: vec!["c".into()],
    });
    assert_ne!(view(&fx), fourth);
}

/// Issue 54 §8: an allocation costs no copy of its job. `Node.GetClientAllocs` lists each job
/// once beside the node's allocations, and the client pairs every allocation with one shared
/// job (it cloned the whole job per allocation: 430 KB each for a 100-group job).
#[test]
fn node_allocs_carry_each_job_once_and_the_client_shares_it() {
    let mut fx = Fixture::new();
    fx.ok(Command::JobUpsert {
        job: crate::structs::Job {
            id: "j".into(),
            namespace: "default".into(),
            ..Default::default()
        },
    });
    let placed = |id: &str| {
        let mut alloc = alloc(id, "n1");
        alloc.job_id = "j".into();
        alloc
    };
    fx.ok(Command::AllocUpsert {
        allocs: vec![placed("a"), placed("b"), placed("c")],
    });
    let (allocs, jobs, _) = fx.state.node_allocs("n1");
    assert_eq!(allocs.len(), 3);
    assert_eq!(jobs.len(), 1, "one job for its three allocations");
    let paired = crate::rpc::NodeAllocsReply::paired(allocs, jobs);
    assert_eq!(paired.len(), 3);
    assert!(
        paired
            .windows(2)
            .all(|pair| alloc::sync::Arc::ptr_eq(&pair[0].1, &pair[1].1)),
        "every allocation holds the one job"
    );
}
