//! ingress-idle's summary: what an idle router connection costs atunnel,
//! awake and hibernated, per case; and its figures (memory per idle
//! connection beside the peers', hibernation before and after).

use serde::{Deserialize, Serialize};

use super::{Measured, Scenario, ScenarioSummary};
use crate::load::confidence::{Conclusion, Counts, FigureSummary};
use crate::load::plots::chart::{Axes, BarSeries, Bars, Chart, Figure, Panel};
use crate::load::plots::per_connection::{PerConnection, memory_per_connection};

/// A peer in atunnel's place (`--compare peers`) writes one pass with
/// hibernation off, the HTTPS cases only, and none of the hibernation
/// fields (`None`, left out of the JSON).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// Connections held per case.
    pub conns: usize,
    /// The hibernation period of the pass with hibernation on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernate_after_s: Option<u64>,
    pub cases: Vec<Case>,
    /// Keep-alive requests per second with hibernation off and on.
    pub keepalive_rps: OffOn,
    pub keepalive_cores_per_1000_rps: OffOn,
    /// The worst of the cases' wake verdicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_verdict: Option<Conclusion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_verdicts: Option<Counts>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::IngressIdle;
}

/// A figure with hibernation off and on (`on`: atunnel's alone).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct OffOn {
    pub off: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on: Option<f64>,
}

/// One kind of idle connection, per connection: awake (hibernation off)
/// and, atunnel's, hibernated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Case {
    /// "http1-keepalive-short", "http1-keepalive-page", "http2-one-request",
    /// "connect-tunnel".
    pub case: String,
    /// `None` for a peer (its heap is not in /stats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap_bytes_per_conn: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_heap_bytes_per_conn: Option<f64>,
    pub cgroup_bytes_per_conn: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_cgroup_bytes_per_conn: Option<f64>,
    /// atunnel's CPU while the connections went idle.
    pub idle_cpu_us_per_conn: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_idle_cpu_us_per_conn: Option<f64>,
    /// What hibernating adds: the hibernated idle CPU less the awake one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernating_cpu_us_per_conn: Option<f64>,
    /// The next request on each idle connection (awake).
    pub next_request_cpu_us: f64,
    pub next_request_p50_us: u64,
    pub next_request_p99_us: u64,
    /// The first request after waking (hibernated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_cpu_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_p50_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_p99_us: Option<u64>,
    /// Per round, the median first request after waking and the next one
    /// awake.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_rounds: Option<Vec<WakeRound>>,
    /// Woken / awake over the rounds, its interval and verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_ratio: Option<FigureSummary>,
}

/// One round's medians; `awake_p50_us` is `None` when a connection had
/// hibernated again before its awake request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct WakeRound {
    pub woken_p50_us: u64,
    pub awake_p50_us: Option<u64>,
}

/// Memory per idle connection of every contender (a peer awake only), and
/// hibernation before and after from the first contender that hibernates
/// (atunnel, from the run or else from the comparison that ran it).
pub fn figures(contenders: &[Measured<Summary>]) -> Vec<Figure> {
    let mut figures = Vec::new();
    let per_connection = per_connection(contenders);
    if !per_connection.is_empty() {
        figures.push(memory_per_connection(
            Scenario::IngressIdle.name(),
            &per_connection,
        ));
    }
    let hibernates = |s: &Summary| {
        s.cases
            .iter()
            .any(|c| c.hibernated_cgroup_bytes_per_conn.is_some())
    };
    if let Some(s) = contenders
        .iter()
        .filter_map(|m| m.summary.as_ref())
        .find(|s| hibernates(s))
    {
        figures.extend(hibernation(s));
    }
    figures
}

/// Each contender's cases, awake and, where it hibernates, hibernated (a
/// series of its own: "atunnel, hibernated").
fn per_connection(contenders: &[Measured<Summary>]) -> Vec<PerConnection> {
    let mut out = Vec::new();
    for m in contenders {
        let Some(s) = &m.summary else { continue };
        let hibernated = format!("{}, hibernated", m.label);
        for c in &s.cases {
            let at = |label: &str, heap: Option<f64>, cgroup: Option<f64>| {
                (heap.is_some() || cgroup.is_some()).then(|| PerConnection {
                    label: label.to_string(),
                    case: c.case.clone(),
                    conns: s.conns as f64,
                    heap_bytes: heap,
                    cgroup_bytes: cgroup,
                })
            };
            out.extend(at(
                &m.label,
                c.heap_bytes_per_conn,
                Some(c.cgroup_bytes_per_conn),
            ));
            out.extend(at(
                &hibernated,
                c.hibernated_heap_bytes_per_conn,
                c.hibernated_cgroup_bytes_per_conn,
            ));
        }
    }
    out
}

/// Per case: heap and cgroup bytes per connection awake (hibernation off)
/// and hibernated, and atunnel's CPU per connection while they went idle.
/// `None` without cases.
fn hibernation(s: &Summary) -> Option<Figure> {
    if s.cases.is_empty() {
        return None;
    }
    let categories: Vec<String> = s.cases.iter().map(|c| c.case.clone()).collect();
    type Column = fn(&Case) -> Option<f64>;
    let column = |value: Column| s.cases.iter().map(value).collect::<Vec<_>>();
    let pair = |title: &str, y: &str, awake: Column, asleep: Column, labels: [&str; 2]| {
        Panel::bars(
            Axes::new(title, "case", y),
            Bars {
                categories: categories.clone(),
                series: vec![
                    BarSeries::new(labels[0], column(awake)),
                    BarSeries::new(labels[1], column(asleep)),
                ],
            },
        )
    };
    let mut panels = vec![
        pair(
            "heap per idle connection",
            "heap bytes per connection",
            |c| c.heap_bytes_per_conn,
            |c| c.hibernated_heap_bytes_per_conn,
            ["awake (hibernation off)", "hibernated"],
        ),
        pair(
            "cgroup memory per idle connection",
            "cgroup bytes per connection",
            |c| Some(c.cgroup_bytes_per_conn),
            |c| c.hibernated_cgroup_bytes_per_conn,
            ["awake (hibernation off)", "hibernated"],
        ),
    ];
    if s.cases
        .iter()
        .any(|c| c.hibernated_idle_cpu_us_per_conn.is_some())
    {
        panels.push(pair(
            "atunnel CPU per connection while going idle",
            "CPU us per connection",
            |c| Some(c.idle_cpu_us_per_conn),
            |c| c.hibernated_idle_cpu_us_per_conn,
            ["hibernation off", "hibernation on"],
        ));
    }
    Some(Figure::new(
        "hibernation",
        Chart::new("ingress-idle: hibernation, before and after", panels),
    ))
}
