//! Issue 54 §1: every server request, tried as a client node would with no ACL token. A
//! node's certificate proves only that it is a node: what it does for its own node (with its
//! node secret) is served, everything else refused before any endpoint sees it.

use super::*;
use crate::acl::Acl;
use crate::fsm::csi::tests::{Fixture, claim, node};
use crate::rpc::authz::{Authority, check};
use crate::rpc::deployments::DeploymentRequest;
use crate::server::OperatorRequest;
use crate::structs::{ClaimMode, ClaimState};
use crate::structs::{CsiVolumeClaim, Job, Node};
use alloc::boxed::Box;

/// One of each request, as node `n1` (secret `s1`) would send it for itself where the request
/// speaks for a node, and for someone else's objects otherwise.
fn every_request() -> Vec<ServerRequest> {
    use ServerRequest as R;
    let own = |id: &str| (id.to_string(), "s1".to_string());
    let (node_id, secret_id) = own("n1");
    let claim: CsiVolumeClaim = claim("a1", &node_id, ClaimMode::Write, ClaimState::Taken);
    let job = || {
        Box::new(Job {
            id: "web".into(),
            namespace: "prod".into(),
            ..Job::default()
        })
    };
    vec![
        R::NodeRegister {
            node: Box::new(Node {
                secret_id: secret_id.clone(),
                ..node("n1", true)
            }),
        },
        R::NodeUpdateStatus {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            status: NodeStatus::Ready,
        },
        R::NodeUpdateCsiInfo {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            controllers: Default::default(),
            nodes: Default::default(),
        },
        R::NodeUpdateDrivers {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            drivers: Default::default(),
        },
        R::NodeEmitEvents {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            events: Vec::new(),
        },
        R::NodeDeregister { node_id: "n2".into() },
        R::NodeUpdateDrain {
            node_id: "n2".into(),
            strategy: None,
            mark_eligible: true,
        },
        R::NodeUpdateEligibility {
            node_id: "n2".into(),
            eligibility: Default::default(),
        },
        R::DeriveSiToken {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            alloc_id: "a1".into(),
            tasks: vec!["connect-proxy-web".into()],
        },
        R::JobUpsert { job: job() },
        R::JobDeregister {
            namespace: "prod".into(),
            job_id: "web".into(),
        },
        R::AllocUpsert { allocs: Vec::new() },
        R::AllocClientUpdate {
            alloc_id: "a1".into(),
            client_status: ClientStatus::Failed,
        },
        R::AllocClientUpdates {
            node_id: node_id.clone(),
            secret_id: secret_id.clone(),
            updates: Vec::new(),
        },
        R::AllocDelete {
            alloc_ids: vec!["a1".into()],
        },
        R::AllocStop { alloc_id: "a1".into() },
        R::VolumeRegister { volumes: Vec::new() },
        R::VolumeDeregister {
            namespace: "prod".into(),
            volume_ids: vec!["v".into()],
            force: true,
        },
        R::VolumeCreate { volumes: Vec::new() },
        R::VolumeDelete {
            namespace: "prod".into(),
            volume_id: "v".into(),
            secrets: Default::default(),
        },
        R::SnapshotCreate {
            namespace: "prod".into(),
            snapshots: Vec::new(),
        },
        R::SnapshotDelete { snapshots: Vec::new() },
        R::SnapshotList {
            plugin_id: "p".into(),
            page: ListPage::default(),
            secrets: Default::default(),
        },
        R::VolumeListExternal {
            plugin_id: "p".into(),
            page: ListPage::default(),
        },
        R::VolumeClaim {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim: claim.clone(),
            secret_id: secret_id.clone(),
        },
        R::VolumeUnpublish {
            namespace: "default".into(),
            volume_id: "v".into(),
            claim,
            secret_id: secret_id.clone(),
        },
        R::VolumeDetach {
            namespace: "prod".into(),
            volume_id: "v".into(),
            node_id: "n2".into(),
        },
        R::PluginDelete { plugin_id: "p".into() },
        R::JobRegister {
            job: job(),
            enforce_index: None,
        },
        R::NodeEvaluate { node_id: "n2".into() },
        R::JobDispatch(Box::new(JobDispatchRequest {
            namespace: "prod".into(),
            job_id: "batch".into(),
            ..JobDispatchRequest::default()
        })),
        R::PeriodicForce {
            namespace: "prod".into(),
            job_id: "cron".into(),
        },
        R::SystemGc,
        R::JobScale(Box::new(JobScaleRequest {
            namespace: "prod".into(),
            job_id: "web".into(),
            group: "g".into(),
            count: Some(0),
            ..JobScaleRequest::default()
        })),
        R::AutopilotSetConfig {
            config: Default::default(),
            cas: None,
        },
        R::Operator(OperatorRequest::RemovePeer { id: 2 }),
        R::Operator(OperatorRequest::ForceLeave {
            node: "s2.global".into(),
            prune: true,
        }),
        R::ReconcileSummaries,
        R::Deployment(DeploymentRequest::Promote {
            deployment_id: "d".into(),
            groups: Vec::new(),
        }),
        R::Deployment(DeploymentRequest::Pause {
            deployment_id: "d".into(),
            pause: true,
        }),
        R::Deployment(DeploymentRequest::Fail {
            deployment_id: "d".into(),
        }),
        R::Deployment(DeploymentRequest::AllocHealth {
            deployment_id: "d".into(),
            healthy: Vec::new(),
            unhealthy: Vec::new(),
        }),
        R::Deployment(DeploymentRequest::Revert {
            namespace: "prod".into(),
            job_id: "web".into(),
            version: 0,
            enforce_prior_version: None,
        }),
        R::Deployment(DeploymentRequest::Stable {
            namespace: "prod".into(),
            job_id: "web".into(),
            version: 0,
            stable: true,
        }),
        R::JobEvaluate {
            namespace: "prod".into(),
            job_id: "web".into(),
        },
        R::JobStop {
            namespace: "prod".into(),
            job_id: "web".into(),
            purge: true,
        },
        R::VariablesRead {
            paths: vec!["nomad/jobs/db".into()],
            node_id: node_id.clone(),
            secret_id,
        },
        R::VariablesRead {
            paths: vec!["nomad/jobs/db".into()],
            node_id: String::new(),
            secret_id: String::new(),
        },
    ]
}

/// Which variant `request` is: a new variant must be added here, and so to [`every_request`].
fn variant(request: &ServerRequest) -> &'static str {
    use ServerRequest as R;
    match request {
        R::NodeRegister { .. } => "NodeRegister",
        R::NodeUpdateStatus { .. } => "NodeUpdateStatus",
        R::NodeUpdateCsiInfo { .. } => "NodeUpdateCsiInfo",
        R::NodeUpdateDrivers { .. } => "NodeUpdateDrivers",
        R::NodeEmitEvents { .. } => "NodeEmitEvents",
        R::NodeDeregister { .. } => "NodeDeregister",
        R::NodeUpdateDrain { .. } => "NodeUpdateDrain",
        R::NodeUpdateEligibility { .. } => "NodeUpdateEligibility",
        R::DeriveSiToken { .. } => "DeriveSiToken",
        R::JobUpsert { .. } => "JobUpsert",
        R::JobDeregister { .. } => "JobDeregister",
        R::AllocUpsert { .. } => "AllocUpsert",
        R::AllocClientUpdate { .. } => "AllocClientUpdate",
        R::AllocClientUpdates { .. } => "AllocClientUpdates",
        R::AllocDelete { .. } => "AllocDelete",
        R::AllocStop { .. } => "AllocStop",
        R::VolumeRegister { .. } => "VolumeRegister",
        R::VolumeDeregister { .. } => "VolumeDeregister",
        R::VolumeCreate { .. } => "VolumeCreate",
        R::VolumeDelete { .. } => "VolumeDelete",
        R::SnapshotCreate { .. } => "SnapshotCreate",
        R::SnapshotDelete { .. } => "SnapshotDelete",
        R::SnapshotList { .. } => "SnapshotList",
        R::VolumeListExternal { .. } => "VolumeListExternal",
        R::VolumeClaim { .. } => "VolumeClaim",
        R::VolumeUnpublish { .. } => "VolumeUnpublish",
        R::VolumeDetach { .. } => "VolumeDetach",
        R::PluginDelete { .. } => "PluginDelete",
        R::JobRegister { .. } => "JobRegister",
        R::NodeEvaluate { .. } => "NodeEvaluate",
        R::JobDispatch(_) => "JobDispatch",
        R::PeriodicForce { .. } => "PeriodicForce",
        R::SystemGc => "SystemGc",
        R::JobScale(_) => "JobScale",
        R::AutopilotSetConfig { .. } => "AutopilotSetConfig",
        R::Operator(_) => "Operator",
        R::ReconcileSummaries => "ReconcileSummaries",
        R::Deployment(_) => "Deployment",
        R::JobEvaluate { .. } => "JobEvaluate",
        R::JobStop { .. } => "JobStop",
        R::VariablesRead { .. } => "VariablesRead",
    }
}

const VARIANTS: usize = 41;

fn stored_node() -> Fixture {
    let mut fx = Fixture::new();
    fx.ok(Command::NodeRegister {
        node: Node {
            secret_id: "s1".into(),
            ..node("n1", true)
        },
    });
    fx.ok(Command::NodeRegister {
        node: Node {
            secret_id: "s2".into(),
            ..node("n2", true)
        },
    });
    fx
}

/// The calls a node makes for itself, with its own secret.
fn a_nodes_own(request: &ServerRequest) -> bool {
    request.node_credential().is_some()
        && !matches!(request, ServerRequest::VariablesRead { node_id, .. } if node_id.is_empty())
        || matches!(request, ServerRequest::DeriveSiToken { .. })
}

#[test]
fn with_no_token_a_node_makes_only_its_own_calls() {
    let requests = every_request();
    let covered: alloc::collections::BTreeSet<&str> = requests.iter().map(variant).collect();
    assert_eq!(covered.len(), VARIANTS, "every variant tried: {covered:?}");
    let fx = stored_node();
    // No token: the anonymous policy, here granting nothing; and a token the servers do not know.
    let callers = [
        Authority::Acl(Acl::default()),
        Authority::Unresolved(crate::acl::ResolveError::NotFound),
    ];
    for authority in &callers {
        for request in &requests {
            let answer = check(request, authority, &fx.state);
            assert_eq!(
                answer.is_ok(),
                a_nodes_own(request),
                "{} as a node with {authority:?}: {answer:?}",
                variant(request)
            );
        }
    }
    // The same calls with another node's secret (a node speaking for its neighbour): refused.
    for request in requests.iter().filter(|request| a_nodes_own(request)) {
        let json = serde_json::to_string(request).unwrap().replace("\"s1\"", "\"s2\"");
        let borrowed: ServerRequest = serde_json::from_str(&json).unwrap();
        assert!(
            check(&borrowed, &callers[0], &fx.state).is_err(),
            "{} with n2's secret",
            variant(&borrowed)
        );
    }
}

#[test]
fn a_management_token_makes_every_call() {
    let fx = stored_node();
    for request in every_request() {
        let json = serde_json::to_string(&request).unwrap().replace("\"s1\"", "\"s2\"");
        let borrowed: ServerRequest = serde_json::from_str(&json).unwrap();
        let answer = check(&request, &Authority::Acl(Acl::management()), &fx.state);
        assert!(answer.is_ok(), "{}: {answer:?}", variant(&request));
        // A node's call is proved by its secret, management token or not.
        if a_nodes_own(&request) {
            assert!(
                check(&borrowed, &Authority::Acl(Acl::management()), &fx.state).is_err(),
                "{} with n2's secret",
                variant(&borrowed)
            );
        }
    }
}
