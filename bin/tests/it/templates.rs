//! Templates for real: a job written in HCL as Nomad's documentation writes it, with three
//! `template` blocks — one reading a Nomad variable (`change_mode = "restart"`), one `env = true`
//! file with `perms`, one reading a variable that does not exist yet (`change_mode = "signal"`).
//! The task does not start until the missing variable is written; it sees the rendered file and
//! the env file's variables; a change to the signal template's variable signals the task
//! without restarting it; a change to the restart template's variable restarts it with the new
//! content.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{Agent, cluster_specs, http, server_args, wait_for};

fn get(port: u16, path: &str) -> Option<Value> {
    serde_json::from_str(&support::http_get(port, path)?).ok()
}

fn put_var(port: u16, path: &str, items: &str) {
    let body = format!(r#"{{"Items":{items}}}"#);
    assert!(
        http("PUT", port, &format!("/v1/var/{path}"), Some(&body)).is_some(),
        "variable {path} written"
    );
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn jobspec(starts: &Path, signals: &Path) -> String {
    let script = format!(
        "trap 'echo HUP >> {signals}' HUP; echo \\\"start user=$(cat local/app.conf) mode=$MODE\\\" >> {starts}; while :; do sleep 0.1; done",
        signals = signals.display(),
        starts = starts.display()
    );
    format!(
        r#"job "web" {{
  group "g" {{
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      template {{
        data        = <<EOH
{{{{ with nomadVar "nomad/jobs/web" }}}}{{{{ .user }}}}{{{{ end }}}}
EOH
        destination = "local/app.conf"
        change_mode = "restart"
      }}
      template {{
        data        = "MODE={{{{ env \"NOMAD_ALLOC_INDEX\" }}}}-prod\n"
        destination = "secrets/app.env"
        env         = true
        perms       = "0600"
      }}
      template {{
        data          = "{{{{ with nomadVar \"nomad/jobs/web/sig\" }}}}{{{{ .v }}}}{{{{ end }}}}"
        destination   = "local/sig.conf"
        change_mode   = "signal"
        change_signal = "SIGHUP"
      }}
      kill_timeout = "1s"
      resources {{
        cpu    = 20
        memory = 16
      }}
    }}
  }}
}}
"#
    )
}

#[test]
fn templates_render_block_on_missing_variables_and_follow_their_change_mode() {
    let root = tempfile::tempdir().unwrap();
    let specs = cluster_specs(root.path(), 1);
    let mut args = server_args(&specs, 0);
    args.push("-client".into());
    let agent = Agent::start(specs[0].clone(), args);
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        let nodes = get(port, "/v1/nodes")?;
        (nodes[0]["Drivers"]["raw_exec"]["Healthy"] == true).then_some(())
    })
    .unwrap_or_else(|| panic!("the client registers:\n{}", agent.log()));
    put_var(port, "nomad/jobs/web", r#"{"user":"admin"}"#);

    let starts = root.path().join("starts");
    let signals = root.path().join("signals");
    let file = root.path().join("web.hcl");
    std::fs::write(&file, jobspec(&starts, &signals)).unwrap();
    let output = std::process::Command::new(support::AGENT)
        .args(["job", "run", "-detach", file.to_str().unwrap()])
        .env("NOMAD_ADDR", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("the CLI runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let alloc = wait_for(Duration::from_secs(20), || {
        let allocs = get(port, "/v1/job/web/allocations")?;
        allocs[0]["ID"].as_str().map(String::from)
    })
    .unwrap_or_else(|| panic!("the job is placed:\n{}", agent.log()));

    // The signal template reads a variable nobody wrote yet: the task waits for it.
    std::thread::sleep(Duration::from_secs(2));
    assert!(lines(&starts).is_empty(), "started before its template could render");
    assert!(
        agent
            .log()
            .contains("Missing: nomad.var.block(nomad/jobs/web/sig@default.global)"),
        "the wait is a task event, in Nomad's words:\n{}",
        agent.log()
    );
    put_var(port, "nomad/jobs/web/sig", r#"{"v":"1"}"#);
    let first = wait_for(Duration::from_secs(20), || lines(&starts).first().cloned())
        .unwrap_or_else(|| panic!("the task starts once the variable exists:\n{}", agent.log()));
    assert_eq!(first, "start user=admin mode=0-prod");
    let task_dir = specs[0].data_dir.join("alloc").join(&alloc).join("t");
    let env_file = task_dir.join("secrets/app.env");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "perms of {}", env_file.display());
    assert_eq!(std::fs::read_to_string(task_dir.join("local/sig.conf")).unwrap(), "1");

    // The signal template's variable changes: the task is signalled, not restarted.
    put_var(port, "nomad/jobs/web/sig", r#"{"v":"2"}"#);
    wait_for(Duration::from_secs(20), || (lines(&signals) == ["HUP"]).then_some(()))
        .unwrap_or_else(|| panic!("the task is signalled: {:?}\n{}", lines(&signals), agent.log()));
    assert_eq!(std::fs::read_to_string(task_dir.join("local/sig.conf")).unwrap(), "2");
    assert_eq!(lines(&starts).len(), 1, "a signal template does not restart the task");

    // The restart template's variable changes: the task restarts with the new content.
    put_var(port, "nomad/jobs/web", r#"{"user":"root"}"#);
    wait_for(Duration::from_secs(20), || (lines(&starts).len() == 2).then_some(()))
        .unwrap_or_else(|| panic!("the task restarts: {:?}\n{}", lines(&starts), agent.log()));
    assert_eq!(lines(&starts)[1], "start user=root mode=0-prod");
    assert!(
        agent.log().contains("Template with change_mode restart re-rendered"),
        "the restart is a task event:\n{}",
        agent.log()
    );
}
