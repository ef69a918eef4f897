//! The leader's scheduler worker: one evaluation at a time, from the state store.
//!
//! Each step it does the first of these that applies, then waits for that proposal to be
//! applied before the next (so every plan is computed from a state that already holds the
//! previous one — no two plans ever race for the same node):
//! 1. nodes that changed status or eligibility (or appeared, or vanished) since last seen get `node-update`
//!    evaluations for the jobs with allocations on them and for every system job;
//! 2. jobs with a failed allocation whose reschedule delay has passed get an `alloc-failure`
//!    evaluation ([`super::reschedule`]; a timer is set for the next one);
//! 3. the oldest pending evaluation is scheduled and its plan proposed (older blocked
//!    evaluations of the same job are canceled with it);
//! 4. blocked evaluations are made pending again once nodes, allocations, volumes or plugins
//!    changed after they blocked (at most once a second).
//!
//! It runs on every input of the leader's core; a timer is set only for the rate limit and
//! reschedule delays.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::{BTreeMap, BTreeSet};
use core::time::Duration;

use rand_010::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::fsm::{Command, ServerState, Table};
use crate::structs::{EvalStatus, Evaluation, JobType, NodeStatus, SchedulingEligibility};
use crate::time::Instant;

/// The least time between two wake-ups of blocked evaluations.
pub const TICK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Worker {
    rng: ChaCha8Rng,
    enabled: bool,
    in_flight: bool,
    /// Node statuses and eligibility as last seen (`None` until seeded from the state on
    /// taking leadership).
    nodes_seen: Option<BTreeMap<String, (NodeStatus, SchedulingEligibility)>>,
    /// The nodes table's index when `nodes_seen` was taken: the nodes are compared again only
    /// after a node write, not on every input.
    nodes_seen_index: u64,
    last_unblock: Option<Instant>,
    /// Set only when blocked evaluations wait for the rate limit: every other change to the
    /// state reaches the leader's core as an input (a proposal's result, a request), and each
    /// input runs the worker — so an idle cluster costs no wake-ups.
    wake_at: Option<Instant>,
    reschedules: super::reschedule::Reschedules,
    /// Pending evaluations with a `wait` (a system job's next rolling batch), with when each
    /// becomes due on this leader's clock.
    delayed: BTreeMap<String, Instant>,
    limits: crate::jobspec::limits::JobLimits,
    faults: crate::config::SchedulerFaults,
}

impl Worker {
    pub fn new(seed: u64) -> Self {
        Worker {
            rng: ChaCha8Rng::seed_from_u64(seed),
            enabled: false,
            in_flight: false,
            nodes_seen: None,
            nodes_seen_index: 0,
            last_unblock: None,
            wake_at: None,
            reschedules: Default::default(),
            delayed: BTreeMap::new(),
            limits: Default::default(),
            faults: Default::default(),
        }
    }

    /// Schedules jobs within `limits` (the server's configured job limits).
    pub fn set_limits(&mut self, limits: crate::jobspec::limits::JobLimits) {
        self.limits = limits;
    }

    /// A scheduler defect re-created on purpose (a regression switch).
    pub fn set_faults(&mut self, faults: crate::config::SchedulerFaults) {
        self.faults = faults;
    }

    /// A fresh id in the UUID text form, from the seeded generator.
    pub fn new_id(&mut self) -> String {
        let high: u64 = self.rng.random();
        let low: u64 = self.rng.random();
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0xffff,
            low >> 48,
            low & 0xffff_ffff_ffff
        )
    }

    pub fn set_enabled(&mut self, now: Instant, enabled: bool) {
        self.enabled = enabled;
        self.in_flight = false;
        self.nodes_seen = None;
        self.reschedules.clear();
        self.delayed.clear();
        self.wake_at = enabled.then_some(now);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wake_at.filter(|_| self.enabled)
    }

    /// The previous proposal was applied (or failed): the next step may run.
    pub fn proposed(&mut self) {
        self.in_flight = false;
    }

    /// One step; returns the command to propose, if any.
    pub fn run(&mut self, now: Instant, state: &ServerState) -> Option<Command> {
        if !self.enabled {
            return None;
        }
        self.wake_at = None;
        if self.in_flight {
            return None;
        }
        let command = self
            .node_updates(state)
            .or_else(|| self.reschedule(now, state))
            .or_else(|| self.next_plan(now, state))
            .or_else(|| self.unblock(now, state));
        self.in_flight = command.is_some();
        command
    }

    fn node_updates(&mut self, state: &ServerState) -> Option<Command> {
        let nodes_index = state.table_index(Table::Nodes);
        if self.nodes_seen.is_some() && nodes_index == self.nodes_seen_index {
            return None;
        }
        self.nodes_seen_index = nodes_index;
        let current: BTreeMap<String, (NodeStatus, SchedulingEligibility)> = state
            .nodes()
            .map(|node| (node.id.clone(), (node.status, node.scheduling_eligibility)))
            .collect();
        let changed: BTreeSet<String> = match self.nodes_seen.replace(current.clone()) {
            Some(seen) => {
                let changed: BTreeSet<String> = current
                    .keys()
                    .chain(seen.keys())
                    .filter(|id| current.get(*id) != seen.get(*id))
                    .cloned()
                    .collect();
                if changed.is_empty() {
                    return None;
                }
                changed
            }
            // A new leader cannot know which node changes its predecessor evaluated: one
            // committed just before the old leader fell (or whose evaluations it failed to
            // propose) would otherwise never be. So it evaluates every system job, and every
            // job with allocations on a node that is not ready (found by the swarm, seed 273:
            // a node back from down under a leader that fell at once never got its plugin).
            None => state
                .nodes()
                .filter(|node| node.status != NodeStatus::Ready)
                .map(|node| node.id.clone())
                .collect(),
        };
        let evals = self.node_evals(state, &changed);
        if evals.is_empty() {
            return None;
        }
        Some(Command::EvalUpsert { evals })
    }

    /// `node-update` evaluations for `changed` nodes: one per job with a live allocation on
    /// one of them, and one per system job (Nomad's `createNodeEvals`).
    pub fn node_evals(&mut self, state: &ServerState, changed: &BTreeSet<String>) -> Vec<Evaluation> {
        let mut jobs: BTreeMap<(String, String), (JobType, crate::structs::EvalTrigger, String)> = BTreeMap::new();
        // In allocation id order, as a scan of the table would find them: the last one of a
        // job names the evaluation's node.
        let mut on_changed: Vec<&crate::structs::Allocation> = changed
            .iter()
            .flat_map(|node_id| state.allocs_on_node(node_id))
            .filter(|alloc| !alloc.client_terminal())
            .collect();
        on_changed.sort_by(|a, b| a.id.cmp(&b.id));
        for alloc in on_changed {
            if let Some(job) = state
                .job(&alloc.namespace, &alloc.job_id)
                .filter(|job| super::is_scheduled(job))
            {
                jobs.insert(
                    (job.namespace.clone(), job.id.clone()),
                    (
                        job.job_type,
                        crate::structs::EvalTrigger::NodeUpdate,
                        alloc.node_id.clone(),
                    ),
                );
            }
        }
        for job in state
            .jobs()
            .filter(|job| job.job_type == JobType::System && !job.stop && super::is_scheduled(job))
        {
            let node = changed.iter().next().map(|id| id.to_string()).unwrap_or_default();
            jobs.entry((job.namespace.clone(), job.id.clone())).or_insert((
                job.job_type,
                crate::structs::EvalTrigger::NodeUpdate,
                node,
            ));
        }
        jobs.into_iter()
            .map(|((namespace, job_id), (eval_type, trigger, node_id))| {
                let priority = state.job(&namespace, &job_id).map_or(50, |job| job.priority);
                Evaluation {
                    id: self.new_id(),
                    namespace,
                    priority,
                    eval_type,
                    triggered_by: trigger,
                    job_id,
                    node_id,
                    status: EvalStatus::Pending,
                    ..Evaluation::default()
                }
            })
            .collect()
    }

    /// `alloc-failure` evaluations for the jobs whose failed allocations are due to be placed
    /// again; a timer for the next one.
    fn reschedule(&mut self, now: Instant, state: &ServerState) -> Option<Command> {
        let (jobs, next) = self.reschedules.due_jobs(now, state);
        if let Some(next) = next {
            self.wake_at = Some(self.wake_at.map_or(next, |at| at.min(next)));
        }
        if jobs.is_empty() {
            return None;
        }
        let evals = jobs
            .into_iter()
            .filter_map(|(namespace, job_id)| {
                let job = state.job(&namespace, &job_id)?;
                Some(Evaluation {
                    id: self.new_id(),
                    namespace,
                    priority: job.priority,
                    eval_type: job.job_type,
                    triggered_by: crate::structs::EvalTrigger::AllocFailure,
                    job_id,
                    status: EvalStatus::Pending,
                    ..Evaluation::default()
                })
            })
            .collect();
        Some(Command::EvalUpsert { evals })
    }

    /// Whether a pending evaluation may be scheduled now: one with a `wait` is due that long
    /// after it was created, in cluster time, mapped onto this leader's clock when first seen
    /// (a new leader waits at most what is left of it).
    fn due(&mut self, now: Instant, state: &ServerState, eval: &Evaluation) -> bool {
        if eval.wait_ms == 0 {
            return true;
        }
        let due_ms = eval.create_time_ms.saturating_add(eval.wait_ms);
        let at = *self
            .delayed
            .entry(eval.id.clone())
            .or_insert_with(|| crate::time::cluster_time_at(now, due_ms, state.last_applied_time_ms()));
        if at > now {
            self.wake_at = Some(self.wake_at.map_or(at, |wake| wake.min(at)));
        }
        at <= now
    }

    fn next_plan(&mut self, now: Instant, state: &ServerState) -> Option<Command> {
        if !self.delayed.is_empty() {
            let pending: BTreeSet<&str> = state.pending_evals().map(|eval| eval.id.as_str()).collect();
            self.delayed.retain(|id, _| pending.contains(id.as_str()));
        }
        let eval = state.pending_evals().find(|eval| self.due(now, state, eval))?.clone();
        let (limits, faults) = (self.limits, self.faults);
        let plan = super::schedule_with_faults(state, &eval, &mut || self.new_id(), &limits, faults);
        let mut evals = plan.evals;
        let keep: BTreeSet<String> = evals.iter().map(|eval| eval.id.clone()).collect();
        // One blocked evaluation per job: the older ones are superseded.
        for older in state
            .job_evals(&eval.namespace, &eval.job_id)
            .filter(|other| other.status == EvalStatus::Blocked && !keep.contains(&other.id))
        {
            let mut canceled = older.clone();
            canceled.status = EvalStatus::Canceled;
            canceled.status_description = format!("superseded by evaluation {}", eval.id);
            evals.push(canceled);
        }
        Some(Command::PlanApply {
            allocs: plan.allocs,
            evals,
            deployment: plan.deployment,
            deployment_updates: plan.deployment_updates,
        })
    }

    fn unblock(&mut self, now: Instant, state: &ServerState) -> Option<Command> {
        let changed_at = [Table::Nodes, Table::Allocs, Table::CsiVolumes, Table::CsiPlugins]
            .into_iter()
            .map(|table| state.table_index(table))
            .max()
            .unwrap_or(0);
        let mut evals: Vec<Evaluation> = state
            .blocked_evals_before(changed_at)
            .map(|eval| {
                let mut pending = eval.clone();
                pending.status = EvalStatus::Pending;
                pending
            })
            .collect();
        // In the order of the blocked evaluations by job, as before the index by snapshot.
        evals.sort_by(|a, b| (&a.namespace, &a.job_id, &a.id).cmp(&(&b.namespace, &b.job_id, &b.id)));
        if evals.is_empty() {
            return None;
        }
        if let Some(at) = self.last_unblock.map(|last| last + TICK).filter(|at| now < *at) {
            self.wake_at = Some(self.wake_at.map_or(at, |wake| wake.min(at)));
            return None;
        }
        self.last_unblock = Some(now);
        Some(Command::EvalUpsert { evals })
    }
}
