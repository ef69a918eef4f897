//! `GET /v1/event/stream`: Nomad's event stream, newline-delimited JSON. Each line is one
//! applied entry's events, `{"Index": N, "Events": [...]}`, or `{}` as a heartbeat after
//! 10 s without one. `?topic=Topic[:key]` (repeatable; `*` for every topic or key) picks
//! events by topic and by their key or filter keys (an allocation's job and deployment,
//! say); `?index=N` starts at the first kept entry at or after N (the buffer holds the last
//! [`drover_io_real::events::BUFFER_ENTRIES`] entries with events); `?namespace=` (default
//! `default`, `*` for every one) limits namespaced events. A subscription to a topic its token
//! may not read is refused (403, as Nomad's), and events it may not read are left out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use drover_core::acl::Acl;
use drover_core::acl::policy::cap;
use drover_core::fsm::ServerState;
use drover_core::fsm::events::{Event, Payload, Topic};
use serde_json::{Value, json};

use super::ApiError;
use drover_io_real::driver::AgentHandle;
use drover_io_real::events::Batch;
use drover_io_real::jobs::ApiJob;

/// Nomad sends a heartbeat when nothing else was sent for this long.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Which events a subscriber asked for.
struct Subscription {
    /// Topic name ("*": any) → keys ("*": any).
    topics: BTreeMap<String, BTreeSet<String>>,
    namespace: String,
    acl: Option<Acl>,
}

impl Subscription {
    fn parse(query: Option<&str>, acl: Option<Acl>) -> Result<(Subscription, u64), ApiError> {
        let mut topics: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut index = 0;
        let mut namespace = "default".to_string();
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*name {
                "topic" => {
                    let (topic, key) = value.split_once(':').unwrap_or((&value, "*"));
                    if topic.is_empty() || key.is_empty() {
                        return Err(ApiError(
                            StatusCode::BAD_REQUEST,
                            format!("Invalid topic query: {value:?}; expected Topic:key"),
                        ));
                    }
                    topics.entry(topic.to_string()).or_default().insert(key.to_string());
                }
                "index" => {
                    index = value
                        .parse()
                        .map_err(|error| ApiError(StatusCode::BAD_REQUEST, format!("Unable to parse index: {error}")))?
                }
                "namespace" => namespace = value.into_owned(),
                _ => {}
            }
        }
        if topics.is_empty() {
            topics.insert("*".into(), BTreeSet::from(["*".to_string()]));
        }
        if let Some(acl) = &acl
            && !topics.keys().all(|topic| may_subscribe(acl, topic, &namespace))
        {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                drover_core::acl::PERMISSION_DENIED.into(),
            ));
        }
        Ok((Subscription { topics, namespace, acl }, index))
    }

    fn wants(&self, event: &Event) -> bool {
        let topic = event.payload.topic();
        let (key, namespace) = event.payload.key();
        if !namespace.is_empty() && self.namespace != "*" && namespace != self.namespace {
            return false;
        }
        if !self.may_read(topic, namespace) {
            return false;
        }
        let filter_keys = filter_keys(&event.payload);
        [topic.as_str(), "*"]
            .iter()
            .filter_map(|name| self.topics.get(*name))
            .any(|keys| keys.contains("*") || keys.contains(key) || filter_keys.iter().any(|k| keys.contains(*k)))
    }

    fn may_read(&self, topic: Topic, namespace: &str) -> bool {
        let Some(acl) = &self.acl else { return true };
        match topic {
            Topic::Node => acl.allows_node(false),
            Topic::CsiPlugin => acl.allows_plugin(true),
            Topic::CsiVolume => acl.allows_namespace(namespace, cap::CSI_READ_VOLUME),
            Topic::Job | Topic::Allocation | Topic::Evaluation | Topic::Deployment => {
                acl.allows_namespace(namespace, cap::READ_JOB)
            }
        }
    }
}

/// Nomad's `aclCheckForEvents`: a subscription is refused outright (403) unless its token may
/// read every topic it names; a job's topics need `read-job` in the subscription's namespace
/// (in some namespace for `*`), nodes `node:read`, CSI volumes `csi-read-volume`, plugins
/// `plugin:read`, and `*` (every topic: what a subscription naming none asks for) a management
/// token. What is let through is still filtered event by event ([`Subscription::may_read`]).
fn may_subscribe(acl: &Acl, topic: &str, namespace: &str) -> bool {
    let in_namespace = |capability: &str| {
        if namespace == "*" {
            acl.allows_some_namespace(capability)
        } else {
            acl.allows_namespace(namespace, capability)
        }
    };
    match Topic::ALL.into_iter().find(|known| known.as_str() == topic) {
        Some(Topic::Job | Topic::Allocation | Topic::Evaluation | Topic::Deployment) => in_namespace(cap::READ_JOB),
        Some(Topic::Node) => acl.allows_node(false),
        Some(Topic::CsiVolume) => in_namespace(cap::CSI_READ_VOLUME),
        Some(Topic::CsiPlugin) => acl.allows_plugin(true),
        None => acl.is_management(),
    }
}

/// Nomad's `FilterKeys`: what else an event can be picked by.
fn filter_keys(payload: &Payload) -> Vec<&str> {
    let keys: Vec<&str> = match payload {
        Payload::Allocation(alloc) => vec![&alloc.job_id, &alloc.deployment_id],
        Payload::Evaluation(eval) => vec![&eval.job_id],
        Payload::Deployment(deployment) => vec![&deployment.job_id],
        _ => Vec::new(),
    };
    keys.into_iter().filter(|key| !key.is_empty()).collect()
}

/// The payload as Nomad's API renders the object, under Nomad's payload key.
fn payload_json(payload: &Payload, state: &ServerState) -> Value {
    match payload {
        Payload::Job(job) => {
            let status = state.job_summary(&job.namespace, &job.id).status(job);
            json!({"Job": serde_json::to_value(ApiJob::from_job(job, status)).expect("a job serializes")})
        }
        Payload::Allocation(alloc) => json!({"Allocation": super::render::alloc_without_job(alloc, state)}),
        Payload::Evaluation(eval) => json!({"Evaluation": super::jobs::eval(eval)}),
        Payload::Deployment(deployment) => json!({"Deployment": super::render::deployment(deployment)}),
        Payload::Node(node) => json!({"Node": super::render::node(node)}),
        Payload::CsiVolume(volume) => json!({"Volume": super::render::volume(volume, state)}),
        Payload::CsiPlugin(plugin) => json!({"Plugin": super::render::plugin(plugin, state)}),
    }
}

/// One batch's line, with the events `subscription` wants (`None`: none).
fn line(batch: &Batch, subscription: &Subscription, state: &ServerState) -> Option<String> {
    let events: Vec<Value> = batch
        .events
        .iter()
        .filter(|event| subscription.wants(event))
        .map(|event| {
            let (key, namespace) = event.payload.key();
            json!({
                "Topic": event.payload.topic().as_str(),
                "Type": event.kind,
                "Key": key,
                "Namespace": namespace,
                "FilterKeys": filter_keys(&event.payload),
                "Index": batch.index,
                "Payload": payload_json(&event.payload, state),
            })
        })
        .collect();
    if events.is_empty() {
        return None;
    }
    Some(format!("{}\n", json!({"Index": batch.index, "Events": events})))
}

struct Follower {
    handle: AgentHandle,
    broker: Arc<drover_io_real::events::EventBroker>,
    newest: tokio::sync::watch::Receiver<u64>,
    subscription: Subscription,
    next_index: u64,
    ready: VecDeque<String>,
}

impl Follower {
    /// The next line to send: the wanted events of kept entries not sent yet, else a
    /// heartbeat once nothing was kept for [`HEARTBEAT`]; `None` once the agent stopped.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(line) = self.ready.pop_front() {
                return Some(line);
            }
            self.newest.borrow_and_update();
            let batches = self.broker.since(self.next_index);
            if let Some(last) = batches.last() {
                self.next_index = last.index + 1;
                let state = self.handle.state_version();
                if let Some(state) = state {
                    for batch in &batches {
                        if let Some(line) = line(batch, &self.subscription, &state.state) {
                            self.ready.push_back(line);
                        }
                    }
                }
                continue;
            }
            match tokio::time::timeout(HEARTBEAT, self.newest.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return None,
                Err(_) => return Some("{}\n".to_string()),
            }
        }
    }
}

pub async fn stream(
    State(handle): State<AgentHandle>,
    RawQuery(query): RawQuery,
    acl: Option<Extension<Acl>>,
) -> Result<Response, ApiError> {
    let Some(broker) = handle.events() else {
        return Err(ApiError(
            StatusCode::NOT_IMPLEMENTED,
            "the event stream is served by servers: ask a server's HTTP API".into(),
        ));
    };
    let (subscription, index) = Subscription::parse(query.as_deref(), acl.map(|Extension(acl)| acl))?;
    let follower = Follower {
        handle,
        newest: broker.subscribe(),
        broker,
        subscription,
        next_index: index,
        ready: VecDeque::new(),
    };
    let body = futures::stream::unfold(follower, |mut follower| async move {
        let line = follower.next().await?;
        Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(line)), follower))
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], Body::from_stream(body)).into_response())
}
