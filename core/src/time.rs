//! The core's own notion of time.
//!
//! An [`Instant`] is nanoseconds since an epoch the driver chooses (process start in
//! production, zero in the simulation). Core code never reads a clock: every `handle*` call is
//! told `now`, and deadlines are handed back through `poll_timeout`. Because the value is a
//! plain integer, a simulation can build any instant and traces print identically on every run.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

use serde::{Deserialize, Serialize};

/// When cluster time `at_ms` (Unix milliseconds, as log entries are stamped) comes on this
/// node's clock: `now` plus what is left of it after `cluster_now_ms`, the time of the last
/// applied entry (at once when it has passed). Leaders time delays recorded in the state this
/// way, so a new leader waits at most what is left.
pub fn cluster_time_at(now: Instant, at_ms: u64, cluster_now_ms: u64) -> Instant {
    now + Duration::from_millis(at_ms.saturating_sub(cluster_now_ms))
}

/// The contract every machine keeps with its driver: the `now` handed to `handle*` never runs
/// back. A driver that fed a wall clock stepped back would move every deadline; debug and
/// simulation builds stop at the first such call, naming both instants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Monotonic {
    last: Option<Instant>,
}

impl Monotonic {
    #[track_caller]
    pub fn observe(&mut self, now: Instant) {
        if let Some(last) = self.last {
            debug_assert!(now >= last, "time ran backwards: now {now:?} after {last:?}");
            if now < last {
                return;
            }
        }
        self.last = Some(now);
    }
}

#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instant {
    nanos: u64,
}

impl Instant {
    pub const ZERO: Instant = Instant { nanos: 0 };

    pub const fn from_nanos(nanos: u64) -> Self {
        Instant { nanos }
    }

    pub const fn from_millis(millis: u64) -> Self {
        Instant {
            nanos: millis * 1_000_000,
        }
    }

    pub const fn as_nanos(self) -> u64 {
        self.nanos
    }

    pub const fn as_millis(self) -> u64 {
        self.nanos / 1_000_000
    }

    /// Time elapsed from `earlier` to `self`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.nanos.saturating_sub(earlier.nanos))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, rhs: Duration) -> Instant {
        let rhs_nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant {
            nanos: self.nanos.saturating_add(rhs_nanos),
        }
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;

    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Instant {
    /// Seconds with millisecond precision, e.g. `12.034s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.nanos / 1_000_000;
        write!(f, "{}.{:03}s", millis / 1000, millis % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[allow(unused_imports)]
    use crate::prelude::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(1500);
        assert_eq!(t + Duration::from_millis(500), Instant::from_millis(2000));
        assert_eq!(t - Instant::from_millis(2000), Duration::ZERO);
        assert_eq!(
            Instant::from_nanos(u64::MAX) + Duration::from_secs(1),
            Instant::from_nanos(u64::MAX)
        );
        assert_eq!(t.to_string(), "1.500s");
    }
}
