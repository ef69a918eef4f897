//! Variables encrypted at rest through a real three-server cluster: the first write makes the
//! cluster's root key and hands it to every server before it is used; any server opens what
//! another sealed; no data dir holds a value in plain text; a rotation makes a new active key
//! while the old one still opens what it sealed; a server that missed a key (it was down)
//! fetches it from a peer when it first needs it; and the active key cannot be deleted.

use crate::support;

use std::time::Duration;

use support::{Agent, agreed_leader, cluster_specs, files_under, http_status, server_args, wait_for};

fn put_var(agent: &Agent, path: &str, value: &str) -> (u16, String) {
    let body = format!(r#"{{"Items":{{"password":"{value}"}}}}"#);
    wait_for(Duration::from_secs(30), || {
        http_status("PUT", agent.spec.http, &format!("/v1/var/{path}"), Some(&body)).filter(|(code, _)| *code != 500)
    })
    .expect("variable write answered")
}

fn read_var(agent: &Agent, path: &str) -> Option<String> {
    http_status("GET", agent.spec.http, &format!("/v1/var/{path}"), None)
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// How many files under `agent`'s data dir, its keystore aside, hold `needle`.
fn files_holding(agent: &Agent, needle: &str) -> usize {
    let keystore = agent.spec.data_dir.join("server/keystore");
    files_under(&agent.spec.data_dir)
        .iter()
        .filter(|file| !file.starts_with(&keystore))
        .filter(|file| {
            std::fs::read(file).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .count()
}

fn keystore_size(agent: &Agent) -> usize {
    std::fs::read_dir(agent.spec.data_dir.join("server/keystore"))
        .map(|dir| dir.flatten().count())
        .unwrap_or(0)
}

#[test]
fn variables_are_sealed_at_rest_and_open_on_every_server_across_rotation_and_restart() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 3);
    let mut agents: Vec<Agent> = (0..3)
        .map(|i| Agent::start(specs[i].clone(), server_args(&specs, i)))
        .collect();
    let refs: Vec<&Agent> = agents.iter().collect();
    wait_for(Duration::from_secs(60), || agreed_leader(&refs, 3)).expect("cluster forms");

    // The first write makes the root key; every server holds it before it seals anything.
    let (code, body) = put_var(&agents[0], "app/db", "first-marker-7d1c");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("first-marker-7d1c"),
        "the write answers the values: {body}"
    );
    for agent in &agents {
        let body = wait_for(Duration::from_secs(10), || read_var(agent, "app/db")).expect("readable everywhere");
        assert!(body.contains("first-marker-7d1c"), "{}: {body}", agent.spec.name);
        assert_eq!(keystore_size(agent), 1, "{} holds the root key", agent.spec.name);
    }
    let keys = agents[1].get("/v1/operator/keyring/keys").unwrap();
    assert_eq!(keys.matches(r#""State":"active""#).count(), 1, "{keys}");

    // At rest: no file of any server holds the value, though its path is there to be found.
    for agent in &agents {
        assert_eq!(files_holding(agent, "first-marker-7d1c"), 0, "{}", agent.spec.name);
        assert!(
            files_holding(agent, "app/db") > 0,
            "{}: the search sees nothing",
            agent.spec.name
        );
    }

    // A server goes down; the others rotate (two of three voters take the new key) and write
    // under the new key; the old value still opens.
    agents[2].kill();
    let survivors: Vec<&Agent> = agents[..2].iter().collect();
    wait_for(Duration::from_secs(60), || agreed_leader(&survivors, 3)).expect("a leader among the survivors");
    let (code, body) = wait_for(Duration::from_secs(30), || {
        http_status("PUT", agents[0].spec.http, "/v1/operator/keyring/rotate", None).filter(|(code, _)| *code != 500)
    })
    .expect("rotate answered");
    assert_eq!(code, 200, "{body}");
    let keys = agents[0].get("/v1/operator/keyring/keys").unwrap();
    assert_eq!(keys.matches(r#""State":"active""#).count(), 1, "{keys}");
    assert_eq!(keys.matches(r#""State":"inactive""#).count(), 1, "{keys}");
    // The CLI lists both, as Nomad's `operator root keyring list` does.
    let output = std::process::Command::new(support::AGENT)
        .args([
            "operator",
            "root",
            "keyring",
            "list",
            &format!("-address=http://127.0.0.1:{}", agents[0].spec.http),
        ])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{listed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(listed.starts_with("Key       State     Create Time"), "{listed}");
    assert_eq!(
        listed.matches(" active ").count() + listed.matches(" inactive ").count(),
        2,
        "{listed}"
    );
    let (code, body) = put_var(&agents[1], "app/api", "second-marker-93ab");
    assert_eq!(code, 200, "{body}");
    assert!(read_var(&agents[0], "app/db").is_some_and(|body| body.contains("first-marker-7d1c")));

    // The server that missed the rotation comes back and opens the new value: it fetches the
    // key it lacks from a peer.
    agents[2].restart();
    assert_eq!(keystore_size(&agents[2]), 1);
    let body = wait_for(Duration::from_secs(60), || read_var(&agents[2], "app/api")).unwrap_or_else(|| {
        panic!("the restarted server opens the new value:\n{}", agents[2].log());
    });
    assert!(body.contains("second-marker-93ab"), "{body}");
    assert_eq!(keystore_size(&agents[2]), 2, "it kept the fetched key");
    let fetched = wait_for(Duration::from_secs(10), || {
        agents[2].log().contains("root key fetched from a peer").then_some(())
    });
    assert!(fetched.is_some(), "{}", agents[2].log());
    for agent in &agents {
        assert_eq!(files_holding(agent, "second-marker-93ab"), 0, "{}", agent.spec.name);
    }

    // The active key cannot be deleted (Nomad's text); a bad key id is refused by name.
    let active = keys
        .split(r#""KeyID":""#)
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_string())
        .zip(
            keys.split(r#""State":""#)
                .skip(1)
                .map(|rest| rest.starts_with("active")),
        )
        .find(|(_, active)| *active)
        .map(|(id, _)| id)
        .expect("an active key");
    let (code, body) = http_status(
        "DELETE",
        agents[0].spec.http,
        &format!("/v1/operator/keyring/key/{active}"),
        None,
    )
    .unwrap();
    assert_eq!(
        (code, body.trim()),
        (400, "active root key cannot be deleted - call rotate first")
    );
    let (code, body) = http_status("DELETE", agents[0].spec.http, "/v1/operator/keyring/key/..%2Fx", None).unwrap();
    assert_eq!(code, 400, "{body}");
}
