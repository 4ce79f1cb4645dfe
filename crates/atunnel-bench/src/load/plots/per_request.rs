//! CPU per request against the offered rate: egress-http's and
//! ingress-https's figure, drawn from every contender's rungs.

use super::chart::{Axes, Chart, Figure, Series, xy};
use crate::load::rung::RungResult;

/// Tunnel CPU per request and requests per tunnel core against offered
/// rate, one series per contender (its label and rungs; bars when each has
/// one rate) (`cpu-per-request`). `None` when no contender has a rung that
/// moved.
pub fn cpu_per_request(scenario: &str, contenders: &[(&str, &[RungResult])]) -> Option<Figure> {
    let per = |rungs: &[RungResult], y: fn(&RungResult) -> f64| {
        rungs
            .iter()
            .filter(|r| r.achieved > 0.0 && r.tunnel_cpu_cores > 0.0)
            .map(|r| (r.offered, y(r)))
            .collect::<Vec<_>>()
    };
    let series = |y: fn(&RungResult) -> f64| -> Vec<Series> {
        contenders
            .iter()
            .map(|(label, rungs)| Series::new(*label, per(rungs, y)))
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let cpu = series(|r| r.tunnel_cpu_cores / r.achieved * 1e6);
    if cpu.is_empty() {
        return None;
    }
    let rps = series(|r| r.achieved / r.tunnel_cpu_cores);
    let x = "offered rate (requests per second)";
    let panels = vec![
        xy(
            Axes::new("tunnel CPU per request", x, "CPU us per request"),
            cpu,
            "per second",
        ),
        xy(
            Axes::new(
                "throughput per tunnel core",
                x,
                "requests per second per core",
            ),
            rps,
            "per second",
        ),
    ];
    Some(Figure::new(
        "cpu-per-request",
        Chart::new(format!("{scenario}: CPU per request"), panels),
    ))
}
