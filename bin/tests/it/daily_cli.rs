//! The daily commands against a real agent: `job init|validate|inspect|history|allocs|eval`,
//! `eval list|status`, `var get|put|list|purge` with check-and-set, the top-level `status`
//! and `node config`, with `-json` and `-t` where Nomad has them.

use std::time::Duration;

use serde_json::Value;

use crate::support::{self, get_json as get, wait_for};

#[test]
fn the_daily_commands_answer_as_nomads_do() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());
    let dir = root.path();
    let run = |args: &[&str]| support::cli_in(dir, port, args);

    // What `node status` reads: the registration event and when each driver was fingerprinted.
    let nodes = get(port, "/v1/nodes").unwrap();
    let node = get(port, &format!("/v1/node/{}", nodes[0]["ID"].as_str().unwrap())).unwrap();
    assert_eq!(node["Events"][0]["Message"], "Node registered", "{node}");
    assert_eq!(node["Events"][0]["Subsystem"], "Cluster", "{node}");
    let updated = node["Drivers"]["raw_exec"]["UpdateTime"].as_str().unwrap();
    assert!(updated.starts_with("20"), "a real time, not Go's zero: {updated}");

    // job init writes an example that validates and runs as it is; a second init refuses.
    let (code, out) = run(&["job", "init"]);
    assert_eq!((code, out.trim()), (0, "Example job file written to example.nomad.hcl"));
    let (code, out) = run(&["job", "init"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Job 'example.nomad.hcl' already exists"), "{out}");
    let (code, out) = run(&["job", "validate", "example.nomad.hcl"]);
    assert_eq!((code, out.trim()), (0, "Job validation successful"));
    std::fs::write(
        dir.join("bad.hcl"),
        "job \"bad\" {\n  priority = 500\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n",
    )
    .unwrap();
    let (code, out) = run(&["job", "validate", "bad.hcl"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Job priority must be between [1, 100]"), "{out}");
    let (code, out) = run(&["job", "run", "example.nomad.hcl"]);
    assert_eq!(code, 0, "{out}");

    // inspect: the stored job as JSON, or through a template.
    let (code, out) = run(&["job", "inspect", "example"]);
    assert_eq!(code, 0, "{out}");
    let inspected: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        inspected["Job"]["TaskGroups"][0]["ReschedulePolicy"]["DelayFunction"],
        "exponential"
    );
    assert!(out.starts_with("{\n    \"Job\""), "indented as Nomad's: {out}");
    let (code, out) = run(&[
        "job",
        "inspect",
        "-t",
        "{{.ID}} {{range .TaskGroups}}{{.Name}}={{.Count}}{{end}}",
        "example",
    ]);
    assert_eq!((code, out.trim()), (0, "example hello=2"));

    // A second version: history lists both, newest first; -json and -version narrow it.
    let spec = std::fs::read_to_string(dir.join("example.nomad.hcl")).unwrap();
    std::fs::write(dir.join("example.nomad.hcl"), spec.replace("count = 2", "count = 1")).unwrap();
    let (code, out) = run(&["job", "run", "-detach", "example.nomad.hcl"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["job", "history", "example"]);
    assert_eq!(code, 0, "{out}");
    let versions: Vec<&str> = out.lines().filter(|line| line.starts_with("Version")).collect();
    assert_eq!(versions, ["Version     = 1", "Version     = 0"], "{out}");
    let (code, out) = run(&["job", "history", "-json", "-version", "0", "example"]);
    assert_eq!(code, 0, "{out}");
    let old: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(old["TaskGroups"][0]["Count"], 2);
    let (code, out) = run(&["job", "history", "-version", "7", "example"]);
    assert_eq!(code, 1, "{out}");

    // allocs and evaluations.
    let allocs = wait_for(Duration::from_secs(30), || {
        let (code, out) = run(&["job", "allocs", "-json", "example"]);
        let allocs: Value = serde_json::from_str(&out).ok()?;
        (code == 0 && allocs.as_array()?.iter().any(|a| a["ClientStatus"] == "running")).then_some(allocs)
    })
    .unwrap_or_else(|| panic!("an allocation runs:\n{}", agent.log()));
    let (code, out) = run(&["job", "allocs", "example"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ID  "), "{out}");
    assert!(out.contains(&allocs[0]["ID"].as_str().unwrap()[..8]), "{out}");
    let (code, out) = run(&["job", "eval", "-detach", "example"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("Created eval ID: "), "{out}");
    let (code, out) = run(&["eval", "list", "-job", "example"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Triggered By") && out.contains("job-register"), "{out}");
    let (code, out) = run(&["eval", "list", "-t", "{{range .}}{{.JobID}} {{end}}", "-job", "example"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.trim().split(' ').all(|job| job == "example"), "{out}");
    let (code, out) = run(&["eval", "list", "-json", "-status", "complete"]);
    let evals: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{code} {out}"));
    let eval_id = evals[0]["ID"].as_str().unwrap().to_string();
    assert!(evals.as_array().unwrap().iter().all(|e| e["Status"] == "complete"));
    let (code, out) = run(&["eval", "status", &eval_id]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("ID                 = {eval_id}")), "{out}");
    let (code, out) = run(&["eval", "status", "-t", "{{.Status}}", &eval_id]);
    assert_eq!((code, out.trim()), (0, "complete"));
    let (code, out) = run(&["eval", "status", "00000000-0000-0000-0000-000000000000"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("No evaluation(s) with prefix or id"), "{out}");

    // The top-level status: the job list, or what a prefix names.
    let (code, out) = run(&["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("example"), "{out}");
    let (code, out) = run(&["status", "examp"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ID          = example"), "{out}");
    let (code, out) = run(&["status", &allocs[0]["ID"].as_str().unwrap()[..8]]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Name                = example.hello["), "{out}");
    let (code, out) = run(&["status", "zzzz-nothing"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("No matches found for prefix \"zzzz-nothing\""), "{out}");

    // Variables, with check-and-set: a stale index is refused and changes nothing.
    let (code, out) = run(&["var", "put", "app/db", "user=web", "pass=s3cret"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["var", "get", "-item", "user", "app/db"]);
    assert_eq!((code, out.trim()), (0, "web"));
    let (code, out) = run(&["var", "get", "-json", "app/db"]);
    let variable: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{code} {out}"));
    let index = variable["ModifyIndex"].as_u64().unwrap();
    let (code, out) = run(&["var", "put", "-check-index", "1", "app/db", "user=late"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Check-and-Set conflict"), "{out}");
    let (code, out) = run(&["var", "put", &format!("-check-index={index}"), "app/db", "user=next"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["var", "get", "-item", "user", "app/db"]);
    assert_eq!((code, out.trim()), (0, "next"));
    let (code, out) = run(&["var", "put", "other/x", "k=v"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["var", "list", "app"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("app/db") && !out.contains("other/x"), "{out}");
    let (code, out) = run(&["var", "purge", "app/db"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&["var", "get", "app/db"]);
    assert_eq!((code, out.trim()), (1, "Variable not found"));

    // node config: the servers this agent's client talks to.
    let (code, out) = run(&["node", "config", "-servers"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.trim().contains(':'), "{out}");
    let (code, out) = run(&["node", "config"]);
    assert_eq!(code, 1, "{out}");
}

/// Namespaces: `default` always there, others made, described, listed and deleted with the
/// CLI; a job goes only into a namespace that exists, and a namespace with a running job in it
/// cannot be deleted.
#[test]
fn namespaces_are_made_used_and_deleted() {
    let root = tempfile::tempdir().unwrap();
    let agent = support::start_dev_with_mock_driver(root.path());
    let port = agent.spec.http;
    let dir = root.path();
    let run = |args: &[&str]| support::cli_in(dir, port, args);

    let (code, out) = run(&["namespace", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("default  Default shared namespace"), "{out}");
    let (code, out) = run(&[
        "namespace",
        "apply",
        "--description",
        "Production APIs",
        "--meta",
        "team=api",
        "prod",
    ]);
    assert_eq!((code, out.trim()), (0, "Successfully applied namespace \"prod\"!"));
    let (code, out) = run(&["namespace", "status", "prod"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("Name        = prod\nDescription = Production APIs\nQuota       = <none>"),
        "{out}"
    );
    assert!(out.contains("Metadata\nteam = api"), "{out}");
    // An update keeps the metadata it does not name.
    run(&["namespace", "apply", "--description", "Prod", "prod"]);
    let (_, out) = run(&[
        "namespace",
        "inspect",
        "-t",
        "{{ .Description }} {{ .Meta.team }}",
        "prod",
    ]);
    assert_eq!(out.trim(), "Prod api");
    let (code, out) = run(&["namespace", "apply", "no spaces"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("invalid name \"no spaces\". Must match regex"), "{out}");
    let (code, out) = run(&["namespace", "status", "qa"]);
    assert_eq!((code, out.trim()), (1, "Namespace \"qa\" not found"));

    let job = |namespace: &str| {
        format!(
            r#"{{"Job":{{"ID":"web","Name":"web","Namespace":"{namespace}","Type":"service","Datacenters":["dc1"],"TaskGroups":[{{"Name":"g","Count":1,"Tasks":[{{"Name":"t","Driver":"mock","Config":{{"run_for":"60s"}},"Resources":{{"CPU":10,"MemoryMB":10}}}}]}}]}}}}"#
        )
    };
    let (code, body) = support::http_status("PUT", port, "/v1/jobs", Some(&job("qa"))).unwrap();
    assert_eq!(
        (code, body.trim()),
        (400, "job \"web\" is in nonexistent namespace \"qa\"")
    );
    let (code, body) = support::http_status("PUT", port, "/v1/jobs", Some(&job("prod"))).unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, out) = run(&["namespace", "delete", "prod"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("namespace \"prod\" has non-terminal jobs in regions: [global]"),
        "{out}"
    );
    let (code, out) = run(&["namespace", "delete", "default"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("default namespace can not be deleted"), "{out}");
    let (code, body) = support::http_status("DELETE", port, "/v1/job/web?namespace=prod&purge=true", None).unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, out) = run(&["namespace", "delete", "prod"]);
    assert_eq!((code, out.trim()), (0, "Successfully deleted namespace \"prod\"!"));
    let (_, out) = run(&["namespace", "list", "-json"]);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}

/// `monitor` streams the agent's log lines as they come, at the level asked (finer than the
/// agent's own); bad options are refused by name; `ui` says there is no UI rather than
/// printing a URL that answers 404.
#[test]
fn monitor_streams_the_agents_log_lines() {
    use std::io::BufRead as _;
    let root = tempfile::tempdir().unwrap();
    let agent = support::start_dev_with_mock_driver(root.path());
    let port = agent.spec.http;
    for (query, text) in [
        ("log_level=loud", "Unknown log level: loud"),
        ("node_id=nope", "node_id \"nope\" is not this agent's client"),
        ("plain=maybe", "\"plain\""),
    ] {
        let (code, body) = support::http_status("GET", port, &format!("/v1/agent/monitor?{query}"), None).unwrap();
        assert!(code == 400 && body.contains(text), "{query}: {code} {body}");
    }

    let mut monitor = support::ChildGuard(
        std::process::Command::new(support::AGENT)
            .args(["monitor", "--log-level", "debug"])
            .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the CLI starts"),
    );
    let stdout = monitor.0.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    // Work for the agent to log about, until a line arrives.
    let job = r#"{"Job":{"ID":"m","Name":"m","Type":"batch","Datacenters":["dc1"],"TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Driver":"mock","Config":{"run_for":"10ms"},"Resources":{"CPU":10,"MemoryMB":10}}]}]}}"#;
    let mut seen = Vec::new();
    let debug = wait_for(Duration::from_secs(20), || {
        support::http_status("PUT", port, "/v1/jobs", Some(job));
        while let Ok(line) = lines.recv_timeout(Duration::from_millis(100)) {
            seen.push(line);
        }
        seen.iter().find(|line| line.contains(" [DEBUG] ")).cloned()
    })
    .unwrap_or_else(|| {
        panic!(
            "debug lines reach the monitor of an info agent: {seen:?}\n{}",
            agent.log()
        )
    });
    assert!(debug.starts_with("20"), "{debug}");
    assert!(!seen.iter().any(|line| line.contains(" [TRACE] ")), "{seen:?}");
    drop(monitor);

    let (code, out) = support::cli_in(root.path(), port, &["ui"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("serves no web UI"), "{out}");
}
