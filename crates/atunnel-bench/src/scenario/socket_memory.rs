//! socket-memory's summary: the memory one stalled connection holds on the
//! proxy holding it, per case.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub cases: Vec<Case>,
    /// Stalled connections per case.
    pub conns: usize,
    /// Measurements per case (their median is the figure).
    pub repeats: usize,
    /// A stalled connection passes at or under this much heap plus kernel.
    pub bound_kib: Option<f64>,
    /// Bulk throughput with the same flags, one run.
    pub throughput_mb_per_s: f64,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::SocketMemory;
}

/// One stall case on one proxy, per stalled connection over the proxy's
/// idle baseline; a figure not measured is `None` (null).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Case {
    /// "actor-stops-reading", "destination-stops-reading", ...
    pub case: String,
    /// The proxy holding the stalled connection: "atunnel" or "gateway".
    pub measured: String,
    pub kernel_kib: Option<f64>,
    pub heap_kib: Option<f64>,
    pub total_kib: Option<f64>,
    /// The kernel's share split by queue.
    pub parts_kib: Parts,
    /// Whether the total is within the bound.
    pub pass: Option<bool>,
}

/// Kernel socket memory by where it is (SO_MEMINFO).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Parts {
    pub receive: Option<f64>,
    pub send: Option<f64>,
    pub reserved: Option<f64>,
}
