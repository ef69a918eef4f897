//! An allocation's directory as the operator reads it (`/v1/client/fs/ls|stat|cat|readat|
//! stream`): every path is taken relative to the allocation dir (a leading `/` is its root, as
//! in Nomad), and one that leads out of it — `..`, or a symlink pointing elsewhere — is
//! refused before anything is read.
//!
//! Reads are bounded steps ([`MAX_READ`] at most), carried like log reads to the client that
//! runs the allocation (`service::relay`).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most one read returns.
pub const MAX_READ: u64 = 256 * 1024;
/// The error text of a path that leads out of the allocation dir (an HTTP 400).
pub const ESCAPES: &str = "Path escapes the alloc directory";
/// The start of the error text of a path that does not exist (an HTTP 404).
pub const NOT_FOUND: &str = "no such file or directory";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsOp {
    List,
    Stat,
    /// At most `limit` bytes (capped at [`MAX_READ`]) from `offset`.
    Read {
        offset: u64,
        limit: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRequest {
    pub alloc_id: String,
    pub path: String,
    pub op: FsOp,
}

/// Nomad's `AllocFileInfo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub name: String,
    pub is_dir: bool,
    pub size: u64,
    pub file_mode: String,
    /// Unix milliseconds.
    pub mod_time_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsReply {
    List(Vec<FileInfo>),
    Stat(FileInfo),
    /// The bytes read and the file's size then.
    Data {
        #[serde(with = "crate::logstream::base64_bytes")]
        data: Vec<u8>,
        size: u64,
    },
}

/// `path` inside `root`, or [`ESCAPES`]: no `..`, and nothing that resolves (through
/// symlinks) outside `root`.
pub fn confine(root: &Path, path: &str) -> Result<PathBuf, String> {
    let mut inside = root.to_path_buf();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => inside.push(part),
            Component::ParentDir | Component::Prefix(_) => return Err(ESCAPES.into()),
        }
    }
    let root = root.canonicalize().map_err(|error| format!("{NOT_FOUND}: {error}"))?;
    let resolved = inside.canonicalize().map_err(|_| format!("{NOT_FOUND}: {path}"))?;
    if !resolved.starts_with(&root) {
        return Err(ESCAPES.into());
    }
    Ok(resolved)
}

/// Unix permission bits as Go's `FileMode.String` prints them (`-rw-r--r--`, `drwxr-xr-x`).
fn mode_string(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode();
    let mut text = String::from(if meta.is_dir() { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

fn info(name: String, meta: &std::fs::Metadata) -> FileInfo {
    let modified = meta
        .modified()
        .ok()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_millis() as u64);
    FileInfo {
        name,
        is_dir: meta.is_dir(),
        size: meta.len(),
        file_mode: mode_string(meta),
        mod_time_ms: modified,
    }
}

/// Carries out `request` in the allocation dir `root`.
pub fn serve(root: &Path, request: &FsRequest) -> Result<FsReply, String> {
    let path = confine(root, &request.path)?;
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let meta = std::fs::metadata(&path).map_err(|error| format!("{NOT_FOUND}: {error}"))?;
    match &request.op {
        FsOp::Stat => Ok(FsReply::Stat(info(name, &meta))),
        FsOp::List => {
            if !meta.is_dir() {
                return Ok(FsReply::List(vec![info(name, &meta)]));
            }
            let mut entries: Vec<FileInfo> = std::fs::read_dir(&path)
                .map_err(|error| error.to_string())?
                .flatten()
                .filter_map(|entry| {
                    let meta = entry.metadata().ok()?;
                    Some(info(entry.file_name().to_string_lossy().into_owned(), &meta))
                })
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(FsReply::List(entries))
        }
        FsOp::Read { offset, limit } => {
            if meta.is_dir() {
                return Err(format!("{:?} is a directory", request.path));
            }
            let mut file = std::fs::File::open(&path).map_err(|error| error.to_string())?;
            file.seek(SeekFrom::Start(*offset)).map_err(|error| error.to_string())?;
            let mut data = Vec::new();
            file.take((*limit).min(MAX_READ))
                .read_to_end(&mut data)
                .map_err(|error| error.to_string())?;
            Ok(FsReply::Data { data, size: meta.len() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_allocation_dir() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "no").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("alloc/logs")).unwrap();
        std::fs::write(root.path().join("alloc/logs/t.stdout.0"), "hello\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("alloc/out")).unwrap();
        std::os::unix::fs::symlink("logs/t.stdout.0", root.path().join("alloc/in")).unwrap();
        let read = |path: &str| {
            serve(
                root.path(),
                &FsRequest {
                    alloc_id: "a".into(),
                    path: path.into(),
                    op: FsOp::Read { offset: 1, limit: 3 },
                },
            )
        };
        assert_eq!(
            read("/alloc/logs/t.stdout.0"),
            Ok(FsReply::Data {
                data: b"ell".to_vec(),
                size: 6
            })
        );
        assert!(read("alloc/in").is_ok(), "a symlink that stays inside is followed");
        for escape in ["../secret", "/alloc/../../secret", "alloc/out", "/alloc/logs/../../.."] {
            assert_eq!(read(escape), Err(ESCAPES.to_string()), "{escape}");
        }
        assert!(read("/alloc/nope").unwrap_err().starts_with(NOT_FOUND));
        let listed = serve(
            root.path(),
            &FsRequest {
                alloc_id: "a".into(),
                path: "/".into(),
                op: FsOp::List,
            },
        )
        .unwrap();
        let FsReply::List(entries) = listed else { panic!() };
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].name.as_str(), entries[0].is_dir), ("alloc", true));
        assert!(entries[0].file_mode.starts_with('d'));
    }
}
