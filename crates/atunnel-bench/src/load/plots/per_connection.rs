//! Memory per idle connection: egress-idle's and ingress-idle's figure,
//! every contender's connections side by side.

use super::chart::{Axes, BarSeries, Bars, Chart, Figure, Panel, Series, tick};

/// Memory per idle connection as one contender measured it in one case at
/// one connection count. A contender measured at several counts has one
/// entry per count, and gets a line.
#[derive(Clone, Debug, PartialEq)]
pub struct PerConnection {
    /// The legend's label: "atunnel", "naive (copy-mode)", "nginx (peers)",
    /// "atunnel, hibernated", ...
    pub label: String,
    /// What was held idle ("http2-one-request"); empty when the scenario
    /// has one kind of connection.
    pub case: String,
    pub conns: f64,
    pub heap_bytes: Option<f64>,
    pub cgroup_bytes: Option<f64>,
}

/// Heap and cgroup bytes per idle connection (`memory-per-connection`).
/// Lines against the number of connections held when a contender was
/// measured at several counts (a line per contender and case); otherwise
/// bars, a group per case and count, a bar per contender.
pub fn memory_per_connection(scenario: &str, contenders: &[PerConnection]) -> Figure {
    let first_seen = |key: &dyn Fn(&PerConnection) -> String| {
        let mut seen: Vec<String> = Vec::new();
        for c in contenders {
            let k = key(c);
            if !seen.contains(&k) {
                seen.push(k);
            }
        }
        seen
    };
    let line_label = |c: &PerConnection| format!("{} {}", c.label, c.case).trim_end().to_string();
    let group = |c: &PerConnection| {
        let count = format!("{} connections", tick(c.conns));
        if c.case.is_empty() {
            count
        } else {
            format!("{}\n{count}", c.case)
        }
    };
    let several_counts = first_seen(&line_label).iter().any(|l| {
        let mut xs: Vec<f64> = contenders
            .iter()
            .filter(|c| line_label(c) == *l)
            .map(|c| c.conns)
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.len() >= 2
    });
    let x = "idle connections held";
    let panel = |title: &str, y: &str, value: fn(&PerConnection) -> Option<f64>| {
        let axes = Axes::new(title, x, y);
        if several_counts {
            let series = first_seen(&line_label)
                .into_iter()
                .map(|l| {
                    let points = contenders
                        .iter()
                        .filter(|c| line_label(c) == l)
                        .filter_map(|c| value(c).map(|v| (c.conns, v)))
                        .collect();
                    Series::new(l, points)
                })
                .collect();
            return Panel::lines(axes, series);
        }
        let categories = first_seen(&group);
        let series = first_seen(&|c: &PerConnection| c.label.clone())
            .into_iter()
            .map(|label| {
                let values = categories
                    .iter()
                    .map(|g| {
                        contenders
                            .iter()
                            .find(|c| c.label == label && group(c) == *g)
                            .and_then(value)
                    })
                    .collect();
                BarSeries::new(label, values)
            })
            .collect();
        Panel::bars(axes, Bars { categories, series })
    };
    Figure::new(
        "memory-per-connection",
        Chart::new(
            format!("{scenario}: memory per idle connection"),
            vec![
                panel(
                    "heap per idle connection",
                    "heap bytes per connection",
                    |c| c.heap_bytes,
                ),
                panel(
                    "cgroup memory per idle connection (user and kernel)",
                    "cgroup bytes per connection",
                    |c| c.cgroup_bytes,
                ),
            ],
        ),
    )
}
