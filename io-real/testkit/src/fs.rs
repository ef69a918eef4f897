//! Files and mounts a test leaves under its directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every file under `dir`, at any depth.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// Mount points at or below `path` (`/proc/self/mountinfo`), in the kernel's order.
pub fn mounts_under(path: &Path) -> Vec<String> {
    let prefix = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(String::from))
        .filter(|point| point.starts_with(&prefix))
        .collect()
}

/// Lazily unmounts whatever is still mounted below a directory when dropped, so a failing
/// test leaves no mount behind.
pub struct UnmountUnder(pub PathBuf);

impl Drop for UnmountUnder {
    fn drop(&mut self) {
        for point in mounts_under(&self.0).into_iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(&point).status();
        }
    }
}
