//! The relay handle: configuration, counters, the in-flight budget, and the
//! upstream failover both transports share.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::stats::Counters;
use crate::{DnsError, DnsRelayStats, RelayConfig};

/// A DNS relay for one sandbox: forwards queries it receives on the sockets
/// handed to [`serve_udp`](Self::serve_udp) and [`serve_tcp`](Self::serve_tcp)
/// to the configured upstreams, without interpreting them.
///
/// Cheap to clone: clones share the configuration, the counters and the
/// in-flight budget, so one relay can serve a UDP socket and a TCP listener
/// at once.
#[derive(Clone, Debug)]
pub struct DnsRelay {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: RelayConfig,
    counters: Counters,
    /// One permit per UDP query being forwarded or TCP connection being
    /// served, so a sandbox flooding its relay costs the worker a bounded
    /// number of tasks and sockets.
    in_flight: Arc<Semaphore>,
}

impl DnsRelay {
    /// Checks `cfg` and builds a relay. Fails if there are no upstreams, if
    /// an upstream could never be sent to (unspecified address or port 0),
    /// or if a limit or timeout is zero.
    pub fn new(cfg: RelayConfig) -> Result<Self, DnsError> {
        if cfg.upstreams.is_empty() {
            return Err(DnsError::NoUpstreams);
        }
        for &upstream in &cfg.upstreams {
            if upstream.ip().is_unspecified() {
                return Err(DnsError::InvalidUpstream {
                    upstream,
                    reason: "unspecified address",
                });
            }
            if upstream.port() == 0 {
                return Err(DnsError::InvalidUpstream {
                    upstream,
                    reason: "port 0",
                });
            }
        }
        if cfg.max_in_flight == 0 {
            return Err(DnsError::InvalidConfig("max_in_flight must be at least 1"));
        }
        if cfg.max_in_flight > Semaphore::MAX_PERMITS {
            return Err(DnsError::InvalidConfig("max_in_flight is too large"));
        }
        if cfg.timeout.is_zero() {
            return Err(DnsError::InvalidConfig("timeout must not be zero"));
        }
        if cfg.tcp_idle_timeout.is_zero() {
            return Err(DnsError::InvalidConfig("tcp_idle_timeout must not be zero"));
        }
        let in_flight = Arc::new(Semaphore::new(cfg.max_in_flight));
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                counters: Counters::default(),
                in_flight,
            }),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> DnsRelayStats {
        let free = self.inner.in_flight.available_permits();
        DnsRelayStats {
            in_flight: self.inner.cfg.max_in_flight.saturating_sub(free) as u64,
            ..self.inner.counters.snapshot()
        }
    }

    pub(crate) fn config(&self) -> &RelayConfig {
        &self.inner.cfg
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// A slot in the in-flight budget, or `None` when it is used up (the
    /// caller drops the work: queueing it would only make the backlog, and
    /// the client's wait, longer).
    pub(crate) fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.inner.in_flight).try_acquire_owned().ok()
    }

    /// Tries each upstream in order, each within the per-exchange timeout,
    /// and returns the first answer; `None` if none answered.
    pub(crate) async fn first_answer<F, Fut>(&self, exchange: F) -> Option<Vec<u8>>
    where
        F: Fn(SocketAddr) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, DnsError>>,
    {
        let timeout = self.inner.cfg.timeout;
        for &upstream in &self.inner.cfg.upstreams {
            let error = match tokio::time::timeout(timeout, exchange(upstream)).await {
                Ok(Ok(answer)) => return Some(answer),
                Ok(Err(error)) => error,
                Err(_elapsed) => DnsError::UpstreamTimeout { upstream, timeout },
            };
            // Debug, not warn: the sandbox chooses what to query, and a
            // resolver ignoring it is not the worker's problem to shout about.
            tracing::debug!(%error, "DNS upstream gave no answer; trying the next");
        }
        None
    }
}
