//! The client for real, as root: an agent (server + client) runs the project's fake CSI plugin
//! as a `raw_exec` monolith plugin task; an `exec` task writes to a volume the plugin stages and
//! publishes; after it stops, the bind mounts are gone and the claim is released; a second
//! `exec` task reads the file back from the same volume.

use crate::support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use drover_core::config::{Advertise, AgentConfig, Ports};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_core::structs::{
    AccessMode, Allocation, AttachmentMode, ClientStatus, ConfigValue, CsiCapability, CsiPluginType, CsiVolume,
    DesiredStatus, Job, JobType, Task, TaskCsiPluginConfig, TaskGroup, VolumeMount, VolumeRequest, VolumeType,
};
use drover_host::net::GrpcTransport;
use drover_host::{HostExecutor, client_identity};
use drover_io_real::client::{ClientCsiRouter, ClientParts, start_client};
use drover_io_real::devices::{DeviceManager, FakeDevicePlugin};
use drover_io_real::driver::{AgentHandle, AgentParts, start_agent};
use drover_io_real::io::{NoConsul, TracingObserver};

const PLUGIN: &str = env!("CARGO_BIN_EXE_drover-csi-fake");

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    })
    .await
    .unwrap()
}

fn strings(items: &[&str]) -> ConfigValue {
    ConfigValue::List(items.iter().map(|item| ConfigValue::String(item.to_string())).collect())
}

fn task(name: &str, driver: &str, command: &str, args: &[&str]) -> Task {
    Task {
        name: name.into(),
        driver: driver.into(),
        config: BTreeMap::from([
            ("command".to_string(), ConfigValue::String(command.into())),
            ("args".to_string(), strings(args)),
        ]),
        kill_timeout: Duration::from_secs(2),
        ..Task::default()
    }
}

fn job(id: &str, job_type: JobType, group: TaskGroup) -> Job {
    Job {
        id: id.into(),
        namespace: "default".into(),
        job_type,
        task_groups: vec![group],
        ..Job::default()
    }
}

fn alloc(id: &str, job: &Job, node: &str) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: "default".into(),
        name: format!("{}.{}[0]", job.id, job.task_groups[0].name),
        node_id: node.into(),
        job_id: job.id.clone(),
        task_group: job.task_groups[0].name.clone(),
        ..Allocation::default()
    }
}

fn consumer(id: &str, script: &str) -> Job {
    let mut group = TaskGroup {
        name: "web".into(),
        count: 1,
        ..TaskGroup::default()
    };
    group.volumes.insert(
        "data".into(),
        VolumeRequest {
            name: "data".into(),
            volume_type: VolumeType::Csi,
            source: "vol0".into(),
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            ..VolumeRequest::default()
        },
    );
    let mut web = task("web", "exec", "/bin/sh", &["-c", script]);
    web.volume_mounts.push(VolumeMount {
        volume: "data".into(),
        destination: "/data".into(),
        ..VolumeMount::default()
    });
    group.tasks.push(web);
    job(id, JobType::Batch, group)
}

async fn ok(handle: &AgentHandle, request: ServerRequest) {
    if let ServerReply::Error(error) = handle.request(request.clone()).await {
        panic!("{request:?}: {}", error.message);
    }
}

async fn until<T>(what: &str, handle: &AgentHandle, check: impl Fn(&drover_core::fsm::ServerState) -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(Some(value)) = handle.read_state(|state| check(state)) {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_task_uses_a_volume_published_by_a_raw_exec_plugin_task() {
    assert!(is_root(), "bind mounts and the exec driver need root");
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    let _cleanup = support::UnmountUnder(dir.path().to_path_buf());
    let ports = crate::support::free_ports();
    let ports = Ports {
        http: ports[0],
        rpc: ports[1],
        serf: ports[2],
    };
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut config = AgentConfig {
        name: "dev".into(),
        data_dir: Some(dir.path().display().to_string()),
        bind_addr: ip,
        ports,
        advertise: Advertise::on(ip, ports),
        dev_mode: true,
        ..AgentConfig::default()
    };
    config.server.enabled = true;
    config.server.bootstrap_expect = 1;
    config.client.enabled = true;
    let (router, inbox) = ClientCsiRouter::new();
    let db = drover_host::disk::open_database(dir.path()).unwrap();
    let handle = start_agent(AgentParts {
        config: config.clone(),
        db,
        transport: GrpcTransport::default(),
        consul: NoConsul,
        observer: Arc::new(TracingObserver),
        client_csi: Some(Arc::new(router)),
        disk_latency: None,
        keystore: None,
    })
    .await
    .unwrap();
    let (settings, node) = client_identity(&config, handle.node_id(), dir.path(), BTreeMap::new());
    let node_id = node.id.clone();
    let _view = start_client(ClientParts {
        agent: handle.clone(),
        settings,
        executor: Arc::new(HostExecutor {
            drivers: drover_host::drivers::builtin(true, false, Some(env!("CARGO_BIN_EXE_agent").into())),
            devices: DeviceManager::default().with(Arc::new(FakeDevicePlugin::new(1))),
            alloc_root: dir.path().join("alloc"),
            exec: Default::default(),
            proxies: Default::default(),
        }),
        store: drover_host::disk::open_client_store(&dir.path().join("client")).unwrap(),
        inbox,
        node,
        services: None,
    })
    .unwrap();
    let http = drover_http::serve(handle.clone(), (ip, ports.http).into(), Default::default())
        .await
        .unwrap();
    until("the node to register", &handle, |state| {
        state.node(&node_id).map(|_| ())
    })
    .await;

    // The plugin: drover-csi-fake as a raw_exec monolith plugin task, its arguments written
    // as Nomad's documentation writes them (interpolated by the client before the start).
    let fake_state = dir.path().join("fake-state");
    let mut plugin_task = task(
        "plugin",
        "raw_exec",
        PLUGIN,
        &[
            "--endpoint=${CSI_ENDPOINT}",
            &format!("--state-dir={}", fake_state.display()),
            "--node-id=node-${NOMAD_ALLOC_INDEX}",
            "--stage-unstage",
            "--auto-create",
        ],
    );
    plugin_task.csi_plugin = Some(TaskCsiPluginConfig::new("fake", CsiPluginType::Monolith));
    let plugin_job = job(
        "plugin",
        JobType::System,
        TaskGroup {
            name: "plugin".into(),
            count: 1,
            tasks: vec![plugin_task],
            ..TaskGroup::default()
        },
    );
    ok(
        &handle,
        ServerRequest::JobUpsert {
            job: Box::new(plugin_job.clone()),
        },
    )
    .await;
    ok(
        &handle,
        ServerRequest::AllocUpsert {
            allocs: vec![alloc("plugin-1", &plugin_job, &node_id)],
        },
    )
    .await;
    until("the plugin to be healthy", &handle, |state| {
        state
            .plugin("fake")
            .filter(|plugin| plugin.nodes_healthy == 1 && plugin.controllers_healthy == 1)
            .map(|_| ())
    })
    .await;
    ok(
        &handle,
        ServerRequest::VolumeRegister {
            volumes: vec![CsiVolume {
                id: "vol0".into(),
                namespace: "default".into(),
                name: "vol0".into(),
                plugin_id: "fake".into(),
                requested_capabilities: vec![CsiCapability {
                    access_mode: AccessMode::SingleNodeWriter,
                    attachment_mode: AttachmentMode::FileSystem,
                }],
                ..CsiVolume::default()
            }],
        },
    )
    .await;

    // The writer: an exec task with the volume at /data.
    let writer = consumer("writer", "echo hello from the writer > /data/hello");
    ok(
        &handle,
        ServerRequest::JobUpsert {
            job: Box::new(writer.clone()),
        },
    )
    .await;
    ok(
        &handle,
        ServerRequest::AllocUpsert {
            allocs: vec![alloc("writer-1", &writer, &node_id)],
        },
    )
    .await;
    until("the writer to complete", &handle, |state| {
        state
            .alloc("writer-1")
            .filter(|alloc| alloc.client_status == ClientStatus::Complete)
            .map(|_| ())
    })
    .await;
    until("the writer's claim to be released", &handle, |state| {
        state
            .volume_raw("default", "vol0")
            .filter(|volume| volume.write_claims.is_empty() && volume.past_claims.is_empty())
            .map(|_| ())
    })
    .await;
    let plugin_root = dir.path().join("client/csi/monolith/fake");
    for _ in 0..50 {
        if support::mounts_under(&plugin_root).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        support::mounts_under(&plugin_root),
        Vec::<String>::new(),
        "no staging or publish mount left"
    );
    let logs = dir.path().join("alloc/writer-1/alloc/logs/web.stderr.0");
    assert_eq!(std::fs::read_to_string(&logs).unwrap_or_default(), "");

    // The reader: a second exec task on the same volume reads the file back.
    // It also asks for a (fake) GPU: the devices hook reserves one and the task sees its env
    // and its device node. It sees Nomad's runtime variables (its directories as the exec
    // driver shows them, task meta), and `${node.datacenter}` in its arguments is replaced
    // before it starts (the shell would refuse it).
    let mut reader = consumer(
        "reader",
        "cat /data/hello && echo \"gpus=$DROVER_FAKE_GPUS\" && test -c /dev/fake-gpu0 && echo node && \
         test -d \"$NOMAD_TASK_DIR\" && \
         echo \"alloc=$NOMAD_ALLOC_DIR local=$NOMAD_TASK_DIR dc=${node.datacenter} owner=$NOMAD_META_owner\"",
    );
    reader.task_groups[0].tasks[0].meta.insert("owner".into(), "ops".into());
    reader.task_groups[0].tasks[0]
        .resources
        .devices
        .push(drover_core::structs::RequestedDevice {
            name: "gpu".into(),
            count: 1,
        });
    ok(
        &handle,
        ServerRequest::JobUpsert {
            job: Box::new(reader.clone()),
        },
    )
    .await;
    ok(
        &handle,
        ServerRequest::AllocUpsert {
            allocs: vec![alloc("reader-1", &reader, &node_id)],
        },
    )
    .await;
    until("the reader to complete", &handle, |state| {
        state
            .alloc("reader-1")
            .filter(|alloc| alloc.client_status == ClientStatus::Complete)
            .map(|_| ())
    })
    .await;
    let out = std::fs::read_to_string(dir.path().join("alloc/reader-1/alloc/logs/web.stdout.0")).unwrap();
    assert_eq!(
        out,
        "hello from the writer\ngpus=fake-gpu-0\nnode\nalloc=/alloc local=/local dc=dc1 owner=ops\n"
    );

    // A running task's device usage is in its allocation's resource usage.
    let mut trainer = consumer("trainer", "sleep 30");
    trainer.job_type = JobType::Service;
    trainer.task_groups[0].volumes.clear();
    trainer.task_groups[0].tasks[0].volume_mounts.clear();
    trainer.task_groups[0].tasks[0]
        .resources
        .devices
        .push(drover_core::structs::RequestedDevice {
            name: "gpu".into(),
            count: 1,
        });
    ok(
        &handle,
        ServerRequest::JobUpsert {
            job: Box::new(trainer.clone()),
        },
    )
    .await;
    ok(
        &handle,
        ServerRequest::AllocUpsert {
            allocs: vec![alloc("trainer-1", &trainer, &node_id)],
        },
    )
    .await;
    let mut stats = String::new();
    for _ in 0..100 {
        stats = http_get(http, "/v1/client/allocation/trainer-1/stats").await;
        if stats.contains("fake-gpu-0") && stats.contains("\"running\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats: serde_json::Value = serde_json::from_str(&stats).expect(&stats);
    let group = &stats["Tasks"]["web"]["ResourceUsage"]["DeviceStats"][0];
    assert_eq!(
        (group["Vendor"].as_str(), group["Type"].as_str()),
        (Some("drover"), Some("gpu"))
    );
    assert_eq!(
        group["InstanceStats"]["fake-gpu-0"]["Summary"]["FloatNumeratorVal"],
        10.0
    );
    assert_eq!(stats["Tasks"]["web"]["State"], "running");
    // The exec driver measures the task's memory and CPU; the pids are listed.
    let memory = &stats["Tasks"]["web"]["ResourceUsage"]["MemoryStats"];
    let measured = memory["Measured"].as_array().unwrap();
    assert_eq!(measured[0], "RSS", "{stats:#}");
    assert!(memory["RSS"].as_u64().unwrap() > 0, "{stats:#}");
    // With a cgroup (as root), what its memory controller accounts is measured too.
    if measured.contains(&serde_json::json!("Usage")) {
        assert!(memory["Usage"].as_u64().unwrap() > 0, "{stats:#}");
    }
    assert!(
        !stats["Tasks"]["web"]["Pids"].as_object().unwrap().is_empty(),
        "{stats:#}"
    );
    assert_eq!(stats["ResourceUsage"]["MemoryStats"]["RSS"], memory["RSS"]);
    // TotalTicks: the CPU percent (of one core) in MHz of this node's cores, as Nomad has it.
    let node: serde_json::Value = serde_json::from_str(&http_get(http, &format!("/v1/node/{node_id}")).await).unwrap();
    let attribute = |key: &str| node["Attributes"][key].as_str().unwrap().parse::<f64>().unwrap();
    let per_core = attribute("cpu.totalcompute") / attribute("cpu.numcores");
    let cpu = &stats["Tasks"]["web"]["ResourceUsage"]["CpuStats"];
    let (percent, ticks) = (cpu["Percent"].as_f64().unwrap(), cpu["TotalTicks"].as_f64().unwrap());
    assert!(
        (ticks - percent / 100.0 * per_core).abs() < 1e-6,
        "{cpu:#} per core {per_core}"
    );
    assert!(
        http_get(http, "/v1/client/allocation/nope/stats")
            .await
            .contains("Unknown allocation")
    );
    let mut stopped = alloc("trainer-1", &trainer, &node_id);
    stopped.desired_status = DesiredStatus::Stop;
    ok(&handle, ServerRequest::AllocUpsert { allocs: vec![stopped] }).await;
    until("the trainer to stop", &handle, |state| {
        state
            .alloc("trainer-1")
            .filter(|alloc| alloc.client_status == ClientStatus::Complete)
            .map(|_| ())
    })
    .await;

    // Stop the plugin: it deregisters and its socket dir goes.
    let mut stopped = alloc("plugin-1", &plugin_job, &node_id);
    stopped.desired_status = DesiredStatus::Stop;
    ok(&handle, ServerRequest::AllocUpsert { allocs: vec![stopped] }).await;
    until("the plugin alloc to stop", &handle, |state| {
        state
            .alloc("plugin-1")
            .filter(|alloc| alloc.client_status == ClientStatus::Complete)
            .map(|_| ())
    })
    .await;
    assert!(!dir.path().join("client/csi/plugins/plugin-1").exists());
    assert_eq!(support::mounts_under(dir.path()), Vec::<String>::new());
    handle.shutdown().await;
}
