//! `Job.Plan`: the scheduler run as a dry run (Nomad's `job plan`). The job is registered on
//! a scratch copy of the state (a clone costs a reference count per table), one evaluation
//! is scheduled there, and the plan is summed up per task group as Nomad's
//! `DesiredTGUpdates`; nothing is proposed and the state the caller holds is untouched.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use super::{ALLOC_MIGRATING, ALLOC_UPDATING, Plan};
use crate::fsm::{Command, Entry, Response, ServerState};
use crate::structs::{AllocMetric, DesiredStatus, EvalStatus, Evaluation, Job};

/// What a plan would do to one task group (Nomad's `DesiredUpdates`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredUpdates {
    pub ignore: u64,
    pub place: u64,
    pub migrate: u64,
    pub stop: u64,
    pub in_place_update: u64,
    pub destructive_update: u64,
    pub canary: u64,
    pub preemptions: u64,
}

/// The outcome of a dry run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DryRun {
    /// By task group.
    pub desired: BTreeMap<String, DesiredUpdates>,
    /// Groups that could not be placed in full, with what the scheduler saw.
    pub failed: BTreeMap<String, AllocMetric>,
    /// The stored job's `job_modify_index` (0 when there is none): what `job run
    /// -check-index` asks the register to find.
    pub job_modify_index: u64,
    /// The job as it would be registered (its version among them).
    pub job: Job,
}

/// Schedules `job` as though registered now. `job` must have passed admission.
pub fn dry_run(state: &ServerState, job: &Job, limits: &crate::jobspec::limits::JobLimits) -> Result<DryRun, String> {
    let stored = state.job(&job.namespace, &job.id);
    let job_modify_index = stored.map_or(0, |stored| stored.job_modify_index);
    let mut scratch = state.clone();
    let eval = Evaluation {
        id: "plan".into(),
        namespace: job.namespace.clone(),
        priority: job.priority,
        eval_type: job.job_type,
        triggered_by: crate::structs::EvalTrigger::JobRegister,
        job_id: job.id.clone(),
        status: EvalStatus::Pending,
        ..Evaluation::default()
    };
    let index = scratch.last_applied().map_or(1, |last| last + 1);
    let entry = Entry {
        at_unix_ms: state.last_applied_time_ms(),
        command: Command::JobRegister {
            job: job.clone(),
            eval: Some(eval.clone()),
            enforce_index: None,
        },
    };
    if let Response::Error(_, text) = scratch.apply(index, &entry) {
        return Err(text);
    }
    let registered = scratch
        .job(&job.namespace, &job.id)
        .cloned()
        .ok_or("the job was not registered")?;
    let mut eval = eval;
    eval.job_modify_index = registered.job_modify_index;
    let mut counter = 0u64;
    let plan = super::schedule_within(
        &scratch,
        &eval,
        &mut || {
            counter += 1;
            format!("plan-{counter}")
        },
        limits,
    );
    Ok(DryRun {
        desired: desired_updates(&scratch, &registered, &plan),
        failed: plan
            .evals
            .first()
            .map(|eval| eval.failed_tg_allocs.clone())
            .unwrap_or_default(),
        job_modify_index,
        job: registered,
    })
}

/// Sums a plan up per group: placements (replacements of allocations stopped for the update
/// are destructive updates, of migrated ones migrations), canaries, stops, in-place updates,
/// and the live allocations the plan leaves alone.
fn desired_updates(state: &ServerState, job: &Job, plan: &Plan) -> BTreeMap<String, DesiredUpdates> {
    let mut desired: BTreeMap<String, DesiredUpdates> = job
        .task_groups
        .iter()
        .map(|group| (group.name.clone(), DesiredUpdates::default()))
        .collect();
    let stopped_for: BTreeMap<&str, &str> = plan
        .allocs
        .iter()
        .filter(|alloc| alloc.desired_status != DesiredStatus::Run)
        .map(|alloc| (alloc.id.as_str(), alloc.desired_description.as_str()))
        .collect();
    let replaced: BTreeSet<&str> = plan
        .placed()
        .filter_map(|alloc| alloc.previous_allocation.as_deref())
        .collect();
    let mut touched = BTreeSet::new();
    // Destructive updates and migrations are counted by what they stop (their replacement
    // may not have found a node); what could not be placed at all is queued on the
    // evaluation.
    let mut unplaced_replacements: BTreeMap<String, u64> = BTreeMap::new();
    for alloc in &plan.allocs {
        touched.insert(alloc.id.as_str());
        let entry = desired.entry(alloc.task_group.clone()).or_default();
        match state.alloc(&alloc.id) {
            None if alloc.is_canary() => entry.canary += 1,
            None => {
                let why = alloc.previous_allocation.as_deref().and_then(|id| stopped_for.get(id));
                if !matches!(why, Some(&ALLOC_UPDATING) | Some(&ALLOC_MIGRATING)) {
                    entry.place += 1;
                }
            }
            Some(_) if alloc.desired_status != DesiredStatus::Run => {
                match alloc.desired_description.as_str() {
                    ALLOC_UPDATING => entry.destructive_update += 1,
                    ALLOC_MIGRATING => entry.migrate += 1,
                    _ => entry.stop += 1,
                }
                let replacement_wanted =
                    [ALLOC_UPDATING, ALLOC_MIGRATING].contains(&alloc.desired_description.as_str());
                if replacement_wanted && !replaced.contains(alloc.id.as_str()) {
                    *unplaced_replacements.entry(alloc.task_group.clone()).or_default() += 1;
                }
            }
            Some(before) if before.job_version != alloc.job_version => entry.in_place_update += 1,
            Some(_) => {}
        }
    }
    let queued = plan
        .evals
        .first()
        .map(|eval| eval.queued_allocations.clone())
        .unwrap_or_default();
    for (group, count) in queued {
        let unplaced = unplaced_replacements.get(&group).copied().unwrap_or(0);
        desired.entry(group).or_default().place += u64::from(count).saturating_sub(unplaced);
    }
    for alloc in state.job_allocs(&job.namespace, &job.id) {
        if !alloc.terminal() && !touched.contains(alloc.id.as_str()) {
            desired.entry(alloc.task_group.clone()).or_default().ignore += 1;
        }
    }
    desired
}
