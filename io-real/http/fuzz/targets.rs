//! The fuzz targets: each reads one kind of outside input exactly as the agent does, then checks
//! what must hold of whatever it accepted (a job read back from the API registers again, a
//! state record re-encodes to the same state).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use drover_core::fsm::{Command, Entry, ServerState};
use drover_core::structs::{Allocation, Evaluation, Job, Node};
use drover_http::decode;
use drover_io_real::jobs::ApiJob;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::mutate::Case;

pub struct Target {
    pub name: &'static str,
    pub about: &'static str,
    /// What reads the input; a corpus file's name starts with its variant and `--`.
    pub variants: &'static [&'static str],
    /// Inputs made fresh by the encoders of this build, beside the corpus files.
    pub seeds: fn() -> Vec<Case>,
    /// Reads one input; panics (or allocates without bound) only on a bug.
    pub run: fn(usize, &[u8]),
}

pub static ALL: &[Target] = &[
    Target {
        name: "http_bodies",
        about: "the JSON body of every HTTP write endpoint, decoded and validated",
        variants: &[
            "job_register",
            "job_register_path",
            "volume_register",
            "variable_put",
            "alloc_restart",
            "alloc_signal",
            "node_drain",
            "node_eligibility",
        ],
        seeds: http_seeds,
        run: http_body,
    },
    Target {
        name: "jobspec_hcl",
        about: "HCL jobspecs (job run, job validate) into the API job and the core job",
        variants: &["job"],
        seeds: no_seeds,
        run: jobspec,
    },
    Target {
        name: "agent_config_hcl",
        about: "an agent config file over the defaults, then validated",
        variants: &["config"],
        seeds: no_seeds,
        run: agent_config,
    },
    Target {
        name: "rpc_envelope",
        about: "an agent RPC request (protobuf envelope, JSON payload) as an agent reads it",
        variants: &[
            "envelope",
            "server",
            "client_csi",
            "client_alloc",
            "client_logs",
            "client_fs",
            "client_exec",
            "client_stats",
            "node_allocs",
            "http",
            "raft_append",
            "raft_vote",
            "raft_snapshot",
            "raft_pre_vote",
            "raft_stand",
            "apply",
        ],
        seeds: rpc_seeds,
        run: rpc_request,
    },
    Target {
        name: "csi_replies",
        about: "replies of a hostile CSI plugin, read by the real client over a unix socket",
        variants: crate::csi_plugin::CALLS,
        seeds: csi_seeds,
        run: crate::csi_plugin::call,
    },
    Target {
        name: "state_codec",
        about: "the versioned state records: server snapshot state and every client record",
        variants: &[
            "server_state",
            "alloc_spec",
            "alloc_state",
            "task_state",
            "registry",
            "devices",
        ],
        seeds: state_seeds,
        run: state_record,
    },
    Target {
        name: "raft_records",
        about: "stored Raft log entries (then applied to a state) and snapshot bodies",
        variants: &["log_entry", "snapshot"],
        seeds: raft_seeds,
        run: raft_record,
    },
];

pub fn by_name(name: &str) -> Option<&'static Target> {
    ALL.iter().find(|target| target.name == name)
}

fn no_seeds() -> Vec<Case> {
    Vec::new()
}

fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

/// The jobs of the jobspec corpus, for the seeds of the other targets.
fn corpus_jobs() -> &'static [Job] {
    static JOBS: OnceLock<Vec<Job>> = OnceLock::new();
    JOBS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/jobspec_hcl");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files
            .iter()
            .filter_map(|file| std::fs::read_to_string(file).ok())
            .filter_map(|source| drover_io_real::jobspec::parse(&source).ok())
            .filter_map(|api| api.to_job().ok())
            .collect()
    })
}

fn api_body(job: &Job) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "Job": ApiJob::from_job(job, "pending") })).expect("JSON")
}

fn http_seeds() -> Vec<Case> {
    corpus_jobs()
        .iter()
        .map(|job| Case {
            variant: 0,
            bytes: api_body(job),
        })
        .collect()
}

fn http_body(variant: usize, bytes: &[u8]) {
    match variant {
        0 | 1 => {
            let path_id = (variant == 1).then_some("example");
            if let Ok(job) = decode::job_register(bytes, path_id) {
                // What a client reads back (GET /v1/job/:id) registers as the same job.
                let again = decode::job_register(&api_body(&job), None)
                    .unwrap_or_else(|error| panic!("a job read back from the API does not register again: {error:?}"));
                assert_eq!(again, job, "a job read back from the API registers as a different job");
                schedule(job);
            }
        }
        2 => drop(decode::volume_register("vol", bytes)),
        3 => {
            for operation in [None, Some("lock-acquire"), Some("lock-renew")] {
                drop(decode::variable_put("nomad/jobs/example", operation, bytes));
            }
        }
        4 => drop(decode::alloc_restart("a1".into(), bytes)),
        5 => drop(decode::alloc_signal("a1".into(), bytes)),
        6 => drop(decode::node_drain("n1".into(), bytes)),
        _ => drop(decode::node_eligibility("n1".into(), bytes)),
    }
}

/// A registered job is scheduled at once: applying it and planning its evaluation must not
/// take the server down, whatever the job asks for.
fn schedule(job: Job) {
    let eval = Evaluation {
        id: "fuzz-eval".into(),
        job_id: job.id.clone(),
        namespace: job.namespace.clone(),
        ..Evaluation::default()
    };
    let mut state = base_state().clone();
    state.apply(
        1000,
        &Entry {
            at_unix_ms: 1_700_000_000_000,
            command: Command::JobRegister {
                job,
                eval: Some(eval.clone()),
                enforce_index: None,
            },
        },
    );
    let mut next = 0u64;
    let _ = drover_core::scheduler::schedule(&state, &eval, &mut || {
        next += 1;
        format!("alloc-{next}")
    });
}

/// The known finding of `io-real/http/fuzz/known/` (README, Fuzzing): hcl-rs takes time exponential
/// in the number of lines like `path = "/srv/ {` (an open string, or an open brace, on each).
/// `hcl_check` now refuses open strings before hcl-rs; inputs with more than 16 lines holding an
/// odd count of quotes are still left out, so the smoke runs go on finding other things. The
/// open-brace shape (`known/agent_config_hcl/config--hang-43a87fe42ac37247`, balanced quotes) is
/// not filtered: CI's seed does not reach it from these corpora, exploratory runs can.
fn known_exponential_hcl(source: &str) -> bool {
    source.lines().filter(|line| line.matches('"').count() % 2 == 1).count() > 16
}

fn jobspec(_: usize, bytes: &[u8]) {
    let Some(source) = text(bytes) else { return };
    if known_exponential_hcl(source) {
        return;
    }
    let Ok(api) = drover_io_real::jobspec::parse(source) else {
        return;
    };
    let converted = api.to_job();
    // `job run` sends the parsed job as JSON: the server must decide as the CLI would.
    let body = serde_json::to_vec(&serde_json::json!({ "Job": api })).expect("JSON");
    let registered = decode::job_register(&body, None);
    assert_eq!(
        converted.is_ok(),
        registered.is_ok(),
        "the CLI and the HTTP API disagree on a parsed jobspec: {converted:?} / {registered:?}"
    );
}

fn agent_config(_: usize, bytes: &[u8]) {
    let Some(source) = text(bytes) else { return };
    if known_exponential_hcl(source) {
        return;
    }
    if let Ok((config, _notes)) = drover_host::agent_config::from_text(source) {
        let _ = config.validate();
    }
}

/// A state with the corpus jobs and a node, for records to apply to and to encode.
fn base_state() -> &'static ServerState {
    static STATE: OnceLock<ServerState> = OnceLock::new();
    STATE.get_or_init(|| {
        let mut state = ServerState::default();
        let mut index = 0;
        for command in base_commands() {
            index += 1;
            state.apply(
                index,
                &Entry {
                    at_unix_ms: 1_700_000_000_000,
                    command,
                },
            );
        }
        state
    })
}

fn base_commands() -> Vec<Command> {
    let node = Node {
        id: "n1".into(),
        name: "node-1".into(),
        datacenter: "dc1".into(),
        ..Node::default()
    };
    let mut commands = vec![
        Command::LeadershipEstablished {
            leader_id: 1,
            term: 1,
            cluster_id: "c1".into(),
        },
        Command::NodeRegister { node },
        Command::VariableUpsert {
            path: "nomad/jobs/example".into(),
            items: BTreeMap::from([("k".to_string(), "v".to_string())]).into(),
            cas: None,
            lock_id: None,
        },
    ];
    for job in corpus_jobs() {
        commands.push(Command::JobRegister {
            job: job.clone(),
            eval: Some(Evaluation {
                id: format!("eval-{}", job.id),
                job_id: job.id.clone(),
                namespace: job.namespace.clone(),
                ..Evaluation::default()
            }),
            enforce_index: None,
        });
    }
    commands
}

fn state_seeds() -> Vec<Case> {
    use drover_core::codec::encode;
    let mut seeds = vec![Case {
        variant: 0,
        bytes: encode(base_state()),
    }];
    for job in corpus_jobs() {
        let alloc = Allocation {
            id: "a1".into(),
            job_id: job.id.clone(),
            node_id: "n1".into(),
            ..Allocation::default()
        };
        seeds.push(Case {
            variant: 1,
            bytes: encode(&(alloc, job.clone())),
        });
    }
    seeds.push(Case {
        variant: 2,
        bytes: encode(&drover_core::client::alloc_runner::LocalAllocState::default()),
    });
    seeds.push(Case {
        variant: 3,
        bytes: encode(&drover_core::client::task_runner::LocalTaskState::default()),
    });
    seeds.push(Case {
        variant: 4,
        bytes: encode(&drover_core::client::registry::Registry::default()),
    });
    seeds.push(Case {
        variant: 5,
        bytes: encode(&drover_core::client::devices::DeviceReservations::default()),
    });
    seeds
}

/// A record that decodes re-encodes, and decodes again to the same value.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(value) = drover_core::codec::decode::<T>(bytes) {
        let again: T = drover_core::codec::decode(&drover_core::codec::encode(&value))
            .unwrap_or_else(|error| panic!("a decoded record does not decode once re-encoded: {error}"));
        assert_eq!(again, value, "a record re-encodes to a different value");
    }
}

fn state_record(variant: usize, bytes: &[u8]) {
    use drover_core::client;
    match variant {
        0 => {
            if let Ok(state) = ServerState::restore(bytes) {
                let again = ServerState::restore(&state.snapshot()).expect("a restored state restores again");
                assert_eq!(again, state, "a restored state snapshots to a different state");
            }
        }
        1 => round_trip::<(Allocation, Job)>(bytes),
        2 => round_trip::<client::alloc_runner::LocalAllocState>(bytes),
        3 => round_trip::<client::task_runner::LocalTaskState>(bytes),
        4 => round_trip::<client::registry::Registry>(bytes),
        _ => round_trip::<client::devices::DeviceReservations>(bytes),
    }
}

fn raft_seeds() -> Vec<Case> {
    use drover_io_real::raft::store::{encode_log_record, encode_snapshot_record};
    use openraft::{Entry as LogEntry, EntryPayload, LogId};
    let mut seeds: Vec<Case> = base_commands()
        .into_iter()
        .enumerate()
        .map(|(index, command)| {
            let entry = LogEntry::<drover_io_real::raft::TypeConfig> {
                log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index as u64 + 1),
                payload: EntryPayload::Normal(Entry {
                    at_unix_ms: 1_700_000_000_000,
                    command,
                }),
            };
            Case {
                variant: 0,
                bytes: encode_log_record(&entry),
            }
        })
        .collect();
    // The bare JSON every record was before the store was versioned.
    if let Some(first) = seeds.first()
        && let Ok(entry) = drover_io_real::raft::store::decode_log_record(&first.bytes)
    {
        seeds.push(Case {
            variant: 0,
            bytes: serde_json::to_vec(&entry).expect("JSON"),
        });
    }
    seeds.push(Case {
        variant: 1,
        bytes: encode_snapshot_record(base_state()),
    });
    seeds
}

fn raft_record(variant: usize, bytes: &[u8]) {
    use drover_io_real::raft::store::{decode_log_record, decode_snapshot_record};
    if variant == 1 {
        if let Ok(state) = decode_snapshot_record(bytes) {
            let _ = state.snapshot();
        }
        return;
    }
    let Ok(entry) = decode_log_record(bytes) else {
        return;
    };
    // Whatever the log holds is applied on every server, on every restart: it must not panic.
    if let openraft::EntryPayload::Normal(entry) = entry.payload {
        let mut state = base_state().clone();
        state.apply(100, &entry);
    }
}

/// A JSON payload in the envelope body of `variant` (1 and on), as another agent sends it.
fn envelope_of(variant: usize, json: Vec<u8>) -> drover_proto::agent::v1::AgentRequest {
    use drover_proto::agent::v1::agent_request::Body;
    use drover_proto::agent::v1::{ApplyRequest, JsonPayload, RaftPayload};
    let payload = JsonPayload { json: json.clone() };
    let raft = RaftPayload { json: json.clone() };
    let body = match variant {
        1 => Body::Server(payload),
        2 => Body::ClientCsi(payload),
        3 => Body::ClientAlloc(payload),
        4 => Body::ClientLogs(payload),
        5 => Body::ClientFs(payload),
        6 => Body::ClientExec(payload),
        7 => Body::ClientStats(payload),
        8 => Body::NodeAllocs(payload),
        9 => Body::Http(payload),
        10 => Body::RaftAppendEntries(raft),
        11 => Body::RaftVote(raft),
        12 => Body::RaftInstallSnapshot(raft),
        13 => Body::RaftPreVote(payload),
        14 => Body::RaftStand(payload),
        _ => Body::Apply(ApplyRequest { command_json: json }),
    };
    drover_io_real::service::envelope("global", body)
}

fn rpc_seeds() -> Vec<Case> {
    use drover_core::rpc::ServerRequest;
    use openraft::{CommittedLeaderId, LogId, Vote};
    use prost::Message;
    let mut payloads: Vec<(usize, Vec<u8>)> = Vec::new();
    for job in corpus_jobs() {
        payloads.push((
            1,
            json(&ServerRequest::JobRegister {
                job: Box::new(job.clone()),
                enforce_index: None,
            }),
        ));
    }
    if let Ok(request) = decode::node_drain("n1".into(), br#"{"DrainSpec":{"Deadline":1}}"#) {
        payloads.push((1, json(&request)));
    }
    payloads.push((
        3,
        json(&drover_core::client::AllocControl::Restart {
            alloc_id: "a1".into(),
            task: Some("web".into()),
        }),
    ));
    payloads.push((7, br#""a1""#.to_vec()));
    let vote =
        openraft::raft::VoteRequest::<u64>::new(Vote::new(2, 1), Some(LogId::new(CommittedLeaderId::new(1, 1), 3)));
    payloads.push((11, json(&vote)));
    let entries = raft_seeds()
        .into_iter()
        .filter(|case| case.variant == 0)
        .filter_map(|case| drover_io_real::raft::store::decode_log_record(&case.bytes).ok())
        .collect::<Vec<_>>();
    let append = openraft::raft::AppendEntriesRequest::<drover_io_real::raft::TypeConfig> {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        entries,
        leader_commit: Some(LogId::new(CommittedLeaderId::new(1, 1), 1)),
    };
    payloads.push((10, json(&append)));
    payloads.push((14, b"1".to_vec()));
    let upsert = Entry {
        at_unix_ms: 1,
        command: Command::VariableUpsert {
            path: "nomad/jobs/example".into(),
            items: BTreeMap::from([("k".to_string(), "v".to_string())]).into(),
            cas: None,
            lock_id: None,
        },
    };
    payloads.push((15, json(&upsert)));
    // Each payload twice: whole envelopes (variant 0), and the bare JSON of its body kind.
    let mut seeds: Vec<Case> = payloads
        .iter()
        .map(|(variant, json)| Case {
            variant: 0,
            bytes: envelope_of(*variant, json.clone()).encode_to_vec(),
        })
        .collect();
    seeds.extend(payloads.into_iter().map(|(variant, bytes)| Case { variant, bytes }));
    seeds
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("JSON")
}

fn rpc_request(variant: usize, bytes: &[u8]) {
    use prost::Message;
    let request = if variant == 0 {
        match drover_proto::agent::v1::AgentRequest::decode(bytes) {
            Ok(request) => request,
            Err(_) => return,
        }
    } else {
        envelope_of(variant, bytes.to_vec())
    };
    let _ = drover_io_real::service::parse_request(request, "global");
}

fn csi_seeds() -> Vec<Case> {
    crate::csi_plugin::seeds()
        .into_iter()
        .map(|(variant, bytes)| Case { variant, bytes })
        .collect()
}
