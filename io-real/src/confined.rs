//! Files the agent makes, writes and reads inside an allocation directory on a task's behalf
//! (templates, the secrets dir's token and Envoy bootstrap, a dispatch payload, the task dirs),
//! never through a link the task planted.
//!
//! A task owns its directories: it can replace `local` with a link to `/etc`, or put a link to
//! a host file where the agent's temporary file is about to be made. The agent writes as root,
//! so a path checked by name and opened again would write wherever the task pointed it (issue
//! 54). Here the allocation directory is opened once, and every directory below it is resolved
//! by the kernel in one step (`openat2` with `RESOLVE_BENEATH`): a link is followed only while
//! it stays inside the allocation directory. A file is written into a fresh temporary name
//! (`O_CREAT | O_EXCL`, which never follows a link) and renamed over its destination within the
//! directory just opened, which replaces a planted link rather than writing through it.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Component, Path, PathBuf};

/// A path that leads out of the allocation directory: the error's own type, so callers tell
/// it apart by [`is_escape`], never by its text.
#[derive(Debug)]
pub struct Escapes(pub PathBuf);

impl std::fmt::Display for Escapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: path escapes the allocation directory", self.0.display())
    }
}

impl std::error::Error for Escapes {}

fn escapes(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Escapes(path.to_path_buf()))
}

/// Whether `error` is a path leading out of the allocation directory.
pub fn is_escape(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|inner| inner.is::<Escapes>())
}

/// Where `path` lies when it lies inside an allocation directory under `alloc_root` (the
/// client's `<data_dir>/alloc`): that allocation's directory and the path relative to it.
/// `None` for paths elsewhere, and for the allocation directory itself.
pub fn within(alloc_root: &Path, path: &Path) -> Option<(PathBuf, PathBuf)> {
    let rest = path.strip_prefix(alloc_root).ok()?;
    let mut components = rest.components();
    let Some(Component::Normal(alloc)) = components.next() else {
        return None;
    };
    let relative = components.as_path();
    if relative.as_os_str().is_empty() {
        return None;
    }
    Some((alloc_root.join(alloc), relative.to_path_buf()))
}

/// `path` relative to the allocation directory, `..` taken lexically (a task dir's `..` is
/// the allocation directory); refused when it would leave it.
pub fn normalize(path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                if !out.pop() {
                    return Err(escapes(path));
                }
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds a NUL byte"))
}

/// An allocation directory, open.
#[derive(Debug)]
pub struct Beneath {
    root: File,
}

impl Beneath {
    /// Opens the allocation directory `root` (the agent made it; the path to it is the
    /// operator's data dir).
    pub fn open(root: &Path) -> io::Result<Beneath> {
        use std::os::unix::fs::OpenOptionsExt;
        let root = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(root)?;
        Ok(Beneath { root })
    }

    /// `relative` (already [`normalize`]d) opened beneath the root by the kernel in one step.
    fn open_at(&self, relative: &Path, flags: libc::c_int) -> io::Result<File> {
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let name = c_path(relative)?;
        // SAFETY: open_how is plain data; all-zero is its default.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: a NUL-terminated path relative to our open directory, and a valid open_how.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root.as_raw_fd(),
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EXDEV | libc::ELOOP) => escapes(relative),
                _ => error,
            });
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd as libc::c_int) };
        // Reads and writes block as on any regular file again.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let status = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
            if status >= 0 {
                libc::fcntl(file.as_raw_fd(), libc::F_SETFL, status & !libc::O_NONBLOCK);
            }
        }
        Ok(file)
    }

    /// The directory `relative` opened, each missing directory on the way made with `mode`.
    fn dir(&self, relative: &Path, mode: u32) -> io::Result<File> {
        let mut at = self.open_at(Path::new(""), libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut walked = PathBuf::new();
        for component in relative.components() {
            let Component::Normal(name) = component else {
                return Err(escapes(relative));
            };
            walked.push(name);
            match self.open_at(&walked, libc::O_RDONLY | libc::O_DIRECTORY) {
                Ok(next) => at = next,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    let name = c_path(Path::new(name))?;
                    // SAFETY: a NUL-terminated single name relative to a directory we hold.
                    if unsafe { libc::mkdirat(at.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) } < 0 {
                        let error = io::Error::last_os_error();
                        if error.kind() != io::ErrorKind::AlreadyExists {
                            return Err(error);
                        }
                    }
                    // Opened again through the root, so whatever now holds the name is
                    // resolved beneath it like the rest.
                    at = self.open_at(&walked, libc::O_RDONLY | libc::O_DIRECTORY)?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(at)
    }

    /// Makes `relative` and every directory above it (`mkdir -p`) with `mode`.
    pub fn create_dir_all(&self, relative: &Path, mode: u32) -> io::Result<()> {
        self.dir(&normalize(relative)?, mode).map(drop)
    }

    /// Writes `content` to `relative` with `mode`, replacing whatever held the name (a file,
    /// or a link, never what a link points to); a task never sees half a file.
    pub fn write_atomically(&self, relative: &Path, content: &[u8], mode: u32) -> io::Result<()> {
        let relative = normalize(relative)?;
        let Some(name) = relative.file_name() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file name to write"));
        };
        let parent = self.dir(relative.parent().unwrap_or(Path::new("")), 0o755)?;
        let temporary = c_path(Path::new(&format!(".{}.drover-tmp", name.to_string_lossy())))?;
        let destination = c_path(Path::new(name))?;
        // A temporary name left by a crash, or planted: the name goes, not what it points to.
        // SAFETY: a NUL-terminated single name relative to a directory we hold.
        unsafe { libc::unlinkat(parent.as_raw_fd(), temporary.as_ptr(), 0) };
        // SAFETY: as above; O_EXCL with O_CREAT fails on any existing name, a link included.
        let fd = unsafe {
            libc::openat(
                parent.as_raw_fd(),
                temporary.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let mut file = unsafe { File::from_raw_fd(fd) };
        let written = file
            .write_all(content)
            // The umask may have taken bits the mode asks for.
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(mode))
            })
            .and_then(|()| {
                // SAFETY: both names are NUL-terminated and relative to the directory we hold.
                if unsafe {
                    libc::renameat(
                        parent.as_raw_fd(),
                        temporary.as_ptr(),
                        parent.as_raw_fd(),
                        destination.as_ptr(),
                    )
                } < 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        if written.is_err() {
            // SAFETY: as above.
            unsafe { libc::unlinkat(parent.as_raw_fd(), temporary.as_ptr(), 0) };
        }
        written
    }

    /// The text of the regular file `relative`, read beneath the root.
    pub fn read_to_string(&self, relative: &Path) -> io::Result<String> {
        let relative = normalize(relative)?;
        let mut file = self.open_at(&relative, libc::O_RDONLY)?;
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", relative.display()),
            ));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn alloc_dir() -> (tempfile::TempDir, tempfile::TempDir) {
        let alloc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(alloc.path().join("web/local")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        (alloc, outside)
    }

    #[test]
    fn a_file_is_written_with_its_mode_and_directories_are_made() {
        let (alloc, _) = alloc_dir();
        let beneath = Beneath::open(alloc.path()).unwrap();
        beneath
            .write_atomically(Path::new("web/local/conf/app.ini"), b"a=1\n", 0o640)
            .unwrap();
        let written = alloc.path().join("web/local/conf/app.ini");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "a=1\n");
        assert_eq!(std::fs::metadata(&written).unwrap().permissions().mode() & 0o777, 0o640);
        assert_eq!(
            beneath.read_to_string(Path::new("web/local/conf/app.ini")).unwrap(),
            "a=1\n"
        );
        // A link that stays inside is followed, as any path the task wrote.
        symlink("../alloc-shared", alloc.path().join("web/shared")).unwrap();
        std::fs::create_dir(alloc.path().join("alloc-shared")).unwrap();
        beneath
            .write_atomically(Path::new("web/shared/x"), b"in", 0o644)
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(alloc.path().join("alloc-shared/x")).unwrap(),
            "in"
        );
    }

    /// Issue 54: a task that replaced its `local` dir with a link to a host directory had the
    /// agent write templates (as root) into that directory.
    #[test]
    fn a_directory_replaced_by_a_link_out_is_never_written_through() {
        let (alloc, outside) = alloc_dir();
        std::fs::remove_dir(alloc.path().join("web/local")).unwrap();
        symlink(outside.path(), alloc.path().join("web/local")).unwrap();
        let beneath = Beneath::open(alloc.path()).unwrap();
        let error = beneath
            .write_atomically(Path::new("web/local/app.ini"), b"x", 0o644)
            .unwrap_err();
        assert!(is_escape(&error), "{error}");
        let error = beneath.create_dir_all(Path::new("web/local/sub"), 0o755).unwrap_err();
        assert!(is_escape(&error), "{error}");
        let error = beneath.read_to_string(Path::new("web/local/f")).unwrap_err();
        assert!(is_escape(&error), "{error}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // `..` past the allocation directory is refused before anything is opened.
        let error = beneath
            .write_atomically(Path::new("web/../../x"), b"x", 0o644)
            .unwrap_err();
        assert!(is_escape(&error), "{error}");
    }

    /// Issue 54: a link planted at the temporary name (or at the destination) is replaced, and
    /// the host file it points to is left as it was.
    #[test]
    fn links_planted_at_the_file_names_are_replaced_not_followed() {
        let (alloc, outside) = alloc_dir();
        let host_file = outside.path().join("passwd");
        std::fs::write(&host_file, "root:x:0:0\n").unwrap();
        symlink(&host_file, alloc.path().join("web/local/.app.ini.drover-tmp")).unwrap();
        symlink(&host_file, alloc.path().join("web/local/app.ini")).unwrap();
        let beneath = Beneath::open(alloc.path()).unwrap();
        beneath
            .write_atomically(Path::new("web/local/app.ini"), b"mine", 0o600)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "root:x:0:0\n");
        let written = alloc.path().join("web/local/app.ini");
        assert!(std::fs::symlink_metadata(&written).unwrap().is_file());
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "mine");
        assert!(!alloc.path().join("web/local/.app.ini.drover-tmp").exists());
    }

    #[test]
    fn paths_are_placed_in_their_allocation_directory() {
        let root = Path::new("/data/alloc");
        assert_eq!(
            within(root, Path::new("/data/alloc/a1/web/secrets/si_token")),
            Some((PathBuf::from("/data/alloc/a1"), PathBuf::from("web/secrets/si_token")))
        );
        assert_eq!(within(root, Path::new("/data/alloc/a1")), None);
        assert_eq!(within(root, Path::new("/data/client/csi/x")), None);
        assert_eq!(
            normalize(Path::new("/web/../alloc/x")).unwrap(),
            PathBuf::from("alloc/x")
        );
        assert!(normalize(Path::new("../x")).is_err());
    }
}
