//! The CSI claim script of the turmoil lane, as an operator runs it against the real HTTP API:
//! a CSI plugin system job, a volume registered on it, a job that mounts the volume (the
//! claim: controller and node publish through the servers and the client), the job stopped
//! (the release walk), the volume deregistered. Faults run while it does; each step retries
//! through the servers in turn until it answers, and must be done within its bound.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_io_sim::trace::Recorder;
use drover_io_sim::turmoil::http;
use serde_json::Value;

pub const PLUGIN_ID: &str = "hostpath";
pub const VOLUME_ID: &str = "vol0";
pub const JOB_ID: &str = "web";
/// Each step must be done this soon.
const STEP_BOUND: Duration = Duration::from_secs(90);

/// How far the script got: the last step begun, and whether the whole script is done.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub step: &'static str,
    pub done: bool,
    pub failed: Option<String>,
    /// The allocation that held the claim.
    pub alloc: Option<String>,
}

fn plugin_job() -> Vec<u8> {
    serde_json::json!({"Job": {
        "ID": "csi-plugin", "Name": "csi-plugin", "Type": "system", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "plugin", "Count": 1,
            "RestartPolicy": {"Attempts": 1000, "Interval": 1_800_000_000_000_i64, "Delay": 15_000_000_000_i64, "Mode": "fail"},
            "Tasks": [{
                "Name": "plugin", "Driver": "raw_exec", "Config": {},
                "Resources": {"CPU": 50, "MemoryMB": 32},
                "CSIPluginConfig": {"ID": PLUGIN_ID, "Type": "monolith", "MountDir": "/csi", "HealthTimeout": 30_000_000_000_i64}
            }]
        }]
    }})
    .to_string()
    .into_bytes()
}

fn volume() -> Vec<u8> {
    serde_json::json!({"Volumes": [{
        "ID": VOLUME_ID, "Name": VOLUME_ID, "Namespace": "default", "ExternalID": VOLUME_ID, "PluginID": PLUGIN_ID,
        "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]
    }]})
    .to_string()
    .into_bytes()
}

fn consumer_job() -> Vec<u8> {
    serde_json::json!({"Job": {
        "ID": JOB_ID, "Name": JOB_ID, "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{
            "Name": "web", "Count": 1,
            "Volumes": {"data": {"Name": "data", "Type": "csi", "Source": VOLUME_ID,
                                 "AccessMode": "single-node-writer", "AttachmentMode": "file-system"}},
            "Tasks": [{
                "Name": "server", "Driver": "exec", "Config": {},
                "VolumeMounts": [{"Volume": "data", "Destination": "/data"}],
                "Resources": {"CPU": 100, "MemoryMB": 64}
            }]
        }]
    }})
    .to_string()
    .into_bytes()
}

struct Script {
    servers: Vec<(String, SocketAddr)>,
    recorder: Recorder,
    progress: Arc<Mutex<Progress>>,
    /// The next server to ask.
    next: usize,
}

impl Script {
    fn begin(&self, step: &'static str) {
        self.recorder.note(format!("csi operator: {step}"));
        self.progress.lock().expect("progress").step = step;
    }

    /// Sends the request through the servers in turn until one answers 200 with a body that
    /// `accept` takes, or the step's bound passes.
    async fn until<T>(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        mut accept: impl FnMut(&Value) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + STEP_BOUND;
        let mut last = String::from("not tried");
        while tokio::time::Instant::now() < deadline {
            let (server, addr) = self.servers[self.next % self.servers.len()].clone();
            let answer = tokio::time::timeout(Duration::from_secs(5), http::request(addr, method, path, body.clone()))
                .await
                .unwrap_or_else(|_| Err("timed out".to_string()));
            match answer {
                Ok(answer) if answer.status == 200 => {
                    let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                    if let Some(accepted) = accept(&value) {
                        return Ok(accepted);
                    }
                    last = format!("{server} answered, not yet as wanted");
                }
                Ok(answer) => {
                    last = format!("{server}: {} {}", answer.status, answer.text().trim());
                    self.next += 1;
                }
                Err(error) => {
                    last = format!("{server}: {error}");
                    self.next += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(format!("{method} {path} not done within {STEP_BOUND:?}: {last}"))
    }
}

/// The running allocation of the consumer job, once its volume is claimed for it.
fn claimed_alloc(allocs: &Value) -> Option<String> {
    allocs.as_array()?.iter().find_map(|alloc| {
        let running = alloc.get("ClientStatus")?.as_str()? == "running";
        let live = alloc.get("DesiredStatus").and_then(Value::as_str).unwrap_or("run") == "run";
        (running && live).then(|| alloc.get("ID")?.as_str().map(str::to_string))?
    })
}

fn claims_of(volume: &Value) -> usize {
    ["ReadAllocs", "WriteAllocs"]
        .iter()
        .filter_map(|key| volume.get(*key)?.as_object().map(|claims| claims.len()))
        .sum()
}

/// Runs the script through `servers`; `release` resolves when the operator may stop the job
/// (the faults are over). Progress is shared with the runner.
pub async fn operate(
    servers: Vec<(String, SocketAddr)>,
    recorder: Recorder,
    progress: Arc<Mutex<Progress>>,
    release: Arc<std::sync::atomic::AtomicBool>,
) -> turmoil::Result {
    let mut script = Script {
        servers,
        recorder: recorder.clone(),
        progress: progress.clone(),
        next: 0,
    };
    let result = steps(&mut script, &release).await;
    let mut progress = progress.lock().expect("progress");
    match result {
        Ok(()) => {
            progress.done = true;
            recorder.note("csi operator: done");
        }
        Err(error) => progress.failed = Some(format!("{}: {error}", progress.step)),
    }
    Ok(())
}

async fn steps(script: &mut Script, release: &std::sync::atomic::AtomicBool) -> Result<(), String> {
    script.begin("register the plugin job");
    script
        .until("PUT", "/v1/jobs", Some(plugin_job()), |_| Some(()))
        .await?;
    script.begin("wait for a healthy node plugin");
    let plugin = format!("/v1/plugin/csi/{PLUGIN_ID}");
    script
        .until("GET", &plugin, None, |plugin| {
            (plugin.get("NodesHealthy")?.as_u64()? >= 1).then_some(())
        })
        .await?;
    script.begin("register the volume");
    let volume_path = format!("/v1/volume/csi/{VOLUME_ID}");
    script.until("PUT", &volume_path, Some(volume()), |_| Some(())).await?;
    script.begin("run the job that mounts it");
    script
        .until("PUT", "/v1/jobs", Some(consumer_job()), |_| Some(()))
        .await?;
    script.begin("wait for its allocation to run with the volume claimed");
    let allocs = format!("/v1/job/{JOB_ID}/allocations");
    let alloc = script.until("GET", &allocs, None, claimed_alloc).await?;
    script
        .until("GET", &volume_path, None, |volume| {
            (claims_of(volume) == 1).then_some(())
        })
        .await?;
    script
        .recorder
        .note(format!("csi operator: {alloc} runs with {VOLUME_ID} claimed"));
    script.progress.lock().expect("progress").alloc = Some(alloc);
    script.begin("wait for the faults to end");
    while !release.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    script.begin("stop the job");
    script
        .until("DELETE", &format!("/v1/job/{JOB_ID}"), None, |_| Some(()))
        .await?;
    script.begin("wait for the claim to be released");
    script
        .until("GET", &volume_path, None, |volume| {
            (claims_of(volume) == 0).then_some(())
        })
        .await?;
    script.begin("deregister the volume");
    script.until("DELETE", &volume_path, None, |_| Some(())).await?;
    Ok(())
}
