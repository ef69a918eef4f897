//! `Job.*` and `Alloc.*` on the leader, and the scheduler worker that turns evaluations into
//! plans.
//!
//! A job register or stop is validated, proposed with its evaluation and answered with the
//! evaluation's ID once applied; the worker proposes one plan at a time.

#[allow(unused_imports)]
use crate::prelude::*;

use super::outbox::{Outbox, Owner};
use super::{ReqId, RpcError, ServerReply, ServerRequest};
use crate::fsm::{Command, Response, ServerState};
use crate::scheduler::worker::Worker;
use crate::structs::{Evaluation, JobType};
use crate::time::Instant;

mod scale;

/// Nomad's `EnforceIndex` check against the state as the endpoint sees it (the entry checks
/// it again when it applies: the endpoint's answer is only the early one).
fn check_index(state: &ServerState, job: &crate::structs::Job, expected: u64) -> Result<(), RpcError> {
    match state.enforce_index_error(&job.namespace, &job.id, expected) {
        Some(Response::Error(kind, text)) => Err(RpcError::new(kind, text, false)),
        _ => Ok(()),
    }
}

/// Nomad's `validateJobUpdate` for what a job is: periodic, parameterized or dispatched stays
/// so across versions.
fn check_kind_change(old: &crate::structs::Job, new: &crate::structs::Job) -> Result<(), RpcError> {
    let text = if old.is_periodic() && !new.is_periodic() {
        "cannot update periodic job to being non-periodic"
    } else if new.is_periodic() && !old.is_periodic() {
        "cannot update non-periodic job to being periodic"
    } else if old.is_parameterized() && !new.is_parameterized() {
        "cannot update parameterized job to being non-parameterized"
    } else if new.is_parameterized() && !old.is_parameterized() {
        "cannot update non-parameterized job to being parameterized"
    } else if old.dispatched != new.dispatched {
        "field 'Dispatched' is read-only"
    } else {
        return Ok(());
    };
    Err(RpcError::invalid(text))
}

/// A proposal of this machine in flight.
#[derive(Debug)]
pub(super) enum JobFlow {
    /// A dispatch: answered with the child and its evaluation.
    Dispatch {
        req: ReqId,
        eval_id: String,
        namespace: String,
        job_id: String,
    },
    /// A job register or deregister: answered with its evaluation.
    Write {
        req: ReqId,
        eval_id: String,
        namespace: String,
        job_id: String,
    },
    /// A scheduler worker proposal.
    Schedule,
}

#[derive(Debug)]
pub(super) struct JobEndpoints {
    worker: Worker,
    /// What one job may ask (`server { job_max_* }`): registration refuses more, and the
    /// worker schedules no more.
    limits: crate::jobspec::limits::JobLimits,
    /// Regression switch: `EnforceIndex` left out of the entry.
    enforce_index_at_endpoint_only: bool,
}

impl JobEndpoints {
    pub fn new(seed: u64) -> Self {
        JobEndpoints {
            worker: Worker::new(seed),
            limits: Default::default(),
            enforce_index_at_endpoint_only: false,
        }
    }

    pub fn set_limits(&mut self, limits: crate::jobspec::limits::JobLimits) {
        self.limits = limits;
        self.worker.set_limits(limits);
    }

    pub fn set_scheduler_faults(&mut self, faults: crate::config::SchedulerFaults) {
        self.enforce_index_at_endpoint_only = faults.enforce_index_at_endpoint_only;
        self.worker.set_faults(faults);
    }

    pub fn set_enabled(&mut self, now: Instant, leader: bool) {
        self.worker.set_enabled(now, leader);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.worker.poll_timeout()
    }

    /// A fresh ID from the worker's seeded generator (evaluations, the drainer's too).
    pub fn new_id(&mut self) -> String {
        self.worker.new_id()
    }

    /// The command to propose as it is, or `None` when handled here.
    pub fn request(
        &mut self,
        req: ReqId,
        request: ServerRequest,
        state: &ServerState,
        out: &mut Outbox,
    ) -> Option<Command> {
        let simple = Some;
        match request {
            ServerRequest::JobUpsert { job } => simple(Command::JobUpsert { job: *job }),
            ServerRequest::JobDeregister { namespace, job_id } => simple(Command::JobDeregister { namespace, job_id }),
            ServerRequest::JobRegister { job, enforce_index } => {
                let mut job = *job;
                if let Some(expected) = enforce_index
                    && let Err(error) = check_index(state, &job, expected)
                {
                    out.reply(req, ServerReply::Error(error));
                    return None;
                }
                if let Some(old) = state.job(&job.namespace, &job.id)
                    && let Err(error) = check_kind_change(old, &job)
                {
                    out.reply(req, ServerReply::Error(error));
                    return None;
                }
                let errors = crate::jobspec::admit(&mut job, &self.limits);
                if !errors.is_empty() {
                    out.reply(
                        req,
                        ServerReply::Error(RpcError::invalid(crate::jobspec::format_errors(&errors))),
                    );
                    return None;
                }
                if state.namespace(&job.namespace).is_none() {
                    let text = format!("job {:?} is in nonexistent namespace {:?}", job.id, job.namespace);
                    out.reply(req, ServerReply::Error(RpcError::invalid(text)));
                    return None;
                }
                // A periodic parent is never scheduled itself: no evaluation (Nomad answers
                // it with an empty `EvalID`).
                let eval = (!job.is_launcher()).then(|| {
                    self.new_eval(
                        &job.namespace,
                        &job.id,
                        job.job_type,
                        job.priority,
                        crate::structs::EvalTrigger::JobRegister,
                    )
                });
                let flow = JobFlow::Write {
                    req,
                    eval_id: eval.as_ref().map(|eval| eval.id.clone()).unwrap_or_default(),
                    namespace: job.namespace.clone(),
                    job_id: job.id.clone(),
                };
                out.propose_new(
                    Owner::Jobs(flow),
                    Command::JobRegister {
                        job,
                        eval,
                        enforce_index: enforce_index.filter(|_| !self.enforce_index_at_endpoint_only),
                    },
                );
                None
            }
            ServerRequest::JobStop {
                namespace,
                job_id,
                purge,
            } => {
                let Some(job) = state.job(&namespace, &job_id) else {
                    out.reply(req, ServerReply::Error(RpcError::not_found("job not found")));
                    return None;
                };
                let eval = self.new_eval(
                    &namespace,
                    &job_id,
                    job.job_type,
                    job.priority,
                    crate::structs::EvalTrigger::JobDeregister,
                );
                let flow = JobFlow::Write {
                    req,
                    eval_id: eval.id.clone(),
                    namespace: namespace.clone(),
                    job_id: job_id.clone(),
                };
                let command = Command::JobStop {
                    namespace,
                    job_id,
                    purge,
                    eval,
                };
                out.propose_new(Owner::Jobs(flow), command);
                None
            }
            ServerRequest::NodeEvaluate { node_id } => {
                if state.node(&node_id).is_none() {
                    out.reply(req, ServerReply::Error(RpcError::not_found("node not found")));
                    return None;
                }
                let evals = self.worker.node_evals(state, &[node_id].into());
                simple(Command::EvalUpsert { evals })
            }
            ServerRequest::JobEvaluate { namespace, job_id } => {
                let Some(job) = state.job(&namespace, &job_id) else {
                    out.reply(req, ServerReply::Error(RpcError::not_found("job not found")));
                    return None;
                };
                if job.is_periodic() {
                    out.reply(
                        req,
                        ServerReply::Error(RpcError::invalid("can't evaluate periodic job")),
                    );
                    return None;
                }
                if job.is_parameterized() {
                    let error = RpcError::invalid("can't evaluate parameterized job");
                    out.reply(req, ServerReply::Error(error));
                    return None;
                }
                let eval = self.new_eval(
                    &namespace,
                    &job_id,
                    job.job_type,
                    job.priority,
                    crate::structs::EvalTrigger::JobRegister,
                );
                let flow = JobFlow::Write {
                    req,
                    eval_id: eval.id.clone(),
                    namespace,
                    job_id,
                };
                out.propose_new(Owner::Jobs(flow), Command::EvalUpsert { evals: vec![eval] });
                None
            }
            ServerRequest::AllocUpsert { allocs } => simple(Command::AllocUpsert { allocs }),
            ServerRequest::AllocClientUpdate {
                alloc_id,
                client_status,
            } => simple(Command::AllocClientUpdate {
                alloc_id,
                client_status,
            }),
            // Nomad's `Node.UpdateAlloc`: a node reports only the allocations placed on it;
            // others are dropped (the node's secret was checked before, `RpcEndpoints::request`).
            ServerRequest::AllocClientUpdates {
                node_id, mut updates, ..
            } => {
                updates.retain(|update| {
                    let mine = state.alloc(&update.alloc_id).is_none_or(|alloc| alloc.node_id == node_id);
                    if !mine {
                        tracing::warn!(node = %node_id, alloc = %update.alloc_id, "a node reported another node's allocation; dropped");
                    }
                    mine
                });
                simple(Command::AllocClientUpdates { updates })
            }
            ServerRequest::AllocDelete { alloc_ids } => simple(Command::AllocDelete { alloc_ids }),
            ServerRequest::AllocStop { alloc_id } => {
                self.stop_alloc(req, alloc_id, state, out);
                None
            }
            other => unreachable!("not a job request: {other:?}"),
        }
    }

    /// `Alloc.Stop`, as Nomad does it: the allocation's desired transition becomes migrate,
    /// and the evaluation that goes with it stops it and places its replacement.
    fn stop_alloc(&mut self, req: ReqId, alloc_id: String, state: &ServerState, out: &mut Outbox) {
        let Some(alloc) = state.alloc(&alloc_id) else {
            out.reply(
                req,
                ServerReply::Error(RpcError::not_found(format!("Unknown allocation {alloc_id:?}"))),
            );
            return;
        };
        let Some(job) = state.job(&alloc.namespace, &alloc.job_id) else {
            out.reply(
                req,
                ServerReply::Error(RpcError::not_found(format!("job {:?} not found", alloc.job_id))),
            );
            return;
        };
        let eval = self.new_eval(
            &job.namespace,
            &job.id,
            job.job_type,
            job.priority,
            crate::structs::EvalTrigger::AllocStop,
        );
        let flow = JobFlow::Write {
            req,
            eval_id: eval.id.clone(),
            namespace: job.namespace.clone(),
            job_id: job.id.clone(),
        };
        let transitions = [(alloc_id, crate::structs::DesiredTransition { migrate: true })].into();
        let command = Command::AllocUpdateDesiredTransition {
            transitions,
            evals: vec![eval],
        };
        out.propose_new(Owner::Jobs(flow), command);
    }

    pub(super) fn new_eval(
        &mut self,
        namespace: &str,
        job_id: &str,
        job_type: JobType,
        priority: u32,
        trigger: crate::structs::EvalTrigger,
    ) -> Evaluation {
        Evaluation {
            id: self.worker.new_id(),
            namespace: namespace.to_string(),
            priority,
            eval_type: job_type,
            triggered_by: trigger,
            job_id: job_id.to_string(),
            status: crate::structs::EvalStatus::Pending,
            ..Evaluation::default()
        }
    }

    /// A proposal of this machine came back.
    pub fn proposed(
        &mut self,
        flow: JobFlow,
        outcome: Result<(u64, Response), RpcError>,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        match flow {
            JobFlow::Schedule => {
                if let Err(failure) = outcome {
                    tracing::warn!(error = %failure.message, "scheduler proposal failed");
                }
                self.worker.proposed();
            }
            JobFlow::Dispatch {
                req,
                eval_id,
                namespace,
                job_id,
            } => {
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::JobDispatched {
                        index,
                        job_create_index: state.job(&namespace, &job_id).map_or(index, |job| job.create_index),
                        dispatched_job_id: job_id,
                        eval_id,
                    },
                    Err(error) => ServerReply::Error(error),
                };
                out.reply(req, reply);
            }
            JobFlow::Write {
                req,
                eval_id,
                namespace,
                job_id,
            } => {
                let job_modify_index = state.job(&namespace, &job_id).map_or(0, |job| job.job_modify_index);
                let reply = match outcome {
                    Ok((index, _)) => ServerReply::JobRegistered {
                        index,
                        eval_id,
                        job_modify_index,
                    },
                    Err(error) => ServerReply::Error(error),
                };
                out.reply(req, reply);
            }
        }
    }

    /// A proposal lost with leadership: the worker may plan again under a new leader.
    pub fn abandoned(&mut self, flow: &JobFlow) -> Option<ReqId> {
        match flow {
            JobFlow::Schedule => {
                self.worker.proposed();
                None
            }
            JobFlow::Write { req, .. } | JobFlow::Dispatch { req, .. } => Some(*req),
        }
    }

    /// `Job.Dispatch`, with Nomad's checks and texts: the parent must be a parameterized
    /// job that is not stopped, and the payload and meta must meet its block.
    pub fn dispatch(
        &mut self,
        req: ReqId,
        request: ServerRequest,
        wall_ms: u64,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let ServerRequest::JobDispatch(request) = request else {
            unreachable!("not a dispatch: {request:?}");
        };
        let super::JobDispatchRequest {
            namespace,
            job_id,
            payload,
            meta,
            idempotency_token,
        } = *request;
        let parent = match state.job(&namespace, &job_id) {
            None => Err(RpcError::not_found("parameterized job not found")),
            Some(job) if !job.is_parameterized() => Err(RpcError::invalid(format!(
                "Specified job {job_id:?} is not a parameterized job"
            ))),
            Some(job) if job.stop => Err(RpcError::invalid(format!("Specified job {job_id:?} is stopped"))),
            Some(job) => Ok(job),
        };
        let parent = match parent.and_then(|job| {
            let config = job.parameterized.as_deref().cloned().unwrap_or_default();
            config.check_dispatch(&payload, &meta).map_err(RpcError::invalid)?;
            Ok(job)
        }) {
            Ok(parent) => parent,
            Err(error) => {
                out.reply(req, ServerReply::Error(error));
                return;
            }
        };
        // Nomad's idempotency: a child with the token not yet garbage collected, finished or
        // not, is the answer.
        if !idempotency_token.is_empty()
            && let Some(existing) = state
                .children(&namespace, &job_id)
                .find(|child| child.dispatch_idempotency_token == idempotency_token)
        {
            let reply = ServerReply::JobDispatched {
                index: existing.modify_index,
                dispatched_job_id: existing.id.clone(),
                eval_id: String::new(),
                job_create_index: existing.create_index,
            };
            out.reply(req, reply);
            return;
        }
        let suffix: String = self
            .worker
            .new_id()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(8)
            .collect();
        let id = format!(
            "{job_id}{}{}-{suffix}",
            crate::structs::DISPATCH_LAUNCH_SUFFIX,
            wall_ms / 1000
        );
        let child = parent.dispatch_child(id.clone(), payload, &meta, &idempotency_token);
        let eval = (!child.is_launcher()).then(|| {
            self.new_eval(
                &namespace,
                &id,
                child.job_type,
                child.priority,
                crate::structs::EvalTrigger::JobRegister,
            )
        });
        let flow = JobFlow::Dispatch {
            req,
            eval_id: eval.as_ref().map(|eval| eval.id.clone()).unwrap_or_default(),
            namespace,
            job_id: id,
        };
        out.propose_new(
            Owner::Jobs(flow),
            Command::JobRegister {
                job: child,
                eval,
                enforce_index: None,
            },
        );
    }

    /// One scheduling step: at most one plan in flight.
    pub fn run(&mut self, now: Instant, state: &ServerState, out: &mut Outbox) {
        if let Some(command) = self.worker.run(now, state) {
            out.propose_new(Owner::Jobs(JobFlow::Schedule), command);
        }
    }
}
