//! DNS over TCP: one task per client connection, length-prefixed messages,
//! a fresh upstream connection per query.

use std::future::Future;
use std::io;
use std::net::SocketAddr;

use atunnel_core::{Listener, ListenerCounters};
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
    // Grown as bytes arrive, never sized by the prefix alone: a client that
    // claims 65,535 bytes and sends a few would otherwise hold 64 KiB per
    // connection until the idle timeout. The room doubles with what has
    // arrived, so the buffer stays within twice the bytes received (or
    // FIRST_READ), and `take` keeps the next frame's bytes in the stream.
    let len = usize::from(len);
    let mut message = Vec::new();
    while message.len() < len {
        let remaining = len - message.len();
        message.reserve_exact(message.len().max(FIRST_READ).min(remaining));
        let read = (&mut *stream)
            .take(remaining as u64)
            .read_buf(&mut message)
            .await?;
        if read == 0 {
            return Ok(Frame::Eof);
        }
    }
    Ok(Frame::Message(message))
}

/// The first read's room for a message: a classic (non-EDNS) UDP-sized
/// message, which most queries fit in one go.
const FIRST_READ: usize = 512;

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
    ///
    /// Not an `async fn`, which would keep a second copy of its arguments
    /// in a future every sandbox holds for its life (rust-lang/rust#62958).
    #[allow(clippy::manual_async_fn)] // the `async fn` is what this avoids
    pub fn serve_tcp(
        self,
        listener: TcpListener,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut listener = Listener::new(listener, "dns-tcp");
        async move {
            let stats = ListenerCounters::default();
            listener
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

#[cfg(test)]
mod fuzz {
    //! Length-prefixed framing against arbitrary and near-valid streams, in
    //! arbitrary chunks.

    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    use atunnel_core::test_util::{Chunked, run_bounded};

    const GUARD: Duration = Duration::from_secs(10);

    #[derive(Debug, PartialEq, Eq)]
    enum Read {
        Message(Vec<u8>),
        Eof,
        BadLength(u16),
    }

    /// Reads frames until one is not a message, as `serve_connection` does.
    async fn read_all(peer: &mut Chunked) -> Vec<Read> {
        let mut out = Vec::new();
        loop {
            let last = match read_frame(peer)
                .await
                .expect("an in-memory read cannot fail")
            {
                Frame::Message(m) => {
                    out.push(Read::Message(m));
                    continue;
                }
                Frame::Eof => Read::Eof,
                Frame::BadLength(len) => Read::BadLength(len),
            };
            out.push(last);
            return out;
        }
    }

    /// The frames RFC 1035 4.2.2 (and the relay's header rule) say `input`
    /// holds, then EOF: written independently of `read_frame`.
    fn expected(mut input: &[u8]) -> Vec<Read> {
        let mut out = Vec::new();
        loop {
            let [hi, lo, rest @ ..] = input else {
                out.push(Read::Eof);
                return out;
            };
            let len = u16::from_be_bytes([*hi, *lo]);
            if usize::from(len) < 12 {
                out.push(Read::BadLength(len));
                return out;
            }
            if rest.len() < usize::from(len) {
                out.push(Read::Eof);
                return out;
            }
            out.push(Read::Message(rest[..usize::from(len)].to_vec()));
            input = &rest[usize::from(len)..];
        }
    }

    fn framed(messages: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.extend_from_slice(&(m.len() as u16).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    fn message() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 12..300)
    }

    fn sizes() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(1usize..128, 0..8)
    }

    /// How much room a buffer for `received` bytes may have.
    fn allowed_room(received: usize) -> usize {
        (2 * received).max(FIRST_READ)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_frame_as_the_rfc_says(
            input in prop::collection::vec(any::<u8>(), 0..200),
            sizes in sizes(),
        ) {
            let mut peer = Chunked::new(input.clone(), sizes);
            let got = run_bounded(GUARD, read_all(&mut peer));
            prop_assert_eq!(got, expected(&input));
            prop_assert!(peer.largest_offer() <= allowed_room(input.len()));
        }

        #[test]
        fn pipelined_queries_read_the_same_in_any_chunks_and_a_cut_one_is_eof(
            messages in prop::collection::vec(message(), 1..5),
            cut in prop::option::of(any::<prop::sample::Index>()),
            sizes in sizes(),
        ) {
            let mut input = framed(&messages);
            if let Some(cut) = cut {
                input.truncate(cut.index(input.len()));
            }
            let whole = run_bounded(GUARD, read_all(&mut Chunked::new(input.clone(), vec![])));
            let mut peer = Chunked::new(input.clone(), sizes);
            let split = run_bounded(GUARD, read_all(&mut peer));
            prop_assert_eq!(&split, &whole);
            prop_assert_eq!(split, expected(&input));
            prop_assert_eq!(peer.consumed(), input.len());
        }

        #[test]
        fn a_claimed_length_sizes_nothing_beyond_what_arrived(
            claimed in 12u16..=u16::MAX,
            sent in 0usize..2000,
            sizes in sizes(),
        ) {
            let mut input = claimed.to_be_bytes().to_vec();
            input.extend(std::iter::repeat_n(0x5a, sent.min(usize::from(claimed))));
            let mut peer = Chunked::new(input.clone(), sizes);
            let got = run_bounded(GUARD, read_all(&mut peer));
            prop_assert_eq!(got, expected(&input));
            prop_assert!(
                peer.largest_offer() <= allowed_room(input.len()),
                "offered {} bytes of room for {} received", peer.largest_offer(), input.len()
            );
        }

        #[test]
        fn written_frames_read_back(messages in prop::collection::vec(message(), 1..4)) {
            let mut wire = Vec::new();
            run_bounded(GUARD, async {
                for m in &messages {
                    write_frame(&mut wire, m).await.expect("write to a Vec");
                }
            });
            prop_assert_eq!(&wire, &framed(&messages));
            let got = run_bounded(GUARD, read_all(&mut Chunked::new(wire, vec![])));
            let mut want: Vec<Read> = messages.into_iter().map(Read::Message).collect();
            want.push(Read::Eof);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn the_largest_message_reads_back_and_a_larger_one_is_not_written() {
        let largest = vec![7u8; usize::from(u16::MAX)];
        let mut wire = Vec::new();
        run_bounded(GUARD, write_frame(&mut wire, &largest)).expect("65535 bytes fit");
        let got = run_bounded(
            GUARD,
            read_all(&mut Chunked::new(wire, vec![1000, 1, 7000])),
        );
        assert_eq!(got, vec![Read::Message(largest), Read::Eof]);
        let error = run_bounded(GUARD, write_frame(&mut Vec::new(), &[0; 65_536]))
            .expect_err("65536 bytes do not fit a length prefix");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }
}
