//! The ACL token of the HTTP request being served, for the server requests its handler makes:
//! they carry it to the servers (`AgentRequest.auth_token`), which check it against what each
//! request needs (`drover_core::rpc::authz`), whatever the transport. Scoped per request by
//! the HTTP layer; a call made outside one (a client's own node calls) carries none.

use std::future::Future;

tokio::task_local! {
    static TOKEN: String;
}

/// Runs `future` with `token` as its caller's.
pub async fn with_token<F: Future>(token: String, future: F) -> F::Output {
    TOKEN.scope(token, future).await
}

/// The token of the request this task serves; empty outside one.
pub fn caller_token() -> String {
    TOKEN.try_with(Clone::clone).unwrap_or_default()
}
