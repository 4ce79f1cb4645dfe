//! The results schema and the report files made from it.
//!
//! - `results.json` — what other tools read; the field names below are a
//!   contract (`scenarios[].name/rungs/summary`, each rung's `offered`,
//!   `achieved`, `errors`, `verdict`, `tunnel_cpu_cores`,
//!   `tunnel_heap_bytes`, `tunnel_cgroup_bytes`, `latency_us.{p50,p99,max}`).
//!   Extra fields (`shed`, `dispatch_lag_p99_us`, `notes`) may be added but
//!   the required ones are never renamed. Each scenario's `summary` is its
//!   `Summary` in `crate::scenario::<name>`, whose field names are the keys.
//! - `results.txt` — one aligned table per scenario plus its summary: what a
//!   person reads first.
//! - `<scenario>.svg` and `<scenario>.<figure>.svg` — the plots, drawn by
//!   [`super::plots`] (plotters, SVG backend).

mod comparison;
mod text;

pub use comparison::*;
pub use text::*;

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

pub use super::rung::{Latency, RungResult};
use super::verdict::sustainable_rate;
use crate::scenario::{Measured, Scenario, ScenarioSummary, cost};

const MIB: f64 = 1024.0 * 1024.0;

/// Everything one run measured.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Results {
    pub scenarios: Vec<ScenarioResult>,
    /// Ablations: the same egress scenarios under each variant of one
    /// setting, run against fresh atunnels in the same run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comparisons: Vec<Comparison>,
    /// The cost scenario's summary again (`units[]`, each with its
    /// `contenders[]`' counts per unit of work), where other tools look
    /// for it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "keys_sorted"
    )]
    pub cost: Option<cost::Summary>,
}

impl Results {
    /// The run's own result of `S`'s scenario, read as `S`.
    pub fn summary<S: ScenarioSummary>(&self) -> Option<S> {
        find(&self.scenarios, S::SCENARIO)?.summary()
    }

    /// `S`'s scenario as each contender of the run measured it: atunnel
    /// with the run's flags, then each variant of each comparison.
    pub fn measured<S: ScenarioSummary>(&self) -> Vec<Measured<'_, S>> {
        let mut out: Vec<Measured<S>> = find(&self.scenarios, S::SCENARIO)
            .map(|s| measured("atunnel".to_string(), s))
            .into_iter()
            .collect();
        for c in &self.comparisons {
            for v in &c.variants {
                if let Some(s) = find(&v.scenarios, S::SCENARIO) {
                    out.push(measured(format!("{} ({})", v.label, c.name), s));
                }
            }
        }
        out
    }
}

fn measured<S: ScenarioSummary>(label: String, s: &ScenarioResult) -> Measured<'_, S> {
    Measured {
        label,
        summary: s.summary(),
        rungs: &s.rungs,
    }
}

/// The first result of `scenario` in `scenarios`.
pub(super) fn find(scenarios: &[ScenarioResult], scenario: Scenario) -> Option<&ScenarioResult> {
    scenarios.iter().find(|s| s.name == scenario.name())
}

/// One scenario: its ladder of rungs (possibly none) and its summary, the
/// scenario's `Summary` (e.g. egress-idle's `{"conns",
/// "heap_bytes_per_conn", ...}`), written and read only as that type.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ScenarioResult {
    pub name: String,
    #[serde(default)]
    pub rungs: Vec<RungResult>,
    /// Kept as JSON so that every result, of any scenario (or of a newer
    /// bench), is written back as it was read and printed whole
    /// ([`text`]); typed only through [`ScenarioResult::new`] and
    /// [`ScenarioResult::summary`].
    #[serde(default = "empty_object")]
    summary: Value,
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

impl ScenarioResult {
    /// `S::SCENARIO`'s result: its summary, rungs and notes.
    pub fn new<S: ScenarioSummary>(
        summary: &S,
        rungs: Vec<RungResult>,
        notes: Vec<String>,
    ) -> Self {
        ScenarioResult {
            name: S::SCENARIO.name().to_string(),
            rungs,
            summary: serde_json::to_value(summary)
                .expect("a summary is plain data: numbers, strings, lists and string-keyed maps"),
            notes,
        }
    }

    /// `scenario`'s result with no summary: it failed before it had one
    /// (`notes` say why).
    pub fn without_summary(scenario: Scenario, notes: Vec<String>) -> Self {
        ScenarioResult {
            name: scenario.name().to_string(),
            notes,
            ..ScenarioResult::default()
        }
    }

    /// The summary as `S`; `None` when this is another scenario's result,
    /// when it has none (the scenario failed), or when it does not read as
    /// `S`.
    pub fn summary<S: ScenarioSummary>(&self) -> Option<S> {
        let empty = self.summary.as_object().is_none_or(|m| m.is_empty());
        if self.name != S::SCENARIO.name() || empty {
            return None;
        }
        // A summary this bench wrote that no longer reads would drop its
        // report section and plots without a word: say so.
        S::deserialize(&self.summary)
            .inspect_err(
                |e| tracing::warn!(scenario = %self.name, error = %e, "summary does not read"),
            )
            .ok()
    }

    /// The summary as one line of JSON (the console and report.md show it
    /// whole).
    pub fn summary_json(&self) -> String {
        self.summary.to_string()
    }
}

/// Writes `value` with its maps' keys in order, as a `serde_json::Value`
/// (and so every scenario's summary) writes them.
fn keys_sorted<T: Serialize, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(value)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::plots::{self, write_plots};
    use crate::load::verdict::Verdict;
    use crate::scenario::{PerFamily, socket_memory};
    use crate::scenario::{egress_http, egress_idle, egress_tcp, ingress_https, ingress_idle};
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

    fn stall(
        case: &str,
        measured: &str,
        kernel: f64,
        heap: f64,
        pass: bool,
    ) -> socket_memory::Case {
        socket_memory::Case {
            case: case.into(),
            measured: measured.into(),
            kernel_kib: Some(kernel),
            heap_kib: Some(heap),
            total_kib: Some(kernel + heap),
            pass: Some(pass),
            ..Default::default()
        }
    }

    fn sample() -> Results {
        let mut last = rung(8000.0, Verdict::TunnelCpu);
        last.notes = "throttled 12 times".to_string();
        Results {
            scenarios: vec![
                ScenarioResult::new(
                    &egress_http::Summary {
                        cores_at_8000_rps: Some(0.8123456),
                        connections: 64,
                        sustainable_rps: Some(2000.0),
                    },
                    vec![
                        rung(1000.0, Verdict::Ok),
                        rung(2000.0, Verdict::Ok),
                        rung(4000.0, Verdict::Generator),
                        last,
                    ],
                    vec![],
                ),
                ScenarioResult::new(
                    &socket_memory::Summary {
                        cases: vec![
                            stall("actor-stops-reading", "atunnel", 20.0, 2.0, true),
                            stall("destination-stops-reading", "gateway", 4096.0, 8.0, false),
                        ],
                        bound_kib: Some(64.0),
                        ..Default::default()
                    },
                    vec![],
                    vec!["run as root for SO_RCVLOWAT".to_string()],
                ),
            ],
            comparisons: Vec::new(),
            cost: None,
        }
    }

    #[test]
    fn a_comparison_prints_one_row_per_variant_side_by_side() {
        let variant = |label: &str, heap: f64, cores: f64| Variant {
            label: label.to_string(),
            flags: vec![format!("--copy-mode={label}")],
            scenarios: vec![
                ScenarioResult::new(
                    &egress_idle::Summary {
                        heap_bytes_per_conn: heap,
                        cgroup_bytes_per_conn: 5600.0,
                        tasks_per_conn: 1.0,
                        ..Default::default()
                    },
                    vec![],
                    vec![],
                ),
                ScenarioResult::new(
                    &egress_http::Summary {
                        cores_at_8000_rps: Some(cores),
                        ..Default::default()
                    },
                    vec![],
                    vec![],
                ),
                ScenarioResult::new(
                    &egress_tcp::Summary {
                        runs: PerFamily {
                            ipv4: egress_tcp::Runs {
                                mb_per_s: vec![500.0, 510.0, 490.0],
                                ..Default::default()
                            },
                            ipv6: None,
                        },
                        ..Default::default()
                    },
                    vec![],
                    vec![],
                ),
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
            cost: None,
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

    #[test]
    fn a_peers_comparison_prints_atunnel_to_peer_ratios() {
        let variant = |label: &str,
                       rps: f64,
                       cpu: f64,
                       (sat_rps, sat_cpu): (f64, f64),
                       h1: f64,
                       hibernated: Option<f64>,
                       egress: Option<f64>| {
            let case = |name: &str, cgroup: f64, hibernated: Option<f64>| ingress_idle::Case {
                case: name.into(),
                cgroup_bytes_per_conn: cgroup,
                hibernated_cgroup_bytes_per_conn: hibernated,
                ..Default::default()
            };
            let mut scenarios = vec![
                ScenarioResult::new(
                    &ingress_https::Summary {
                        sustainable_rps: Some(rps),
                        cpu_us_per_request: Some(999.0),
                        saturated: Some(ingress_https::Saturated {
                            streams_in_flight: 128,
                            rps: sat_rps,
                            cpu_us_per_request: Some(sat_cpu),
                            ..Default::default()
                        }),
                        new_upstream_conns_per_1000: None,
                    },
                    // Kept up with 1,000/s and 2,000/s (CPU per
                    // request `cpu` at 2,000/s), not 4,000/s.
                    [1000.0, 2000.0, 4000.0]
                        .into_iter()
                        .map(|offered: f64| RungResult {
                            achieved: offered.min(rps),
                            tunnel_cpu_cores: cpu * offered.min(rps) / 1e6,
                            ..rung(offered, Verdict::Ok)
                        })
                        .collect(),
                    vec![],
                ),
                ScenarioResult::new(
                    &ingress_idle::Summary {
                        cases: vec![
                            case("http1-keepalive-short", h1, hibernated),
                            case("http2-one-request", 2.0 * h1, None),
                        ],
                        ..Default::default()
                    },
                    vec![],
                    vec![],
                ),
            ];
            if let Some(mb) = egress {
                let mut tcp = egress_tcp::Summary::default();
                tcp.runs.ipv4.mb_per_tunnel_cpu_s_median = Some(mb);
                scenarios.push(ScenarioResult::new(&tcp, vec![], vec![]));
            }
            Variant {
                label: label.to_string(),
                flags: Vec::new(),
                scenarios,
            }
        };
        let c = Comparison {
            name: "peers".into(),
            variants: vec![
                variant(
                    "atunnel",
                    4000.0,
                    17.1,
                    (50000.0, 20.0),
                    8000.0,
                    Some(2000.0),
                    Some(1050.0),
                ),
                variant("nginx", 4000.0, 13.2, (40000.0, 10.0), 25000.0, None, None),
                variant(
                    "haproxy",
                    2000.0,
                    7.5,
                    (80000.0, 8.0),
                    26000.0,
                    None,
                    Some(840.0),
                ),
            ],
        };
        let txt = render_txt(&Results {
            scenarios: Vec::new(),
            comparisons: vec![c],
            cost: None,
        });
        assert!(txt.contains("== compare peers (ingress"), "{txt}");
        // Compared where all three kept up, not at the summaries' figure.
        assert!(txt.contains("CPU us/req at 2000/s"), "{txt}");
        let row = |label: &str| -> Vec<String> {
            txt.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} row in\n{txt}"))
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert!(txt.contains("sat: 128 requests in flight"), "{txt}");
        assert!(txt.contains("egress MB/CPU-s: egress-tcp's"), "{txt}");
        // label, req/s, ratio, CPU, ratio, saturated req/s, ratio, saturated
        // CPU, ratio, h1, ratio, h2, ratio, egress MB per CPU-second, ratio,
        // hibernated
        assert_eq!(
            row("atunnel"),
            [
                "atunnel", "4000", "1.00", "17.1", "1.00", "50000", "1.00", "20", "1.00", "8000",
                "1.00", "16000", "1.00", "1050", "1.00", "2000"
            ]
        );
        assert_eq!(
            row("nginx"),
            [
                "nginx", "4000", "1.00", "13.2", "1.30", "40000", "1.25", "10", "2.00", "25000",
                "0.32", "50000", "0.32", "-", "-", "-"
            ]
        );
        assert_eq!(
            row("haproxy"),
            [
                "haproxy", "2000", "2.00", "7.5", "2.28", "80000", "0.62", "8", "2.50", "26000",
                "0.31", "52000", "0.31", "840", "1.25", "-"
            ]
        );
    }

    fn keys(v: &Value) -> BTreeSet<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn latency_from_histogram_reads_p50_p99_max() {
        let mut h = atunnel_measure::schedule::new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 100).unwrap();
        }
        let l = Latency::from_histogram(&h);
        assert!((49_900..=50_100).contains(&l.p50), "{l:?}");
        assert!((98_900..=99_100).contains(&l.p99), "{l:?}");
        assert!((99_950..=100_100).contains(&l.max), "{l:?}");
        let empty = atunnel_measure::schedule::new_histogram();
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
        assert_eq!(scenarios[1]["summary"]["cases"][1]["total_kib"], 4104.0);
    }

    #[test]
    fn a_summary_reads_back_only_as_its_own_scenarios_type() {
        let r = sample();
        let http = r.summary::<egress_http::Summary>().expect("egress-http's");
        assert_eq!(http.cores_at_8000_rps, Some(0.8123456));
        assert_eq!(r.scenarios[0].summary::<egress_idle::Summary>(), None);
        let memory = r
            .summary::<socket_memory::Summary>()
            .expect("socket-memory's");
        assert_eq!(memory.cases[1].total_kib, Some(4104.0));
        // A scenario that failed has no summary, not a summary of zeros.
        let failed = ScenarioResult::without_summary(Scenario::EgressIdle, vec!["x".into()]);
        assert_eq!(failed.summary::<egress_idle::Summary>(), None);
        // A file written before a field was added still reads.
        let old: ScenarioResult = serde_json::from_str(
            r#"{"name": "egress-idle", "summary": {"conns": 10, "heap_bytes_per_conn": 1500.0}}"#,
        )
        .expect("JSON");
        let old = old.summary::<egress_idle::Summary>().expect("read");
        assert_eq!(
            (old.conns, old.heap_bytes_per_conn, old.tasks_per_conn),
            (10, 1500.0, 0.0)
        );
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
            "case=actor-stops-reading heap_kib=2 kernel_kib=20 measured=atunnel parts_kib=receive=- reserved=- send=- pass=true total_kib=22",
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
        // The ladder of the scenario with rungs, its CPU per request, and
        // socket-memory's stall memory (it has cases but no rungs).
        assert_eq!(
            paths,
            vec![
                dir.path().join("egress-http.svg"),
                dir.path().join("egress-http.cpu-per-request.svg"),
                dir.path().join("socket-memory.stall-memory.svg"),
            ],
        );
        let svg = fs::read_to_string(&paths[0]).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // Three panels of one series each, four rungs: a line and four
        // markers per panel, and a red ring per rung whose verdict is not
        // ok (two of the four).
        let line = r##"<polyline fill="none" opacity="1" stroke="#1F77B4" stroke-width="2""##;
        assert_eq!(svg.matches(line).count(), 3, "{svg}");
        assert_eq!(svg.matches(r##"<circle"##).count(), 3 * 4 + 3 * 2, "{svg}");
        assert_eq!(svg.matches(r##"stroke="#D62728""##).count(), 3 * 2, "{svg}");
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
        let dir = tempfile::tempdir().unwrap();
        let results = Results {
            scenarios: vec![s],
            comparisons: Vec::new(),
            cost: None,
        };
        let paths = write_plots(dir.path(), &results).unwrap();
        assert_eq!(paths, vec![dir.path().join("a_b____c_.svg")]);
        let svg = fs::read_to_string(&paths[0]).unwrap();
        assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert_eq!(plots::file_stem("../x"), "___x");
    }
}
