//! The `docker` driver's cost against a real Docker Engine, beside the Engine's own in the same
//! run. Prints figures; asserts nothing.
//!
//!   scripts/docker-engine.sh start target/docker-engine        # prints the endpoint
//!   DROVER_TEST_DOCKER_HOST=unix://... cargo bench -p drover --bench docker [-- ROUNDS [COUNT]]
//!
//! One `agent -dev` with the docker plugin on that Engine. ROUNDS (default 20) one-container
//! jobs, one after another: `PUT /v1/jobs` → its evaluation complete (the servers' part), → its
//! container running (the Engine says so), → the API shows the allocation running; then `job
//! stop` → the container gone. Then one job of COUNT (default 50) containers: placed → all
//! running, and the agent's RSS before and with them running. The baseline, measured in the
//! same run on the same Engine and image: create + start of one container (until the Engine
//! says running), stop + remove, and COUNT containers created and started at once. Every
//! container runs `sleep` under Docker's init (`init = true`), so a stop's SIGTERM ends it at
//! once in both.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, ListContainersOptions, RemoveContainerOptions};
use serde_json::{Value, json};
use support::{Agent, dev_spec, get_json, http, http_status, wait_for, wait_for_every};

const IMAGE: &str = "drover-busybox:local";
const LIMIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(1);
const LABEL: &str = "drover-bench";

/// `check` every millisecond until it holds, for at most [`LIMIT`].
fn poll<T>(check: impl FnMut() -> Option<T>) -> Option<T> {
    wait_for_every(LIMIT, POLL, check)
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn line(label: &str, samples: &mut [Duration], baseline: Option<Duration>) -> Duration {
    let median = p50(samples);
    let ratio = baseline.map_or(String::new(), |base| {
        format!(
            "  {:+.1} ms, {:.2}x the Engine's",
            ms(median) - ms(base),
            ms(median) / ms(base)
        )
    });
    println!(
        "  {label:<52} p50 {:>7.1} ms  max {:>7.1} ms  (n={}){ratio}",
        ms(median),
        ms(samples[samples.len() - 1]),
        samples.len()
    );
    median
}

/// The containers whose label `key` is `value`, with whether each runs.
async fn labelled(docker: &Docker, key: &str, value: &str) -> Vec<(String, bool)> {
    let filters = HashMap::from([("label".to_string(), vec![format!("{key}={value}")])]);
    docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|summary| {
            let running = summary.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING);
            (summary.id.unwrap_or_default(), running)
        })
        .collect()
}

async fn create_and_start(docker: &Docker, name: &str) -> String {
    let body = ContainerCreateBody {
        image: Some(IMAGE.into()),
        cmd: Some(vec!["sleep".into(), "3600".into()]),
        labels: Some(HashMap::from([(LABEL.to_string(), "baseline".to_string())])),
        host_config: Some(HostConfig {
            init: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(name.into()),
        platform: String::new(),
    };
    let id = docker.create_container(Some(options), body).await.expect("created").id;
    docker.start_container(&id, None).await.expect("started");
    id
}

async fn stop_and_remove(docker: &Docker, id: &str) {
    let stop = bollard::query_parameters::StopContainerOptions {
        t: Some(5),
        signal: None,
    };
    docker.stop_container(id, Some(stop)).await.expect("stopped");
    let remove = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    docker.remove_container(id, Some(remove)).await.expect("removed");
}

/// The Engine's own figures: `rounds` create+start and stop+remove, then `count` at once.
async fn baseline(docker: &Docker, rounds: usize, count: usize) -> (Duration, Duration, Duration) {
    let (mut started, mut gone) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let begun = Instant::now();
        let id = create_and_start(docker, &format!("drover-bench-{round}")).await;
        started.push(begun.elapsed());
        let begun = Instant::now();
        stop_and_remove(docker, &id).await;
        gone.push(begun.elapsed());
    }
    println!("the Engine alone (bollard over its socket, the same image and command):");
    let start = line("create + start -> running", &mut started, None);
    let stop = line("stop + remove -> gone", &mut gone, None);
    let begun = Instant::now();
    let mut starts = tokio::task::JoinSet::new();
    for n in 0..count {
        let docker = docker.clone();
        starts.spawn(async move { create_and_start(&docker, &format!("drover-bench-many-{n}")).await });
    }
    let ids = starts.join_all().await;
    let many = begun.elapsed();
    println!(
        "  {count} containers created and started at once{:>22} {:>7.1} ms",
        "",
        ms(many)
    );
    let mut stops = tokio::task::JoinSet::new();
    for id in ids {
        let docker = docker.clone();
        stops.spawn(async move { stop_and_remove(&docker, &id).await });
    }
    stops.join_all().await;
    (start, stop, many)
}

fn job(id: &str, count: usize) -> String {
    json!({"Job": {
        "ID": id,
        "TaskGroups": [{"Name": "g", "Count": count, "Tasks": [{
            "Name": "t",
            "Driver": "docker",
            "Config": {"image": IMAGE, "command": "sleep", "args": ["3600"], "init": true},
            "Resources": {"CPU": 20, "MemoryMB": 32},
            "KillTimeout": 5_000_000_000u64,
        }]}],
    }})
    .to_string()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let numbers: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .filter_map(|arg| arg.parse().ok())
        .collect();
    let rounds = numbers.first().copied().unwrap_or(20);
    let count = numbers.get(1).copied().unwrap_or(50);
    let endpoint = std::env::var("DROVER_TEST_DOCKER_HOST")
        .expect("DROVER_TEST_DOCKER_HOST: start an Engine with scripts/docker-engine.sh start target/docker-engine");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = endpoint.trim_start_matches("unix://").to_string();
    let docker = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION).expect("the Engine");
    let (engine_start, engine_stop, engine_many) = runtime.block_on(baseline(&docker, rounds, count));

    let root = tempfile::tempdir().unwrap();
    let (spec, mut args) = dev_spec(root.path(), "dev");
    std::fs::create_dir_all(&spec.data_dir).unwrap();
    let config = root.path().join("docker.hcl");
    std::fs::write(
        &config,
        format!("plugin \"docker\" {{\n  config {{\n    endpoint = \"{endpoint}\"\n  }}\n}}\n"),
    )
    .unwrap();
    args.push(format!("-config={}", config.display()));
    let port = spec.http;
    let agent = Agent::start(spec, args);
    wait_for(LIMIT, || {
        let nodes = get_json(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["docker"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the docker driver is healthy:\n{}", agent.log()));

    let (mut evaluated, mut container, mut running, mut gone) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let id = format!("one{round}");
        let submitted = Instant::now();
        let reply: Value =
            serde_json::from_str(&http("PUT", port, "/v1/jobs", Some(&job(&id, 1))).expect("registered"))
                .expect("a register answer");
        let eval_id = reply["EvalID"].as_str().expect("an evaluation").to_string();
        let (mut eval_done, mut container_up, mut alloc_running, mut alloc_id) = (None, None, None, None);
        poll(|| {
            if eval_done.is_none()
                && get_json(port, &format!("/v1/evaluation/{eval_id}")).is_some_and(|eval| eval["Status"] == "complete")
            {
                eval_done = Some(submitted.elapsed());
            }
            if alloc_id.is_none() {
                alloc_id = get_json(port, &format!("/v1/job/{id}/allocations"))
                    .and_then(|allocs| allocs[0]["ID"].as_str().map(String::from));
            }
            if let Some(alloc) = &alloc_id {
                if container_up.is_none()
                    && runtime
                        .block_on(labelled(&docker, "com.hashicorp.nomad.alloc_id", alloc))
                        .iter()
                        .any(|(_, up)| *up)
                {
                    container_up = Some(submitted.elapsed());
                }
                if alloc_running.is_none()
                    && get_json(port, &format!("/v1/allocation/{alloc}"))
                        .is_some_and(|a| a["ClientStatus"] == "running")
                {
                    alloc_running = Some(submitted.elapsed());
                }
            }
            (eval_done.is_some() && container_up.is_some() && alloc_running.is_some()).then_some(())
        })
        .unwrap_or_else(|| panic!("job {id} did not run:\n{}", agent.log()));
        evaluated.push(eval_done.unwrap());
        container.push(container_up.unwrap());
        running.push(alloc_running.unwrap());
        let alloc = alloc_id.unwrap();
        let stopped = Instant::now();
        match http_status("DELETE", port, &format!("/v1/job/{id}"), None) {
            Some((200, _)) => {}
            other => panic!("job {id} was not stopped: {other:?}"),
        }
        poll(|| {
            runtime
                .block_on(labelled(&docker, "com.hashicorp.nomad.alloc_id", &alloc))
                .is_empty()
                .then_some(())
        })
        .unwrap_or_else(|| panic!("the container of {alloc} stayed:\n{}", agent.log()));
        gone.push(stopped.elapsed());
    }
    println!("through Drover (`agent -dev`, docker driver; PUT /v1/jobs and DELETE /v1/job/:id):");
    let servers = line("register -> evaluation complete (servers)", &mut evaluated, None);
    let up = line("register -> container running", &mut container, Some(engine_start));
    line("register -> allocation running (API)", &mut running, Some(engine_start));
    line("stop -> container gone", &mut gone, Some(engine_stop));
    println!(
        "  driver overhead per task (container running - servers - the Engine's create+start): {:.1} ms",
        ms(up) - ms(servers) - ms(engine_start)
    );

    let pid = agent.pid().expect("the agent runs");
    let idle = rss_kib(pid);
    let placed = Instant::now();
    match http_status("PUT", port, "/v1/jobs", Some(&job("many", count))) {
        Some((200, _)) => {}
        other => panic!("the {count}-container job was not registered: {other:?}"),
    }
    poll(|| {
        let allocs = get_json(port, "/v1/job/many/allocations")?;
        let up = allocs
            .as_array()?
            .iter()
            .filter(|alloc| alloc["ClientStatus"] == "running")
            .count();
        (up == count).then_some(())
    })
    .unwrap_or_else(|| panic!("the {count} containers did not all run:\n{}", agent.log()));
    let all = placed.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let busy = rss_kib(pid);
    println!(
        "  {count} containers of one job: placed -> all running {:.1} ms ({:.2}x the Engine's {:.1} ms at once)",
        ms(all),
        ms(all) / ms(engine_many),
        ms(engine_many)
    );
    println!(
        "  agent RSS: {:.1} MiB idle after the rounds, {:.1} MiB with {count} containers running (+{:.1} KiB each)",
        idle as f64 / 1024.0,
        busy as f64 / 1024.0,
        busy.saturating_sub(idle) as f64 / count as f64
    );
    let _ = http_status("DELETE", port, "/v1/job/many", None);
    poll(|| {
        runtime
            .block_on(labelled(&docker, "com.hashicorp.nomad.task_name", "t"))
            .is_empty()
            .then_some(())
    });
}
