//! Unix sockets that forward each connection to a TCP address (`Io::ProxySocket`): how the
//! tasks of a group with a network of its own reach the host's Consul gRPC API
//! (`alloc/tmp/consul_grpc.sock`, the `consul_grpc_socket` hook). One listener per path;
//! asked again (after an agent restart, or twice) it replaces the one there.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use drover_core::client::{ErrorKind, IoError};

/// The sockets this client serves, by path.
#[derive(Clone, Default)]
pub struct SocketProxies {
    serving: Arc<Mutex<BTreeMap<String, tokio::task::AbortHandle>>>,
}

impl std::fmt::Debug for SocketProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let serving: Vec<String> = self.serving.lock().unwrap().keys().cloned().collect();
        f.debug_struct("SocketProxies").field("serving", &serving).finish()
    }
}

impl SocketProxies {
    /// Serves `path` (its directory made beneath `alloc_root`, never through a link a task
    /// planted), forwarding to `target`.
    pub fn start(&self, alloc_root: &Path, path: &str, target: &str) -> Result<(), IoError> {
        self.stop(path);
        let socket = Path::new(path);
        if let Some(parent) = socket.parent() {
            drover_io_real::alloc_files::mkdir(alloc_root, &parent.to_string_lossy())?;
        }
        let listener = tokio::net::UnixListener::bind(socket)
            .map_err(|error| IoError::new(ErrorKind::Other, format!("listen on {path}: {error}")))?;
        let target = target.to_string();
        let served = path.to_string();
        let task = tokio::spawn(async move {
            loop {
                let mut inbound = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(socket = %served, %error, "the socket stopped accepting");
                        return;
                    }
                };
                let target = target.clone();
                tokio::spawn(async move {
                    match tokio::net::TcpStream::connect(&target).await {
                        Ok(mut outbound) => {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(error) => tracing::debug!(%target, %error, "could not reach the socket's target"),
                    }
                });
            }
        });
        self.serving
            .lock()
            .unwrap()
            .insert(path.to_string(), task.abort_handle());
        Ok(())
    }

    /// Stops serving `path` and removes the socket (a link there is removed, not followed).
    pub fn stop(&self, path: &str) {
        if let Some(task) = self.serving.lock().unwrap().remove(path) {
            task.abort();
        }
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_to_the_socket_reaches_the_target_and_stop_removes_it() {
        let root = tempfile::tempdir().unwrap();
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = upstream.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut stream, _) = upstream.accept().await.unwrap();
            let mut asked = [0u8; 4];
            stream.read_exact(&mut asked).await.unwrap();
            stream.write_all(b"pong").await.unwrap();
        });
        let path = root.path().join("a1/alloc/tmp/consul_grpc.sock");
        let path = path.to_str().unwrap();
        let proxies = SocketProxies::default();
        proxies.start(root.path(), path, &target).unwrap();
        // Asked again (an agent restart): the one there is replaced.
        proxies.start(root.path(), path, &target).unwrap();
        let mut client = tokio::net::UnixStream::connect(path).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut answer = [0u8; 4];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"pong");
        proxies.stop(path);
        assert!(!Path::new(path).exists());
    }
}
