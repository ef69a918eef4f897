//! The README's ACL commands against a real agent with `acl { enabled = true }`: bootstrap,
//! a policy applied from a file and read back, a client token holding it (with a TTL), that
//! token's view of itself and what it may and may not do, the list, and deletion, after which
//! the token is refused by name.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
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
    let (_agent, port, bootstrap) = acl_agent(dir);
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
    // A token reads itself by accessor, not others; update keeps what is not given.
    let (code, out) = cli(
        dir,
        port,
        Some(&via_role),
        &["acl", "token", "info", &field(&linked, "Accessor ID")],
    );
    assert_eq!((code, field(&out, "Name")), (0, "via-role".to_string()), "{out}");
    let (code, out) = cli(dir, port, Some(&via_role), &["acl", "token", "info", &accessor]);
    assert!(code != 0 && out.contains("Permission denied"), "{out}");
    let (code, out) = cli(
        dir,
        port,
        root,
        &[
            "acl",
            "token",
            "update",
            "-name",
            "renamed",
            &field(&linked, "Accessor ID"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        (field(&out, "Name"), field(&out, "Roles")),
        ("renamed".to_string(), "[readers]".to_string())
    );
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

#[path = "../../../io-real/http/tests/it/support/idp.rs"]
mod idp;

/// An agent with ACLs on, bootstrapped: the agent, its HTTP port and what `acl bootstrap`
/// printed.
fn acl_agent(dir: &Path) -> (Agent, u16, String) {
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
    (agent, port, bootstrap)
}

#[test]
fn the_sso_commands_write_methods_and_rules_and_log_in_with_jwt_and_oidc() {
    let root_dir = tempfile::tempdir().unwrap();
    let dir = root_dir.path();
    let (_agent, port, bootstrap) = acl_agent(dir);
    let root_token = field(&bootstrap, "Secret ID");
    let root = Some(root_token.as_str());
    let ok = |args: &[&str]| {
        let (code, out) = cli(dir, port, root, args);
        assert_eq!(code, 0, "{args:?}: {out}");
        out
    };
    std::fs::write(dir.join("readonly.hcl"), "node {\n  policy = \"read\"\n}\n").unwrap();
    ok(&["acl", "policy", "apply", "readonly", "readonly.hcl"]);
    ok(&["acl", "role", "create", "-name", "platform", "-policy", "readonly"]);

    // The fake identity provider, and a key for the CI system's JWTs.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let key = std::sync::Arc::new(idp::signing_key("k1"));
    let provider: idp::Shared = std::sync::Arc::default();
    provider.lock().unwrap().key = Some(key.clone());
    let issuer = runtime.block_on(idp::serve_idp(provider.clone()));

    // A JWT method from a config file; a rule binding a policy; a login.
    let ci = json!({"JWTValidationPubKeys": [key.public_pem], "SigningAlgs": ["ES256"],
        "ClaimMappings": {"repo": "repo"}});
    std::fs::write(dir.join("ci.json"), ci.to_string()).unwrap();
    let method = ok(&[
        "acl",
        "auth-method",
        "create",
        "-name",
        "ci",
        "-type",
        "JWT",
        "-max-token-ttl",
        "1h",
        "-token-locality",
        "local",
        "-config",
        "@ci.json",
    ]);
    assert_eq!(field(&method, "Max Token TTL"), "1h0m0s");
    assert_eq!(field(&method, "Signing algorithms"), "ES256");
    let (code, out) = cli(
        dir,
        port,
        root,
        &[
            "acl",
            "binding-rule",
            "create",
            "-auth-method",
            "ci",
            "-bind-type",
            "group",
            "-bind-name",
            "x",
        ],
    );
    assert_ne!(code, 0);
    assert!(out.contains("unsupported bind type: \"group\""), "{out}");
    let rule = ok(&[
        "acl",
        "binding-rule",
        "create",
        "-auth-method",
        "ci",
        "-bind-type",
        "policy",
        "-bind-name",
        "readonly",
        "-selector",
        "value.repo == \"infra\"",
    ]);
    assert_eq!(field(&rule, "Selector"), "\"value.repo == \\\"infra\\\"\"");
    let rule_id = field(&rule, "ID");
    assert!(ok(&["acl", "binding-rule", "list"]).contains(&rule_id));
    let jwt = idp::sign(&key, "k1", &json!({"repo": "infra", "exp": idp::now_s() + 300}));
    let (code, out) = cli(
        dir,
        port,
        None,
        &["acl", "login", "-method", "ci", "-login-token", &jwt],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("Successfully logged in via JWT and ci"), "{out}");
    assert_eq!(field(&out, "Policies"), "[readonly]");
    let (code, out) = cli(dir, port, Some(&field(&out, "Secret ID")), &["node", "status"]);
    assert_eq!(code, 0, "the login's token reads nodes: {out}");

    // OIDC, the default method: the CLI serves the provider's redirect itself.
    let callback = format!("127.0.0.1:{}", support::free_ports()[0]);
    let sso = json!({"OIDCDiscoveryURL": issuer, "OIDCClientID": "drover", "OIDCClientSecret": "s3cr3t-client",
        "OIDCEnablePKCE": true, "SigningAlgs": ["ES256"],
        "AllowedRedirectURIs": [format!("http://{callback}/oidc/callback")],
        "ListClaimMappings": {"groups": "groups"}});
    let method = ok(&[
        "acl",
        "auth-method",
        "create",
        "-name",
        "sso",
        "-type",
        "OIDC",
        "-max-token-ttl",
        "30m",
        "-token-locality",
        "global",
        "-default",
        "-config",
        &sso.to_string(),
    ]);
    assert_eq!(field(&method, "OIDC Client Secret"), "<redacted>");
    assert_eq!(field(&method, "Default"), "true");
    assert!(
        ok(&["acl", "auth-method", "list"])
            .lines()
            .any(|line| line.starts_with("sso") && line.contains("OIDC"))
    );
    ok(&[
        "acl",
        "binding-rule",
        "create",
        "-auth-method",
        "sso",
        "-bind-type",
        "role",
        "-bind-name",
        "platform",
        "-selector",
        "\"platform\" in list.groups",
    ]);
    let mut login = support::ChildGuard(
        Command::new(AGENT)
            .args(["acl", "login", &format!("-oidc-callback-addr={callback}")])
            .arg(format!("-address=http://127.0.0.1:{port}"))
            .env_remove("NOMAD_TOKEN")
            .env("PATH", "/nonexistent")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = std::io::BufReader::new(login.0.stdout.take().unwrap());
    let url = loop {
        let mut line = String::new();
        assert_ne!(
            std::io::BufRead::read_line(&mut stdout, &mut line).unwrap(),
            0,
            "the CLI printed no URL"
        );
        if let Some(url) = line.trim().strip_prefix(&format!("{issuer}/authorize")) {
            break format!("{issuer}/authorize{url}");
        }
    };
    // The browser: the provider signs the user in and redirects to the CLI's callback.
    let redirect = idp::browse(&url);
    let page = idp::browse(&redirect);
    assert!(page.contains("You can close this window"), "{page}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = login.0.wait().unwrap();
    assert!(status.success(), "{rest}");
    assert!(rest.contains("Successfully logged in via OIDC and sso"), "{rest}");
    assert_eq!(field(&rest, "Roles"), "[platform]");
    assert_eq!(field(&rest, "Global"), "true");
    assert_eq!(provider.lock().unwrap().userinfo_calls, 1);

    let (code, out) = cli(dir, port, root, &["acl", "binding-rule", "delete", &rule_id]);
    assert_eq!(
        (code, out.trim().to_string()),
        (0, format!("ACL binding rule {rule_id} successfully deleted"))
    );
    ok(&["acl", "auth-method", "delete", "sso"]);
    assert!(
        ok(&["acl", "auth-method", "list"])
            .lines()
            .all(|line| !line.starts_with("sso"))
    );
}
