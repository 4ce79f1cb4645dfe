//! The crate's error type.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in this crate; each variant names the file or
/// address involved so a log line is enough to act on.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The resolver configuration could not be read.
    #[error("cannot read resolver configuration {}: {source}", path.display())]
    ReadResolvConf {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },

    /// The resolver configuration has no usable `nameserver` line.
    #[error("no usable nameserver line in {}", path.display())]
    NoNameserver {
        /// The file that was parsed.
        path: PathBuf,
    },

    /// [`RelayConfig::upstreams`](crate::RelayConfig::upstreams) is empty.
    #[error("no upstream resolvers configured for the DNS relay")]
    NoUpstreams,

    /// An upstream address the relay could never send to.
    #[error("invalid upstream resolver {upstream}: {reason}")]
    InvalidUpstream {
        /// The offending address.
        upstream: SocketAddr,
        /// Why it is unusable.
        reason: &'static str,
    },

    /// A configuration value outside what the relay can work with.
    #[error("invalid DNS relay configuration: {0}")]
    InvalidConfig(&'static str),

    /// An exchange with an upstream resolver failed.
    #[error("upstream resolver {upstream}: {source}")]
    Upstream {
        /// The resolver.
        upstream: SocketAddr,
        /// The underlying error.
        source: io::Error,
    },

    /// An upstream resolver did not answer within the per-exchange timeout.
    #[error("upstream resolver {upstream} did not answer within {timeout:?}")]
    UpstreamTimeout {
        /// The resolver.
        upstream: SocketAddr,
        /// The timeout that expired.
        timeout: Duration,
    },
}
