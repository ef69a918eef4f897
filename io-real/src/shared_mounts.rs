//! Shared mounts for bidirectional binds: a plugin task's mounts (a CSI node plugin's
//! publishing) reach the host only through a bind whose source is a shared mount. Most hosts
//! share `/` (systemd does), but not all: the source is then bound onto itself and made
//! shared, as kubelet does for its own directory, and that self-bind undone once the task is
//! gone. Used by the `exec` driver and by the `docker` driver (whose Engine refuses an
//! `rshared` bind of a path "mounted on / but not a shared mount").

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use drover_core::client::IoError;

/// `path` as the C string a syscall takes; a NUL inside it is an error.
pub fn cstring(path: &Path) -> Result<CString, IoError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| IoError::other(format!("path {} contains NUL", path.display())))
}

/// Makes `source` a shared mount on the host (bound onto itself first when it is not a mount
/// point), for a bidirectional bind to clone; returns whether the self-bind was ours.
pub fn make_shared(source: &Path) -> Result<bool, IoError> {
    let path = cstring(source)?;
    let none = std::ptr::null::<libc::c_char>();
    let fail = |what: &str| {
        IoError::other(format!(
            "{what} {}: {}",
            source.display(),
            std::io::Error::last_os_error()
        ))
    };
    let ours = !is_mount_point(source);
    // SAFETY: NUL-terminated paths that outlive the calls; null where the syscalls allow it.
    unsafe {
        if ours
            && libc::mount(
                path.as_ptr(),
                path.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) != 0
        {
            return Err(fail("bind"));
        }
        if libc::mount(none, path.as_ptr(), none, libc::MS_SHARED, std::ptr::null()) != 0 {
            return Err(fail("make shared"));
        }
    }
    Ok(ours)
}

/// Whether `path` is a mount point, from the kernel's own table.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(path) = path.canonicalize() else {
        return false;
    };
    let path = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .any(|point| point == path)
}

/// Undoes the self-binds [`make_shared`] made, once their task is gone — unless something is
/// still mounted below (a staged volume outlives its plugin task), in which case the shared
/// mount stays for the next plugin task to reuse.
pub fn release_shared(sources: &[String]) {
    for source in sources {
        let Ok(path) = CString::new(source.as_bytes()) else {
            continue;
        };
        // SAFETY: a NUL-terminated path; plain umount fails with EBUSY when mounts remain.
        unsafe {
            libc::umount2(path.as_ptr(), 0);
        }
    }
}
