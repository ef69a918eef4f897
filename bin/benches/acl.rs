//! What ACLs cost a cheap read (issue 21 §4): `GET /v1/jobs?stale` through a real agent's HTTP
//! API, one connection per request, against an agent without ACLs, and against one with ACLs
//! with a management token and with a client token whose policy the gate evaluates. Rounds are
//! interleaved so warm-up favours none; figures are requests per second and the ratio to the
//! agent without ACLs, measured in the same run. Nothing is asserted.
//!
//!   cargo bench -p drover --bench acl [-- REQUESTS]     (default 3,000 per kind)

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{Agent, cluster_specs, http, server_args, wait_for};

fn get(port: u16, path: &str, token: &str) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let header = if token.is_empty() {
        String::new()
    } else {
        format!("X-Nomad-Token: {token}\r\n")
    };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{header}\r\n"
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

fn put(port: u16, path: &str, token: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Nomad-Token: {token}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

fn secret(body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("a token: {body}"));
    value["SecretID"].as_str().expect("SecretID").to_string()
}

fn main() {
    let requests: usize = std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(3_000);
    let root = tempfile::tempdir().unwrap();
    let plain_specs = cluster_specs(&root.path().join("plain"), 1);
    let acl_specs = cluster_specs(&root.path().join("acl"), 1);
    std::fs::create_dir_all(&acl_specs[0].data_dir).unwrap();
    let config = acl_specs[0].data_dir.join("acl.hcl");
    std::fs::write(&config, "acl {\n  enabled = true\n}\n").unwrap();
    let mut acl_args = server_args(&acl_specs, 0);
    acl_args.push(format!("-config={}", config.display()));
    let plain = Agent::start(plain_specs[0].clone(), server_args(&plain_specs, 0));
    let acl = Agent::start(acl_specs[0].clone(), acl_args);
    let (plain_port, acl_port) = (plain_specs[0].http, acl_specs[0].http);
    wait_for(Duration::from_secs(30), || http("GET", plain_port, "/v1/jobs", None))
        .unwrap_or_else(|| panic!("the plain server answers:\n{}", plain.log()));
    let root_token = wait_for(Duration::from_secs(30), || {
        http("POST", acl_port, "/v1/acl/bootstrap", None).filter(|body| body.contains("SecretID"))
    })
    .map(|body| secret(&body))
    .unwrap_or_else(|| panic!("the ACL server bootstraps:\n{}", acl.log()));
    put(
        acl_port,
        "/v1/acl/policy/readonly",
        &root_token,
        r#"{"Rules": "namespace \"default\" { policy = \"read\" }"}"#,
    );
    let client_token = secret(&put(
        acl_port,
        "/v1/acl/token",
        &root_token,
        r#"{"Type": "client", "Policies": ["readonly"]}"#,
    ));

    let kinds: [(&str, u16, &str); 3] = [
        ("no ACLs", plain_port, ""),
        ("ACLs, management token", acl_port, &root_token),
        ("ACLs, client token", acl_port, &client_token),
    ];
    let rounds = 5;
    let mut spent = [Duration::ZERO; 3];
    for _ in 0..rounds {
        for (kind, (_, port, token)) in kinds.iter().enumerate() {
            let started = Instant::now();
            for _ in 0..requests / rounds {
                let status = get(*port, "/v1/jobs?stale", token);
                assert_eq!(status, 200, "{}", kinds[kind].0);
            }
            spent[kind] += started.elapsed();
        }
    }
    println!("acl: GET /v1/jobs?stale, one connection per request, {requests} requests per kind");
    println!("  kind                       requests/s  vs no ACLs");
    let per_second = |time: Duration| (requests / rounds * rounds) as f64 / time.as_secs_f64();
    let baseline = per_second(spent[0]);
    for ((name, _, _), time) in kinds.iter().zip(spent) {
        println!(
            "  {name:<25}  {:>10.0}  {:>10.2}x",
            per_second(time),
            per_second(time) / baseline
        );
    }
}
