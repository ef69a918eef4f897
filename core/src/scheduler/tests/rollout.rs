//! Deployments in the scheduler: rolling updates within `max_parallel`, canaries and their
//! promotion, in-place updates, cancellation, failure, success and stable versions.

use super::*;
use crate::structs::{
    AllocClientReport, AllocDeploymentStatus, DEPLOYMENT_DESC_NEEDS_PROMOTION, DEPLOYMENT_DESC_NEWER_JOB,
    DEPLOYMENT_DESC_SUCCESSFUL, Deployment, DeploymentStatus, DeploymentStatusUpdate, UpdateStrategy,
};

fn rolling(count: u32, max_parallel: u32, canary: u32) -> Job {
    let mut web = job("web", JobType::Service, count, 100);
    web.task_groups[0].update = Some(alloc::boxed::Box::new(UpdateStrategy {
        max_parallel,
        canary,
        ..UpdateStrategy::default()
    }));
    web
}

fn bump(web: &mut Job, value: &str) {
    web.task_groups[0].tasks[0].env.insert("V".into(), value.into());
}

impl World {
    fn deployment(&self) -> Deployment {
        self.fx
            .state
            .latest_deployment("default", "web")
            .expect("a deployment")
            .clone()
    }

    /// The client reports `alloc_id` running and (un)healthy.
    fn health(&mut self, alloc_id: &str, healthy: bool) {
        self.fx.ok(Command::AllocClientUpdates {
            updates: vec![AllocClientReport {
                alloc_id: alloc_id.into(),
                client_status: ClientStatus::Running,
                deployment_status: Some(AllocDeploymentStatus {
                    healthy: Some(healthy),
                    timestamp_ms: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        });
    }

    /// Every live allocation of the current deployment turns healthy.
    fn all_healthy(&mut self) {
        let id = self.deployment().id;
        let ids: Vec<String> = self
            .fx
            .state
            .allocs()
            .filter(|alloc| alloc.deployment_id == id && !alloc.terminal() && !alloc.healthy())
            .map(|alloc| alloc.id.clone())
            .collect();
        for alloc in ids {
            self.health(&alloc, true);
        }
    }

    fn live_versions(&self) -> Vec<(String, u64, bool)> {
        let mut live: Vec<(String, u64, bool)> = self
            .fx
            .state
            .allocs()
            .filter(|alloc| alloc.job_id == "web" && !alloc.terminal())
            .map(|alloc| (alloc.name.clone(), alloc.job_version, alloc.is_canary()))
            .collect();
        live.sort();
        live
    }

    fn evaluate(&mut self) -> Plan {
        let eval = self.eval("web");
        self.run(&eval)
    }
}

#[test]
fn a_first_version_places_everything_and_succeeds_once_healthy() {
    let mut world = World::new(&[node("n1", 4000)]);
    let web = rolling(3, 1, 0);
    let eval = world.register(&web);
    let plan = world.run(&eval);
    let deployment = plan.deployment.clone().expect("a deployment for the first version");
    assert_eq!(plan.placed().count(), 3, "nothing to wait for: everything at once");
    assert!(plan.placed().all(|alloc| alloc.deployment_id == deployment.id));
    let stored = world.deployment();
    assert_eq!((stored.status, stored.job_version), (DeploymentStatus::Running, 0));
    assert_eq!(stored.task_groups["g"].desired_total, 3);
    assert_eq!(stored.task_groups["g"].placed_allocs, 3);
    assert!(stored.task_groups["g"].require_progress_by_ms > 0);
    // Not healthy yet: nothing to do, not done.
    assert!(world.evaluate().deployment_updates.is_empty());
    world.all_healthy();
    assert_eq!(world.deployment().task_groups["g"].healthy_allocs, 3);
    let plan = world.evaluate();
    assert_eq!(
        plan.deployment_updates,
        vec![DeploymentStatusUpdate {
            deployment_id: deployment.id.clone(),
            status: DeploymentStatus::Successful,
            status_description: DEPLOYMENT_DESC_SUCCESSFUL.into(),
        }]
    );
    assert!(world.fx.state.job("default", "web").unwrap().stable);
    assert!(world.fx.state.job_version("default", "web", 0).unwrap().stable);
}

#[test]
fn a_rolling_update_replaces_max_parallel_at_a_time_as_they_turn_healthy() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(4, 2, 0);
    let eval = world.register(&web);
    world.run(&eval);
    world.all_healthy();
    world.evaluate();
    bump(&mut web, "2");
    let eval = world.register(&web);
    let plan = world.run(&eval);
    let second = plan.deployment.clone().expect("a deployment for version 1");
    assert_eq!(second.job_version, 1);
    let stopped = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Stop)
        .count();
    assert_eq!((stopped, plan.placed().count()), (2, 2), "max_parallel = 2");
    // Until they turn healthy, nothing more.
    let plan = world.evaluate();
    assert!(plan.allocs.is_empty(), "{:?}", plan.allocs);
    // One healthy frees one slot.
    let new: Vec<String> = world
        .fx
        .state
        .allocs()
        .filter(|a| a.deployment_id == second.id)
        .map(|a| a.id.clone())
        .collect();
    world.health(&new[0], true);
    let plan = world.evaluate();
    assert_eq!(plan.placed().count(), 1);
    world.all_healthy();
    let plan = world.evaluate();
    assert_eq!(plan.placed().count(), 1);
    assert!(plan.deployment_updates.is_empty(), "the last one is not healthy yet");
    world.all_healthy();
    let plan = world.evaluate();
    assert_eq!(plan.deployment_updates[0].status, DeploymentStatus::Successful);
    assert!(world.live_versions().iter().all(|(_, version, _)| *version == 1));
    assert_eq!(world.deployment().task_groups["g"].healthy_allocs, 4);
}

#[test]
fn an_unhealthy_allocation_stops_the_rollout() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(3, 1, 0);
    let eval = world.register(&web);
    world.run(&eval);
    world.all_healthy();
    world.evaluate();
    bump(&mut web, "2");
    let eval = world.register(&web);
    let plan = world.run(&eval);
    let new = plan.placed().next().unwrap().id.clone();
    world.health(&new, false);
    assert_eq!(world.deployment().task_groups["g"].unhealthy_allocs, 1);
    let plan = world.evaluate();
    assert!(plan.allocs.is_empty(), "{:?}", plan.allocs);
    assert!(plan.deployment_updates.is_empty());
}

#[test]
fn canaries_run_beside_the_old_version_until_promoted() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(3, 1, 1);
    let eval = world.register(&web);
    world.run(&eval);
    assert_eq!(
        world.deployment().task_groups["g"].desired_canaries,
        0,
        "no canaries for a first version"
    );
    world.all_healthy();
    world.evaluate();
    bump(&mut web, "2");
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(plan.placed().count(), 1);
    assert!(
        plan.allocs.iter().all(|a| a.desired_status == DesiredStatus::Run),
        "nothing stopped"
    );
    let canary = plan.placed().next().unwrap().clone();
    assert!(canary.is_canary());
    assert_eq!(canary.name, "web.g[0]", "named after the allocation it will replace");
    let deployment = world.deployment();
    assert_eq!(deployment.task_groups["g"].desired_canaries, 1);
    assert_eq!(deployment.task_groups["g"].placed_canaries, vec![canary.id.clone()]);
    assert_eq!(deployment.status_description, DEPLOYMENT_DESC_NEEDS_PROMOTION);
    assert_eq!(
        world.live_versions(),
        vec![
            ("web.g[0]".into(), 0, false),
            ("web.g[0]".into(), 1, true),
            ("web.g[1]".into(), 0, false),
            ("web.g[2]".into(), 0, false)
        ]
    );
    // Healthy but not promoted: still nothing else.
    world.health(&canary.id, true);
    assert!(world.evaluate().allocs.is_empty());
    let promote = world.eval("web");
    world.fx.ok(Command::DeploymentPromote {
        deployment_id: deployment.id.clone(),
        groups: Vec::new(),
        eval: promote.clone(),
    });
    let plan = world.run(&promote);
    let stopped: Vec<&Allocation> = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Stop)
        .collect();
    // The old web.g[0] goes (the canary took its name) and one destructive update starts.
    assert_eq!(stopped.len(), 2, "{stopped:?}");
    assert!(
        stopped
            .iter()
            .any(|a| a.name == "web.g[0]" && a.desired_description == ALLOC_NOT_NEEDED)
    );
    assert_eq!(plan.placed().count(), 1);
    world.all_healthy();
    world.evaluate();
    world.all_healthy();
    let plan = world.evaluate();
    assert_eq!(plan.deployment_updates[0].status, DeploymentStatus::Successful);
    // The promoted canary is a canary no more (its services drop their canary tags).
    assert_eq!(
        world.live_versions(),
        vec![
            ("web.g[0]".into(), 1, false),
            ("web.g[1]".into(), 1, false),
            ("web.g[2]".into(), 1, false)
        ]
    );
}

#[test]
fn a_failed_deployment_stops_its_canaries_and_reschedules_nothing_of_its_own() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(2, 1, 1);
    let eval = world.register(&web);
    world.run(&eval);
    world.all_healthy();
    world.evaluate();
    bump(&mut web, "2");
    let eval = world.register(&web);
    let canary = world.run(&eval).placed().next().unwrap().id.clone();
    let deployment = world.deployment();
    world.fx.ok(Command::DeploymentStatus {
        update: DeploymentStatusUpdate {
            deployment_id: deployment.id.clone(),
            status: DeploymentStatus::Failed,
            status_description: "Deployment marked as failed".into(),
        },
        job: None,
        eval: None,
    });
    let plan = world.evaluate();
    let stopped: Vec<&str> = plan
        .allocs
        .iter()
        .filter(|a| a.desired_status == DesiredStatus::Stop)
        .map(|a| a.id.as_str())
        .collect();
    assert_eq!(stopped, vec![canary.as_str()]);
    assert_eq!(plan.placed().count(), 0);
    assert_eq!(
        world.live_versions(),
        vec![("web.g[0]".into(), 0, false), ("web.g[1]".into(), 0, false)]
    );
}

#[test]
fn a_new_version_cancels_the_running_deployment() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(2, 1, 0);
    let eval = world.register(&web);
    world.run(&eval);
    let first = world.deployment().id;
    bump(&mut web, "2");
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert_eq!(
        plan.deployment_updates,
        vec![DeploymentStatusUpdate {
            deployment_id: first.clone(),
            status: DeploymentStatus::Cancelled,
            status_description: DEPLOYMENT_DESC_NEWER_JOB.into(),
        }]
    );
    assert_ne!(world.deployment().id, first);
    assert_eq!(
        world.fx.state.deployment(&first).unwrap().status,
        DeploymentStatus::Cancelled
    );
}

#[test]
fn a_change_that_leaves_the_tasks_alone_updates_in_place() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(2, 1, 0);
    let eval = world.register(&web);
    world.run(&eval);
    world.all_healthy();
    world.evaluate();
    let before: BTreeSet<String> = world.fx.state.allocs().map(|a| a.id.clone()).collect();
    web.task_groups[0].count = 3;
    let eval = world.register(&web);
    let plan = world.run(&eval);
    assert!(
        plan.allocs.iter().all(|a| a.desired_status == DesiredStatus::Run),
        "nothing stopped"
    );
    assert_eq!(plan.placed().count(), 1);
    let deployment = world.deployment();
    assert_eq!(deployment.job_version, 1);
    for alloc in world.fx.state.allocs().filter(|a| before.contains(&a.id)) {
        assert_eq!(alloc.job_version, 1, "moved to the new version where it runs");
        assert_eq!(alloc.deployment_id, deployment.id);
        assert!(!alloc.healthy(), "health is earned again in the new deployment");
    }
    // Without an update block, the same change also leaves what runs alone.
    let mut plain = job("plain", JobType::Service, 1, 100);
    let eval = world.register(&plain);
    world.run(&eval);
    plain.task_groups[0].count = 2;
    let eval = world.register(&plain);
    let plan = world.run(&eval);
    assert!(plan.allocs.iter().all(|a| a.desired_status == DesiredStatus::Run));
    assert!(world.fx.state.latest_deployment("default", "plain").is_none());
}

#[test]
fn a_failed_canary_never_displaces_the_allocation_it_stands_beside() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = rolling(2, 1, 1);
    let eval = world.register(&web);
    world.run(&eval);
    world.all_healthy();
    world.evaluate();
    bump(&mut web, "2");
    let eval = world.register(&web);
    let canary = world.run(&eval).placed().next().unwrap().id.clone();
    // The canary fails before the watcher fails its deployment: nothing else moves, and no
    // second canary is placed.
    world.set_client_status(&canary, ClientStatus::Failed);
    let plan = world.evaluate();
    assert!(plan.allocs.is_empty(), "{:?}", plan.allocs);
    assert_eq!(
        world.live_versions(),
        vec![("web.g[0]".into(), 0, false), ("web.g[1]".into(), 0, false)]
    );
}
