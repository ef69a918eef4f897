//! `Periodic.Force` and registering periodic parents through the leader's endpoints.

use super::*;
use crate::structs::{Job, PeriodicConfig};

fn job(id: &str, periodic: Option<PeriodicConfig>) -> Job {
    Job {
        periodic: periodic.map(alloc::boxed::Box::new),
        ..batch_job(id)
    }
}

fn register(h: &mut Harness, req: ReqId, job: Job) -> ServerReply {
    let request = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(job),
        enforce_index: None,
    };
    ask(h, req, request)
}

fn force(h: &mut Harness, req: ReqId, id: &str) -> ServerReply {
    let request = ServerRequest::PeriodicForce {
        namespace: "default".into(),
        job_id: id.into(),
    };
    ask(h, req, request)
}

#[test]
fn a_periodic_parent_registers_without_an_evaluation_and_is_forced_now() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_250);
    let periodic = PeriodicConfig {
        spec: "0 0 1 1 *".into(),
        ..PeriodicConfig::default()
    };
    let reply = register(&mut h, 1, job("nightly", Some(periodic)));
    assert!(
        matches!(reply, ServerReply::JobRegistered { ref eval_id, .. } if eval_id.is_empty()),
        "{reply:?}"
    );
    let reply = force(&mut h, 2, "nightly");
    let ServerReply::JobRegistered { eval_id, .. } = reply else {
        panic!("forced launch answered {reply:?}");
    };
    let child =
        h.fx.state
            .job("default", "nightly/periodic-1700000000")
            .expect("the child is named after the second it was forced in");
    assert_eq!(child.parent_id, "nightly");
    let eval =
        h.fx.state
            .eval(&eval_id)
            .expect("the answer names the child's evaluation");
    assert_eq!(eval.job_id, child.id);
    assert!(
        h.fx.state.evals().all(|eval| eval.job_id != "nightly"),
        "the parent itself is never evaluated"
    );
}

#[test]
fn force_and_evaluate_refuse_what_is_not_periodic_with_nomads_texts() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_000);
    register(&mut h, 1, job("plain", None));
    let disabled = PeriodicConfig {
        enabled: false,
        spec: "* * * * *".into(),
        ..PeriodicConfig::default()
    };
    register(&mut h, 2, job("off", Some(disabled.clone())));
    let text = error_text;
    assert_eq!(text(force(&mut h, 3, "plain")), "can't force launch non-periodic job");
    assert_eq!(
        text(force(&mut h, 4, "off")),
        "can't force run non-tracked job \"off\" (default)"
    );
    assert_eq!(text(force(&mut h, 5, "nope")), "job \"nope\" not found");
    let evaluate = ServerRequest::JobEvaluate {
        namespace: "default".into(),
        job_id: "off".into(),
    };
    assert_eq!(text(ask(&mut h, 6, evaluate)), "can't evaluate periodic job");
    // What a job is stays across versions (Nomad's `validateJobUpdate`).
    assert_eq!(
        text(register(&mut h, 7, job("off", None))),
        "cannot update periodic job to being non-periodic"
    );
    assert_eq!(
        text(register(&mut h, 8, job("plain", Some(disabled)))),
        "cannot update non-periodic job to being periodic"
    );
    let mut dispatched = job("plain", None);
    dispatched.dispatched = true;
    assert_eq!(text(register(&mut h, 9, dispatched)), "field 'Dispatched' is read-only");
}
