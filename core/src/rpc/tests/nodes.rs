//! Node writes and heartbeats.

use super::*;

fn ttl_of(reply: &ServerReply) -> Duration {
    let ServerReply::Heartbeat { heartbeat_ttl_ms, .. } = reply else {
        panic!("not a heartbeat reply: {reply:?}")
    };
    Duration::from_millis(*heartbeat_ttl_ms)
}

#[test]
fn a_node_that_stops_heartbeating_is_marked_down_after_its_ttl_and_grace() {
    let mut h = Harness::new();
    let grace = HeartbeatConfig::default().grace;
    let index = h.fx.index;
    let ttl = ttl_of(&h.heartbeat(1, "n1"));
    // Nomad's TTL: at least 10 s, staggered by up to another TTL.
    assert!(
        ttl >= Duration::from_secs(10) && ttl < Duration::from_secs(20),
        "{ttl:?}"
    );
    assert_eq!(h.fx.index, index, "an unchanged status is not written through Raft");
    h.advance(ttl + grace - Duration::from_millis(1));
    assert_eq!(h.status("n1"), NodeStatus::Ready);
    // A heartbeat in time moves the deadline on.
    let ttl = ttl_of(&h.heartbeat(2, "n1"));
    h.advance(ttl + grace - Duration::from_millis(1));
    assert_eq!(h.status("n1"), NodeStatus::Ready);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.status("n1"), NodeStatus::Down);
    let event = h.fx.state.node("n1").unwrap().events.last().cloned().unwrap();
    assert_eq!(
        (event.subsystem.as_str(), event.message.as_str()),
        ("Cluster", "Node heartbeat missed")
    );
    assert_eq!(h.machine.heartbeats().deadline("n1"), None, "a down node is not timed");
    // n2 never heartbeated to this leader: it still has the failover TTL.
    assert_eq!(h.status("n2"), NodeStatus::Ready);
}

#[test]
fn a_new_leader_gives_every_live_node_the_failover_ttl() {
    let mut h = Harness::new();
    let failover = HeartbeatConfig::default().failover_ttl;
    assert_eq!(h.machine.heartbeats().deadline("n1"), Some(Instant::ZERO + failover));
    h.advance(failover - Duration::from_secs(1));
    assert_eq!((h.status("n1"), h.status("n2")), (NodeStatus::Ready, NodeStatus::Ready));
    ttl_of(&h.heartbeat(1, "n2"));
    h.advance(Duration::from_secs(1));
    assert_eq!((h.status("n1"), h.status("n2")), (NodeStatus::Down, NodeStatus::Ready));
    // Leadership lost and regained: the clock starts again from the failover TTL.
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.machine.handle(h.now, Input::Leadership { leader: true }, &h.fx.state);
    assert_eq!(h.machine.heartbeats().deadline("n2"), Some(h.now + failover));
    assert_eq!(h.machine.heartbeats().deadline("n1"), None);
}

#[test]
fn a_down_node_that_heartbeats_is_ready_again_and_unknown_nodes_are_told_so() {
    let mut h = Harness::new();
    h.advance(HeartbeatConfig::default().failover_ttl);
    assert_eq!(h.status("n1"), NodeStatus::Down);
    let index = h.fx.index;
    let reply = h.heartbeat(1, "n1");
    assert!(ttl_of(&reply) >= Duration::from_secs(10));
    assert!(h.fx.index > index, "a status change is written through Raft");
    assert_eq!(h.status("n1"), NodeStatus::Ready);
    let event = h.fx.state.node("n1").unwrap().events.last().cloned().unwrap();
    assert_eq!(event.message, "Node reregistered by heartbeat");
    assert!(h.machine.heartbeats().deadline("n1").is_some());
    let ServerReply::Error(failure) = h.heartbeat(2, "n9") else {
        panic!()
    };
    assert!(
        !failure.retryable && failure.kind == crate::error::ErrorKind::NotFound,
        "{failure:?}"
    );
    assert_eq!(failure.message, "node not found: n9");
}

#[test]
fn the_ttl_grows_with_the_cluster_past_the_heartbeat_rate() {
    let mut h = Harness::new();
    for i in 0..1_000 {
        h.fx.ok(Command::NodeRegister {
            node: node(&format!("m{i:04}"), true),
        });
    }
    // 1,002 nodes at 50 heartbeats a second: 20.04 s, staggered by up to as much again.
    for req in 0..20 {
        let ttl = ttl_of(&h.heartbeat(req, "n1"));
        assert!(
            ttl >= Duration::from_millis(20_040) && ttl < Duration::from_millis(40_080),
            "{ttl:?}"
        );
    }
}
