//! The restart policy tracker (Nomad's `RestartTracker`): after a task exits or fails to
//! start, decide whether to restart it, after how long, and why.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

use crate::client::{ExitResult, Jitter};
use crate::structs::{RestartMode, RestartPolicy};
use crate::time::Instant;

pub const REASON_NO_RESTARTS_ALLOWED: &str = "Policy allows no restarts";
pub const REASON_UNRECOVERABLE: &str = "Error was unrecoverable";
pub const REASON_WITHIN_POLICY: &str = "Restart within policy";
pub const REASON_SUCCESS: &str = "Restart unnecessary as task terminated successfully";

/// Fraction of the delay added as random jitter, as Nomad does.
const JITTER: f64 = 0.25;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Restart after `delay`.
    Restart { delay: Duration, reason: String },
    /// Do not restart; the task failed.
    NotRestarting { reason: String },
    /// Do not restart; the task finished as it should.
    Terminated { reason: String },
}

#[derive(Clone, Debug)]
pub struct RestartTracker {
    policy: RestartPolicy,
    /// Restart even after a successful exit (service and system jobs; not batch).
    on_success: bool,
    count: u32,
    interval_start: Option<Instant>,
    jitter: Jitter,
}

impl RestartTracker {
    pub fn new(policy: RestartPolicy, on_success: bool, seed: u64) -> Self {
        RestartTracker {
            policy,
            on_success,
            count: 0,
            interval_start: None,
            jitter: Jitter::new(seed),
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The task exited with `exit`.
    pub fn on_exit(&mut self, now: Instant, exit: &ExitResult) -> Decision {
        if exit.successful() && !self.on_success {
            return Decision::Terminated {
                reason: REASON_SUCCESS.into(),
            };
        }
        self.on_failure(now)
    }

    /// The task could not be started or set up; `recoverable` errors follow the policy (see
    /// [`start_error_recoverable`] for a driver's).
    pub fn on_start_error(&mut self, now: Instant, recoverable: bool) -> Decision {
        if !recoverable {
            return Decision::NotRestarting {
                reason: REASON_UNRECOVERABLE.into(),
            };
        }
        self.on_failure(now)
    }

    fn on_failure(&mut self, now: Instant) -> Decision {
        if self.policy.attempts == 0 {
            return Decision::NotRestarting {
                reason: REASON_NO_RESTARTS_ALLOWED.into(),
            };
        }
        let start = *self.interval_start.get_or_insert(now);
        let end = start + self.policy.interval;
        let (start, end) = if now > end {
            self.count = 0;
            self.interval_start = Some(now);
            (now, now + self.policy.interval)
        } else {
            (start, end)
        };
        let _ = start;
        self.count += 1;
        if self.count <= self.policy.attempts {
            return Decision::Restart {
                delay: self.jittered_delay(),
                reason: REASON_WITHIN_POLICY.into(),
            };
        }
        let reason = format!(
            "Exceeded allowed attempts {} in interval {} and mode is \"{}\"",
            self.policy.attempts,
            go_duration(self.policy.interval),
            match self.policy.mode {
                RestartMode::Fail => "fail",
                RestartMode::Delay => "delay",
            }
        );
        match self.policy.mode {
            RestartMode::Fail => Decision::NotRestarting { reason },
            RestartMode::Delay => {
                // Wait out the interval, then a fresh one begins.
                let delay = end.saturating_duration_since(now);
                self.count = 0;
                self.interval_start = Some(end);
                Decision::Restart { delay, reason }
            }
        }
    }

    fn jittered_delay(&mut self) -> Duration {
        let delay = self.policy.delay;
        let bound = (delay.as_nanos() as f64 * JITTER) as u64;
        delay + Duration::from_nanos(self.jitter.below(bound))
    }
}

pub use crate::goduration::format as go_duration;

/// Whether a driver's failure to start a task is worth another attempt under the restart
/// policy. Nomad's drivers mark their errors recoverable or not; here the driver says what
/// happened and this decides: an image the registry does not have or will not hand over, and a
/// configuration the driver refused, fail the task at once (`Error was unrecoverable`); a
/// pull that timed out, a daemon that was down and anything else are tried again.
pub fn start_error_recoverable(kind: super::ErrorKind) -> bool {
    match kind {
        super::ErrorKind::ImagePull(failure) => super::containers::pull_failure(failure),
        super::ErrorKind::TaskConfig => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> ExitResult {
        ExitResult {
            exit_code: 1,
            ..ExitResult::default()
        }
    }

    fn policy(attempts: u32, mode: RestartMode) -> RestartPolicy {
        RestartPolicy {
            attempts,
            interval: Duration::from_secs(60),
            delay: Duration::from_secs(4),
            mode,
        }
    }

    #[test]
    fn restarts_within_policy_then_fails() {
        let mut tracker = RestartTracker::new(policy(2, RestartMode::Fail), true, 7);
        let now = Instant::from_millis(1_000);
        for _ in 0..2 {
            match tracker.on_exit(now, &failed()) {
                Decision::Restart { delay, reason } => {
                    assert_eq!(reason, REASON_WITHIN_POLICY);
                    assert!(
                        delay >= Duration::from_secs(4) && delay < Duration::from_secs(5),
                        "{delay:?}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            tracker.on_exit(now, &failed()),
            Decision::NotRestarting {
                reason: "Exceeded allowed attempts 2 in interval 1m0s and mode is \"fail\"".into()
            }
        );
    }

    #[test]
    fn a_new_interval_resets_the_count() {
        let mut tracker = RestartTracker::new(policy(1, RestartMode::Fail), true, 7);
        let t0 = Instant::from_millis(0);
        assert!(matches!(tracker.on_exit(t0, &failed()), Decision::Restart { .. }));
        let later = t0 + Duration::from_secs(61);
        assert!(matches!(tracker.on_exit(later, &failed()), Decision::Restart { .. }));
        assert!(matches!(
            tracker.on_exit(later, &failed()),
            Decision::NotRestarting { .. }
        ));
    }

    #[test]
    fn delay_mode_waits_for_the_interval_end() {
        let mut tracker = RestartTracker::new(policy(1, RestartMode::Delay), true, 7);
        let t0 = Instant::from_millis(0);
        tracker.on_exit(t0, &failed());
        let t1 = t0 + Duration::from_secs(10);
        match tracker.on_exit(t1, &failed()) {
            Decision::Restart { delay, reason } => {
                assert_eq!(delay, Duration::from_secs(50));
                assert_eq!(
                    reason,
                    "Exceeded allowed attempts 1 in interval 1m0s and mode is \"delay\""
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn batch_success_terminates_and_unrecoverable_stops() {
        let mut tracker = RestartTracker::new(policy(3, RestartMode::Fail), false, 7);
        let now = Instant::ZERO;
        assert!(matches!(
            tracker.on_exit(now, &ExitResult::default()),
            Decision::Terminated { .. }
        ));
        assert_eq!(
            tracker.on_start_error(now, false),
            Decision::NotRestarting {
                reason: REASON_UNRECOVERABLE.into()
            }
        );
        let mut none = RestartTracker::new(policy(0, RestartMode::Fail), true, 7);
        assert_eq!(
            none.on_exit(now, &failed()),
            Decision::NotRestarting {
                reason: REASON_NO_RESTARTS_ALLOWED.into()
            }
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(30 * 60)), "30m0s");
        assert_eq!(go_duration(Duration::from_secs(86_400)), "24h0m0s");
        assert_eq!(go_duration(Duration::from_millis(16_500)), "16.5s");
        assert_eq!(go_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(go_duration(Duration::from_micros(1_500)), "1.5ms");
        assert_eq!(go_duration(Duration::from_micros(250)), "250µs");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }
}
