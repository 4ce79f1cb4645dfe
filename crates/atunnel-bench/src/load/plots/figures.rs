//! One builder per figure of a run's report, reading what the scenarios put
//! in `results.json` and handing the shapes plain series.

use super::*;
use crate::scenario::noisy_neighbour::{Pattern, Victim};

/// A plot of a run: its file name in the run folder and its SVG text.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// `<scenario>.svg` for the ladder, `<scenario>.<figure>.svg` for the
    /// others: the scenario is the name up to the first `.`.
    pub file: String,
    pub svg: String,
}

/// Every plot made from `r` but noisy-neighbour's (its report section
/// draws that one with [`noisy_neighbour`], beside its table).
pub fn of_results(r: &Results) -> Result<Vec<Plot>, PlotError> {
    let mut plots = Vec::new();
    let mut add = |scenario: &str, figure: Option<&str>, svg: Option<String>| {
        if let Some(svg) = svg {
            let stem = file_stem(scenario);
            let file = match figure {
                Some(f) => format!("{stem}.{f}.svg"),
                None => format!("{stem}.svg"),
            };
            plots.push(Plot { file, svg });
        }
    };
    for s in r.scenarios.iter().filter(|s| !s.rungs.is_empty()) {
        add(&s.name, None, Some(rungs(s)?));
    }
    for scenario in ["egress-idle", "ingress-idle"] {
        let contenders = idle_contenders(r, scenario);
        if !contenders.is_empty() {
            let svg = memory_per_connection(scenario, &contenders)?;
            add(scenario, Some("memory-per-connection"), Some(svg));
        }
    }
    // atunnel's, from the run or else from the comparison that ran it.
    let hibernates = |s: &ScenarioResult| {
        cases(s)
            .iter()
            .any(|c| f(&c["hibernated_cgroup_bytes_per_conn"]).is_some())
    };
    if let Some((_, s)) = contenders(r, "ingress-idle")
        .into_iter()
        .find(|(_, s)| hibernates(s))
    {
        add(&s.name, Some("hibernation"), hibernation(s)?);
    }
    for scenario in ["egress-http", "ingress-https"] {
        let contenders = contenders(r, scenario);
        let svg = cpu_per_request(scenario, &contenders)?;
        add(scenario, Some("cpu-per-request"), svg);
    }
    let tcp = contenders(r, "egress-tcp");
    add("egress-tcp", Some("throughput"), tcp_throughput(&tcp)?);
    if let Some(s) = find(&r.scenarios, "socket-memory") {
        add(&s.name, Some("stall-memory"), stall_memory(s)?);
    }
    if let Some(s) = find(&r.scenarios, "cost") {
        for unit in s.summary["units"].as_array().into_iter().flatten() {
            let name = unit["name"].as_str().unwrap_or("unit");
            add(&s.name, Some(&file_stem(name)), Some(cost_unit(unit)?));
        }
    }
    Ok(plots)
}

/// One cost unit: a panel per cost kind (instructions; syscalls, one bar
/// per contender stacked by name, the five names the contenders make most
/// and the rest; context switches and allocations), the contenders side by
/// side in each.
pub fn cost_unit(unit: &Value) -> Result<String, PlotError> {
    let contenders = unit["contenders"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = contenders
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").to_string())
        .collect();
    let per = unit["per"].as_str().unwrap_or("unit");
    let kind = |key: &str| -> BarSeries {
        BarSeries::new(key, contenders.iter().map(|c| f(&c[key])).collect())
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
    // The syscalls by name the contenders make most, summed over them.
    let mut totals: std::collections::BTreeMap<String, f64> = Default::default();
    for c in &contenders {
        for (k, v) in c["syscalls_by_name"].as_object().into_iter().flatten() {
            *totals.entry(k.clone()).or_default() += f(v).unwrap_or(0.0).max(0.0);
        }
    }
    let mut top: Vec<(String, f64)> = totals.into_iter().filter(|(k, _)| k != "other").collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(5);
    let mut by_name: Vec<BarSeries> = top
        .iter()
        .map(|(k, _)| {
            BarSeries::new(
                k.clone(),
                contenders
                    .iter()
                    .map(|c| {
                        // A name's per-unit difference can come out a hair
                        // below zero; as a part of the stack it is none.
                        f(&c["syscalls"])
                            .map(|_| f(&c["syscalls_by_name"][k]).unwrap_or(0.0).max(0.0))
                    })
                    .collect(),
            )
        })
        .collect();
    by_name.push(BarSeries::new(
        "rest",
        contenders
            .iter()
            .map(|c| {
                let total = f(&c["syscalls"])?;
                let named: f64 = top
                    .iter()
                    .map(|(k, _)| f(&c["syscalls_by_name"][k]).unwrap_or(0.0).max(0.0))
                    .sum();
                Some((total - named).max(0.0))
            })
            .collect(),
    ));
    render(
        &format!("cost: {} (per {per})", unit["name"].as_str().unwrap_or("")),
        &[
            panel(
                "user-space instructions (callgrind)",
                vec![kind("instructions")],
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
                vec![kind("context_switches"), kind("allocations")],
            ),
        ],
    )
}

/// A scenario's file name: characters other than letters, digits, `-`
/// and `_` become `_` (no `.`: it separates the scenario from the figure).
pub fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() {
        "scenario".to_string()
    } else {
        stem
    }
}

pub(super) fn find<'a>(scenarios: &'a [ScenarioResult], name: &str) -> Option<&'a ScenarioResult> {
    scenarios.iter().find(|s| s.name == name)
}

/// The same scenario as measured by each contender of the run: atunnel
/// with the run's flags, then each variant of each comparison.
pub(super) fn contenders<'a>(r: &'a Results, scenario: &str) -> Vec<(String, &'a ScenarioResult)> {
    let mut out: Vec<(String, &ScenarioResult)> = find(&r.scenarios, scenario)
        .map(|s| ("atunnel".to_string(), s))
        .into_iter()
        .collect();
    for c in &r.comparisons {
        for v in &c.variants {
            if let Some(s) = find(&v.scenarios, scenario) {
                out.push((format!("{} ({})", v.label, c.name), s));
            }
        }
    }
    out
}

pub(super) fn f(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// The ladder: tunnel CPU, tunnel cgroup memory and p99 latency against
/// offered rate; rungs whose verdict is not ok ringed in red.
pub(super) fn rungs(s: &ScenarioResult) -> Result<String, PlotError> {
    type Metric = (&'static str, fn(&RungResult) -> f64);
    pub(super) const MIB: f64 = 1024.0 * 1024.0;
    let metrics: [Metric; 3] = [
        ("tunnel CPU (cores)", |r| r.tunnel_cpu_cores),
        ("tunnel cgroup memory (MiB)", |r| {
            r.tunnel_cgroup_bytes as f64 / MIB
        }),
        ("p99 latency (ms)", |r| r.latency_us.p99 as f64 / 1000.0),
    ];
    let mut xs: Vec<f64> = s.rungs.iter().map(|r| r.offered).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let panels: Vec<Panel> = metrics
        .iter()
        .map(|(title, value)| {
            if xs.len() >= 2 {
                let series = Series {
                    label: s.name.clone(),
                    points: s.rungs.iter().map(|r| (r.offered, value(r))).collect(),
                    marked: s.rungs.iter().map(|r| r.verdict != Verdict::Ok).collect(),
                };
                let axes = Axes::new(*title, "offered rate (per second)", *title);
                Panel::lines(axes, vec![series])
            } else {
                // One rate (e.g. the same rate with a setting off and on):
                // a bar per rung.
                let bars = Bars {
                    categories: s
                        .rungs
                        .iter()
                        .enumerate()
                        .map(|(i, r)| format!("rung {} at {}/s", i + 1, tick(r.offered)))
                        .collect(),
                    series: vec![BarSeries::new(
                        s.name.clone(),
                        s.rungs.iter().map(|r| Some(value(r))).collect(),
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
    render(
        &format!("{}: tunnel against offered rate{note}", s.name),
        &panels,
    )
}

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

/// What the run measured per idle connection, from atunnel and each
/// compared variant: egress-idle's one figure; ingress-idle's per case,
/// awake, and hibernated where the contender hibernates (atunnel, whose
/// default it is).
pub(super) fn idle_contenders(r: &Results, scenario: &str) -> Vec<PerConnection> {
    let mut out = Vec::new();
    for (label, s) in contenders(r, scenario) {
        let conns = f(&s.summary["conns"]).unwrap_or(0.0);
        if scenario != "ingress-idle" {
            let heap = f(&s.summary["heap_bytes_per_conn"]);
            let cgroup = f(&s.summary["cgroup_bytes_per_conn"]);
            if heap.is_some() || cgroup.is_some() {
                out.push(PerConnection {
                    label,
                    case: String::new(),
                    conns,
                    heap_bytes: heap,
                    cgroup_bytes: cgroup,
                });
            }
            continue;
        }
        let hibernated = format!("{label}, hibernated");
        for c in cases(s) {
            let case = c["case"].as_str().unwrap_or("?").to_string();
            let at = |label: &str, heap: &str, cgroup: &str| {
                let (heap, cgroup) = (f(&c[heap]), f(&c[cgroup]));
                (heap.is_some() || cgroup.is_some()).then(|| PerConnection {
                    label: label.to_string(),
                    case: case.clone(),
                    conns,
                    heap_bytes: heap,
                    cgroup_bytes: cgroup,
                })
            };
            out.extend(at(&label, "heap_bytes_per_conn", "cgroup_bytes_per_conn"));
            out.extend(at(
                &hibernated,
                "hibernated_heap_bytes_per_conn",
                "hibernated_cgroup_bytes_per_conn",
            ));
        }
    }
    out
}

pub(super) fn cases(s: &ScenarioResult) -> &[Value] {
    s.summary["cases"].as_array().map_or(&[], Vec::as_slice)
}

/// Heap and cgroup bytes per idle connection. Lines against the number of
/// connections held when a contender was measured at several counts (a
/// line per contender and case); otherwise bars, a group per case and
/// count, a bar per contender.
pub fn memory_per_connection(
    scenario: &str,
    contenders: &[PerConnection],
) -> Result<String, PlotError> {
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
    render(
        &format!("{scenario}: memory per idle connection"),
        &[
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
    )
}

/// ingress-idle per case: heap and cgroup bytes per connection awake
/// (hibernation off) and hibernated, and atunnel's CPU per connection
/// while they went idle. `None` without cases.
pub(super) fn hibernation(s: &ScenarioResult) -> Result<Option<String>, PlotError> {
    let cases = cases(s);
    if cases.is_empty() {
        return Ok(None);
    }
    let categories: Vec<String> = cases
        .iter()
        .map(|c| c["case"].as_str().unwrap_or("?").to_string())
        .collect();
    let column = |key: &str| cases.iter().map(|c| f(&c[key])).collect::<Vec<_>>();
    let pair = |title: &str, y: &str, awake: &str, asleep: &str, labels: [&str; 2]| {
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
            "heap_bytes_per_conn",
            "hibernated_heap_bytes_per_conn",
            ["awake (hibernation off)", "hibernated"],
        ),
        pair(
            "cgroup memory per idle connection",
            "cgroup bytes per connection",
            "cgroup_bytes_per_conn",
            "hibernated_cgroup_bytes_per_conn",
            ["awake (hibernation off)", "hibernated"],
        ),
    ];
    if cases
        .iter()
        .any(|c| f(&c["hibernated_idle_cpu_us_per_conn"]).is_some())
    {
        panels.push(pair(
            "atunnel CPU per connection while going idle",
            "CPU us per connection",
            "idle_cpu_us_per_conn",
            "hibernated_idle_cpu_us_per_conn",
            ["hibernation off", "hibernation on"],
        ));
    }
    render("ingress-idle: hibernation, before and after", &panels).map(Some)
}

/// Tunnel CPU per request and requests per tunnel core against offered
/// rate, one series per contender (bars when each has one rate). `None`
/// when no contender has a rung that moved.
pub(super) fn cpu_per_request(
    scenario: &str,
    contenders: &[(String, &ScenarioResult)],
) -> Result<Option<String>, PlotError> {
    let per = |s: &ScenarioResult, y: fn(&RungResult) -> Option<f64>| {
        s.rungs
            .iter()
            .filter(|r| r.achieved > 0.0 && r.tunnel_cpu_cores > 0.0)
            .filter_map(|r| y(r).map(|y| (r.offered, y)))
            .collect::<Vec<_>>()
    };
    let series = |y: fn(&RungResult) -> Option<f64>| -> Vec<Series> {
        contenders
            .iter()
            .map(|(label, s)| Series::new(label.clone(), per(s, y)))
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let cpu = series(|r| Some(r.tunnel_cpu_cores / r.achieved * 1e6));
    if cpu.is_empty() {
        return Ok(None);
    }
    let rps = series(|r| Some(r.achieved / r.tunnel_cpu_cores));
    let x = "offered rate (requests per second)";
    let panels = [
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
    render(&format!("{scenario}: CPU per request"), &panels).map(Some)
}

/// egress-tcp: MB/s and MB/s per tunnel core of each bulk run, a bar per
/// contender. `None` when no contender has runs.
pub(super) fn tcp_throughput(
    contenders: &[(String, &ScenarioResult)],
) -> Result<Option<String>, PlotError> {
    let runs = |s: &ScenarioResult, key: &str| -> Vec<Option<f64>> {
        s.summary[key]
            .as_array()
            .map(|a| a.iter().map(f).collect())
            .unwrap_or_default()
    };
    let n = contenders
        .iter()
        .map(|(_, s)| runs(s, "mb_per_s").len())
        .max()
        .unwrap_or(0);
    if n == 0 {
        return Ok(None);
    }
    let categories: Vec<String> = (1..=n).map(|i| format!("run {i}")).collect();
    let mut mbps = Vec::new();
    let mut per_core = Vec::new();
    for (label, s) in contenders {
        let (m, c) = (runs(s, "mb_per_s"), runs(s, "tunnel_cores"));
        per_core.push(BarSeries::new(
            label.clone(),
            (0..n)
                .map(
                    |i| match (m.get(i).copied().flatten(), c.get(i).copied().flatten()) {
                        (Some(m), Some(c)) if c > 0.0 => Some(m / c),
                        _ => None,
                    },
                )
                .collect(),
        ));
        mbps.push(BarSeries::new(
            label.clone(),
            (0..n).map(|i| m.get(i).copied().flatten()).collect(),
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
    render(
        "egress-tcp: throughput of one connection",
        &[
            panel("throughput", "MB/s", mbps),
            panel(
                "throughput per tunnel core",
                "MB/s per tunnel core",
                per_core,
            ),
        ],
    )
    .map(Some)
}

/// socket-memory: kernel, heap and total KiB per stalled connection per
/// case, with the bound. `None` without cases.
pub(super) fn stall_memory(s: &ScenarioResult) -> Result<Option<String>, PlotError> {
    let cases = cases(s);
    if cases.is_empty() {
        return Ok(None);
    }
    let categories = cases
        .iter()
        .map(|c| {
            format!(
                "{}\n({})",
                c["case"].as_str().unwrap_or("?"),
                c["measured"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let column = |key: &str| cases.iter().map(|c| f(&c[key])).collect::<Vec<_>>();
    let mut panel = Panel::bars(
        Axes::new(
            "memory one stalled connection holds, over the idle baseline",
            "case (proxy measured)",
            "KiB per stalled connection",
        ),
        Bars {
            categories,
            series: vec![
                BarSeries::new("kernel (socket buffers)", column("kernel_kib")),
                BarSeries::new("heap", column("heap_kib")),
                BarSeries::new("total", column("total_kib")),
            ],
        },
    );
    if let Some(bound) = f(&s.summary["bound_kib"]) {
        panel.limits.push(Limit {
            label: format!("bound {} KiB", tick(bound)),
            y: bound,
        });
    }
    render("socket-memory: stall memory per case", &[panel]).map(Some)
}

/// The bounds noisy-neighbour holds the victim to.
#[derive(Clone, Copy, Debug)]
pub struct VictimBounds {
    /// Largest p99 under the pattern / baseline that passes.
    pub p99_ratio_max: f64,
    /// Smallest throughput under the pattern / baseline that passes.
    pub tcp_ratio_min: f64,
}

/// noisy-neighbour, one group per hostile pattern: the victim's
/// egress-http p50 and p99, ingress-https p99 and egress-tcp MB/s at
/// baseline and under the pattern; their ratios with the bounds; atunnel's
/// memory against the soft threshold; and the seconds to recover ("n/a":
/// never).
pub fn noisy_neighbour(patterns: &[Pattern], bounds: VictimBounds) -> Result<String, PlotError> {
    let categories: Vec<String> = patterns.iter().map(|p| p.pattern.clone()).collect();
    let column = |value: &dyn Fn(&Pattern) -> Option<f64>, scale: f64| {
        patterns
            .iter()
            .map(|p| value(p).map(|v| v * scale))
            .collect::<Vec<_>>()
    };
    let bars = |series: Vec<BarSeries>| Bars {
        categories: categories.clone(),
        series,
    };
    let axes = |title: &str, y: &str| Axes::new(title, "hostile pattern", y);
    let ms = 1e-3;
    let mib = 1.0 / 1048576.0;
    let soft = patterns
        .iter()
        .map(|p| p.soft_threshold_bytes)
        .fold(0.0f64, f64::max)
        * mib;
    let victim = |f: fn(&Victim) -> f64| move |p: &Pattern| Some(f(&p.victim));
    let panels = vec![
        Panel::bars(
            axes(
                "victim egress-http latency: baseline and under the pattern",
                "ms",
            ),
            bars(vec![
                BarSeries::new(
                    "p50 baseline",
                    column(&victim(|v| v.baseline_http_p50_us), ms),
                ),
                BarSeries::new("p50 under", column(&victim(|v| v.victim_http_p50_us), ms)),
                BarSeries::new(
                    "p99 baseline",
                    column(&victim(|v| v.baseline_http_p99_us), ms),
                ),
                BarSeries::new("p99 under", column(&victim(|v| v.victim_http_p99_us), ms)),
            ]),
        ),
        Panel::bars(
            axes(
                "victim ingress-https p99: baseline and under the pattern",
                "ms",
            ),
            bars(vec![
                BarSeries::new(
                    "p99 baseline",
                    column(&victim(|v| v.baseline_https_p99_us), ms),
                ),
                BarSeries::new("p99 under", column(&victim(|v| v.victim_https_p99_us), ms)),
            ]),
        ),
        Panel::bars(
            axes("victim egress-tcp: baseline and under the pattern", "MB/s"),
            bars(vec![
                BarSeries::new("baseline", column(&victim(|v| v.baseline_tcp_mb_s), 1.0)),
                BarSeries::new("under", column(&victim(|v| v.victim_tcp_mb_s), 1.0)),
            ]),
        ),
        Panel::bars(
            axes("victim under the pattern / its baseline", "ratio"),
            bars(vec![
                BarSeries::new("egress-http p99", column(&|p| p.victim_p99_ratio, 1.0)),
                BarSeries::new(
                    "ingress-https p99",
                    column(&|p| p.victim_https_p99_ratio, 1.0),
                ),
                BarSeries::new("egress-tcp MB/s", column(&|p| p.victim_tcp_ratio, 1.0)),
            ]),
        )
        .with_limits(vec![
            Limit {
                label: format!("p99 bound {}", tick(bounds.p99_ratio_max)),
                y: bounds.p99_ratio_max,
            },
            Limit {
                label: format!("tcp bound {}", tick(bounds.tcp_ratio_min)),
                y: bounds.tcp_ratio_min,
            },
        ]),
        Panel::bars(
            axes(
                "atunnel's cgroup memory: at baseline and the pattern's peak",
                "MiB",
            ),
            bars(vec![
                BarSeries::new(
                    "baseline",
                    column(&|p| Some(p.baseline_memory_bytes as f64), mib),
                ),
                BarSeries::new("peak", column(&|p| Some(p.peak_memory_bytes as f64), mib)),
            ]),
        )
        .with_limits(
            (soft > 0.0)
                .then(|| Limit {
                    label: format!("soft threshold {} MiB", tick(soft)),
                    y: soft,
                })
                .into_iter()
                .collect(),
        ),
        Panel::bars(
            axes(
                "from the hostile actor stopping to atunnel back at baseline (n/a: never)",
                "seconds",
            ),
            bars(vec![BarSeries::new(
                "recovered",
                column(&|p| p.recovered_s, 1.0),
            )]),
        ),
    ];
    render(
        "noisy-neighbour: the victim beside each hostile pattern",
        &panels,
    )
}

/// Every plot of the run ([`of_results`]: the ladder of each
/// scenario with rungs, memory per idle connection, hibernation, CPU per
/// request, bulk throughput, stall memory), written into `dir` beside
/// report.md; returns their paths. A file is `<scenario>.svg` (the ladder)
/// or `<scenario>.<figure>.svg`.
pub fn write_plots(dir: &Path, r: &Results) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    for plot in of_results(r).map_err(io::Error::other)? {
        let path = dir.join(&plot.file);
        write_whole(&path, plot.svg)?;
        paths.push(path);
    }
    Ok(paths)
}
