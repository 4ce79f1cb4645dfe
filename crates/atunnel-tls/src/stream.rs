//! A server-side TLS stream that can put rustls down while its connection
//! is idle: rustls runs the handshake and the traffic until the first
//! hibernation; then its session (record buffers, key schedule, the peer's
//! certificate chain, about 8 KiB) is dropped and the connection goes on
//! with its TLS 1.3 traffic secrets alone ([`crate::records`]), holding
//! buffers only while a record is in flight. The peer sees no change: the
//! same keys, the next sequence numbers, key updates followed and made as
//! rustls would, and an alert before the end on every error.
//!
//! rustls is put down only when nothing of the connection is inside it: no
//! plaintext or record waiting to be read, no part of a record received (the
//! socket under rustls tracks record boundaries for this, rustls does not
//! say), nothing waiting to be sent; and only when its traffic secrets came
//! through the config's key log ([`crate::secrets`]), without which a key
//! update could not be followed. Otherwise, and for TLS 1.2, the connection
//! stays with rustls.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use atunnel_core::endpoint::ReadReady;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::records::{
    self, Direction, Inbound, MAX_PLAINTEXT, Outbound, Read, SEAL_OVERHEAD, Suite, TlsError,
};
use crate::secrets::{Filing, TrafficSecrets};

/// The TCP stream under rustls, which notes where TLS records begin in
/// what it reads and whether its write side was shut down, and takes the
/// connection's traffic secrets from the key log during the handshake.
pub struct RecordTracking {
    tcp: TcpStream,
    framing: records::Framing,
    write_shut: bool,
    secrets: Claim,
}

/// Where the connection is in taking its secrets from the key log.
enum Claim {
    /// Not yet derived; `wrote` once the server wrote its first flight.
    Waiting {
        filing: Filing,
        wrote: bool,
    },
    Taken(Box<TrafficSecrets>),
    /// Never coming (TLS 1.2, no key log, a handshake rustls drove oddly):
    /// the connection stays with rustls.
    None,
}

impl RecordTracking {
    pub fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            framing: records::Framing::default(),
            write_shut: false,
            secrets: Claim::Waiting {
                filing: Filing::new(),
                wrote: false,
            },
        }
    }

    /// Whether the traffic secrets came through the key log.
    pub fn has_secrets(&self) -> bool {
        matches!(self.secrets, Claim::Taken(_))
    }

    fn try_take(&mut self) {
        if let Claim::Waiting { filing, .. } = &self.secrets
            && let Some(s) = filing.take()
        {
            self.secrets = Claim::Taken(s);
        }
    }

    fn wrote(&mut self) {
        if let Claim::Waiting { wrote, .. } = &mut self.secrets {
            *wrote = true;
            self.try_take();
        }
    }

    /// A record of `content_type` begins. rustls derives the application
    /// secrets before writing its flight, and the client's first protected
    /// record answers that flight, so once both happened the secrets are in
    /// the log or never will be.
    fn record_begins(&mut self, content_type: u8) {
        if content_type != records::CONTENT_APPLICATION_DATA {
            return;
        }
        if let Claim::Waiting { wrote: true, .. } = self.secrets {
            self.try_take();
            if !self.has_secrets() {
                // Dropping the filing forgets anything left under it.
                self.secrets = Claim::None;
            }
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn at_record_boundary(&self) -> bool {
        self.framing.at_boundary()
    }

    fn track(&mut self, bytes: &[u8]) {
        // A copy, as `record_begins` takes all of `self`.
        let mut framing = self.framing;
        framing.track(bytes, |header| self.record_begins(header[0]));
        self.framing = framing;
    }
}

impl AsyncRead for RecordTracking {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        if let Claim::Waiting { filing, .. } = &self.secrets {
            // rustls may derive the secrets from what this read brings.
            filing.reading();
        }
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
        self.wrote();
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.wrote();
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
                let Some((suite, limit)) = can_leave_rustls(tls) else {
                    return false;
                };
                let Self::Rustls(tls) = std::mem::replace(self, Self::Lost) else {
                    unreachable!("matched above")
                };
                let (io, conn) = (*tls).into_inner();
                match RecordStream::from_rustls(io, conn, suite, limit) {
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

/// The cipher suite and its confidentiality limit, when rustls holds
/// nothing of the connection but its keys and the key log gave its secrets.
fn can_leave_rustls(tls: &mut RustlsStream) -> Option<(Suite, u64)> {
    let (io, conn) = tls.get_mut();
    if !io.at_record_boundary() || !io.has_secrets() || conn.is_handshaking() || conn.wants_write()
    {
        return None;
    }
    if conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
        return None;
    }
    let (suite, limit) = Suite::of(conn.negotiated_cipher_suite()?)?;
    // Decrypts whatever whole records rustls has, so the check sees them.
    let state = conn.process_new_packets().ok()?;
    let idle = state.plaintext_bytes_to_read() == 0
        && state.tls_bytes_to_write() == 0
        && !state.peer_has_closed();
    idle.then_some((suite, limit))
}

/// Most plaintext one write of a [`RecordStream`] seals and sends at once.
const WRITE_BATCH: usize = 4 * MAX_PLAINTEXT;

/// A TLS 1.3 connection carried by its traffic secrets: one record read or
/// written at a time, buffers held only while one is in flight.
pub struct RecordStream {
    tcp: TcpStream,
    inbound: Inbound,
    outbound: Outbound,
    /// Sealed records not yet written: `outgoing[written..]`.
    outgoing: Vec<u8>,
    written: usize,
    /// close_notify or an error alert was sealed: nothing more is sent.
    close_sent: bool,
}

impl RecordStream {
    fn from_rustls(
        io: RecordTracking,
        conn: rustls::ServerConnection,
        suite: Suite,
        limit: u64,
    ) -> io::Result<Self> {
        let mut io = io;
        let Claim::Taken(generation_0) = std::mem::replace(&mut io.secrets, Claim::None) else {
            return Err(io::Error::other("no traffic secrets from the key log"));
        };
        // A key update rustls owes the peer (its answer to one the peer
        // asked for) waits outside its send queue until the next write, and
        // would be lost with the session; an empty write queues it. It was
        // sealed with the keys before the ones handed over, so it goes out
        // first, now if the socket takes it.
        let mut conn = conn;
        let mut outgoing = Vec::new();
        io::Write::write(&mut conn.writer(), &[])?;
        while conn.wants_write() {
            conn.write_tls(&mut outgoing)?;
        }
        let keys = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
        // rustls may have updated keys since the handshake: the keys it
        // hands over are used as they are, and the secret that leads to
        // them is found at the next key update, which fails the connection
        // if the key log's secrets are not this connection's.
        let lost = || io::Error::other("rustls handed over keys of another suite");
        let rx = Direction::resume(suite, &generation_0.client, keys.rx.0, &keys.rx.1)
            .ok_or_else(lost)?;
        let tx = Direction::resume(suite, &generation_0.server, keys.tx.0, &keys.tx.1)
            .ok_or_else(lost)?;
        let mut written = 0;
        while written < outgoing.len() {
            match io.tcp.try_write(&outgoing[written..]) {
                Ok(n) if n > 0 => written += n,
                _ => break,
            }
        }
        if written == outgoing.len() {
            (outgoing, written) = (Vec::new(), 0);
        }
        Ok(Self {
            tcp: io.tcp,
            inbound: Inbound::new(rx),
            outbound: Outbound::new(tx, limit),
            outgoing,
            written,
            close_sent: io.write_shut,
        })
    }

    fn sleep(&mut self) {
        self.inbound.sleep();
        self.outbound.sleep();
    }

    /// Whether a read would make progress without the socket.
    fn has_pending_read(&self) -> bool {
        self.inbound.has_pending()
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

    /// Ends the connection on `e`: the alert it owes goes out before the
    /// write side closes (as rustls, one attempt without waiting; a flush
    /// or shutdown finishes it), and nothing is sent after it.
    fn fail(&mut self, e: TlsError, cx: &mut Context<'_>) -> io::Error {
        if let Some(alert) = e.alert
            && !self.close_sent
            && self.outbound.seal_alert(alert, &mut self.outgoing).is_ok()
            && let Poll::Ready(Ok(())) = self.poll_send_outgoing(cx)
        {
            let _ = Pin::new(&mut self.tcp).poll_shutdown(cx);
        }
        self.close_sent = true;
        e.into()
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
            let plain = this.inbound.plaintext();
            if !plain.is_empty() {
                let n = plain.len().min(buf.remaining());
                buf.put_slice(&plain[..n]);
                this.inbound.consume(n);
                return Poll::Ready(Ok(()));
            }
            match this.inbound.read() {
                Ok(Read::Data) => continue,
                Ok(Read::Closed) => return Poll::Ready(Ok(())),
                Ok(Read::KeyUpdate { requested }) => {
                    if requested {
                        this.outbound.owe_key_update();
                    }
                    continue;
                }
                Ok(Read::More) => {}
                Err(e) => return Poll::Ready(Err(this.fail(e, cx))),
            }
            // Need more bytes. An idle connection's reads find nothing: the
            // buffer waits for the socket to have something.
            if !this.inbound.holds_buffer() {
                ready!(this.tcp.poll_read_ready(cx))?;
            }
            let mut read = ReadBuf::new(this.inbound.space());
            match Pin::new(&mut this.tcp).poll_read(cx, &mut read) {
                Poll::Pending => {
                    this.inbound.release_if_idle();
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
                    this.inbound.filled(n);
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
        if this.close_sent || this.inbound.is_failed() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS write side already closed",
            )));
        }
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // Up to WRITE_BATCH in one go, sent with one syscall: one record per
        // write cost a syscall and an allocation per 16 KiB (a 60 KB answer
        // took four of each on a woken connection, against rustls' one).
        // A batch is all a router that stops reading makes the stream hold:
        // the next write first waits for this one to go out (rustls's own
        // send buffer limit is the same 64 KiB).
        let batch = &data[..data.len().min(WRITE_BATCH)];
        let records = batch.len().div_ceil(MAX_PLAINTEXT);
        // One more record's room for a key update sealed before them.
        this.outgoing
            .reserve(batch.len() + (records + 1) * SEAL_OVERHEAD);
        let mut sealed = 0;
        for record in batch.chunks(MAX_PLAINTEXT) {
            match this.outbound.seal_data(record, &mut this.outgoing) {
                Ok(()) => sealed += record.len(),
                // What was sealed goes out and is reported written; the
                // error comes with the next write, so no byte is counted
                // lost that the peer will get.
                Err(_) if sealed > 0 => break,
                Err(e) => return Poll::Ready(Err(this.fail(e, cx))),
            }
        }
        // The records are ours to send now; start at once, finish on flush.
        if let Poll::Ready(Err(e)) = this.poll_send_outgoing(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(sealed))
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
            this.outbound
                .seal_alert(records::ALERT_CLOSE_NOTIFY, &mut this.outgoing)?;
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
                if r.has_pending_read() {
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

#[cfg(test)]
mod tests {
    /// What a hibernated connection keeps (docs/memory.md): the socket, a
    /// traffic secret, key, IV and sequence number per direction, the state
    /// of a fragmented key update and the counters that bound empty
    /// records, empty buffers.
    #[test]
    fn a_hibernated_stream_stays_small() {
        let size = std::mem::size_of::<super::RecordStream>();
        println!("RecordStream: {size} B");
        assert!(
            size <= 368,
            "{size} B (272 before each direction kept its key and IV)"
        );
    }
}
