//! The one route table: every endpoint's path, its handlers by method, and the ACL rule its
//! caller's token must satisfy ([`Rule`]). The router and the ACL gate are both built from it,
//! so a route cannot exist without a rule; a path no route matches needs a management token.
//! `tests/golden/routes.txt` lists every route's need by method, so a change to who may call
//! what shows in review (`UPDATE_GOLDEN=1 cargo test -p drover-http --lib routes` rewrites it).

use axum::Router;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, put};
use drover_core::acl::policy::{cap, var_cap};

use crate::acl::gate::Need::{Agent, Management, Node, Nothing, Operator, Plugin, Token};
use crate::acl::gate::{Need, query_param};
use crate::acl::{endpoints as acl_tokens, login, oidc, roles};
use crate::*;
use drover_io_real::driver::AgentHandle;

/// What a route's caller must hold.
#[derive(Clone, Debug)]
pub enum Rule {
    /// The same whatever the method.
    Always(Need),
    /// Reads (GET, HEAD) one, every other method the other.
    ReadWrite { read: Need, write: Need },
    /// Worked out from the request: its method, the route's parameters and the query.
    By(fn(&Method, &matchit::Params<'_, '_>, Option<&str>) -> Need),
}

impl Rule {
    fn need(&self, method: &Method, params: &matchit::Params<'_, '_>, query: Option<&str>) -> Need {
        match self {
            Rule::Always(need) => need.clone(),
            Rule::ReadWrite { read, write } => {
                if *method == Method::GET || *method == Method::HEAD {
                    read.clone()
                } else {
                    write.clone()
                }
            }
            Rule::By(rule) => rule(method, params, query),
        }
    }
}

/// Every route's rule, found by path as the router finds its handler.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    by_path: matchit::Router<Rule>,
    paths: Vec<&'static str>,
}

impl Rules {
    /// What a request for `method path?query` needs: its route's rule, or a management token
    /// when no route matches (an endpoint added without a rule is closed, not open).
    pub fn need(&self, method: &Method, path: &str, query: Option<&str>) -> Need {
        match self.by_path.at(path) {
            Ok(found) => found.value.need(method, &found.params, query),
            Err(_) => Need::Management,
        }
    }

    /// The route patterns, in the order they were added.
    #[cfg(test)]
    pub fn paths(&self) -> &[&'static str] {
        &self.paths
    }
}

/// The router and the rules, built together.
struct Table {
    router: Router<AgentHandle>,
    rules: Rules,
}

impl Table {
    fn route(mut self, path: &'static str, methods: MethodRouter<AgentHandle>, rule: Rule) -> Self {
        self.rules
            .by_path
            .insert(path, rule)
            .unwrap_or_else(|error| panic!("route {path}: {error}"));
        self.rules.paths.push(path);
        self.router = self.router.route(path, methods);
        self
    }
}

fn always(need: Need) -> Rule {
    Rule::Always(need)
}

fn read_write(read: Need, write: Need) -> Rule {
    Rule::ReadWrite { read, write }
}

/// A namespace capability for reads, another for writes.
fn namespace(read: &'static str, write: &'static str) -> Rule {
    read_write(Need::Namespace(read), Need::Namespace(write))
}

fn in_namespace(capability: &'static str) -> Rule {
    always(Need::Namespace(capability))
}

/// Reads need any valid token (the endpoint shows only what it may); writes, management.
fn token_reads() -> Rule {
    read_write(Need::Token, Need::Management)
}

const CSI_VOLUME_LISTING: &[&str] = &[
    cap::CSI_LIST_VOLUME,
    cap::CSI_READ_VOLUME,
    cap::CSI_MOUNT_VOLUME,
    cap::LIST_JOBS,
];

/// `GET /v1/vars?prefix=`: listing under the prefix.
fn variables_listed(_: &Method, _: &matchit::Params<'_, '_>, query: Option<&str>) -> Need {
    Need::Variable {
        path: query_param(query, "prefix").unwrap_or_default(),
        capability: var_cap::LIST,
    }
}

/// `/v1/var/:path`: read, write or destroy that path.
fn variable(method: &Method, params: &matchit::Params<'_, '_>, _: Option<&str>) -> Need {
    Need::Variable {
        path: params.get("path").unwrap_or_default().to_string(),
        capability: match *method {
            Method::GET | Method::HEAD => var_cap::READ,
            Method::DELETE => var_cap::DESTROY,
            _ => var_cap::WRITE,
        },
    }
}

/// PUT and POST both write (Nomad's API takes either).
fn put_post<H, T>(handler: H) -> MethodRouter<AgentHandle>
where
    H: axum::handler::Handler<T, AgentHandle> + Clone,
    T: 'static,
{
    put(handler.clone()).post(handler)
}

/// The rules alone (for tests).
#[cfg(test)]
pub fn rules() -> Rules {
    table().rules
}

/// The router (without its layers) and its rules.
pub fn router_and_rules() -> (Router<AgentHandle>, Rules) {
    let Table { router, rules } = table();
    (router, rules)
}

/// Every route, family by family.
fn table() -> Table {
    let table = Table {
        router: Router::new(),
        rules: Rules::default(),
    };
    acl(allocations(jobs(csi(variables_and_namespaces(cluster(table))))))
}

/// Status, the agent, operator and system endpoints.
fn cluster(table: Table) -> Table {
    table
        // Status and cluster.
        .route("/v1/status/leader", get(status_leader), always(Nothing))
        .route("/v1/status/peers", get(status_peers), always(Nothing))
        .route("/v1/regions", get(cluster::regions), always(Nothing))
        // Any token: the stream, the metrics and the searches leave out what it may not read
        // (Nomad serves metrics without a token; here anonymous callers get them too).
        .route("/v1/event/stream", get(events::stream), always(Token))
        .route("/v1/metrics", get(metrics::get), always(Token))
        .route("/v1/search", put_post(search::prefix_search), always(Token))
        .route("/v1/search/fuzzy", put_post(fuzzy::fuzzy_search), always(Token))
        // The agent.
        .route(
            "/v1/agent/servers",
            get(cluster::agent_servers)
                .put(cluster::set_agent_servers)
                .post(cluster::set_agent_servers),
            read_write(Agent { write: false }, Agent { write: true }),
        )
        .route(
            "/v1/agent/join",
            put_post(operator::join),
            always(Agent { write: true }),
        )
        .route(
            "/v1/agent/force-leave",
            put_post(operator::force_leave),
            always(Agent { write: true }),
        )
        .route("/v1/agent/members", get(agent_members), always(Node { write: false }))
        .route("/v1/agent/self", get(agent_self), always(Agent { write: false }))
        .route(
            "/v1/agent/monitor",
            get(monitor::monitor),
            always(Agent { write: false }),
        )
        .route(
            "/v1/agent/keyring/list",
            get(keyring::list),
            read_write(Agent { write: false }, Agent { write: true }),
        )
        .route(
            "/v1/agent/keyring/{op}",
            put_post(keyring::change),
            read_write(Agent { write: false }, Agent { write: true }),
        )
        // Operator.
        .route(
            "/v1/operator/raft/configuration",
            get(cluster::raft_configuration),
            always(Operator { write: false }),
        )
        .route(
            "/v1/operator/raft/peer",
            delete(operator::remove_peer),
            always(Operator { write: true }),
        )
        .route(
            "/v1/operator/autopilot/configuration",
            get(operator::get_config).put(operator::set_config),
            read_write(Operator { write: false }, Operator { write: true }),
        )
        .route(
            "/v1/operator/autopilot/health",
            get(operator::health),
            read_write(Operator { write: false }, Operator { write: true }),
        )
        .route("/v1/operator/keyring/keys", get(rootkeys::list), always(Management))
        .route(
            "/v1/operator/keyring/rotate",
            put_post(rootkeys::rotate),
            always(Management),
        )
        .route(
            "/v1/operator/keyring/key/{key_id}",
            delete(rootkeys::remove),
            always(Management),
        )
        .route("/v1/system/gc", put_post(system::gc), always(Management))
        .route(
            "/v1/system/reconcile/summaries",
            put_post(system::reconcile_summaries),
            always(Management),
        )
}

/// Variables and namespaces.
fn variables_and_namespaces(table: Table) -> Table {
    table
        // Variables and namespaces.
        .route("/v1/vars", get(variables::list), Rule::By(variables_listed))
        .route(
            "/v1/var/{*path}",
            get(variables::get)
                .put(variables::put)
                .post(variables::put)
                .delete(variables::delete),
            Rule::By(variable),
        )
        // Any token: the endpoints show the namespaces it may do anything in.
        .route("/v1/namespaces", get(namespaces::list), always(Token))
        .route("/v1/namespace", put_post(namespaces::write), always(Management))
        .route(
            "/v1/namespace/{name}",
            get(namespaces::read)
                .put(namespaces::write)
                .post(namespaces::write)
                .delete(namespaces::delete),
            token_reads(),
        )
}

/// CSI volumes, snapshots and plugins.
fn csi(table: Table) -> Table {
    table
        // CSI. Snapshots and unregistered volumes are the plugin's; the namespace is the caller's.
        .route(
            "/v1/volumes",
            get(csi::list_volumes),
            always(Need::NamespaceAny(CSI_VOLUME_LISTING)),
        )
        .route(
            "/v1/volumes/snapshot",
            get(csi_snapshots::list_snapshots)
                .put(csi_snapshots::create_snapshots)
                .post(csi_snapshots::create_snapshots)
                .delete(csi_snapshots::delete_snapshot),
            read_write(
                Need::NamespaceAny(CSI_VOLUME_LISTING),
                Need::Namespace(cap::CSI_WRITE_VOLUME),
            ),
        )
        .route(
            "/v1/volumes/external",
            get(csi_snapshots::list_external),
            always(Need::NamespaceAny(CSI_VOLUME_LISTING)),
        )
        .route(
            "/v1/volume/csi/{id}",
            get(csi::get_volume)
                .put(csi::put_volume)
                .post(csi::put_volume)
                .delete(csi::delete_volume),
            namespace(cap::CSI_READ_VOLUME, cap::CSI_WRITE_VOLUME),
        )
        .route(
            "/v1/volume/csi/{id}/detach",
            delete(csi::detach_volume),
            namespace(cap::CSI_READ_VOLUME, cap::CSI_WRITE_VOLUME),
        )
        .route(
            "/v1/volume/csi/{id}/create",
            put_post(csi::create_volume),
            namespace(cap::CSI_READ_VOLUME, cap::CSI_WRITE_VOLUME),
        )
        .route(
            "/v1/volume/csi/{id}/delete",
            delete(csi::delete_created_volume),
            namespace(cap::CSI_READ_VOLUME, cap::CSI_WRITE_VOLUME),
        )
        .route("/v1/plugins", get(csi::list_plugins), always(Plugin { read: false }))
        .route(
            "/v1/plugin/csi/{id}",
            get(csi::get_plugin).delete(csi::delete_plugin),
            read_write(Plugin { read: true }, Operator { write: true }),
        )
}

/// Jobs, their scaling, deployments and evaluations.
fn jobs(table: Table) -> Table {
    table
        // Jobs.
        .route(
            "/v1/jobs/parse",
            put_post(job_parse::parse_job),
            always(Need::NamespaceAny(&[cap::PARSE_JOB, cap::SUBMIT_JOB])),
        )
        .route(
            "/v1/validate/job",
            put_post(job_parse::validate_job),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/jobs",
            get(jobs::list_jobs).put(jobs::register_jobs).post(jobs::register_jobs),
            namespace(cap::LIST_JOBS, cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}",
            get(jobs::get_job)
                .put(jobs::register_job)
                .post(jobs::register_job)
                .delete(jobs::deregister_job),
            namespace(cap::READ_JOB, cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}/allocations",
            get(jobs::job_allocations),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/summary",
            get(jobs::job_summary),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/evaluations",
            get(jobs::job_evaluations),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/versions",
            get(jobs::job_versions),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/deployments",
            get(deployments::of_job),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/deployment",
            get(deployments::latest_of_job),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/job/{id}/scale",
            get(scaling::status).put(scaling::scale).post(scaling::scale),
            read_write(
                Need::NamespaceAny(&[cap::READ_JOB_SCALING, cap::READ_JOB]),
                Need::NamespaceAny(&[cap::SCALE_JOB, cap::SUBMIT_JOB]),
            ),
        )
        .route(
            "/v1/job/{id}/plan",
            put_post(job_plan::plan),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}/dispatch",
            put_post(dispatch::dispatch),
            in_namespace(cap::DISPATCH_JOB),
        )
        .route(
            "/v1/job/{id}/periodic/force",
            put_post(periodic::force),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}/revert",
            put_post(deployments::revert),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}/stable",
            put_post(deployments::stable),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/job/{id}/evaluate",
            put_post(evaluate::evaluate_job),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/scaling/policies",
            get(scaling::list),
            always(Need::NamespaceAny(&[cap::LIST_SCALING_POLICIES, cap::LIST_JOBS])),
        )
        .route(
            "/v1/scaling/policy/{id}",
            get(scaling::get),
            always(Need::NamespaceAny(&[cap::READ_SCALING_POLICY, cap::READ_JOB])),
        )
        // Deployments and evaluations.
        .route("/v1/deployments", get(deployments::list), in_namespace(cap::READ_JOB))
        .route(
            "/v1/deployment/{id}",
            get(deployments::get),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/deployment/allocations/{id}",
            get(deployments::allocations),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/deployment/fail/{id}",
            put_post(deployments::fail),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/deployment/pause/{id}",
            put_post(deployments::pause),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/deployment/promote/{id}",
            put_post(deployments::promote),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/deployment/allocation-health/{id}",
            put_post(deployments::allocation_health),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/evaluations",
            get(jobs::list_evaluations),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/evaluation/{id}",
            get(jobs::get_evaluation),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/evaluation/{id}/allocations",
            get(evaluate::evaluation_allocations),
            in_namespace(cap::READ_JOB),
        )
}

/// Allocations, what a client answers about them, and nodes.
fn allocations(table: Table) -> Table {
    table
        // Allocations and what a client answers about them.
        .route(
            "/v1/allocations",
            get(allocs::list_allocations),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/allocation/{id}",
            get(allocs::get_allocation),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/allocation/{id}/stop",
            put_post(allocs::stop_allocation),
            in_namespace(cap::ALLOC_LIFECYCLE),
        )
        .route(
            "/v1/client/fs/logs/{alloc}",
            get(fs::logs),
            in_namespace(cap::READ_LOGS),
        )
        .route("/v1/client/fs/ls/{alloc}", get(fs::ls), in_namespace(cap::READ_FS))
        .route("/v1/client/fs/stat/{alloc}", get(fs::stat), in_namespace(cap::READ_FS))
        .route("/v1/client/fs/cat/{alloc}", get(fs::cat), in_namespace(cap::READ_FS))
        .route(
            "/v1/client/fs/readat/{alloc}",
            get(fs::readat),
            in_namespace(cap::READ_FS),
        )
        .route(
            "/v1/client/fs/stream/{alloc}",
            get(fs::stream_file),
            in_namespace(cap::READ_FS),
        )
        .route(
            "/v1/client/allocation/{id}/stats",
            get(client::alloc_stats),
            in_namespace(cap::READ_JOB),
        )
        .route(
            "/v1/client/allocation/{id}/gc",
            get(client::alloc_gc).put(client::alloc_gc),
            in_namespace(cap::SUBMIT_JOB),
        )
        .route(
            "/v1/client/allocation/{id}/exec",
            get(exec::exec),
            in_namespace(cap::ALLOC_EXEC),
        )
        .route(
            "/v1/client/allocation/{id}/restart",
            put_post(allocs::restart_allocation),
            in_namespace(cap::ALLOC_LIFECYCLE),
        )
        .route(
            "/v1/client/allocation/{id}/signal",
            put_post(allocs::signal_allocation),
            in_namespace(cap::ALLOC_LIFECYCLE),
        )
        .route(
            "/v1/client/stats",
            get(client::host_stats),
            always(Node { write: false }),
        )
        .route(
            "/v1/client/gc",
            get(client::node_gc).put(client::node_gc),
            always(Node { write: true }),
        )
        // Nodes.
        .route(
            "/v1/nodes",
            get(csi::list_nodes),
            read_write(Node { write: false }, Node { write: true }),
        )
        .route(
            "/v1/node/{id}",
            get(csi::get_node),
            read_write(Node { write: false }, Node { write: true }),
        )
        .route(
            "/v1/node/{id}/allocations",
            get(allocs::node_allocations),
            read_write(Node { write: false }, Node { write: true }),
        )
        .route(
            "/v1/node/{id}/drain",
            put_post(nodes::drain),
            always(Node { write: true }),
        )
        .route(
            "/v1/node/{id}/eligibility",
            put_post(nodes::eligibility),
            always(Node { write: true }),
        )
        .route(
            "/v1/node/{id}/evaluate",
            put_post(evaluate::evaluate_node),
            always(Node { write: true }),
        )
}

/// The ACL endpoints.
fn acl(table: Table) -> Table {
    table
        // ACLs. Bootstrapping and logging in are how a token is got; the auth methods are listed
        // for the login screen; the one-time exchange's credential is its one-time secret.
        .route("/v1/acl/bootstrap", put_post(acl_tokens::bootstrap), always(Nothing))
        .route("/v1/acl/policies", get(acl_tokens::list_policies), token_reads())
        .route(
            "/v1/acl/policy/{name}",
            get(acl_tokens::get_policy)
                .put(acl_tokens::put_policy)
                .post(acl_tokens::put_policy)
                .delete(acl_tokens::delete_policy),
            token_reads(),
        )
        .route("/v1/acl/tokens", get(acl_tokens::list_tokens), always(Management))
        .route("/v1/acl/token", put_post(acl_tokens::create_token), always(Management))
        .route("/v1/acl/token/self", get(acl_tokens::token_self), always(Token))
        // A token reads itself by accessor (the endpoint checks which).
        .route(
            "/v1/acl/token/{accessor}",
            get(acl_tokens::get_token)
                .put(acl_tokens::update_token)
                .post(acl_tokens::update_token)
                .delete(acl_tokens::delete_token),
            token_reads(),
        )
        .route("/v1/acl/token/onetime", put_post(roles::one_time), always(Token))
        .route(
            "/v1/acl/token/onetime/exchange",
            put_post(roles::exchange),
            always(Nothing),
        )
        // Roles a token links are readable with it (the endpoint filters the rest).
        .route("/v1/acl/roles", get(roles::list_roles), token_reads())
        .route("/v1/acl/role", put_post(roles::create_role), always(Management))
        .route(
            "/v1/acl/role/{id}",
            get(roles::get_role)
                .put(roles::update_role)
                .post(roles::update_role)
                .delete(roles::delete_role),
            token_reads(),
        )
        .route("/v1/acl/role/name/{name}", get(roles::get_role_by_name), token_reads())
        .route(
            "/v1/acl/auth-methods",
            get(login::list_methods),
            read_write(Nothing, Management),
        )
        .route(
            "/v1/acl/auth-method",
            put_post(login::create_method),
            always(Management),
        )
        .route(
            "/v1/acl/auth-method/{name}",
            get(login::get_method)
                .put(login::update_method)
                .post(login::update_method)
                .delete(login::delete_method),
            always(Management),
        )
        .route("/v1/acl/binding-rules", get(login::list_rules), always(Management))
        .route("/v1/acl/binding-rule", put_post(login::create_rule), always(Management))
        .route(
            "/v1/acl/binding-rule/{id}",
            get(login::get_rule)
                .put(login::update_rule)
                .post(login::update_rule)
                .delete(login::delete_rule),
            always(Management),
        )
        .route("/v1/acl/login", put_post(login::login), always(Nothing))
        .route("/v1/acl/oidc/auth-url", put_post(oidc::auth_url), always(Nothing))
        .route(
            "/v1/acl/oidc/complete-auth",
            put_post(oidc::complete_auth),
            always(Nothing),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route's need for a read, a write and a delete, one line each: reviewed as a
    /// file, so a change to who may call what is seen.
    fn rendered(rules: &Rules) -> String {
        let mut out = String::new();
        for pattern in rules.paths() {
            let path = pattern.replace("{*path}", "a/b").replace('{', "").replace('}', "1");
            for method in [Method::GET, Method::PUT, Method::DELETE] {
                let need = rules.need(&method, &path, Some("prefix=p"));
                out += &format!("{method} {pattern} {need:?}\n");
            }
        }
        out
    }

    #[test]
    fn every_routes_need_is_the_reviewed_one() {
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/routes.txt");
        let now = rendered(&rules());
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&golden, &now).unwrap();
        }
        let reviewed = std::fs::read_to_string(&golden).unwrap();
        assert!(
            now == reviewed,
            "the routes' ACL needs changed; review and rewrite with UPDATE_GOLDEN=1:\n{now}"
        );
    }

    /// The rules and the router come from one table: every route the router serves has a rule
    /// (a path no route matches needs a management token).
    #[test]
    fn a_path_no_route_matches_needs_a_management_token() {
        let rules = rules();
        assert!(rules.paths().len() > 100, "{}", rules.paths().len());
        for method in [Method::GET, Method::PUT] {
            assert_eq!(rules.need(&method, "/v1/nothing/here", None), Need::Management);
            assert_eq!(
                rules.need(&method, "/v1/job/web/unknown/deeper", None),
                Need::Management
            );
        }
    }
}
