//! socket-memory's summary: the memory one stalled connection holds on the
//! proxy holding it, per case; and its figure (kernel, heap and total per
//! case against the bound).

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};
use crate::load::plots::chart::{Axes, BarSeries, Bars, Chart, Figure, Limit, Panel, tick};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub cases: Vec<Case>,
    /// Stalled connections per case.
    pub conns: usize,
    /// Measurements per case (their median is the figure).
    pub repeats: usize,
    /// A stalled connection passes at or under this much heap plus kernel.
    pub bound_kib: Option<f64>,
    /// Bulk throughput with the same flags, one run.
    pub throughput_mb_per_s: f64,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::SocketMemory;
}

/// One stall case on one proxy, per stalled connection over the proxy's
/// idle baseline; a figure not measured is `None` (null).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Case {
    /// "actor-stops-reading", "destination-stops-reading", ...
    pub case: String,
    /// The proxy holding the stalled connection: "atunnel" or "gateway".
    pub measured: String,
    pub kernel_kib: Option<f64>,
    pub heap_kib: Option<f64>,
    pub total_kib: Option<f64>,
    /// The kernel's share split by queue.
    pub parts_kib: Parts,
    /// Whether the total is within the bound.
    pub pass: Option<bool>,
}

/// Kernel socket memory by where it is (SO_MEMINFO).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Parts {
    pub receive: Option<f64>,
    pub send: Option<f64>,
    pub reserved: Option<f64>,
}

/// Kernel, heap and total KiB per stalled connection per case, with the
/// bound. None without cases.
pub fn figures(s: &Summary) -> Vec<Figure> {
    if s.cases.is_empty() {
        return Vec::new();
    }
    let categories = s
        .cases
        .iter()
        .map(|c| format!("{}\n({})", c.case, c.measured))
        .collect();
    let column = |value: fn(&Case) -> Option<f64>| s.cases.iter().map(value).collect::<Vec<_>>();
    let mut panel = Panel::bars(
        Axes::new(
            "memory one stalled connection holds, over the idle baseline",
            "case (proxy measured)",
            "KiB per stalled connection",
        ),
        Bars {
            categories,
            series: vec![
                BarSeries::new("kernel (socket buffers)", column(|c| c.kernel_kib)),
                BarSeries::new("heap", column(|c| c.heap_kib)),
                BarSeries::new("total", column(|c| c.total_kib)),
            ],
        },
    );
    if let Some(bound) = s.bound_kib {
        panel.limits.push(Limit {
            label: format!("bound {} KiB", tick(bound)),
            y: bound,
        });
    }
    vec![Figure::new(
        "stall-memory",
        Chart::new("socket-memory: stall memory per case", vec![panel]),
    )]
}
