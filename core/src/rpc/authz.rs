//! Who may make each server request. Nomad checks the ACL token of every RPC, whatever the
//! transport: a client node's certificate proves only that it is a node, so what a node does
//! for itself is proved by its node secret, and everything an operator does needs the
//! operator's token, here as at the HTTP API (the same capabilities as `io-real`'s HTTP gate).
//!
//! The driver resolves the token the request came with ([`crate::fsm::acl::AclState::resolve`], at its wall
//! clock) into an [`Authority`]; [`check`] decides, before any endpoint sees the request.
//! A direct write (a state-machine command a server forwards to the leader for the HTTP
//! request it serves: ACL tables, variables, root keys) carries the same token, and
//! [`check_command`] decides on it the same way: a forwarded write proves nothing by coming
//! from a server, since without mutual TLS anyone can send one.

#[allow(unused_imports)]
use crate::prelude::*;

use crate::acl::policy::{cap, var_cap};
use crate::acl::{Acl, PERMISSION_DENIED, ResolveError};
use crate::fsm::acl::AclCommand;
use crate::fsm::rootkeys::RootKeyCommand;
use crate::fsm::{Command, ServerState};
use crate::rpc::OperatorRequest;

use super::deployments::DeploymentRequest;
use super::{ErrorKind, RpcError, ServerRequest};

/// What the caller of a request proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authority {
    /// ACLs are off (`acl { enabled = false }`): every request is served, and a node's own
    /// calls still carry its secret.
    Open,
    /// The request's token (or, with none, the anonymous policy) resolved to this ACL.
    Acl(Acl),
    /// The request's token is unknown or expired.
    Unresolved(ResolveError),
}

/// An object whose namespace the state knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject<'a> {
    Alloc(&'a str),
    Deployment(&'a str),
}

/// What a request needs of its caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need<'a> {
    /// A node's own call: the node secret it carries must be the stored node's (a node not
    /// registered yet may only register itself).
    NodeSecret {
        node_id: &'a str,
        secret_id: &'a str,
    },
    /// A management token: internal writes, garbage collection.
    Management,
    Node,
    Agent,
    Operator,
    /// One of `capabilities` in every one of `namespaces`.
    Namespace {
        capabilities: &'static [&'static str],
        namespaces: Vec<&'a str>,
    },
    /// One of `capabilities` in the namespace the state holds `subject` in.
    NamespaceOf {
        capabilities: &'static [&'static str],
        subject: Subject<'a>,
    },
    /// One of `capabilities` in some namespace: the request names none (a plugin's
    /// snapshots or volumes, which the caller lists in a namespace of its choosing).
    SomeNamespace {
        capabilities: &'static [&'static str],
    },
    /// `capability` on the variable at every one of `paths` (variables are stored by path
    /// alone).
    Variables {
        paths: Vec<&'a str>,
        capability: &'static str,
    },
    /// The caller's own token is the one with `accessor_id` (a one-time token is made only
    /// for the token that asks for it).
    OwnToken {
        accessor_id: &'a str,
    },
    /// Whoever asks: the write carries its own credential (a one-time secret) or the state
    /// machine refuses it unless it is the first (the ACL bootstrap).
    Anyone,
    /// A server's own write, trusted as Raft's messages are: by the transport (mutual TLS).
    Peer,
    /// Never over RPC, whatever the token; the message says where it is made instead.
    Local(&'static str),
}

const SUBMIT_JOB: &[&str] = &[cap::SUBMIT_JOB];
const CSI_WRITE: &[&str] = &[cap::CSI_WRITE_VOLUME];
const CSI_LIST: &[&str] = &[
    cap::CSI_LIST_VOLUME,
    cap::CSI_READ_VOLUME,
    cap::CSI_MOUNT_VOLUME,
    cap::LIST_JOBS,
];

fn namespace<'a>(capabilities: &'static [&'static str], namespace: &'a str) -> Need<'a> {
    Need::Namespace {
        capabilities,
        namespaces: vec![namespace],
    }
}

/// What `request` needs: Nomad's per-endpoint check.
pub fn need(request: &ServerRequest) -> Need<'_> {
    use ServerRequest as R;
    // A template's read speaks for its node; one with no node, for the token it carries.
    if let R::VariablesRead { paths, node_id, .. } = request
        && node_id.is_empty()
    {
        return Need::Variables {
            paths: paths.iter().map(String::as_str).collect(),
            capability: var_cap::READ,
        };
    }
    if let Some((node_id, secret_id)) = request.node_credential() {
        return Need::NodeSecret { node_id, secret_id };
    }
    match request {
        R::DeriveSiToken { node_id, secret_id, .. } => Need::NodeSecret { node_id, secret_id },
        R::NodeDeregister { .. }
        | R::NodeUpdateDrain { .. }
        | R::NodeUpdateEligibility { .. }
        | R::NodeEvaluate { .. } => Need::Node,
        R::JobRegister { job, .. } => namespace(SUBMIT_JOB, &job.namespace),
        R::JobDeregister { namespace: ns, .. }
        | R::JobStop { namespace: ns, .. }
        | R::JobEvaluate { namespace: ns, .. }
        | R::PeriodicForce { namespace: ns, .. } => namespace(SUBMIT_JOB, ns),
        R::JobDispatch(dispatch) => namespace(&[cap::DISPATCH_JOB], &dispatch.namespace),
        R::JobScale(scale) => namespace(&[cap::SCALE_JOB, cap::SUBMIT_JOB], &scale.namespace),
        R::Deployment(
            DeploymentRequest::Revert { namespace: ns, .. } | DeploymentRequest::Stable { namespace: ns, .. },
        ) => namespace(SUBMIT_JOB, ns),
        R::Deployment(
            DeploymentRequest::Promote { deployment_id, .. }
            | DeploymentRequest::Pause { deployment_id, .. }
            | DeploymentRequest::Fail { deployment_id }
            | DeploymentRequest::AllocHealth { deployment_id, .. },
        ) => Need::NamespaceOf {
            capabilities: SUBMIT_JOB,
            subject: Subject::Deployment(deployment_id),
        },
        R::AllocStop { alloc_id } => Need::NamespaceOf {
            capabilities: &[cap::ALLOC_LIFECYCLE],
            subject: Subject::Alloc(alloc_id),
        },
        // No volume names no namespace: the right somewhere, rather than none at all.
        R::VolumeRegister { volumes } | R::VolumeCreate { volumes } if volumes.is_empty() => Need::SomeNamespace {
            capabilities: CSI_WRITE,
        },
        R::VolumeRegister { volumes } | R::VolumeCreate { volumes } => Need::Namespace {
            capabilities: CSI_WRITE,
            namespaces: volumes.iter().map(|volume| volume.namespace.as_str()).collect(),
        },
        R::VolumeDeregister { namespace: ns, .. }
        | R::VolumeDelete { namespace: ns, .. }
        | R::VolumeDetach { namespace: ns, .. }
        | R::SnapshotCreate { namespace: ns, .. } => namespace(CSI_WRITE, ns),
        R::SnapshotDelete { .. } => Need::SomeNamespace {
            capabilities: CSI_WRITE,
        },
        R::SnapshotList { .. } | R::VolumeListExternal { .. } => Need::SomeNamespace { capabilities: CSI_LIST },
        R::PluginDelete { .. } | R::AutopilotSetConfig { .. } | R::Operator(OperatorRequest::RemovePeer { .. }) => {
            Need::Operator
        }
        R::Operator(OperatorRequest::ForceLeave { .. }) => Need::Agent,
        // The servers' own writes, and what only an operator with every right may do.
        R::JobUpsert { .. }
        | R::AllocUpsert { .. }
        | R::AllocClientUpdate { .. }
        | R::AllocDelete { .. }
        | R::SystemGc
        | R::ReconcileSummaries => Need::Management,
        // Answered by `node_credential` above; listed so a new request must be given its rule.
        R::NodeRegister { .. }
        | R::NodeUpdateStatus { .. }
        | R::NodeUpdateCsiInfo { .. }
        | R::NodeUpdateDrivers { .. }
        | R::NodeEmitEvents { .. }
        | R::AllocClientUpdates { .. }
        | R::VolumeClaim { .. }
        | R::VolumeUnpublish { .. }
        | R::VariablesRead { .. } => Need::Management,
    }
}

/// What a direct write needs of the caller of the HTTP request it was made for.
pub fn need_command(command: &Command) -> Need<'_> {
    match command {
        Command::VariableUpsert { path, .. } => Need::Variables {
            paths: vec![path],
            capability: var_cap::WRITE,
        },
        Command::VariableDelete { path, .. } => Need::Variables {
            paths: vec![path],
            capability: var_cap::DESTROY,
        },
        // Nomad asks `write` of every lock operation.
        Command::VariableLock(command) => Need::Variables {
            paths: vec![command.path()],
            capability: var_cap::WRITE,
        },
        // The first bootstrap is anyone's, as at the HTTP API; the state machine refuses a
        // second. A reset names the index of the last one, which anyone could guess over RPC:
        // it is read from the leader's own data dir, so the leader's API makes it.
        Command::Acl(AclCommand::Bootstrap { reset_index: 0, .. }) => Need::Anyone,
        Command::Acl(AclCommand::Bootstrap { .. }) => {
            Need::Local("an ACL bootstrap reset is made by the leader's own API")
        }
        Command::Acl(AclCommand::OneTimeExchange { .. }) => Need::Anyone,
        Command::Acl(AclCommand::OneTimeUpsert { token }) => Need::OwnToken {
            accessor_id: &token.accessor_id,
        },
        // Policies, tokens (a login's too: the leader's API validates logins itself), roles,
        // auth methods and binding rules.
        Command::Acl(_) => Need::Management,
        // Made active by the server that handed the key to a quorum, for whoever's write
        // needed the first key.
        Command::RootKey(RootKeyCommand::Activate { .. }) => Need::Peer,
        Command::RootKey(RootKeyCommand::Delete { .. }) => Need::Management,
        // Not direct writes: refused before any check (`Command::check_direct_write`).
        _ => Need::Management,
    }
}

/// Whether the caller holding `secret` (resolved as `authority`) may have the leader apply
/// `command` for it: `Err` with Nomad's `Permission denied` (or the token's own failure).
pub fn check_command(
    command: &Command,
    authority: &Authority,
    secret: &str,
    state: &ServerState,
) -> Result<(), RpcError> {
    let need = need_command(command);
    match (&need, authority) {
        (_, Authority::Open) | (Need::Anyone | Need::Peer, _) => return Ok(()),
        (Need::Local(reason), _) => return Err(denied(format!("{PERMISSION_DENIED}: {reason}"))),
        (_, Authority::Unresolved(error)) => return Err(denied(error.to_string())),
        (_, Authority::Acl(_)) => {}
    }
    let Authority::Acl(acl) = authority else {
        unreachable!("the other authorities answered above")
    };
    let allowed = match need {
        Need::Management => acl.is_management(),
        Need::Variables { paths, capability } => variables_allowed(acl, &paths, capability),
        Need::OwnToken { accessor_id } => {
            !secret.is_empty()
                && state
                    .acl()
                    .token_by_secret(secret)
                    .is_some_and(|token| token.accessor_id == accessor_id)
        }
        _ => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(denied(PERMISSION_DENIED.to_string()))
    }
}

/// Whether the caller may make `request`: `Err` with Nomad's `Permission denied` (or the
/// token's own failure) when not. The stored node secret a node's call must match is checked
/// here under ACLs; with ACLs off, as before them, only a stored node's secret is compared
/// (by the endpoints' router).
pub fn check(request: &ServerRequest, authority: &Authority, state: &ServerState) -> Result<(), RpcError> {
    let need = need(request);
    // Nomad's own answer to a node's call with the wrong secret, whatever the token (a
    // service identity's derivation answers with its own text, at its endpoint).
    if let Some((node_id, secret_id)) = request.node_credential()
        && let Some(node) = state.node(node_id)
        && node.secret_id != secret_id
    {
        return Err(RpcError::invalid(node_secret_mismatch(request)));
    }
    let acl = match authority {
        Authority::Open => return Ok(()),
        Authority::Acl(acl) => acl,
        Authority::Unresolved(error) => {
            // A node's call carries no token: its secret is its credential.
            if !matches!(need, Need::NodeSecret { .. }) {
                return Err(denied(error.to_string()));
            }
            &Acl::default()
        }
    };
    let allowed = match need {
        Need::NodeSecret { node_id, secret_id } => match state.node(node_id) {
            Some(node) => !secret_id.is_empty() && node.secret_id == secret_id,
            // Only registering makes a node; nothing else may speak for one not stored.
            None => matches!(request, ServerRequest::NodeRegister { .. }),
        },
        Need::Management => acl.is_management(),
        Need::Node => acl.allows_node(true),
        Need::Agent => acl.allows_agent(true),
        Need::Operator => acl.allows_operator(true),
        Need::Namespace {
            capabilities,
            namespaces,
        } => namespaces
            .iter()
            .all(|namespace| acl.allows_namespace_any(namespace, capabilities)),
        Need::NamespaceOf { capabilities, subject } => {
            let namespace = match subject {
                Subject::Alloc(id) => state.alloc(id).map(|alloc| alloc.namespace.as_str()),
                Subject::Deployment(id) => state.deployment(id).map(|deployment| deployment.namespace.as_str()),
            };
            match namespace {
                Some(namespace) => acl.allows_namespace_any(namespace, capabilities),
                // Unknown: the endpoint answers not found to whoever could act somewhere.
                None => capabilities
                    .iter()
                    .any(|capability| acl.allows_some_namespace(capability)),
            }
        }
        Need::SomeNamespace { capabilities } => capabilities
            .iter()
            .any(|capability| acl.allows_some_namespace(capability)),
        Need::Variables { paths, capability } => variables_allowed(acl, &paths, capability),
        // A direct write's needs ([`need_command`]); no server request has them.
        Need::OwnToken { .. } | Need::Anyone | Need::Peer | Need::Local(_) => false,
    };
    if allowed {
        Ok(())
    } else {
        Err(denied(PERMISSION_DENIED.to_string()))
    }
}

/// Nomad's refusal of a node's call that carries another secret than the stored node's.
pub fn node_secret_mismatch(request: &ServerRequest) -> &'static str {
    if matches!(request, ServerRequest::NodeRegister { .. }) {
        "node secret ID does not match. Not registering node."
    } else {
        "node secret ID does not match"
    }
}

/// Every one of `paths`, and at least one: nothing is allowed for naming nothing.
fn variables_allowed(acl: &Acl, paths: &[&str], capability: &str) -> bool {
    !paths.is_empty() && paths.iter().all(|path| acl.allows_variable_somewhere(path, capability))
}

fn denied(message: String) -> RpcError {
    RpcError::new(ErrorKind::PermissionDenied, message, false)
}
