//! egress-tcp's summary: bulk throughput of one egress connection, three
//! runs per address family.

use serde::{Deserialize, Serialize};

use super::{PerFamily, Scenario, ScenarioSummary};

/// IPv4's runs under the bare keys, IPv6's under the same keys with
/// `_ipv6` after them ([`PerFamily`]; a contender that relays IPv4 only
/// has none).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    #[serde(flatten)]
    pub runs: PerFamily<Runs>,
    pub bytes_per_run: u64,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::EgressTcp;
}

/// Three bulk uploads over one family, a value per run in each list.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Runs {
    pub mb_per_s: Vec<f64>,
    /// MB per CPU-second of the tunnel's cgroup.
    pub mb_per_tunnel_cpu_s: Vec<f64>,
    /// Their median: the figure to compare.
    pub mb_per_tunnel_cpu_s_median: Option<f64>,
    pub tunnel_cores: Vec<f64>,
    pub sink_cores: Vec<f64>,
    pub generator_cores: Vec<f64>,
}
