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

use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The agent's hidden subcommand.
pub const SUBCOMMAND: &str = "taskexec";

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// One mount an `exec` task's helper (or forked child) makes before it execs.
pub struct BindMount {
    pub source: CString,
    pub target: CString,
    pub readonly: bool,
    pub propagation: libc::c_ulong,
    /// A bidirectional mount's (`propagation` is `MS_SHARED`): a detached clone of the
    /// (shared) host source, opened in the host's mount namespace ([`open_detached`]: by the
    /// helper itself, or by the agent before a forked start) and attached in the task's with
    /// `move_mount`, so it stays a peer of the host source — mounts the task makes below it
    /// reach the host.
    pub detached: Option<OwnedFd>,
}

/// An `exec` task's isolation: its root and what is bound into it.
pub struct Isolation<'a> {
    pub root: &'a CStr,
    pub binds: &'a [BindMount],
}

fn bytes(text: &CStr) -> OsString {
    OsStr::from_bytes(text.to_bytes()).to_os_string()
}

/// `taskexec <cgroup.procs>... [--root ROOT [--bind SOURCE TARGET ro|rw PROPAGATION]...] --
/// <program> <args...>`.
pub fn args(join: &[CString], isolation: Option<&Isolation<'_>>, program: &str, args: &[String]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![SUBCOMMAND.into()];
    out.extend(join.iter().map(|path| bytes(path)));
    if let Some(isolation) = isolation {
        out.push("--root".into());
        out.push(bytes(isolation.root));
        for bind in isolation.binds {
            out.push("--bind".into());
            out.push(bytes(&bind.source));
            out.push(bytes(&bind.target));
            out.push(if bind.readonly { "ro" } else { "rw" }.into());
            out.push(bind.propagation.to_string().into());
        }
    }
    out.push("--".into());
    out.push(program.into());
    out.extend(args.iter().map(OsString::from));
    out
}

/// What comes before `--`: the cgroups to join, and an `exec` task's root and binds.
struct Setup {
    join: Vec<CString>,
    root: Option<CString>,
    binds: Vec<BindMount>,
}

fn parse_setup(args: &[OsString]) -> Result<Setup, String> {
    let cstring = |arg: &OsString| CString::new(arg.as_bytes()).map_err(|_| format!("{arg:?} holds a NUL byte"));
    let mut setup = Setup {
        join: Vec::new(),
        root: None,
        binds: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--root" {
            let root = args.next().ok_or("--root takes a directory")?;
            setup.root = Some(cstring(root)?);
        } else if arg == "--bind" {
            let mut next = || args.next().ok_or("--bind takes SOURCE TARGET ro|rw PROPAGATION");
            let (source, target, mode, propagation) = (next()?, next()?, next()?, next()?);
            setup.binds.push(BindMount {
                source: cstring(source)?,
                target: cstring(target)?,
                readonly: mode == "ro",
                propagation: propagation
                    .to_str()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| format!("bad propagation {propagation:?}"))?,
                detached: None,
            });
        } else {
            setup.join.push(cstring(arg)?);
        }
    }
    Ok(setup)
}

pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.collect();
    let Some(split) = args.iter().position(|arg| arg == "--") else {
        eprintln!("usage: agent taskexec <cgroup.procs>... -- <program> <args...>");
        return ExitCode::from(2);
    };
    let (setup, command) = (&args[..split], &args[split + 1..]);
    let Some((program, rest)) = command.split_first() else {
        eprintln!("usage: agent taskexec <cgroup.procs>... -- <program> <args...>");
        return ExitCode::from(2);
    };
    let setup = match parse_setup(setup) {
        Ok(setup) => setup,
        Err(error) => {
            eprintln!("taskexec: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = join_in_child(&setup.join) {
        eprintln!("taskexec: join the task's cgroup: {error}");
        return ExitCode::from(126);
    }
    // SAFETY: setsid takes no arguments; a new session so a signal to the agent's process
    // group (a terminal's Ctrl-C) does not reach the task.
    unsafe { libc::setsid() };
    reset_signals();
    let mut setup = setup;
    // Still in the host's mount namespace: the bidirectional binds' clones are taken here.
    if let Err(error) = open_detached(&mut setup.binds) {
        eprintln!("taskexec: {error}");
        return ExitCode::from(126);
    }
    if let Some(root) = &setup.root {
        // This process stays behind as the task's stand-in (see `enter_pid_namespace`); the
        // task, PID 1 of its namespace, goes on here.
        if let Err(error) = enter_pid_namespace().and_then(|()| enter_namespace(root, &setup.binds)) {
            eprintln!("taskexec: enter the task's namespaces and root: {error}");
            return ExitCode::from(126);
        }
    }
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!("taskexec: {}: {error}", Path::new(program).display());
    ExitCode::from(127)
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Opens a detached recursive clone of the source of every bidirectional bind (one whose
/// `propagation` is `MS_SHARED`, made a shared mount on the host by the driver) that has none
/// yet. Must run in the host's mount namespace, before [`enter_namespace`].
pub fn open_detached(binds: &mut [BindMount]) -> Result<(), String> {
    use std::os::fd::FromRawFd;
    for bind in binds
        .iter_mut()
        .filter(|bind| bind.propagation == libc::MS_SHARED && bind.detached.is_none())
    {
        // SAFETY: a NUL-terminated path that outlives the call; the descriptor returned is
        // owned from here on.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                bind.source.as_ptr(),
                OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(format!(
                "open_tree {}: {}",
                Path::new(OsStr::from_bytes(bind.source.to_bytes())).display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a descriptor just returned by the kernel, owned by nothing else.
        bind.detached = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    }
    Ok(())
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

/// Enters the task's own mount namespace and root: the binds, `chroot`, and its own `/proc`.
/// Runs in the helper (or the forked child) before exec: only syscalls on data prepared before.
pub fn enter_namespace(root: &CStr, binds: &[BindMount]) -> std::io::Result<()> {
    let check = |result: libc::c_int| {
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null where
    // the syscall allows it; no allocation happens here.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Receive host mounts, never send ours back.
        check(libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ))?;
        for bind in binds {
            if let Some(fd) = &bind.detached {
                // Attach the shared clone as it is: re-marking it would cut it off the host.
                let moved = libc::syscall(
                    libc::SYS_move_mount,
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    bind.target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                );
                check(if moved == 0 { 0 } else { -1 })?;
                continue;
            }
            check(libc::mount(
                bind.source.as_ptr(),
                bind.target.as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            if bind.readonly {
                check(libc::mount(
                    bind.source.as_ptr(),
                    bind.target.as_ptr(),
                    none,
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                ))?;
            }
            check(libc::mount(
                none,
                bind.target.as_ptr(),
                none,
                bind.propagation | libc::MS_REC,
                std::ptr::null(),
            ))?;
        }
        check(libc::chroot(root.as_ptr()))?;
        check(libc::chdir(c"/".as_ptr()))?;
        check(libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ))?;
    }
    Ok(())
}

/// Runs in the helper (or the forked child) of an `exec` task, before `enter_namespace`: the task gets PID,
/// IPC and UTS namespaces of its own, and is PID 1 of its PID namespace, as Nomad's `exec`
/// makes it (a signal from the agent then reaches it only if it handles that signal, as for
/// any PID 1; SIGKILL after `kill_timeout` always does).
///
/// A new PID namespace applies to the children of the caller, so this process forks once
/// more. The child (PID 1 inside) returns and goes on to exec the task. This process stays
/// in the host's namespace as the task's stand-in: the pid the driver tracks, signals as a
/// group (it ignores the polite signals; the task gets them), and waits for. It closes every
/// descriptor it inherited beyond stdio — among them the exec-error pipe of the spawning
/// `Command`, so the spawn returns when the task itself has exec'd — waits for the task, and
/// exits as the task exited. Async-signal-safe: syscalls only.
pub fn enter_pid_namespace() -> std::io::Result<()> {
    // SAFETY: unshare, fork, signal, close_range/close, waitpid, kill and _exit are
    // async-signal-safe; `status` is a local.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let task = libc::fork();
        if task < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if task == 0 {
            return Ok(());
        }
        for signal in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..4096 {
                libc::close(fd);
            }
        }
        let mut status = 0;
        loop {
            let waited = libc::waitpid(task, &mut status, 0);
            if waited == task {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = libc::WTERMSIG(status);
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
}

/// Where `program` is found as `execvp` would find it from `dir` with `path` (the task's
/// `PATH`, or the agent's when the task sets none); `None` when there is no executable file
/// of that name.
pub fn resolve(program: &str, dir: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    resolve_mapped(program, path, |candidate| dir.join(candidate))
}

/// [`resolve`] for an `exec` task, whose `/` is `root` with `binds` mounted in it: where the
/// task's `execvp` would find `program`, as a path on the host.
pub fn resolve_in_root(program: &str, root: &Path, binds: &[BindMount], path: Option<&OsStr>) -> Option<PathBuf> {
    resolve_mapped(program, path, |candidate| {
        let inside = root.join(candidate.strip_prefix("/").unwrap_or(candidate));
        binds
            .iter()
            .filter_map(|bind| {
                let target = Path::new(OsStr::from_bytes(bind.target.to_bytes()));
                let rest = inside.strip_prefix(target).ok()?;
                Some((
                    target.as_os_str().len(),
                    Path::new(OsStr::from_bytes(bind.source.to_bytes())).join(rest),
                ))
            })
            .max_by_key(|(length, _)| *length)
            .map_or(inside.clone(), |(_, host)| host)
    })
}

fn resolve_mapped(program: &str, path: Option<&OsStr>, host: impl Fn(&Path) -> PathBuf) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |candidate: &Path| {
        std::fs::metadata(candidate).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let candidate = host(Path::new(program));
        return executable(&candidate).then_some(candidate);
    }
    let path = path
        .map(OsStr::to_os_string)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|entry| host(&entry.join(program)))
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
        let args = args(&join, None, "/bin/echo", &["--".into(), "hi".into()]);
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
