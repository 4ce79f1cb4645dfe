//! egress-http's summary: requests over reused egress connections, a
//! ladder of rates.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// The tunnel's cores at the 8,000/s rung (the reference's figure);
    /// `None` without that rung.
    pub cores_at_8000_rps: Option<f64>,
    /// Reused egress connections.
    pub connections: usize,
    /// The fastest rung that kept up.
    pub sustainable_rps: Option<f64>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::EgressHttp;
}
