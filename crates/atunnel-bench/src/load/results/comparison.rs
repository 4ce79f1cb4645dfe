//! `--compare`: the variants' figures side by side, and the ingress table
//! that sets each contender's CPU per request like with like.

use super::*;
use crate::scenario::{egress_http, egress_idle, egress_tcp, ingress_https, ingress_idle};

/// One setting swept in one run (e.g. `copy-mode`: lean vs naive).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Comparison {
    pub name: String,
    pub variants: Vec<Variant>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Variant {
    pub label: String,
    /// atunnel's flags for this variant.
    pub flags: Vec<String>,
    pub scenarios: Vec<ScenarioResult>,
}

impl Variant {
    /// This variant's result of `S`'s scenario, read as `S`.
    pub(super) fn summary<S: ScenarioSummary>(&self) -> Option<S> {
        find(&self.scenarios, S::SCENARIO)?.summary()
    }
}

/// Whether `c` compares ingress (atunnel and peers in its place) rather
/// than egress settings.
pub(super) fn compares_ingress(c: &Comparison) -> bool {
    c.variants
        .iter()
        .flat_map(|v| &v.scenarios)
        .any(|s| s.name == Scenario::IngressHttps.name() || s.name == Scenario::IngressIdle.name())
}

/// The side-by-side table of a comparison (text; report.md embeds it too).
pub fn comparison_table(c: &Comparison) -> String {
    if compares_ingress(c) {
        return ingress_comparison_table(c);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>14} {:>10} {:>16} {:>22}",
        "variant", "idle heap B", "idle cgroup B", "tasks", "http cores@8000", "tcp MB/s (3 runs)"
    );
    let num = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x}"));
    for v in &c.variants {
        let idle = v.summary::<egress_idle::Summary>();
        let idle = |figure: fn(&egress_idle::Summary) -> f64| num(idle.as_ref().map(figure));
        let cores = v
            .summary::<egress_http::Summary>()
            .and_then(|s| s.cores_at_8000_rps);
        let tcp = v
            .summary::<egress_tcp::Summary>()
            .map(|s| s.runs.ipv4.mb_per_s)
            .filter(|runs| !runs.is_empty())
            .map_or_else(
                || "-".into(),
                |runs| {
                    runs.iter()
                        .map(|x| format!("{x:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            );
        let _ = writeln!(
            out,
            "{:<14} {:>12} {:>14} {:>10} {:>16} {:>22}",
            v.label,
            idle(|s| s.heap_bytes_per_conn),
            idle(|s| s.cgroup_bytes_per_conn),
            idle(|s| s.tasks_per_conn),
            num(cores),
            tcp
        );
    }
    out
}

/// ingress-idle's `figure` for `case` in a variant's summary.
pub(super) fn idle_case(
    v: &Variant,
    case: &str,
    figure: fn(&ingress_idle::Case) -> Option<f64>,
) -> Option<f64> {
    let s = v.summary::<ingress_idle::Summary>()?;
    figure(s.cases.iter().find(|c| c.case == case)?)
}

/// The highest ingress-https rate every variant kept up with (achieved at
/// least 99 % of it, no errors), whatever the verdict: CPU per request is
/// compared there, at the same load for all.
pub(super) fn common_rate(c: &Comparison) -> Option<f64> {
    let kept_up = |v: &Variant| -> Vec<f64> {
        v.scenarios
            .iter()
            .filter(|s| s.name == Scenario::IngressHttps.name())
            .flat_map(|s| &s.rungs)
            .filter(|r| r.errors == 0 && r.achieved >= 0.99 * r.offered)
            .map(|r| r.offered)
            .collect()
    };
    let first = kept_up(c.variants.first()?);
    let rest: Vec<Vec<f64>> = c.variants.iter().skip(1).map(kept_up).collect();
    first
        .into_iter()
        .filter(|rate| rest.iter().all(|rates| rates.contains(rate)))
        .fold(None, |best: Option<f64>, r| {
            Some(best.map_or(r, |b| b.max(r)))
        })
}

/// A variant's CPU per request (microseconds) at ingress-https's `rate`
/// rung, else the figure its summary gives.
pub(super) fn cpu_us_per_request(v: &Variant, rate: Option<f64>) -> Option<f64> {
    let at_rate = rate.and_then(|rate| {
        v.scenarios
            .iter()
            .filter(|s| s.name == Scenario::IngressHttps.name())
            .flat_map(|s| &s.rungs)
            .find(|r| r.offered == rate && r.achieved > 0.0)
            .map(|r| r.tunnel_cpu_cores / r.achieved * 1e6)
    });
    at_rate.or_else(|| v.summary::<ingress_https::Summary>()?.cpu_us_per_request)
}

/// The ingress comparison (`--compare peers`): per variant, sustainable
/// requests/s (ingress-https), CPU per request at the highest rate all kept
/// up with, cgroup bytes per idle HTTP/1.1 and HTTP/2 router connection
/// (ingress-idle, awake), each with the ratio of the first variant's
/// (atunnel's) figure to this one's: above 1, atunnel needs more CPU or
/// memory, or sustains more requests/s. atunnel's hibernated figure (its
/// default after 15 s idle) is beside them.
pub(super) fn ingress_comparison_table(c: &Comparison) -> String {
    /// A column: its heading and how a variant's figure is read.
    type Column<'a> = (&'a str, Box<dyn Fn(&Variant) -> Option<f64>>);
    let rate = common_rate(c);
    let saturated = |v: &Variant| v.summary::<ingress_https::Summary>()?.saturated;
    let egress_per_cpu_s = |v: &Variant| {
        v.summary::<egress_tcp::Summary>()?
            .runs
            .ipv4
            .mb_per_tunnel_cpu_s_median
    };
    let figures: [Column; 8] = [
        (
            "req/s",
            Box::new(|v| v.summary::<ingress_https::Summary>()?.sustainable_rps),
        ),
        ("CPU us/req", Box::new(move |v| cpu_us_per_request(v, rate))),
        ("sat req/s", Box::new(move |v| Some(saturated(v)?.rps))),
        (
            "sat us/req",
            Box::new(move |v| saturated(v)?.cpu_us_per_request),
        ),
        (
            "idle h1 B/conn",
            Box::new(|v| {
                idle_case(v, "http1-keepalive-short", |c| {
                    Some(c.cgroup_bytes_per_conn)
                })
            }),
        ),
        (
            "idle h2 B/conn",
            Box::new(|v| idle_case(v, "http2-one-request", |c| Some(c.cgroup_bytes_per_conn))),
        ),
        ("egress MB/CPU-s", Box::new(egress_per_cpu_s)),
        (
            "hibernated h1",
            Box::new(|v| {
                idle_case(v, "http1-keepalive-short", |c| {
                    c.hibernated_cgroup_bytes_per_conn
                })
            }),
        ),
    ];
    // Ratios for the first seven; the hibernated figure is atunnel's alone.
    pub(super) const WITH_RATIO: usize = 7;
    let base = c.variants.first();
    let fmt = |x: Option<f64>| x.map_or("-".to_string(), |x| trim_float(x, 1));
    let ratio = |x: Option<f64>, i: usize| {
        let b = base.and_then(|b| figures[i].1(b));
        match (b, x) {
            (Some(b), Some(x)) if x != 0.0 => format!("{:.2}", b / x),
            _ => "-".to_string(),
        }
    };
    let mut out = String::new();
    let mut head = format!("{:<10}", "variant");
    for (i, (name, _)) in figures.iter().enumerate() {
        let _ = write!(head, " {name:>14}");
        if i < WITH_RATIO {
            let _ = write!(head, " {:>7}", "ratio");
        }
    }
    let _ = writeln!(out, "{}", head.trim_end());
    for v in &c.variants {
        let mut row = format!("{:<10}", v.label);
        for (i, (_, figure)) in figures.iter().enumerate() {
            let x = figure(v);
            let _ = write!(row, " {:>14}", fmt(x));
            if i < WITH_RATIO {
                let _ = write!(row, " {:>7}", ratio(x, i));
            }
        }
        let _ = writeln!(out, "{}", row.trim_end());
    }
    if let Some(b) = base {
        let _ = writeln!(out, "ratio = {}'s figure / this variant's", b.label);
    }
    if let Some(rate) = rate {
        let _ = writeln!(
            out,
            "CPU us/req at {}/s, the highest ingress-https rate every variant kept up with",
            fmt_rate(rate)
        );
    }
    if let Some(n) = c
        .variants
        .iter()
        .find_map(|v| Some(saturated(v)?.streams_in_flight as f64))
    {
        let _ = writeln!(
            out,
            "sat: {} requests in flight, closed-loop (ingress-https's summary says whose CPU ran out first)",
            trim_float(n, 0)
        );
    }
    if c.variants.iter().any(|v| egress_per_cpu_s(v).is_some()) {
        let _ = writeln!(
            out,
            "egress MB/CPU-s: egress-tcp's MB per CPU-second of the contender's cgroup, median of 3 IPv4 runs (HAProxy as a TCP -> TLS relay, without atunnel's HTTP/2 framing)"
        );
    }
    out
}
