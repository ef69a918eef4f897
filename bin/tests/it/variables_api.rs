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
