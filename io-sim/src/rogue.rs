//! A machine holding a client's certificate that makes a server's call: a direct write of a
//! variable (`Apply`), sent straight to a server. The servers must refuse it by the caller's
//! identity; what they answer goes in the trace, and a write that gets through is caught by
//! the `only servers write directly` invariant when it commits.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use drover_core::fsm::{Command, Entry};
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
