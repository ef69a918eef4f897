//! `agent alloc exec [-i] [-t] [-task T] <alloc> <command...>`: the command runs in the task's
//! context on its client, over the websocket at `/v1/client/allocation/:id/exec` (any agent
//! relays it); stdin goes to it, its output comes back, and its exit code is this command's.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tungstenite::Message;

use super::alloc::resolve_alloc;
use super::logs::task_of;
use super::{Api, Failure, text};

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Whether stdin is a terminal.
fn stdin_is_tty() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(0) == 1 }
}

/// The local terminal in raw mode for the session's length (restored on drop).
struct RawTerminal(Option<libc::termios>);

impl RawTerminal {
    fn enter() -> RawTerminal {
        // SAFETY: tcgetattr/tcsetattr on stdin with a termios we own.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return RawTerminal(None);
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(0, libc::TCSANOW, &raw);
            RawTerminal(Some(saved))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: restores the attributes read in `enter`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, saved) };
        }
    }
}

fn terminal_size() -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ fills the winsize we own.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        (libc::ioctl(1, libc::TIOCGWINSZ, &mut size) == 0).then_some((size.ws_col, size.ws_row))
    }
}

/// A plain or TLS stream under the websocket.
trait Duplex: Read + Write + Send {}
impl<T: Read + Write + Send> Duplex for T {}

enum ExecConnect {
    /// The agent answered the upgrade with an HTTP error: its status and body.
    Refused(u16, String),
    Failed(String),
}

/// The websocket of `request` (`ws://` or `wss://` with the CLI's TLS settings), and the TCP
/// socket under it (to set its read timeout once the handshakes are done).
fn connect(
    api: &Api,
    request: tungstenite::handshake::client::Request,
) -> Result<(tungstenite::WebSocket<Box<dyn Duplex>>, std::net::TcpStream), ExecConnect> {
    let failed = |error: &dyn std::fmt::Display| ExecConnect::Failed(error.to_string());
    let uri = request.uri().clone();
    let host = uri.host().ok_or_else(|| failed(&"no host"))?.to_string();
    let secure = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = std::net::TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port))
        .map_err(|error| failed(&error))?;
    let under = tcp.try_clone().map_err(|error| failed(&error))?;
    let stream: Box<dyn Duplex> = if secure {
        let config = api
            .tls
            .clone()
            .ok_or_else(|| failed(&"wss:// needs the CLI's TLS settings (an https:// address)"))?;
        let name =
            rustls::pki_types::ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
                .map_err(|error| failed(&error))?;
        let connection = rustls::ClientConnection::new(config, name).map_err(|error| failed(&error))?;
        Box::new(rustls::StreamOwned::new(connection, tcp))
    } else {
        Box::new(tcp)
    };
    match tungstenite::client(request, stream) {
        Ok((socket, _)) => Ok((socket, under)),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            let body = response
                .body()
                .as_ref()
                .map(|body| String::from_utf8_lossy(body).into_owned())
                .unwrap_or_default();
            Err(ExecConnect::Refused(response.status().as_u16(), body))
        }
        Err(error) => Err(failed(&error)),
    }
}

pub(super) fn alloc_exec(
    api: &Api,
    id: &str,
    task: Option<String>,
    command: Vec<String>,
    interactive: Option<bool>,
    tty: Option<bool>,
) -> Result<(), Failure> {
    let alloc = resolve_alloc(api, id)?;
    let task = task_of(&alloc, task)?;
    let interactive = interactive.unwrap_or(true);
    let tty = tty.unwrap_or_else(stdin_is_tty);
    let base = api
        .base
        .replacen("https://", "wss://", 1)
        .replacen("http://", "ws://", 1);
    let url = format!(
        "{base}/v1/client/allocation/{}/exec?task={}&tty={tty}&command={}",
        text(&alloc["ID"]),
        encode(&task),
        encode(&serde_json::to_string(&command)?)
    );
    let mut request = tungstenite::client::IntoClientRequest::into_client_request(url.as_str())?;
    if let Some(token) = &api.token {
        request.headers_mut().insert("X-Nomad-Token", token.parse()?);
    }
    let (mut socket, tcp) = match connect(api, request) {
        Ok(connected) => connected,
        Err(ExecConnect::Refused(code, body)) => {
            return Err(Failure(
                format!("Unexpected response code: {code} ({})", body.trim()),
                1,
            ));
        }
        Err(ExecConnect::Failed(error)) => return Err(Failure(format!("Error connecting to {url}: {error}"), 1)),
    };
    // Reads wake up every 50 ms to pass stdin on.
    tcp.set_read_timeout(Some(Duration::from_millis(50)))?;
    let _raw = tty.then(RawTerminal::enter);
    if tty && let Some((width, height)) = terminal_size() {
        socket.send(Message::text(
            json!({"tty_size": {"width": width, "height": height}}).to_string(),
        ))?;
    }
    let (input, typed) = mpsc::channel::<Option<Vec<u8>>>();
    if interactive {
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buffer) {
                    Ok(0) | Err(_) => {
                        let _ = input.send(None);
                        return;
                    }
                    Ok(read) => {
                        if input.send(Some(buffer[..read].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    } else {
        socket.send(Message::text(json!({"stdin": {"close": true}}).to_string()))?;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    loop {
        while let Ok(data) = typed.try_recv() {
            let frame = match data {
                Some(data) => json!({"stdin": {"data": b64.encode(data)}}),
                None => json!({"stdin": {"close": true}}),
            };
            socket.send(Message::text(frame.to_string()))?;
        }
        let message = match socket.read() {
            Ok(message) => message,
            Err(tungstenite::Error::Io(error))
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(error) => return Err(Failure(format!("Error reading from the session: {error}"), 1)),
        };
        let frame: Value = match &message {
            Message::Text(text) => serde_json::from_str(text.as_str()).unwrap_or(Value::Null),
            Message::Close(frame) => {
                let reason = frame.as_ref().map(|frame| frame.reason.to_string()).unwrap_or_default();
                return Err(Failure(format!("the session ended without an exit code: {reason}"), 1));
            }
            _ => continue,
        };
        for (key, out) in [("stdout", &mut stdout as &mut dyn Write), ("stderr", &mut stderr)] {
            if let Some(data) = frame[key]["data"].as_str() {
                out.write_all(&b64.decode(data).unwrap_or_default())?;
                out.flush()?;
            }
        }
        if frame["exited"] == true {
            let code = frame["result"]["exit_code"].as_i64().unwrap_or(0);
            let _ = socket.close(None);
            return match code {
                0 => Ok(()),
                code => Err(Failure(String::new(), code.clamp(1, 255) as u8)),
            };
        }
    }
}
