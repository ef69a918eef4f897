//! The process drivers of a production client: `raw_exec` and `exec` run real child processes
//! (each in a cgroup of its own where the host has cgroup v2); [`builtin`] is the set a client
//! starts with.

use std::sync::Arc;

use drover_io_real::drivers::{Drivers, mock};

pub mod cgroup;
pub mod process;

/// The built-in drivers of a production client; `raw_exec` only fingerprints as detected
/// when the operator enabled it (`plugin "raw_exec" { config { enabled = true } }`), mock
/// only when enabled too. With `logmon` (the agent binary), task output is rotated by log
/// collectors run from it.
pub fn builtin(raw_exec_enabled: bool, mock_enabled: bool, logmon: Option<std::path::PathBuf>) -> Drivers {
    let with_logmon = |driver: process::ProcessDriver| match &logmon {
        Some(agent) => driver.with_logmon(agent.clone()),
        None => driver,
    };
    let raw_exec = with_logmon(process::ProcessDriver::raw_exec());
    let raw_exec = if raw_exec_enabled {
        raw_exec
    } else {
        raw_exec.disabled()
    };
    let drivers = Drivers::default()
        .with(Arc::new(raw_exec))
        .with(Arc::new(with_logmon(process::ProcessDriver::exec())));
    // The scripted driver only where a client asked for it (Nomad has it in test builds).
    if mock_enabled {
        mock::MockDriver::NAMES.into_iter().fold(drivers, |drivers, name| {
            drivers.with(Arc::new(mock::MockDriver::named(name)))
        })
    } else {
        drivers
    }
}

#[cfg(test)]
mod tests {
    use super::builtin;

    #[test]
    fn the_mock_driver_exists_only_when_enabled() {
        assert!(builtin(true, false, None).get("mock").is_none());
        assert!(builtin(true, true, None).get("mock").is_some());
        assert!(builtin(true, true, None).get("mock_driver").is_some());
        assert!(builtin(false, false, None).get("exec").is_some());
    }
}
