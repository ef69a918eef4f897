//! The `mock` driver: a task that "runs" for a scripted time and exits with a scripted code,
//! or fails to start, without any process. Used by tests and the simulation.
//!
//! `config { run_for = "5s"  exit_code = 1  start_error = "boom"  start_delay = "1s" }`;
//! `run_for` absent means it runs until stopped. It answers to `mock` and, as Nomad's test
//! driver is named, to `mock_driver` (Nomad's own test jobs say `driver = "mock_driver"`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover_core::client::{
    DriverCapabilities, ErrorKind, ExitResult, IoError, MountConfigSupport, TaskConfig, TaskHandle,
};
use drover_core::structs::ConfigValue;
use tokio::sync::watch;

use super::{DriverFingerprint, TaskDriver};
use crate::io::BoxFuture;

type Key = (String, String);

#[derive(Clone)]
pub struct MockDriver {
    name: &'static str,
    tasks: Arc<Mutex<BTreeMap<Key, watch::Sender<Option<ExitResult>>>>>,
}

impl Default for MockDriver {
    fn default() -> Self {
        MockDriver::named("mock")
    }
}

impl MockDriver {
    /// The names this driver answers to.
    pub const NAMES: [&'static str; 2] = ["mock", "mock_driver"];

    /// The driver under `name` (each name has its own tasks, as each handle names its driver).
    pub fn named(name: &'static str) -> Self {
        MockDriver {
            name,
            tasks: Arc::default(),
        }
    }
}

/// Go-style durations (`250ms`, `5s`, `2m`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    drover_core::goduration::parse(text.trim()).ok()
}

fn duration(config: &BTreeMap<String, ConfigValue>, key: &str) -> Result<Option<Duration>, IoError> {
    match config.get(key) {
        None => Ok(None),
        Some(value) => value
            .as_str()
            .and_then(parse_duration)
            .map(Some)
            .ok_or_else(|| IoError::other(format!("mock driver: {key} must be a duration like \"5s\""))),
    }
}

impl TaskDriver for MockDriver {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> DriverCapabilities {
        DriverCapabilities {
            mount_configs: MountConfigSupport::None,
            fs_isolation: false,
        }
    }

    fn fingerprint(&self) -> DriverFingerprint {
        DriverFingerprint {
            detected: true,
            healthy: true,
            health_description: "Healthy".into(),
            attributes: BTreeMap::from([(format!("driver.{}", self.name), "1".to_string())]),
            update_time_ms: 0,
        }
    }

    fn start(&self, config: TaskConfig) -> BoxFuture<Result<TaskHandle, IoError>> {
        let tasks = self.tasks.clone();
        let name = self.name;
        Box::pin(async move {
            if let Some(delay) = duration(&config.config, "start_delay")? {
                tokio::time::sleep(delay).await;
            }
            if let Some(error) = config.config.get("start_error").and_then(ConfigValue::as_str) {
                return Err(IoError::other(error.to_string()));
            }
            let run_for = duration(&config.config, "run_for")?;
            let exit_code = config
                .config
                .get("exit_code")
                .and_then(ConfigValue::as_int)
                .unwrap_or(0) as i32;
            let (sender, _) = watch::channel(None);
            let key = (config.alloc_id.clone(), config.task.clone());
            tasks.lock().unwrap().insert(key, sender.clone());
            if let Some(run_for) = run_for {
                tokio::spawn(async move {
                    tokio::time::sleep(run_for).await;
                    sender.send_if_modified(|exit| {
                        if exit.is_none() {
                            *exit = Some(ExitResult {
                                exit_code,
                                ..ExitResult::default()
                            });
                            true
                        } else {
                            false
                        }
                    });
                });
            }
            Ok(TaskHandle {
                driver: name.into(),
                alloc_id: config.alloc_id,
                task: config.task,
                state: String::new(),
            })
        })
    }

    fn wait(&self, handle: TaskHandle) -> BoxFuture<ExitResult> {
        let receiver = self
            .tasks
            .lock()
            .unwrap()
            .get(&(handle.alloc_id, handle.task))
            .map(watch::Sender::subscribe);
        Box::pin(async move {
            let Some(mut receiver) = receiver else {
                return ExitResult {
                    err: Some("unknown task".into()),
                    ..ExitResult::default()
                };
            };
            loop {
                if let Some(exit) = receiver.borrow().clone() {
                    return exit;
                }
                if receiver.changed().await.is_err() {
                    return ExitResult {
                        err: Some("driver gone".into()),
                        ..ExitResult::default()
                    };
                }
            }
        })
    }

    fn stop(&self, handle: TaskHandle, _kill_timeout: Duration, _signal: i32) -> BoxFuture<Result<(), IoError>> {
        let sender = self.tasks.lock().unwrap().get(&(handle.alloc_id, handle.task)).cloned();
        Box::pin(async move {
            if let Some(sender) = sender {
                sender.send_if_modified(|exit| {
                    if exit.is_none() {
                        *exit = Some(ExitResult {
                            exit_code: 130,
                            signal: 2,
                            ..ExitResult::default()
                        });
                        true
                    } else {
                        false
                    }
                });
            }
            Ok(())
        })
    }

    /// A mock task has no process to signal; the signal is taken as delivered.
    fn signal(&self, _handle: &TaskHandle, _signal: i32) -> Result<(), IoError> {
        Ok(())
    }

    /// A mock task is no process: nothing of it can be left behind.
    fn destroy(&self, _handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        Box::pin(async { Ok(()) })
    }

    fn recover(&self, handle: TaskHandle) -> BoxFuture<Result<(), IoError>> {
        let known = self.tasks.lock().unwrap().contains_key(&(handle.alloc_id, handle.task));
        Box::pin(async move {
            if known {
                Ok(())
            } else {
                Err(IoError::new(
                    ErrorKind::NotFound,
                    "mock task does not survive a restart",
                ))
            }
        })
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> TaskConfig {
        TaskConfig {
            alloc_id: "a1".into(),
            task: "t".into(),
            driver: "mock".into(),
            config: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ConfigValue::String(v.to_string())))
                .collect(),
            env: BTreeMap::new(),
            mounts: Vec::new(),
            devices: Vec::new(),
            task_dir: "/t".into(),
            log_dir: "/l".into(),
            kill_timeout: Duration::from_secs(1),
            cpu_mhz: 100,
            memory_mb: 300,
            memory_max_mb: 0,
            logs: Default::default(),
            node_cpu_mhz: 4_000,
            node_cores: 2,
            reserved_cores: Vec::new(),
            network: None,
        }
    }

    #[tokio::test]
    async fn scripted_exit_and_stop() {
        let driver = MockDriver::default();
        let handle = driver
            .start(config(&[("run_for", "20ms"), ("exit_code", "3")]))
            .await
            .unwrap();
        assert_eq!(driver.wait(handle).await.exit_code, 3);
        let handle = driver.start(config(&[])).await.unwrap();
        driver
            .stop(handle.clone(), Duration::from_secs(1), libc::SIGINT)
            .await
            .unwrap();
        assert_eq!(driver.wait(handle).await.signal, 2);
        let error = driver.start(config(&[("start_error", "boom")])).await.unwrap_err();
        assert_eq!(error.message, "boom");
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert!(driver.start(config(&[("run_for", "soon")])).await.is_err());
    }
}
