//! No secret reaches a log: an agent with ACLs on, every line it writes captured at trace
//! level (openraft's included, which logs log entries), while it is handed a management and a
//! client token, a variable's values, a volume's secrets, a one-time token and an OIDC auth
//! method's client secret. None of them may appear.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn call(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Nomad-Token: {token}\r\nContent-Length: {}\r\n\r\n{body}",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_variable_value_or_volume_secret_is_ever_logged() {
    let logs = Capture::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), true, Default::default(), 100).await;
    let (handle, port) = (server.handle, server.http);

    let steps = tokio::task::spawn_blocking(move || {
        let (status, body) = call(port, "POST", "/v1/acl/bootstrap", "", "");
        assert_eq!(status, 200, "{body}");
        let root = serde_json::from_str::<Value>(&body).unwrap()["SecretID"]
            .as_str()
            .unwrap()
            .to_string();
        let policy = json!({"Rules": "namespace \"default\" { policy = \"write\" }"}).to_string();
        assert_eq!(call(port, "PUT", "/v1/acl/policy/writer", &root, &policy).0, 200);
        let token = json!({"Type": "client", "Policies": ["writer"]}).to_string();
        let (status, body) = call(port, "PUT", "/v1/acl/token", &root, &token);
        assert_eq!(status, 200, "{body}");
        let client = serde_json::from_str::<Value>(&body).unwrap()["SecretID"]
            .as_str()
            .unwrap()
            .to_string();
        let variable = json!({"Items": {"password": "VARSECRET-5b1d"}}).to_string();
        let (status, body) = call(port, "PUT", "/v1/var/app/db", &root, &variable);
        assert_eq!(status, 200, "{body}");
        let (status, body) = call(port, "GET", "/v1/var/app/db", &root, "");
        assert!(
            status == 200 && body.contains("VARSECRET-5b1d"),
            "the owner reads it: {body}"
        );
        let volume = json!({"Volumes": [{"ID": "v1", "Name": "v1", "PluginID": "nowhere",
            "AccessMode": "single-node-writer", "AttachmentMode": "file-system",
            "Secrets": {"pw": "VOLSECRET-77c2"}}]})
        .to_string();
        let (_, body) = call(port, "PUT", "/v1/volume/csi/v1", &client, &volume);
        assert!(!body.contains("VOLSECRET-77c2"), "{body}");
        // A one-time token made and exchanged; an OIDC method holding a client secret.
        let (status, body) = call(port, "POST", "/v1/acl/token/onetime", &client, "");
        assert_eq!(status, 200, "{body}");
        let one_time = serde_json::from_str::<Value>(&body).unwrap()["OneTimeToken"]["OneTimeSecretID"]
            .as_str()
            .unwrap()
            .to_string();
        let exchange = json!({ "OneTimeSecretID": one_time }).to_string();
        assert_eq!(
            call(port, "POST", "/v1/acl/token/onetime/exchange", "", &exchange).0,
            200
        );
        let method = json!({"Name": "sso", "Type": "OIDC", "TokenLocality": "local", "MaxTokenTTL": "1h",
            "Config": {"OIDCDiscoveryURL": "https://idp.example", "OIDCClientID": "drover",
                "OIDCClientSecret": "OIDCSECRET-3f1a", "AllowedRedirectURIs": ["http://localhost:4649/oidc/callback"]}})
        .to_string();
        let (status, body) = call(port, "POST", "/v1/acl/auth-method", &root, &method);
        assert_eq!(status, 200, "{body}");
        vec![root, client, one_time]
    })
    .await
    .unwrap();
    handle.shutdown().await;

    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    // The capture saw the agent work at trace level, the Raft entries of every write among it
    // (bootstrap, policy, token, variable): a check of an empty log would prove nothing.
    assert!(text.lines().count() > 100, "{} lines", text.lines().count());
    let writes = text.lines().filter(|line| line.contains("payload: normal")).count();
    assert!(writes >= 4, "{writes} normal entries logged");
    for secret in steps
        .iter()
        .map(String::as_str)
        .chain(["VARSECRET-5b1d", "VOLSECRET-77c2", "OIDCSECRET-3f1a"])
    {
        let line = text.lines().find(|line| line.contains(secret));
        assert!(line.is_none(), "{secret} was logged: {}", line.unwrap_or_default());
    }
}
