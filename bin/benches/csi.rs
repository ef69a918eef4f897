//! CSI figures. Prints; asserts nothing.
//!
//!   cargo bench -p drover --bench csi [-- CYCLES]
//!
//! 1. Claim+release cycles on a 3-server loopback cluster of real `agent` processes (redb with
//!    fsync on every Raft append), driven by a fake client over real gRPC. One cycle =
//!    alloc upsert, claim (+ ControllerPublish), alloc complete, unpublish (NodeUnpublish +
//!    ControllerUnpublish), each step committed through Raft. Baseline: one replicated write
//!    (alloc upsert) measured in the same run.
//! 2. Snapshot and restore of a state store holding 100,000 volumes. Baseline: an in-memory
//!    clone of the same state.

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use drover_core::fsm::{Command, Entry, ServerState};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{AccessMode, AttachmentMode, ClaimState, ClientStatus, CsiCapability, CsiVolume};
use support::csi::{FakeClient, volume_body};
use support::{Agent, agreed_leader, cluster_specs, free_ports, http, server_args, wait_for};

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn ok(reply: ServerReply) {
    assert!(
        matches!(
            reply,
            ServerReply::Done { .. } | ServerReply::Claimed { .. } | ServerReply::Heartbeat { .. }
        ),
        "{reply:?}"
    );
}

fn claim_cycles(cycles: usize) {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let agents: Vec<Agent> = (0..3)
        .map(|i| Agent::start(specs[i].clone(), server_args(&specs, i)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for(Duration::from_secs(60), || agreed_leader(&refs, 3)).expect("cluster forms");
    let leader_addr: SocketAddr = leader.parse().unwrap();
    let leader_http = agents
        .iter()
        .find(|agent| agent.rpc_addr() == leader)
        .unwrap()
        .spec
        .http;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(FakeClient::start("client-1", free_ports()[0]));
    ok(runtime.block_on(client.request(
        leader_addr,
        ServerRequest::NodeRegister {
            node: Box::new(client.node()),
        },
    )));
    http("PUT", leader_http, "/v1/volume/csi/bench", Some(&volume_body("bench"))).expect("volume registers");

    let mut baseline = Vec::new();
    for i in 0..cycles {
        let started = Instant::now();
        ok(runtime.block_on(client.request(
            leader_addr,
            ServerRequest::AllocUpsert {
                allocs: vec![client.alloc(&format!("warm-{i}"))],
            },
        )));
        baseline.push(started.elapsed());
    }
    let mut latencies = Vec::new();
    let started_all = Instant::now();
    for i in 0..cycles {
        let alloc = format!("bench-{i}");
        let started = Instant::now();
        ok(runtime.block_on(client.request(
            leader_addr,
            ServerRequest::AllocUpsert {
                allocs: vec![client.alloc(&alloc)],
            },
        )));
        ok(runtime.block_on(client.request(
            leader_addr,
            ServerRequest::VolumeClaim {
                namespace: "default".into(),
                volume_id: "bench".into(),
                claim: client.claim(&alloc, ClaimState::Taken),
            },
        )));
        ok(runtime.block_on(client.request(
            leader_addr,
            ServerRequest::AllocClientUpdate {
                alloc_id: alloc.clone(),
                client_status: ClientStatus::Complete,
            },
        )));
        ok(runtime.block_on(client.request(
            leader_addr,
            ServerRequest::VolumeUnpublish {
                namespace: "default".into(),
                volume_id: "bench".into(),
                claim: client.claim(&alloc, ClaimState::Unpublishing),
            },
        )));
        latencies.push(started.elapsed());
    }
    let total = started_all.elapsed();
    let base_p50 = percentile(&mut baseline, 0.5);
    let p50 = percentile(&mut latencies, 0.5);
    let p99 = percentile(&mut latencies, 0.99);
    println!("3-server loopback cluster, fsync on, {cycles} sequential cycles:");
    println!("  baseline: one replicated write          p50 {:>7.2} ms", ms(base_p50));
    println!(
        "  claim+release cycle                     p50 {:>7.2} ms ({:.1}x baseline)  p99 {:>7.2} ms ({:.1}x)",
        ms(p50),
        ms(p50) / ms(base_p50),
        ms(p99),
        ms(p99) / ms(base_p50)
    );
    println!(
        "  throughput: {:.1} claim+release cycles per second",
        cycles as f64 / total.as_secs_f64()
    );
}

fn snapshot_100k() {
    const VOLUMES: usize = 100_000;
    let mut state = ServerState::default();
    let mut index = 0u64;
    let mut apply = |state: &mut ServerState, command: Command| {
        index += 1;
        state.apply(
            index,
            &Entry {
                at_unix_ms: index,
                command,
            },
        );
    };
    let client_node = {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async { FakeClient::start("client-1", free_ports()[0]).await.node() })
    };
    apply(&mut state, Command::NodeRegister { node: client_node });
    for batch in 0..VOLUMES / 1_000 {
        let volumes = (0..1_000)
            .map(|i| CsiVolume {
                id: format!("vol-{batch:03}-{i:03}"),
                namespace: "default".into(),
                name: format!("volume {batch} {i}"),
                plugin_id: "hostpath".into(),
                requested_capabilities: vec![CsiCapability {
                    access_mode: AccessMode::MultiNodeMultiWriter,
                    attachment_mode: AttachmentMode::FileSystem,
                }],
                parameters: [("type".to_string(), "gp3".to_string())].into(),
                ..CsiVolume::default()
            })
            .collect();
        apply(&mut state, Command::CsiVolumeRegister { volumes });
    }
    assert_eq!(state.volume_keys().count(), VOLUMES);
    let started = Instant::now();
    let copy = state.clone();
    let clone_time = started.elapsed();
    drop(copy);
    let started = Instant::now();
    let legacy = postcard::to_allocvec(&state).unwrap();
    let legacy_time = started.elapsed();
    let started = Instant::now();
    let legacy_restored = ServerState::restore(&legacy).unwrap();
    let legacy_restore_time = started.elapsed();
    assert_eq!(legacy_restored, state);
    drop(legacy_restored);
    let started = Instant::now();
    let bytes = state.snapshot();
    let snapshot_time = started.elapsed();
    let started = Instant::now();
    let restored = ServerState::restore(&bytes).unwrap();
    let restore_time = started.elapsed();
    assert_eq!(restored, state, "restore gives the state that made the snapshot");
    let mib = |len: usize| len as f64 / (1024.0 * 1024.0);
    println!("state store with {VOLUMES} volumes:");
    println!("  baseline: in-memory clone            {:>8.1} ms", ms(clone_time));
    println!(
        "  snapshot, unversioned postcard       {:>8.1} ms ({:.1}x baseline), {:.1} MiB",
        ms(legacy_time),
        ms(legacy_time) / ms(clone_time),
        mib(legacy.len())
    );
    println!(
        "  restore,  unversioned postcard       {:>8.1} ms ({:.1}x baseline)",
        ms(legacy_restore_time),
        ms(legacy_restore_time) / ms(clone_time)
    );
    println!(
        "  snapshot, state format v{} (CBOR+LZ4) {:>7.1} ms ({:.1}x baseline), {:.1} MiB ({:.1}x postcard)",
        drover_core::codec::FORMAT_VERSION,
        ms(snapshot_time),
        ms(snapshot_time) / ms(clone_time),
        mib(bytes.len()),
        bytes.len() as f64 / legacy.len() as f64
    );
    println!(
        "  restore,  state format v{} (CBOR+LZ4) {:>7.1} ms ({:.1}x baseline)",
        drover_core::codec::FORMAT_VERSION,
        ms(restore_time),
        ms(restore_time) / ms(clone_time)
    );
}

fn main() {
    let cycles: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(200);
    snapshot_100k();
    claim_cycles(cycles);
}
