//! When a task's leader process is gone: it exited by itself, a stop killed it, or it was found
//! gone after an agent restart. Whatever the task started may still run (a shell's background
//! child that ignored SIGINT, a daemon that left the session), so before the runner restarts
//! the task or runs its stop hooks it asks the driver to destroy the task (`Io::DestroyTask`:
//! kill every process of its cgroup, remove the cgroup), as Nomad's task runner calls the
//! driver's `DestroyTask` after every exit. The handle stays persisted until that is done, so
//! an agent restarted in between destroys the task again.
//!
//! A destroy that failed for want of an answer (a container daemon down or hung) is asked
//! again ([`destroy_retry`]) before the runner goes on: Nomad logs the failure and forgets
//! the container, which then outlives its allocation until someone removes it by hand.

use super::*;
use crate::client::IoError;

/// The first pause before a destroy that got no answer is asked again, the longest, and how
/// long after the first such failure the runner stops asking and goes on (what is left is
/// then the driver's orphan sweep's to remove).
pub const DESTROY_RETRY_FIRST: Duration = Duration::from_millis(200);
pub const DESTROY_RETRY_MAX: Duration = Duration::from_secs(5);
pub const DESTROY_RETRY_FOR: Duration = Duration::from_secs(120);

/// The destroys of one task that failed for want of an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DestroyFailures {
    /// How many failed.
    pub attempts: u32,
    /// When the first one failed.
    pub since: Instant,
}

/// The pause before the destroy is asked again, after `failures` (this one included,
/// counted from one) that began `failing_for` ago; `None`: go on without it. Only a failure the driver marks
/// retryable (its backend timed out, was unreachable or out of resources) is asked again:
/// the pause doubles from 200 ms to at most 5 s, for at most two minutes.
pub fn destroy_retry(error: &IoError, failures: u32, failing_for: Duration) -> Option<Duration> {
    if !error.is_retryable() || failing_for >= DESTROY_RETRY_FOR {
        return None;
    }
    let pause = DESTROY_RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    Some(pause.min(DESTROY_RETRY_MAX))
}

/// What the runner does once the task is destroyed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum AfterDestroy {
    /// The task exited by itself: the restart policy decides (or the stop goes on).
    Exited(Box<ExitResult>),
    /// A stop (`StopTask`) finished.
    Killed,
    /// Reattaching after an agent restart found the process gone.
    RestoreFailed { error: String, was_running: bool },
}

impl TaskRunner {
    /// The driver reports the task exited.
    pub fn exited(&mut self, now: Instant, exit: ExitResult, ops: &mut OpIds) {
        if !matches!(
            self.phase,
            Phase::Running | Phase::Killing { .. } | Phase::ShutdownDelay { .. }
        ) {
            return;
        }
        self.stop_supervisor(now);
        if let Some(templates) = &mut self.templates {
            templates.cancel();
        }
        let mut message = format!("Exit Code: {}", exit.exit_code);
        if exit.signal != 0 {
            message.push_str(&format!(", Signal: {}", exit.signal));
        }
        // An OOM kill is named as Nomad's drivers name it (the exit itself says only SIGKILL).
        let oom = exit.oom_killed.then(|| "OOM Killed".to_string());
        if let Some(err) = exit.err.as_ref().or(oom.as_ref()) {
            message.push_str(&format!(", Exit Message: {err:?}"));
        }
        let mut fields = BTreeMap::from([
            ("exit_code".to_string(), exit.exit_code.to_string()),
            ("signal".to_string(), exit.signal.to_string()),
        ]);
        if let Some(err) = exit.err.as_ref().or(oom.as_ref()) {
            fields.insert("exit_message".into(), err.clone());
        }
        if exit.oom_killed {
            fields.insert("oom_killed".into(), "true".into());
        }
        self.event_with(now, events::TERMINATED, &message, fields);
        if let Phase::Killing { .. } = self.phase {
            // The stop reply follows; it destroys the task and finishes the kill.
            self.persist();
            return;
        }
        self.destroy(now, AfterDestroy::Exited(Box::new(exit)), ops);
    }

    /// The driver's answer to `StopTask`.
    pub(super) fn kill_outcome(&mut self, now: Instant, outcome: Outcome, ops: &mut OpIds) {
        self.stop_supervisor(now);
        match outcome {
            Ok(_) => self.event(now, events::KILLED, "Task successfully killed"),
            Err(error) => self.event(now, events::KILLED, &format!("Task killed with error: {error}")),
        }
        self.destroy(now, AfterDestroy::Killed, ops);
    }

    /// The driver's answer to `RecoverTask` after an agent restart.
    pub(super) fn restore_outcome(&mut self, now: Instant, outcome: Outcome, ops: &mut OpIds) {
        let Err(error) = outcome else {
            self.begin_prestart(now, ops);
            return;
        };
        let after = AfterDestroy::RestoreFailed {
            error: error.to_string(),
            was_running: self.local.state.state == TaskStatus::Running,
        };
        if self.spec.faults.restore_failure_keeps_process {
            self.destroyed(now, after, ops);
            return;
        }
        self.destroy(now, after, ops);
    }

    /// Destroys the task behind the held handle, then goes on with `after`.
    fn destroy(&mut self, now: Instant, after: AfterDestroy, ops: &mut OpIds) {
        let handle = match self.local.handle.clone() {
            Some(handle) if !self.spec.faults.skip_task_destroy => handle,
            _ => {
                self.destroyed(now, after, ops);
                return;
            }
        };
        self.send_destroy(handle, after, None, ops);
    }

    fn send_destroy(
        &mut self,
        handle: TaskHandle,
        after: AfterDestroy,
        failed: Option<DestroyFailures>,
        ops: &mut OpIds,
    ) {
        let op = ops.allocate();
        self.set_phase(Phase::Destroying { op, after, failed });
        self.actions.push(TaskAction::Io {
            op,
            io: Io::DestroyTask { handle },
        });
    }

    /// The pause after a failed destroy is over: it is asked again.
    pub(super) fn destroy_again(
        &mut self,
        now: Instant,
        after: AfterDestroy,
        failed: DestroyFailures,
        ops: &mut OpIds,
    ) {
        match self.local.handle.clone() {
            Some(handle) => self.send_destroy(handle, after, Some(failed), ops),
            None => self.destroyed(now, after, ops),
        }
    }

    pub(super) fn destroy_outcome(
        &mut self,
        now: Instant,
        after: AfterDestroy,
        failed: Option<DestroyFailures>,
        outcome: Outcome,
        ops: &mut OpIds,
    ) {
        let Err(error) = outcome else {
            self.destroyed(now, after, ops);
            return;
        };
        let failed = DestroyFailures {
            attempts: failed.map_or(1, |failed| failed.attempts + 1),
            since: failed.map_or(now, |failed| failed.since),
        };
        match destroy_retry(&error, failed.attempts, now.saturating_duration_since(failed.since)) {
            Some(pause) => {
                // Told once; the handle stays persisted, so a restarted agent asks again too.
                if failed.attempts == 1 {
                    self.event(
                        now,
                        events::DRIVER_FAILURE,
                        &format!("failed to destroy task: {error}; trying again"),
                    );
                }
                self.set_phase(Phase::DestroyPause {
                    until: now + pause,
                    after,
                    failed,
                });
            }
            None => {
                // The event tells the operator that processes of the task may have survived.
                self.event(now, events::DRIVER_FAILURE, &format!("failed to destroy task: {error}"));
                self.destroyed(now, after, ops);
            }
        }
    }

    /// The task's processes are gone: restart it, or stop for good.
    fn destroyed(&mut self, now: Instant, after: AfterDestroy, ops: &mut OpIds) {
        self.local.handle = None;
        match after {
            AfterDestroy::Exited(exit) => {
                if self.kill_requested {
                    self.persist();
                    self.begin_stop(now, ops);
                    return;
                }
                let decision = self.tracker.on_exit(now, &exit);
                self.decide(now, decision, ops);
            }
            AfterDestroy::Killed => {
                let template_restart = core::mem::take(&mut self.restart_requested);
                if core::mem::take(&mut self.restart_after_kill) && !self.kill_requested {
                    // A failure under the restart policy, like any other.
                    let decision = self.tracker.on_start_error(now, true);
                    self.decide(now, decision, ops);
                } else if template_restart && !self.kill_requested {
                    // Asked for (a template changed), not a failure: at once, outside the
                    // restart policy, as Nomad's restart does.
                    self.local.state.restarts += 1;
                    self.local.state.last_restart = self.wall(now);
                    self.local.state.state = TaskStatus::Pending;
                    self.event(now, events::RESTARTING, "Task restarting in 0s");
                    self.persist();
                    self.begin_prestart(now, ops);
                } else {
                    self.begin_stop(now, ops);
                }
            }
            AfterDestroy::RestoreFailed { error, was_running } => {
                self.persist();
                if was_running && !self.servers_contacted {
                    self.event(
                        now,
                        events::WAITING_ON_SERVERS,
                        &format!("failed to restore task handle ({error}); waiting to contact servers"),
                    );
                    self.phase = Phase::WaitingOnServers;
                    if self.kill_requested {
                        self.begin_stop(now, ops);
                    }
                } else {
                    self.begin_prestart(now, ops);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ErrorKind;

    #[test]
    fn a_destroy_without_an_answer_is_asked_again_for_two_minutes_and_no_other_is() {
        let down = IoError::new(ErrorKind::Unavailable, "daemon down");
        let pauses: Vec<Option<Duration>> = (1..=7)
            .map(|failures| destroy_retry(&down, failures, Duration::from_secs(1)))
            .collect();
        let ms = |ms| Some(Duration::from_millis(ms));
        assert_eq!(
            pauses,
            [ms(200), ms(400), ms(800), ms(1600), ms(3200), ms(5000), ms(5000)]
        );
        assert_eq!(destroy_retry(&down, 40, Duration::from_secs(119)), ms(5000));
        assert_eq!(destroy_retry(&down, 41, DESTROY_RETRY_FOR), None);
        let hung = IoError::new(ErrorKind::Timeout, "daemon hung");
        assert_eq!(destroy_retry(&hung, 1, Duration::ZERO), ms(200));
        let refused = IoError::new(ErrorKind::Other, "container is in use");
        assert_eq!(destroy_retry(&refused, 1, Duration::ZERO), None);
    }
}
