//! What a user writes to the variables and nodes lists is honoured (issue 55): `?cas=` on
//! `PUT` and `DELETE /v1/var/:path` refuses a stale index with 409 and the variable as it is
//! (a lost update otherwise), `GET /v1/vars?prefix=` lists only that prefix, and
//! `GET /v1/nodes?os=true` puts each node's `os.name` in its stub (whose `Version` is the
//! node's agent version).

use crate::support;

use std::time::Duration;

use serde_json::Value;
use support::{Agent, cluster_specs, get_json, http_status, server_args, wait_for};

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

#[test]
fn check_and_set_prefixes_and_os_are_honoured() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get_json(port, "/v1/nodes")?;
        (nodes.as_array()?.len() == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));

    let put = |path: &str, query: &str, value: &str| {
        let body = format!(r#"{{"Items":{{"k":"{value}"}}}}"#);
        http_status("PUT", port, &format!("/v1/var/{path}{query}"), Some(&body)).expect("answered")
    };
    // cas=0: only when there is none.
    let (code, created) = put("app/db", "?cas=0", "one");
    assert_eq!(code, 200, "{created}");
    let created = json(&created);
    let index = created["ModifyIndex"].as_u64().unwrap();
    let (code, conflict) = put("app/db", "?cas=0", "lost");
    assert_eq!(code, 409, "a second create: {conflict}");
    let conflict = json(&conflict);
    assert_eq!(conflict["ModifyIndex"], index);
    assert_eq!(
        conflict["Items"]["k"], "one",
        "the conflict shows the variable as it is"
    );

    // A writer holding the current index wins; one holding the old index is refused.
    let (code, updated) = put("app/db", &format!("?cas={index}"), "two");
    assert_eq!(code, 200, "{updated}");
    let newer = json(&updated)["ModifyIndex"].as_u64().unwrap();
    assert!(newer > index);
    let (code, conflict) = put("app/db", &format!("?cas={index}"), "stale");
    assert_eq!(code, 409, "a stale index: {conflict}");
    assert_eq!(json(&conflict)["Items"]["k"], "two");
    let stored = get_json(port, "/v1/var/app/db").expect("read");
    assert_eq!(stored["Items"]["k"], "two", "the stale write changed nothing");
    assert_eq!(stored["ModifyIndex"], newer);

    // A stale delete is refused too, and the current one deletes.
    let (code, conflict) = http_status("DELETE", port, &format!("/v1/var/app/db?cas={index}"), None).expect("answered");
    assert_eq!(code, 409, "a stale delete: {conflict}");
    assert!(get_json(port, "/v1/var/app/db").is_some(), "still there");
    let (code, text) = http_status("DELETE", port, &format!("/v1/var/app/db?cas={newer}"), None).expect("answered");
    assert_eq!(code, 200, "{text}");
    assert!(get_json(port, "/v1/var/app/db").is_none(), "deleted");
    // A check against a variable that is not there: the conflict names its path, empty.
    let (code, conflict) = put("app/db", "?cas=7", "nothing");
    assert_eq!(code, 409, "{conflict}");
    let conflict = json(&conflict);
    assert_eq!(
        (conflict["Path"].as_str(), conflict["ModifyIndex"].as_u64()),
        (Some("app/db"), Some(0))
    );
    let (code, text) = put("app/db", "?cas=soon", "x");
    assert_eq!(code, 400, "a cas that is not a number: {text}");
    assert!(text.contains("cas"), "{text}");

    // ?prefix= lists that prefix alone.
    for path in ["app/web", "app/worker", "other/web"] {
        assert_eq!(put(path, "", "v").0, 200);
    }
    let listed = |query: &str| -> Vec<String> {
        get_json(port, &format!("/v1/vars{query}"))
            .expect("listed")
            .as_array()
            .unwrap()
            .iter()
            .map(|variable| variable["Path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed("?prefix=app/"), ["app/web", "app/worker"]);
    assert_eq!(listed("?prefix=other"), ["other/web"]);
    assert_eq!(listed(""), ["app/web", "app/worker", "other/web"]);

    // ?os=true: the stub carries os.name (and not without it).
    let nodes = get_json(port, "/v1/nodes?os=true").expect("nodes");
    let os = nodes[0]["Attributes"]["os.name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!os.is_empty(), "os.name in the stub: {nodes}");
    let node_id = nodes[0]["ID"].as_str().unwrap();
    let node = get_json(port, &format!("/v1/node/{node_id}")).expect("node");
    assert_eq!(node["Attributes"]["os.name"], os.as_str());
    // The stub's Version is the node's agent version, as its attributes say (it was empty).
    assert_eq!(nodes[0]["Version"], node["Attributes"]["nomad.version"], "{nodes}");
    assert!(!nodes[0]["Version"].as_str().unwrap_or_default().is_empty());
    let plain = get_json(port, "/v1/nodes").expect("nodes");
    assert!(
        plain[0].get("Attributes").is_none(),
        "no attributes unless asked: {plain}"
    );
}

/// The parameters every endpoint shares are read or refused, never ignored: an unreadable
/// `index`, `wait`, `per_page` or boolean is a 400 naming it, another region is Nomad's
/// `No path to region`, and `?task_states=false` leaves the allocation stubs' task states out.
#[test]
fn shared_query_parameters_are_read_or_refused() {
    let root = tempfile::tempdir().unwrap();
    let agent = support::start_dev_with_mock_driver(root.path());
    let port = agent.spec.http;
    let job = r#"{"Job":{"ID":"q","Name":"q","Type":"service","Datacenters":["dc1"],"TaskGroups":[{"Name":"g","Count":1,"Tasks":[{"Name":"t","Driver":"mock","Config":{"run_for":"60s"},"Resources":{"CPU":10,"MemoryMB":10}}]}]}}"#;
    let (code, body) = http_status("PUT", port, "/v1/jobs", Some(job)).expect("answered");
    assert_eq!(code, 200, "{body}");
    let stubs = wait_for(Duration::from_secs(20), || {
        let stubs = get_json(port, "/v1/allocations")?;
        (stubs[0]["TaskStates"]["t"]["State"] == "running").then_some(stubs)
    })
    .unwrap_or_else(|| panic!("the allocation runs:\n{}", agent.log()));
    assert!(stubs[0]["TaskStates"].is_object());
    let without = get_json(port, "/v1/allocations?task_states=false").expect("listed");
    assert_eq!(without[0]["TaskStates"], Value::Null, "{without}");
    assert_eq!(without[0]["ID"], stubs[0]["ID"]);

    for (query, status, text) in [
        ("/v1/jobs?index=abc", 400, "Invalid index"),
        ("/v1/jobs?index=1&wait=forever", 400, "Invalid wait time"),
        ("/v1/allocations?per_page=x", 400, "Invalid per_page"),
        ("/v1/allocations?task_states=nah", 400, "\"task_states\""),
        ("/v1/nodes?os=maybe", 400, "\"os\""),
        ("/v1/jobs?region=mars", 500, "No path to region"),
        ("/v1/jobs?stale=nah", 400, "`stale`"),
    ] {
        let (code, body) = http_status("GET", port, query, None).expect("answered");
        assert!(code == status && body.contains(text), "{query}: {code} {body}");
    }
    for query in [
        "/v1/jobs?region=global",
        "/v1/jobs?index=1&wait=10ms",
        "/v1/jobs?per_page=1",
    ] {
        assert_eq!(
            http_status("GET", port, query, None).expect("answered").0,
            200,
            "{query}"
        );
    }
}
