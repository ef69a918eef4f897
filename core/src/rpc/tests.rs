use super::*;
use crate::fsm::csi::tests::{Fixture, alloc, claim, node, volume};
use crate::structs::ClientStatus;

struct Harness {
    fx: Fixture,
    machine: RpcEndpoints,
    now: Instant,
    calls: Vec<(OpId, String, ClientCsiRequest)>,
    replies: Vec<(ReqId, ServerReply)>,
    log: Vec<String>,
}

impl Harness {
    fn new() -> Self {
        let mut fx = Fixture::new();
        fx.ok(Command::NodeRegister { node: node("n1", true) });
        fx.ok(Command::NodeRegister { node: node("n2", true) });
        fx.ok(Command::CsiVolumeRegister {
            volumes: vec![volume("v"), volume("w")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("a1", "n1"), alloc("a2", "n2")],
        });
        let mut machine = RpcEndpoints::new(
            Duration::from_secs(10),
            GcConfig::default(),
            HeartbeatConfig::default(),
            crate::config::CsiFaults::default(),
            7,
        );
        machine.handle(Instant::ZERO, Input::Leadership { leader: true }, &fx.state);
        Harness {
            fx,
            machine,
            now: Instant::ZERO,
            calls: Vec::new(),
            replies: Vec::new(),
            log: Vec::new(),
        }
    }

    /// Drains actions; proposals are committed at once, client calls are recorded.
    fn pump(&mut self) {
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Propose { op, command } => {
                    if let Command::CsiVolumeClaim { claim, .. } = &*command {
                        self.log.push(format!("checkpoint {:?}", claim.state));
                    }
                    let response = self.fx.apply(*command);
                    let index = self.fx.index;
                    self.machine.handle(
                        self.now,
                        Input::Proposed {
                            op,
                            result: Ok((index, response)),
                        },
                        &self.fx.state,
                    );
                }
                Action::CallClient {
                    op, node_id, request, ..
                } => {
                    self.log.push(format!("call {node_id} {}", kind(&request)));
                    self.calls.push((op, node_id, request));
                }
                Action::Reply { req, reply } => self.replies.push((req, reply)),
                Action::CancelClientCall { op } => self.log.push(format!("cancel {op}")),
            }
        }
    }

    fn request(&mut self, req: ReqId, request: ServerRequest) {
        self.machine
            .handle(self.now, Input::Request { req, request }, &self.fx.state);
        self.pump();
    }

    fn answer(&mut self, index: usize, result: Result<ClientCsiReply, String>) {
        let (op, _, _) = self.calls.remove(index);
        self.machine
            .handle(self.now, Input::ClientReplied { op, result }, &self.fx.state);
        self.pump();
    }
}

fn kind(request: &ClientCsiRequest) -> &'static str {
    match request {
        ClientCsiRequest::ControllerAttach(_) => "controller-attach",
        ClientCsiRequest::ControllerDetach(_) => "controller-detach",
        ClientCsiRequest::ControllerValidate(_) => "controller-validate",
        ClientCsiRequest::NodeDetach(_) => "node-detach",
    }
}

fn take(alloc: &str, node: &str) -> ServerRequest {
    ServerRequest::VolumeClaim {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim(alloc, node, ClaimMode::Write, ClaimState::Taken),
    }
}

#[test]
fn a_new_claim_is_committed_then_controller_published() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    assert_eq!(h.log, ["checkpoint Taken", "call n1 controller-attach"]);
    let ClientCsiRequest::ControllerAttach(attach) = &h.calls[0].2 else {
        panic!()
    };
    assert_eq!(attach.client_csi_node_id, "ext-plug-n1");
    assert!(
        h.fx.state
            .volume("default", "v")
            .unwrap()
            .write_claims
            .contains_key("a1"),
        "committed before the call"
    );
    h.answer(
        0,
        Ok(ClientCsiReply::Attached {
            publish_context: [("dev".into(), "/dev/x".into())].into(),
        }),
    );
    let (req, ServerReply::Claimed { publish_context, .. }) = &h.replies[0] else {
        panic!("{:?}", h.replies)
    };
    assert_eq!((*req, publish_context["dev"].as_str()), (1, "/dev/x"));
}

#[test]
fn controller_calls_are_serialised_per_plugin() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.request(
        2,
        ServerRequest::VolumeClaim {
            namespace: "default".into(),
            volume_id: "w".into(),
            claim: claim("a2", "n2", ClaimMode::Write, ClaimState::Taken),
        },
    );
    assert_eq!(h.calls.len(), 1, "the second publish waits for the first");
    h.answer(0, Ok(ClientCsiReply::Done));
    assert_eq!(h.calls.len(), 1);
    h.answer(0, Ok(ClientCsiReply::Done));
    assert_eq!(h.replies.len(), 2);
}

#[test]
fn retryable_controller_errors_move_to_the_next_controller_in_sorted_order() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    assert_eq!(h.calls[0].1, "n1");
    h.answer(0, Err(format!("{RETRYABLE_PREFIX}: plugin not ready")));
    assert_eq!(h.calls[0].1, "n2");
    h.answer(0, Err("rpc error: code = FailedPrecondition desc = busy".into()));
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!()
    };
    assert!(
        failure.retryable && failure.message.starts_with(RETRYABLE_PREFIX),
        "{failure:?}"
    );
}

#[test]
fn unpublish_walks_node_then_controller_committing_each_step() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    h.log.clear();
    h.request(
        2,
        ServerRequest::VolumeUnpublish {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
        },
    );
    h.answer(0, Ok(ClientCsiReply::Done));
    h.answer(0, Ok(ClientCsiReply::Done));
    assert_eq!(
        h.log,
        [
            "checkpoint Unpublishing",
            "call n1 node-detach",
            "checkpoint NodeDetached",
            "call n1 controller-detach",
            "checkpoint ReadyToFree",
        ]
    );
    assert!(matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))));
    let vol = h.fx.state.volume("default", "v").unwrap();
    assert!(vol.write_claims.is_empty() && vol.past_claims.is_empty());
}

#[test]
fn a_client_that_never_answers_fails_the_walk_at_the_deadline_and_the_watcher_resumes_it() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    let unpublish = || ServerRequest::VolumeUnpublish {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
    };
    h.request(2, unpublish());
    assert_eq!(h.calls.len(), 1);
    h.now = Instant::ZERO + Duration::from_secs(10);
    h.machine.handle_timeout(h.now, &h.fx.state);
    h.pump();
    let ServerReply::Error(failure) = &h.replies.last().unwrap().1 else {
        panic!()
    };
    assert!(
        failure.retryable && failure.message.contains("timed out"),
        "{failure:?}"
    );
    assert_eq!(
        h.fx.state.volume("default", "v").unwrap().past_claims["a1"].state,
        ClaimState::Unpublishing
    );
    // The watcher picks the checkpointed claim up again at once (the late answer to the
    // first call is ignored) and a new request joins its walk.
    assert_eq!(h.calls.len(), 2, "{:?}", h.log);
    let (stale, _, _) = h.calls.remove(0);
    h.machine.handle(
        h.now,
        Input::ClientReplied {
            op: stale,
            result: Ok(ClientCsiReply::Done),
        },
        &h.fx.state,
    );
    h.pump();
    assert_eq!(kind(&h.calls[0].2), "node-detach");
    h.request(3, unpublish());
    assert_eq!(h.calls.len(), 1, "shared walk, no second call");
    h.answer(0, Ok(ClientCsiReply::Done));
    h.answer(0, Ok(ClientCsiReply::Done));
    assert!(matches!(h.replies.last(), Some((3, ServerReply::Done { .. }))));
    assert!(h.fx.state.volume("default", "v").unwrap().past_claims.is_empty());
}

#[test]
fn the_watcher_releases_terminal_allocs_claims_rate_limited_and_stops_when_leadership_is_lost() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    h.log.clear();
    // The alloc finishes: nobody asks, the watcher releases its claim.
    h.fx.ok(Command::AllocClientUpdate {
        alloc_id: "a1".into(),
        client_status: ClientStatus::Complete,
    });
    h.machine.handle_timeout(h.now, &h.fx.state);
    h.pump();
    assert_eq!(h.log, ["checkpoint Unpublishing", "call n1 node-detach"]);
    assert_eq!(h.machine.watcher().workers(), 1);
    // A failing node: every pass re-drives, at most once a second after the burst.
    let mut passes = 0;
    for second in 1..=10 {
        h.answer(0, Err("connection refused".into()));
        h.now = Instant::ZERO + Duration::from_secs(second);
        h.machine.handle_timeout(h.now, &h.fx.state);
        h.pump();
        passes += h.calls.len();
    }
    assert_eq!(passes, 10, "one retry per second");
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.pump();
    assert_eq!(h.machine.watcher().workers(), 0);
    assert_eq!(h.machine.poll_timeout(), None);
}

#[test]
fn claim_gc_bumps_old_volumes_with_past_claims() {
    let mut h = Harness::new();
    h.fx.ok(Command::AllocUpsert {
        allocs: vec![alloc("gone", "n1")],
    });
    h.fx.ok(Command::CsiVolumeClaim {
        namespace: "default".into(),
        volume_id: "w".into(),
        claim: claim("gone", "n1", ClaimMode::Write, ClaimState::Taken),
    });
    h.fx.ok(Command::AllocDelete {
        alloc_ids: vec!["gone".into()],
    });
    let before = h.fx.state.volume("default", "w").unwrap().modify_index;
    // Advance the cluster clock past the 5 minute threshold with an unrelated write.
    for _ in 0..400 {
        h.fx.ok(Command::EvalUpsert { evals: vec![] });
    }
    h.now = Instant::ZERO + Duration::from_secs(300);
    h.machine.handle_timeout(h.now, &h.fx.state);
    h.pump();
    assert!(
        h.fx.state.volume("default", "w").unwrap().modify_index > before,
        "GC claim bumped the volume"
    );
}

#[test]
fn a_down_node_is_skipped_and_concurrent_unpublishes_share_one_walk() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    h.fx.ok(Command::NodeUpdateStatus {
        node_id: "n1".into(),
        status: NodeStatus::Down,
        event: None,
    });
    h.log.clear();
    let unpublish = ServerRequest::VolumeUnpublish {
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
    };
    h.request(2, unpublish.clone());
    h.request(3, unpublish);
    // No node call at all; the controller call is the only external step, and it is shared.
    assert_eq!(
        h.log,
        [
            "checkpoint Unpublishing",
            "checkpoint NodeDetached",
            "call n2 controller-detach"
        ]
    );
    h.answer(0, Ok(ClientCsiReply::Done));
    assert_eq!(
        h.replies
            .iter()
            .filter(|(_, reply)| matches!(reply, ServerReply::Done { .. }))
            .count(),
        2
    );
}

#[test]
fn losing_leadership_fails_everything_in_flight_as_retryable() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.pump();
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!()
    };
    assert!(failure.retryable);
    h.request(2, take("a2", "n2"));
    let ServerReply::Error(failure) = &h.replies[1].1 else {
        panic!()
    };
    assert_eq!(failure.message, "No cluster leader");
    assert_eq!(h.machine.poll_timeout(), None);
}

#[test]
fn register_validates_with_a_controller_first() {
    let mut h = Harness::new();
    let mut new = volume("x");
    new.external_id = "vol-123".into();
    h.request(
        1,
        ServerRequest::VolumeRegister {
            volumes: vec![new.clone()],
        },
    );
    let ClientCsiRequest::ControllerValidate(validate) = &h.calls[0].2 else {
        panic!()
    };
    assert_eq!(validate.volume_id, "vol-123");
    assert!(
        h.fx.state.volume("default", "x").is_none(),
        "not stored before validation"
    );
    h.answer(0, Ok(ClientCsiReply::Done));
    assert!(h.fx.state.volume("default", "x").is_some());
    h.request(
        2,
        ServerRequest::VolumeRegister {
            volumes: vec![volume("y")],
        },
    );
    h.answer(0, Err("rpc error: code = InvalidArgument desc = no such volume".into()));
    let ServerReply::Error(failure) = &h.replies[1].1 else {
        panic!()
    };
    assert!(
        failure.message.starts_with("controller validate volume:"),
        "{failure:?}"
    );
    assert!(h.fx.state.volume("default", "y").is_none());
}

#[test]
fn detach_releases_every_claim_of_the_volume_on_the_node() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    h.request(
        2,
        ServerRequest::VolumeDetach {
            namespace: "default".into(),
            volume_id: "v".into(),
            node_id: "n1".into(),
        },
    );
    h.answer(0, Ok(ClientCsiReply::Done));
    h.answer(0, Ok(ClientCsiReply::Done));
    assert!(matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))));
    assert!(h.fx.state.volume("default", "v").unwrap().write_claims.is_empty());
}

impl Harness {
    fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
        self.machine.handle_timeout(self.now, &self.fx.state);
        self.pump();
    }

    fn status(&self, node: &str) -> NodeStatus {
        self.fx.state.node(node).unwrap().status
    }

    fn heartbeat(&mut self, req: ReqId, node: &str) -> ServerReply {
        self.request(
            req,
            ServerRequest::NodeUpdateStatus {
                node_id: node.into(),
                status: NodeStatus::Ready,
            },
        );
        self.replies.last().unwrap().1.clone()
    }
}

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
        !failure.retryable && failure.message.contains("node not found"),
        "{failure:?}"
    );
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
