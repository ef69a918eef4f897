//! The leader's expiry of variable locks ([`super::super::varlocks`]).

use super::*;
use crate::fsm::{Entry, VariableLockCommand};

struct Locks {
    state: ServerState,
    index: u64,
    machine: RpcEndpoints,
    now: Instant,
    /// The wall clock at `Instant::ZERO`.
    epoch_ms: u64,
    expiries: Vec<(u64, String)>,
}

impl Locks {
    fn new(epoch_ms: u64) -> Self {
        let machine = RpcEndpoints::new(
            Duration::from_secs(10),
            GcConfig::default(),
            HeartbeatConfig::default(),
            crate::config::CsiFaults::default(),
            7,
        );
        Locks {
            state: ServerState::default(),
            index: 0,
            machine,
            now: Instant::ZERO,
            epoch_ms,
            expiries: Vec::new(),
        }
    }

    fn wall(&self) -> u64 {
        self.epoch_ms + self.now.saturating_duration_since(Instant::ZERO).as_millis() as u64
    }

    fn apply(&mut self, command: VariableLockCommand) {
        self.index += 1;
        let entry = Entry {
            at_unix_ms: self.wall(),
            command: Command::VariableLock(command),
        };
        self.state.apply(self.index, &entry);
    }

    fn lead(&mut self) {
        self.machine.set_wall_clock(self.now, self.wall());
        self.machine
            .handle(self.now, Input::Leadership { leader: true }, &self.state);
        self.pump();
    }

    /// Moves time to `at` (ms after the epoch) through every timeout on the way.
    fn advance_to(&mut self, at_ms: u64) {
        let until = Instant::ZERO + Duration::from_millis(at_ms - self.epoch_ms);
        while let Some(wake) = self.machine.poll_timeout().filter(|wake| *wake <= until) {
            self.now = self.now.max(wake);
            self.machine.set_wall_clock(self.now, self.wall());
            self.machine.handle_timeout(self.now, &self.state);
            self.pump();
        }
        self.now = until;
    }

    fn pump(&mut self) {
        while let Some(action) = self.machine.poll_action() {
            // The other background machines' calls (Consul's token sweep) are not this test's.
            let Action::Propose { op, command } = action else {
                continue;
            };
            if let Command::VariableLock(VariableLockCommand::Expire { path, .. }) = &*command {
                self.expiries.push((self.wall(), path.clone()));
            }
            self.index += 1;
            let entry = Entry {
                at_unix_ms: self.wall(),
                command: *command,
            };
            let response = self.state.apply(self.index, &entry);
            self.machine.handle(
                self.now,
                Input::Proposed {
                    op,
                    result: Ok((self.index, response)),
                },
                &self.state,
            );
        }
    }

    fn locked(&self, path: &str) -> bool {
        self.state
            .variable(path)
            .is_some_and(|variable| variable.lock.is_some())
    }
}

fn acquire(path: &str, ttl_ms: u64) -> VariableLockCommand {
    VariableLockCommand::Acquire {
        path: path.into(),
        items: None,
        lock_id: format!("id-{path}"),
        ttl_ms,
        lock_delay_ms: 5_000,
    }
}

#[test]
fn a_lock_not_renewed_expires_at_its_ttl_and_a_renewed_one_lives_on() {
    let mut locks = Locks::new(1_000_000);
    locks.apply(acquire("a", 10_000));
    locks.apply(acquire("b", 20_000));
    locks.lead();
    // "b" is renewed in time, again and again; "a" is not.
    for at in [1_015_000, 1_030_000] {
        locks.advance_to(at);
        locks.apply(VariableLockCommand::Renew {
            path: "b".into(),
            lock_id: "id-b".into(),
        });
    }
    assert_eq!(locks.expiries, vec![(1_010_000, "a".to_string())]);
    assert!(!locks.locked("a"));
    assert!(locks.locked("b"));
    assert_eq!(locks.state.variable("a").unwrap().lock_free_unix_ms, 1_015_000);
    // Left alone, "b" goes one TTL after its last renewal.
    locks.advance_to(1_100_000);
    assert_eq!(locks.expiries[1], (1_050_000, "b".to_string()));
    assert!(!locks.locked("b"));
}

#[test]
fn a_new_leader_gives_every_lock_one_more_ttl() {
    let mut locks = Locks::new(1_000_000);
    locks.apply(acquire("a", 10_000));
    // No leader for a minute: the holder could not renew.
    locks.advance_to(1_060_000);
    locks.lead();
    locks.advance_to(1_069_999);
    assert!(locks.locked("a"), "{:?}", locks.expiries);
    locks.advance_to(1_080_000);
    assert_eq!(locks.expiries, vec![(1_070_000, "a".to_string())]);
    // A follower expires nothing.
    let mut follower = Locks::new(1_000_000);
    follower.apply(acquire("a", 10_000));
    follower.advance_to(1_100_000);
    assert!(follower.expiries.is_empty() && follower.locked("a"));
}
