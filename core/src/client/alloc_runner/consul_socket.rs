//! The `consul_grpc_socket` alloc hook (Nomad's): a Connect sidecar in a group with a network
//! of its own cannot reach the host's Consul on its loopback, so the client serves Consul's
//! gRPC API as a unix socket in the allocation's shared directory
//! (`alloc/tmp/consul_grpc.sock`, `/alloc/tmp/consul_grpc.sock` inside a task), forwarding each
//! connection to the client's `consul { grpc_address }`. Made in prerun (again after an agent
//! restart), removed in postrun. Host-mode groups, and groups without a sidecar, need none.

use super::*;

impl AllocRunner {
    /// Whether the allocation needs the socket: a Connect sidecar in a bridge-mode group.
    pub(super) fn needs_grpc_socket(&self) -> bool {
        let bridge = self
            .spec
            .group
            .networks
            .first()
            .is_some_and(|network| network.mode == crate::structs::NETWORK_MODE_BRIDGE);
        bridge
            && self
                .spec
                .group
                .services
                .iter()
                .any(|service| service.connect.as_ref().is_some_and(|connect| connect.has_sidecar()))
    }

    pub(super) fn grpc_socket_prerun(&mut self, ops: &mut OpIds) -> HookProgress {
        if !self.needs_grpc_socket() || self.grpc_socket_requested {
            return HookProgress::Done;
        }
        self.grpc_socket_requested = true;
        let io = Io::ProxySocket {
            path: self.spec.paths.consul_grpc_socket(&self.spec.alloc.id),
            target: self.spec.consul.grpc_addr.clone(),
        };
        self.request(ops, io)
    }

    pub(super) fn grpc_socket_outcome(&mut self, outcome: Outcome) -> PrerunVerdict {
        match outcome {
            Ok(_) => PrerunVerdict::Advance,
            // Nomad's text.
            Err(error) => PrerunVerdict::Failed(format!("unable to setup consul grpc socket: {error}")),
        }
    }

    /// Postrun: stops serving the socket; `true` once nothing is left to do.
    pub(super) fn grpc_socket_postrun(&mut self, ops: &mut OpIds) -> bool {
        if !self.needs_grpc_socket() || self.grpc_socket_closed {
            return true;
        }
        if self.grpc_socket_op.is_some() {
            return false;
        }
        let op = ops.allocate();
        self.grpc_socket_op = Some(op);
        self.actions.push(AllocAction::Io {
            op,
            io: Io::StopProxySocket {
                path: self.spec.paths.consul_grpc_socket(&self.spec.alloc.id),
            },
        });
        false
    }
}
