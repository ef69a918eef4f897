mod authz;
mod cas;
mod connect;
mod csi;
mod csi_lifecycle;
mod deployments;
mod dispatch;
mod group_commit;
mod hold;
mod jobs;
mod nodes;
mod periodic;
mod scale;
mod varlocks;

use super::*;
use crate::fsm::csi::tests::{Fixture, alloc, claim, node, volume};
use crate::structs::{ClaimMode, ClaimState, ClientStatus, NodeStatus};

pub(super) struct Harness {
    pub(super) fx: Fixture,
    pub(super) machine: RpcEndpoints,
    pub(super) now: Instant,
    pub(super) calls: Vec<(OpId, String, ClientCsiRequest)>,
    pub(super) consul: Vec<(OpId, ConsulAclCall)>,
    pub(super) replies: Vec<(ReqId, ServerReply)>,
    pub(super) log: Vec<String>,
}

impl Harness {
    pub(super) fn new() -> Self {
        let mut fx = Fixture::new();
        fx.ok(Command::NodeRegister { node: node("n1", true) });
        fx.ok(Command::NodeRegister { node: node("n2", true) });
        fx.ok(Command::CsiVolumeRegister {
            volumes: vec![volume("v"), volume("w")],
        });
        fx.ok(Command::AllocUpsert {
            allocs: vec![alloc("a1", "n1"), alloc("a2", "n2")],
        });
        let mut machine = RpcEndpoints::new(
            Duration::from_secs(10),
            GcConfig::default(),
            HeartbeatConfig::default(),
            crate::config::CsiFaults::default(),
            7,
        );
        machine.handle(Instant::ZERO, Input::Leadership { leader: true }, &fx.state);
        Harness {
            fx,
            machine,
            now: Instant::ZERO,
            calls: Vec::new(),
            consul: Vec::new(),
            replies: Vec::new(),
            log: Vec::new(),
        }
    }

    /// Drains actions; proposals are committed at once, client calls are recorded.
    pub(super) fn pump(&mut self) {
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Propose { op, command } => {
                    if let Command::CsiVolumeClaim { claim, .. } = &*command {
                        self.log.push(format!("checkpoint {:?}", claim.state));
                    }
                    let response = self.fx.apply(*command);
                    let index = self.fx.index;
                    self.machine.handle(
                        self.now,
                        Input::Proposed {
                            op,
                            result: Ok((index, response)),
                        },
                        &self.fx.state,
                    );
                }
                Action::CallClient {
                    op, node_id, request, ..
                } => {
                    self.log.push(format!("call {node_id} {}", kind(&request)));
                    self.calls.push((op, node_id, request));
                }
                Action::Reply { req, reply } => self.replies.push((req, reply)),
                Action::CancelClientCall { op } => self.log.push(format!("cancel {op}")),
                Action::Consul { op, call } => self.consul.push((op, call)),
                Action::CancelConsulCall { op } => self.log.push(format!("cancel consul {op}")),
            }
        }
    }

    pub(super) fn request(&mut self, req: ReqId, request: ServerRequest) {
        self.machine.handle(
            self.now,
            Input::Request {
                req,
                request,
                authority: crate::rpc::authz::Authority::Open,
            },
            &self.fx.state,
        );
        self.pump();
    }

    pub(super) fn answer(&mut self, index: usize, result: Result<ClientCsiReply, crate::error::CsiCallError>) {
        let (op, _, _) = self.calls.remove(index);
        self.machine
            .handle(self.now, Input::ClientReplied { op, result }, &self.fx.state);
        self.pump();
    }
}

pub(super) fn kind(request: &ClientCsiRequest) -> &'static str {
    match request {
        ClientCsiRequest::ControllerAttach(_) => "controller-attach",
        ClientCsiRequest::ControllerDetach(_) => "controller-detach",
        ClientCsiRequest::ControllerValidate(_) => "controller-validate",
        ClientCsiRequest::NodeDetach(_) => "node-detach",
        ClientCsiRequest::ControllerCreate(_) => "controller-create",
        ClientCsiRequest::ControllerDelete(_) => "controller-delete",
        ClientCsiRequest::ControllerCreateSnapshot(_) => "controller-create-snapshot",
        ClientCsiRequest::ControllerDeleteSnapshot(_) => "controller-delete-snapshot",
        ClientCsiRequest::ControllerListSnapshots(_) => "controller-list-snapshots",
        ClientCsiRequest::ControllerListVolumes(_) => "controller-list-volumes",
        ClientCsiRequest::ControllerExpand(_) => "controller-expand",
        ClientCsiRequest::NodeExpand(_) => "node-expand",
    }
}

pub(super) fn take(alloc: &str, node: &str) -> ServerRequest {
    ServerRequest::VolumeClaim {
        secret_id: String::new(),
        namespace: "default".into(),
        volume_id: "v".into(),
        claim: claim(alloc, node, ClaimMode::Write, ClaimState::Taken),
    }
}

impl Harness {
    pub(super) fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
        self.machine.handle_timeout(self.now, &self.fx.state);
        self.pump();
    }

    pub(super) fn status(&self, node: &str) -> NodeStatus {
        self.fx.state.node(node).unwrap().status
    }

    pub(super) fn heartbeat(&mut self, req: ReqId, node: &str) -> ServerReply {
        self.request(
            req,
            ServerRequest::NodeUpdateStatus {
                node_id: node.into(),
                secret_id: self
                    .fx
                    .state
                    .node(node)
                    .map(|node| node.secret_id.clone())
                    .unwrap_or_default(),
                status: NodeStatus::Ready,
            },
        );
        self.replies.last().unwrap().1.clone()
    }
}

#[test]
fn losing_leadership_fails_everything_in_flight_as_retryable() {
    let mut h = Harness::new();
    h.request(1, take("a1", "n1"));
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.pump();
    let ServerReply::Error(failure) = &h.replies[0].1 else {
        panic!()
    };
    assert!(failure.retryable);
    // Another server leads now: requests are refused at once, not held.
    h.machine.set_holding(false);
    h.request(2, take("a2", "n2"));
    let ServerReply::Error(failure) = &h.replies[1].1 else {
        panic!()
    };
    assert_eq!(failure.message, "No cluster leader");
    assert_eq!(h.machine.poll_timeout(), None);
}

/// A valid batch job: one group of one `exec` task (what launcher parents are built on).
pub(super) fn batch_job(id: &str) -> crate::structs::Job {
    crate::testkit::job(id, crate::structs::JobType::Batch).with_memory(64)
}

/// The request's answer (the harness commits proposals at once).
pub(super) fn ask(h: &mut Harness, req: ReqId, request: ServerRequest) -> ServerReply {
    h.request(req, request);
    h.replies.pop().expect("answered").1
}

/// The text of an error answer.
pub(super) fn error_text(reply: ServerReply) -> String {
    match reply {
        ServerReply::Error(error) => error.message,
        other => panic!("expected an error, got {other:?}"),
    }
}
