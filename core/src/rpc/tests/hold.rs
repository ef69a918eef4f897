//! Nomad's RPC hold: a request that reaches a server that does not lead yet, while no other
//! server is known to, waits for its leadership instead of being refused.

use super::*;

fn heartbeat(req: ReqId, secret: &str) -> Input {
    Input::Request {
        req,
        request: ServerRequest::NodeUpdateStatus {
            node_id: "n1".into(),
            secret_id: secret.into(),
            status: NodeStatus::Ready,
        },
        authority: crate::rpc::authz::Authority::Open,
    }
}

fn not_leading(h: &mut Harness) {
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.pump();
}

fn refused(h: &Harness) -> Vec<(ReqId, String)> {
    h.replies
        .iter()
        .filter_map(|(req, reply)| match reply {
            ServerReply::Error(error) if error.retryable => Some((*req, error.message.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn requests_made_before_this_server_leads_wait_for_it() {
    let mut h = Harness::new();
    let secret = h.fx.state.node("n1").unwrap().secret_id.clone();
    not_leading(&mut h);
    assert!(h.machine.is_holding(), "no leader is known at first");
    for req in [1, 2] {
        h.machine.handle(h.now, heartbeat(req, &secret), &h.fx.state);
        h.pump();
    }
    assert!(h.replies.is_empty(), "held, not refused: {:?}", h.replies);
    assert_eq!(h.machine.poll_timeout(), Some(h.now + RPC_HOLD_TIMEOUT));
    // The barrier applies: both are served, in arrival order.
    h.machine.handle(h.now, Input::Leadership { leader: true }, &h.fx.state);
    h.machine.set_holding(false);
    h.pump();
    let served: Vec<ReqId> = h
        .replies
        .iter()
        .map(|(req, reply)| {
            assert!(matches!(reply, ServerReply::Heartbeat { .. }), "{reply:?}");
            *req
        })
        .collect();
    assert_eq!(served, [1, 2]);
}

#[test]
fn held_requests_are_refused_when_the_term_is_lost_or_the_hold_runs_out() {
    let mut h = Harness::new();
    not_leading(&mut h);
    // Not holding (another server leads): refused at once, as before.
    h.machine.set_holding(false);
    h.machine.handle(h.now, heartbeat(1, ""), &h.fx.state);
    h.pump();
    assert_eq!(refused(&h), [(1, "No cluster leader".to_string())]);
    // Held, then the election is lost before the barrier applied.
    h.machine.set_holding(true);
    h.machine.handle(h.now, heartbeat(2, ""), &h.fx.state);
    h.pump();
    assert_eq!(refused(&h).len(), 1);
    h.machine.set_holding(false);
    h.pump();
    assert_eq!(refused(&h).last(), Some(&(2, "No cluster leader".to_string())));
    // Held past the hold timeout.
    h.machine.set_holding(true);
    h.machine.handle(h.now, heartbeat(3, ""), &h.fx.state);
    h.pump();
    h.now = h.now + (RPC_HOLD_TIMEOUT - Duration::from_millis(1));
    h.machine.handle_timeout(h.now, &h.fx.state);
    h.pump();
    assert_eq!(refused(&h).len(), 2, "not yet");
    h.now = h.now + Duration::from_millis(1);
    h.machine.handle_timeout(h.now, &h.fx.state);
    h.pump();
    assert_eq!(refused(&h).last(), Some(&(3, "No cluster leader".to_string())));
    assert_eq!(h.machine.poll_timeout(), None);
}

#[test]
fn a_read_without_a_leader_asks_again_sooner_then_later_within_the_hold() {
    let pauses: Vec<u64> = (0..6)
        .map(|attempt| crate::rpc::read_hold_pause(attempt).as_millis() as u64)
        .collect();
    assert_eq!(pauses, [50, 100, 200, 400, 500, 500]);
    assert_eq!(crate::rpc::read_hold_pause(u32::MAX).as_millis(), 500);
}
