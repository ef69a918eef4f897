//! Periodic jobs on the leader (Nomad's `nomad/periodic.go`): the dispatcher that launches a
//! child of each periodic parent at the times its cron spec names.
//!
//! It keeps nothing it could not read back: each parent's last launch is in the state store
//! (`fsm/periodic.rs`), written in the same entry as the child, so a new leader carries on
//! from exactly where the last one stopped. Times come from two seams:
//! - the leader's wall clock, read by the driver before every step
//!   ([`PeriodicDispatcher::set_wall_clock`]), because a cron spec names wall-clock times;
//! - a [`Calendar`] that answers "the first time after t the spec names", handed in like the
//!   seeded generator: cron parsing and time zones are pure arithmetic, done by a maintained
//!   crate outside this `no_std` crate.
//!
//! Rules, on every step while leading (one proposal at a time):
//! 1. a parent whose next time after its last launch has come is launched at that time;
//! 2. when several of its times came while no leader launched them (an election, a wall
//!    clock stepped forward), only the latest is launched and the others are counted as
//!    skipped in the entry, as Kubernetes' CronJob and Nomad's leader restore do: a job
//!    meant to run hourly never runs five times at once;
//! 3. with `prohibit_overlap`, a launch while a child still runs records the time without a
//!    child;
//! 4. a time at or before the recorded last launch is never launched again (the state
//!    machine refuses it too), so a wall clock stepped back launches nothing twice.

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::sync::Arc;
use core::fmt;
use core::time::Duration;

use crate::fsm::{Command, ServerState, Table};
use crate::structs::{EvalStatus, Evaluation, Job, PeriodicConfig};
use crate::time::Instant;

/// How many due times one step walks through to find the latest: past it (a clock stepped
/// days ahead of a per-second spec), the step launches the latest it found and the next step
/// walks on.
pub const CATCH_UP_STEPS: u32 = 10_000;

/// A wall-clock reading further than this from what the monotonic clock predicts is a clock
/// step: every parent is looked at again.
const WALL_STEP: Duration = Duration::from_secs(1);

/// Cron arithmetic: the first time strictly after `after_ms` (Unix milliseconds) that the
/// spec names, in its time zone. `None` when there is none (or the spec does not parse; the
/// register path refuses such specs).
pub trait Calendar: fmt::Debug + Send + Sync {
    fn next_after(&self, periodic: &PeriodicConfig, after_ms: u64) -> Option<u64>;
}

/// The calendar of a core built without one: names no times, so nothing is launched.
#[derive(Debug)]
pub struct NoCalendar;

impl Calendar for NoCalendar {
    fn next_after(&self, _: &PeriodicConfig, _: u64) -> Option<u64> {
        None
    }
}

/// A child's pending evaluation.
pub fn child_eval(child: &Job, id: String) -> Evaluation {
    Evaluation {
        id,
        namespace: child.namespace.clone(),
        priority: child.priority,
        eval_type: child.job_type,
        triggered_by: crate::structs::EvalTrigger::PeriodicJob,
        job_id: child.id.clone(),
        status: EvalStatus::Pending,
        ..Evaluation::default()
    }
}

/// The launch of `parent` at `launch_ms`: with its child, or without one when
/// `prohibit_overlap` finds a child still running (never for a forced launch).
pub fn launch(
    state: &ServerState,
    parent: &Job,
    launch_ms: u64,
    forced: bool,
    skipped: u32,
    new_id: &mut dyn FnMut() -> String,
) -> Command {
    let overlap = parent
        .periodic
        .as_ref()
        .is_some_and(|periodic| periodic.prohibit_overlap);
    let child = if !forced && overlap && state.running_children(&parent.namespace, &parent.id) {
        tracing::info!(job = %parent.id, launch_ms, "periodic launch skipped: a child is still running");
        None
    } else {
        let child = parent.periodic_child(launch_ms);
        let eval = child_eval(&child, new_id());
        Some(alloc::boxed::Box::new((child, eval)))
    };
    Command::PeriodicLaunch {
        namespace: parent.namespace.clone(),
        job_id: parent.id.clone(),
        launch_ms,
        forced,
        skipped,
        child,
    }
}

#[derive(Debug)]
pub struct PeriodicDispatcher {
    enabled: bool,
    in_flight: bool,
    calendar: Arc<dyn Calendar>,
    /// The last wall-clock reading (Unix ms) and the monotonic instant it was taken at.
    wall: Option<(Instant, u64)>,
    /// The earliest next launch of any parent, on the monotonic clock.
    wake: Option<Instant>,
    /// The jobs and launches tables' indexes when last looked at.
    looked_at: (u64, u64),
    /// Set when something may have changed what is due (a clock step, a proposal back).
    dirty: bool,
    /// The regression switch `periodic-from-leadership`, and the wall clock when this leader
    /// took office.
    from_leadership: bool,
    took_office_ms: Option<u64>,
}

impl Default for PeriodicDispatcher {
    fn default() -> Self {
        PeriodicDispatcher::new(Arc::new(NoCalendar))
    }
}

impl PeriodicDispatcher {
    pub fn new(calendar: Arc<dyn Calendar>) -> Self {
        PeriodicDispatcher {
            enabled: false,
            in_flight: false,
            calendar,
            wall: None,
            wake: None,
            looked_at: (0, 0),
            dirty: true,
            from_leadership: false,
            took_office_ms: None,
        }
    }

    /// A dispatcher defect re-created on purpose (a regression switch of the simulation).
    pub fn with_faults(mut self, faults: crate::config::SchedulerFaults) -> Self {
        self.from_leadership = faults.periodic_from_leadership;
        self
    }

    pub fn with_calendar(mut self, calendar: Arc<dyn Calendar>) -> Self {
        self.calendar = calendar;
        self
    }

    /// The leader's wall clock now. A reading that disagrees with the monotonic clock by
    /// more than a second (the clock was stepped) makes the next step look at every parent.
    pub fn set_wall_clock(&mut self, now: Instant, unix_ms: u64) {
        if let Some(predicted) = self.wall_at(now) {
            let off = predicted.abs_diff(unix_ms);
            if off > WALL_STEP.as_millis() as u64 {
                tracing::info!(off_ms = off, "wall clock stepped; periodic launches looked at again");
                self.dirty = true;
            }
        }
        self.wall = Some((now, unix_ms));
    }

    /// The wall clock at `now`, from the last reading.
    pub fn wall_at(&self, now: Instant) -> Option<u64> {
        self.wall.map(|(at, unix_ms)| {
            let elapsed = now.saturating_duration_since(at).as_millis() as u64;
            unix_ms.saturating_add(elapsed)
        })
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        self.took_office_ms = None;
        self.in_flight = false;
        self.wake = None;
        self.dirty = true;
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.enabled { self.wake } else { None }
    }

    pub fn proposed(&mut self) {
        self.in_flight = false;
        self.dirty = true;
    }

    /// One step; returns the launch to propose, if one is due.
    pub fn run(&mut self, now: Instant, state: &ServerState, new_id: &mut dyn FnMut() -> String) -> Option<Command> {
        if !self.enabled || self.in_flight {
            return None;
        }
        let wall_ms = self.wall_at(now)?;
        let took_office_ms = *self.took_office_ms.get_or_insert(wall_ms);
        let tables = (
            state.table_index(Table::Jobs),
            state.table_index(Table::PeriodicLaunches),
        );
        let woke = self.wake.is_some_and(|at| at <= now);
        if !self.dirty && !woke && tables == self.looked_at {
            return None;
        }
        self.dirty = false;
        self.looked_at = tables;
        self.wake = None;
        for ((namespace, job_id), last) in state.periodic_launches() {
            let Some(parent) = state.job(namespace, job_id).filter(|job| job.is_periodic_active()) else {
                continue;
            };
            let Some(periodic) = parent.periodic.as_ref() else {
                continue;
            };
            let base = if self.from_leadership {
                last.launch_ms.max(took_office_ms)
            } else {
                last.launch_ms
            };
            let Some(next) = self.calendar.next_after(periodic, base) else {
                continue;
            };
            if next > wall_ms {
                let at = now + Duration::from_millis(next - wall_ms);
                self.wake = Some(self.wake.map_or(at, |wake| wake.min(at)));
                continue;
            }
            let (latest, skipped) = self.latest_due(periodic, next, wall_ms);
            if skipped > 0 {
                tracing::warn!(job = %job_id, skipped, launch_ms = latest, "periodic launches missed; launching the latest");
            }
            self.in_flight = true;
            return Some(launch(state, parent, latest, false, skipped, new_id));
        }
        None
    }

    /// The latest time the spec names at or before `wall_ms`, from `first` (one that is),
    /// and how many due times before it are passed over.
    fn latest_due(&self, periodic: &PeriodicConfig, first: u64, wall_ms: u64) -> (u64, u32) {
        let (mut latest, mut skipped) = (first, 0);
        while skipped < CATCH_UP_STEPS {
            match self.calendar.next_after(periodic, latest) {
                Some(next) if next <= wall_ms => {
                    latest = next;
                    skipped += 1;
                }
                _ => break,
            }
        }
        (latest, skipped)
    }
}

#[cfg(test)]
mod tests;
