//! A connection to an actor for ingress's HTTP clients, whose writes the
//! actor cannot block forever.
//!
//! hyper's HTTP/1.1 client flushes what it has buffered before it closes a
//! connection, so one whose request was ended because the actor stopped
//! reading its body would otherwise wait on that actor for as long as it
//! likes, holding a descriptor and hyper's buffers outside every budget. A
//! write blocked for the bound fails instead, and hyper drops the
//! connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

pub(crate) struct ActorIo {
    io: TokioIo<TcpStream>,
    /// How long a write may stay blocked (zero: forever).
    bound: Duration,
    /// Since when writes have been blocked, none written since.
    blocked_since: Option<Instant>,
    /// Made at the connection's first blocked write and kept: a write to a
    /// local actor rarely blocks, so most connections never have one.
    timer: Option<Pin<Box<Sleep>>>,
}

impl ActorIo {
    pub(crate) fn new(tcp: TcpStream, bound: Duration) -> Self {
        Self {
            io: TokioIo::new(tcp),
            bound,
            blocked_since: None,
            timer: None,
        }
    }

    pub(crate) fn into_inner(self) -> TcpStream {
        self.io.into_inner()
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
            let _ = self.io.inner().set_zero_linger();
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the actor stopped reading",
            )));
        }
        Poll::Pending
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
        bufs: &[io::IoSlice<'_>],
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
        self.io.connected()
    }
}
