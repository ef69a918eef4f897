//! Consistent reads by default, as Nomad's: a `GET` of cluster state waits for the Raft read
//! barrier (`AgentHandle::read_barrier`) before its handler reads this server's state, so a
//! read through a lagging follower never misses a write the cluster acknowledged before the
//! read arrived. `?stale` (or `?stale=true`) reads are answered locally at once, with
//! `X-Nomad-KnownLeader` and `X-Nomad-LastContact` saying how fresh they are. A read that
//! finds no leader is held for up to `rpc_hold_timeout` (5 s) while one is elected, as Nomad
//! holds its RPCs, rather than failing with "No cluster leader" at the first try.
//!
//! Not behind the barrier: the agent's own endpoints (`/v1/agent/*`), `/v1/status/*` (they
//! say what this server knows), and the client endpoints (`/v1/client/*`), which read a
//! client's own files and processes.

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use drover_io_real::driver::{AgentHandle, ReadError};

/// Whether `path` reads the replicated state.
fn replicated(path: &str) -> bool {
    // Metrics must answer when there is no leader; the event stream follows its own index.
    !["/v1/agent/", "/v1/status/", "/v1/client/", "/v1/metrics", "/v1/event/"]
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

/// `?stale`, `?stale=` or `?stale=<Go bool>`; a value that is no boolean is Nomad's 400.
fn stale(query: Option<&str>) -> Result<bool, String> {
    let Some(query) = query else { return Ok(false) };
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "stale" {
            continue;
        }
        return match value {
            "" | "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err("Expect `true` or `false` for `stale` query string parameter".into()),
        };
    }
    Ok(false)
}

pub async fn consistent(State(handle): State<AgentHandle>, request: Request, next: Next) -> Response {
    if request.method() != Method::GET || !handle.is_server() || !replicated(request.uri().path()) {
        return next.run(request).await;
    }
    match stale(request.uri().query()) {
        Ok(true) => return next.run(request).await,
        Ok(false) => {}
        Err(error) => return (StatusCode::BAD_REQUEST, error).into_response(),
    }
    // Held through an election, as Nomad holds every RPC for `rpc_hold_timeout`: a read that
    // finds no leader asks again until one is known or the hold runs out.
    let give_up = tokio::time::Instant::now() + drover_core::rpc::RPC_HOLD_TIMEOUT;
    let mut attempt = 0;
    loop {
        match handle.read_barrier().await {
            Ok(()) => return next.run(request).await,
            Err(ReadError::NoLeader) if tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(drover_core::rpc::read_hold_pause(attempt)).await;
                attempt += 1;
            }
            Err(error @ (ReadError::NoLeader | ReadError::Behind(_))) => {
                return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_is_a_flag_or_a_go_boolean() {
        assert_eq!(stale(None), Ok(false));
        assert_eq!(stale(Some("index=4&wait=1s")), Ok(false));
        assert_eq!(stale(Some("stale")), Ok(true));
        assert_eq!(stale(Some("index=4&stale=")), Ok(true));
        assert_eq!(stale(Some("stale=True")), Ok(true));
        assert_eq!(stale(Some("stale=0")), Ok(false));
        assert!(stale(Some("stale=maybe")).unwrap_err().contains("`stale`"));
    }

    #[test]
    fn agent_status_and_client_endpoints_are_local() {
        assert!(replicated("/v1/jobs"));
        assert!(replicated("/v1/volume/csi/x"));
        assert!(!replicated("/v1/status/leader"));
        assert!(!replicated("/v1/agent/self"));
        assert!(!replicated("/v1/client/fs/logs/a"));
    }
}
