//! Polling the local Consul agent's check statuses while an allocation's deployment health
//! waits on them (`health_check = "checks"`), as Nomad's health tracker polls its service
//! client: every [`CHECK_POLL_INTERVAL`], one call at a time, and only while some allocation
//! is waiting. A failed call is tried again at the next interval; health then simply waits
//! (and is decided unhealthy at `healthy_deadline` if the checks never pass).

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::collections::BTreeMap;
use alloc::string::String;
use core::time::Duration;

use crate::client::{ConsulOp, Io, Outcome, Reply};
use crate::op::{OpId, OpIds};
use crate::time::Instant;

/// How often check statuses are read while they are wanted (Nomad's
/// `consulCheckLookupInterval`).
pub const CHECK_POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Clone, Debug, Default)]
pub struct CheckPoll {
    in_flight: Option<OpId>,
    /// No call before this time.
    not_before: Option<Instant>,
}

impl CheckPoll {
    pub fn owns(&self, op: OpId) -> bool {
        self.in_flight == Some(op)
    }

    /// The next read, when `wanted` and one is due.
    pub fn poll(&mut self, now: Instant, wanted: bool, ops: &mut OpIds) -> Option<(OpId, Io)> {
        if !wanted || self.in_flight.is_some() || self.not_before.is_some_and(|at| now < at) {
            return None;
        }
        let op = ops.allocate();
        self.in_flight = Some(op);
        Some((op, Io::Consul(ConsulOp::Checks)))
    }

    /// The read's outcome: the statuses by check id, or `None` when it failed.
    pub fn outcome(&mut self, now: Instant, outcome: Outcome) -> Option<BTreeMap<String, String>> {
        self.in_flight = None;
        self.not_before = Some(now + CHECK_POLL_INTERVAL);
        match outcome {
            Ok(Reply::Checks(statuses)) => Some(statuses),
            Ok(_) => None,
            Err(error) => {
                tracing::debug!(%error, "reading consul check statuses failed; trying again");
                None
            }
        }
    }

    /// When the next read is due, if one is `wanted`.
    pub fn poll_timeout(&self, wanted: bool) -> Option<Instant> {
        if !wanted || self.in_flight.is_some() {
            return None;
        }
        Some(self.not_before.unwrap_or(Instant::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_at_a_time_every_interval_and_only_while_wanted() {
        let mut poll = CheckPoll::default();
        let mut ops = OpIds::default();
        let t0 = Instant::from_millis(1_000);
        assert!(poll.poll(t0, false, &mut ops).is_none());
        assert_eq!(poll.poll_timeout(false), None);
        let (op, io) = poll.poll(t0, true, &mut ops).expect("a read is due");
        assert!(matches!(io, Io::Consul(ConsulOp::Checks)));
        assert!(poll.owns(op));
        assert!(poll.poll(t0, true, &mut ops).is_none(), "one call at a time");
        let statuses = BTreeMap::from([("c1".to_string(), "passing".to_string())]);
        assert_eq!(poll.outcome(t0, Ok(Reply::Checks(statuses.clone()))), Some(statuses));
        assert_eq!(poll.poll_timeout(true), Some(t0 + CHECK_POLL_INTERVAL));
        assert!(poll.poll(t0 + Duration::from_millis(499), true, &mut ops).is_none());
        let (op, _) = poll.poll(t0 + CHECK_POLL_INTERVAL, true, &mut ops).unwrap();
        let failed = Err(crate::client::IoError::other("connection refused"));
        assert_eq!(poll.outcome(t0 + CHECK_POLL_INTERVAL, failed), None);
        assert!(!poll.owns(op));
    }
}
