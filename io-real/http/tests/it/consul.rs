//! The production Consul client against a real HTTP server playing Consul: catalog lookups
//! (local and other datacenters), service registration, and a Consul that hangs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::{get, put};
use drover_host::consul::ConsulHttp;
use drover_io_real::io::{Consul, ServiceRegistration};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct FakeConsul {
    registered: Arc<Mutex<Vec<Value>>>,
    hang: bool,
}

async fn catalog(
    State(fake): State<FakeConsul>,
    Path(service): Path<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> axum::Json<Value> {
    if fake.hang {
        std::future::pending::<()>().await;
    }
    assert_eq!(service, "nomad");
    assert_eq!(query.get("tag").map(String::as_str), Some("serf"));
    let answer = match query.get("dc").map(String::as_str) {
        None => json!([
            {"Address": "10.0.0.1", "ServiceAddress": "", "ServicePort": 4648},
            {"Address": "10.0.0.9", "ServiceAddress": "10.0.0.2", "ServicePort": 5648}
        ]),
        Some("dc2") => json!([{"Address": "10.1.0.1", "ServiceAddress": "", "ServicePort": 4648}]),
        Some(other) => panic!("unexpected dc {other}"),
    };
    axum::Json(answer)
}

async fn datacenters() -> axum::Json<Value> {
    axum::Json(json!(["dc1", "dc2"]))
}

async fn register(State(fake): State<FakeConsul>, body: axum::Json<Value>) {
    fake.registered.lock().unwrap().push(body.0);
}

/// What a Consul 1.9 agent answers, trimmed to the fields the fingerprint reads.
async fn agent_self() -> axum::Json<Value> {
    axum::Json(json!({
        "Config": {"Datacenter": "dc1", "NodeName": "host-7", "Revision": "f55da9306", "Server": false, "Version": "1.9.5"},
        "DebugConfig": {"ConnectEnabled": true, "GRPCPort": 8502},
        "Member": {"Tags": {"role": "node"}}
    }))
}

async fn serve(fake: FakeConsul) -> SocketAddr {
    let app = Router::new()
        .route("/v1/catalog/service/{service}", get(catalog))
        .route("/v1/catalog/datacenters", get(datacenters))
        .route("/v1/agent/service/register", put(register))
        .route("/v1/agent/self", get(agent_self))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn catalog_lookup_covers_every_datacenter_and_prefers_service_addresses() {
    let addr = serve(FakeConsul::default()).await;
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2));
    let servers = consul.catalog_service("nomad", "serf").await.unwrap();
    let expected: Vec<SocketAddr> = ["10.0.0.1:4648", "10.0.0.2:5648", "10.1.0.1:4648"]
        .iter()
        .map(|text| text.parse().unwrap())
        .collect();
    assert_eq!(servers, expected);
}

#[tokio::test]
async fn registration_uses_consuls_field_names() {
    let fake = FakeConsul::default();
    let addr = serve(fake.clone()).await;
    let consul = ConsulHttp::new(&format!("http://{addr}/"), Duration::from_secs(2));
    consul
        .register_service(ServiceRegistration {
            id: "_nomad-server-s1.global-serf".into(),
            name: "nomad".into(),
            tags: vec!["serf".into()],
            addr: "10.0.0.1:4648".parse().unwrap(),
        })
        .await
        .unwrap();
    let registered = fake.registered.lock().unwrap().clone();
    assert_eq!(
        registered,
        vec![
            json!({"ID": "_nomad-server-s1.global-serf", "Name": "nomad", "Tags": ["serf"], "Address": "10.0.0.1", "Port": 4648})
        ]
    );
}

#[tokio::test]
async fn the_agent_is_fingerprinted_with_nomads_attribute_names() {
    let addr = serve(FakeConsul::default()).await;
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2));
    let attributes = consul.fingerprint().await.unwrap();
    let expected: BTreeMap<String, String> = [
        ("consul.connect", "true"),
        ("consul.datacenter", "dc1"),
        ("consul.grpc", "8502"),
        ("consul.revision", "f55da9306"),
        ("consul.server", "false"),
        ("consul.version", "1.9.5"),
        ("unique.consul.name", "host-7"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    assert_eq!(attributes, expected);
}

#[tokio::test]
async fn a_connect_group_service_is_registered_with_its_sidecar_and_checks() {
    use drover_core::client::services::{
        CheckRegistration, ConnectRegistration, SidecarRegistration, TaskServiceRegistration,
    };
    use drover_core::connect::ConsulUpstream;
    let fake = FakeConsul::default();
    let addr = serve(fake.clone()).await;
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2));
    let registration = TaskServiceRegistration {
        id: "_nomad-task-a1-group-api-count-api-http".into(),
        name: "count-api".into(),
        port: 9001,
        checks: vec![CheckRegistration {
            id: "_nomad-check-1".into(),
            name: "alive".into(),
            check_type: "http".into(),
            port: 9001,
            path: "/health".into(),
            interval_ms: 10_000,
            timeout_ms: 2_000,
            ..CheckRegistration::default()
        }],
        connect: Some(ConnectRegistration {
            native: false,
            sidecar: Some(SidecarRegistration {
                port: 21000,
                local_service_address: "10.0.0.5".into(),
                local_service_port: 9001,
                upstreams: vec![ConsulUpstream {
                    destination_name: "count-db".into(),
                    local_bind_port: 8080,
                    ..ConsulUpstream::default()
                }],
                ..SidecarRegistration::default()
            }),
        }),
        ..TaskServiceRegistration::default()
    };
    consul
        .register_task_service(&registration, "10.0.0.5".parse().unwrap())
        .await
        .unwrap();
    let registered = fake.registered.lock().unwrap().clone();
    assert_eq!(
        registered,
        vec![json!({
            "ID": "_nomad-task-a1-group-api-count-api-http", "Name": "count-api", "Tags": [], "Meta": {},
            "EnableTagOverride": false, "Address": "10.0.0.5", "Port": 9001,
            "Checks": [{"CheckID": "_nomad-check-1", "Name": "alive", "Interval": "10000ms", "Timeout": "2000ms",
                        "HTTP": "http://10.0.0.5:9001/health"}],
            "Connect": {"SidecarService": {"Port": 21000, "Tags": [], "Proxy": {
                "LocalServiceAddress": "10.0.0.5", "LocalServicePort": 9001,
                "Upstreams": [{"DestinationName": "count-db", "LocalBindPort": 8080}], "Config": {}}}}
        })]
    );
}

/// A check's initial status, gRPC service and TLS settings, and HTTP headers reach Consul in
/// its field names (Nomad's `createCheckReg`).
#[tokio::test]
async fn check_settings_are_registered_in_consuls_field_names() {
    use drover_core::client::services::{CheckRegistration, TaskServiceRegistration};
    let fake = FakeConsul::default();
    let addr = serve(fake.clone()).await;
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2));
    let check = |id: &str, check_type: &str| CheckRegistration {
        id: id.into(),
        name: id.into(),
        check_type: check_type.into(),
        port: 9001,
        interval_ms: 10_000,
        timeout_ms: 2_000,
        ..CheckRegistration::default()
    };
    let registration = TaskServiceRegistration {
        id: "_nomad-task-a1-t-api-http".into(),
        name: "api".into(),
        port: 9001,
        checks: vec![
            CheckRegistration {
                path: "/health".into(),
                protocol: "https".into(),
                tls_skip_verify: true,
                initial_status: "passing".into(),
                header: [("X-Probe".to_string(), vec!["a".to_string(), "b".to_string()])].into(),
                ..check("h", "http")
            },
            CheckRegistration {
                grpc_service: "health.v1".into(),
                grpc_use_tls: true,
                initial_status: "warning".into(),
                ..check("g", "grpc")
            },
        ],
        ..TaskServiceRegistration::default()
    };
    consul
        .register_task_service(&registration, "10.0.0.5".parse().unwrap())
        .await
        .unwrap();
    let registered = fake.registered.lock().unwrap().clone();
    assert_eq!(
        registered[0]["Checks"],
        json!([
            {"CheckID": "h", "Name": "h", "Interval": "10000ms", "Timeout": "2000ms",
             "HTTP": "https://10.0.0.5:9001/health", "Header": {"X-Probe": ["a", "b"]},
             "TLSSkipVerify": true, "Status": "passing"},
            {"CheckID": "g", "Name": "g", "Interval": "10000ms", "Timeout": "2000ms",
             "GRPC": "10.0.0.5:9001/health.v1", "GRPCUseTLS": true, "Status": "warning"}
        ])
    );
}

#[tokio::test]
async fn a_hung_consul_fails_the_call_at_the_deadline() {
    let addr = serve(FakeConsul {
        hang: true,
        ..FakeConsul::default()
    })
    .await;
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_millis(300));
    let started = Instant::now();
    let error = consul.catalog_service("nomad", "serf").await.unwrap_err();
    assert!(error.contains("timed out"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "the deadline held");
}

#[tokio::test]
async fn a_down_consul_is_an_error_not_a_hang() {
    // A port no test holds and nothing listens on.
    let port = drover_testkit::free_port();
    let consul = ConsulHttp::new(&format!("127.0.0.1:{port}"), Duration::from_secs(2));
    assert!(consul.catalog_service("nomad", "serf").await.is_err());
}

/// Consul's ACL token API as the leader uses it for service identity tokens: tokens by
/// accessor, the token each call presented, and a mode answering 500.
#[derive(Clone, Default)]
struct FakeAcl {
    tokens: Arc<Mutex<BTreeMap<String, Value>>>,
    presented: Arc<Mutex<Vec<String>>>,
    failing: Arc<Mutex<bool>>,
}

async fn acl_create(
    State(fake): State<FakeAcl>,
    headers: axum::http::HeaderMap,
    body: axum::Json<Value>,
) -> Result<axum::Json<Value>, (axum::http::StatusCode, String)> {
    let token = headers
        .get("x-consul-token")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    fake.presented.lock().unwrap().push(token.to_string());
    if *fake.failing.lock().unwrap() {
        return Err((
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "rpc error: No cluster leader".into(),
        ));
    }
    let mut tokens = fake.tokens.lock().unwrap();
    let accessor = format!("acc-{}", tokens.len());
    tokens.insert(accessor.clone(), body.0);
    Ok(axum::Json(
        json!({"AccessorID": accessor, "SecretID": format!("secret-of-{accessor}")}),
    ))
}

async fn acl_delete(
    State(fake): State<FakeAcl>,
    Path(accessor): Path<String>,
) -> Result<axum::Json<Value>, (axum::http::StatusCode, String)> {
    match fake.tokens.lock().unwrap().remove(&accessor) {
        Some(_) => Ok(axum::Json(json!(true))),
        None => Err((axum::http::StatusCode::NOT_FOUND, "ACL not found".into())),
    }
}

#[tokio::test]
async fn service_identity_tokens_are_created_and_revoked_through_consuls_acl_api() {
    use drover_core::rpc::{ConsulAclCall, ConsulAclReply};
    let fake = FakeAcl::default();
    let app = Router::new()
        .route("/v1/acl/token", put(acl_create))
        .route("/v1/acl/token/{accessor}", axum::routing::delete(acl_delete))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(2)).with_token(Some("nomad-acl".into()));

    let create = ConsulAclCall::CreateToken {
        description: "_nomad_si [c1] [a1] [connect-proxy-web]".into(),
        service_name: "web".into(),
    };
    let created = consul.acl_call(create.clone()).await.unwrap();
    assert_eq!(
        created,
        ConsulAclReply::Created {
            accessor_id: "acc-0".into(),
            secret_id: "secret-of-acc-0".into()
        }
    );
    assert_eq!(
        fake.tokens.lock().unwrap()["acc-0"],
        json!({
            "Description": "_nomad_si [c1] [a1] [connect-proxy-web]",
            "ServiceIdentities": [{"ServiceName": "web"}],
            "Local": true,
        })
    );
    assert_eq!(*fake.presented.lock().unwrap(), ["nomad-acl"]);

    let revoke = ConsulAclCall::RevokeToken {
        accessor_id: "acc-0".into(),
    };
    assert_eq!(consul.acl_call(revoke.clone()).await.unwrap(), ConsulAclReply::Revoked);
    assert!(fake.tokens.lock().unwrap().is_empty());
    // Revoked already: Consul does not know it, which counts as revoked.
    let again = consul.acl_call(revoke).await.unwrap_err();
    assert!(again.not_found && !again.retryable, "{again:?}");
    // A 500 is worth retrying; so is a Consul nobody answers on.
    *fake.failing.lock().unwrap() = true;
    let failed = consul.acl_call(create.clone()).await.unwrap_err();
    assert!(
        failed.retryable && !failed.not_found && failed.message.contains("500"),
        "{failed:?}"
    );
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nobody = closed.local_addr().unwrap();
    drop(closed);
    let unreachable = ConsulHttp::new(&nobody.to_string(), Duration::from_secs(2))
        .acl_call(create)
        .await
        .unwrap_err();
    assert!(unreachable.retryable, "{unreachable:?}");
}

/// The leader's token creations go out together: ten calls made at once all reach Consul
/// before any is answered (each waits for the other nine), so they cannot be serialised by a
/// single connection. Measured, not timed: a serialised client never fills the barrier.
#[tokio::test]
async fn concurrent_acl_calls_reach_consul_together() {
    use drover_core::rpc::ConsulAclCall;
    let barrier = Arc::new(tokio::sync::Barrier::new(10));
    let app = Router::new()
        .route(
            "/v1/acl/token",
            put(move || {
                let barrier = barrier.clone();
                async move {
                    barrier.wait().await;
                    axum::Json(json!({"AccessorID": "a", "SecretID": "s"}))
                }
            }),
        )
        .with_state(());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let consul = ConsulHttp::new(&addr.to_string(), Duration::from_secs(10));
    let calls = (0..10).map(|n| {
        let consul = consul.clone();
        tokio::spawn(async move {
            consul
                .acl_call(ConsulAclCall::CreateToken {
                    description: format!("t{n}"),
                    service_name: "web".into(),
                })
                .await
        })
    });
    for call in futures::future::join_all(calls).await {
        assert!(call.unwrap().is_ok(), "every call answered once all ten were in");
    }
}
