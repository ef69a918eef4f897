//! Consul-assisted discovery with real processes: three servers with no `retry_join` register
//! themselves in a Consul catalog (their `serf` and `rpc` addresses) and find each other
//! there; a client-only agent with no `servers` finds them there too (`client_auto_join`). The
//! Consul is a small stateful HTTP server in this test; it refuses every call for its first
//! seconds, as a Consul that is still starting would.

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Agent, agreed_leader, cluster_specs, wait_for};

struct FakeConsul {
    /// (tag, address, port) of every registration.
    services: Mutex<Vec<(String, String, u16)>>,
    available_after: Instant,
}

fn handle(consul: &FakeConsul, stream: std::net::TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut content_length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some(value) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            content_length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; content_length];
    reader.read_exact(&mut body).unwrap();
    let mut stream = stream;
    if Instant::now() < consul.available_after {
        let _ = write!(
            stream,
            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 20\r\nConnection: close\r\n\r\nconsul is not ready "
        );
        return;
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
    let answer = if path.starts_with("/v1/agent/service/register") {
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let entry = (
            json["Tags"][0].as_str().unwrap_or("").to_string(),
            json["Address"].as_str().unwrap().to_string(),
            json["Port"].as_u64().unwrap() as u16,
        );
        let mut services = consul.services.lock().unwrap();
        if !services.contains(&entry) {
            services.push(entry);
        }
        String::new()
    } else if path.starts_with("/v1/catalog/datacenters") {
        "[\"dc1\"]".to_string()
    } else if path.starts_with("/v1/catalog/service/nomad") {
        let tag = path
            .split("tag=")
            .nth(1)
            .and_then(|rest| rest.split('&').next())
            .unwrap_or("");
        let services = consul.services.lock().unwrap();
        let entries: Vec<serde_json::Value> = services
            .iter()
            .filter(|(registered, _, _)| registered == tag)
            .map(|(_, ip, port)| serde_json::json!({"Address": ip, "ServiceAddress": ip, "ServicePort": port}))
            .collect();
        serde_json::to_string(&entries).unwrap()
    } else {
        let _ = write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    };
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

fn start_consul(unavailable_for: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let consul = Arc::new(FakeConsul {
        services: Mutex::new(Vec::new()),
        available_after: Instant::now() + unavailable_for,
    });
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let consul = consul.clone();
            std::thread::spawn(move || handle(&consul, stream));
        }
    });
    port
}

#[test]
fn servers_find_each_other_through_consul() {
    let consul_port = start_consul(Duration::from_secs(3));
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 4);
    let agents: Vec<Agent> = specs[..3]
        .iter()
        .map(|spec| {
            let config = root.path().join(format!("{}.hcl", spec.name));
            std::fs::write(
                &config,
                format!("consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  timeout = \"2s\"\n}}\n"),
            )
            .unwrap();
            Agent::start(
                spec.clone(),
                vec![
                    "-server".into(),
                    "-bootstrap-expect=3".into(),
                    format!("-data-dir={}", spec.data_dir.display()),
                    format!("-node={}", spec.name),
                    "-bind=127.0.0.1".into(),
                    format!("-http-port={}", spec.http),
                    format!("-rpc-port={}", spec.rpc),
                    format!("-serf-port={}", spec.serf),
                    format!("-config={}", config.display()),
                ],
            )
        })
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader = wait_for(Duration::from_secs(90), || agreed_leader(&refs, 3));
    let logs: Vec<String> = agents.iter().map(Agent::log).collect();
    assert!(
        leader.is_some(),
        "no leader via Consul discovery:\n{}",
        logs.join("\n---\n")
    );
    assert!(
        logs.iter().any(|log| log.contains("joining server found in Consul")),
        "discovery went through Consul:\n{}",
        logs.join("\n---\n")
    );

    // A client-only agent with no servers configured finds them in Consul and registers.
    let spec = &specs[3];
    let config = root.path().join("client.hcl");
    std::fs::write(
        &config,
        format!("consul {{\n  address = \"127.0.0.1:{consul_port}\"\n}}\n"),
    )
    .unwrap();
    let client = Agent::start(
        spec.clone(),
        vec![
            "-client".into(),
            format!("-data-dir={}", spec.data_dir.display()),
            format!("-node={}", spec.name),
            "-bind=127.0.0.1".into(),
            format!("-http-port={}", spec.http),
            format!("-rpc-port={}", spec.rpc),
            format!("-serf-port={}", spec.serf),
            format!("-config={}", config.display()),
        ],
    );
    wait_for(Duration::from_secs(60), || {
        let nodes: serde_json::Value = serde_json::from_str(&agents[0].get("/v1/nodes")?).ok()?;
        nodes
            .as_array()?
            .iter()
            .any(|node| node["Name"] == spec.name.as_str() && node["Status"] == "ready")
            .then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the client registers through servers found in Consul:\n{}",
            client.log()
        )
    });
    assert!(
        client.log().contains("found servers through Consul"),
        "{}",
        client.log()
    );
}
