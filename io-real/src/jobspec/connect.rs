//! The HCL of a group service's `connect {}` block and a task's `lifecycle {}` block, as
//! Nomad's documentation writes them.

use std::collections::BTreeMap;

use crate::jobs::{
    ApiConsulConnect, ApiConsulProxy, ApiConsulUpstream, ApiLifecycle, ApiSidecarService, ApiSidecarTask,
};
use serde_json::Value;

use super::{Object, Walker, parse_resources};

/// `connect { native  sidecar_service { port tags proxy {} }  sidecar_task {} }`.
pub(super) fn parse_connect(walker: &mut Walker, at: &str, block: &Object) -> ApiConsulConnect {
    walker.known(at, block, &["native", "sidecar_service", "sidecar_task"]);
    let sidecar_service = walker.single(at, block, "sidecar_service").map(|sidecar| {
        let at = format!("{at} sidecar_service");
        walker.known(&at, sidecar, &["port", "tags", "proxy"]);
        ApiSidecarService {
            port: walker.string(&at, sidecar, "port").unwrap_or_default(),
            tags: walker.strings(&at, sidecar, "tags").unwrap_or_default(),
            proxy: walker
                .single(&at, sidecar, "proxy")
                .map(|proxy| parse_proxy(walker, &format!("{at} proxy"), proxy)),
        }
    });
    let sidecar_task = walker
        .single(at, block, "sidecar_task")
        .map(|task| parse_sidecar_task(walker, &format!("{at} sidecar_task"), task));
    ApiConsulConnect {
        native: walker.boolean(at, block, "native").unwrap_or(false),
        sidecar_service,
        sidecar_task,
    }
}

/// `proxy { local_service_address local_service_port upstreams {} config {} }`.
fn parse_proxy(walker: &mut Walker, at: &str, block: &Object) -> ApiConsulProxy {
    walker.known(
        at,
        block,
        &["local_service_address", "local_service_port", "upstreams", "config"],
    );
    let upstreams = walker
        .repeated(at, block, "upstreams")
        .into_iter()
        .map(|upstream| {
            let at = format!("{at} upstreams");
            walker.known(&at, upstream, &["destination_name", "local_bind_port", "datacenter"]);
            ApiConsulUpstream {
                destination_name: walker.string(&at, upstream, "destination_name").unwrap_or_default(),
                local_bind_port: port(walker, &at, upstream, "local_bind_port"),
                datacenter: walker.string(&at, upstream, "datacenter").unwrap_or_default(),
            }
        })
        .collect();
    ApiConsulProxy {
        local_service_address: walker.string(at, block, "local_service_address").unwrap_or_default(),
        local_service_port: port(walker, at, block, "local_service_port"),
        upstreams,
        config: free_form(walker, at, block, "config"),
    }
}

/// `sidecar_task { name driver user config {} env {} resources {} meta {} kill_timeout }`.
fn parse_sidecar_task(walker: &mut Walker, at: &str, block: &Object) -> ApiSidecarTask {
    walker.known(
        at,
        block,
        &[
            "name",
            "driver",
            "user",
            "config",
            "env",
            "resources",
            "meta",
            "kill_timeout",
        ],
    );
    ApiSidecarTask {
        name: walker.string(at, block, "name").unwrap_or_default(),
        driver: walker.string(at, block, "driver").unwrap_or_default(),
        user: walker.string(at, block, "user").unwrap_or_default(),
        config: free_form(walker, at, block, "config"),
        env: walker.string_map(at, block, "env"),
        resources: walker
            .single(at, block, "resources")
            .map(|resources| parse_resources(walker, &format!("{at} resources"), resources)),
        meta: walker.string_map(at, block, "meta"),
        kill_timeout: walker.duration(at, block, "kill_timeout"),
    }
}

/// `lifecycle { hook sidecar }`.
pub(super) fn parse_lifecycle(walker: &mut Walker, at: &str, block: &Object) -> ApiLifecycle {
    walker.known(at, block, &["hook", "sidecar"]);
    ApiLifecycle {
        hook: walker.string(at, block, "hook").unwrap_or_default(),
        sidecar: walker.boolean(at, block, "sidecar").unwrap_or(false),
    }
}

/// A port number (0 when absent), named where it is when out of range.
fn port(walker: &mut Walker, at: &str, block: &Object, key: &str) -> u16 {
    let Some(value) = walker.integer(at, block, key) else {
        return 0;
    };
    u16::try_from(value).unwrap_or_else(|_| {
        walker.problem(at, format!("{key} must be a port number (0 to 65535), not {value}"));
        0
    })
}

/// A block taken as it is (driver or proxy `config {}`).
fn free_form(walker: &mut Walker, at: &str, block: &Object, key: &str) -> BTreeMap<String, Value> {
    walker
        .single(at, block, key)
        .map(|config| config.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use drover_core::connect::{ConsulUpstream, proxied_service};
    use drover_core::structs::ConfigValue;

    use super::super::parse;

    /// Nomad's countdash example, in host mode with a `raw_exec` proxy.
    const COUNTDASH: &str = r#"
job "countdash" {
  datacenters = ["dc1"]
  group "api" {
    network {
      port "http" {}
    }
    service {
      name = "count-api"
      port = "http"
      connect {
        sidecar_service {
          tags = ["proxy"]
          proxy {
            upstreams {
              destination_name = "count-db"
              local_bind_port  = 8080
            }
            config {
              protocol = "http"
            }
          }
        }
        sidecar_task {
          driver = "raw_exec"
          config {
            command = "/usr/bin/envoy"
            args    = ["-c", "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json"]
          }
          resources {
            cpu    = 100
            memory = 64
          }
          kill_timeout = "2s"
        }
      }
    }
    task "web" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["300"]
      }
      lifecycle {
        hook    = "poststart"
        sidecar = false
      }
    }
  }
}
"#;

    #[test]
    fn a_connect_group_service_parses_and_is_mutated_as_nomads_is() {
        let mut job = parse(COUNTDASH).unwrap().to_job().unwrap();
        let service = &job.task_groups[0].services[0];
        assert_eq!(service.name, "count-api");
        let connect = service.connect.as_ref().unwrap();
        let sidecar = connect.sidecar_service.as_ref().unwrap();
        assert_eq!(sidecar.tags, ["proxy"]);
        let proxy = sidecar.proxy.as_ref().unwrap();
        assert_eq!(
            proxy.upstreams,
            [ConsulUpstream {
                destination_name: "count-db".into(),
                local_bind_port: 8080,
                datacenter: String::new(),
            }]
        );
        assert_eq!(proxy.config["protocol"], ConfigValue::String("http".into()));
        assert_eq!(
            job.task_groups[0].tasks[0].lifecycle.as_ref().unwrap().hook,
            "poststart"
        );

        drover_core::connect::mutate(&mut job).unwrap();
        assert_eq!(drover_core::jobspec::validate(&job), Vec::<String>::new());
        let group = &job.task_groups[0];
        let sidecar_task = group.tasks.iter().find(|task| proxied_service(task).is_some()).unwrap();
        assert_eq!(sidecar_task.name, "connect-proxy-count-api");
        assert_eq!(sidecar_task.driver, "raw_exec");
        assert_eq!(
            sidecar_task.config["command"],
            ConfigValue::String("/usr/bin/envoy".into())
        );
        assert_eq!(sidecar_task.kill_timeout.as_secs(), 2);
        assert!(
            group.networks[0]
                .ports()
                .any(|port| port.label == "connect-proxy-count-api")
        );

        // What the API returns shows the injected task, and reads back the same.
        let api = crate::jobs::ApiJob::from_job(&job, "pending");
        let json = serde_json::to_value(&api).unwrap();
        let tasks = json["TaskGroups"][0]["Tasks"].as_array().unwrap();
        assert_eq!(tasks[1]["Kind"], "connect-proxy:count-api");
        assert_eq!(tasks[1]["Lifecycle"]["Hook"], "prestart");
        assert_eq!(tasks[1]["Lifecycle"]["Sidecar"], true);
        let connect = &json["TaskGroups"][0]["Services"][0]["Connect"];
        assert_eq!(
            connect["SidecarService"]["Proxy"]["Upstreams"][0]["DestinationName"],
            "count-db"
        );
        let back: crate::jobs::ApiJob = serde_json::from_value(json).unwrap();
        assert_eq!(back.to_job().unwrap(), job);
    }

    #[test]
    fn connect_blocks_name_what_is_wrong_where() {
        let bad = parse(
            r#"
job "web" {
  group "g" {
    service {
      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "db"
              local_bind_port  = 70000
              port             = 1
            }
          }
        }
        gateway {}
      }
    }
    task "t" {
      driver = "raw_exec"
      lifecycle {
        hook = "prestart"
        when = "now"
      }
    }
  }
}
"#,
        );
        assert_eq!(
            bad.unwrap_err(),
            [
                "job \"web\" group \"g\" task \"t\" lifecycle: unsupported key \"when\"",
                "job \"web\" group \"g\" service connect: unsupported key \"gateway\"",
                "job \"web\" group \"g\" service connect sidecar_service proxy upstreams: unsupported key \"port\"",
                "job \"web\" group \"g\" service connect sidecar_service proxy upstreams: local_bind_port must be a port number (0 to 65535), not 70000",
            ]
        );
    }
}
