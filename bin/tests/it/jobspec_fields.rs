//! Issue 55 §1: nothing a jobspec says is dropped. Every field Drover honours comes back as
//! written through parse, register, inspect, versions and plan (a table of JSON paths and the
//! values `testdata/every_field.hcl` writes), and every block Nomad documents, walked through
//! `POST /v1/jobs/parse` at its level, is either kept or refused with an error naming it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Agent, cluster_specs, http_status, server_args, wait_for};

const EVERY_FIELD: &str = include_str!("testdata/every_field.hcl");

/// The value at `path` (`/`-separated): in an array, a segment that is not a number names
/// the element whose `Name` it is (stored tasks need not keep the file's order).
fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('/')
        .filter(|segment| !segment.is_empty())
        .try_fold(value, |value, segment| match value {
            Value::Array(items) => match segment.parse::<usize>() {
                Ok(index) => items.get(index),
                Err(_) => items.iter().find(|item| item["Name"] == segment),
            },
            Value::Object(map) => map.get(segment),
            _ => None,
        })
}

const S: i64 = 1_000_000_000;

/// When a written value is read back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    Always,
    /// Only from parse: the job-level `reschedule` and `migrate` are merged into the groups
    /// when the job is registered and not kept on the job, as Nomad's are.
    Parsed,
    /// Once registered: what a group inherits from the job.
    Registered,
}
use When::{Always, Parsed, Registered};

/// What `every_field.hcl` writes, field by field, as Nomad's API spells it.
fn written() -> Vec<(&'static str, Value, When)> {
    vec![
        ("ID", json!("every-field"), Always),
        ("Name", json!("every-field-name"), Always),
        ("Namespace", json!("default"), Always),
        ("Region", json!("global"), Always),
        ("Type", json!("service"), Always),
        ("Priority", json!(71), Always),
        ("Datacenters", json!(["dc1", "dc2"]), Always),
        ("AllAtOnce", json!(true), Always),
        ("Meta/owner", json!("ops"), Always),
        ("Constraints/0/LTarget", json!("${attr.kernel.name}"), Always),
        ("Constraints/0/Operand", json!("="), Always),
        ("Constraints/0/RTarget", json!("linux"), Always),
        ("Affinities/0/LTarget", json!("${node.datacenter}"), Always),
        ("Affinities/0/RTarget", json!("dc1"), Always),
        ("Affinities/0/Weight", json!(40), Always),
        ("Spreads/0/Attribute", json!("${node.datacenter}"), Always),
        ("Spreads/0/Weight", json!(30), Always),
        ("Spreads/0/SpreadTarget/0/Value", json!("dc1"), Always),
        ("Spreads/0/SpreadTarget/0/Percent", json!(60), Always),
        ("Spreads/0/SpreadTarget/1/Value", json!("dc2"), Always),
        ("Spreads/0/SpreadTarget/1/Percent", json!(40), Always),
        ("Update/MaxParallel", json!(2), Always),
        ("Update/HealthCheck", json!("task_states"), Always),
        ("Update/MinHealthyTime", json!(11 * S), Always),
        ("Update/HealthyDeadline", json!(240 * S), Always),
        ("Update/ProgressDeadline", json!(540 * S), Always),
        ("Update/AutoRevert", json!(true), Always),
        ("Update/AutoPromote", json!(false), Always),
        ("Update/Canary", json!(1), Always),
        ("Update/Stagger", json!(31 * S), Always),
        ("Reschedule/Attempts", json!(4), Parsed),
        ("Reschedule/Interval", json!(7200 * S), Parsed),
        ("Reschedule/Delay", json!(45 * S), Parsed),
        ("Reschedule/DelayFunction", json!("fibonacci"), Parsed),
        ("Reschedule/MaxDelay", json!(1800 * S), Parsed),
        ("Reschedule/Unlimited", json!(false), Parsed),
        ("Migrate/MaxParallel", json!(3), Parsed),
        ("TaskGroups/web/Count", json!(2), Always),
        ("TaskGroups/web/ShutdownDelay", json!(7 * S), Always),
        ("TaskGroups/web/StopAfterClientDisconnect", json!(90 * S), Always),
        ("TaskGroups/web/Meta/tier", json!("front"), Always),
        ("TaskGroups/web/Constraints/0/Operand", json!("distinct_hosts"), Always),
        ("TaskGroups/web/Affinities/0/LTarget", json!("${meta.rack}"), Always),
        ("TaskGroups/web/Affinities/0/RTarget", json!("r1"), Always),
        ("TaskGroups/web/Affinities/0/Weight", json!(-20), Always),
        ("TaskGroups/web/Spreads/0/Attribute", json!("${meta.rack}"), Always),
        ("TaskGroups/web/RestartPolicy/Attempts", json!(3), Always),
        ("TaskGroups/web/RestartPolicy/Interval", json!(600 * S), Always),
        ("TaskGroups/web/RestartPolicy/Delay", json!(20 * S), Always),
        ("TaskGroups/web/RestartPolicy/Mode", json!("delay"), Always),
        ("TaskGroups/web/ReschedulePolicy/Attempts", json!(0), Always),
        ("TaskGroups/web/ReschedulePolicy/Unlimited", json!(true), Always),
        ("TaskGroups/web/ReschedulePolicy/Delay", json!(10 * S), Always),
        ("TaskGroups/web/Migrate/MaxParallel", json!(2), Always),
        // The job's reschedule fills in what the group's leaves unset (Nomad's canonicalize).
        (
            "TaskGroups/web/ReschedulePolicy/DelayFunction",
            json!("fibonacci"),
            Registered,
        ),
        ("TaskGroups/web/ReschedulePolicy/Interval", json!(7200 * S), Registered),
        ("TaskGroups/web/ReschedulePolicy/MaxDelay", json!(1800 * S), Registered),
        ("TaskGroups/web/EphemeralDisk/SizeMB", json!(350), Always),
        ("TaskGroups/web/Networks/0/Mode", json!("host"), Always),
        ("TaskGroups/web/Networks/0/DynamicPorts/0/Label", json!("http"), Always),
        ("TaskGroups/web/Networks/0/DynamicPorts/0/To", json!(8080), Always),
        (
            "TaskGroups/web/Networks/0/ReservedPorts/0/Label",
            json!("admin"),
            Always,
        ),
        ("TaskGroups/web/Networks/0/ReservedPorts/0/Value", json!(9901), Always),
        ("TaskGroups/web/Volumes/data/Type", json!("host"), Always),
        ("TaskGroups/web/Volumes/data/Source", json!("shared"), Always),
        ("TaskGroups/web/Volumes/data/ReadOnly", json!(true), Always),
        ("TaskGroups/web/Services/every-web/PortLabel", json!("http"), Always),
        ("TaskGroups/web/Services/every-web/Tags", json!(["web", "v1"]), Always),
        ("TaskGroups/web/Services/every-web/Meta/team", json!("ops"), Always),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Type",
            json!("http"),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Path",
            json!("/health"),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Method",
            json!("GET"),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Protocol",
            json!("http"),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Interval",
            json!(12 * S),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Timeout",
            json!(3 * S),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/InitialStatus",
            json!("warning"),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/TLSSkipVerify",
            json!(true),
            Always,
        ),
        (
            "TaskGroups/web/Services/every-web/Checks/alive/Header/X-Probe",
            json!(["a", "b"]),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Driver", json!("raw_exec"), Always),
        ("TaskGroups/web/Tasks/server/KillTimeout", json!(17 * S), Always),
        ("TaskGroups/web/Tasks/server/KillSignal", json!("SIGINT"), Always),
        ("TaskGroups/web/Tasks/server/Leader", json!(true), Always),
        ("TaskGroups/web/Tasks/server/ShutdownDelay", json!(2 * S), Always),
        (
            "TaskGroups/web/Tasks/server/Config/command",
            json!("/bin/sleep"),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Config/args", json!(["600"]), Always),
        ("TaskGroups/web/Tasks/server/Env/GREETING", json!("hello"), Always),
        ("TaskGroups/web/Tasks/server/Meta/role", json!("server"), Always),
        (
            "TaskGroups/web/Tasks/server/Constraints/0/LTarget",
            json!("${attr.os.name}"),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Constraints/0/Operand", json!("!="), Always),
        (
            "TaskGroups/web/Tasks/server/Constraints/0/RTarget",
            json!("windows"),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Resources/CPU", json!(150), Always),
        ("TaskGroups/web/Tasks/server/Resources/MemoryMB", json!(96), Always),
        ("TaskGroups/web/Tasks/server/Resources/MemoryMaxMB", json!(192), Always),
        ("TaskGroups/web/Tasks/server/RestartPolicy/Attempts", json!(5), Always),
        ("TaskGroups/web/Tasks/server/LogConfig/MaxFiles", json!(4), Always),
        ("TaskGroups/web/Tasks/server/LogConfig/MaxFileSizeMB", json!(7), Always),
        (
            "TaskGroups/web/Tasks/server/VolumeMounts/0/Volume",
            json!("data"),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/VolumeMounts/0/Destination",
            json!("/srv/data"),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/VolumeMounts/0/ReadOnly",
            json!(true),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/Templates/0/EmbeddedTmpl",
            json!("port={{ env \"NOMAD_PORT_http\" }}"),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/Templates/0/DestPath",
            json!("local/app.conf"),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Templates/0/Perms", json!("600"), Always),
        (
            "TaskGroups/web/Tasks/server/Templates/0/ChangeMode",
            json!("signal"),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/Templates/0/ChangeSignal",
            json!("SIGHUP"),
            Always,
        ),
        ("TaskGroups/web/Tasks/server/Templates/0/Splay", json!(3 * S), Always),
        (
            "TaskGroups/web/Tasks/server/Services/every-admin/PortLabel",
            json!("admin"),
            Always,
        ),
        (
            "TaskGroups/web/Tasks/server/Services/every-admin/Tags",
            json!(["admin"]),
            Always,
        ),
        ("TaskGroups/web/Tasks/init/Lifecycle/Hook", json!("prestart"), Always),
        ("TaskGroups/web/Tasks/init/Lifecycle/Sidecar", json!(false), Always),
        ("TaskGroups/web/Tasks/init/Config/command", json!("/bin/true"), Always),
    ]
}

fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (code, text) = http_status("POST", port, path, Some(&body.to_string())).expect("the agent answers");
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn get(port: u16, path: &str) -> Value {
    let (code, text) = http_status("GET", port, path, None).expect("the agent answers");
    assert_eq!(code, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Every written value, read back from `job` (named `what`); the misses, all of them.
fn misses(what: &str, job: &Value) -> Vec<String> {
    let parsed = what == "parse";
    // Tasks in the order the file writes them, as Nomad keeps them.
    let order: Vec<&Value> = job["TaskGroups"][0]["Tasks"]
        .as_array()
        .map(|tasks| tasks.iter().map(|task| &task["Name"]).collect())
        .unwrap_or_default();
    let order_missed = (order != [&json!("server"), &json!("init")])
        .then(|| format!("{what}: tasks in the order {order:?}, written server, init"));
    order_missed
        .into_iter()
        .chain(
            written()
                .into_iter()
                .filter(|(_, _, when)| *when == Always || (*when == Parsed) == parsed)
                .filter(|(path, value, _)| at(job, path) != Some(value))
                .map(|(path, value, _)| format!("{what}: {path} is {:?}, written {value}", at(job, path))),
        )
        .collect()
}

fn server(root: &std::path::Path) -> (Agent, u16) {
    let specs = cluster_specs(root, 1);
    let agent = Agent::start(specs[0].clone(), server_args(&specs, 0));
    let port = specs[0].http;
    wait_for(Duration::from_secs(30), || {
        http_status("GET", port, "/v1/jobs", None).filter(|(code, _)| *code == 200)
    })
    .unwrap_or_else(|| panic!("the server answers:\n{}", agent.log()));
    (agent, port)
}

#[test]
fn every_field_comes_back_from_parse_register_inspect_versions_and_plan() {
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = server(root.path());
    let (code, parsed) = post(port, "/v1/jobs/parse", &json!({"JobHCL": EVERY_FIELD}));
    assert_eq!(code, 200, "{parsed}");
    let mut problems = misses("parse", &parsed);
    // Registered as the CLI registers a parsed file, then read back every way there is.
    let (code, registered) = post(port, "/v1/jobs", &json!({"Job": parsed}));
    assert_eq!(code, 200, "{registered}\n{}", agent.log());
    problems.extend(misses("inspect", &get(port, "/v1/job/every-field")));
    let versions = get(port, "/v1/job/every-field/versions");
    problems.extend(misses("versions", &versions["Versions"][0]));
    let (code, plan) = post(port, "/v1/job/every-field/plan", &json!({"Job": parsed, "Diff": true}));
    assert_eq!(code, 200, "{plan}");
    assert_eq!(plan["Diff"]["Type"], "None", "the same job plans no change: {plan}");
    // A JSON body registers the same (the API's own path, no HCL).
    let (code, _) = post(port, "/v1/jobs", &json!({"Job": get(port, "/v1/job/every-field")}));
    assert_eq!(code, 200);
    problems.extend(misses("re-registered", &get(port, "/v1/job/every-field")));
    assert!(
        problems.is_empty(),
        "{} dropped:\n{}",
        problems.len(),
        problems.join("\n")
    );
    drop(agent);
}

/// Where a block is written, as Nomad's documentation places it.
#[derive(Clone, Copy)]
enum Level {
    Job,
    Group,
    Task,
    /// In a group `service` (with a port to name).
    Service,
    /// In a group service's `check`.
    Check,
}

enum Expect {
    /// Parsed, and found (not null) at this path of the parsed job.
    Kept(&'static str),
    /// Refused, the error naming this key.
    Refused(&'static str),
}

fn jobspec(level: Level, snippet: &str) -> String {
    let (job, group, task, service, check) = match level {
        Level::Job => (snippet, "", "", "", ""),
        Level::Group => ("", snippet, "", "", ""),
        Level::Task => ("", "", snippet, "", ""),
        Level::Service => ("", "", "", snippet, ""),
        Level::Check => ("", "", "", "", snippet),
    };
    format!(
        r#"job "walk" {{
  {job}
  group "g" {{
    {group}
    network {{
      port "http" {{}}
    }}
    service {{
      name = "walk"
      port = "http"
      {service}
      check {{
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
        {check}
      }}
    }}
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/true"
      }}
      {task}
    }}
  }}
}}
"#
    )
}

#[test]
fn every_documented_block_is_kept_or_refused_by_name_at_parse() {
    use Expect::{Kept, Refused};
    use Level::{Check, Group, Job, Service, Task};
    let table: Vec<(Level, &str, Expect)> = vec![
        // The job.
        (
            Job,
            "constraint {\n attribute = \"${attr.os.name}\"\n value = \"linux\"\n }",
            Kept("Constraints/0"),
        ),
        (
            Job,
            "affinity {\n attribute = \"${node.class}\"\n value = \"a\"\n weight = 10\n }",
            Kept("Affinities/0"),
        ),
        (Job, r#"spread { attribute = "${node.datacenter}" }"#, Kept("Spreads/0")),
        (Job, "meta { a = \"b\" }", Kept("Meta/a")),
        (Job, "update { max_parallel = 2 }", Kept("Update/MaxParallel")),
        (Job, "migrate { max_parallel = 2 }", Kept("Migrate/MaxParallel")),
        (Job, "reschedule { attempts = 2 }", Kept("Reschedule/Attempts")),
        (
            Job,
            "type = \"batch\"\n periodic {\n cron = \"*/5 * * * *\"\n prohibit_overlap = true\n time_zone = \"UTC\"\n }",
            Kept("Periodic/Spec"),
        ),
        (
            Job,
            "type = \"batch\"\n parameterized {\n payload = \"required\"\n meta_required = [\"a\"]\n }",
            Kept("ParameterizedJob/MetaRequired"),
        ),
        (Job, "all_at_once = true", Kept("AllAtOnce")),
        (Job, "vault { policies = [\"p\"] }", Refused("vault")),
        (
            Job,
            "multiregion {\n strategy {\n max_parallel = 1\n }\n }",
            Refused("multiregion"),
        ),
        (Job, "consul_token = \"x\"", Refused("consul_token")),
        (Job, "vault_token = \"x\"", Refused("vault_token")),
        // The group.
        (Group, "count = 3", Kept("TaskGroups/g/Count")),
        (
            Group,
            r#"constraint { distinct_hosts = true }"#,
            Kept("TaskGroups/g/Constraints/0"),
        ),
        (
            Group,
            "affinity {\n attribute = \"${node.class}\"\n value = \"a\"\n weight = 10\n }",
            Kept("TaskGroups/g/Affinities/0"),
        ),
        (
            Group,
            r#"spread { attribute = "${node.datacenter}" }"#,
            Kept("TaskGroups/g/Spreads/0"),
        ),
        (Group, "meta { a = \"b\" }", Kept("TaskGroups/g/Meta/a")),
        (
            Group,
            "restart { attempts = 1 }",
            Kept("TaskGroups/g/RestartPolicy/Attempts"),
        ),
        (
            Group,
            "reschedule { attempts = 1 }",
            Kept("TaskGroups/g/ReschedulePolicy/Attempts"),
        ),
        (
            Group,
            "migrate { max_parallel = 2 }",
            Kept("TaskGroups/g/Migrate/MaxParallel"),
        ),
        (Group, "update { canary = 1 }", Kept("TaskGroups/g/Update/Canary")),
        (
            Group,
            "ephemeral_disk { size = 200 }",
            Kept("TaskGroups/g/EphemeralDisk/SizeMB"),
        ),
        (
            Group,
            "scaling {\n min = 1\n max = 5\n }",
            Kept("TaskGroups/g/Scaling/Max"),
        ),
        (Group, "shutdown_delay = \"5s\"", Kept("TaskGroups/g/ShutdownDelay")),
        (
            Group,
            "stop_after_client_disconnect = \"1m\"",
            Kept("TaskGroups/g/StopAfterClientDisconnect"),
        ),
        (
            Group,
            "volume \"v\" {\n type = \"csi\"\n source = \"vol\"\n access_mode = \"single-node-writer\"\n attachment_mode = \"file-system\"\n per_alloc = true\n mount_options { fs_type = \"ext4\" }\n }",
            Kept("TaskGroups/g/Volumes/v/MountOptions/FSType"),
        ),
        (Group, "consul { namespace = \"ns\" }", Refused("consul")),
        (
            Group,
            "max_client_disconnect = \"1m\"",
            Refused("max_client_disconnect"),
        ),
        // The task.
        (Task, "env { A = \"b\" }", Kept("TaskGroups/g/Tasks/t/Env/A")),
        (Task, "meta { a = \"b\" }", Kept("TaskGroups/g/Tasks/t/Meta/a")),
        (
            Task,
            "constraint {\n attribute = \"${attr.os.name}\"\n value = \"linux\"\n }",
            Kept("TaskGroups/g/Tasks/t/Constraints/0"),
        ),
        (
            Task,
            "affinity {\n attribute = \"${node.class}\"\n value = \"a\"\n weight = 10\n }",
            Kept("TaskGroups/g/Tasks/t/Affinities/0"),
        ),
        (
            Task,
            "resources {\n cpu = 200\n memory = 64\n device \"nvidia/gpu\" { count = 1 }\n }",
            Kept("TaskGroups/g/Tasks/t/Resources/Devices/0/Name"),
        ),
        (
            Task,
            "restart { attempts = 1 }",
            Kept("TaskGroups/g/Tasks/t/RestartPolicy/Attempts"),
        ),
        (
            Task,
            "logs { max_files = 2 }",
            Kept("TaskGroups/g/Tasks/t/LogConfig/MaxFiles"),
        ),
        (
            Task,
            "lifecycle { hook = \"poststart\" }",
            Kept("TaskGroups/g/Tasks/t/Lifecycle/Hook"),
        ),
        (
            Task,
            "template {\n data = \"x\"\n destination = \"local/x\"\n }",
            Kept("TaskGroups/g/Tasks/t/Templates/0/DestPath"),
        ),
        (
            Task,
            "dispatch_payload { file = \"in\" }",
            Kept("TaskGroups/g/Tasks/t/DispatchPayload/File"),
        ),
        (
            Task,
            "csi_plugin {\n id = \"p\"\n type = \"node\"\n mount_dir = \"/csi\"\n }",
            Kept("TaskGroups/g/Tasks/t/CSIPluginConfig/ID"),
        ),
        (
            Task,
            "volume_mount {\n volume = \"v\"\n destination = \"/v\"\n }",
            Kept("TaskGroups/g/Tasks/t/VolumeMounts/0/Destination"),
        ),
        (
            Task,
            "service { name = \"ts\" }",
            Kept("TaskGroups/g/Tasks/t/Services/ts"),
        ),
        (Task, "kill_timeout = \"9s\"", Kept("TaskGroups/g/Tasks/t/KillTimeout")),
        (
            Task,
            "kill_signal = \"SIGUSR1\"",
            Kept("TaskGroups/g/Tasks/t/KillSignal"),
        ),
        (Task, "leader = true", Kept("TaskGroups/g/Tasks/t/Leader")),
        (
            Task,
            "shutdown_delay = \"3s\"",
            Kept("TaskGroups/g/Tasks/t/ShutdownDelay"),
        ),
        (
            Task,
            "artifact { source = \"https://example.com/app.tgz\" }",
            Refused("artifact"),
        ),
        (Task, "vault { policies = [\"p\"] }", Refused("vault")),
        (Task, "user = \"nobody\"", Refused("user")),
        (Task, "identity { env = true }", Refused("identity")),
        (
            Task,
            "scaling \"cpu\" {\n min = 100\n max = 500\n }",
            Refused("scaling"),
        ),
        // A group service and its check.
        (Service, "tags = [\"a\"]", Kept("TaskGroups/g/Services/walk/Tags")),
        (Service, "meta { a = \"b\" }", Kept("TaskGroups/g/Services/walk/Meta/a")),
        (
            Service,
            "connect { native = true }",
            Kept("TaskGroups/g/Services/walk/Connect"),
        ),
        (Service, "provider = \"nomad\"", Refused("provider")),
        (Check, "name = \"c\"", Kept("TaskGroups/g/Services/walk/Checks/c")),
        (Check, "task = \"t\"", Refused("task")),
        (
            Check,
            "initial_status = \"passing\"",
            Kept("TaskGroups/g/Services/walk/Checks/0/InitialStatus"),
        ),
        (
            Check,
            "grpc_service = \"health\"",
            Kept("TaskGroups/g/Services/walk/Checks/0/GRPCService"),
        ),
        (
            Check,
            "grpc_use_tls = true",
            Kept("TaskGroups/g/Services/walk/Checks/0/GRPCUseTLS"),
        ),
        (
            Check,
            "tls_skip_verify = true",
            Kept("TaskGroups/g/Services/walk/Checks/0/TLSSkipVerify"),
        ),
        (
            Check,
            "header {\n X = [\"y\"]\n }",
            Kept("TaskGroups/g/Services/walk/Checks/0/Header/X"),
        ),
        (Check, "check_restart {\n limit = 3\n }", Refused("check_restart")),
        (Check, "body = \"{}\"", Refused("body")),
    ];
    let root = tempfile::tempdir().unwrap();
    let (agent, port) = server(root.path());
    let mut problems = Vec::new();
    for (level, snippet, expect) in &table {
        let (code, answer) = post(port, "/v1/jobs/parse", &json!({"JobHCL": jobspec(*level, snippet)}));
        match expect {
            Kept(path) => {
                if code != 200 || at(&answer, path).is_none_or(Value::is_null) {
                    problems.push(format!("{snippet:?}: expected kept at {path}, got {code}: {answer}"));
                }
            }
            Refused(key) => {
                let text = answer.as_str().unwrap_or_default();
                if code != 400 || !text.contains(&format!("unsupported key \"{key}\"")) {
                    problems.push(format!(
                        "{snippet:?}: expected refused naming {key:?}, got {code}: {answer}"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    drop(agent);
}
