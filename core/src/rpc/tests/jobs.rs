//! Job writes, answered with their evaluation; and the composer failing every machine's
//! requests in arrival order when leadership is lost.

use super::*;
use crate::structs::{Job, JobType};
use alloc::boxed::Box;

fn web(count: u32) -> Job {
    let mut job = crate::testkit::job("web", JobType::Service)
        .with_count(count)
        .with_memory(64);
    job.datacenters = vec!["dc1".into()];
    job
}

#[test]
fn a_registered_job_is_answered_with_its_evaluation_once_applied() {
    let mut h = Harness::new();
    h.request(
        1,
        ServerRequest::JobRegister {
            job: Box::new(web(2)),
            enforce_index: None,
        },
    );
    let Some((
        1,
        ServerReply::JobRegistered {
            index,
            eval_id,
            job_modify_index,
        },
    )) = h.replies.last().cloned()
    else {
        panic!("{:?}", h.replies)
    };
    let job = h.fx.state.job("default", "web").expect("stored");
    assert_eq!(job.name, "web", "an empty name is the job's ID");
    assert_eq!(job_modify_index, job.job_modify_index);
    assert!(index >= job_modify_index);
    let eval =
        h.fx.state
            .evals()
            .find(|eval| eval.id == eval_id)
            .expect("the evaluation");
    assert_eq!(
        (eval.job_id.as_str(), eval.triggered_by.as_str()),
        ("web", "job-register")
    );
}

#[test]
fn a_connect_job_is_stored_with_its_injected_sidecar_and_a_bad_one_is_refused() {
    use crate::connect::{ConsulConnect, ConsulSidecarService};
    use crate::structs::{NetworkResource, Port, Service};
    let connect_job = |native_and_sidecar: bool| {
        let mut job = web(1);
        let group = &mut job.task_groups[0];
        group.networks = vec![NetworkResource {
            mode: "host".into(),
            dynamic_ports: vec![Port {
                label: "http".into(),
                ..Port::default()
            }],
            ..NetworkResource::default()
        }];
        group.services = vec![Service {
            name: "web-api".into(),
            port_label: "http".into(),
            address_mode: "auto".into(),
            connect: Some(ConsulConnect {
                native: native_and_sidecar,
                sidecar_service: Some(ConsulSidecarService::default()),
                sidecar_task: None,
            }),
            ..Service::default()
        }];
        job
    };
    let mut h = Harness::new();
    h.request(
        1,
        ServerRequest::JobRegister {
            job: Box::new(connect_job(false)),
            enforce_index: None,
        },
    );
    let stored = h.fx.state.job("default", "web").expect("stored");
    let names: Vec<&str> = stored.task_groups[0]
        .tasks
        .iter()
        .map(|task| task.name.as_str())
        .collect();
    assert_eq!(names, ["t", "connect-proxy-web-api"]);
    let index = h.fx.index;
    h.request(
        2,
        ServerRequest::JobRegister {
            job: Box::new(connect_job(true)),
            enforce_index: None,
        },
    );
    assert_eq!(h.fx.index, index, "nothing written");
    let ServerReply::Error(failure) = &h.replies[1].1 else {
        panic!("{:?}", h.replies)
    };
    assert!(
        failure
            .message
            .contains("Consul Connect must be exclusively native, make use of a sidecar, or represent a Gateway"),
        "{failure:?}"
    );
}

#[test]
fn an_invalid_job_is_refused_with_nomads_errors_and_nothing_is_proposed() {
    let mut h = Harness::new();
    let index = h.fx.index;
    let mut bad = web(1);
    bad.task_groups[0].tasks[0].driver.clear();
    h.request(
        1,
        ServerRequest::JobRegister {
            job: Box::new(bad),
            enforce_index: None,
        },
    );
    assert_eq!(h.fx.index, index, "nothing written");
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!("{:?}", h.replies)
    };
    assert!(!failure.retryable);
    assert!(failure.message.contains("Missing task driver"), "{failure:?}");
    assert!(h.fx.state.job("default", "web").is_none());
}

#[test]
fn stopping_a_job_nobody_registered_is_not_found() {
    let mut h = Harness::new();
    let stop = ServerRequest::JobStop {
        namespace: "default".into(),
        job_id: "nope".into(),
        purge: false,
    };
    h.request(1, stop);
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(failure.message, "job not found");
}

#[test]
fn leadership_lost_fails_every_machines_requests_in_the_order_they_came() {
    let mut h = Harness::new();
    // Proposals stay in flight: nothing is pumped until leadership is gone.
    let sends = [
        (
            1,
            ServerRequest::JobRegister {
                job: Box::new(web(1)),
                enforce_index: None,
            },
        ),
        (
            2,
            ServerRequest::NodeRegister {
                node: Box::new(node("n3", true)),
            },
        ),
        (3, take("a1", "n1")),
        (
            4,
            ServerRequest::AllocClientUpdate {
                alloc_id: "a2".into(),
                client_status: ClientStatus::Running,
            },
        ),
    ];
    for (req, request) in sends {
        h.machine.handle(
            h.now,
            Input::Request {
                req,
                request,
                authority: crate::rpc::authz::Authority::Open,
            },
            &h.fx.state,
        );
    }
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    let mut replies = Vec::new();
    while let Some(action) = h.machine.poll_action() {
        if let Action::Reply {
            req,
            reply: ServerReply::Error(failure),
        } = action
        {
            assert!(failure.retryable, "{failure:?}");
            replies.push(req);
        }
    }
    assert_eq!(replies, vec![1, 2, 3, 4]);
}

#[test]
fn a_node_updates_only_its_own_allocations() {
    use crate::structs::{AllocClientReport, ClientStatus};
    let mut h = Harness::new();
    let report = |alloc_id: &str| AllocClientReport {
        deployment_status: None,
        alloc_id: alloc_id.into(),
        client_status: ClientStatus::Failed,
        task_states: Default::default(),
    };
    // n1 reports its own a1, n2's a2, and one the servers never had.
    h.request(
        1,
        ServerRequest::AllocClientUpdates {
            node_id: "n1".into(),
            secret_id: String::new(),
            updates: vec![report("a1"), report("a2"), report("unknown")],
        },
    );
    assert!(
        matches!(h.replies.last(), Some((1, ServerReply::Done { .. }))),
        "{:?}",
        h.replies
    );
    assert_eq!(h.fx.state.alloc("a1").unwrap().client_status, ClientStatus::Failed);
    assert_eq!(
        h.fx.state.alloc("a2").unwrap().client_status,
        ClientStatus::Pending,
        "another node's allocation is not n1's to report"
    );
}

#[test]
fn a_client_speaks_only_for_its_own_node_by_its_secret() {
    use crate::structs::{AllocClientReport, ClientStatus};
    let mut h = Harness::new();
    let mut node = h.fx.state.node("n1").unwrap().clone();
    node.secret_id = "s1".into();
    h.fx.ok(Command::NodeRegister { node: node.clone() });
    let report = |secret: &str| ServerRequest::AllocClientUpdates {
        node_id: "n1".into(),
        secret_id: secret.into(),
        updates: vec![AllocClientReport {
            deployment_status: None,
            alloc_id: "a1".into(),
            client_status: ClientStatus::Failed,
            task_states: Default::default(),
        }],
    };
    h.request(1, report("stolen"));
    let Some((1, ServerReply::Error(error))) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(error.message, "node secret ID does not match");
    assert_eq!(
        h.fx.state.alloc("a1").unwrap().client_status,
        ClientStatus::Pending,
        "nothing applied"
    );
    // Nor may anyone re-register the node under another secret.
    let mut impostor = node.clone();
    impostor.secret_id = "other".into();
    h.request(
        2,
        ServerRequest::NodeRegister {
            node: Box::new(impostor),
        },
    );
    let Some((2, ServerReply::Error(error))) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(error.message, "node secret ID does not match. Not registering node.");
    assert_eq!(h.fx.state.node("n1").unwrap().secret_id, "s1");
    h.request(3, report("s1"));
    assert!(
        matches!(h.replies.last(), Some((3, ServerReply::Done { .. }))),
        "{:?}",
        h.replies
    );
    assert_eq!(h.fx.state.alloc("a1").unwrap().client_status, ClientStatus::Failed);
}

#[test]
fn stopping_an_allocation_marks_it_to_migrate_with_an_evaluation() {
    let mut h = Harness::new();
    h.request(
        1,
        ServerRequest::JobRegister {
            job: Box::new(web(1)),
            enforce_index: None,
        },
    );
    let mut alloc = h.fx.state.alloc("a1").unwrap().clone();
    alloc.job_id = "web".into();
    h.fx.ok(Command::AllocUpsert { allocs: vec![alloc] });
    h.request(2, ServerRequest::AllocStop { alloc_id: "a1".into() });
    let Some((2, ServerReply::JobRegistered { eval_id, .. })) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert!(h.fx.state.alloc("a1").unwrap().desired_transition.migrate);
    let eval =
        h.fx.state
            .evals()
            .find(|eval| eval.id == eval_id)
            .expect("its evaluation");
    assert_eq!(
        (eval.job_id.as_str(), eval.triggered_by.as_str()),
        ("web", "alloc-stop")
    );
    h.request(
        3,
        ServerRequest::AllocStop {
            alloc_id: "nope".into(),
        },
    );
    let Some((3, ServerReply::Error(error))) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(error.message, "Unknown allocation \"nope\"");
}
