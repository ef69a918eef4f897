//! Raft RPCs over the agent transport: each openraft request is serialized as JSON into an
//! agent envelope, and the remote's `Result` comes back the same way, so remote Raft errors
//! reach openraft as `RemoteError`s and transport failures as `Unreachable`/`Network`.

use std::net::SocketAddr;

use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use drover_proto::agent::v1::{AgentRequest, RaftPayload};
use openraft::AnyError;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{ServerNode, TypeConfig};
use crate::io::{Transport, TransportError};

pub struct NetworkFactory<T> {
    transport: T,
    region: String,
    reachability: Reachability,
    heartbeat: std::time::Duration,
}

impl<T: Transport> NetworkFactory<T> {
    /// Who answered this server's Raft RPCs, and when (shared with the factory's connections).
    pub fn reachability(&self) -> Reachability {
        self.reachability.clone()
    }

    /// `heartbeat` is the Raft heartbeat interval: the pause before retrying a peer that could
    /// not be reached.
    pub fn new(transport: T, region: String, heartbeat: std::time::Duration) -> Self {
        NetworkFactory {
            transport,
            region,
            reachability: Reachability::default(),
            heartbeat,
        }
    }
}

/// The most JSON one AppendEntries may carry. openraft 0.9 gives every AppendEntries one
/// heartbeat interval to complete and retries a timed-out batch unchanged, so a follower far
/// behind on large entries could never catch up; a bigger batch is refused before it is sent
/// with a hint of how many entries fit, and openraft sends fewer.
pub const APPEND_ENTRIES_BYTES: usize = 256 * 1024;

/// How many of `entries` fit in `budget` bytes of JSON when they do not all fit; None when
/// they do. Stops counting at the budget: openraft offers up to 300 entries at a time, and
/// sizing all of a far-behind follower's batch (300 x 60 KB took ~200 ms in a debug build)
/// on the runtime thread starved heartbeats to the other followers into failovers.
fn entries_within<T: serde::Serialize>(entries: &[T], budget: usize) -> Option<usize> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    for (index, entry) in entries.iter().enumerate() {
        // An entry that does not serialise is sent as it is, for the peer to refuse.
        let _ = serde_json::to_writer(&mut count, entry);
        if count.0 > budget {
            return Some(index);
        }
    }
    None
}

/// Whether each peer answered its last Raft RPC, and when one last answered. openraft
/// retries a dead peer every heartbeat and logs every failure; this says it once when a peer
/// stops answering and once when it answers again (openraft's own log is off by default).
/// The leader's last contact with each follower is what autopilot's health reports.
#[derive(Clone, Default)]
pub struct Reachability(std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Reached>>>);

#[derive(Clone, Copy, Debug)]
struct Reached {
    reachable: bool,
    answered_at: Option<tokio::time::Instant>,
}

impl Reachability {
    /// How long ago each peer last answered a Raft RPC from this server.
    pub fn last_contacts(&self) -> std::collections::BTreeMap<u64, std::time::Duration> {
        let now = tokio::time::Instant::now();
        self.0
            .lock()
            .expect("reachability lock")
            .iter()
            .filter_map(|(id, reached)| Some((*id, now.saturating_duration_since(reached.answered_at?))))
            .collect()
    }

    fn record(&self, target: u64, addr: &str, failure: Option<&TransportError>) {
        let reachable = failure.is_none();
        let before = {
            let mut peers = self.0.lock().expect("reachability lock");
            let answered_at = if reachable {
                Some(tokio::time::Instant::now())
            } else {
                peers.get(&target).and_then(|reached| reached.answered_at)
            };
            peers
                .insert(target, Reached { reachable, answered_at })
                .map(|reached| reached.reachable)
        };
        match (before, failure) {
            (Some(false), None) => tracing::info!(peer = target, %addr, "Raft peer reachable again"),
            (Some(true) | None, Some(error)) => {
                tracing::warn!(peer = target, %addr, %error, "Raft peer unreachable; retrying quietly")
            }
            _ => {}
        }
    }
}

impl<T: Transport> RaftNetworkFactory<TypeConfig> for NetworkFactory<T> {
    type Network = Connection<T>;

    async fn new_client(&mut self, target: u64, node: &ServerNode) -> Connection<T> {
        Connection {
            transport: self.transport.clone(),
            region: self.region.clone(),
            target,
            addr: node.rpc_addr.parse().ok(),
            raw_addr: node.rpc_addr.clone(),
            reachability: self.reachability.clone(),
            heartbeat: self.heartbeat,
            last_batch: None,
        }
    }
}

/// What determines an AppendEntries request's bytes: two log entries with the same id are the
/// same entry (Raft's log matching), so equal keys encode equally.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BatchKey {
    vote: openraft::Vote<u64>,
    prev_log_id: Option<openraft::LogId<u64>>,
    leader_commit: Option<openraft::LogId<u64>>,
    first: Option<openraft::LogId<u64>>,
    last: Option<openraft::LogId<u64>>,
    len: usize,
}

impl BatchKey {
    fn of(rpc: &AppendEntriesRequest<TypeConfig>) -> Self {
        BatchKey {
            vote: rpc.vote,
            prev_log_id: rpc.prev_log_id,
            leader_commit: rpc.leader_commit,
            first: rpc.entries.first().map(|entry| entry.log_id),
            last: rpc.entries.last().map(|entry| entry.log_id),
            len: rpc.entries.len(),
        }
    }
}

pub struct Connection<T> {
    transport: T,
    region: String,
    target: u64,
    addr: Option<SocketAddr>,
    raw_addr: String,
    reachability: Reachability,
    heartbeat: std::time::Duration,
    /// The last batch of entries sent, encoded. openraft retries a batch that failed unchanged
    /// every heartbeat, for as long as the peer is down; encoding it afresh each time (up to
    /// `APPEND_ENTRIES_BYTES` of JSON at every heartbeat tick) was most of a leader's CPU while a
    /// follower was away.
    last_batch: Option<(BatchKey, Vec<u8>)>,
}

type RpcResult<R, E> = Result<R, RPCError<u64, ServerNode, RaftError<u64, E>>>;

impl<T: Transport> Connection<T> {
    async fn send<Req, Resp, E>(
        &self,
        wrap: fn(RaftPayload) -> RequestBody,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let json = serde_json::to_vec(request).expect("raft request serializes");
        self.send_json(wrap, json, option).await
    }

    /// Sends a request already encoded as JSON.
    async fn send_json<Resp, E>(
        &self,
        wrap: fn(RaftPayload) -> RequestBody,
        json: Vec<u8>,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if crate::buggify::fires(crate::buggify::RAFT_SLOW) {
            tokio::time::sleep(crate::buggify::delay_millis(20..400)).await;
        }
        let Some(addr) = self.addr else {
            let error = AnyError::error(format!("invalid RPC address {:?}", self.raw_addr));
            return Err(RPCError::Unreachable(Unreachable::new(&error)));
        };
        let envelope = AgentRequest {
            attached_node: String::new(),
            region: self.region.clone(),
            forwarded: false,
            version: crate::service::ENVELOPE_VERSION,
            auth_token: String::new(),
            body: Some(wrap(RaftPayload { json })),
        };
        let response = self.transport.call(addr, envelope, option.hard_ttl()).await;
        self.reachability
            .record(self.target, &self.raw_addr, response.as_ref().err());
        let response = response.map_err(|error| match error {
            TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
            _ => RPCError::Network(NetworkError::new(&error)),
        })?;
        match response.body {
            Some(ResponseBody::Raft(payload)) => {
                let result: Result<Resp, RaftError<u64, E>> = serde_json::from_slice(&payload.json)
                    .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
                result.map_err(|remote| RPCError::RemoteError(RemoteError::new(self.target, remote)))
            }
            Some(ResponseBody::Error(error)) => {
                Err(RPCError::Network(NetworkError::new(&AnyError::error(error.message))))
            }
            other => Err(RPCError::Network(NetworkError::new(&AnyError::error(format!(
                "unexpected response to a Raft RPC: {other:?}"
            ))))),
        }
    }
}

impl<T: Transport> RaftNetwork<TypeConfig> for Connection<T> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        // A batch retried unchanged reuses its bytes (it was sized when first sent).
        let key = (!rpc.entries.is_empty()).then(|| BatchKey::of(&rpc));
        if let (Some(key), Some((last, json))) = (&key, &self.last_batch)
            && key == last
        {
            let json = json.clone();
            return self.send_json(RequestBody::RaftAppendEntries, json, &option).await;
        }
        // Sized before it is encoded whole: a far-behind follower is offered up to 300 large
        // entries, and encoding all of them only to refuse the batch starved the heartbeats.
        if rpc.entries.len() > 1
            && let Some(fit) = entries_within(&rpc.entries, APPEND_ENTRIES_BYTES)
        {
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(
                fit.max(1) as u64
            )));
        }
        let json = serde_json::to_vec(&rpc).expect("raft request serializes");
        if let Some(key) = key {
            self.last_batch = Some((key, json.clone()));
        }
        self.send_json(RequestBody::RaftAppendEntries, json, &option).await
    }

    /// A peer that could not be reached is tried again at the next heartbeat (openraft's
    /// default waits 500 ms, longer than followers wait before standing for election: one
    /// refused connection would have cost a failover).
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(self.heartbeat))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.send(RequestBody::RaftInstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.send(RequestBody::RaftVote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::entries_within;

    #[test]
    fn a_batch_is_cut_where_its_json_passes_the_budget() {
        let entries: Vec<String> = (0..300).map(|_| "x".repeat(1000)).collect();
        // Each entry is 1,002 bytes of JSON (quotes included), plus no separators counted.
        assert_eq!(entries_within(&entries, 10_000), Some(9));
        assert_eq!(entries_within(&entries, 1_000), Some(0));
        assert_eq!(entries_within(&entries, 400_000), None);
    }
}
