//! `/stats`: what the gateway process costs, as JSON on a local address
//! (off unless `--stats` names one).
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` (or `?trim=1`)
//! first returns free pool buffers and asks the allocator to give free
//! memory back, as atunnel's /stats does, so heap figures are taken the
//! same way every time. `heap_bytes` is the live heap through
//! `atunnel_core::alloc`'s counting allocator, 0 when the binary did not
//! install it (atunnel-bench's gateway role does).

use std::sync::Arc;

use atunnel_core::{BufferPool, ListenerFigures, PoolStats};
use atunnel_process::admin::{self, AdminFigures, AdminLimits, AdminStats};
use atunnel_process::process_stats::{ProcessStats, process_stats};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Serialize)]
pub(crate) struct Stats {
    pub process: ProcessStats,
    pub pool: PoolStats,
    /// The CONNECT listener's figures.
    pub listener: ListenerFigures,
    /// Connections in their TLS handshake, and those closed at the cap.
    pub pre_auth: atunnel_tls::PreAuthFigures,
    /// HTTP/2 connections ended for a control-frame flood.
    pub h2_floods_total: u64,
    /// Client identities with tunnels open, and budget refusals.
    pub budgets: crate::budget::BudgetStats,
    /// The overload guard's state and actions, when one runs.
    pub overload: Option<atunnel_process::overload::OverloadFigures>,
    /// The destination policy's refusals (403) by rule, and its reloads;
    /// absent for a far end without one.
    pub policy: Option<crate::policy::PolicyStats>,
    /// /stats's own listener: connections accepted, and those past its
    /// cap taken into the probe reserve.
    pub admin: AdminFigures,
}

/// The figures `/stats` serves.
pub(crate) struct StatsSource {
    pub pool: BufferPool,
    /// Reads the CONNECT listener's figures (the gateway's far end type is
    /// generic; this hides it).
    pub listener: Box<dyn Fn() -> ListenerFigures + Send + Sync>,
    pub pre_auth: Box<dyn Fn() -> atunnel_tls::PreAuthFigures + Send + Sync>,
    pub h2_floods: Box<dyn Fn() -> u64 + Send + Sync>,
    pub budgets: Box<dyn Fn() -> crate::budget::BudgetStats + Send + Sync>,
    pub overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
    pub policy: Option<Arc<crate::policy::PolicyHandle>>,
    pub admin: Arc<AdminStats>,
}

impl StatsSource {
    fn collect(&self, release: bool) -> Stats {
        if release {
            self.pool.trim(0);
            atunnel_core::alloc::release_free_memory();
        }
        Stats {
            process: process_stats(),
            pool: self.pool.stats(),
            listener: (self.listener)(),
            pre_auth: (self.pre_auth)(),
            h2_floods_total: (self.h2_floods)(),
            budgets: (self.budgets)(),
            overload: self.overload.as_ref().map(|o| o.figures()),
            policy: self.policy.as_ref().map(|p| p.stats()),
            admin: self.admin.figures(),
        }
    }
}

/// Serves `/stats` on `listener`, within `limits`, until `cancel`, then
/// closes its connections and waits for them.
pub(crate) async fn serve(
    listener: TcpListener,
    limits: AdminLimits,
    source: Arc<StatsSource>,
    cancel: CancellationToken,
) {
    let admin = source.admin.clone();
    atunnel_process::admin::serve(
        listener,
        limits,
        &admin,
        move |req| answer(&source, req),
        cancel,
    )
    .await
}

fn answer(source: &StatsSource, req: &admin::Request) -> admin::Response {
    if req.uri().path() != "/stats" {
        return admin::not_found();
    }
    let stats = source.collect(admin::wants_release(req.uri().query()));
    admin::json(serde_json::to_vec(&stats).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn stats_serves_heap_pool_and_listener_figures_as_json() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let source = Arc::new(StatsSource {
            pool: BufferPool::default(),
            listener: Box::new(|| ListenerFigures {
                accepted_total: 7,
                ..ListenerFigures::default()
            }),
            pre_auth: Box::new(|| atunnel_tls::PreAuthFigures {
                handshaking: 2,
                refused_total: 5,
                evicted_total: 1,
            }),
            h2_floods: Box::new(|| 4),
            budgets: Box::new(|| crate::budget::BudgetStats {
                refused_total: 3,
                ..Default::default()
            }),
            overload: None,
            policy: Some(Arc::new(
                crate::policy::PolicyHandle::new(crate::policy::allowing(&["10.0.0.0/8"]), None)
                    .expect("policy"),
            )),
            admin: Default::default(),
        });
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve(tcp, AdminLimits::default(), source, cancel.clone()));
        let get = |query: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET /stats{query} HTTP/1.0\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await.expect("read");
            let at = raw
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("a head")
                + 4;
            serde_json::from_slice::<serde_json::Value>(&raw[at..]).expect("JSON")
        };
        for query in ["", "?release=1"] {
            let v = get(query).await;
            assert!(v["process"]["heap_bytes"].is_u64(), "{v}");
            assert_eq!(v["process"]["pid"], std::process::id());
            assert_eq!(v["pool"]["in_use"], 0, "{v}");
            assert_eq!(v["listener"]["accepted_total"], 7, "{v}");
            assert_eq!(v["budgets"]["refused_total"], 3, "{v}");
            assert_eq!(v["pre_auth"]["handshaking"], 2, "{v}");
            assert_eq!(v["pre_auth"]["refused_total"], 5, "{v}");
            assert_eq!(v["pre_auth"]["evicted_total"], 1, "{v}");
            assert_eq!(v["h2_floods_total"], 4, "{v}");
            assert_eq!(
                v["policy"]["refused_by_rule"]["default loopback 127.0.0.0/8"], 0,
                "{v}"
            );
            assert!(v["admin"]["accepted_total"].as_u64() >= Some(1), "{v}");
        }
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("stops when cancelled")
            .expect("no panic");
    }
}
