//! Jobs through Nomad's HTTP API, for real: a single agent (server + client) takes a JSON job
//! as a client written for Nomad would send it, the scheduler places it, the client runs its
//! `raw_exec` tasks; an update replaces them with the new version; a bad job is refused with
//! every problem and nothing stored; a purge stops everything.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Agent, cluster_specs, http, http_status, server_args, wait_for};

fn pids(file: &Path) -> Vec<i32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect()
}

fn job(marker: &Path, version: &str) -> String {
    json!({"Job": {
        "ID": "web",
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 2,
            "Tasks": [{
                "Name": "t",
                "Driver": "raw_exec",
                "Env": {"VERSION": version},
                "Config": {"command": "/bin/sh", "args": ["-c", format!("echo $$ >> {}; exec sleep 300", marker.display())]},
                "KillTimeout": 2_000_000_000u64,
                // As Nomad's Go client sends unset fields.
                "VolumeMounts": null,
                "Services": [{"Name": "web-${TASK}", "Tags": ["v"], "Meta": null, "Checks": null}],
            }],
        }],
    }})
    .to_string()
}

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&http("GET", port, path, None)?).ok()
}

fn running(port: u16, version: u64) -> Option<Vec<Value>> {
    let allocs = get(port, "/v1/job/web/allocations")?;
    let live: Vec<Value> = allocs
        .as_array()?
        .iter()
        .filter(|a| a["DesiredStatus"] == "run" && a["ClientStatus"] == "running" && a["JobVersion"] == version)
        .cloned()
        .collect();
    (live.len() == 2).then_some(live)
}

#[test]
fn register_update_refuse_and_purge_a_job_over_http() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = support::start_with_client(root.path());

    let marker = root.path().join("pids");
    let reply: Value =
        serde_json::from_str(&http("PUT", port, "/v1/jobs", Some(&job(&marker, "1"))).expect("registered")).unwrap();
    let eval_id = reply["EvalID"].as_str().unwrap().to_string();
    assert!(reply["JobModifyIndex"].as_u64().unwrap() > 0, "{reply}");
    let first = wait_for(Duration::from_secs(30), || running(port, 0))
        .unwrap_or_else(|| panic!("both allocations run:\n{}", agent.log()));
    let names: Vec<&str> = first.iter().map(|a| a["Name"].as_str().unwrap()).collect();
    assert!(names.contains(&"web.g[0]") && names.contains(&"web.g[1]"), "{names:?}");
    let eval = get(port, &format!("/v1/evaluation/{eval_id}")).unwrap();
    assert_eq!(
        (eval["Status"].as_str(), eval["TriggeredBy"].as_str()),
        (Some("complete"), Some("job-register"))
    );
    // The evaluation's own allocations, and a new evaluation asked for by hand.
    let made = get(port, &format!("/v1/evaluation/{eval_id}/allocations")).unwrap();
    assert_eq!(made.as_array().map(Vec::len), Some(2), "{made}");
    let forced: Value =
        serde_json::from_str(&http("PUT", port, "/v1/job/web/evaluate", Some("{}")).expect("evaluated")).unwrap();
    let forced_id = forced["EvalID"].as_str().unwrap().to_string();
    assert_ne!(forced_id, eval_id);
    let again = wait_for(Duration::from_secs(30), || {
        let eval = get(port, &format!("/v1/evaluation/{forced_id}"))?;
        (eval["Status"] == "complete").then_some(eval)
    })
    .expect("the forced evaluation completes");
    assert_eq!(again["TriggeredBy"], "job-register");
    assert_eq!(
        running(port, 0).map(|allocs| allocs.len()),
        Some(2),
        "nothing to change: the same two"
    );
    assert_eq!(http_status("PUT", port, "/v1/job/nope/evaluate", None).unwrap().0, 404);
    // A node evaluated by hand: one node-update evaluation per job running on it.
    let node_id = get(port, "/v1/nodes").unwrap()[0]["ID"].as_str().unwrap().to_string();
    let answer: Value = serde_json::from_str(
        &http("PUT", port, &format!("/v1/node/{node_id}/evaluate"), None).expect("node evaluated"),
    )
    .unwrap();
    let ids = answer["EvalIDs"].as_array().unwrap();
    assert_eq!(ids.len(), 1, "{answer}");
    let made = get(port, &format!("/v1/evaluation/{}", ids[0].as_str().unwrap())).unwrap();
    assert_eq!(
        (&made["TriggeredBy"], &made["JobID"]),
        (&json!("node-update"), &json!("web"))
    );
    assert_eq!(made["NodeID"], node_id.as_str());
    assert_eq!(http_status("PUT", port, "/v1/node/nope/evaluate", None).unwrap().0, 404);
    let force = json!({"EvalOptions": {"ForceReschedule": true}}).to_string();
    assert_eq!(
        http_status("PUT", port, "/v1/job/web/evaluate", Some(&force))
            .unwrap()
            .0,
        400
    );
    let listed = get(port, "/v1/jobs").unwrap();
    assert_eq!(listed[0]["ID"], "web");
    assert_eq!(listed[0]["Status"], "running");
    assert_eq!(listed[0]["JobSummary"]["Summary"]["g"]["Running"], 2);
    wait_for(Duration::from_secs(10), || (pids(&marker).len() == 2).then_some(())).expect("two tasks");
    let old_pids = pids(&marker);
    // List stubs carry resources only when asked (`?resources=true`, Go's booleans).
    let plain = get(port, "/v1/allocations").unwrap();
    assert!(plain[0].get("AllocatedResources").is_none(), "{plain}");
    let with = get(port, "/v1/allocations?resources=true").unwrap();
    assert!(with[0]["AllocatedResources"]["Tasks"]["t"].is_object(), "{with}");
    let nodes = get(port, "/v1/nodes?resources=True").unwrap();
    assert!(
        nodes[0]["NodeResources"]["Cpu"]["CpuShares"].as_u64().unwrap() > 0,
        "{nodes}"
    );
    assert!(get(port, "/v1/nodes").unwrap()[0].get("NodeResources").is_none());

    // An update: version 1 replaces both, each handing over to the one it replaces.
    http("PUT", port, "/v1/job/web", Some(&job(&marker, "2"))).expect("updated");
    let second = wait_for(Duration::from_secs(60), || running(port, 1))
        .unwrap_or_else(|| panic!("the new version runs:\n{}", agent.log()));
    let old_ids: Vec<&str> = first.iter().map(|a| a["ID"].as_str().unwrap()).collect();
    for alloc in &second {
        let full = get(port, &format!("/v1/allocation/{}", alloc["ID"].as_str().unwrap())).unwrap();
        assert!(
            old_ids.contains(&full["PreviousAllocation"].as_str().unwrap()),
            "{full}"
        );
        assert_eq!(full["Metrics"]["NodesEvaluated"], 1);
    }
    wait_for(Duration::from_secs(30), || {
        old_pids.iter().all(|pid| !support::running(*pid)).then_some(())
    })
    .expect("the old tasks are stopped");
    let stored = get(port, "/v1/job/web").unwrap();
    assert_eq!(stored["Version"], 1);
    assert_eq!(stored["TaskGroups"][0]["Tasks"][0]["Services"][0]["Name"], "web-t");
    assert_eq!(
        get(port, "/v1/job/web/versions").unwrap()["Versions"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A bad job: every problem, HTTP 400, nothing stored.
    let bad = json!({"Job": {"ID": "bad", "Priority": 500, "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t",
        "Services": [{"Name": "no_underscores", "PortLabel": "http"}]}]}]}});
    let (code, body) = http_status("PUT", port, "/v1/jobs", Some(&bad.to_string())).unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.starts_with("4 errors occurred:"), "{body}");
    assert!(body.contains("Service name must be valid per RFC 1123"), "{body}");
    assert!(
        body.contains("port label \"http\" referenced by services no_underscores does not exist"),
        "{body}"
    );
    assert!(body.contains("Job priority must be between [1, 100]"), "{body}");
    assert!(body.contains("Missing task driver"), "{body}");
    assert_eq!(http_status("GET", port, "/v1/job/bad", None).unwrap().0, 404);

    // Purge: every task stops, the job is gone. Query booleans read as Go's ParseBool does
    // (the Python client sends `True`).
    let (code, body) = http_status("DELETE", port, "/v1/job/web?purge=maybe", None).unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("strconv.ParseBool: parsing \"maybe\": invalid syntax"),
        "{body}"
    );
    http("DELETE", port, "/v1/job/web?purge=True", None).expect("purged");
    let new_pids: Vec<i32> = pids(&marker)
        .into_iter()
        .filter(|pid| !old_pids.contains(pid))
        .collect();
    assert_eq!(new_pids.len(), 2);
    wait_for(Duration::from_secs(30), || {
        new_pids.iter().all(|pid| !support::running(*pid)).then_some(())
    })
    .unwrap_or_else(|| panic!("purging stops the tasks:\n{}", agent.log()));
    assert_eq!(http_status("GET", port, "/v1/job/web", None).unwrap().0, 404);
}

fn cli(port: u16, args: &[&str]) -> (i32, String) {
    support::cli_in(std::path::Path::new("."), port, args)
}

/// The operator CLI against a real agent: `job run` of an HCL file follows placement and
/// exits 0, or 2 when something cannot be placed; `job status` shows the tables; `job stop
/// -purge` stops it; an unknown job exits 1.
#[test]
fn the_cli_runs_inspects_and_stops_jobs() {
    let root = tempfile::tempdir().unwrap();
    let (_agent, port) = support::start_with_client(root.path());
    let spec = |name: &str, cpu: u64| {
        format!(
            "job \"{name}\" {{\n  group \"g\" {{\n    count = 2\n    task \"t\" {{\n      driver = \"raw_exec\"\n      config {{\n        command = \"/bin/sleep\"\n        args    = [\"300\"]\n      }}\n      resources {{\n        cpu    = {cpu}\n        memory = 32\n      }}\n    }}\n  }}\n}}\n"
        )
    };
    let web = root.path().join("web.hcl");
    std::fs::write(&web, spec("web", 50)).unwrap();
    let (code, out) = cli(port, &["job", "run", web.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("==> Monitoring evaluation"), "{out}");
    assert_eq!(out.matches("created: node").count(), 2, "{out}");
    assert!(out.contains("finished with status \"complete\""), "{out}");

    let (code, out) = cli(port, &["job", "status", "web"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ID          = web"), "{out}");
    assert!(
        out.contains("Task Group  Queued  Starting  Running  Failed  Complete  Lost"),
        "{out}"
    );

    let huge = root.path().join("huge.hcl");
    std::fs::write(&huge, spec("huge", 100_000_000)).unwrap();
    let (code, out) = cli(port, &["job", "run", huge.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("failed to place 2 allocations"), "{out}");
    assert!(out.contains("Dimension \"cpu\" exhausted on 1 nodes"), "{out}");

    let (code, out) = cli(port, &["node", "status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("raw_exec") && out.contains("ready"), "{out}");

    let (code, out) = cli(port, &["job", "stop", "-purge", "web"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(port, &["job", "status", "web"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("No job(s) with prefix or id \"web\" found"), "{out}");

    let bad = root.path().join("bad.hcl");
    std::fs::write(&bad, "job \"bad\" {\n  colour = \"blue\"\n}\n").unwrap();
    let (code, out) = cli(port, &["job", "run", bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("unsupported key \"colour\""), "{out}");
}

/// Lists page as Nomad's do: `per_page` items, `X-Nomad-NextToken` naming the first item of
/// the next page, absent on the last; following the tokens yields every item once, in order.
#[test]
fn job_and_evaluation_lists_page_with_next_tokens() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || get(port, "/v1/jobs"))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    for n in 0..5 {
        let job = json!({"Job": {
            "ID": format!("batch-{n}"),
            "Type": "batch",
            "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}],
        }});
        http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");
    }
    let walk = |list: &str| -> (Vec<Vec<String>>, Vec<String>) {
        let (mut pages, mut tokens, mut token) = (Vec::new(), Vec::new(), String::new());
        loop {
            let url = format!("http://127.0.0.1:{port}{list}?per_page=2&next_token={token}");
            let response = ureq::get(&url).call().unwrap();
            let next = response.header("X-Nomad-NextToken").map(String::from);
            let body: Value = response.into_json().unwrap();
            pages.push(
                body.as_array()
                    .unwrap()
                    .iter()
                    .map(|item| item["ID"].as_str().unwrap().to_string())
                    .collect(),
            );
            match next {
                Some(next) => {
                    tokens.push(next.clone());
                    token = next;
                }
                None => return (pages, tokens),
            }
        }
    };
    let (pages, tokens) = walk("/v1/jobs");
    assert_eq!(
        pages,
        vec![vec!["batch-0", "batch-1"], vec!["batch-2", "batch-3"], vec!["batch-4"]],
        "job pages"
    );
    assert_eq!(tokens, vec!["batch-2", "batch-4"]);
    // Prefix search: the jobs' IDs in order, nothing truncated; a context Nomad does not
    // have is refused.
    let search =
        |body: Value| -> (u16, String) { http_status("POST", port, "/v1/search", Some(&body.to_string())).unwrap() };
    let (code, body) = search(json!({"Prefix": "batch-", "Context": "jobs"}));
    assert_eq!(code, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        found["Matches"]["jobs"],
        json!(["batch-0", "batch-1", "batch-2", "batch-3", "batch-4"])
    );
    assert_eq!(found["Truncations"]["jobs"], false);
    let (code, body) = search(json!({"Prefix": "batch-3"}));
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((code, &found["Matches"]["jobs"]), (200, &json!(["batch-3"])), "{body}");
    assert_eq!(found["Matches"]["nodes"], json!([]), "every context searched: {body}");
    assert_eq!(search(json!({"Prefix": "x", "Context": "bogus"})).0, 400);
    // Fuzzy search: names containing the text, inside jobs too, with their scope.
    let fuzzy = |body: Value| -> (u16, String) {
        http_status("POST", port, "/v1/search/fuzzy", Some(&body.to_string())).unwrap()
    };
    let (code, body) = fuzzy(json!({"Text": "TCH-3", "Context": "all"}));
    assert_eq!(code, 200, "{body}");
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        found["Matches"]["jobs"],
        json!([{"ID": "batch-3", "Scope": ["default", "batch-3"]}]),
        "case ignored: {body}"
    );
    let (_, body) = fuzzy(json!({"Text": "bin/tr", "Context": "jobs"}));
    let found: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(found["Matches"]["commands"][0]["ID"], "/bin/true", "{body}");
    assert_eq!(
        found["Matches"]["commands"][0]["Scope"],
        json!(["default", "batch-0", "g", "t"]),
        "{body}"
    );
    assert_eq!(found["Matches"]["commands"].as_array().unwrap().len(), 5, "{body}");
    assert_eq!(
        fuzzy(json!({"Text": "b"})),
        (500, "fuzzy search query must be at least 2 characters, got 1".into())
    );
    assert_eq!(fuzzy(json!({"Text": "batch", "Context": "evals"})).0, 400);
    // Each job has its registration evaluation and, with no client to place on, a blocked one.
    let unpaged: Vec<String> = get(port, "/v1/evaluations")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|eval| eval["ID"].as_str().unwrap().to_string())
        .collect();
    let (pages, _) = walk("/v1/evaluations");
    assert!(pages.iter().all(|page| page.len() <= 2), "evaluation pages: {pages:?}");
    assert_eq!(pages.len(), unpaged.len().div_ceil(2), "evaluation pages: {pages:?}");
    assert_eq!(pages.concat(), unpaged, "every evaluation once, in ID order");

    // Variables page by path, nodes by ID (none here: the header is absent, the page empty).
    for path in ["p/a", "p/b", "p/c"] {
        http("PUT", port, &format!("/v1/var/{path}"), Some(r#"{"Items":{"k":"v"}}"#)).expect("written");
    }
    let first = ureq::get(&format!("http://127.0.0.1:{port}/v1/vars?per_page=2"))
        .call()
        .unwrap();
    assert_eq!(first.header("X-Nomad-NextToken"), Some("p/c"));
    let paths: Vec<String> = first
        .into_json::<Value>()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["Path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paths, vec!["p/a", "p/b"]);
    let last = ureq::get(&format!("http://127.0.0.1:{port}/v1/vars?per_page=2&next_token=p/c"))
        .call()
        .unwrap();
    assert_eq!(last.header("X-Nomad-NextToken"), None);
    assert_eq!(last.into_json::<Value>().unwrap().as_array().unwrap().len(), 1);
    let nodes = ureq::get(&format!("http://127.0.0.1:{port}/v1/nodes?per_page=1"))
        .call()
        .unwrap();
    assert_eq!(nodes.header("X-Nomad-NextToken"), None);
}

/// `?filter=` (go-bexpr) selects from every list on the items' full objects before paging,
/// as Nomad's paginator does; a bad expression or a field that is not there is an error
/// with go-bexpr's texts.
#[test]
fn lists_filter_with_go_bexpr_before_paging() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || get(port, "/v1/jobs"))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    for n in 0..4 {
        let team = if n % 2 == 0 { "ops" } else { "web" };
        let job = json!({"Job": {
            "ID": format!("job-{n}"),
            "Type": "batch",
            "Priority": 40 + n,
            "Meta": {"team": team},
            "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}],
        }});
        http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered");
    }
    let ids = |path: &str| -> (Vec<String>, Option<String>) {
        let response = ureq::get(&format!("http://127.0.0.1:{port}{path}")).call().unwrap();
        let next = response.header("X-Nomad-NextToken").map(String::from);
        let body: Value = response.into_json().unwrap();
        let ids = body
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["ID"].as_str().unwrap().to_string())
            .collect();
        (ids, next)
    };
    let query = |expr: &str| form_urlencoded::byte_serialize(expr.as_bytes()).collect::<String>();
    assert_eq!(
        ids(&format!("/v1/jobs?filter={}", query(r#"Meta.team == "ops""#))).0,
        vec!["job-0", "job-2"]
    );
    // Paging counts matching items only.
    let (first, next) = ids(&format!(
        "/v1/jobs?per_page=1&filter={}",
        query(r#"Meta.team == "web""#)
    ));
    assert_eq!((first, next.as_deref()), (vec!["job-1".to_string()], Some("job-3")));
    assert_eq!(
        ids(&format!(
            "/v1/jobs?filter={}",
            query(r#"Priority == 43 or "dc2" in Datacenters"#)
        ))
        .0,
        vec!["job-3"]
    );
    // Evaluations of one job, by their full object.
    let (evals, _) = ids(&format!("/v1/evaluations?filter={}", query(r#"JobID == "job-1""#)));
    assert!(!evals.is_empty());
    let (none, _) = ids(&format!("/v1/deployments?filter={}", query(r#"JobID == "job-1""#)));
    assert!(none.is_empty(), "batch jobs have no deployments");

    let bad = http_status("GET", port, &format!("/v1/jobs?filter={}", query("NotValid")), None).unwrap();
    assert_eq!(bad.0, 400, "{bad:?}");
    assert!(bad.1.starts_with("failed to read filter expression: "), "{bad:?}");
    let missing = http_status(
        "GET",
        port,
        &format!("/v1/allocations?filter={}", query(r#"InvalidField == "value""#)),
        None,
    )
    .unwrap();
    assert_eq!(missing, (200, "[]".to_string()), "no allocations: nothing to evaluate");
    let missing = http_status(
        "GET",
        port,
        &format!("/v1/jobs?filter={}", query(r#"InvalidField == "value""#)),
        None,
    )
    .unwrap();
    assert_eq!(
        missing,
        (
            500,
            "error finding value in datum: /InvalidField at part 0: couldn't find key \"InvalidField\"".into()
        )
    );
}

/// The job family's shapes, table-driven: each read answers exactly Nomad's field names
/// (`api.JobListStub`, `JobSummary`, `TaskGroupSummary`, `JobRegisterResponse`, scaling
/// policy stubs), durations and times as Nomad sends them.
#[test]
fn the_job_family_answers_nomads_field_names() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || get(port, "/v1/jobs"))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    let job = json!({"Job": {
        "ID": "shaped",
        "Type": "service",
        "Meta": {"team": "ops"},
        "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "g",
            "Count": 1,
            "Scaling": {"Min": 1, "Max": 2},
            "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}],
        }],
    }});
    let registered: Value =
        serde_json::from_str(&http("PUT", port, "/v1/jobs", Some(&job.to_string())).expect("registered")).unwrap();
    let (keys, sorted) = (support::field_names, support::sorted_names);
    const STUB: &[&str] = &[
        "ID",
        "ParentID",
        "Name",
        "Namespace",
        "Datacenters",
        "Type",
        "Priority",
        "Periodic",
        "ParameterizedJob",
        "Stop",
        "Status",
        "StatusDescription",
        "JobSummary",
        "CreateIndex",
        "ModifyIndex",
        "JobModifyIndex",
        "SubmitTime",
    ];
    let with_meta: Vec<&str> = STUB.iter().copied().chain(["Meta"]).collect();
    let table: Vec<(&str, Value, Vec<String>)> = vec![
        (
            "JobRegisterResponse",
            registered.clone(),
            sorted(&[
                "EvalCreateIndex",
                "EvalID",
                "JobModifyIndex",
                "Warnings",
                "Index",
                "LastContact",
                "KnownLeader",
                "NextToken",
            ]),
        ),
        ("JobListStub", get(port, "/v1/jobs").unwrap()[0].clone(), sorted(STUB)),
        (
            "JobListStub with meta",
            get(port, "/v1/jobs?meta=true").unwrap()[0].clone(),
            sorted(&with_meta),
        ),
        (
            "JobSummary",
            get(port, "/v1/job/shaped/summary").unwrap(),
            sorted(&[
                "JobID",
                "Namespace",
                "Summary",
                "Children",
                "CreateIndex",
                "ModifyIndex",
            ]),
        ),
        (
            "TaskGroupSummary",
            get(port, "/v1/job/shaped/summary").unwrap()["Summary"]["g"].clone(),
            sorted(&["Queued", "Complete", "Failed", "Running", "Starting", "Lost", "Unknown"]),
        ),
        (
            "ScalingPolicyListStub",
            get(port, "/v1/scaling/policies").unwrap()[0].clone(),
            sorted(&["ID", "Enabled", "Type", "Target", "CreateIndex", "ModifyIndex"]),
        ),
    ];
    for (shape, value, expected) in table {
        assert_eq!(keys(&value), expected, "{shape}: {value}");
    }
    let stub = &get(port, "/v1/jobs?meta=true").unwrap()[0];
    assert_eq!(stub["Meta"]["team"], "ops");
    assert!(
        stub["SubmitTime"].as_i64().unwrap() > 1_000_000_000_000_000_000,
        "nanoseconds"
    );
    assert_eq!(registered["Warnings"], "");
}

/// A jobspec that takes hcl-rs minutes to parse (issue 54's bomb) is abandoned at the parse
/// deadline with a 400 naming it, at most four run at once (the fifth is refused with 503 at
/// once), and meanwhile the agent goes on serving: a job registered over JSON and reads.
#[test]
fn a_jobspec_that_takes_minutes_to_parse_is_abandoned_and_the_agent_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || get(port, "/v1/jobs"))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    let bomb = format!(
        "job \"x\" {{\n  meta {{\n{}    x = \"1\"\n  }}\n}}\n",
        "    patts = \"2= \"/srv/ {\n".repeat(30)
    );
    let body = json!({ "JobHCL": bomb }).to_string();
    let parses: Vec<_> = (0..4)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || http_status("POST", port, "/v1/jobs/parse", Some(&body)))
        })
        .collect();
    for parse in parses {
        let (code, text) = parse.join().unwrap().expect("answered");
        assert_eq!(
            (code, text.as_str()),
            (400, "job spec took longer than 5s to parse and was abandoned")
        );
    }
    // The four still run, at nice 19, past their deadline: the next parse is refused at once.
    let (code, text) = http_status("POST", port, "/v1/jobs/parse", Some(&body)).expect("answered");
    assert_eq!(
        (code, text.as_str()),
        (503, "too many job spec parses in progress (4); try again later")
    );
    // The agent serves everything else meanwhile.
    let job = json!({"Job": {
        "ID": "after-the-bomb",
        "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{
            "Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["600"]}
        }]}]
    }})
    .to_string();
    let (code, text) = http_status("PUT", port, "/v1/jobs", Some(&job)).expect("answered");
    assert_eq!(code, 200, "{text}");
    let listed = http("GET", port, "/v1/jobs", None).unwrap();
    assert!(listed.contains("after-the-bomb"), "{listed}");
}

/// Issue 54 §3: the bomb sent to the leader of a 3-server cluster, four at a time (the most
/// that run) and once more (refused), costs it nothing: every server names the same leader
/// throughout, and a write through it commits meanwhile. Parsed inline on a runtime worker,
/// two of them had made a leader lose leadership and autopilot remove it from Raft.
#[test]
fn the_bomb_sent_to_a_three_server_leader_costs_it_nothing() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let agents: Vec<Agent> = (0..3)
        .map(|i| Agent::start(specs[i].clone(), server_args(&specs, i)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    let leader =
        wait_for(Duration::from_secs(60), || support::agreed_leader(&refs, 3)).expect("the servers form a cluster");
    let at = agents
        .iter()
        .position(|agent| agent.rpc_addr() == leader)
        .expect("the leader is one of them");
    let port = agents[at].spec.http;
    let bomb = format!(
        "job \"x\" {{\n  meta {{\n{}    x = \"1\"\n  }}\n}}\n",
        "    patts = \"2= \"/srv/ {\n".repeat(30)
    );
    let body = json!({ "JobHCL": bomb }).to_string();
    let parses: Vec<_> = (0..5)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || http_status("POST", port, "/v1/jobs/parse", Some(&body)))
        })
        .collect();
    // While they run: every server names the same leader, every quarter second.
    let started = std::time::Instant::now();
    let mut looks = 0;
    while started.elapsed() < Duration::from_secs(6) {
        for agent in &agents {
            assert_eq!(
                agent.leader().as_deref(),
                Some(leader.as_str()),
                "leadership moved:\n{}",
                agents[at].log()
            );
        }
        looks += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    let write = json!({"Items": {"k": "v"}}).to_string();
    let (code, text) = http_status("PUT", port, "/v1/var/bomb/after", Some(&write)).expect("answered");
    assert_eq!(code, 200, "{text}");
    let mut codes: Vec<u16> = parses
        .into_iter()
        .map(|parse| parse.join().unwrap().expect("answered").0)
        .collect();
    codes.sort();
    assert_eq!(
        codes,
        [400, 400, 400, 400, 503],
        "four abandoned at the deadline, the fifth refused"
    );
    assert!(looks >= 20, "looked {looks} times");
    assert_eq!(support::agreed_leader(&refs, 3).as_deref(), Some(leader.as_str()));
}

/// `/v1/jobs/parse` turns a jobspec into Nomad's JSON through the CLI's parser, and
/// `/v1/validate/job` checks a job as a register would, storing nothing.
#[test]
fn jobspecs_parse_and_jobs_validate_without_registering() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || get(port, "/v1/jobs"))
        .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    let hcl = r#"job "parsed" {
  datacenters = ["dc1"]
  group "g" {
    count = 3
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#;
    let body = json!({ "JobHCL": hcl, "Canonicalize": false }).to_string();
    let parsed: Value = serde_json::from_str(&http("POST", port, "/v1/jobs/parse", Some(&body)).unwrap()).unwrap();
    assert_eq!(parsed["ID"], "parsed", "{parsed}");
    assert_eq!(parsed["TaskGroups"][0]["Count"], 3, "{parsed}");
    assert_eq!(parsed["TaskGroups"][0]["Tasks"][0]["Config"]["command"], "/bin/true");
    let body = json!({ "JobHCL": hcl, "Canonicalize": true }).to_string();
    let canonical: Value = serde_json::from_str(&http("POST", port, "/v1/jobs/parse", Some(&body)).unwrap()).unwrap();
    assert_eq!(
        (&canonical["Priority"], &canonical["Type"], &canonical["Namespace"]),
        (&json!(50), &json!("service"), &json!("default")),
        "{canonical}"
    );
    let body = json!({ "JobHCL": "job \"x\" { group \"g\" { bogus = 1 } }" }).to_string();
    let (code, text) = http_status("POST", port, "/v1/jobs/parse", Some(&body)).unwrap();
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("bogus"), "names what was wrong: {text}");

    // Validated as a register would be, nothing stored either way.
    let good = json!({ "Job": canonical }).to_string();
    let answer: Value = serde_json::from_str(&http("PUT", port, "/v1/validate/job", Some(&good)).unwrap()).unwrap();
    assert_eq!(answer["ValidationErrors"], json!([]), "{answer}");
    assert_eq!(
        (&answer["Error"], &answer["DriverConfigValidated"]),
        (&json!(""), &json!(true))
    );
    let bad = json!({"Job": {"ID": "bad", "Priority": 500, "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t"}]}]}});
    let answer: Value =
        serde_json::from_str(&http("PUT", port, "/v1/validate/job", Some(&bad.to_string())).unwrap()).unwrap();
    let errors: Vec<&str> = answer["ValidationErrors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(errors.contains(&"Job priority must be between [1, 100]"), "{answer}");
    assert!(
        errors.contains(&"Task group g validation failed: Task t validation failed: Missing task driver"),
        "{answer}"
    );
    assert!(
        answer["Error"].as_str().unwrap().starts_with("2 errors occurred:"),
        "{answer}"
    );
    assert_eq!(http_status("GET", port, "/v1/job/parsed", None).unwrap().0, 404);
    assert_eq!(http_status("GET", port, "/v1/job/bad", None).unwrap().0, 404);

    // A field Drover has no place for is named, not dropped: validate lists it, register and
    // plan refuse it. One that asks for nothing (a Go client's zero value) or holds Nomad's
    // own default for a field Drover lacks passes.
    let with = |extra: Value| {
        let mut job = canonical.clone();
        for (key, value) in extra.as_object().unwrap() {
            job[key] = value.clone();
        }
        job["TaskGroups"][0]["Migrate"] = json!({"MaxParallel": 1, "HealthCheck": "checks"});
        json!({ "Job": job }).to_string()
    };
    let unknown = with(json!({"Multiregion": {"Strategy": {"MaxParallel": 1}}, "VaultToken": ""}));
    let answer: Value = serde_json::from_str(&http("PUT", port, "/v1/validate/job", Some(&unknown)).unwrap()).unwrap();
    assert_eq!(
        answer["ValidationErrors"],
        json!(["Job.Multiregion: not a field Drover takes; refused rather than dropped"]),
        "{answer}"
    );
    for path in ["/v1/jobs", "/v1/job/parsed/plan"] {
        let (code, text) = http_status("PUT", port, path, Some(&unknown)).unwrap();
        assert_eq!(code, 400, "{path}: {text}");
        assert!(text.contains("Job.Multiregion"), "{path} names the field: {text}");
    }
    assert_eq!(http_status("GET", port, "/v1/job/parsed", None).unwrap().0, 404);
    let zeros = with(json!({"Multiregion": null, "VaultToken": "", "ConsulToken": ""}));
    let (code, text) = http_status("PUT", port, "/v1/jobs", Some(&zeros)).unwrap();
    assert_eq!(code, 200, "{text}");
}
