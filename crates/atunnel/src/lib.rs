//! atunnel: the per-worker tunnel between actors' sandboxes and the world.
//!
//! A worker drives it through [`Tunnel`]: start, prepare an actor's egress,
//! serve its sandbox, activate, deactivate, close (see [`tunnel`]). Egress
//! relays each actor's connections through CONNECT tunnels to the gateway
//! ([`egress`]); ingress carries the router's HTTPS requests and CONNECT
//! tunnels into the sandboxes ([`ingress`]); [`stats`] serves what it costs;
//! [`host`] makes the worker's calls itself for N actors.
//!
//! Depends on every lower crate (core, identity, sandbox, dns, nodeagent,
//! tls, connect, process); only the bench and tests depend on it.

mod activation;
mod admin;
#[cfg(feature = "comparison")]
pub mod comparison;
pub mod control;
pub mod dns_relays;
pub mod egress;
pub mod holdings;
pub mod host;
pub mod ingress;
pub mod leftovers;
mod log_limit;
mod metrics;
mod shedding;
pub mod stats;
pub mod tunnel;

pub use atunnel_process::BoxError;

/// How long [`tunnel::Tunnel::shutdown`] waits for each thing it cancelled
/// to end on its own (router connections closing gracefully, an actor's
/// tasks, its gateway connections) before it drops it: enough for a few
/// round trips. The drain before shutdown was the time for work to finish,
/// and a peer that hung (a gateway that stopped reading) must not make the
/// stop outlast the supervisor's grace period.
pub const SHUTDOWN_CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
