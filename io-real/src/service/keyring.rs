//! `operator gossip keyring`: one operation applied to every server's gossip keyring, as
//! Serf's key manager does with a query to the members: each server applies it to its own
//! ring (and keeps it in its data dir) and answers the keys it then holds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;

use super::{ENVELOPE_VERSION, Service, envelope, json_payload};
use crate::keyring::KeyringRequest;
use drover_proto::agent::v1::AgentResponse;

/// How long one server has to answer.
const KEYRING_TIMEOUT: Duration = Duration::from_secs(5);

/// Nomad's `KeyringResponse`: how many servers hold each key, and what went wrong where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyringSummary {
    /// Key → servers holding it.
    pub keys: BTreeMap<String, usize>,
    /// Server → why it did not apply the operation.
    pub messages: BTreeMap<String, String>,
    pub num_nodes: usize,
}

impl Service {
    /// Applies `request` to this server's ring (a peer asked, over RPC).
    pub(super) fn keyring_local(&self, request: &KeyringRequest) -> AgentResponse {
        let reply = self
            .keyring
            .lock()
            .expect("keyring lock")
            .apply(request)
            .map_err(|error| error.to_string());
        if let Err(error) = &reply {
            tracing::warn!(?request, %error, "gossip keyring operation refused");
        } else if *request != KeyringRequest::List {
            tracing::info!(?request, "gossip keyring changed");
        }
        AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::Keyring(json_payload(&reply))),
        }
    }

    /// Applies `request` on this server and on each of `peers` (name, RPC address), gathering
    /// what each holds afterwards.
    pub async fn keyring_everywhere(
        &self,
        me: &str,
        peers: &[(String, SocketAddr)],
        request: KeyringRequest,
    ) -> KeyringSummary {
        let mut summary = KeyringSummary::default();
        let local = self.keyring_local(&request);
        summary.add(me, Ok(local));
        let calls = peers.iter().map(|(name, addr)| {
            let body = RequestBody::Keyring(json_payload(&request));
            let call = (self.forward)(*addr, envelope(&self.region, body), KEYRING_TIMEOUT);
            async move { (name.clone(), call.await.map_err(|error| error.to_string())) }
        });
        for (name, answer) in futures::future::join_all(calls).await {
            summary.add(&name, answer);
        }
        summary
    }
}

impl KeyringSummary {
    fn add(&mut self, server: &str, answer: Result<AgentResponse, String>) {
        self.num_nodes += 1;
        let keys = match answer.map(|response| response.body) {
            Ok(Some(ResponseBody::Keyring(payload))) => {
                serde_json::from_slice::<Result<Vec<String>, String>>(&payload.json)
                    .unwrap_or_else(|error| Err(format!("malformed answer: {error}")))
            }
            Ok(Some(ResponseBody::Error(error))) => Err(error.message),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(error) => Err(error),
        };
        match keys {
            Ok(keys) => {
                for key in keys {
                    *self.keys.entry(key).or_default() += 1;
                }
            }
            Err(error) => {
                self.messages.insert(server.to_string(), error);
            }
        }
    }
}
