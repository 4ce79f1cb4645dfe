//! Relay counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a relay's counters, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DnsRelayStats {
    /// Datagrams received on UDP listening sockets, including those dropped.
    pub udp_queries: u64,
    /// Complete length-prefixed queries read from TCP clients.
    pub tcp_queries: u64,
    /// Answers delivered to clients (UDP sent, TCP written).
    pub answered: u64,
    /// Queries no upstream answered: every upstream timed out or failed.
    pub timed_out: u64,
    /// UDP datagrams not forwarded (shorter than a DNS header, or beyond the
    /// in-flight limit), TCP connections refused for the in-flight limit, and
    /// TCP connections closed for a bad length prefix.
    pub dropped: u64,
    /// UDP queries being forwarded and TCP clients being served now (of
    /// `max_in_flight`): each holds an upstream socket, a TCP one its
    /// client's too. The overload guard counts them as the actor's.
    pub in_flight: u64,
}

/// The live counters behind [`DnsRelayStats`]. Relaxed ordering: they are
/// independent tallies, not synchronisation.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    udp_queries: AtomicU64,
    tcp_queries: AtomicU64,
    answered: AtomicU64,
    timed_out: AtomicU64,
    dropped: AtomicU64,
}

impl Counters {
    pub(crate) fn udp_query(&self) {
        self.udp_queries.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn tcp_query(&self) {
        self.tcp_queries.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn timed_out(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DnsRelayStats {
        DnsRelayStats {
            udp_queries: self.udp_queries.load(Ordering::Relaxed),
            tcp_queries: self.tcp_queries.load(Ordering::Relaxed),
            answered: self.answered.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            in_flight: 0,
        }
    }
}
