//! Setup failures: what stops a [`NodeAgentSource`](crate::NodeAgentSource)
//! or a [`FakeNodeAgent`](crate::FakeNodeAgent) from being built. Failures
//! of individual mints are `MintError`s instead.

use std::io;
use std::path::PathBuf;

use atunnel_identity::VerifierError;

/// Why a node-agent client or fake agent could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NodeAgentError {
    #[error("node agent socket path {:?} is unusable: {reason}", .path.display().to_string())]
    SocketPath { path: PathBuf, reason: &'static str },
    #[error("mint timeout for the node agent at {} must be positive", .socket.display())]
    ZeroTimeout { socket: PathBuf },
    #[error("trust anchors for checking peer identity {peer_id} are unusable: {source}")]
    Verifier {
        peer_id: String,
        #[source]
        source: VerifierError,
    },
    #[error("TLS client config for the node agent at {} is unusable: {source}", .socket.display())]
    ClientTls {
        socket: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS server config for the node agent at {} is unusable: {source}", .socket.display())]
    ServerTls {
        socket: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("{} exists and is not a socket; refusing to replace it", .path.display())]
    NotASocket { path: PathBuf },
    #[error("removing the stale socket {} failed: {source}", .path.display())]
    StaleSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding the node agent socket {} failed: {source}", .path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}
