//! DNS over UDP: one task per query, a fresh upstream socket per exchange.

use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::message::{HEADER_LEN, answers};
use crate::{DnsError, DnsRelay};

/// Largest query read from a client. Queries are small (a header and one
/// question); 4096 is the common EDNS ceiling and bounds what a sandbox can
/// make the relay copy.
const MAX_QUERY_LEN: usize = 4096;

/// Room for the largest possible UDP payload, so an answer is never cut
/// short. Only reserved, not zeroed, so physical memory tracks the answer
/// actually received.
const MAX_ANSWER_LEN: usize = 65_535;

impl DnsRelay {
    /// Serves DNS over UDP on `socket` (created by the caller, typically in
    /// the sandbox's namespace) until `cancel` fires.
    ///
    /// Each datagram of at least a DNS header and at most 4096 bytes is
    /// forwarded in its own task; shorter and longer ones, and those beyond
    /// the in-flight limit, are dropped and counted. An answer goes back to
    /// the address the query came from; if no upstream answers, nothing is
    /// sent and the client retries. On cancel, stops reading, waits for the
    /// queries already being forwarded, and returns with the socket closed.
    ///
    /// Not an `async fn`, which would keep a second copy of its arguments
    /// in a future every sandbox holds for its life (rust-lang/rust#62958).
    #[allow(clippy::manual_async_fn)] // the `async fn` is what this avoids
    pub fn serve_udp(
        self,
        socket: UdpSocket,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let socket = Arc::new(socket);
            let tracker = TaskTracker::new();
            loop {
                let readable = tokio::select! {
                    // Cancel first, so a flood of datagrams cannot delay shutdown.
                    biased;
                    () = cancel.cancelled() => break,
                    // Polled, not `readable()`: its waker lives in the socket's
                    // registration rather than in this future, which every
                    // sandbox holds, idle, for its life.
                    readable = std::future::poll_fn(|cx| socket.poll_recv_ready(cx)) => readable,
                };
                if let Err(error) = readable {
                    tracing::debug!(%error, "DNS relay: UDP socket not readable");
                    continue;
                }
                // The receive buffer lives on the stack only while a datagram is
                // read, not in this future while the relay waits: an idle
                // sandbox's relay holds no buffer. One byte more than a query may
                // have, so a longer datagram (which the kernel cuts to the
                // buffer) is seen and dropped rather than forwarded cut short.
                let mut buf = [0u8; MAX_QUERY_LEN + 1];
                let (len, client) = match socket.try_recv_from(&mut buf) {
                    Ok(received) => received,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(error) => {
                        // Errors on an unconnected UDP socket are per-datagram
                        // (ICMP reports and the like); the socket stays usable.
                        tracing::debug!(%error, "DNS relay: UDP receive failed");
                        continue;
                    }
                };
                self.counters().udp_query();
                if !(HEADER_LEN..=MAX_QUERY_LEN).contains(&len) {
                    self.counters().dropped();
                    continue;
                }
                let Some(permit) = self.try_admit() else {
                    tracing::debug!(%client, "DNS relay: in-flight limit reached; dropping UDP query");
                    self.counters().dropped();
                    continue;
                };
                let query = buf[..len].to_vec();
                tracker.spawn(
                    self.clone()
                        .answer_udp(query, client, Arc::clone(&socket), permit),
                );
            }
            tracker.close();
            Box::pin(tracker.wait()).await;
        }
    }

    /// Forwards one query and sends the first answer back to `client`.
    async fn answer_udp(
        self,
        query: Vec<u8>,
        client: SocketAddr,
        socket: Arc<UdpSocket>,
        _permit: OwnedSemaphorePermit,
    ) {
        let answer = self
            .first_answer(|upstream| exchange(upstream, &query))
            .await;
        let Some(answer) = answer else {
            self.counters().timed_out();
            return;
        };
        match socket.send_to(&answer, client).await {
            Ok(_) => self.counters().answered(),
            Err(error) => tracing::debug!(%client, %error, "DNS relay: cannot send UDP answer"),
        }
    }
}

/// One exchange with one upstream. The socket is fresh and connected to the
/// upstream, so the kernel discards datagrams from anyone else and an
/// unreachable upstream fails fast (ICMP port unreachable) instead of using
/// up the timeout. The caller bounds the wait.
async fn exchange(upstream: SocketAddr, query: &[u8]) -> Result<Vec<u8>, DnsError> {
    let io_error = |source| DnsError::Upstream { upstream, source };
    let local: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.map_err(io_error)?;
    socket.connect(upstream).await.map_err(io_error)?;
    socket.send(query).await.map_err(io_error)?;
    let mut answer = Vec::with_capacity(MAX_ANSWER_LEN);
    loop {
        answer.clear();
        socket.recv_buf(&mut answer).await.map_err(io_error)?;
        if answers(query, &answer) {
            return Ok(answer);
        }
        // A late answer to an earlier query, or not DNS at all: keep waiting
        // for ours until the caller's timeout.
        tracing::debug!(%upstream, len = answer.len(), "DNS relay: ignoring a UDP datagram that does not answer the query");
    }
}
