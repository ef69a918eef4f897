//! The leader's expiry of variable locks (`fsm::variables`): a lock whose holder stopped
//! renewing it is taken away once its TTL has passed on the wall clock, one proposal at a
//! time, soonest first.
//!
//! A new leader gives every lock one more TTL from when it took office, as Nomad's does:
//! holders could not renew while there was no leader, and must not lose their lock for it.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::fsm::{Command, ServerState, Table, VariableLockCommand};
use crate::time::Instant;

#[derive(Debug, Default)]
pub struct LockExpiry {
    enabled: bool,
    /// The wall clock (Unix ms) when this server took office; learnt at the first run.
    took_office_ms: Option<u64>,
    /// An expiry in flight: nothing else is proposed until it lands.
    in_flight: bool,
    /// Locks by when they lapse (the later of their expiry and the grace of a new leader),
    /// rebuilt when the variables table changes.
    due: Vec<(u64, String, String)>,
    seen_index: Option<u64>,
    /// When the soonest one lapses, on the monotonic clock.
    wake: Option<Instant>,
}

impl LockExpiry {
    pub fn set_enabled(&mut self, enabled: bool) {
        *self = LockExpiry {
            enabled,
            ..LockExpiry::default()
        };
    }

    /// The expiry to propose now, if a lock has lapsed. `wall_ms` is the wall clock at `now`
    /// (`None` before the driver told it: nothing expires then).
    pub fn run(&mut self, now: Instant, wall_ms: Option<u64>, state: &ServerState) -> Option<Command> {
        self.wake = None;
        if !self.enabled || self.in_flight {
            return None;
        }
        let wall_ms = wall_ms?;
        let took_office = *self.took_office_ms.get_or_insert(wall_ms);
        let index = state.table_index(Table::Variables);
        if self.seen_index != Some(index) {
            self.seen_index = Some(index);
            self.due = state
                .variable_locks()
                .map(|(path, lock)| {
                    let due = lock.expires_unix_ms.max(took_office.saturating_add(lock.ttl_ms));
                    (due, path.to_string(), lock.id.clone())
                })
                .collect();
            self.due.sort();
        }
        let (due, path, lock_id) = self.due.first()?.clone();
        if due > wall_ms {
            self.wake = Some(now + core::time::Duration::from_millis(due - wall_ms));
            return None;
        }
        // A renewal moves only the lock's expiry, not the table's index: look again.
        let lapsed = state
            .variable(&path)
            .and_then(|variable| variable.lock.as_ref())
            .is_some_and(|lock| lock.id == lock_id && lock.expires_unix_ms <= wall_ms);
        if !lapsed {
            self.seen_index = None;
            self.wake = Some(now);
            return None;
        }
        self.in_flight = true;
        tracing::info!(path = %path, "variable lock expired");
        Some(Command::VariableLock(VariableLockCommand::Expire { path, lock_id }))
    }

    /// The expiry landed (or failed): the table is looked at again.
    pub fn proposed(&mut self) {
        self.in_flight = false;
        self.seen_index = None;
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wake
    }
}
