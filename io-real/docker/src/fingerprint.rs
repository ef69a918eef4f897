//! The driver's fingerprint: whether the daemon answers, and what it is (Nomad's
//! `driver.docker.*` attributes). Fingerprints are taken on a blocking thread, so the daemon is
//! asked over a plain blocking socket, each question bounded by [`ASK_TIMEOUT`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use drover_core::driverspec::docker_plugin::DockerPluginConfig;
use drover_io_real::drivers::DriverFingerprint;

/// How long the daemon may take to answer one fingerprint question.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Nomad's texts: a daemon never reached leaves the driver undetected; one that stopped
/// answering makes it unhealthy, so feasibility stops placing docker tasks on the node.
const UNREACHABLE: &str = "Failed to connect to docker daemon";

pub fn take(endpoint: &str, plugin: &DockerPluginConfig, detected: &AtomicBool) -> DriverFingerprint {
    let answered = super::socket_path(endpoint)
        .ok_or_else(|| format!("docker endpoint {endpoint:?} is not a unix socket (unix:///path)"))
        .and_then(|socket| {
            let version = ask(&socket, "/v1.41/version")?;
            // Runtimes come from `info`; a daemon answering `version` but not `info` is still up.
            let info = ask(&socket, "/v1.41/info").unwrap_or_default();
            Ok((version, info))
        });
    let (version, info) = match answered {
        Ok(answers) => answers,
        Err(error) => {
            tracing::debug!(%endpoint, %error, "docker daemon did not answer");
            let was_detected = detected.load(Ordering::SeqCst);
            return DriverFingerprint {
                detected: was_detected,
                healthy: false,
                health_description: UNREACHABLE.into(),
                attributes: BTreeMap::new(),
                update_time_ms: 0,
            };
        }
    };
    detected.store(true, Ordering::SeqCst);
    let mut attributes = BTreeMap::new();
    attributes.insert("driver.docker".to_string(), "true".to_string());
    if let Some(number) = version.get("Version").and_then(|value| value.as_str()) {
        attributes.insert("driver.docker.version".into(), number.to_string());
    }
    if plugin.allow_privileged {
        attributes.insert("driver.docker.privileged.enabled".into(), "true".into());
    }
    if plugin.volumes_enabled {
        attributes.insert("driver.docker.volumes.enabled".into(), "true".into());
    }
    if let Some(runtimes) = info.get("Runtimes").and_then(|value| value.as_object()) {
        let mut names: Vec<&String> = runtimes.keys().collect();
        names.sort();
        attributes.insert(
            "driver.docker.runtimes".into(),
            names.into_iter().cloned().collect::<Vec<_>>().join(","),
        );
    }
    // podman's compatible API names itself among the version's components.
    let podman = version
        .get("Components")
        .and_then(|components| components.as_array())
        .is_some_and(|components| {
            components
                .iter()
                .any(|component| component.get("Name").and_then(|name| name.as_str()) == Some("Podman Engine"))
        });
    if podman {
        attributes.insert("driver.docker.engine".into(), "podman".into());
    }
    DriverFingerprint {
        detected: true,
        healthy: true,
        health_description: "Healthy".into(),
        attributes,
        update_time_ms: 0,
    }
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
    fn a_daemon_never_reached_is_undetected_and_one_gone_is_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/docker.sock", dir.path().display());
        let detected = AtomicBool::new(false);
        let plugin = DockerPluginConfig::default();
        let first = take(&endpoint, &plugin, &detected);
        assert!(!first.detected && !first.healthy);
        assert_eq!(first.health_description, UNREACHABLE);
        detected.store(true, Ordering::SeqCst);
        let later = take(&endpoint, &plugin, &detected);
        assert!(later.detected && !later.healthy);
    }

    #[test]
    fn a_daemon_answering_is_healthy_with_its_version_and_runtimes() {
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
        let plugin = DockerPluginConfig {
            allow_privileged: true,
            ..DockerPluginConfig::default()
        };
        let detected = AtomicBool::new(false);
        let fingerprint = take(&format!("unix://{}", socket.display()), &plugin, &detected);
        daemon.join().unwrap();
        assert!(fingerprint.detected && fingerprint.healthy);
        assert_eq!(fingerprint.attributes["driver.docker.version"], "20.10.24");
        assert_eq!(
            fingerprint.attributes["driver.docker.runtimes"],
            "io.containerd.runc.v2,runc"
        );
        assert_eq!(fingerprint.attributes["driver.docker.privileged.enabled"], "true");
        assert!(detected.load(Ordering::SeqCst));
    }
}
