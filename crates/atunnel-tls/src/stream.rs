//! A server-side TLS stream that can put rustls down while its connection
//! is idle: rustls runs the handshake and the traffic until the first
//! hibernation; then its session (record buffers, key schedule, the peer's
//! certificate chain, about 8 KiB) is dropped and the connection goes on
//! with its TLS 1.3 traffic keys alone ([`crate::records`]), holding
//! buffers only while a record is in flight. The peer sees no change: the
//! same keys, the next sequence numbers.
//!
//! rustls is put down only when nothing of the connection is inside it: no
//! plaintext or record waiting to be read, no part of a record received (the
//! socket under rustls tracks record boundaries for this, rustls does not
//! say), nothing waiting to be sent. Otherwise, and for TLS 1.2, the
//! connection stays with rustls.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use atunnel_core::endpoint::ReadReady;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::records::{self, CLOSE_NOTIFY, Direction, MAX_PLAINTEXT, MAX_RECORD, Opened};

/// The TCP stream under rustls, which notes where TLS records begin in
/// what it reads and whether its write side was shut down.
pub struct RecordTracking {
    tcp: TcpStream,
    /// Header bytes of the next record seen so far (0-4).
    header: [u8; records::HEADER_LEN],
    header_seen: u8,
    /// Bytes of the current record's body still to come.
    body_left: usize,
    write_shut: bool,
}

impl RecordTracking {
    pub fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            header: [0; records::HEADER_LEN],
            header_seen: 0,
            body_left: 0,
            write_shut: false,
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn at_record_boundary(&self) -> bool {
        self.header_seen == 0 && self.body_left == 0
    }

    fn track(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
            } else {
                self.header[usize::from(self.header_seen)] = bytes[0];
                self.header_seen += 1;
                bytes = &bytes[1..];
                if usize::from(self.header_seen) == records::HEADER_LEN {
                    self.header_seen = 0;
                    self.body_left =
                        usize::from(u16::from_be_bytes([self.header[3], self.header[4]]));
                }
            }
        }
    }
}

impl AsyncRead for RecordTracking {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.tcp).poll_read(cx, buf))?;
        let this = &mut *self;
        this.track(&buf.filled()[before..]);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for RecordTracking {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write_shut = true;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl ReadReady for RecordTracking {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_read_ready(cx)
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_write_ready(cx)
    }

    fn reset_on_close(&self) {
        self.tcp.reset_on_close()
    }
}

pub type RustlsStream = TlsStream<RecordTracking>;

/// An accepted TLS connection, with rustls or, once it has hibernated, with
/// its traffic keys alone.
pub enum ServerTls {
    Rustls(Box<RustlsStream>),
    Records(Box<RecordStream>),
    /// rustls refused to hand its secrets over after agreeing it could; the
    /// connection cannot continue.
    Lost,
}

fn lost() -> io::Error {
    io::Error::other("TLS session lost while hibernating")
}

impl ServerTls {
    pub fn new(tls: RustlsStream) -> Self {
        Self::Rustls(Box::new(tls))
    }

    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Self::Rustls(tls) => Some(tls.get_ref().0.tcp()),
            Self::Records(r) => Some(&r.tcp),
            Self::Lost => None,
        }
    }

    pub fn is_records(&self) -> bool {
        matches!(self, Self::Records(_))
    }

    /// Frees what the idle connection need not keep: rustls's whole session
    /// the first time, ring's expanded keys after that. Returns false, and
    /// changes nothing, when the connection cannot hibernate now (something
    /// is buffered, part of a record was received, or it is not TLS 1.3).
    pub fn hibernate(&mut self) -> bool {
        match self {
            Self::Records(r) => {
                r.sleep();
                true
            }
            Self::Lost => false,
            Self::Rustls(tls) => {
                let Some(limit) = can_leave_rustls(tls) else {
                    return false;
                };
                let Self::Rustls(tls) = std::mem::replace(self, Self::Lost) else {
                    unreachable!("matched above")
                };
                let (io, conn) = (*tls).into_inner();
                match RecordStream::from_rustls(io, conn, limit) {
                    Ok(records) => {
                        *self = Self::Records(Box::new(records));
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "rustls did not hand over a TLS session; closing it");
                        false
                    }
                }
            }
        }
    }
}

/// The cipher suite's confidentiality limit, when rustls holds nothing of
/// the connection but its keys.
fn can_leave_rustls(tls: &mut RustlsStream) -> Option<u64> {
    let (io, conn) = tls.get_mut();
    if !io.at_record_boundary() || conn.is_handshaking() || conn.wants_write() {
        return None;
    }
    if conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
        return None;
    }
    let limit = records::record_limit(conn.negotiated_cipher_suite()?)?;
    // Decrypts whatever whole records rustls has, so the check sees them.
    let state = conn.process_new_packets().ok()?;
    let idle = state.plaintext_bytes_to_read() == 0
        && state.tls_bytes_to_write() == 0
        && !state.peer_has_closed();
    idle.then_some(limit)
}

/// A TLS 1.3 connection carried by its traffic keys: one record read or
/// written at a time, buffers held only while one is in flight.
pub struct RecordStream {
    tcp: TcpStream,
    rx: Direction,
    tx: Direction,
    /// Bytes read from the socket: `[..filled]`; records not yet opened
    /// start at `start`; opened plaintext not yet handed out is `plain`.
    incoming: Vec<u8>,
    filled: usize,
    start: usize,
    plain: std::ops::Range<usize>,
    /// Sealed records not yet written: `outgoing[written..]`.
    outgoing: Vec<u8>,
    written: usize,
    read_closed: bool,
    close_sent: bool,
}

impl RecordStream {
    fn from_rustls(
        io: RecordTracking,
        conn: rustls::ServerConnection,
        limit: u64,
    ) -> io::Result<Self> {
        let secrets = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
        Ok(Self {
            tcp: io.tcp,
            // The limit is on what this side sends; received records are
            // the peer's to count.
            rx: Direction::new(secrets.rx.0, secrets.rx.1, u64::MAX)?,
            tx: Direction::new(secrets.tx.0, secrets.tx.1, limit)?,
            incoming: Vec::new(),
            filled: 0,
            start: 0,
            plain: 0..0,
            outgoing: Vec::new(),
            written: 0,
            read_closed: false,
            close_sent: io.write_shut,
        })
    }

    fn sleep(&mut self) {
        self.rx.sleep();
        self.tx.sleep();
        self.release_incoming();
    }

    /// Drops the read buffer once everything in it was handed out (the
    /// write buffer goes as soon as it is sent, in `poll_send_outgoing`).
    fn release_incoming(&mut self) {
        if self.plain.is_empty() && self.start == self.filled {
            self.incoming = Vec::new();
            (self.filled, self.start, self.plain) = (0, 0, 0..0);
        }
    }

    /// Whether a read would make progress without the socket.
    fn has_pending_read(&self) -> io::Result<bool> {
        Ok(!self.plain.is_empty()
            || self.read_closed
            || records::record_len(&self.incoming[self.start..self.filled])?.is_some())
    }

    fn poll_send_outgoing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.outgoing[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.outgoing = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for RecordStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.plain.is_empty() {
                let n = this.plain.len().min(buf.remaining());
                buf.put_slice(&this.incoming[this.plain.start..this.plain.start + n]);
                this.plain.start += n;
                this.release_incoming();
                return Poll::Ready(Ok(()));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            if let Some(len) = records::record_len(&this.incoming[this.start..this.filled])? {
                let at = this.start;
                this.start += len;
                match this.rx.open(&mut this.incoming[at..at + len])? {
                    Opened::Data(range) => this.plain = at + range.start..at + range.end,
                    Opened::CloseNotify => this.read_closed = true,
                }
                continue;
            }
            // Need more bytes: move the partial record to the front, and
            // read at most one whole record's room. An idle connection's
            // reads find nothing: the buffer waits for the socket to have
            // something.
            if this.incoming.is_empty() {
                ready!(this.tcp.poll_read_ready(cx))?;
                this.incoming = vec![0; MAX_RECORD];
            } else if this.start > 0 {
                this.incoming.copy_within(this.start..this.filled, 0);
                this.filled -= this.start;
                this.start = 0;
            }
            let mut read = ReadBuf::new(&mut this.incoming[this.filled..]);
            match Pin::new(&mut this.tcp).poll_read(cx, &mut read) {
                Poll::Pending => {
                    this.release_incoming();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        // rustls reports the same: a TLS stream must end
                        // with close_notify.
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed the connection without sending TLS close_notify",
                        )));
                    }
                    this.filled += n;
                }
            }
        }
    }
}

impl AsyncWrite for RecordStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_send_outgoing(cx))?;
        if this.close_sent {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS write side already closed",
            )));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = data.len().min(MAX_PLAINTEXT);
        this.tx.seal(
            records::CONTENT_APPLICATION_DATA,
            &data[..n],
            &mut this.outgoing,
        )?;
        // The record is ours to send now; start at once, finish on flush.
        if let Poll::Ready(Err(e)) = this.poll_send_outgoing(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_outgoing(cx))?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_send_outgoing(cx))?;
        if !this.close_sent {
            this.close_sent = true;
            this.tx
                .seal(records::CONTENT_ALERT, &CLOSE_NOTIFY, &mut this.outgoing)?;
            ready!(this.poll_send_outgoing(cx))?;
        }
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

impl AsyncRead for ServerTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Rustls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
            Self::Records(r) => Pin::new(&mut **r).poll_read(cx, buf),
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }
}

impl AsyncWrite for ServerTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Rustls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
            Self::Records(r) => Pin::new(&mut **r).poll_write(cx, buf),
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Rustls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
            Self::Records(r) => Pin::new(&mut **r).poll_write_vectored(cx, bufs),
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Rustls(tls) => tls.is_write_vectored(),
            _ => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Rustls(tls) => Pin::new(&mut **tls).poll_flush(cx),
            Self::Records(r) => Pin::new(&mut **r).poll_flush(cx),
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Rustls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
            Self::Records(r) => Pin::new(&mut **r).poll_shutdown(cx),
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }
}

impl ReadReady for ServerTls {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Rustls(tls) => tls.poll_read_ready(cx),
            Self::Records(r) => {
                if r.has_pending_read()? {
                    return Poll::Ready(Ok(()));
                }
                r.tcp.poll_read_ready(cx)
            }
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }

    /// Sealed records still queued go out first, then the socket must have room.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Self::Rustls(tls) => tls.poll_write_ready(cx),
            Self::Records(r) => {
                ready!(Pin::new(&mut **r).poll_flush(cx))?;
                r.tcp.poll_write_ready(cx)
            }
            Self::Lost => Poll::Ready(Err(lost())),
        }
    }

    fn reset_on_close(&self) {
        match self {
            Self::Rustls(tls) => tls.reset_on_close(),
            Self::Records(r) => r.tcp.reset_on_close(),
            Self::Lost => {}
        }
    }
}
