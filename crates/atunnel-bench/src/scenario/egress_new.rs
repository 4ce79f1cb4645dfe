//! egress-new's summary: new egress connections per second, a ladder per
//! address family (the scenario's rungs are IPv4's).

use serde::{Deserialize, Serialize};

use super::{PerFamily, Scenario, ScenarioSummary};
use crate::load::rung::RungResult;

/// IPv4's figures under the bare keys, IPv6's under the same keys with
/// `_ipv6` after them ([`PerFamily`]); IPv6's ladder is `rungs_ipv6`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    #[serde(flatten)]
    pub families: PerFamily<Family>,
    pub rungs_ipv6: Vec<RungResult>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::EgressNew;
}

/// One family's ladder.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Family {
    /// The fastest rung that kept up.
    pub sustainable_rate: Option<f64>,
    /// Per rung that opened any: the tunnel's CPU per new connection.
    pub cpu_per_conn: Vec<CpuPerConn>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct CpuPerConn {
    /// The rung's offered rate, per second.
    pub rate: f64,
    pub tunnel_cpu_ms_per_conn: f64,
}
