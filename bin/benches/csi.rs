//! CSI figures. Prints; asserts nothing.
//!
//!   cargo bench -p drover --bench csi [-- CYCLES]
//!
//! 1. Claim+release cycles on a 3-server loopback cluster of real `agent` processes (redb with
//!    fsync on every Raft append), driven by a fake client over real gRPC. One cycle =
//!    alloc upsert, claim (+ ControllerPublish), alloc complete, unpublish (NodeUnpublish +
//!    ControllerUnpublish), each step committed through Raft. Baseline: one replicated write
//!    (alloc upsert) measured in the same run. Then the same cycles from 32 concurrent
//!    claimers, each on its own volume: cycles/s against the sequential figure.
//! 2. Snapshot and restore of a state store holding 100,000 volumes. Baseline: copying every
//!    volume out of the state in memory (cloning the state itself is O(1): its tables are
//!    persistent maps).
//! 3. `volume create` + `volume delete` cycles through a 3-server cluster (one server also a
//!    client running `drover-csi-fake` as a raw_exec system job, real gRPC over its unix
//!    socket): CreateVolume + register, then DeleteVolume + deregister. Baseline in the same
//!    run: register (ValidateVolumeCapabilities) + deregister of the same volumes' shape.
//!    Also: create → schedulable (the create's answer until `GET` shows it schedulable).

#[path = "../tests/it/support/mod.rs"]
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
        let started = Instant::now();
        runtime.block_on(cycle(&client, leader_addr, "bench", &format!("bench-{i}")));
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
    let sequential = cycles as f64 / total.as_secs_f64();
    println!("  throughput: {sequential:.1} claim+release cycles per second");

    // 32 claimers at once, each cycling on its own volume.
    const CLAIMERS: usize = 32;
    for n in 0..CLAIMERS {
        let id = format!("bench-{n}");
        http(
            "PUT",
            leader_http,
            &format!("/v1/volume/csi/{id}"),
            Some(&volume_body(&id)),
        )
        .expect("volume registers");
    }
    let client = std::sync::Arc::new(client);
    let each = cycles.div_ceil(CLAIMERS).max(5);
    let started_all = Instant::now();
    let latencies: Vec<Duration> = runtime.block_on(async {
        let tasks: Vec<_> = (0..CLAIMERS)
            .map(|n| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut took = Vec::new();
                    for i in 0..each {
                        let started = Instant::now();
                        cycle(&client, leader_addr, &format!("bench-{n}"), &format!("c{n}-{i}")).await;
                        took.push(started.elapsed());
                    }
                    took
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all
    });
    let total = started_all.elapsed();
    let mut latencies = latencies;
    let concurrent = latencies.len() as f64 / total.as_secs_f64();
    println!(
        "  {CLAIMERS} concurrent claimers, {each} cycles each: {concurrent:.1} cycles per second ({:.1}x sequential), cycle p50 {:.2} ms p99 {:.2} ms",
        concurrent / sequential,
        ms(percentile(&mut latencies, 0.5)),
        ms(percentile(&mut latencies, 0.99)),
    );
}

/// One claim+release cycle of allocation `alloc` on volume `volume`, each step through Raft.
async fn cycle(client: &FakeClient, leader: SocketAddr, volume: &str, alloc: &str) {
    ok(client
        .request(
            leader,
            ServerRequest::AllocUpsert {
                allocs: vec![client.alloc(alloc)],
            },
        )
        .await);
    ok(client
        .request(
            leader,
            ServerRequest::VolumeClaim {
                secret_id: String::new(),
                namespace: "default".into(),
                volume_id: volume.into(),
                claim: client.claim(alloc, ClaimState::Taken),
            },
        )
        .await);
    ok(client
        .request(
            leader,
            ServerRequest::AllocClientUpdate {
                alloc_id: alloc.into(),
                client_status: ClientStatus::Complete,
            },
        )
        .await);
    ok(client
        .request(
            leader,
            ServerRequest::VolumeUnpublish {
                secret_id: String::new(),
                namespace: "default".into(),
                volume_id: volume.into(),
                claim: client.claim(alloc, ClaimState::Unpublishing),
            },
        )
        .await);
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
    let copy: Vec<CsiVolume> = state
        .volume_keys()
        .filter_map(|(ns, id)| state.volume_raw(ns, id).cloned())
        .collect();
    let clone_time = started.elapsed();
    assert_eq!(copy.len(), VOLUMES);
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
    println!("  baseline: copying every volume       {:>8.1} ms", ms(clone_time));
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
    create_delete_cycles(cycles);
}

fn volume_spec(id: &str) -> String {
    format!(
        r#"{{"Volumes":[{{"ID":"{id}","Name":"{id}","PluginID":"fake","RequestedCapacityMin":1048576,"RequestedCapabilities":[{{"AccessMode":"single-node-writer","AttachmentMode":"file-system"}}]}}]}}"#
    )
}

fn create_delete_cycles(cycles: usize) {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let config = root.path().join("client.hcl");
    std::fs::write(
        &config,
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut args = server_args(&specs, i);
            if i == 0 {
                args.push("-client".into());
                args.push(format!("-config={}", config.display()));
            }
            Agent::start(specs[i].clone(), args)
        })
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    wait_for(Duration::from_secs(60), || agreed_leader(&refs, 3)).expect("cluster forms");
    let port = specs[0].http;
    let state = root.path().join("fake-state");
    // The baseline's registered volumes exist in the plugin on first use (`--auto-create`),
    // 1 GiB each: 200 of them would fill the fake's default 100 GiB and refuse the creates.
    let job = format!(
        r#"{{"Job":{{"ID":"plugin","Type":"system","Datacenters":["dc1"],"TaskGroups":[{{"Name":"nodes","Count":1,"Tasks":[{{"Name":"plugin","Driver":"raw_exec","Config":{{"command":"{}","args":["--state-dir={}","--node-id=bench-node","--auto-create","--capacity-bytes=1125899906842624"]}},"CSIPluginConfig":{{"ID":"fake","Type":"monolith"}},"Resources":{{"CPU":50,"MemoryMB":32}}}}]}}]}}}}"#,
        env!("CARGO_BIN_EXE_drover-csi-fake"),
        state.display()
    );
    wait_for(Duration::from_secs(60), || {
        let nodes: serde_json::Value = serde_json::from_str(&http("GET", port, "/v1/nodes", None)?).ok()?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .expect("the client registers");
    http("PUT", port, "/v1/jobs", Some(&job)).expect("the plugin job registers");
    wait_for(Duration::from_secs(60), || {
        let plugin: serde_json::Value = serde_json::from_str(&http("GET", port, "/v1/plugin/csi/fake", None)?).ok()?;
        (plugin["ControllersHealthy"] == 1).then_some(())
    })
    .expect("the plugin is healthy");

    let create = |id: &str| {
        http(
            "PUT",
            port,
            &format!("/v1/volume/csi/{id}/create"),
            Some(&volume_spec(id)),
        )
        .expect("creates");
    };
    let timed = |step: &dyn Fn(usize)| -> Vec<Duration> {
        (0..cycles)
            .map(|i| {
                let started = Instant::now();
                step(i);
                started.elapsed()
            })
            .collect()
    };
    let mut baseline = timed(&|i| {
        let id = format!("r{i}");
        http("PUT", port, &format!("/v1/volume/csi/{id}"), Some(&volume_spec(&id))).expect("registers");
        http("DELETE", port, &format!("/v1/volume/csi/{id}"), None).expect("deregisters");
    });
    let started_all = Instant::now();
    let mut cycle = timed(&|i| {
        let id = format!("c{i}");
        create(&id);
        http("DELETE", port, &format!("/v1/volume/csi/{id}/delete"), None).expect("deletes");
    });
    let total = started_all.elapsed();
    let mut schedulable = timed(&|i| {
        let id = format!("s{i}");
        create(&id);
        loop {
            let volume: serde_json::Value =
                serde_json::from_str(&http("GET", port, &format!("/v1/volume/csi/{id}"), None).unwrap_or_default())
                    .unwrap_or_default();
            if volume["Schedulable"] == true {
                break;
            }
        }
    });
    let base = percentile(&mut baseline, 0.5);
    println!("3-server loopback cluster, drover-csi-fake over its socket, {cycles} sequential cycles:");
    println!("  baseline: register + deregister         p50 {:>7.2} ms", ms(base));
    println!(
        "  create + delete (CreateVolume, DeleteVolume) p50 {:>7.2} ms ({:.1}x baseline)  p99 {:>7.2} ms",
        ms(percentile(&mut cycle, 0.5)),
        ms(percentile(&mut cycle, 0.5)) / ms(base),
        ms(percentile(&mut cycle, 0.99)),
    );
    println!(
        "  throughput: {:.1} create+delete cycles per second",
        cycles as f64 / total.as_secs_f64()
    );
    println!(
        "  create -> schedulable                   p50 {:>7.2} ms ({:.1}x baseline)  p99 {:>7.2} ms",
        ms(percentile(&mut schedulable, 0.5)),
        ms(percentile(&mut schedulable, 0.5)) / ms(base),
        ms(percentile(&mut schedulable, 0.99)),
    );
    let _ = http("DELETE", port, "/v1/job/plugin", None);
}
