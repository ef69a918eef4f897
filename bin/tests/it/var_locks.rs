//! Variable locks (Nomad 1.7's `?lock-acquire|renew|release` and `var lock`) against a real
//! server: one holder at a time, only the holder writes, the ID shown to nobody else, a lock
//! not renewed taken away by the leader and kept from anyone for its lock delay, and `var lock`
//! holding a lock for as long as its command runs.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{self, Agent, ChildGuard, cluster_specs, get_json as get, http_status, server_args, wait_for};

fn put(port: u16, path: &str, body: &str) -> (u16, Value) {
    let (code, text) = http_status("PUT", port, path, Some(body)).expect("the agent answers");
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[test]
fn a_lock_has_one_holder_who_alone_writes_and_loses_it_when_it_stops_renewing() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        http_status("PUT", port, "/v1/var/probe", Some(r#"{"Items":{"k":"v"}}"#)).filter(|(code, _)| *code == 200)
    })
    .unwrap_or_else(|| panic!("the server takes writes:\n{}", agent.log()));

    // Acquired: the holder alone learns the ID.
    let (code, held) = put(
        port,
        "/v1/var/app/leader?lock-acquire",
        r#"{"Items":{"who":"a"},"Lock":{"TTL":"1s","LockDelay":"1h"}}"#,
    );
    assert_eq!(code, 200, "{held}");
    let id = held["Lock"]["ID"].as_str().unwrap().to_string();
    assert!(!id.is_empty(), "{held}");
    assert_eq!(
        (&held["Lock"]["TTL"], &held["Items"]["who"]),
        (&Value::from("1s"), &Value::from("a"))
    );
    let (code, other) = put(port, "/v1/var/app/leader?lock-acquire", "{}");
    assert_eq!(code, 409, "{other}");
    assert_eq!(other["Lock"]["ID"], "", "a conflict does not give the ID away: {other}");
    assert_eq!(get(port, "/v1/var/app/leader").unwrap()["Lock"]["ID"], "");

    // Only the holder writes; nobody deletes it while it is held.
    let (code, _) = put(port, "/v1/var/app/leader", r#"{"Items":{"who":"b"}}"#);
    assert_eq!(code, 409);
    let with_id = format!(r#"{{"Items":{{"who":"a2"}},"Lock":{{"ID":"{id}"}}}}"#);
    let (code, written) = put(port, "/v1/var/app/leader", &with_id);
    assert_eq!(code, 200, "{written}");
    assert_eq!(http_status("DELETE", port, "/v1/var/app/leader", None).unwrap().0, 409);
    let (code, _) = put(port, "/v1/var/app/leader?lock-renew", r#"{"Lock":{"ID":"forged"}}"#);
    assert_eq!(code, 409);
    let (code, text) = put(port, "/v1/var/app/leader?lock-renew", "{}");
    assert_eq!((code, text), (400, Value::from("missing lock ID")));

    // Not renewed: the leader takes it away after its TTL, the items stay, and its lock delay
    // keeps everyone out.
    let expired = wait_for(Duration::from_secs(30), || {
        let variable = get(port, "/v1/var/app/leader")?;
        variable.get("Lock").is_none().then_some(variable)
    })
    .unwrap_or_else(|| panic!("the lock expires:\n{}", agent.log()));
    assert_eq!(expired["Items"]["who"], "a2");
    let (code, _) = put(port, "/v1/var/app/leader?lock-acquire", "{}");
    assert_eq!(code, 409, "inside the lock delay");
    let (code, _) = put(port, "/v1/var/app/leader?lock-renew", &with_id);
    assert_eq!(code, 409, "an expired lock cannot be renewed");

    // Released by its holder: at once free again.
    let (code, held) = put(port, "/v1/var/app/other?lock-acquire", r#"{"Lock":{"TTL":"1h"}}"#);
    assert_eq!(code, 200);
    let release = format!(r#"{{"Lock":{{"ID":"{}"}}}}"#, held["Lock"]["ID"].as_str().unwrap());
    assert_eq!(put(port, "/v1/var/app/other?lock-release", &release).0, 200);
    assert_eq!(put(port, "/v1/var/app/other?lock-acquire", "{}").0, 200);
    drop(agent);
}

#[test]
fn var_lock_holds_the_lock_while_its_command_runs() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    let dir = root.path();
    let run = |args: &[&str]| support::cli_in(dir, port, args);
    wait_for(Duration::from_secs(30), || {
        let (code, _) = run(&["var", "put", "probe", "k=v"]);
        (code == 0).then_some(())
    })
    .unwrap_or_else(|| panic!("the server takes writes:\n{}", agent.log()));

    // The command's exit code is the CLI's, and the lock is released after it.
    let (code, out) = run(&["var", "lock", "-ttl", "1s", "app/job", "exit", "7"]);
    assert_eq!(code, 7, "{out}");
    assert!(get(port, "/v1/var/app/job").unwrap().get("Lock").is_none());

    // Held for longer than several TTLs: renewed all along, so a second holder is refused.
    let started = dir.join("started");
    let finish = dir.join("finish");
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        finish.display()
    );
    let holder = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_agent"))
            .args(["var", "lock", "-ttl", "1s", "-delay", "1s", "app/job", &script])
            .current_dir(dir)
            .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_for(Duration::from_secs(30), || started.exists().then_some(()))
        .unwrap_or_else(|| panic!("the command runs under the lock:\n{}", agent.log()));
    // Three TTLs: without renewals the leader would have taken the lock away by now.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(get(port, "/v1/var/app/job").unwrap()["Lock"]["TTL"], "1s");
    let (code, out) = run(&["var", "lock", "-max-retry", "2", "app/job", "true"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is held by another"), "{out}");
    std::fs::write(&finish, b"").unwrap();
    let output = holder.wait_with_output(Duration::from_secs(30));
    assert!(output.status.success(), "{output:?}");
    assert!(
        get(port, "/v1/var/app/job").unwrap().get("Lock").is_none(),
        "released at the end"
    );
    drop(agent);
}
