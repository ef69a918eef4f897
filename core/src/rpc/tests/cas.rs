//! Check-and-set on jobs decided where the write lands, not only where it is asked: two
//! writers that read the same version, with both entries in flight, cannot both win, and a
//! scaling made from a version that a later register replaced is refused, not applied over it.

use super::group_commit::{land, proposals, send};
use super::*;
use crate::rpc::messages::JobScaleRequest;
use alloc::boxed::Box;

fn register(priority: u32, enforce_index: Option<u64>) -> ServerRequest {
    let mut job = batch_job("web");
    job.priority = priority;
    ServerRequest::JobRegister {
        job: Box::new(job),
        enforce_index,
    }
}

/// The answer to request `req`.
fn answer(h: &Harness, req: ReqId) -> &ServerReply {
    &h.replies.iter().find(|(r, _)| *r == req).expect("answered").1
}

#[test]
fn two_registers_enforcing_the_same_index_in_flight_together_one_wins() {
    let mut h = Harness::new();
    let ServerReply::JobRegistered { job_modify_index, .. } = ask(&mut h, 1, register(50, None)) else {
        panic!("registered")
    };
    proposals(&mut h);
    // Both writers read version 0 and send its index; the endpoint lets both through.
    send(&mut h, 2, register(60, Some(job_modify_index)));
    let mut entries = proposals(&mut h);
    send(&mut h, 3, register(70, Some(job_modify_index)));
    entries.extend(proposals(&mut h));
    assert_eq!(entries.len(), 2, "{entries:?}");
    for (op, command) in entries {
        land(&mut h, op, command);
        proposals(&mut h);
    }
    assert!(
        matches!(answer(&h, 2), ServerReply::JobRegistered { .. }),
        "{:?}",
        answer(&h, 2)
    );
    let ServerReply::Error(refused) = answer(&h, 3) else {
        panic!("{:?}", answer(&h, 3))
    };
    let stored = h.fx.state.job("default", "web").unwrap();
    assert_eq!(
        refused.message,
        format!(
            "Enforcing job modify index {job_modify_index}: job exists with conflicting job modify index: {}",
            stored.job_modify_index
        )
    );
    assert_eq!(refused.kind, crate::error::ErrorKind::Invalid);
    // The first writer's version stands; the second changed nothing.
    assert_eq!((stored.priority, stored.version), (60, 1));
}

#[test]
fn a_scaling_made_from_a_replaced_version_is_refused_when_it_lands() {
    let mut h = Harness::new();
    ask(&mut h, 1, register(50, None));
    proposals(&mut h);
    // A register (priority 60) and a scaling made from version 0, both in flight.
    send(&mut h, 2, register(60, None));
    let mut entries = proposals(&mut h);
    let scale = JobScaleRequest {
        namespace: "default".into(),
        job_id: "web".into(),
        group: "g".into(),
        count: Some(3),
        ..Default::default()
    };
    send(&mut h, 3, ServerRequest::JobScale(Box::new(scale)));
    entries.extend(proposals(&mut h));
    assert_eq!(entries.len(), 2, "{entries:?}");
    for (op, command) in entries {
        land(&mut h, op, command);
        proposals(&mut h);
    }
    let ServerReply::Error(refused) = answer(&h, 3) else {
        panic!("{:?}", answer(&h, 3))
    };
    assert_eq!(refused.kind, crate::error::ErrorKind::Unavailable, "{refused:?}");
    // The register was not undone by the older spec with a new count, and no event recorded.
    let stored = h.fx.state.job("default", "web").unwrap();
    assert_eq!(
        (stored.priority, stored.task_groups[0].count, stored.version),
        (60, 1, 1)
    );
    assert!(h.fx.state.scaling_events("default", "web").is_none());
}
