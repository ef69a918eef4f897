//! `var lock`: runs a command while holding a variable's lock (Nomad 1.7's `nomad var lock`).
//!
//! The lock is acquired through `PUT /v1/var/:path?lock-acquire` (waiting while another holds
//! it), renewed at half its TTL from a thread of its own while the command runs, and released
//! once the command ends. If a renewal is refused the lock is lost: the command is stopped and
//! this one fails, so two holders never run at once for longer than a TTL. The command's exit
//! code is this one's.

use std::process::{Child, Command as Process};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::{Api, Failure, escape};

#[derive(Debug, Args)]
pub struct VarLock {
    /// How long the lock lasts unless renewed (renewed at half of it while the command runs).
    #[arg(long, default_value = "15s")]
    ttl: String,
    /// How long nobody may take the lock after it ran out unreleased.
    #[arg(long, default_value = "15s")]
    delay: String,
    /// Attempts to take a lock another holds before giving up (0: wait for as long as it
    /// takes).
    #[arg(long = "max-retry", default_value_t = 0)]
    max_retry: u32,
    /// Run the command through `sh -c` (its words joined), as Nomad's does by default.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    shell: bool,
    /// Say when the lock is taken, renewed and released.
    #[arg(long)]
    verbose: bool,
    /// The variable the lock is held on.
    path: String,
    /// The command run while the lock is held.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    child: Vec<String>,
}

fn url(path: &str, operation: &str) -> String {
    let segments: Vec<String> = path.trim_matches('/').split('/').map(escape).collect();
    format!("/v1/var/{}?{operation}", segments.join("/"))
}

fn go_duration(text: &str, flag: &str) -> Result<Duration, Failure> {
    drover_core::goduration::parse(text).map_err(|_| Failure(format!("Invalid -{flag} {text:?}"), 1))
}

pub(super) fn run(api: &Api, lock: VarLock) -> Result<(), Failure> {
    let ttl = go_duration(&lock.ttl, "ttl")?;
    go_duration(&lock.delay, "delay")?;
    let path = lock.path.trim_matches('/').to_string();
    let body = json!({"Path": path, "Lock": {"TTL": lock.ttl, "LockDelay": lock.delay}});
    let mut refused = 0;
    let lock_id = loop {
        match api.call_status("PUT", &url(&path, "lock-acquire"), Some(&body))? {
            Ok(held) => break held["Lock"]["ID"].as_str().unwrap_or_default().to_string(),
            Err((409, _)) => {
                refused += 1;
                if lock.max_retry > 0 && refused >= lock.max_retry {
                    return Err(Failure(
                        format!("Error acquiring lock: {path:?} is held by another ({refused} attempts)"),
                        1,
                    ));
                }
                // Another holds it, or its lock delay runs: look again shortly.
                std::thread::sleep(Duration::from_secs(1).min(ttl / 2));
            }
            Err((code, text)) => {
                return Err(Failure(format!("Error acquiring lock: {code} ({text})"), 1));
            }
        }
    };
    if lock_id.is_empty() {
        return Err(Failure("Error acquiring lock: the answer named no lock ID".into(), 1));
    }
    if lock.verbose {
        eprintln!("Lock acquired on {path:?}");
    }
    let held = json!({"Path": path, "Lock": {"ID": lock_id}});
    let outcome = run_holding(api, &lock, &path, &held, ttl);
    // Released whatever happened to the command (a lost lock has nothing left to release).
    if !matches!(outcome, Err(Lost)) {
        match api.call_status("PUT", &url(&path, "lock-release"), Some(&held))? {
            Ok(_) if lock.verbose => eprintln!("Lock released on {path:?}"),
            Ok(_) => {}
            Err((code, text)) => eprintln!("Error releasing the lock on {path:?}: {code} ({text})"),
        }
    }
    match outcome {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure(String::new(), code)),
        Err(Lost) => Err(Failure(format!("Lock on {path:?} lost: the command was stopped"), 1)),
    }
}

/// The lock was lost while the command ran.
struct Lost;

/// Runs the command, renewing the lock until it ends; its exit code.
fn run_holding(api: &Api, lock: &VarLock, path: &str, held: &Value, ttl: Duration) -> Result<u8, Lost> {
    let mut child = match spawn(lock) {
        Ok(child) => child,
        Err(error) => {
            eprintln!("Error starting {:?}: {error}", lock.child.join(" "));
            return Ok(1);
        }
    };
    let done = Arc::new(AtomicBool::new(false));
    let (lost_tx, lost_rx) = mpsc::channel::<()>();
    let renewer = {
        let (api, url, held, done, verbose) = (
            api.clone(),
            url(path, "lock-renew"),
            held.clone(),
            done.clone(),
            lock.verbose,
        );
        std::thread::spawn(move || {
            let mut failures = 0;
            while !done.load(Ordering::SeqCst) {
                // Slept in small steps so the thread ends promptly once the command has.
                let mut slept = Duration::ZERO;
                while slept < ttl / 2 && !done.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                    slept += Duration::from_millis(50);
                }
                if done.load(Ordering::SeqCst) {
                    return;
                }
                match api.call_status("PUT", &url, Some(&held)) {
                    Ok(Ok(_)) => {
                        failures = 0;
                        if verbose {
                            eprintln!("Lock renewed");
                        }
                    }
                    // Refused: another holds it now, or it ran out.
                    Ok(Err((409 | 404, _))) => {
                        let _ = lost_tx.send(());
                        return;
                    }
                    // The servers could not be reached: tried again until the TTL is spent.
                    Ok(Err(_)) | Err(_) => {
                        failures += 1;
                        if failures >= 2 {
                            let _ = lost_tx.send(());
                            return;
                        }
                    }
                }
            }
        })
    };
    let outcome = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Ok(exit_code(status));
        }
        if lost_rx.try_recv().is_ok() {
            stop(&mut child);
            break Err(Lost);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    done.store(true, Ordering::SeqCst);
    let _ = renewer.join();
    outcome
}

fn spawn(lock: &VarLock) -> std::io::Result<Child> {
    if lock.shell {
        Process::new("/bin/sh").arg("-c").arg(lock.child.join(" ")).spawn()
    } else {
        Process::new(&lock.child[0]).args(&lock.child[1..]).spawn()
    }
}

/// SIGTERM, then SIGKILL if it has not gone within five seconds.
fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    for _ in 0..100 {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match status.code() {
        Some(code) => u8::try_from(code).unwrap_or(1),
        None => status.signal().map_or(1, |signal| 128u8.saturating_add(signal as u8)),
    }
}
