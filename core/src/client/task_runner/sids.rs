//! The `consul_si_token` hook (Nomad's sids hook, 0.10.4–1.8 design, reference §5.1): a
//! Connect task on a client with Consul ACLs gets a service identity token in
//! `secrets/si_token` (mode 0440) before it starts.
//!
//! Once per task runner: a token already in the file (written before an agent restart) is
//! used as it is; otherwise the servers derive one (`Node.DeriveSIToken`), retried on
//! recoverable errors after 0, 100 ms, then `attempt × 5 s` (at most 3 minutes) for at most
//! 5 minutes. A refusal, or running out of time, kills the task with a `Killing` event that
//! fails it.

use super::*;
use core::time::Duration;

use crate::rpc::{ServerReply, ServerRequest};

/// The token's file in the task's `secrets` directory.
pub const SI_TOKEN_FILE: &str = "si_token";
/// Read-only for the task's user and group, as Nomad writes it.
pub const SI_TOKEN_MODE: u32 = 0o440;
/// How long a derivation may keep retrying (Nomad's `sidsDerivationTimeout`).
pub const SI_DERIVATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The longest wait between two attempts.
pub const SI_BACKOFF_CAP: Duration = Duration::from_secs(3 * 60);
const _: () = assert!(
    SI_BACKOFF_CAP.as_nanos() < SI_DERIVATION_TIMEOUT.as_nanos(),
    "a derivation is retried at least once before it times out"
);

/// Where the hook is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Looking for a token written before an agent restart.
    Reading {
        op: OpId,
    },
    Deriving {
        op: OpId,
        attempt: u32,
        give_up_at: Instant,
    },
    /// Before attempt `attempt`.
    Waiting {
        until: Instant,
        attempt: u32,
        give_up_at: Instant,
    },
    Writing {
        op: OpId,
    },
}

impl Step {
    pub(super) fn op(&self) -> Option<OpId> {
        match self {
            Step::Reading { op } | Step::Deriving { op, .. } | Step::Writing { op } => Some(*op),
            Step::Waiting { .. } => None,
        }
    }
}

/// Nomad's sids backoff: nothing before the first attempt, 100 ms before the second, then
/// `attempt × 5 s`, capped.
pub fn si_backoff(attempt: u32) -> Duration {
    match attempt {
        0 => Duration::ZERO,
        1 => Duration::from_millis(100),
        n => (Duration::from_secs(5) * n).min(SI_BACKOFF_CAP),
    }
}

impl TaskRunner {
    fn si_token_path(&self) -> String {
        let dir = self.spec.paths.task_dir(&self.spec.alloc_id, &self.spec.task.name);
        paths::join(&paths::join(&dir, "secrets"), SI_TOKEN_FILE)
    }

    fn si_io(&mut self, index: usize, step: impl FnOnce(OpId) -> Step, io: Io, ops: &mut OpIds) {
        let op = ops.allocate();
        self.phase = Phase::SiToken { index, step: step(op) };
        self.actions.push(TaskAction::Io { op, io });
    }

    /// The hook's prestart: a token from before a restart first.
    pub(super) fn si_token_prestart(&mut self, index: usize, ops: &mut OpIds) {
        let path = self.si_token_path();
        self.si_io(index, |op| Step::Reading { op }, Io::ReadFile { path }, ops);
    }

    fn si_derive(&mut self, index: usize, attempt: u32, give_up_at: Instant, ops: &mut OpIds) {
        let node = &self.spec.node.node;
        let request = ServerRequest::DeriveSiToken {
            node_id: node.id.clone(),
            secret_id: node.secret_id.clone(),
            alloc_id: self.spec.alloc_id.clone(),
            tasks: vec![self.spec.task.name.clone()],
        };
        self.si_io(
            index,
            |op| Step::Deriving {
                op,
                attempt,
                give_up_at,
            },
            Io::Server(request),
            ops,
        );
    }

    pub(super) fn si_token_outcome(
        &mut self,
        now: Instant,
        index: usize,
        step: Step,
        outcome: Outcome,
        ops: &mut OpIds,
    ) {
        match step {
            Step::Reading { .. } => match outcome {
                Ok(Reply::File(Some(token))) if !token.trim().is_empty() => self.si_token_done(now, index, ops),
                Ok(Reply::File(_)) => self.si_derive(index, 0, now + SI_DERIVATION_TIMEOUT, ops),
                Ok(other) => self.si_failed(now, format!("unexpected reply {other:?}"), true, ops),
                Err(error) => self.si_failed(now, format!("failed to read SI token: {error}"), true, ops),
            },
            Step::Deriving {
                attempt, give_up_at, ..
            } => {
                let retry = match outcome {
                    Ok(Reply::Server(ServerReply::SiTokens { tokens, .. })) => {
                        match tokens.get(&self.spec.task.name) {
                            Some(token) => {
                                let io = Io::WriteFile {
                                    path: self.si_token_path(),
                                    content: token.clone(),
                                    mode: SI_TOKEN_MODE,
                                };
                                self.si_io(index, |op| Step::Writing { op }, io, ops);
                            }
                            None => {
                                self.si_failed(now, "the servers returned no token for this task".into(), false, ops)
                            }
                        }
                        return;
                    }
                    Ok(Reply::Server(ServerReply::Error(error))) if !error.retryable => {
                        self.si_failed(now, error.message, false, ops);
                        return;
                    }
                    Ok(Reply::Server(ServerReply::Error(error))) => error.message,
                    Ok(other) => format!("unexpected reply {other:?}"),
                    Err(error) => error.to_string(),
                };
                let next = attempt + 1;
                let until = now + si_backoff(next);
                if until >= give_up_at {
                    let message = format!("gave up after {SI_DERIVATION_TIMEOUT:?}: {retry}");
                    self.si_failed(now, message, false, ops);
                    return;
                }
                self.phase = Phase::SiToken {
                    index,
                    step: Step::Waiting {
                        until,
                        attempt: next,
                        give_up_at,
                    },
                };
            }
            Step::Writing { .. } => match outcome {
                Ok(_) => self.si_token_done(now, index, ops),
                Err(error) => self.si_failed(now, format!("failed to write SI token: {error}"), true, ops),
            },
            Step::Waiting { .. } => {}
        }
    }

    /// The next attempt, once its wait is over.
    pub(super) fn si_token_timeout(&mut self, now: Instant, ops: &mut OpIds) {
        if let Phase::SiToken {
            index,
            step:
                Step::Waiting {
                    until,
                    attempt,
                    give_up_at,
                },
        } = self.phase
            && now >= until
        {
            self.si_derive(index, attempt, give_up_at, ops);
        }
    }

    /// The token is in place: never again for this task (a restart reads the file).
    fn si_token_done(&mut self, now: Instant, index: usize, ops: &mut OpIds) {
        let state = HookState {
            prestart_done: true,
            ..HookState::default()
        };
        let name = TaskHook::SiToken.name();
        if self.local.hooks.get(name) != Some(&state) {
            self.local.hooks.insert(name.to_string(), state);
            self.persist();
        }
        self.next_hook(index);
        self.run_prestart(now, ops);
    }

    /// Nomad kills the task with a `Killing` event that fails it; a file that cannot be read
    /// or written is a setup failure the restart policy may retry.
    fn si_failed(&mut self, now: Instant, why: String, recoverable: bool, ops: &mut OpIds) {
        let message = format!("consul: failed to derive SI token: {why}");
        if recoverable {
            self.prestart_failed(now, HookError::recoverable(message), ops);
            return;
        }
        self.event(now, events::KILLING, &message);
        self.prestart_failed(now, HookError::fatal(message), ops);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_is_nomads() {
        let waits: Vec<u64> = (0..40).map(|attempt| si_backoff(attempt).as_millis() as u64).collect();
        assert_eq!(&waits[..4], [0, 100, 10_000, 15_000]);
        assert_eq!(waits[36], 180_000);
        assert_eq!(waits[39], 180_000);
    }
}
