//! `volume create` and `volume delete` as a new user runs them, as root: an agent runs the
//! project's fake CSI plugin as a raw_exec system job (without `--auto-create`: volumes exist
//! only when made); the CLI creates a volume from a spec with a capacity range, the plugin
//! makes it and the cluster registers what it made; re-running the create makes nothing new;
//! a conflicting spec is refused by the plugin; a job writes to the volume; deleting it is
//! refused while claimed; in use, it is expanded (controller, then node) by re-running the
//! create with a larger minimum, snapshotted, and listed by the plugin; then deleting it
//! removes it from the plugin and the cluster.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{AGENT, Agent, cluster_specs, server_args, wait_for};

const PLUGIN: &str = env!("CARGO_BIN_EXE_drover-csi-fake");

/// Unmounts whatever a failed run left under the dir.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let prefix = self.0.display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split_whitespace().nth(4))
            .filter(|point| point.starts_with(&prefix))
            .collect();
        points.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in points {
            let _ = Command::new("umount").arg("-l").arg(point).status();
        }
    }
}

fn cli(port: u16, args: &[&str]) -> (bool, String) {
    let output = Command::new(AGENT)
        .args(args)
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .env_remove("NOMAD_TOKEN")
        .output()
        .expect("the CLI runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The plugin's own records (what exists in its "storage").
fn plugin_volumes(state: &Path) -> Value {
    let text = std::fs::read_to_string(state.join("fake-plugin.json")).unwrap_or_else(|_| "{}".into());
    serde_json::from_str::<Value>(&text).unwrap()["volumes"].clone()
}

#[test]
fn volumes_are_created_and_deleted_through_the_plugin_and_registered_once() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "bind mounts and the exec driver need root"
    );
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let _unmount = Unmount(dir.to_path_buf());
    let specs = cluster_specs(dir, 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));

    let state = dir.join("fake-state");
    let plugin = write(
        dir,
        "plugin.hcl",
        &format!(
            r#"job "plugin" {{
  type = "system"
  group "nodes" {{
    task "plugin" {{
      driver = "raw_exec"
      config {{
        command = "{PLUGIN}"
        args    = ["--state-dir={}", "--node-id=node-1", "--stage-unstage", "--expand", "--snapshots", "--list-volumes", "--topology=zone=a"]
      }}
      csi_plugin {{
        id   = "fake"
        type = "monolith"
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#,
            state.display()
        ),
    );
    let (ok, out) = cli(port, &["job", "run", "-detach", &plugin]);
    assert!(ok, "{out}");
    wait_for(Duration::from_secs(30), || {
        let plugin = get(port, "/v1/plugin/csi/fake")?;
        (plugin["ControllersHealthy"] == 1 && plugin["NodesHealthy"] == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("the plugin is healthy:\n{}", agent.log()));

    // Created from a spec as Nomad's documentation writes one.
    let spec = |id: &str, name: &str, min: &str| {
        format!(
            r#"id           = "{id}"
name         = "{name}"
type         = "csi"
plugin_id    = "fake"
capacity_min = "{min}"
capacity_max = "8GiB"

capability {{
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}}

parameters {{
  tier = "gold"
}}
"#
        )
    };
    let volume = write(dir, "vol0.hcl", &spec("vol0", "vol0", "2GiB"));
    let (ok, out) = cli(port, &["volume", "create", &volume]);
    assert!(ok, "{out}\n{}", agent.log());
    assert_eq!(out.trim(), "Created external volume vol0 with ID vol0");
    // The node plugin's accessible topology is the node's, and the volume is made inside it.
    let node_id = get(port, "/v1/nodes").expect("nodes")[0]["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let node = get(port, &format!("/v1/node/{node_id}")).expect("node");
    assert_eq!(
        node["CSINodePlugins"]["fake"]["NodeInfo"]["AccessibleTopology"]["Segments"]["zone"], "a",
        "{node}"
    );
    let stored = get(port, "/v1/volume/csi/vol0").expect("registered");
    assert_eq!(stored["Topologies"][0]["Segments"]["zone"], "a", "{stored}");
    assert_eq!(stored["ExternalID"], "vol0");
    assert_eq!(stored["Capacity"], 2u64 << 30);
    assert_eq!(stored["Parameters"]["tier"], "gold");
    assert_eq!(plugin_volumes(&state)["vol0"]["capacity_bytes"], 2u64 << 30);
    let (ok, status) = cli(port, &["volume", "status", "vol0"]);
    assert!(ok, "{status}");
    let line = |key: &str| {
        status
            .lines()
            .find(|line| line.starts_with(key))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("Capacity").ends_with("= 2.0 GiB"), "{status}");
    assert!(line("External ID").ends_with("= vol0"), "{status}");
    assert!(line("Access Mode").contains('='), "{status}");
    // Again: nothing new anywhere.
    let (ok, out) = cli(port, &["volume", "create", &volume]);
    assert!(ok, "{out}");
    assert_eq!(plugin_volumes(&state).as_object().unwrap().len(), 1);
    // Another volume whose name the plugin already holds at another size: refused by the plugin.
    let clash = write(dir, "clash.hcl", &spec("vol1", "vol0", "6GiB"));
    let (ok, out) = cli(port, &["volume", "create", &clash]);
    assert!(
        !ok && out.contains("controller create volume") && out.contains("AlreadyExists"),
        "{out}"
    );
    assert!(get(port, "/v1/volume/csi/vol1").is_none(), "nothing registered");

    // A job writes through the volume; the volume cannot be deleted under it.
    let writer = write(
        dir,
        "writer.hcl",
        r#"job "writer" {
  group "g" {
    volume "data" {
      type            = "csi"
      source          = "vol0"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo written > /data/hello && sleep 300"]
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      kill_timeout = "1s"
      resources {
        cpu    = 20
        memory = 32
      }
    }
  }
}
"#,
    );
    let (ok, out) = cli(port, &["job", "run", "-detach", &writer]);
    assert!(ok, "{out}");
    let data = state.join("volumes/vol0/hello");
    wait_for(Duration::from_secs(60), || std::fs::read_to_string(&data).ok())
        .unwrap_or_else(|| panic!("the writer writes through the volume:\n{}", agent.log()));
    // alloc status names the volume the task mounts (verbose: with its plugin).
    let alloc_id = get(port, "/v1/job/writer/allocations").expect("listed")[0]["ID"]
        .as_str()
        .unwrap()
        .to_string();
    // (Its task's state reaches the servers within the client's batching: waited for.)
    let out = wait_for(Duration::from_secs(10), || {
        let (ok, out) = cli(port, &["alloc", "status", &alloc_id]);
        (ok && out.contains("Task \"")).then_some(out)
    })
    .unwrap_or_else(|| panic!("the task's state reaches the servers:\n{}", agent.log()));
    assert!(out.contains("CSI Volumes:\nID    Read Only\nvol0  false"), "{out}");
    let (ok, out) = cli(port, &["alloc", "status", "--verbose", &alloc_id]);
    assert!(ok, "{out}");
    let csi = out.split("CSI Volumes:\n").nth(1).unwrap_or_default();
    assert!(csi.starts_with("ID    Plugin  Provider"), "{out}");
    assert!(
        csi.lines().nth(1).is_some_and(|row| row.starts_with("vol0  fake")),
        "{out}"
    );
    let (ok, out) = cli(port, &["volume", "delete", "vol0"]);
    assert!(!ok && out.contains("volume in use: vol0"), "{out}");
    assert!(state.join("volumes/vol0").is_dir(), "nothing deleted");

    // Expanded in use, Nomad's way: the same spec with a larger minimum. The controller grows
    // it, then the node the writer runs on grows its file system.
    let bigger = write(dir, "vol0-big.hcl", &spec("vol0", "vol0", "4GiB"));
    let (ok, out) = cli(port, &["volume", "create", &bigger]);
    assert!(ok, "{out}\n{}", agent.log());
    let stored = get(port, "/v1/volume/csi/vol0").expect("registered");
    assert_eq!(
        (stored["Capacity"].as_u64(), stored["RequestedCapacityMin"].as_u64()),
        (Some(4 << 30), Some(4 << 30)),
        "{stored}"
    );
    assert_eq!(plugin_volumes(&state)["vol0"]["capacity_bytes"], 4u64 << 30);
    assert_eq!(plugin_volumes(&state)["vol0"]["node_capacity_bytes"], 4u64 << 30);
    assert!(!stored["WriteAllocs"].as_object().unwrap().is_empty(), "still claimed");
    // A maximum below what it has now is refused: volumes do not shrink.
    let smaller = write(
        dir,
        "vol0-small.hcl",
        &spec("vol0", "vol0", "1GiB").replace("8GiB", "2GiB"),
    );
    let (ok, out) = cli(port, &["volume", "create", &smaller]);
    assert!(!ok && out.contains("less than or equal to current (4.3 GB)"), "{out}");

    // Snapshots: made of the registered volume, listed, deleted, all in the plugin.
    let (ok, out) = cli(port, &["volume", "snapshot", "create", "vol0", "nightly"]);
    assert!(ok, "{out}\n{}", agent.log());
    let row = out.lines().nth(1).unwrap_or_default().to_string();
    assert!(
        out.starts_with("Snapshot ID") && row.starts_with("nightly") && row.ends_with("true"),
        "{out}"
    );
    assert!(row.contains("4.0 GiB"), "the snapshot's size: {out}");
    let (ok, out) = cli(port, &["volume", "snapshot", "list", "--plugin", "fak"]);
    assert!(
        ok && out.lines().nth(1).is_some_and(|line| line.starts_with("nightly")),
        "{out}"
    );
    // Without a name, one is made (CSI requires it; the fake plugin refuses none).
    let (ok, out) = cli(port, &["volume", "snapshot", "create", "vol0"]);
    assert!(ok, "{out}");
    let unnamed = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(unnamed.starts_with("vol0-snapshot-"), "{out}");
    let (ok, out) = cli(port, &["volume", "snapshot", "delete", "fake", &unnamed]);
    assert!(ok, "{out}");
    let (ok, out) = cli(port, &["volume", "snapshot", "create", "nope", "x"]);
    assert!(!ok && out.contains("no such volume \"nope\""), "{out}");
    let (ok, out) = cli(port, &["volume", "snapshot", "delete", "fake", "nightly"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "Deleted snapshot nightly.");
    let (ok, out) = cli(port, &["volume", "snapshot", "list", "--plugin", "fake"]);
    assert!(ok && out.trim() == "No snapshots found", "{out}");

    // The plugin's own listing: what it holds, registered or not.
    let listed = get(port, "/v1/volumes/external?plugin_id=fake").expect("listed");
    assert_eq!(listed["Volumes"][0]["ExternalID"], "vol0", "{listed}");
    assert_eq!(listed["Volumes"][0]["CapacityBytes"], 4u64 << 30, "{listed}");
    let (ok, out) = cli(port, &["plugin", "status", "fake"]);
    assert!(ok, "{out}");
    let external = out.split("External Volumes").nth(1).unwrap_or_default().to_string();
    assert!(external.contains("vol0") && external.contains("OK"), "{out}");
    let (ok, out) = cli(port, &["volume", "status", "--verbose"]);
    assert!(ok && out.contains("External ID") && out.contains("Condition"), "{out}");

    let (ok, out) = cli(port, &["job", "stop", "writer"]);
    assert!(ok, "{out}");
    wait_for(Duration::from_secs(60), || {
        let volume = get(port, "/v1/volume/csi/vol0")?;
        let free = volume["WriteAllocs"]
            .as_object()
            .is_some_and(|claims| claims.is_empty())
            && volume["ReadAllocs"].as_object().is_some_and(|claims| claims.is_empty());
        free.then_some(())
    })
    .unwrap_or_else(|| panic!("the writer's claim is released:\n{}", agent.log()));
    let (ok, out) = wait_for(Duration::from_secs(30), || {
        let (ok, out) = cli(port, &["volume", "delete", "vol0"]);
        (ok || !out.contains("in use")).then_some((ok, out))
    })
    .unwrap_or_else(|| panic!("the claim never cleared:\n{}", agent.log()));
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "Successfully deleted volume \"vol0\"!");
    assert!(get(port, "/v1/volume/csi/vol0").is_none(), "deregistered");
    assert!(!state.join("volumes/vol0").exists(), "deleted in the plugin");
    assert!(plugin_volumes(&state).as_object().unwrap().is_empty());
    let (ok, out) = cli(port, &["job", "stop", "plugin"]);
    assert!(ok, "{out}");
}
