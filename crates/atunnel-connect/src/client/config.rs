//! Where and how a gateway client reaches the gateway: the one struct its
//! caller fills in, each default from [`crate::limits`]; the client only
//! reads it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atunnel_core::sockopt::SocketOptions;
use rustls::pki_types::ServerName;

use crate::flood::FloodLimits;
use crate::limits::{
    OPEN_TIMEOUT, POOL_IDLE_TIMEOUT, POOL_PING_INTERVAL, POOL_PING_TIMEOUT, REFUSAL_BODY_WAIT,
    TUNNEL_CONNECTION_WINDOW, TUNNEL_MAX_FRAME_SIZE, TUNNEL_STREAM_WINDOW,
};

/// Where and how to reach the gateway.
#[derive(Clone, Debug)]
pub struct GatewayClientConfig {
    pub address: SocketAddr,
    /// The name the gateway's certificate must carry.
    pub server_name: ServerName<'static>,
    /// CAs that sign the gateway's certificate.
    pub roots: Arc<rustls::RootCertStore>,
    pub socket: SocketOptions,
    pub open_timeout: Duration,
    /// See [`REFUSAL_BODY_WAIT`].
    pub refusal_body_wait: Duration,
    /// Receive window per tunnel (see [`TUNNEL_STREAM_WINDOW`]).
    pub stream_window: u32,
    /// Receive window per pooled connection: the most its tunnels together
    /// hold unread (see [`TUNNEL_CONNECTION_WINDOW`]).
    pub connection_window: u32,
    /// Largest frame the gateway may send (see [`TUNNEL_MAX_FRAME_SIZE`]).
    pub max_frame_size: u32,
    /// A pooled connection with no tunnel for this long is closed (see
    /// [`POOL_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// A pooled connection is pinged this often (see [`POOL_PING_INTERVAL`];
    /// zero: never)
    pub ping_interval: Duration,
    /// and retired if a ping is not answered within this.
    pub ping_timeout: Duration,
    /// Each pooled connection's control-frame budget ([`crate::flood`]).
    pub floods: FloodLimits,
}

impl GatewayClientConfig {
    pub fn new(
        address: SocketAddr,
        server_name: ServerName<'static>,
        roots: Arc<rustls::RootCertStore>,
    ) -> Self {
        Self {
            address,
            server_name,
            roots,
            socket: SocketOptions::default(),
            open_timeout: OPEN_TIMEOUT,
            refusal_body_wait: REFUSAL_BODY_WAIT,
            stream_window: TUNNEL_STREAM_WINDOW,
            connection_window: TUNNEL_CONNECTION_WINDOW,
            max_frame_size: TUNNEL_MAX_FRAME_SIZE,
            idle_timeout: POOL_IDLE_TIMEOUT,
            ping_interval: POOL_PING_INTERVAL,
            ping_timeout: POOL_PING_TIMEOUT,
            floods: FloodLimits::default(),
        }
    }
}
