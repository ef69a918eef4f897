//! A container's output into the task's rotated log files (`<task>.stdout.N`,
//! `<task>.stderr.N`), as a process task's collectors write them, so `alloc logs`, `-f` and the
//! fs API read a container task as any other.
//!
//! The Engine keeps the container's output itself, so a client restarted after a crash picks
//! the stream up again from where its files stop: from the second of the newest file's last
//! write. Lines written in that second may appear twice; none is lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use drover_core::structs::LogConfig;
use futures::StreamExt;

use super::engine::{Engine, Output};
use crate::logmon::{Rotator, indexes};

/// Follows the container's output from `since` (Unix seconds; 0: all) until it exits.
pub async fn follow(engine: Arc<dyn Engine>, id: String, dir: PathBuf, task: String, logs: LogConfig, mut since: i64) {
    let size = u64::from(logs.max_file_size_mb) * 1024 * 1024;
    let open = |stream: &str| Rotator::open(&dir, &format!("{task}.{stream}"), logs.max_files, size);
    let (mut stdout, mut stderr) = match (open("stdout"), open("stderr")) {
        (Ok(stdout), Ok(stderr)) => (stdout, stderr),
        (Err(error), _) | (_, Err(error)) => {
            tracing::warn!(container = %id, dir = %dir.display(), %error, "cannot open the task's log files");
            return;
        }
    };
    loop {
        let mut output = engine.logs(&id, since);
        while let Some(chunk) = output.next().await {
            let written = match chunk {
                Ok(Output::Stdout(message)) => stdout.write(&message),
                Ok(Output::Stderr(message)) => stderr.write(&message),
                Err(error) => {
                    tracing::debug!(container = %id, %error, "the container's output stream ended");
                    break;
                }
            };
            if let Err(error) = written {
                tracing::warn!(container = %id, %error, "cannot write the task's output");
            }
        }
        // The stream ends when the container exits, or when the daemon went away under it:
        // then follow again from now on while the container still runs.
        match engine.inspect(&id).await {
            Ok(state) if state.running => {
                since = resume_from(&dir, &task);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(_) => return,
            Err(error) if error.is_not_found() => return,
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The second the task's newest log files were last written in (0 when there are none).
pub fn resume_from(dir: &Path, task: &str) -> i64 {
    ["stdout", "stderr"]
        .iter()
        .filter_map(|stream| {
            let base = format!("{task}.{stream}");
            let newest = indexes(dir, &base).last().copied()?;
            // The name, never what a link there points to.
            let modified = std::fs::symlink_metadata(dir.join(format!("{base}.{newest}")))
                .ok()?
                .modified()
                .ok()?;
            Some(modified.duration_since(UNIX_EPOCH).ok()?.as_secs() as i64)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_resumes_from_the_second_of_the_last_write() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resume_from(dir.path(), "web"), 0);
        std::fs::write(dir.path().join("web.stdout.0"), "one\n").unwrap();
        std::fs::write(dir.path().join("web.stdout.1"), "two\n").unwrap();
        let written = std::fs::metadata(dir.path().join("web.stdout.1"))
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert_eq!(resume_from(dir.path(), "web"), written);
    }
}
