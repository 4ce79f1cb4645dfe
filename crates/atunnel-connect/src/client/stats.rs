//! The client's figures as /stats reads them: its pool now, and what
//! became of the connections that left it.

use std::sync::atomic::Ordering;

use super::GatewayClient;

/// Counters for /stats.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    pub h2_connections: usize,
    pub h2_streams: usize,
    /// Pooled connections closed for having no tunnel for the idle timeout.
    pub h2_idle_closed_total: u64,
    /// Pooled connections retired as dead: a ping or a CONNECT unanswered.
    pub h2_dead_retired_total: u64,
    /// Connections ended for an HTTP/2 control-frame flood from the gateway.
    pub h2_floods_total: u64,
}

impl GatewayClient {
    pub fn stats(&self) -> ClientStats {
        let pool = self.pool.conns.lock().expect("pool lock poisoned");
        ClientStats {
            h2_connections: pool.len(),
            h2_streams: pool
                .iter()
                .map(|c| c.use_.streams.load(Ordering::Relaxed))
                .sum(),
            h2_idle_closed_total: self.pool.idle_closed.load(Ordering::Relaxed),
            h2_dead_retired_total: self.pool.dead_retired.load(Ordering::Relaxed),
            h2_floods_total: self.pool.floods.total(),
        }
    }
}
