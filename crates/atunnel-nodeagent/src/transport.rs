//! gRPC's transport to the node agent: HTTP/2 over mutual TLS 1.3 over a
//! Unix socket. tonic's own TLS is for TCP, so both ends do TLS themselves
//! with tokio-rustls and hand tonic an already-secured byte stream.
//!
//! Identities are SPIFFE IDs checked by `atunnel_identity`'s verifiers; the
//! TLS server name is meaningless on a Unix socket and is not checked.

use std::convert::Infallible;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use atunnel_identity::{spiffe_client_verifier, spiffe_server_verifier};
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::error::NodeAgentError;

/// The only application protocol spoken on the socket.
const ALPN_H2: &[u8] = b"h2";

/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// A peer that connects but never finishes its handshake must not hold a
/// task and a socket forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// After a failed `accept` (typically EMFILE) wait before retrying, so the
/// loop does not spin on an error that persists.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Checked up front so a bad path fails at setup with a clear message
/// rather than on every connection attempt.
pub(crate) fn check_socket_path(path: &Path) -> Result<(), NodeAgentError> {
    let reason = if path.as_os_str().is_empty() {
        Some("it is empty")
    } else if path.as_os_str().as_bytes().len() > MAX_SOCKET_PATH {
        Some("longer than the 107 bytes a Unix socket address holds")
    } else if path.as_os_str().as_bytes().contains(&0) {
        Some("it contains a NUL byte")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(NodeAgentError::SocketPath {
            path: path.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // No process-wide provider is installed; name ours explicitly.
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The worker's side: present `chain`, accept only `agent_id`, TLS 1.3, h2.
pub(crate) fn client_config(
    socket: &Path,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: &[CertificateDer<'static>],
    agent_id: &str,
) -> Result<Arc<ClientConfig>, NodeAgentError> {
    let tls_error = |source| NodeAgentError::ClientTls {
        socket: socket.to_owned(),
        source,
    };
    let verifier =
        spiffe_server_verifier(roots, agent_id).map_err(|source| NodeAgentError::Verifier {
            peer_id: agent_id.to_owned(),
            source,
        })?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(tls_error)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // There is no host name on a Unix socket; do not send one.
    config.enable_sni = false;
    Ok(Arc::new(config))
}

/// The agent's side: present `chain`, admit only `allowed_client_id`, TLS 1.3, h2.
pub(crate) fn server_config(
    socket: &Path,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: &[CertificateDer<'static>],
    allowed_client_id: &str,
) -> Result<Arc<ServerConfig>, NodeAgentError> {
    let tls_error = |source| NodeAgentError::ServerTls {
        socket: socket.to_owned(),
        source,
    };
    let verifier = spiffe_client_verifier(client_roots, allowed_client_id).map_err(|source| {
        NodeAgentError::Verifier {
            peer_id: allowed_client_id.to_owned(),
            source,
        }
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(tls_error)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// Why one connection to the agent could not be set up. The socket is in
/// the message so logs say which agent was unreachable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("connecting to {}", .socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("TLS handshake with the node agent at {}", .socket.display())]
    Handshake {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the node agent at {} did not negotiate HTTP/2 (ALPN h2)", .socket.display())]
    NoH2 { socket: PathBuf },
}

/// Dials the agent and completes mutual TLS; the result is what tonic's
/// custom connector must return.
pub(crate) async fn dial(
    socket: PathBuf,
    tls: TlsConnector,
) -> Result<TokioIo<tokio_rustls::client::TlsStream<UnixStream>>, DialError> {
    let stream = match UnixStream::connect(&socket).await {
        Ok(stream) => stream,
        Err(source) => return Err(DialError::Connect { socket, source }),
    };
    // Any name will do: the server verifier checks the SPIFFE ID instead,
    // and SNI is off.
    let name = ServerName::try_from("nodeagent").expect("\"nodeagent\" is a valid DNS name");
    let stream = match tls.connect(name, stream).await {
        Ok(stream) => stream,
        Err(source) => return Err(DialError::Handshake { socket, source }),
    };
    if stream.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
        return Err(DialError::NoH2 { socket });
    }
    Ok(TokioIo::new(stream))
}

/// One accepted, authenticated connection, as tonic's server wants it.
pub(crate) struct ServerConn(tokio_rustls::server::TlsStream<UnixStream>);

impl tonic::transport::server::Connected for ServerConn {
    // Nothing to report: the peer is a Unix socket without an address, and
    // its identity was fixed by the client verifier (one allowed SPIFFE ID).
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for ServerConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts on `listener` until `cancel`, and yields the connections whose
/// mutual-TLS handshake succeeded. Handshakes run concurrently so one slow
/// peer does not hold up the others; refused ones are logged and dropped
/// (tonic never sees them, so no call is made on them).
pub(crate) fn accept_tls(
    listener: UnixListener,
    config: Arc<ServerConfig>,
    cancel: CancellationToken,
) -> (
    ReceiverStream<Result<ServerConn, Infallible>>,
    JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = TlsAcceptor::from(config);
    let task = tokio::spawn(async move {
        // Dropping the set when the loop ends aborts unfinished handshakes.
        let mut handshakes = JoinSet::new();
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        handshakes.spawn(handshake(acceptor.clone(), stream, tx.clone()));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "node agent: accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            }
        }
    });
    (ReceiverStream::new(rx), task)
}

async fn handshake(
    acceptor: TlsAcceptor,
    stream: UnixStream,
    tx: mpsc::Sender<Result<ServerConn, Infallible>>,
) {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            // A closed receiver means the server is stopping; the connection
            // is simply dropped.
            let _ = tx.send(Ok(ServerConn(tls))).await;
        }
        Ok(Err(error)) => tracing::warn!(%error, "node agent: TLS handshake refused"),
        Err(_) => tracing::warn!(
            timeout = ?HANDSHAKE_TIMEOUT,
            "node agent: TLS handshake did not finish in time"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_that_cannot_be_bound_are_refused_up_front() {
        assert!(check_socket_path(Path::new("/run/atelet/ateom.sock")).is_ok());
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH));
        for bad in ["", long.as_str(), "/tmp/a\0b"] {
            let err = check_socket_path(Path::new(bad)).expect_err(bad);
            assert!(matches!(err, NodeAgentError::SocketPath { .. }), "{err}");
        }
        let exact = format!("/{}", "a".repeat(MAX_SOCKET_PATH - 1));
        assert!(check_socket_path(Path::new(&exact)).is_ok());
    }
}
