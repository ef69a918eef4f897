//! A client-only agent answers the API as Nomad's client agents do: requests about the cluster
//! (jobs, allocations, nodes, volumes, evaluations, variables, status, ...) go to a server,
//! which answers them with its own API; only `/v1/client/*` (this client, or relayed to the
//! one that runs an allocation) and `/v1/agent/*` (this agent) are its own.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tower::ServiceExt;

use drover_io_real::driver::AgentHandle;
use drover_io_real::service::{HttpAnswer, HttpForward};

/// The most of a request or response body that is handed on.
const BODY_MAX: usize = 64 * 1024 * 1024;

/// Whether a client-only agent hands `path` to a server.
fn forwarded(path: &str) -> bool {
    path.starts_with("/v1/")
        && !path.starts_with("/v1/client/")
        && !path.starts_with("/v1/agent/")
        // A stream does not end, and a forwarded answer is handed on whole.
        && path != "/v1/event/stream"
        // Each agent's own.
        && path != "/v1/metrics"
}

/// Middleware: on a client-only agent, cluster requests go to a server.
pub async fn to_servers(State(handle): State<AgentHandle>, request: Request, next: Next) -> Response {
    if handle.is_server() || !forwarded(request.uri().path()) {
        return next.run(request).await;
    }
    let forward = match handed_on(request, false).await {
        Ok(forward) => forward,
        Err(refused) => return refused,
    };
    match handle.forward_http(forward).await {
        Ok(answer) => response_of(answer),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("No path to region: {error}")).into_response(),
    }
}

/// `request` as another agent's API is handed it: method, path and query, body and token (a
/// 400 when its body cannot be read).
async fn handed_on(request: Request, to_leader: bool) -> Result<HttpForward, Response> {
    let method = request.method().to_string();
    let token = super::acl::gate::token_of(request.headers());
    let uri = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_string(), |pq| pq.as_str().to_string());
    let body = axum::body::to_bytes(request.into_body(), BODY_MAX)
        .await
        .map_err(|error| (StatusCode::BAD_REQUEST, format!("failed to read the request: {error}")).into_response())?;
    Ok(HttpForward {
        method,
        uri,
        body: body.to_vec(),
        token,
        to_leader,
    })
}

/// Marks a request handed to the leader, which answers it whatever it then believes.
const TO_LEADER: &str = "x-drover-to-leader";

/// What only the leader may answer: the writes whose proof a server checks itself before
/// proposing them, so the leader cannot check it again from the write alone (a login's
/// identity token, the bootstrap reset file in the leader's data dir, as Nomad's
/// `ACL.Bootstrap` reads it). Anywhere else they would reach the leader as a bare token
/// write, which it refuses without a management token (`rpc::authz::need_command`).
fn leader_only(path: &str) -> bool {
    matches!(
        path,
        "/v1/acl/bootstrap" | "/v1/acl/login" | "/v1/acl/oidc/auth-url" | "/v1/acl/oidc/complete-auth"
    )
}

/// Middleware: on a server that does not lead, what only the leader may answer goes to it.
pub async fn to_leader(State(handle): State<AgentHandle>, request: Request, next: Next) -> Response {
    if !handle.is_server() || !leader_only(request.uri().path()) || request.headers().contains_key(TO_LEADER) {
        return next.run(request).await;
    }
    let status = handle.status();
    let leader = status.raft.as_ref().and_then(|raft| raft.leader.as_ref());
    let addr = match leader {
        Some((leader, _)) if *leader == handle.node_id() => return next.run(request).await,
        Some((_, node)) => node.rpc_addr.parse::<std::net::SocketAddr>().ok(),
        None => None,
    };
    let Some(addr) = addr else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "No cluster leader").into_response();
    };
    let forward = match handed_on(request, true).await {
        Ok(forward) => forward,
        Err(refused) => return refused,
    };
    match handle.forward_http_to(addr, forward).await {
        Ok(answer) => response_of(answer),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("forwarding to the leader failed: {error}"),
        )
            .into_response(),
    }
}

/// The response another agent answered a handed-on request with: its status, body and the
/// headers it handed back.
pub fn response_of(answer: HttpAnswer) -> Response {
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// Runs a request another agent handed on through this agent's API.
pub async fn answer(app: axum::Router, forward: HttpForward) -> HttpAnswer {
    let mut request = axum::http::Request::builder()
        .method(forward.method.as_str())
        .uri(forward.uri.as_str());
    if !forward.token.is_empty() {
        request = request.header("X-Nomad-Token", forward.token.as_str());
    }
    if forward.to_leader {
        request = request.header(TO_LEADER, "1");
    }
    let request = request.body(Body::from(forward.body));
    let response = match request {
        Ok(request) => app.oneshot(request).await.unwrap_or_else(|never| match never {}),
        Err(error) => (StatusCode::BAD_REQUEST, format!("bad forwarded request: {error}")).into_response(),
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str() == "content-type" || name.as_str().starts_with("x-nomad-"))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
        .collect();
    let body = match response.into_body().collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(error) => format!("failed to read the answer: {error}").into_bytes(),
    };
    HttpAnswer { status, headers, body }
}

#[cfg(test)]
mod tests {
    use super::forwarded;

    #[test]
    fn only_cluster_requests_are_handed_on() {
        assert!(forwarded("/v1/allocations"));
        assert!(forwarded("/v1/job/web/summary"));
        assert!(forwarded("/v1/status/leader"));
        assert!(!forwarded("/v1/client/fs/logs/a"));
        assert!(!forwarded("/v1/agent/self"));
        assert!(!forwarded("/ui/"));
    }
}
