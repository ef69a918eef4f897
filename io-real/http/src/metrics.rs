//! `GET /v1/metrics` (Nomad's JSON; `?format=prometheus` for Prometheus' text) and the
//! middleware that times every HTTP request (`nomad.http.<METHOD>.<route>`).
//!
//! Besides what the agent counts as it runs (RPCs, Raft roles, state machine applies, HTTP
//! requests: `drover_io_real::metrics`), a server reports gauges read from its state when asked: jobs
//! by status, allocations by job, group and client status (Nomad's `job_summary`), pending
//! and blocked evaluations, nodes by status, CSI volumes, claims and plugin health, and its
//! Raft indexes.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Extension;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use drover_core::acl::Acl;
use drover_core::acl::policy::cap;
use drover_core::fsm::ServerState;

use drover_io_real::driver::AgentHandle;
use drover_io_real::metrics::{Labels, Reading, nomad_json, prometheus_text};

/// Middleware: each request's time, by method and route (its template, not the raw path, so
/// IDs do not make a series each).
pub async fn measure(State(handle): State<AgentHandle>, request: Request, next: Next) -> Response {
    let name = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| format!("nomad.http.{}.{}", request.method(), path.as_str()));
    let started = tokio::time::Instant::now();
    let response = next.run(request).await;
    if let Some(name) = name {
        handle.metrics().0.sample(&name, &[], started.elapsed());
    }
    response
}

fn gauge(out: &mut Vec<(String, Labels, Reading)>, name: &str, labels: &[(&str, &str)], value: f64) {
    let labels = labels
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    out.push((name.to_string(), labels, Reading::Gauge(value)));
}

/// Gauges read from the state store.
fn state_gauges(state: &ServerState, out: &mut Vec<(String, Labels, Reading)>) {
    let mut by_status: BTreeMap<&str, u64> = [("pending", 0), ("running", 0), ("dead", 0)].into();
    for job in state.jobs() {
        let summary = state.job_summary(&job.namespace, &job.id);
        *by_status.entry(summary.status(job)).or_default() += 1;
        for (group, counts) in &summary.groups {
            let labels = [
                ("job", job.id.as_str()),
                ("task_group", group.as_str()),
                ("namespace", job.namespace.as_str()),
            ];
            for (what, count) in [
                ("starting", counts.starting),
                ("running", counts.running),
                ("complete", counts.complete),
                ("failed", counts.failed),
                ("lost", counts.lost),
            ] {
                gauge(
                    out,
                    &format!("nomad.nomad.job_summary.{what}"),
                    &labels,
                    f64::from(count),
                );
            }
        }
    }
    for (status, count) in by_status {
        gauge(out, &format!("nomad.nomad.job_status.{status}"), &[], count as f64);
    }
    gauge(
        out,
        "nomad.nomad.broker.total_pending",
        &[],
        state.pending_evals().count() as f64,
    );
    gauge(
        out,
        "nomad.nomad.blocked_evals.total_blocked",
        &[],
        state.blocked_evals().count() as f64,
    );
    let mut nodes: BTreeMap<String, u64> = BTreeMap::new();
    for node in state.nodes() {
        *nodes.entry(node.status.as_str().to_string()).or_default() += 1;
    }
    for (status, count) in nodes {
        gauge(out, "nomad.nomad.nodes", &[("status", &status)], count as f64);
    }
    let mut volumes: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for (namespace, id) in state.volume_keys() {
        if let Some(volume) = state.volume_raw(namespace, id) {
            let entry = volumes.entry(volume.plugin_id.clone()).or_default();
            entry.0 += 1;
            entry.1 += volume.read_claims.len() as u64;
            entry.2 += volume.write_claims.len() as u64;
        }
    }
    for (plugin, (count, reads, writes)) in volumes {
        gauge(out, "nomad.nomad.csi.volumes", &[("plugin_id", &plugin)], count as f64);
        let labels = [("plugin_id", plugin.as_str()), ("mode", "read")];
        gauge(out, "nomad.nomad.csi.volume_claims", &labels, reads as f64);
        let labels = [("plugin_id", plugin.as_str()), ("mode", "write")];
        gauge(out, "nomad.nomad.csi.volume_claims", &labels, writes as f64);
    }
    for plugin in state.plugins() {
        let labels = [("plugin_id", plugin.id.as_str())];
        let counts = [
            ("controllers_healthy", plugin.controllers_healthy),
            ("controllers_expected", plugin.controllers_expected()),
            ("nodes_healthy", plugin.nodes_healthy),
            ("nodes_expected", plugin.nodes_expected()),
        ];
        for (what, count) in counts {
            gauge(
                out,
                &format!("nomad.nomad.csi.plugin.{what}"),
                &labels,
                f64::from(count),
            );
        }
    }
}

/// Every reading of this agent, sorted by name and labels.
fn readings(handle: &AgentHandle) -> (Vec<(String, Labels, Reading)>, Duration) {
    let (metrics, uptime) = handle.metrics();
    let mut out = metrics.readings();
    gauge(&mut out, "nomad.uptime", &[], uptime.as_secs_f64());
    for (name, labels, value) in handle.client_gauges() {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(key, value)| (*key, value.as_str())).collect();
        gauge(&mut out, name, &labels, value);
    }
    let mut leads = false;
    if let Some(raft) = handle.status().raft {
        gauge(&mut out, "nomad.raft.term", &[], raft.term as f64);
        gauge(&mut out, "nomad.raft.peers", &[], raft.peers.len() as f64);
        leads = raft.leader.as_ref().is_some_and(|(id, _)| *id == handle.node_id());
        gauge(&mut out, "nomad.raft.leader", &[], if leads { 1.0 } else { 0.0 });
        for (name, index) in [
            ("nomad.raft.lastIndex", raft.last_log_index),
            ("nomad.raft.commitIndex", raft.commit_index),
            ("nomad.raft.appliedIndex", raft.last_applied),
        ] {
            gauge(&mut out, name, &[], index.unwrap_or(0) as f64);
        }
    }
    if let Some(state) = handle.state_version() {
        state_gauges(&state.state, &mut out);
        if leads {
            // The leader holds a heartbeat timer for every node that is not down.
            let active = state
                .state
                .nodes()
                .filter(|node| node.status != drover_core::structs::NodeStatus::Down)
                .count();
            gauge(&mut out, "nomad.nomad.heartbeat.active", &[], active as f64);
        }
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    (out, uptime)
}

/// Whether `acl` may see a series with these labels: one naming a namespace needs `read-job`
/// in it.
fn may_see(acl: &Acl, labels: &Labels) -> bool {
    labels
        .iter()
        .filter(|(name, _)| name == "namespace")
        .all(|(_, namespace)| acl.allows_namespace(namespace, cap::READ_JOB))
}

/// `GET /v1/metrics[?format=prometheus]`: this agent's metrics (not handed to a server by a
/// client-only agent: each agent has its own, as in Nomad).
/// With ACLs on, a series labelled with a namespace (a job's, a group's, an allocation's) is
/// shown only to a token that may read jobs there: job names are not for anonymous callers.
pub async fn get(
    State(handle): State<AgentHandle>,
    acl: Option<Extension<Acl>>,
    RawQuery(query): RawQuery,
) -> Response {
    let prometheus = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .any(|(name, value)| name == "format" && value == "prometheus");
    let (mut readings, uptime) = readings(&handle);
    if let Some(Extension(acl)) = acl {
        readings.retain(|(_, labels, _)| may_see(&acl, labels));
    }
    if prometheus {
        let content_type = "text/plain; version=0.0.4; charset=utf-8";
        return ([(header::CONTENT_TYPE, content_type)], prometheus_text(&readings)).into_response();
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    axum::Json(nomad_json(&readings, &super::rfc3339(now), uptime)).into_response()
}
