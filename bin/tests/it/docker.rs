//! The `docker` driver against a real Docker Engine: the one `scripts/test.sh` starts (through
//! `scripts/docker-engine.sh`) and names in `DROVER_TEST_DOCKER_HOST`, with the
//! `drover-busybox:local` image imported. A container task runs, writes its logs through the
//! same rotation as any task, carries Nomad's labels and is removed when it stops; a client
//! killed with `kill -9` reattaches to its running container; an OOM kill and bad input are
//! reported as task events, and nothing is left behind.

use crate::support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{Agent, dev_spec, get_json, wait_for};

const IMAGE: &str = "drover-busybox:local";

/// The Engine the tests use. Not skipped when missing: the test says how to start one.
fn engine() -> String {
    std::env::var("DROVER_TEST_DOCKER_HOST").unwrap_or_else(|_| {
        panic!(
            "DROVER_TEST_DOCKER_HOST is not set: start an Engine with \
             `scripts/docker-engine.sh start target/docker-engine` and export what it prints \
             (scripts/test.sh does both)"
        )
    })
}

fn docker(args: &[&str]) -> String {
    let output = Command::new("docker")
        .arg("-H")
        .arg(engine())
        .args(args)
        .output()
        .expect("the docker CLI runs");
    assert!(output.status.success(), "docker {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Whether the Engine is podman's compatible API (`scripts/podman-engine.sh`): where it
/// answers differently from dockerd, the tests check podman's answer (docs/podman.md lists
/// each difference).
fn podman() -> bool {
    docker(&["version", "--format", "{{json .Server.Components}}"]).contains("Podman Engine")
}

/// A container as podman's own API describes it (what its compatible inspect leaves out).
fn libpod_inspect(container: &str) -> Value {
    let socket = engine();
    let socket = socket.trim_start_matches("unix://");
    let output = Command::new("curl")
        .args(["-sf", "--unix-socket", socket])
        .arg(format!("http://podman/v4.0.0/libpod/containers/{container}/json"))
        .output()
        .expect("curl runs");
    assert!(output.status.success(), "libpod inspect {container}: {output:?}");
    serde_json::from_slice(&output.stdout).expect("libpod's inspect is JSON")
}

/// The containers labelled with `alloc`, running or not.
fn containers_of(alloc: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        &format!("label=com.hashicorp.nomad.alloc_id={alloc}"),
    ])
    .lines()
    .map(String::from)
    .collect()
}

/// An `agent -dev` using the test Engine (with `extra` in its docker plugin config), once its
/// docker driver is healthy.
fn start_dev(root: &std::path::Path, extra: &str) -> Agent {
    start_dev_at(root, &engine(), extra)
}

/// [`start_dev`] with the Engine reached at `endpoint`.
fn start_dev_at(root: &std::path::Path, endpoint: &str, extra: &str) -> Agent {
    start_dev_configured(root, endpoint, extra, "")
}

/// [`start_dev_at`] with `more` (whole blocks) in the agent's configuration too.
fn start_dev_configured(root: &std::path::Path, endpoint: &str, extra: &str, more: &str) -> Agent {
    let (spec, mut args) = dev_spec(root, "dev");
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let config = root.join("docker.hcl");
    std::fs::write(
        &config,
        format!("plugin \"docker\" {{\n  config {{\n    endpoint = \"{endpoint}\"\n{extra}\n  }}\n}}\n{more}"),
    )
    .unwrap();
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(spec, args);
    wait_for_docker(&agent);
    agent
}

fn wait_for_docker(agent: &Agent) {
    let port = agent.spec.http;
    wait_for(Duration::from_secs(60), || {
        let nodes = get_json(port, "/v1/nodes")?;
        let node = nodes.as_array()?.first()?.clone();
        (node["Status"] == "ready" && node["Drivers"]["docker"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the dev node is ready with a healthy docker driver:\n{}", agent.log()));
}

fn run_job(agent: &Agent, root: &std::path::Path, name: &str, spec: &str) {
    let file = root.join(format!("{name}.hcl"));
    std::fs::write(&file, spec).unwrap();
    let run = Command::new(support::AGENT)
        .args(["job", "run", "-detach", file.to_str().unwrap()])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{}", agent.spec.http))
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}\n{}", agent.log());
}

fn stop_job(agent: &Agent, job: &str) {
    let stop = support::cli(agent.spec.http, &["job", "stop", job]);
    assert!(stop.status.success(), "{stop:?}\n{}", agent.log());
}

/// The job's first allocation once `ready` says it is.
fn wait_alloc(agent: &Agent, job: &str, ready: impl Fn(&Value) -> bool, what: &str) -> Value {
    wait_for(Duration::from_secs(60), || {
        let allocs = get_json(agent.spec.http, &format!("/v1/job/{job}/allocations"))?;
        let alloc = allocs.as_array()?.first()?.clone();
        ready(&alloc).then_some(alloc)
    })
    .unwrap_or_else(|| {
        let allocs = get_json(agent.spec.http, &format!("/v1/job/{job}/allocations"));
        panic!("{what}: {allocs:#?}\n{}", agent.log())
    })
}

fn events(alloc: &Value, task: &str) -> Vec<String> {
    alloc["TaskStates"][task]["Events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|event| {
                    format!(
                        "{}: {}",
                        event["Type"].as_str().unwrap_or(""),
                        event["DisplayMessage"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn logs(agent: &Agent, alloc: &str, task: &str, stream: &str) -> String {
    let mut args = vec!["alloc", "logs"];
    if stream == "stderr" {
        args.push("-stderr");
    }
    args.extend([alloc, task]);
    let output = support::cli(agent.spec.http, &args);
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn service_job(name: &str) -> String {
    format!(
        r#"job "{name}" {{
  group "g" {{
    task "web" {{
      driver = "docker"
      config {{
        image        = "{IMAGE}"
        network_mode = "none"
        command      = "sh"
        args         = ["-c", "echo hello from $NOMAD_TASK_NAME in $NOMAD_ALLOC_DIR; echo oops >&2; trap 'echo bye; exit 0' TERM; while true; do sleep 0.1; done"]
        labels {{
          team = "web"
        }}
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"#
    )
}

#[test]
fn a_container_task_runs_logs_carries_its_labels_and_is_removed_when_stopped() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    run_job(&agent, root.path(), "web", &service_job("web"));
    let alloc = wait_alloc(
        &agent,
        "web",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let stdout = wait_for(Duration::from_secs(20), || {
        let text = logs(&agent, &id, "web", "stdout");
        text.contains("hello").then_some(text)
    })
    .unwrap_or_else(|| panic!("the task's stdout reaches its log:\n{}", agent.log()));
    assert_eq!(stdout, "hello from web in /alloc\n");
    assert_eq!(logs(&agent, &id, "web", "stderr"), "oops\n");

    let containers = containers_of(&id);
    assert_eq!(containers.len(), 1, "one container for the task");
    let labels: Value = serde_json::from_str(&docker(&[
        "inspect",
        "--format",
        "{{json .Config.Labels}}",
        &containers[0],
    ]))
    .unwrap();
    assert_eq!(labels["com.hashicorp.nomad.task_name"], "web");
    assert_eq!(labels["team"], "web");
    let binds = docker(&["inspect", "--format", "{{json .HostConfig.Binds}}", &containers[0]]);
    // podman echoes each bind with the options it applied (`:/alloc:rw,rprivate,rbind`).
    let bound = |target: &str| binds.contains(&format!(":{target}\"")) || binds.contains(&format!(":{target}:"));
    assert!(bound("/alloc") && bound("/local") && bound("/secrets"), "{binds}");

    stop_job(&agent, "web");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the stopped task's container is removed:\n{}", agent.log()));
    let alloc = wait_alloc(
        &agent,
        "web",
        |alloc| alloc["TaskStates"]["web"]["State"] == "dead",
        "the task is dead",
    );
    let stdout = logs(&agent, &id, "web", "stdout");
    assert!(
        stdout.ends_with("bye\n"),
        "the container got its SIGTERM and said so: {stdout:?} {:?}\n{}",
        events(&alloc, "web"),
        agent.log()
    );
}

/// `alloc exec` runs in the task's container through the Engine's exec API: its stdout and
/// stderr apart, its exit code passed on, and what the operator types reaching its stdin.
#[test]
fn alloc_exec_runs_in_the_container_through_the_engine() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    run_job(&agent, root.path(), "shell", &service_job("shell"));
    let alloc = wait_alloc(
        &agent,
        "shell",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let container = containers_of(&id).pop().expect("the task's container");
    let hostname = docker(&["inspect", "--format", "{{.Config.Hostname}}", &container]);

    let out = support::cli(
        agent.spec.http,
        &[
            "alloc",
            "exec",
            "-i=false",
            &id,
            "sh",
            "-c",
            "echo out $NOMAD_TASK_NAME; hostname; echo err >&2; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{}", agent.log());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("out web\n{}\n", hostname.trim()),
        "ran in the container, with the task's environment"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    let mut cat = Command::new(support::AGENT)
        .args(["alloc", "exec", &id, "sh", "-c", "read line; echo got $line"])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{}", agent.spec.http))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = cat.stdin.take().unwrap();
        stdin.write_all(b"typed\n").unwrap();
    }
    let out = cat.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}\n{}", agent.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got typed\n");

    stop_job(&agent, "shell");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the stopped task's container is removed:\n{}", agent.log()));
}

/// The keys Nomad's driver passes straight to the Engine reach it (read back from the
/// container the Engine made), and a key this driver cannot honour is refused by name at
/// `job run`, not taken and ignored.
#[test]
fn engine_settings_reach_the_container_and_an_unsupported_key_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    run_job(
        &agent,
        root.path(),
        "tuned",
        &format!(
            r#"job "tuned" {{
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image           = "{IMAGE}"
        network_mode    = "none"
        command         = "sh"
        args            = ["-c", "touch /root-is-writable 2>/dev/null || echo read-only; while true; do sleep 0.1; done"]
        cpuset_cpus     = "0"
        cpu_hard_limit  = true
        cpu_cfs_period  = 50000
        pids_limit      = 32
        readonly_rootfs = true
        security_opt    = ["no-new-privileges"]
        group_add       = ["123"]
        healthchecks {{
          disable = true
        }}
        mount {{
          type   = "tmpfs"
          target = "/scratch"
          tmpfs_options {{
            size = 1048576
          }}
        }}
        logging {{
          type = "json-file"
          config {{
            max-size = "10m"
          }}
        }}
      }}
      resources {{
        cpu    = 500
        memory = 32
      }}
    }}
  }}
}}
"#
        ),
    );
    let alloc = wait_alloc(
        &agent,
        "tuned",
        |alloc| alloc["TaskStates"]["t"]["State"] == "running",
        "the tuned container runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let container = containers_of(&id).pop().expect("the task's container");
    let host: Value =
        serde_json::from_str(&docker(&["inspect", "--format", "{{json .HostConfig}}", &container])).unwrap();
    assert_eq!(host["CpusetCpus"], "0");
    // cpu_hard_limit: 500 MHz of the node's fingerprinted MHz, of each 50 ms period on each of
    // its cores (Nomad's formula; 1 ms at least).
    let node_id = alloc["NodeID"].as_str().unwrap();
    let node = get_json(agent.spec.http, &format!("/v1/node/{node_id}")).expect("the node");
    let node_mhz = node["NodeResources"]["Cpu"]["CpuShares"].as_i64().unwrap();
    let cores: i64 = node["Attributes"]["cpu.numcores"].as_str().unwrap().parse().unwrap();
    assert_eq!(host["CpuPeriod"], 50_000);
    assert_eq!(
        host["CpuQuota"],
        (500 * 50_000 / node_mhz * cores).max(1_000),
        "{node:#}"
    );
    assert_eq!(host["CpuShares"], 500);
    assert_eq!(host["PidsLimit"], 32);
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["SecurityOpt"], serde_json::json!(["no-new-privileges"]));
    assert_eq!(host["GroupAdd"], serde_json::json!(["123"]));
    assert_eq!(host["LogConfig"]["Type"], "json-file");
    if podman() {
        // podman keeps the size limit as its own `Size` and answers `Config: null`.
        assert_eq!(libpod_inspect(&container)["HostConfig"]["LogConfig"]["Size"], "10MB");
    } else {
        assert_eq!(host["LogConfig"]["Config"]["max-size"], "10m");
    }
    if podman() {
        // podman answers a tmpfs mount as `Tmpfs` (target: options), not in `Mounts`.
        let options = host["Tmpfs"]["/scratch"].as_str().unwrap_or_default().to_string();
        assert!(
            options.contains("size=1048576") && options.contains("mode=1777"),
            "{host:#}"
        );
    } else {
        assert_eq!(host["Mounts"][0]["Target"], "/scratch");
        assert_eq!(host["Mounts"][0]["TmpfsOptions"]["SizeBytes"], 1048576);
        assert_eq!(host["Mounts"][0]["TmpfsOptions"]["Mode"], 0o1777);
    }
    let health = docker(&["inspect", "--format", "{{json .Config.Healthcheck}}", &container]);
    assert!(health.contains("NONE"), "{health}");
    let said = wait_for(Duration::from_secs(20), || {
        let text = logs(&agent, &id, "t", "stdout");
        text.contains("read-only").then_some(text)
    })
    .unwrap_or_else(|| panic!("the read-only root refuses a write:\n{}", agent.log()));
    assert_eq!(said, "read-only\n");
    stop_job(&agent, "tuned");

    let file = root.path().join("windows.hcl");
    std::fs::write(
        &file,
        format!(
            "job \"win\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"docker\"\n      config {{\n        image     = \"{IMAGE}\"\n        isolation = \"process\"\n      }}\n    }}\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let refused = support::cli(agent.spec.http, &["job", "run", "-detach", file.to_str().unwrap()]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "{text}");
    assert!(
        text.contains("\"isolation\" is not supported by this agent"),
        "named in the refusal: {text}"
    );
}

/// An image of the project's own CSI plugin: busybox, the plugin binary and the libraries it
/// links (read from `ldd`), imported as `drover-csi-fake:local`. No registry, no Dockerfile.
fn plugin_image(root: &std::path::Path) -> &'static str {
    const PLUGIN_IMAGE: &str = "drover-csi-fake:local";
    let plugin = env!("CARGO_BIN_EXE_drover-csi-fake");
    let rootfs = root.join("plugin-rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "mkdir", "cat", "sleep", "echo", "ls"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::copy(plugin, rootfs.join("drover-csi-fake")).unwrap();
    let ldd = Command::new("ldd").arg(plugin).output().expect("ldd runs");
    for library in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
    {
        let inside = rootfs.join(library.trim_start_matches('/'));
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::copy(library, inside).unwrap();
    }
    let archive = root.join("plugin-rootfs.tar");
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success(), "tar of the plugin's rootfs");
    let import = Command::new("docker")
        .arg("-H")
        .arg(engine())
        .args(["import", archive.to_str().unwrap(), PLUGIN_IMAGE])
        .output()
        .unwrap();
    assert!(import.status.success(), "{import:?}");
    PLUGIN_IMAGE
}

/// Nomad's canonical CSI jobs with containers: the plugin a monolith container
/// (`csi_plugin { mount_dir = "/csi" }`) with the capability to mount (`cap_add =
/// ["sys_admin"]`: Nomad's examples say `privileged = true`, which no container can be on a
/// host whose capability bounding set lacks one, as these test machines' lacks
/// `CAP_SYS_RESOURCE`: the Engine's own `docker run --privileged` fails there too), a volume
/// created through it, and a consumer container that writes through the volume: the file
/// lands in the plugin's storage on the host. The client's CSI directory is not a shared
/// mount here (`/` is private), which the Engine refuses for the plugin's `rshared` binds
/// until the driver shares it. After both jobs stop, no container and no mount under the
/// agent's data dir is left.
#[test]
fn a_csi_plugin_container_serves_a_volume_a_consumer_container_writes_through() {
    let root = tempfile::tempdir().unwrap();
    let image = plugin_image(root.path());
    let agent = start_dev(
        root.path(),
        "allow_caps = [\"all\"]\n    volumes {\n      enabled = true\n    }",
    );
    let port = agent.spec.http;
    let state = root.path().join("plugin-state");
    std::fs::create_dir_all(&state).unwrap();
    run_job(
        &agent,
        root.path(),
        "plugin",
        &format!(
            r#"job "plugin" {{
  type = "system"
  group "nodes" {{
    task "plugin" {{
      driver = "docker"
      config {{
        image      = "{image}"
        command    = "/drover-csi-fake"
        args       = ["--state-dir=/state", "--node-id=node-1", "--stage-unstage"]
        cap_add    = ["sys_admin"]
        volumes    = ["{}:/state"]
      }}
      csi_plugin {{
        id        = "fake"
        type      = "monolith"
        mount_dir = "/csi"
      }}
      resources {{
        cpu    = 50
        memory = 64
      }}
    }}
  }}
}}
"#,
            state.display()
        ),
    );
    wait_for(Duration::from_secs(60), || {
        let plugin = get_json(port, "/v1/plugin/csi/fake")?;
        (plugin["ControllersHealthy"] == 1 && plugin["NodesHealthy"] == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("the plugin container is healthy:\n{}", agent.log()));

    let spec = root.path().join("vol.hcl");
    std::fs::write(
        &spec,
        r#"id        = "vol0"
name      = "vol0"
type      = "csi"
plugin_id = "fake"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#,
    )
    .unwrap();
    let created = support::cli(port, &["volume", "create", spec.to_str().unwrap()]);
    assert!(created.status.success(), "{created:?}\n{}", agent.log());

    run_job(
        &agent,
        root.path(),
        "writer",
        &format!(
            r#"job "writer" {{
  group "g" {{
    volume "data" {{
      type            = "csi"
      source          = "vol0"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }}
    task "w" {{
      driver = "docker"
      config {{
        image        = "{IMAGE}"
        network_mode = "none"
        command      = "sh"
        args         = ["-c", "echo written by $NOMAD_ALLOC_ID > /data/file; while true; do sleep 0.1; done"]
      }}
      volume_mount {{
        volume      = "data"
        destination = "/data"
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#
        ),
    );
    let alloc = wait_alloc(
        &agent,
        "writer",
        |alloc| alloc["TaskStates"]["w"]["State"] == "running",
        "the consumer container runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let written = wait_for(Duration::from_secs(20), || {
        let found = walk(&state).into_iter().find(|path| path.ends_with("file"))?;
        std::fs::read_to_string(found).ok()
    })
    .unwrap_or_else(|| panic!("the file reaches the plugin's storage:\n{}", agent.log()));
    assert_eq!(written, format!("written by {id}\n"));

    stop_job(&agent, "writer");
    wait_for(Duration::from_secs(60), || {
        let volume = get_json(port, "/v1/volume/csi/vol0")?;
        (volume["WriteAllocs"].as_object()?.is_empty() && containers_of(&id).is_empty()).then_some(())
    })
    .unwrap_or_else(|| panic!("the claim is released and the container gone:\n{}", agent.log()));
    stop_job(&agent, "plugin");
    let data_dir = agent.spec.data_dir.display().to_string();
    wait_for(Duration::from_secs(60), || {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        (!mounts.contains(&data_dir)).then_some(())
    })
    .unwrap_or_else(|| panic!("no mount is left under {data_dir}:\n{}", agent.log()));
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A batch job whose one task is refused or fails once, with no restart.
/// A registry on this host that has no image at all: `/v2/` answers as a registry does, every
/// manifest is unknown (404), so a pull fails as it would for a misspelt image, without
/// reaching the internet. The Engine pulls from `localhost` registries over plain HTTP. Its
/// thread ends with the test process.
fn empty_registry() -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            // The rest of the request head.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
                line.clear();
            }
            let (status, body) = if first.starts_with("GET /v2/ ") {
                ("200 OK", "{}")
            } else {
                (
                    "404 Not Found",
                    r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                )
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nDocker-Distribution-API-Version: registry/2.0\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("localhost:{port}")
}

fn failing_job(name: &str, config: &str, memory: u32, attempts: u32) -> String {
    format!(
        r#"job "{name}" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = {attempts}
      delay    = "1s"
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    task "t" {{
      driver = "docker"
      config {{
{config}
      }}
      resources {{
        memory = {memory}
      }}
    }}
  }}
}}
"#
    )
}

#[test]
fn bad_input_and_an_oom_kill_are_task_events_and_leave_no_container() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    let registry = empty_registry();
    let cases = [
        (
            "privileged",
            format!("image = \"{IMAGE}\"\nprivileged = true"),
            16,
            "Docker privileged mode is disabled on this Nomad agent",
        ),
        (
            "hostpath",
            format!("image = \"{IMAGE}\"\nvolumes = [\"/etc:/host-etc\"]"),
            16,
            "volumes are not enabled; cannot mount host paths: \"/etc:/host-etc\"",
        ),
        (
            "noimage",
            format!("image = \"{registry}/drover-no-such-image:never\""),
            16,
            "Failed to pull",
        ),
        (
            "oom",
            format!(
                "image = \"{IMAGE}\"\nnetwork_mode = \"none\"\ncommand = \"sh\"\nargs = [\"-c\", \"x=$(head -c 134217728 /dev/zero | tr '\\\\0' a); echo survived\"]"
            ),
            16,
            "OOM Killed",
        ),
    ];
    // The policy allows two restarts: a refused configuration and a missing image fail the
    // task at once ("Error was unrecoverable"), an OOM kill is tried again.
    for (name, config, memory, _) in &cases {
        run_job(&agent, root.path(), name, &failing_job(name, config, *memory, 2));
    }
    // podman on cgroup v1 does not see the kernel's OOM kill (its inspect answers
    // `OOMKilled: false`): the kill reads as what it is to podman, exit 137 (docs/podman.md).
    let podman = podman();
    for (name, _, _, expected) in &cases {
        let expected = if podman && *name == "oom" {
            "Terminated: Exit Code: 137"
        } else {
            expected
        };
        let alloc = wait_alloc(
            &agent,
            name,
            |alloc| alloc["ClientStatus"] == "failed",
            &format!("the {name} task fails"),
        );
        let events = events(&alloc, "t");
        assert!(
            events.iter().any(|event| event.contains(expected)),
            "{name}: an event says {expected:?}: {events:#?}"
        );
        let last = if *name == "oom" {
            "Exceeded allowed attempts 2"
        } else {
            "Error was unrecoverable"
        };
        assert!(
            events.iter().any(|event| event.contains(last)),
            "{name}: an event says {last:?}: {events:#?}"
        );
        let id = alloc["ID"].as_str().unwrap();
        wait_for(Duration::from_secs(20), || containers_of(id).is_empty().then_some(()))
            .unwrap_or_else(|| panic!("{name}: no container is left: {:?}", containers_of(id)));
    }
}

#[test]
fn a_client_killed_with_kill_9_reattaches_to_its_running_container() {
    let root = tempfile::tempdir().unwrap();
    let mut agent = start_dev(root.path(), "");
    run_job(&agent, root.path(), "keep", &service_job("keep"));
    let alloc = wait_alloc(
        &agent,
        "keep",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let before = containers_of(&id);
    assert_eq!(before.len(), 1);
    wait_for(Duration::from_secs(20), || {
        logs(&agent, &id, "web", "stdout").contains("hello").then_some(())
    })
    .expect("the first output is logged");

    agent.kill();
    assert_eq!(
        docker(&["inspect", "--format", "{{.State.Running}}", &before[0]]),
        "true",
        "the container outlives the agent"
    );
    agent.restart();
    wait_for_docker(&agent);
    let after = wait_alloc(
        &agent,
        "keep",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running" && alloc["ClientStatus"] == "running",
        "the task runs after the restart",
    );
    assert_eq!(after["TaskStates"]["web"]["Restarts"], 0, "reattached, not restarted");
    assert_eq!(containers_of(&id), before, "the same container, no second one");

    stop_job(&agent, "keep");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the reattached container is stopped and removed:\n{}", agent.log()));
    assert!(
        logs(&agent, &id, "web", "stdout").ends_with("bye\n"),
        "the reattached container's output is still followed"
    );
}

#[test]
fn a_labelled_container_no_task_owns_is_removed_and_nothing_else_is_touched() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(
        root.path(),
        "    gc {\n      dangling_containers {\n        period         = \"1s\"\n        creation_grace = \"1s\"\n      }\n    }",
    );
    run_job(&agent, root.path(), "owned", &service_job("owned"));
    let alloc = wait_alloc(
        &agent,
        "owned",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let owned = containers_of(alloc["ID"].as_str().unwrap());
    // A container Drover's labels say belongs to an allocation this client does not have (as a
    // client killed between creating and recording it leaves), and one that is not Drover's.
    let orphan_alloc = format!("orphan-{}", std::process::id());
    let orphan = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        &format!("com.hashicorp.nomad.alloc_id={orphan_alloc}"),
        "--label",
        "com.hashicorp.nomad.task_name=web",
        "--label",
        &format!("io.drover.client={}", agent.spec.data_dir.join("alloc").display()),
        IMAGE,
        "sleep",
        "600",
    ]);
    let foreign = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        "owner=someone-else",
        IMAGE,
        "sleep",
        "600",
    ]);
    // Another client's on the same Engine (as the other tests' agents are).
    let other_client = docker(&[
        "run",
        "-d",
        "--network",
        "none",
        "--label",
        &format!("com.hashicorp.nomad.alloc_id={orphan_alloc}-elsewhere"),
        "--label",
        "io.drover.client=/some/other/client/alloc",
        IMAGE,
        "sleep",
        "600",
    ]);
    wait_for(Duration::from_secs(30), || {
        containers_of(&orphan_alloc).is_empty().then_some(())
    })
    .unwrap_or_else(|| panic!("the orphan {orphan} is removed:\n{}", agent.log()));
    for (kept, what) in [
        (&foreign, "without Drover's labels"),
        (&other_client, "of another client"),
    ] {
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.Running}}", kept]),
            "true",
            "a container {what} is never touched"
        );
        docker(&["rm", "-f", kept]);
    }
    assert_eq!(
        containers_of(alloc["ID"].as_str().unwrap()),
        owned,
        "the task's own container stays"
    );
}

/// `gc { image image_delay }`: an image no task has used for the delay is removed, and only
/// that one (the test image it was tagged from stays, as does any image a task still runs).
#[test]
fn an_image_no_task_used_for_image_delay_is_removed() {
    let root = tempfile::tempdir().unwrap();
    let tag = format!("drover-gc-test:{}", std::process::id());
    docker(&["tag", IMAGE, &tag]);
    let agent = start_dev(root.path(), "    gc {\n      image_delay = \"2s\"\n    }");
    let job = service_job("gc").replace(IMAGE, &tag);
    run_job(&agent, root.path(), "gc", &job);
    wait_alloc(
        &agent,
        "gc",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let exists = |image: &str| {
        Command::new("docker")
            .args(["-H", &engine(), "image", "inspect", image])
            .output()
            .expect("the docker CLI runs")
            .status
            .success()
    };
    assert!(exists(&tag), "the task's image is there while it runs");
    stop_job(&agent, "gc");
    wait_for(Duration::from_secs(60), || (!exists(&tag)).then_some(()))
        .unwrap_or_else(|| panic!("{tag} is removed after image_delay:\n{}", agent.log()));
    assert!(exists(IMAGE), "the image it was tagged from stays");
}

/// A web service on the default (bridge) network with a dynamic port, as Nomad's example job
/// has it: the port is published on the node's address and the container's server answers
/// there; a static port some other process holds is a clear task event and no container is
/// left.
fn web_job(name: &str, port: &str) -> String {
    format!(
        r#"job "{name}" {{
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    network {{
      port "http" {{
        {port}
        to = 8080
      }}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        ports   = ["http"]
        command = "httpd"
        args    = ["-f", "-p", "8080", "-h", "/etc"]
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"#
    )
}

#[test]
fn a_web_service_answers_on_its_dynamic_port_and_a_taken_port_is_a_clear_event() {
    use std::io::{Read, Write};
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    run_job(&agent, root.path(), "www", &web_job("www", ""));
    let stub = wait_alloc(
        &agent,
        "www",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the web container runs",
    );
    let id = stub["ID"].as_str().unwrap().to_string();
    let alloc = get_json(agent.spec.http, &format!("/v1/allocation/{id}")).unwrap();
    let given = &alloc["AllocatedResources"]["Shared"]["Ports"][0];
    assert_eq!(given["Label"], "http", "{alloc:#}");
    assert_eq!(given["To"], 8080, "{alloc:#}");
    let (host, port) = (
        given["HostIP"].as_str().unwrap().to_string(),
        given["Value"].as_u64().unwrap(),
    );
    let answer = wait_for(Duration::from_secs(30), || {
        let mut stream = std::net::TcpStream::connect((host.as_str(), port as u16)).ok()?;
        write!(stream, "GET /passwd HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.lines().next()?.contains(" 200 ").then_some(answer)
    })
    .unwrap_or_else(|| {
        panic!(
            "httpd answers on {host}:{port}: {}\n{}",
            docker(&[
                "ps",
                "-a",
                "--filter",
                &format!("label=com.hashicorp.nomad.alloc_id={id}"),
                "--format",
                "{{.Ports}} {{.Status}} {{.Networks}}"
            ]),
            agent.log()
        )
    });
    assert!(answer.contains("root:x:0:0"), "{answer}");
    stop_job(&agent, "www");
    wait_for(Duration::from_secs(20), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("no container is left after job stop: {:?}", containers_of(&id)));
    wait_for(Duration::from_secs(20), || {
        std::net::TcpStream::connect((host.as_str(), port as u16))
            .is_err()
            .then_some(())
    })
    .unwrap_or_else(|| panic!("nothing listens on {host}:{port} once the job stopped"));

    // A static port another process holds.
    let holder = std::net::TcpListener::bind((host.as_str(), 0)).unwrap();
    let taken = holder.local_addr().unwrap().port();
    run_job(
        &agent,
        root.path(),
        "taken",
        &web_job("taken", &format!("static = {taken}")),
    );
    let stub = wait_alloc(
        &agent,
        "taken",
        |alloc| alloc["ClientStatus"] == "failed",
        "the task on a taken port fails",
    );
    let events = events(&stub, "web");
    assert!(
        events
            .iter()
            .any(|event| event.starts_with("Driver Failure: ") && event.contains(&taken.to_string())),
        "an event names the taken port {taken}: {events:#?}"
    );
    let id = stub["ID"].as_str().unwrap();
    wait_for(Duration::from_secs(20), || containers_of(id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("no container is left: {:?}", containers_of(id)));
    drop(holder);
}

/// The test Engine's socket, forwarded from `path` while the proxy is up: taking it down is a
/// daemon that went away, as far as a client using `path` can tell.
struct SocketProxy {
    path: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accepting: Option<std::thread::JoinHandle<()>>,
}

impl SocketProxy {
    fn up(path: &std::path::Path) -> SocketProxy {
        use std::os::unix::net::{UnixListener, UnixStream};
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let engine_socket = engine().trim_start_matches("unix://").to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let accepting = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(daemon) = UnixStream::connect(&engine_socket) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), daemon.try_clone().unwrap()),
                    (daemon, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        SocketProxy {
            path: path.to_path_buf(),
            stop,
            accepting: Some(accepting),
        }
    }

    /// No new connection reaches the daemon (the socket is gone).
    fn down(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(accepting) = self.accepting.take() {
            accepting.join().unwrap();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for SocketProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A daemon that goes away makes the driver unhealthy on the node with Nomad's text, and a
/// docker job is then not placed there ("missing drivers"); when the daemon answers again the
/// driver is healthy and the waiting job is placed.
#[test]
fn a_daemon_that_goes_away_makes_the_driver_unhealthy_until_it_comes_back() {
    let root = tempfile::tempdir().unwrap();
    let socket = root.path().join("proxied-docker.sock");
    let proxy = SocketProxy::up(&socket);
    let agent = start_dev_at(root.path(), &format!("unix://{}", socket.display()), "");
    let docker_driver = |agent: &Agent| -> Option<Value> {
        let nodes = get_json(agent.spec.http, "/v1/nodes")?;
        let id = nodes.as_array()?.first()?["ID"].as_str()?.to_string();
        let node = get_json(agent.spec.http, &format!("/v1/node/{id}"))?;
        Some(node["Drivers"]["docker"].clone())
    };
    proxy.down();
    // Drivers are fingerprinted every 30 s, as Nomad's docker driver is.
    let driver = wait_for(Duration::from_secs(75), || {
        docker_driver(&agent).filter(|driver| driver["Healthy"] == false)
    })
    .unwrap_or_else(|| {
        panic!(
            "the driver turns unhealthy: {:?}\n{}",
            docker_driver(&agent),
            agent.log()
        )
    });
    assert_eq!(
        driver["HealthDescription"], "Failed to connect to docker daemon",
        "{driver:#}"
    );
    assert_eq!(driver["Detected"], true, "{driver:#}");

    run_job(&agent, root.path(), "later", &service_job("later"));
    let filtered = wait_for(Duration::from_secs(30), || {
        let evals = get_json(agent.spec.http, "/v1/job/later/evaluations")?;
        evals
            .as_array()?
            .iter()
            .find_map(|eval| eval["FailedTGAllocs"]["g"]["ConstraintFiltered"]["missing drivers"].as_u64())
    })
    .unwrap_or_else(|| {
        panic!(
            "the job is not placed, for missing drivers: {:?}",
            get_json(agent.spec.http, "/v1/job/later/evaluations")
        )
    });
    assert_eq!(filtered, 1);
    assert!(
        get_json(agent.spec.http, "/v1/job/later/allocations").is_some_and(|allocs| allocs == serde_json::json!([]))
    );

    let proxy = SocketProxy::up(&socket);
    wait_for(Duration::from_secs(75), || {
        docker_driver(&agent).filter(|driver| driver["Healthy"] == true)
    })
    .unwrap_or_else(|| panic!("the driver is healthy again: {:?}", docker_driver(&agent)));
    let alloc = wait_alloc(
        &agent,
        "later",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the waiting job is placed and runs once the daemon is back",
    );
    stop_job(&agent, "later");
    let id = alloc["ID"].as_str().unwrap();
    wait_for(Duration::from_secs(20), || containers_of(id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("no container is left: {:?}", containers_of(id)));
    proxy.down();
}

/// `resources { cores = 1 }` (Nomad 1.1's reserved cores): the scheduler reserves one of the
/// node's cores, the container is pinned to it (`CpusetCpus`) and told which
/// (`NOMAD_CPU_CORES`); a second job asking for more cores than are left is not placed, the
/// evaluation naming the "cores" dimension.
#[test]
fn reserved_cores_are_the_containers_cpuset_and_never_given_twice() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    let job = |name: &str, cores: u32| {
        format!(
            r#"job "{name}" {{
  group "g" {{
    task "t" {{
      driver = "docker"
      config {{
        image        = "{IMAGE}"
        network_mode = "none"
        command      = "sh"
        args         = ["-c", "echo cores=$NOMAD_CPU_CORES; while true; do sleep 0.1; done"]
      }}
      resources {{
        cores  = {cores}
        memory = 32
      }}
    }}
  }}
}}
"#
        )
    };
    run_job(&agent, root.path(), "pinned", &job("pinned", 1));
    let stub = wait_alloc(
        &agent,
        "pinned",
        |alloc| alloc["TaskStates"]["t"]["State"] == "running",
        "the pinned container runs",
    );
    let id = stub["ID"].as_str().unwrap().to_string();
    let alloc = get_json(agent.spec.http, &format!("/v1/allocation/{id}")).expect("the allocation");
    let cpu = &alloc["AllocatedResources"]["Tasks"]["t"]["Cpu"];
    let reserved = cpu["ReservedCores"].as_array().expect("reserved cores").clone();
    assert_eq!(reserved.len(), 1, "{cpu}");
    let core = reserved[0].as_u64().unwrap().to_string();
    let node_id = alloc["NodeID"].as_str().unwrap();
    let node = get_json(agent.spec.http, &format!("/v1/node/{node_id}")).expect("the node");
    let node_mhz = node["NodeResources"]["Cpu"]["CpuShares"].as_u64().unwrap();
    let cores: u64 = node["Attributes"]["cpu.numcores"].as_str().unwrap().parse().unwrap();
    assert_eq!(cpu["CpuShares"].as_u64(), Some(node_mhz / cores), "{cpu}");
    let container = containers_of(&id).pop().expect("the task's container");
    assert_eq!(
        docker(&["inspect", "--format", "{{.HostConfig.CpusetCpus}}", &container]),
        core
    );
    let said = wait_for(Duration::from_secs(20), || {
        let text = logs(&agent, &id, "t", "stdout");
        text.contains("cores=").then_some(text)
    })
    .unwrap_or_else(|| panic!("the task says its cores:\n{}", agent.log()));
    assert_eq!(said, format!("cores={core}\n"));

    // Every core of the node but the one taken, and one more: nowhere to go.
    run_job(&agent, root.path(), "wide", &job("wide", cores as u32));
    let evals = wait_for(Duration::from_secs(30), || {
        let evals = get_json(agent.spec.http, "/v1/job/wide/evaluations")?;
        evals
            .as_array()?
            .iter()
            .find(|eval| eval["FailedTGAllocs"]["g"].is_object())
            .cloned()
    })
    .unwrap_or_else(|| panic!("the wide job's evaluation fails to place:\n{}", agent.log()));
    let metric = &evals["FailedTGAllocs"]["g"];
    assert_eq!(metric["DimensionExhausted"]["cores"], 1, "{metric:#}");
    assert!(containers_of(&id).len() == 1, "the pinned task keeps its one container");
    stop_job(&agent, "wide");
    stop_job(&agent, "pinned");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the pinned container is removed:\n{}", agent.log()));
}

/// One `alloc exec` session over the exec websocket, as the CLI and the UI open it.
struct ExecSession {
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
}

impl ExecSession {
    fn open(agent: &Agent, alloc: &str, task: &str, command: &[&str], tty: bool) -> ExecSession {
        let command = serde_json::to_string(command).unwrap();
        let encoded: String = command
            .bytes()
            .map(|byte| match byte {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (byte as char).to_string(),
                other => format!("%{other:02X}"),
            })
            .collect();
        let url = format!(
            "ws://127.0.0.1:{}/v1/client/allocation/{alloc}/exec?task={task}&tty={tty}&command={encoded}",
            agent.spec.http
        );
        let (socket, _) = tungstenite::connect(url).expect("the exec websocket opens");
        ExecSession { socket }
    }

    fn send(&mut self, frame: serde_json::Value) {
        self.socket
            .send(tungstenite::Message::Text(frame.to_string().into()))
            .expect("a frame is sent");
    }

    /// What the command wrote (stdout and stderr together) and its exit code.
    fn finish(&mut self) -> (String, Option<i64>) {
        use base64::Engine as _;
        let mut output = Vec::new();
        loop {
            let message = match self.socket.read() {
                Ok(message) => message,
                Err(_) => return (String::from_utf8_lossy(&output).into_owned(), None),
            };
            let tungstenite::Message::Text(text) = message else {
                continue;
            };
            let frame: serde_json::Value = serde_json::from_str(&text).unwrap();
            for stream in ["stdout", "stderr"] {
                if let Some(data) = frame[stream]["data"].as_str() {
                    output.extend(base64::engine::general_purpose::STANDARD.decode(data).unwrap());
                }
            }
            if frame["exited"] == true {
                return (
                    String::from_utf8_lossy(&output).into_owned(),
                    frame["result"]["exit_code"].as_i64(),
                );
            }
        }
    }
}

/// An exec session with a terminal: the command sees a tty of the size the session sets
/// (resized through the Engine), and a session given up kills what it ran in the container
/// (the Engine has no call for it: the driver kills it by its host pid).
#[test]
fn alloc_exec_with_a_terminal_is_resized_and_killed_when_given_up() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    run_job(&agent, root.path(), "term", &service_job("term"));
    let alloc = wait_alloc(
        &agent,
        "term",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running",
        "the container task runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let container = containers_of(&id).pop().expect("the task's container");

    // `stty size` once the resize has had time to land; `[ -t 0 ]` says a terminal is there.
    let mut session = ExecSession::open(
        &agent,
        &id,
        "web",
        &["sh", "-c", "sleep 1; [ -t 0 ] && echo tty; stty size"],
        true,
    );
    session.send(serde_json::json!({"tty_size": {"height": 41, "width": 123}}));
    let (output, code) = session.finish();
    assert_eq!(code, Some(0), "{output:?}\n{}", agent.log());
    assert_eq!(output.replace('\r', ""), "tty\n41 123\n");

    // A session whose client goes away: its command dies with it.
    let mut session = ExecSession::open(&agent, &id, "web", &["sh", "-c", "exec sleep 4242"], true);
    let running = || docker(&["top", &container]).contains("sleep 4242");
    wait_for(Duration::from_secs(20), || running().then_some(()))
        .unwrap_or_else(|| panic!("the exec'd sleep runs in the container:\n{}", agent.log()));
    session.socket.close(None).ok();
    drop(session);
    wait_for(Duration::from_secs(20), || (!running()).then_some(()))
        .unwrap_or_else(|| panic!("the given-up session's sleep is killed:\n{}", agent.log()));

    stop_job(&agent, "term");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the stopped task's container is removed:\n{}", agent.log()));
}

/// Removes the test's user-defined network however the test ends.
struct UserNetwork(String);

impl Drop for UserNetwork {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["-H", &engine(), "network", "rm", &self.0])
            .output();
    }
}

/// `network_mode` naming a user-defined network: the container joins it (and only it), its
/// endpoint there is gone once the job stops, and a network that does not exist is a clear
/// task event that fails the task, with no container left.
#[test]
fn a_user_defined_network_is_joined_and_left_and_a_missing_one_is_a_clear_event() {
    let root = tempfile::tempdir().unwrap();
    let agent = start_dev(root.path(), "");
    let network = UserNetwork(format!("drover-test-{}", std::process::id()));
    docker(&["network", "create", &network.0]);
    let job = |name: &str, mode: &str| {
        format!(
            r#"job "{name}" {{
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    task "t" {{
      driver = "docker"
      config {{
        image        = "{IMAGE}"
        network_mode = "{mode}"
        command      = "sh"
        args         = ["-c", "while true; do sleep 0.1; done"]
      }}
      resources {{
        memory = 32
      }}
    }}
  }}
}}
"#
        )
    };
    run_job(&agent, root.path(), "joined", &job("joined", &network.0));
    let alloc = wait_alloc(
        &agent,
        "joined",
        |alloc| alloc["TaskStates"]["t"]["State"] == "running",
        "the container on the user network runs",
    );
    let id = alloc["ID"].as_str().unwrap().to_string();
    let container = containers_of(&id).pop().expect("the task's container");
    let networks: Value = serde_json::from_str(&docker(&[
        "inspect",
        "--format",
        "{{json .NetworkSettings.Networks}}",
        &container,
    ]))
    .unwrap();
    let joined: Vec<&String> = networks.as_object().unwrap().keys().collect();
    assert_eq!(joined, [&network.0], "{networks:#}");
    let attached = || docker(&["network", "inspect", "--format", "{{json .Containers}}", &network.0]);
    assert!(attached().contains(&container), "{}", attached());
    stop_job(&agent, "joined");
    wait_for(Duration::from_secs(30), || containers_of(&id).is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the stopped task's container is removed:\n{}", agent.log()));
    let left = attached();
    assert!(
        left == "{}" || left == "null",
        "no endpoint is left on the network: {left}"
    );

    let missing = format!("{}-missing", network.0);
    run_job(&agent, root.path(), "nowhere", &job("nowhere", &missing));
    let alloc = wait_alloc(
        &agent,
        "nowhere",
        |alloc| alloc["ClientStatus"] == "failed",
        "the task on a missing network fails",
    );
    let events = events(&alloc, "t");
    assert!(
        events
            .iter()
            .any(|event| event.contains("Driver Failure") && event.contains(&missing) && event.contains("not found")),
        "the event names the missing network: {events:#?}"
    );
    let id = alloc["ID"].as_str().unwrap();
    assert!(
        containers_of(id).is_empty(),
        "no container is left: {:?}",
        containers_of(id)
    );
}

/// Imports `tag`: busybox with a few applets and `script` as its entrypoint (`/bin/entry`).
fn script_image(root: &std::path::Path, tag: &str, script: &str) {
    let rootfs = root.join(format!("rootfs-{}", tag.replace(['/', ':'], "-")));
    for dir in ["bin", "tmp"] {
        std::fs::create_dir_all(rootfs.join(dir)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "echo", "mkdir", "httpd", "sleep", "wget"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("bin/entry"), script).unwrap();
    std::fs::set_permissions(
        rootfs.join("bin/entry"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let archive = rootfs.with_extension("tar");
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success(), "tar of {tag}'s rootfs");
    docker(&[
        "import",
        "--change",
        "ENTRYPOINT [\"/bin/entry\"]",
        archive.to_str().unwrap(),
        tag,
    ]);
}

/// An image standing in for Envoy's, tagged as the one Consul's preferred version names
/// (`envoyproxy/envoy:v1.16.2`): its entrypoint prints its arguments and the bootstrap file
/// given with `-c`, then serves one page on the proxy's port, as Envoy would listen there.
fn fake_envoy_image(root: &std::path::Path) -> &'static str {
    const ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.16.2";
    // One script for every test that runs it (tests run at once and share the tag): in a
    // group's own network (Consul's socket there) it first reaches the local service.
    let script = "#!/bin/sh\necho \"envoy $*\"\ncat \"$2\"\necho\n\
                  if [ -S /alloc/tmp/consul_grpc.sock ]; then\n\
                  echo 'consul grpc socket present'\n\
                  until wget -qO- http://127.0.0.1:9001/passwd >/dev/null; do sleep 0.2; done\n\
                  echo 'local service reached'\nfi\nmkdir -p /tmp/www\n\
                  echo proxied > /tmp/www/index.html\n\
                  exec httpd -f -p \"$NOMAD_PORT_connect_proxy_count_api\" -h /tmp/www\n";
    script_image(root, ENVOY_IMAGE, script);
    ENVOY_IMAGE
}

/// Nomad's Connect job with its default sidecar: no `sidecar_task`, so the client's
/// `meta.connect.sidecar_image` (`envoyproxy/envoy:v${NOMAD_envoy_version}`) runs as a
/// container, at the newest Envoy version the local Consul agent supports, sharing the
/// host's network (Drover's Connect groups are host mode). It gets its bootstrap through
/// `${NOMAD_SECRETS_DIR}`, answers on the proxy's dynamic port, and nothing is left behind
/// once the job stops.
#[test]
fn a_connect_sidecar_runs_as_a_container_at_the_envoy_version_consul_prefers() {
    use std::io::{Read, Write};
    let root = tempfile::tempdir().unwrap();
    let image = fake_envoy_image(root.path());
    let (consul, consul_port) = crate::connect::start_consul();
    let cli = root.path().join("consul");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\necho \"$@\" >> {}/calls.log\necho '{{\"bootstrapped\": true}}'\n",
            root.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let consul_config = format!(
        "consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  binary = \"{}\"\n}}\n",
        cli.display()
    );
    let agent = start_dev_configured(root.path(), &engine(), "", &consul_config);
    let job = format!(
        r#"job "countdash" {{
  group "api" {{
    network {{
      port "http" {{}}
    }}
    service {{
      name = "count-api"
      port = "http"
      connect {{
        sidecar_service {{}}
      }}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "sleep"
        args    = ["300"]
      }}
    }}
  }}
}}
"#
    );
    run_job(&agent, root.path(), "countdash", &job);
    let stub = wait_alloc(
        &agent,
        "countdash",
        |alloc| {
            alloc["TaskStates"]["web"]["State"] == "running"
                && alloc["TaskStates"]["connect-proxy-count-api"]["State"] == "running"
        },
        "the app and its sidecar container run",
    );
    let id = stub["ID"].as_str().unwrap().to_string();
    let sidecar = docker(&[
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label=com.hashicorp.nomad.alloc_id={id}"),
        "--filter",
        "label=com.hashicorp.nomad.task_name=connect-proxy-count-api",
    ]);
    assert!(!sidecar.is_empty(), "the sidecar is a container\n{}", agent.log());
    let inspect: Value = serde_json::from_str(&docker(&["inspect", &sidecar])).unwrap();
    assert_eq!(inspect[0]["Config"]["Image"], image, "{inspect:#}");
    assert_eq!(inspect[0]["HostConfig"]["NetworkMode"], "host", "{inspect:#}");

    let alloc = get_json(agent.spec.http, &format!("/v1/allocation/{id}")).unwrap();
    let proxy_port = alloc["AllocatedResources"]["Shared"]["Ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|port| port["Label"] == "connect-proxy-count-api")
        .unwrap_or_else(|| panic!("the proxy's port: {alloc:#}"))
        .clone();
    let (host, port) = (
        proxy_port["HostIP"].as_str().unwrap().to_string(),
        proxy_port["Value"].as_u64().unwrap() as u16,
    );
    let answer = wait_for(Duration::from_secs(30), || {
        let mut stream = std::net::TcpStream::connect((host.as_str(), port)).ok()?;
        write!(stream, "GET /index.html HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.contains("proxied").then_some(answer)
    });
    assert!(answer.is_some(), "the proxy answers on {host}:{port}\n{}", agent.log());
    let out = logs(&agent, &id, "connect-proxy-count-api", "stdout");
    assert!(
        out.contains("envoy -c /secrets/envoy_bootstrap.json -l info --concurrency 1 --disable-hot-restart"),
        "the sidecar runs with Nomad's arguments and the client's meta defaults: {out}"
    );
    assert!(
        out.contains("\"bootstrapped\": true"),
        "the bootstrap reached the container: {out}"
    );
    let calls = std::fs::read_to_string(root.path().join("calls.log")).unwrap();
    assert!(
        calls.contains("connect envoy") && calls.contains("-sidecar-for"),
        "{calls}"
    );
    assert!(
        consul
            .services
            .lock()
            .unwrap()
            .keys()
            .any(|id| id.ends_with("-sidecar-proxy")),
        "the sidecar service is registered"
    );

    stop_job(&agent, "countdash");
    wait_for(Duration::from_secs(60), || containers_of(&id).is_empty().then_some(())).unwrap_or_else(|| {
        panic!(
            "no container of {id} is left: {:?}\n{}",
            containers_of(&id),
            agent.log()
        )
    });
    // The agent's own (`_nomad-server-*`) stay.
    let task_services = || -> Vec<String> {
        let services = consul.services.lock().unwrap();
        services
            .keys()
            .filter(|id| id.starts_with("_nomad-task-"))
            .cloned()
            .collect()
    };
    wait_for(Duration::from_secs(30), || task_services().is_empty().then_some(()))
        .unwrap_or_else(|| panic!("the task services are deregistered: {:?}", task_services()));
}

/// A group with `network { mode = "bridge" }`, as Nomad users write it for containers: one
/// pause container (the client's `infra_image`, here a local stand-in) holds the group's
/// network namespace with its port published from the host (dynamic host port to `to =
/// 8080`); both tasks join it, so one reaches the other on 127.0.0.1; the host port reaches
/// the web task; after `job stop`, neither the tasks' containers nor the pause container is
/// left.
#[test]
fn a_bridge_mode_group_shares_one_network_its_port_reaches() {
    use std::io::{Read, Write};
    let root = tempfile::tempdir().unwrap();
    script_image(
        root.path(),
        "drover-pause:local",
        "#!/bin/sh\ntrap 'exit 0' TERM INT\nwhile :; do sleep 1 & wait $!; done\n",
    );
    let agent = start_dev(root.path(), "    infra_image = \"drover-pause:local\"");
    let job = format!(
        r#"job "bridged" {{
  group "g" {{
    network {{
      mode = "bridge"
      port "http" {{
        to = 8080
      }}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "httpd"
        args    = ["-f", "-p", "8080", "-h", "/etc"]
      }}
    }}
    task "probe" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "sh"
        args    = ["-c", "until wget -qO- http://127.0.0.1:8080/passwd; do sleep 0.2; done; echo reached; sleep 300"]
      }}
    }}
  }}
}}
"#
    );
    run_job(&agent, root.path(), "bridged", &job);
    let stub = wait_alloc(
        &agent,
        "bridged",
        |alloc| alloc["TaskStates"]["web"]["State"] == "running" && alloc["TaskStates"]["probe"]["State"] == "running",
        "both containers run",
    );
    let id = stub["ID"].as_str().unwrap().to_string();
    let pause = docker(&["ps", "-q", "--no-trunc", "--filter", &format!("name=nomad_init_{id}")]);
    assert!(
        !pause.is_empty(),
        "the pause container runs: {:?}\n{}",
        containers_of(&id),
        agent.log()
    );
    for task in ["web", "probe"] {
        let container = docker(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=com.hashicorp.nomad.alloc_id={id}"),
            "--filter",
            &format!("label=com.hashicorp.nomad.task_name={task}"),
        ]);
        let mode = docker(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &container]);
        assert_eq!(
            mode,
            format!("container:{pause}"),
            "{task} joins the pause container's network"
        );
    }
    let reached = wait_for(Duration::from_secs(30), || {
        logs(&agent, &id, "probe", "stdout").contains("reached").then_some(())
    });
    assert!(
        reached.is_some(),
        "the probe reaches web on 127.0.0.1:8080\n{}",
        agent.log()
    );

    let alloc = get_json(agent.spec.http, &format!("/v1/allocation/{id}")).unwrap();
    let given = &alloc["AllocatedResources"]["Shared"]["Ports"][0];
    assert_eq!(
        (given["Label"].as_str(), given["To"].as_i64()),
        (Some("http"), Some(8080)),
        "{alloc:#}"
    );
    let (host, port) = (
        given["HostIP"].as_str().unwrap().to_string(),
        given["Value"].as_u64().unwrap() as u16,
    );
    let answer = wait_for(Duration::from_secs(30), || {
        let mut stream = std::net::TcpStream::connect((host.as_str(), port)).ok()?;
        write!(stream, "GET /passwd HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.lines().next()?.contains(" 200 ").then_some(answer)
    });
    assert!(
        answer.is_some(),
        "the host port {host}:{port} reaches web\n{}",
        agent.log()
    );

    stop_job(&agent, "bridged");
    wait_for(Duration::from_secs(60), || containers_of(&id).is_empty().then_some(())).unwrap_or_else(|| {
        panic!(
            "no container of {id} is left: {:?}\n{}",
            containers_of(&id),
            agent.log()
        )
    });
}

/// Nomad's canonical Connect group, unchanged in shape: `network { mode = "bridge" }`, the
/// service on the literal port the app binds inside (`port = "9001"`), the default sidecar.
/// The proxy container and the app share the group's namespace: the proxy reaches the app on
/// 127.0.0.1:9001, as Consul is told (`LocalServiceAddress`/`LocalServicePort`), finds
/// Consul's gRPC socket at `/alloc/tmp/consul_grpc.sock` (the bootstrap's `-grpc-addr`), and
/// answers on the proxy's host port through the pause container. Nothing is left after `job
/// stop`, the socket included.
#[test]
fn a_connect_group_in_bridge_mode_runs_as_nomads_countdash_does() {
    use std::io::{Read, Write};
    let root = tempfile::tempdir().unwrap();
    script_image(
        root.path(),
        "drover-pause:local",
        "#!/bin/sh\ntrap 'exit 0' TERM INT\nwhile :; do sleep 1 & wait $!; done\n",
    );
    // The same stand-in as the host-mode test, which checks what a real Envoy needs here.
    fake_envoy_image(root.path());
    let (consul, consul_port) = crate::connect::start_consul();
    let cli = root.path().join("consul");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\necho \"$@\" >> {}/calls.log\necho '{{\"bootstrapped\": true}}'\n",
            root.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let consul_config = format!(
        "consul {{\n  address = \"127.0.0.1:{consul_port}\"\n  binary = \"{}\"\n}}\n",
        cli.display()
    );
    let agent = start_dev_configured(
        root.path(),
        &engine(),
        "    infra_image = \"drover-pause:local\"",
        &consul_config,
    );
    let job = format!(
        r#"job "countdash" {{
  group "api" {{
    network {{
      mode = "bridge"
    }}
    service {{
      name = "count-api"
      port = "9001"
      connect {{
        sidecar_service {{}}
      }}
    }}
    task "web" {{
      driver = "docker"
      config {{
        image   = "{IMAGE}"
        command = "httpd"
        args    = ["-f", "-p", "9001", "-h", "/etc"]
      }}
    }}
  }}
  group "dashboard" {{
    network {{
      mode = "bridge"
      port "http" {{
        to = 9002
      }}
    }}
    service {{
      name = "count-dashboard"
      port = "9002"
      connect {{
        sidecar_service {{
          proxy {{
            upstreams {{
              destination_name = "count-api"
              local_bind_port  = 8080
            }}
          }}
        }}
      }}
    }}
    task "dashboard" {{
      driver = "docker"
      env {{
        COUNTING_SERVICE_URL = "http://${{NOMAD_UPSTREAM_ADDR_count_api}}"
      }}
      config {{
        image   = "{IMAGE}"
        command = "sh"
        args    = ["-c", "echo URL=$COUNTING_SERVICE_URL; sleep 300"]
      }}
    }}
  }}
}}
"#
    );
    run_job(&agent, root.path(), "countdash", &job);
    let dashboard = wait_for(Duration::from_secs(60), || {
        let allocs = get_json(agent.spec.http, "/v1/job/countdash/allocations")?;
        let alloc = allocs
            .as_array()?
            .iter()
            .find(|alloc| alloc["TaskGroup"] == "dashboard")?
            .clone();
        let id = alloc["ID"].as_str()?.to_string();
        logs(&agent, &id, "dashboard", "stdout").contains("URL=").then_some(id)
    })
    .unwrap_or_else(|| panic!("the dashboard runs\n{}", agent.log()));
    assert!(
        logs(&agent, &dashboard, "dashboard", "stdout").contains("URL=http://127.0.0.1:8080"),
        "the dashboard finds its upstream where Nomad's countdash reads it"
    );
    let stub = wait_for(Duration::from_secs(60), || {
        let allocs = get_json(agent.spec.http, "/v1/job/countdash/allocations")?;
        let alloc = allocs
            .as_array()?
            .iter()
            .find(|alloc| alloc["TaskGroup"] == "api")?
            .clone();
        (alloc["TaskStates"]["web"]["State"] == "running"
            && alloc["TaskStates"]["connect-proxy-count-api"]["State"] == "running")
            .then_some(alloc)
    })
    .unwrap_or_else(|| panic!("the app and its sidecar run\n{}", agent.log()));
    let id = stub["ID"].as_str().unwrap().to_string();
    let pause = docker(&["ps", "-q", "--no-trunc", "--filter", &format!("name=nomad_init_{id}")]);
    assert!(!pause.is_empty(), "the pause container runs\n{}", agent.log());
    let sidecar = docker(&[
        "ps",
        "-q",
        "--no-trunc",
        "--filter",
        &format!("label=com.hashicorp.nomad.alloc_id={id}"),
        "--filter",
        "label=com.hashicorp.nomad.task_name=connect-proxy-count-api",
    ]);
    let mode = docker(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &sidecar]);
    assert_eq!(
        mode,
        format!("container:{pause}"),
        "the sidecar joins the group's network"
    );

    let reached = wait_for(Duration::from_secs(30), || {
        let out = logs(&agent, &id, "connect-proxy-count-api", "stdout");
        out.contains("local service reached").then_some(out)
    })
    .unwrap_or_else(|| panic!("the proxy reaches the app on 127.0.0.1:9001\n{}", agent.log()));
    assert!(reached.contains("consul grpc socket present"), "{reached}");
    assert!(
        reached.contains("envoy -c /secrets/envoy_bootstrap.json -l info --concurrency 1 --disable-hot-restart"),
        "{reached}"
    );
    let calls = std::fs::read_to_string(root.path().join("calls.log")).unwrap();
    assert!(
        calls.contains("-grpc-addr unix://alloc/tmp/consul_grpc.sock") && calls.contains("-admin-bind localhost:19000"),
        "{calls}"
    );
    let parent = {
        let services = consul.services.lock().unwrap();
        services
            .values()
            .find(|service| service["Service"] == "count-api")
            .cloned()
            .expect("the service is registered")
    };
    let proxy = &parent["Connect"]["SidecarService"]["Proxy"];
    assert_eq!(
        (
            proxy["LocalServiceAddress"].as_str(),
            proxy["LocalServicePort"].as_u64()
        ),
        (Some("127.0.0.1"), Some(9001)),
        "{parent:#}"
    );

    let alloc = get_json(agent.spec.http, &format!("/v1/allocation/{id}")).unwrap();
    let proxy_port = alloc["AllocatedResources"]["Shared"]["Ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|port| port["Label"] == "connect-proxy-count-api")
        .unwrap_or_else(|| panic!("the proxy's port: {alloc:#}"))
        .clone();
    let (host, port) = (
        proxy_port["HostIP"].as_str().unwrap().to_string(),
        proxy_port["Value"].as_u64().unwrap() as u16,
    );
    let answer = wait_for(Duration::from_secs(30), || {
        let mut stream = std::net::TcpStream::connect((host.as_str(), port)).ok()?;
        write!(stream, "GET /index.html HTTP/1.0\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.contains("proxied").then_some(answer)
    });
    assert!(answer.is_some(), "the proxy answers on {host}:{port}\n{}", agent.log());

    let socket = agent
        .spec
        .data_dir
        .join(format!("alloc/{id}/alloc/tmp/consul_grpc.sock"));
    assert!(socket.exists(), "{}", socket.display());
    stop_job(&agent, "countdash");
    for alloc in [&id, &dashboard] {
        wait_for(Duration::from_secs(60), || {
            containers_of(alloc).is_empty().then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "no container of {alloc} is left: {:?}\n{}",
                containers_of(alloc),
                agent.log()
            )
        });
    }
    wait_for(Duration::from_secs(30), || (!socket.exists()).then_some(()))
        .unwrap_or_else(|| panic!("the socket is removed: {}", socket.display()));
}
