//! A DNS relay for one sandbox that moves DNS messages without interpreting
//! them.
//!
//! Each sandbox gets a small relay listening on `169.254.17.1:53` (UDP and
//! TCP) inside the sandbox's gateway network namespace; it forwards every
//! query to the worker's resolvers and hands the answer back. It depends
//! on `atunnel-core` (its accept loop); the tunnel depends on it.
//!
//! # What the relay does not do
//!
//! The relay never parses DNS. It only looks at the two things it needs to
//! move a message safely: that it is at least as long as the 12-byte DNS
//! header, and the 2-byte ID (so that an answer is matched to the query it
//! belongs to). It does not read names, types or records, does not cache,
//! rewrite or filter, and has no notion of policy: policy is not its job.
//! Keeping it a byte mover keeps it small, keeps untrusted input away from a
//! DNS parser, and leaves the resolvers' behaviour (search domains, DNSSEC,
//! EDNS) exactly as the worker would see it.
//!
//! A consequence worth stating plainly: **DNS bypasses the egress tunnel and
//! is not checked against egress policy.** Names a sandbox resolves reach
//! the worker's resolvers whatever the egress policy says; only the
//! connections the sandbox later makes are subject to it.
//!
//! # Namespaces
//!
//! The caller creates the listening sockets (inside the sandbox's namespace)
//! and hands them to [`DnsRelay::serve_udp`] and [`DnsRelay::serve_tcp`]. The
//! relay creates its upstream sockets itself, in whatever network namespace
//! the runtime thread that polls it is in, so it must run on a runtime whose
//! threads are in the worker's namespace: that is how it reaches the
//! worker's resolvers (typically found with [`resolvers_from_resolv_conf`]).
//!
//! # Shutdown
//!
//! Every task the relay spawns is tracked. When the `cancel` token given to a
//! `serve_*` call fires, that call stops accepting, lets exchanges already
//! under way finish (each is bounded by the per-exchange timeout times the
//! number of upstreams), closes idle TCP connections, and returns only once
//! all its tasks have ended and the listening socket is closed.

mod config;
mod error;
mod message;
mod relay;
mod resolv_conf;
mod stats;
mod tcp;
mod udp;

pub use config::RelayConfig;
pub use error::DnsError;
pub use relay::DnsRelay;
pub use resolv_conf::resolvers_from_resolv_conf;
pub use stats::DnsRelayStats;
