//! Data-driven tests of the core machines (the etcd/raft-rs style).
//!
//! Each file under `tests/testdata/<machine>/` is a script of directives in the `datadriven`
//! format (cockroachdb's, ported): a line `name key=value ...`, optional input lines, a `----`
//! line, and the expected output up to the next blank line. The harness runs the directive and
//! the crate compares its output; with `REWRITE=1` it rewrites the files with what the machine
//! did instead. Regenerate, then read every diff: the expected output is reviewed, never
//! hand-tuned.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use drover_core::Instant;
use drover_core::bootstrap::{BootState, Bootstrap, BootstrapAction};
use drover_core::config::{BootstrapFault, ServerTiming};
use drover_core::membership::{MemberId, ServerTags};
use drover_core::op::{OpId, OpIds};

/// One directive as the harnesses read it: the `datadriven` crate's test case with its
/// arguments flattened (`key=value`; `key=(a,b)` reads as `a,b`; `key` alone is a flag) and
/// its input as lines. A value the directive line cannot spell (a path, an address) is
/// written as a bare key with the value on the input lines (several lines read as `a,b`).
/// Arguments whose values may come on the input lines.
const SPELLED_ON_INPUT: &[&str] = &["ok", "mounted", "path", "alloc"];

struct Directive {
    command: String,
    args: BTreeMap<String, String>,
    input: Vec<String>,
}

impl Directive {
    fn from_case(case: &datadriven::TestCase) -> Directive {
        // Ordered: the harnesses may iterate arguments into actions.
        let mut args: BTreeMap<String, String> = case
            .args
            .iter()
            .map(|(key, values)| (key.clone(), values.join(",")))
            .collect();
        let mut input: Vec<String> = case.input.lines().map(String::from).collect();
        for key in SPELLED_ON_INPUT {
            if args.get(*key).is_some_and(String::is_empty) && !input.is_empty() {
                args.insert(key.to_string(), std::mem::take(&mut input).join(","));
            }
        }
        Directive {
            command: case.directive.clone(),
            args,
            input,
        }
    }
}

/// Runs every script in `tests/testdata/<dir>` through `run`, one fresh state per file. The
/// `datadriven` crate compares each output (`REWRITE=1` rewrites the files instead: then
/// review every diff — the expected output is reviewed, never hand-tuned).
fn run_dir<S>(dir: &str, mut new_state: impl FnMut() -> S, mut run: impl FnMut(&mut S, &Directive) -> String) {
    let dir = format!("{}/tests/testdata/{dir}", env!("CARGO_MANIFEST_DIR"));
    datadriven::walk(&dir, |file| {
        let mut state = new_state();
        file.run(|case| -> String { run(&mut state, &Directive::from_case(case)) });
    });
}

struct BootstrapHarness {
    now: Instant,
    ops: OpIds,
    machine: Option<Bootstrap>,
    members: Vec<MemberId>,
}

fn member(line: &str) -> MemberId {
    let mut words = line.split_whitespace();
    let name = words.next().expect("member name").to_string();
    let mut tags = ServerTags {
        region: "global".into(),
        datacenter: "dc1".into(),
        id: 0,
        rpc_addr: "127.0.0.1:4647".parse().unwrap(),
        expect: 0,
        bootstrap: false,
        nonvoter: false,
        build: "test".into(),
    };
    for word in words {
        let (key, value) = word.split_once('=').unwrap_or((word, ""));
        match key {
            "id" => {
                tags.id = value.parse().unwrap();
                tags.rpc_addr = format!("10.0.0.{}:4647", tags.id).parse().unwrap();
            }
            "expect" => tags.expect = value.parse().unwrap(),
            "region" => tags.region = value.into(),
            "bootstrap" => tags.bootstrap = true,
            "nonvoter" => tags.nonvoter = true,
            other => panic!("unknown member attribute {other}"),
        }
    }
    MemberId {
        name,
        addr: format!("10.0.0.{}:4648", tags.id).parse().unwrap(),
        generation: 0,
        tags: Some(tags),
    }
}

fn describe(machine: &mut Bootstrap, now: Instant) -> String {
    let mut out = String::new();
    while let Some(action) = machine.poll_action() {
        match action {
            BootstrapAction::QueryPeers { op, peer } => {
                writeln!(out, "action: query-peers {op} {}", peer.name)
            }
            BootstrapAction::Initialize { op, servers } => {
                let names: Vec<String> = servers
                    .iter()
                    .map(|peer| {
                        if peer.nonvoter {
                            format!("{}(nonvoter)", peer.name)
                        } else {
                            peer.name.clone()
                        }
                    })
                    .collect();
                writeln!(out, "action: initialize {op} [{}]", names.join(" "))
            }
            BootstrapAction::PersistBootstrapped => writeln!(out, "action: persist-bootstrapped"),
        }
        .unwrap();
    }
    let timeout = machine
        .poll_timeout()
        .map(|at| format!(" timeout=+{}ms", at.saturating_duration_since(now).as_millis()))
        .unwrap_or_default();
    writeln!(out, "phase: {}{timeout}", machine.phase()).unwrap();
    out
}

fn op(directive: &Directive) -> OpId {
    OpId(directive.args["op"].parse().expect("op=N"))
}

#[test]
fn bootstrap() {
    run_dir(
        "bootstrap",
        || BootstrapHarness {
            now: Instant::ZERO,
            ops: OpIds::default(),
            machine: None,
            members: Vec::new(),
        },
        |harness, directive| {
            let args = &directive.args;
            match directive.command.as_str() {
                "new" => {
                    let boot = BootState {
                        last_log_index: args.get("log").map(|index| index.parse().unwrap()),
                        bootstrapped: args.contains_key("bootstrapped"),
                    };
                    let fault = args
                        .contains_key("fault")
                        .then_some(BootstrapFault::SelfElectAfterElectionTimeout);
                    let machine = Bootstrap::new(
                        harness.now,
                        args["expect"].parse().unwrap(),
                        "global".into(),
                        args["id"].parse().unwrap(),
                        ServerTiming::default(),
                        fault,
                        boot,
                    );
                    harness.machine = Some(machine);
                }
                "members" => {
                    harness.members = directive.input.iter().map(|line| member(line)).collect();
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.evaluate(harness.now, &harness.members, &mut harness.ops);
                }
                "peers" => {
                    let result = match (args.get("ok"), args.get("err")) {
                        (Some(list), _) => Ok(list.split(',').filter(|p| !p.is_empty()).map(String::from).collect()),
                        (None, Some(error)) => Err(drover_core::error::Failure::unavailable(error.replace('_', " "))),
                        _ => panic!("peers needs ok= or err="),
                    };
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.handle_peers(harness.now, op(directive), result, &mut harness.ops);
                }
                "initialized" => {
                    let result = args.get("err").map_or(Ok(()), |error| {
                        Err(drover_core::error::Failure::unavailable(error.replace('_', " ")))
                    });
                    harness
                        .machine
                        .as_mut()
                        .expect("new first")
                        .handle_initialized(op(directive), result);
                }
                "advance" => {
                    let ms: u64 = args["ms"].parse().unwrap();
                    harness.now = harness.now + Duration::from_millis(ms);
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.handle_timeout(harness.now, &harness.members, &mut harness.ops);
                }
                "raft" => {
                    let log = args.get("log").map(|index| index.parse().unwrap());
                    let machine = harness.machine.as_mut().expect("new first");
                    machine.observe_raft(log, args.contains_key("leader"));
                }
                other => panic!("unknown directive {other}"),
            }
            describe(harness.machine.as_mut().expect("new first"), harness.now)
        },
    );
}

// --- client: alloc runner with its task runners -------------------------------------------

mod client_harness {
    use super::*;
    use drover_core::client::alloc_runner::{AllocAction, AllocRunner, AllocSpec, LocalAllocState};
    use drover_core::client::containers::PullFailure;
    use drover_core::client::paths::ClientPaths;
    use drover_core::client::task_runner::{LocalTaskState, TaskAction};
    use drover_core::client::volume_hook::HostVolumeConfig;
    use drover_core::client::{
        CsiReply, DriverCapabilities, ErrorKind, ExitResult, Io, IoError, MountConfigSupport, MountInfo, Outcome,
        Reply, Reservation, TaskHandle, VolumeOp,
    };
    use drover_core::rpc::{RpcError, ServerReply, ServerRequest};
    use drover_core::structs::{
        AccessMode, Allocation, AttachmentMode, CsiPluginType, CsiVolume, JobType, RequestedDevice, RestartMode,
        RestartPolicy, Task, TaskCsiPluginConfig, TaskGroup, VolumeMount, VolumeRequest, VolumeType,
    };

    pub struct Harness {
        pub now: Instant,
        pub ops: OpIds,
        pub spec: Option<AllocSpec>,
        pub runner: Option<AllocRunner>,
        pub saved_alloc: LocalAllocState,
        pub saved_tasks: BTreeMap<String, LocalTaskState>,
        pub contacted: bool,
        /// The newest op issued (`reply op=last`).
        pub last_op: u64,
    }

    impl Harness {
        pub fn new() -> Self {
            Harness {
                now: Instant::ZERO,
                ops: OpIds::default(),
                spec: None,
                runner: None,
                saved_alloc: LocalAllocState::default(),
                saved_tasks: BTreeMap::new(),
                contacted: false,
                last_op: 0,
            }
        }
    }

    fn caps(driver: &str) -> DriverCapabilities {
        match driver {
            "raw_exec" => DriverCapabilities {
                mount_configs: MountConfigSupport::None,
                fs_isolation: false,
            },
            "mock" => DriverCapabilities {
                mount_configs: MountConfigSupport::None,
                fs_isolation: false,
            },
            _ => DriverCapabilities {
                mount_configs: MountConfigSupport::All,
                fs_isolation: true,
            },
        }
    }

    fn spec(directive: &Directive) -> AllocSpec {
        let args = &directive.args;
        let job_type = match args.get("job").map(String::as_str) {
            Some("batch") => JobType::Batch,
            Some("system") => JobType::System,
            _ => JobType::Service,
        };
        let mut group = TaskGroup {
            name: "g".into(),
            count: 1,
            ..TaskGroup::default()
        };
        if let Some(seconds) = args.get("group_shutdown") {
            group.shutdown_delay = Some(Duration::from_secs(seconds.parse().unwrap()));
        }
        if let Some(attempts) = args.get("attempts") {
            group.restart_policy = Some(RestartPolicy {
                attempts: attempts.parse().unwrap(),
                interval: Duration::from_secs(300),
                delay: Duration::from_secs(10),
                mode: if args.get("mode").map(String::as_str) == Some("delay") {
                    RestartMode::Delay
                } else {
                    RestartMode::Fail
                },
            });
        }
        for line in &directive.input {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("task") => {
                    let mut task = Task {
                        name: words.next().expect("task name").into(),
                        ..Task::default()
                    };
                    for word in words {
                        let (key, value) = word.split_once('=').expect("key=value");
                        match key {
                            "driver" => task.driver = value.into(),
                            // attempts=<n>: the task's own restart block (mode fail), laid
                            // over whatever its group says.
                            "attempts" => {
                                task.restart_policy = Some(RestartPolicy {
                                    attempts: value.parse().unwrap(),
                                    interval: Duration::from_secs(300),
                                    delay: Duration::from_secs(10),
                                    mode: RestartMode::Fail,
                                });
                            }
                            // shutdown=<seconds>: the task's shutdown_delay.
                            "shutdown" => task.shutdown_delay = Duration::from_secs(value.parse().unwrap()),
                            "mount" => {
                                let (volume, rest) = value.split_once(':').expect("alias:dest[:ro]");
                                let (destination, read_only) = match rest.strip_suffix(":ro") {
                                    Some(dest) => (dest, true),
                                    None => (rest, false),
                                };
                                task.volume_mounts.push(VolumeMount {
                                    volume: volume.into(),
                                    destination: destination.into(),
                                    read_only,
                                    ..VolumeMount::default()
                                });
                            }
                            "plugin" => {
                                let (id, kind) = value.split_once(':').expect("id:type");
                                let kind = match kind {
                                    "node" => CsiPluginType::Node,
                                    "controller" => CsiPluginType::Controller,
                                    _ => CsiPluginType::Monolith,
                                };
                                let mut config = TaskCsiPluginConfig::new(id, kind);
                                if let Some(timeout) = args.get("health") {
                                    config.health_timeout = Duration::from_secs(timeout.parse().unwrap());
                                }
                                task.csi_plugin = Some(config);
                            }
                            "device" => task.resources.devices.push(RequestedDevice {
                                name: value.into(),
                                count: 1,
                            }),
                            "env" => {
                                let (k, v) = value.split_once(':').unwrap();
                                task.env.insert(k.into(), v.into());
                            }
                            // lifecycle=prestart|prestart-sidecar
                            "lifecycle" => {
                                task.lifecycle = Some(drover_core::structs::TaskLifecycle {
                                    hook: "prestart".into(),
                                    sidecar: value == "prestart-sidecar",
                                })
                            }
                            // connect=<service>: the Connect sidecar of that group service
                            // (port label `http`, allocated 9001).
                            "connect" => {
                                task.kind = format!("connect-proxy:{value}");
                                group.services.push(drover_core::structs::Service {
                                    name: value.into(),
                                    port_label: "http".into(),
                                    connect: Some(drover_core::connect::ConsulConnect {
                                        sidecar_service: Some(Default::default()),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                });
                            }
                            // template=<destination>:<change mode>[:<signal>|:env]
                            "template" => {
                                let mut parts = value.split(':');
                                let dest_path = parts.next().unwrap().to_string();
                                let change_mode = parts.next().unwrap_or("restart").to_string();
                                let rest = parts.next().unwrap_or("");
                                task.templates.push(drover_core::structs::Template {
                                    embedded_tmpl: "(faked by replies)".into(),
                                    dest_path,
                                    change_mode,
                                    envvars: rest == "env",
                                    change_signal: if rest == "env" { String::new() } else { rest.into() },
                                    ..Default::default()
                                });
                            }
                            // image=<image>: the task's `config { image }` (`meta.x` for
                            // `${meta.x}`, as the injected Connect sidecar names it).
                            "image" => {
                                let image = match value.strip_prefix("meta.") {
                                    Some(key) => format!("${{meta.{key}}}"),
                                    None => value.to_string(),
                                };
                                task.config
                                    .insert("image".into(), drover_core::structs::ConfigValue::String(image));
                            }
                            "kill_signal" => task.kill_signal = value.into(),
                            "leader" => task.leader = value == "true",
                            other => panic!("unknown task attribute {other}"),
                        }
                    }
                    group.tasks.push(task);
                }
                Some("volume") => {
                    let alias = words.next().expect("alias").to_string();
                    let mut request = VolumeRequest {
                        name: alias.clone(),
                        access_mode: AccessMode::SingleNodeWriter,
                        attachment_mode: AttachmentMode::FileSystem,
                        ..VolumeRequest::default()
                    };
                    for word in words {
                        let (key, value) = word.split_once('=').unwrap_or((word, ""));
                        match key {
                            "csi" => request.volume_type = VolumeType::Csi,
                            "host" => request.volume_type = VolumeType::Host,
                            "source" => request.source = value.into(),
                            "ro" => request.read_only = true,
                            "per_alloc" => request.per_alloc = true,
                            other => panic!("unknown volume attribute {other}"),
                        }
                    }
                    group.volumes.insert(alias, request);
                }
                other => panic!("unknown spec line {other:?}"),
            }
        }
        let drivers = args
            .get("drivers")
            .map(|list| list.split(',').map(|d| (d.to_string(), caps(d))).collect())
            .unwrap_or_default();
        let mut host_volumes = BTreeMap::new();
        host_volumes.insert(
            "cache".to_string(),
            HostVolumeConfig {
                path: "/srv/cache".into(),
                read_only: false,
            },
        );
        let mut resources = drover_core::structs::AllocatedResources::default();
        // bridge: the group has a network of its own, its port `http` 9001 mapped to 8080.
        if args.contains_key("bridge") {
            group.networks = vec![drover_core::structs::NetworkResource {
                mode: "bridge".into(),
                ..Default::default()
            }];
            resources.ports.push(drover_core::structs::AllocatedPort {
                label: "http".into(),
                value: 9001,
                to: 8080,
                host_ip: "10.0.0.5".into(),
            });
        }
        if !group.services.is_empty() && resources.ports.is_empty() {
            resources.ports.push(drover_core::structs::AllocatedPort {
                label: "http".into(),
                value: 9001,
                to: 0,
                host_ip: "10.0.0.5".into(),
            });
        }
        AllocSpec {
            alloc: Allocation {
                resources,
                id: args.get("alloc").cloned().unwrap_or_else(|| "a1".into()),
                namespace: "default".into(),
                name: "j.g[0]".into(),
                job_id: "j".into(),
                task_group: "g".into(),
                previous_allocation: args.get("prev").cloned(),
                preempted_allocations: args
                    .get("preempted")
                    .map(|list| list.split(',').map(String::from).collect())
                    .unwrap_or_default(),
                ..Allocation::default()
            },
            job_type,
            job_name: "j".into(),
            job_meta: BTreeMap::new(),
            job_payload: Vec::new(),
            group,
            node: std::sync::Arc::new(drover_core::taskenv::NodeEnv {
                node: drover_core::structs::Node {
                    id: "n1".into(),
                    secret_id: "n1-secret".into(),
                    // As a production client's: Nomad's `connect.*` defaults.
                    meta: drover_core::connect::envoy_version::with_client_meta_defaults(BTreeMap::new()),
                    ..Default::default()
                },
                ..Default::default()
            }),
            node_id: "n1".into(),
            paths: ClientPaths::new("/s", "/a"),
            host_volumes,
            drivers,
            seed: 1,
            faults: drover_core::config::ClientFaults {
                skip_task_destroy: args.contains_key("skip-destroy"),
                ..drover_core::config::ClientFaults::default()
            },
            wall_epoch: 1_700_000_000_000_000_000,
            max_kill_timeout: drover_core::client::task_runner::DEFAULT_MAX_KILL_TIMEOUT,
            consul: drover_core::connect::ClientConsul {
                acl: args.contains_key("consul-acl"),
                http_addr: "127.0.0.1:8500".into(),
                grpc_addr: "127.0.0.1:8502".into(),
                binary: "consul".into(),
                // `consul-tls`: a Consul over mutual TLS with basic auth.
                transport: if args.contains_key("consul-tls") {
                    drover_core::connect::ConsulTransport {
                        auth: Some("nomad:pw".into()),
                        ssl: true,
                        verify_ssl: true,
                        ca_file: "/etc/consul/ca.pem".into(),
                        cert_file: "/etc/consul/cli.pem".into(),
                        key_file: "/etc/consul/cli-key.pem".into(),
                    }
                } else {
                    drover_core::connect::ConsulTransport::default()
                },
            },
        }
    }

    pub fn reply(directive: &Directive) -> Outcome {
        let args = &directive.args;
        if let Some(error) = args.get("err") {
            let (kind, message) = error.split_once(',').unwrap_or(("other", error));
            let kind = match kind {
                "timeout" => ErrorKind::Timeout,
                "unavailable" => ErrorKind::Unavailable,
                "notfound" => ErrorKind::NotFound,
                "pull-notfound" => ErrorKind::ImagePull(PullFailure::NotFound),
                "pull-unauthorized" => ErrorKind::ImagePull(PullFailure::Unauthorized),
                "pull-timeout" => ErrorKind::ImagePull(PullFailure::Timeout),
                "pull-daemon" => ErrorKind::ImagePull(PullFailure::Daemon),
                "config" => ErrorKind::TaskConfig,
                _ => ErrorKind::Other,
            };
            return Err(IoError::new(kind, message.replace('_', " ")));
        }
        if let Some(message) = args.get("rpc-err") {
            // `busy`: a refusal the state lifts by itself (claims exhausted), by its kind alone.
            let error = if args.contains_key("busy") {
                RpcError::new(
                    drover_core::error::ErrorKind::Busy,
                    message.replace('_', " "),
                    args.contains_key("retryable"),
                )
            } else {
                RpcError::from_plugin(message.replace('_', " "), args.contains_key("retryable"))
            };
            return Ok(Reply::Server(ServerReply::Error(error)));
        }
        if let Some(volume) = args.get("claimed") {
            return Ok(Reply::Server(ServerReply::Claimed {
                index: 10,
                volume: Box::new(CsiVolume {
                    id: volume.clone(),
                    namespace: "default".into(),
                    plugin_id: args.get("plugin").cloned().unwrap_or_else(|| "hp".into()),
                    access_mode: AccessMode::SingleNodeWriter,
                    attachment_mode: AttachmentMode::FileSystem,
                    ..CsiVolume::default()
                }),
                publish_context: BTreeMap::new(),
            }));
        }
        if let Some(source) = args.get("mounted") {
            return Ok(Reply::Mounted(MountInfo {
                source: source.clone(),
                is_device: false,
            }));
        }
        if let Some(value) = args.get("bool") {
            return Ok(Reply::Bool(value == "true"));
        }
        if let Some(value) = args.get("probe") {
            return Ok(Reply::Csi(CsiReply::Probe { ready: value == "true" }));
        }
        if let Some(value) = args.get("info") {
            let (name, version) = value.split_once(',').unwrap();
            return Ok(Reply::Csi(CsiReply::PluginInfo {
                name: name.into(),
                version: version.into(),
            }));
        }
        if args.contains_key("done") {
            return Ok(Reply::Server(ServerReply::Done { index: 11 }));
        }
        // file=<text> or file=none (ReadFile); si-token=(<task>,<secret>) (DeriveSiToken).
        if let Some(text) = args.get("file") {
            return Ok(Reply::File((text != "none").then(|| text.clone())));
        }
        if let Some(token) = args.get("si-token") {
            let (task, secret) = token.split_once(',').expect("(task,secret)");
            return Ok(Reply::Server(ServerReply::SiTokens {
                index: 12,
                tokens: [(task.to_string(), secret.to_string())].into(),
            }));
        }
        if let Some(task) = args.get("started") {
            return Ok(Reply::Started(TaskHandle {
                driver: "d".into(),
                alloc_id: "a1".into(),
                task: task.clone(),
                state: "pid=1".into(),
            }));
        }
        // Datadriven words allow only [A-Za-z0-9._-]: in paths '.' stands for '/'; in the
        // rendered content '.' is a line end, '-' is '=' and '_' a space.
        let path = |word: &str| word.replace('.', "/");
        if let Some(content) = args.get("rendered") {
            let set = |key: &str| -> BTreeSet<String> {
                args.get(key)
                    .map(|list| list.split(',').filter(|p| !p.is_empty()).map(path).collect())
                    .unwrap_or_default()
            };
            return Ok(Reply::Rendered(drover_core::client::RenderReply {
                content: content.replace('.', "\n").replace('-', "=").replace('_', " "),
                used: set("used"),
                unknown: set("unknown"),
                blocked: set("blocked"),
            }));
        }
        // var=<path> index=<n> items=(<k>-<v>, ...): one variable; var-missing: none.
        if args.contains_key("var-missing") {
            return Ok(Reply::Server(ServerReply::Variables {
                index: 20,
                variables: BTreeMap::new(),
            }));
        }
        if let Some(var) = args.get("var") {
            let items = args
                .get("items")
                .map(|list| {
                    list.split(',')
                        .filter_map(|pair| pair.trim().split_once('-'))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let variable = drover_core::rpc::VariableItems {
                items,
                modify_index: args.get("index").map_or(1, |index| index.parse().unwrap()),
            };
            return Ok(Reply::Server(ServerReply::Variables {
                index: 20,
                variables: BTreeMap::from([(path(var), variable)]),
            }));
        }
        if let Some(id) = args.get("network") {
            return Ok(Reply::Network(drover_core::client::AllocNetwork {
                driver: "docker".into(),
                id: id.clone(),
            }));
        }
        if let Some(versions) = args.get("proxies") {
            let versions = versions.split(",").filter(|v| *v != "none").map(String::from).collect();
            return Ok(Reply::Proxies(BTreeMap::from([("envoy".to_string(), versions)])));
        }
        if args.contains_key("reserved") {
            let mut reservation = Reservation::default();
            reservation.env.insert("FAKE_DEVICE".into(), "dev0".into());
            return Ok(Reply::Reserved(reservation));
        }
        Ok(Reply::Unit)
    }

    pub fn describe_io(io: &Io) -> String {
        match io {
            Io::Mkdir { path } => format!("mkdir {path}"),
            Io::RemoveAll { path } => format!("rm -rf {path}"),
            Io::Rmdir { path } => format!("rmdir {path}"),
            Io::IsMountPoint { path } => format!("is-mount {path}"),
            Io::StartTask(config) => {
                let env: Vec<String> = config
                    .env
                    .iter()
                    .filter(|(k, _)| !k.starts_with("NOMAD_") || k.starts_with("NOMAD_ENVOY_"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let mounts: Vec<String> = config.mounts.iter().map(|m| m.to_string()).collect();
                let mut image = match config.config.get("image").and_then(|image| image.as_str()) {
                    Some(image) => format!(" image={image}"),
                    None => String::new(),
                };
                if let Some(network) = &config.network {
                    image.push_str(&format!(" network={}", network.id));
                }
                format!(
                    "start {}{image} env=[{}] mounts=[{}]",
                    config.task,
                    env.join(" "),
                    mounts.join(" ")
                )
            }
            Io::StopTask {
                handle,
                kill_timeout,
                signal,
            } => {
                // SIGINT, the default, is left unsaid.
                let signal = if *signal == 2 {
                    String::new()
                } else {
                    format!(" signal={signal}")
                };
                format!("stop {} kill_timeout={kill_timeout:?}{signal}", handle.task)
            }
            Io::RecoverTask { handle } => format!("recover {}", handle.task),
            Io::DestroyTask { handle } => format!("destroy {}", handle.task),
            Io::SignalTask { handle, signal } => format!("signal {} {signal}", handle.task),
            Io::ReadFile { path } => format!("read {path}"),
            Io::WriteFile { path, content, mode } => format!("write {path} mode={mode:o} {content}"),
            Io::WriteBytes { path, content, mode } => {
                format!("write {path} mode={mode:o} {}", String::from_utf8_lossy(content))
            }
            Io::RunCommand {
                program,
                args,
                env,
                stdout_path,
                mode,
            } => {
                let env: Vec<String> = env.iter().map(|(key, value)| format!("{key}={value}")).collect();
                format!(
                    "run {program} {} env=[{}] > {stdout_path} mode={mode:o}",
                    args.join(" "),
                    env.join(" ")
                )
            }
            Io::RenderTemplate(request) => {
                let vars: Vec<String> = request
                    .variables
                    .iter()
                    .map(|(path, items)| format!("{path}{}", if items.is_some() { "" } else { "(none)" }))
                    .collect();
                format!("render {} vars=[{}]", request.template.dest_path, vars.join(" "))
            }
            Io::ReserveDevices { task, devices, .. } => format!("reserve {} for {task}", devices[0].name),
            Io::Csi { socket, call } => format!("csi {} {socket}", call.name()),
            Io::Server(request) => match request {
                ServerRequest::VolumeClaim { volume_id, claim, .. } => {
                    format!(
                        "server claim {volume_id} {:?} alloc={}",
                        claim.mode, claim.allocation_id
                    )
                }
                ServerRequest::VolumeUnpublish { volume_id, claim, .. } => {
                    format!("server unpublish {volume_id} alloc={}", claim.allocation_id)
                }
                ServerRequest::VariablesRead { paths, .. } => format!("server vars-read {}", paths.join(",")),
                ServerRequest::DeriveSiToken {
                    node_id,
                    secret_id,
                    alloc_id,
                    tasks,
                } => format!(
                    "server derive-si-token node={node_id} secret={secret_id} alloc={alloc_id} tasks={}",
                    tasks.join(",")
                ),
                other => format!("server {other:?}"),
            },
            Io::Volume(op) => match op {
                VolumeOp::Mount {
                    plugin_id,
                    volume,
                    usage,
                    ..
                } => format!("volume mount {} plugin={plugin_id} usage={}", volume.id, usage.to_fs()),
                VolumeOp::Unmount {
                    plugin_id, volume_id, ..
                } => format!("volume unmount {volume_id} plugin={plugin_id}"),
                VolumeOp::HasMount { mount, .. } => format!("volume has-mount {}", mount.source),
                VolumeOp::Expand {
                    volume_id, alloc_id, ..
                } => format!("volume expand {volume_id} alloc={alloc_id}"),
            },
            Io::AllocSync(request) => format!("alloc-sync min_index={}", request.min_index),
            Io::Consul(call) => format!("consul {call:?}"),
            Io::CreateNetwork {
                alloc_id,
                driver,
                ports,
            } => {
                let ports: Vec<String> = ports
                    .iter()
                    .map(|port| format!("{}:{}->{}", port.label, port.value, port.task_port()))
                    .collect();
                format!("create-network {alloc_id} driver={driver} ports=[{}]", ports.join(" "))
            }
            Io::DestroyNetwork { alloc_id, network } => format!("destroy-network {alloc_id} {}", network.id),
            Io::ProxySocket { path, target } => format!("proxy-socket {path} -> {target}"),
            Io::StopProxySocket { path } => format!("stop-proxy-socket {path}"),
            Io::PrepareDevices { picks } => format!("prepare-devices {picks:?}"),
        }
    }

    pub fn drain(harness: &mut Harness) -> String {
        let mut out = String::new();
        let runner = harness.runner.as_mut().expect("run first");
        while let Some(action) = runner.poll_action() {
            match action {
                AllocAction::Io { op, io } => {
                    harness.last_op = op.0;
                    writeln!(out, "io {op} {}", describe_io(&io))
                }
                AllocAction::Persist(local) => {
                    let stubs: Vec<String> = local
                        .csi_stubs
                        .iter()
                        .map(|(alias, stub)| {
                            format!(
                                "{alias}:{}{}",
                                stub.volume_id,
                                match (&stub.mount, stub.mount_attempted) {
                                    (Some(_), _) => "(mounted)",
                                    (None, true) => "(mounting)",
                                    (None, false) => "",
                                }
                            )
                        })
                        .collect();
                    let network = match &local.network {
                        Some(network) => format!(" network={}", network.id),
                        None => String::new(),
                    };
                    let line = format!(
                        "persist alloc stubs=[{}]{network}{}{}",
                        stubs.join(" "),
                        if local.postrun_done { " postrun-done" } else { "" },
                        if local.destroyed { " destroyed" } else { "" }
                    );
                    harness.saved_alloc = *local;
                    writeln!(out, "{line}")
                }
                AllocAction::Task { task, action } => match action {
                    TaskAction::Io { op, io } => {
                        harness.last_op = op.0;
                        writeln!(out, "task {task} io {op} {}", describe_io(&io))
                    }
                    TaskAction::Event(event) => {
                        writeln!(out, "task {task} event {}: {}", event.kind, event.message)
                    }
                    TaskAction::Persist(local) => {
                        let hooks: Vec<String> = local
                            .hooks
                            .iter()
                            .map(|(name, state)| format!("{name}{}", if state.prestart_done { "*" } else { "" }))
                            .collect();
                        let line = format!(
                            "task {task} persist hooks=[{}] handle={} state={}{} restarts={}",
                            hooks.join(" "),
                            local.handle.is_some(),
                            local.state.state.as_str(),
                            if local.state.failed { " failed" } else { "" },
                            local.state.restarts
                        );
                        harness.saved_tasks.insert(task.clone(), *local);
                        writeln!(out, "{line}")
                    }
                    TaskAction::Register(info) => {
                        writeln!(
                            out,
                            "task {task} register {} {} v{} socket={} root={}",
                            info.kind.as_str(),
                            info.name,
                            info.version,
                            info.socket_path,
                            info.container_mount_point
                        )
                    }
                    TaskAction::Deregister { kind, name, alloc_id } => {
                        writeln!(out, "task {task} deregister {} {name} {alloc_id}", kind.as_str())
                    }
                },
                AllocAction::Hook { hook, phase, result } => match result {
                    Ok(()) => writeln!(out, "hook {hook} {phase} ok"),
                    Err(error) => writeln!(out, "hook {hook} {phase} err: {error}"),
                },
                AllocAction::Status(status) => writeln!(out, "status {status:?}"),
            }
            .unwrap();
        }
        if let Some(at) = runner.poll_timeout() {
            writeln!(
                out,
                "timeout=+{}ms",
                at.saturating_duration_since(harness.now).as_millis()
            )
            .unwrap();
        }
        out
    }

    pub fn run(harness: &mut Harness, directive: &Directive) -> String {
        let args = &directive.args;
        match directive.command.as_str() {
            "new" => {
                let spec = spec(directive);
                harness.runner = Some(AllocRunner::new(spec.clone()));
                harness.spec = Some(spec);
            }
            "run" => harness.runner.as_mut().unwrap().run(harness.now, &mut harness.ops),
            "reply" => {
                let outcome = reply(directive);
                let op = match args["op"].as_str() {
                    "last" => OpId(harness.last_op),
                    _ => op(directive),
                };
                let consumed = harness
                    .runner
                    .as_mut()
                    .unwrap()
                    .outcome(harness.now, op, outcome, &mut harness.ops);
                if !consumed {
                    return format!("ignored {op}\n{}", drain(harness));
                }
            }
            "exit" => {
                let exit = ExitResult {
                    exit_code: args.get("code").map_or(0, |c| c.parse().unwrap()),
                    signal: args.get("signal").map_or(0, |s| s.parse().unwrap()),
                    oom_killed: args.contains_key("oom"),
                    ..ExitResult::default()
                };
                harness
                    .runner
                    .as_mut()
                    .unwrap()
                    .task_exited(harness.now, &args["task"], exit, &mut harness.ops);
            }
            "stop" => harness.runner.as_mut().unwrap().stop(harness.now, &mut harness.ops),
            "destroy" => harness.runner.as_mut().unwrap().destroy(harness.now, &mut harness.ops),
            "contact" => {
                harness.contacted = true;
                harness
                    .runner
                    .as_mut()
                    .unwrap()
                    .servers_contacted(harness.now, &mut harness.ops);
            }
            "terminal" => {
                let ids = args["ids"].split(',').map(String::from).collect();
                harness
                    .runner
                    .as_mut()
                    .unwrap()
                    .allocs_terminal(harness.now, &ids, &mut harness.ops);
            }
            "advance" => {
                let ms: u64 = args["ms"].parse().unwrap();
                harness.now = harness.now + Duration::from_millis(ms);
                harness
                    .runner
                    .as_mut()
                    .unwrap()
                    .handle_timeout(harness.now, &mut harness.ops);
            }
            "agent-restart" => {
                // Everything in memory is lost; only what was persisted comes back.
                let spec = harness.spec.clone().unwrap();
                let runner = AllocRunner::restore(
                    spec,
                    harness.saved_alloc.clone(),
                    harness.saved_tasks.clone(),
                    args.contains_key("contacted"),
                );
                harness.runner = Some(runner);
            }
            "tasks" => {
                let runner = harness.runner.as_ref().unwrap();
                let mut out = String::new();
                for task in runner.tasks() {
                    let state = task.state();
                    writeln!(
                        out,
                        "{}: {} hooks={:?} failed={} restarts={}",
                        task.name(),
                        state.state.as_str(),
                        task.hook_names(),
                        state.failed,
                        state.restarts
                    )
                    .unwrap();
                }
                writeln!(out, "alloc: {:?} done={}", runner.status(), runner.is_done()).unwrap();
                return out;
            }
            other => panic!("unknown directive {other}"),
        }
        drain(harness)
    }
}

#[test]
fn alloc_runner() {
    run_dir("alloc_runner", client_harness::Harness::new, client_harness::run);
}

// --- client: the volume manager of one node plugin ----------------------------------------

mod volume_harness {
    use super::*;
    use drover_core::client::volume_manager::{PluginMounts, VolumeAction, VolumeManager};
    use drover_core::client::{CsiCall, Io, MountInfo, UsageOptions, VolumeOp};
    use drover_core::structs::{AccessMode, AttachmentMode, CsiVolume};

    pub struct Harness {
        now: Instant,
        ops: OpIds,
        manager: Option<VolumeManager>,
        last_op: u64,
    }

    pub fn new() -> Harness {
        Harness {
            now: Instant::ZERO,
            ops: OpIds::default(),
            manager: None,
            last_op: 0,
        }
    }

    fn usage(args: &BTreeMap<String, String>) -> UsageOptions {
        UsageOptions {
            read_only: args.contains_key("ro"),
            attachment_mode: AttachmentMode::FileSystem,
            access_mode: if args.contains_key("ro") {
                AccessMode::MultiNodeReader
            } else {
                AccessMode::SingleNodeWriter
            },
            fs_type: "ext4".into(),
            mount_flags: Vec::new(),
        }
    }

    fn drain(harness: &mut Harness) -> String {
        let mut out = String::new();
        let manager = harness.manager.as_mut().unwrap();
        while let Some(action) = manager.poll_action() {
            match action {
                VolumeAction::Io { op, io } => {
                    harness.last_op = op.0;
                    let text = match &io {
                        Io::Csi { call, .. } => match call {
                            CsiCall::NodeStageVolume {
                                volume_id,
                                staging_target_path,
                                ..
                            } => format!("NodeStageVolume {volume_id} staging={staging_target_path}"),
                            CsiCall::NodePublishVolume {
                                volume_id,
                                staging_target_path,
                                target_path,
                                readonly,
                                ..
                            } => format!(
                                "NodePublishVolume {volume_id} staging={staging_target_path:?} target={target_path} readonly={readonly}"
                            ),
                            CsiCall::NodeUnpublishVolume { volume_id, target_path } => {
                                format!("NodeUnpublishVolume {volume_id} target={target_path}")
                            }
                            CsiCall::NodeUnstageVolume {
                                volume_id,
                                staging_target_path,
                            } => format!("NodeUnstageVolume {volume_id} staging={staging_target_path}"),
                            other => other.name().to_string(),
                        },
                        other => super::client_harness::describe_io(other),
                    };
                    writeln!(out, "io {op} {text}")
                }
                VolumeAction::Reply { request, outcome } => match outcome {
                    Ok(reply) => writeln!(out, "reply {request} {reply:?}"),
                    Err(error) => writeln!(out, "reply {request} error {:?}: {}", error.kind, error.message),
                },
                VolumeAction::NodeEvent(event) => {
                    let details: Vec<String> = event.details.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    writeln!(out, "node-event {}: {} {{{}}}", event.subsystem, event.message, details.join(" "))
                }
            }
            .unwrap();
        }
        if let Some(at) = manager.poll_timeout() {
            writeln!(
                out,
                "timeout=+{}ms",
                at.saturating_duration_since(harness.now).as_millis()
            )
            .unwrap();
        }
        out
    }

    pub fn run(harness: &mut Harness, directive: &Directive) -> String {
        let args = &directive.args;
        let mut prefix = String::new();
        match directive.command.as_str() {
            "new" => {
                harness.manager = Some(VolumeManager::new(PluginMounts {
                    plugin_id: "hp".into(),
                    socket: "/s/csi/plugins/p1/csi.sock".into(),
                    mount_root: "/s/csi/node/hp".into(),
                    container_mount_point: "/local/csi".into(),
                    requires_stage: args.get("stage").map(String::as_str) == Some("true"),
                }));
            }
            "mount" | "unmount" | "has-mount" => {
                let request = harness.ops.allocate();
                let vol = args.get("vol").cloned().unwrap_or_default();
                let alloc = args.get("alloc").cloned().unwrap_or_default();
                let op = match directive.command.as_str() {
                    "mount" => VolumeOp::Mount {
                        plugin_id: "hp".into(),
                        volume: Box::new(CsiVolume {
                            id: vol,
                            namespace: "default".into(),
                            external_id: args.get("external").cloned().unwrap_or_default(),
                            plugin_id: "hp".into(),
                            ..CsiVolume::default()
                        }),
                        alloc_id: alloc,
                        usage: usage(args),
                        publish_context: BTreeMap::new(),
                    },
                    "unmount" => VolumeOp::Unmount {
                        plugin_id: "hp".into(),
                        namespace: "default".into(),
                        volume_id: vol.clone(),
                        remote_id: args.get("external").cloned().unwrap_or(vol),
                        alloc_id: alloc,
                        usage: usage(args),
                    },
                    _ => VolumeOp::HasMount {
                        plugin_id: "hp".into(),
                        namespace: "default".into(),
                        volume_id: vol,
                        alloc_id: alloc,
                        usage: usage(args),
                        mount: MountInfo {
                            source: args["path"].clone(),
                            is_device: false,
                        },
                    },
                };
                prefix = format!("request {request}\n");
                harness
                    .manager
                    .as_mut()
                    .unwrap()
                    .submit(harness.now, request, op, &mut harness.ops);
            }
            "reply" => {
                let outcome = super::client_harness::reply(directive);
                let op = match args["op"].as_str() {
                    "last" => OpId(harness.last_op),
                    _ => op(directive),
                };
                if !harness
                    .manager
                    .as_mut()
                    .unwrap()
                    .outcome(harness.now, op, outcome, &mut harness.ops)
                {
                    prefix = format!("ignored {op}\n");
                }
            }
            "advance" => {
                let ms: u64 = args["ms"].parse().unwrap();
                harness.now = harness.now + Duration::from_millis(ms);
                harness
                    .manager
                    .as_mut()
                    .unwrap()
                    .handle_timeout(harness.now, &mut harness.ops);
            }
            "users" => {
                let users = harness.manager.as_ref().unwrap().users("default", &args["vol"]);
                return format!("{users:?}\n");
            }
            // After an agent restart: an allocation whose persisted stub says it mounted the
            // volume, handed over by the client before any of them acts.
            "restored-user" => {
                harness
                    .manager
                    .as_mut()
                    .unwrap()
                    .add_user("default", &args["vol"], &usage(args), &args["alloc"]);
            }
            other => panic!("unknown directive {other}"),
        }
        prefix + &drain(harness)
    }
}

#[test]
fn volume_manager() {
    run_dir("volume_manager", volume_harness::new, volume_harness::run);
}

/// The client's link to the servers: `connect`, `tick at=<ms>` (sends what is due),
/// `reply op=N at=<ms> <kind>` with kind `registered ttl=<ms>`, `heartbeat ttl=<ms>`,
/// `unavailable`, `not-found` or `allocs index=N ids=(a,b)`; each prints the requests it sent,
/// what the link learned, and when it wants to run next.
mod link_harness {
    use super::*;
    use drover_core::client::server_link::{LinkEvent, ServerLink};
    use drover_core::client::{ErrorKind, Io, IoError, Reply};
    use drover_core::rpc::{NodeAllocsReply, RpcError, ServerReply, ServerRequest};
    use drover_core::structs::{Allocation, Job, Node};

    #[derive(Default)]
    pub struct Harness {
        link: ServerLink,
        ops: OpIds,
        now: Instant,
    }

    pub fn new() -> Harness {
        Harness::default()
    }

    fn at(args: &BTreeMap<String, String>) -> Instant {
        Instant::from_nanos(args["at"].parse::<u64>().expect("at=<ms>") * 1_000_000)
    }

    fn reply(args: &BTreeMap<String, String>, kind: &str) -> drover_core::client::Outcome {
        let ms = |key: &str| args[key].parse::<u64>().expect("a number of ms");
        match kind {
            "registered" | "heartbeat" => Ok(Reply::Server(ServerReply::Heartbeat {
                index: 1,
                heartbeat_ttl_ms: ms("ttl"),
            })),
            "unavailable" => Ok(Reply::Server(ServerReply::Error(RpcError::unavailable(
                "No cluster leader",
            )))),
            "not-found" => Ok(Reply::Server(ServerReply::Error(RpcError::not_found(
                "node not found: n1",
            )))),
            "timeout" => Err(IoError::new(ErrorKind::Timeout, "timed out")),
            "allocs" => Ok(Reply::Allocs(NodeAllocsReply {
                index: ms("index"),
                allocs: args["ids"]
                    .split(',')
                    .filter(|id| !id.is_empty())
                    .map(|id| Allocation {
                        id: id.to_string(),
                        ..Allocation::default()
                    })
                    .collect(),
                jobs: vec![Job {
                    namespace: Allocation::default().namespace,
                    id: Allocation::default().job_id,
                    ..Job::default()
                }],
                finished_elsewhere: Vec::new(),
                view: ms("index"),
            })),
            other => panic!("unknown reply {other}"),
        }
    }

    fn describe(harness: &mut Harness, event: Option<LinkEvent>) -> String {
        let mut out = String::new();
        match event {
            Some(LinkEvent::Registered { again }) => writeln!(out, "event: registered again={again}").unwrap(),
            Some(LinkEvent::Allocs { allocs, .. }) => {
                let ids: Vec<&str> = allocs.iter().map(|(alloc, _)| alloc.id.as_str()).collect();
                writeln!(out, "event: allocs {}", ids.join(",")).unwrap();
            }
            None => {}
        }
        for (op, io) in harness.link.poll(harness.now, &mut harness.ops) {
            let what = match io {
                Io::Server(ServerRequest::NodeRegister { node }) => format!("register {}", node.id),
                Io::Server(ServerRequest::NodeUpdateStatus { node_id, .. }) => format!("heartbeat {node_id}"),
                Io::AllocSync(request) => format!(
                    "alloc-sync min_index={} wait={}ms",
                    request.min_index, request.max_wait_ms
                ),
                other => format!("{other:?}"),
            };
            writeln!(out, "send: {op} {what}").unwrap();
        }
        let next = match harness.link.poll_timeout() {
            Some(at) => format!("+{}ms", at.saturating_duration_since(harness.now).as_millis()),
            None => "none".into(),
        };
        writeln!(out, "next: {next}").unwrap();
        out
    }

    pub fn run(harness: &mut Harness, directive: &Directive) -> String {
        let args = &directive.args;
        match directive.command.as_str() {
            "connect" => {
                let node = Node {
                    id: "n1".into(),
                    ..Node::default()
                };
                harness.link.connect(harness.now, node);
                describe(harness, None)
            }
            "tick" => {
                harness.now = at(args);
                describe(harness, None)
            }
            "known-as-of" => {
                let index = args["index"].parse().expect("index=<n>");
                harness.link.known_as_of(index);
                describe(harness, None)
            }
            "reply" => {
                harness.now = at(args);
                let kind = args
                    .iter()
                    .find(|(_, value)| value.is_empty())
                    .map(|(key, _)| key.as_str())
                    .expect("a reply kind");
                let op = op(directive);
                assert!(harness.link.owns(op), "{op} is not in flight");
                let event = harness.link.outcome(harness.now, op, reply(args, kind));
                describe(harness, event)
            }
            other => panic!("unknown directive {other}"),
        }
    }
}

#[test]
fn server_link() {
    run_dir("server_link", link_harness::new, link_harness::run);
}

/// Who may make each server request (`rpc::authz`): a state with nodes and allocations, the
/// caller's authority, and `check` of a request given as its JSON.
mod authz_harness {
    use drover_core::acl::policy::PolicyRules;
    use drover_core::acl::{Acl, ResolveError};
    use drover_core::acl::{AclToken, TokenType};
    use drover_core::fsm::acl::AclCommand;
    use drover_core::fsm::{Command, Entry, Response, ServerState};
    use drover_core::rpc::ServerRequest;
    use drover_core::rpc::authz::{Authority, check, check_command};
    use drover_core::structs::{Allocation, Node};

    use super::Directive;

    pub struct Harness {
        state: ServerState,
        index: u64,
        authority: Authority,
    }

    pub fn new() -> Harness {
        Harness {
            state: ServerState::default(),
            index: 0,
            authority: Authority::Open,
        }
    }

    fn apply(h: &mut Harness, command: Command) -> String {
        h.index += 1;
        let entry = Entry {
            at_unix_ms: 1_700_000_000_000 + h.index,
            command,
        };
        match h.state.apply(h.index, &entry) {
            Response::Error(kind, message) => format!("error: {kind:?} {message}"),
            _ => "ok".into(),
        }
    }

    pub fn run(h: &mut Harness, d: &Directive) -> String {
        format!("{}\n", directive(h, d))
    }

    fn directive(h: &mut Harness, d: &Directive) -> String {
        let arg = |key: &str| d.args.get(key).cloned().unwrap_or_default();
        match d.command.as_str() {
            "node" => {
                let node = Node {
                    id: arg("id"),
                    secret_id: arg("secret"),
                    ..Node::default()
                };
                apply(h, Command::NodeRegister { node })
            }
            "alloc" => {
                let alloc = Allocation {
                    id: arg("id"),
                    namespace: arg("namespace"),
                    node_id: arg("node"),
                    ..Allocation::default()
                };
                apply(h, Command::AllocUpsert { allocs: vec![alloc] })
            }
            // `acl off`, `acl management`, `acl unknown`, `acl expired`, or `acl` with the
            // token's policy rules as JSON (the `policy` shorthands expanded as stored).
            "acl" => {
                h.authority = if d.args.contains_key("off") {
                    Authority::Open
                } else if d.args.contains_key("management") {
                    Authority::Acl(Acl::management())
                } else if d.args.contains_key("unknown") {
                    Authority::Unresolved(ResolveError::NotFound)
                } else if d.args.contains_key("expired") {
                    Authority::Unresolved(ResolveError::Expired)
                } else {
                    let mut rules: PolicyRules = serde_json::from_str(&d.input.join("\n")).expect("policy rules JSON");
                    if let Err(error) = rules.validate() {
                        return format!("invalid policy: {error}");
                    }
                    Authority::Acl(Acl::from_policies([&rules]))
                };
                "ok".into()
            }
            // `check register id=.. secret=..`: a node registering (its JSON is long), else the
            // request as JSON on the input lines.
            "check" => {
                let request: ServerRequest = if d.args.contains_key("register") {
                    ServerRequest::NodeRegister {
                        node: Box::new(Node {
                            id: arg("id"),
                            secret_id: arg("secret"),
                            ..Node::default()
                        }),
                    }
                } else {
                    serde_json::from_str(&d.input.join("\n")).expect("request JSON")
                };
                match check(&request, &h.authority, &h.state) {
                    Ok(()) => "allowed".into(),
                    Err(error) => format!("denied: {:?} {}", error.kind, error.message),
                }
            }
            // `token accessor=.. secret=..`: a client token stored in the ACL tables.
            "token" => {
                let token = AclToken {
                    accessor_id: arg("accessor"),
                    secret_id: arg("secret"),
                    name: arg("accessor"),
                    token_type: TokenType::Client,
                    policies: Vec::new(),
                    roles: Vec::new(),
                    global: false,
                    create_time_ms: 0,
                    expiration_time_ms: None,
                    create_index: 0,
                    modify_index: 0,
                };
                apply(h, Command::Acl(AclCommand::TokensUpsert { tokens: vec![token] }))
            }
            // `write [secret=..]`: a direct write forwarded to the leader for a caller whose
            // token is `secret` (resolved as the last `acl`), the command as JSON.
            "write" => {
                let command: Command = serde_json::from_str(&d.input.join("\n")).expect("command JSON");
                match check_command(&command, &h.authority, &arg("secret"), &h.state) {
                    Ok(()) => "allowed".into(),
                    Err(error) => format!("denied: {:?} {}", error.kind, error.message),
                }
            }
            other => panic!("unknown directive {other}"),
        }
    }
}

#[test]
fn rpc_authz() {
    run_dir("rpc_authz", authz_harness::new, authz_harness::run);
}

/// Which server a client-only agent calls (`client::servers`): `servers list=(a,b) [consul]`
/// sets the known list (and whether Consul may be asked); `call answer=(a,b)` makes one call
/// that the named servers would answer, each input line being what one Consul lookup
/// returns (`-` for none); the output is every step the driver was told to take.
mod servers_harness {
    use drover_core::client::servers::{Next, ServerList};

    use super::Directive;

    pub fn new() -> ServerList<String> {
        ServerList::new(Vec::new(), false)
    }

    fn names(text: &str) -> Vec<String> {
        text.split([',', ' '])
            .filter(|name| !name.is_empty() && *name != "-")
            .map(String::from)
            .collect()
    }

    fn describe(list: &ServerList<String>) -> String {
        format!(
            "known: {} preferred={}\n",
            list.servers().join(","),
            list.preferred().map_or("none", String::as_str)
        )
    }

    pub fn run(list: &mut ServerList<String>, directive: &Directive) -> String {
        let args = &directive.args;
        match directive.command.as_str() {
            "servers" => {
                *list = ServerList::new(
                    names(args.get("list").map_or("", String::as_str)),
                    args.contains_key("consul"),
                );
                describe(list)
            }
            "call" => {
                let answering = names(args.get("answer").map_or("", String::as_str));
                let mut lookups = directive.input.iter();
                let mut round = list.round();
                let mut out = String::new();
                loop {
                    match list.next(&mut round) {
                        Next::Call(server) if answering.contains(&server) => {
                            out += &format!("call {server}: answered\n");
                            list.answered(&round);
                            break;
                        }
                        Next::Call(server) => out += &format!("call {server}: unreachable\n"),
                        Next::Discover => {
                            let found = names(lookups.next().map_or("-", String::as_str));
                            out += &format!(
                                "consul lists: {}\n",
                                if found.is_empty() {
                                    "none".to_string()
                                } else {
                                    found.join(",")
                                }
                            );
                            list.discovered(&mut round, found);
                        }
                        Next::Exhausted => {
                            out += "no server reachable\n";
                            break;
                        }
                    }
                }
                out + &describe(list)
            }
            other => panic!("unknown directive {other}"),
        }
    }
}

#[test]
fn servers() {
    run_dir("servers", servers_harness::new, servers_harness::run);
}

/// The servers' controller calls on a client (`client::client::controller_turns`): one at a
/// time per plugin, each given up at its deadline. The client is registered with controller
/// plugins `p1` and `p2`; only the controller actions are shown.
mod turns_harness {
    use super::*;
    use drover_core::client::client::{Client, ClientAction, ClientInput};
    use drover_core::client::registry::{PluginInfo, PluginKind, Registry};
    use drover_core::client::{Io, Reply};
    use drover_core::rpc::{ClientCsiRequest, ControllerDeleteRequest, ServerReply, ServerRequest};
    use drover_core::structs::Node;

    pub struct Harness {
        client: Client,
        now: Instant,
    }

    fn client(no_turn: bool) -> Client {
        let mut settings = crate::client::client_settings(1);
        settings.faults.no_controller_turn = no_turn;
        let mut client = Client::new(settings);
        let mut registry = Registry::default();
        for name in ["p1", "p2"] {
            registry
                .register(PluginInfo {
                    kind: PluginKind::CsiController,
                    name: name.into(),
                    version: "1".into(),
                    provider: "fake".into(),
                    socket_path: format!("/plugins/{name}.sock"),
                    alloc_id: format!("alloc-{name}"),
                    mount_point: String::new(),
                    container_mount_point: String::new(),
                })
                .unwrap();
        }
        let now = Instant::from_nanos(0);
        let node = Node {
            id: "n1".into(),
            ..Node::default()
        };
        client.connect(now, node, registry, Vec::new());
        // The servers take the registration; the registry is restored then.
        let mut register = None;
        while let Some(action) = client.poll_action() {
            if let ClientAction::Io {
                op,
                io: Io::Server(ServerRequest::NodeRegister { .. }),
            } = action
            {
                register = Some(op);
            }
        }
        let op = register.expect("the client registers its node");
        client.handle(
            now,
            ClientInput::Outcome {
                op,
                outcome: Ok(Reply::Server(ServerReply::Heartbeat {
                    index: 1,
                    heartbeat_ttl_ms: 3_600_000,
                })),
            },
        );
        while client.poll_action().is_some() {}
        client
    }

    pub fn new() -> Harness {
        Harness {
            client: client(false),
            now: Instant::from_nanos(0),
        }
    }

    fn describe(harness: &mut Harness) -> String {
        let mut out = String::new();
        while let Some(action) = harness.client.poll_action() {
            match action {
                ClientAction::ControllerStart { req, socket, request } => {
                    writeln!(out, "start: {req} {} on {socket}", request.plugin_id()).unwrap();
                }
                ClientAction::ControllerReply { req, result } => match result {
                    Ok(reply) => writeln!(out, "reply: {req} {reply:?}").unwrap(),
                    Err(error) => writeln!(out, "reply: {req} {:?}: {error}", error.kind).unwrap(),
                },
                ClientAction::ControllerAbandoned { req, error } => {
                    writeln!(out, "abandoned: {req} {:?}: {error}", error.kind).unwrap();
                }
                _ => {}
            }
        }
        if out.is_empty() {
            out.push_str("ok\n");
        }
        out
    }

    pub fn run(harness: &mut Harness, directive: &Directive) -> String {
        let args = &directive.args;
        if let Some(at) = args.get("at") {
            harness.now = Instant::from_nanos(at.parse::<u64>().expect("at=<ms>") * 1_000_000);
        }
        let req = || args["req"].parse::<u64>().expect("req=<n>");
        let now = harness.now;
        match directive.command.as_str() {
            "no-turn" => harness.client = client(true),
            "call" => {
                let request = ClientCsiRequest::ControllerDelete(ControllerDeleteRequest {
                    plugin_id: args["plugin"].clone(),
                    external_id: "v".into(),
                    secrets: Default::default(),
                });
                harness
                    .client
                    .handle(now, ClientInput::ControllerCall { req: req(), request });
            }
            "finished" => harness
                .client
                .handle(now, ClientInput::ControllerFinished { req: req() }),
            "tick" => harness.client.handle_timeout(now),
            other => panic!("unknown directive {other}"),
        }
        describe(harness)
    }
}

#[test]
fn controller_turns() {
    run_dir("controller_turns", turns_harness::new, turns_harness::run);
}

/// A driver's config as a job is admitted (`driverspec::check`): `check driver=<name>` with the
/// config as JSON on the input lines (as the API carries it; HCL reads to the same values).
/// Prints `ok`, or each problem as the job's validation names it.
mod driverspec_harness {
    use std::collections::BTreeMap;

    use drover_core::structs::ConfigValue;

    use super::Directive;

    pub(super) fn value(json: &serde_json::Value) -> ConfigValue {
        match json {
            serde_json::Value::Bool(flag) => ConfigValue::Bool(*flag),
            serde_json::Value::Number(number) => ConfigValue::Int(number.as_i64().expect("an integer")),
            serde_json::Value::String(text) => ConfigValue::String(text.clone()),
            serde_json::Value::Array(items) => ConfigValue::List(items.iter().map(value).collect()),
            serde_json::Value::Object(map) => {
                ConfigValue::Map(map.iter().map(|(key, item)| (key.clone(), value(item))).collect())
            }
            serde_json::Value::Null => panic!("null is not a config value"),
        }
    }

    pub fn run(_: &mut (), directive: &Directive) -> String {
        assert_eq!(directive.command, "check", "unknown directive");
        let json: serde_json::Value = serde_json::from_str(&directive.input.join("\n")).expect("config as JSON");
        let ConfigValue::Map(config) = value(&json) else {
            panic!("the config is an object");
        };
        let config: BTreeMap<String, ConfigValue> = config;
        let problems = drover_core::driverspec::check(&directive.args["driver"], &config);
        if problems.is_empty() {
            return "ok\n".into();
        }
        problems.iter().map(|problem| format!("{problem}\n")).collect()
    }
}

#[test]
fn driverspec() {
    run_dir("driverspec", || (), driverspec_harness::run);
}

/// The container a docker task gets (`client::container_spec`): `spec` with the plugin's
/// settings as arguments (`allow_privileged`, `volumes`, `allow_caps=a,b`), the task's docker
/// config as JSON on the first input line, then `env NAME=value`, `mount host:task[:ro][:propagation]`,
/// `resources cpu=N memory=N memory_max=N node_cpu=N node_cores=N` (the node: 4,000 MHz over 2
/// cores unless given). Prints what the engine is asked for, or the refusal.
mod container_spec_harness {
    use std::collections::BTreeMap;

    use drover_core::client::container_spec::container_spec;
    use drover_core::client::{MountConfig, TaskConfig};
    use drover_core::driverspec::docker::DockerTaskConfig;
    use drover_core::driverspec::docker_plugin::DockerPluginConfig;
    use drover_core::structs::{ConfigValue, Propagation};

    use super::Directive;

    pub fn run(_: &mut (), directive: &Directive) -> String {
        assert_eq!(directive.command, "spec", "unknown directive");
        let mut plugin = DockerPluginConfig {
            allow_privileged: directive.args.contains_key("allow_privileged"),
            volumes_enabled: directive.args.contains_key("volumes"),
            ..DockerPluginConfig::default()
        };
        if let Some(caps) = directive.args.get("allow_caps") {
            plugin.allow_caps = caps.split(',').map(String::from).collect();
        }
        let json: serde_json::Value = serde_json::from_str(&directive.input[0]).expect("config as JSON");
        let ConfigValue::Map(config) = super::driverspec_harness::value(&json) else {
            panic!("the config is an object");
        };
        let config: BTreeMap<String, ConfigValue> = config;
        let docker = DockerTaskConfig::read(&config).expect("a config admission lets through");
        let mut task = TaskConfig {
            alloc_id: "a1".into(),
            task: "web".into(),
            driver: "docker".into(),
            config,
            env: BTreeMap::new(),
            mounts: Vec::new(),
            devices: Vec::new(),
            task_dir: "/data/alloc/a1/web".into(),
            log_dir: "/data/alloc/a1/alloc/logs".into(),
            kill_timeout: std::time::Duration::from_secs(5),
            cpu_mhz: 100,
            memory_mb: 300,
            memory_max_mb: 0,
            logs: Default::default(),
            node_cpu_mhz: 4_000,
            node_cores: 2,
            reserved_cores: Vec::new(),
            network: None,
        };
        for line in &directive.input[1..] {
            let (what, rest) = line.split_once(' ').expect("`<what> <value>`");
            match what {
                "env" => {
                    for pair in rest.split_whitespace() {
                        let (name, value) = pair.split_once('=').expect("NAME=value");
                        task.env.insert(name.into(), value.into());
                    }
                }
                "mount" => {
                    let parts: Vec<&str> = rest.split(':').collect();
                    task.mounts.push(MountConfig {
                        host_path: parts[0].into(),
                        task_path: parts[1].into(),
                        readonly: parts.contains(&"ro"),
                        propagation: parts[2..]
                            .iter()
                            .find_map(|part| Propagation::parse(part))
                            .unwrap_or_default(),
                    });
                }
                "cores" => {
                    task.reserved_cores = rest.split(',').map(|core| core.parse().expect("a core id")).collect();
                }
                // network <id>: the allocation's pause container (bridge mode).
                "network" => {
                    task.network = Some(drover_core::client::AllocNetwork {
                        driver: "docker".into(),
                        id: rest.into(),
                    });
                }
                "resources" => {
                    for pair in rest.split_whitespace() {
                        let (name, value) = pair.split_once('=').expect("name=N");
                        let value: u32 = value.parse().expect("a number");
                        match name {
                            "cpu" => task.cpu_mhz = value,
                            "memory" => task.memory_mb = value,
                            "memory_max" => task.memory_max_mb = value,
                            "node_cpu" => task.node_cpu_mhz = u64::from(value),
                            "node_cores" => task.node_cores = value,
                            other => panic!("unknown resource {other}"),
                        }
                    }
                }
                other => panic!("unknown input line {other:?}"),
            }
        }
        let spec = match container_spec(&task, &docker, &plugin) {
            Ok(spec) => spec,
            Err(refusal) => return format!("refused: {refusal}\n"),
        };
        let mut out = String::new();
        let mut line = |name: &str, value: String| {
            if !value.is_empty() {
                out.push_str(&format!("{name}: {value}\n"));
            }
        };
        line("name", spec.name.clone());
        line("image", spec.image.clone());
        line("entrypoint", spec.entrypoint.join(" "));
        line("cmd", spec.cmd.join(" "));
        line("working_dir", spec.working_dir.clone());
        line("hostname", spec.hostname.clone());
        line("network_mode", spec.network_mode.clone());
        for bind in &spec.binds {
            line("bind", bind.clone());
        }
        for mount in &spec.mounts {
            line(
                "mount",
                format!(
                    "{} {} -> {}{}{}",
                    mount.kind.as_str(),
                    mount.source,
                    mount.target,
                    if mount.readonly { " ro" } else { "" },
                    if mount.propagation.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", mount.propagation)
                    }
                ),
            );
            let options = &mount.options;
            if options != &Default::default() {
                line("  options", format!("{options:?}"));
            }
        }
        for port in &spec.ports {
            line(
                "port",
                format!(
                    "{} {}:{} -> {}",
                    port.label, port.host_ip, port.host_port, port.container_port
                ),
            );
        }
        for var in spec.env.iter().filter(|var| var.starts_with("NOMAD_PORT_")) {
            line("env", var.clone());
        }
        line(
            "resources",
            format!(
                "cpu_shares={} memory={} reservation={}",
                spec.cpu_shares, spec.memory_bytes, spec.memory_reservation_bytes
            ),
        );
        line(
            "privileged",
            if spec.privileged { "true".into() } else { String::new() },
        );
        line("cap_add", spec.cap_add.join(","));
        line("cap_drop", spec.cap_drop.join(","));
        for device in &spec.devices {
            line(
                "device",
                format!(
                    "{} -> {} {}",
                    device.host_path, device.container_path, device.permissions
                ),
            );
        }
        line("dns", spec.dns_servers.join(","));
        line("dns_search", spec.dns_search.join(","));
        line("extra_hosts", spec.extra_hosts.join(","));
        for ulimit in &spec.ulimits {
            line("ulimit", format!("{} {}:{}", ulimit.name, ulimit.soft, ulimit.hard));
        }
        for (name, value) in &spec.sysctls {
            line("sysctl", format!("{name}={value}"));
        }
        line(
            "shm_size",
            spec.shm_size.map(|size| size.to_string()).unwrap_or_default(),
        );
        line("cpuset_cpus", spec.cpuset_cpus.clone());
        if let (Some(period), Some(quota)) = (spec.cpu_period, spec.cpu_quota) {
            line("cpu_limit", format!("period={period} quota={quota}"));
        }
        line(
            "pids_limit",
            spec.pids_limit.map(|limit| limit.to_string()).unwrap_or_default(),
        );
        line("security_opt", spec.security_opt.join(","));
        line("group_add", spec.group_add.join(","));
        for (name, mode) in [
            ("ipc_mode", &spec.ipc_mode),
            ("pid_mode", &spec.pid_mode),
            ("uts_mode", &spec.uts_mode),
            ("userns_mode", &spec.userns_mode),
            ("volume_driver", &spec.volume_driver),
        ] {
            line(name, mode.clone());
        }
        for (name, value) in &spec.storage_opt {
            line("storage_opt", format!("{name}={value}"));
        }
        if let Some((kind, options)) = &spec.log_driver {
            let options: Vec<String> = options.iter().map(|(name, value)| format!("{name}={value}")).collect();
            line("log_driver", format!("{kind} {}", options.join(",")).trim().to_string());
        }
        let flags: Vec<&str> = [
            ("init", spec.init),
            ("tty", spec.tty),
            ("interactive", spec.open_stdin),
            ("readonly_rootfs", spec.readonly_rootfs),
            ("healthcheck_disabled", spec.healthcheck_disabled),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| name)
        .collect();
        line("flags", flags.join(","));
        for (name, value) in &spec.labels {
            line("label", format!("{name}={value}"));
        }
        out
    }
}

#[test]
fn container_spec() {
    run_dir("container_spec", || (), container_spec_harness::run);
}
