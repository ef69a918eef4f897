//! A task's log directory, opened so that nothing the task plants in it is followed.
//!
//! `alloc/logs` is shared with the tasks (an `exec` task sees it in its chroot), and the
//! collectors write there as root: a task that replaced `t.stdout.1` with a link to a host file
//! had that file created and appended on rotation, and the logs endpoint served a root-only file
//! through a link in place of `t.stderr.0` (issue 54). So the directory is opened once without
//! following a link, and every file in it is opened relative to it, never through a link
//! (`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`), and used only when it is a regular
//! file with one name: anything else in a writer's way (a link, a FIFO, a hard link to a file
//! elsewhere) is removed — the name, not what it points to — and a fresh file made in its place.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// An open log directory.
#[derive(Debug)]
pub struct LogDir(File);

impl LogDir {
    /// Opens `dir`, refusing it when it is itself a link.
    pub fn open(dir: &Path) -> io::Result<LogDir> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)?;
        Ok(LogDir(dir))
    }

    fn open_at(&self, name: &str, flags: libc::c_int) -> io::Result<File> {
        if name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a log file's name has no '/'",
            ));
        }
        let name = CString::new(name).map_err(io::Error::other)?;
        let flags = flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated name relative to our open directory.
        let fd = unsafe { libc::openat(self.0.as_raw_fd(), name.as_ptr(), flags, 0o644 as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        // Writes and reads block as on any regular file again.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let status = libc::fcntl(fd, libc::F_GETFL);
            if status >= 0 {
                libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK);
            }
        }
        Ok(file)
    }

    /// Whether `file` is a log file of ours: regular, with this one name.
    fn ours(file: &File) -> io::Result<bool> {
        let meta = file.metadata()?;
        Ok(meta.file_type().is_file() && meta.nlink() == 1)
    }

    /// `name` opened to append, created if missing; anything but a regular file of ours in
    /// its place is removed first.
    pub fn append(&self, name: &str) -> io::Result<File> {
        let flags = libc::O_WRONLY | libc::O_APPEND;
        match self.open_at(name, flags | libc::O_CREAT) {
            Ok(file) if Self::ours(&file)? => return Ok(file),
            Ok(_) => {}
            // A link (ELOOP), or a FIFO with no reader (ENXIO).
            Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {}
            Err(error) => return Err(error),
        }
        tracing::warn!(
            file = name,
            "a log file was replaced by something else; making it a file again"
        );
        self.remove(name)?;
        // Created here and now, or not at all: a task racing to plant again gets an error.
        let file = self.open_at(name, flags | libc::O_CREAT | libc::O_EXCL)?;
        Ok(file)
    }

    /// `name` opened to read, when it is a regular file of ours.
    pub fn read(&self, name: &str) -> io::Result<File> {
        let file = self.open_at(name, libc::O_RDONLY)?;
        if !Self::ours(&file)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} is not a regular log file"),
            ));
        }
        Ok(file)
    }

    /// Removes the name `name` from the directory (a link itself, never what it points to).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let name = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated name relative to our open directory.
        if unsafe { libc::unlinkat(self.0.as_raw_fd(), name.as_ptr(), 0) } < 0 {
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::NotFound {
                return Err(error);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_planted_link_is_replaced_not_followed_and_never_read_through() {
        let root = tempfile::tempdir().unwrap();
        let logs = root.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let host = root.path().join("host-file");
        std::fs::write(&host, "host secret\n").unwrap();
        std::os::unix::fs::symlink(&host, logs.join("t.stdout.1")).unwrap();
        let dir = LogDir::open(&logs).unwrap();

        assert!(dir.read("t.stdout.1").is_err(), "read through a link");
        dir.append("t.stdout.1").unwrap().write_all(b"task line\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&host).unwrap(),
            "host secret\n",
            "host file untouched"
        );
        let written = logs.join("t.stdout.1");
        assert!(std::fs::symlink_metadata(&written).unwrap().file_type().is_file());
        let mut text = String::new();
        dir.read("t.stdout.1").unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "task line\n");
    }

    #[test]
    fn a_fifo_or_a_hard_link_in_a_writers_way_is_replaced() {
        let root = tempfile::tempdir().unwrap();
        let logs = root.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        let fifo = CString::new(logs.join("t.stderr.0").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let other = root.path().join("elsewhere");
        std::fs::write(&other, "elsewhere\n").unwrap();
        std::fs::hard_link(&other, logs.join("t.stdout.0")).unwrap();
        let dir = LogDir::open(&logs).unwrap();

        assert!(dir.read("t.stderr.0").is_err(), "a FIFO is not read (nor waited on)");
        dir.append("t.stderr.0").unwrap().write_all(b"e\n").unwrap();
        dir.append("t.stdout.0").unwrap().write_all(b"o\n").unwrap();
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "elsewhere\n");
        assert_eq!(std::fs::read_to_string(logs.join("t.stderr.0")).unwrap(), "e\n");
        assert_eq!(std::fs::read_to_string(logs.join("t.stdout.0")).unwrap(), "o\n");
    }

    #[test]
    fn a_log_directory_that_is_a_link_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("host")).unwrap();
        std::os::unix::fs::symlink(root.path().join("host"), root.path().join("logs")).unwrap();
        assert!(LogDir::open(&root.path().join("logs")).is_err());
    }
}
