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

/// The run folder's `cost` part: per unit, each contender's counts.
pub(super) fn units_json(
    units: &[Unit],
    quick: bool,
    measured: &[(Contender, BTreeMap<&'static str, PerUnit>)],
) -> Value {
    let units: Vec<Value> = units
        .iter()
        .map(|u| {
            let contenders: Vec<Value> = measured
                .iter()
                .filter_map(|(c, m)| {
                    let r = m.get(u.name())?;
                    let by_name: serde_json::Map<String, Value> = r
                        .rounds
                        .keys()
                        .filter_map(|k| {
                            let name = k.strip_prefix("sys:")?;
                            let v = r.get(k)?.median;
                            (v.abs() >= 0.005).then(|| (name.to_string(), json!(round2(v))))
                        })
                        .collect();
                    let median = |k: &str, round: fn(f64) -> f64| r.get(k).map(|s| round(s.median));
                    // [min, max] of the pairs' estimates, beside each median.
                    let spread: serde_json::Map<String, Value> = [
                        ("instructions", f64::round as fn(f64) -> f64),
                        ("syscalls", round2),
                        ("context_switches", round2),
                        ("preemptions", round2),
                        ("allocations", round2),
                    ]
                    .into_iter()
                    .filter_map(|(k, round)| {
                        let s = r.get(k)?;
                        Some((k.to_string(), json!([round(s.min), round(s.max)])))
                    })
                    .collect();
                    Some(json!({
                        "name": c.name(),
                        "path": path_of(*c, *u),
                        "instructions": median("instructions", f64::round),
                        "syscalls": median("syscalls", round2),
                        "syscalls_by_name": by_name,
                        "context_switches": median("context_switches", round2),
                        "preemptions": median("preemptions", round2),
                        "allocations": median("allocations", round2),
                        "spread": spread,
                    }))
                })
                .collect();
            json!({
                "name": u.name(),
                "per": u.per(),
                "n": u.count(Pass::Callgrind, quick),
                "n_perf": u.count(Pass::Perf, quick),
                "rounds": rounds(*u, Pass::Callgrind, quick),
                "rounds_perf": rounds(*u, Pass::Perf, quick),
                "contenders": contenders,
            })
        })
        .collect();
    json!({ "units": units })
}

/// report.md's tables: per unit, each contender's counts (the median over
/// the pairs of windows, their range in brackets) and atunnel's ratio to it.
pub fn report_section(summary: &Value) -> String {
    use std::fmt::Write;
    let mut md = String::new();
    let num = |v: &Value| match v.as_f64() {
        Some(x) if x.abs() >= 1000.0 => format!("{:.0}", x),
        Some(x) => format!("{x:.2}"),
        None => "n/a".into(),
    };
    // `key`'s median and, when the pairs disagreed, their min..max.
    let fmt = |c: &Value, key: &str| {
        let median = num(&c[key]);
        match c["spread"][key]
            .as_array()
            .map(|r| (num(&r[0]), num(&r[1])))
        {
            Some((lo, hi)) if lo != hi || lo != median => format!("{median} ({lo}..{hi})"),
            _ => median,
        }
    };
    for unit in summary["units"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "### cost: {} (per {}; N = {} under callgrind, median of {} pairs of windows; N = {} under perf, median of {})\n",
            unit["name"].as_str().unwrap_or(""),
            unit["per"].as_str().unwrap_or(""),
            unit["n"],
            unit["rounds"].as_u64().unwrap_or(1),
            unit["n_perf"],
            unit["rounds_perf"].as_u64().unwrap_or(1),
        );
        let _ = writeln!(
            md,
            "| contender | instructions | syscalls | top {TOP_SYSCALLS} syscalls | context switches | preemptions | allocations | path |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        let contenders = unit["contenders"].as_array().cloned().unwrap_or_default();
        for c in &contenders {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                c["name"].as_str().unwrap_or(""),
                fmt(c, "instructions"),
                fmt(c, "syscalls"),
                top_syscalls(&c["syscalls_by_name"]),
                fmt(c, "context_switches"),
                fmt(c, "preemptions"),
                fmt(c, "allocations"),
                c["path"].as_str().unwrap_or(""),
            );
        }
        let atunnel = contenders.iter().find(|c| c["name"] == "atunnel");
        for peer in contenders.iter().filter(|c| c["name"] != "atunnel") {
            let Some(a) = atunnel else { break };
            let ratio = |k: &str| match (a[k].as_f64(), peer[k].as_f64()) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "n/a".into(),
            };
            let _ = writeln!(
                md,
                "| atunnel / {} | {} | {} | | {} | | n/a | |",
                peer["name"].as_str().unwrap_or(""),
                ratio("instructions"),
                ratio("syscalls"),
                ratio("context_switches"),
            );
        }
        let _ = writeln!(md);
    }
    md
}

/// The top syscalls by name, `name count` each, the most first.
pub(super) fn top_syscalls(by_name: &Value) -> String {
    let mut v: Vec<(&String, f64)> = by_name
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k, v.as_f64()?)))
        .collect();
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
        let summary = units_json(&[Unit::IngressHttps], true, &measured);
        let c = &summary["units"][0]["contenders"][0];
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
        assert_eq!(c["instructions"], json!(84_500.0));
        assert_eq!(c["spread"]["instructions"], json!([84_300.0, 91_000.0]));
        assert_eq!(c["syscalls_by_name"]["writev"], json!(2.0));
        let md = report_section(&summary);
        assert!(md.contains("| 84500 (84300..91000) |"), "{md}");
        assert!(md.contains("| 6.00 (6.00..6.10) |"), "{md}");
        // A count every pair agreed on stands alone.
        assert!(md.contains("| 2.00 |"), "{md}");
    }
}
