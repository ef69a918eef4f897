//! One client must never take the HTTP API down: a real agent's API on a real socket, held
//! open idle, with partial headers, with a partial body, over the per-client connection
//! limit, with a body or a head too large, and with jobs too big to schedule. Each is answered
//! or closed within its limit, and the API keeps answering throughout.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use drover_http::HttpLimits;

/// Far above every deadline below: a connection not closed by then was never going to be.
const PATIENCE: Duration = Duration::from_secs(10);

const LIMITS: HttpLimits = HttpLimits {
    max_conns_per_client: 4,
    header_timeout: Duration::from_millis(300),
    body_timeout: Duration::from_millis(300),
    body_max: 64 * 1024,
    header_max: 16 * 1024,
    handshake_timeout: Duration::from_millis(300),
};

/// Inbound agent RPC connections per client address, in these tests.
const RPC_MAX_CONNS: usize = 3;

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// Everything the server sends until it closes the connection; panics if it does not close it
/// within [`PATIENCE`].
fn until_closed(mut stream: TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&answer).into_owned(),
            Ok(read) => answer.extend_from_slice(&buf[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&answer).into_owned();
            }
            Err(error) => panic!("the server kept the connection open: {error}"),
        }
    }
}

/// A keep-alive connection on which one request was answered in full: the server has
/// accepted it and counts it, and it stays open for the next request.
fn answered_once(port: u16) -> TcpStream {
    let mut stream = connect(port);
    stream
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = stream.read(&mut buf).unwrap();
        assert!(
            read > 0,
            "closed before answering: {}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..read]);
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a Content-Length");
            if body.len() >= length {
                return stream;
            }
        }
    }
}

/// Polls `check` until it holds or [`PATIENCE`] passes.
fn wait_for<T>(check: impl FnMut() -> Option<T>) -> Option<T> {
    drover_testkit::wait_for_every(PATIENCE, Duration::from_millis(10), check)
}

fn request(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut stream = connect(port);
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    // A server answering before the whole body is read may reset the rest: what it answered
    // is what counts.
    let _ = stream.write_all(body);
    let response = until_closed(stream);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).map_or(0, |code| code.parse().unwrap());
    (status, body.to_string())
}

fn job(groups: usize, count: u64, task: &str) -> Vec<u8> {
    let groups: Vec<serde_json::Value> = (0..groups)
        .map(|index| {
            serde_json::json!({
                "Name": format!("g{index}"), "Count": count,
                "Tasks": [{"Name": task, "Driver": "raw_exec", "Config": {"command": "/bin/true"},
                           "Resources": {"CPU": 10, "MemoryMB": 10}}]
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"Job": {
        "ID": "big", "Type": "service", "Datacenters": ["dc1"], "TaskGroups": groups
    }}))
    .unwrap()
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_hold_or_overload_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = support::start_server(dir.path(), false, LIMITS, RPC_MAX_CONNS).await;
    let (handle, port, rpc) = (server.handle, server.http, server.rpc);
    let leader = move || request(port, "GET", "/v1/status/leader", b"");
    assert_eq!(blocking(leader).await.0, 200);

    // Idle, partial head, partial body: each closed by its deadline.
    let idle = blocking(move || until_closed(connect(port))).await;
    assert_eq!(idle, "", "an idle connection is closed without an answer");
    let partial_head = blocking(move || {
        let mut stream = connect(port);
        stream
            .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        until_closed(stream)
    })
    .await;
    assert!(!partial_head.starts_with("HTTP/1.1 200"), "{partial_head}");
    let partial_body = blocking(move || {
        let mut stream = connect(port);
        stream
            .write_all(b"PUT /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"Job\":")
            .unwrap();
        until_closed(stream)
    })
    .await;
    assert!(partial_body.starts_with("HTTP/1.1 400"), "{partial_body}");

    // The fifth connection of one client is refused, naming the limit; one of the four held
    // closing frees a place. On an agent whose idle deadline is far off, and each held
    // connection answered once first, so all four are surely counted and still open when
    // the fifth comes, however slow the machine (it slept 100 ms and hoped: under load the
    // fifth came before a held one was accepted, or after the 300 ms deadline closed one).
    let patient_dir = tempfile::tempdir().unwrap();
    let patient = support::start_server(
        patient_dir.path(),
        false,
        HttpLimits {
            header_timeout: PATIENCE,
            ..LIMITS
        },
        RPC_MAX_CONNS,
    )
    .await;
    let patient_port = patient.http;
    let held: Vec<TcpStream> = blocking(move || (0..4).map(|_| answered_once(patient_port)).collect()).await;
    let refused = blocking(move || until_closed(connect(patient_port))).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("the limit is 4"), "{refused}");
    drop(held);
    let freed =
        blocking(move || wait_for(|| (request(patient_port, "GET", "/v1/status/leader", b"").0 == 200).then_some(())))
            .await;
    assert!(freed.is_some(), "a closed connection frees its place");
    patient.handle.shutdown().await;
    assert_eq!(blocking(leader).await.0, 200);

    // The agent RPC port too: the connections held are served (each opens with HTTP/2's
    // preface; the server answers with its settings frame), one past the limit is closed at
    // once with nothing said.
    let mut rpc_held: Vec<TcpStream> = (0..RPC_MAX_CONNS)
        .map(|_| {
            let mut stream = connect(rpc);
            stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
            stream
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let closed = blocking(move || until_closed(connect(rpc))).await;
    assert_eq!(closed, "");
    let settings = rpc_held[0].read(&mut [0u8; 64]).unwrap();
    assert!(settings > 0, "a held connection is served");
    drop(rpc_held);
    // One that says nothing is closed at the handshake deadline (5 s), TLS or not, unanswered.
    let silent = blocking(move || until_closed(connect(rpc))).await;
    assert_eq!(silent, "", "a silent RPC peer is closed without an answer");

    // Too large a body, too large a head.
    let (status, body) = blocking(move || request(port, "PUT", "/v1/jobs", &vec![b' '; 100_000])).await;
    assert_eq!(
        (status, body.as_str()),
        (413, "Request body too large: the limit is 65536 bytes")
    );
    // Far over the limit too: the server answers after reading 16 KiB, and lingers on the
    // connection so the client can finish writing and read the answer (closing at once reset
    // the connection under the client's write: a broken pipe, and no 431 to read).
    for size in [20_000, 200_000] {
        let head = blocking(move || {
            let mut stream = connect(port);
            let cookie = "c".repeat(size);
            write!(
                stream,
                "GET /v1/status/leader HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n"
            )
            .unwrap();
            until_closed(stream)
        })
        .await;
        assert!(head.starts_with("HTTP/1.1 431"), "{size} bytes: {head}");
    }
    // A client still sending its head, slowly, when the server has read past the limit and
    // answered: every write still lands, and the 431 is there to read.
    let head = blocking(move || {
        let mut stream = connect(port);
        stream
            .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\nCookie: ")
            .unwrap();
        for _ in 0..24 {
            stream
                .write_all(&[b'c'; 1024])
                .expect("the server lingers: no reset under a write");
            std::thread::sleep(Duration::from_millis(3));
        }
        stream
            .write_all(b"\r\n\r\n")
            .expect("the server lingers: no reset under a write");
        until_closed(stream)
    })
    .await;
    assert!(head.starts_with("HTTP/1.1 431"), "a slow writer: {head}");

    // Jobs too big to schedule, or with a name that would climb out of its directory, are
    // refused before Raft; nothing is stored.
    for (body, text) in [
        (
            job(1, 1_000_000_000, "t"),
            "more than the limit of 10000 allocations per group",
        ),
        (job(200, 1, "t"), "more than the limit of 100 task groups per job"),
        (job(1, 1, "../../../../tmp/x"), "Task name cannot include slashes"),
    ] {
        let (status, answer) = blocking(move || request(port, "PUT", "/v1/jobs", &body)).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.contains(text), "{answer}");
    }
    let stored = handle.read_state(|state| state.jobs().count()).unwrap();
    assert_eq!(stored, 0);
    assert_eq!(blocking(leader).await.0, 200);
    handle.shutdown().await;
}
