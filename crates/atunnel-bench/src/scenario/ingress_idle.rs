//! ingress-idle's summary: what an idle router connection costs atunnel,
//! awake and hibernated, per case.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};
use crate::load::confidence::{Conclusion, Counts, FigureSummary};

/// A peer in atunnel's place (`--compare peers`) writes one pass with
/// hibernation off, the HTTPS cases only, and none of the hibernation
/// fields (`None`, left out of the JSON).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// Connections held per case.
    pub conns: usize,
    /// The hibernation period of the pass with hibernation on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernate_after_s: Option<u64>,
    pub cases: Vec<Case>,
    /// Keep-alive requests per second with hibernation off and on.
    pub keepalive_rps: OffOn,
    pub keepalive_cores_per_1000_rps: OffOn,
    /// The worst of the cases' wake verdicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_verdict: Option<Conclusion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_verdicts: Option<Counts>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::IngressIdle;
}

/// A figure with hibernation off and on (`on`: atunnel's alone).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct OffOn {
    pub off: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on: Option<f64>,
}

/// One kind of idle connection, per connection: awake (hibernation off)
/// and, atunnel's, hibernated.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Case {
    /// "http1-keepalive-short", "http1-keepalive-page", "http2-one-request",
    /// "connect-tunnel".
    pub case: String,
    /// `None` for a peer (its heap is not in /stats).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heap_bytes_per_conn: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_heap_bytes_per_conn: Option<f64>,
    pub cgroup_bytes_per_conn: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_cgroup_bytes_per_conn: Option<f64>,
    /// atunnel's CPU while the connections went idle.
    pub idle_cpu_us_per_conn: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernated_idle_cpu_us_per_conn: Option<f64>,
    /// What hibernating adds: the hibernated idle CPU less the awake one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hibernating_cpu_us_per_conn: Option<f64>,
    /// The next request on each idle connection (awake).
    pub next_request_cpu_us: f64,
    pub next_request_p50_us: u64,
    pub next_request_p99_us: u64,
    /// The first request after waking (hibernated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_cpu_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_p50_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_p99_us: Option<u64>,
    /// Per round, the median first request after waking and the next one
    /// awake.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_rounds: Option<Vec<WakeRound>>,
    /// Woken / awake over the rounds, its interval and verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_request_after_wake_ratio: Option<FigureSummary>,
}

/// One round's medians; `awake_p50_us` is `None` when a connection had
/// hibernated again before its awake request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct WakeRound {
    pub woken_p50_us: u64,
    pub awake_p50_us: Option<u64>,
}
