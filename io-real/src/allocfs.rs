//! An allocation's directory as the operator reads it (`/v1/client/fs/ls|stat|cat|readat|
//! stream`): every path is taken relative to the allocation dir (a leading `/` is its root, as
//! in Nomad), and one that leads out of it — `..`, or a symlink pointing elsewhere — is
//! refused before anything is read.
//!
//! Reads are bounded steps ([`MAX_READ`] at most), carried like log reads to the client that
//! runs the allocation (`service::relay`).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use drover_core::error::{AllocCallError, AllocCallFailure};
use serde::{Deserialize, Serialize};

/// The most one read returns.
pub const MAX_READ: u64 = 256 * 1024;
/// The error text of a path that leads out of the allocation dir (an HTTP 400).
pub const ESCAPES: &str = "Path escapes the alloc directory";
/// The start of the error text of a path that does not exist (an HTTP 404).
pub const NOT_FOUND: &str = "no such file or directory";

fn escapes() -> AllocCallError {
    AllocCallError::invalid(ESCAPES)
}

fn not_found(what: impl std::fmt::Display) -> AllocCallError {
    AllocCallError::new(AllocCallFailure::NoSuchFile, format!("{NOT_FOUND}: {what}"))
}

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
pub fn confine(root: &Path, path: &str) -> Result<PathBuf, AllocCallError> {
    let inside = root.join(relative(path)?);
    let root = root.canonicalize().map_err(not_found)?;
    let resolved = inside.canonicalize().map_err(|_| not_found(path))?;
    if !resolved.starts_with(&root) {
        return Err(escapes());
    }
    Ok(resolved)
}

/// `path` as a path relative to the allocation dir, or [`ESCAPES`] when it names `..`.
fn relative(path: &str) -> Result<PathBuf, AllocCallError> {
    let mut inside = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => inside.push(part),
            Component::ParentDir | Component::Prefix(_) => return Err(escapes()),
        }
    }
    Ok(inside)
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

/// `path` (already [`confine`]d: no `..`) opened beneath `root` in one step, by the kernel
/// (`openat2` with `RESOLVE_BENEATH`): a link is followed only while it stays inside, whatever a
/// task swaps in between our check and the open (issue 54: a task swapping a directory for a
/// link got 1-3 % of reads answered with the host file when the checked path was re-opened by
/// name). Never blocks on a FIFO.
fn open_beneath(root: &Path, path: &str) -> Result<std::fs::File, AllocCallError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let root_dir = std::fs::File::open(root).map_err(not_found)?;
    let relative = relative(path)?;
    let relative = if relative.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        relative
    };
    let relative =
        std::ffi::CString::new(relative.into_os_string().into_encoded_bytes()).map_err(|_| not_found(path))?;
    // SAFETY: open_how is plain data; all-zero is its default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a NUL-terminated path relative to an open directory, and a valid open_how.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root_dir.as_raw_fd(),
            relative.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => escapes(),
            _ => not_found(path),
        });
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as libc::c_int) })
}

/// Carries out `request` in the allocation dir `root`.
pub fn serve(root: &Path, request: &FsRequest) -> Result<FsReply, AllocCallError> {
    let path = confine(root, &request.path)?;
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    // What is served is what this descriptor holds, never the path opened again.
    let opened = open_beneath(root, &request.path)?;
    let meta = opened.metadata().map_err(not_found)?;
    match &request.op {
        FsOp::Stat => Ok(FsReply::Stat(info(name, &meta))),
        FsOp::List => {
            if !meta.is_dir() {
                return Ok(FsReply::List(vec![info(name, &meta)]));
            }
            // The directory the descriptor holds, by its /proc name (not the path again).
            use std::os::fd::AsRawFd;
            let held = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
            let mut entries: Vec<FileInfo> = std::fs::read_dir(&held)
                .map_err(|error| AllocCallError::failed(error.to_string()))?
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
                return Err(AllocCallError::invalid(format!("{:?} is a directory", request.path)));
            }
            if !meta.is_file() {
                return Err(AllocCallError::failed(format!(
                    "{:?} is not a regular file",
                    request.path
                )));
            }
            let mut file = opened;
            file.seek(SeekFrom::Start(*offset))
                .map_err(|error| AllocCallError::failed(error.to_string()))?;
            let mut data = Vec::new();
            file.take((*limit).min(MAX_READ))
                .read_to_end(&mut data)
                .map_err(|error| AllocCallError::failed(error.to_string()))?;
            Ok(FsReply::Data { data, size: meta.len() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 54: a task swapping a directory for a link to a host directory, over and over,
    /// while files in it are read: not one read may be answered from the host.
    #[test]
    fn a_directory_swapped_for_a_link_while_reading_never_leaks_the_host_file() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("f"), "secret").unwrap();
        let root = tempfile::tempdir().unwrap();
        let alloc = root.path().join("alloc");
        std::fs::create_dir_all(&alloc).unwrap();
        std::os::unix::fs::symlink(outside.path(), alloc.join("link")).unwrap();
        std::fs::create_dir(alloc.join("d")).unwrap();
        std::fs::write(alloc.join("d/f"), "inside").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (alloc, stop) = (alloc.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // d is a directory, then a link out, then a directory again.
                    let _ = std::fs::rename(alloc.join("d"), alloc.join("real"));
                    let _ = std::fs::rename(alloc.join("link"), alloc.join("d"));
                    let _ = std::fs::rename(alloc.join("d"), alloc.join("link"));
                    let _ = std::fs::rename(alloc.join("real"), alloc.join("d"));
                    // A moment with the directory in place, so reads also land there.
                    std::thread::yield_now();
                }
            })
        };
        // Reads go on until 100 found the directory in place (on a loaded machine the swapper
        // can hold every one of 5,000 reads off it), at most 100,000.
        let (mut answered, mut tries) = (0, 0);
        while tries < 5_000 || (answered < 100 && tries < 100_000) {
            tries += 1;
            let reply = serve(
                root.path(),
                &FsRequest {
                    alloc_id: "a".into(),
                    path: "/alloc/d/f".into(),
                    op: FsOp::Read { offset: 0, limit: 64 },
                },
            );
            if let Ok(FsReply::Data { data, .. }) = reply {
                assert_eq!(data, b"inside", "read from the host");
                answered += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(answered > 0, "some reads found the directory in place");
    }

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
            assert_eq!(read(escape), Err(AllocCallError::invalid(ESCAPES)), "{escape}");
        }
        assert_eq!(read("/alloc/nope").unwrap_err().kind, AllocCallFailure::NoSuchFile);
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
