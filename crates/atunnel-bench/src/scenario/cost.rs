//! cost's summary: what one unit of work costs each contender, in counts
//! (instructions, system calls, context switches, allocations); and its
//! figures (a file per unit, the contenders side by side). results.json
//! has it twice: as the scenario's summary and as its top-level `cost`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};
use crate::load::plots::chart::{Axes, BarSeries, Bars, Chart, Figure, Panel};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub units: Vec<UnitCounts>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::Cost;
}

/// One unit of work and each contender's counts for it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct UnitCounts {
    /// "ingress-https", "egress-open", ...
    pub name: String,
    /// What one unit is ("request (router h2 -> actor h1, 64 B answer)").
    pub per: String,
    /// N: units in the smaller window under callgrind (the larger has 2N),
    /// and under perf.
    pub n: u64,
    pub n_perf: u64,
    /// Pairs of windows whose median each count is; files written before
    /// they were counted have one (`None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds_perf: Option<u64>,
    pub contenders: Vec<ContenderCounts>,
}

/// One contender's counts per unit: the median over the pairs of windows.
/// `None` (null) for a count not measured (a peer's allocations; the
/// instructions of a pass that did not run).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ContenderCounts {
    /// "atunnel", "nginx", "haproxy".
    pub name: String,
    /// The way its units took to the actors or the far end.
    pub path: String,
    pub instructions: Option<f64>,
    pub syscalls: Option<f64>,
    /// The system calls by name (those of at least 0.005 per unit).
    pub syscalls_by_name: BTreeMap<String, f64>,
    pub context_switches: Option<f64>,
    pub preemptions: Option<f64>,
    pub allocations: Option<f64>,
    /// Each count's [min, max] over the pairs, beside its median.
    pub spread: Spread,
}

/// [min, max] of a count's per-pair estimates; absent for one not measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Spread {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscalls: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_switches: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<[f64; 2]>,
}

/// A file per unit, named for it.
pub fn figures(s: &Summary) -> Vec<Figure> {
    s.units
        .iter()
        .map(|unit| Figure::new(unit.name.clone(), unit_chart(unit)))
        .collect()
}

/// The syscalls by name a unit's stacked bars show: the five the
/// contenders make most (summed over them), the rest in one segment.
const TOP: usize = 5;

/// One unit: a panel per cost kind (instructions; syscalls, one bar per
/// contender stacked by name, the five names the contenders make most and
/// the rest; context switches and allocations), the contenders side by
/// side in each.
pub fn unit_chart(unit: &UnitCounts) -> Chart {
    let contenders = &unit.contenders;
    let names: Vec<String> = contenders.iter().map(|c| c.name.clone()).collect();
    let per = &unit.per;
    let kind = |label: &str, count: fn(&ContenderCounts) -> Option<f64>| {
        BarSeries::new(label, contenders.iter().map(count).collect())
    };
    let panel = |title: &str, series: Vec<BarSeries>| {
        Panel::bars(
            Axes::new(title, "contender", format!("per {per}")),
            Bars {
                categories: names.clone(),
                series,
            },
        )
    };
    // A name's per-unit difference can come out a hair below zero; as a
    // part of the stack it is none.
    let of = |c: &ContenderCounts, name: &str| {
        c.syscalls_by_name
            .get(name)
            .copied()
            .unwrap_or(0.0)
            .max(0.0)
    };
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    for c in contenders {
        for name in c.syscalls_by_name.keys() {
            *totals.entry(name).or_default() += of(c, name);
        }
    }
    let mut top: Vec<(&str, f64)> = totals.into_iter().filter(|(k, _)| *k != "other").collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(TOP);
    let mut by_name: Vec<BarSeries> = top
        .iter()
        .map(|(name, _)| {
            BarSeries::new(
                *name,
                contenders
                    .iter()
                    .map(|c| c.syscalls.map(|_| of(c, name)))
                    .collect(),
            )
        })
        .collect();
    by_name.push(BarSeries::new(
        "rest",
        contenders
            .iter()
            .map(|c| {
                let named: f64 = top.iter().map(|(name, _)| of(c, name)).sum();
                Some((c.syscalls? - named).max(0.0))
            })
            .collect(),
    ));
    Chart::new(
        format!("cost: {} (per {per})", unit.name),
        vec![
            panel(
                "user-space instructions (callgrind)",
                vec![kind("instructions", |c| c.instructions)],
            ),
            Panel::stacked_bars(
                Axes::new(
                    "system calls (perf), stacked by name",
                    "contender",
                    format!("per {per}"),
                ),
                Bars {
                    categories: names.clone(),
                    series: by_name,
                },
            ),
            panel(
                "context switches and heap allocations",
                vec![
                    kind("context_switches", |c| c.context_switches),
                    kind("allocations", |c| c.allocations),
                ],
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::plots::tests::{Drawn, assert_written, bars_drawn, check, text};

    fn contender(
        name: &str,
        instructions: Option<f64>,
        syscalls: f64,
        by_name: &[(&str, f64)],
        context_switches: f64,
        allocations: Option<f64>,
    ) -> ContenderCounts {
        ContenderCounts {
            name: name.into(),
            instructions,
            syscalls: Some(syscalls),
            syscalls_by_name: by_name.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            context_switches: Some(context_switches),
            allocations,
            ..ContenderCounts::default()
        }
    }

    #[test]
    fn a_cost_unit_is_drawn_with_each_contender_side_by_side_and_a_peers_allocations_as_na() {
        let unit = UnitCounts {
            name: "ingress-https".into(),
            per: "request".into(),
            n: 200,
            contenders: vec![
                contender(
                    "atunnel",
                    Some(84400.0),
                    6.1,
                    &[("writev", 2.0), ("recvfrom", 2.0), ("epoll_wait", 2.1)],
                    2.0,
                    Some(35.0),
                ),
                contender(
                    "nginx",
                    None,
                    8.0,
                    &[("read", 2.0), ("writev", 1.0), ("epoll_wait", 2.0)],
                    2.0,
                    None,
                ),
            ],
            ..UnitCounts::default()
        };
        let svg = unit_chart(&unit).render().expect("drawn");
        check(&svg);
        // Each panel names both contenders.
        assert_eq!(text(&svg, "atunnel"), 3, "{svg}");
        assert_eq!(text(&svg, "nginx"), 3, "{svg}");
        // The syscalls panel's series: the top names and the rest.
        assert_written(&svg, &["writev", "epoll_wait", "read", "rest"]);
        // nginx's instructions and allocations were not measured.
        assert!(svg.contains("n/a"), "{svg}");
    }

    #[test]
    fn a_cost_units_syscalls_are_one_stacked_bar_per_contender_summing_to_its_total() {
        // Top five over both: recvfrom 6, epoll_wait 4, getpid 3, sendto 3,
        // writev 2; atunnel's futex, close and other are its rest.
        let unit = UnitCounts {
            name: "egress-open".into(),
            per: "tunnel".into(),
            n: 64,
            contenders: vec![
                contender(
                    "atunnel",
                    Some(90000.0),
                    10.0,
                    &[
                        ("writev", 2.0),
                        ("recvfrom", 2.0),
                        ("epoll_wait", 2.0),
                        ("sendto", 1.0),
                        ("futex", 1.0),
                        ("close", 0.5),
                        ("other", 1.5),
                    ],
                    5.0,
                    Some(19.0),
                ),
                contender(
                    "haproxy",
                    None,
                    12.0,
                    &[
                        ("recvfrom", 4.0),
                        ("sendto", 2.0),
                        ("epoll_wait", 2.0),
                        ("getpid", 3.0),
                        ("other", 1.0),
                    ],
                    4.0,
                    None,
                ),
            ],
            ..UnitCounts::default()
        };
        let svg = unit_chart(&unit).render().expect("drawn");
        check(&svg);
        // The stacked panel's bars are the only ones drawn as columns of
        // several rects of one x and width: (recvfrom, epoll_wait, getpid, sendto,
        // writev, rest) are series 0-5.
        let drawn = bars_drawn(&svg, 6);
        let mut columns: Vec<(f64, f64)> = drawn.iter().map(|r| (r.1, r.3)).collect();
        columns.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        columns.dedup();
        let columns: Vec<Vec<Drawn>> = columns
            .into_iter()
            .map(|(x, w)| {
                drawn
                    .iter()
                    .copied()
                    .filter(|r| (r.1, r.3) == (x, w))
                    .collect::<Vec<_>>()
            })
            .filter(|c| c.len() >= 2)
            .collect();
        assert_eq!(columns.len(), 2, "a stacked bar per contender: {drawn:?}");
        let mut heights = Vec::new();
        for column in &columns {
            // Each segment starts where the one before it ends (y grows
            // downwards), from the axis up.
            for pair in column.windows(2) {
                let (below, above) = (pair[0], pair[1]);
                assert!(
                    (above.2 + above.4 - below.2).abs() <= 1.0,
                    "segments apart: {column:?}"
                );
            }
            heights.push(column.iter().map(|r| r.4).sum::<f64>());
        }
        // atunnel: 2 + 2 + 1 + 2 + a rest of 3 = 10; haproxy: 4 + 2 + 3 + 2
        // + a rest of 1 = 12: the segments sum to each one's total.
        let ratio = heights[0] / heights[1];
        assert!((ratio - 10.0 / 12.0).abs() < 0.02, "{heights:?}");
        let rest = columns[0]
            .iter()
            .find(|r| r.0 == 5)
            .expect("atunnel's rest");
        assert!(
            (rest.4 / heights[0] - 0.3).abs() < 0.02,
            "{rest:?} of {heights:?}"
        );
        assert!(
            !columns[0].iter().any(|r| r.0 == 2),
            "atunnel makes no getpid"
        );
        // The other panels kept.
        assert!(svg.contains("user-space instructions"), "{svg}");
        assert!(
            svg.contains("context switches and heap allocations"),
            "{svg}"
        );
    }
}
