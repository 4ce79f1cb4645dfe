//! How egress runs: socket options on both sides, the per-actor budget,
//! the gateway connections' windows and pool, and the relay's bounds.

use std::time::Duration;

use atunnel_core::relay::RelayBounds;
use atunnel_core::sockopt::SocketOptions;

use super::{ActorBudget, DEFAULT_DRAIN_TIMEOUT};

#[derive(Clone, Copy, Debug)]
pub struct EgressConfig {
    /// Network side: the gateway connections.
    pub socket: SocketOptions,
    /// Sandbox side: the actors' accepted connections.
    pub sandbox_socket: SocketOptions,
    pub drain_timeout: Duration,
    /// What each actor may make egress hold.
    pub budget: ActorBudget,
    /// Receive window per tunnel on the gateway connections: what one
    /// tunnel whose actor stopped reading can make atunnel hold.
    pub stream_window: u32,
    /// Receive window per gateway connection: the most one actor's tunnels
    /// on it hold unread together.
    pub connection_window: u32,
    /// Largest HTTP/2 frame the gateway may send.
    pub max_frame_size: u32,
    /// A pooled gateway connection with no tunnel for this long closes.
    pub pool_idle_timeout: Duration,
    /// Pooled gateway connections are pinged this often (zero: never)
    pub pool_ping_interval: Duration,
    /// and retired if a ping goes unanswered this long.
    pub pool_ping_timeout: Duration,
    /// When tunnels that cannot finish are reset.
    pub relay: RelayBounds,
    /// Each pooled gateway connection's HTTP/2 control-frame budget.
    pub h2_floods: atunnel_connect::flood::FloodLimits,
    /// How tunnels relay when the bench compares designs (lean otherwise).
    #[cfg(feature = "comparison")]
    pub comparison: crate::comparison::RelayVariant,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            socket: SocketOptions::default(),
            sandbox_socket: SocketOptions::sandbox_default(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            budget: ActorBudget::default(),
            stream_window: atunnel_connect::limits::TUNNEL_STREAM_WINDOW,
            connection_window: atunnel_connect::limits::TUNNEL_CONNECTION_WINDOW,
            max_frame_size: atunnel_connect::limits::TUNNEL_MAX_FRAME_SIZE,
            pool_idle_timeout: atunnel_connect::limits::POOL_IDLE_TIMEOUT,
            pool_ping_interval: atunnel_connect::limits::POOL_PING_INTERVAL,
            pool_ping_timeout: atunnel_connect::limits::POOL_PING_TIMEOUT,
            relay: RelayBounds::default(),
            h2_floods: atunnel_connect::flood::FloodLimits::default(),
            #[cfg(feature = "comparison")]
            comparison: crate::comparison::RelayVariant::default(),
        }
    }
}
