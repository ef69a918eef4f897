//! Task log streaming throughput with real agents on loopback: a server-only agent and a
//! client-only agent, a batch task that writes MB megabytes to stdout in 1 MB files. Prints
//! figures; asserts nothing.
//!
//!   cargo bench -p drover --bench logs [-- MB]
//!
//! Measured in the same run, each ROUNDS times (median shown):
//! - baseline: reading the rotated files straight from disk;
//! - `/v1/client/fs/logs?plain=true` from the client's own agent, and through the server
//!   (each read relayed down the stream the client keeps attached to it), raw and in Nomad's
//!   framed JSON;
//! - follow mode through the server: a follower started before the task writes, timed from
//!   the task's go to the last byte, beside the task's own writing time.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Agent, client_spec, cluster_specs, server_args, wait_for};

const ROUNDS: usize = 5;
const LIMIT: Duration = Duration::from_secs(120);

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn jobspec(id: &str, go: &std::path::Path, done: &std::path::Path, megabytes: u64) -> String {
    // 100-byte lines.
    let lines = megabytes * 1024 * 1024 / 100;
    format!(
        r#"job "{id}" {{
  type = "batch"
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "while [ ! -f {go} ]; do sleep 0.01; done; awk 'BEGIN {{ for (i = 0; i < {lines}; i++) printf \"%099d\\n\", i }}'; touch {done}"]
      }}
      logs {{
        max_files     = {files}
        max_file_size = 1
      }}
    }}
  }}
}}
"#,
        go = go.display(),
        done = done.display(),
        files = megabytes + 5
    )
}

/// Bytes of a GET and how long it took.
fn fetch(port: u16, path: &str) -> (u64, Duration) {
    let start = Instant::now();
    let response = ureq::get(&format!("http://127.0.0.1:{port}{path}"))
        .call()
        .unwrap_or_else(|error| panic!("{path}: {error}"));
    let mut reader = response.into_reader();
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let read = reader.read(&mut buffer).unwrap();
        if read == 0 {
            break;
        }
        total += read as u64;
    }
    (total, start.elapsed())
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[samples.len() / 2]
}

fn report(label: &str, mb_per_s: Vec<f64>, baseline: Option<f64>) -> f64 {
    let value = median(mb_per_s);
    let ratio = baseline.map_or(String::new(), |base| format!("  = {:.2}x baseline", value / base));
    println!("{label:<58} {value:>9.1} MB/s{ratio}");
    value
}

fn main() {
    let megabytes: u64 = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(50);
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let server = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    let (spec, args) = client_spec(root.path(), "c1", specs[0].rpc);
    let http = spec.http;
    let client = Agent::start(spec.clone(), args);
    wait_for(LIMIT, || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}\n{}", server.log(), client.log()));
    let address = format!("http://127.0.0.1:{port}");
    let run = |id: &str| {
        let go = root.path().join(format!("{id}.go"));
        let done = root.path().join(format!("{id}.done"));
        let file = root.path().join(format!("{id}.hcl"));
        std::fs::write(&file, jobspec(id, &go, &done, megabytes)).unwrap();
        let output = std::process::Command::new(support::AGENT)
            .args(["job", "run", "-detach", file.to_str().unwrap()])
            .env("NOMAD_ADDR", &address)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let alloc = wait_for(LIMIT, || {
            let allocs = get(port, &format!("/v1/job/{id}/allocations"))?;
            let alloc = &allocs[0];
            (alloc["TaskStates"]["t"]["State"] == "running").then(|| alloc["ID"].as_str().unwrap().to_string())
        })
        .expect("the task runs");
        (alloc, go, done)
    };

    // A finished log: every reader reads the same bytes.
    let (alloc, go, done) = run("written");
    std::fs::write(&go, "").unwrap();
    wait_for(LIMIT, || done.exists().then_some(())).expect("the task writes its log");
    let logs = spec.data_dir.join("alloc").join(&alloc).join("alloc/logs");
    let path = |plain: bool| format!("/v1/client/fs/logs/{alloc}?task=t&type=stdout&plain={plain}");
    let (mut direct, mut local, mut relayed, mut framed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut size = 0u64;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let mut files: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                Some((name.strip_prefix("t.stdout.")?.parse().ok()?, entry.path()))
            })
            .collect();
        files.sort();
        size = files
            .iter()
            .map(|(_, path)| std::fs::read(path).unwrap().len() as u64)
            .sum();
        let mb = size as f64 / (1024.0 * 1024.0);
        direct.push(mb / start.elapsed().as_secs_f64());
        let (bytes, took) = fetch(http, &path(true));
        assert_eq!(bytes, size);
        local.push(mb / took.as_secs_f64());
        let (bytes, took) = fetch(port, &path(true));
        assert_eq!(bytes, size);
        relayed.push(mb / took.as_secs_f64());
        let (_, took) = fetch(port, &path(false));
        framed.push(mb / took.as_secs_f64());
    }
    println!(
        "{:.1} MB of task stdout in 1 MB files, {ROUNDS} rounds, medians",
        size as f64 / (1024.0 * 1024.0)
    );
    let base = report("baseline: the files read from disk", direct, None);
    report("plain, from the client's own agent", local, Some(base));
    report("plain, through the server (relayed to the client)", relayed, Some(base));
    report("framed JSON, through the server", framed, Some(base));

    // Following through the server while the task writes.
    let mut follow = Vec::new();
    let mut writing = Vec::new();
    for round in 0..ROUNDS {
        let (alloc, go, done) = run(&format!("followed{round}"));
        let path = format!("/v1/client/fs/logs/{alloc}?task=t&type=stdout&plain=true&follow=true");
        let reader = std::thread::spawn(move || fetch(port, &path));
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        std::fs::write(&go, "").unwrap();
        wait_for(LIMIT, || done.exists().then_some(())).expect("the task writes its log");
        let wrote = start.elapsed();
        let (bytes, _) = reader.join().unwrap();
        let took = start.elapsed();
        assert_eq!(bytes, size, "the follower got every byte");
        let mb = bytes as f64 / (1024.0 * 1024.0);
        writing.push(mb / wrote.as_secs_f64());
        follow.push(mb / took.as_secs_f64());
    }
    let task = report("the task writing its log (follow baseline)", writing, None);
    report("follow=true through the server, go -> last byte", follow, Some(task));
}
