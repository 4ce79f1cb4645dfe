//! chaos's summary: per fault, how the concurrent egress tunnels it struck
//! ended (completed, cut with a reset, refused, silently truncated), and
//! whether fresh ones completed after it.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub faults: Vec<Fault>,
    /// Over every fault: the figure that must be 0.
    pub silently_truncated: u64,
    pub silently_truncated_ipv4: u64,
    pub silently_truncated_ipv6: u64,
    pub pass: bool,
    pub tunnels_per_fault: u64,
    pub bytes_each_way: u32,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::Chaos;
}

/// One fault's phase: its tunnels' outcomes, then a few fresh tunnels'.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Fault {
    /// "none", "gateway-kill", "actor-deactivate", "tunnel-kill",
    /// "destination-reset".
    pub fault: String,
    pub tunnels: u64,
    pub completed: u64,
    pub cut_rst: u64,
    pub silently_truncated: u64,
    pub refused: u64,
    pub other: u64,
    /// When and where the fault struck.
    pub struck: Option<String>,
    pub first_truncated: Option<String>,
    pub first_other: Option<String>,
    /// The deactivation fault only: tunnels of the actors it did not
    /// strike that did not complete (`None` for the other faults).
    pub bystanders_incomplete: Option<u64>,
    /// Every fresh tunnel after the fault completed.
    pub recovered: bool,
    pub recovery_completed: u64,
    pub recovery_tunnels: u64,
    pub ipv4: Outcomes,
    pub ipv6: Outcomes,
    pub recovered_ipv4: bool,
    pub recovered_ipv6: bool,
}

/// How one family's tunnels of a phase ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct Outcomes {
    pub completed: u64,
    pub cut_rst: u64,
    pub refused: u64,
    pub silently_truncated: u64,
    pub other: u64,
}
