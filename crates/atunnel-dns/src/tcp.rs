//! DNS over TCP: one task per client connection, length-prefixed messages,
//! a fresh upstream connection per query.

use std::io;
use std::net::SocketAddr;

use atunnel_core::{Listener, ListenerStats};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::message::{HEADER_LEN, answers};
use crate::{DnsError, DnsRelay};

/// What reading one length-prefixed message produced.
enum Frame {
    Message(Vec<u8>),
    /// The peer closed the connection (or its write side) between or inside
    /// messages; either way there is nothing more to answer.
    Eof,
    /// A length below the DNS header: the stream cannot be trusted further.
    BadLength(u16),
}

async fn read_frame<R: AsyncRead + Unpin>(stream: &mut R) -> io::Result<Frame> {
    let mut prefix = [0u8; 2];
    match stream.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(Frame::Eof),
        Err(error) => return Err(error),
    }
    let len = u16::from_be_bytes(prefix);
    if usize::from(len) < HEADER_LEN {
        return Ok(Frame::BadLength(len));
    }
    let mut message = vec![0u8; usize::from(len)];
    match stream.read_exact(&mut message).await {
        Ok(_) => Ok(Frame::Message(message)),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(Frame::Eof),
        Err(error) => Err(error),
    }
}

/// Writes `message` with its length prefix in one write, so it leaves in one
/// segment where possible.
async fn write_frame<W: AsyncWrite + Unpin>(stream: &mut W, message: &[u8]) -> io::Result<()> {
    let len = u16::try_from(message.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "DNS message over 65535 bytes"))?;
    let mut frame = Vec::with_capacity(2 + message.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(message);
    stream.write_all(&frame).await
}

impl DnsRelay {
    /// Serves DNS over TCP on `listener` (created by the caller, typically in
    /// the sandbox's namespace) until `cancel` fires.
    ///
    /// Each client connection is served in its own task: length-prefixed
    /// queries are read one after another and each answer is written back
    /// length-prefixed. The connection is closed on EOF, on a length below a
    /// DNS header, after the idle timeout with no query, and when no upstream
    /// answers a query (the client then retries or fails over). Connections
    /// beyond the in-flight limit are closed at once and counted as dropped.
    /// On cancel, stops accepting, lets queries already being forwarded be
    /// answered, closes every connection, and returns once all have ended.
    pub async fn serve_tcp(&self, listener: TcpListener, cancel: CancellationToken) {
        let stats = ListenerStats::default();
        Listener::new(listener, "dns-tcp")
            .serve(&cancel, &stats, |stream, client| {
                let Some(permit) = self.try_admit() else {
                    tracing::debug!(%client, "DNS relay: in-flight limit reached; refusing TCP connection");
                    self.counters().dropped();
                    return None;
                };
                Some(
                    self.clone()
                        .serve_connection(stream, client, cancel.clone(), permit),
                )
            })
            .await
    }

    async fn serve_connection(
        self,
        mut stream: TcpStream,
        client: SocketAddr,
        cancel: CancellationToken,
        _permit: OwnedSemaphorePermit,
    ) {
        // One write per answer, but a pipelining client can have the next
        // answer wait on a delayed ACK without this.
        let _ = stream.set_nodelay(true);
        let lowat = self.config().tcp_notsent_lowat;
        if let Err(error) = set_notsent_lowat(&stream, lowat) {
            tracing::debug!(%client, %error, "DNS relay: cannot set TCP_NOTSENT_LOWAT; closing");
            return;
        }
        let idle = self.config().tcp_idle_timeout;
        loop {
            let frame = tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                frame = tokio::time::timeout(idle, read_frame(&mut stream)) => frame,
            };
            let query = match frame {
                Ok(Ok(Frame::Message(query))) => query,
                Ok(Ok(Frame::Eof)) => return,
                Ok(Ok(Frame::BadLength(len))) => {
                    tracing::debug!(%client, len, "DNS relay: bad TCP length prefix; closing");
                    self.counters().dropped();
                    return;
                }
                Ok(Err(error)) => {
                    tracing::debug!(%client, %error, "DNS relay: TCP read failed");
                    return;
                }
                Err(_elapsed) => {
                    tracing::debug!(%client, ?idle, "DNS relay: idle TCP connection; closing");
                    return;
                }
            };
            self.counters().tcp_query();
            // Not raced against cancel: a query already read is answered, so
            // shutdown does not turn into a client-visible failure.
            let answer = self
                .first_answer(|upstream| exchange(upstream, &query, lowat))
                .await;
            let Some(answer) = answer else {
                // Closing tells the client at once that this server failed,
                // rather than leaving it to its own timeout.
                self.counters().timed_out();
                return;
            };
            // Bounded, so a client that stops reading cannot pin the task
            // (and shutdown) forever.
            let timeout = self.config().timeout;
            match tokio::time::timeout(timeout, write_frame(&mut stream, &answer)).await {
                Ok(Ok(())) => self.counters().answered(),
                Ok(Err(error)) => {
                    tracing::debug!(%client, %error, "DNS relay: cannot write TCP answer");
                    return;
                }
                Err(_elapsed) => {
                    tracing::debug!(%client, "DNS relay: client did not take its TCP answer in time");
                    return;
                }
            }
        }
    }
}

/// Sets `TCP_NOTSENT_LOWAT` on `stream` unless `lowat` is `None` (kernel
/// default).
fn set_notsent_lowat(stream: &TcpStream, lowat: Option<u32>) -> io::Result<()> {
    match lowat {
        Some(lowat) => socket2::SockRef::from(stream).set_tcp_notsent_lowat(lowat),
        None => Ok(()),
    }
}

/// One exchange with one upstream over a new connection; the caller's timeout
/// covers connect and exchange. Messages that do not carry the query's ID are
/// skipped, as over UDP.
async fn exchange(
    upstream: SocketAddr,
    query: &[u8],
    lowat: Option<u32>,
) -> Result<Vec<u8>, DnsError> {
    let io_error = |source| DnsError::Upstream { upstream, source };
    let mut stream = TcpStream::connect(upstream).await.map_err(io_error)?;
    let _ = stream.set_nodelay(true);
    set_notsent_lowat(&stream, lowat).map_err(io_error)?;
    write_frame(&mut stream, query).await.map_err(io_error)?;
    loop {
        match read_frame(&mut stream).await.map_err(io_error)? {
            Frame::Message(answer) if answers(query, &answer) => return Ok(answer),
            Frame::Message(answer) => {
                tracing::debug!(%upstream, len = answer.len(), "DNS relay: ignoring a TCP message that does not answer the query");
            }
            Frame::Eof => {
                return Err(io_error(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed the connection without answering",
                )));
            }
            Frame::BadLength(len) => {
                return Err(io_error(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("length prefix {len} is shorter than a DNS header"),
                )));
            }
        }
    }
}
