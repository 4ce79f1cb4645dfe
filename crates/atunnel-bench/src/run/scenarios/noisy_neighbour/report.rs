//! noisy-neighbour's part of report.md: one table row per hostile pattern
//! (each ratio with its 95 % interval and verdict), the count of each
//! verdict, and its plot (drawn by `scenario::noisy_neighbour::chart`): the victim's
//! latency and throughput beside its baseline, their ratios against the
//! bounds, atunnel's peak memory against the soft threshold, and the time
//! to recover.

use std::path::Path;

use atunnel_bench::load::confidence::{Conclusion, FigureSummary};
use atunnel_bench::load::results::{ScenarioResult, write_whole};
use atunnel_bench::markdown::Table;
use atunnel_bench::scenario::noisy_neighbour::{self, Confidence, Pattern, Summary, VictimBounds};

use super::{P99_RATIO_MAX, TCP_RATIO_MIN};

/// The plot's file, beside report.md.
pub(in crate::run) const PLOT_FILE: &str = "noisy-neighbour.svg";

/// The markdown for noisy-neighbour's result `s`: its table and a link to
/// its plot, which this writes into `dir` (the run folder). Empty when `s`
/// has no patterns (the scenario failed before any ran; its notes say why).
pub(in crate::run) fn section(dir: &Path, s: &ScenarioResult) -> std::io::Result<String> {
    let Some(summary) = s.summary::<Summary>().filter(|s| !s.patterns.is_empty()) else {
        return Ok(String::new());
    };
    let rows = &summary.patterns;
    let bounds = VictimBounds {
        p99_ratio_max: P99_RATIO_MAX,
        tcp_ratio_min: TCP_RATIO_MIN,
    };
    let svg = noisy_neighbour::chart(rows, bounds)
        .render()
        .map_err(std::io::Error::other)?;
    write_whole(&dir.join(PLOT_FILE), svg)?;
    let (spread, counts) = (&summary.baseline_spread, &summary.verdicts);
    Ok(format!(
        "{}Verdicts: {} pass, {} fail, {} inconclusive (a ratio's interval straddling its bound; neither pass nor fail).\n\nThe baselines themselves moved by up to {}x (egress-http p99), {}x (ingress-https p99) and {}x (egress-tcp) over the run, the noise each pair's ratio cancels and each interval is as wide as.\n\n![victim latency and throughput against its baseline, ratios, peak memory and recovery per pattern]({PLOT_FILE})\n\n",
        table(rows),
        counts.pass,
        counts.fail,
        counts.inconclusive,
        num(spread.http_p99, 2),
        num(spread.https_p99, 2),
        num(spread.tcp_mb_s, 2),
    ))
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1e3)
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn mib(bytes: f64) -> String {
    format!("{:.0}", bytes / 1048576.0)
}

/// A ratio with its 95 % interval and verdict: `1.02 [0.95, 1.10] pass`;
/// the bare ratio for a row without one.
fn ratio(
    r: &Pattern,
    figure: fn(&Confidence) -> &Option<FigureSummary>,
    bare: Option<f64>,
) -> String {
    let Some(f) = r.confidence.as_ref().and_then(|c| figure(c).as_ref()) else {
        return num(bare, 2);
    };
    format!(
        "{} {} {}",
        num(f.estimate, 2),
        f.interval_text("[-]"),
        f.verdict
    )
}

/// The table: one row per pattern.
fn table(rows: &[Pattern]) -> String {
    let mut t = Table::new(&[
        "pattern",
        "http p99 ms (base -> under, median window)",
        "ratio [95 %]",
        "https p99 ms (base -> under)",
        "ratio [95 %]",
        "tcp MB/s (base -> under)",
        "ratio [95 %]",
        "OOM kills",
        "peak / soft MiB",
        "recovered s",
        "atunnel refused or reset",
        "victim refused; overload guard",
        "cores under: tunnel / generator / sink / other work",
        "verdict",
    ]);
    for r in rows {
        let f = &r.context.refused;
        let refused_text = format!(
            "{:.0} refused, {:.0} reset at a bound, {:.0} shed",
            f.refused_tunnels
                + f.refused_opening
                + f.refused_overload
                + f.ingress_refused_in_flight
                + f.ingress_refused_overload,
            f.stalled_write_ends + f.half_closed_ends,
            f.shed + f.overload_shed,
        );
        let victim = &r.victim_refused;
        let victim_text = format!(
            "{}/{} new tunnels, {} request errors; {}",
            victim.new_tunnels_refused,
            victim.new_tunnels_tried,
            victim.request_errors,
            r.overload
                .worst_state
                .map_or("-".to_string(), |s| s.to_string()),
        );
        let verdict = match r.verdict {
            Some(Conclusion::Pass) => "pass".to_string(),
            Some(Conclusion::Inconclusive) => {
                format!("inconclusive: {}", r.inconclusive.join(", "))
            }
            // Rows written before the intervals have only `pass`.
            None if r.pass => "pass".to_string(),
            _ => format!("**fail**: {}", r.failed.join(", ")),
        };
        let (v, c) = (&r.victim, &r.context);
        let saturated = if c.machine_saturated || c.baseline_machine_saturated {
            " (machine saturated)"
        } else {
            ""
        };
        t.row([
            r.pattern.clone(),
            format!(
                "{} -> {}",
                ms(v.baseline_http_p99_us),
                ms(v.victim_http_p99_us)
            ),
            ratio(r, |c| &c.http_p99, r.victim_p99_ratio),
            format!(
                "{} -> {}",
                ms(v.baseline_https_p99_us),
                ms(v.victim_https_p99_us)
            ),
            ratio(r, |c| &c.https_p99, r.victim_https_p99_ratio),
            format!(
                "{} -> {}",
                num(Some(v.baseline_tcp_mb_s), 0),
                num(Some(v.victim_tcp_mb_s), 0)
            ),
            ratio(r, |c| &c.tcp_mb_s, r.victim_tcp_ratio),
            r.oom_kills.to_string(),
            format!(
                "{} / {}",
                mib(r.peak_memory_bytes as f64),
                mib(r.soft_threshold_bytes)
            ),
            r.recovered_s.map_or("never".into(), |s| format!("{s:.1}")),
            refused_text,
            victim_text,
            format!(
                "{} / {} / {} / {}{saturated}",
                num(Some(c.tunnel_cores), 2),
                num(Some(c.generator_cores), 2),
                num(Some(c.sink_cores), 2),
                num(Some(c.others_cores), 2)
            ),
            verdict,
        ]);
    }
    t.end()
}

#[cfg(test)]
mod tests {
    use atunnel_bench::load::confidence::Counts;
    use atunnel_bench::scenario::noisy_neighbour::{
        Context, Overload, Refused, Spread, Victim, VictimRefused,
    };
    use atunnel_process::overload::OverloadState;

    use super::*;

    fn figure(estimate: f64, ci95: Option<[f64; 2]>, verdict: Conclusion) -> Option<FigureSummary> {
        Some(FigureSummary {
            estimate: Some(estimate),
            ci95,
            verdict,
            ..FigureSummary::default()
        })
    }

    fn result() -> ScenarioResult {
        let row = |name: &str, pass: bool, recovered: Option<f64>| {
            let (verdict, http) = if pass {
                (Conclusion::Pass, 1.02)
            } else {
                (Conclusion::Fail, 1.8)
            };
            Pattern {
                pattern: name.into(),
                pass,
                verdict: Some(verdict),
                confidence: Some(Confidence {
                    http_p99: figure(
                        http,
                        Some(if pass { [0.97, 1.07] } else { [1.5, 2.2] }),
                        verdict,
                    ),
                    https_p99: figure(0.97, Some([0.9, 1.3]), Conclusion::Inconclusive),
                    tcp_mb_s: figure(0.95, None, Conclusion::Inconclusive),
                }),
                failed: if pass {
                    vec![]
                } else {
                    vec!["victim egress-http p99".into()]
                },
                victim_p99_ratio: Some(http),
                victim_https_p99_ratio: Some(0.97),
                victim_tcp_ratio: Some(0.95),
                oom_kills: 0,
                peak_memory_bytes: 120 << 20,
                baseline_memory_bytes: 60 << 20,
                soft_threshold_bytes: (870u64 << 20) as f64,
                recovered_s: recovered,
                victim: Victim {
                    baseline_http_p99_us: 900.0,
                    victim_http_p99_us: 950.0,
                    baseline_http_p50_us: 400.0,
                    victim_http_p50_us: 420.0,
                    baseline_https_p99_us: 1500.0,
                    victim_https_p99_us: 1400.0,
                    baseline_tcp_mb_s: 600.0,
                    victim_tcp_mb_s: 570.0,
                    ..Victim::default()
                },
                context: Context {
                    tunnel_cores: 0.6,
                    generator_cores: 0.7,
                    sink_cores: 0.1,
                    others_cores: 0.2,
                    machine_saturated: !pass,
                    refused: Refused {
                        refused_tunnels: 300.0,
                        stalled_write_ends: 12.0,
                        ..Refused::default()
                    },
                    ..Context::default()
                },
                victim_refused: VictimRefused {
                    new_tunnels_tried: 50,
                    new_tunnels_refused: if pass { 0 } else { 17 },
                    request_errors: if pass { 0 } else { 2500 },
                    ..VictimRefused::default()
                },
                overload: Overload {
                    worst_state: Some(if pass {
                        OverloadState::Normal
                    } else {
                        OverloadState::Soft
                    }),
                    ..Overload::default()
                },
                ..Pattern::default()
            }
        };
        let summary = Summary {
            patterns: vec![
                row("unread-downloads", true, Some(0.4)),
                row("stalled-uploads", false, None),
            ],
            baseline_spread: Spread {
                http_p99: Some(1.3),
                https_p99: Some(1.25),
                tcp_mb_s: None,
            },
            verdicts: Counts {
                pass: 1,
                fail: 1,
                inconclusive: 0,
            },
            ..Summary::default()
        };
        ScenarioResult::new(&summary, Vec::new(), Vec::new())
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
        let summary = Summary {
            patterns: vec![Pattern {
                pattern: "dns-flood".into(),
                verdict: Some(Conclusion::Inconclusive),
                inconclusive: vec!["victim ingress-https p99".into()],
                confidence: Some(Confidence {
                    https_p99: figure(1.24, Some([0.8, 1.9]), Conclusion::Inconclusive),
                    ..Confidence::default()
                }),
                ..Pattern::default()
            }],
            verdicts: Counts {
                inconclusive: 1,
                ..Counts::default()
            },
            ..Summary::default()
        };
        let s = ScenarioResult::new(&summary, Vec::new(), Vec::new());
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
        let empty = ScenarioResult::without_summary(
            atunnel_bench::scenario::Scenario::NoisyNeighbour,
            vec!["scenario failed: no actors".into()],
        );
        assert_eq!(section(dir.path(), &empty).expect("nothing to write"), "");
        assert!(!dir.path().join(PLOT_FILE).exists());
    }
}
