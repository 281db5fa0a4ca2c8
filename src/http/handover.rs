//! The socket wrapper hyper reads through, which takes an event-stream
//! request away from hyper wherever it comes on a connection.
//!
//! Browsers and load balancers reuse keep-alive connections, so a stream is
//! rarely the first request of its connection. When a read between requests
//! brings exactly one complete `GET …/events` head, the wrapper keeps the
//! socket and those bytes, and tells hyper the peer closed: hyper drops the
//! connection and its buffers, and the lean writer serves the stream.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::lean::{StreamRequest, parse_stream_request};

/// A socket taken from hyper, with the stream request read off it.
pub struct HandedOver {
    pub stream: TcpStream,
    pub request: StreamRequest,
}

/// Where a handed-over socket is left for the connection task.
pub type Slot = Arc<Mutex<Option<HandedOver>>>;

/// The IO hyper serves a connection through.
pub struct HandoverIo {
    inner: Option<TcpStream>,
    slot: Slot,
    /// True at the start and after each response: a read now begins a new
    /// request (clients here do not pipeline; a pipelined stream request is
    /// simply left to hyper).
    between_requests: bool,
}

impl HandoverIo {
    pub fn new(stream: TcpStream, slot: Slot) -> Self {
        Self {
            inner: Some(stream),
            slot,
            between_requests: true,
        }
    }
}

impl AsyncRead for HandoverIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(stream) = this.inner.as_mut() else {
            return Poll::Ready(Ok(())); // handed over: EOF for hyper
        };
        let before = buf.filled().len();
        match Pin::new(stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                if this.between_requests
                    && !fresh.is_empty()
                    && let Some(request) =
                        parse_stream_request(fresh).filter(|r| r.head_len == fresh.len())
                {
                    buf.set_filled(before);
                    let stream = this.inner.take().expect("checked above");
                    *this.slot.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(HandedOver { stream, request });
                    return Poll::Ready(Ok(()));
                }
                if buf.filled().len() > before {
                    this.between_requests = false;
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for HandoverIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match this.inner.as_mut() {
            Some(stream) => {
                let written = Pin::new(stream).poll_write(cx, data);
                if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
                    this.between_requests = true;
                }
                written
            }
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(stream) => Pin::new(stream).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(stream) => Pin::new(stream).poll_shutdown(cx),
            // The socket lives on in the lean writer: nothing to shut down.
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match this.inner.as_mut() {
            Some(stream) => {
                let written = Pin::new(stream).poll_write_vectored(cx, bufs);
                if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
                    this.between_requests = true;
                }
                written
            }
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|s| s.is_write_vectored())
    }
}
