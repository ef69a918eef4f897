//! Lingering close, as Go's `net/http` does it. Closing a socket while the client's bytes are
//! still arriving, or unread, makes the kernel answer with a reset, and a reset can destroy
//! the response before the client reads it: a client sending a head over `header_max` saw a
//! broken pipe instead of its 431. So when hyper is done with a connection, its write half is
//! shut (the client reads the answer to its end) and what the client still sends is read and
//! dropped, for at most [`LINGER`] and [`LINGER_BYTES`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// How long a closed connection is drained at most.
pub const LINGER: Duration = Duration::from_millis(500);
/// How much of what a client still sends is read and dropped at most.
pub const LINGER_BYTES: usize = 256 << 10;

/// A connection that lingers when dropped (see the module).
pub struct Lingering<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> {
    inner: Option<T>,
}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Lingering<T> {
    pub fn new(inner: T) -> Self {
        Lingering { inner: Some(inner) }
    }

    fn stream(&mut self) -> &mut T {
        self.inner
            .as_mut()
            .expect("a lingering stream is used only before it is dropped")
    }
}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AsyncRead for Lingering<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AsyncWrite for Lingering<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().stream()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(self.get_mut().stream()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Drop for Lingering<T> {
    fn drop(&mut self) {
        let Some(stream) = self.inner.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream));
        }
    }
}

/// Shuts the write half, then reads and drops what comes until the client closes, or the
/// bounds are reached; the socket closes when this returns.
async fn linger<T: AsyncRead + AsyncWrite + Unpin>(mut stream: T) {
    let _ = tokio::time::timeout(LINGER, async {
        stream.shutdown().await?;
        let mut buf = [0u8; 8192];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            let read = stream.read(&mut buf).await?;
            if read == 0 {
                break;
            }
            drained += read;
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}
