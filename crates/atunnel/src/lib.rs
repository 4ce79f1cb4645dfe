//! atunnel: the per-worker tunnel between actors' sandboxes and the world.
//!
//! This crate knows actors, identities and the gateway; the byte moving is
//! `atunnel_core`'s.

pub mod clock;
pub mod config;
pub mod connect_server;
pub mod cpu_quota;
pub mod credential;
pub mod egress;
pub mod gateway;
pub mod gateway_client;
pub mod hibernate;
pub mod host;
pub mod http1;
pub mod ingress;
pub mod naive_copy;
pub mod process;
pub mod server_tls;
pub mod stats;
pub mod tls_records;
pub mod tunnel;

/// Errors at process entry points, where the message is all that is left.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
