//! The admin listener: `/stats` (the figures as JSON), `/metrics`
//! (OpenMetrics), `/healthz` and `/readyz`.
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` first returns free
//! pool buffers and asks the allocator to give free memory back, so idle
//! figures are taken the same way every time.

use std::sync::Arc;

use atunnel_process::AdminLimits;
use atunnel_process::admin;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::stats::StatsSource;

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
    let metrics = Metrics::new(source.clone());
    atunnel_process::admin::serve(
        listener,
        limits,
        &admin,
        move |req| answer(&source, &metrics, req),
        cancel,
    )
    .await
}

fn answer(source: &StatsSource, metrics: &Metrics, req: &admin::Request) -> admin::Response {
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
