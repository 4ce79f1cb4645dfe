//! TLS for connections that sit idle most of their life.
//!
//! - [`admission`]: where every mutual-TLS listener admits a client (a
//!   bounded handshake, then the validity check rustls skips on resumption).
//! - [`client`]: the client TLS stream of gateway connections: rustls for
//!   the handshake, then TLS 1.3 records opened in place.
//! - [`stream`]: the server TLS stream that, once idle, trades its rustls
//!   session (about 8 KiB) for its TLS 1.3 traffic secrets.
//! - [`records`]: the TLS 1.3 record layer that stream goes on with.
//! - [`secrets`]: the key log that hands that stream its traffic secrets,
//!   so that it can follow key updates.
//! - [`hibernate`]: idle detection, and asking a connection to hibernate.
//! - [`provider`]: the crypto provider and suite order of every endpoint.
//! - [`reloadable`]: a server config replaced while its listeners run.
//!
//! Depends on `atunnel-core` (readiness) and `atunnel-identity` (certificate
//! validity); knows nothing of actors, HTTP or CONNECT. The CONNECT server,
//! the gateway and ingress depend on it.

pub mod admission;
pub mod client;
pub mod hibernate;
pub mod pre_auth;
pub mod provider;
pub mod records;
pub mod reloadable;
pub mod secrets;
pub mod stream;

pub use admission::accept;
pub use hibernate::{Activity, ActivityIo, Hibernation, HibernationStats, with_hibernation};
pub use pre_auth::{PreAuthGate, PreAuthLimits, PreAuthPermit, PreAuthStats};
pub use reloadable::ReloadableConfig;
pub use stream::{RecordStream, RecordTracking, RustlsStream, ServerTls};
