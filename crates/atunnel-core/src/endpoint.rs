//! One side of a relay: something that yields chunks of bytes and accepts
//! them, without holding a buffer while it waits.
//!
//! Sockets and TLS streams wait for read readiness first and only then borrow
//! a pooled buffer. An HTTP/2 stream hands out the `Bytes` h2 already decoded
//! (no copy, no buffer of ours) and takes `Bytes` to send, so a pooled buffer
//! travels into h2's send queue and comes back to the pool once written.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::pool::{BufferPool, PooledBuf};

/// Bytes read from one side, waiting to be written to the other.
pub enum Chunk {
    /// Read into a pooled buffer: `buf[start..end]` is unwritten.
    Pooled {
        buf: PooledBuf,
        start: usize,
        end: usize,
    },
    /// Handed out by a side that already holds the bytes (HTTP/2 DATA).
    Shared(Bytes),
}

impl Chunk {
    pub fn remaining(&self) -> &[u8] {
        match self {
            Chunk::Pooled { buf, start, end } => &buf.as_ref()[*start..*end],
            Chunk::Shared(b) => b,
        }
    }

    pub fn len(&self) -> usize {
        self.remaining().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn advance(&mut self, n: usize) {
        match self {
            Chunk::Pooled { start, end, .. } => *start = (*start + n).min(*end),
            Chunk::Shared(b) => b.advance(n.min(b.len())),
        }
    }

    /// Copies the unwritten bytes out of a pooled buffer, which goes back to
    /// the pool; shared bytes stay as they are. True if a buffer went back.
    pub fn spill(&mut self) -> bool {
        let pooled = matches!(self, Chunk::Pooled { .. });
        if pooled {
            *self = Chunk::Shared(Bytes::copy_from_slice(self.remaining()));
        }
        pooled
    }

    /// Splits off the first `n` bytes as `Bytes`. A pooled buffer becomes
    /// shared with its new owner and returns to the pool when the last piece
    /// is dropped.
    pub fn split_to_bytes(&mut self, n: usize) -> Bytes {
        if let Chunk::Pooled { .. } = self {
            let Chunk::Pooled { buf, start, end } =
                std::mem::replace(self, Chunk::Shared(Bytes::new()))
            else {
                unreachable!("matched Pooled above")
            };
            *self = Chunk::Shared(Bytes::from_owner(buf).slice(start..end));
        }
        match self {
            Chunk::Shared(b) => b.split_to(n.min(b.len())),
            Chunk::Pooled { .. } => unreachable!("converted to Shared above"),
        }
    }
}

/// A side of a relay.
///
/// The relay asks, in this order, whether the source has bytes
/// ([`poll_readable`](Self::poll_readable)), whether the destination can
/// take them now ([`poll_send_capacity`](Self::poll_send_capacity)), and
/// only then reads: behind a peer that stopped reading, bytes wait in the
/// source's kernel queue (bounded by its socket buffer) or under HTTP/2 flow
/// control, and no pooled buffer is held for them.
pub trait Endpoint {
    /// Ready once a read would make progress (bytes, end of stream or an
    /// error), holding no buffer. The default cannot tell and says ready.
    fn poll_readable(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Ready once this side can take bytes now, with how many at most
    /// (`usize::MAX` when it cannot tell). HTTP/2 waits for flow-control
    /// window here; a socket for room in its send queue.
    fn poll_send_capacity(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(usize::MAX))
    }

    /// False for a side whose chunks are bytes it has already received
    /// (HTTP/2 DATA, bounded by the window it granted): the relay takes
    /// them at once instead of first waiting for the destination, since
    /// holding them costs nothing more, and a stalled write then means
    /// bytes really are waiting.
    fn reads_into_pool(&self) -> bool {
        true
    }

    /// The relay waits for new bytes from the other side: give back
    /// whatever was set aside for them (HTTP/2 returns reserved window to
    /// its connection, where other streams can use it).
    fn idle(&mut self) {}

    /// The next bytes this side has to give, at most `max` of them, `None`
    /// at end of stream. While nothing is readable no buffer is held.
    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        pool: &BufferPool,
        max: usize,
    ) -> Poll<io::Result<Option<Chunk>>>;

    /// `n` bytes this side produced have reached the other side's socket.
    /// HTTP/2 returns that much flow-control window to the peer here, so
    /// bytes queued behind a slow reader are bounded by the window.
    fn consumed(&mut self, _n: usize) {}

    /// Writes some of `chunk` and advances it.
    fn poll_write_chunk(&mut self, cx: &mut Context<'_>, chunk: &mut Chunk)
    -> Poll<io::Result<()>>;

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Half-close: no more bytes will be written (FIN, close_notify, END_STREAM).
    fn poll_close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Ready with an error once the peer has cut what is written to this
    /// side abnormally (HTTP/2: RST_STREAM with an error code, or the
    /// connection lost), even while there is nothing to write: bytes
    /// already handed over may be lost, so the relay must fail and reset
    /// the other side rather than later end cleanly. A peer's orderly "no
    /// more" (RST_STREAM NO_ERROR after its answer) is not a cut: a later
    /// write fails, as one to a closed socket would. The default is never.
    fn poll_write_cut(&mut self, _cx: &mut Context<'_>) -> Poll<io::Error> {
        Poll::Pending
    }

    /// The relay failed, or was dropped before it ended (cancelled, its
    /// server shutting down): tell the peer abruptly (HTTP/2 RST_STREAM; a
    /// socket resets when closed), so that it never takes a cut stream for a
    /// complete one. Never called on a clean end.
    fn abort(&mut self) {}
}

/// A byte stream that can report read readiness without being handed a buffer.
pub trait ReadReady: AsyncRead + AsyncWrite + Unpin {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Ready once a write would take bytes: bytes this stream queued itself
    /// (TLS records) are out and its socket has room. The default cannot
    /// tell and says ready.
    fn poll_write_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Makes closing the socket under this stream reset the connection (RST,
    /// unsent bytes dropped) instead of ending it with FIN (and, for TLS, no
    /// close_notify is sent). A stream that does not forward this to its
    /// socket closes cleanly, and its peer sees only a TLS truncation.
    fn reset_on_close(&self) {}
}

impl ReadReady for TcpStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    /// With `TCP_NOTSENT_LOWAT`, writable once the unsent bytes are below it.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_write_ready(self, cx)
    }

    /// `SO_LINGER` 0: closing sends RST and drops unsent bytes.
    fn reset_on_close(&self) {
        // setsockopt fails only on a bad descriptor, which an open stream's is not.
        if let Err(e) = self.set_zero_linger() {
            tracing::trace!(error = %e, "setting SO_LINGER 0");
        }
    }
}

/// True when rustls already holds plaintext (or the peer's close_notify), so
/// a read would make progress without the socket becoming readable again.
fn tls_has_pending<D>(conn: &mut rustls::ConnectionCommon<D>) -> bool {
    match conn.process_new_packets() {
        Ok(state) => state.plaintext_bytes_to_read() > 0 || state.peer_has_closed(),
        // Let the read surface the error.
        Err(_) => true,
    }
}

/// Client and server TLS streams are ready alike: rustls first, then the
/// socket.
macro_rules! tls_read_ready {
    ($($stream:ident),*) => {$(
        impl<IO: ReadReady> ReadReady for tokio_rustls::$stream::TlsStream<IO> {
            fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let (io, conn) = self.get_mut();
                if tls_has_pending(conn) {
                    return Poll::Ready(Ok(()));
                }
                io.poll_read_ready(cx)
            }

            /// rustls queues records up to its buffer limit: they go out
            /// first, then the socket must have room.
            fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                ready!(Pin::new(&mut *self).poll_flush(cx))?;
                self.get_mut().0.poll_write_ready(cx)
            }

            fn reset_on_close(&self) {
                self.get_ref().0.reset_on_close()
            }
        }
    )*};
}

tls_read_ready!(client, server);

impl<T: ReadReady + ?Sized> ReadReady for Box<T> {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_read_ready(cx)
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (**self).poll_write_ready(cx)
    }

    fn reset_on_close(&self) {
        (**self).reset_on_close()
    }
}

impl<T: ReadReady> Endpoint for T {
    fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }

    fn poll_send_capacity(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        ready!(self.poll_write_ready(cx))?;
        Poll::Ready(Ok(usize::MAX))
    }

    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        pool: &BufferPool,
        max: usize,
    ) -> Poll<io::Result<Option<Chunk>>> {
        ready!(self.poll_read_ready(cx))?;
        let mut buf = ready!(pool.poll_acquire(cx));
        let slice = buf.as_mut_slice();
        let len = slice.len().min(max.max(1));
        let mut read_buf = ReadBuf::new(&mut slice[..len]);
        // On Pending (readiness was spurious, or TLS got only part of a
        // record) the buffer goes straight back to the pool.
        ready!(Pin::new(&mut *self).poll_read(cx, &mut read_buf))?;
        let end = read_buf.filled().len();
        Poll::Ready(Ok((end > 0).then_some(Chunk::Pooled {
            buf,
            start: 0,
            end,
        })))
    }

    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Chunk,
    ) -> Poll<io::Result<()>> {
        let n = ready!(Pin::new(&mut *self).poll_write(cx, chunk.remaining()))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        chunk.advance(n);
        Poll::Ready(Ok(()))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self).poll_flush(cx)
    }

    fn poll_close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self).poll_shutdown(cx)
    }

    fn abort(&mut self) {
        self.reset_on_close()
    }
}

/// Most bytes asked of h2's flow control at once: one chunk's worth keeps
/// the send queue to one frame batch per stream.
const MAX_SEND_RESERVE: usize = 64 * 1024;

/// An HTTP/2 stream (a CONNECT tunnel) as a relay side, read and written in
/// place: no reader task, no copy into a buffer of ours, and nothing queued in
/// h2 beyond the window it granted.
pub struct H2Stream {
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
}

impl H2Stream {
    pub fn new(send: h2::SendStream<Bytes>, recv: h2::RecvStream) -> Self {
        Self { send, recv }
    }

    pub fn into_parts(self) -> (h2::SendStream<Bytes>, h2::RecvStream) {
        (self.send, self.recv)
    }
}

fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e.into_io().expect("is_io checked");
    }
    let kind = match e.reason() {
        Some(h2::Reason::NO_ERROR) | Some(h2::Reason::CANCEL) => io::ErrorKind::ConnectionReset,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

fn closed_for_sending() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "HTTP/2 stream closed for sending",
    )
}

impl Endpoint for H2Stream {
    /// Waits for the peer's flow-control window: asks h2 for up to
    /// `MAX_SEND_RESERVE` and says what it granted, so the relay reads no
    /// more than can be sent at once and h2 queues nothing.
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            let capacity = self.send.capacity();
            if capacity > 0 {
                return Poll::Ready(Ok(capacity));
            }
            self.send.reserve_capacity(MAX_SEND_RESERVE);
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(closed_for_sending())),
            }
        }
    }

    fn reads_into_pool(&self) -> bool {
        false
    }

    fn idle(&mut self) {
        if self.send.capacity() > 0 {
            self.send.reserve_capacity(0);
        }
    }

    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        _pool: &BufferPool,
        _max: usize,
    ) -> Poll<io::Result<Option<Chunk>>> {
        loop {
            return match ready!(self.recv.poll_data(cx)) {
                Some(Ok(b)) if b.is_empty() => continue,
                Some(Ok(b)) => Poll::Ready(Ok(Some(Chunk::Shared(b)))),
                Some(Err(e)) => Poll::Ready(Err(h2_to_io(e))),
                None => Poll::Ready(Ok(None)),
            };
        }
    }

    fn consumed(&mut self, n: usize) {
        // Fails only once the stream is gone, when the window no longer matters.
        let _ = self.recv.flow_control().release_capacity(n);
    }

    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Chunk,
    ) -> Poll<io::Result<()>> {
        loop {
            let capacity = self.send.capacity();
            if capacity > 0 {
                let bytes = chunk.split_to_bytes(capacity);
                self.send.send_data(bytes, false).map_err(h2_to_io)?;
                return Poll::Ready(Ok(()));
            }
            self.send
                .reserve_capacity(chunk.len().min(MAX_SEND_RESERVE));
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => return Poll::Ready(Err(closed_for_sending())),
            }
        }
    }

    fn poll_flush(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2's connection task writes and flushes frames.
        Poll::Ready(Ok(()))
    }

    fn poll_close_write(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Fails only when the stream is already closed for sending: the peer
        // reset it. A server that finished its answer resets with NO_ERROR
        // rather than wait for our end: nothing is left to half-close and
        // the other direction must keep draining, so that is no error. Any
        // other reset cut what we sent.
        match self.send.send_data(Bytes::new(), true) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) if e.reason() == Some(h2::Reason::NO_ERROR) => {
                tracing::trace!(error = %e, "HTTP/2 stream already closed for sending");
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(h2_to_io(e))),
        }
    }

    fn poll_write_cut(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.send.poll_reset(cx) {
            Poll::Pending | Poll::Ready(Ok(h2::Reason::NO_ERROR)) => Poll::Pending,
            Poll::Ready(Ok(reason)) => Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("the peer reset the stream ({reason})"),
            )),
            Poll::Ready(Err(e)) => Poll::Ready(h2_to_io(e)),
        }
    }

    fn abort(&mut self) {
        self.send.send_reset(h2::Reason::CANCEL);
    }
}

/// Awaits the next chunk from `ep` (see [`Endpoint::poll_read_chunk`]).
pub async fn read_chunk<E: Endpoint + ?Sized>(
    ep: &mut E,
    pool: &BufferPool,
) -> io::Result<Option<Chunk>> {
    std::future::poll_fn(|cx| ep.poll_read_chunk(cx, pool, usize::MAX)).await
}

/// Writes all of `chunk` to `ep` and flushes.
pub async fn write_chunk<E: Endpoint + ?Sized>(ep: &mut E, mut chunk: Chunk) -> io::Result<()> {
    while !chunk.is_empty() {
        std::future::poll_fn(|cx| ep.poll_write_chunk(cx, &mut chunk)).await?;
    }
    std::future::poll_fn(|cx| ep.poll_flush(cx)).await
}

/// Half-closes `ep`.
pub async fn close_write<E: Endpoint + ?Sized>(ep: &mut E) -> io::Result<()> {
    std::future::poll_fn(|cx| ep.poll_close_write(cx)).await
}

/// A socket that waits for data by reading into a small buffer of its own,
/// held for the connection's whole life, instead of waiting for readiness.
/// This is the reference's fix (a 512 B wait buffer); atunnel keeps it only
/// so the benchmark can sweep its size against readiness (no buffer at all).
pub struct WaitBuffered<T> {
    inner: T,
    wait: Box<[u8]>,
    /// Bytes in `wait` not yet handed out (the pool made us wait).
    held: usize,
    /// An error met after some bytes were read, reported on the next read.
    deferred: Option<io::Error>,
}

impl<T> WaitBuffered<T> {
    pub fn new(inner: T, wait_buffer: usize) -> Self {
        Self {
            inner,
            wait: vec![0u8; wait_buffer.max(1)].into_boxed_slice(),
            held: 0,
            deferred: None,
        }
    }
}

impl<T: ReadReady> Endpoint for WaitBuffered<T> {
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.inner.poll_send_capacity(cx)
    }

    fn poll_read_chunk(
        &mut self,
        cx: &mut Context<'_>,
        pool: &BufferPool,
        max: usize,
    ) -> Poll<io::Result<Option<Chunk>>> {
        if let Some(e) = self.deferred.take() {
            return Poll::Ready(Err(e));
        }
        if self.held == 0 {
            let mut rb = ReadBuf::new(&mut self.wait);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut rb))?;
            self.held = rb.filled().len();
            if self.held == 0 {
                return Poll::Ready(Ok(None));
            }
        }
        // Data is moving: borrow a pooled buffer for it and whatever else
        // is already readable.
        let mut buf = ready!(pool.poll_acquire(cx));
        let held = std::mem::take(&mut self.held);
        buf.as_mut_slice()[..held].copy_from_slice(&self.wait[..held]);
        let slice = buf.as_mut_slice();
        let room = slice.len().min(max.max(held));
        let mut rest = ReadBuf::new(&mut slice[held..room]);
        let more = match Pin::new(&mut self.inner).poll_read(cx, &mut rest) {
            Poll::Ready(Ok(())) => rest.filled().len(),
            Poll::Ready(Err(e)) => {
                self.deferred = Some(e);
                0
            }
            Poll::Pending => 0,
        };
        Poll::Ready(Ok(Some(Chunk::Pooled {
            buf,
            start: 0,
            end: held + more,
        })))
    }

    fn consumed(&mut self, n: usize) {
        self.inner.consumed(n)
    }

    fn poll_write_chunk(
        &mut self,
        cx: &mut Context<'_>,
        chunk: &mut Chunk,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_write_chunk(cx, chunk)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Endpoint::poll_flush(&mut self.inner, cx)
    }

    fn poll_close_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_close_write(cx)
    }

    fn abort(&mut self) {
        self.inner.abort()
    }
}
