//! Egress's figures as /stats and /metrics read them: the process's
//! counters and each actor's.

/// Counters for /stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressStats {
    pub tunnels_open: u64,
    pub tunnels_total: u64,
    /// `tunnels_total` by the destination's family (an IPv4-mapped
    /// destination is IPv4: the gateway dials it over IPv4).
    pub tunnels_ipv4_total: u64,
    pub tunnels_ipv6_total: u64,
    /// Connections closed with no bytes: actor inactive or certificate invalid.
    pub rejected_total: u64,
    /// Tunnels whose CONNECT failed or was refused.
    pub open_failed_total: u64,
    /// Tunnels reset because a write made no progress for the stalled-write timeout.
    pub stalled_write_ends_total: u64,
    /// Tunnels reset because they stayed half-closed and idle past the half-closed timeout.
    pub half_closed_ends_total: u64,
    /// Bytes from actors to the gateway and back, of tunnels that have
    /// ended (a tunnel's count is added when it ends).
    pub bytes_up_total: u64,
    pub bytes_down_total: u64,
    /// Time from an actor's connection to its tunnel open (the CONNECT
    /// answered), for tunnels that opened.
    pub open_latency: OpenLatency,
    /// Size of one tunnel's task future (its state lives in the task's one
    /// heap allocation), for the memory accounting in docs/memory.md.
    pub tunnel_future_bytes: usize,
}

/// Upper bounds of the open-latency buckets, in microseconds: 0.25 ms
/// (a pooled connection on loopback) to 10 s (the open timeout).
pub const OPEN_LATENCY_BOUNDS_US: [u64; 14] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 10_000_000,
];

/// A histogram of open latencies: how many opens took at most each of
/// [`OPEN_LATENCY_BOUNDS_US`] (cumulative), all of them, and their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenLatency {
    pub at_most_us: [u64; 14],
    pub count: u64,
    pub sum_us: u64,
}

/// An actor's figures in /stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ActorEgressStats {
    pub actor: String,
    pub tunnels: usize,
    pub opening: usize,
    pub buffers: usize,
    /// Connections reset because the actor had `max_tunnels` open.
    pub refused_tunnels_total: u64,
    /// Connections reset because the actor had `max_opening` opening.
    pub refused_opening_total: u64,
    /// Connections reset because the process was overloaded.
    pub refused_overload_total: u64,
    /// Tunnels reset by the overload guard shedding this actor.
    pub shed_total: u64,
    /// Relay borrows that waited for the actor's buffer share.
    pub buffer_waits_total: u64,
    /// Times its listener stopped accepting, its refusals past
    /// `max_refusals_per_second`.
    pub refusal_pauses_total: u64,
    /// Pooled HTTP/2 connections to the gateway of its current activation.
    pub gateway_connections: usize,
    /// Descriptors the actor holds across egress tunnels and ingress
    /// requests and CONNECTs (its per-actor descriptor budget's count).
    pub held_descriptors: u64,
    /// Bytes it holds, estimated from the same (fixed costs per tunnel and
    /// per request; buffers and gateway connections are the overload
    /// shedder's to add).
    pub held_bytes: u64,
    /// New tunnels and ingress requests refused for its descriptor budget.
    pub refused_descriptors_total: u64,
    /// Of those, closed for having had no tunnel for the idle timeout.
    pub gateway_idle_closed_total: u64,
    /// Gateway connections ended for an HTTP/2 control-frame flood.
    pub gateway_h2_floods_total: u64,
}
