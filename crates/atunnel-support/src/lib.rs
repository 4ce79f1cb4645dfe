//! What atunnel's tests and its bench both need, so neither keeps a copy:
//!
//! - [`pki`]: a throwaway PKI shaped like the cluster's;
//! - [`sink`]: the far end of a bench gateway, answering tunnels by port;
//! - [`sink_tls`]: the same services over TLS, the far end of a TCP -> TLS relay;
//! - [`gateway`]: gateways on loopback, and actors' clients of them;
//! - [`scripted_gateway`]: a gateway a test scripts connection by connection;
//! - [`ingress`]: ingress on loopback and the actors behind it;
//! - [`router`]: the router's client side of ingress;
//! - [`peers`]: destinations and checks of how a socket ended;
//! - [`stats_client`]: reads a `/stats` endpoint.
//!
//! Development only: the bench and the tests depend on it, no production
//! crate does. Fixtures panic on setup failures (they are tests' setup).

pub mod gateway;
pub mod h2_raw;
pub mod ingress;
pub mod overload;
pub mod peers;
pub mod pki;
pub mod router;
pub mod scripted_gateway;
pub mod sink;
pub mod sink_role;
pub mod sink_tls;
pub mod stats_client;

/// Every fixture, for a test's one `use`.
pub mod prelude {
    pub use crate::gateway::*;
    pub use crate::ingress::*;
    pub use crate::overload::*;
    pub use crate::peers::*;
    pub use crate::pki::*;
    pub use crate::router::*;
    pub use crate::scripted_gateway::*;
    pub use crate::sink::{Service, SinkConfig};
}
