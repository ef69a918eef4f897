//! `job plan`'s dry run: what a register would do, summed up per group, with the state left
//! as it was.

use super::*;
use crate::scheduler::dry_run::{DesiredUpdates, dry_run};
use crate::structs::UpdateStrategy;

fn plan(world: &World, job: &Job) -> crate::scheduler::dry_run::DryRun {
    let mut job = job.clone();
    assert!(crate::jobspec::admit(&mut job, &Default::default()).is_empty());
    dry_run(&world.fx.state, &job, &Default::default()).expect("a dry run")
}

#[test]
fn a_dry_run_counts_what_a_register_would_do_and_changes_nothing() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = job("web", JobType::Service, 3, 100);
    let fresh = plan(&world, &web);
    assert_eq!(fresh.job_modify_index, 0);
    assert_eq!(
        fresh.desired["g"],
        DesiredUpdates {
            place: 3,
            ..Default::default()
        }
    );
    assert!(world.fx.state.job("default", "web").is_none(), "nothing registered");

    let eval = world.register(&web);
    world.run(&eval);
    let index = world.fx.state.job("default", "web").unwrap().job_modify_index;
    let same = plan(&world, &web);
    assert_eq!(same.job_modify_index, index);
    assert_eq!(
        same.desired["g"],
        DesiredUpdates {
            ignore: 3,
            ..Default::default()
        }
    );

    // A new env: every allocation replaced (no update block: all at once).
    web.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    let changed = plan(&world, &web);
    assert_eq!(
        changed.desired["g"],
        DesiredUpdates {
            destructive_update: 3,
            ..Default::default()
        }
    );
    assert_eq!(changed.job.version, 1);
    assert_eq!(
        world.fx.state.job("default", "web").unwrap().version,
        0,
        "still version 0"
    );
    assert_eq!(world.live("web").len(), 3);

    // One more allocation and nothing else: in place, plus one placement.
    web.task_groups[0].tasks[0].env.clear();
    web.task_groups[0].count = 4;
    let scaled = plan(&world, &web);
    assert_eq!(
        scaled.desired["g"],
        DesiredUpdates {
            place: 1,
            in_place_update: 3,
            ..Default::default()
        }
    );

    // Too big for the node: what cannot be placed shows as failed.
    let mut huge = job("huge", JobType::Service, 2, 3000);
    huge.task_groups[0].tasks[0].resources.cpu = 3000;
    let failed = plan(&world, &huge);
    assert_eq!(failed.desired["g"].place, 2, "placed or not, both are creates");
    assert_eq!(failed.failed["g"].dimension_exhausted["cpu"], 1, "{:?}", failed.failed);
}

#[test]
fn a_dry_run_follows_the_rollout() {
    let mut world = World::new(&[node("n1", 4000)]);
    let mut web = job("web", JobType::Service, 3, 100);
    web.task_groups[0].update = Some(alloc::boxed::Box::new(UpdateStrategy {
        max_parallel: 1,
        ..UpdateStrategy::default()
    }));
    let eval = world.register(&web);
    world.run(&eval);
    web.task_groups[0].tasks[0].env.insert("V".into(), "2".into());
    assert_eq!(
        plan(&world, &web).desired["g"],
        DesiredUpdates {
            destructive_update: 1,
            ignore: 2,
            ..Default::default()
        }
    );
    web.task_groups[0].update.as_mut().unwrap().canary = 1;
    assert_eq!(
        plan(&world, &web).desired["g"],
        DesiredUpdates {
            canary: 1,
            ignore: 3,
            ..Default::default()
        }
    );
}
