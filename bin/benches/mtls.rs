//! What mutual TLS costs agent RPC (issue 21 §4): the latency of a cheap server RPC
//! (`Status.Peers`) against a real agent without TLS and one with `tls { rpc = true
//! verify_server_hostname = true }`, from this process holding a client's certificate. Two
//! kinds per agent: calls on a warm connection (what agents do all day), and a fresh
//! connection per call (dial, TLS handshake, HTTP/2 set-up: what a reconnect costs). Rounds are
//! interleaved so warm-up favours none; figures are the median and p99 and the ratio to the
//! same kind without TLS, measured in the same run. Nothing is asserted.
//!
//!   cargo bench -p drover --bench mtls [-- CALLS]     (default 2,000 per kind)

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drover_host::net::GrpcTransport;
use drover_host::tls::agent::AgentTls;
use drover_host::tls::issue::Role;
use drover_io_real::io::Transport;
use drover_io_real::service::envelope;
use drover_proto::agent::v1::StatusPeersRequest;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use support::{Agent, cluster_specs, http, server_args, tls, wait_for};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let calls: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(2_000);
    let root = tempfile::tempdir().unwrap();
    let pki = tls::pki(&root.path().join("pki"), "bench CA");
    let plain_specs = cluster_specs(&root.path().join("plain"), 1);
    let tls_specs = cluster_specs(&root.path().join("tls"), 1);
    std::fs::create_dir_all(&tls_specs[0].data_dir).unwrap();
    let config = tls_specs[0].data_dir.join("tls.hcl");
    std::fs::write(&config, tls::block(&tls::settings(&pki, Role::Server))).unwrap();
    let mut tls_args = server_args(&tls_specs, 0);
    tls_args.push(format!("-config={}", config.display()));
    let plain = Agent::start(plain_specs[0].clone(), server_args(&plain_specs, 0));
    let secured = Agent::start(tls_specs[0].clone(), tls_args);
    for (agent, port) in [(&plain, plain_specs[0].http), (&secured, tls_specs[0].http)] {
        wait_for(Duration::from_secs(30), || http("GET", port, "/v1/jobs", None))
            .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    }
    let client_tls = Arc::new(AgentTls::load(tls::settings(&pki, Role::Client), "global").unwrap());
    let addr = |spec: &support::ServerSpec| -> SocketAddr { format!("127.0.0.1:{}", spec.rpc).parse().unwrap() };
    let (plain_addr, tls_addr) = (addr(&plain_specs[0]), addr(&tls_specs[0]));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let transport = |tls: bool| {
        let transport = GrpcTransport::default();
        if tls {
            transport.with_tls(client_tls.clone())
        } else {
            transport
        }
    };
    // (name, address, TLS, a fresh connection per call)
    let kinds = [
        ("warm connection, plaintext", plain_addr, false, false),
        ("warm connection, mutual TLS", tls_addr, true, false),
        ("new connection, plaintext", plain_addr, false, true),
        ("new connection, mutual TLS", tls_addr, true, true),
    ];
    let warm = [transport(false), transport(true)];
    let rounds = 5;
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    runtime.block_on(async {
        for _ in 0..rounds {
            for (kind, (name, addr, tls, fresh)) in kinds.iter().enumerate() {
                for _ in 0..calls / rounds {
                    let caller = if *fresh {
                        transport(*tls)
                    } else {
                        warm[usize::from(*tls)].clone()
                    };
                    let request = envelope("global", RequestBody::StatusPeers(StatusPeersRequest {}));
                    let started = Instant::now();
                    caller
                        .call(*addr, request, Duration::from_secs(10))
                        .await
                        .unwrap_or_else(|error| panic!("{name}: {error}"));
                    samples[kind].push(started.elapsed());
                }
            }
        }
    });
    println!("mtls: Status.Peers over agent RPC, {calls} calls per kind, client certificate");
    println!("  kind                          median       p99   median vs plaintext");
    for (kind, (name, ..)) in kinds.iter().enumerate() {
        samples[kind].sort();
        let baseline_kind = if kind % 2 == 1 { kind - 1 } else { kind };
        let median = percentile(&samples[kind], 0.5);
        let baseline = percentile(&samples[baseline_kind], 0.5);
        println!(
            "  {name:<28} {:>7.0} µs {:>7.0} µs   {:>6.2}x",
            median.as_secs_f64() * 1e6,
            percentile(&samples[kind], 0.99).as_secs_f64() * 1e6,
            median.as_secs_f64() / baseline.as_secs_f64()
        );
    }
}
