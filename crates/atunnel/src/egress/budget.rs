//! What one actor may make egress hold: its budget and the defaults, each
//! with its reason.

/// What one actor may make egress hold at once. Past a bound its new
/// connections are reset, counted for it in /stats; other actors see no
/// change and its established tunnels go on. Past its buffer share, its
/// relays wait (backpressure on that actor alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActorBudget {
    /// Concurrent egress tunnels (open and opening).
    pub max_tunnels: usize,
    /// Tunnels being opened (dialling or waiting for the gateway's answer).
    pub max_opening: usize,
    /// Pooled relay buffers in use at once, of the shared pool's.
    pub max_buffers: usize,
    /// Connections refused a second (over a budget, overloaded, inactive)
    /// before its listener stops accepting for a while; 0 does not pace.
    pub max_refusals_per_second: u32,
    /// Bytes all of its gateway connections together may leave unread:
    /// each connection's receive window is this divided by the most
    /// connections its tunnel budget can open (one per
    /// `MAX_CONCURRENT_STREAMS` tunnels), at least 64 KiB.
    pub max_gateway_bytes: u32,
}

/// Default of [`ActorBudget::max_tunnels`]: 4,096 tunnels, a sixteenth of
/// what one sandbox's source ports allow; idle they cost 6 MB, stalled at
/// most 64 KiB each.
pub const DEFAULT_ACTOR_MAX_TUNNELS: usize = 4096;
/// Default of [`ActorBudget::max_opening`]: 256 opens in flight; a pooled
/// gateway connection answers an open in about a round trip.
pub const DEFAULT_ACTOR_MAX_OPENING: usize = 256;
/// Default of [`ActorBudget::max_buffers`]: 256 of the pool's 4,096
/// (8 MiB at 32 KiB), so sixteen actors moving bytes at once cannot take
/// the whole pool; a relay holds one only while bytes move.
pub const DEFAULT_ACTOR_MAX_BUFFERS: usize = 256;
/// Default of [`ActorBudget::max_refusals_per_second`]: an accept and a
/// reset cost atunnel some 10-20 us, so 1,000 a second is at most about 2%
/// of a core per actor, where an unpaced flood took 0.3 core; an actor's
/// own program that retries a refused connect sees a refusal at once
/// within that rate and a slower connect past it.
pub const DEFAULT_ACTOR_MAX_REFUSALS_PER_SECOND: u32 = 1000;
/// Default of [`ActorBudget::max_gateway_bytes`]: 16 MiB, 64 stalled
/// stream windows. It was 16 MiB per gateway connection, up to five at the
/// default tunnel budget (80 MiB).
pub const DEFAULT_ACTOR_MAX_GATEWAY_BYTES: u32 = 16 * 1024 * 1024;

impl ActorBudget {
    /// The most gateway connections the tunnel budget can open (a
    /// gateway allows `MAX_CONCURRENT_STREAMS` tunnels on one).
    pub fn max_gateway_connections(&self) -> u32 {
        let per = atunnel_connect::limits::MAX_CONCURRENT_STREAMS as usize;
        u32::try_from(self.max_tunnels.div_ceil(per).max(1)).unwrap_or(u32::MAX)
    }

    /// The receive window of each of the actor's gateway connections:
    /// [`max_gateway_bytes`](Self::max_gateway_bytes) shared by the most
    /// connections it can open, no more than `connection_window`, and at
    /// least HTTP/2's initial 65,535 (a window cannot start lower).
    pub fn gateway_connection_window(&self, connection_window: u32) -> u32 {
        (self.max_gateway_bytes / self.max_gateway_connections())
            .min(connection_window)
            .max(65_535)
    }
}

impl Default for ActorBudget {
    fn default() -> Self {
        Self {
            max_tunnels: DEFAULT_ACTOR_MAX_TUNNELS,
            max_opening: DEFAULT_ACTOR_MAX_OPENING,
            max_buffers: DEFAULT_ACTOR_MAX_BUFFERS,
            max_refusals_per_second: DEFAULT_ACTOR_MAX_REFUSALS_PER_SECOND,
            max_gateway_bytes: DEFAULT_ACTOR_MAX_GATEWAY_BYTES,
        }
    }
}
