//! A small HTTP/1 client over turmoil's TCP: how the lane's operator and workload reach the
//! agents' real HTTP API.

use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// An answer: the status code and the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a new connection and reads the whole answer; `Err` when the
/// connection failed or broke before the answer was read.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<Answer, String> {
    let stream = turmoil::net::TcpStream::connect(addr)
        .await
        .map_err(|error| format!("connect to {addr}: {error}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("handshake with {addr}: {error}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|error| format!("request {method} {path}: {error}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("{method} {path} on {addr}: {error}"))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|error| format!("{method} {path} on {addr}: reading the body: {error}"))?
        .to_bytes()
        .to_vec();
    Ok(Answer { status, body })
}
