//! `alloc exec` through the Engine's exec API: the command is created and started in the
//! task's container, attached to its streams (stdout and stderr apart, or one terminal with
//! `tty`), resized with the session's terminal, and its exit code read once its output ends.
//! A session given up kills the command by its host pid (the Engine has no call for it).

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use drover_core::client::IoError;
use drover_io_real::drivers::{ExecControl, ExecLaunch, ExecOutput, ExecStreams};
use drover_io_real::io::BoxFuture;
use futures::StreamExt;

use crate::engine;

/// How long an exit code may take to show after the output ended.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Creates `command` in `container` and starts it attached.
pub(crate) async fn launch(
    docker: Docker,
    container: &str,
    command: Vec<String>,
    tty: bool,
) -> Result<ExecLaunch, IoError> {
    let options = CreateExecOptions {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(tty),
        cmd: Some(command),
        ..CreateExecOptions::default()
    };
    let created = docker
        .create_exec(container, options)
        .await
        .map_err(|error| engine::io_error("Failed to create exec", &error))?;
    let start = StartExecOptions {
        detach: false,
        tty,
        output_capacity: None,
    };
    let started = docker
        .start_exec(&created.id, Some(start))
        .await
        .map_err(|error| engine::io_error("Failed to start exec", &error))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(IoError::other("the Engine started the exec detached"));
    };
    let output = output
        .take_while(|piece| std::future::ready(piece.is_ok()))
        .filter_map(|piece| {
            std::future::ready(match piece {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                    Some(ExecOutput::Stdout(message.to_vec()))
                }
                Ok(LogOutput::StdErr { message }) => Some(ExecOutput::Stderr(message.to_vec())),
                Ok(LogOutput::StdIn { .. }) | Err(_) => None,
            })
        })
        .boxed();
    Ok(ExecLaunch::Streams(ExecStreams {
        input,
        output,
        control: std::sync::Arc::new(EngineExec { docker, id: created.id }),
    }))
}

struct EngineExec {
    docker: Docker,
    id: String,
}

impl ExecControl for EngineExec {
    fn resize(&self, width: u16, height: u16) -> BoxFuture<()> {
        let (docker, id) = (self.docker.clone(), self.id.clone());
        Box::pin(async move {
            if let Err(error) = docker.resize_exec(&id, ResizeExecOptions { height, width }).await {
                tracing::debug!(exec = %id, %error, "resizing an exec's terminal failed");
            }
        })
    }

    fn exit_code(&self) -> BoxFuture<i32> {
        let (docker, id) = (self.docker.clone(), self.id.clone());
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + EXIT_WAIT;
            loop {
                match docker.inspect_exec(&id).await {
                    Ok(inspect) if inspect.running != Some(true) => {
                        return inspect.exit_code.map_or(-1, |code| code as i32);
                    }
                    Ok(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(_) => return -1,
                    Err(error) => {
                        tracing::debug!(exec = %id, %error, "reading an exec's exit code failed");
                        return -1;
                    }
                }
            }
        })
    }

    fn kill(&self) -> BoxFuture<()> {
        let (docker, id) = (self.docker.clone(), self.id.clone());
        Box::pin(async move {
            let Ok(inspect) = docker.inspect_exec(&id).await else {
                return;
            };
            if inspect.running == Some(true)
                && let Some(pid) = inspect.pid.filter(|pid| *pid > 0)
            {
                // SAFETY: a plain kill(2) of the exec's process, by the pid the Engine gave.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        })
    }
}
