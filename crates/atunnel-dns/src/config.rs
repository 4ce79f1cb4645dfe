//! Relay configuration.

use std::net::SocketAddr;
use std::time::Duration;

/// How a [`DnsRelay`](crate::DnsRelay) forwards queries.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Resolvers to try, in order; the first answer wins.
    pub upstreams: Vec<SocketAddr>,
    /// Budget for one exchange with one upstream (for TCP it covers the
    /// connect too). Default 5 s.
    pub timeout: Duration,
    /// Maximum concurrent work per relay: UDP queries being forwarded plus
    /// open TCP client connections. Beyond it, UDP queries and new TCP
    /// connections are dropped and counted. Default 256.
    pub max_in_flight: usize,
    /// A TCP client connection with no complete query for this long is
    /// closed. Default 10 s.
    pub tcp_idle_timeout: Duration,
    /// `TCP_NOTSENT_LOWAT` in bytes on every TCP socket the relay accepts or
    /// dials, set on each accepted socket itself (a listener's value is not
    /// reliably inherited); `None` leaves the kernel default. Default 16 KiB,
    /// as atunnel's `--tcp-notsent-lowat`.
    pub tcp_notsent_lowat: Option<u32>,
}

impl RelayConfig {
    /// Default per-exchange timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default in-flight limit.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;
    /// Default TCP idle timeout.
    pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default `TCP_NOTSENT_LOWAT`.
    pub const DEFAULT_TCP_NOTSENT_LOWAT: u32 = 16 * 1024;

    /// The defaults, forwarding to `upstreams`.
    pub fn new(upstreams: Vec<SocketAddr>) -> Self {
        Self {
            upstreams,
            timeout: Self::DEFAULT_TIMEOUT,
            max_in_flight: Self::DEFAULT_MAX_IN_FLIGHT,
            tcp_idle_timeout: Self::DEFAULT_TCP_IDLE_TIMEOUT,
            tcp_notsent_lowat: Some(Self::DEFAULT_TCP_NOTSENT_LOWAT),
        }
    }
}

impl Default for RelayConfig {
    /// The defaults with no upstreams; fill `upstreams` in before
    /// [`DnsRelay::new`](crate::DnsRelay::new), which rejects an empty list.
    fn default() -> Self {
        Self::new(Vec::new())
    }
}
