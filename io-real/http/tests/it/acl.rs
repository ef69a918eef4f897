//! ACLs through a real agent's HTTP API on a real socket: bootstrap once (and again through
//! the reset file), policies in Nomad's language, client tokens held to their capabilities per
//! endpoint family, the anonymous policy, either token header, a namespace named in a job's
//! body, expired and deleted tokens.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

/// Sends one request; `header` is a whole header line ("X-Nomad-Token: ...") or empty.
fn send(port: u16, method: &str, path: &str, header: &str, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let header = if header.is_empty() {
        String::new()
    } else {
        format!("{header}\r\n")
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{header}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// One request and its whole answer.
fn call(port: u16, method: &str, path: &str, header: &str, body: &str) -> (u16, String) {
    let mut stream = send(port, method, path, header, body);
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        body.to_string(),
    )
}

async fn http(port: u16, method: &'static str, path: String, token: String, body: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let header = if token.is_empty() {
            String::new()
        } else {
            format!("X-Nomad-Token: {token}")
        };
        call(port, method, &path, &header, &body)
    })
    .await
    .unwrap()
}

/// [`job`] with one allocation to place.
fn job_of_one(namespace: &str) -> String {
    job(namespace).replace(r#""Count":0"#, r#""Count":1"#)
}

fn job(namespace: &str) -> String {
    json!({"Job": {"ID": "web", "Namespace": namespace, "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 0, "Tasks": [{"Name": "t", "Driver": "raw_exec",
            "Config": {"command": "/bin/true"}, "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_held_to_their_policies_on_every_endpoint_family() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let (handle, port) = (server.handle, server.http);
    let get = |path: &str, token: &str| http(port, "GET", path.into(), token.into(), String::new());

    // Before any token: status answers, everything else is denied.
    assert_eq!(get("/v1/status/leader", "").await.0, 200);
    assert_eq!(get("/v1/jobs", "").await, (403, "Permission denied".into()));

    // Bootstrap once.
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap".into(), String::new(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(root["Type"], "management");
    let first_root = root["SecretID"].as_str().unwrap().to_string();
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap".into(), String::new(), String::new()).await;
    assert_eq!(status, 400);
    let done_at: u64 = body
        .strip_prefix("ACL bootstrap already done (reset index: ")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{body}"))
        .parse()
        .unwrap();
    // The reset file naming that index allows one more.
    std::fs::write(dir.path().join("acl-bootstrap-reset"), done_at.to_string()).unwrap();
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap".into(), String::new(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    let root = root["SecretID"].as_str().unwrap().to_string();
    assert_ne!(root, first_root);
    assert_eq!(get("/v1/jobs", &root).await.0, 200);

    // A policy in Nomad's language; a bad one is refused with its reason.
    let policy = |rules: &str| json!({"Description": "d", "Rules": rules}).to_string();
    let put_policy = |name: &str, rules: &str| {
        http(
            port,
            "PUT",
            format!("/v1/acl/policy/{name}"),
            root.clone(),
            policy(rules),
        )
    };
    let (status, body) = put_policy("broken", "namespace \"default\" { policy = \"root\" }").await;
    assert_eq!((status, body.as_str()), (400, "Invalid namespace policy: \"root\""));
    let (status, body) = put_policy(
        "readonly",
        "namespace \"default\" { policy = \"read\" }\nnode { policy = \"read\" }",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = put_policy("submit", "namespace \"default\" { capabilities = [\"submit-job\"] }").await;
    assert_eq!(status, 200, "{body}");

    // Client tokens.
    let create = |policies: Value| {
        http(
            port,
            "PUT",
            "/v1/acl/token".into(),
            root.clone(),
            json!({"Name": "t", "Type": "client", "Policies": policies}).to_string(),
        )
    };
    let (status, body) = create(json!(["readonly"])).await;
    assert_eq!(status, 200, "{body}");
    let reader: Value = serde_json::from_str(&body).unwrap();
    let (reader, reader_accessor) = (
        reader["SecretID"].as_str().unwrap().to_string(),
        reader["AccessorID"].as_str().unwrap().to_string(),
    );
    let (_, body) = create(json!(["submit"])).await;
    let submitter: Value = serde_json::from_str(&body).unwrap();
    let submitter = submitter["SecretID"].as_str().unwrap().to_string();
    let (status, body) = create(json!([])).await;
    assert_eq!((status, body.as_str()), (400, "client token missing policies or roles"));

    // Per endpoint family: what the reader may and may not do.
    for (method, path, body, want) in [
        ("GET", "/v1/jobs", String::new(), 200),
        ("GET", "/v1/nodes", String::new(), 200),
        ("GET", "/v1/volumes?type=csi", String::new(), 200),
        ("PUT", "/v1/jobs", job("default"), 403),
        ("GET", "/v1/plugins", String::new(), 403),
        (
            "PUT",
            "/v1/node/n1/eligibility",
            "{\"Eligibility\":\"ineligible\"}".into(),
            403,
        ),
        ("GET", "/v1/var/a", String::new(), 403),
        ("GET", "/v1/acl/tokens", String::new(), 403),
        ("GET", "/v1/agent/self", String::new(), 403),
    ] {
        let (status, answer) = http(port, method, path.into(), reader.clone(), body).await;
        assert_eq!(status, want, "{method} {path}: {answer}");
        if want == 403 {
            assert_eq!(answer, "Permission denied");
        }
    }
    // The submitter may submit into `default`, not into a namespace its job body names.
    let (status, body) = http(port, "PUT", "/v1/jobs".into(), submitter.clone(), job("default")).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = http(port, "PUT", "/v1/jobs".into(), submitter.clone(), job("other")).await;
    assert_eq!(status, 403);
    // A job in another namespace (made first: a job goes only into one that exists) is not
    // listed to a token that may read only `default`.
    let (status, body) = http(
        port,
        "PUT",
        "/v1/namespace/other".into(),
        root.clone(),
        r#"{"Name":"other"}"#.into(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(port, "PUT", "/v1/jobs".into(), root.clone(), job("other")).await;
    assert_eq!(status, 200, "{body}");
    let namespaces = |body: String| -> Vec<String> {
        serde_json::from_str::<Vec<Value>>(&body)
            .unwrap()
            .iter()
            .map(|job| job["Namespace"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(namespaces(get("/v1/jobs", &reader).await.1), ["default"]);
    assert_eq!(get("/v1/jobs?namespace=other", &reader).await.0, 403);
    assert_eq!(namespaces(get("/v1/jobs?namespace=other", &root).await.1), ["other"]);
    // Every namespace: each token sees the jobs of the namespaces it may read, no more.
    assert_eq!(namespaces(get("/v1/jobs?namespace=*", &reader).await.1), ["default"]);
    // A token no namespace lets list jobs is refused outright, as Nomad's `AllowNsOp("*")`.
    assert_eq!(
        get("/v1/jobs?namespace=*", &submitter).await,
        (403, "Permission denied".into())
    );
    let mut all = namespaces(get("/v1/jobs?namespace=*", &root).await.1);
    all.sort();
    assert_eq!(all, ["default", "other"]);

    // Either header; an unknown token is named.
    let (status, _) = tokio::task::spawn_blocking({
        let reader = reader.clone();
        move || call(port, "GET", "/v1/jobs", &format!("Authorization: Bearer {reader}"), "")
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        get("/v1/jobs", "not-a-token").await,
        (403, "ACL token not found".into())
    );

    // Token self, and the policies a client token may see.
    let (status, body) = get("/v1/acl/token/self", &reader).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["Policies"],
        json!(["readonly"])
    );
    let (_, body) = get("/v1/acl/policies", &reader).await;
    let names: Vec<Value> = serde_json::from_str::<Vec<Value>>(&body)
        .unwrap()
        .into_iter()
        .map(|policy| policy["Name"].clone())
        .collect();
    assert_eq!(names, [json!("readonly")]);
    assert_eq!(get("/v1/acl/policy/submit", &reader).await.0, 403);

    // The anonymous policy opens what it names to requests without a token.
    assert_eq!(get("/v1/nodes", "").await.0, 403);
    assert_eq!(put_policy("anonymous", "node { policy = \"read\" }").await.0, 200);
    assert_eq!(get("/v1/nodes", "").await.0, 200);
    assert_eq!(get("/v1/jobs", "").await.0, 403);

    // A deleted token stops working at once; so does one past its expiry.
    let (status, _) = http(
        port,
        "DELETE",
        format!("/v1/acl/token/{reader_accessor}"),
        root.clone(),
        String::new(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(get("/v1/jobs", &reader).await, (403, "ACL token not found".into()));
    let with_ttl = |ttl: &str| {
        http(
            port,
            "PUT",
            "/v1/acl/token".into(),
            root.clone(),
            json!({"Type": "client", "Policies": ["readonly"], "ExpirationTTL": ttl}).to_string(),
        )
    };
    let secret = |body: String| {
        serde_json::from_str::<Value>(&body).unwrap()["SecretID"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        with_ttl("48h").await,
        (
            400,
            "expiration time cannot be more than 24h0m0s in the future (was 48h0m0s)".into()
        )
    );
    let lasting = secret(with_ttl("1h").await.1);
    assert_eq!(get("/v1/jobs", &lasting).await.0, 200);

    // Search shows only the contexts a token may read: the reader (namespace read, node
    // read) jobs and nodes but no plugins; a token that may read none of them is refused.
    let search = |token: &str, context: &str| {
        http(
            port,
            "POST",
            "/v1/search".into(),
            token.to_string(),
            json!({"Prefix": "", "Context": context}).to_string(),
        )
    };
    let (status, body) = search(&lasting, "all").await;
    assert_eq!(status, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    assert!(
        found["Matches"]["jobs"].is_array() && found["Matches"]["nodes"].is_array(),
        "{body}"
    );
    assert!(found["Matches"].get("plugins").is_none(), "{body}");
    assert_eq!(search(&lasting, "plugins").await.0, 403);
    let (status, body) = search(&root, "all").await;
    assert_eq!(status, 200, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["Matches"]["plugins"].is_array());
    let brief = secret(with_ttl("1ms").await.1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get("/v1/jobs", &brief).await, (403, "ACL token expired".into()));
    handle.shutdown().await;
}

/// Bootstraps `port`'s agent and returns the management secret.
async fn bootstrap(port: u16) -> String {
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap".into(), String::new(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    root["SecretID"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_give_tokens_their_policies_and_one_time_tokens_are_spent_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let port = server.http;
    let root = bootstrap(port).await;
    let call = |method: &'static str, path: &str, token: &str, body: Value| {
        http(
            port,
            method,
            path.into(),
            token.into(),
            if body.is_null() {
                String::new()
            } else {
                body.to_string()
            },
        )
    };
    let (status, body) = call(
        "PUT",
        "/v1/acl/policy/nodes-write",
        &root,
        json!({"Rules": "node { policy = \"write\" }"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A role needs existing policies and a unique name.
    let (status, body) = call(
        "POST",
        "/v1/acl/role",
        &root,
        json!({"Name": "ops", "Policies": [{"Name": "missing"}]}),
    )
    .await;
    assert_eq!((status, body.as_str()), (400, "cannot find policy missing"));
    let (status, body) = call("POST", "/v1/acl/role", &root, json!({"Name": "ops", "Policies": []})).await;
    assert_eq!(
        (status, body.as_str()),
        (400, "role 0 invalid: at least one policy should be specified")
    );
    let (status, body) = call(
        "POST",
        "/v1/acl/role",
        &root,
        json!({"Name": "ops", "Description": "operators", "Policies": [{"Name": "nodes-write"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let role: Value = serde_json::from_str(&body).unwrap();
    let role_id = role["ID"].as_str().unwrap().to_string();
    assert_eq!(role["Policies"], json!([{"Name": "nodes-write"}]));
    let (status, body) = call(
        "POST",
        "/v1/acl/role",
        &root,
        json!({"Name": "ops", "Policies": [{"Name": "nodes-write"}]}),
    )
    .await;
    assert_eq!((status, body.as_str()), (400, "role with name ops already exists"));

    // A token linked by the role's name holds the role's policies.
    let (status, body) = call(
        "PUT",
        "/v1/acl/token",
        &root,
        json!({"Name": "op", "Type": "client", "Roles": [{"Name": "ops"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let token: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(token["Roles"], json!([{"ID": role_id, "Name": "ops"}]));
    let secret = token["SecretID"].as_str().unwrap().to_string();
    assert_eq!(call("GET", "/v1/nodes", &secret, Value::Null).await.0, 200);
    assert_eq!(call("GET", "/v1/jobs", &secret, Value::Null).await.0, 403);
    // It reads its own role and the role's policy, by ID and by name, and lists only them.
    assert_eq!(
        call("GET", &format!("/v1/acl/role/{role_id}"), &secret, Value::Null)
            .await
            .0,
        200
    );
    assert_eq!(call("GET", "/v1/acl/role/name/ops", &secret, Value::Null).await.0, 200);
    assert_eq!(
        call("GET", "/v1/acl/policy/nodes-write", &secret, Value::Null).await.0,
        200
    );
    let (status, body) = call(
        "POST",
        "/v1/acl/role",
        &root,
        json!({"Name": "other", "Policies": [{"Name": "nodes-write"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, listed) = call("GET", "/v1/acl/roles", &secret, Value::Null).await;
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.len(), 1, "only the linked role: {listed:?}");
    let (_, all) = call("GET", "/v1/acl/roles", &root, Value::Null).await;
    assert_eq!(serde_json::from_str::<Vec<Value>>(&all).unwrap().len(), 2);
    assert_eq!(
        call("GET", "/v1/acl/role/name/other", &secret, Value::Null).await.0,
        403
    );
    assert_eq!(call("POST", "/v1/acl/role", &secret, json!({"Name": "x"})).await.0, 403);

    // Renaming keeps the link; deleting the role takes its policies from the token at once.
    let (status, body) = call(
        "POST",
        &format!("/v1/acl/role/{role_id}"),
        &root,
        json!({"Name": "operators", "Policies": [{"Name": "nodes-write"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = call("GET", "/v1/acl/token/self", &secret, Value::Null).await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["Roles"][0]["Name"],
        "operators"
    );
    assert_eq!(
        call("DELETE", &format!("/v1/acl/role/{role_id}"), &root, Value::Null)
            .await
            .0,
        200
    );
    assert_eq!(call("GET", "/v1/nodes", &secret, Value::Null).await.0, 403);

    // The token list filters by accessor prefix and by globality.
    let accessor = token["AccessorID"].as_str().unwrap().to_string();
    let (_, listed) = call(
        "GET",
        &format!("/v1/acl/tokens?prefix={}", &accessor[..8]),
        &root,
        Value::Null,
    )
    .await;
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["AccessorID"], accessor.as_str());
    let (_, global) = call("GET", "/v1/acl/tokens?global=true", &root, Value::Null).await;
    let global: Vec<Value> = serde_json::from_str(&global).unwrap();
    assert_eq!(global.len(), 1, "only the bootstrap token is global: {global:?}");
    assert_eq!(global[0]["Name"], "Bootstrap Token");
    assert_eq!(
        call("GET", "/v1/acl/tokens?global=maybe", &root, Value::Null).await.0,
        400
    );

    // One-time tokens: made for the caller's own token, exchanged once, without a token.
    assert_eq!(call("POST", "/v1/acl/token/onetime", "", Value::Null).await.0, 403);
    let (status, body) = call("POST", "/v1/acl/token/onetime", &root, Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let ott: Value = serde_json::from_str(&body).unwrap();
    let one_time = ott["OneTimeToken"]["OneTimeSecretID"].as_str().unwrap().to_string();
    assert_ne!(one_time, root);
    let exchange = json!({ "OneTimeSecretID": one_time });
    let (status, body) = call("POST", "/v1/acl/token/onetime/exchange", "", exchange.clone()).await;
    assert_eq!(status, 200, "{body}");
    let exchanged: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(exchanged["Token"]["SecretID"], root);
    let (status, body) = call("POST", "/v1/acl/token/onetime/exchange", "", exchange).await;
    assert_eq!((status, body.as_str()), (403, "Permission denied"), "spent");
    drop(server);
}

/// Issue 54 §2: with ACLs on and no TLS, whoever reaches the RPC port is a caller like any
/// other. A forwarded direct write that mints a management token, a variable read with no
/// node, garbage collection: each refused without a token, and served with the management
/// token that proves the right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tls_every_rpc_is_held_to_its_token() {
    use drover_core::acl::{AclToken, TokenType};
    use drover_core::error::ErrorKind;
    use drover_core::fsm::acl::AclCommand;
    use drover_core::fsm::{Command, Entry};
    use drover_core::rpc::{ServerReply, ServerRequest};
    use drover_host::net::GrpcTransport;
    use drover_io_real::io::Transport;
    use drover_io_real::service::{envelope, server_envelope, server_reply};
    use drover_proto::agent::v1::ApplyRequest;
    use drover_proto::agent::v1::agent_request::Body;
    use drover_proto::agent::v1::agent_response::Body as Answer;

    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let to: std::net::SocketAddr = format!("127.0.0.1:{}", server.rpc).parse().unwrap();
    let (status, body) = http(
        server.http,
        "POST",
        "/v1/acl/bootstrap".into(),
        String::new(),
        String::new(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    let root = root["SecretID"].as_str().unwrap().to_string();
    let (status, body) = http(
        server.http,
        "PUT",
        "/v1/var/nomad/jobs/db".into(),
        root.clone(),
        json!({"Items": {"password": "hunter2-77c1"}}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let transport = GrpcTransport::default();
    let minted = |secret: &str| AclToken {
        accessor_id: format!("accessor-{secret}"),
        secret_id: secret.into(),
        name: "minted".into(),
        token_type: TokenType::Management,
        policies: Vec::new(),
        roles: Vec::new(),
        global: true,
        create_time_ms: 0,
        expiration_time_ms: None,
        create_index: 0,
        modify_index: 0,
    };
    let apply = |token: &str, secret: &str| {
        let entry = Entry {
            at_unix_ms: 0,
            command: Command::Acl(AclCommand::TokensUpsert {
                tokens: vec![minted(secret)],
            }),
        };
        let mut request = envelope(
            "global",
            Body::Apply(ApplyRequest {
                command_json: serde_json::to_vec(&entry).unwrap(),
            }),
        );
        request.forwarded = true;
        request.auth_token = token.into();
        request
    };
    let answer = transport
        .call(to, apply("", "attacker-secret"), Duration::from_secs(10))
        .await
        .unwrap();
    match answer.body {
        Some(Answer::Error(error)) => assert_eq!(error.message, "Permission denied", "{error:?}"),
        other => panic!("a token minted with no token: {other:?}"),
    }
    let get = |token: String| http(server.http, "GET", "/v1/jobs".into(), token, String::new());
    assert_eq!(get("attacker-secret".into()).await.0, 403);

    let read = ServerRequest::VariablesRead {
        paths: vec!["nomad/jobs/db".into()],
        node_id: String::new(),
        secret_id: String::new(),
    };
    for request in [read.clone(), ServerRequest::SystemGc] {
        let reply = server_reply(
            transport
                .call(
                    to,
                    server_envelope("global", &request, "", false),
                    Duration::from_secs(10),
                )
                .await
                .unwrap(),
        );
        assert!(
            matches!(&reply, ServerReply::Error(error) if error.kind == ErrorKind::PermissionDenied),
            "{request:?} with no token: {reply:?}"
        );
        assert!(!format!("{reply:?}").contains("hunter2"), "{reply:?}");
    }

    // The management token proves the right: the same write and read are served.
    let answer = transport
        .call(to, apply(&root, "operator-made"), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(matches!(answer.body, Some(Answer::Apply(_))), "{answer:?}");
    assert_eq!(get("operator-made".into()).await.0, 200);
    let reply = server_reply(
        transport
            .call(
                to,
                server_envelope("global", &read, &root, false),
                Duration::from_secs(10),
            )
            .await
            .unwrap(),
    );
    match reply {
        ServerReply::Variables { variables, .. } => assert!(variables.contains_key("nomad/jobs/db"), "{variables:?}"),
        other => panic!("the management token reads the variable: {other:?}"),
    }
}

/// The status of a request whose answer may never end (a stream): its first line only.
fn status_of_stream(port: u16, path: &str, token: &str) -> u16 {
    let header = if token.is_empty() {
        String::new()
    } else {
        format!("X-Nomad-Token: {token}")
    };
    let stream = send(port, "GET", path, &header, "");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut line).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Bootstraps ACLs on the agent at `port` and makes a client token that may read the default
/// namespace: the management and the reader secrets.
async fn root_and_default_reader(port: u16) -> (String, String) {
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap".into(), String::new(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    let root = root["SecretID"].as_str().unwrap().to_string();
    let policy = json!({"Rules": "namespace \"default\" { policy = \"read\" }"}).to_string();
    let (status, body) = http(port, "PUT", "/v1/acl/policy/jobs".into(), root.clone(), policy).await;
    assert_eq!(status, 200, "{body}");
    let token = json!({"Name": "t", "Type": "client", "Policies": ["jobs"]}).to_string();
    let (status, body) = http(port, "PUT", "/v1/acl/token".into(), root.clone(), token).await;
    assert_eq!(status, 200, "{body}");
    let reader: Value = serde_json::from_str(&body).unwrap();
    let reader = reader["SecretID"].as_str().unwrap().to_string();
    (root, reader)
}

/// Issue 54 §9: Nomad refuses a subscription to the event stream whose token may not read
/// every topic it names (403); every topic at once, what a subscription naming none asks for,
/// is a management token's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_is_refused_a_topic_its_token_may_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let port = server.http;
    let (root, reader) = root_and_default_reader(port).await;
    let cases = [
        ("/v1/event/stream", "", 403),
        ("/v1/event/stream?topic=Job:*", "", 403),
        ("/v1/event/stream", reader.as_str(), 403),
        ("/v1/event/stream?topic=Node:*", reader.as_str(), 403),
        ("/v1/event/stream?topic=Job:*&namespace=other", reader.as_str(), 403),
        ("/v1/event/stream?topic=Job:*&topic=Allocation:*", reader.as_str(), 200),
        ("/v1/event/stream", root.as_str(), 200),
    ];
    for (path, token, want) in cases {
        let status = tokio::task::spawn_blocking({
            let (path, token) = (path.to_string(), token.to_string());
            move || status_of_stream(port, &path, &token)
        })
        .await
        .unwrap();
        assert_eq!(status, want, "{path} with {token:?}");
    }
}

/// `/v1/metrics` answers anonymous callers, as Nomad's does, but with ACLs on a series
/// labelled with a namespace (a job's summary gauges, name and group included) is shown only
/// to a token that may read jobs there (issue 54 §9: job names reached anonymous callers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_a_job_only_to_a_token_that_may_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let port = server.http;
    let (root, reader) = root_and_default_reader(port).await;
    // A node a job is placed on (fingerprinted, never running anything): the job's summary
    // gauges count allocations.
    let node = drover_core::structs::Node {
        id: "n1".into(),
        name: "n1".into(),
        datacenter: "dc1".into(),
        status: drover_core::structs::NodeStatus::Ready,
        drivers: [(
            "raw_exec".to_string(),
            drover_core::structs::DriverInfo {
                detected: true,
                healthy: true,
                ..Default::default()
            },
        )]
        .into(),
        resources: drover_core::structs::NodeResources {
            cpu: 4000,
            memory_mb: 4096,
            ..Default::default()
        },
        ..Default::default()
    };
    let registered = server
        .handle
        .request(drover_core::rpc::ServerRequest::NodeRegister { node: Box::new(node) })
        .await;
    assert!(
        !matches!(registered, drover_core::rpc::ServerReply::Error(_)),
        "{registered:?}"
    );
    let (status, body) = http(port, "PUT", "/v1/jobs".into(), root.clone(), job_of_one("default")).await;
    assert_eq!(status, 200, "{body}");
    let placed = tokio::time::Instant::now() + Duration::from_secs(30);
    while server.handle.state_version().unwrap().state.allocs().count() == 0 {
        assert!(tokio::time::Instant::now() < placed, "the job was never placed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The gauges that name the job `web`, and how many series there are in all.
    let web_series = |token: String| async move {
        let (status, body) = http(port, "GET", "/v1/metrics".into(), token, String::new()).await;
        assert_eq!(status, 200, "{body}");
        let metrics: Value = serde_json::from_str(&body).unwrap();
        let gauges = metrics["Gauges"].as_array().unwrap();
        let web = gauges.iter().filter(|gauge| gauge["Labels"]["job"] == "web").count();
        (web, gauges.len())
    };
    let (anonymous, anonymous_all) = web_series(String::new()).await;
    let (read, read_all) = web_series(reader).await;
    let (management, _) = web_series(root).await;
    assert_eq!(anonymous, 0, "an anonymous caller sees no series of the job");
    assert!(anonymous_all > 0, "but the agent's own series");
    assert!(read > 0 && read == management, "{read} of {management}");
    assert!(read_all > anonymous_all);
    let (status, _) = http(port, "GET", "/v1/metrics".into(), "no-such-token".into(), String::new()).await;
    assert_eq!(status, 403, "an unknown token is refused, not taken for anonymous");
}
