//! What Nomad's own CSI client sends, made acceptable to our HTTP/2 server.
//!
//! Go's gRPC (as Nomad vendors it) names a unix socket's path as the HTTP/2 `:authority`
//! (`/csi/csi.sock`). That is not an authority by RFC 9113, and the `h2` crate under tonic
//! resets such a stream with PROTOCOL_ERROR (hyperium/h2#487, open since 2020), where every
//! Go plugin (and Nomad's client with it) carries on. So each connection goes through this
//! shim first: the client's frames are passed on one by one, except that a header block whose
//! `:authority` is not one has it replaced by `localhost`, as gRPC's own clients name a unix
//! peer. Header blocks are decoded with the client's HPACK context and encoded again with one
//! of the shim's own towards the server, so both sides' tables stay as each expects; the
//! server's frames go back untouched.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Every HTTP/2 peer takes frames this large (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is refused (the connection closed): gRPC's are tiny.
const MAX_BLOCK: usize = 1 << 20;

/// A connection as the server sees it, through the shim.
pub struct Shimmed(DuplexStream);

impl tonic::transport::server::Connected for Shimmed {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Shimmed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Shimmed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// `client` behind the shim; the pumps end with either side.
pub fn shim(client: UnixStream) -> Shimmed {
    let (ours, server) = tokio::io::duplex(256 * 1024);
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = tokio::io::split(server);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    tokio::spawn(async move {
        if let Err(error) = client_to_server(client_read, server_write).await
            && error.kind() != io::ErrorKind::UnexpectedEof
        {
            eprintln!("drover-csi-fake: connection dropped: {error}");
        }
    });
    Shimmed(ours)
}

/// `value` unless it is no authority, then `localhost`.
pub fn authority(value: &[u8]) -> &[u8] {
    let valid = std::str::from_utf8(value)
        .ok()
        .is_some_and(|text| text.parse::<tonic::codegen::http::uri::Authority>().is_ok());
    if valid { value } else { b"localhost" }
}

async fn client_to_server(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: the server refuses it better than we could.
        tokio::io::copy(&mut from, &mut to).await?;
        return Ok(());
    }
    let mut decoder = fluke_hpack::Decoder::new();
    let mut encoder = fluke_hpack::Encoder::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(&mut from).await?;
        if kind != HEADERS {
            write_frame(&mut to, kind, flags, stream, &payload).await?;
            to.flush().await?;
            continue;
        }
        let (priority, mut block) = headers_payload(flags, payload)?;
        let mut end_headers = flags & END_HEADERS != 0;
        while !end_headers {
            let (kind, flags, continued, payload) = read_frame(&mut from).await?;
            if kind != CONTINUATION || continued != stream || block.len() + payload.len() > MAX_BLOCK {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "a header block broken off"));
            }
            block.extend_from_slice(&payload);
            end_headers = flags & END_HEADERS != 0;
        }
        let headers = decoder
            .decode(&block)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {error:?}")))?;
        let headers: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| {
                let value = if name == b":authority" {
                    authority(&value).to_vec()
                } else {
                    value
                };
                (name, value)
            })
            .collect();
        let encoded = encoder.encode(headers.iter().map(|(name, value)| (name.as_slice(), value.as_slice())));
        // Sent again in one HEADERS frame and as many CONTINUATIONs as it takes, its priority
        // kept, its padding dropped.
        let mut first = priority.unwrap_or_default();
        let room = MAX_FRAME - first.len();
        let (head, mut rest) = encoded.split_at(encoded.len().min(room));
        first.extend_from_slice(head);
        let keep = (flags & (END_STREAM | PRIORITY)) | if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame(&mut to, HEADERS, keep, stream, &first).await?;
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME));
            let done = if after.is_empty() { END_HEADERS } else { 0 };
            write_frame(&mut to, CONTINUATION, done, stream, chunk).await?;
            rest = after;
        }
        to.flush().await?;
    }
}

/// A HEADERS payload's priority fields (if flagged) and its header block fragment, its
/// padding taken off.
fn headers_payload(flags: u8, payload: Vec<u8>) -> io::Result<(Option<Vec<u8>>, Vec<u8>)> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "a malformed HEADERS frame");
    let mut body = payload.as_slice();
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&length, rest) = body.split_first().ok_or_else(malformed)?;
        pad = usize::from(length);
        body = rest;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        if body.len() < 5 {
            return Err(malformed());
        }
        priority = Some(body[..5].to_vec());
        body = &body[5..];
    }
    if pad > body.len() {
        return Err(malformed());
    }
    Ok((priority, body[..body.len() - pad].to_vec()))
}

async fn read_frame(from: &mut (impl AsyncRead + Unpin)) -> io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut header = [0u8; 9];
    from.read_exact(&mut header).await?;
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    if length > MAX_BLOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a frame larger than any we allow",
        ));
    }
    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; length];
    from.read_exact(&mut payload).await?;
    Ok((header[3], header[4], stream, payload))
}

async fn write_frame(
    to: &mut (impl AsyncWrite + Unpin),
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> io::Result<()> {
    let length = (payload.len() as u32).to_be_bytes();
    let mut header = [0u8; 9];
    header[..3].copy_from_slice(&length[1..]);
    header[3] = kind;
    header[4] = flags;
    header[5..].copy_from_slice(&stream.to_be_bytes());
    to.write_all(&header).await?;
    to.write_all(payload).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_no_authority_is_replaced() {
        assert_eq!(authority(b"/csi/csi.sock"), b"localhost");
        assert_eq!(authority(b"%2Ftmp%2Fx.sock"), b"localhost");
        assert_eq!(authority(b"localhost"), b"localhost");
        assert_eq!(authority(b"plugin.example:9000"), b"plugin.example:9000");
    }

    #[test]
    fn padding_goes_and_priority_stays() {
        let payload = vec![2, 1, 2, 3, 4, 16, 0xaa, 0xbb, 0, 0];
        let (priority, block) = headers_payload(PADDED | PRIORITY, payload).unwrap();
        assert_eq!(priority, Some(vec![1, 2, 3, 4, 16]));
        assert_eq!(block, vec![0xaa, 0xbb]);
        assert!(headers_payload(PADDED, vec![9, 1]).is_err());
    }
}
