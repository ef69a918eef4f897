//! Clients attached to this server (`Agent.Attach`): a client-only agent keeps a stream open
//! to the server it talks to, and requests for it (an operator's exec step, log or file read,
//! restart, signal) go down that stream instead of to its RPC port, as Nomad routes them over
//! the connection the client holds to its server. So they reach clients the servers cannot
//! dial (behind NAT, a firewalled RPC port).
//!
//! A newer stream of the same node replaces the older; requests waiting on a stream that ends
//! are failed, and the caller falls back to dialing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_proto::agent::v1::{AgentRequest, AgentResponse, AttachDown};
use tokio::sync::{mpsc, oneshot};

type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<AgentResponse>>>>;

struct Attached {
    generation: u64,
    down: mpsc::Sender<AttachDown>,
    pending: Pending,
}

/// The clients attached to this server, by node ID.
#[derive(Clone, Default)]
pub struct Attachments {
    nodes: Arc<Mutex<BTreeMap<String, Attached>>>,
    next: Arc<AtomicU64>,
}

/// One attached stream, as the transport serves it.
pub struct Attachment {
    pub node_id: String,
    generation: u64,
    pub down: mpsc::Receiver<AttachDown>,
    pending: Pending,
    registry: Attachments,
}

impl Attachment {
    /// An answer came up the stream.
    pub fn answered(&self, id: u64, response: AgentResponse) {
        if let Some(waiter) = self.pending.lock().unwrap().remove(&id) {
            let _ = waiter.send(response);
        }
    }
}

impl Drop for Attachment {
    /// The stream ended: the node is no longer attached here (unless a newer stream is).
    fn drop(&mut self) {
        let mut nodes = self.registry.nodes.lock().unwrap();
        if nodes
            .get(&self.node_id)
            .is_some_and(|attached| attached.generation == self.generation)
        {
            nodes.remove(&self.node_id);
            tracing::debug!(node = %self.node_id, "client detached");
        }
    }
}

impl Attachments {
    /// A client attached with `node_id`.
    pub fn attach(&self, node_id: String) -> Attachment {
        let generation = self.next.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = mpsc::channel(16);
        let pending = Pending::default();
        self.nodes.lock().unwrap().insert(
            node_id.clone(),
            Attached {
                generation,
                down: sender,
                pending: pending.clone(),
            },
        );
        tracing::debug!(node = %node_id, "client attached");
        Attachment {
            node_id,
            generation,
            down: receiver,
            pending,
            registry: self.clone(),
        }
    }

    /// Sends `request` to the attached node and waits for its answer; `None` when the node
    /// is not attached here (or its stream ended before answering).
    pub async fn call(
        &self,
        node_id: &str,
        request: AgentRequest,
        timeout: Duration,
    ) -> Option<Result<AgentResponse, String>> {
        let (down, pending) = {
            let nodes = self.nodes.lock().unwrap();
            let attached = nodes.get(node_id)?;
            (attached.down.clone(), attached.pending.clone())
        };
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let (sender, answer) = oneshot::channel();
        pending.lock().unwrap().insert(id, sender);
        let message = AttachDown {
            id,
            request: Some(request),
        };
        if down.send(message).await.is_err() {
            pending.lock().unwrap().remove(&id);
            return None;
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(response)) => Some(Ok(response)),
            Ok(Err(_)) => None,
            Err(_) => {
                pending.lock().unwrap().remove(&id);
                Some(Err(format!(
                    "the client attached as {node_id} did not answer within {timeout:?}"
                )))
            }
        }
    }
}
