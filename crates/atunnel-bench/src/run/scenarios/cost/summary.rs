//! The scenario's summary (per unit, per contender) and its report section.

use super::*;

/// One contender's figures per unit: each count's per-unit estimate from
/// every pair of windows (keys: `instructions`, `syscalls`,
/// `context_switches`, `preemptions`, `allocations`, and `sys:<name>` per
/// syscall name).
#[derive(Clone, Debug, Default)]
pub(super) struct PerUnit {
    pub(super) rounds: BTreeMap<String, Vec<f64>>,
}

impl PerUnit {
    pub(super) fn push(&mut self, key: impl Into<String>, v: f64) {
        self.rounds.entry(key.into()).or_default().push(v);
    }

    /// The median of `key`'s estimates and their minimum and maximum.
    pub(super) fn get(&self, key: &str) -> Option<Spread> {
        Spread::of(self.rounds.get(key)?)
    }
}

/// A count's median over the pairs of windows, and their range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Spread {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
}

impl Spread {
    pub(super) fn of(v: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

/// The path `contender` takes for `unit`: to the actors' program
/// (ingress), or from actor-0's sandbox to the far end (egress).
pub(super) fn path_of(contender: Contender, unit: Unit) -> &'static str {
    let egress = matches!(
        unit,
        Unit::EgressOpen | Unit::EgressUpload | Unit::EgressDownload | Unit::EgressHttp
    );
    match (contender.peer(), egress) {
        (None, false) => "across a veth into each actor's sandbox (its nftables rules)",
        (None, true) => {
            "redirected from actor-0's sandbox to atunnel; HTTP/2 CONNECT on a kept mTLS connection to the gateway sink"
        }
        (Some(peer), false) => peer.path(),
        (Some(_), true) => {
            "redirected from actor-0's sandbox to HAProxy (mode tcp); a TLS connection per tunnel (session resumed) to the sink's TLS services"
        }
    }
}

pub(super) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The scenario's summary (and results.json's `cost`): per unit, each
/// contender's counts.
pub(super) fn summary(
    units: &[Unit],
    quick: bool,
    measured: &[(Contender, BTreeMap<&'static str, PerUnit>)],
) -> Summary {
    let units = units
        .iter()
        .map(|u| UnitCounts {
            name: u.name().into(),
            per: u.per().into(),
            n: u.count(Pass::Callgrind, quick),
            n_perf: u.count(Pass::Perf, quick),
            rounds: Some(rounds(*u, Pass::Callgrind, quick) as u64),
            rounds_perf: Some(rounds(*u, Pass::Perf, quick) as u64),
            contenders: measured
                .iter()
                .filter_map(|(c, m)| Some(contender_counts(*c, *u, m.get(u.name())?)))
                .collect(),
        })
        .collect();
    Summary { units }
}

/// `contender`'s counts for `unit`: each count's median over the pairs
/// of windows, its [min, max] beside it.
fn contender_counts(contender: Contender, unit: Unit, r: &PerUnit) -> ContenderCounts {
    let median = |k: &str, round: fn(f64) -> f64| r.get(k).map(|s| round(s.median));
    let spread = |k: &str, round: fn(f64) -> f64| r.get(k).map(|s| [round(s.min), round(s.max)]);
    ContenderCounts {
        name: contender.name().into(),
        path: path_of(contender, unit).into(),
        instructions: median("instructions", f64::round),
        syscalls: median("syscalls", round2),
        syscalls_by_name: r
            .rounds
            .keys()
            .filter_map(|k| {
                let name = k.strip_prefix("sys:")?;
                let v = r.get(k)?.median;
                (v.abs() >= 0.005).then(|| (name.to_string(), round2(v)))
            })
            .collect(),
        context_switches: median("context_switches", round2),
        preemptions: median("preemptions", round2),
        allocations: median("allocations", round2),
        spread: CountSpread {
            instructions: spread("instructions", f64::round),
            syscalls: spread("syscalls", round2),
            context_switches: spread("context_switches", round2),
            preemptions: spread("preemptions", round2),
            allocations: spread("allocations", round2),
        },
    }
}

/// report.md's tables: per unit, each contender's counts (the median over
/// the pairs of windows, their range in brackets) and atunnel's ratio to it.
pub fn report_section(summary: &Summary) -> String {
    use std::fmt::Write;
    let mut md = String::new();
    let num = |v: Option<f64>| match v {
        Some(x) if x.abs() >= 1000.0 => format!("{:.0}", x),
        Some(x) => format!("{x:.2}"),
        None => "n/a".into(),
    };
    // A count's median and, when the pairs disagreed, their min..max.
    let fmt = |median: Option<f64>, spread: Option<[f64; 2]>| {
        let median = num(median);
        match spread.map(|[lo, hi]| (num(Some(lo)), num(Some(hi)))) {
            Some((lo, hi)) if lo != hi || lo != median => format!("{median} ({lo}..{hi})"),
            _ => median,
        }
    };
    for unit in &summary.units {
        let _ = writeln!(
            md,
            "### cost: {} (per {}; N = {} under callgrind, median of {} pairs of windows; N = {} under perf, median of {})\n",
            unit.name,
            unit.per,
            unit.n,
            unit.rounds.unwrap_or(1),
            unit.n_perf,
            unit.rounds_perf.unwrap_or(1),
        );
        let mut t = Table::new(&[
            "contender".to_string(),
            "instructions".into(),
            "syscalls".into(),
            format!("top {TOP_SYSCALLS} syscalls"),
            "context switches".into(),
            "preemptions".into(),
            "allocations".into(),
            "path".into(),
        ]);
        for c in &unit.contenders {
            t.row([
                c.name.clone(),
                fmt(c.instructions, c.spread.instructions),
                fmt(c.syscalls, c.spread.syscalls),
                top_syscalls(&c.syscalls_by_name),
                fmt(c.context_switches, c.spread.context_switches),
                fmt(c.preemptions, c.spread.preemptions),
                fmt(c.allocations, c.spread.allocations),
                c.path.clone(),
            ]);
        }
        let atunnel = unit.contenders.iter().find(|c| c.name == "atunnel");
        for peer in unit.contenders.iter().filter(|c| c.name != "atunnel") {
            let Some(a) = atunnel else { break };
            let ratio = |count: fn(&ContenderCounts) -> Option<f64>| match (count(a), count(peer)) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "n/a".into(),
            };
            t.row([
                format!("atunnel / {}", peer.name),
                ratio(|c| c.instructions),
                ratio(|c| c.syscalls),
                String::new(),
                ratio(|c| c.context_switches),
                String::new(),
                "n/a".into(),
                String::new(),
            ]);
        }
        md.push_str(&t.end());
    }
    md
}

/// The top syscalls by name, `name count` each, the most first.
pub(super) fn top_syscalls(by_name: &BTreeMap<String, f64>) -> String {
    let mut v: Vec<(&String, f64)> = by_name.iter().map(|(k, v)| (k, *v)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter()
        .take(TOP_SYSCALLS)
        .map(|(k, n)| format!("{k} {n:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_the_median_of_the_pairs_with_their_range() {
        let s = Spread::of(&[84_500.0, 84_300.0, 91_000.0]).expect("some");
        assert_eq!(
            s,
            Spread {
                median: 84_500.0,
                min: 84_300.0,
                max: 91_000.0
            }
        );
        assert_eq!(Spread::of(&[2.0, 4.0]).map(|s| s.median), Some(3.0));
        assert_eq!(Spread::of(&[f64::NAN]), None);
    }

    #[test]
    fn the_report_carries_each_figures_spread_beside_it_and_json_keeps_its_fields() {
        let mut r = PerUnit::default();
        for (i, s, c) in [
            (84_500.0, 6.0, 2.0),
            (84_300.0, 6.1, 2.0),
            (91_000.0, 6.0, 2.0),
        ] {
            r.push("instructions", i);
            r.push("syscalls", s);
            r.push("context_switches", c);
            r.push("sys:writev", 2.0);
        }
        let measured = vec![(
            Contender::Atunnel,
            BTreeMap::from([(Unit::IngressHttps.name(), r)]),
        )];
        let summary = summary(&[Unit::IngressHttps], true, &measured);
        let json = serde_json::to_value(&summary).expect("JSON");
        let c = &json["units"][0]["contenders"][0];
        for key in [
            "name",
            "instructions",
            "syscalls",
            "syscalls_by_name",
            "context_switches",
            "allocations",
        ] {
            assert!(c.get(key).is_some(), "{key} missing: {c}");
        }
        assert_eq!(c["instructions"], serde_json::json!(84_500.0));
        assert_eq!(
            c["spread"]["instructions"],
            serde_json::json!([84_300.0, 91_000.0])
        );
        assert_eq!(c["syscalls_by_name"]["writev"], serde_json::json!(2.0));
        let md = report_section(&summary);
        assert!(md.contains("| 84500 (84300..91000) |"), "{md}");
        assert!(md.contains("| 6.00 (6.00..6.10) |"), "{md}");
        // A count every pair agreed on stands alone.
        assert!(md.contains("| 2.00 |"), "{md}");
    }
}
