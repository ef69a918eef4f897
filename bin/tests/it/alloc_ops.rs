//! What an operator does with a running allocation, for real, through the CLI: `alloc status`
//! shows its tasks and their recent events, `job status` counts it, and `alloc stop` replaces
//! it (the old task's process ends, a new allocation runs).

use crate::support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use support::{Agent, cluster_specs, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn cli(port: u16, args: &[&str]) -> Output {
    std::process::Command::new(support::AGENT)
        .args(args)
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Lines `<alloc id> <pid>` the task writes when it starts, and `<alloc id> <signal>` when it
/// is signalled.
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn jobspec(marks: &Path) -> String {
    let marks = marks.display();
    format!(
        r#"job "web" {{
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo hello > local/hello; ln -sf /etc/hostname local/out; trap 'echo $NOMAD_ALLOC_ID USR1 >> {marks}' USR1; echo $NOMAD_ALLOC_ID $$ >> {marks}; while :; do sleep 0.1; done"]
      }}
      kill_timeout = "1s"
      resources {{
        cpu    = 20
        memory = 16
      }}
    }}
  }}
}}
"#
    )
}

/// A client-only agent `c1` that tells the servers an RPC address nothing listens on, so the
/// servers can only reach it down the stream it keeps attached to them.
fn unreachable_client(root: &Path, server_rpc: u16) -> Agent {
    let (spec, mut args) = support::client_spec(root, "c1", server_rpc);
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let unreachable = spec.data_dir.join("unreachable.hcl");
    // A port no test holds and nothing listens on.
    let closed = drover_testkit::free_port();
    std::fs::write(
        &unreachable,
        format!("advertise {{\n  rpc = \"127.0.0.1:{closed}\"\n}}\n"),
    )
    .unwrap();
    args.push(format!("-config={}", unreachable.display()));
    Agent::start(spec, args)
}

#[test]
fn an_operator_sees_an_allocations_tasks_and_stops_it() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));
    let marks = root.path().join("marks");
    let file = root.path().join("web.hcl");
    std::fs::write(&file, jobspec(&marks)).unwrap();
    stdout(&cli(port, &["job", "run", file.to_str().unwrap()]));
    let (first, pid) = wait_for(Duration::from_secs(20), || {
        let line = lines(&marks).first().cloned()?;
        let (alloc, pid) = line.split_once(' ')?;
        Some((alloc.to_string(), pid.parse::<i32>().ok()?))
    })
    .unwrap_or_else(|| panic!("the task starts:\n{}", agent.log()));

    // Its task states reach the servers: alloc status shows them in Nomad's layout.
    let status = wait_for(Duration::from_secs(10), || {
        let out = stdout(&cli(port, &["alloc", "status", &first[..8]]));
        out.contains("Started     Task started by client").then_some(out)
    })
    .unwrap_or_else(|| panic!("alloc status shows the task's events:\n{}", agent.log()));
    assert!(status.contains("Client Description  = Tasks are running"), "{status}");
    assert!(status.contains("Task \"t\" is \"running\""), "{status}");
    assert!(status.contains("Recent Events:\nTime"), "{status}");
    assert!(status.contains("Received    Task received by client"), "{status}");
    let on_node = wait_for(Duration::from_secs(10), || {
        let alloc = get(port, &format!("/v1/allocation/{first}"))?;
        let listed = get(port, &format!("/v1/node/{}/allocations", alloc["NodeID"].as_str()?))?;
        let found = listed.as_array()?.iter().find(|a| a["ID"] == first.as_str())?.clone();
        (found["TaskStates"]["t"]["State"] == "running").then_some(found)
    })
    .expect("/v1/node/:id/allocations lists it with its task states");
    assert_eq!(on_node["JobID"], "web");
    let job = stdout(&cli(port, &["job", "status", "web"]));
    assert!(
        job.contains("Task Group  Queued  Starting  Running  Failed  Complete  Lost\ng           0       0         1"),
        "{job}"
    );

    // Stopped: the scheduler replaces it, and its task's process is gone.
    let out = stdout(&cli(port, &["alloc", "stop", &first[..8]]));
    assert!(out.contains("==> Monitoring evaluation"), "{out}");
    assert!(out.contains("finished with status \"complete\""), "{out}");
    let second = wait_for(Duration::from_secs(20), || {
        let line = lines(&marks).get(1).cloned()?;
        Some(line.split_once(' ')?.0.to_string())
    })
    .unwrap_or_else(|| panic!("a replacement starts:\n{}", agent.log()));
    assert_ne!(second, first);
    let old = wait_for(Duration::from_secs(20), || {
        let old = get(port, &format!("/v1/allocation/{first}"))?;
        (old["ClientStatus"] == "complete").then_some(old)
    })
    .unwrap_or_else(|| panic!("the stopped allocation completes:\n{}", agent.log()));
    assert_eq!(old["DesiredStatus"], "stop");
    assert_eq!(old["DesiredDescription"], "alloc is being migrated");
    assert!(!support::running(pid), "the stopped task's process {pid} is gone");

    // The node's own resource usage, from its client, named or not.
    let node_id = old["NodeID"].as_str().unwrap().to_string();
    let status = |method: &str, path: &str| support::http_status(method, port, path, None).unwrap();
    for path in [
        "/v1/client/stats".to_string(),
        format!("/v1/client/stats?node_id={node_id}"),
    ] {
        let (code, body) = status("GET", &path);
        assert_eq!(code, 200, "{path}: {body}");
        let stats: Value = serde_json::from_str(&body).unwrap();
        assert!(stats["Memory"]["Total"].as_u64() > Some(0), "{stats:#}");
        assert_eq!(stats["CPU"][0]["CPU"], "cpu0", "{stats:#}");
        assert!(stats["AllocDirStats"]["Size"].as_u64() > Some(0), "{stats:#}");
        assert!(stats["Uptime"].as_u64() > Some(0), "{stats:#}");
    }
    // The node's disk for ephemeral_disk sizes: what is free where allocation dirs live.
    let node = get(port, &format!("/v1/node/{node_id}")).unwrap();
    assert!(node["NodeResources"]["Disk"]["DiskMB"].as_u64() > Some(0), "{node:#}");
    let (code, body) = status("GET", "/v1/client/stats?node_id=nope");
    assert_eq!((code, body.trim()), (404, "Unknown node nope"));
    assert_eq!(
        status("GET", "/v1/client/stats?nodeid=x").0,
        400,
        "an unknown parameter"
    );

    // An operator's client GC: the running replacement is never collected, the finished
    // allocation is (its directory removed), and only once the servers list it finished.
    let alloc_dir = |id: &str| specs[0].data_dir.join("alloc").join(id);
    assert!(alloc_dir(&first).is_dir() && alloc_dir(&second).is_dir());
    let (code, body) = status("GET", &format!("/v1/client/allocation/{second}/gc"));
    assert_eq!(
        (code, body.trim()),
        (400, "No such allocation on client or allocation not eligible for GC")
    );
    wait_for(Duration::from_secs(10), || {
        assert_eq!(status("PUT", "/v1/client/gc"), (200, String::new()));
        (!alloc_dir(&first).exists()).then_some(())
    })
    .unwrap_or_else(|| panic!("the finished allocation is collected:\n{}", agent.log()));
    assert!(alloc_dir(&second).is_dir(), "the running allocation is kept");
    assert!(support::running(
        lines(&marks)[1].split_once(' ').unwrap().1.parse().unwrap()
    ));
    let missing = cli(port, &["alloc", "stop", "ffffffff"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("No allocation(s) with prefix or id \"ffffffff\" found"),
        "{missing:?}"
    );
}

/// `alloc signal` and `alloc restart` sent to a server-only agent reach the task on a
/// client-only agent: the server relays them to the client that runs the allocation, over
/// the stream the client keeps attached to it (the client's advertised RPC address is dead).
#[test]
fn signals_and_restarts_sent_to_a_server_reach_the_task_on_its_client() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let server = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    // The client tells the servers an RPC address nothing listens on: every relayed request
    // below must reach it down the stream it keeps attached to its server, as in Nomad.
    let client = unreachable_client(root.path(), specs[0].rpc);
    let http = client.spec.http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}\n{}", server.log(), client.log()));
    let marks = root.path().join("marks");
    let file = root.path().join("web.hcl");
    std::fs::write(&file, jobspec(&marks)).unwrap();
    stdout(&cli(port, &["job", "run", "-detach", file.to_str().unwrap()]));
    let alloc = wait_for(Duration::from_secs(20), || {
        Some(lines(&marks).first()?.split_once(' ')?.0.to_string())
    })
    .unwrap_or_else(|| panic!("the task starts:\n{}", client.log()));

    stdout(&cli(port, &["alloc", "signal", "-s", "SIGUSR1", &alloc[..8], "t"]));
    wait_for(Duration::from_secs(10), || {
        lines(&marks).contains(&format!("{alloc} USR1")).then_some(())
    })
    .unwrap_or_else(|| panic!("the task sees the signal: {:?}\n{}", lines(&marks), client.log()));

    stdout(&cli(port, &["alloc", "restart", &alloc[..8]]));
    let starts = |marks: &Path| {
        lines(marks)
            .iter()
            .filter(|line| line.starts_with(&alloc) && !line.ends_with("USR1"))
            .count()
    };
    wait_for(Duration::from_secs(20), || (starts(&marks) == 2).then_some(()))
        .unwrap_or_else(|| panic!("the task starts again: {:?}\n{}", lines(&marks), client.log()));
    let restarted = wait_for(Duration::from_secs(10), || {
        let alloc = get(port, &format!("/v1/allocation/{alloc}"))?;
        (alloc["TaskStates"]["t"]["Restarts"] == 1 && alloc["TaskStates"]["t"]["State"] == "running").then_some(alloc)
    })
    .unwrap_or_else(|| panic!("the servers hear of the restart:\n{}", client.log()));
    let kinds: Vec<&str> = restarted["TaskStates"]["t"]["Events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|event| event["Type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"Signaling") && kinds.contains(&"Restart Signaled"),
        "{kinds:?}"
    );

    // The client node's own usage, asked of the server by node ID and relayed down the
    // client's stream; the server-only agent has no client of its own to answer for.
    let node_id = get(port, "/v1/nodes").unwrap()[0]["ID"].as_str().unwrap().to_string();
    let (code, body) = support::http_status("GET", port, &format!("/v1/client/stats?node_id={node_id}"), None).unwrap();
    assert_eq!(code, 200, "{body}");
    let host: Value = serde_json::from_str(&body).unwrap();
    assert!(host["Memory"]["Total"].as_u64() > Some(0), "{host:#}");
    let (code, body) = support::http_status("GET", port, "/v1/client/stats", None).unwrap();
    assert_eq!((code, body.trim()), (400, "Nomad client not enabled"));

    // Its resource usage, read through the server.
    let stats = get(port, &format!("/v1/client/allocation/{alloc}/stats")).expect("stats through the server");
    assert_eq!(stats["Tasks"]["t"]["State"], "running", "{stats:#}");
    assert!(
        stats["ResourceUsage"]["MemoryStats"]["RSS"].as_u64().is_some(),
        "{stats:#}"
    );

    // The allocation dir, read through the server: listed, printed, and confined.
    let listing = stdout(&cli(port, &["alloc", "fs", &alloc[..8], "t/local"]));
    assert!(
        listing.contains("-rw-r--r--  6 B") && listing.contains("hello"),
        "{listing}"
    );
    assert_eq!(
        stdout(&cli(port, &["alloc", "fs", &alloc[..8], "t/local/hello"])),
        "hello\n"
    );
    let fs = |endpoint: &str, path: &str| {
        let url = format!("http://127.0.0.1:{port}/v1/client/fs/{endpoint}/{alloc}?path={path}&limit=3");
        match ureq::get(&url).call() {
            Ok(response) => (response.status(), response.into_string().unwrap()),
            Err(ureq::Error::Status(code, response)) => (code, response.into_string().unwrap()),
            Err(error) => panic!("{url}: {error}"),
        }
    };
    assert_eq!(fs("readat", "/t/local/hello").1, "hel");
    // stream, not following: Nomad's frames, the file's bytes in base64.
    let (code, framed) = fs("stream", "/t/local/hello&follow=false");
    let frame: serde_json::Value = serde_json::from_str(&framed).unwrap();
    assert_eq!(
        (code, frame["Data"].as_str(), frame["Offset"].as_u64()),
        (200, Some("aGVsbG8K"), Some(6))
    );
    for endpoint in ["ls", "stat", "cat", "readat", "stream"] {
        for escape in ["../../..", "/t/../../c1", "t/local/out"] {
            let (code, body) = fs(endpoint, escape);
            assert_eq!(
                (code, body.trim()),
                (400, "Path escapes the alloc directory"),
                "{endpoint} {escape}"
            );
        }
    }
    assert_eq!(fs("cat", "/t/local/nope").0, 404);
    // Nomad's stream refuses a missing file with 400 before it starts.
    assert_eq!(fs("stream", "/t/local/nope&follow=false").0, 400);

    // Through a client-only agent that does not run it: handed to the servers, relayed on.
    let (bystander_spec, bystander_args) = support::client_spec(root.path(), "c2", specs[0].rpc);
    let http2 = bystander_spec.http;
    let bystander = Agent::start(bystander_spec, bystander_args);
    let url = format!("http://127.0.0.1:{http2}/v1/client/fs/cat/{alloc}?path=/t/local/hello");
    let through = wait_for(Duration::from_secs(20), || {
        ureq::get(&url).call().ok()?.into_string().ok()
    })
    .unwrap_or_else(|| panic!("a bystander client relays:\n{}", bystander.log()));
    assert_eq!(through, "hello\n");
    // And the cluster's state through it: a client-only agent hands reads to the servers, so
    // the CLI pointed at any client works (`alloc status` resolves the prefix, then reads).
    let status = stdout(&cli(http2, &["alloc", "status", &alloc[..8]]));
    assert!(status.contains("Task \"t\" is \"running\""), "{status}");
    let job = stdout(&cli(http, &["job", "status", "web"]));
    assert!(job.contains("Summary"), "{job}");

    // alloc exec through the server: the task's environment, its exit code, its stdin.
    let exec = cli(
        port,
        &[
            "alloc",
            "exec",
            "-i=false",
            &alloc[..8],
            "sh",
            "-c",
            "echo $NOMAD_ALLOC_ID; exit 3",
        ],
    );
    assert_eq!(exec.status.code(), Some(3), "{exec:?}");
    assert_eq!(String::from_utf8_lossy(&exec.stdout), format!("{alloc}\n"));
    let mut cat = std::process::Command::new(support::AGENT)
        .args(["alloc", "exec", &alloc[..8], "cat"])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    cat.stdin.take().unwrap().write_all(b"typed in\n").unwrap();
    let cat = support::ChildGuard(cat).wait_with_output(Duration::from_secs(20));
    assert!(cat.status.success(), "{cat:?}");
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "typed in\n");
    // -t: the command's stdin is a terminal.
    let tty = cli(
        port,
        &[
            "alloc",
            "exec",
            "-t=true",
            "-i=false",
            &alloc[..8],
            "sh",
            "-c",
            "test -t 0 && echo on-a-tty",
        ],
    );
    assert!(stdout(&tty).contains("on-a-tty"), "{tty:?}");

    // Refused with Nomad's words, through the relay too.
    let bad_task = cli(port, &["alloc", "restart", &alloc[..8], "nope"]);
    assert!(
        String::from_utf8_lossy(&bad_task.stderr).contains("404 (Could not find task runner for task: nope)"),
        "{bad_task:?}"
    );
    let bad_signal = cli(port, &["alloc", "signal", "-s", "SIGNOPE", &alloc[..8]]);
    assert!(
        String::from_utf8_lossy(&bad_signal.stderr).contains("400 (Invalid signal \"SIGNOPE\")"),
        "{bad_signal:?}"
    );
}

/// `alloc exec` into an `exec` task (as root; the exec driver needs it): the command sees the
/// task's root and is a process of the task's PID namespace (a small pid, only the task's
/// processes in its /proc).
#[test]
fn exec_enters_an_exec_tasks_root_and_pid_namespace() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the exec driver needs root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers with exec:\n{}", agent.log()));
    let file = root.path().join("iso.hcl");
    std::fs::write(
        &file,
        r#"job "iso" {
  group "g" {
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo inside > /local/mark; sleep 600"]
      }
      kill_timeout = "1s"
    }
  }
}
"#,
    )
    .unwrap();
    stdout(&cli(port, &["job", "run", "-detach", file.to_str().unwrap()]));
    let alloc = wait_for(Duration::from_secs(20), || {
        let allocs = get(port, "/v1/job/iso/allocations")?;
        let alloc = &allocs[0];
        (alloc["TaskStates"]["t"]["State"] == "running").then(|| alloc["ID"].as_str().unwrap().to_string())
    })
    .unwrap_or_else(|| panic!("the exec task runs:\n{}", agent.log()));
    let seen = wait_for(Duration::from_secs(10), || {
        let out = cli(
            port,
            &[
                "alloc",
                "exec",
                "-i=false",
                &alloc,
                "sh",
                "-c",
                "cat /local/mark; echo $$; ls /proc | grep -c '^[0-9]'",
            ],
        );
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .unwrap_or_else(|| panic!("alloc exec runs in the task:\n{}", agent.log()));
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines[0], "inside", "the task's root: {seen}");
    let pid: u32 = lines[1].parse().unwrap();
    let processes: u32 = lines[2].parse().unwrap();
    assert!(pid < 20 && processes < 20, "the task's PID namespace: {seen}");
}

/// Three servers; the client is attached to the first and its advertised RPC address is dead.
/// A read sent to each of the other two still reaches it: they pass it to the server it is
/// attached to (Nomad routes through the server the client is connected to).
#[test]
fn any_server_reaches_a_client_attached_to_another() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let servers: Vec<Agent> = (0..3)
        .map(|index| Agent::start(specs[index].clone(), server_args(&specs, index)))
        .collect();
    let refs: Vec<&Agent> = servers.iter().collect();
    wait_for(Duration::from_secs(60), || support::agreed_leader(&refs, 3)).expect("the servers form a cluster");
    let client = unreachable_client(root.path(), specs[0].rpc);
    let port = specs[1].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", client.log()));
    let marks = root.path().join("marks");
    let file = root.path().join("web.hcl");
    std::fs::write(&file, jobspec(&marks)).unwrap();
    stdout(&cli(port, &["job", "run", "-detach", file.to_str().unwrap()]));
    let alloc = wait_for(Duration::from_secs(30), || {
        Some(lines(&marks).first()?.split_once(' ')?.0.to_string())
    })
    .unwrap_or_else(|| panic!("the task starts:\n{}", client.log()));
    for server in &specs[1..] {
        let url = format!(
            "http://127.0.0.1:{}/v1/client/fs/cat/{alloc}?path=/t/local/hello",
            server.http
        );
        let read = wait_for(Duration::from_secs(20), || {
            ureq::get(&url).call().ok()?.into_string().ok()
        })
        .unwrap_or_else(|| panic!("{} relays through the first server:\n{}", server.name, client.log()));
        assert_eq!(read, "hello\n");
    }
}
