//! Nomad Variables in the state store: writes checked against a check-and-set index and
//! against the variable's lock, and the locks themselves (Nomad 1.7's `?lock-acquire`,
//! `?lock-renew`, `?lock-release`).
//!
//! A lock is state like any other: acquired, renewed and released through Raft, so every
//! server agrees on who holds it, and a new leader knows when each one lapses. Its TTL runs
//! on the proposers' clock stamps: an acquire or renewal applied at `t` holds it until
//! `t + ttl`. The leader proposes [`VariableLockCommand::Expire`] once that passes
//! (`rpc::varlocks`), and the entry takes the lock away only if it has truly lapsed by the
//! entry's own stamp, so a renewal applied first always wins. A lock that ran out keeps the
//! variable from being locked again for its lock delay; one released by its holder does not.
//! Where Nomad keeps TTLs and delays in the leader's memory (lost at a leader change), these
//! survive it.

#[allow(unused_imports)]
use crate::prelude::*;

use serde::{Deserialize, Serialize};

use super::{Response, ServerState, Table, Variable};

/// A variable's lock, as its holder asked for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableLock {
    /// Chosen by the server that took the acquire; proves the holder on every later call.
    pub id: String,
    pub ttl_ms: u64,
    pub lock_delay_ms: u64,
    /// When it lapses unless renewed: the stamp of its acquire or last renewal, plus its TTL.
    pub expires_unix_ms: u64,
}

/// Nomad's defaults (`api.DefaultLockTTL`, `api.DefaultLockDelay`).
pub const DEFAULT_LOCK_TTL_MS: u64 = 15_000;
pub const DEFAULT_LOCK_DELAY_MS: u64 = 15_000;
/// Bounds on what a holder may ask: a TTL under a second would have the leader proposing
/// expiries as fast as it could, and a day is Nomad's ceiling for both.
pub const LOCK_TTL_MIN_MS: u64 = 1_000;
pub const LOCK_DURATION_MAX_MS: u64 = 24 * 60 * 60 * 1_000;
const _: () = assert!(
    LOCK_TTL_MIN_MS <= DEFAULT_LOCK_TTL_MS
        && DEFAULT_LOCK_TTL_MS <= LOCK_DURATION_MAX_MS
        && DEFAULT_LOCK_DELAY_MS <= LOCK_DURATION_MAX_MS,
    "a lock's defaults are within its bounds"
);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VariableLockCommand {
    /// Locks `path` (creating the variable when there is none), replacing its items when
    /// some are given. Refused with the variable as it is while another holds it or its lock
    /// delay runs.
    Acquire {
        path: String,
        /// Sealed, as [`super::Command::VariableUpsert`]'s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items: Option<crate::structs::Secrets>,
        lock_id: String,
        ttl_ms: u64,
        lock_delay_ms: u64,
    },
    /// Moves the lock's expiry to this entry's stamp plus its TTL.
    Renew { path: String, lock_id: String },
    /// The holder lets it go: at once lockable again.
    Release { path: String, lock_id: String },
    /// The leader's: the lock ran out. Applied only if it really has by this entry's stamp
    /// (a renewal may have landed first); then the lock delay starts.
    Expire { path: String, lock_id: String },
}

impl VariableLockCommand {
    pub fn path(&self) -> &str {
        match self {
            VariableLockCommand::Acquire { path, .. }
            | VariableLockCommand::Renew { path, .. }
            | VariableLockCommand::Release { path, .. }
            | VariableLockCommand::Expire { path, .. } => path,
        }
    }

    /// What a direct write of it must satisfy: its bounds, with Nomad's words.
    pub fn check(&self) -> Result<(), String> {
        match self {
            VariableLockCommand::Acquire {
                items,
                lock_id,
                ttl_ms,
                lock_delay_ms,
                ..
            } => {
                if lock_id.is_empty() {
                    return Err("lock ID is required".into());
                }
                if !(LOCK_TTL_MIN_MS..=LOCK_DURATION_MAX_MS).contains(ttl_ms) {
                    return Err(format!(
                        "lock TTL must be between {}s and {}h",
                        LOCK_TTL_MIN_MS / 1_000,
                        LOCK_DURATION_MAX_MS / 3_600_000
                    ));
                }
                if *lock_delay_ms > LOCK_DURATION_MAX_MS {
                    return Err(format!(
                        "lock delay must be at most {}h",
                        LOCK_DURATION_MAX_MS / 3_600_000
                    ));
                }
                match items.as_ref().map(|items| items.sealed()) {
                    Some(Some(Err(reason))) => Err(format!("malformed sealed items: {reason}")),
                    Some(None) => {
                        crate::structs::check_secret_keys("variable items", items.iter().flat_map(|items| items.keys()))
                    }
                    _ => Ok(()),
                }
            }
            VariableLockCommand::Renew { lock_id, .. }
            | VariableLockCommand::Release { lock_id, .. }
            | VariableLockCommand::Expire { lock_id, .. } => {
                if lock_id.is_empty() {
                    Err("lock ID is required".into())
                } else {
                    Ok(())
                }
            }
        }
    }
}

impl Variable {
    /// Whether `lock_id` may write it: anyone while it is unlocked, only its holder while
    /// locked.
    fn writable_by(&self, lock_id: Option<&str>) -> bool {
        match (&self.lock, lock_id) {
            (None, None) => true,
            (Some(lock), Some(id)) => lock.id == id,
            // A lock id for a variable not locked (any more) is stale: the writer believes it
            // holds what it does not.
            _ => false,
        }
    }
}

impl ServerState {
    /// The conflict a write of `path` meets: a check-and-set index that does not hold (0:
    /// only if there is none), or a lock the writer does not hold. `None` when it may go
    /// ahead. Answered with the variable as it is.
    fn variable_conflict(&self, path: &str, cas: Option<u64>, lock_id: Option<&str>) -> Option<Response> {
        let current = self.variables.get(path);
        let cas_holds = match (cas, current) {
            (None, _) => true,
            (Some(cas), Some(variable)) => variable.modify_index == cas,
            (Some(cas), None) => cas == 0,
        };
        let lock_holds = match current {
            Some(variable) => variable.writable_by(lock_id),
            None => lock_id.is_none(),
        };
        (!(cas_holds && lock_holds)).then(|| Response::VariableConflict(current.cloned()))
    }

    pub(super) fn write_variable(
        &mut self,
        path: &str,
        items: &crate::structs::Secrets,
        cas: Option<u64>,
        lock_id: Option<&str>,
        index: u64,
        at_unix_ms: u64,
    ) -> Response {
        if let Some(conflict) = self.variable_conflict(path, cas, lock_id) {
            return conflict;
        }
        self.put_variable(path, Some(items), index, at_unix_ms, |_| {})
    }

    pub(super) fn remove_variable(
        &mut self,
        path: &str,
        cas: Option<u64>,
        lock_id: Option<&str>,
        index: u64,
    ) -> Response {
        if let Some(conflict) = self.variable_conflict(path, cas, lock_id) {
            return conflict;
        }
        match self.variables.remove(path) {
            Some(_) => {
                self.table_index.insert(Table::Variables, index);
                Response::Done
            }
            None => Response::NotFound,
        }
    }

    pub(super) fn apply_variable_lock(
        &mut self,
        command: &VariableLockCommand,
        index: u64,
        at_unix_ms: u64,
    ) -> Response {
        let path = command.path();
        let current = self.variables.get(path);
        match command {
            VariableLockCommand::Acquire {
                items,
                lock_id,
                ttl_ms,
                lock_delay_ms,
                ..
            } => {
                if current.is_some_and(|variable| variable.lock.is_some() || at_unix_ms < variable.lock_free_unix_ms) {
                    return Response::VariableConflict(current.cloned());
                }
                let lock = VariableLock {
                    id: lock_id.clone(),
                    ttl_ms: *ttl_ms,
                    lock_delay_ms: *lock_delay_ms,
                    expires_unix_ms: at_unix_ms.saturating_add(*ttl_ms),
                };
                let items = items.as_ref().filter(|items| !items.is_empty());
                self.put_variable(path, items, index, at_unix_ms, |variable| {
                    variable.lock = Some(lock);
                    variable.lock_free_unix_ms = 0;
                })
            }
            VariableLockCommand::Renew { lock_id, .. } => {
                let Some(variable) = current else {
                    return Response::NotFound;
                };
                if !variable.writable_by(Some(lock_id)) {
                    return Response::VariableConflict(Some(variable.clone()));
                }
                // Only its expiry moves: no index, so no reader wakes and no check-and-set
                // index goes stale for a heartbeat.
                let mut renewed = variable.clone();
                if let Some(lock) = &mut renewed.lock {
                    lock.expires_unix_ms = at_unix_ms.saturating_add(lock.ttl_ms);
                }
                self.variables.insert(path.to_string(), renewed.clone());
                Response::Variable(renewed)
            }
            VariableLockCommand::Release { lock_id, .. } => {
                let Some(variable) = current else {
                    return Response::NotFound;
                };
                if !variable.writable_by(Some(lock_id)) {
                    return Response::VariableConflict(Some(variable.clone()));
                }
                self.put_variable(path, None, index, at_unix_ms, |variable| variable.lock = None)
            }
            VariableLockCommand::Expire { lock_id, .. } => {
                let lapsed = current
                    .and_then(|variable| variable.lock.as_ref())
                    .is_some_and(|lock| lock.id == *lock_id && lock.expires_unix_ms <= at_unix_ms);
                if !lapsed {
                    return Response::Done;
                }
                self.put_variable(path, None, index, at_unix_ms, |variable| {
                    let delay = variable.lock.take().map_or(0, |lock| lock.lock_delay_ms);
                    variable.lock_free_unix_ms = at_unix_ms.saturating_add(delay);
                })
            }
        }
    }

    /// Creates or changes the variable at `path` (its items replaced when `items` is given),
    /// then lets `change` touch it; a new modify index either way.
    fn put_variable(
        &mut self,
        path: &str,
        items: Option<&crate::structs::Secrets>,
        index: u64,
        at_unix_ms: u64,
        change: impl FnOnce(&mut Variable),
    ) -> Response {
        let mut variable = match self.variables.get(path) {
            Some(existing) => Variable {
                modify_index: index,
                modify_time_unix_ms: at_unix_ms,
                ..existing.clone()
            },
            None => Variable {
                path: path.to_string(),
                items: Default::default(),
                create_index: index,
                modify_index: index,
                create_time_unix_ms: at_unix_ms,
                modify_time_unix_ms: at_unix_ms,
                lock: None,
                lock_free_unix_ms: 0,
            },
        };
        if let Some(items) = items {
            variable.items = items.clone();
        }
        change(&mut variable);
        self.variables.insert(path.to_string(), variable.clone());
        self.table_index.insert(Table::Variables, index);
        Response::Variable(variable)
    }

    /// Locked variables with when each lapses, for the leader's expiry (`rpc::varlocks`).
    pub fn variable_locks(&self) -> impl Iterator<Item = (&str, &VariableLock)> {
        self.variables
            .values()
            .filter_map(|variable| Some((variable.path.as_str(), variable.lock.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsm::{Command, Entry};

    fn apply(state: &mut ServerState, index: u64, at: u64, command: Command) -> Response {
        state.apply(
            index,
            &Entry {
                at_unix_ms: at,
                command,
            },
        )
    }

    fn acquire(id: &str, items: Option<&str>) -> Command {
        Command::VariableLock(VariableLockCommand::Acquire {
            path: "l".into(),
            items: items.map(|value| [("v".to_string(), value.to_string())].into()),
            lock_id: id.into(),
            ttl_ms: 10_000,
            lock_delay_ms: 5_000,
        })
    }

    fn lock(command: fn(String, String) -> VariableLockCommand, id: &str) -> Command {
        Command::VariableLock(command("l".into(), id.into()))
    }

    fn renew(path: String, lock_id: String) -> VariableLockCommand {
        VariableLockCommand::Renew { path, lock_id }
    }
    fn release(path: String, lock_id: String) -> VariableLockCommand {
        VariableLockCommand::Release { path, lock_id }
    }
    fn expire(path: String, lock_id: String) -> VariableLockCommand {
        VariableLockCommand::Expire { path, lock_id }
    }

    fn write(lock_id: Option<&str>) -> Command {
        Command::VariableUpsert {
            path: "l".into(),
            items: [("v".to_string(), "w".to_string())].into(),
            cas: None,
            lock_id: lock_id.map(str::to_string),
        }
    }

    fn conflict(response: &Response) -> bool {
        matches!(response, Response::VariableConflict(_))
    }

    #[test]
    fn one_holder_at_a_time_and_only_the_holder_writes() {
        let mut state = ServerState::default();
        let Response::Variable(held) = apply(&mut state, 1, 1_000, acquire("a", None)) else {
            panic!("an acquire of a new path creates it, locked")
        };
        assert_eq!(held.lock.as_ref().unwrap().expires_unix_ms, 11_000);
        assert!(held.items.is_empty());
        assert!(conflict(&apply(&mut state, 2, 1_500, acquire("b", Some("x")))));
        // Others may neither write nor delete it; the holder may write.
        assert!(conflict(&apply(&mut state, 3, 1_600, write(None))));
        assert!(conflict(&apply(&mut state, 4, 1_600, write(Some("b")))));
        let delete = Command::VariableDelete {
            path: "l".into(),
            cas: None,
            lock_id: None,
        };
        assert!(conflict(&apply(&mut state, 5, 1_600, delete.clone())));
        let Response::Variable(written) = apply(&mut state, 6, 1_700, write(Some("a"))) else {
            panic!("the holder writes")
        };
        assert_eq!(written.lock, held.lock, "a write keeps the lock");
        // A renewal by another is refused; by the holder it moves only the expiry.
        assert!(conflict(&apply(&mut state, 7, 2_000, lock(renew, "b"))));
        let Response::Variable(renewed) = apply(&mut state, 8, 5_000, lock(renew, "a")) else {
            panic!("the holder renews")
        };
        assert_eq!(renewed.lock.as_ref().unwrap().expires_unix_ms, 15_000);
        assert_eq!(renewed.modify_index, 6);
        assert_eq!(state.table_index(Table::Variables), 6);
        // Released by its holder: at once lockable again, and writable by anyone.
        assert!(conflict(&apply(&mut state, 9, 5_100, lock(release, "b"))));
        let Response::Variable(released) = apply(&mut state, 10, 5_200, lock(release, "a")) else {
            panic!("the holder releases")
        };
        assert_eq!((released.lock.clone(), released.lock_free_unix_ms), (None, 0));
        assert!(
            conflict(&apply(&mut state, 11, 5_300, write(Some("a")))),
            "a stale lock id"
        );
        assert!(matches!(
            apply(&mut state, 12, 5_300, acquire("b", Some("x"))),
            Response::Variable(_)
        ));
    }

    #[test]
    fn an_expiry_applies_only_to_a_lapsed_lock_and_starts_the_lock_delay() {
        let mut state = ServerState::default();
        apply(&mut state, 1, 1_000, acquire("a", Some("x")));
        // Renewed before the expiry landed: the expiry finds it alive and changes nothing.
        apply(&mut state, 2, 10_000, lock(renew, "a"));
        assert_eq!(apply(&mut state, 3, 11_000, lock(expire, "a")), Response::Done);
        assert!(state.variable("l").unwrap().lock.is_some());
        // An expiry of another holder's lock changes nothing either.
        assert_eq!(apply(&mut state, 4, 30_000, lock(expire, "z")), Response::Done);
        let Response::Variable(expired) = apply(&mut state, 5, 30_000, lock(expire, "a")) else {
            panic!("a lapsed lock expires")
        };
        assert_eq!((expired.lock, expired.lock_free_unix_ms), (None, 35_000));
        assert_eq!(expired.items, [("v".to_string(), "x".to_string())].into(), "items stay");
        // Nobody locks it during its lock delay; anyone after.
        assert!(conflict(&apply(&mut state, 6, 34_999, acquire("b", None))));
        let Response::Variable(again) = apply(&mut state, 7, 35_000, acquire("b", None)) else {
            panic!("lockable once the delay is over")
        };
        assert_eq!(again.lock.unwrap().id, "b");
        assert_eq!(again.lock_free_unix_ms, 0);
    }

    #[test]
    fn lock_requests_are_checked_with_their_bounds() {
        let with = |ttl_ms, lock_delay_ms| VariableLockCommand::Acquire {
            path: "l".into(),
            items: None,
            lock_id: "a".into(),
            ttl_ms,
            lock_delay_ms,
        };
        assert_eq!(with(15_000, 15_000).check(), Ok(()));
        assert_eq!(
            with(999, 0).check(),
            Err("lock TTL must be between 1s and 24h".to_string())
        );
        assert_eq!(
            with(1_000, LOCK_DURATION_MAX_MS + 1).check(),
            Err("lock delay must be at most 24h".to_string())
        );
        assert!(renew("l".into(), String::new()).check().is_err());
    }
}
