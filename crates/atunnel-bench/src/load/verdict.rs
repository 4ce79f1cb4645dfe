//! Each rung's verdict: what, if anything, limited it.
//!
//! The rules, tried in this order; the first that holds is the verdict:
//!
//! 1. **`tunnel-died`** — the tunnel process exited (or was killed) during
//!    the rung.
//! 2. **`tunnel-cpu`** — the tunnel used at least 90 % of its CPU quota
//!    (`tunnel_cpu_cores >= 0.9 * tunnel_cpu_quota`), or its cgroup was
//!    throttled during the rung.
//! 3. **`generator`** — the load generator used at least 90 % of the CPU it
//!    has, or its dispatch lag p99 was over 10 ms, or it shed any unit
//!    (more than `max_in_flight` were running when one came due).
//! 4. **`far-end`** — the far end (the upstream server or the client behind
//!    the tunnel) used at least 90 % of the CPU it has.
//! 5. **`errors`** — more than 1 % of finished units failed
//!    (`errors > 1 % of completed + errors`), or, when fewer than 100 units
//!    finished, any unit failed.
//! 6. **`ok`** — none of the above.
//!
//! A quota or an amount of CPU "available" that is zero, negative or not a
//! number means "unknown / unlimited", and its rule is skipped.
//!
//! Why this order: what is measured is the tunnel, so its own limits come
//! first. A tunnel that died or ran out of CPU explains everything after it —
//! errors, a generator falling behind while it waited on a stalled socket, a
//! far end that looked busy — and naming it is the point of the run. Only
//! when the tunnel had room do the other participants' limits say the number
//! is not the tunnel's: a saturated generator or far end means the rung
//! measured them, and the rung is not evidence against the tunnel. Errors
//! come last because they are a symptom whose cause, if any was seen, the
//! earlier rules already named.
//!
//! A rung can be `ok` and still not have kept up (achieved below offered
//! without any limit seen); [`sustainable_rate`] only counts rungs that are
//! `ok` *and* achieved at least 99 % of what was offered.

use serde::{Deserialize, Serialize};

use atunnel_measure::schedule::RungOutcome;

/// The share of a CPU budget at which a participant counts as saturated.
pub const CPU_SATURATED: f64 = 0.9;
/// The dispatch lag p99 above which the generator counts as behind.
pub const DISPATCH_LAG_P99_MAX_US: u64 = 10_000;
/// The failed share of finished units above which a rung is `errors`.
pub const ERROR_SHARE_MAX: f64 = 0.01;
/// Below this many finished units, any error makes the rung `errors`.
pub const ERRORS_SMALL_SAMPLE: u64 = 100;
/// The share of the offered rate a rung must achieve to be sustainable.
pub const SUSTAINED_SHARE: f64 = 0.99;

/// What limited a rung, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Ok,
    TunnelCpu,
    Generator,
    FarEnd,
    Errors,
    TunnelDied,
}

impl Verdict {
    /// The name written in the results (`ok`, `tunnel-cpu`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::TunnelCpu => "tunnel-cpu",
            Verdict::Generator => "generator",
            Verdict::FarEnd => "far-end",
            Verdict::Errors => "errors",
            Verdict::TunnelDied => "tunnel-died",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What was seen during one rung. CPU figures are in cores (CPU-seconds per
/// second) averaged over the rung.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RungEvidence {
    pub offered: f64,
    pub achieved: f64,
    pub errors: u64,
    pub completed: u64,
    pub shed: u64,
    pub dispatch_lag_p99_us: u64,
    pub tunnel_cpu_cores: f64,
    /// The tunnel cgroup's CPU quota in cores (0 = unlimited / unknown).
    pub tunnel_cpu_quota: f64,
    /// Whether the tunnel's cgroup was throttled during the rung.
    pub tunnel_throttled: bool,
    pub generator_cpu_cores: f64,
    /// The cores the generator may use (0 = unknown).
    pub generator_cpu_available: f64,
    pub far_end_cpu_cores: f64,
    /// The cores the far end may use (0 = unknown).
    pub far_end_cpu_available: f64,
    pub tunnel_died: bool,
}

impl RungEvidence {
    /// What the scheduler counted of a rung: its rates, units and dispatch
    /// lag; CPU figures zero (unknown) and the tunnel alive until the caller
    /// adds what it measured around the rung.
    pub fn of(out: &RungOutcome) -> Self {
        RungEvidence {
            offered: out.offered,
            achieved: out.achieved,
            errors: out.errors,
            completed: out.completed,
            shed: out.shed,
            dispatch_lag_p99_us: out.dispatch_lag_p99_us(),
            ..RungEvidence::default()
        }
    }
}

/// The rung's verdict by the rules in the module doc.
pub fn verdict(e: &RungEvidence) -> Verdict {
    if e.tunnel_died {
        return Verdict::TunnelDied;
    }
    if e.tunnel_throttled || saturated(e.tunnel_cpu_cores, e.tunnel_cpu_quota) {
        return Verdict::TunnelCpu;
    }
    if saturated(e.generator_cpu_cores, e.generator_cpu_available)
        || e.dispatch_lag_p99_us > DISPATCH_LAG_P99_MAX_US
        || e.shed > 0
    {
        return Verdict::Generator;
    }
    if saturated(e.far_end_cpu_cores, e.far_end_cpu_available) {
        return Verdict::FarEnd;
    }
    let finished = e.completed.saturating_add(e.errors);
    let too_many_errors = if finished < ERRORS_SMALL_SAMPLE {
        e.errors > 0
    } else {
        e.errors as f64 > ERROR_SHARE_MAX * finished as f64
    };
    if too_many_errors {
        return Verdict::Errors;
    }
    Verdict::Ok
}

/// Whether `used` is at least 90 % of a known, positive `budget`.
fn saturated(used: f64, budget: f64) -> bool {
    budget.is_finite() && budget > 0.0 && used >= CPU_SATURATED * budget
}

/// The highest rung that is Ok with achieved >= 0.99 x offered, as offered rate.
///
/// Rungs are `(offered, achieved, verdict)` in any order; a higher rung that
/// is not `ok` (or did not keep up) does not count against a lower one.
pub fn sustainable_rate(rungs: &[(f64 /*offered*/, f64 /*achieved*/, Verdict)]) -> Option<f64> {
    rungs
        .iter()
        .filter(|&&(offered, achieved, v)| {
            v == Verdict::Ok && offered.is_finite() && achieved >= SUSTAINED_SHARE * offered
        })
        .map(|&(offered, _, _)| offered)
        .fold(None, |best: Option<f64>, o| {
            Some(best.map_or(o, |b| b.max(o)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rung where every participant had room and nothing failed.
    fn healthy() -> RungEvidence {
        RungEvidence {
            offered: 1000.0,
            achieved: 1000.0,
            errors: 0,
            completed: 10_000,
            shed: 0,
            dispatch_lag_p99_us: 200,
            tunnel_cpu_cores: 0.5,
            tunnel_cpu_quota: 1.0,
            tunnel_throttled: false,
            generator_cpu_cores: 0.3,
            generator_cpu_available: 1.0,
            far_end_cpu_cores: 0.2,
            far_end_cpu_available: 1.0,
            tunnel_died: false,
        }
    }

    #[test]
    fn healthy_rung_is_ok() {
        assert_eq!(verdict(&healthy()), Verdict::Ok);
    }

    #[test]
    fn tunnel_died_is_tunnel_died() {
        let e = RungEvidence {
            tunnel_died: true,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::TunnelDied);
    }

    #[test]
    fn tunnel_at_90_percent_of_quota_is_tunnel_cpu() {
        let e = RungEvidence {
            tunnel_cpu_cores: 0.9,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::TunnelCpu);
        let e = RungEvidence {
            tunnel_cpu_cores: 0.89,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::Ok);
    }

    #[test]
    fn tunnel_throttled_is_tunnel_cpu() {
        let e = RungEvidence {
            tunnel_throttled: true,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::TunnelCpu);
    }

    #[test]
    fn unknown_quota_skips_the_cpu_rule() {
        let e = RungEvidence {
            tunnel_cpu_cores: 3.0,
            tunnel_cpu_quota: 0.0,
            generator_cpu_cores: 3.0,
            generator_cpu_available: 0.0,
            far_end_cpu_cores: 3.0,
            far_end_cpu_available: f64::NAN,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::Ok);
    }

    #[test]
    fn generator_cpu_lag_or_shed_is_generator() {
        let cpu = RungEvidence {
            generator_cpu_cores: 0.95,
            ..healthy()
        };
        let lag = RungEvidence {
            dispatch_lag_p99_us: 10_001,
            ..healthy()
        };
        let lag_at_limit = RungEvidence {
            dispatch_lag_p99_us: 10_000,
            ..healthy()
        };
        let shed = RungEvidence {
            shed: 1,
            ..healthy()
        };
        assert_eq!(verdict(&cpu), Verdict::Generator);
        assert_eq!(verdict(&lag), Verdict::Generator);
        assert_eq!(verdict(&lag_at_limit), Verdict::Ok);
        assert_eq!(verdict(&shed), Verdict::Generator);
    }

    #[test]
    fn far_end_cpu_is_far_end() {
        let e = RungEvidence {
            far_end_cpu_cores: 1.8,
            far_end_cpu_available: 2.0,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::FarEnd);
    }

    #[test]
    fn errors_over_one_percent_are_errors() {
        let at_one_percent = RungEvidence {
            completed: 990,
            errors: 10,
            ..healthy()
        };
        let over = RungEvidence {
            completed: 989,
            errors: 11,
            ..healthy()
        };
        assert_eq!(verdict(&at_one_percent), Verdict::Ok);
        assert_eq!(verdict(&over), Verdict::Errors);
    }

    #[test]
    fn any_error_in_fewer_than_100_units_is_errors() {
        let e = RungEvidence {
            completed: 98,
            errors: 1,
            ..healthy()
        };
        assert_eq!(verdict(&e), Verdict::Errors);
        let all_failed = RungEvidence {
            completed: 0,
            errors: 5,
            ..healthy()
        };
        assert_eq!(verdict(&all_failed), Verdict::Errors);
    }

    #[test]
    fn earlier_rules_win_in_order() {
        let everything = RungEvidence {
            tunnel_died: true,
            tunnel_throttled: true,
            tunnel_cpu_cores: 1.0,
            shed: 5,
            dispatch_lag_p99_us: 50_000,
            generator_cpu_cores: 1.0,
            far_end_cpu_cores: 1.0,
            errors: 5_000,
            ..healthy()
        };
        assert_eq!(verdict(&everything), Verdict::TunnelDied);
        let e = RungEvidence {
            tunnel_died: false,
            ..everything.clone()
        };
        assert_eq!(verdict(&e), Verdict::TunnelCpu);
        let e = RungEvidence {
            tunnel_throttled: false,
            tunnel_cpu_cores: 0.1,
            ..e
        };
        assert_eq!(verdict(&e), Verdict::Generator);
        let e = RungEvidence {
            shed: 0,
            dispatch_lag_p99_us: 0,
            generator_cpu_cores: 0.1,
            ..e
        };
        assert_eq!(verdict(&e), Verdict::FarEnd);
        let e = RungEvidence {
            far_end_cpu_cores: 0.1,
            ..e
        };
        assert_eq!(verdict(&e), Verdict::Errors);
        let e = RungEvidence { errors: 0, ..e };
        assert_eq!(verdict(&e), Verdict::Ok);
    }

    #[test]
    fn verdicts_serialize_kebab_case() {
        let all = [
            Verdict::Ok,
            Verdict::TunnelCpu,
            Verdict::Generator,
            Verdict::FarEnd,
            Verdict::Errors,
            Verdict::TunnelDied,
        ];
        for v in all {
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.as_str()));
            assert_eq!(serde_json::from_str::<Verdict>(&json).unwrap(), v);
        }
    }

    #[test]
    fn sustainable_rate_is_highest_ok_rung_that_kept_up() {
        let rungs = [
            (1000.0, 1000.0, Verdict::Ok),
            (2000.0, 1995.0, Verdict::Ok),
            (4000.0, 3900.0, Verdict::Ok), // ok but fell short of 99 %
            (8000.0, 8000.0, Verdict::TunnelCpu),
            (16000.0, 9000.0, Verdict::Errors),
        ];
        assert_eq!(sustainable_rate(&rungs), Some(2000.0));
    }

    #[test]
    fn sustainable_rate_ignores_order_and_higher_non_ok_rungs() {
        let rungs = [
            (3000.0, 3000.0, Verdict::Generator),
            (500.0, 500.0, Verdict::Ok),
            (1500.0, 1490.0, Verdict::Ok),
        ];
        assert_eq!(sustainable_rate(&rungs), Some(1500.0));
    }

    #[test]
    fn sustainable_rate_is_none_without_an_ok_rung() {
        assert_eq!(sustainable_rate(&[]), None);
        assert_eq!(
            sustainable_rate(&[(100.0, 100.0, Verdict::FarEnd), (200.0, 150.0, Verdict::Ok)]),
            None
        );
    }
}
