//! The scheduler: turns one evaluation into a plan — allocations to place, allocations to
//! stop — from the state store alone (a pure function of the state and the evaluation; ids
//! come from the caller's seeded generator).
//!
//! - Service and batch jobs: `count` allocations per task group, named `job.group[i]`. A
//!   live allocation of an older job version is replaced (stopped, and its successor placed
//!   with `previous_allocation` pointing at it so volumes are handed over); a lost or failed
//!   one is replaced; extra ones are stopped. A batch allocation that completed stays done.
//! - System jobs: one allocation per task group on every feasible node.
//! - Feasibility (§3.9): node ready and in the job's datacenters, every driver detected and
//!   healthy, host volumes present, CSI volumes and plugins as Nomad's `CSIVolumeChecker`
//!   (with its filter reasons). Then bin-packing on CPU and memory: the feasible node that is
//!   fullest after the placement wins (ties by node id), so the outcome is deterministic.
//! - What could not be placed is recorded on the evaluation (`failed_tg_allocs`, with the
//!   filter reasons and exhausted dimensions) and a blocked evaluation is created to retry it.

pub mod constraints;
pub mod cores;
pub mod dry_run;
pub mod ports;
mod reconcile;
pub mod reschedule;
mod rollout;
mod spread;
pub mod worker;

use reconcile::Reconcile;

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};

use crate::fsm::ServerState;
use crate::structs::{
    AllocMetric, AllocatedResources, Allocation, ClientStatus, CsiVolume, DISTINCT_HOSTS, DISTINCT_PROPERTY,
    DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, NodeStatus, TaskGroup, VolumeType,
};

/// Nomad's desired-status descriptions.
pub const ALLOC_NOT_NEEDED: &str = "alloc not needed due to job update";
pub const ALLOC_UPDATING: &str = "alloc is being updated due to job update";
pub const ALLOC_LOST: &str = "alloc is lost since its node is down";
pub const ALLOC_NODE_INELIGIBLE: &str = "alloc not needed as node is tainted";
pub const ALLOC_MIGRATING: &str = "alloc is being migrated";

/// The outcome of one evaluation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// New allocations, and existing ones with a new desired (or lost client) status.
    pub allocs: Vec<Allocation>,
    /// The evaluation as processed, plus a blocked one when something could not be placed.
    pub evals: Vec<Evaluation>,
    /// The job's deployment, created or with changed counts.
    pub deployment: Option<crate::structs::Deployment>,
    /// Deployments cancelled or completed.
    pub deployment_updates: Vec<crate::structs::DeploymentStatusUpdate>,
}

impl Plan {
    pub fn placed(&self) -> impl Iterator<Item = &Allocation> {
        self.allocs.iter().filter(|alloc| alloc.create_index == 0)
    }
}

/// One allocation to place: its name, group, and the allocation it replaces.
struct Placement<'a> {
    group: &'a TaskGroup,
    name: String,
    previous: Option<String>,
    /// System jobs: the node it must go to.
    node: Option<String>,
    /// A canary of the job's deployment.
    canary: bool,
}

impl<'a> Placement<'a> {
    fn new(group: &'a TaskGroup, name: String, previous: Option<String>) -> Self {
        Placement {
            group,
            name,
            previous,
            node: None,
            canary: false,
        }
    }
}

/// Usage of one node: what live allocations hold, adjusted by the plan so far.
#[derive(Clone, Debug, Default)]
struct Usage {
    cpu: u64,
    memory_mb: u64,
    disk_mb: u64,
    ports: BTreeSet<u16>,
    /// Ports of allocations told to stop whose tasks may still hold them (until their client
    /// reports them finished): a dynamic pick avoids them while it can.
    releasing: BTreeSet<u16>,
    /// Cores reserved by tasks asking for `cores`.
    cores: BTreeSet<u32>,
}

/// The CPU and memory `group` asks for (its ports are assigned per node, [`ports::assign`]).
pub fn group_resources(group: &TaskGroup) -> AllocatedResources {
    let mut sum = AllocatedResources::default();
    for task in &group.tasks {
        sum.cpu += u64::from(task.resources.cpu);
        sum.memory_mb += u64::from(task.resources.memory_mb);
    }
    sum.disk_mb = group.ephemeral_disk.map_or(0, |disk| disk.size_mb);
    sum
}

fn alloc_name(job: &Job, group: &TaskGroup, index: u32) -> String {
    format!("{}.{}[{index}]", job.id, group.name)
}

/// Whether the scheduler owns the job's allocations: jobs written through `Job.Register`
/// (which stamps `job_modify_index`). A job stored with the raw `JobUpsert` command — tests
/// and the simulation's workloads placing allocations themselves — is left alone.
pub fn is_scheduled(job: &Job) -> bool {
    job.job_modify_index > 0
}

/// Computes the plan for `eval` under the default job limits. `new_id` hands out allocation
/// and evaluation ids.
pub fn schedule(state: &ServerState, eval: &Evaluation, new_id: &mut dyn FnMut() -> String) -> Plan {
    schedule_within(state, eval, new_id, &crate::jobspec::limits::JobLimits::default())
}

/// Computes the plan for `eval`, scheduling no more groups or allocations per group than
/// `limits` allow (validation refuses more; a job stored under higher limits is cut to them).
pub fn schedule_within(
    state: &ServerState,
    eval: &Evaluation,
    new_id: &mut dyn FnMut() -> String,
    limits: &crate::jobspec::limits::JobLimits,
) -> Plan {
    schedule_with_faults(state, eval, new_id, limits, Default::default())
}

/// [`schedule_within`], with a scheduler defect re-created on purpose (a regression switch).
pub fn schedule_with_faults(
    state: &ServerState,
    eval: &Evaluation,
    new_id: &mut dyn FnMut() -> String,
    limits: &crate::jobspec::limits::JobLimits,
    faults: crate::config::SchedulerFaults,
) -> Plan {
    let stored = state.job(&eval.namespace, &eval.job_id);
    if stored.is_some_and(|job| !is_scheduled(job)) {
        let mut processed = eval.clone();
        processed.status = EvalStatus::Complete;
        processed.status_description = "job is not managed by the scheduler".into();
        return Plan {
            evals: vec![processed],
            ..Plan::default()
        };
    }
    // A periodic parent only launches children: nothing of its own is placed.
    let job = stored.filter(|job| !job.stop && !job.is_launcher());
    let allocs: Vec<&Allocation> = state.job_allocs(&eval.namespace, &eval.job_id).collect();
    let mut reconcile = Reconcile::new(state, eval.triggered_by == crate::structs::EvalTrigger::AllocFailure);
    reconcile.group_count_max = limits.group_count;
    reconcile.rollout = rollout::Rollout::start(state, &eval.namespace, &eval.job_id, job);
    reconcile.rollout.ignore_max_parallel = faults.ignore_max_parallel;
    // A purged job's allocations that still run when a job of the same ID is registered
    // again are no one's: stopped, never adopted by the new job.
    let orphans: Vec<&Allocation> = state
        .allocs()
        .filter(|alloc| alloc.namespace == eval.namespace && alloc.job_id == eval.job_id)
        .filter(|alloc| !allocs.iter().any(|ours| ours.id == alloc.id))
        .collect();
    reconcile.lose_stopped_on_down_nodes(&orphans);
    for orphan in orphans.iter().filter(|alloc| !alloc.terminal()) {
        reconcile.stop(orphan, ALLOC_NOT_NEEDED, false);
    }
    reconcile.lose_stopped_on_down_nodes(&allocs);
    match job {
        None => {
            for alloc in allocs.iter().filter(|alloc| !alloc.terminal()) {
                reconcile.stop(alloc, ALLOC_NOT_NEEDED, false);
            }
        }
        // Validation refuses more groups; a job stored before the limit is scheduled up to it
        // (groups past it are not scheduled).
        Some(job) if job.job_type == JobType::System => {
            for group in job.task_groups.iter().take(limits.groups) {
                reconcile.system_group(job, group, &allocs);
            }
        }
        Some(job) => {
            for group in job.task_groups.iter().take(limits.groups) {
                reconcile.service_group(job, group, &allocs, new_id);
            }
        }
    }
    reconcile.place(job, eval, new_id)
}

/// What live allocations (placed, not stopped, not finished) hold on each node.
fn node_usage(state: &ServerState) -> BTreeMap<String, Usage> {
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    // A lost allocation's tasks may still run on a node that was only cut off: until the
    // client comes back and stops them, its ports are being released too.
    let maybe_running = |alloc: &&Allocation| !alloc.client_terminal() || alloc.client_status == ClientStatus::Lost;
    for alloc in state.allocs().filter(maybe_running) {
        let entry = usage.entry(alloc.node_id.clone()).or_default();
        if alloc.terminal() {
            entry.releasing.extend(alloc.resources.host_ports());
            continue;
        }
        entry.cpu += alloc.resources.cpu;
        entry.memory_mb += alloc.resources.memory_mb;
        entry.disk_mb += alloc.resources.disk_mb;
        entry.ports.extend(alloc.resources.host_ports());
        entry.cores.extend(alloc.resources.task_cores.values().flatten());
    }
    usage
}

/// Filters every node (recording why each one was filtered), then bin-packs: the feasible
/// node with the highest utilisation after the placement wins.
fn select_node(
    state: &ServerState,
    job: &Job,
    group: &TaskGroup,
    placement: &Placement<'_>,
    ask: &AllocatedResources,
    usage: &BTreeMap<String, Usage>,
    plan: &Plan,
) -> (Option<String>, AllocMetric) {
    let mut metric = AllocMetric::default();
    let mut best: Option<(i64, String)> = None;
    let affinities: Vec<_> = job
        .affinities
        .iter()
        .chain(&group.affinities)
        .chain(group.tasks.iter().flat_map(|task| &task.affinities))
        .collect();
    let spreads: Vec<_> = job.spreads.iter().chain(&group.spreads).collect();
    let placed = if spreads.is_empty() {
        Vec::new()
    } else {
        placed_nodes(state, job, Some(group.name.as_str()), plan)
    };
    for node in state.nodes() {
        if placement.node.as_ref().is_some_and(|wanted| *wanted != node.id) {
            continue;
        }
        if node.status != NodeStatus::Ready || !node.eligible() || !job.runs_in(&node.datacenter) {
            // Not a candidate at all (Nomad does not count these as evaluated).
            continue;
        }
        metric.nodes_evaluated += 1;
        *metric.nodes_available.entry(node.datacenter.clone()).or_default() += 1;
        if let Err(reason) = feasible(state, job, group, placement, node, plan) {
            metric.nodes_filtered += 1;
            *metric.constraint_filtered.entry(reason).or_default() += 1;
            continue;
        }
        let idle = Usage::default();
        let used = usage.get(&node.id).unwrap_or(&idle);
        // Reserved cores count as their share of the node's MHz.
        let asked_cores = cores::asked(group);
        let cpu_after = used.cpu + ask.cpu + u64::from(asked_cores) * node.mhz_per_core();
        let memory_after = used.memory_mb + ask.memory_mb;
        // Nomad checks the network first, then CPU and memory.
        let mut exhausted = ports::fit(node, &used.ports, group).err();
        if exhausted.is_none() && asked_cores > cores::free(node, &used.cores) {
            exhausted = Some("cores".into());
        } else if exhausted.is_none() && node.resources.cpu > 0 && cpu_after > node.resources.cpu {
            exhausted = Some("cpu".into());
        } else if exhausted.is_none() && node.resources.memory_mb > 0 && memory_after > node.resources.memory_mb {
            exhausted = Some("memory".into());
        } else if exhausted.is_none()
            && ask.disk_mb > 0
            && node.resources.disk_mb > 0
            && used.disk_mb + ask.disk_mb > node.resources.disk_mb
        {
            exhausted = Some("disk".into());
        }
        if let Some(dimension) = exhausted {
            metric.nodes_exhausted += 1;
            *metric.dimension_exhausted.entry(dimension).or_default() += 1;
            continue;
        }
        // Fullest after placement first: utilisation in parts per million, summed.
        let share = |used: u64, total: u64| used.saturating_mul(1_000_000).checked_div(total).unwrap_or(0);
        let binpack = share(cpu_after, node.resources.cpu) + share(memory_after, node.resources.memory_mb);
        // Affinities weigh as much as bin-packing (Nomad averages the two scores): a full
        // match adds what a full node scores, a full anti-match subtracts it.
        let affinity = (constraints::affinity_score(&affinities, node) * 2_000_000.0) as i64;
        // Spreads weigh as affinities do.
        let spread = (spread::score(&spreads, group, node, &placed) * 2_000_000.0) as i64;
        let score = binpack as i64 + affinity + spread;
        let better = match &best {
            None => true,
            Some((best_score, best_id)) => score > *best_score || (score == *best_score && node.id < *best_id),
        };
        if better {
            best = Some((score, node.id.clone()));
        }
    }
    (best.map(|(_, id)| id), metric)
}

/// Whether `node` can run `group`: drivers, host volumes and the CSI checks, with Nomad's
/// filter reasons.
fn feasible(
    state: &ServerState,
    job: &Job,
    group: &TaskGroup,
    placement: &Placement<'_>,
    node: &Node,
    plan: &Plan,
) -> Result<(), String> {
    drivers_and_host_volumes(group, node)?;
    constraints_hold(state, job, group, node, plan)?;
    let index = placement
        .name
        .rsplit_once('[')
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .and_then(|index| index.parse().ok())
        .unwrap_or(0);
    let claimed_per_plugin = claimed_per_plugin(state, node);
    for request in group
        .volumes
        .values()
        .filter(|request| request.volume_type == VolumeType::Csi)
    {
        let source = request.source_for(index);
        let Some(volume) = state.volume(&job.namespace, &source) else {
            return Err(format!("missing CSI volume(s) {source}"));
        };
        csi_plugin_feasible(&volume, node, &claimed_per_plugin)?;
        csi_claims_feasible(state, job, plan, &volume, &source, request.read_only)?;
    }
    Ok(())
}

/// The job's, group's and tasks' constraints on `node`; the first that fails is the filter
/// reason (Nomad's `Constraint.String()`, or `distinct_hosts` / `distinct_property: <attr>`).
fn constraints_hold(state: &ServerState, job: &Job, group: &TaskGroup, node: &Node, plan: &Plan) -> Result<(), String> {
    let task_level = group.tasks.iter().flat_map(|task| &task.constraints);
    let scoped = job.constraints.iter().map(|constraint| (constraint, None)).chain(
        group
            .constraints
            .iter()
            .chain(task_level)
            .map(|constraint| (constraint, Some(group.name.as_str()))),
    );
    for (constraint, group_scope) in scoped {
        if !constraints::node_satisfies(constraint, node) {
            return Err(constraint.to_string());
        }
        if matches!(constraint.operand.as_str(), DISTINCT_HOSTS | DISTINCT_PROPERTY) {
            let placed = placed_nodes(state, job, group_scope, plan);
            constraints::distinct_ok(constraint, node, &placed)?;
        }
    }
    Ok(())
}

/// The nodes of the job's (or one group's) live allocations, counting the plan so far: what
/// it places, not what it stops.
fn placed_nodes<'a>(state: &'a ServerState, job: &Job, group: Option<&str>, plan: &Plan) -> Vec<&'a Node> {
    let ours = |alloc: &Allocation| {
        alloc.namespace == job.namespace && alloc.job_id == job.id && group.is_none_or(|name| alloc.task_group == name)
    };
    let stopping = |alloc: &Allocation| {
        plan.allocs
            .iter()
            .any(|planned| planned.id == alloc.id && planned.desired_status != DesiredStatus::Run)
    };
    state
        .allocs()
        .filter(|alloc| ours(alloc) && !alloc.terminal() && !stopping(alloc))
        .chain(plan.placed().filter(|alloc| ours(alloc)))
        .filter_map(|alloc| state.node(&alloc.node_id))
        .collect()
}

/// Every task's driver detected and healthy; every host volume present and writable when asked.
fn drivers_and_host_volumes(group: &TaskGroup, node: &Node) -> Result<(), String> {
    for task in &group.tasks {
        let usable = node
            .drivers
            .get(&task.driver)
            .is_some_and(|driver| driver.detected && driver.healthy);
        if !usable {
            return Err("missing drivers".into());
        }
    }
    for request in group
        .volumes
        .values()
        .filter(|request| request.volume_type == VolumeType::Host)
    {
        match node.host_volumes.get(&request.source) {
            Some(volume) if !volume.read_only || request.read_only => {}
            _ => return Err("missing compatible host volumes".into()),
        }
    }
    Ok(())
}

/// Volumes with a live claim on `node`, per plugin (for `MaxVolumes`).
fn claimed_per_plugin(state: &ServerState, node: &Node) -> BTreeMap<String, u64> {
    let mut claimed: BTreeMap<String, u64> = BTreeMap::new();
    for (namespace, id) in state.volumes_on_node(&node.id) {
        if let Some(volume) = state.volume_raw(&namespace, &id) {
            let live = volume
                .read_claims
                .values()
                .chain(volume.write_claims.values())
                .any(|claim| claim.node_id == node.id);
            if live {
                *claimed.entry(volume.plugin_id.clone()).or_default() += 1;
            }
        }
    }
    claimed
}

/// The volume's node plugin on `node`: present, healthy, under its volume limit, and meeting
/// the volume's topology.
fn csi_plugin_feasible(
    volume: &CsiVolume,
    node: &Node,
    claimed_per_plugin: &BTreeMap<String, u64>,
) -> Result<(), String> {
    let Some(plugin) = node.csi_node_plugins.get(&volume.plugin_id) else {
        return Err(format!(
            "CSI plugin {} is missing from client {}",
            volume.plugin_id, node.id
        ));
    };
    if !plugin.healthy {
        return Err(format!(
            "CSI plugin {} is unhealthy on client {}",
            volume.plugin_id, node.id
        ));
    }
    if let Some(info) = &plugin.node_info
        && info.max_volumes > 0
        && claimed_per_plugin.get(&volume.plugin_id).copied().unwrap_or(0) >= info.max_volumes
    {
        return Err(format!(
            "CSI plugin {} has the maximum number of volumes on client {}",
            volume.plugin_id, node.id
        ));
    }
    if !volume.topologies.is_empty() {
        let accessible = plugin
            .node_info
            .as_ref()
            .and_then(|info| info.accessible_topology.as_ref());
        let meets = accessible.is_some_and(|node_topology| {
            volume.topologies.iter().any(|topology| {
                topology
                    .segments
                    .iter()
                    .all(|(key, value)| node_topology.segments.get(key) == Some(value))
            })
        });
        if !meets {
            return Err("did not meet topology requirement".into());
        }
    }
    Ok(())
}

/// Whether the volume has a claim of the kind asked for free. Writers of the same job do not
/// block (an update places the replacement and its claim waits for the old allocation), nor do
/// writers this plan stops.
fn csi_claims_feasible(
    state: &ServerState,
    job: &Job,
    plan: &Plan,
    volume: &CsiVolume,
    source: &str,
    read_only: bool,
) -> Result<(), String> {
    if read_only {
        if !volume.read_schedulable() || !volume.has_free_read_claims() {
            return Err(format!(
                "CSI volume {source} is unschedulable or has exhausted its available reader claims"
            ));
        }
        return Ok(());
    }
    if !volume.write_schedulable() {
        return Err(format!("CSI volume {source} is unschedulable or is read-only"));
    }
    if volume.has_free_write_claims() {
        return Ok(());
    }
    for writer in volume.write_claims.keys() {
        let stopping = plan
            .allocs
            .iter()
            .any(|alloc| alloc.id == *writer && alloc.desired_status != DesiredStatus::Run);
        match state.alloc(writer) {
            None => {
                return Err(format!(
                    "CSI volume {source} has exhausted its available writer claims and is claimed by a garbage collected allocation {writer}; waiting for claim to be released"
                ));
            }
            Some(holder) if holder.namespace == job.namespace && holder.job_id == job.id => {}
            Some(_) if stopping => {}
            Some(_) => {
                return Err(format!("CSI volume {source} has exhausted its available writer claims"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
