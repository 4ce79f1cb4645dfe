//! Tests of the shapes and of the figures, and the fixtures and SVG
//! readers they share.

mod chart;
mod figures;

use super::*;
use crate::load::results::{Comparison, Latency, RungResult, ScenarioResult, Variant};
use crate::load::verdict::Verdict;
use crate::scenario::{PerFamily, egress_idle, egress_tcp, ingress_idle, socket_memory};

pub(crate) fn rung(offered: f64, cores: f64, verdict: Verdict) -> RungResult {
    RungResult {
        offered,
        achieved: offered,
        errors: 0,
        verdict,
        tunnel_cpu_cores: cores,
        tunnel_heap_bytes: 10 << 20,
        tunnel_cgroup_bytes: 30 << 20,
        latency_us: Latency {
            p50: 700,
            p99: 2_000,
            max: 9_000,
        },
        shed: 0,
        dispatch_lag_p99_us: 0,
        notes: String::new(),
    }
}

/// `scenario`'s result with rungs and no summary.
pub(crate) fn rungs_only(scenario: Scenario, rungs: Vec<RungResult>) -> ScenarioResult {
    let mut s = ScenarioResult::without_summary(scenario, Vec::new());
    s.rungs = rungs;
    s
}

pub(crate) fn idle(heap: f64, cgroup: f64) -> ScenarioResult {
    let summary = egress_idle::Summary {
        conns: 1000,
        heap_bytes_per_conn: heap,
        cgroup_bytes_per_conn: cgroup,
        ..Default::default()
    };
    ScenarioResult::new(&summary, vec![rung(200.0, 0.05, Verdict::Ok)], Vec::new())
}

pub(crate) fn tcp(mbps: [f64; 3], cores: [f64; 3]) -> ScenarioResult {
    let runs = egress_tcp::Runs {
        mb_per_s: mbps.to_vec(),
        tunnel_cores: cores.to_vec(),
        ..Default::default()
    };
    let summary = egress_tcp::Summary {
        runs: PerFamily {
            ipv4: runs,
            ipv6: None,
        },
        ..Default::default()
    };
    ScenarioResult::new(&summary, Vec::new(), Vec::new())
}

pub(crate) fn ingress_idle_summary() -> ingress_idle::Summary {
    let case = |name: &str, heap: f64, hib: f64| ingress_idle::Case {
        case: name.into(),
        heap_bytes_per_conn: Some(heap),
        hibernated_heap_bytes_per_conn: Some(hib),
        cgroup_bytes_per_conn: heap * 2.0,
        hibernated_cgroup_bytes_per_conn: Some(hib * 2.0),
        idle_cpu_us_per_conn: 1.0,
        hibernated_idle_cpu_us_per_conn: Some(9.0),
        ..Default::default()
    };
    ingress_idle::Summary {
        conns: 150,
        cases: vec![
            case("http1-keepalive-short", 8600.0, 2100.0),
            case("http2-one-request", 21100.0, 3300.0),
        ],
        ..Default::default()
    }
}

pub(crate) fn ingress_idle_result(summary: &ingress_idle::Summary) -> ScenarioResult {
    let rungs = vec![
        rung(1000.0, 0.2, Verdict::Ok),
        rung(1000.0, 0.21, Verdict::Ok),
    ];
    ScenarioResult::new(summary, rungs, Vec::new())
}

pub(crate) fn sample() -> Results {
    Results {
        scenarios: vec![
            idle(1500.0, 5600.0),
            rungs_only(
                Scenario::IngressHttps,
                vec![
                    rung(1000.0, 0.1, Verdict::Ok),
                    rung(2000.0, 0.2, Verdict::Ok),
                    rung(4000.0, 0.5, Verdict::TunnelCpu),
                ],
            ),
            tcp([900.0, 950.0, 870.0], [0.9, 0.95, 0.9]),
            ingress_idle_result(&ingress_idle_summary()),
            ScenarioResult::new(&stall_memory(), Vec::new(), Vec::new()),
        ],
        comparisons: vec![Comparison {
            name: "copy-mode".into(),
            variants: [
                ("lean", 1500.0, 5600.0, 950.0),
                ("naive", 69561.0, 140000.0, 700.0),
            ]
            .into_iter()
            .map(|(label, heap, cgroup, mbps)| Variant {
                label: label.into(),
                flags: vec![format!("--copy-mode={label}")],
                scenarios: vec![idle(heap, cgroup), tcp([mbps; 3], [1.0; 3])],
            })
            .collect(),
        }],
        cost: None,
    }
}

pub(crate) fn stall_memory() -> socket_memory::Summary {
    let case = |case: &str, measured: &str, kernel: Option<f64>, heap: f64| socket_memory::Case {
        case: case.into(),
        measured: measured.into(),
        kernel_kib: kernel,
        heap_kib: Some(heap),
        total_kib: kernel.map(|k| k + heap),
        ..Default::default()
    };
    socket_memory::Summary {
        bound_kib: Some(64.0),
        cases: vec![
            case("actor-stops-reading", "atunnel", Some(20.0), 1.5),
            case("destination-stops-reading", "gateway", Some(300.0), 0.0),
            case("router-stops-reading", "atunnel", None, 2.0),
        ],
        ..Default::default()
    }
}

/// Well-formed enough for a browser: one `<svg>` document, every
/// `<text>` closed, no number plotters could not format.
pub(crate) fn check(svg: &str) {
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    assert_eq!(svg.matches("<svg").count(), 1, "{svg}");
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
}

pub(crate) fn hex(i: usize) -> String {
    let c = color(i);
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// plotters writes one element a line: the `<rect>`s filled with series
/// `i`'s colour (its bars, and its legend swatch in each panel).
pub(crate) fn rects(svg: &str, i: usize) -> usize {
    let fill = format!(r#"fill="{}""#, hex(i));
    svg.lines()
        .filter(|l| l.starts_with("<rect") && l.contains(&fill))
        .count()
}

/// Series `i`'s lines (the axes and ticks are 1 px black polylines).
pub(crate) fn lines(svg: &str, i: usize) -> usize {
    let stroke = format!(r#"stroke="{}" stroke-width="2""#, hex(i));
    svg.lines()
        .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
        .count()
}

pub(crate) fn markers(svg: &str, i: usize) -> usize {
    let fill = format!(r#"fill="{}""#, hex(i));
    svg.lines()
        .filter(|l| l.starts_with("<circle") && l.contains(&fill))
        .count()
}

/// A `<text>` whose whole content is `t`.
pub(crate) fn text(svg: &str, t: &str) -> usize {
    svg.matches(&format!(">\n{t}\n</text>")).count()
}

/// Asserts that each of `texts` is written in `svg` at least once.
pub(crate) fn assert_written(svg: &str, texts: &[&str]) {
    for t in texts {
        assert!(text(svg, t) >= 1, "{t}: {svg}");
    }
}

/// Asserts that each of `texts` is written in `svg` exactly `times` times.
pub(crate) fn assert_written_times(svg: &str, texts: &[&str], times: usize) {
    for t in texts {
        assert_eq!(text(svg, t), times, "{t}: {svg}");
    }
}

/// A bar's rect: (series, x, y, width, height) in pixels.
pub(crate) type Drawn = (usize, f64, f64, f64, f64);

/// The series-coloured `<rect>`s wider than a legend swatch.
pub(crate) fn bars_drawn(svg: &str, series: usize) -> Vec<Drawn> {
    let attr = |l: &str, a: &str| -> f64 {
        let start = l.find(&format!(" {a}=\"")).expect("attribute") + a.len() + 3;
        l[start..]
            .split('"')
            .next()
            .expect("value")
            .parse()
            .expect("a number")
    };
    svg.lines()
        .filter(|l| l.starts_with("<rect"))
        .filter_map(|l| {
            let i = (0..series).find(|&i| l.contains(&format!(r#"fill="{}""#, hex(i))))?;
            let r = (
                i,
                attr(l, "x"),
                attr(l, "y"),
                attr(l, "width"),
                attr(l, "height"),
            );
            (r.3 > 20.0).then_some(r)
        })
        .collect()
}

pub(crate) fn plot(r: &Results, file: &str) -> String {
    let plots = of_results(r).expect("drawn");
    let names: Vec<&str> = plots.iter().map(|p| p.file.as_str()).collect();
    let p = plots
        .iter()
        .find(|p| p.file == file)
        .unwrap_or_else(|| panic!("{file} not in {names:?}"));
    check(&p.svg);
    p.svg.clone()
}
