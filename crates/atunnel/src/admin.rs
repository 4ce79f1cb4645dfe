//! The admin listener: `/stats` (the figures as JSON), `/metrics`
//! (OpenMetrics), `/healthz` and `/readyz`.
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` first returns free
//! pool buffers and asks the allocator to give free memory back, so idle
//! figures are taken the same way every time.

use std::sync::Arc;

use atunnel_process::admin;

use crate::stats::StatsSource;
use atunnel_process::metrics_text::Page;

/// The tunnel's admin app: its stats source, and `/metrics` over it.
pub(crate) struct TunnelAdmin {
    source: Arc<StatsSource>,
    metrics: Page,
}

impl TunnelAdmin {
    pub(crate) fn new(source: Arc<StatsSource>) -> Self {
        let metrics = crate::metrics::page(source.clone());
        Self { source, metrics }
    }
}

impl admin::AdminApp for TunnelAdmin {
    type Snapshot = crate::stats::Stats;

    fn snapshot(&self, release: bool) -> Self::Snapshot {
        self.source.collect(release)
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }

    /// Ready for new work until it drains or stops.
    fn ready(&self) -> bool {
        !self
            .source
            .draining
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn admin_counters(&self) -> &Arc<admin::AdminCounters> {
        &self.source.admin
    }
}
