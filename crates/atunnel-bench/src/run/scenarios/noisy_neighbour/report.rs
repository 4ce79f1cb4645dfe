//! noisy-neighbour's part of report.md: one table row per hostile pattern
//! (each ratio with its 95 % interval and verdict), the count of each
//! verdict, and its plot (drawn by `load::plots::noisy_neighbour`): the victim's
//! latency and throughput beside its baseline, their ratios against the
//! bounds, atunnel's peak memory against the soft threshold, and the time
//! to recover.

use std::fmt::Write as _;
use std::path::Path;

use atunnel_bench::load::plots::{self, VictimBounds};
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
    let bounds = VictimBounds {
        p99_ratio_max: P99_RATIO_MAX,
        tcp_ratio_min: TCP_RATIO_MIN,
    };
    let svg = plots::noisy_neighbour(rows, bounds).map_err(std::io::Error::other)?;
    write_whole(&dir.join(PLOT_FILE), svg)?;
    let spread = &s.summary["baseline_spread"];
    let counts = &s.summary["verdicts"];
    Ok(format!(
        "{}\nVerdicts: {} pass, {} fail, {} inconclusive (a ratio's interval straddling its bound; neither pass nor fail).\n\nThe baselines themselves moved by up to {}x (egress-http p99), {}x (ingress-https p99) and {}x (egress-tcp) over the run, the noise each pair's ratio cancels and each interval is as wide as.\n\n![victim latency and throughput against its baseline, ratios, peak memory and recovery per pattern]({PLOT_FILE})\n\n",
        table(rows),
        num(&counts["pass"], 0),
        num(&counts["fail"], 0),
        num(&counts["inconclusive"], 0),
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

/// A ratio with its 95 % interval and verdict: `1.02 [0.95, 1.10] pass`;
/// the bare ratio for a row without one.
fn ratio(r: &Value, figure: &str, bare: &str) -> String {
    let f = &r["confidence"][figure];
    if f.is_null() {
        return num(&r[bare], 2);
    }
    let interval = match (f["ci95"][0].as_f64(), f["ci95"][1].as_f64()) {
        (Some(lo), Some(hi)) => format!("[{lo:.2}, {hi:.2}]"),
        _ => "[-]".into(),
    };
    format!(
        "{} {interval} {}",
        num(&f["estimate"], 2),
        f["verdict"].as_str().unwrap_or("-")
    )
}

/// The table: one row per pattern.
fn table(rows: &[Value]) -> String {
    let mut md = String::from(
        "| pattern | http p99 ms (base -> under, median window) | ratio [95 %] | https p99 ms (base -> under) | ratio [95 %] | tcp MB/s (base -> under) | ratio [95 %] | OOM kills | peak / soft MiB | recovered s | atunnel refused or reset | victim refused; overload guard | cores under: tunnel / generator / sink / other work | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
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
        let victim = &r["victim_refused"];
        let victim_text = format!(
            "{}/{} new tunnels, {} request errors; {}",
            num(&victim["new_tunnels_refused"], 0),
            num(&victim["new_tunnels_tried"], 0),
            num(&victim["request_errors"], 0),
            r["overload"]["worst_state"].as_str().unwrap_or("-"),
        );
        let list = |key: &str| -> String {
            let v: Vec<&str> = r[key]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            v.join(", ")
        };
        let pass = match r["verdict"].as_str() {
            Some("pass") => "pass".to_string(),
            Some("inconclusive") => format!("inconclusive: {}", list("inconclusive")),
            // Rows written before the intervals have only `pass`.
            None if r["pass"] == true => "pass".to_string(),
            _ => format!("**fail**: {}", list("failed")),
        };
        let _ = writeln!(
            md,
            "| {} | {} -> {} | {} | {} -> {} | {} | {} -> {} | {} | {} | {} / {} | {} | {} | {} | {} / {} / {} / {}{} | {} |",
            r["pattern"].as_str().unwrap_or("?"),
            ms(&r["baseline_http_p99_us"]),
            ms(&r["victim_http_p99_us"]),
            ratio(r, "http_p99", "victim_p99_ratio"),
            ms(&r["baseline_https_p99_us"]),
            ms(&r["victim_https_p99_us"]),
            ratio(r, "https_p99", "victim_https_p99_ratio"),
            num(&r["baseline_tcp_mb_s"], 0),
            num(&r["victim_tcp_mb_s"], 0),
            ratio(r, "tcp_mb_s", "victim_tcp_ratio"),
            num(&r["oom_kills"], 0),
            mib(&r["peak_memory_bytes"]),
            mib(&r["soft_threshold_bytes"]),
            r["recovered_s"]
                .as_f64()
                .map_or("never".into(), |s| format!("{s:.1}")),
            refused_text,
            victim_text,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result() -> ScenarioResult {
        let row = |name: &str, pass: bool, recovered: Value| {
            json!({
                "pattern": name, "pass": pass, "verdict": if pass { "pass" } else { "fail" },
                "confidence": {
                    "http_p99": {"estimate": if pass { 1.02 } else { 1.8 }, "ci95": if pass { json!([0.97, 1.07]) } else { json!([1.5, 2.2]) },
                                 "verdict": if pass { "pass" } else { "fail" }},
                    "https_p99": {"estimate": 0.97, "ci95": [0.9, 1.3], "verdict": "inconclusive"},
                    "tcp_mb_s": {"estimate": 0.95, "ci95": null, "verdict": "inconclusive"},
                },
                "failed": if pass { json!([]) } else { json!(["victim egress-http p99"]) },
                "victim_p99_ratio": if pass { 1.02 } else { 1.8 },
                "victim_https_p99_ratio": 0.97, "victim_tcp_ratio": 0.95,
                "oom_kills": 0, "peak_memory_bytes": 120u64 << 20,
                "baseline_memory_bytes": 60u64 << 20, "soft_threshold_bytes": 870u64 << 20,
                "recovered_s": recovered,
                "baseline_http_p99_us": 900, "victim_http_p99_us": 950,
                "baseline_http_p50_us": 400, "victim_http_p50_us": 420,
                "baseline_https_p99_us": 1500, "victim_https_p99_us": 1400,
                "baseline_tcp_mb_s": 600.0, "victim_tcp_mb_s": 570.0,
                "tunnel_cores": 0.6, "generator_cores": 0.7, "sink_cores": 0.1,
                "others_cores": 0.2, "machine_saturated": !pass,
                "refused": {"refused_tunnels": 300.0, "stalled_write_ends": 12.0, "shed": 0.0},
                "victim_refused": {"new_tunnels_tried": 50, "new_tunnels_refused": if pass { 0 } else { 17 },
                                   "request_errors": if pass { 0 } else { 2500 }},
                "overload": {"worst_state": if pass { "normal" } else { "soft" }},
            })
        };
        ScenarioResult {
            name: "noisy-neighbour".into(),
            summary: json!({"patterns": [
                row("unread-downloads", true, json!(0.4)),
                row("stalled-uploads", false, Value::Null),
            ], "baseline_spread": {"http_p99": 1.3, "https_p99": 1.25, "tcp_mb_s": null},
               "verdicts": {"pass": 1, "fail": 1, "inconclusive": 0}}),
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
            rows[1].contains("| 1.02 [0.97, 1.07] pass |")
                && rows[1].contains("| 0.97 [0.90, 1.30] inconclusive |")
                && rows[1].contains("| 0.95 [-] inconclusive |"),
            "{md}"
        );
        assert!(rows[2].contains("| 1.80 [1.50, 2.20] fail |"), "{md}");
        assert!(
            md.contains("Verdicts: 1 pass, 1 fail, 0 inconclusive"),
            "{md}"
        );
        assert!(
            rows[1].contains("0.90 -> 0.95") && rows[1].contains("120 / 870"),
            "{md}"
        );
        assert!(rows[1].contains("300 refused, 12 reset at a bound"), "{md}");
        assert!(
            rows[1].contains("| 0/50 new tunnels, 0 request errors; normal |"),
            "{md}"
        );
        assert!(
            rows[2].contains("| 17/50 new tunnels, 2500 request errors; soft |"),
            "{md}"
        );
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
        // Per pattern: http p50 and p99 at baseline and under (4), https
        // p99 (2), tcp (2), the three ratios, memory at baseline and peak
        // (2) and the recovery (1, "n/a" for the second: never). Plus a
        // legend swatch per series of each panel and the background.
        let bars = 2 * (4 + 2 + 2 + 3 + 2) + 1;
        let swatches = 4 + 2 + 2 + 3 + 2 + 1;
        assert_eq!(svg.matches("<rect").count(), bars + swatches + 1, "{svg}");
        assert_eq!(svg.matches(">\nn/a\n</text>").count(), 1, "{svg}");
        for label in [
            "victim egress-http latency: baseline and under the pattern",
            "victim ingress-https p99",
            "victim egress-tcp",
            "p50 baseline",
            "p50 under",
            "p99 baseline",
            "p99 under",
            "p99 bound 1.1",
            "tcp bound 0.9",
            "soft threshold 870 MiB",
            "unread-downloads",
            "stalled-uploads",
            "hostile pattern",
        ] {
            assert!(svg.contains(label), "{label} missing from {svg}");
        }
        // The p50s are drawn: 0.4 ms and 0.42 ms at the top of their bars.
        assert!(svg.contains(">\n0.4\n</text>") && svg.contains(">\n0.42\n</text>"));
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn an_inconclusive_pattern_says_which_figure_and_is_counted_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = ScenarioResult {
            name: "noisy-neighbour".into(),
            summary: json!({"patterns": [
                {"pattern": "dns-flood", "verdict": "inconclusive", "pass": false,
                 "inconclusive": ["victim ingress-https p99"], "failed": [],
                 "confidence": {"https_p99": {"estimate": 1.24, "ci95": [0.8, 1.9], "verdict": "inconclusive"}}},
            ], "verdicts": {"pass": 0, "fail": 0, "inconclusive": 1}}),
            ..ScenarioResult::default()
        };
        let md = section(dir.path(), &s).expect("written");
        let row = md
            .lines()
            .find(|l| l.starts_with("| dns-flood"))
            .expect("row");
        assert!(
            row.ends_with("| inconclusive: victim ingress-https p99 |"),
            "{row}"
        );
        assert!(row.contains("| 1.24 [0.80, 1.90] inconclusive |"), "{row}");
        assert!(
            md.contains("Verdicts: 0 pass, 0 fail, 1 inconclusive"),
            "{md}"
        );
    }

    #[test]
    fn a_failed_scenario_has_no_section() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = ScenarioResult::default();
        assert_eq!(section(dir.path(), &empty).expect("nothing to write"), "");
        assert!(!dir.path().join(PLOT_FILE).exists());
    }
}
