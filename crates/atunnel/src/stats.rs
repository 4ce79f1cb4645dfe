//! `/stats`: what this process costs, as JSON on a local address.
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` first returns free
//! pool buffers and asks the allocator to give free memory back, so idle
//! figures are taken the same way every time.

use std::convert::Infallible;
use std::sync::Arc;

use atunnel_core::{BufferPool, Listener, ListenerStats, PoolStats};
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use atunnel_process::process_stats::{ProcessStats, process_stats};

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
}

#[derive(Debug, Serialize)]
pub struct IngressPreAuth {
    pub https: atunnel_tls::PreAuthFigures,
    pub connect: atunnel_tls::PreAuthFigures,
}

/// /stats connections open at once (a reader or two; the next waits in the
/// backlog), and how long one has to send its request head: a local peer
/// cannot make /stats hold connections or tasks without bound.
const MAX_CONNECTIONS: usize = 4;
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The figures `/stats` serves.
pub(crate) struct StatsSource {
    pub pool: BufferPool,
    pub overload: Option<Arc<atunnel_core::overload::OverloadGuard>>,
    pub egress: Option<Arc<Egress>>,
    pub ingress: Option<Arc<crate::ingress::Ingress>>,
    pub dns_relays: crate::tunnel::DnsRelays,
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
        }
    }
}

/// Serves `/stats` on `listener` until `cancel`, then closes its
/// connections and waits for them.
pub(crate) async fn serve(
    listener: TcpListener,
    source: Arc<StatsSource>,
    cancel: CancellationToken,
) {
    let stats = ListenerStats::default();
    let listener =
        Listener::new(listener, "stats").with_cap(Arc::new(Semaphore::new(MAX_CONNECTIONS)));
    listener
        .serve(&cancel, &stats, |tcp, _| {
            let (source, cancel) = (source.clone(), cancel.clone());
            Some(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let source = source.clone();
                    async move { Ok::<_, Infallible>(answer(&source, &req)) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(tcp), service);
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = conn => {}
                }
            })
        })
        .await
}

fn answer(
    source: &StatsSource,
    req: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let release = req.uri().query().is_some_and(|q| q.contains("release=1"));
    let response = if req.uri().path() == "/stats" {
        let body = serde_json::to_vec(&source.collect(release)).unwrap_or_default();
        hyper::Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
    } else {
        hyper::Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(b"not found\n")))
    };
    response.expect("static response parts are valid")
}
