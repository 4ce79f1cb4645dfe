//! `/stats`: what this process costs, as JSON on a local address.
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` first returns free
//! pool buffers and asks the allocator to give free memory back, so idle
//! figures are taken the same way every time.

use std::sync::Arc;

use atunnel_core::{BufferPool, PoolStats};
use atunnel_process::AdminLimits;
use atunnel_process::admin;
use atunnel_process::admin::{AdminFigures, AdminStats};
use atunnel_process::process_stats::{ProcessStats, process_stats};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::egress::{ActorEgressStats, Egress, EgressStats};

#[derive(Debug, Serialize)]
pub struct Stats {
    pub process: ProcessStats,
    pub pool: PoolStats,
    pub egress: Option<EgressStats>,
    /// Each actor's egress budget use and refusals.
    pub egress_actors: Vec<ActorEgressStats>,
    pub ingress: Option<crate::ingress::RouteStats>,
    /// The overload guard's state, readings and actions.
    pub overload: Option<atunnel_core::overload::OverloadFigures>,
    /// Ingress connections hibernated now, and counts so far.
    pub hibernation: Option<atunnel_tls::HibernationStats>,
    /// Each sandbox's DNS relay: queries, answers, timeouts, drops.
    pub dns_relays: Vec<crate::tunnel::SandboxDnsStats>,
    /// Ingress connections in their TLS handshake on each listener, and
    /// those closed at the cap.
    pub pre_auth: Option<IngressPreAuth>,
    /// /stats's own listener: connections accepted, and those past its
    /// cap taken into the probe reserve.
    pub admin: AdminFigures,
    /// The control socket: connections closed before they were served.
    pub control: crate::control::listener::ControlFigures,
    /// Sandboxes an earlier process left: adopted, removed, pending.
    pub leftovers: Option<crate::leftovers::LeftoverStats>,
}

#[derive(Debug, Serialize)]
pub struct IngressPreAuth {
    pub https: atunnel_tls::PreAuthFigures,
    pub connect: atunnel_tls::PreAuthFigures,
}

/// The figures `/stats` serves.
pub(crate) struct StatsSource {
    pub pool: BufferPool,
    pub overload: Option<Arc<atunnel_core::overload::OverloadGuard>>,
    pub egress: Option<Arc<Egress>>,
    pub ingress: Option<Arc<crate::ingress::Ingress>>,
    pub dns_relays: crate::tunnel::DnsRelays,
    pub leftovers: Option<Arc<crate::leftovers::Leftovers>>,
    pub admin: Arc<AdminStats>,
    pub control: Arc<crate::control::listener::ControlStats>,
    /// Set once the tunnel drains or shuts down.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

impl StatsSource {
    pub(crate) fn collect(&self, release: bool) -> Stats {
        if release {
            self.pool.trim(0);
            atunnel_core::alloc::release_free_memory();
        }
        Stats {
            process: process_stats(),
            pool: self.pool.stats(),
            egress: self.egress.as_ref().map(|e| e.stats()),
            egress_actors: self
                .egress
                .as_ref()
                .map_or_else(Vec::new, |e| e.actor_stats()),
            ingress: self.ingress.as_ref().map(|i| i.stats()),
            overload: self.overload.as_ref().map(|o| o.figures()),
            hibernation: self.ingress.as_ref().map(|i| i.hibernation().stats()),
            dns_relays: crate::tunnel::dns_stats(&self.dns_relays),
            pre_auth: self.ingress.as_ref().map(|i| {
                let (https, connect) = i.pre_auth();
                IngressPreAuth { https, connect }
            }),
            admin: self.admin.figures(),
            control: self.control.figures(),
            leftovers: self.leftovers.as_ref().map(|l| l.stats()),
        }
    }
}

/// Serves the admin listener (`/stats`, `/metrics`, `/healthz`,
/// `/readyz`) on `listener`, within `limits`, until `cancel`, then closes
/// its connections and waits for them.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: AdminLimits,
    source: Arc<StatsSource>,
    cancel: CancellationToken,
) {
    let admin = source.admin.clone();
    let metrics = crate::metrics::Metrics::new(source.clone());
    atunnel_process::admin::serve(
        listener,
        limits,
        &admin,
        move |req| answer(&source, &metrics, req),
        cancel,
    )
    .await
}

fn answer(
    source: &StatsSource,
    metrics: &crate::metrics::Metrics,
    req: &admin::Request,
) -> admin::Response {
    match req.uri().path() {
        "/stats" => {
            let release = admin::wants_release(req.uri().query());
            admin::json(serde_json::to_vec(&source.collect(release)).unwrap_or_default())
        }
        "/metrics" => admin::text(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        // Alive: the process answers.
        "/healthz" => admin::text("text/plain", "ok\n".into()),
        // Ready for new work until it drains or stops.
        "/readyz" => {
            if source.draining.load(std::sync::atomic::Ordering::Relaxed) {
                admin::status(503, "draining\n")
            } else {
                admin::text("text/plain", "ready\n".into())
            }
        }
        _ => admin::not_found(),
    }
}
