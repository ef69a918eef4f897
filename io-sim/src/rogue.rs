//! A machine holding a client's certificate that makes a server's call: a direct write of a
//! variable (`Apply`), sent straight to a server. The servers must refuse it by the caller's
//! identity; what they answer goes in the trace, and a write that gets through is caught by
//! the `only servers write directly` invariant when it commits. With ACLs on, the same
//! machine also makes the server calls only a token may allow ([`server_calls`]): a client's
//! certificate proves a node, and a node makes only its own node's calls.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use drover_core::fsm::{Command, Entry};
use drover_core::rpc::{ServerReply, ServerRequest};
use drover_io_real::io::{Identity, Transport};
use drover_proto::agent::v1::ApplyRequest;
use drover_proto::agent::v1::agent_request::Body as RequestBody;
use drover_proto::agent::v1::agent_response::Body as ResponseBody;
use madsim::runtime::{Handle, NodeHandle};

use crate::net::SimTransport;
use crate::trace::Recorder;

/// The rogue machine's address: outside the servers' (10.0.0.x) and clients' (10.0.1.x).
const ROGUE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 9, 9));
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The rogue's machine, made on first use.
pub fn machine(handle: &Handle) -> NodeHandle {
    handle.create_node().name("rogue").ip(ROGUE_IP).build()
}

/// Sends one direct write from `node` to the server at `to` (of `region`), the `n`th, and
/// notes the answer.
pub fn direct_write(node: &NodeHandle, to: SocketAddr, region: String, n: u64, recorder: Recorder) {
    node.spawn(async move {
        let entry = Entry {
            at_unix_ms: 0,
            command: Command::VariableUpsert {
                path: format!("rogue/{n}"),
                items: [("v".to_string(), "written by a client".to_string())].into(),
                cas: None,
                lock_id: None,
            },
        };
        let request = drover_io_real::service::envelope(
            &region,
            RequestBody::Apply(ApplyRequest {
                command_json: serde_json::to_vec(&entry).expect("entry serializes"),
            }),
        );
        let transport = SimTransport::proving(Identity::Client);
        let answer = match transport.call(to, request, CALL_TIMEOUT).await {
            Ok(response) => match response.body {
                Some(ResponseBody::Apply(apply)) => format!("committed at index {}", apply.index),
                Some(ResponseBody::Error(error)) => format!("refused: {}", error.message),
                other => format!("answered {other:?}"),
            },
            Err(error) => format!("failed: {error}"),
        };
        recorder.note(format!("rogue client: direct write {n} to {to}: {answer}"));
    });
}

/// What [`server_calls`] checks: with ACLs on, a client's certificate and no token (or a
/// token the servers never issued) gets no answer but a refusal to a call only a token may
/// make.
pub const CALLS_REFUSED: &str = "a client's certificate makes only a node's calls";

/// The calls a node never makes, each one a token must allow (Nomad's ACL checks): a read
/// of the workload's variables, writes that would leave a mark (`rogue` names), and calls
/// that would harm the cluster (a purge, a GC, a server forced out, autopilot turned off).
fn hostile_calls(n: u64, victims: &[String], server: &str) -> Vec<(&'static str, ServerRequest)> {
    use drover_core::server::OperatorRequest;
    let job = drover_core::structs::Job {
        id: format!("rogue-{n}"),
        name: format!("rogue-{n}"),
        namespace: "default".into(),
        ..Default::default()
    };
    let autopilot = drover_core::autopilot::AutopilotConfig {
        cleanup_dead_servers: false,
        max_trailing_logs: ROGUE_TRAILING_LOGS,
        ..Default::default()
    };
    vec![
        (
            "VariablesRead",
            ServerRequest::VariablesRead {
                paths: victims.to_vec(),
                node_id: String::new(),
                secret_id: String::new(),
            },
        ),
        (
            "JobRegister",
            ServerRequest::JobRegister {
                job: Box::new(job),
                enforce_index: None,
            },
        ),
        (
            "JobStop",
            ServerRequest::JobStop {
                namespace: "default".into(),
                job_id: "victim".into(),
                purge: true,
            },
        ),
        ("SystemGc", ServerRequest::SystemGc),
        (
            "AutopilotSetConfig",
            ServerRequest::AutopilotSetConfig {
                config: autopilot,
                cas: None,
            },
        ),
        (
            "Operator.ForceLeave",
            ServerRequest::Operator(OperatorRequest::ForceLeave {
                node: server.to_string(),
                prune: true,
            }),
        ),
    ]
}

/// The `max_trailing_logs` a rogue's autopilot change would set: a state holding it took one.
pub const ROGUE_TRAILING_LOGS: u64 = 4_242;

/// Sends the server at `to` every call of [`hostile_calls`] from `node` (a client's
/// certificate), once with no token and once with one nobody issued; each must be refused
/// ([`CALLS_REFUSED`], a violation otherwise). `victims` are variables the workload wrote;
/// `server` a server's name a forced leave would name.
pub fn server_calls(
    node: &NodeHandle,
    to: SocketAddr,
    region: String,
    n: u64,
    victims: Vec<String>,
    server: String,
    recorder: Recorder,
) {
    node.spawn(async move {
        let transport = SimTransport::proving(Identity::Client);
        let mut tried = 0;
        for token in ["", "00000000-0000-0000-0000-00000000beef"] {
            for (name, request) in hostile_calls(n, &victims, &server) {
                let envelope = drover_io_real::service::server_envelope(&region, &request, token, false);
                let answer = match transport.call(to, envelope, CALL_TIMEOUT).await {
                    Ok(response) => Ok(drover_io_real::service::server_reply(response)),
                    Err(error) => Err(error),
                };
                tried += 1;
                let with = if token.is_empty() { "no token" } else { "a forged token" };
                match answer {
                    Ok(ServerReply::Error(error)) => recorder.note(format!(
                        "rogue client: {name} with {with} to {to}: refused ({:?}: {})",
                        error.kind, error.message
                    )),
                    Err(error) => recorder.note(format!("rogue client: {name} with {with} to {to}: failed: {error}")),
                    Ok(reply) => recorder.violate(
                        CALLS_REFUSED,
                        format!("{name} with {with} to {to} was answered: {reply:?}"),
                    ),
                }
            }
        }
        recorder.checked(CALLS_REFUSED, tried);
    });
}
