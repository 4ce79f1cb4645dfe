//! atunnel: the per-worker tunnel between actors' sandboxes and the world.
//!
//! This crate knows actors, identities and the gateway; the byte moving is
//! `atunnel_core`'s.

pub mod clock;
pub mod credential;
pub mod egress;
pub mod gateway;
pub mod gateway_client;
pub mod http1;
