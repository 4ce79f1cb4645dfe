//! One rung of a scenario's ladder as results.json has it: what the
//! schedule counted, the verdict, and what the tunnel used.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::verdict::Verdict;
use atunnel_measure::schedule::RungOutcome;

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
