//! Operators acting on a running allocation (`alloc restart`, `alloc signal`): the request
//! reaches the task runners, and the answer goes back once the restart has begun or every
//! signal was delivered (or one failed).

use super::*;
use crate::client::AllocControl;
use crate::error::AllocCallError;

impl Client {
    pub(super) fn alloc_control(&mut self, now: Instant, req: u64, request: AllocControl) {
        let alloc_id = request.alloc_id().to_string();
        let Some(runner) = self.allocs.get_mut(&alloc_id) else {
            self.actions.push_back(ClientAction::AllocControlled {
                req,
                result: Err(AllocCallError::unknown_alloc(&alloc_id)),
            });
            return;
        };
        let result = match request {
            AllocControl::Restart { task, .. } => runner.restart_by_user(now, task.as_deref(), &mut self.ops),
            AllocControl::Signal { task, signal, .. } => {
                // Nomad's default signal is SIGKILL.
                let name = if signal.is_empty() {
                    "SIGKILL".to_string()
                } else {
                    signal
                };
                let Some(number) = crate::structs::signal_number(&name) else {
                    self.actions.push_back(ClientAction::AllocControlled {
                        req,
                        result: Err(AllocCallError::invalid(format!("Invalid signal {name:?}"))),
                    });
                    return;
                };
                match runner.signal_by_user(now, task.as_deref(), &name, &mut self.ops) {
                    Ok(handles) => {
                        self.controls.insert(req, (handles.len(), None));
                        for handle in handles {
                            let op = self.ops.allocate();
                            self.routes.insert(op, Route::Control(req));
                            self.actions.push_back(ClientAction::Io {
                                op,
                                io: Io::SignalTask { handle, signal: number },
                            });
                        }
                        self.collect(now, &alloc_id);
                        return;
                    }
                    Err(error) => Err(error),
                }
            }
        };
        self.collect(now, &alloc_id);
        self.actions.push_back(ClientAction::AllocControlled { req, result });
    }

    /// One signal was sent (or not): answered once every send of the request is done.
    pub(super) fn control_outcome(&mut self, req: u64, outcome: Outcome) {
        let Some((left, error)) = self.controls.get_mut(&req) else {
            return;
        };
        *left -= 1;
        if let Err(failure) = outcome
            && error.is_none()
        {
            *error = Some(failure.message);
        }
        if *left == 0 {
            let (_, error) = self.controls.remove(&req).expect("present");
            let result = match error {
                Some(error) => Err(AllocCallError::failed(error)),
                None => Ok(()),
            };
            self.actions.push_back(ClientAction::AllocControlled { req, result });
        }
    }
}
