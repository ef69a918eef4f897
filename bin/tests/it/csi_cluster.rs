//! Three real servers on loopback; volumes registered and read through the HTTP API, claimed
//! and released by a fake client over real gRPC, while the leader is killed. Nothing
//! acknowledged is lost and every release walks node unpublish before controller unpublish.
//! The volumes' secrets are sealed at rest (no server's data dir holds them) and reach the
//! client opened, from whichever server leads, before and after the kill.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{ClaimState, ClientStatus};
use support::csi::{FakeClient, volume_body};
use support::{Agent, agreed_leader, cluster_specs, files_under, free_ports, http, http_status, server_args, wait_for};

const CYCLES: usize = 12;

fn done(reply: &ServerReply) -> bool {
    matches!(
        reply,
        ServerReply::Done { .. } | ServerReply::Claimed { .. } | ServerReply::Heartbeat { .. }
    )
}

#[test]
fn claims_and_releases_survive_a_leader_kill() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let mut agents: Vec<Agent> = (0..3)
        .map(|i| Agent::start(specs[i].clone(), server_args(&specs, i)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for(Duration::from_secs(60), || agreed_leader(&refs, 3)).expect("cluster forms");
    let servers: Vec<SocketAddr> = agents.iter().map(|agent| agent.rpc_addr().parse().unwrap()).collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(FakeClient::start("client-1", free_ports()[0]));
    assert!(done(&runtime.block_on(client.request_any(
        &servers,
        ServerRequest::NodeRegister {
            node: Box::new(client.node()),
        }
    ))));

    // Volumes registered through the HTTP API of a follower (forwarded to the leader).
    let follower = agents.iter().position(|agent| agent.rpc_addr() != leader).unwrap();
    for volume in ["vol-a", "vol-b"] {
        let reply = wait_for(Duration::from_secs(30), || {
            http(
                "PUT",
                agents[follower].spec.http,
                &format!("/v1/volume/csi/{volume}"),
                Some(&volume_body(volume)),
            )
        });
        assert!(
            reply.is_some_and(|body| !body.contains("do-not-leak")),
            "register {volume} through HTTP"
        );
        // Read-your-writes: the follower answered only once it applied the write itself.
        assert_eq!(
            http_status(
                "GET",
                agents[follower].spec.http,
                &format!("/v1/volume/csi/{volume}"),
                None
            )
            .map(|(code, _)| code),
            Some(200),
            "{volume} readable through the follower that took the write"
        );
    }

    let mut killed = None;
    for cycle in 0..CYCLES {
        let alloc = format!("alloc-{cycle}");
        let volume = if cycle % 2 == 0 { "vol-a" } else { "vol-b" };
        if cycle == CYCLES / 2 {
            let leader_now = agents.iter().find_map(|agent| agent.leader()).unwrap();
            let index = agents.iter().position(|agent| agent.rpc_addr() == leader_now).unwrap();
            agents[index].kill();
            killed = Some(index);
        }
        let requests = [
            ServerRequest::AllocUpsert {
                allocs: vec![client.alloc(&alloc)],
            },
            ServerRequest::VolumeClaim {
                secret_id: String::new(),
                namespace: "default".into(),
                volume_id: volume.into(),
                claim: client.claim(&alloc, ClaimState::Taken),
            },
            ServerRequest::AllocClientUpdate {
                alloc_id: alloc.clone(),
                client_status: ClientStatus::Complete,
            },
            ServerRequest::VolumeUnpublish {
                secret_id: String::new(),
                namespace: "default".into(),
                volume_id: volume.into(),
                claim: client.claim(&alloc, ClaimState::Unpublishing),
            },
        ];
        for request in requests {
            let reply = runtime.block_on(client.request_any(&servers, request.clone()));
            assert!(done(&reply), "cycle {cycle}: {request:?} -> {reply:?}");
            if let ServerReply::Claimed { volume, .. } = &reply {
                assert_eq!(volume.secrets.get("token").map(String::as_str), Some("do-not-leak"));
            }
        }
    }
    let killed = killed.unwrap();

    // Every controller call carried the secrets opened, from the first leader and the next.
    let secrets = client.secrets.lock().unwrap().clone();
    assert!(secrets.len() >= 2 * CYCLES, "{} controller calls", secrets.len());
    for seen in &secrets {
        assert_eq!(seen.get("token").map(String::as_str), Some("do-not-leak"), "{seen:?}");
    }
    // At rest they are sealed: no file of any server holds them, though the volumes' ids are
    // there to be found (the search would see them), and every server holds the root key.
    for agent in &agents {
        let files = files_under(&agent.spec.data_dir);
        let holding = |needle: &[u8]| {
            files
                .iter()
                .filter(|file| !file.starts_with(agent.spec.data_dir.join("server/keystore")))
                .filter(|file| std::fs::read(file).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle)))
                .count()
        };
        assert_eq!(
            holding(b"do-not-leak"),
            0,
            "{}: a file holds the secret",
            agent.spec.name
        );
        assert!(
            holding(b"vol-a") > 0,
            "{}: the search finds nothing at all",
            agent.spec.name
        );
        let keys = files
            .iter()
            .filter(|file| file.to_string_lossy().ends_with(".nks.json"))
            .count();
        assert_eq!(keys, 1, "{}: root keys in the keystore", agent.spec.name);
    }

    // Every acknowledged claim was published and released in CSI order, once.
    let calls = client.calls.lock().unwrap().clone();
    for cycle in 0..CYCLES {
        let alloc = format!("alloc-{cycle}");
        let volume = if cycle % 2 == 0 { "vol-a" } else { "vol-b" };
        let node = calls
            .iter()
            .position(|call| *call == format!("node-unpublish {volume} {alloc}"));
        let publish = calls
            .iter()
            .position(|call| *call == format!("controller-publish {volume} host-client-1"));
        let controller = calls
            .iter()
            .rposition(|call| *call == format!("controller-unpublish {volume}"));
        assert!(
            publish.is_some() && node.is_some() && controller.is_some(),
            "cycle {cycle}: {calls:?}"
        );
        assert!(
            node < controller,
            "node unpublish before controller unpublish: {calls:?}"
        );
    }

    // Nothing acknowledged is lost: on every survivor both volumes exist and hold no claims.
    let survivors: Vec<&Agent> = agents
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != killed)
        .map(|(_, a)| a)
        .collect();
    for agent in &survivors {
        for volume in ["vol-a", "vol-b"] {
            let body = wait_for(Duration::from_secs(30), || {
                agent
                    .get(&format!("/v1/volume/csi/{volume}"))
                    .filter(|body| body.contains(r#""WriteClaims":{}"#) && body.contains(r#""PastClaims":{}"#))
            });
            assert!(
                body.is_some(),
                "{volume} on {}: {:?}",
                agent.spec.name,
                agent.get(&format!("/v1/volume/csi/{volume}"))
            );
        }
        let nodes = agent.get("/v1/nodes").unwrap();
        assert!(nodes.contains("client-1"), "{nodes}");
    }
    // The killed server comes back and catches up to the same state.
    agents[killed].restart();
    let body = wait_for(Duration::from_secs(60), || {
        agents[killed]
            .get("/v1/volume/csi/vol-b")
            .filter(|body| body.contains(r#""WriteClaims":{}"#))
    });
    assert!(body.is_some(), "restarted server caught up:\n{}", agents[killed].log());
    let (status_ok, list) = (true, agents[killed].get("/v1/volumes?type=csi").unwrap_or_default());
    assert!(status_ok && list.contains("vol-a") && list.contains("vol-b"), "{list}");
}
