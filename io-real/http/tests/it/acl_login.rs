//! Single sign-on through a real agent's HTTP API: auth methods and binding rules written and
//! checked, a JWT login (keys given as PEM, and fetched from a JWKS URL) whose claims bind
//! roles, policies or management, and the whole OIDC authorization-code flow (with PKCE)
//! against a fake identity provider on a real socket that signs ID tokens with a key made
//! for the run.

use crate::support;

use crate::support::idp;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use idp::{Shared, now_s, serve_idp, sign, signing_key};
use serde_json::{Value, json};

fn call(port: u16, method: &str, path: &str, token: &str, body: &Value) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let header = if token.is_empty() {
        String::new()
    } else {
        format!("X-Nomad-Token: {token}\r\n")
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{header}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        body.to_string(),
    )
}

async fn http(port: u16, method: &'static str, path: &str, token: &str, body: Value) -> (u16, String) {
    let (path, token) = (path.to_string(), token.to_string());
    tokio::task::spawn_blocking(move || call(port, method, &path, &token, &body))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_through_jwt_and_oidc_auth_methods_bind_roles_policies_and_management() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let port = server.http;
    let (status, body) = http(port, "POST", "/v1/acl/bootstrap", "", Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let root: Value = serde_json::from_str(&body).unwrap();
    let root = root["SecretID"].as_str().unwrap().to_string();
    let ok = |(status, body): (u16, String)| -> Value {
        assert_eq!(status, 200, "{body}");
        if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap()
        }
    };
    ok(http(
        port,
        "PUT",
        "/v1/acl/policy/nodes-read",
        &root,
        json!({"Rules": "node { policy = \"read\" }"}),
    )
    .await);
    ok(http(
        port,
        "PUT",
        "/v1/acl/policy/jobs-read",
        &root,
        json!({"Rules": "namespace \"default\" { policy = \"read\" }"}),
    )
    .await);
    let role = ok(http(
        port,
        "POST",
        "/v1/acl/role",
        &root,
        json!({"Name": "platform", "Policies": [{"Name": "jobs-read"}]}),
    )
    .await);
    let key = Arc::new(signing_key("k1"));

    // An auth method is checked before it is stored.
    let method = |name: &str, config: Value| json!({"Name": name, "Type": "JWT", "TokenLocality": "local", "MaxTokenTTL": "1h", "Config": config});
    let (status, body) = http(
        port,
        "POST",
        "/v1/acl/auth-method",
        &root,
        json!({"Name": "x", "Type": "LDAP", "TokenLocality": "local", "MaxTokenTTL": "1h"}),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (400, "auth method 0 invalid: invalid token type 'LDAP'")
    );
    let (status, body) = http(port, "POST", "/v1/acl/auth-method", &root, json!({"Name": "x", "Type": "JWT", "TokenLocality": "local", "MaxTokenTTL": "72h", "Config": {"JWTValidationPubKeys": [key.public_pem]}})).await;
    assert_eq!(
        (status, body.as_str()),
        (
            400,
            "auth method 0 invalid: invalid MaxTokenTTL value '72h0m0s' (should be between 1ms and 24h0m0s)"
        )
    );
    let config = json!({"JWTValidationPubKeys": [key.public_pem], "SigningAlgs": ["ES256"],
        "BoundIssuer": ["https://ci.example"], "BoundAudiences": ["drover"],
        "ClaimMappings": {"repo": "repo", "/actor/name": "actor"}, "ListClaimMappings": {"teams": "teams"}});
    let stored = ok(http(port, "POST", "/v1/acl/auth-method", &root, method("ci", config)).await);
    assert_eq!(
        (stored["MaxTokenTTL"].as_str(), stored["TokenNameFormat"].as_str()),
        (Some("1h0m0s"), Some("${auth_method_type}-${auth_method_name}"))
    );
    // Listed without a token (the login screen needs it); read only with management.
    let (status, listed) = http(port, "GET", "/v1/acl/auth-methods", "", Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&listed).unwrap()[0]["Name"], "ci");
    assert_eq!(
        http(port, "GET", "/v1/acl/auth-method/ci", "", Value::Null).await.0,
        403
    );

    // Binding rules: checked, and tied to an existing method.
    let rule = |selector: &str, bind_type: &str, bind_name: &str| json!({"AuthMethod": "ci", "Selector": selector, "BindType": bind_type, "BindName": bind_name});
    let (status, body) = http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        json!({"AuthMethod": "nope", "BindType": "management"}),
    )
    .await;
    assert_eq!((status, body.as_str()), (400, "ACL auth method nope not found"));
    let (status, body) = http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        rule("value.repo ==", "policy", "x"),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body.starts_with("binding rule 0 invalid: selector is invalid: "),
        "{body}"
    );
    ok(http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        rule(r#"value.repo == "infra""#, "policy", "nodes-read"),
    )
    .await);
    ok(http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        rule(r#""platform" in list.teams"#, "role", "${value.repo}"),
    )
    .await);
    let admin_rule = ok(http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        rule(r#"value.actor == "root-bot""#, "management", ""),
    )
    .await);

    // A JWT login: signature, issuer, audience and expiry checked; claims bound.
    let claims = |repo: &str, actor: &str, exp: u64| {
        json!({"iss": "https://ci.example", "aud": ["drover"], "exp": exp, "repo": repo,
            "actor": {"name": actor}, "teams": ["platform"]})
    };
    let login = |token: String| {
        http(
            port,
            "POST",
            "/v1/acl/login",
            "",
            json!({"AuthMethodName": "ci", "LoginToken": token}),
        )
    };
    let infra = ok(login(sign(&key, "k1", &claims("infra", "dev", now_s() + 300))).await);
    assert_eq!(infra["Type"], "client");
    assert_eq!(infra["Name"], "JWT-ci");
    assert_eq!(infra["Policies"], json!(["nodes-read"]));
    assert!(infra["ExpirationTime"].is_string());
    let secret = infra["SecretID"].as_str().unwrap().to_string();
    assert_eq!(http(port, "GET", "/v1/nodes", &secret, Value::Null).await.0, 200);
    assert_eq!(http(port, "GET", "/v1/jobs", &secret, Value::Null).await.0, 403);
    // `${value.repo}` names the role "platform" for a repo of that name.
    let platform = ok(login(sign(&key, "k1", &claims("platform", "dev", now_s() + 300))).await);
    assert_eq!(platform["Roles"], json!([{"ID": role["ID"], "Name": "platform"}]));
    let platform = platform["SecretID"].as_str().unwrap().to_string();
    assert_eq!(http(port, "GET", "/v1/jobs", &platform, Value::Null).await.0, 200);
    let admin = ok(login(sign(&key, "k1", &claims("infra", "root-bot", now_s() + 300))).await);
    assert_eq!(admin["Type"], "management");
    let (status, body) = login(sign(&key, "k1", &claims("web", "dev", now_s() + 300))).await;
    assert_eq!((status, body.as_str()), (400, "no role or policy bindings matched"));
    let (status, body) = login(sign(&key, "k1", &claims("infra", "dev", now_s() - 3_600))).await;
    assert_eq!(
        (status, body.as_str()),
        (401, "unable to validate provided token: token is expired (exp)")
    );
    let mut wrong_issuer = claims("infra", "dev", now_s() + 300);
    wrong_issuer["iss"] = json!("https://evil.example");
    let (status, body) = login(sign(&key, "k1", &wrong_issuer)).await;
    assert_eq!(
        (status, body.as_str()),
        (401, "unable to validate provided token: invalid issuer (iss) claim")
    );
    let other_key = signing_key("k1");
    let (status, body) = login(sign(&other_key, "k1", &claims("infra", "dev", now_s() + 300))).await;
    assert_eq!(
        (status, body.as_str()),
        (
            401,
            "unable to validate provided token: no known key successfully validated the token signature"
        )
    );
    // Deleting the management rule ends management logins.
    let rule_id = admin_rule["ID"].as_str().unwrap();
    ok(http(
        port,
        "DELETE",
        &format!("/v1/acl/binding-rule/{rule_id}"),
        &root,
        Value::Null,
    )
    .await);
    assert_eq!(
        ok(login(sign(&key, "k1", &claims("infra", "root-bot", now_s() + 300))).await)["Type"],
        "client"
    );

    // The same login with the keys fetched from a JWKS URL, and an OIDC method, against the
    // fake provider.
    let idp: Shared = Arc::default();
    idp.lock().unwrap().key = Some(key.clone());
    let issuer = serve_idp(idp.clone()).await;
    let jwks_config = json!({"JWKSURL": format!("{issuer}/jwks"), "SigningAlgs": ["ES256"],
        "ClaimMappings": {"repo": "repo"}});
    ok(http(
        port,
        "POST",
        "/v1/acl/auth-method",
        &root,
        method("ci-jwks", jwks_config),
    )
    .await);
    ok(http(
        port,
        "POST",
        "/v1/acl/binding-rule",
        &root,
        json!({"AuthMethod": "ci-jwks", "BindType": "policy", "BindName": "nodes-read"}),
    )
    .await);
    let (status, body) = http(
        port,
        "POST",
        "/v1/acl/login",
        "",
        json!({"AuthMethodName": "ci-jwks",
        "LoginToken": sign(&key, "k1", &claims("infra", "dev", now_s() + 300))}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    let redirect = "http://localhost:4649/oidc/callback";
    let oidc = json!({"Name": "sso", "Type": "OIDC", "TokenLocality": "global", "MaxTokenTTL": "30m",
        "TokenNameFormat": "${auth_method_name}-${value.email}", "Default": true,
        "Config": {"OIDCDiscoveryURL": issuer, "OIDCClientID": "drover", "OIDCClientSecret": "s3cr3t-client",
            "OIDCEnablePKCE": true, "SigningAlgs": ["ES256"], "AllowedRedirectURIs": [redirect],
            "ClaimMappings": {"email": "email"}, "ListClaimMappings": {"groups": "groups"}}});
    ok(http(port, "POST", "/v1/acl/auth-method", &root, oidc).await);
    ok(http(port, "POST", "/v1/acl/binding-rule", &root, json!({"AuthMethod": "sso", "Selector": "\"platform\" in list.groups", "BindType": "role", "BindName": "platform"})).await);
    let (status, body) = http(
        port,
        "POST",
        "/v1/acl/oidc/auth-url",
        "",
        json!({"AuthMethodName": "sso", "RedirectURI": "http://evil/cb", "ClientNonce": "n-1"}),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (400, "unauthorized redirect_uri: http://evil/cb")
    );
    let url = ok(http(
        port,
        "POST",
        "/v1/acl/oidc/auth-url",
        "",
        json!({"AuthMethodName": "sso", "RedirectURI": redirect, "ClientNonce": "n-1"}),
    )
    .await);
    let url = url["AuthURL"].as_str().unwrap().to_string();
    assert!(url.starts_with(&format!("{issuer}/authorize?")), "{url}");
    // The browser: the provider answers with where it would redirect.
    let callback = browse(&url).await;
    let query: BTreeMap<String, String> = form_urlencoded::parse(callback.split_once('?').unwrap().1.as_bytes())
        .into_owned()
        .collect();
    let complete = |nonce: &str| {
        json!({"AuthMethodName": "sso", "ClientNonce": nonce, "State": query["state"],
        "Code": query["code"], "RedirectURI": redirect})
    };
    // A nonce other than the caller's cannot redeem the code (PKCE fails at the provider).
    let (status, body) = http(port, "POST", "/v1/acl/oidc/complete-auth", "", complete("n-2")).await;
    assert_eq!(status, 400);
    assert!(body.starts_with("failed to exchange token with provider: "), "{body}");
    let url = ok(http(
        port,
        "POST",
        "/v1/acl/oidc/auth-url",
        "",
        json!({"AuthMethodName": "sso", "RedirectURI": redirect, "ClientNonce": "n-1"}),
    )
    .await);
    let callback = browse(url["AuthURL"].as_str().unwrap()).await;
    let query: BTreeMap<String, String> = form_urlencoded::parse(callback.split_once('?').unwrap().1.as_bytes())
        .into_owned()
        .collect();
    let signed_in = ok(http(
        port,
        "POST",
        "/v1/acl/oidc/complete-auth",
        "",
        json!({"AuthMethodName": "sso",
        "ClientNonce": "n-1", "State": query["state"], "Code": query["code"], "RedirectURI": redirect}),
    )
    .await);
    assert_eq!(signed_in["Name"], "sso-dev@example.com");
    assert_eq!(
        signed_in["Roles"][0]["Name"], "platform",
        "groups came from user info: {signed_in}"
    );
    assert_eq!(signed_in["Global"], true);
    assert_eq!(idp.lock().unwrap().userinfo_calls, 1);
    let sso = signed_in["SecretID"].as_str().unwrap();
    assert_eq!(http(port, "GET", "/v1/jobs", sso, Value::Null).await.0, 200);
    // The client secret never reaches the logs through the method's Debug.
    let stored = ok(http(port, "GET", "/v1/acl/auth-method/sso", &root, Value::Null).await);
    assert_eq!(
        stored["Config"]["OIDCClientSecret"], "s3cr3t-client",
        "management reads it back, as Nomad's API"
    );
    drop(server);
}

/// The browser's visit to the provider.
async fn browse(url: &str) -> String {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || idp::browse(&url)).await.unwrap()
}
