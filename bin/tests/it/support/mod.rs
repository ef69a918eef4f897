//! Real `agent` processes on loopback for integration tests and the formation bench: distinct
//! ports and data dirs, a tiny HTTP client for the API, and kill -9 / restart.

#![allow(dead_code)]

pub mod csi;
pub mod tls;

// Each test binary and bench uses a part of the kit.
#[allow(unused_imports)]
pub use drover_testkit::{
    ChildGuard, UnmountUnder, files_under, get_json, http, http_get, http_status, mounts_under, wait_for,
    wait_for_every,
};

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const AGENT: &str = env!("CARGO_BIN_EXE_agent");

/// Three free ports (HTTP, RPC, serf), each free for both TCP and UDP and held by no other
/// test (the kit's [`drover_testkit::free_ports`]).
pub fn free_ports() -> [u16; 3] {
    drover_testkit::free_ports::<3>()
}

/// A client-only agent `name` under `root` that talks to the server at `server_rpc`: its
/// identity and its arguments (more can be pushed before it starts).
pub fn client_spec(root: &Path, name: &str, server_rpc: u16) -> (ServerSpec, Vec<String>) {
    let spec = fresh_spec(root, name);
    let args = vec![
        "-client".into(),
        format!("-data-dir={}", spec.data_dir.display()),
        format!("-node={name}"),
        "-bind=127.0.0.1".into(),
        format!("-http-port={}", spec.http),
        format!("-rpc-port={}", spec.rpc),
        format!("-servers=127.0.0.1:{server_rpc}"),
    ];
    (spec, args)
}

/// An `agent -dev` under `root` with the scripted `mock` driver enabled, started and waited
/// for until its node is ready with that driver (the benches that place allocations without
/// starting a process per task).
pub fn start_dev_with_mock_driver(root: &Path) -> Agent {
    let (spec, mut args) = dev_spec(root, "dev");
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let config = root.join("mock.hcl");
    std::fs::write(
        &config,
        "plugin \"mock_driver\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(spec, args);
    let port = agent.spec.http;
    wait_for(Duration::from_secs(60), || {
        let nodes = get_json(port, "/v1/nodes")?;
        let node = nodes.as_array()?.first()?.clone();
        (node["Status"] == "ready" && node.get("Drivers")?.get("mock").is_some()).then_some(())
    })
    .unwrap_or_else(|| panic!("the dev node is ready with the mock driver:\n{}", agent.log()));
    agent
}

/// An `agent -dev` named `name` under `root`: its identity and its arguments.
pub fn dev_spec(root: &Path, name: &str) -> (ServerSpec, Vec<String>) {
    let spec = fresh_spec(root, name);
    let args = vec![
        "-dev".into(),
        format!("-data-dir={}", spec.data_dir.display()),
        format!("-http-port={}", spec.http),
        format!("-rpc-port={}", spec.rpc),
        format!("-serf-port={}", spec.serf),
    ];
    (spec, args)
}

/// Agent `name` under `root` on ports the OS handed out.
fn fresh_spec(root: &Path, name: &str) -> ServerSpec {
    let [http, rpc, serf] = free_ports();
    ServerSpec {
        name: name.into(),
        http,
        rpc,
        serf,
        data_dir: root.join(name),
    }
}

/// One server's identity on this machine.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub name: String,
    pub http: u16,
    pub rpc: u16,
    pub serf: u16,
    pub data_dir: PathBuf,
}

/// A running (or killed) agent process whose output is captured.
pub struct Agent {
    pub spec: ServerSpec,
    child: Option<Child>,
    pub log: Arc<Mutex<String>>,
    args: Vec<String>,
    /// `RUST_LOG` for the process.
    log_filter: String,
}

impl Agent {
    pub fn start(spec: ServerSpec, args: Vec<String>) -> Agent {
        Agent::start_logging(spec, args, "info")
    }

    /// Started with `RUST_LOG=<filter>` (`debug` shows what a log at that level would leak).
    pub fn start_logging(spec: ServerSpec, mut args: Vec<String>, filter: &str) -> Agent {
        // raw_exec is off unless an operator enables it (Nomad's default); the tests' client
        // agents run raw_exec tasks, so they enable it as an operator would, in a config file.
        if args.iter().any(|arg| arg == "-client") {
            std::fs::create_dir_all(&spec.data_dir).unwrap();
            let file = spec.data_dir.join("raw_exec.hcl");
            std::fs::write(&file, "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n").unwrap();
            args.push(format!("-config={}", file.display()));
        }
        let mut agent = Agent {
            spec,
            child: None,
            log: Arc::new(Mutex::new(String::new())),
            args,
            log_filter: filter.to_string(),
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let mut child = Command::new(AGENT)
            .args(&self.args)
            .env("RUST_LOG", &self.log_filter)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("agent starts");
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()) as Box<dyn Read + Send>,
        ] {
            let log = self.log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        self.child = Some(child);
    }

    /// SIGKILL, as `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The agent process's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` to the agent process and returns at once.
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: kill has no memory preconditions; the pid is our own child, not reaped.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// SIGTERM, as an operator's graceful stop; SIGKILL if it has not exited within 10 s.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill has no memory preconditions; the pid is our own live child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same process again on the same data dir; returns the output of this life.
    pub fn restart(&mut self) {
        self.kill();
        self.log.lock().unwrap().push_str("=== restart ===\n");
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn get(&self, path: &str) -> Option<String> {
        http_get(self.spec.http, path)
    }

    pub fn leader(&self) -> Option<String> {
        self.get("/v1/status/leader")
            .and_then(|body| serde_json::from_str::<String>(&body).ok())
            .filter(|leader| !leader.is_empty())
    }

    pub fn peers(&self) -> Vec<String> {
        self.get("/v1/status/peers")
            .and_then(|body| serde_json::from_str(&body).ok())
            .unwrap_or_default()
    }

    pub fn rpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.spec.rpc)
    }
}

impl Drop for Agent {
    /// Kills the agent and then its tasks: tasks outlive their agent on purpose (a restarted
    /// agent reattaches), so a test that ends, passed or failed, must end them itself.
    fn drop(&mut self) {
        let pid = self.child.as_ref().map(|child| child.id());
        self.kill();
        kill_tasks_under(&self.spec.data_dir);
        if let Some(pid) = pid {
            remove_task_cgroups(pid);
        }
    }
}

/// Removes the task cgroups the agent with `pid` created (`<alloc>.<task>.<pid>.<n>` under
/// `/sys/fs/cgroup/**/drover/`), once the killed tasks have left them.
pub fn remove_task_cgroups(pid: u32) {
    let suffix = format!(".{pid}.");
    let mut dirs = Vec::new();
    for root in [
        "/sys/fs/cgroup/drover",
        "/sys/fs/cgroup/freezer/drover",
        "/sys/fs/cgroup/memory/drover",
        "/sys/fs/cgroup/cpu/drover",
        "/sys/fs/cgroup/pids/drover",
    ] {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && name.rsplit('.').nth(1) == Some(&pid.to_string()) && name.contains(&suffix) {
                dirs.push(entry.path());
            }
        }
    }
    // A SIGKILLed process leaves its cgroup when it has exited, a moment after the signal.
    for _ in 0..50 {
        dirs.retain(|dir| std::fs::remove_dir(dir).is_err() && dir.exists());
        if dirs.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the process `pid` still runs. A zombie does not: it has exited and only waits for its
/// parent to collect its status. A task whose agent was killed is re-parented to PID 1, which on
/// these machines reaps orphans only every second or two (longer under load), so `kill(pid, 0)`
/// would count a task that the restarted agent did stop as still alive.
pub fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state ...`: comm may hold spaces and parentheses, the state follows the last `)`.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

/// Kills every process working in (raw_exec) or chrooted into (exec) a directory under `dir`:
/// the tasks of an agent whose data dir it is.
pub fn kill_tasks_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let inside = ["cwd", "root"]
            .iter()
            .any(|link| std::fs::read_link(format!("/proc/{pid}/{link}")).is_ok_and(|target| target.starts_with(&dir)));
        if inside && pid != std::process::id() as i32 {
            // SAFETY: kill has no memory preconditions; the process works in this test's dir.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The operator CLI against the agent at `port` (`NOMAD_ADDR`).
pub fn cli(port: u16, args: &[&str]) -> std::process::Output {
    Command::new(AGENT)
        .args(args)
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs")
}

/// The operator CLI against the agent at `port`, run in `dir`: its exit code and its stdout
/// and stderr together.
pub fn cli_in(dir: &std::path::Path, port: u16, args: &[&str]) -> (i32, String) {
    let output = Command::new(AGENT)
        .args(args)
        .current_dir(dir)
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// A CLI run's stdout, once it exited 0 (its whole output in the panic otherwise).
pub fn cli_stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A JSON object's field names, sorted (the shape tables compare them with Nomad's).
pub fn field_names(value: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

/// `names`, sorted, to compare with [`field_names`].
pub fn sorted_names(names: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
    names.sort();
    names
}

/// One agent that is server and client (under `root`), once its `raw_exec` is healthy; its
/// HTTP port.
pub fn start_with_client(root: &Path) -> (Agent, u16) {
    let specs = cluster_specs(root, 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for_raw_exec(&agent, port);
    (agent, port)
}

/// Waits until the agent's own client registered with a healthy `raw_exec`.
pub fn wait_for_raw_exec(agent: &Agent, port: u16) {
    wait_for(Duration::from_secs(30), || {
        let nodes = get_json(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers with its drivers:\n{}", agent.log()));
}

/// Submits a server request over agent RPC, retrying while the servers answer "retry".
pub fn submit(rpc: std::net::SocketAddr, request: drover_core::rpc::ServerRequest) {
    use drover_core::rpc::ServerReply;
    use drover_io_real::io::Transport;
    use drover_io_real::service::{server_envelope, server_reply};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..120 {
        let reply = runtime.block_on(async {
            let envelope = server_envelope("global", &request, "", false);
            drover_host::net::GrpcTransport::default()
                .call(rpc, envelope, Duration::from_secs(10))
                .await
                .map(server_reply)
        });
        match reply {
            Ok(ServerReply::Error(error)) if !error.retryable => panic!("{request:?}: {}", error.message),
            Ok(ServerReply::Error(_)) | Err(_) => std::thread::sleep(Duration::from_millis(250)),
            Ok(_) => return,
        }
    }
    panic!("{request:?} never succeeded");
}

/// The specs of an `n`-server cluster under `root`.
pub fn cluster_specs(root: &Path, n: usize) -> Vec<ServerSpec> {
    (0..n)
        .map(|i| {
            let [http, rpc, serf] = free_ports();
            ServerSpec {
                name: format!("s{}", i + 1),
                http,
                rpc,
                serf,
                data_dir: root.join(format!("s{}", i + 1)),
            }
        })
        .collect()
}

/// Flags for a server of `specs` with `bootstrap_expect = specs.len()`, joining the others.
pub fn server_args(specs: &[ServerSpec], index: usize) -> Vec<String> {
    let spec = &specs[index];
    let mut args = vec![
        "-server".to_string(),
        format!("-bootstrap-expect={}", specs.len()),
        format!("-data-dir={}", spec.data_dir.display()),
        format!("-node={}", spec.name),
        "-bind=127.0.0.1".to_string(),
        format!("-http-port={}", spec.http),
        format!("-rpc-port={}", spec.rpc),
        format!("-serf-port={}", spec.serf),
        "-retry-interval=1s".to_string(),
    ];
    for (other, peer) in specs.iter().enumerate() {
        if other != index {
            args.push(format!("-retry-join=127.0.0.1:{}", peer.serf));
        }
    }
    args
}

/// The leader every running agent in `agents` agrees on, once they all know it and it is one of
/// them with `peers_expected` Raft peers.
pub fn agreed_leader(agents: &[&Agent], peers_expected: usize) -> Option<String> {
    let leaders: Vec<String> = agents.iter().map(|agent| agent.leader()).collect::<Option<_>>()?;
    let first = leaders.first()?.clone();
    let agreed = leaders.iter().all(|leader| *leader == first);
    let known = agents.iter().any(|agent| agent.rpc_addr() == first);
    let shaped = agents.iter().all(|agent| agent.peers().len() == peers_expected);
    (agreed && known && shaped).then_some(first)
}
