//! Where every mutual-TLS listener admits a client: the handshake within a
//! bound, then a check rustls does not make on resumed sessions.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::stream::{RecordTracking, RustlsStream};

/// Most bytes rustls queues for sending on an accepted connection (its
/// default is 64 KiB): behind a peer that stopped reading, what waits in
/// heap on top of the kernel's send queue. The kernel's queue, not this
/// one, carries a transfer between the peer's reads, so it costs no
/// throughput.
pub const SEND_QUEUE_LIMIT: usize = 16 * 1024;

/// Accepts mutual TLS on `tcp` within `timeout`, then refuses a client
/// that resumed a session with a leaf certificate outside its validity
/// period now. The stream comes boxed: it is over a kilobyte, and a future
/// it came out of unboxed would keep room for it for the connection's life.
///
/// The validity check is what makes session resumption safe: rustls
/// restores a resumed session's client chain from its ticket without
/// verifying it again, and every resumption hands out new tickets with that
/// chain, so a client could otherwise go on resuming long after its
/// certificate expired. A full handshake's verifier has made this check.
///
/// When the handshake fails (a refused client certificate, say), the alert
/// has been written; closing at once would turn the client's in-flight
/// Finished into a reset that can destroy the alert before it is read, so
/// half-close and drain briefly first. A client refused after the handshake
/// (rustls cannot send it an alert then) is closed the same way.
pub async fn accept(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    timeout: Duration,
) -> io::Result<Box<RustlsStream>> {
    let accept = tokio::time::timeout(
        timeout,
        acceptor.accept(RecordTracking::new(tcp)).into_fallible(),
    );
    let (e, mut tcp) = match accept.await {
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            ));
        }
        Ok(Ok(mut tls)) => match check_resumed_client(tls.get_ref().1) {
            Ok(()) => {
                tls.get_mut().1.set_buffer_limit(Some(SEND_QUEUE_LIMIT));
                return Ok(Box::new(tls));
            }
            Err(e) => (e, tls.into_inner().0),
        },
        Ok(Err((e, tcp))) => (e, tcp),
    };
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 1024];
    let drain = async { while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_millis(250), drain).await;
    Err(e)
}

/// Whether a resumed session's client leaf is valid now (see [`accept`]).
fn check_resumed_client(conn: &rustls::ServerConnection) -> io::Result<()> {
    if conn.handshake_kind() != Some(rustls::HandshakeKind::Resumed) {
        return Ok(());
    }
    let refused = |e| io::Error::new(io::ErrorKind::PermissionDenied, e);
    let leaf = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or_else(|| refused("no client certificate".into()))?;
    atunnel_identity::verifier::check_leaf_validity(leaf, rustls::pki_types::UnixTime::now())
        .map_err(|e| refused(format!("client refused after a resumed handshake: {e}")))
}
