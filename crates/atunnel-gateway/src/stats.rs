//! The gateway's admin listener (off unless `--stats` names an address):
//! the same app as atunnel's ([`admin::AdminApp`]): `/stats` (what the
//! gateway process costs and holds, as JSON), `/metrics` (the same
//! snapshot for scrapers), `/healthz` and `/readyz`.
//!
//! `GET /stats` reads the figures; `GET /stats?release=1` (or `?trim=1`)
//! first returns free pool buffers and asks the allocator to give free
//! memory back, as atunnel's /stats does, so heap figures are taken the
//! same way every time. `heap_bytes` is the live heap through
//! `atunnel_core::alloc`'s counting allocator, 0 when the binary did not
//! install it (atunnel-bench's gateway role does).

use std::sync::Arc;

use atunnel_core::{BufferPool, ListenerStats, PoolStats};
use atunnel_process::admin::{self, AdminCounters, AdminStats};
use atunnel_process::metrics_text::{self, Fmt, Out, Page, n};
use atunnel_process::process_stats::{ProcessStats, process_and_pool};
use serde::{Deserialize, Serialize};

/// What the gateway's `/stats` serves; readers deserialize it, so a renamed
/// field fails their build rather than reading 0.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stats {
    pub process: ProcessStats,
    pub pool: PoolStats,
    /// The CONNECT listener's figures.
    pub listener: ListenerStats,
    /// Connections in their TLS handshake, and those closed at the cap.
    pub pre_auth: atunnel_tls::PreAuthStats,
    /// HTTP/2 connections ended for a control-frame flood.
    pub h2_floods_total: u64,
    /// Client identities with tunnels open, and budget refusals.
    pub budgets: crate::budget::BudgetStats,
    /// The overload guard's state and actions, when one runs.
    pub overload: Option<atunnel_process::overload::OverloadStats>,
    /// The destination policy's refusals (403) by rule, and its reloads;
    /// absent for a far end without one.
    pub policy: Option<crate::policy::PolicyStats>,
    /// /stats's own listener: connections accepted, and those past its
    /// cap taken into the probe reserve.
    pub admin: AdminStats,
}

/// The figures `/stats` serves.
pub(crate) struct StatsSource {
    pub pool: BufferPool,
    /// Reads the CONNECT listener's figures (the gateway's far end type is
    /// generic; this hides it).
    pub listener: Box<dyn Fn() -> ListenerStats + Send + Sync>,
    pub pre_auth: Box<dyn Fn() -> atunnel_tls::PreAuthStats + Send + Sync>,
    pub h2_floods: Box<dyn Fn() -> u64 + Send + Sync>,
    pub budgets: Box<dyn Fn() -> crate::budget::BudgetStats + Send + Sync>,
    pub overload: Option<Arc<atunnel_process::overload::OverloadGuard>>,
    pub policy: Option<Arc<crate::policy::PolicyHandle>>,
    pub admin: Arc<AdminCounters>,
}

impl StatsSource {
    fn collect(&self, release: bool) -> Stats {
        let (process, pool) = process_and_pool(&self.pool, release);
        Stats {
            process,
            pool,
            listener: (self.listener)(),
            pre_auth: (self.pre_auth)(),
            h2_floods_total: (self.h2_floods)(),
            budgets: (self.budgets)(),
            overload: self.overload.as_ref().map(|o| o.stats()),
            policy: self.policy.as_ref().map(|p| p.stats()),
            admin: self.admin.stats(),
        }
    }
}

/// The gateway's admin app.
pub(crate) struct GatewayAdmin {
    source: Arc<StatsSource>,
    metrics: Page,
}

impl GatewayAdmin {
    pub(crate) fn new(source: Arc<StatsSource>) -> Self {
        let metrics = {
            let source = source.clone();
            Page::new("atunnel_gateway", move || source.collect(false), families)
        };
        Self { source, metrics }
    }
}

impl admin::AdminApp for GatewayAdmin {
    type Snapshot = Stats;

    fn snapshot(&self, release: bool) -> Stats {
        self.source.collect(release)
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }

    /// The gateway has no drain: it takes new tunnels until it stops, and
    /// its admin listener stops with it.
    fn ready(&self) -> bool {
        true
    }

    fn admin_counters(&self) -> &Arc<AdminCounters> {
        &self.source.admin
    }
}

/// `/metrics`'s families, from one snapshot.
fn families(out: &mut Out, s: &Stats) -> Fmt {
    metrics_text::process(out, &s.process, &s.pool)?;
    out.counter(
        "connections",
        "CONNECT listener connections accepted",
        None,
        s.listener.accepted_total,
    )?;
    out.gauge(
        "handshaking",
        "Connections in their TLS handshake",
        None,
        n(s.pre_auth.handshaking),
    )?;
    out.counter(
        "pre_auth_refused",
        "Connections closed at once: their source was at its handshake cap",
        None,
        s.pre_auth.refused_total,
    )?;
    out.counter(
        "pre_auth_evicted",
        "Handshakes ended to make room for a newer one at the total cap",
        None,
        s.pre_auth.evicted_total,
    )?;
    out.counter(
        "h2_floods",
        "HTTP/2 connections ended for a control-frame flood",
        None,
        s.h2_floods_total,
    )?;
    out.gauge(
        "identities",
        "Client identities with a tunnel open",
        None,
        n(s.budgets.identities),
    )?;
    out.counter(
        "budget_refused",
        "CONNECTs refused (429): their identity was at its budget",
        None,
        s.budgets.refused_total,
    )?;
    if let Some(p) = &s.policy {
        out.counters(
            "policy_refused",
            "CONNECTs refused (403) by the destination policy, by rule",
            "rule",
            p.refused_by_rule
                .iter()
                .map(|(rule, v)| (rule.as_str(), *v)),
        )?;
        out.counter("policy_reloads", "Policy reloads", None, p.reloads_total)?;
        out.counter(
            "policy_reload_failures",
            "Policy reloads whose file failed to read or parse",
            None,
            p.reload_failures_total,
        )?;
    }
    if let Some(o) = &s.overload {
        metrics_text::overload(out, o)?;
    }
    metrics_text::admin(out, &s.admin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn the_admin_app_serves_stats_metrics_and_probes() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("addr");
        let source = Arc::new(StatsSource {
            pool: BufferPool::default(),
            listener: Box::new(|| ListenerStats {
                accepted_total: 7,
                ..ListenerStats::default()
            }),
            pre_auth: Box::new(|| atunnel_tls::PreAuthStats {
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
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(admin::serve_app(
            tcp,
            atunnel_process::AdminLimits::default(),
            GatewayAdmin::new(source),
            cancel.clone(),
        ));
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await.expect("read");
            let at = raw
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("a head")
                + 4;
            let head = String::from_utf8_lossy(&raw[..at]).into_owned();
            (head, raw[at..].to_vec())
        };
        for path in ["/stats", "/stats?release=1"] {
            let (_, body) = get(path).await;
            let v: Stats = serde_json::from_slice(&body).expect("/stats parses as Stats");
            assert_eq!(v.process.pid, std::process::id());
            assert_eq!(v.pool.in_use, 0, "{v:?}");
            assert_eq!(v.listener.accepted_total, 7, "{v:?}");
            assert_eq!(v.budgets.refused_total, 3, "{v:?}");
            assert_eq!(v.pre_auth.handshaking, 2, "{v:?}");
            assert_eq!(v.pre_auth.refused_total, 5, "{v:?}");
            assert_eq!(v.pre_auth.evicted_total, 1, "{v:?}");
            assert_eq!(v.h2_floods_total, 4, "{v:?}");
            let policy = v.policy.as_ref().expect("policy figures");
            assert_eq!(
                policy.refused_by_rule.get("default loopback 127.0.0.0/8"),
                Some(&0),
                "{v:?}"
            );
            assert!(v.admin.listener.accepted_total >= 1, "{v:?}");
        }
        // The same app as atunnel's: /metrics renders the snapshot, and the
        // probes answer.
        let (head, body) = get("/metrics").await;
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
        let metrics = String::from_utf8(body).expect("text");
        for line in [
            "atunnel_gateway_connections_total 7",
            "atunnel_gateway_handshaking 2",
            "atunnel_gateway_h2_floods_total 4",
            "atunnel_gateway_budget_refused_total 3",
            "atunnel_gateway_policy_refused_total{rule=\"default loopback 127.0.0.0/8\"} 0",
            "atunnel_gateway_pool_buffers_in_use 0",
        ] {
            assert!(
                metrics.lines().any(|l| l == line),
                "no {line:?} in:\n{metrics}"
            );
        }
        assert!(metrics.ends_with("# EOF\n"), "{metrics}");
        for (path, answer) in [("/healthz", "ok\n"), ("/readyz", "ready\n")] {
            let (head, body) = get(path).await;
            assert!(head.contains(" 200 "), "{path}: {head}");
            assert_eq!(body, answer.as_bytes(), "{path}");
        }
        assert!(get("/nope").await.0.contains(" 404 "));
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("stops when cancelled")
            .expect("no panic");
    }
}
