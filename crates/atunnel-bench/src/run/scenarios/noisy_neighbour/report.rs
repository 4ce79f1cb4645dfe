//! noisy-neighbour's part of report.md: one table row per hostile pattern,
//! and a plot (SVG, written by hand as results.rs writes the others) of the
//! victim's ratios to its baseline, atunnel's peak memory against the soft
//! threshold, and the time to recover.

use std::fmt::Write as _;
use std::path::Path;

use atunnel_bench::load::results::{ScenarioResult, write_whole};
use serde_json::Value;

use super::{P99_RATIO_MAX, TCP_RATIO_MIN};

/// The plot's file, beside report.md.
pub(in crate::run) const PLOT_FILE: &str = "noisy-neighbour.svg";

/// The markdown for noisy-neighbour's result `s`: its table and a link to
/// its plot, which this writes into `dir` (the run folder). Empty when `s`
/// has no patterns (the scenario failed before any ran; its notes say why).
pub(in crate::run) fn section(dir: &Path, s: &ScenarioResult) -> std::io::Result<String> {
    let Some(rows) = s.summary["patterns"].as_array().filter(|r| !r.is_empty()) else {
        return Ok(String::new());
    };
    write_whole(&dir.join(PLOT_FILE), svg(rows))?;
    let spread = &s.summary["baseline_spread"];
    Ok(format!(
        "{}\nThe baselines themselves moved by up to {}x (egress-http p99), {}x (ingress-https p99) and {}x (egress-tcp) over the run: a ratio inside that spread is within this machine's noise.\n\n![victim ratios, peak memory and recovery per pattern]({PLOT_FILE})\n\n",
        table(rows),
        num(&spread["http_p99"], 2),
        num(&spread["https_p99"], 2),
        num(&spread["tcp_mb_s"], 2),
    ))
}

fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |us| format!("{:.2}", us / 1e3))
}

fn num(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn mib(v: &Value) -> String {
    v.as_f64()
        .map_or("-".into(), |b| format!("{:.0}", b / 1048576.0))
}

/// The table: one row per pattern.
fn table(rows: &[Value]) -> String {
    let mut md = String::from(
        "| pattern | http p99 ms (base -> under) | ratio | https p99 ms (base -> under) | ratio | tcp MB/s (base -> under) | ratio | OOM kills | peak / soft MiB | recovered s | atunnel refused or reset | cores under: tunnel / generator / sink / other work | pass |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let refused = &r["refused"];
        let sum = |keys: &[&str]| -> f64 { keys.iter().filter_map(|k| refused[*k].as_f64()).sum() };
        let refused_text = format!(
            "{:.0} refused, {:.0} reset at a bound, {:.0} shed",
            sum(&[
                "refused_tunnels",
                "refused_opening",
                "refused_overload",
                "ingress_refused_in_flight",
                "ingress_refused_overload"
            ]),
            sum(&["stalled_write_ends", "half_closed_ends"]),
            sum(&["shed", "overload_shed"]),
        );
        let pass = if r["pass"] == true {
            "pass".to_string()
        } else {
            let why: Vec<&str> = r["failed"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            format!("**fail**: {}", why.join(", "))
        };
        let _ = writeln!(
            md,
            "| {} | {} -> {} | {} | {} -> {} | {} | {} -> {} | {} | {} | {} / {} | {} | {} | {} / {} / {} / {}{} | {} |",
            r["pattern"].as_str().unwrap_or("?"),
            ms(&r["baseline_http_p99_us"]),
            ms(&r["victim_http_p99_us"]),
            num(&r["victim_p99_ratio"], 2),
            ms(&r["baseline_https_p99_us"]),
            ms(&r["victim_https_p99_us"]),
            num(&r["victim_https_p99_ratio"], 2),
            num(&r["baseline_tcp_mb_s"], 0),
            num(&r["victim_tcp_mb_s"], 0),
            num(&r["victim_tcp_ratio"], 2),
            num(&r["oom_kills"], 0),
            mib(&r["peak_memory_bytes"]),
            mib(&r["soft_threshold_bytes"]),
            r["recovered_s"]
                .as_f64()
                .map_or("never".into(), |s| format!("{s:.1}")),
            refused_text,
            num(&r["tunnel_cores"], 2),
            num(&r["generator_cores"], 2),
            num(&r["sink_cores"], 2),
            num(&r["others_cores"], 2),
            if r["machine_saturated"] == true || r["baseline_machine_saturated"] == true {
                " (machine saturated)"
            } else {
                ""
            },
            pass,
        );
    }
    md
}

const W: f64 = 720.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const PANEL_H: f64 = 150.0;
const PANEL_GAP: f64 = 70.0;
const TOP: f64 = 40.0;
const COLORS: [&str; 3] = ["#1f77b4", "#9467bd", "#2ca02c"];
const LIMIT_COLOR: &str = "#d62728";

/// Three panels, one group per pattern: the victim's ratios to baseline
/// (egress-http p99, ingress-https p99, egress-tcp MB/s) with their bounds;
/// peak cgroup memory with the soft threshold; seconds to recover.
fn svg(rows: &[Value]) -> String {
    let h = TOP + 3.0 * (PANEL_H + PANEL_GAP);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">noisy-neighbour: the victim beside each hostile pattern</text>"#,
        W / 2.0
    );
    let f = |r: &Value, k: &str| r[k].as_f64();
    let ratios: Vec<[Option<f64>; 3]> = rows
        .iter()
        .map(|r| {
            [
                f(r, "victim_p99_ratio"),
                f(r, "victim_https_p99_ratio"),
                f(r, "victim_tcp_ratio"),
            ]
        })
        .collect();
    let ratio_max = ratios
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(1.5f64, f64::max);
    panel(
        &mut o,
        0,
        "victim under the pattern / its baseline (bounds: p99 <= 1.1, tcp >= 0.9)",
        rows,
        &ratios,
        ratio_max,
        &["egress-http p99", "ingress-https p99", "egress-tcp MB/s"],
        &[(P99_RATIO_MAX, "1.1"), (TCP_RATIO_MIN, "0.9")],
    );
    let mib = |x: Option<f64>| x.map(|b| b / 1048576.0);
    let memory: Vec<[Option<f64>; 3]> = rows
        .iter()
        .map(|r| {
            [
                mib(f(r, "baseline_memory_bytes")),
                mib(f(r, "peak_memory_bytes")),
                None,
            ]
        })
        .collect();
    let soft = rows
        .iter()
        .filter_map(|r| mib(f(r, "soft_threshold_bytes")))
        .fold(0.0f64, f64::max);
    let memory_max = memory
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(soft, f64::max)
        .max(1.0);
    panel(
        &mut o,
        1,
        "atunnel's cgroup memory, MiB: at baseline and the pattern's peak (line: soft threshold)",
        rows,
        &memory,
        memory_max,
        &["baseline", "peak", ""],
        &[(soft, "soft")],
    );
    let recovered: Vec<[Option<f64>; 3]> = rows
        .iter()
        .map(|r| [f(r, "recovered_s"), None, None])
        .collect();
    let recovered_max = recovered
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(1.0f64, f64::max);
    panel(
        &mut o,
        2,
        "seconds from the hostile actor stopping until atunnel was back to baseline (x: never)",
        rows,
        &recovered,
        recovered_max,
        &["recovered s", "", ""],
        &[],
    );
    o.push_str("</svg>\n");
    o
}

/// One panel: per pattern up to three bars of `values` on an axis from 0
/// to `max`, horizontal `limits`, a legend of `series`. A missing value is
/// drawn as an x at the baseline.
#[allow(clippy::too_many_arguments)]
fn panel(
    o: &mut String,
    n: usize,
    title: &str,
    rows: &[Value],
    values: &[[Option<f64>; 3]],
    max: f64,
    series: &[&str; 3],
    limits: &[(f64, &str)],
) {
    let y0 = TOP + n as f64 * (PANEL_H + PANEL_GAP) + 20.0;
    let y1 = y0 + PANEL_H;
    let (top, step) = axis(max);
    let py = |v: f64| y1 - (v.max(0.0) / top) * PANEL_H;
    let group = (W - LEFT - RIGHT) / rows.len().max(1) as f64;
    let bars = series.iter().filter(|s| !s.is_empty()).count().max(1);
    let bar = group * 0.7 / bars as f64;
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{:.1}" font-size="12">{}</text>"#,
        y0 - 6.0,
        esc(title)
    );
    for k in 0..=((top / step).round() as usize) {
        let v = step * k as f64;
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py(v) + 4.0,
            tick(v),
            y = py(v)
        );
    }
    for (g, (row, vals)) in rows.iter().zip(values).enumerate() {
        let gx = LEFT + g as f64 * group + group * 0.15;
        for (b, v) in vals.iter().take(bars).enumerate() {
            let x = gx + b as f64 * bar;
            match v {
                Some(v) => {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                        py(*v),
                        bar * 0.9,
                        y1 - py(*v),
                        COLORS[b],
                        esc(series[b]),
                        tick(*v)
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{LIMIT_COLOR}" font-size="14">x</text>"#,
                        x + bar * 0.45,
                        y1 - 4.0
                    );
                }
            }
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + (g as f64 + 0.5) * group,
            y1 + 14.0,
            esc(row["pattern"].as_str().unwrap_or("?"))
        );
    }
    for (v, label) in limits {
        let _ = writeln!(
            o,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{LIMIT_COLOR}" stroke-dasharray="5,3"/><text x="{:.1}" y="{:.1}" fill="{LIMIT_COLOR}" text-anchor="end">{}</text>"#,
            W - RIGHT,
            W - RIGHT - 2.0,
            py(*v) - 3.0,
            esc(label),
            y = py(*v)
        );
    }
    let _ = writeln!(
        o,
        r#"<line x1="{LEFT}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="black"/><line x1="{LEFT}" y1="{y0:.1}" x2="{LEFT}" y2="{y1:.1}" stroke="black"/>"#,
        W - RIGHT
    );
    let mut lx = LEFT;
    for (b, s) in series.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let _ = writeln!(
            o,
            r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y1 + 24.0,
            COLORS[b],
            lx + 14.0,
            y1 + 33.0,
            esc(s)
        );
        lx += 150.0;
    }
}

/// An axis from 0 covering `max`: its end and its tick step (1, 2 or 5
/// times a power of ten, about four ticks).
fn axis(max: f64) -> (f64, f64) {
    if !max.is_finite() || max <= 0.0 {
        return (1.0, 0.25);
    }
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = mag
        * match raw / mag {
            f if f <= 1.0 => 1.0,
            f if f <= 2.0 => 2.0,
            f if f <= 5.0 => 5.0,
            _ => 10.0,
        };
    ((max / step - 1e-9).ceil().max(1.0) * step, step)
}

fn tick(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result() -> ScenarioResult {
        let row = |name: &str, pass: bool, recovered: Value| {
            json!({
                "pattern": name, "pass": pass,
                "failed": if pass { json!([]) } else { json!(["victim egress-http p99"]) },
                "victim_p99_ratio": if pass { 1.02 } else { 1.8 },
                "victim_https_p99_ratio": 0.97, "victim_tcp_ratio": 0.95,
                "oom_kills": 0, "peak_memory_bytes": 120u64 << 20,
                "baseline_memory_bytes": 60u64 << 20, "soft_threshold_bytes": 870u64 << 20,
                "recovered_s": recovered,
                "baseline_http_p99_us": 900, "victim_http_p99_us": 950,
                "baseline_https_p99_us": 1500, "victim_https_p99_us": 1400,
                "baseline_tcp_mb_s": 600.0, "victim_tcp_mb_s": 570.0,
                "tunnel_cores": 0.6, "generator_cores": 0.7, "sink_cores": 0.1,
                "others_cores": 0.2, "machine_saturated": !pass,
                "refused": {"refused_tunnels": 300.0, "stalled_write_ends": 12.0, "shed": 0.0},
            })
        };
        ScenarioResult {
            name: "noisy-neighbour".into(),
            summary: json!({"patterns": [
                row("unread-downloads", true, json!(0.4)),
                row("stalled-uploads", false, Value::Null),
            ], "baseline_spread": {"http_p99": 1.3, "https_p99": 1.25, "tcp_mb_s": null}}),
            ..ScenarioResult::default()
        }
    }

    #[test]
    fn the_section_has_a_row_per_pattern_and_writes_its_plot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let md = section(dir.path(), &result()).expect("written");
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 3, "{md}");
        assert!(
            rows[1].contains("unread-downloads") && rows[1].contains("| pass |"),
            "{md}"
        );
        assert!(
            rows[1].contains("0.90 -> 0.95") && rows[1].contains("120 / 870"),
            "{md}"
        );
        assert!(rows[1].contains("300 refused, 12 reset at a bound"), "{md}");
        assert!(
            rows[2].contains("never") && rows[2].contains("**fail**: victim egress-http p99"),
            "{md}"
        );
        assert!(md.contains(&format!("]({PLOT_FILE})")));
        assert!(
            md.contains("up to 1.30x (egress-http p99), 1.25x (ingress-https p99) and -x"),
            "{md}"
        );
        let svg = std::fs::read_to_string(dir.path().join(PLOT_FILE)).expect("plot");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // 3 ratios and 2 memory bars per pattern, one recovery bar for the
        // first (an x for the second); 3 + 2 + 1 legend swatches and the
        // background.
        assert_eq!(
            svg.matches("<rect").count(),
            2 * 3 + 2 * 2 + 1 + 6 + 1,
            "{svg}"
        );
        assert!(svg.contains(">x</text>"));
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn a_failed_scenario_has_no_section() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = ScenarioResult::default();
        assert_eq!(section(dir.path(), &empty).expect("nothing to write"), "");
        assert!(!dir.path().join(PLOT_FILE).exists());
    }
}
