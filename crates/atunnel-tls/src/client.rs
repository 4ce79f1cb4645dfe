//! The client TLS stream of gateway connections: rustls runs the handshake,
//! then a TLS 1.3 connection goes on with its traffic secrets in
//! [`crate::records`], opening records in place in a buffer this stream
//! owns and handing their plaintext straight to the reader, which copies it
//! once, into its own buffer.
//!
//! Hand-written because rustls 0.23 cannot hand plaintext out in place:
//! its buffered connection copies every decrypted record into a plaintext
//! queue (`take_received_plaintext`, a quarter of a download's instructions
//! with its deframer's reallocations), and its unbuffered API
//! (`UnbufferedClientConnection`) goes through that same queue
//! (`ReadTraffic::next_record` pops it), so it saves no copy either.
//!
//! The peer sees no change. rustls is handed the handshake's records one at
//! a time and no further than the server's Finished: the connection's own
//! key log says when rustls has derived the application traffic secrets,
//! which it does while processing that record, and what came after it
//! stays in this stream's buffer for the record layer. The keys rustls
//! hands over (`dangerous_extract_secrets`) and those secrets, which key
//! updates derive from, are all it keeps. Session tickets that arrive
//! later are skipped, as rustls skips them with resumption off; key
//! updates are followed and answered; errors send their alert. TLS 1.2,
//! or anything unusual at the end of the handshake, stays with
//! tokio-rustls for the connection's life.
//!
//! Buffers: reads go into a buffer of several records ([`READ_BUFFER`],
//! after a first small one, [`FIRST_READ`]), kept while records arrive and released when a read finds the socket
//! empty with nothing buffered; writes gather the writer's slices into
//! full records, at most [`WRITE_BATCH`] of plaintext sealed at a time and
//! sent with one write, the next write waiting until they are out. The
//! sealed-record buffer is released in the same place as the read buffer:
//! an idle connection holds neither.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use atunnel_core::endpoint::ReadReady;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::records::{
    self, Direction, MAX_PLAINTEXT, MAX_RECORD, Opened, Outbound, RecordReader, SEAL_OVERHEAD,
    Suite, TlsError, record_len,
};
use crate::secrets::Secret;

/// What one read may fill: four records' worth, so a read takes about what
/// rustls's reads took (several records) and the partial record moved to
/// the front when the buffer runs out is moved once per three records or
/// more.
pub const READ_BUFFER: usize = 4 * MAX_RECORD;

/// The buffer a read starts with after the connection was idle: small
/// enough for the allocator's thread cache (jemalloc keeps classes up to 32
/// KiB there; a 66 KiB buffer is a large allocation, about 4,000
/// instructions to take and give back, which a request and its answer on a
/// kept tunnel paid for each time). A read that fills it, or a record that
/// does not fit, moves to the full [`READ_BUFFER`]: a download pays one
/// more read per burst for it.
pub const FIRST_READ: usize = 8 * 1024;

/// Most plaintext one write seals and sends at once (rustls's own send
/// buffer limit is the same 64 KiB): all a gateway that stops reading makes
/// the stream hold.
pub const WRITE_BATCH: usize = 4 * MAX_PLAINTEXT;

const CLIENT_LABEL: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_LABEL: &str = "SERVER_TRAFFIC_SECRET_0";

/// The key log of one connection's config: the two application traffic
/// secrets, generation 0. A config per connection (the gateway client
/// makes one per dial) keeps them tied to their connection without the
/// server side's thread-local filing ([`crate::secrets`]).
#[derive(Debug, Default)]
struct ConnectionSecrets {
    secrets: Mutex<(Option<Secret>, Option<Secret>)>,
}

impl ConnectionSecrets {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<Secret>, Option<Secret>)> {
        // Every update is one field write: a panic cannot leave it half done.
        self.secrets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Both secrets are in: rustls has processed the server's Finished.
    fn complete(&self) -> bool {
        let s = self.lock();
        s.0.is_some() && s.1.is_some()
    }

    fn take(&self) -> Option<(Secret, Secret)> {
        let mut s = self.lock();
        Some((s.0.take()?, s.1.take()?))
    }
}

impl rustls::KeyLog for ConnectionSecrets {
    fn will_log(&self, label: &str) -> bool {
        label == CLIENT_LABEL || label == SERVER_LABEL
    }

    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        let Some(secret) = Secret::new(secret) else {
            return;
        };
        let mut s = self.lock();
        match label {
            CLIENT_LABEL => s.0 = Some(secret),
            SERVER_LABEL => s.1 = Some(secret),
            _ => {}
        }
    }
}

/// The socket under rustls: hands rustls one record at a time from a
/// buffer of its own, and nothing once the application secrets are
/// derived, so what follows the server's Finished stays here.
pub struct Handshaking {
    tcp: TcpStream,
    /// Read and not yet handed to rustls: `buf[at..]`.
    buf: Vec<u8>,
    at: usize,
    framing: records::Framing,
    secrets: Arc<ConnectionSecrets>,
    /// The connection stayed with rustls: reads go straight to the socket
    /// once the buffer is empty.
    passthrough: bool,
}

impl Handshaking {
    fn new(tcp: TcpStream, secrets: Arc<ConnectionSecrets>) -> Self {
        Self {
            tcp,
            buf: Vec::new(),
            at: 0,
            framing: records::Framing::default(),
            secrets,
            passthrough: false,
        }
    }

    fn at_record_boundary(&self) -> bool {
        self.framing.at_boundary()
    }

    /// Bytes from the read position to the end of the current record's
    /// header or body.
    fn to_boundary(&self) -> usize {
        self.framing.to_boundary()
    }

    fn track(&mut self, bytes: &[u8]) {
        self.framing.track(bytes, |_| {});
    }
}

impl AsyncRead for Handshaking {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at == this.buf.len() {
            if this.passthrough {
                this.buf = Vec::new();
                this.at = 0;
                return Pin::new(&mut this.tcp).poll_read(cx, out);
            }
            if this.secrets.complete() {
                // rustls is done with the handshake and its loop asks for
                // more: nothing, so the next records stay here. Nobody
                // waits on this Pending (the handshake returns).
                return Poll::Pending;
            }
            this.buf.clear();
            this.at = 0;
            this.buf.reserve(READ_BUFFER);
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.tcp),
                cx,
                &mut this.buf
            ))?;
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
        } else if !this.passthrough && this.secrets.complete() {
            return Poll::Pending;
        }
        let n = (this.buf.len() - this.at)
            .min(out.remaining())
            .min(this.to_boundary());
        let (from, to) = (this.at, this.at + n);
        out.put_slice(&this.buf[from..to]);
        this.at = to;
        let handed = std::mem::take(&mut this.buf);
        this.track(&handed[from..to]);
        this.buf = handed;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Handshaking {
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
        bufs: &[IoSlice<'_>],
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
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl ReadReady for Handshaking {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.at < self.buf.len() {
            return Poll::Ready(Ok(()));
        }
        self.tcp.poll_read_ready(cx)
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_write_ready(cx)
    }

    fn reset_on_close(&self) {
        self.tcp.reset_on_close()
    }
}

/// Handshakes as a TLS client with `config` (its key log and secret
/// extraction are set here) over `tcp`. Errors are tokio-rustls's.
pub async fn connect(
    mut config: rustls::ClientConfig,
    name: ServerName<'static>,
    tcp: TcpStream,
) -> io::Result<ClientTls> {
    let secrets = Arc::new(ConnectionSecrets::default());
    config.key_log = secrets.clone();
    config.enable_secret_extraction = true;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, Handshaking::new(tcp, secrets))
        .await?;
    Ok(ClientTls::after_handshake(tls))
}

/// A gateway connection's TLS stream: TLS 1.3 in [`crate::records`], or
/// rustls (TLS 1.2).
pub struct ClientTls {
    inner: Inner,
}

enum Inner {
    /// Boxed like the others: the stream moves into h2 and the pool.
    Records(Box<RecordClient>),
    /// Boxed: a rustls session is large and rare here.
    Rustls(Box<tokio_rustls::client::TlsStream<Handshaking>>),
    /// rustls refused to hand its session over after agreeing it could:
    /// every read and write fails.
    Lost(TcpStream),
}

impl ClientTls {
    fn after_handshake(mut tls: tokio_rustls::client::TlsStream<Handshaking>) -> Self {
        let Some((suite, limit)) = can_leave_rustls(&mut tls) else {
            tls.get_mut().0.passthrough = true;
            return Self {
                inner: Inner::Rustls(Box::new(tls)),
            };
        };
        let (io, conn) = tls.into_inner();
        match RecordClient::from_rustls(io, conn, suite, limit) {
            Ok(r) => Self {
                inner: Inner::Records(Box::new(r)),
            },
            // rustls agreed above that it could; nothing is lost yet, but
            // the session is gone with `conn`: the connection fails.
            Err((e, tcp)) => {
                tracing::warn!(error = %e, "rustls did not hand over a TLS session");
                Self {
                    inner: Inner::Lost(tcp),
                }
            }
        }
    }

    /// The protocol agreed by ALPN.
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match &self.inner {
            Inner::Records(r) => r.alpn.as_deref(),
            Inner::Rustls(tls) => tls.get_ref().1.alpn_protocol(),
            Inner::Lost(_) => None,
        }
    }

    /// Whether the connection left rustls for the record layer (TLS 1.3).
    pub fn is_records(&self) -> bool {
        matches!(self.inner, Inner::Records(_))
    }

    /// Heap bytes held by this stream's own buffers (the record layer's;
    /// rustls's are not counted).
    pub fn held_bytes(&self) -> usize {
        match &self.inner {
            Inner::Records(r) => r.inbuf.capacity() + r.out.capacity(),
            Inner::Rustls(_) | Inner::Lost(_) => 0,
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Inner::Records(r) => &r.tcp,
            Inner::Rustls(tls) => &tls.get_ref().0.tcp,
            Inner::Lost(tcp) => tcp,
        }
    }
}

/// The suite and its confidentiality limit when the connection can leave
/// rustls: TLS 1.3, a suite the record layer carries, both secrets logged,
/// and nothing of the connection inside rustls but its keys.
fn can_leave_rustls(
    tls: &mut tokio_rustls::client::TlsStream<Handshaking>,
) -> Option<(Suite, u64)> {
    let (io, conn) = tls.get_mut();
    if conn.is_handshaking()
        || conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3)
        || !io.at_record_boundary()
        || !io.secrets.complete()
    {
        return None;
    }
    let (suite, limit) = Suite::of(conn.negotiated_cipher_suite()?)?;
    let state = conn.process_new_packets().ok()?;
    let idle = state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed();
    idle.then_some((suite, limit))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadState {
    Open,
    Closed,
    Failed,
}

/// A TLS 1.3 client connection carried by its traffic secrets.
struct RecordClient {
    tcp: TcpStream,
    reader: RecordReader,
    outbound: Outbound,
    /// `inbuf[start..]` are records not yet opened; `inbuf[plain.0..plain.1]`
    /// is plaintext not yet handed out (inside a record already opened).
    inbuf: Vec<u8>,
    start: usize,
    plain: (usize, usize),
    /// Sealed records not yet written: `out[sent..]`.
    out: Vec<u8>,
    sent: usize,
    read_state: ReadState,
    /// close_notify or an error alert was sealed: nothing more is sent.
    close_sent: bool,
    alpn: Option<Vec<u8>>,
}

fn lost() -> io::Error {
    io::Error::other("TLS session lost leaving rustls")
}

impl RecordClient {
    fn from_rustls(
        io: Handshaking,
        conn: rustls::ClientConnection,
        suite: Suite,
        limit: u64,
    ) -> Result<Self, (io::Error, TcpStream)> {
        let mut conn = conn;
        let mut out = Vec::new();
        // Anything rustls still has to send (nothing after a handshake
        // tokio-rustls flushed, but it would be lost with the session).
        while conn.wants_write() {
            if let Err(e) = conn.write_tls(&mut out) {
                return Err((e, io.tcp));
            }
        }
        let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
        let Some((client, server)) = io.secrets.take() else {
            return Err((
                io::Error::other("no traffic secrets from the key log"),
                io.tcp,
            ));
        };
        let keys = match conn.dangerous_extract_secrets() {
            Ok(k) => k,
            Err(e) => return Err((io::Error::other(e), io.tcp)),
        };
        let wrong = || io::Error::other("rustls handed over keys of another suite");
        let Some(tx) = Direction::resume(suite, &client, keys.tx.0, &keys.tx.1) else {
            return Err((wrong(), io.tcp));
        };
        let Some(rx) = Direction::resume(suite, &server, keys.rx.0, &keys.rx.1) else {
            return Err((wrong(), io.tcp));
        };
        let Handshaking {
            tcp, mut buf, at, ..
        } = io;
        buf.drain(..at);
        Ok(Self {
            tcp,
            reader: RecordReader::for_client(rx),
            outbound: Outbound::new(tx, limit),
            inbuf: buf,
            start: 0,
            plain: (0, 0),
            out,
            sent: 0,
            read_state: ReadState::Open,
            close_sent: false,
            alpn,
        })
    }

    /// Whether a read would make progress without the socket.
    fn has_pending_read(&self) -> bool {
        self.read_state != ReadState::Open
            || self.plain.0 < self.plain.1
            || !matches!(record_len(&self.inbuf[self.start..]), Ok(None))
    }

    /// Gives back the buffers when nothing is in them: the read found the
    /// socket empty, so the connection may now stay idle for long.
    fn release_if_idle(&mut self) {
        if self.start == self.inbuf.len() && self.plain.0 == self.plain.1 {
            self.inbuf = Vec::new();
            self.start = 0;
            self.plain = (0, 0);
        }
        if self.sent == self.out.len() && self.out.capacity() > 0 {
            self.out = Vec::new();
            self.sent = 0;
        }
    }

    /// Whether the read buffer must make room before the next read: the
    /// first, small buffer once it is full or too short for the record at
    /// its front; the full-size one once under a record's room is left,
    /// so its reads stay large.
    fn needs_room(&self) -> bool {
        let (cap, len) = (self.inbuf.capacity(), self.inbuf.len());
        if cap >= READ_BUFFER {
            return cap - len < MAX_RECORD;
        }
        let record = self.inbuf[self.start..]
            .first_chunk::<{ records::HEADER_LEN }>()
            .map(|h| records::HEADER_LEN + usize::from(u16::from_be_bytes([h[3], h[4]])));
        len == cap || record.is_some_and(|r| self.start + r > cap)
    }

    fn poll_send_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        // Kept for the next batch while the connection is busy; released
        // by `release_if_idle`.
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Ends the connection on `e`: the alert it owes goes out before the
    /// write side closes (one attempt without waiting, as rustls; a flush
    /// or shutdown finishes it), and nothing is sent after it.
    fn fail(&mut self, e: TlsError, cx: &mut Context<'_>) -> io::Error {
        self.read_state = ReadState::Failed;
        self.inbuf = Vec::new();
        (self.start, self.plain) = (0, (0, 0));
        if let Some(alert) = e.alert
            && !self.close_sent
            && self.outbound.seal_alert(alert, &mut self.out).is_ok()
            && let Poll::Ready(Ok(())) = self.poll_send_out(cx)
        {
            let _ = Pin::new(&mut self.tcp).poll_shutdown(cx);
        }
        self.close_sent = true;
        e.into()
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.plain.0 < self.plain.1 {
                let n = (self.plain.1 - self.plain.0).min(buf.remaining());
                buf.put_slice(&self.inbuf[self.plain.0..self.plain.0 + n]);
                self.plain.0 += n;
                return Poll::Ready(Ok(()));
            }
            match self.read_state {
                ReadState::Open => {}
                ReadState::Closed => return Poll::Ready(Ok(())),
                ReadState::Failed => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "TLS connection failed earlier",
                    )));
                }
            }
            match record_len(&self.inbuf[self.start..]) {
                Err(e) => return Poll::Ready(Err(self.fail(e, cx))),
                Ok(Some(len)) => {
                    let at = self.start;
                    self.start += len;
                    match self.reader.open(&mut self.inbuf[at..at + len]) {
                        Ok(Opened::Data(r)) => self.plain = (at + r.start, at + r.end),
                        Ok(Opened::Nothing) => {}
                        Ok(Opened::KeyUpdate { requested }) => {
                            if requested {
                                self.outbound.owe_key_update();
                            }
                        }
                        Ok(Opened::Closed) => {
                            // "Any data received after a closure alert has
                            // been received MUST be ignored" (6.1).
                            self.read_state = ReadState::Closed;
                            self.inbuf = Vec::new();
                            (self.start, self.plain) = (0, (0, 0));
                            return Poll::Ready(Ok(()));
                        }
                        Err(e) => return Poll::Ready(Err(self.fail(e, cx))),
                    }
                    continue;
                }
                Ok(None) => {}
            }
            // A whole record is needed.
            if self.start == self.inbuf.len() {
                self.inbuf.clear();
                self.start = 0;
            }
            if self.inbuf.capacity() == 0 {
                // An idle connection's buffer waits for the socket to have
                // something.
                ready!(self.tcp.poll_read_ready(cx))?;
                self.inbuf.reserve_exact(FIRST_READ);
            } else if self.needs_room() {
                // The partial record (under one record) to the front, into
                // the full-size buffer if this is still the first one.
                self.inbuf.drain(..self.start);
                self.start = 0;
                if self.inbuf.capacity() < READ_BUFFER {
                    self.inbuf.reserve_exact(READ_BUFFER - self.inbuf.len());
                }
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.tcp), cx, &mut self.inbuf) {
                Poll::Pending => {
                    self.release_if_idle();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => {
                    // rustls reports the same: a TLS stream must end with
                    // close_notify.
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection without sending TLS close_notify",
                    )));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }

    fn poll_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // The previous batch goes out first: a gateway that stops reading
        // makes this stream hold one batch at most.
        ready!(self.poll_send_out(cx))?;
        if self.close_sent || self.read_state == ReadState::Failed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS write side already closed",
            )));
        }
        let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(WRITE_BATCH);
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        // One more record's room for a key update sealed before them.
        let records = total.div_ceil(MAX_PLAINTEXT);
        self.out.reserve(total + (records + 1) * SEAL_OVERHEAD);
        let mut sealed = 0;
        while sealed < total {
            let n = (total - sealed).min(MAX_PLAINTEXT);
            match self
                .outbound
                .seal_data_gathered(bufs, sealed, n, &mut self.out)
            {
                Ok(()) => sealed += n,
                // What was sealed goes out and is reported written; the
                // error comes with the next write.
                Err(_) if sealed > 0 => break,
                Err(e) => return Poll::Ready(Err(self.fail(e, cx))),
            }
        }
        // The records are ours to send now: one write now, the rest on
        // flush or the next write.
        if let Poll::Ready(Err(e)) = self.poll_send_out(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(sealed))
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_out(cx))?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_send_out(cx))?;
        if !self.close_sent {
            self.close_sent = true;
            self.outbound
                .seal_alert(records::ALERT_CLOSE_NOTIFY, &mut self.out)?;
            ready!(self.poll_send_out(cx))?;
        }
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl AsyncRead for ClientTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(r) => r.poll_read(cx, buf),
            Inner::Rustls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }
}

impl AsyncWrite for ClientTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Records(r) => r.poll_write_vectored(cx, &[IoSlice::new(buf)]),
            Inner::Rustls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Records(r) => r.poll_write_vectored(cx, bufs),
            Inner::Rustls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Inner::Records(_) => true,
            Inner::Rustls(tls) => tls.is_write_vectored(),
            Inner::Lost(_) => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(r) => r.poll_flush(cx),
            Inner::Rustls(tls) => Pin::new(&mut **tls).poll_flush(cx),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(r) => r.poll_shutdown(cx),
            Inner::Rustls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }
}

impl ReadReady for ClientTls {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Inner::Records(r) => {
                if r.has_pending_read() {
                    return Poll::Ready(Ok(()));
                }
                r.tcp.poll_read_ready(cx)
            }
            Inner::Rustls(tls) => tls.poll_read_ready(cx),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }

    /// Sealed records still queued go out first, then the socket must have room.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.inner {
            Inner::Records(r) => {
                ready!(r.poll_flush(cx))?;
                r.tcp.poll_write_ready(cx)
            }
            Inner::Rustls(tls) => tls.poll_write_ready(cx),
            Inner::Lost(_) => Poll::Ready(Err(lost())),
        }
    }

    fn reset_on_close(&self) {
        self.tcp().reset_on_close()
    }
}

/// The TLS error inside an `io::Error` from this stream, rustls's or the
/// record layer's.
pub fn is_tls_error(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.is::<rustls::Error>() || inner.is::<TlsError>())
}
