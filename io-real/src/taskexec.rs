//! `agent taskexec`: how a `raw_exec` task starts without forking the agent (issue 54 §7).
//!
//! A `Command` with a `pre_exec` closure is started with `fork`, which copies the page
//! tables of the whole agent: 20 % of an agent's CPU under mixed load went to
//! `copy_page_range`, with an RSS of about 1 GB, and each task start (two log collectors and
//! the task) forked it three times. Without a closure the standard library starts a process
//! with `posix_spawn` (`clone(CLONE_VM | CLONE_VFORK)`: no copy at all). So the driver starts
//! this small helper — the agent's own binary — that way, with the task's stdio, directory
//! and environment; the helper does what the closure did (join the task's cgroups, a
//! session of its own, default signal handling) and `exec`s the task in place: the pid the
//! driver tracks, its start time and its exit are the task's. Nomad's executor plays the
//! same part, but stays resident; this one is gone once the task runs.
//!
//! The driver resolves the command before it starts the helper, so a command that does not
//! exist still fails the start with its name, as before; one that fails to `exec` anyway (a
//! race, a bad binary) exits 127 with the reason on the task's stderr, as a shell does.
//!
//! The steps themselves ([`join_in_child`], [`reset_signals`]) live here, plain libc calls
//! compiled in both worlds, and are shared with the drivers' forked starts (`exec` tasks,
//! `alloc exec`) that still run them between `fork` and `exec`.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The agent's hidden subcommand.
pub const SUBCOMMAND: &str = "taskexec";

/// `taskexec <cgroup.procs>... -- <program> <args...>`.
pub fn args(join: &[CString], program: &str, args: &[String]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![SUBCOMMAND.into()];
    out.extend(
        join.iter()
            .map(|path| OsStr::from_bytes(path.as_bytes()).to_os_string()),
    );
    out.push("--".into());
    out.push(program.into());
    out.extend(args.iter().map(OsString::from));
    out
}

pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.collect();
    let Some(split) = args.iter().position(|arg| arg == "--") else {
        eprintln!("usage: agent taskexec <cgroup.procs>... -- <program> <args...>");
        return ExitCode::from(2);
    };
    let (join, command) = (&args[..split], &args[split + 1..]);
    let Some((program, rest)) = command.split_first() else {
        eprintln!("usage: agent taskexec <cgroup.procs>... -- <program> <args...>");
        return ExitCode::from(2);
    };
    let join: Vec<CString> = join
        .iter()
        .filter_map(|path| CString::new(path.as_bytes()).ok())
        .collect();
    if let Err(error) = join_in_child(&join) {
        eprintln!("taskexec: join the task's cgroup: {error}");
        return ExitCode::from(126);
    }
    // SAFETY: setsid takes no arguments; a new session so a signal to the agent's process
    // group (a terminal's Ctrl-C) does not reach the task.
    unsafe { libc::setsid() };
    reset_signals();
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!("taskexec: {}: {error}", Path::new(program).display());
    ExitCode::from(127)
}

/// Moves the calling process into the cgroups of `paths` (their `cgroup.procs`). Only
/// async-signal-safe calls: for the child between `fork` and `exec`.
pub fn join_in_child(paths: &[CString]) -> std::io::Result<()> {
    for path in paths {
        // SAFETY: the path is a valid C string made before the fork; the buffer is static.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Gives the task default signal handling whatever the agent inherited: an agent started in
/// the background of a non-interactive shell ignores SIGINT, and ignored signals survive exec,
/// so the task would never hear the polite half of a stop. Async-signal-safe.
pub fn reset_signals() {
    // SAFETY: signal and sigprocmask are async-signal-safe and take no pointers we own
    // beyond a local, zeroed set.
    unsafe {
        for signal in 1..32 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// Where `program` is found as `execvp` would find it from `dir` with `path` (the task's
/// `PATH`, or the agent's when the task sets none); `None` when there is no executable file
/// of that name.
pub fn resolve(program: &str, dir: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |candidate: &Path| {
        std::fs::metadata(candidate).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let candidate = dir.join(program);
        return executable(&candidate).then_some(candidate);
    }
    let path = path
        .map(OsStr::to_os_string)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|entry| dir.join(entry).join(program))
        .find(|candidate| executable(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_resolve_as_execvp_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let tool = bin.join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::write(bin.join("data"), "not executable").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = bin.as_os_str();
        assert_eq!(resolve("tool", Path::new("/"), Some(path)), Some(tool.clone()));
        assert_eq!(resolve("bin/tool", dir.path(), None), Some(tool.clone()));
        assert_eq!(resolve(tool.to_str().unwrap(), Path::new("/"), None), Some(tool));
        assert_eq!(resolve("data", Path::new("/"), Some(path)), None, "not executable");
        assert_eq!(resolve("missing", Path::new("/"), Some(path)), None);
        assert_eq!(resolve("/nonexistent/bin", Path::new("/"), None), None);
        assert!(resolve("sh", Path::new("/"), None).is_some(), "the agent's PATH");
    }

    #[test]
    fn arguments_carry_the_cgroups_and_the_command() {
        let join = vec![CString::new("/sys/fs/cgroup/x/cgroup.procs").unwrap()];
        let args = args(&join, "/bin/echo", &["--".into(), "hi".into()]);
        assert_eq!(
            args,
            [
                "taskexec",
                "/sys/fs/cgroup/x/cgroup.procs",
                "--",
                "/bin/echo",
                "--",
                "hi"
            ]
            .map(OsString::from)
        );
    }
}
