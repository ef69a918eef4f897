//! `Node.DeriveSIToken` and the revocation of service identity tokens.

use super::*;
use crate::connect::{ConsulConnect, ConsulSidecarService, mutate};
use crate::structs::{Job, JobType, NetworkResource, Port, Service, Task, TaskGroup, TaskResources};

/// Job "app", group "web" (the fixture allocations' group) with `services` Connect sidecars.
fn connect_job(services: usize) -> Job {
    let mut job = Job {
        id: "app".into(),
        name: "app".into(),
        namespace: "default".into(),
        job_type: JobType::Service,
        priority: 50,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "web".into(),
            count: 1,
            tasks: vec![Task {
                name: "main".into(),
                driver: "exec".into(),
                resources: TaskResources {
                    cpu: 100,
                    memory_mb: 64,
                    ..TaskResources::default()
                },
                ..Task::default()
            }],
            networks: vec![NetworkResource {
                mode: "host".into(),
                dynamic_ports: vec![Port {
                    label: "http".into(),
                    ..Port::default()
                }],
                ..NetworkResource::default()
            }],
            services: (0..services)
                .map(|n| Service {
                    name: format!("svc{n}"),
                    port_label: "http".into(),
                    address_mode: "auto".into(),
                    connect: Some(ConsulConnect {
                        sidecar_service: Some(ConsulSidecarService::default()),
                        ..ConsulConnect::default()
                    }),
                    ..Service::default()
                })
                .collect(),
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    mutate(&mut job).unwrap();
    job
}

fn harness(services: usize) -> Harness {
    let mut h = Harness::new();
    h.fx.ok(Command::LeadershipEstablished {
        leader_id: 1,
        term: 1,
        cluster_id: "c1d".into(),
    });
    let mut n1 = h.fx.state.node("n1").unwrap().clone();
    n1.secret_id = "n1-secret".into();
    h.fx.ok(Command::NodeRegister { node: n1 });
    h.fx.ok(Command::JobUpsert {
        job: connect_job(services),
    });
    h
}

fn derive(alloc: &str, tasks: &[&str]) -> ServerRequest {
    ServerRequest::DeriveSiToken {
        node_id: "n1".into(),
        secret_id: "n1-secret".into(),
        alloc_id: alloc.into(),
        tasks: tasks.iter().map(|task| task.to_string()).collect(),
    }
}

fn created(n: usize) -> Result<ConsulAclReply, ConsulAclError> {
    Ok(ConsulAclReply::Created {
        accessor_id: format!("acc-{n}"),
        secret_id: format!("secret-{n}"),
    })
}

fn consul_down() -> Result<ConsulAclReply, ConsulAclError> {
    Err(ConsulAclError {
        message: "HTTP 503".into(),
        retryable: true,
        not_found: false,
    })
}

impl Harness {
    /// Answers the oldest Consul call.
    fn consul_answer(&mut self, result: Result<ConsulAclReply, ConsulAclError>) -> ConsulAclCall {
        let (op, call) = self.consul.remove(0);
        self.machine
            .handle(self.now, Input::ConsulReplied { op, result }, &self.fx.state);
        self.pump();
        call
    }

    fn accessors(&self) -> Vec<(String, String, bool)> {
        self.fx
            .state
            .si_accessors()
            .map(|a| (a.accessor_id.clone(), a.task_name.clone(), a.orphaned))
            .collect()
    }
}

#[test]
fn tokens_are_created_in_consul_committed_and_only_then_handed_out() {
    let mut h = harness(1);
    h.request(1, derive("a1", &["connect-proxy-svc0"]));
    assert!(h.replies.is_empty(), "nothing before Consul answers");
    assert_eq!(
        h.consul,
        [(
            h.consul[0].0,
            ConsulAclCall::CreateToken {
                description: "_nomad_si [c1d] [a1] [connect-proxy-svc0]".into(),
                service_name: "svc0".into(),
            }
        )]
    );
    h.consul_answer(created(0));
    let accessor = h.fx.state.si_accessors().next().expect("committed").clone();
    assert_eq!(
        (
            accessor.node_id.as_str(),
            accessor.alloc_id.as_str(),
            accessor.accessor_id.as_str()
        ),
        ("n1", "a1", "acc-0")
    );
    assert!(!accessor.orphaned);
    let Some((1, ServerReply::SiTokens { index, tokens })) = h.replies.last().cloned() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(index, accessor.create_index, "the reply comes after the commit");
    assert_eq!(tokens["connect-proxy-svc0"], "secret-0");
}

#[test]
fn requests_are_checked_with_nomads_texts_and_none_reach_consul() {
    let mut h = harness(1);
    let mut stopped = alloc("a3", "n1");
    stopped.client_status = ClientStatus::Complete;
    let mut other_group = alloc("a4", "n1");
    other_group.task_group = "nope".into();
    h.fx.ok(Command::AllocUpsert {
        allocs: vec![stopped, other_group],
    });
    let mut plain = connect_job(0);
    plain.id = "plain".into();
    h.fx.ok(Command::JobUpsert { job: plain });
    let mut plain_alloc = alloc("a5", "n1");
    plain_alloc.job_id = "plain".into();
    h.fx.ok(Command::AllocUpsert {
        allocs: vec![plain_alloc],
    });
    let mut wrong_secret = derive("a1", &["connect-proxy-svc0"]);
    if let ServerRequest::DeriveSiToken { secret_id, .. } = &mut wrong_secret {
        *secret_id = "guess".into();
    }
    let mut unknown_node = derive("a1", &["connect-proxy-svc0"]);
    if let ServerRequest::DeriveSiToken { node_id, .. } = &mut unknown_node {
        *node_id = "n9".into();
    }
    let cases = [
        (unknown_node, "Node \"n9\" does not exist"),
        (wrong_secret, "SecretID mismatch"),
        (
            derive("zz", &["connect-proxy-svc0"]),
            "Allocation \"zz\" does not exist",
        ),
        (
            derive("a2", &["connect-proxy-svc0"]),
            "Allocation \"a2\" not running on node \"n1\"",
        ),
        (
            derive("a3", &["connect-proxy-svc0"]),
            "Cannot request SI token for terminal allocation",
        ),
        (
            derive("a4", &["connect-proxy-svc0"]),
            "Allocation \"a4\" does not contain TaskGroup \"nope\"",
        ),
        (derive("a5", &["main"]), "TaskGroup \"web\" does not use Connect"),
        (
            derive("a1", &["main", "connect-proxy-svc0", "ghost"]),
            "Requested Consul Service Identity tokens for tasks that are not Connect enabled: main, ghost",
        ),
        (derive("a1", &[]), "no tasks specified"),
    ];
    for (position, (request, expected)) in cases.into_iter().enumerate() {
        h.request(position as u64, request);
        let Some((_, ServerReply::Error(error))) = h.replies.last() else {
            panic!("{:?}", h.replies)
        };
        assert_eq!((error.message.as_str(), error.retryable), (expected, false));
    }
    assert!(h.consul.is_empty());
    assert!(h.fx.state.si_accessors().next().is_none());
}

#[test]
fn a_partial_failure_revokes_every_token_already_created() {
    let mut h = harness(2);
    h.request(1, derive("a1", &["connect-proxy-svc0", "connect-proxy-svc1"]));
    assert_eq!(h.consul.len(), 2, "both in parallel");
    h.consul_answer(created(0));
    h.consul_answer(consul_down());
    let Some((1, ServerReply::Error(error))) = h.replies.last() else {
        panic!("{:?}", h.replies)
    };
    assert!(error.retryable, "Consul answered 5xx: the client may retry");
    assert!(
        error.message.contains("connect-proxy-svc1") && error.message.contains("HTTP 503"),
        "{error:?}"
    );
    // The token that was made is committed as an orphan, and revoked.
    assert_eq!(h.accessors(), [("acc-0".into(), "connect-proxy-svc0".into(), true)]);
    assert_eq!(
        h.consul_answer(Ok(ConsulAclReply::Revoked)),
        ConsulAclCall::RevokeToken {
            accessor_id: "acc-0".into()
        }
    );
    assert!(h.accessors().is_empty(), "deleted once revoked");
}

#[test]
fn at_most_sixteen_calls_of_a_request_are_in_flight() {
    let mut h = harness(20);
    let tasks: Vec<String> = (0..20).map(|n| format!("connect-proxy-svc{n}")).collect();
    let names: Vec<&str> = tasks.iter().map(String::as_str).collect();
    h.request(1, derive("a1", &names));
    assert_eq!(h.consul.len(), MAX_PARALLEL_PER_DERIVE);
    for n in 0..20 {
        h.consul_answer(created(n));
        assert!(h.consul.len() <= MAX_PARALLEL_PER_DERIVE);
    }
    let Some((1, ServerReply::SiTokens { tokens, .. })) = h.replies.last() else {
        panic!("{:?}", h.replies)
    };
    assert_eq!(tokens.len(), 20);
    assert_eq!(h.accessors().len(), 20);
}

#[test]
fn a_hung_consul_fails_the_request_at_the_deadline_as_retryable() {
    let mut h = harness(1);
    h.request(1, derive("a1", &["connect-proxy-svc0"]));
    h.advance(CONSUL_ACL_TIMEOUT - Duration::from_millis(1));
    assert!(h.replies.is_empty());
    h.advance(Duration::from_millis(1));
    assert!(
        h.log.iter().any(|line| line.starts_with("cancel consul")),
        "{:?}",
        h.log
    );
    let Some((1, ServerReply::Error(error))) = h.replies.last() else {
        panic!("{:?}", h.replies)
    };
    assert!(error.retryable && error.message.contains("did not answer"), "{error:?}");
    // A late answer to the abandoned call changes nothing.
    h.consul_answer(created(0));
    assert!(h.accessors().is_empty());
}

#[test]
fn a_finished_allocations_tokens_are_revoked_with_a_backoff_until_consul_takes_it() {
    let mut h = harness(1);
    h.request(1, derive("a1", &["connect-proxy-svc0"]));
    h.consul_answer(created(0));
    assert!(h.consul.is_empty(), "a running allocation keeps its token");
    h.fx.ok(Command::AllocClientUpdate {
        alloc_id: "a1".into(),
        client_status: ClientStatus::Complete,
    });
    h.advance(Duration::ZERO);
    h.consul_answer(consul_down());
    assert!(h.consul.is_empty(), "retried later, not at once");
    h.advance(Duration::from_millis(999));
    assert!(h.consul.is_empty());
    h.advance(Duration::from_millis(1));
    h.consul_answer(consul_down());
    h.advance(Duration::from_secs(1));
    assert!(h.consul.is_empty(), "the backoff doubled");
    h.advance(Duration::from_secs(1));
    // Consul no longer knows the token: as good as revoked.
    h.consul_answer(Err(ConsulAclError {
        message: "HTTP 404".into(),
        retryable: false,
        not_found: true,
    }));
    assert!(h.accessors().is_empty());
}

#[test]
fn revocation_resumes_under_a_new_leader_and_a_lost_leadership_fails_derivations() {
    let mut h = harness(2);
    h.request(1, derive("a1", &["connect-proxy-svc0"]));
    h.consul_answer(created(0));
    h.fx.ok(Command::AllocDelete {
        alloc_ids: vec!["a1".into()],
    });
    h.request(2, derive("a2", &["connect-proxy-svc1"]));
    // a2 is on n2: refused. A derivation for a new alloc on n1 stays in flight...
    let mut a6 = alloc("a6", "n1");
    a6.job_id = "app".into();
    h.fx.ok(Command::AllocUpsert { allocs: vec![a6] });
    h.consul.clear();
    h.request(3, derive("a6", &["connect-proxy-svc1"]));
    assert_eq!(h.consul.len(), 1);
    // ...when leadership is lost: it fails as retryable, its call is abandoned.
    h.machine
        .handle(h.now, Input::Leadership { leader: false }, &h.fx.state);
    h.pump();
    let Some((3, ServerReply::Error(error))) = h.replies.last() else {
        panic!("{:?}", h.replies)
    };
    assert!(error.retryable);
    assert!(h.log.iter().any(|line| line.starts_with("cancel consul")));
    // A new leader finds the gone allocation's accessor in the state and revokes it.
    h.consul.clear();
    h.machine.handle(h.now, Input::Leadership { leader: true }, &h.fx.state);
    h.pump();
    assert_eq!(
        h.consul_answer(Ok(ConsulAclReply::Revoked)),
        ConsulAclCall::RevokeToken {
            accessor_id: "acc-0".into()
        }
    );
    assert!(h.accessors().is_empty());
}

/// A token created for a derivation whose leader was lost before its accessor was committed
/// is unknown to the state: the sweep lists Consul's tokens every minute and revokes it once
/// two listings in a row found it unknown. Tokens of other clusters and known ones stay.
#[test]
fn tokens_the_state_never_learned_of_are_swept() {
    let mut h = harness(1);
    h.request(1, derive("a1", &["connect-proxy-svc0"]));
    h.consul_answer(created(0));
    assert_eq!(h.accessors().len(), 1);
    let listing = |extra: &[(&str, &str)]| {
        let mut tokens = vec![ConsulToken {
            accessor_id: "acc-0".into(),
            description: "_nomad_si [c1d] [a1] [connect-proxy-svc0]".into(),
        }];
        tokens.extend(extra.iter().map(|(accessor, description)| ConsulToken {
            accessor_id: accessor.to_string(),
            description: description.to_string(),
        }));
        Ok(ConsulAclReply::Tokens(tokens))
    };
    let strays = [
        ("lost", "_nomad_si [c1d] [a1] [connect-proxy-svc0]"),
        ("elsewhere", "_nomad_si [other] [a9] [connect-proxy-svc0]"),
    ];
    assert!(h.consul.is_empty());
    h.advance(SWEEP_INTERVAL);
    assert_eq!(h.consul_answer(listing(&strays)), ConsulAclCall::ListTokens);
    assert!(h.consul.is_empty(), "a first sighting revokes nothing");
    h.advance(SWEEP_INTERVAL);
    assert_eq!(h.consul_answer(listing(&strays)), ConsulAclCall::ListTokens);
    assert_eq!(
        h.consul_answer(Ok(ConsulAclReply::Revoked)),
        ConsulAclCall::RevokeToken {
            accessor_id: "lost".into()
        }
    );
    assert!(h.consul.is_empty());
    assert_eq!(h.accessors().len(), 1, "the known token stays");
}
