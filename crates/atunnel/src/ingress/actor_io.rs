//! The IO of one connection to an actor for ingress's HTTP clients: plain
//! for HTTP/1.1 and CONNECT, under a [`FloodGuard`] for h2c (so an actor
//! cannot flood its HTTP/2 client with control frames), and with writes
//! the actor cannot block forever.
//!
//! A request body the actor stops reading would otherwise hold its write
//! (and hyper's h2c client its flush before closing) for as long as the
//! actor likes, with a descriptor and buffers outside every budget. A write
//! blocked for the bound fails instead and the connection closes with a
//! reset (a FIN would wait behind the unread bytes).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_connect::flood::FloodGuard;
use bytes::BytesMut;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The byte stream to the actor: plain, or under the flood guard for h2c.
pub(crate) enum ActorStream {
    Plain(TcpStream),
    H2c(FloodGuard<TcpStream>),
}

impl ActorStream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::H2c(guard) => guard.get_ref(),
        }
    }

    fn into_tcp(self) -> TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::H2c(guard) => guard.into_inner(),
        }
    }
}

impl AsyncRead for ActorStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::H2c(guard) => Pin::new(guard).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ActorStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::H2c(guard) => Pin::new(guard).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::H2c(guard) => Pin::new(guard).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::H2c(guard) => Pin::new(guard).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::H2c(guard) => Pin::new(guard).poll_shutdown(cx),
        }
    }
}

pub(crate) struct ActorIo {
    io: TokioIo<ActorStream>,
    /// How long a write may stay blocked (zero: forever).
    bound: Duration,
    /// Since when writes have been blocked, none written since.
    blocked_since: Option<Instant>,
    /// Made at the connection's first blocked write and kept: a write to a
    /// local actor rarely blocks, so most connections never have one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl ActorIo {
    pub(crate) fn new(stream: ActorStream, bound: Duration) -> Self {
        Self {
            io: TokioIo::new(stream),
            bound,
            blocked_since: None,
            timer: None,
        }
    }

    pub(crate) fn into_tcp(self) -> TcpStream {
        self.io.into_inner().into_tcp()
    }

    /// A write returned `Pending`: still pending until the bound, then an
    /// error. One clock read per blocked write; the timer is reset only
    /// when a new blockage starts.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.bound.is_zero() {
            return Poll::Pending;
        }
        let now = Instant::now();
        let due = *self.blocked_since.get_or_insert(now) + self.bound;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.deadline() != due {
            timer.as_mut().reset(due);
        }
        if now >= due || timer.as_mut().poll(cx).is_ready() {
            // Closed with a reset: a FIN would wait behind the bytes the
            // actor never read, and the actor would see no end.
            let _ = self.io.inner().tcp().set_zero_linger();
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the actor stopped reading",
            )));
        }
        Poll::Pending
    }

    /// Reads what the actor sent onto the end of `buf` (`http1_pool`).
    pub(crate) fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        tokio_util::io::poll_read_buf(Pin::new(self.io.inner_mut()), cx, buf)
    }

    /// Writes as much of `bufs` as the socket takes, blocked no longer than
    /// the bound (`http1_pool`).
    pub(crate) fn poll_write_gathered(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(self.io.inner_mut()).poll_write_vectored(cx, bufs);
        self.wrote(r, cx)
    }

    /// Makes closing the connection reset it.
    pub(crate) fn reset_on_close(&self) {
        let _ = self.io.inner().tcp().set_zero_linger();
    }

    /// Whether an idle connection is still open: the actor has neither
    /// closed it nor sent anything since its last response. Costs no system
    /// call unless the reactor saw it become readable.
    pub(crate) fn idle_and_open(&mut self) -> bool {
        let tcp = self.io.inner().tcp();
        match tcp.poll_read_ready(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut byte = [0u8; 1];
                matches!(tcp.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    fn wrote<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.blocked_since = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.blocked(cx),
        }
    }
}

impl Read for ActorIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for ActorIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Connection for ActorIo {
    fn connected(&self) -> Connected {
        self.io.inner().tcp().connected()
    }
}
