// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

//! One real server agent for the HTTP tests: its own data dir, ports the OS hands out, the
//! production gRPC transport and HTTP server, started and waited for until it leads.

pub mod idp;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use drover_core::config::Ports;
use drover_host::net::GrpcTransport;
use drover_host::tls::agent::AgentTls;
use drover_http::HttpLimits;
use drover_io_real::driver::{AgentHandle, AgentParts, start_agent};
use drover_io_real::io::{NoConsul, TracingObserver};

/// A started server: its handle, HTTP port and RPC port.
pub struct Server {
    pub handle: AgentHandle,
    pub http: u16,
    pub rpc: u16,
}

/// Starts a single server in `dir`, with ACLs on when `acl`, the HTTP API within `limits` and
/// at most `rpc_max_conns` RPC connections per address.
pub async fn start_server(dir: &std::path::Path, acl: bool, limits: HttpLimits, rpc_max_conns: usize) -> Server {
    start_server_with_tls(dir, acl, limits, rpc_max_conns, None).await
}

/// [`start_server`], with `tls` on RPC and HTTP as its settings say.
pub async fn start_server_with_tls(
    dir: &std::path::Path,
    acl: bool,
    limits: HttpLimits,
    rpc_max_conns: usize,
    tls: Option<Arc<AgentTls>>,
) -> Server {
    let [rpc, serf] = drover_testkit::free_ports::<2>();
    let ports = Ports { http: 0, rpc, serf };
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut config = drover_core::testkit::lone_server_config("test", &dir.display().to_string(), ports);
    config.acl.enabled = acl;
    // Tests watch tokens expire within milliseconds (Nomad's floor is a minute).
    config.acl.token_min_expiration_ttl = std::time::Duration::from_millis(1);
    let handle = start_agent(AgentParts {
        config,
        db: drover_host::disk::open_database(dir).unwrap(),
        transport: match tls.clone().filter(|tls| tls.settings().rpc) {
            Some(tls) => GrpcTransport::default()
                .with_max_conns_per_client(rpc_max_conns)
                .with_tls(tls),
            None => GrpcTransport::default().with_max_conns_per_client(rpc_max_conns),
        },
        consul: NoConsul,
        observer: Arc::new(TracingObserver),
        client_csi: None,
        disk_latency: None,
        keystore: None,
    })
    .await
    .unwrap();
    let https = tls.filter(|tls| tls.settings().http);
    let sockets = drover_host::sockets::TokioSockets;
    let http = drover_http::serve_tls(&sockets, handle.clone(), SocketAddr::new(ip, 0), limits, https)
        .await
        .unwrap()
        .port();
    wait_until_serving(&handle).await;
    Server {
        handle,
        http,
        rpc: ports.rpc,
    }
}

/// Waits until the agent's leader endpoints answer: Raft naming a leader is not enough, the
/// new leader serves requests only once its leadership barrier is applied (before that every
/// request is refused with "No cluster leader", which a test must not race).
pub async fn wait_until_serving(handle: &AgentHandle) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let probe = drover_core::rpc::ServerRequest::VariablesRead {
            paths: Vec::new(),
            node_id: String::new(),
            secret_id: String::new(),
        };
        match handle.request(probe).await {
            drover_core::rpc::ServerReply::Error(error) if error.retryable => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the agent never started serving: {}",
                    error.message
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            _ => return,
        }
    }
}
