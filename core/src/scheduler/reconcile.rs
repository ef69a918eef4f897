//! One evaluation's reconciliation: what to stop (and why), what to place (and what each
//! placement replaces), then placing on the best feasible node, with what could not be placed
//! recorded on the evaluation and retried by a blocked one. Plan entries keep the order in
//! which they were decided, so a plan is a pure function of the state and the evaluation.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use super::reschedule::{self, ALLOC_RESCHEDULED};
use super::rollout::{self, Rollout};
use super::{
    ALLOC_LOST, ALLOC_MIGRATING, ALLOC_NODE_INELIGIBLE, ALLOC_NOT_NEEDED, ALLOC_UPDATING, Placement, Plan, Usage,
    alloc_name, group_resources, node_usage, ports, select_node,
};
use crate::fsm::ServerState;
use crate::structs::{
    AllocMetric, Allocation, ClientStatus, DesiredStatus, EvalStatus, EvalTrigger, Evaluation, Job, JobType, Node,
    NodeStatus, TaskGroup, UpdateStrategy,
};

/// What a group's names call for, gathered before the deployment decides how much of it
/// happens now.
#[derive(Default)]
struct NameChanges<'a> {
    /// Names to place, each replacing the given (already stopped) allocation if any.
    places: Vec<(String, Option<String>)>,
    destructive: Vec<&'a Allocation>,
    in_place: Vec<&'a Allocation>,
}

/// What becomes of one allocation name.
enum Decision<'a> {
    Keep,
    /// Place one, replacing the given allocation (already stopped) if any.
    Place(Option<String>),
    /// Replace this one with the new version, when the deployment allows.
    Destructive(&'a Allocation),
    /// Move this one to the new version where it runs.
    InPlace(&'a Allocation),
}

pub(super) struct Reconcile<'a> {
    state: &'a ServerState,
    /// The job's deployment as this plan changes it.
    pub(super) rollout: Rollout,
    /// The evaluation was made to reschedule failed allocations (their delay has passed).
    rescheduling: bool,
    plan: Plan,
    usage: BTreeMap<String, Usage>,
    placements: Vec<Placement<'a>>,
    /// The most allocations one group is given (the server's `JobLimits::group_count`).
    pub(super) group_count_max: u32,
    /// A system job's group had more outdated allocations than its `max_parallel`: the rest
    /// wait for a follow-up evaluation this long (its `stagger`).
    rolling_wait: Option<core::time::Duration>,
    /// A lost allocation's replacement waits this long for its client to have stopped it
    /// (`stop_after_client_disconnect`): a follow-up evaluation places it.
    disconnect_wait: Option<core::time::Duration>,
}

impl<'a> Reconcile<'a> {
    pub(super) fn new(state: &'a ServerState, rescheduling: bool) -> Self {
        Reconcile {
            state,
            rescheduling,
            plan: Plan::default(),
            usage: node_usage(state),
            placements: Vec::new(),
            rollout: Rollout::default(),
            group_count_max: crate::jobspec::GROUP_COUNT_MAX,
            rolling_wait: None,
            disconnect_wait: None,
        }
    }

    /// How long from now the replacement of `alloc`, lost, must wait: until its client, out of
    /// touch since before it was found lost, has surely stopped it under its group's
    /// `stop_after_client_disconnect` (`None`: due, or no such wait).
    fn lost_wait(&self, job: &Job, alloc: &Allocation) -> Option<core::time::Duration> {
        let after = job
            .task_groups
            .iter()
            .find(|group| group.name == alloc.task_group)?
            .stop_after_client_disconnect?;
        let due = alloc.modify_time_ms.saturating_add(after.as_millis() as u64);
        let now = self.state.last_applied_time_ms();
        (now < due).then(|| core::time::Duration::from_millis(due - now))
    }

    /// Whether `alloc`'s group has its lost allocations wait for their client.
    fn waits_for_disconnect(&self, job: &Job, alloc: &Allocation) -> bool {
        job.task_groups
            .iter()
            .any(|group| group.name == alloc.task_group && group.stop_after_client_disconnect.is_some())
    }

    fn wait_for_disconnect(&mut self, wait: core::time::Duration) {
        self.disconnect_wait = Some(self.disconnect_wait.map_or(wait, |known| known.min(wait)));
    }

    /// Stops `alloc` (lost: its node is gone, so its client status becomes lost too) and frees
    /// what it held for the placements that follow.
    pub(super) fn stop(&mut self, alloc: &Allocation, why: &str, lost: bool) {
        let mut stopped = alloc.clone();
        stopped.desired_status = DesiredStatus::Stop;
        stopped.desired_description = why.to_string();
        if lost {
            stopped.client_status = ClientStatus::Lost;
        }
        if let Some(node) = self.usage.get_mut(&alloc.node_id) {
            node.cpu = node.cpu.saturating_sub(alloc.resources.cpu);
            node.memory_mb = node.memory_mb.saturating_sub(alloc.resources.memory_mb);
            node.disk_mb = node.disk_mb.saturating_sub(alloc.resources.disk_mb);
            for port in alloc.resources.host_ports() {
                node.ports.remove(&port);
                node.releasing.insert(port);
            }
            for core in alloc.resources.task_cores.values().flatten() {
                node.cores.remove(core);
            }
        }
        self.plan.allocs.push(stopped);
    }

    fn node_down(&self, alloc: &Allocation) -> bool {
        self.state
            .node(&alloc.node_id)
            .is_none_or(|node| node.status == NodeStatus::Down)
    }

    /// Stopped by an earlier plan but still running when its node went down: no client will
    /// ever report it finished, so it is lost — otherwise it would hold its volume claims
    /// forever (found by the jobs_node_loss simulation: an update's replacement on another
    /// node waited for a single-writer claim that was never released).
    pub(super) fn lose_stopped_on_down_nodes(&mut self, allocs: &[&Allocation]) {
        let lost: Vec<&&Allocation> = allocs
            .iter()
            .filter(|alloc| alloc.server_terminal() && !alloc.client_terminal() && self.node_down(alloc))
            .collect();
        for alloc in lost {
            let mut lost = (*alloc).clone();
            lost.client_status = ClientStatus::Lost;
            self.plan.allocs.push(lost);
        }
    }

    /// A system job's group: one allocation on every usable, eligible node. With an `update`
    /// block, at most `max_parallel` outdated allocations are replaced per evaluation; the
    /// rest wait for a `rolling-update` evaluation `stagger` later (Nomad's system scheduler).
    pub(super) fn system_group(&mut self, job: &'a Job, group: &'a TaskGroup, allocs: &[&Allocation]) {
        let state = self.state;
        let nodes: Vec<&Node> = state.nodes().collect();
        let rolling = group.rolling_update();
        let mut updates_left = rolling.map_or(u32::MAX, |update| update.max_parallel);
        let mine: Vec<&&Allocation> = allocs
            .iter()
            .filter(|alloc| alloc.task_group == group.name && !alloc.server_terminal())
            .collect();
        for node in &nodes {
            let here: Vec<&&&Allocation> = mine.iter().filter(|alloc| alloc.node_id == node.id).collect();
            let usable = node.status == NodeStatus::Ready && job.runs_in(&node.datacenter);
            let wanted = usable && node.eligible();
            let mut kept = false;
            for alloc in here {
                if node.status == NodeStatus::Down {
                    if !alloc.client_terminal() {
                        self.stop(alloc, ALLOC_LOST, true);
                    }
                } else if alloc.desired_transition.migrate {
                    // Drained: stopped, and not placed again while the node is ineligible.
                    self.stop(alloc, ALLOC_MIGRATING, false);
                } else if !usable {
                    self.stop(alloc, ALLOC_NODE_INELIGIBLE, false);
                } else if !node.eligible() {
                    // Ineligible but not drained away: left alone (no updates either).
                    kept = true;
                } else if kept {
                    self.stop(alloc, ALLOC_NOT_NEEDED, false);
                } else if alloc.job_version < job.version && updates_left == 0 {
                    // Past this evaluation's max_parallel: updated by the next one.
                    self.rolling_wait = rolling.map(|update| update.stagger);
                    kept = true;
                } else if alloc.job_version < job.version {
                    updates_left -= 1;
                    self.stop(alloc, ALLOC_UPDATING, false);
                    self.placements.push(Placement {
                        node: Some(node.id.clone()),
                        ..Placement::new(group, alloc_name(job, group, 0), Some(alloc.id.clone()))
                    });
                    kept = true;
                } else {
                    // Running, or failed on this node and left as it is (no reschedule for
                    // system jobs).
                    kept = true;
                }
            }
            if wanted && !kept {
                self.placements.push(Placement {
                    node: Some(node.id.clone()),
                    ..Placement::new(group, alloc_name(job, group, 0), None)
                });
            }
        }
        // Allocations on nodes that are gone altogether.
        for alloc in mine.iter().filter(|alloc| state.node(&alloc.node_id).is_none()) {
            if !alloc.client_terminal() {
                self.stop(alloc, ALLOC_LOST, true);
            }
        }
    }

    /// A service or batch job's group: `count` allocations by name; with an `update` block,
    /// through the job's deployment (`rollout.rs`).
    pub(super) fn service_group(
        &mut self,
        job: &'a Job,
        group: &'a TaskGroup,
        allocs: &[&'a Allocation],
        new_id: &mut dyn FnMut() -> String,
    ) {
        let strategy = rollout::rolls_out(job, group);
        let mine: Vec<&Allocation> = allocs
            .iter()
            .copied()
            .filter(|alloc| alloc.task_group == group.name)
            .collect();
        let (waiting, stopped) = self.sort_canaries(group, &mine);
        let mut by_name: BTreeMap<String, Vec<&Allocation>> = BTreeMap::new();
        for alloc in mine
            .iter()
            .filter(|alloc| !waiting.contains(&alloc.id) && !stopped.contains(&alloc.id))
        {
            by_name.entry(alloc.name.clone()).or_default().push(alloc);
        }
        // Validation refuses larger counts; one stored before the limit must not make the
        // leader build a billion names.
        let count = group.count.min(self.group_count_max);
        let wanted: BTreeSet<String> = (0..count).map(|i| alloc_name(job, group, i)).collect();
        for (name, history) in &by_name {
            if !wanted.contains(name) {
                for alloc in history.iter().filter(|alloc| !alloc.terminal()) {
                    self.stop(alloc, ALLOC_NOT_NEEDED, false);
                    self.rollout.busy(&group.name);
                }
            }
        }
        let failed_deployment = self
            .rollout
            .deployment
            .as_ref()
            .filter(|_| self.rollout.failed())
            .map(|deployment| deployment.id.clone());
        let mut changes = NameChanges::default();
        for name in &wanted {
            let mut history: Vec<&Allocation> = by_name.get(name).cloned().unwrap_or_default();
            history.sort_by_key(|alloc| (alloc.create_index, alloc.id.clone()));
            match self.one_name(job, &history, strategy.is_some(), failed_deployment.as_deref()) {
                Decision::Keep => {}
                Decision::Place(previous) => changes.places.push((name.clone(), previous)),
                Decision::Destructive(alloc) => changes.destructive.push(alloc),
                Decision::InPlace(alloc) => changes.in_place.push(alloc),
            }
        }
        match strategy {
            Some(strategy) => self.roll_out(job, group, &strategy, &mine, &waiting, changes, new_id),
            None => {
                // No deployment: everything at once (destructive updates were made by
                // `one_name`).
                for alloc in changes.in_place {
                    self.update_in_place(job, alloc, None);
                }
                for (name, previous) in changes.places {
                    self.placements.push(Placement::new(group, name, previous));
                }
            }
        }
    }

    /// A group's changes through its deployment: created if this version needs one, then
    /// in-place updates, placements as the deployment allows, canaries, and destructive
    /// updates within its limit.
    #[allow(clippy::too_many_arguments)]
    fn roll_out(
        &mut self,
        job: &'a Job,
        group: &'a TaskGroup,
        strategy: &UpdateStrategy,
        mine: &[&Allocation],
        waiting: &BTreeSet<String>,
        changes: NameChanges<'a>,
        new_id: &mut dyn FnMut() -> String,
    ) {
        let NameChanges {
            places,
            mut destructive,
            in_place,
        } = changes;
        let had_current = mine.iter().any(|alloc| alloc.job_version == job.version);
        let updating = !destructive.is_empty() || !in_place.is_empty();
        let dstate = self
            .rollout
            .group(self.state, job, group, had_current, updating, new_id);
        if !destructive.is_empty() && strategy.canary > 0 && dstate.as_ref().is_some_and(|state| !state.promoted) {
            self.rollout.want_canaries(&group.name, strategy.canary);
        }
        let live: Vec<&Allocation> = mine.iter().copied().filter(|alloc| !alloc.terminal()).collect();
        let allowance = self
            .rollout
            .allowance(&group.name, strategy, &live, waiting.len() as u32);
        let deployment_id = self.rollout.placing_into(&group.name).map(String::from);
        for alloc in in_place {
            self.update_in_place(job, alloc, deployment_id.as_deref());
            self.rollout.busy(&group.name);
        }
        for (name, previous) in places {
            if allowance.place_new || previous.is_some() {
                self.placements.push(Placement::new(group, name, previous));
                self.rollout.busy(&group.name);
            }
        }
        destructive.sort_by_key(|alloc| (alloc.index(), alloc.id.clone()));
        let canaried: BTreeSet<&str> = mine
            .iter()
            .filter(|alloc| waiting.contains(&alloc.id))
            .map(|alloc| alloc.name.as_str())
            .collect();
        let canary_names: Vec<String> = destructive
            .iter()
            .map(|alloc| alloc.name.clone())
            .filter(|name| !canaried.contains(name.as_str()))
            .take(allowance.canaries as usize)
            .collect();
        for name in canary_names {
            let mut placement = Placement::new(group, name, None);
            placement.canary = true;
            self.placements.push(placement);
            self.rollout.busy(&group.name);
        }
        for alloc in destructive.into_iter().take(allowance.limit) {
            self.stop(alloc, ALLOC_UPDATING, false);
            self.placements
                .push(Placement::new(group, alloc.name.clone(), Some(alloc.id.clone())));
            self.rollout.busy(&group.name);
        }
        if allowance.limit == 0 && updating {
            // Waiting on health, a promotion or an operator: not done.
            self.rollout.busy(&group.name);
        }
    }

    /// The group's canaries the servers still run that are not (yet) the allocations of their
    /// names: those of the current deployment that await promotion (kept beside the
    /// allocations they will replace), and those of an older deployment or of a failed one,
    /// never promoted, which are stopped.
    fn sort_canaries(&mut self, group: &TaskGroup, mine: &[&Allocation]) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut waiting, mut stopped) = (BTreeSet::new(), BTreeSet::new());
        let current = self.rollout.deployment.clone();
        // A canary that failed still stands beside the allocation it would replace (never in
        // its place) until its deployment is promoted or stopped.
        for alloc in mine
            .iter()
            .filter(|alloc| alloc.is_canary() && !alloc.server_terminal())
        {
            let promoted = |deployment: &crate::structs::Deployment| {
                deployment
                    .task_groups
                    .get(&group.name)
                    .is_some_and(|state| state.promoted)
            };
            match &current {
                Some(deployment) if deployment.id == alloc.deployment_id => {
                    if promoted(deployment) {
                        continue;
                    }
                    if self.rollout.failed() {
                        self.stop(alloc, ALLOC_NOT_NEEDED, false);
                        stopped.insert(alloc.id.clone());
                    } else {
                        waiting.insert(alloc.id.clone());
                    }
                }
                _ => {
                    let theirs = self.state.deployment(&alloc.deployment_id);
                    if theirs.is_none_or(|deployment| !promoted(deployment)) {
                        self.stop(alloc, ALLOC_NOT_NEEDED, false);
                        stopped.insert(alloc.id.clone());
                    }
                }
            }
        }
        (waiting, stopped)
    }

    /// Moves a running allocation to the job's version without a restart, into the
    /// deployment (if any), whose health it then has to earn again.
    fn update_in_place(&mut self, job: &Job, alloc: &Allocation, deployment_id: Option<&str>) {
        let mut updated = alloc.clone();
        updated.job_version = job.version;
        let deployment_id = deployment_id.unwrap_or_default();
        if updated.deployment_id != deployment_id {
            updated.deployment_id = deployment_id.to_string();
            updated.deployment_status = None;
        }
        self.plan.allocs.push(updated);
    }

    /// One allocation name of a service or batch group: whether to place one (replacing
    /// `previous`, if any), to update what runs (destructively: made here unless `defer`red
    /// to a deployment; or in place), or to keep it. Failed allocations of `failed_deployment`
    /// are not rescheduled.
    fn one_name(
        &mut self,
        job: &Job,
        history: &[&'a Allocation],
        defer: bool,
        failed_deployment: Option<&str>,
    ) -> Decision<'a> {
        let mut live: Vec<&'a Allocation> = history
            .iter()
            .copied()
            .filter(|alloc| !alloc.server_terminal())
            .collect();
        live.sort_by_key(|alloc| (core::cmp::Reverse(alloc.create_index), alloc.id.clone()));
        // Duplicates (two live allocations of one name): keep the newest.
        for extra in live.iter().skip(1) {
            if !extra.client_terminal() {
                self.stop(extra, ALLOC_NOT_NEEDED, false);
            }
        }
        let done_at_this_version = |alloc: &Allocation| {
            job.job_type == JobType::Batch
                && alloc.client_status == ClientStatus::Complete
                && alloc.job_version == job.version
        };
        match live.first().copied() {
            // Nothing live. A batch allocation that completed at this version is done;
            // anything else is (re)placed.
            None if history.iter().any(|alloc| done_at_this_version(alloc)) => Decision::Keep,
            None => {
                let newest = history.iter().copied().max_by_key(|alloc| alloc.create_index);
                match newest.and_then(|alloc| self.lost_wait(job, alloc).map(|wait| (alloc, wait))) {
                    Some((_, wait)) => {
                        self.wait_for_disconnect(wait);
                        Decision::Keep
                    }
                    // The replacement of one that waited for its client replaces it.
                    None => Decision::Place(
                        newest
                            .filter(|alloc| {
                                alloc.client_status == ClientStatus::Lost && self.waits_for_disconnect(job, alloc)
                            })
                            .map(|alloc| alloc.id.clone()),
                    ),
                }
            }
            Some(alloc) if !alloc.client_terminal() && self.node_down(alloc) => {
                self.stop(alloc, ALLOC_LOST, true);
                let after = job
                    .task_groups
                    .iter()
                    .find(|group| group.name == alloc.task_group)
                    .and_then(|group| group.stop_after_client_disconnect);
                match after {
                    // Its client may still run it: replaced once that client has stopped it.
                    Some(after) => {
                        self.wait_for_disconnect(after);
                        Decision::Keep
                    }
                    None => Decision::Place(Some(alloc.id.clone())),
                }
            }
            Some(alloc) if alloc.desired_transition.migrate && !alloc.client_terminal() => {
                // A drain moves it: the replacement goes to an eligible node and takes its
                // volumes over once it has stopped.
                self.stop(alloc, ALLOC_MIGRATING, false);
                Decision::Place(Some(alloc.id.clone()))
            }
            Some(alloc) if alloc.job_version < job.version && !alloc.client_terminal() => {
                let before = self.state.job_version(&job.namespace, &job.id, alloc.job_version);
                if before.is_some_and(|before| rollout::in_place(before, job, &alloc.task_group)) {
                    return Decision::InPlace(alloc);
                }
                if defer {
                    return Decision::Destructive(alloc);
                }
                self.stop(alloc, ALLOC_UPDATING, false);
                Decision::Place(Some(alloc.id.clone()))
            }
            Some(alloc) if alloc.client_terminal() && done_at_this_version(alloc) => Decision::Keep,
            Some(alloc) if alloc.client_status == ClientStatus::Failed && alloc.job_version == job.version => {
                // Failed: placed again once its reschedule delay has passed (the worker
                // evaluates it then), never when its policy has run out, nor when its
                // deployment failed.
                if failed_deployment.is_some_and(|id| id == alloc.deployment_id) || !self.reschedule_due(job, alloc) {
                    return Decision::Keep;
                }
                self.stop(alloc, ALLOC_RESCHEDULED, false);
                Decision::Place(Some(alloc.id.clone()))
            }
            Some(alloc) if alloc.client_terminal() => {
                // Lost, a service that exited, or failed at an older version: replace it.
                self.stop(alloc, ALLOC_NOT_NEEDED, false);
                Decision::Place(Some(alloc.id.clone()))
            }
            Some(_) => Decision::Keep,
        }
    }

    /// Whether a failed allocation is to be placed again now: its policy allows another
    /// attempt, and this is the evaluation made for it or its delay has passed in cluster time.
    fn reschedule_due(&self, job: &Job, alloc: &Allocation) -> bool {
        let Some(delay) = reschedule::delay(self.state, alloc, job) else {
            return false;
        };
        let due_ms = alloc.modify_time_ms.saturating_add(delay.as_millis() as u64);
        self.rescheduling || self.state.last_applied_time_ms() >= due_ms
    }

    /// Places every decided placement on the best feasible node, and finishes the plan with
    /// the processed evaluation (and a blocked one for what could not be placed).
    pub(super) fn place(mut self, job: Option<&Job>, eval: &Evaluation, new_id: &mut dyn FnMut() -> String) -> Plan {
        let state = self.state;
        self.rollout.finish();
        if self.rollout.changed {
            self.plan.deployment = self.rollout.deployment.clone();
        }
        self.plan.deployment_updates = core::mem::take(&mut self.rollout.updates);
        let mut processed = eval.clone();
        processed.status = EvalStatus::Complete;
        processed.status_description.clear();
        processed.failed_tg_allocs.clear();
        processed.queued_allocations.clear();
        let Some(job) = job else {
            self.plan.evals.push(processed);
            return self.plan;
        };
        // Follow-up evaluations: the rest of a system job's rollout after its stagger, and the
        // replacement of a lost allocation once its client has stopped it.
        let follow_ups = [
            (self.rolling_wait, EvalTrigger::RollingUpdate),
            (self.disconnect_wait, crate::structs::EvalTrigger::AllocFailure),
        ];
        for (wait, triggered_by) in follow_ups {
            let Some(wait) = wait else { continue };
            let next = Evaluation {
                id: new_id(),
                namespace: eval.namespace.clone(),
                priority: eval.priority,
                eval_type: eval.eval_type,
                triggered_by,
                job_id: eval.job_id.clone(),
                job_modify_index: job.job_modify_index,
                status: EvalStatus::Pending,
                previous_eval: eval.id.clone(),
                wait_ms: wait.as_millis() as u64,
                ..Evaluation::default()
            };
            processed.next_eval = next.id.clone();
            self.plan.evals.push(next);
        }
        let mut failed: BTreeMap<String, AllocMetric> = BTreeMap::new();
        for placement in core::mem::take(&mut self.placements) {
            let mut ask = group_resources(placement.group);
            let (chosen, metric) = select_node(state, job, placement.group, &placement, &ask, &self.usage, &self.plan);
            match chosen {
                Some(node_id) => {
                    debug_assert!(
                        state
                            .node(&node_id)
                            .is_some_and(|node| node.status == crate::structs::NodeStatus::Ready && node.eligible()),
                        "placed {} on {node_id}, which is not ready and eligible",
                        placement.name
                    );
                    let id = new_id();
                    let entry = self.usage.entry(node_id.clone()).or_default();
                    if let Some(node) = state.node(&node_id) {
                        // `ports::fit` passed a moment ago with the same usage, so this succeeds
                        // (`fit_agrees_with_assign` holds the two together).
                        let assigned = ports::assign(node, &entry.ports, &entry.releasing, placement.group, &id);
                        debug_assert!(assigned.is_ok(), "fit and assign disagree on {node_id}: {assigned:?}");
                        let assigned = assigned.unwrap_or_default();
                        entry.ports.extend(assigned.host_ports());
                        ask.ports = assigned.shared;
                        ask.task_ports = assigned.tasks;
                        // `select_node` found enough free cores with the same usage.
                        let reserved = super::cores::assign(node, &entry.cores, placement.group);
                        debug_assert!(reserved.is_some(), "too few free cores on {node_id}");
                        let reserved = reserved.unwrap_or_default();
                        let count: u32 = reserved.values().map(|cores| cores.len() as u32).sum();
                        ask.cpu += u64::from(count) * node.mhz_per_core();
                        entry.cores.extend(reserved.values().flatten());
                        ask.task_cores = reserved;
                    }
                    entry.cpu += ask.cpu;
                    entry.memory_mb += ask.memory_mb;
                    entry.disk_mb += ask.disk_mb;
                    self.plan.allocs.push(Allocation {
                        id,
                        namespace: job.namespace.clone(),
                        eval_id: eval.id.clone(),
                        name: placement.name,
                        node_id,
                        job_id: job.id.clone(),
                        task_group: placement.group.name.clone(),
                        previous_allocation: placement.previous,
                        job_version: job.version,
                        deployment_id: self
                            .rollout
                            .placing_into(&placement.group.name)
                            .unwrap_or_default()
                            .to_string(),
                        deployment_status: placement.canary.then(|| crate::structs::AllocDeploymentStatus {
                            canary: true,
                            ..Default::default()
                        }),
                        resources: ask,
                        metrics: Some(metric),
                        ..Allocation::default()
                    });
                }
                None => {
                    *processed
                        .queued_allocations
                        .entry(placement.group.name.clone())
                        .or_default() += 1;
                    failed
                        .entry(placement.group.name.clone())
                        .and_modify(|known| known.coalesced_failures += 1)
                        .or_insert(metric);
                }
            }
        }
        if failed.is_empty() {
            self.plan.evals.push(processed);
            return self.plan;
        }
        processed.failed_tg_allocs = failed;
        if eval.triggered_by == crate::structs::EvalTrigger::QueuedAllocs {
            // A retried blocked evaluation that still cannot place everything blocks again
            // itself (no new evaluation per retry).
            processed.status = EvalStatus::Blocked;
            processed.status_description = "created to place remaining allocations".into();
            processed.snapshot_index = state.last_applied().unwrap_or(0);
            self.plan.evals.push(processed);
            return self.plan;
        }
        let blocked = Evaluation {
            id: new_id(),
            namespace: eval.namespace.clone(),
            priority: eval.priority,
            eval_type: eval.eval_type,
            triggered_by: crate::structs::EvalTrigger::QueuedAllocs,
            job_id: eval.job_id.clone(),
            job_modify_index: job.job_modify_index,
            status: EvalStatus::Blocked,
            status_description: "created to place remaining allocations".into(),
            queued_allocations: processed.queued_allocations.clone(),
            failed_tg_allocs: processed.failed_tg_allocs.clone(),
            previous_eval: eval.id.clone(),
            snapshot_index: state.last_applied().unwrap_or(0),
            ..Evaluation::default()
        };
        processed.blocked_eval = blocked.id.clone();
        self.plan.evals.push(processed);
        self.plan.evals.push(blocked);
        self.plan
    }
}
