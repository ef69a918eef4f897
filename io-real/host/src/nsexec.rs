//! `agent nsexec`: how `alloc exec` runs a command in a running task's context without
//! forking the agent (issue 54 §7; `drover_io_real::taskexec` does the same for task starts).
//!
//! The driver spawns this helper — the agent's own binary, started with `posix_spawn`, no
//! copy of the agent's memory — with the command's environment, directory and stdio. The
//! helper joins the task's cgroups, leads a session of its own (taking the terminal it was
//! given as its controlling terminal, for a TTY session), and then:
//! - for a `raw_exec` task, `exec`s the command in place;
//! - for an `exec` task, enters the task's IPC, UTS, PID and mount namespaces and its root,
//!   opened here by path from `/proc/<pid>` and checked to be the process that started at the
//!   time the driver read (so a pid reused since is refused, never entered), and runs the
//!   command as its child — a process cannot move itself into another PID namespace, only
//!   the children it forks afterwards — exiting as the command exited.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

/// The agent's hidden subcommand.
pub const SUBCOMMAND: &str = "nsexec";

/// A running `exec` task to enter: its pid (PID 1 of its namespace, seen from the host) and
/// that process's start time (`/proc/<pid>/stat` field 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enter {
    pub pid: i32,
    pub start_time: u64,
}

/// `nsexec [--join <cgroup.procs>]... [--tty] [--enter PID START] -- <command...>`.
pub fn args(join: &[CString], tty: bool, enter: Option<Enter>, command: &[String]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![SUBCOMMAND.into()];
    for path in join {
        out.push("--join".into());
        out.push(std::ffi::OsStr::from_bytes(path.to_bytes()).to_os_string());
    }
    if tty {
        out.push("--tty".into());
    }
    if let Some(enter) = enter {
        out.push("--enter".into());
        out.push(enter.pid.to_string().into());
        out.push(enter.start_time.to_string().into());
    }
    out.push("--".into());
    out.extend(command.iter().map(OsString::from));
    out
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Setup {
    join: Vec<CString>,
    tty: bool,
    enter: Option<Enter>,
}

fn parse(args: &[OsString]) -> Result<(Setup, &[OsString]), String> {
    let split = args
        .iter()
        .position(|arg| arg == "--")
        .ok_or("no -- before the command")?;
    let (options, command) = (&args[..split], &args[split + 1..]);
    if command.is_empty() {
        return Err("no command".into());
    }
    let mut setup = Setup::default();
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let mut value = |what: &str| {
            options
                .next()
                .ok_or_else(|| format!("{} takes {what}", option.to_string_lossy()))
        };
        match option.to_str() {
            Some("--join") => {
                let path = value("a cgroup.procs path")?;
                setup
                    .join
                    .push(CString::new(path.as_bytes()).map_err(|_| format!("{path:?} holds a NUL byte"))?);
            }
            Some("--tty") => setup.tty = true,
            Some("--enter") => {
                let pid = value("PID START")?.to_str().and_then(|text| text.parse().ok());
                let start_time = value("PID START")?.to_str().and_then(|text| text.parse().ok());
                let (Some(pid), Some(start_time)) = (pid, start_time) else {
                    return Err("--enter takes PID START, two numbers".into());
                };
                if pid <= 1 {
                    return Err(format!("--enter: {pid} is not a task's pid"));
                }
                setup.enter = Some(Enter { pid, start_time });
            }
            _ => return Err(format!("unknown option {option:?}")),
        }
    }
    Ok((setup, command))
}

/// The start time of `pid` (`/proc/<pid>/stat` field 22, in clock ticks since boot).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(19)?.parse().ok()
}

fn fail(what: &str, error: std::io::Error) -> ExitCode {
    eprintln!("nsexec: {what}: {error}");
    ExitCode::from(126)
}

pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.collect();
    let (setup, command) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(error) => {
            eprintln!("nsexec: {error}");
            eprintln!("usage: agent nsexec [--join <cgroup.procs>]... [--tty] [--enter PID START] -- <command...>");
            return ExitCode::from(2);
        }
    };
    let (program, rest) = command.split_first().expect("parse checks for a command");
    if let Err(error) = drover_io_real::taskexec::join_in_child(&setup.join) {
        return fail("join the task's cgroup", error);
    }
    // SAFETY: setsid takes no arguments; the ioctl makes fd 0 (the session's terminal, when
    // it is one) the controlling terminal of the session just made.
    unsafe {
        libc::setsid();
        if setup.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return fail("take the terminal", std::io::Error::last_os_error());
        }
    }
    drover_io_real::taskexec::reset_signals();
    let Some(enter) = setup.enter else {
        let error = std::process::Command::new(program).args(rest).exec();
        eprintln!("nsexec: {}: {error}", program.to_string_lossy());
        return ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        });
    };
    if let Err(error) = enter_task(enter) {
        return fail("enter the task's namespaces and root", error);
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

/// Opens the namespaces and root of `enter.pid`, checks it is still the process that started
/// at `enter.start_time` (the descriptors then belong to it whatever happens to the pid
/// later), and enters them.
fn enter_task(enter: Enter) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let open = |what: &str| std::fs::File::open(format!("/proc/{}/{what}", enter.pid));
    let (ipc, uts, pid, mnt, root) = (
        open("ns/ipc")?,
        open("ns/uts")?,
        open("ns/pid")?,
        open("ns/mnt")?,
        open("root")?,
    );
    if start_time(enter.pid) != Some(enter.start_time) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("process {} is no longer the task", enter.pid),
        ));
    }
    // SAFETY: setns, fchdir, chroot and chdir on descriptors held open above.
    unsafe {
        for (file, kind) in [
            (&ipc, libc::CLONE_NEWIPC),
            (&uts, libc::CLONE_NEWUTS),
            (&pid, libc::CLONE_NEWPID),
            (&mnt, libc::CLONE_NEWNS),
        ] {
            if libc::setns(file.as_raw_fd(), kind) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if libc::fchdir(root.as_raw_fd()) != 0 || libc::chroot(c".".as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip_and_bad_ones_are_named() {
        let join = vec![CString::new("/sys/fs/cgroup/x/cgroup.procs").unwrap()];
        let enter = Enter {
            pid: 4242,
            start_time: 99,
        };
        let command = ["/bin/sh".to_string(), "-c".into(), "--tty".into()];
        let words = args(&join, true, Some(enter), &command);
        let (setup, parsed) = parse(&words[1..]).unwrap();
        assert_eq!(
            setup,
            Setup {
                join,
                tty: true,
                enter: Some(enter)
            }
        );
        assert_eq!(parsed, command.clone().map(OsString::from));
        let (setup, _) = parse(&args(&[], false, None, &command)[1..]).unwrap();
        assert_eq!(setup, Setup::default());
        let bad = |words: &[&str]| parse(&words.iter().map(OsString::from).collect::<Vec<_>>()).unwrap_err();
        assert_eq!(
            bad(&["--enter", "1", "5", "--", "sh"]),
            "--enter: 1 is not a task's pid"
        );
        assert_eq!(
            bad(&["--enter", "x", "5", "--", "sh"]),
            "--enter takes PID START, two numbers"
        );
        assert_eq!(bad(&["--join"]), "no -- before the command");
        assert_eq!(bad(&["--"]), "no command");
        assert_eq!(bad(&["--bogus", "--", "sh"]), "unknown option \"--bogus\"");
    }

    #[test]
    fn our_own_start_time_is_read() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
        assert_eq!(start_time(i32::MAX), None);
    }
}
