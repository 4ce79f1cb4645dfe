//! noisy-neighbour's summary: per hostile pattern, the victim's figures at
//! baseline and under the pattern, their ratios with 95 % intervals and a
//! verdict, what atunnel held and refused, and how long it took to recover;
//! and its figure (drawn beside its table in report.md).

use std::collections::BTreeMap;

use atunnel_process::overload::OverloadState;
use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};
use crate::load::confidence::{Conclusion, Counts, FigureSummary};
use crate::load::plots::chart::{Axes, BarSeries, Bars, Chart, Limit, Panel, tick};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub patterns: Vec<Pattern>,
    /// The worst of the patterns' verdicts.
    pub verdict: Conclusion,
    pub verdicts: Counts,
    pub pass: bool,
    /// Pairs of windows per pattern.
    pub pairs: usize,
    /// "actor-0".
    pub victim: String,
    /// "actor-1".
    pub hostile: String,
    /// atunnel's flags for the scenario, beside the run's.
    pub tunnel_flags: Vec<String>,
    /// The victim's request rate, egress HTTP and ingress HTTPS alike.
    pub rate_per_s: f64,
    pub window_s: f64,
    pub tcp_bytes: u64,
    pub baseline_spread: Spread,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::NoisyNeighbour;
}

/// How far the baselines moved over the run: per figure, the largest over
/// the smallest of every baseline window (`None`: no window measured it).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Spread {
    pub http_p99: Option<f64>,
    pub https_p99: Option<f64>,
    pub tcp_mb_s: Option<f64>,
}

/// One hostile pattern's row. In JSON one flat object: the victim's
/// figures and the context beside the verdict's fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Pattern {
    /// "unread-downloads", "dns-flood", ...
    pub pattern: String,
    /// `None` in rows written before the intervals (only `pass`).
    pub verdict: Option<Conclusion>,
    pub pass: bool,
    /// The checks that failed, and the figures that were inconclusive.
    pub failed: Vec<String>,
    pub inconclusive: Vec<String>,
    pub pairs: usize,
    /// `None` in rows written before the intervals.
    pub confidence: Option<Confidence>,
    /// The ratios' point estimates (under / baseline).
    pub victim_p99_ratio: Option<f64>,
    pub victim_https_p99_ratio: Option<f64>,
    pub victim_tcp_ratio: Option<f64>,
    pub windows: Vec<WindowPair>,
    /// Between a block's two pairs: how long until what the hostile actors
    /// held was gone.
    pub between_pairs: Vec<Between>,
    pub oom_kills: u64,
    pub tunnel_died: bool,
    /// atunnel's cgroup memory: the highest seen while the pattern ran,
    /// and at the first baseline.
    pub peak_memory_bytes: u64,
    pub baseline_memory_bytes: u64,
    /// Where the overload guard refuses new work.
    pub soft_threshold_bytes: f64,
    /// From the hostile actors stopping to atunnel back at baseline;
    /// `None`: never (within the limit).
    pub recovered_s: Option<f64>,
    /// What was still above the baseline when recovery was given up.
    pub not_recovered: Vec<String>,
    pub victim_refused: VictimRefused,
    pub overload: Overload,
    #[serde(flatten)]
    pub victim: Victim,
    #[serde(flatten)]
    pub context: Context,
}

/// The ratio of each victim figure over the pairs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Confidence {
    pub http_p99: Option<FigureSummary>,
    pub https_p99: Option<FigureSummary>,
    pub tcp_mb_s: Option<FigureSummary>,
}

/// A pair of the victim's windows: a baseline, then one under the pattern.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct WindowPair {
    pub baseline: Window,
    pub under: Window,
}

/// The victim's figures of one window, as a pair compares them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Window {
    pub http_p99_us: u64,
    pub http_p50_us: u64,
    pub https_p99_us: u64,
    /// The median of the window's uploads.
    pub tcp_mb_s: f64,
    pub errors: u64,
    pub machine_saturated: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Between {
    /// `None`: not within the limit.
    pub cleared_s: Option<f64>,
    pub still_held: Vec<String>,
}

/// What the victim was refused while the pattern ran.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct VictimRefused {
    pub new_tunnels_tried: usize,
    pub new_tunnels_refused: u64,
    pub new_tunnels_first_error: Option<String>,
    pub request_errors: u64,
    /// From atunnel's /stats, the victim's actor.
    pub egress_refused_overload: f64,
    pub egress_refused_tunnels: f64,
}

/// The overload guard while the pattern ran.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Overload {
    /// The worst state it was seen in (`None` in rows without it).
    pub worst_state: Option<OverloadState>,
    /// State changes between the readings before and after.
    pub transitions: f64,
    pub peak_open_fds: f64,
    pub descriptor_limit: u64,
}

/// The victim's figures: the median window of each side (in µs and MB/s),
/// and what went wrong for it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Victim {
    pub victim_http_p99_us: f64,
    pub baseline_http_p99_us: f64,
    pub victim_http_p50_us: f64,
    pub baseline_http_p50_us: f64,
    pub victim_https_p99_us: f64,
    pub baseline_https_p99_us: f64,
    pub victim_tcp_mb_s: f64,
    pub baseline_tcp_mb_s: f64,
    /// Every upload of every window.
    pub victim_tcp_runs_mb_s: Vec<f64>,
    pub baseline_tcp_runs_mb_s: Vec<f64>,
    pub victim_errors: u64,
    pub baseline_errors: u64,
    pub victim_first_error: Option<String>,
    pub victim_dispatch_lag_p99_us: Option<u64>,
    pub victim_shed: u64,
    /// Egress HTTP and ingress HTTPS of the last window under the pattern.
    pub victim_achieved_per_s: [f64; 2],
}

/// Who was busy (mean cores of each side's windows), what the hostile
/// actors held, and what atunnel refused and held.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Context {
    pub tunnel_cores: f64,
    pub baseline_tunnel_cores: f64,
    pub tunnel_throttled: bool,
    pub generator_cores: f64,
    pub baseline_generator_cores: f64,
    pub sink_cores: f64,
    pub baseline_sink_cores: f64,
    pub actors_cores: f64,
    pub baseline_actors_cores: f64,
    /// Busy CPU of the machine's other work.
    pub others_cores: f64,
    pub baseline_others_cores: f64,
    /// 90 % of the machine's cores busy in a window under the pattern.
    pub machine_saturated: bool,
    pub baseline_machine_saturated: bool,
    /// How long the pattern took to be established (the longest of its
    /// starts), and whether every start reached it.
    pub established_s: f64,
    pub established: bool,
    pub hostile: Hostile,
    pub refused: Refused,
    pub during: During,
    pub baseline_resources: Resources,
    pub recovered_resources: Resources,
    pub tunnel_sockets_before: Sockets,
    pub tunnel_sockets_after: Sockets,
}

/// What the hostile actors did and held.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Hostile {
    /// The most held at once.
    pub held: u64,
    pub opened: u64,
    /// Held connections that ended and were opened again.
    pub reopened: u64,
    pub failed: u64,
    /// Flood attempts, or DNS queries sent.
    pub sent: u64,
    /// In atunnel's /stats while the pattern ran.
    pub tunnels_in_atunnel: f64,
    pub buffers_in_atunnel: f64,
    pub ingress_in_flight_in_atunnel: f64,
    pub actors: Vec<String>,
    /// What the pattern tries to hold (`None`: it holds nothing).
    pub target: Option<usize>,
    pub egress_each: usize,
    /// The generator's descriptor limit cut what they tried to hold.
    pub fd_limited: bool,
}

/// What the pattern made atunnel refuse or end, between the readings
/// before and after: the hostile actors' refusals and the process's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Refused {
    pub refused_tunnels: f64,
    pub refused_opening: f64,
    pub refused_overload: f64,
    pub shed: f64,
    pub buffer_waits: f64,
    pub refusal_pauses: f64,
    pub stalled_write_ends: f64,
    pub half_closed_ends: f64,
    pub overload_refused: f64,
    pub overload_shed: f64,
    pub ingress_refused_in_flight: f64,
    pub ingress_refused_overload: f64,
}

/// atunnel's /stats right after the windows under the pattern.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct During {
    pub heap_bytes: usize,
    pub open_fds: usize,
    pub tasks: usize,
    pub pool_in_use: usize,
    pub overload_state: Option<OverloadState>,
    pub gateway_connections: f64,
}

/// What atunnel holds, as recovery compares it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Resources {
    pub heap_bytes: f64,
    pub cgroup_bytes: f64,
    pub open_fds: f64,
    pub tasks: f64,
    pub pool_in_use: f64,
    pub gateway_connections: f64,
    /// atunnel's sockets in the other actors' sandboxes (left out of the
    /// descriptors and tasks recovery compares).
    pub neighbour_sockets: f64,
}

/// atunnel's socket descriptors by where the kernel lists them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Sockets {
    pub sockets: usize,
    pub worker_namespace: usize,
    /// Per actor ("actor-0"), in its sandbox's namespace.
    pub sandboxes: BTreeMap<String, usize>,
    /// Closed or reset, its descriptor still held.
    pub unlisted: usize,
}

/// The bounds the victim is held to.
#[derive(Clone, Copy, Debug)]
pub struct VictimBounds {
    /// Largest p99 under the pattern / baseline that passes.
    pub p99_ratio_max: f64,
    /// Smallest throughput under the pattern / baseline that passes.
    pub tcp_ratio_min: f64,
}

/// One group per hostile pattern: the victim's egress-http p50 and p99,
/// ingress-https p99 and egress-tcp MB/s at baseline and under the
/// pattern; their ratios with the bounds; atunnel's memory against the
/// soft threshold; and the seconds to recover ("n/a": never).
pub fn chart(patterns: &[Pattern], bounds: VictimBounds) -> Chart {
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
    Chart::new(
        "noisy-neighbour: the victim beside each hostile pattern",
        panels,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::plots::tests::{assert_written, check, rects, text};

    #[test]
    fn noisy_neighbour_draws_the_victim_beside_its_baseline_per_pattern() {
        let row = |pattern: &str, recovered: Option<f64>| Pattern {
            pattern: pattern.into(),
            victim: Victim {
                baseline_http_p50_us: 400.0,
                victim_http_p50_us: 450.0,
                baseline_http_p99_us: 900.0,
                victim_http_p99_us: 1800.0,
                baseline_https_p99_us: 1500.0,
                victim_https_p99_us: 1400.0,
                baseline_tcp_mb_s: 600.0,
                victim_tcp_mb_s: 570.0,
                ..Victim::default()
            },
            victim_p99_ratio: Some(2.0),
            victim_https_p99_ratio: Some(0.93),
            victim_tcp_ratio: Some(0.95),
            baseline_memory_bytes: 60 << 20,
            peak_memory_bytes: 120 << 20,
            soft_threshold_bytes: (870u64 << 20) as f64,
            recovered_s: recovered,
            ..Pattern::default()
        };
        let rows = [row("unread-downloads", Some(0.4)), row("dns-flood", None)];
        let bounds = VictimBounds {
            p99_ratio_max: 1.1,
            tcp_ratio_min: 0.9,
        };
        let svg = chart(&rows, bounds).render().expect("drawn");
        check(&svg);
        // Series 0 is in all six panels (http p50 baseline, https p99
        // baseline, tcp baseline, the http ratio, baseline memory, the
        // recovery, which only the first pattern has); series 3 (http p99
        // under) only in the first.
        assert_eq!(rects(&svg, 0), 2 * 5 + 1 + 6, "{svg}");
        assert_eq!(rects(&svg, 3), 2 + 1, "{svg}");
        assert_eq!(text(&svg, "n/a"), 1, "never recovered: {svg}");
        assert_written(
            &svg,
            &[
                "0.45",
                "1.8",
                "p99 bound 1.1",
                "tcp bound 0.9",
                "soft threshold 870 MiB",
                "dns-flood",
            ],
        );
    }
}
