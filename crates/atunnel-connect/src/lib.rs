//! CONNECT tunnels over mutual TLS, both ends.
//!
//! - [`client`]: opens tunnels to the egress gateway (HTTP/2 CONNECT
//!   streams over pooled connections, or HTTP/1.1 CONNECT, one per
//!   connection) with an actor's credential.
//! - [`server`]: the CONNECT server the gateway and ingress CONNECT share;
//!   what a tunnel may reach is its handler's.
//! - [`http1`]: CONNECT heads, read without over-reading.
//! - [`flood`]: HTTP/2 control-frame floods, bounded per connection under
//!   every HTTP/2 server and client.
//! - [`preface`]: an HTTP/2 client's preface, read within a bound.
//! - [`limits`]: every HTTP/2 window, stream limit, frame size and timeout,
//!   with the reason for each.
//!
//! Depends on `atunnel-core` (relay sides), `atunnel-identity` (the actor's
//! credential) and `atunnel-tls` (admission, hibernation); the tunnel and
//! the gateway depend on it.

pub mod client;
pub mod flood;
pub mod http1;
pub mod limits;
pub mod preface;
pub mod server;

pub use client::{
    ClientStats, GatewayClient, GatewayClientConfig, GatewayTunnel, OpenError, parse_destination,
};
pub use server::{Answer, ConnectHandler, ConnectRequest, ConnectServer, H2Settings};
