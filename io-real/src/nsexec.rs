//! `agent nsexec`: how `alloc exec` gets into an `exec` task's namespaces. A process cannot
//! move itself into another PID namespace, only the children it forks afterwards; so the
//! driver starts this helper with descriptors of the task's namespaces and root, and it
//! enters the IPC, UTS, PID and mount namespaces, changes root to the task's, then runs the
//! command as its child — a process of the task's PID namespace that sees only the task's
//! processes — and exits with the command's code. Its environment and stdio are the
//! command's.

use std::ffi::OsString;
use std::process::ExitCode;

/// The agent's hidden subcommand.
pub const SUBCOMMAND: &str = "nsexec";

/// `nsexec <ipc> <uts> <pid> <mnt> <root> <command...>`, each a descriptor number.
pub fn args(fds: [i32; 5], command: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![SUBCOMMAND.into()];
    args.extend(fds.iter().map(|fd| OsString::from(fd.to_string())));
    args.extend(command.iter().map(OsString::from));
    args
}

fn fail(what: &str) -> ExitCode {
    eprintln!("nsexec: {what}: {}", std::io::Error::last_os_error());
    ExitCode::from(126)
}

pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.collect();
    let fds: Vec<i32> = args
        .iter()
        .take(5)
        .filter_map(|arg| arg.to_str()?.parse().ok())
        .collect();
    let ([ipc, uts, pid, mnt, root], Some((program, rest))) = (
        <[i32; 5]>::try_from(fds).unwrap_or([-1; 5]),
        args.get(5..).and_then(|command| command.split_first()),
    ) else {
        eprintln!("usage: agent nsexec <ipc> <uts> <pid> <mnt> <root> <command...>");
        return ExitCode::from(2);
    };
    if ipc < 0 {
        eprintln!("usage: agent nsexec <ipc> <uts> <pid> <mnt> <root> <command...>");
        return ExitCode::from(2);
    }
    // SAFETY: setns, fchdir, chroot and chdir on descriptors this process inherited.
    unsafe {
        for (fd, kind, what) in [
            (ipc, libc::CLONE_NEWIPC, "enter the task's IPC namespace"),
            (uts, libc::CLONE_NEWUTS, "enter the task's UTS namespace"),
            (pid, libc::CLONE_NEWPID, "enter the task's PID namespace"),
            (mnt, libc::CLONE_NEWNS, "enter the task's mount namespace"),
        ] {
            if libc::setns(fd, kind) != 0 {
                return fail(what);
            }
        }
        if libc::fchdir(root) != 0 || libc::chroot(c".".as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
            return fail("enter the task's root");
        }
        for fd in [ipc, uts, pid, mnt, root] {
            libc::close(fd);
        }
    }
    match std::process::Command::new(program).args(rest).status() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Err(error) => {
            eprintln!("nsexec: {}: {error}", program.to_string_lossy());
            ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            })
        }
    }
}
