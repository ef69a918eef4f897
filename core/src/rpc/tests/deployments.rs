//! Deployments through the leader's machines: the scheduler worker takes each step of a
//! rollout as the deployment watcher evaluates the health clients report, fails it on an
//! unhealthy allocation or a missed progress deadline, rolls back with `auto_revert`, and
//! promotes canaries with `auto_promote`.

use super::*;
use crate::structs::{
    AllocClientReport, AllocDeploymentStatus, Deployment, DeploymentStatus, DriverInfo, Job, JobType, Node,
    NodeResources, Task, TaskGroup, TaskResources, UpdateStrategy,
};
use alloc::boxed::Box;

fn worker_node(id: &str) -> Node {
    Node {
        id: id.into(),
        name: id.into(),
        secret_id: format!("secret-{id}"),
        datacenter: "dc1".into(),
        status: NodeStatus::Ready,
        drivers: [(
            "exec".to_string(),
            DriverInfo {
                detected: true,
                healthy: true,
                ..DriverInfo::default()
            },
        )]
        .into(),
        resources: NodeResources {
            cpu: 8000,
            memory_mb: 8192,
            ..NodeResources::default()
        },
        ..Node::default()
    }
}

fn web(count: u32, version: &str, update: UpdateStrategy) -> Job {
    Job {
        id: "web".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "g".into(),
            count,
            tasks: vec![Task {
                name: "t".into(),
                driver: "exec".into(),
                env: [("V".to_string(), version.to_string())].into(),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            update: Some(Box::new(update)),
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn strategy() -> UpdateStrategy {
    UpdateStrategy {
        min_healthy_time: Duration::from_secs(1),
        healthy_deadline: Duration::from_secs(20),
        progress_deadline: Duration::from_secs(30),
        ..UpdateStrategy::default()
    }
}

struct Rollout {
    h: Harness,
    next_req: ReqId,
}

impl Rollout {
    fn new() -> Rollout {
        let mut h = Harness::new();
        h.fx.ok(Command::NodeRegister {
            node: worker_node("w1"),
        });
        Rollout { h, next_req: 100 }
    }

    fn register(&mut self, job: Job) {
        self.next_req += 1;
        self.h.request(
            self.next_req,
            ServerRequest::JobRegister {
                job: Box::new(job),
                enforce_index: None,
            },
        );
    }

    fn deployment(&self) -> Deployment {
        self.h.fx.state.latest_deployment("default", "web").unwrap().clone()
    }

    /// The client of w1 reports these allocations running and (un)healthy.
    fn report(&mut self, ids: &[String], healthy: bool) {
        self.next_req += 1;
        let updates = ids
            .iter()
            .map(|id| AllocClientReport {
                alloc_id: id.clone(),
                client_status: ClientStatus::Running,
                deployment_status: Some(AllocDeploymentStatus {
                    healthy: Some(healthy),
                    timestamp_ms: 1_000 * self.h.fx.index,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        self.h.request(
            self.next_req,
            ServerRequest::AllocClientUpdates {
                node_id: "w1".into(),
                secret_id: "secret-w1".into(),
                updates,
            },
        );
    }

    /// Live allocations of the current deployment with no verdict yet.
    fn undecided(&self) -> Vec<String> {
        let id = self.deployment().id;
        self.h
            .fx
            .state
            .allocs()
            .filter(|a| {
                a.deployment_id == id
                    && !a.terminal()
                    && a.deployment_status.as_ref().is_none_or(|s| s.healthy.is_none())
            })
            .map(|a| a.id.clone())
            .collect()
    }

    fn live_versions(&self) -> Vec<u64> {
        let mut versions: Vec<u64> = self
            .h
            .fx
            .state
            .allocs()
            .filter(|a| a.job_id == "web" && !a.terminal())
            .map(|a| a.job_version)
            .collect();
        versions.sort();
        versions
    }

    /// Reports every undecided allocation healthy until the deployment is done.
    fn run_healthy(&mut self) {
        for _ in 0..20 {
            let undecided = self.undecided();
            if undecided.is_empty() {
                break;
            }
            self.report(&undecided, true);
        }
    }
}

#[test]
fn a_rolling_update_moves_on_as_clients_report_health_and_marks_the_version_stable() {
    let mut r = Rollout::new();
    r.register(web(3, "1", strategy()));
    assert_eq!(r.live_versions(), vec![0, 0, 0]);
    r.run_healthy();
    assert_eq!(r.deployment().status, DeploymentStatus::Successful);
    assert!(r.h.fx.state.job("default", "web").unwrap().stable);

    r.register(web(3, "2", strategy()));
    let second = r.deployment();
    assert_eq!((second.job_version, second.status), (1, DeploymentStatus::Running));
    assert_eq!(r.live_versions(), vec![0, 0, 1], "max_parallel = 1");
    // Each healthy report lets the next one go.
    let first_new = r.undecided();
    r.report(&first_new, true);
    assert_eq!(r.live_versions(), vec![0, 1, 1]);
    r.run_healthy();
    assert_eq!(r.live_versions(), vec![1, 1, 1]);
    let done = r.deployment();
    assert_eq!(
        (done.id.as_str(), done.status),
        (second.id.as_str(), DeploymentStatus::Successful)
    );
    assert_eq!(done.task_groups["g"].healthy_allocs, 3);
    assert!(r.h.fx.state.job_version("default", "web", 1).unwrap().stable);
}

#[test]
fn an_unhealthy_allocation_fails_the_deployment_and_auto_revert_rolls_back_in_place() {
    let mut r = Rollout::new();
    let reverting = UpdateStrategy {
        auto_revert: true,
        ..strategy()
    };
    r.register(web(3, "1", reverting.clone()));
    r.run_healthy();
    let old_ids: Vec<String> =
        r.h.fx
            .state
            .allocs()
            .filter(|a| a.job_id == "web")
            .map(|a| a.id.clone())
            .collect();
    r.register(web(3, "2", reverting));
    let bad = r.undecided();
    assert_eq!(bad.len(), 1);
    let failing = r.deployment();
    r.report(&bad, false);
    let failed = r.h.fx.state.deployment(&failing.id).unwrap().clone();
    assert_eq!(failed.status, DeploymentStatus::Failed);
    assert_eq!(
        failed.status_description,
        "Failed due to unhealthy allocations - rolling back to job version 0"
    );
    // Version 2 is version 0's spec again: its allocations that still run move to it in
    // place; the bad one is replaced.
    let job = r.h.fx.state.job("default", "web").unwrap().clone();
    assert_eq!(job.version, 2);
    assert_eq!(job.task_groups[0].tasks[0].env["V"], "1");
    let revert = r.deployment();
    assert_eq!(revert.job_version, 2);
    let kept: Vec<&crate::structs::Allocation> =
        r.h.fx
            .state
            .allocs()
            .filter(|a| old_ids.contains(&a.id) && !a.terminal())
            .collect();
    assert_eq!(kept.len(), 2, "the two old allocations still run");
    assert!(kept.iter().all(|a| a.job_version == 2 && a.deployment_id == revert.id));
    r.run_healthy();
    assert_eq!(r.deployment().status, DeploymentStatus::Successful);
    assert_eq!(r.live_versions(), vec![2, 2, 2]);
}

#[test]
fn a_missed_progress_deadline_fails_the_deployment() {
    let mut r = Rollout::new();
    r.register(web(2, "1", strategy()));
    r.run_healthy();
    r.register(web(2, "2", strategy()));
    let stuck = r.deployment();
    // Nothing turns healthy; the leader's clock passes the 30 s deadline (measured from the
    // cluster time the watcher saw, which this fixture moves a second per entry).
    r.h.advance(Duration::from_secs(20));
    assert_eq!(
        r.h.fx.state.deployment(&stuck.id).unwrap().status,
        DeploymentStatus::Running
    );
    r.h.advance(Duration::from_secs(11));
    let failed = r.h.fx.state.deployment(&stuck.id).unwrap();
    assert_eq!(
        (failed.status, failed.status_description.as_str()),
        (DeploymentStatus::Failed, "Failed due to progress deadline")
    );
}

#[test]
fn healthy_canaries_are_promoted_automatically_with_auto_promote() {
    let mut r = Rollout::new();
    let canaries = UpdateStrategy {
        canary: 1,
        auto_promote: true,
        ..strategy()
    };
    r.register(web(2, "1", canaries.clone()));
    r.run_healthy();
    r.register(web(2, "2", canaries));
    let canary = r.undecided();
    assert_eq!(r.live_versions(), vec![0, 0, 1]);
    assert!(!r.deployment().task_groups["g"].promoted);
    r.report(&canary, true);
    assert!(r.deployment().task_groups["g"].promoted);
    r.run_healthy();
    assert_eq!(r.deployment().status, DeploymentStatus::Successful);
    assert_eq!(r.live_versions(), vec![1, 1]);
}

#[test]
fn a_broken_canary_fails_its_deployment_and_the_revert_moves_what_runs_in_place() {
    let mut r = Rollout::new();
    let canaries = UpdateStrategy {
        canary: 1,
        auto_promote: true,
        auto_revert: true,
        ..strategy()
    };
    r.register(web(3, "1", canaries.clone()));
    r.run_healthy();
    r.register(web(3, "2", canaries.clone()));
    r.run_healthy();
    assert_eq!(r.deployment().status, DeploymentStatus::Successful);
    assert_eq!(r.live_versions(), vec![1, 1, 1]);
    r.register(web(3, "broken", canaries));
    let canary = r.undecided();
    assert_eq!(canary.len(), 1);
    // The canary's task fails for good: its client reports it failed and unhealthy.
    r.next_req += 1;
    let updates = vec![AllocClientReport {
        alloc_id: canary[0].clone(),
        client_status: ClientStatus::Failed,
        deployment_status: Some(AllocDeploymentStatus {
            healthy: Some(false),
            timestamp_ms: 1,
            ..Default::default()
        }),
        ..Default::default()
    }];
    r.h.request(
        r.next_req,
        ServerRequest::AllocClientUpdates {
            node_id: "w1".into(),
            secret_id: "secret-w1".into(),
            updates,
        },
    );
    let job = r.h.fx.state.job("default", "web").unwrap().clone();
    assert_eq!(job.version, 3, "reverted to version 1's spec");
    let revert = r.deployment();
    assert_eq!(revert.job_version, 3);
    let replaced: Vec<&crate::structs::Allocation> =
        r.h.fx
            .state
            .allocs()
            .filter(|a| a.job_id == "web" && a.deployment_id == revert.id && a.create_index >= revert.create_index)
            .collect();
    assert!(replaced.is_empty(), "nothing placed, all moved in place: {replaced:?}");
    r.run_healthy();
    assert_eq!(r.deployment().status, DeploymentStatus::Successful);
    assert_eq!(r.live_versions(), vec![3, 3, 3]);
}

impl Rollout {
    /// An operator's deployment request; the reply.
    fn operate(&mut self, request: crate::rpc::DeploymentRequest) -> ServerReply {
        self.next_req += 1;
        let req = self.next_req;
        self.h.request(req, ServerRequest::Deployment(request));
        self.h
            .replies
            .iter()
            .rev()
            .find(|(id, _)| *id == req)
            .map(|(_, reply)| reply.clone())
            .expect("answered")
    }
}

#[test]
fn operators_pause_resume_fail_and_mark_health_with_nomads_checks() {
    use crate::rpc::DeploymentRequest as D;
    let mut r = Rollout::new();
    let manual = UpdateStrategy {
        health_check: crate::structs::HEALTH_CHECK_MANUAL.into(),
        auto_revert: true,
        ..strategy()
    };
    r.register(web(2, "1", manual.clone()));
    let first = r.deployment();
    let allocs = r.undecided();
    // An allocation of another job is refused by name; then both are marked healthy.
    let foreign = r.operate(D::AllocHealth {
        deployment_id: first.id.clone(),
        healthy: vec!["a1".into()],
        unhealthy: Vec::new(),
    });
    assert!(
        matches!(&foreign, ServerReply::Error(e) if e.message.contains("isn't part of deployment")),
        "{foreign:?}"
    );
    r.operate(D::AllocHealth {
        deployment_id: first.id.clone(),
        healthy: allocs.clone(),
        unhealthy: Vec::new(),
    });
    assert_eq!(
        r.h.fx.state.deployment(&first.id).unwrap().status,
        DeploymentStatus::Successful
    );
    let done = r.operate(D::Pause {
        deployment_id: first.id.clone(),
        pause: true,
    });
    assert!(
        matches!(&done, ServerReply::Error(e) if e.message == "can't pause terminal deployment"),
        "{done:?}"
    );

    // Version 1: paused, nothing moves; resumed, the rollout goes on.
    r.register(web(2, "2", manual));
    let second = r.deployment();
    r.operate(D::Pause {
        deployment_id: second.id.clone(),
        pause: true,
    });
    let paused = r.h.fx.state.deployment(&second.id).unwrap().clone();
    assert_eq!(
        (paused.status, paused.status_description.as_str()),
        (DeploymentStatus::Paused, "Deployment is paused")
    );
    r.operate(D::Pause {
        deployment_id: second.id.clone(),
        pause: false,
    });
    assert_eq!(
        r.h.fx.state.deployment(&second.id).unwrap().status,
        DeploymentStatus::Running
    );
    // An operator fails it: auto_revert rolls back to version 0.
    r.operate(D::Fail {
        deployment_id: second.id.clone(),
    });
    let failed = r.h.fx.state.deployment(&second.id).unwrap();
    assert_eq!(
        (failed.status, failed.status_description.as_str()),
        (
            DeploymentStatus::Failed,
            "Deployment marked as failed - rolling back to job version 0"
        )
    );
    assert_eq!(r.h.fx.state.job("default", "web").unwrap().version, 2);
    // A promotion with no canaries, and a revert to the current version, are refused.
    let latest = r.deployment();
    let nothing = r.operate(D::Promote {
        deployment_id: latest.id.clone(),
        groups: Vec::new(),
    });
    assert!(
        matches!(&nothing, ServerReply::Error(e) if e.message == "no canaries to promote"),
        "{nothing:?}"
    );
    let current = r.operate(D::Revert {
        namespace: "default".into(),
        job_id: "web".into(),
        version: 2,
        enforce_prior_version: None,
    });
    assert!(
        matches!(&current, ServerReply::Error(e) if e.message == "can't revert to current version"),
        "{current:?}"
    );
}
