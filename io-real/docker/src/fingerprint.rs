//! What the daemon is, for the driver's fingerprint (core turns it into Nomad's
//! `driver.docker.*` attributes). Fingerprints are taken on a blocking thread, so the daemon is
//! asked over a plain blocking socket, each question bounded by [`ASK_TIMEOUT`].

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use drover_core::client::containers::EngineFacts;

/// How long the daemon may take to answer one fingerprint question.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the daemon at `socket` is: its `version` (which must answer) and its `info` (runtimes;
/// a daemon answering `version` but not `info` is still up).
pub fn facts(socket: &std::path::Path) -> Result<EngineFacts, String> {
    let version = ask(socket, "/v1.41/version")?;
    let info = ask(socket, "/v1.41/info").unwrap_or_default();
    let runtimes = info
        .get("Runtimes")
        .and_then(|value| value.as_object())
        .map(|runtimes| runtimes.keys().cloned().collect())
        .unwrap_or_default();
    // podman's compatible API names itself among the version's components.
    let podman = version
        .get("Components")
        .and_then(|components| components.as_array())
        .is_some_and(|components| {
            components
                .iter()
                .any(|component| component.get("Name").and_then(|name| name.as_str()) == Some("Podman Engine"))
        });
    Ok(EngineFacts {
        version: version
            .get("Version")
            .and_then(|value| value.as_str())
            .map(String::from),
        runtimes,
        podman,
    })
}

/// `GET path` on the daemon's socket, its JSON body.
fn ask(socket: &std::path::Path, path: &str) -> Result<serde_json::Value, String> {
    let mut stream = UnixStream::connect(socket).map_err(|error| format!("connect {}: {error}", socket.display()))?;
    stream
        .set_read_timeout(Some(ASK_TIMEOUT))
        .map_err(|error| error.to_string())?;
    stream
        .set_write_timeout(Some(ASK_TIMEOUT))
        .map_err(|error| error.to_string())?;
    // HTTP/1.0: the daemon closes the connection after the body, which is then read whole.
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n").as_bytes())
        .map_err(|error| error.to_string())?;
    let mut response = Vec::new();
    stream
        .take(4 * 1024 * 1024)
        .read_to_end(&mut response)
        .map_err(|error| format!("read {path}: {error}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{path}: no HTTP response"))?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        return Err(format!("{path}: HTTP {status}"));
    }
    serde_json::from_str(body).map_err(|error| format!("{path}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_not_there_does_not_answer() {
        let dir = tempfile::tempdir().unwrap();
        assert!(facts(&dir.path().join("docker.sock")).is_err());
    }

    #[test]
    fn a_daemon_answering_names_its_version_and_runtimes() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let daemon = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut conn, _) = listener.accept().unwrap();
                // The whole request before answering: closing on unread bytes would reset it.
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                    request.push(byte[0]);
                }
                let request = String::from_utf8_lossy(&request).to_string();
                let body = if request.starts_with("GET /v1.41/version") {
                    r#"{"Version":"20.10.24","ApiVersion":"1.41"}"#
                } else {
                    r#"{"Runtimes":{"runc":{},"io.containerd.runc.v2":{}}}"#
                };
                write!(conn, "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{body}").unwrap();
            }
        });
        let facts = facts(&socket).unwrap();
        daemon.join().unwrap();
        assert_eq!(facts.version.as_deref(), Some("20.10.24"));
        let mut runtimes = facts.runtimes.clone();
        runtimes.sort();
        assert_eq!(runtimes, ["io.containerd.runc.v2", "runc"]);
        assert!(!facts.podman);
    }
}
