//! Consistent reads (Nomad's default): a read is answered from state at least as new as the
//! leader's commit index when the read arrived — Raft's ReadIndex. The leader confirms it
//! still leads with a heartbeat round to a quorum (openraft's `get_read_log_id`) and names the
//! index; the answering server waits until it has applied that far, then reads its own state.
//! A follower asks the leader for the index over the agent transport; the data never moves.
//! `?stale` reads skip all of this and are answered from whatever the server has applied.

use drover_core::server::reads::ReadRounds;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

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
            self.inner.service.read_index.read_index(raft).await?
        } else {
            let addr = leader.1.rpc_addr.parse().map_err(|_| ReadError::NoLeader)?;
            self.ask_read_index(addr).await?
        };
        if self.inner.config.server.raft_faults.reads_skip_apply_wait {
            return Ok(());
        }
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
async fn read_index(raft: &crate::raft::Raft) -> Result<u64, ReadError> {
    let (read, _) = tokio::time::timeout(READ_BARRIER_TIMEOUT, raft.get_read_log_id())
        .await
        .map_err(|_| ReadError::NoLeader)?
        .map_err(|_| ReadError::NoLeader)?;
    Ok(read.map(|log| log.index).unwrap_or(0))
}

/// Runs the read-index rounds the core's [`ReadRounds`] decides (one at a time, each for the
/// reads that were waiting when it started) against openraft.
/// How one waiting read is answered.
type ReadAnswer = oneshot::Sender<Result<u64, ReadError>>;

#[derive(Clone)]
pub struct ReadIndexBatcher {
    rounds: Arc<Mutex<ReadRounds<ReadAnswer>>>,
    /// The regression switch `RaftFaults::leader_reads_without_quorum`.
    without_quorum: bool,
}

impl Default for ReadIndexBatcher {
    fn default() -> Self {
        ReadIndexBatcher::new(drover_core::config::RaftFaults::default())
    }
}

impl ReadIndexBatcher {
    /// A batcher that skips the quorum round, or joins reads to the running one, when
    /// `faults` re-create those defects.
    pub fn new(faults: drover_core::config::RaftFaults) -> Self {
        ReadIndexBatcher {
            rounds: Arc::new(Mutex::new(ReadRounds::new(faults.reads_join_running_round))),
            without_quorum: faults.leader_reads_without_quorum,
        }
    }

    /// The leader's read index from a quorum round that started after this call.
    pub async fn read_index(&self, raft: &crate::raft::Raft) -> Result<u64, ReadError> {
        let (answer, answered) = oneshot::channel();
        let start = self.rounds.lock().expect("read rounds lock").ask(answer);
        if start {
            // Its own task: a caller that gives up must not strand the others.
            let (batcher, raft) = (self.clone(), raft.clone());
            tokio::spawn(async move { batcher.run(&raft).await });
        }
        answered.await.unwrap_or(Err(ReadError::NoLeader))
    }

    /// Rounds until nobody waits.
    async fn run(&self, raft: &crate::raft::Raft) {
        loop {
            let Some(started_with) = self.rounds.lock().expect("read rounds lock").start_round() else {
                return;
            };
            let index = if self.without_quorum {
                Ok(raft.metrics().borrow().last_applied.map_or(0, |log| log.index))
            } else {
                read_index(raft).await
            };
            let answering = self.rounds.lock().expect("read rounds lock").round_ended(started_with);
            for answer in answering {
                let _ = answer.send(index.clone());
            }
        }
    }
}
