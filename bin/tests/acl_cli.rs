//! The README's ACL commands against a real agent with `acl { enabled = true }`: bootstrap,
//! a policy applied from a file and read back, a client token holding it (with a TTL), that
//! token's view of itself and what it may and may not do, the list, and deletion, after which
//! the token is refused by name.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{AGENT, Agent, cluster_specs, server_args, wait_for};

/// Runs the CLI against `port` with `token` (if any): exit code and what it printed.
fn cli(dir: &Path, port: u16, token: Option<&str>, args: &[&str]) -> (i32, String) {
    let mut command = Command::new(AGENT);
    command
        .args(args)
        .arg(format!("-address=http://127.0.0.1:{port}"))
        .current_dir(dir)
        .env_remove("NOMAD_TOKEN")
        .env_remove("NOMAD_ADDR");
    if let Some(token) = token {
        command.env("NOMAD_TOKEN", token);
    }
    let output = command.output().expect("the CLI runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// The value of `key` in Nomad's `Key = value` block.
fn field(block: &str, key: &str) -> String {
    block
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once('=')?;
            (name.trim() == key).then(|| value.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no {key} in:\n{block}"))
}

#[test]
fn the_acl_commands_bootstrap_write_policies_and_tokens_and_revoke_them() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let specs = cluster_specs(dir, 1);
    std::fs::create_dir_all(&specs[0].data_dir).unwrap();
    let config = specs[0].data_dir.join("acl.hcl");
    std::fs::write(&config, "acl {\n  enabled = true\n}\n").unwrap();
    let mut args = server_args(&specs, 0);
    args.push(format!("-config={}", config.display()));
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;

    let bootstrap = wait_for(Duration::from_secs(30), || {
        let (code, out) = cli(dir, port, None, &["acl", "bootstrap"]);
        (code == 0).then_some(out)
    })
    .unwrap_or_else(|| panic!("bootstrap:\n{}", agent.log()));
    assert_eq!(field(&bootstrap, "Type"), "management");
    assert_eq!(field(&bootstrap, "Policies"), "n/a");
    let root_token = field(&bootstrap, "Secret ID");
    let (code, out) = cli(dir, port, None, &["acl", "bootstrap"]);
    assert_ne!(code, 0, "a second bootstrap is refused: {out}");
    assert!(out.contains("ACL bootstrap already done"), "{out}");

    // Without a token nothing but the status answers.
    let (code, out) = cli(dir, port, None, &["node", "status"]);
    assert_ne!(code, 0);
    assert!(out.contains("403") && out.contains("Permission denied"), "{out}");

    std::fs::write(
        dir.join("readonly.hcl"),
        "namespace \"default\" {\n  policy = \"read\"\n}\nnode {\n  policy = \"read\"\n}\n",
    )
    .unwrap();
    let root = Some(root_token.as_str());
    let (code, out) = cli(
        dir,
        port,
        root,
        &[
            "acl",
            "policy",
            "apply",
            "-description",
            "read only",
            "readonly",
            "readonly.hcl",
        ],
    );
    assert_eq!((code, out.trim()), (0, "Successfully wrote \"readonly\" ACL policy!"));
    let (code, out) = cli(dir, port, root, &["acl", "policy", "info", "readonly"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(field(&out, "Description"), "read only");
    assert!(out.contains("policy = \"read\""), "{out}");
    std::fs::write(dir.join("broken.hcl"), "namespace \"default\" { policy = \"root\" }\n").unwrap();
    let (code, out) = cli(dir, port, root, &["acl", "policy", "apply", "broken", "broken.hcl"]);
    assert_ne!(code, 0);
    assert_eq!(
        out.trim(),
        "Unexpected response code: 400 (Invalid namespace policy: \"root\")"
    );

    let (code, created) = cli(
        dir,
        port,
        root,
        &[
            "acl", "token", "create", "-name", "ci", "-policy", "readonly", "-ttl", "1h",
        ],
    );
    assert_eq!(code, 0, "{created}");
    assert_eq!(field(&created, "Policies"), "[readonly]");
    assert_ne!(field(&created, "Expiry Time"), "<none>");
    let (accessor, secret) = (field(&created, "Accessor ID"), field(&created, "Secret ID"));
    let (code, info) = cli(dir, port, root, &["acl", "token", "info", &accessor]);
    assert_eq!((code, field(&info, "Name")), (0, "ci".to_string()));
    let ci = Some(secret.as_str());
    let (code, me) = cli(dir, port, ci, &["acl", "token", "self"]);
    assert_eq!((code, field(&me, "Accessor ID")), (0, accessor.clone()));
    // The client token reads nodes, may not write policies.
    let (code, out) = cli(dir, port, ci, &["node", "status"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = cli(dir, port, ci, &["acl", "policy", "delete", "readonly"]);
    assert_ne!(code, 0);
    assert!(out.contains("Permission denied"), "{out}");

    let (code, list) = cli(dir, port, root, &["acl", "token", "list"]);
    assert_eq!(code, 0, "{list}");
    let row = list
        .lines()
        .find(|line| line.contains(&accessor))
        .expect("the token is listed");
    assert!(row.trim_end().ends_with("false"), "not expired: {row}");

    // Roles: one made from the policy, a token linking it by name, renamed, listed, deleted.
    let (code, role) = cli(
        dir,
        port,
        root,
        &["acl", "role", "create", "-name", "readers", "-policy", "readonly"],
    );
    assert_eq!(code, 0, "{role}");
    assert_eq!(field(&role, "Policies"), "readonly");
    assert_eq!(field(&role, "Description"), "<none>");
    let role_id = field(&role, "ID");
    let (code, out) = cli(dir, port, root, &["acl", "role", "create", "-name", "empty"]);
    assert_ne!(code, 0);
    assert!(out.contains("At least one policy"), "{out}");
    let (code, linked) = cli(
        dir,
        port,
        root,
        &["acl", "token", "create", "-name", "via-role", "-role-name", "readers"],
    );
    assert_eq!(code, 0, "{linked}");
    assert_eq!(field(&linked, "Roles"), "[readers]");
    let via_role = field(&linked, "Secret ID");
    let (code, out) = cli(dir, port, Some(&via_role), &["node", "status"]);
    assert_eq!(code, 0, "the role's policy reads nodes: {out}");
    let (code, out) = cli(
        dir,
        port,
        root,
        &["acl", "role", "update", "-name", "auditors", &role_id],
    );
    assert_eq!((code, field(&out, "Name")), (0, "auditors".to_string()), "{out}");
    assert_eq!(field(&out, "Policies"), "readonly", "merged: {out}");
    let (code, out) = cli(dir, port, root, &["acl", "role", "info", "-by-name", "auditors"]);
    assert_eq!((code, field(&out, "ID")), (0, role_id.clone()), "{out}");
    let (code, list) = cli(dir, port, root, &["acl", "role", "list"]);
    assert_eq!(code, 0, "{list}");
    assert!(
        list.lines()
            .any(|line| line.contains(&role_id) && line.contains("auditors")),
        "{list}"
    );
    let (code, out) = cli(dir, port, root, &["acl", "role", "delete", &role_id]);
    assert_eq!(
        (code, out.trim().to_string()),
        (0, format!("ACL role {role_id} successfully deleted"))
    );
    let (code, out) = cli(dir, port, Some(&via_role), &["node", "status"]);
    assert_ne!(code, 0, "the role's policies went with it: {out}");

    let (code, out) = cli(dir, port, root, &["acl", "token", "delete", &accessor]);
    assert_eq!(
        (code, out.trim().to_string()),
        (0, format!("Token {accessor} successfully deleted"))
    );
    let (code, out) = cli(dir, port, ci, &["acl", "token", "self"]);
    assert_ne!(code, 0);
    assert!(out.contains("ACL token not found"), "{out}");
}
