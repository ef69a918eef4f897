//! The CSI control plane through real sockets: an agent (server + client) whose ClientCSI calls
//! go over tonic to its own recording fake plugin, driven through the HTTP API and the
//! endpoints a client uses.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::config::Ports;
use drover_core::rpc::{ClientCsiReply, ClientCsiRequest, ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClaimMode, ClaimState, ClientStatus, CsiControllerInfo, CsiExternalVolume,
    CsiInfo, CsiNodeInfo, CsiSnapshot, CsiVolumeClaim, Node, NodeStatus,
};
use drover_host::net::GrpcTransport;
use drover_io_real::driver::{AgentHandle, AgentParts, start_agent};
use drover_io_real::io::{BoxFuture, ClientCsi, NoConsul, TracingObserver};

struct FakePlugins {
    calls: Mutex<Vec<String>>,
    /// Node detaches wait until this turns true (so a test can look at a release in flight:
    /// the volume watcher starts one as soon as a claiming allocation turns terminal).
    node_detach_open: tokio::sync::watch::Sender<bool>,
}

impl Default for FakePlugins {
    fn default() -> Self {
        FakePlugins {
            calls: Mutex::default(),
            node_detach_open: tokio::sync::watch::channel(true).0,
        }
    }
}

impl ClientCsi for FakePlugins {
    fn call(&self, request: ClientCsiRequest) -> BoxFuture<Result<ClientCsiReply, drover_core::error::CsiCallError>> {
        let (name, reply) = match &request {
            ClientCsiRequest::ControllerValidate(r) => (format!("validate {}", r.volume_id), ClientCsiReply::Done),
            ClientCsiRequest::ControllerAttach(r) => (
                format!("controller-publish {} on {}", r.volume_id, r.client_csi_node_id),
                ClientCsiReply::Attached {
                    publish_context: [("device".into(), "/dev/fake0".into())].into(),
                },
            ),
            ClientCsiRequest::ControllerDetach(r) => {
                (format!("controller-unpublish {}", r.volume_id), ClientCsiReply::Done)
            }
            ClientCsiRequest::NodeDetach(r) => (
                format!("node-unpublish {} alloc {}", r.volume_id, r.alloc_id),
                ClientCsiReply::Done,
            ),
            ClientCsiRequest::ControllerCreate(r) => (
                format!("controller-create {}", r.name),
                ClientCsiReply::Created {
                    external_id: format!("ext-{}", r.name),
                    capacity: r.capacity_min,
                    context: [("made-by".into(), "fake".into())].into(),
                    topologies: Vec::new(),
                },
            ),
            ClientCsiRequest::ControllerDelete(r) => {
                (format!("controller-delete {}", r.external_id), ClientCsiReply::Done)
            }
            ClientCsiRequest::ControllerCreateSnapshot(r) => (
                format!("controller-create-snapshot {} {}", r.source_external_id, r.name),
                ClientCsiReply::Snapshot(CsiSnapshot {
                    id: format!("snap-{}", r.name),
                    external_source_volume_id: r.source_external_id.clone(),
                    size_bytes: 1 << 30,
                    create_time: 1_700_000_000,
                    is_ready: true,
                    ..CsiSnapshot::default()
                }),
            ),
            ClientCsiRequest::ControllerDeleteSnapshot(r) => (
                format!("controller-delete-snapshot {}", r.snapshot_id),
                ClientCsiReply::Done,
            ),
            // Two snapshots a page, whatever was asked: the server cuts to `per_page`.
            ClientCsiRequest::ControllerListSnapshots(r) => (
                format!("controller-list-snapshots from {:?}", r.page.next_token),
                ClientCsiReply::Snapshots {
                    snapshots: vec![CsiSnapshot::default(), CsiSnapshot::default()],
                    next_token: "t2".into(),
                },
            ),
            ClientCsiRequest::ControllerListVolumes(_) => (
                "controller-list-volumes".into(),
                ClientCsiReply::Volumes {
                    volumes: vec![CsiExternalVolume {
                        external_id: "ext-vol0".into(),
                        capacity_bytes: 1 << 30,
                        published_external_node_ids: vec!["host-1".into()],
                        ..CsiExternalVolume::default()
                    }],
                    next_token: String::new(),
                },
            ),
            other => (
                format!("unanswered {other:?}"),
                ClientCsiReply::Expanded {
                    capacity: 0,
                    node_expansion_required: false,
                },
            ),
        };
        self.calls.lock().unwrap().push(name);
        let mut open = self.node_detach_open.subscribe();
        let gated = matches!(request, ClientCsiRequest::NodeDetach(_));
        Box::pin(async move {
            if gated {
                let _ = open.wait_for(|open| *open).await;
            }
            Ok(reply)
        })
    }
}

fn http(method: &str, port: u16, path: &str, body: &str) -> (u16, String) {
    drover_testkit::http_status(method, port, path, Some(body)).expect("the agent answers over HTTP")
}

async fn call(method: &'static str, port: u16, path: String, body: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || http(method, port, &path, &body))
        .await
        .unwrap()
}

async fn start() -> (AgentHandle, u16, Arc<FakePlugins>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let [http, rpc, serf] = drover_testkit::free_ports::<3>();
    let ports = Ports { http, rpc, serf };
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut config = drover_core::testkit::lone_server_config("dev", &dir.path().display().to_string(), ports);
    config.dev_mode = true;
    config.client.enabled = true;
    let plugins = Arc::new(FakePlugins::default());
    let db = drover_host::disk::open_database(dir.path()).unwrap();
    let handle = start_agent(AgentParts {
        config,
        db,
        transport: GrpcTransport::default(),
        consul: NoConsul,
        observer: Arc::new(TracingObserver),
        client_csi: Some(plugins.clone()),
        disk_latency: None,
        keystore: None,
    })
    .await
    .unwrap();
    // Port 0: the API's own port is the one the OS binds, nothing can take it in between.
    let http = drover_http::serve(handle.clone(), SocketAddr::new(ip, 0), Default::default())
        .await
        .unwrap()
        .port();
    // Raft naming a leader is not enough: the endpoints serve once the leadership barrier
    // is applied (before, "No cluster leader").
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let probe = ServerRequest::VariablesRead {
            paths: Vec::new(),
            node_id: String::new(),
            secret_id: String::new(),
        };
        match handle.request(probe).await {
            ServerReply::Error(error) if error.retryable => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never served: {}",
                    error.message
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            _ => break,
        }
    }
    (handle, http, plugins, dir)
}

fn info(node_half: bool) -> CsiInfo {
    CsiInfo {
        plugin_id: "hostpath".into(),
        alloc_id: "plugin-alloc".into(),
        healthy: true,
        health_description: "healthy".into(),
        provider: "hostpath.csi.k8s.io".into(),
        provider_version: "1.9.0".into(),
        requires_controller_plugin: true,
        controller_info: (!node_half).then(|| CsiControllerInfo {
            supports_attach_detach: true,
            supports_create_delete_snapshot: true,
            supports_list_snapshots: true,
            supports_list_volumes: true,
            ..Default::default()
        }),
        node_info: node_half.then(|| CsiNodeInfo {
            id: "host-1".into(),
            max_volumes: 64,
            ..Default::default()
        }),
        ..CsiInfo::default()
    }
}

async fn ok(handle: &AgentHandle, request: ServerRequest) -> ServerReply {
    let reply = handle.request(request).await;
    assert!(!matches!(reply, ServerReply::Error(_)), "{reply:?}");
    reply
}

fn claim(state: ClaimState) -> CsiVolumeClaim {
    CsiVolumeClaim {
        allocation_id: "a1".into(),
        node_id: "n1".into(),
        external_node_id: String::new(),
        mode: ClaimMode::Write,
        access_mode: AccessMode::SingleNodeWriter,
        attachment_mode: AttachmentMode::FileSystem,
        state,
    }
}

/// Registers node `n1`, at this agent's own RPC address, fingerprinting both halves of the
/// `hostpath` plugin.
async fn register_plugin_node(handle: &AgentHandle) {
    let rpc_addr = format!("127.0.0.1:{}", handle.config().ports.rpc);
    ok(
        handle,
        ServerRequest::NodeRegister {
            node: Box::new(Node {
                id: "n1".into(),
                name: "client-1".into(),
                rpc_addr,
                status: NodeStatus::Ready,
                csi_controller_plugins: [("hostpath".to_string(), info(false))].into(),
                csi_node_plugins: [("hostpath".to_string(), info(true))].into(),
                ..Node::default()
            }),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_claim_release_and_deregister_through_real_sockets() {
    let (handle, port, plugins, _dir) = start().await;
    register_plugin_node(&handle).await;

    let (status, body) = call("GET", port, "/v1/plugins?type=csi".into(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""ControllersHealthy":1"#) && body.contains(r#""NodesHealthy":1"#),
        "{body}"
    );
    let (_, body) = call("GET", port, "/v1/plugins".into(), String::new()).await;
    assert_eq!(body, "[]", "no type means an empty list, as Nomad");

    let volume = r#"{"Volumes":[{"ID":"vol0","Name":"vol0","ExternalID":"ext-vol0","PluginID":"hostpath",
        "RequestedCapabilities":[{"AccessMode":"single-node-writer","AttachmentMode":"file-system"}],
        "MountOptions":{"FSType":"ext4","MountFlags":["noatime"]},"Secrets":{"password":"hunter2"}}]}"#;
    let (status, body) = call("PUT", port, "/v1/volume/csi/vol0".into(), volume.into()).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("hunter2"), "secrets never appear: {body}");

    for (query, listed) in [
        ("type=csi", true),
        ("type=csi&plugin_id=hostpath", true),
        ("type=csi&plugin_id=other", false),
        ("type=csi&prefix=vol", true),
        ("type=csi&prefix=x", false),
    ] {
        let (status, body) = call("GET", port, format!("/v1/volumes?{query}"), String::new()).await;
        assert_eq!(
            (status, body.contains(r#""ID":"vol0""#)),
            (200, listed),
            "{query}: {body}"
        );
    }
    let (status, body) = call("GET", port, "/v1/volume/csi/vol0".into(), String::new()).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(json.get("Secrets").is_none() && !body.contains("hunter2"), "{body}");
    assert_eq!(json["MountOptions"]["MountFlags"], serde_json::json!(["[REDACTED]"]));
    assert_eq!(json["Schedulable"], true);

    ok(
        &handle,
        ServerRequest::AllocUpsert {
            allocs: vec![Allocation {
                id: "a1".into(),
                namespace: "default".into(),
                node_id: "n1".into(),
                ..Default::default()
            }],
        },
    )
    .await;
    let claimed = ok(
        &handle,
        ServerRequest::VolumeClaim {
            secret_id: String::new(),
            namespace: "default".into(),
            volume_id: "vol0".into(),
            claim: claim(ClaimState::Taken),
        },
    )
    .await;
    let ServerReply::Claimed { publish_context, .. } = claimed else {
        panic!("{claimed:?}")
    };
    assert_eq!(publish_context["device"], "/dev/fake0");

    let (status, body) = call("DELETE", port, "/v1/volume/csi/vol0".into(), String::new()).await;
    assert_eq!((status, body.as_str()), (500, "rpc error: volume in use: vol0"));

    // Hold node detaches: the watcher releases the claim as soon as the alloc is terminal.
    plugins.node_detach_open.send_replace(false);
    ok(
        &handle,
        ServerRequest::AllocClientUpdate {
            alloc_id: "a1".into(),
            client_status: ClientStatus::Complete,
        },
    )
    .await;
    let (_, body) = call("GET", port, "/v1/volume/csi/vol0".into(), String::new()).await;
    assert!(
        body.contains(r#""State":4"#),
        "a terminal alloc reads as a past claim in state Unpublishing: {body}"
    );
    plugins.node_detach_open.send_replace(true);
    // The client's own unpublish joins (or follows) the release the watcher started.
    ok(
        &handle,
        ServerRequest::VolumeUnpublish {
            secret_id: String::new(),
            namespace: "default".into(),
            volume_id: "vol0".into(),
            claim: claim(ClaimState::Unpublishing),
        },
    )
    .await;
    assert_eq!(
        *plugins.calls.lock().unwrap(),
        [
            "validate ext-vol0",
            "controller-publish ext-vol0 on host-1",
            "node-unpublish vol0 alloc a1",
            "controller-unpublish ext-vol0",
        ]
    );
    let (status, _) = call("DELETE", port, "/v1/volume/csi/vol0".into(), String::new()).await;
    assert_eq!(status, 200);
    let (status, body) = call("GET", port, "/v1/volume/csi/vol0".into(), String::new()).await;
    assert_eq!((status, body.as_str()), (404, "volume not found"));
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_validated_and_reads_block_until_the_table_changes() {
    let (handle, port, _plugins, _dir) = start().await;
    for (path, reason) in [
        ("/v1/volume/csi/a%2Fb", "must not contain path separators"),
        ("/v1/volume/csi/..x", "must not contain \\\"..\\\""),
        ("/v1/volume/csi/a%07b", "must not contain control characters"),
        ("/v1/plugin/csi/a%5Cb", "must not contain path separators"),
    ] {
        let (status, body) = call("GET", port, path.into(), String::new()).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body.contains(reason.trim_matches('\\')) || body.contains("\"..\""),
            "{path}: {body}"
        );
    }
    let long = "x".repeat(129);
    let (status, body) = call("GET", port, format!("/v1/volume/csi/{long}"), String::new()).await;
    assert_eq!((status, body.contains("at most 128 bytes")), (400, true));
    let (status, body) = call("PUT", port, "/v1/volume/csi/v".into(), "{\"Volumes\":[]}".into()).await;
    assert_eq!(status, 400, "{body}");

    // A blocking query on the nodes table returns when a node registers.
    let (_, _) = call("GET", port, "/v1/nodes".into(), String::new()).await;
    let index = handle.read_state(|state| state.last_applied().unwrap_or(0)).unwrap();
    let waiter = tokio::spawn(call(
        "GET",
        port,
        format!("/v1/nodes?index={index}&wait=30s"),
        String::new(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "blocked");
    ok(
        &handle,
        ServerRequest::NodeRegister {
            node: Box::new(Node {
                id: "n9".into(),
                name: "late".into(),
                status: NodeStatus::Ready,
                ..Node::default()
            }),
        },
    )
    .await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"n9\""), "{body}");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_the_plugins_own_listing_in_nomads_shapes() {
    let (handle, port, plugins, _dir) = start().await;
    register_plugin_node(&handle).await;
    let volume = r#"{"Volumes":[{"ID":"vol0","Name":"vol0","ExternalID":"ext-vol0","PluginID":"hostpath",
        "RequestedCapabilities":[{"AccessMode":"single-node-writer","AttachmentMode":"file-system"}],
        "Secrets":{"password":"hunter2"}}]}"#;
    let (status, body) = call("PUT", port, "/v1/volume/csi/vol0".into(), volume.into()).await;
    assert_eq!(status, 200, "{body}");
    let json = |body: &str| serde_json::from_str::<serde_json::Value>(body).unwrap();

    let (status, body) = call("GET", port, "/v1/volumes/snapshot".into(), String::new()).await;
    assert_eq!((status, body.trim()), (400, "missing plugin_id"));
    let create = r#"{"Snapshots":[{"SourceVolumeID":"vol0","Name":"nightly","Secrets":{"extra":"s3cr3t"}}]}"#;
    let (status, body) = call("PUT", port, "/v1/volumes/snapshot".into(), create.into()).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("s3cr3t") && !body.contains("hunter2"), "{body}");
    let made = &json(&body)["Snapshots"][0];
    assert_eq!(made["ID"], "snap-nightly", "{body}");
    assert_eq!(made["ExternalSourceVolumeID"], "ext-vol0");
    assert_eq!(made["PluginID"], "hostpath");
    assert_eq!(
        (made["CreateTime"].as_i64(), made["IsReady"].as_bool()),
        (Some(1_700_000_000), Some(true))
    );
    let missing = r#"{"Snapshots":[{"SourceVolumeID":"nope","Name":"x"}]}"#;
    let (status, body) = call("PUT", port, "/v1/volumes/snapshot".into(), missing.into()).await;
    assert_eq!((status, body.trim()), (400, "no such volume \"nope\""));

    let path = "/v1/volumes/snapshot?plugin_id=hostpath&per_page=1&next_token=t1";
    let (status, body) = call("GET", port, path.into(), String::new()).await;
    assert_eq!(status, 200, "{body}");
    let page = json(&body);
    assert_eq!(
        page["Snapshots"].as_array().map(Vec::len),
        Some(1),
        "cut to per_page: {body}"
    );
    assert_eq!(page["NextToken"], "t2");
    let path = "/v1/volumes/snapshot?plugin_id=hostpath&snapshot_id=snap-nightly";
    let (status, body) = call("DELETE", port, path.into(), String::new()).await;
    assert_eq!(status, 200, "{body}");

    let (status, body) = call(
        "GET",
        port,
        "/v1/volumes/external?plugin_id=hostpath".into(),
        String::new(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let listed = &json(&body)["Volumes"][0];
    assert_eq!(listed["ExternalID"], "ext-vol0", "{body}");
    assert_eq!(listed["CapacityBytes"], 1u64 << 30);
    assert_eq!(listed["PublishedExternalNodeIDs"][0], "host-1");
    assert_eq!(listed["IsAbnormal"], false);
    let (status, body) = call(
        "GET",
        port,
        "/v1/volumes/external?plugin_id=other".into(),
        String::new(),
    )
    .await;
    assert_eq!((status, body.trim()), (404, "no such plugin"));

    let calls = plugins.calls.lock().unwrap().clone();
    assert!(
        calls.contains(&"controller-create-snapshot ext-vol0 nightly".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"controller-list-snapshots from \"t1\"".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"controller-delete-snapshot snap-nightly".to_string()),
        "{calls:?}"
    );
    handle.shutdown().await;
}

fn keys(value: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    names.sort();
    names
}

/// The CSI family, table-driven: the volume and plugin stubs, the plugin and the CSI info a
/// node fingerprints answer exactly Nomad's field names (`CSIVolListStub`, `CSIVolume`,
/// `CSIPluginListStub`, `CSIPlugin`, `CSIInfo`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_csi_family_answers_nomads_field_names() {
    let (handle, port, _plugins, _dir) = start().await;
    register_plugin_node(&handle).await;
    let volume = r#"{"Volumes":[{"ID":"vol0","Name":"vol0","ExternalID":"ext-vol0","PluginID":"hostpath",
        "RequestedCapabilities":[{"AccessMode":"single-node-writer","AttachmentMode":"file-system"}]}]}"#;
    let (status, body) = call("PUT", port, "/v1/volume/csi/vol0".into(), volume.into()).await;
    assert_eq!(status, 200, "{body}");
    let get = |path: &'static str| async move {
        let (status, body) = call("GET", port, path.into(), String::new()).await;
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let plugin = get("/v1/plugin/csi/hostpath").await;
    let volume = get("/v1/volume/csi/vol0").await;
    let table = [
        (
            "CSIVolListStub",
            get("/v1/volumes?type=csi").await[0].clone(),
            sorted(&[
                "ID",
                "Namespace",
                "Name",
                "ExternalID",
                "Topologies",
                "AccessMode",
                "AttachmentMode",
                "CurrentReaders",
                "CurrentWriters",
                "Schedulable",
                "PluginID",
                "Provider",
                "ControllerRequired",
                "ControllersHealthy",
                "ControllersExpected",
                "NodesHealthy",
                "NodesExpected",
                "ResourceExhausted",
                "CreateIndex",
                "ModifyIndex",
                "CreateTime",
                "ModifyTime",
            ]),
        ),
        (
            // Nomad's volume, its claim maps included (they are shown when a volume has
            // claims, and empty here).
            "CSIVolume",
            volume.clone(),
            sorted(&[
                "ID",
                "Name",
                "ExternalID",
                "Namespace",
                "RequestedTopologies",
                "Topologies",
                "AccessMode",
                "AttachmentMode",
                "MountOptions",
                "Parameters",
                "Context",
                "Capacity",
                "RequestedCapacityMin",
                "RequestedCapacityMax",
                "RequestedCapabilities",
                "CloneID",
                "SnapshotID",
                "ReadAllocs",
                "WriteAllocs",
                "ReadClaims",
                "WriteClaims",
                "PastClaims",
                "Allocations",
                "Schedulable",
                "PluginID",
                "Provider",
                "ProviderVersion",
                "ControllerRequired",
                "ControllersHealthy",
                "ControllersExpected",
                "NodesHealthy",
                "NodesExpected",
                "ResourceExhausted",
                "CreateIndex",
                "ModifyIndex",
                "CreateTime",
                "ModifyTime",
            ]),
        ),
        (
            "CSIPluginListStub",
            get("/v1/plugins?type=csi").await[0].clone(),
            sorted(&[
                "ID",
                "Provider",
                "ControllerRequired",
                "ControllersHealthy",
                "ControllersExpected",
                "NodesHealthy",
                "NodesExpected",
                "CreateIndex",
                "ModifyIndex",
            ]),
        ),
        (
            "CSIPlugin",
            plugin.clone(),
            sorted(&[
                "ID",
                "Provider",
                "Version",
                "ControllerRequired",
                "Controllers",
                "Nodes",
                "Allocations",
                "ControllersHealthy",
                "ControllersExpected",
                "NodesHealthy",
                "NodesExpected",
                "CreateIndex",
                "ModifyIndex",
                "CreateTime",
                "ModifyTime",
            ]),
        ),
        (
            "CSIInfo (node)",
            plugin["Nodes"]["n1"].clone(),
            sorted(&[
                "PluginID",
                "AllocID",
                "Healthy",
                "HealthDescription",
                "UpdateTime",
                "Provider",
                "ProviderVersion",
                "RequiresControllerPlugin",
                "RequiresTopologies",
                "NodeInfo",
            ]),
        ),
        (
            "CSIInfo (controller)",
            plugin["Controllers"]["n1"].clone(),
            sorted(&[
                "PluginID",
                "AllocID",
                "Healthy",
                "HealthDescription",
                "UpdateTime",
                "Provider",
                "ProviderVersion",
                "RequiresControllerPlugin",
                "RequiresTopologies",
                "ControllerInfo",
            ]),
        ),
    ];
    for (shape, value, expected) in table {
        assert_eq!(keys(&value), expected, "{shape}: {value}");
    }
    assert_eq!(volume["ResourceExhausted"], "0001-01-01T00:00:00Z", "Go's zero time");
    handle.shutdown().await;
}
