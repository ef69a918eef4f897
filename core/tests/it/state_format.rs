//! Upgrades keep the data: snapshots written by earlier builds are read by every later one.
//!
//! `testdata/state/` holds a server state written once, by the build that introduced each
//! file, and never rewritten. `v<N>.cbor` is state format v<N>: every later build must read
//! every one of them; a change that cannot (a field added without `#[serde(default)]`, a field
//! or variant renamed) fails here instead of on an operator's servers. A new format version
//! adds a file: `WRITE_STATE_FIXTURE=v2.cbor cargo test -p drover-core --test state_format`.
//!
//! `postcard-unversioned.bin` is the form data dirs had before the format was versioned.
//! Postcard is positional, so it can be read only while the shapes are those of that time:
//! the build that first changes a stored shape must delete that file and the note in the
//! README's upgrade section must then name the last build that upgrades such data dirs (one
//! start of it rewrites them as v1).

use std::collections::BTreeMap;
use std::time::Duration;

use drover_core::fsm::{Command, Entry, Response, ServerState};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiCapability, CsiInfo, CsiNodeInfo,
    CsiVolume, CsiVolumeClaim, DesiredStatus, DriverInfo, Evaluation, Job, JobType, Node, NodeStatus, Service,
    ServiceCheck, Task, TaskGroup, VolumeMount, VolumeRequest, VolumeType,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/state");

/// A state touching every table: cluster, variable, node, plugin, job (with services and a CSI volume
/// request), allocation, evaluation, volume with a write claim.
fn representative_state() -> ServerState {
    let mut state = ServerState::default();
    let mut index = 0;
    let mut apply = |command: Command| {
        index += 1;
        let response = state.apply(
            index,
            &Entry {
                at_unix_ms: 1_700_000_000_000 + index,
                command,
            },
        );
        assert!(!matches!(response, Response::Error(..)), "entry {index}: {response:?}");
    };
    apply(Command::LeadershipEstablished {
        leader_id: 1,
        term: 1,
        cluster_id: "c0ffee00-0000-4000-8000-000000000001".into(),
    });
    apply(Command::VariableUpsert {
        path: "app/config".into(),
        items: BTreeMap::from([("k".into(), "v".into())]).into(),
        cas: None,
        lock_id: None,
    });
    apply(Command::NodeRegister {
        node: Node {
            id: "node-1".into(),
            name: "client-1".into(),
            datacenter: "dc1".into(),
            status: NodeStatus::Ready,
            drivers: BTreeMap::from([(
                "exec".into(),
                DriverInfo {
                    detected: true,
                    healthy: true,
                    ..Default::default()
                },
            )]),
            ..Default::default()
        },
    });
    apply(Command::NodeUpdateCsiInfo {
        node_id: "node-1".into(),
        controllers: BTreeMap::new(),
        nodes: BTreeMap::from([(
            "fake".into(),
            CsiInfo {
                plugin_id: "fake".into(),
                alloc_id: "plugin-alloc".into(),
                healthy: true,
                provider: "fake.drover.dev".into(),
                node_info: Some(CsiNodeInfo {
                    id: "node-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )]),
    });
    apply(Command::CsiVolumeRegister {
        volumes: vec![CsiVolume {
            id: "data".into(),
            namespace: "default".into(),
            name: "data".into(),
            external_id: "vol-data".into(),
            plugin_id: "fake".into(),
            requested_capabilities: vec![CsiCapability {
                access_mode: AccessMode::SingleNodeWriter,
                attachment_mode: AttachmentMode::FileSystem,
            }],
            ..Default::default()
        }],
    });
    let job = Job {
        id: "web".into(),
        namespace: "default".into(),
        name: "web".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count: 1,
            volumes: BTreeMap::from([(
                "data".into(),
                VolumeRequest {
                    name: "data".into(),
                    volume_type: VolumeType::Csi,
                    source: "data".into(),
                    access_mode: AccessMode::SingleNodeWriter,
                    attachment_mode: AttachmentMode::FileSystem,
                    ..Default::default()
                },
            )]),
            tasks: vec![Task {
                name: "t".into(),
                driver: "exec".into(),
                kill_timeout: Duration::from_secs(5),
                volume_mounts: vec![VolumeMount {
                    volume: "data".into(),
                    destination: "/srv".into(),
                    ..Default::default()
                }],
                services: vec![Service {
                    name: "web".into(),
                    tags: vec!["a".into()],
                    checks: vec![ServiceCheck {
                        name: "alive".into(),
                        check_type: "tcp".into(),
                        interval: Duration::from_secs(10),
                        timeout: Duration::from_secs(2),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let eval = Evaluation {
        id: "eval-1".into(),
        namespace: "default".into(),
        priority: 50,
        job_id: "web".into(),
        triggered_by: drover_core::structs::EvalTrigger::JobRegister,
        ..Default::default()
    };
    apply(Command::JobRegister {
        job,
        eval: Some(eval),
        enforce_index: None,
    });
    apply(Command::AllocUpsert {
        allocs: vec![Allocation {
            id: "alloc-1".into(),
            namespace: "default".into(),
            eval_id: "eval-1".into(),
            name: "web.g[0]".into(),
            node_id: "node-1".into(),
            job_id: "web".into(),
            task_group: "g".into(),
            desired_status: DesiredStatus::Run,
            client_status: ClientStatus::Running,
            ..Default::default()
        }],
    });
    apply(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "data".into(),
        claim: CsiVolumeClaim {
            allocation_id: "alloc-1".into(),
            node_id: "node-1".into(),
            external_node_id: "node-1".into(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            state: ClaimState::Taken,
        },
    });
    state
}

/// What an operator would lose if a fixture decoded to something else.
fn assert_holds_the_representative_facts(state: &ServerState, fixture: &str) {
    let cluster = state
        .cluster()
        .unwrap_or_else(|| panic!("{fixture}: cluster identity lost"));
    assert_eq!(cluster.cluster_id, "c0ffee00-0000-4000-8000-000000000001", "{fixture}");
    assert_eq!(
        state.variable("app/config").map(|v| v.items["k"].as_str()),
        Some("v"),
        "{fixture}"
    );
    let node = state.node("node-1").unwrap_or_else(|| panic!("{fixture}: node lost"));
    assert!(node.drivers["exec"].healthy, "{fixture}");
    let job = state
        .job("default", "web")
        .unwrap_or_else(|| panic!("{fixture}: job lost"));
    let task = &job.task_groups[0].tasks[0];
    assert_eq!(task.kill_timeout, Duration::from_secs(5), "{fixture}");
    assert_eq!(
        task.services[0].checks[0].interval,
        Duration::from_secs(10),
        "{fixture}"
    );
    assert_eq!(job.task_groups[0].volumes["data"].source, "data", "{fixture}");
    assert_eq!(
        state.eval("eval-1").map(|e| e.job_id.as_str()),
        Some("web"),
        "{fixture}"
    );
    assert_eq!(
        state.alloc("alloc-1").map(|a| a.client_status),
        Some(ClientStatus::Running),
        "{fixture}"
    );
    let volume = state
        .volume_raw("default", "data")
        .unwrap_or_else(|| panic!("{fixture}: volume lost"));
    assert_eq!(volume.write_claims["alloc-1"].state, ClaimState::Taken, "{fixture}");
    assert_eq!(
        state.volumes_of_plugin("fake").count(),
        1,
        "{fixture}: plugin index lost"
    );
    assert!(state.plugin("fake").is_some(), "{fixture}: plugin lost");
    assert_eq!(state.last_applied(), Some(8), "{fixture}");
}

fn fixture_names() -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(FIXTURES)
        .expect("fixture dir")
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn read_fixture(name: &str) {
    let bytes = std::fs::read(format!("{FIXTURES}/{name}")).unwrap();
    let state = ServerState::restore(&bytes).unwrap_or_else(|error| panic!("{name}: {error}"));
    assert_holds_the_representative_facts(&state, name);
}

#[test]
fn snapshots_of_every_state_format_version_are_still_read() {
    if let Ok(name) = std::env::var("WRITE_STATE_FIXTURE") {
        let state = representative_state();
        let bytes = if name.starts_with("postcard") {
            postcard::to_allocvec(&state).unwrap()
        } else {
            state.snapshot()
        };
        std::fs::write(format!("{FIXTURES}/{name}"), bytes).unwrap();
    }
    let versioned: Vec<String> = fixture_names().into_iter().filter(|n| n.ends_with(".cbor")).collect();
    assert!(
        versioned.contains(&"v1.cbor".to_string()),
        "v1.cbor missing: {versioned:?}"
    );
    for name in &versioned {
        read_fixture(name);
    }
}

#[test]
fn snapshots_from_before_the_format_was_versioned_are_read_while_the_shapes_last() {
    // See the module comment: when a stored shape changes, this file is deleted on purpose.
    if fixture_names().iter().any(|n| n == "postcard-unversioned.bin") {
        read_fixture("postcard-unversioned.bin");
    }
}

#[test]
fn the_current_build_round_trips_its_own_snapshot() {
    let state = representative_state();
    assert_holds_the_representative_facts(&state, "built");
    assert_eq!(ServerState::restore(&state.snapshot()).unwrap(), state);
}
