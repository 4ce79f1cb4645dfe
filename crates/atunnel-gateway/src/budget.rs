//! What one client identity (an actor) may make the gateway hold at once:
//! concurrent tunnels and a share of the relay buffers. Past its tunnel
//! budget an identity's new CONNECTs are refused (429), counted; other
//! identities see no change and its open tunnels go on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use atunnel_core::BufferPool;
use atunnel_identity::identity::ActorIdentity;

/// Default of [`IdentityBudget::max_tunnels`]: as many as atunnel lets one
/// actor have open (`--actor-max-tunnels`).
pub const DEFAULT_IDENTITY_MAX_TUNNELS: usize = 4096;
/// Default of [`IdentityBudget::max_buffers`]: 256 of the pool's 4,096.
pub const DEFAULT_IDENTITY_MAX_BUFFERS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdentityBudget {
    /// Concurrent tunnels per client identity.
    pub max_tunnels: usize,
    /// Pooled relay buffers one identity's tunnels may hold at once (its
    /// relays wait past it).
    pub max_buffers: usize,
}

impl Default for IdentityBudget {
    fn default() -> Self {
        Self {
            max_tunnels: DEFAULT_IDENTITY_MAX_TUNNELS,
            max_buffers: DEFAULT_IDENTITY_MAX_BUFFERS,
        }
    }
}

/// One identity's use of its budget; forgotten once it has no tunnel.
struct Usage {
    tunnels: AtomicUsize,
    pool: BufferPool,
}

/// Every identity with a tunnel open, and the refusals so far.
pub(crate) struct Budgets {
    budget: IdentityBudget,
    pool: BufferPool,
    active: Mutex<HashMap<String, Arc<Usage>>>,
    refused: AtomicU64,
}

/// A tunnel's place in its identity's budget; given back when dropped.
pub struct Admitted {
    key: String,
    usage: Arc<Usage>,
    budgets: Arc<Budgets>,
}

impl Admitted {
    /// The identity's share of the relay buffers.
    pub fn pool(&self) -> &BufferPool {
        &self.usage.pool
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut active = self.budgets.active.lock().expect("budgets lock poisoned");
        if self.usage.tunnels.fetch_sub(1, Ordering::Relaxed) == 1 {
            active.remove(&self.key);
        }
    }
}

/// Figures for /stats.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BudgetStats {
    /// Identities with a tunnel open.
    pub identities: usize,
    /// The most tunnels one identity has open.
    pub max_tunnels_of_one: usize,
    /// CONNECTs refused (429) because their identity was at its budget.
    pub refused_total: u64,
}

impl Budgets {
    pub(crate) fn new(budget: IdentityBudget, pool: BufferPool) -> Arc<Self> {
        Arc::new(Self {
            budget,
            pool,
            active: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    /// A place for one more tunnel of `identity`, or `None` (counted) when
    /// it has `max_tunnels` open.
    pub(crate) fn admit(self: &Arc<Self>, identity: &ActorIdentity) -> Option<Admitted> {
        let key = format!(
            "{}/{}/{}",
            identity.atespace, identity.actor_name, identity.actor_uid
        );
        let mut active = self.active.lock().expect("budgets lock poisoned");
        let usage = active
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Usage {
                    tunnels: AtomicUsize::new(0),
                    pool: self.pool.share(self.budget.max_buffers),
                })
            })
            .clone();
        if usage.tunnels.load(Ordering::Relaxed) >= self.budget.max_tunnels {
            self.refused.fetch_add(1, Ordering::Relaxed);
            if usage.tunnels.load(Ordering::Relaxed) == 0 {
                // A budget of 0: keep no entry for an identity with nothing open.
                active.remove(&key);
            }
            return None;
        }
        usage.tunnels.fetch_add(1, Ordering::Relaxed);
        drop(active);
        Some(Admitted {
            key,
            usage,
            budgets: self.clone(),
        })
    }

    pub(crate) fn stats(&self) -> BudgetStats {
        let active = self.active.lock().expect("budgets lock poisoned");
        BudgetStats {
            identities: active.len(),
            max_tunnels_of_one: active
                .values()
                .map(|u| u.tunnels.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0),
            refused_total: self.refused.load(Ordering::Relaxed),
        }
    }
}
