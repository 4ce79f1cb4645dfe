//! The results schema and the report files made from it.
//!
//! - `results.json` — what other tools read; the field names below are a
//!   contract (`scenarios[].name/rungs/summary`, each rung's `offered`,
//!   `achieved`, `errors`, `verdict`, `tunnel_cpu_cores`,
//!   `tunnel_heap_bytes`, `tunnel_cgroup_bytes`, `latency_us.{p50,p99,max}`).
//!   Extra fields (`shed`, `dispatch_lag_p99_us`, `notes`) may be added but
//!   the required ones are never renamed.
//! - `results.txt` — one aligned table per scenario plus its summary: what a
//!   person reads first.
//! - `<scenario>.svg` — tunnel CPU, tunnel cgroup memory and p99 latency
//!   against offered rate. Written by hand as SVG text: three polylines with
//!   axes and a few tick labels need no plotting crate (and its dependency
//!   tree and font handling) — a page of string formatting does it.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schedule::RungOutcome;
use super::verdict::{Verdict, sustainable_rate};
use crate::scenario::Scenario;

const MIB: f64 = 1024.0 * 1024.0;

/// Everything one run measured.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Results {
    pub scenarios: Vec<ScenarioResult>,
    /// Ablations: the same egress scenarios under each variant of one
    /// setting, run against fresh atunnels in the same run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comparisons: Vec<Comparison>,
}

/// One setting swept in one run (e.g. `copy-mode`: lean vs naive).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Comparison {
    pub name: String,
    pub variants: Vec<Variant>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Variant {
    pub label: String,
    /// atunnel's flags for this variant.
    pub flags: Vec<String>,
    pub scenarios: Vec<ScenarioResult>,
}

impl Variant {
    fn summary(&self, scenario: Scenario, key: &str) -> Option<&Value> {
        self.scenarios
            .iter()
            .find(|s| s.name == scenario.name())
            .and_then(|s| s.summary.get(key))
    }
}

/// The side-by-side table of a comparison (text; report.md embeds it too).
pub fn comparison_table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>12} {:>14} {:>10} {:>16} {:>22}",
        "variant", "idle heap B", "idle cgroup B", "tasks", "http cores@8000", "tcp MB/s (3 runs)"
    );
    for v in &c.variants {
        let num = |s: Scenario, k: &str| {
            v.summary(s, k)
                .and_then(Value::as_f64)
                .map_or("-".to_string(), |x| format!("{x}"))
        };
        let tcp = v
            .summary(Scenario::EgressTcp, "mb_per_s")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|x| x.as_f64().map_or("-".into(), |x| format!("{x:.0}")))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<14} {:>12} {:>14} {:>10} {:>16} {:>22}",
            v.label,
            num(Scenario::EgressIdle, "heap_bytes_per_conn"),
            num(Scenario::EgressIdle, "cgroup_bytes_per_conn"),
            num(Scenario::EgressIdle, "tasks_per_conn"),
            num(Scenario::EgressHttp, "cores_at_8000_rps"),
            tcp
        );
    }
    out
}

/// One scenario: its ladder of rungs (possibly none) and a free-form summary
/// object (e.g. egress-idle `{"conns", "heap_bytes_per_conn", ...}`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScenarioResult {
    pub name: String,
    #[serde(default)]
    pub rungs: Vec<RungResult>,
    #[serde(default = "empty_object")]
    pub summary: Value,
    /// Free-text remarks (what was skipped, why a number is missing, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Default for ScenarioResult {
    fn default() -> Self {
        ScenarioResult {
            name: String::new(),
            rungs: Vec::new(),
            summary: empty_object(),
            notes: Vec::new(),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// One rung of a scenario's ladder.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RungResult {
    /// Units per second offered by the schedule.
    pub offered: f64,
    /// Successful units per second.
    pub achieved: f64,
    pub errors: u64,
    pub verdict: Verdict,
    /// The tunnel's average CPU use over the rung, in cores.
    pub tunnel_cpu_cores: f64,
    /// The tunnel's heap at the end of the rung.
    pub tunnel_heap_bytes: u64,
    /// The tunnel cgroup's memory at the end of the rung.
    pub tunnel_cgroup_bytes: u64,
    pub latency_us: Latency,
    #[serde(default)]
    pub shed: u64,
    #[serde(default)]
    pub dispatch_lag_p99_us: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
}

impl RungResult {
    /// A rung's result from what the scheduler counted and its verdict: the
    /// first error as its notes, the tunnel's CPU and memory zero (unknown)
    /// until the caller adds what it measured around the rung.
    pub fn of(out: &RungOutcome, verdict: Verdict) -> Self {
        RungResult {
            offered: out.offered,
            achieved: out.achieved,
            errors: out.errors,
            verdict,
            tunnel_cpu_cores: 0.0,
            tunnel_heap_bytes: 0,
            tunnel_cgroup_bytes: 0,
            latency_us: Latency::from_histogram(&out.latency),
            shed: out.shed,
            dispatch_lag_p99_us: out.dispatch_lag_p99_us(),
            notes: out.first_error.clone().unwrap_or_default(),
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Latency {
    /// p50, p99 and max of a histogram (all 0 when it is empty).
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// Writes `dir/results.json` (pretty-printed), creating `dir` if needed.
pub fn write_results_json(dir: &Path, r: &Results) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut text = serde_json::to_string_pretty(r).map_err(io::Error::other)?;
    text.push('\n');
    write_whole(&dir.join("results.json"), text)
}

/// Replaces `path` with `contents` whole or not at all: written beside it
/// and renamed over it, so a full disk (or a crash) leaves the previous
/// complete file rather than a truncated one. The error names the file.
pub fn write_whole(path: &Path, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let written = fs::write(&partial, contents).and_then(|()| fs::rename(&partial, path));
    written.map_err(|e| {
        let _ = fs::remove_file(&partial);
        io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))
    })
}

/// results.txt: one aligned table per scenario (rate, achieved, errors, verdict, tunnel cores, heap MiB, cgroup MiB, p50/p99/max ms) plus its summary lines — what a person reads first.
pub fn write_results_txt(dir: &Path, r: &Results) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_whole(&dir.join("results.txt"), render_txt(r))
}

/// The text of `results.txt`.
pub fn render_txt(r: &Results) -> String {
    let mut out = String::new();
    for (n, s) in r.scenarios.iter().enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "== {} ==", s.name);
        if !s.rungs.is_empty() {
            out.push_str(&rung_table(&s.rungs));
            for rung in s.rungs.iter().filter(|r| !r.notes.is_empty()) {
                let _ = writeln!(out, "  at {}/s: {}", fmt_rate(rung.offered), rung.notes);
            }
            let ladder: Vec<_> = s
                .rungs
                .iter()
                .map(|r| (r.offered, r.achieved, r.verdict))
                .collect();
            match sustainable_rate(&ladder) {
                Some(rate) => {
                    let _ = writeln!(out, "sustainable: {}/s", fmt_rate(rate));
                }
                None => out.push_str("sustainable: none of the rungs\n"),
            }
        }
        summary_lines(&mut out, &s.summary);
        for note in &s.notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
    for c in &r.comparisons {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "== compare {} (egress, per idle connection) ==",
            c.name
        );
        out.push_str(&comparison_table(c));
    }
    out
}

fn rung_table(rungs: &[RungResult]) -> String {
    const HEAD: [&str; 10] = [
        "rate/s",
        "achieved/s",
        "errors",
        "verdict",
        "tunnel cores",
        "heap MiB",
        "cgroup MiB",
        "p50 ms",
        "p99 ms",
        "max ms",
    ];
    const VERDICT_COL: usize = 3;
    let rows: Vec<[String; 10]> = rungs
        .iter()
        .map(|r| {
            [
                fmt_rate(r.offered),
                fmt_rate(r.achieved),
                r.errors.to_string(),
                r.verdict.to_string(),
                format!("{:.2}", r.tunnel_cpu_cores),
                format!("{:.1}", r.tunnel_heap_bytes as f64 / MIB),
                format!("{:.1}", r.tunnel_cgroup_bytes as f64 / MIB),
                fmt_ms(r.latency_us.p50),
                fmt_ms(r.latency_us.p99),
                fmt_ms(r.latency_us.max),
            ]
        })
        .collect();
    let mut width = HEAD.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (c, (cell, w)) in cells.iter().zip(width).enumerate() {
            if c > 0 {
                l.push_str("  ");
            }
            if c == VERDICT_COL {
                let _ = write!(l, "{cell:<w$}");
            } else {
                let _ = write!(l, "{cell:>w$}");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&HEAD);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

/// The summary object as `key: value` lines (arrays of objects one element
/// a line, as `k=v` pairs).
fn summary_lines(out: &mut String, summary: &Value) {
    match summary {
        Value::Null => {}
        Value::Object(m) if m.is_empty() => {}
        Value::Object(m) => {
            out.push_str("summary:\n");
            for (k, v) in m {
                match v {
                    Value::Array(items) if items.iter().any(Value::is_object) => {
                        let _ = writeln!(out, "  {k}:");
                        for item in items {
                            let _ = writeln!(out, "    - {}", fmt_value(item));
                        }
                    }
                    _ => {
                        let _ = writeln!(out, "  {k}: {}", fmt_value(v));
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "summary: {}", fmt_value(other));
        }
    }
}

fn fmt_value(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (None, Some(i), _) => i.to_string(),
            (None, None, Some(f)) => trim_float(f, 3),
            _ => n.to_string(),
        },
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(fmt_value).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{k}={}", fmt_value(v)))
                .collect();
            parts.join(" ")
        }
    }
}

fn trim_float(f: f64, decimals: usize) -> String {
    if !f.is_finite() {
        return f.to_string();
    }
    let s = format!("{f:.decimals$}");
    if s.contains('.') {
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".to_string()
        } else {
            s.to_string()
        }
    } else {
        s
    }
}

fn fmt_rate(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn fmt_ms(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else if ms < 100.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}

/// One SVG per scenario with rungs: tunnel CPU cores, tunnel cgroup MiB and p99 latency against offered rate (three small line charts stacked, axes labelled, written by hand as SVG text — a few polylines need no plotting crate).
///
/// Files are `dir/<scenario name>.svg` (characters other than letters,
/// digits, `-`, `_` and `.` become `_`); returns their paths.
pub fn write_plots(dir: &Path, r: &Results) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    for s in r.scenarios.iter().filter(|s| !s.rungs.is_empty()) {
        let path = dir.join(format!("{}.svg", file_stem(&s.name)));
        write_whole(&path, render_svg(s))?;
        paths.push(path);
    }
    Ok(paths)
}

fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = stem.trim_start_matches('.');
    if stem.is_empty() {
        "scenario".to_string()
    } else {
        stem.to_string()
    }
}

const SVG_W: f64 = 640.0;
const TITLE_H: f64 = 34.0;
const PANEL_TITLE_H: f64 = 26.0;
const PLOT_H: f64 = 130.0;
const PANEL_BOTTOM: f64 = 44.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const OK_COLOR: &str = "#1f77b4";
const BAD_COLOR: &str = "#d62728";

/// The SVG text of one scenario's charts.
pub fn render_svg(s: &ScenarioResult) -> String {
    type Series = (&'static str, &'static str, fn(&RungResult) -> f64);
    let series: [Series; 3] = [
        ("tunnel CPU", "cores", |r| r.tunnel_cpu_cores),
        ("tunnel cgroup memory", "MiB", |r| {
            r.tunnel_cgroup_bytes as f64 / MIB
        }),
        ("p99 latency", "ms", |r| r.latency_us.p99 as f64 / 1000.0),
    ];
    let mut rungs: Vec<&RungResult> = s.rungs.iter().collect();
    rungs.sort_by(|a, b| a.offered.total_cmp(&b.offered));

    let panel_h = PANEL_TITLE_H + PLOT_H + PANEL_BOTTOM;
    let height = TITLE_H + panel_h * series.len() as f64;
    let x_max_data = rungs.iter().map(|r| finite(r.offered)).fold(0.0, f64::max);
    let (x_max, x_step) = axis(x_max_data);
    let px = |x: f64| LEFT + (finite(x) / x_max) * (SVG_W - LEFT - RIGHT);

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_W}" height="{height}" viewBox="0 0 {SVG_W} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}: tunnel against offered rate</text>"#,
        SVG_W / 2.0,
        esc(&s.name)
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end" fill="{BAD_COLOR}">red points: verdict not ok</text>"#,
        SVG_W - RIGHT,
        TITLE_H - 4.0
    );

    for (p, (title, unit, value)) in series.iter().enumerate() {
        let top = TITLE_H + panel_h * p as f64;
        let y0 = top + PANEL_TITLE_H; // top of the plot area
        let y1 = y0 + PLOT_H; // its bottom (the x axis)
        let values: Vec<f64> = rungs.iter().map(|r| finite(value(r))).collect();
        let (y_max, y_step) = axis(values.iter().copied().fold(0.0, f64::max));
        let py = |y: f64| y1 - (y / y_max) * PLOT_H;

        let _ = writeln!(
            o,
            r#"<text x="{LEFT}" y="{}" font-size="12" font-weight="bold">{} ({})</text>"#,
            top + PANEL_TITLE_H - 8.0,
            esc(title),
            esc(unit)
        );
        // Horizontal grid lines and y tick labels.
        for k in 0..=((y_max / y_step).round() as usize) {
            let v = y_step * k as f64;
            let y = py(v);
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
                SVG_W - RIGHT
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + 4.0,
                tick(v)
            );
        }
        // X ticks.
        for k in 0..=((x_max / x_step).round() as usize) {
            let v = x_step * k as f64;
            let x = px(v);
            let _ = writeln!(
                o,
                r#"<line x1="{x:.1}" y1="{y1:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/>"#,
                y1 + 4.0
            );
            let _ = writeln!(
                o,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y1 + 16.0,
                tick(v)
            );
        }
        // Axes and their labels.
        let _ = writeln!(
            o,
            r#"<line x1="{LEFT}" y1="{y0:.1}" x2="{LEFT}" y2="{y1:.1}" stroke="black"/>"#
        );
        let _ = writeln!(
            o,
            r#"<line x1="{LEFT}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="black"/>"#,
            SVG_W - RIGHT
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">offered rate (per second)</text>"#,
            (LEFT + SVG_W - RIGHT) / 2.0,
            y1 + 32.0
        );
        let (lx, ly) = (16.0, (y0 + y1) / 2.0);
        let _ = writeln!(
            o,
            r#"<text x="{lx}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx} {ly:.1})">{}</text>"#,
            esc(unit)
        );
        // The series.
        let points: Vec<String> = rungs
            .iter()
            .zip(&values)
            .map(|(r, &v)| format!("{:.1},{:.1}", px(r.offered), py(v)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{OK_COLOR}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for (r, &v) in rungs.iter().zip(&values) {
            let color = if r.verdict == Verdict::Ok {
                OK_COLOR
            } else {
                BAD_COLOR
            };
            let _ = writeln!(
                o,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}/s: {} {} ({})</title></circle>"#,
                px(r.offered),
                py(v),
                fmt_rate(r.offered),
                trim_float(v, 3),
                esc(unit),
                r.verdict
            );
        }
    }
    o.push_str("</svg>\n");
    o
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x.max(0.0) } else { 0.0 }
}

/// An axis from 0 covering `max`: its end and its tick step (1, 2 or 5
/// times a power of ten, about four ticks).
fn axis(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 {
        return (1.0, 0.25);
    }
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let step = mag
        * if f <= 1.0 {
            1.0
        } else if f <= 2.0 {
            2.0
        } else if f <= 5.0 {
            5.0
        } else {
            10.0
        };
    ((max / step - 1e-9).ceil().max(1.0) * step, step)
}

fn tick(v: f64) -> String {
    trim_float(v, 3)
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeSet;

    fn rung(offered: f64, verdict: Verdict) -> RungResult {
        RungResult {
            offered,
            achieved: offered * 0.995,
            errors: 0,
            verdict,
            tunnel_cpu_cores: offered / 10_000.0,
            tunnel_heap_bytes: 12 * 1024 * 1024,
            tunnel_cgroup_bytes: 40 * 1024 * 1024,
            latency_us: Latency {
                p50: 800,
                p99: 2_500,
                max: 14_000,
            },
            shed: 0,
            dispatch_lag_p99_us: 150,
            notes: String::new(),
        }
    }

    fn sample() -> Results {
        let mut last = rung(8000.0, Verdict::TunnelCpu);
        last.notes = "throttled 12 times".to_string();
        Results {
            scenarios: vec![
                ScenarioResult {
                    name: "egress-http".to_string(),
                    rungs: vec![
                        rung(1000.0, Verdict::Ok),
                        rung(2000.0, Verdict::Ok),
                        rung(4000.0, Verdict::Generator),
                        last,
                    ],
                    summary: json!({"cores_at_8000_rps": 0.8123456}),
                    notes: vec![],
                },
                ScenarioResult {
                    name: "socket-memory".to_string(),
                    rungs: vec![],
                    summary: json!({"cases": [
                        {"case": "actor-stops-reading", "measured": "atunnel",
                         "kernel_kib": 20, "heap_kib": 2, "total_kib": 22, "pass": true},
                        {"case": "destination-stops-reading", "measured": "gateway",
                         "kernel_kib": 4096, "heap_kib": 8, "total_kib": 4104, "pass": false},
                    ], "bound_kib": 64}),
                    notes: vec!["run as root for SO_RCVLOWAT".to_string()],
                },
            ],
            comparisons: Vec::new(),
        }
    }

    #[test]
    fn a_comparison_prints_one_row_per_variant_side_by_side() {
        let variant = |label: &str, heap: f64, cores: f64| Variant {
            label: label.to_string(),
            flags: vec![format!("--copy-mode={label}")],
            scenarios: vec![
                ScenarioResult {
                    name: "egress-idle".into(),
                    summary: json!({"heap_bytes_per_conn": heap, "cgroup_bytes_per_conn": 5600.0, "tasks_per_conn": 1.0}),
                    ..ScenarioResult::default()
                },
                ScenarioResult {
                    name: "egress-http".into(),
                    summary: json!({"cores_at_8000_rps": cores}),
                    ..ScenarioResult::default()
                },
                ScenarioResult {
                    name: "egress-tcp".into(),
                    summary: json!({"mb_per_s": [500.0, 510.0, 490.0]}),
                    ..ScenarioResult::default()
                },
            ],
        };
        let r = Results {
            scenarios: Vec::new(),
            comparisons: vec![Comparison {
                name: "copy-mode".into(),
                variants: vec![
                    variant("lean", 1500.0, 0.24),
                    variant("naive", 69561.0, 0.3),
                ],
            }],
        };
        let txt = render_txt(&r);
        assert!(txt.contains("== compare copy-mode"), "{txt}");
        let rows: Vec<&str> = txt
            .lines()
            .filter(|l| l.starts_with("lean") || l.starts_with("naive"))
            .collect();
        assert_eq!(rows.len(), 2, "{txt}");
        assert!(
            rows[0].contains("1500")
                && rows[0].contains("0.24")
                && rows[0].contains("500, 510, 490"),
            "{txt}"
        );
        assert!(rows[1].contains("69561"), "{txt}");
        // And it survives results.json.
        let dir = tempfile::tempdir().unwrap();
        write_results_json(dir.path(), &r).unwrap();
        let back: Results =
            serde_json::from_str(&fs::read_to_string(dir.path().join("results.json")).unwrap())
                .unwrap();
        assert_eq!(back, r);
    }

    fn keys(v: &Value) -> BTreeSet<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn latency_from_histogram_reads_p50_p99_max() {
        let mut h = super::super::schedule::new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 100).unwrap();
        }
        let l = Latency::from_histogram(&h);
        assert!((49_900..=50_100).contains(&l.p50), "{l:?}");
        assert!((98_900..=99_100).contains(&l.p99), "{l:?}");
        assert!((99_950..=100_100).contains(&l.max), "{l:?}");
        let empty = super::super::schedule::new_histogram();
        assert_eq!(Latency::from_histogram(&empty), Latency::default());
    }

    #[test]
    fn results_json_round_trips_with_the_required_field_names() {
        let dir = tempfile::tempdir().unwrap();
        let r = sample();
        write_results_json(dir.path(), &r).unwrap();
        let text = fs::read_to_string(dir.path().join("results.json")).unwrap();
        let back: Results = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);

        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(keys(&v), BTreeSet::from(["scenarios"]));
        let scenarios = v["scenarios"].as_array().unwrap();
        assert_eq!(
            keys(&scenarios[0]),
            BTreeSet::from(["name", "rungs", "summary"])
        );
        assert_eq!(
            keys(&scenarios[1]),
            BTreeSet::from(["name", "rungs", "summary", "notes"])
        );
        let required = [
            "offered",
            "achieved",
            "errors",
            "verdict",
            "tunnel_cpu_cores",
            "tunnel_heap_bytes",
            "tunnel_cgroup_bytes",
            "latency_us",
        ];
        let extra = ["shed", "dispatch_lag_p99_us"];
        let plain = &scenarios[0]["rungs"][0];
        let want: BTreeSet<&str> = required.iter().chain(&extra).copied().collect();
        assert_eq!(keys(plain), want);
        let noted = &scenarios[0]["rungs"][3];
        let want_noted: BTreeSet<&str> = want.iter().copied().chain(["notes"]).collect();
        assert_eq!(keys(noted), want_noted);
        assert_eq!(
            keys(&plain["latency_us"]),
            BTreeSet::from(["p50", "p99", "max"])
        );
        assert_eq!(plain["verdict"], "ok");
        assert_eq!(noted["verdict"], "tunnel-cpu");
        assert_eq!(plain["latency_us"]["p99"], 2500);
        assert_eq!(scenarios[1]["summary"]["cases"][1]["total_kib"], 4104);
    }

    #[test]
    fn results_json_reads_files_without_the_optional_fields() {
        let text = r#"{"scenarios":[{"name":"egress-tcp","rungs":[{"offered":1.0,"achieved":1.0,
            "errors":0,"verdict":"far-end","tunnel_cpu_cores":0.1,"tunnel_heap_bytes":1,
            "tunnel_cgroup_bytes":2,"latency_us":{"p50":1,"p99":2,"max":3}}],
            "summary":{"mb_per_s":[1,2,3]}}]}"#;
        let r: Results = serde_json::from_str(text).unwrap();
        let rung = &r.scenarios[0].rungs[0];
        assert_eq!(rung.verdict, Verdict::FarEnd);
        assert_eq!((rung.shed, rung.dispatch_lag_p99_us), (0, 0));
        assert!(rung.notes.is_empty() && r.scenarios[0].notes.is_empty());
    }

    #[test]
    fn results_txt_has_each_scenario_and_verdict() {
        let dir = tempfile::tempdir().unwrap();
        write_results_txt(dir.path(), &sample()).unwrap();
        let text = fs::read_to_string(dir.path().join("results.txt")).unwrap();
        for want in [
            "== egress-http ==",
            "== socket-memory ==",
            "ok",
            "generator",
            "tunnel-cpu",
            "sustainable: 2000/s",
            "cores_at_8000_rps: 0.812",
            "case=actor-stops-reading heap_kib=2 kernel_kib=20 measured=atunnel pass=true total_kib=22",
            "note: run as root for SO_RCVLOWAT",
            "at 8000/s: throttled 12 times",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        // The table is aligned: every row of a scenario's table is as wide
        // as its header up to the last column.
        let table: Vec<&str> = text
            .lines()
            .skip(1)
            .take_while(|l| !l.starts_with("  at") && !l.starts_with("sustainable"))
            .collect();
        assert_eq!(table.len(), 5, "{table:?}");
        let width = table[0].len();
        assert!(table.iter().all(|l| l.len() == width), "{table:#?}");
        assert!(table[0].starts_with("rate/s") || table[0].trim_start().starts_with("rate/s"));
        assert!(table[1].trim_start().starts_with("1000"));
        assert!(table[1].contains("12.0") && table[1].contains("40.0"));
        assert!(
            table[1].contains("0.80") && table[1].contains("2.50") && table[1].contains("14.0")
        );
    }

    #[test]
    fn svg_has_one_polyline_per_series() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_plots(dir.path(), &sample()).unwrap();
        assert_eq!(
            paths,
            vec![dir.path().join("egress-http.svg")],
            "only scenarios with rungs"
        );
        let svg = fs::read_to_string(&paths[0]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("<circle").count(), 3 * 4);
        assert_eq!(svg.matches("</circle>").count(), 3 * 4);
        for label in [
            "tunnel CPU (cores)",
            "tunnel cgroup memory (MiB)",
            "p99 latency (ms)",
        ] {
            assert!(svg.contains(label), "{label}");
        }
        assert_eq!(svg.matches("offered rate (per second)").count(), 3);
        // Every element opened is closed or self-closing.
        let opened = svg.matches("<text").count();
        assert_eq!(opened, svg.matches("</text>").count());
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn svg_escapes_names_and_survives_zero_and_odd_values() {
        let mut r = rung(0.0, Verdict::Errors);
        r.tunnel_cpu_cores = f64::NAN;
        r.latency_us = Latency::default();
        let s = ScenarioResult {
            name: "a<b & \"c\"".to_string(),
            rungs: vec![r],
            ..ScenarioResult::default()
        };
        let svg = render_svg(&s);
        assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert_eq!(file_stem(&s.name), "a_b____c_");
        assert_eq!(file_stem("../x"), "_x");
    }

    #[test]
    fn axis_steps_are_round() {
        let close = |(a, b): (f64, f64), (c, d): (f64, f64)| {
            assert!(
                (a - c).abs() < 1e-9 && (b - d).abs() < 1e-9,
                "({a}, {b}) != ({c}, {d})"
            );
        };
        close(axis(8000.0), (8000.0, 2000.0));
        close(axis(7000.0), (8000.0, 2000.0));
        close(axis(37.0), (40.0, 10.0));
        close(axis(0.9), (1.0, 0.5));
        close(axis(0.0), (1.0, 0.25));
        close(axis(f64::NAN), (1.0, 0.25));
    }
}
