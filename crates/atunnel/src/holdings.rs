//! What each actor makes atunnel hold across egress and ingress, and the
//! per-actor descriptor budget that keeps a documented number of actors at
//! their budgets below the overload guard's soft threshold.
//!
//! Counted at open and close (an egress tunnel admitted or ended, an ingress
//! request or CONNECT admitted or finished), never per byte: the bytes are an
//! estimate from fixed per-unit costs measured in docs/memory.md, to which
//! the overload shedder adds what it can read per actor at sampling time
//! (pooled buffers borrowed, gateway connections). The guard takes fair
//! shares and the shedding order from these figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use atunnel_process::overload::Held;

/// Heap one egress tunnel holds while idle: 1,597 B measured over 2,000
/// idle tunnels (docs/memory.md), rounded up, plus the kernel's minimum for
/// its actor socket (about 2 KiB of skb and socket state).
pub const TUNNEL_HELD_BYTES: u64 = 4 * 1024;
/// Heap and kernel state one ingress request or CONNECT holds while in
/// flight: its upstream connection (socket, hyper's HTTP/1.1 read buffer up
/// to `PROXY_H1_MAX_BUFFER`, 64 KiB, grown only while bytes move: counted
/// at a quarter) and its task.
pub const REQUEST_HELD_BYTES: u64 = 20 * 1024;
/// What one pooled HTTP/2 connection to the gateway holds: h2's buffers
/// (about 28 KiB for its life), TLS state and its socket.
pub const GATEWAY_CONNECTION_HELD_BYTES: u64 = 48 * 1024;

/// What one DNS query in flight in an actor's relay holds: an upstream
/// socket (and a TCP client's own, counted as a second), the answer buffer
/// a UDP exchange reserves (64 KiB, `atunnel-dns`'s largest answer), the
/// query and its task.
pub const DNS_QUERY_HELD_DESCRIPTORS: u64 = 2;
pub const DNS_QUERY_HELD_BYTES: u64 = 68 * 1024;

/// Default of [`HoldingsConfig::actors_at_budget`]: four actors at their
/// descriptor budgets stay below the soft threshold.
pub const DEFAULT_ACTORS_AT_BUDGET: u64 = 4;
/// Descriptors the process keeps for itself before any actor's are
/// counted: listeners, the runtime, each sandbox's namespace handles,
/// egress listener and DNS sockets, router connections, log and /stats.
/// 5% of the limit, at least 64 (1,000 at 20,000).
pub fn descriptor_reserve(nofile: u64) -> u64 {
    (nofile / 20).max(64)
}

/// How the per-actor descriptor budget is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldingsConfig {
    /// Descriptors one actor's egress tunnels, gateway connections,
    /// ingress requests and CONNECTs may hold together; past it its new
    /// tunnels are reset and its requests answered 503. 0: derived at
    /// start (see [`derive_max_descriptors`]).
    pub max_descriptors: u64,
    /// How many actors at their budgets must stay below the soft
    /// threshold: the derived budget is what that many fit.
    pub actors_at_budget: u64,
}

impl Default for HoldingsConfig {
    fn default() -> Self {
        Self {
            max_descriptors: 0,
            actors_at_budget: DEFAULT_ACTORS_AT_BUDGET,
        }
    }
}

/// The per-actor descriptor budget that lets `actors_at_budget` actors at
/// it, each with a DNS relay at its own bound (`dns_per_actor`
/// descriptors), stay below `soft` x `nofile` with the process's own
/// [`descriptor_reserve`] besides: 4,000 at 20,000 descriptors, soft 0.85,
/// four actors, no DNS (17,000 - 1,000 = 16,000 / 4); 3,488 with DNS at its
/// default 256 in flight (two descriptors each at most).
pub fn derive_max_descriptors(
    nofile: u64,
    soft: f64,
    actors_at_budget: u64,
    dns_per_actor: u64,
) -> u64 {
    let below_soft = (nofile as f64 * soft).floor() as u64;
    let actors = below_soft.saturating_sub(descriptor_reserve(nofile)) / actors_at_budget.max(1);
    actors.saturating_sub(dns_per_actor).max(1)
}

/// Whether `actors_at_budget` actors at `max_descriptors` each (and their
/// DNS) fit below `soft` x `nofile` with the reserve: a start-time check
/// of an operator's explicit budget.
pub fn descriptors_fit(
    nofile: u64,
    soft: f64,
    actors_at_budget: u64,
    dns_per_actor: u64,
    max_descriptors: u64,
) -> bool {
    let need = actors_at_budget
        .saturating_mul(max_descriptors.saturating_add(dns_per_actor))
        .saturating_add(descriptor_reserve(nofile));
    // At equality the process is at soft only if its own descriptors
    // reach the whole reserve.
    (need as f64) <= nofile as f64 * soft
}

/// One actor's holdings, shared by its egress binding and its ingress
/// route.
#[derive(Debug)]
pub struct ActorHold {
    descriptors: AtomicU64,
    bytes: AtomicU64,
    /// What the overload shedder last read besides (gateway connections,
    /// pooled buffers), so that an actor's admission under soft weighs the
    /// same figures as its fair share. Not part of the descriptor budget.
    sampled_descriptors: AtomicU64,
    sampled_bytes: AtomicU64,
    max_descriptors: u64,
    refused: AtomicU64,
}

impl ActorHold {
    fn new(max_descriptors: u64) -> Self {
        Self {
            descriptors: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sampled_descriptors: AtomicU64::new(0),
            sampled_bytes: AtomicU64::new(0),
            max_descriptors,
            refused: AtomicU64::new(0),
        }
    }

    /// Takes `descriptors` and `bytes` if the descriptor budget allows;
    /// false (counted) if not. Two atomic adds, and two subtractions back
    /// when refused.
    pub(crate) fn try_take(&self, descriptors: u64, bytes: u64) -> bool {
        let before = self.descriptors.fetch_add(descriptors, Ordering::Relaxed);
        if before.saturating_add(descriptors) > self.max_descriptors {
            self.descriptors.fetch_sub(descriptors, Ordering::Relaxed);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    /// Gives back what [`try_take`](Self::try_take) took.
    pub(crate) fn give(&self, descriptors: u64, bytes: u64) {
        self.descriptors.fetch_sub(descriptors, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// What it holds now, as counted at open and close.
    pub fn held(&self) -> Held {
        Held {
            descriptors: self.descriptors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// [`held`](Self::held) and what the shedder last read besides: what
    /// the overload guard weighs.
    pub fn weighed(&self) -> Held {
        let counted = self.held();
        Held {
            descriptors: counted.descriptors + self.sampled_descriptors.load(Ordering::Relaxed),
            bytes: counted.bytes + self.sampled_bytes.load(Ordering::Relaxed),
        }
    }

    fn set_sampled(&self, descriptors: u64, bytes: u64) {
        self.sampled_descriptors
            .store(descriptors, Ordering::Relaxed);
        self.sampled_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Its work refused for the descriptor budget, egress and ingress.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Every actor's [`ActorHold`], by uid, while its egress binding or ingress
/// route keeps it.
#[derive(Debug)]
pub struct Holdings {
    actors: Mutex<HashMap<String, Weak<ActorHold>>>,
    max_descriptors: u64,
}

impl Holdings {
    /// Holdings whose actors may each hold `max_descriptors`.
    pub fn new(max_descriptors: u64) -> Arc<Self> {
        Arc::new(Self {
            actors: Mutex::default(),
            max_descriptors,
        })
    }

    /// Holdings with no descriptor budget (egress or ingress on its own).
    pub fn unbounded() -> Arc<Self> {
        Self::new(u64::MAX)
    }

    /// The per-actor descriptor budget.
    pub fn max_descriptors(&self) -> u64 {
        self.max_descriptors
    }

    /// Actor `uid`'s hold, made on first use (once per activation or
    /// binding, not per request). Forgotten entries are dropped here.
    pub(crate) fn actor(&self, uid: &str) -> Arc<ActorHold> {
        let mut actors = self.actors.lock().expect("holdings lock poisoned");
        if let Some(hold) = actors.get(uid).and_then(Weak::upgrade) {
            return hold;
        }
        actors.retain(|_, h| h.strong_count() > 0);
        let hold = Arc::new(ActorHold::new(self.max_descriptors));
        actors.insert(uid.to_string(), Arc::downgrade(&hold));
        hold
    }

    /// What each live actor holds, by uid, as the guard weighs it.
    pub fn snapshot(&self) -> Vec<(String, Held)> {
        let actors = self.actors.lock().expect("holdings lock poisoned");
        actors
            .iter()
            .filter_map(|(uid, h)| Some((uid.clone(), h.upgrade()?.weighed())))
            .collect()
    }

    /// Sets what the shedder read of `uid` besides its counts.
    pub(crate) fn set_sampled(&self, uid: &str, descriptors: u64, bytes: u64) {
        let actors = self.actors.lock().expect("holdings lock poisoned");
        if let Some(hold) = actors.get(uid).and_then(Weak::upgrade) {
            hold.set_sampled(descriptors, bytes);
        }
    }
}

/// The per-actor descriptor budget a tunnel starts with: `cfg`'s if set
/// (warned about when that many actors at it would not fit below soft),
/// else derived from RLIMIT_NOFILE, the soft threshold and each actor's
/// DNS bound. Without a readable limit, no budget.
pub fn start_budget(
    cfg: &HoldingsConfig,
    overload: Option<&atunnel_process::overload::OverloadConfig>,
    dns: Option<&atunnel_dns::RelayConfig>,
) -> u64 {
    let soft = overload.map_or(atunnel_process::overload::DEFAULT_SOFT, |o| o.soft);
    // A UDP query holds one upstream socket; a TCP client holds its own
    // and one upstream.
    let dns_per_actor = dns.map_or(0, |d| 2 * d.max_in_flight as u64);
    let nofile = match atunnel_host::nofile_soft_limit() {
        Ok(soft_limit) => soft_limit,
        Err(e) => {
            tracing::warn!(error = %e, "getrlimit(RLIMIT_NOFILE): no per-actor descriptor budget");
            return match cfg.max_descriptors {
                0 => u64::MAX,
                explicit => explicit,
            };
        }
    };
    if cfg.max_descriptors == 0 {
        let derived = derive_max_descriptors(nofile, soft, cfg.actors_at_budget, dns_per_actor);
        tracing::info!(
            nofile,
            actors_at_budget = cfg.actors_at_budget,
            max_descriptors = derived,
            "per-actor descriptor budget derived"
        );
        return derived;
    }
    if !descriptors_fit(
        nofile,
        soft,
        cfg.actors_at_budget,
        dns_per_actor,
        cfg.max_descriptors,
    ) {
        tracing::warn!(
            nofile,
            soft,
            actors_at_budget = cfg.actors_at_budget,
            max_descriptors = cfg.max_descriptors,
            "that many actors at their descriptor budgets would pass the overload guard's soft threshold"
        );
    }
    cfg.max_descriptors
}

/// Warns when `actors_at_budget` actors holding what their byte bounds
/// allow (gateway windows, their pooled-buffer share, their tunnels' fixed
/// cost) would pass `soft` of `memory_limit`.
pub fn check_memory_fit(
    actors_at_budget: u64,
    max_descriptors: u64,
    max_gateway_bytes: u32,
    max_buffers: usize,
    buffer_size: usize,
    soft: f64,
    memory_limit: u64,
) {
    let per_actor = u64::from(max_gateway_bytes)
        + (max_buffers * buffer_size) as u64
        + max_descriptors.min(1 << 32) * TUNNEL_HELD_BYTES;
    let need = actors_at_budget.saturating_mul(per_actor);
    if need as f64 >= soft * memory_limit as f64 {
        tracing::warn!(
            actors_at_budget,
            per_actor,
            memory_limit,
            "that many actors at their byte bounds would pass the overload guard's soft threshold"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_actors_at_the_derived_budget_fit_below_soft() {
        let d = derive_max_descriptors(20_000, 0.85, 4, 0);
        assert_eq!(d, 4_000);
        assert!(descriptors_fit(20_000, 0.85, 4, 0, d));
        assert!(!descriptors_fit(20_000, 0.85, 4, 0, 4_096 + 1_024));
        let with_dns = derive_max_descriptors(20_000, 0.85, 4, 512);
        assert_eq!(with_dns, 3_488);
        assert!(descriptors_fit(20_000, 0.85, 4, 512, with_dns));
        // A large limit gives a large budget; a tiny one still gives one.
        assert_eq!(derive_max_descriptors(1 << 20, 0.85, 4, 512), 209_203);
        assert_eq!(derive_max_descriptors(10, 0.85, 4, 0), 1);
    }

    #[test]
    fn a_hold_past_its_budget_refuses_and_gives_back() {
        let holdings = Holdings::new(2);
        let a = holdings.actor("a");
        assert!(a.try_take(1, 10));
        assert!(a.try_take(1, 10));
        assert!(!a.try_take(1, 10));
        assert_eq!(
            (a.held(), a.refused_total()),
            (
                Held {
                    descriptors: 2,
                    bytes: 20
                },
                1
            )
        );
        a.give(1, 10);
        assert!(a.try_take(1, 10));
        // The same actor's hold is shared; a forgotten one is dropped.
        assert!(Arc::ptr_eq(&a, &holdings.actor("a")));
        drop(holdings.actor("b"));
        assert_eq!(holdings.snapshot().len(), 1);
    }
}
