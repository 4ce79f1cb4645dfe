//! The figures of this process that `/stats` serves as JSON and `/metrics`
//! renders (the admin module serves both): what it costs and holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use atunnel_core::{BufferPool, PoolStats};
use atunnel_process::admin::{AdminCounters, AdminStats};
use atunnel_process::process_stats::{ProcessStats, process_and_pool};
use serde::Serialize;

use crate::egress::{ActorEgressStats, Egress, EgressStats};

/// One snapshot of the figures: `/stats` serves it as JSON and `/metrics`
/// renders it. Readers (the bench, the tests) deserialize it, so a renamed
/// field fails their build rather than reading 0. `Default` is the
/// all-zero snapshot a reader uses when it has none.
#[derive(Debug, Default, Serialize, serde::Deserialize)]
pub struct Stats {
    pub process: ProcessStats,
    pub pool: PoolStats,
    pub egress: Option<EgressStats>,
    /// Each actor's egress budget use and refusals.
    pub egress_actors: Vec<ActorEgressStats>,
    pub ingress: Option<crate::ingress::RouteStats>,
    /// The overload guard's state, readings and actions.
    pub overload: Option<atunnel_process::overload::OverloadStats>,
    /// Ingress connections hibernated now, and counts so far.
    pub hibernation: Option<atunnel_tls::HibernationStats>,
    /// Each sandbox's DNS relay: queries, answers, timeouts, drops.
    pub dns_relays: Vec<crate::dns_relays::SandboxDnsStats>,
    /// Ingress connections in their TLS handshake on each listener, and
    /// those closed at the cap.
    pub pre_auth: Option<IngressPreAuth>,
    /// /stats's own listener: connections accepted, and those past its
    /// cap taken into the probe reserve.
    pub admin: AdminStats,
    /// The control socket: connections closed before they were served.
    pub control: ControlStats,
    /// Sandboxes an earlier process left: adopted, removed, pending.
    pub leftovers: Option<crate::leftovers::LeftoverStats>,
}

#[derive(Debug, Serialize, serde::Deserialize)]
pub struct IngressPreAuth {
    pub https: atunnel_tls::PreAuthStats,
    pub connect: atunnel_tls::PreAuthStats,
}

/// The figures `/stats` serves.
pub(crate) struct StatsSource {
    pub pool: BufferPool,
    pub overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
    pub egress: Option<Arc<Egress>>,
    pub ingress: Option<Arc<crate::ingress::Ingress>>,
    pub dns_relays: crate::dns_relays::DnsRelays,
    pub leftovers: Option<Arc<crate::leftovers::Leftovers>>,
    pub admin: Arc<AdminCounters>,
    pub control: Arc<ControlCounters>,
    /// Set once the tunnel drains or shuts down.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

impl StatsSource {
    pub(crate) fn collect(&self, release: bool) -> Stats {
        let (process, pool) = process_and_pool(&self.pool, release);
        Stats {
            process,
            pool,
            egress: self.egress.as_ref().map(|e| e.stats()),
            egress_actors: self
                .egress
                .as_ref()
                .map_or_else(Vec::new, |e| e.actor_stats()),
            ingress: self.ingress.as_ref().map(|i| i.stats()),
            overload: self.overload.as_ref().map(|o| o.stats()),
            hibernation: self.ingress.as_ref().map(|i| i.hibernation().stats()),
            dns_relays: crate::dns_relays::dns_stats(&self.dns_relays),
            pre_auth: self.ingress.as_ref().map(|i| {
                let (https, connect) = i.pre_auth();
                IngressPreAuth { https, connect }
            }),
            admin: self.admin.stats(),
            control: self.control.stats(),
            leftovers: self.leftovers.as_ref().map(|l| l.stats()),
        }
    }
}

/// What the control socket counts: connections it closed before serving
/// them, by why.
#[derive(Debug, Default)]
pub struct ControlCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) refused_uid: AtomicU64,
    pub(crate) preface_timeouts: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) bad_preface: AtomicU64,
}

/// What [`ControlCounters`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControlStats {
    pub accepted_total: u64,
    /// Closed at accept: the peer's uid is not allowed.
    pub refused_uid_total: u64,
    /// Closed at the preface timeout: no preface, or no place, in time.
    pub preface_timeouts_total: u64,
    /// Closed while waiting for their preface, to make room for a newer one.
    pub evicted_total: u64,
    /// Closed: their first bytes were not the HTTP/2 preface.
    pub bad_preface_total: u64,
}

impl ControlCounters {
    pub fn stats(&self) -> ControlStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ControlStats {
            accepted_total: load(&self.accepted),
            refused_uid_total: load(&self.refused_uid),
            preface_timeouts_total: load(&self.preface_timeouts),
            evicted_total: load(&self.evicted),
            bad_preface_total: load(&self.bad_preface),
        }
    }
}
