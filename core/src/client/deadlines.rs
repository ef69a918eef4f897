//! How long the driver lets each I/O request run before it gives up and answers
//! [`ErrorKind::Timeout`](crate::client::ErrorKind::Timeout), which the requesting machine's
//! retry rules then act on. The values are decisions, so they live here; the driver only
//! enforces them.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

use crate::client::Io;
use crate::rpc::ServerRequest;

/// Filesystem calls (`mkdir`, `rm -rf`, `rmdir`, the mount table): a hung NFS mount must not
/// hang a hook forever.
pub const FS_TIMEOUT: Duration = Duration::from_secs(30);
/// Starting a task (the driver's own start, not the task's lifetime).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// One CSI call to a node plugin (Nomad's `DefaultMountActionTimeout`).
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// One call to the local Consul agent.
pub const CONSUL_TIMEOUT: Duration = Duration::from_secs(10);
/// Killing what a task left behind and removing its cgroup.
pub const DESTROY_TIMEOUT: Duration = Duration::from_secs(30);
/// A blocking alloc sync may take its whole wait; this much more covers the network.
pub const ALLOC_SYNC_GRACE: Duration = Duration::from_secs(10);
/// The node's own calls to the servers (registration, heartbeat, status and fingerprint
/// reports): each is small and answered once applied, and each is retried by the machine
/// that sent it. A reply lost on the way (a dropped connection, a server that restarted
/// mid-call) must not leave the client waiting on it for good; the driver's own 60 s
/// forwarding bound is far longer than a heartbeat TTL.
pub const NODE_RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadline of `io`, or `None` when it has none of its own: stopping a task is bounded by
/// its kill timeout, the other server requests by the leader's own deadlines, and device reservations and
/// volume operations answer from memory or through requests that have deadlines.
pub fn deadline(io: &Io) -> Option<Duration> {
    match io {
        Io::Mkdir { .. }
        | Io::RemoveAll { .. }
        | Io::Rmdir { .. }
        | Io::IsMountPoint { .. }
        | Io::ReadFile { .. }
        | Io::WriteFile { .. }
        | Io::WriteBytes { .. }
        | Io::ProxySocket { .. }
        | Io::StopProxySocket { .. } => Some(FS_TIMEOUT),
        Io::StartTask(_) | Io::RunCommand { .. } | Io::CreateNetwork { .. } => Some(START_TIMEOUT),
        Io::DestroyTask { .. } | Io::DestroyNetwork { .. } => Some(DESTROY_TIMEOUT),
        Io::RenderTemplate(_) | Io::SignalTask { .. } => Some(FS_TIMEOUT),
        Io::Csi { .. } => Some(CSI_TIMEOUT),
        Io::AllocSync(request) => Some(Duration::from_millis(request.max_wait_ms) + ALLOC_SYNC_GRACE),
        Io::Consul(_) => Some(CONSUL_TIMEOUT),
        Io::Server(
            ServerRequest::NodeRegister { .. }
            | ServerRequest::NodeUpdateStatus { .. }
            | ServerRequest::NodeUpdateCsiInfo { .. }
            | ServerRequest::NodeUpdateDrivers { .. }
            | ServerRequest::NodeEmitEvents { .. }
            | ServerRequest::AllocClientUpdates { .. },
        ) => Some(NODE_RPC_TIMEOUT),
        // Claims may wait on a controller's publish, tokens on Consul: the leader bounds
        // those itself.
        Io::Server(_) => None,
        Io::StopTask { .. }
        | Io::RecoverTask { .. }
        | Io::ReserveDevices { .. }
        | Io::PrepareDevices { .. }
        | Io::Volume(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::server_link::ALLOC_SYNC_WAIT;
    use crate::rpc::NodeAllocsRequest;

    #[test]
    fn each_request_kind_has_its_deadline() {
        assert_eq!(deadline(&Io::Mkdir { path: "/a".into() }), Some(FS_TIMEOUT));
        assert_eq!(deadline(&Io::IsMountPoint { path: "/a".into() }), Some(FS_TIMEOUT));
        let sync = Io::AllocSync(NodeAllocsRequest {
            known_view: None,
            node_id: "n1".into(),
            min_index: 7,
            max_wait_ms: ALLOC_SYNC_WAIT.as_millis() as u64,
        });
        assert_eq!(deadline(&sync), Some(Duration::from_secs(40)));
        assert_eq!(
            deadline(&Io::Server(ServerRequest::NodeUpdateStatus {
                node_id: "n1".into(),
                secret_id: String::new(),
                status: crate::structs::NodeStatus::Ready,
            })),
            Some(NODE_RPC_TIMEOUT)
        );
        let read = Io::Server(ServerRequest::VariablesRead {
            paths: Vec::new(),
            node_id: String::new(),
            secret_id: String::new(),
        });
        assert_eq!(deadline(&read), None, "the leader bounds the rest");
    }
}
