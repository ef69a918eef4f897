//! Root key material between servers (Nomad's `Keyring.Get` and the leader's key
//! distribution): a server hands a new root key to its peers before proposing it active, and
//! asks its peers for a key it lacks when it meets a value sealed under it. Only servers may
//! make these calls (`Incoming::needs`); under mutual TLS that is a server certificate.

use std::net::SocketAddr;
use std::time::Duration;

use drover_core::structs::Secrets;
use drover_proto::agent::v1::AgentResponse;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use serde::{Deserialize, Serialize};

use super::{ENVELOPE_VERSION, Service, envelope, json_payload};
use crate::rootkeys::{RootKeyError, RootKeyMaterial};

/// How long one server has to answer.
const ROOT_KEY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootKeyRequest {
    /// Keep this key (it is about to become active).
    Put(RootKeyMaterial),
    /// The key with this id, if held.
    Get(String),
}

impl Service {
    /// Answers a peer's request from this server's keystore.
    pub(super) fn root_key_local(&self, request: RootKeyRequest) -> AgentResponse {
        let reply: Result<Option<RootKeyMaterial>, String> = match request {
            RootKeyRequest::Put(material) => {
                let key_id = material.key_id.clone();
                match self.keystore.insert(material) {
                    Ok(()) => {
                        tracing::info!(%key_id, "root key received from a peer and kept");
                        Ok(None)
                    }
                    Err(error) => Err(error.to_string()),
                }
            }
            RootKeyRequest::Get(key_id) => Ok(self.keystore.material(&key_id)),
        };
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::RootKey(json_payload(&reply))),
        }
    }

    /// The other servers of the Raft configuration (their RPC addresses), and how many
    /// voters it has.
    pub fn raft_peers(&self) -> (Vec<SocketAddr>, usize) {
        let voters = self.raft.as_ref().map_or(0, |raft| {
            raft.metrics()
                .borrow()
                .membership_config
                .membership()
                .voter_ids()
                .count()
        });
        (self.peer_servers(), voters)
    }

    async fn root_key_call(
        &self,
        addr: SocketAddr,
        request: &RootKeyRequest,
    ) -> Result<Option<RootKeyMaterial>, String> {
        let body = RequestBody::RootKey(json_payload(request));
        let response = (self.forward)(addr, envelope(&self.region, body), ROOT_KEY_TIMEOUT)
            .await
            .map_err(|error| error.to_string())?;
        match response.body {
            Some(ResponseBody::RootKey(payload)) => {
                serde_json::from_slice::<Result<Option<RootKeyMaterial>, String>>(&payload.json)
                    .unwrap_or_else(|error| Err(format!("malformed answer: {error}")))
            }
            Some(ResponseBody::Error(error)) => Err(error.message),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// Hands `material` to every other server; how many kept it.
    pub async fn push_root_key(&self, peers: &[SocketAddr], material: &RootKeyMaterial) -> usize {
        let request = RootKeyRequest::Put(material.clone());
        let calls = peers.iter().map(|addr| {
            let request = &request;
            async move {
                let result = self.root_key_call(*addr, request).await;
                if let Err(error) = &result {
                    tracing::warn!(peer = %addr, %error, key_id = %material.key_id, "a server did not take the new root key");
                }
                result.is_ok()
            }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter(|kept| *kept)
            .count()
    }

    /// Asks the other servers for `key_id` and keeps the first copy one hands back.
    pub async fn fetch_root_key(&self, key_id: &str) -> Result<(), RootKeyError> {
        let (peers, _) = self.raft_peers();
        let request = RootKeyRequest::Get(key_id.to_string());
        for addr in peers {
            match self.root_key_call(addr, &request).await {
                Ok(Some(material)) if material.key_id == key_id => {
                    self.keystore.insert(material)?;
                    tracing::info!(%key_id, peer = %addr, "root key fetched from a peer");
                    return Ok(());
                }
                Ok(_) => {}
                Err(error) => tracing::debug!(peer = %addr, %error, %key_id, "root key fetch failed"),
            }
        }
        Err(RootKeyError::Missing(key_id.to_string()))
    }

    /// `secrets` opened (a plain map as it is), fetching the key from a peer first if this
    /// server lacks it.
    pub async fn open_secrets(&self, secrets: &Secrets) -> Result<Secrets, RootKeyError> {
        if let Some(key_id) = self.keystore.lacks(secrets) {
            self.fetch_root_key(&key_id).await?;
        }
        self.keystore.open_map(secrets)
    }
}
