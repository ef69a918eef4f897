//! Snapshots, a plugin's listings, and expansion by re-running a create.

use super::*;
use crate::error::CsiCallError;
use crate::rpc::ListPage;
use crate::structs::CsiSnapshot;

fn error_of(h: &Harness) -> String {
    match h.replies.last() {
        Some((_, ServerReply::Error(error))) => error.message.clone(),
        other => panic!("no error: {other:?}"),
    }
}

#[test]
fn a_snapshot_is_made_of_the_registered_volume_with_its_secrets_under_the_callers() {
    let mut h = Harness::new();
    let snapshot = CsiSnapshot {
        source_volume_id: "w".into(),
        name: "nightly".into(),
        secrets: [("extra".to_string(), "x".to_string())].into(),
        ..CsiSnapshot::default()
    };
    h.request(
        1,
        ServerRequest::SnapshotCreate {
            namespace: "default".into(),
            snapshots: vec![snapshot],
        },
    );
    let ClientCsiRequest::ControllerCreateSnapshot(asked) = &h.calls[0].2 else {
        panic!("{:?}", h.calls)
    };
    assert_eq!(
        (asked.source_external_id.as_str(), asked.name.as_str()),
        ("w", "nightly")
    );
    assert_eq!(
        asked.secrets.get("token").map(String::as_str),
        Some("s3cr3t"),
        "the volume's"
    );
    assert_eq!(
        asked.secrets.get("extra").map(String::as_str),
        Some("x"),
        "the caller's"
    );
    h.answer(
        0,
        Ok(ClientCsiReply::Snapshot(CsiSnapshot {
            id: "snap-1".into(),
            external_source_volume_id: "w".into(),
            size_bytes: 10,
            is_ready: true,
            ..CsiSnapshot::default()
        })),
    );
    let Some((1, ServerReply::Snapshots { snapshots, .. })) = h.replies.last() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(
        (snapshots[0].id.as_str(), snapshots[0].plugin_id.as_str()),
        ("snap-1", "p")
    );

    h.request(
        2,
        ServerRequest::SnapshotCreate {
            namespace: "default".into(),
            snapshots: vec![CsiSnapshot {
                source_volume_id: "nope".into(),
                ..CsiSnapshot::default()
            }],
        },
    );
    assert_eq!(error_of(&h), "no such volume \"nope\"");
}

#[test]
fn a_failed_snapshot_delete_says_which_snapshot() {
    let mut h = Harness::new();
    let snapshot = |plugin: &str| CsiSnapshot {
        id: "snap-1".into(),
        plugin_id: plugin.into(),
        ..CsiSnapshot::default()
    };
    h.request(
        1,
        ServerRequest::SnapshotDelete {
            snapshots: vec![snapshot("p")],
        },
    );
    h.answer(
        0,
        Err(CsiCallError::other("rpc error: code = Internal desc = disk on fire")),
    );
    assert!(
        error_of(&h).starts_with("could not delete \"snap-1\": rpc error: code = Internal"),
        "{}",
        error_of(&h)
    );
    h.request(
        2,
        ServerRequest::SnapshotDelete {
            snapshots: vec![snapshot("elsewhere")],
        },
    );
    assert_eq!(error_of(&h), "no such plugin \"elsewhere\"");
    assert!(h.calls.is_empty());
}

#[test]
fn a_listing_is_one_page_cut_to_per_page_with_the_plugins_next_token() {
    let mut h = Harness::new();
    h.request(
        1,
        ServerRequest::SnapshotList {
            plugin_id: "p".into(),
            page: ListPage {
                per_page: 1,
                next_token: "t0".into(),
            },
            secrets: Default::default(),
        },
    );
    let ClientCsiRequest::ControllerListSnapshots(asked) = &h.calls[0].2 else {
        panic!("{:?}", h.calls)
    };
    assert_eq!(asked.page.next_token, "t0");
    let two = vec![CsiSnapshot::default(), CsiSnapshot::default()];
    h.answer(
        0,
        Ok(ClientCsiReply::Snapshots {
            snapshots: two,
            next_token: "t1".into(),
        }),
    );
    let Some((
        1,
        ServerReply::Snapshots {
            snapshots, next_token, ..
        },
    )) = h.replies.last()
    else {
        panic!("{:?}", h.replies)
    };
    assert_eq!((snapshots.len(), next_token.as_str()), (1, "t1"));
    h.request(
        2,
        ServerRequest::VolumeListExternal {
            plugin_id: "missing".into(),
            page: ListPage::default(),
        },
    );
    assert_eq!(error_of(&h), "no such plugin");
}

#[test]
fn a_larger_minimum_expands_in_the_controller_then_on_every_claims_node() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.answer(0, Ok(ClientCsiReply::Done));
    let mut bigger = volume("v");
    bigger.requested_capacity_min = 4 << 30;
    h.request(2, ServerRequest::VolumeCreate { volumes: vec![bigger] });
    let ClientCsiRequest::ControllerExpand(asked) = &h.calls[0].2 else {
        panic!("{:?}", h.calls)
    };
    assert_eq!((asked.external_id.as_str(), asked.capacity_min), ("v", 4 << 30));
    assert!(asked.capability.is_some(), "in use: its capability goes with the call");
    h.answer(
        0,
        Ok(ClientCsiReply::Expanded {
            capacity: 5 << 30,
            node_expansion_required: true,
        }),
    );
    let ClientCsiRequest::NodeExpand(node) = &h.calls[0].2 else {
        panic!("{:?}", h.calls)
    };
    assert_eq!((h.calls[0].1.as_str(), node.alloc_id.as_str()), ("n1", "a1"));
    assert_eq!(
        h.fx.state.volume("default", "v").unwrap().capacity,
        0,
        "not before the nodes"
    );
    h.answer(
        0,
        Ok(ClientCsiReply::Expanded {
            capacity: 5 << 30,
            node_expansion_required: false,
        }),
    );
    assert!(
        matches!(h.replies.last(), Some((2, ServerReply::Done { .. }))),
        "{:?}",
        h.replies
    );
    let stored = h.fx.state.volume("default", "v").unwrap();
    assert_eq!((stored.capacity, stored.requested_capacity_min), (5 << 30, 4 << 30));
    assert!(stored.write_claims.contains_key("a1"), "claims kept");

    // Capacity never shrinks: a maximum below it is refused with Nomad's text.
    let mut smaller = volume("v");
    smaller.requested_capacity_max = 1 << 30;
    h.request(3, ServerRequest::VolumeCreate { volumes: vec![smaller] });
    assert_eq!(
        error_of(&h),
        "unable to update volume: max requested capacity (1.1 GB) less than or equal to current (5.4 GB)"
    );
    // The same spec again: nothing to do, nothing asked.
    let mut same = volume("v");
    same.requested_capacity_min = 4 << 30;
    h.request(4, ServerRequest::VolumeCreate { volumes: vec![same] });
    assert!(h.calls.is_empty(), "{:?}", h.calls);
    assert!(matches!(h.replies.last(), Some((4, ServerReply::Done { .. }))));
}
