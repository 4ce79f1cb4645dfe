//! egress-tcp's summary: bulk throughput of one egress connection, three
//! runs per address family; and its figure (MB/s and MB/s per tunnel
//! core per run, a bar per contender).

use serde::{Deserialize, Serialize};

use super::{Measured, PerFamily, Scenario, ScenarioSummary};
use crate::load::plots::chart::{Axes, BarSeries, Bars, Chart, Figure, Panel};

/// IPv4's runs under the bare keys, IPv6's under the same keys with
/// `_ipv6` after them ([`PerFamily`]; a contender that relays IPv4 only
/// has none).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    #[serde(flatten)]
    pub runs: PerFamily<Runs>,
    pub bytes_per_run: u64,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::EgressTcp;
}

/// Three bulk uploads over one family, a value per run in each list.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Runs {
    pub mb_per_s: Vec<f64>,
    /// MB per CPU-second of the tunnel's cgroup.
    pub mb_per_tunnel_cpu_s: Vec<f64>,
    /// Their median: the figure to compare.
    pub mb_per_tunnel_cpu_s_median: Option<f64>,
    pub tunnel_cores: Vec<f64>,
    pub sink_cores: Vec<f64>,
    pub generator_cores: Vec<f64>,
}

/// IPv4's MB/s and MB/s per tunnel core of each run, a bar per contender
/// (n/a for one whose scenario failed). None when no contender has runs.
pub fn figures(contenders: &[Measured<Summary>]) -> Vec<Figure> {
    let none = Runs::default();
    let runs: Vec<(&str, &Runs)> = contenders
        .iter()
        .map(|m| {
            let runs = m.summary.as_ref().map_or(&none, |s| &s.runs.ipv4);
            (m.label.as_str(), runs)
        })
        .collect();
    let n = runs
        .iter()
        .map(|(_, r)| r.mb_per_s.len())
        .max()
        .unwrap_or(0);
    if n == 0 {
        return Vec::new();
    }
    let categories: Vec<String> = (1..=n).map(|i| format!("run {i}")).collect();
    let mut mbps = Vec::new();
    let mut per_core = Vec::new();
    for (label, r) in runs {
        let (m, c) = (&r.mb_per_s, &r.tunnel_cores);
        per_core.push(BarSeries::new(
            label,
            (0..n)
                .map(|i| match (m.get(i), c.get(i)) {
                    (Some(m), Some(c)) if *c > 0.0 => Some(m / c),
                    _ => None,
                })
                .collect(),
        ));
        mbps.push(BarSeries::new(
            label,
            (0..n).map(|i| m.get(i).copied()).collect(),
        ));
    }
    let panel = |title: &str, y: &str, series| {
        Panel::bars(
            Axes::new(title, "bulk run", y),
            Bars {
                categories: categories.clone(),
                series,
            },
        )
    };
    vec![Figure::new(
        "throughput",
        Chart::new(
            "egress-tcp: throughput of one connection",
            vec![
                panel("throughput", "MB/s", mbps),
                panel(
                    "throughput per tunnel core",
                    "MB/s per tunnel core",
                    per_core,
                ),
            ],
        ),
    )]
}
