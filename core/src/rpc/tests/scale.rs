//! `Job.Scale` through the leader's endpoints: a new version with the group's count and a
//! `job-scaling` evaluation, within the scaling policy, with Nomad's texts.

use super::*;
use crate::rpc::messages::JobScaleRequest;
use crate::structs::{Job, ScalingPolicy};

fn scalable() -> Job {
    let mut job = batch_job("web");
    job.task_groups[0].count = 2;
    job.task_groups[0].scaling = Some(alloc::boxed::Box::new(ScalingPolicy {
        min: 1,
        max: 4,
        enabled: true,
        policy: Default::default(),
    }));
    job
}

fn scale(h: &mut Harness, req: ReqId, group: &str, count: Option<i64>, index: u64) -> ServerReply {
    let request = JobScaleRequest {
        namespace: "default".into(),
        job_id: "web".into(),
        group: group.into(),
        count,
        job_modify_index: index,
        message: format!("to {count:?}"),
        ..Default::default()
    };
    ask(h, req, ServerRequest::JobScale(alloc::boxed::Box::new(request)))
}

#[test]
fn a_scale_registers_a_new_version_with_the_count_and_an_evaluation() {
    let mut h = Harness::new();
    let register = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(scalable()),
        enforce_index: None,
    };
    let ServerReply::JobRegistered { job_modify_index, .. } = ask(&mut h, 1, register) else {
        panic!("registered")
    };
    let reply = scale(&mut h, 2, "g", Some(3), job_modify_index);
    let ServerReply::JobRegistered { eval_id, .. } = reply else {
        panic!("{reply:?}")
    };
    let job = h.fx.state.job("default", "web").unwrap();
    assert_eq!((job.task_groups[0].count, job.version), (3, 1));
    let eval = h.fx.state.eval(&eval_id).expect("the evaluation");
    assert_eq!(eval.triggered_by, crate::structs::EvalTrigger::JobScaling);
    // No count: nothing changes, and no evaluation.
    let reply = scale(&mut h, 3, "g", None, 0);
    assert!(
        matches!(reply, ServerReply::JobRegistered { ref eval_id, .. } if eval_id.is_empty()),
        "{reply:?}"
    );
    assert_eq!(h.fx.state.job("default", "web").unwrap().version, 1);
    // Both were recorded as the group's scaling events, newest first, across versions.
    let events = &h.fx.state.scaling_events("default", "web").expect("events")["g"];
    let seen: Vec<(Option<i64>, i64, &str, bool)> = events
        .iter()
        .map(|event| {
            (
                event.count,
                event.previous_count,
                event.message.as_str(),
                event.eval_id.is_some(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![(None, 3, "to None", false), (Some(3), 2, "to Some(3)", true)]
    );
    assert_eq!(events[1].eval_id.as_deref(), Some(eval_id.as_str()));
    // A purge drops them with the job.
    let stop = ServerRequest::JobStop {
        namespace: "default".into(),
        job_id: "web".into(),
        purge: true,
    };
    ask(&mut h, 4, stop);
    assert!(h.fx.state.scaling_events("default", "web").is_none());
}

#[test]
fn a_scale_outside_the_policy_or_of_a_missing_group_is_refused_with_nomads_texts() {
    let mut h = Harness::new();
    let register = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(scalable()),
        enforce_index: None,
    };
    ask(&mut h, 1, register);
    let stored = h.fx.state.job("default", "web").unwrap().job_modify_index;
    let texts: Vec<String> = [
        ("g", Some(5), 0),
        ("g", Some(0), 0),
        ("g", Some(-1), 0),
        ("nope", Some(2), 0),
        ("g", Some(3), 999),
    ]
    .into_iter()
    .enumerate()
    .map(|(n, (group, count, index))| error_text(scale(&mut h, 10 + n as u64, group, count, index)))
    .collect();
    assert_eq!(
        texts,
        vec![
            "group count was greater than scaling policy maximum: 5 > 4",
            "group count was less than scaling policy minimum: 0 < 1",
            "scaling action count can't be negative",
            "task group \"nope\" specified for scaling does not exist in job",
            &format!("Enforcing job modify index 999: job exists with conflicting job modify index: {stored}"),
        ]
    );
    assert_eq!(
        h.fx.state.job("default", "web").unwrap().task_groups[0].count,
        2,
        "unchanged"
    );
}
