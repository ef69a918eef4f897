//! `Job.Scale`: a task group's count changed by an operator (`job scale`) or an autoscaler,
//! within the group's scaling policy, as a new version of the job with an evaluation
//! (triggered by `job-scaling`), with Nomad's checks and texts. Every request records a
//! scaling event for the group (its message, error and meta, the previous and new count, the
//! evaluation); one without a count (an autoscaler's report) records only that.

#[allow(unused_imports)]
use crate::prelude::*;

use super::{JobEndpoints, JobFlow, check_index};
use crate::fsm::{Command, ServerState};
use crate::rpc::messages::JobScaleRequest;
use crate::rpc::outbox::{Outbox, Owner};
use crate::rpc::{ReqId, RpcError, ServerReply};

impl JobEndpoints {
    pub(in crate::rpc) fn scale(
        &mut self,
        req: ReqId,
        request: JobScaleRequest,
        state: &ServerState,
        out: &mut Outbox,
    ) {
        let Some(stored) = state.job(&request.namespace, &request.job_id) else {
            let text = format!("job {:?} not found", request.job_id);
            out.reply(req, ServerReply::Error(RpcError::not_found(text)));
            return;
        };
        let stored_index = stored.job_modify_index;
        let scaled = match scaled(&request, stored, state) {
            Ok(scaled) => scaled,
            Err(error) => return out.reply(req, ServerReply::Error(error)),
        };
        let previous_count = stored
            .task_groups
            .iter()
            .find(|group| group.name == request.group)
            .map_or(0, |group| i64::from(group.count));
        let event = crate::structs::ScalingEvent {
            count: request.count,
            previous_count,
            message: request.message.clone(),
            error: request.error,
            meta: request.meta.clone(),
            ..Default::default()
        };
        let (job, eval) = match scaled {
            None => (None, None),
            Some(mut job) => {
                let errors = crate::jobspec::admit(&mut job, &self.limits);
                if !errors.is_empty() {
                    let text = crate::jobspec::format_errors(&errors);
                    out.reply(req, ServerReply::Error(RpcError::invalid(text)));
                    return;
                }
                let eval = self.new_eval(
                    &job.namespace,
                    &job.id,
                    job.job_type,
                    job.priority,
                    crate::structs::EvalTrigger::JobScaling,
                );
                (Some(job), Some(eval))
            }
        };
        let flow = JobFlow::Write {
            req,
            eval_id: eval.as_ref().map(|eval| eval.id.clone()).unwrap_or_default(),
            namespace: request.namespace.clone(),
            job_id: request.job_id.clone(),
        };
        let command = Command::JobScale {
            namespace: request.namespace,
            job_id: request.job_id,
            group: request.group,
            based_on: job.as_ref().map(|_| stored_index),
            job,
            eval,
            event,
        };
        out.propose_new(Owner::Jobs(flow), command);
    }
}

/// The job with the group's new count (`None`: no count asked, nothing to change), or why not.
fn scaled(
    request: &JobScaleRequest,
    stored: &crate::structs::Job,
    state: &ServerState,
) -> Result<Option<crate::structs::Job>, RpcError> {
    let Some(position) = stored.task_groups.iter().position(|group| group.name == request.group) else {
        return Err(RpcError::invalid(format!(
            "task group {:?} specified for scaling does not exist in job",
            request.group
        )));
    };
    let Some(count) = request.count else {
        return Ok(None);
    };
    if count < 0 {
        return Err(RpcError::invalid("scaling action count can't be negative"));
    }
    if let Some(policy) = &stored.task_groups[position].scaling {
        if count < policy.min {
            return Err(RpcError::invalid(format!(
                "group count was less than scaling policy minimum: {count} < {}",
                policy.min
            )));
        }
        if policy.max < count {
            return Err(RpcError::invalid(format!(
                "group count was greater than scaling policy maximum: {count} > {}",
                policy.max
            )));
        }
    }
    let active = state
        .latest_deployment(&stored.namespace, &stored.id)
        .is_some_and(|deployment| deployment.active() && deployment.job_create_index == stored.create_index);
    if active {
        return Err(RpcError::invalid("job scaling blocked due to active deployment"));
    }
    if request.job_modify_index > 0 {
        check_index(state, stored, request.job_modify_index)?;
    }
    let mut job = stored.clone();
    job.task_groups[position].count =
        u32::try_from(count).map_err(|_| RpcError::invalid(format!("scaling action count {count} is too large")))?;
    Ok(Some(job))
}
