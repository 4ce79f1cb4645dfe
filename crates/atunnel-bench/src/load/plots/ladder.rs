//! The ladder: the figure of every scenario with rungs, whatever the
//! scenario (`<scenario>.svg`).

use super::chart::{Axes, BarSeries, Bars, Chart, Panel, Series, tick};
use crate::load::rung::RungResult;
use crate::load::verdict::Verdict;

/// Tunnel CPU, tunnel cgroup memory and p99 latency against offered rate;
/// rungs whose verdict is not ok ringed in red. Rungs all at one rate (a
/// setting off and on, say) are a bar each.
pub(super) fn chart(scenario: &str, rungs: &[RungResult]) -> Chart {
    type Metric = (&'static str, fn(&RungResult) -> f64);
    const MIB: f64 = 1024.0 * 1024.0;
    let metrics: [Metric; 3] = [
        ("tunnel CPU (cores)", |r| r.tunnel_cpu_cores),
        ("tunnel cgroup memory (MiB)", |r| {
            r.tunnel_cgroup_bytes as f64 / MIB
        }),
        ("p99 latency (ms)", |r| r.latency_us.p99 as f64 / 1000.0),
    ];
    let mut xs: Vec<f64> = rungs.iter().map(|r| r.offered).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let panels: Vec<Panel> = metrics
        .iter()
        .map(|(title, value)| {
            if xs.len() >= 2 {
                let series = Series {
                    label: scenario.to_string(),
                    points: rungs.iter().map(|r| (r.offered, value(r))).collect(),
                    marked: rungs.iter().map(|r| r.verdict != Verdict::Ok).collect(),
                };
                let axes = Axes::new(*title, "offered rate (per second)", *title);
                Panel::lines(axes, vec![series])
            } else {
                let bars = Bars {
                    categories: rungs
                        .iter()
                        .enumerate()
                        .map(|(i, r)| format!("rung {} at {}/s", i + 1, tick(r.offered)))
                        .collect(),
                    series: vec![BarSeries::new(
                        scenario.to_string(),
                        rungs.iter().map(|r| Some(value(r))).collect(),
                    )],
                };
                Panel::bars(Axes::new(*title, "rung (offered rate)", *title), bars)
            }
        })
        .collect();
    let note = if xs.len() >= 2 {
        " (red ring: verdict not ok)"
    } else {
        ""
    };
    Chart::new(
        format!("{scenario}: tunnel against offered rate{note}"),
        panels,
    )
}
