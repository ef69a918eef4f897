//! Consistent reads (Nomad's default): a read is answered from state at least as new as the
//! leader's commit index when the read arrived — Raft's ReadIndex. The leader confirms it
//! still leads with a heartbeat round to a quorum (openraft's `get_read_log_id`) and names the
//! index; the answering server waits until it has applied that far, then reads its own state.
//! A follower asks the leader for the index over the agent transport; the data never moves.
//! `?stale` reads skip all of this and are answered from whatever the server has applied.

use std::time::Duration;

use drover_proto::agent::v1::JsonPayload;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;

use super::AgentHandle;

/// How long a read waits for the leader's index and for this server to apply up to it.
pub const READ_BARRIER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a consistent read could not be answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Nomad's text, answered with 500.
    #[error("No cluster leader")]
    NoLeader,
    #[error("timed out waiting for this server to apply up to the leader's index {0}")]
    Behind(u64),
}

impl AgentHandle {
    /// Waits until this server's state is at least as new as the leader's commit index now.
    pub async fn read_barrier(&self) -> Result<(), ReadError> {
        let Some(raft) = &self.inner.raft else {
            return Ok(());
        };
        if self.inner.config.server.raft_faults.local_consistent_reads {
            return Ok(());
        }
        let (known, _) = self.leader_contact();
        let leader = self
            .status()
            .raft
            .and_then(|raft| raft.leader)
            .filter(|_| known)
            .ok_or(ReadError::NoLeader)?;
        let index = if leader.0 == self.inner.node_id {
            read_index(raft).await?
        } else {
            let addr = leader.1.rpc_addr.parse().map_err(|_| ReadError::NoLeader)?;
            self.ask_read_index(addr).await?
        };
        self.wait_applied(index).await
    }

    async fn ask_read_index(&self, addr: std::net::SocketAddr) -> Result<u64, ReadError> {
        let envelope = crate::service::envelope(
            &self.inner.config.region,
            RequestBody::RaftReadIndex(JsonPayload { json: b"null".to_vec() }),
        );
        let response = (self.inner.service.forward)(addr, envelope, READ_BARRIER_TIMEOUT)
            .await
            .map_err(|_| ReadError::NoLeader)?;
        match response.body {
            Some(ResponseBody::RaftReadIndex(payload)) => serde_json::from_slice::<Result<u64, String>>(&payload.json)
                .ok()
                .and_then(Result::ok)
                .ok_or(ReadError::NoLeader),
            _ => Err(ReadError::NoLeader),
        }
    }

    async fn wait_applied(&self, index: u64) -> Result<(), ReadError> {
        let (Some(applied), Some(changes)) = (&self.inner.applied, &self.inner.changes) else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + READ_BARRIER_TIMEOUT;
        loop {
            let seen = changes.count();
            if applied.last_applied_index() >= index {
                return Ok(());
            }
            if !changes.changed_since(seen, deadline).await {
                return Err(ReadError::Behind(index));
            }
        }
    }
}

/// The leader's read index: its commit index once a quorum confirmed it still leads (also
/// the answer to a follower's `raft_read_index` request).
pub(crate) async fn read_index(raft: &crate::raft::Raft) -> Result<u64, ReadError> {
    let (read, _) = tokio::time::timeout(READ_BARRIER_TIMEOUT, raft.get_read_log_id())
        .await
        .map_err(|_| ReadError::NoLeader)?
        .map_err(|_| ReadError::NoLeader)?;
    Ok(read.map(|log| log.index).unwrap_or(0))
}
