//! A pattern's verdict from its pairs of windows and its checks.

use super::*;

/// What a pattern's verdict is made of.
pub(super) struct Checks {
    /// The victim's figures over the pattern's pairs of windows.
    pub(super) http: Figure,
    pub(super) https: Figure,
    pub(super) tcp: Figure,
    pub(super) victim_errors: u64,
    /// Of the victim's [`PROBE_TUNNELS`] new egress tunnels in each pair.
    pub(super) new_tunnels_refused: u64,
    pub(super) oom_kills: u64,
    pub(super) alive: bool,
    pub(super) peak_memory: f64,
    pub(super) soft: f64,
    /// The overload guard was seen past normal, or changed state.
    pub(super) guard_left_normal: bool,
    pub(super) recovered: bool,
}

/// The pattern's verdict from `c`, with what failed and what was
/// inconclusive: a figure whose interval is wholly outside its bound, or
/// that no pair measured at all (the victim got nothing through), fails
/// it, as does any of the checks that are counts (errors, refusals, OOM
/// kills, memory, the guard, recovery); a figure whose interval straddles
/// its bound leaves it inconclusive unless something failed.
pub(super) fn verdict(c: &Checks) -> (Conclusion, Vec<&'static str>, Vec<&'static str>) {
    let mut failed = Vec::new();
    let mut unsure = Vec::new();
    for (figure, name) in [
        (&c.http, "victim egress-http p99"),
        (&c.https, "victim ingress-https p99"),
        (&c.tcp, "victim egress-tcp throughput"),
    ] {
        if figure.estimate.is_none() || figure.conclusion == Conclusion::Fail {
            failed.push(name);
        } else if figure.conclusion == Conclusion::Inconclusive {
            unsure.push(name);
        }
    }
    if c.victim_errors > 0 {
        failed.push("victim errors");
    }
    if c.new_tunnels_refused > 0 {
        failed.push("victim new tunnels refused");
    }
    if c.oom_kills > 0 || !c.alive {
        failed.push("atunnel died");
    }
    if c.peak_memory >= c.soft {
        failed.push("memory over the soft threshold");
    }
    if c.guard_left_normal {
        failed.push("overload guard left normal");
    }
    if !c.recovered {
        failed.push("not back to baseline");
    }
    let conclusion = if !failed.is_empty() {
        Conclusion::Fail
    } else if !unsure.is_empty() {
        Conclusion::Inconclusive
    } else {
        Conclusion::Pass
    };
    (conclusion, failed, unsure)
}

/// The middle value of `v` (the upper one of an even count), 0 if empty.
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The victim's three figures of one window, as a pair compares them.
pub(super) fn window_figures(w: &Window) -> summary::Window {
    summary::Window {
        http_p99_us: w.http.latency.p99,
        http_p50_us: w.http.latency.p50,
        https_p99_us: w.https.latency.p99,
        tcp_mb_s: w.tcp_median(),
        errors: w.errors(),
        machine_saturated: w.machine_saturated(),
    }
}

/// The victim's three figures over `pairs` of (baseline, under) windows:
/// each pair's ratio against its bound.
pub(super) fn figures(pairs: &[(Window, Window)]) -> (Figure, Figure, Figure) {
    let of = |f: fn(&Window) -> f64, bound| {
        Figure::of(
            pairs
                .iter()
                .map(|(base, under)| ratio(f(under), f(base)))
                .collect(),
            bound,
        )
    };
    (
        of(|w| w.http.latency.p99 as f64, Bound::AtMost(P99_RATIO_MAX)),
        of(|w| w.https.latency.p99 as f64, Bound::AtMost(P99_RATIO_MAX)),
        of(Window::tcp_median, Bound::AtLeast(TCP_RATIO_MIN)),
    )
}

/// A pattern's verdict in one line, with each figure's interval:
/// `unread-downloads: inconclusive (http p99 1.02 [0.95, 1.14] <= 1.1:
/// inconclusive; ...)`.
pub(super) fn verdict_line(row: &summary::Pattern) -> String {
    let figure = |f: fn(&summary::Confidence) -> &Option<FigureSummary>| {
        let Some(f) = row.confidence.as_ref().and_then(|c| f(c).as_ref()) else {
            return "- [no interval]: -".to_string();
        };
        let point = f.estimate.map_or("-".into(), |x| format!("{x:.2}"));
        format!(
            "{point} {}: {}",
            f.interval_text("[no interval]"),
            f.verdict
        )
    };
    format!(
        "{}: {}{} over {} pairs; http p99 ratio {}, https p99 ratio {}, tcp ratio {}",
        row.pattern,
        row.verdict.map_or("?", Conclusion::as_str),
        if row.failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", row.failed.join(", "))
        },
        row.pairs,
        figure(|c| &c.http_p99),
        figure(|c| &c.https_p99),
        figure(|c| &c.tcp_mb_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(r: f64, bound: Bound) -> Figure {
        Figure::of(vec![Some(r); 4], bound)
    }

    fn passing() -> Checks {
        Checks {
            http: steady(1.0, Bound::AtMost(P99_RATIO_MAX)),
            https: steady(1.05, Bound::AtMost(P99_RATIO_MAX)),
            tcp: steady(0.95, Bound::AtLeast(TCP_RATIO_MIN)),
            victim_errors: 0,
            new_tunnels_refused: 0,
            oom_kills: 0,
            alive: true,
            peak_memory: 100.0,
            soft: 870.0,
            guard_left_normal: false,
            recovered: true,
        }
    }

    #[test]
    fn a_victim_refused_or_a_guard_gone_soft_fails_the_pattern() {
        assert_eq!(verdict(&passing()), (Conclusion::Pass, vec![], vec![]));
        let refused = Checks {
            new_tunnels_refused: 3,
            ..passing()
        };
        assert_eq!(
            verdict(&refused),
            (Conclusion::Fail, vec!["victim new tunnels refused"], vec![])
        );
        let soft = Checks {
            guard_left_normal: true,
            ..passing()
        };
        assert_eq!(verdict(&soft).1, vec!["overload guard left normal"]);
        // No request of any pair completed: no ratio at all, a failure.
        let starved = Checks {
            https: Figure::of(vec![None; 4], Bound::AtMost(P99_RATIO_MAX)),
            victim_errors: 2500,
            ..passing()
        };
        assert_eq!(
            verdict(&starved).1,
            vec!["victim ingress-https p99", "victim errors"]
        );
    }

    #[test]
    fn a_figure_straddling_its_bound_leaves_the_pattern_inconclusive_unless_something_failed() {
        let noisy = Figure::of(
            vec![Some(0.9), Some(2.4), Some(1.0), Some(1.1)],
            Bound::AtMost(P99_RATIO_MAX),
        );
        let unsure = Checks {
            http: noisy.clone(),
            ..passing()
        };
        assert_eq!(
            verdict(&unsure),
            (
                Conclusion::Inconclusive,
                vec![],
                vec!["victim egress-http p99"]
            )
        );
        let unsure_and_failed = Checks {
            http: noisy,
            tcp: steady(0.5, Bound::AtLeast(TCP_RATIO_MIN)),
            ..passing()
        };
        assert_eq!(
            verdict(&unsure_and_failed),
            (
                Conclusion::Fail,
                vec!["victim egress-tcp throughput"],
                vec!["victim egress-http p99"]
            )
        );
    }

    fn window(http_p99: u64, https_p99: u64, tcp: f64) -> Window {
        let mut w = Window::default();
        w.http.latency.p99 = http_p99;
        w.https.latency.p99 = https_p99;
        w.tcp_mb_s = vec![tcp];
        w
    }

    #[test]
    fn each_pair_is_its_own_ratio_so_a_drifting_baseline_cancels() {
        // The machine slows down 3x over the pattern, the pattern itself
        // costs the victim nothing: each pair's ratio is 1.
        let pairs: Vec<(Window, Window)> = [1.0, 2.0, 3.0, 1.5]
            .iter()
            .map(|&slow| {
                (
                    window((1000.0 * slow) as u64, (2000.0 * slow) as u64, 600.0 / slow),
                    window((1000.0 * slow) as u64, (2000.0 * slow) as u64, 600.0 / slow),
                )
            })
            .collect();
        let (http, https, tcp) = figures(&pairs);
        for f in [&http, &https, &tcp] {
            assert_eq!(f.conclusion, Conclusion::Pass, "{f:?}");
            assert_eq!(f.point(), Some(1.0));
        }
        // A victim that got nothing through in one window: that pair has
        // no ratio, the others still count.
        let mut gap = pairs.clone();
        gap[1].1.https.latency.p99 = 0;
        let (_, https, _) = figures(&gap);
        assert_eq!(https.ratios, vec![Some(1.0), None, Some(1.0), Some(1.0)]);
    }

    #[test]
    fn the_verdict_line_shows_each_figures_interval() {
        let (http, https, tcp) = (
            steady(1.0, Bound::AtMost(P99_RATIO_MAX)),
            Figure::of(
                vec![Some(0.9), Some(2.4), Some(1.0), Some(1.1)],
                Bound::AtMost(P99_RATIO_MAX),
            ),
            steady(0.95, Bound::AtLeast(TCP_RATIO_MIN)),
        );
        let row = summary::Pattern {
            pattern: "dns-flood".into(),
            verdict: Some(Conclusion::Inconclusive),
            pairs: 4,
            confidence: Some(summary::Confidence {
                http_p99: Some(http.summary()),
                https_p99: Some(https.summary()),
                tcp_mb_s: Some(tcp.summary()),
            }),
            ..Default::default()
        };
        let line = verdict_line(&row);
        let (lo, hi) = https.interval().expect("interval");
        assert!(
            line.starts_with(&format!(
                "dns-flood: inconclusive over 4 pairs; http p99 ratio 1.00 [1.00, 1.00]: pass, https p99 ratio {:.2} [",
                https.point().expect("estimate")
            )),
            "{line}"
        );
        assert!(
            line.contains(&format!("[{lo:.2}, {hi:.2}]: inconclusive")),
            "{line}"
        );
        assert!(
            line.ends_with("tcp ratio 0.95 [0.95, 0.95]: pass"),
            "{line}"
        );
    }
}
