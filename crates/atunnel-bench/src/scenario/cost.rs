//! cost's summary: what one unit of work costs each contender, in counts
//! (instructions, system calls, context switches, allocations).
//! results.json has it twice: as the scenario's summary and as its
//! top-level `cost`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub units: Vec<UnitCounts>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::Cost;
}

/// One unit of work and each contender's counts for it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct UnitCounts {
    /// "ingress-https", "egress-open", ...
    pub name: String,
    /// What one unit is ("request (router h2 -> actor h1, 64 B answer)").
    pub per: String,
    /// N: units in the smaller window under callgrind (the larger has 2N),
    /// and under perf.
    pub n: u64,
    pub n_perf: u64,
    /// Pairs of windows whose median each count is; files written before
    /// they were counted have one.
    pub rounds: Option<u64>,
    pub rounds_perf: Option<u64>,
    pub contenders: Vec<ContenderCounts>,
}

/// One contender's counts per unit: the median over the pairs of windows.
/// `None` (null) for a count not measured (a peer's allocations; the
/// instructions of a pass that did not run).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ContenderCounts {
    /// "atunnel", "nginx", "haproxy".
    pub name: String,
    /// The way its units took to the actors or the far end.
    pub path: String,
    pub instructions: Option<f64>,
    pub syscalls: Option<f64>,
    /// The system calls by name (those of at least 0.005 per unit).
    pub syscalls_by_name: BTreeMap<String, f64>,
    pub context_switches: Option<f64>,
    pub preemptions: Option<f64>,
    pub allocations: Option<f64>,
    /// Each count's [min, max] over the pairs, beside its median.
    pub spread: Spread,
}

/// [min, max] of a count's per-pair estimates; absent for one not measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Spread {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscalls: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_switches: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<[f64; 2]>,
}
