//! The `alloc exec` sessions of a host's client: each command its driver set up in a task's
//! context, started and then stepped through (input, resize, read, cancel) as
//! `drover_io_real::exec` describes; sessions nobody reads for [`IDLE`] are killed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

use drover_io_real::drivers::{ExecControl, ExecLaunch, ExecOutput, ExecStreams};
use drover_io_real::exec::{ExecReply, ExecRequest};

/// A session nobody read for this long is killed (its websocket went away).
pub const IDLE: Duration = Duration::from_secs(60);
/// How long a read waits for output.
const READ_WAIT: Duration = Duration::from_secs(1);
/// The most one read returns of each stream.
const READ_MAX: usize = 256 * 1024;
/// Output held per stream before the command's writes are held back.
const BUFFERED: usize = 16;

struct Session {
    input: Option<mpsc::Sender<Option<Vec<u8>>>>,
    stdout: mpsc::Receiver<Vec<u8>>,
    stderr: Option<mpsc::Receiver<Vec<u8>>>,
    exit: Arc<Mutex<Option<i32>>>,
    exited: Arc<Notify>,
    pgid: i32,
    pty: Option<i32>,
    /// A command its driver started (the Docker Engine's exec): resized and killed there.
    control: Option<Arc<dyn ExecControl>>,
    last_read: tokio::time::Instant,
}

/// A client's exec sessions.
#[derive(Clone, Default)]
pub struct ExecSessions {
    sessions: Arc<tokio::sync::Mutex<BTreeMap<u64, Session>>>,
    next: Arc<Mutex<u64>>,
}

impl std::fmt::Debug for ExecSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecSessions")
    }
}

fn pump(mut from: impl AsyncRead + Unpin + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    if sender.send(buffer[..read].to_vec()).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    receiver
}

/// Everything waiting in `receiver` now, up to [`READ_MAX`]; `None` once it closed.
fn take(receiver: &mut mpsc::Receiver<Vec<u8>>, into: &mut Vec<u8>) -> bool {
    while into.len() < READ_MAX {
        match receiver.try_recv() {
            Ok(chunk) => into.extend(chunk),
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
    true
}

impl ExecSessions {
    /// Starts a session: the process its driver set up, or the command its driver started.
    pub async fn start(&self, launch: ExecLaunch, tty: bool) -> Result<u64, String> {
        let session = match launch {
            ExecLaunch::Process(command) => Self::spawn(command, tty)?,
            ExecLaunch::Streams(streams) => Self::attach(streams),
        };
        Ok(self.keep(session).await)
    }

    /// A command its driver started: input written to it, output split by stream (one
    /// terminal's all goes to stdout), and its exit code asked for once the output ended.
    fn attach(streams: ExecStreams) -> Session {
        let ExecStreams {
            mut input,
            mut output,
            control,
        } = streams;
        let (input_sender, mut inputs) = mpsc::channel::<Option<Vec<u8>>>(BUFFERED);
        tokio::spawn(async move {
            while let Some(message) = inputs.recv().await {
                let written = match message {
                    Some(data) => input.write_all(&data).await,
                    // Input closed: the command reads end of file.
                    None => input.shutdown().await,
                };
                if written.is_err() {
                    return;
                }
            }
        });
        let (stdout_sender, stdout) = mpsc::channel(BUFFERED);
        let (stderr_sender, stderr) = mpsc::channel(BUFFERED);
        let exit = Arc::new(Mutex::new(None));
        let exited = Arc::new(Notify::new());
        {
            let (exit, exited, control) = (exit.clone(), exited.clone(), control.clone());
            tokio::spawn(async move {
                use futures::StreamExt;
                while let Some(piece) = output.next().await {
                    let sent = match piece {
                        ExecOutput::Stdout(data) => stdout_sender.send(data).await,
                        ExecOutput::Stderr(data) => stderr_sender.send(data).await,
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                drop((stdout_sender, stderr_sender));
                *exit.lock().unwrap() = Some(control.exit_code().await);
                exited.notify_waiters();
            });
        }
        Session {
            input: Some(input_sender),
            stdout,
            stderr: Some(stderr),
            exit,
            exited,
            pgid: 0,
            pty: None,
            control: Some(control),
            last_read: tokio::time::Instant::now(),
        }
    }

    /// Spawns `command`, already set up by its driver in the task's context and to lead a
    /// session of its own (so it can be killed whole), taking the terminal when `tty`.
    fn spawn(command: std::process::Command, tty: bool) -> Result<Session, String> {
        let mut command = tokio::process::Command::from(command);
        let pty = if tty { Some(open_pty()?) } else { None };
        match pty {
            Some((_, slave)) => {
                // SAFETY: dup'd descriptors become the child's stdio; closed here after spawn.
                let io =
                    |fd: i32| unsafe { std::process::Stdio::from(std::os::fd::OwnedFd::from_raw_fd(libc::dup(fd))) };
                // The driver's command takes it as its controlling terminal.
                command.stdin(io(slave)).stdout(io(slave)).stderr(io(slave));
            }
            None => {
                command
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
            }
        }
        command.kill_on_drop(false);
        let mut child = command
            .spawn()
            .map_err(|error| format!("failed to start the command: {error}"))?;
        let pgid = child.id().map_or(0, |pid| pid as i32);
        let (input_sender, mut input) = mpsc::channel::<Option<Vec<u8>>>(BUFFERED);
        let (stdout, stderr, pty_master) = match pty {
            Some((master, slave)) => {
                // SAFETY: the slave was only needed by the child.
                unsafe { libc::close(slave) };
                // SAFETY: dup'd so reading and writing own a descriptor each.
                let reader = tokio::fs::File::from_std(unsafe { std::fs::File::from_raw_fd(libc::dup(master)) });
                let mut writer = tokio::fs::File::from_std(unsafe { std::fs::File::from_raw_fd(libc::dup(master)) });
                tokio::spawn(async move {
                    while let Some(Some(data)) = input.recv().await {
                        if writer.write_all(&data).await.is_err() {
                            return;
                        }
                    }
                });
                (pump(reader), None, Some(master))
            }
            None => {
                let mut stdin = child.stdin.take();
                tokio::spawn(async move {
                    while let Some(message) = input.recv().await {
                        match (message, stdin.as_mut()) {
                            (Some(data), Some(pipe)) => {
                                if pipe.write_all(&data).await.is_err() {
                                    return;
                                }
                            }
                            // Input closed: the command reads end of file.
                            _ => {
                                stdin = None;
                            }
                        }
                    }
                });
                let stdout = pump(child.stdout.take().expect("piped"));
                let stderr = pump(child.stderr.take().expect("piped"));
                (stdout, Some(stderr), None)
            }
        };
        let exit = Arc::new(Mutex::new(None));
        let exited = Arc::new(Notify::new());
        {
            let (exit, exited) = (exit.clone(), exited.clone());
            tokio::spawn(async move {
                let status = child.wait().await;
                let code = status.map_or(-1, |status| {
                    use std::os::unix::process::ExitStatusExt;
                    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
                });
                *exit.lock().unwrap() = Some(code);
                exited.notify_waiters();
            });
        }
        Ok(Session {
            input: Some(input_sender),
            stdout,
            stderr,
            exit,
            exited,
            pgid,
            pty: pty_master,
            control: None,
            last_read: tokio::time::Instant::now(),
        })
    }

    /// Numbers `entry` and keeps it, with its watchdog.
    async fn keep(&self, entry: Session) -> u64 {
        let session = {
            let mut next = self.next.lock().unwrap();
            *next += 1;
            *next
        };
        self.sessions.lock().await.insert(session, entry);
        // Its watchdog: a session nobody reads for [`IDLE`] (the websocket went away, or
        // never came) is killed and dropped.
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(IDLE / 4).await;
                let mut sessions = sessions.lock().await;
                let Some(entry) = sessions.get(&session) else { return };
                if entry.last_read.elapsed() > IDLE {
                    let entry = sessions.remove(&session).expect("present");
                    end(&entry);
                    return;
                }
            }
        });
        session
    }

    /// Carries out one step of an existing session.
    pub async fn step(&self, request: ExecRequest) -> Result<ExecReply, String> {
        let gone = |session: u64| format!("exec session {session} not found");
        match request {
            ExecRequest::Start { .. } => Err("a start is handled by the client".into()),
            ExecRequest::Input {
                session, data, close, ..
            } => {
                let sender = {
                    let mut sessions = self.sessions.lock().await;
                    let entry = sessions.get_mut(&session).ok_or_else(|| gone(session))?;
                    if close { entry.input.take() } else { entry.input.clone() }
                };
                if let Some(sender) = sender {
                    if !data.is_empty() {
                        let _ = sender.send(Some(data)).await;
                    }
                    if close {
                        let _ = sender.send(None).await;
                    }
                }
                Ok(ExecReply {
                    session,
                    ..ExecReply::default()
                })
            }
            ExecRequest::Resize {
                session, width, height, ..
            } => {
                let control = {
                    let sessions = self.sessions.lock().await;
                    let entry = sessions.get(&session).ok_or_else(|| gone(session))?;
                    if let Some(master) = entry.pty {
                        let size = libc::winsize {
                            ws_row: height,
                            ws_col: width,
                            ws_xpixel: 0,
                            ws_ypixel: 0,
                        };
                        // SAFETY: the master descriptor is open while the session is.
                        unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &size) };
                    }
                    entry.control.clone()
                };
                if let Some(control) = control {
                    control.resize(width, height).await;
                }
                Ok(ExecReply {
                    session,
                    ..ExecReply::default()
                })
            }
            ExecRequest::Read { session, .. } => self.read(session).await,
            ExecRequest::Cancel { session, .. } => {
                if let Some(entry) = self.sessions.lock().await.remove(&session) {
                    end(&entry);
                }
                Ok(ExecReply {
                    session,
                    ..ExecReply::default()
                })
            }
        }
    }

    async fn read(&self, session: u64) -> Result<ExecReply, String> {
        let deadline = tokio::time::Instant::now() + READ_WAIT;
        loop {
            let (exited, notified) = {
                let mut sessions = self.sessions.lock().await;
                let entry = sessions
                    .get_mut(&session)
                    .ok_or_else(|| format!("exec session {session} not found"))?;
                entry.last_read = tokio::time::Instant::now();
                let mut reply = ExecReply {
                    session,
                    ..ExecReply::default()
                };
                let out_open = take(&mut entry.stdout, &mut reply.stdout);
                let err_open = match &mut entry.stderr {
                    Some(stderr) => take(stderr, &mut reply.stderr),
                    None => false,
                };
                let exit = *entry.exit.lock().unwrap();
                // Done once it exited and both streams are drained and closed (a PTY's
                // reader only ends when every holder of the terminal is gone).
                if let Some(code) = exit
                    && !out_open
                    && !err_open
                    && reply.stdout.is_empty()
                    && reply.stderr.is_empty()
                {
                    let entry = sessions.remove(&session).expect("present");
                    end(&entry);
                    reply.exit = Some(code);
                    return Ok(reply);
                }
                if let Some(code) = exit
                    && entry.pty.is_some()
                    && reply.stdout.is_empty()
                    && tokio::time::Instant::now() >= deadline
                {
                    let entry = sessions.remove(&session).expect("present");
                    end(&entry);
                    reply.exit = Some(code);
                    return Ok(reply);
                }
                if !reply.stdout.is_empty() || !reply.stderr.is_empty() || tokio::time::Instant::now() >= deadline {
                    return Ok(reply);
                }
                (exit.is_some(), entry.exited.clone())
            };
            let pause = tokio::time::sleep(Duration::from_millis(if exited { 10 } else { 20 }));
            tokio::select! {
                _ = notified.notified() => {}
                _ = pause => {}
            }
        }
    }
}

/// Kills what is left of the session and closes its terminal.
fn end(session: &Session) {
    if let Some(control) = &session.control {
        tokio::spawn(control.kill());
    }
    if session.pgid > 0 {
        // SAFETY: the command leads its own session and process group.
        unsafe { libc::kill(-session.pgid, libc::SIGKILL) };
    }
    if let Some(master) = session.pty {
        // SAFETY: the session owned this descriptor; it is dropped with the session.
        unsafe { libc::close(master) };
    }
}

/// A pseudo-terminal pair (master, slave).
fn open_pty() -> Result<(i32, i32), String> {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills the two descriptors; no name, termios or size given.
    let result = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if result != 0 {
        return Err(format!("openpty: {}", std::io::Error::last_os_error()));
    }
    Ok((master, slave))
}

use std::os::fd::FromRawFd;
