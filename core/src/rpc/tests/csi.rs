//! The CSI flows: claims, controller queues, unpublish walks, the watcher.

use super::*;
use crate::error::{CsiCallError, CsiCallFailure};

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
            secret_id: String::new(),
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
    h.answer(
        0,
        Err(CsiCallError::new(
            CsiCallFailure::Unreachable,
            format!("{RETRYABLE_PREFIX}: plugin not ready"),
        )),
    );
    assert_eq!(h.calls[0].1, "n2");
    h.answer(
        0,
        Err(CsiCallError::new(
            CsiCallFailure::FailedPrecondition,
            "rpc error: code = FailedPrecondition desc = busy",
        )),
    );
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
            secret_id: String::new(),
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
    // A late retry of the same release finds nothing recorded: done at once, nothing reopened.
    h.log.clear();
    let index = h.fx.index;
    h.request(
        3,
        ServerRequest::VolumeUnpublish {
            secret_id: String::new(),
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
        },
    );
    assert!(matches!(h.replies.last(), Some((3, ServerReply::Done { .. }))));
    assert!(h.log.is_empty(), "{:?}", h.log);
    assert_eq!(h.fx.index, index, "nothing written");
    assert!(h.calls.is_empty());
}

#[test]
fn a_client_that_never_answers_fails_the_walk_at_the_deadline_and_the_watcher_resumes_it() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    let unpublish = || ServerRequest::VolumeUnpublish {
        secret_id: String::new(),
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
        h.answer(0, Err(CsiCallError::other("connection refused")));
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
        secret_id: String::new(),
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
    h.answer(
        0,
        Err(CsiCallError::other(
            "rpc error: code = InvalidArgument desc = no such volume",
        )),
    );
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

#[test]
fn a_claim_or_release_for_another_nodes_secret_is_refused_before_any_plugin_call() {
    let mut h = Harness::new();
    let mut node = h.fx.state.node("n1").unwrap().clone();
    node.secret_id = "s1".into();
    h.fx.ok(Command::NodeRegister { node });
    let claim_with = |secret: &str| ServerRequest::VolumeClaim {
        secret_id: secret.into(),
        namespace: "default".into(),
        volume_id: "w".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Taken),
    };
    h.request(1, claim_with("stolen"));
    let Some((1, ServerReply::Error(error))) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(error.message, "node secret ID does not match");
    assert!(h.calls.is_empty(), "no controller call for a refused claim");
    let release = ServerRequest::VolumeUnpublish {
        secret_id: "stolen".into(),
        namespace: "default".into(),
        volume_id: "w".into(),
        claim: claim("a1", "n1", ClaimMode::Write, ClaimState::Unpublishing),
    };
    h.request(2, release);
    assert!(
        matches!(h.replies.last(), Some((2, ServerReply::Error(error))) if error.message == "node secret ID does not match"),
        "{:?}",
        h.replies
    );
    h.request(3, claim_with("s1"));
    assert_eq!(h.calls.len(), 1, "the node's own claim reaches the controller");
}

#[test]
fn create_names_the_plugins_volume_after_the_volume_then_registers_what_it_made() {
    let mut h = Harness::new();
    let mut new = volume("x");
    new.requested_capacity_min = 5 << 30;
    h.request(
        1,
        ServerRequest::VolumeCreate {
            volumes: vec![new.clone()],
        },
    );
    let ClientCsiRequest::ControllerCreate(create) = &h.calls[0].2 else {
        panic!("{:?}", h.calls)
    };
    assert_eq!((create.name.as_str(), create.capacity_min), ("x", 5 << 30));
    assert_eq!(create.secrets, new.secrets, "the volume's secrets go with the call");
    assert!(
        h.fx.state.volume("default", "x").is_none(),
        "not stored before the plugin made it"
    );
    h.answer(
        0,
        Ok(ClientCsiReply::Created {
            external_id: "vol-0abc".into(),
            capacity: 6 << 30,
            context: [("zone".to_string(), "a".to_string())].into(),
            topologies: Vec::new(),
        }),
    );
    assert!(
        matches!(h.replies.last(), Some((1, ServerReply::Done { .. }))),
        "{:?}",
        h.replies
    );
    let stored = h.fx.state.volume("default", "x").unwrap();
    assert_eq!((stored.external_id.as_str(), stored.capacity), ("vol-0abc", 6 << 30));
    assert_eq!(stored.context["zone"], "a");
    // Re-running the create of a registered volume makes nothing.
    h.request(2, ServerRequest::VolumeCreate { volumes: vec![new] });
    assert!(h.calls.is_empty(), "{:?}", h.calls);
    assert!(matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))));
}

#[test]
fn a_failed_create_registers_nothing_and_says_why() {
    let mut h = Harness::new();
    h.request(
        1,
        ServerRequest::VolumeCreate {
            volumes: vec![volume("y")],
        },
    );
    h.answer(
        0,
        Err(CsiCallError::other("rpc error: code = OutOfRange desc = too big")),
    );
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!("{:?}", h.replies)
    };
    assert!(failure.message.starts_with("controller create volume: "), "{failure:?}");
    assert!(h.fx.state.volume("default", "y").is_none());
    let mut elsewhere = volume("z");
    elsewhere.plugin_id = "missing".into();
    h.request(
        2,
        ServerRequest::VolumeCreate {
            volumes: vec![elsewhere],
        },
    );
    let ServerReply::Error(failure) = &h.replies[1].1 else {
        panic!()
    };
    assert_eq!(failure.message, "CSI plugin \"missing\" not found");
    assert!(h.calls.is_empty());
}

#[test]
fn delete_is_refused_while_claimed_then_deletes_in_the_plugin_before_deregistering() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    let delete = |id: &str| ServerRequest::VolumeDelete {
        namespace: "default".into(),
        volume_id: id.into(),
        secrets: Default::default(),
    };
    h.request(2, delete("v"));
    let ServerReply::Error(failure) = &h.replies.last().unwrap().1 else {
        panic!()
    };
    assert!(failure.message.starts_with("volume in use: v"), "{failure:?}");
    assert!(h.calls.is_empty());
    h.request(3, delete("w"));
    let ClientCsiRequest::ControllerDelete(call) = &h.calls[0].2 else {
        panic!()
    };
    assert_eq!(call.external_id, "w", "the volume's remote id");
    assert!(
        h.fx.state.volume("default", "w").is_some(),
        "still registered until the plugin answers"
    );
    h.answer(0, Ok(ClientCsiReply::Done));
    assert!(matches!(h.replies.last(), Some((3, ServerReply::Done { .. }))));
    assert!(h.fx.state.volume("default", "w").is_none());
    h.request(4, delete("w"));
    let ServerReply::Error(failure) = &h.replies.last().unwrap().1 else {
        panic!()
    };
    assert_eq!(failure.message, "volume not found: w");
}

/// Issue 54 §9: a namespace that could be a path segment, hold a separator or a control
/// character is refused by name (Nomad's `^[a-zA-Z0-9-]{1,128}$`), before anything is stored:
/// a claim in one could never be released.
#[test]
fn a_volume_in_a_malformed_namespace_is_refused_by_name() {
    let mut h = Harness::new();
    for (req, namespace) in [(1, "../x"), (2, "a\nb"), (3, "a/b")] {
        let mut bad = volume("bad");
        bad.namespace = namespace.into();
        h.request(req, ServerRequest::VolumeRegister { volumes: vec![bad] });
        let (_, ServerReply::Error(failure)) = h.replies.last().unwrap() else {
            panic!("{namespace:?}: {:?}", h.replies.last())
        };
        assert_eq!(failure.kind, ErrorKind::Invalid, "{failure:?}");
        let refused = crate::structs::check_namespace(namespace).expect_err(namespace);
        assert_eq!(failure.message, refused, "{failure:?}");
        assert!(h.fx.state.volume(namespace, "bad").is_none());
    }
    assert!(h.calls.is_empty(), "no plugin was asked");
}
