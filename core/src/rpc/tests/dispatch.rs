//! `Job.Dispatch` through the leader's endpoints: Nomad's checks and texts, the child it
//! registers, and the idempotency token.

use super::*;
use crate::structs::{Job, ParameterizedJobConfig};

fn parent(payload: &str, required: &[&str], optional: &[&str]) -> Job {
    Job {
        meta: [("owner".to_string(), "ops".to_string())].into(),
        parameterized: Some(alloc::boxed::Box::new(ParameterizedJobConfig {
            payload: payload.into(),
            meta_required: required.iter().map(|key| key.to_string()).collect(),
            meta_optional: optional.iter().map(|key| key.to_string()).collect(),
        })),
        ..batch_job("render")
    }
}

fn dispatch(h: &mut Harness, req: ReqId, payload: &[u8], meta: &[(&str, &str)], token: &str) -> ServerReply {
    let request = ServerRequest::JobDispatch(alloc::boxed::Box::new(JobDispatchRequest {
        namespace: "default".into(),
        job_id: "render".into(),
        payload: payload.to_vec(),
        meta: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        idempotency_token: token.into(),
    }));
    ask(h, req, request)
}

#[test]
fn a_dispatch_registers_a_child_with_its_payload_and_meta() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_500);
    let register = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(parent("required", &["input"], &["color"])),
        enforce_index: None,
    };
    let reply = ask(&mut h, 1, register);
    assert!(
        matches!(reply, ServerReply::JobRegistered { ref eval_id, .. } if eval_id.is_empty()),
        "{reply:?}"
    );
    let reply = dispatch(&mut h, 2, b"\x00binary\xff", &[("input", "a.png")], "");
    let ServerReply::JobDispatched {
        dispatched_job_id,
        eval_id,
        ..
    } = reply
    else {
        panic!("{reply:?}");
    };
    let (prefix, suffix) = dispatched_job_id.split_at("render/dispatch-1700000000-".len());
    assert_eq!(prefix, "render/dispatch-1700000000-");
    assert_eq!(suffix.len(), 8, "{dispatched_job_id}");
    assert!(suffix.chars().all(|c| c.is_ascii_hexdigit()), "{dispatched_job_id}");
    let child = h.fx.state.job("default", &dispatched_job_id).expect("the child");
    assert!(child.dispatched && !child.is_launcher());
    assert_eq!(child.parent_id, "render");
    assert_eq!(child.payload, b"\x00binary\xff");
    assert_eq!(child.meta.get("input").map(String::as_str), Some("a.png"));
    assert_eq!(
        child.meta.get("owner").map(String::as_str),
        Some("ops"),
        "the parent's meta stays"
    );
    assert_eq!(
        h.fx.state.eval(&eval_id).map(|eval| eval.job_id.as_str()),
        Some(dispatched_job_id.as_str())
    );
    assert!(h.fx.state.evals().all(|eval| eval.job_id != "render"));
}

#[test]
fn dispatch_requests_are_checked_with_nomads_texts() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_000);
    let register = |job| ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(job),
        enforce_index: None,
    };
    ask(&mut h, 1, register(parent("forbidden", &["input"], &["color"])));
    assert_eq!(
        error_text(dispatch(&mut h, 2, b"x", &[("input", "a")], "")),
        "Payload provided but forbidden by parameterized job"
    );
    assert_eq!(
        error_text(dispatch(&mut h, 3, b"", &[], "")),
        "Dispatch did not provide required meta keys: [input]"
    );
    assert_eq!(
        error_text(dispatch(&mut h, 4, b"", &[("input", "a"), ("size", "9")], "")),
        "Dispatch request included unpermitted metadata keys: [size]"
    );
    ask(&mut h, 5, register(parent("required", &[], &[])));
    assert_eq!(
        error_text(dispatch(&mut h, 6, b"", &[], "")),
        "Payload is not provided but required by parameterized job"
    );
    let big = vec![0u8; 16 * 1024 + 1];
    assert_eq!(
        error_text(dispatch(&mut h, 7, &big, &[], "")),
        "Payload exceeds maximum size; 16385 > 16384"
    );
    // A parameterized job stays one (Nomad's update rule); once purged, the ID is free.
    let mut plain = parent("optional", &[], &[]);
    plain.parameterized = None;
    assert_eq!(
        error_text(ask(&mut h, 8, register(plain.clone()))),
        "cannot update parameterized job to being non-parameterized"
    );
    let purge = ServerRequest::JobStop {
        namespace: "default".into(),
        job_id: "render".into(),
        purge: true,
    };
    ask(&mut h, 9, purge);
    ask(&mut h, 10, register(plain));
    assert_eq!(
        error_text(ask(&mut h, 13, register(parent("optional", &[], &[])))),
        "cannot update non-parameterized job to being parameterized"
    );
    assert_eq!(
        error_text(dispatch(&mut h, 11, b"", &[], "")),
        "Specified job \"render\" is not a parameterized job"
    );
    let missing = ServerRequest::JobDispatch(alloc::boxed::Box::new(JobDispatchRequest {
        job_id: "nope".into(),
        ..JobDispatchRequest::default()
    }));
    assert_eq!(error_text(ask(&mut h, 12, missing)), "parameterized job not found");
}

#[test]
fn an_idempotency_token_names_the_child_it_made_instead_of_a_new_one() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_000);
    let register = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(parent("optional", &[], &[])),
        enforce_index: None,
    };
    ask(&mut h, 1, register);
    let first = dispatch(&mut h, 2, b"a", &[], "nightly-42");
    let again = dispatch(&mut h, 3, b"a", &[], "nightly-42");
    let other = dispatch(&mut h, 4, b"a", &[], "nightly-43");
    let id = |reply: &ServerReply| match reply {
        ServerReply::JobDispatched {
            dispatched_job_id,
            eval_id,
            ..
        } => (dispatched_job_id.clone(), eval_id.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(id(&again).0, id(&first).0);
    assert!(id(&again).1.is_empty(), "no new evaluation for the same child");
    assert_ne!(id(&other).0, id(&first).0);
    assert_eq!(h.fx.state.children("default", "render").count(), 2);
}

/// Periodic and parameterized together (Nomad's `IsPeriodicActive`): the parent is never
/// launched; each dispatched child is a periodic parent of its own, launching
/// `<child>/periodic-<unix>` with the dispatch's payload and meta.
#[test]
fn a_periodic_parameterized_job_launches_its_dispatched_children_periodically() {
    let mut h = Harness::new();
    h.machine.set_wall_clock(h.now, 1_700_000_000_000);
    let mut job = parent("optional", &[], &["color"]);
    job.periodic = Some(alloc::boxed::Box::new(crate::structs::PeriodicConfig {
        spec: "0 0 1 1 *".into(),
        ..crate::structs::PeriodicConfig::default()
    }));
    let register = ServerRequest::JobRegister {
        job: alloc::boxed::Box::new(job),
        enforce_index: None,
    };
    assert!(matches!(ask(&mut h, 1, register), ServerReply::JobRegistered { .. }));
    let parent_job = h.fx.state.job("default", "render").unwrap();
    assert!(
        !parent_job.is_periodic_active(),
        "the parameterized parent is not launched"
    );
    let force = |id: &str| ServerRequest::PeriodicForce {
        namespace: "default".into(),
        job_id: id.into(),
    };
    assert_eq!(
        error_text(ask(&mut h, 2, force("render"))),
        "can't force run non-tracked job \"render\" (default)"
    );

    let ServerReply::JobDispatched {
        dispatched_job_id,
        eval_id,
        ..
    } = dispatch(&mut h, 3, b"input", &[("color", "red")], "")
    else {
        panic!("dispatched");
    };
    assert!(eval_id.is_empty(), "a periodic child is not evaluated itself");
    let child = h.fx.state.job("default", &dispatched_job_id).unwrap().clone();
    assert!(child.is_periodic_active() && child.is_launcher());

    let ServerReply::JobRegistered { eval_id, .. } = ask(&mut h, 4, force(&dispatched_job_id)) else {
        panic!("the dispatched child is forced like any periodic parent");
    };
    let grandchild_id = format!("{dispatched_job_id}/periodic-1700000000");
    let grandchild = h.fx.state.job("default", &grandchild_id).expect("the launch").clone();
    assert_eq!(grandchild.parent_id, dispatched_job_id);
    assert_eq!(grandchild.payload, b"input");
    assert_eq!(grandchild.meta.get("color").map(String::as_str), Some("red"));
    assert!(!grandchild.is_launcher(), "the launch itself runs");
    assert_eq!(
        h.fx.state.eval(&eval_id).map(|eval| eval.job_id.as_str()),
        Some(grandchild_id.as_str())
    );
}
