//! The client's file requests (`Io::Mkdir`, `Io::ReadFile`, `Io::WriteFile`/`WriteBytes`) as
//! the production executor carries them out: under the allocation root, everything is made,
//! read or written beneath the allocation directory it lies in ([`crate::confined`]), never
//! through a link one of its tasks planted; elsewhere (the agent's own directories) by name.
//!
//! Both worlds run this code: the host executor on the machine's filesystem, and the simulated
//! hosts of the `task_planted_links` scenario on a scratch directory while a hostile task swaps
//! its directories and files for links out of its allocation.

use std::path::{Path, PathBuf};

use drover_core::client::{ErrorKind, IoError};

/// The allocation directory `path` lies in and `path` relative to it; a path elsewhere (the
/// agent's own directories) as its parent and its name.
fn placed(alloc_root: &Path, path: &str) -> Result<(PathBuf, PathBuf), IoError> {
    let path = Path::new(path);
    if let Some(placed) = crate::confined::within(alloc_root, path) {
        return Ok(placed);
    }
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent.to_path_buf(), PathBuf::from(name))),
        _ => Err(IoError::other(format!("no file name in {}", path.display()))),
    }
}

/// Makes `path` and its parents (mode 0700). Below an allocation directory, each is made
/// beneath it: a link on the way that leads out is refused.
pub fn mkdir(alloc_root: &Path, path: &str) -> Result<(), IoError> {
    let mut builder = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.recursive(true);
    let made = match crate::confined::within(alloc_root, Path::new(path)) {
        // The allocation directory is the agent's own; what is below it, the tasks'.
        Some((root, relative)) => builder
            .create(&root)
            .and_then(|()| crate::confined::Beneath::open(&root))
            .and_then(|beneath| beneath.create_dir_all(&relative, 0o700)),
        None => builder.create(path),
    };
    made.map_err(|error| fs_error(&format!("mkdir {path}"), error))
}

/// A small file's text; `None` when there is none.
pub fn read(alloc_root: &Path, path: &str) -> Result<Option<String>, IoError> {
    let read = placed(alloc_root, path).and_then(|(root, relative)| {
        crate::confined::Beneath::open(&root)
            .and_then(|beneath| beneath.read_to_string(&relative))
            .map_err(|error| fs_error(&format!("read {path}"), error))
    });
    match read {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind == ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Writes `content` to `path` (a temporary file renamed over it), confined to its allocation
/// directory when it lies in one.
pub fn write(alloc_root: &Path, path: &str, content: &[u8], mode: u32) -> Result<(), IoError> {
    let (root, relative) = placed(alloc_root, path)?;
    crate::confined::Beneath::open(&root)
        .and_then(|beneath| beneath.write_atomically(&relative, content, mode))
        .map_err(|error| fs_error(&format!("write {path}"), error))
}

/// A failed file operation as the core sees it: missing, refused because a link leads out of
/// the allocation directory (the directory is not as it must be), or otherwise failed.
pub fn fs_error(context: &str, error: std::io::Error) -> IoError {
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        _ if crate::confined::is_escape(&error) => ErrorKind::FailedPrecondition,
        _ => ErrorKind::Other,
    };
    IoError::new(kind, format!("{context}: {error}"))
}
