//! `ACL.ResolveToken` for agents without the ACL tables: a client-only agent asks a server for
//! a token's rules (its policies, or management, and expiry) and builds the ACL itself, as
//! Nomad's client agents do. Any server answers from its own applied state.

use std::time::Duration;

use drover_core::acl::{ResolveError, ResolvedToken};
use drover_proto::agent::v1::AgentResponse;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use serde::{Deserialize, Serialize};

use super::{ENVELOPE_VERSION, Service, envelope, json_payload};

/// How long a client-only agent waits for a server to resolve a token.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The token to resolve. Its secret crosses agent RPC: mutual TLS protects it there.
#[derive(Clone, Serialize, Deserialize)]
pub struct AclResolveRequest {
    pub secret: String,
}

impl std::fmt::Debug for AclResolveRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AclResolveRequest([REDACTED])")
    }
}

/// What a server answers: the token's rules, or why it has none.
pub type AclResolveReply = Result<ResolvedToken, ResolveError>;

impl Service {
    /// A server resolves `request` from its applied state.
    pub(super) fn acl_resolve_local(&self, request: &AclResolveRequest) -> Option<AgentResponse> {
        let (applied, _) = self.state.as_ref()?;
        let reply: AclResolveReply = applied.read(|applied| {
            let now = crate::clock::unix_millis().max(applied.state.last_applied_time_ms());
            applied.state.acl().resolve_rules(&request.secret, now)
        });
        Some(AgentResponse {
            version: ENVELOPE_VERSION,
            body: Some(ResponseBody::AclResolve(json_payload(&reply))),
        })
    }

    /// A client-only agent has a server resolve `secret`; `Err` with why no server answered.
    pub async fn acl_resolve(&self, secret: &str) -> Result<AclResolveReply, String> {
        let request = AclResolveRequest {
            secret: secret.to_string(),
        };
        let body = RequestBody::AclResolve(json_payload(&request));
        match self
            .call_servers(envelope(&self.region, body), RESOLVE_TIMEOUT)
            .await?
            .body
        {
            Some(ResponseBody::AclResolve(payload)) => {
                serde_json::from_slice(&payload.json).map_err(|error| format!("malformed reply: {error}"))
            }
            Some(ResponseBody::Error(error)) => Err(error.message),
            other => Err(format!("unexpected response {other:?}")),
        }
    }
}
