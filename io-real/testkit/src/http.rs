//! A tiny blocking HTTP/1.1 client for an agent's API on loopback: one fresh connection per
//! request, `Connection: close`, a 10 s read limit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// `method path` with `body`: `(status, body)`, or `None` when the agent could not be reached
/// or answered something that is not HTTP.
pub fn http_status(method: &str, port: u16, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// [`http_status`]'s body when the status is 200.
pub fn http(method: &str, port: u16, path: &str, body: Option<&str>) -> Option<String> {
    http_status(method, port, path, body).and_then(|(code, body)| (code == 200).then_some(body))
}

/// GET; `None` when the agent does not answer 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    http("GET", port, path, None)
}

/// GET, parsed as JSON; `None` when the agent does not answer 200 with JSON.
pub fn get_json(port: u16, path: &str) -> Option<serde_json::Value> {
    serde_json::from_str(&http_get(port, path)?).ok()
}
