//! Actor certificates from the node agent (atelet). Depends on
//! `atunnel-identity` (the certificate source it implements); the tunnel
//! and the bench depend on it.
//!
//! atunnel asks atelet, over a node-local Unix socket, to sign each actor's
//! CSR (gRPC `AteomSupport.MintActorCertificate`). The socket is protected
//! by mutual TLS 1.3: atunnel presents the worker pod's certificate and
//! checks atelet's exact SPIFFE ID. tonic's TLS support is TCP-only, so the
//! TLS is ours (tokio-rustls over `UnixStream`, in the `transport` module).
//!
//! - [`proto`]: the generated messages, client and server.
//! - [`NodeAgentSource`]: the [`CertificateSource`](atunnel_identity::CertificateSource)
//!   that mints through the agent.
//! - [`FakeNodeAgent`]: an in-process agent signing with a local CA, with
//!   scripted misbehaviour, for tests and the benchmark.

pub mod error;
pub mod fake;
pub mod source;
pub(crate) mod transport;

/// The node agent's gRPC API, generated from `proto/ateom_support.proto`.
pub mod proto {
    tonic::include_proto!("ateom.support.v1");
}

pub use error::NodeAgentError;
pub use fake::{Behavior, FakeAgentTls, FakeNodeAgent, FakeNodeAgentHandle};
pub use source::{DEFAULT_MINT_TIMEOUT, NodeAgentConfig, NodeAgentSource};
/// Re-exported so [`Behavior::Fail`] can be built without depending on tonic.
pub use tonic::Code;
