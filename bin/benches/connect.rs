//! Consul Connect figures. Prints; asserts nothing.
//!
//!   cargo bench -p drover --bench connect [-- ROUNDS]
//!
//! 1. `Node.DeriveSIToken` for an allocation with 10 Connect sidecars, on a real `agent`
//!    server (redb, fsync on every Raft append) whose Consul is a fake HTTP server answering
//!    every ACL call after 5 ms. One round = ten tokens created in Consul, their accessors
//!    committed through Raft, the secrets returned. Baselines measured in the same run: one
//!    replicated write (an alloc upsert), and ten 5 ms calls made one after another.
//! 2. The leader's revocation loop with 10,000 accessors: the cost of one leader turn while
//!    their allocations run (nothing to revoke), against the same turn over the same 10,000
//!    allocations with no accessors; then
//!    the turn that finds all 10,000 allocations finished, and how long the 500-per-second
//!    rate limit takes to issue every revocation.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use drover_core::connect::{ConsulConnect, ConsulSidecarService, SiTokenAccessor};
use drover_core::fsm::{Command, Entry, ServerState};
use drover_core::rpc::{Action, Input, RpcEndpoints, ServerReply, ServerRequest};
use drover_core::structs::{
    ClientStatus, Job, JobType, NetworkResource, Port, Service, Task, TaskGroup, TaskResources,
};
use support::csi::FakeClient;
use support::{Agent, cluster_specs, free_ports, server_args, wait_for};

const SIDECARS: usize = 10;
const CONSUL_LATENCY: Duration = Duration::from_millis(5);

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

/// A Consul answering every ACL call after `CONSUL_LATENCY`, one thread per connection.
fn fake_consul() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let made = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let made = made.clone();
            std::thread::spawn(move || serve(stream, &made));
        }
    });
    port
}

/// Keep-alive: answers requests on one connection until the client closes it.
fn serve(stream: std::net::TcpStream, made: &AtomicU64) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut content_length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                break;
            }
            if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let mut words = request_line.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let answer = if path.starts_with("/v1/acl/token") {
            std::thread::sleep(CONSUL_LATENCY);
            if method == "PUT" {
                let n = made.fetch_add(1, Ordering::Relaxed);
                format!("{{\"AccessorID\": \"acc-{n}\", \"SecretID\": \"sec-{n}\"}}")
            } else if method == "GET" {
                "[]".to_string()
            } else {
                "true".to_string()
            }
        } else if path.starts_with("/v1/catalog/datacenters") {
            "[\"dc1\"]".to_string()
        } else {
            "[]".to_string()
        };
        // One write (and no Nagle): a response split over writes waits for the client's
        // delayed ACK, 40 ms a call, which would be measured as Drover's.
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// Job "app", group "web" with `SIDECARS` Connect services (the servers inject the sidecars).
fn connect_job() -> Job {
    Job {
        id: "app".into(),
        name: "app".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: 1,
            tasks: vec![Task {
                name: "main".into(),
                driver: "raw_exec".into(),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            networks: vec![NetworkResource {
                mode: "host".into(),
                dynamic_ports: vec![Port {
                    label: "http".into(),
                    ..Port::default()
                }],
                ..NetworkResource::default()
            }],
            services: (0..SIDECARS)
                .map(|n| Service {
                    name: format!("svc{n}"),
                    port_label: "http".into(),
                    address_mode: "auto".into(),
                    connect: Some(ConsulConnect {
                        sidecar_service: Some(ConsulSidecarService::default()),
                        ..ConsulConnect::default()
                    }),
                    ..Service::default()
                })
                .collect(),
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn derive_rounds(rounds: usize) {
    let consul_port = fake_consul();
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let config = specs[0].data_dir.join("consul.hcl");
    std::fs::write(
        &config,
        format!("consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  token = \"bench\"\n}}\n"),
    )
    .unwrap();
    let mut args = server_args(&specs, 0);
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(specs[0].clone(), args);
    let leader = wait_for(Duration::from_secs(60), || agent.leader()).expect("the server leads");
    let leader: SocketAddr = leader.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(FakeClient::start("client-1", free_ports()[0]));
    let mut node = client.node();
    node.secret_id = "bench-secret".into();
    let register = |request| runtime.block_on(client.request(leader, request));
    assert!(matches!(
        register(ServerRequest::NodeRegister { node: Box::new(node) }),
        ServerReply::Heartbeat { .. }
    ));
    let registered = register(ServerRequest::JobRegister {
        job: Box::new(connect_job()),
        enforce_index: None,
    });
    assert!(
        matches!(registered, ServerReply::JobRegistered { .. }),
        "{registered:?}"
    );
    let tasks: Vec<String> = (0..SIDECARS).map(|n| format!("connect-proxy-svc{n}")).collect();

    let mut writes = Vec::new();
    let mut derives = Vec::new();
    for round in 0..rounds {
        let mut alloc = client.alloc(&format!("00000000-0000-0000-0000-{round:012}"));
        alloc.job_id = "app".into();
        alloc.client_status = ClientStatus::Running;
        let started = Instant::now();
        let reply = register(ServerRequest::AllocUpsert {
            allocs: vec![alloc.clone()],
        });
        writes.push(started.elapsed());
        assert!(matches!(reply, ServerReply::Done { .. }), "{reply:?}");
        let started = Instant::now();
        let reply = register(ServerRequest::DeriveSiToken {
            node_id: client.node_id.clone(),
            secret_id: "bench-secret".into(),
            alloc_id: alloc.id.clone(),
            tasks: tasks.clone(),
        });
        derives.push(started.elapsed());
        match reply {
            ServerReply::SiTokens { tokens, .. } => assert_eq!(tokens.len(), SIDECARS),
            other => panic!("derivation failed: {other:?}\n{}", agent.log()),
        }
    }
    let median_write = percentile(&mut writes, 0.5);
    let median = percentile(&mut derives, 0.5);
    let p99 = percentile(&mut derives, 0.99);
    let serial = CONSUL_LATENCY * SIDECARS as u32 + median_write;
    println!(
        "DeriveSIToken, {SIDECARS} sidecars, Consul at {} ms: median {:.1} ms, p99 {:.1} ms over {rounds} rounds = {:.0} tokens/s",
        ms(CONSUL_LATENCY),
        ms(median),
        ms(p99),
        SIDECARS as f64 / median.as_secs_f64()
    );
    println!(
        "  baselines (same run): one replicated write {:.1} ms; ten calls one after another + that write {:.1} ms ({:.0} tokens/s)",
        ms(median_write),
        ms(serial),
        SIDECARS as f64 / serial.as_secs_f64()
    );
    println!(
        "  ratio: {:.2}x the replicated write, {:.2}x the serial estimate",
        median.as_secs_f64() / median_write.as_secs_f64(),
        median.as_secs_f64() / serial.as_secs_f64()
    );
}

/// The state with `allocs` running allocations on one node, the first `accessors` of them with
/// an accessor.
fn state_with(allocs: usize, accessors: usize) -> (ServerState, u64) {
    let mut state = ServerState::default();
    let mut index = 0;
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
    apply(
        &mut state,
        Command::LeadershipEstablished {
            leader_id: 1,
            term: 1,
            cluster_id: "bench".into(),
        },
    );
    let allocs: Vec<_> = (0..allocs)
        .map(|n| drover_core::structs::Allocation {
            id: format!("alloc-{n:06}"),
            namespace: "default".into(),
            node_id: "n1".into(),
            job_id: "app".into(),
            task_group: "web".into(),
            client_status: ClientStatus::Running,
            ..Default::default()
        })
        .collect();
    for chunk in allocs.chunks(1_000) {
        apply(&mut state, Command::AllocUpsert { allocs: chunk.to_vec() });
    }
    let accessors: Vec<SiTokenAccessor> = (0..accessors)
        .map(|n| SiTokenAccessor {
            node_id: "n1".into(),
            alloc_id: format!("alloc-{n:06}"),
            accessor_id: format!("acc-{n:06}"),
            task_name: "connect-proxy-svc0".into(),
            create_index: 0,
            orphaned: false,
        })
        .collect();
    for chunk in accessors.chunks(1_000) {
        apply(
            &mut state,
            Command::SiAccessorsUpsert {
                accessors: chunk.to_vec(),
            },
        );
    }
    (state, index)
}

fn leader_machine(state: &ServerState) -> RpcEndpoints {
    let config = drover_core::config::ServerConfig::default();
    let mut machine = RpcEndpoints::new(
        Duration::from_secs(10),
        config.timing.csi_gc,
        config.timing.heartbeat,
        Default::default(),
        7,
    );
    machine.handle(
        drover_core::time::Instant::ZERO,
        Input::Leadership { leader: true },
        state,
    );
    while machine.poll_action().is_some() {}
    machine
}

/// Mean wall time of one leader turn (`handle_timeout`) over `turns` turns.
fn turn_cost(state: &ServerState, turns: u32) -> Duration {
    let mut machine = leader_machine(state);
    let now = drover_core::time::Instant::ZERO + Duration::from_millis(1);
    let started = Instant::now();
    for _ in 0..turns {
        machine.handle_timeout(now, state);
        while machine.poll_action().is_some() {}
    }
    started.elapsed() / turns
}

fn revocation_loop() {
    const ACCESSORS: usize = 10_000;
    const TURNS: u32 = 200;
    let (empty, _) = state_with(ACCESSORS, 0);
    let (full, index) = state_with(ACCESSORS, ACCESSORS);
    let baseline = turn_cost(&empty, TURNS);
    let steady = turn_cost(&full, TURNS);
    println!(
        "leader turn, {ACCESSORS} running allocations with an accessor each: {:.1} µs vs {:.1} µs with no accessors ({:.2}x)",
        steady.as_secs_f64() * 1e6,
        baseline.as_secs_f64() * 1e6,
        steady.as_secs_f64() / baseline.as_secs_f64()
    );
    // Every allocation finishes at once: the revocations are rate limited to 500 a second.
    let mut finished = full.clone();
    let allocs: Vec<_> = finished
        .allocs()
        .map(|alloc| {
            let mut alloc = alloc.clone();
            alloc.client_status = ClientStatus::Complete;
            alloc
        })
        .collect();
    let mut at = index;
    for chunk in allocs.chunks(1_000) {
        at += 1;
        finished.apply(
            at,
            &Entry {
                at_unix_ms: at,
                command: Command::AllocUpsert { allocs: chunk.to_vec() },
            },
        );
    }
    let mut machine = leader_machine(&full);
    let mut now = drover_core::time::Instant::ZERO + Duration::from_millis(1);
    let started = Instant::now();
    let mut issued = 0usize;
    let mut turns = 0u32;
    let mut first_turn = None;
    let mut last_issued_at = now;
    while issued < ACCESSORS && turns < 100_000 {
        machine.handle_timeout(now, &finished);
        turns += 1;
        first_turn.get_or_insert_with(|| started.elapsed());
        // Consul takes each revocation at once; its answer may let the next call go.
        while let Some(action) = machine.poll_action() {
            if let Action::Consul { op, .. } = action {
                issued += 1;
                last_issued_at = now;
                let result = Ok(drover_core::rpc::ConsulAclReply::Revoked);
                machine.handle(now, Input::ConsulReplied { op, result }, &finished);
            }
        }
        match machine.poll_timeout() {
            Some(next) if next > now => now = next,
            _ => now = now + Duration::from_millis(2),
        }
    }
    let virtual_span = last_issued_at.saturating_duration_since(drover_core::time::Instant::ZERO);
    println!(
        "all {ACCESSORS} allocations finished: first turn {:.1} ms; {issued} revocation calls issued over {:.1} s of leader time (500/s limit) in {turns} turns, {:.0} ms of CPU",
        ms(first_turn.unwrap_or_default()),
        virtual_span.as_secs_f64(),
        ms(started.elapsed())
    );
}

fn main() {
    let rounds = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(50);
    derive_rounds(rounds);
    revocation_loop();
}
