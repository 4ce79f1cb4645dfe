//! ingress-connect's summary: CONNECT tunnels through the router-facing
//! CONNECT listener, a ladder of rates (its rungs are its figures).

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// The fastest rung that kept up.
    pub sustainable_rps: Option<f64>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::IngressConnect;
}
