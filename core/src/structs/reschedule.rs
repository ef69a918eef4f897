//! The `reschedule` block (Nomad's `ReschedulePolicy`): whether and when the servers place a
//! failed allocation again, on another node if they can.

use super::*;

/// How the delay grows with each failure in a row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelayFunction {
    /// The same delay every time.
    #[default]
    Constant,
    /// Doubled with each failure in a row.
    Exponential,
    /// The Fibonacci sequence of the delay: d, d, 2d, 3d, 5d…
    Fibonacci,
}

impl DelayFunction {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "constant" => DelayFunction::Constant,
            "exponential" => DelayFunction::Exponential,
            "fibonacci" => DelayFunction::Fibonacci,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DelayFunction::Constant => "constant",
            DelayFunction::Exponential => "exponential",
            DelayFunction::Fibonacci => "fibonacci",
        }
    }
}

/// A group's reschedule policy, merged from Nomad's default for the job type, the job's
/// `reschedule` block and the group's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReschedulePolicy {
    /// Reschedules allowed within `interval` (unless `unlimited`).
    pub attempts: u32,
    pub interval: Duration,
    /// The first delay after a failure.
    pub delay: Duration,
    pub delay_function: DelayFunction,
    /// The ceiling of a growing delay (zero: none).
    pub max_delay: Duration,
    pub unlimited: bool,
}

impl ReschedulePolicy {
    /// Nomad's default for service jobs: forever, from 30 s doubling up to an hour.
    pub const SERVICE: ReschedulePolicy = ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: Duration::from_secs(30),
        delay_function: DelayFunction::Exponential,
        max_delay: Duration::from_secs(3_600),
        unlimited: true,
    };

    /// Nomad's default for batch jobs: once a day, after 5 s.
    pub const BATCH: ReschedulePolicy = ReschedulePolicy {
        attempts: 1,
        interval: Duration::from_secs(24 * 3_600),
        delay: Duration::from_secs(5),
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    };

    /// The default for `job_type`; system jobs are never rescheduled.
    pub fn default_for(job_type: JobType) -> Option<ReschedulePolicy> {
        match job_type {
            JobType::Service => Some(Self::SERVICE),
            JobType::Batch => Some(Self::BATCH),
            JobType::System => None,
        }
    }

    /// Whether the policy lets a failed allocation be placed again at all (Nomad: unlimited,
    /// or some attempts within a positive interval).
    pub fn enabled(&self) -> bool {
        self.unlimited || (self.attempts > 0 && !self.interval.is_zero())
    }

    /// The delay before the reschedule that follows `in_a_row` failures in a row (1 for the
    /// first), capped by `max_delay` when one is set.
    pub fn delay_after(&self, in_a_row: u32) -> Duration {
        let steps = in_a_row.saturating_sub(1).min(62);
        let grown = match self.delay_function {
            DelayFunction::Constant => self.delay,
            DelayFunction::Exponential => self.delay.saturating_mul(1u32 << steps.min(31)),
            DelayFunction::Fibonacci => {
                let (mut previous, mut current) = (0u32, 1u32);
                for _ in 0..steps.min(46) {
                    (previous, current) = (current, previous.saturating_add(current));
                }
                self.delay.saturating_mul(current)
            }
        };
        if self.max_delay.is_zero() || self.delay_function == DelayFunction::Constant {
            grown
        } else {
            grown.min(self.max_delay)
        }
    }

    /// Nomad's `ReschedulePolicy.Validate`, in its words.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.enabled() {
            return problems;
        }
        const MIN_DELAY: Duration = Duration::from_secs(5);
        if self.delay < MIN_DELAY {
            problems.push(format!(
                "Delay cannot be less than {} (got {})",
                crate::goduration::format(MIN_DELAY),
                crate::goduration::format(self.delay)
            ));
        }
        if self.delay_function != DelayFunction::Constant && self.max_delay < self.delay {
            problems.push(format!(
                "Max Delay cannot be less than Delay {} (got {})",
                crate::goduration::format(self.delay),
                crate::goduration::format(self.max_delay)
            ));
        }
        if !self.unlimited && self.attempts > 0 && self.interval.is_zero() {
            problems.push("Interval must be a non zero value if Attempts > 0".into());
        }
        problems
    }
}
