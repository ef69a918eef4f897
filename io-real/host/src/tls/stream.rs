//! A connection that is plaintext or TLS, so one listener and one dialer serve both (`tls {
//! rpc http }` on or off), and the handshakes with their timeouts.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream as accepted or dialed: plaintext, or TLS over it.
pub enum MaybeTls<S> {
    Plain(S),
    Tls(Box<tokio_rustls::TlsStream<S>>),
}

impl<S> MaybeTls<S> {
    /// The certificates the peer presented (none over plaintext).
    pub fn peer_certificates(&self) -> Option<&[rustls::pki_types::CertificateDer<'static>]> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(stream) => stream.get_ref().1.peer_certificates(),
        }
    }
}

/// Nomad's `limits { rpc_handshake_timeout https_handshake_timeout }` default: a connection
/// that has not finished its TLS handshake by then is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// 0 is Nomad's "no limit".
fn bounded(timeout: Duration) -> Duration {
    if timeout.is_zero() { Duration::MAX } else { timeout }
}

fn timed_out(what: &str, timeout: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{what} TLS handshake did not finish within {timeout:?}"),
    )
}

/// The server side of a handshake on an accepted stream (`timeout` 0: no limit).
pub async fn accept<S>(stream: S, config: Arc<rustls::ServerConfig>, timeout: Duration) -> io::Result<MaybeTls<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match tokio::time::timeout(bounded(timeout), acceptor.accept(stream)).await {
        Ok(stream) => Ok(MaybeTls::Tls(Box::new(tokio_rustls::TlsStream::Server(stream?)))),
        Err(_) => Err(timed_out("inbound", timeout)),
    }
}

/// The client side of a handshake on a dialed stream, checking the peer as `name`.
pub async fn connect<S>(
    stream: S,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    timeout: Duration,
) -> io::Result<MaybeTls<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(bounded(timeout), connector.connect(name, stream)).await {
        Ok(stream) => Ok(MaybeTls::Tls(Box::new(tokio_rustls::TlsStream::Client(stream?)))),
        Err(_) => Err(timed_out("outbound", timeout)),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_flush(cx),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(stream) => stream.is_write_vectored(),
            MaybeTls::Tls(stream) => stream.is_write_vectored(),
        }
    }
}

/// A TLS connection opens with a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 22;

/// A stream whose first byte was read already (to tell TLS from plaintext), given back first.
pub struct Prefixed<S> {
    first: Option<u8>,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(inner: S) -> Self {
        Prefixed { first: None, inner }
    }
}

/// Reads the first byte of `stream` (within `timeout`, 0: no limit): whether it opens a TLS
/// handshake, and the stream with that byte put back.
pub async fn sniff<S: AsyncRead + Unpin>(mut stream: S, timeout: Duration) -> io::Result<(bool, Prefixed<S>)> {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    let read = match tokio::time::timeout(bounded(timeout), stream.read(&mut byte)).await {
        Ok(read) => read?,
        Err(_) => return Err(timed_out("inbound", timeout)),
    };
    if read == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before a byte was sent",
        ));
    }
    Ok((
        byte[0] == TLS_HANDSHAKE_RECORD,
        Prefixed {
            first: Some(byte[0]),
            inner: stream,
        },
    ))
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(byte) = this.first.take() {
            if buf.remaining() == 0 {
                this.first = Some(byte);
                return Poll::Ready(Ok(()));
            }
            buf.put_slice(&[byte]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
