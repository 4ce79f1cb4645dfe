//! egress-http's summary: requests over reused egress connections, a
//! ladder of rates; and its figure (CPU per request against the rate).

use serde::{Deserialize, Serialize};

use super::{Measured, Scenario, ScenarioSummary, rungs_of};
use crate::load::plots::chart::Figure;
use crate::load::plots::per_request::cpu_per_request;

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

/// Tunnel CPU per request against the offered rate, a series per contender.
pub fn figures(contenders: &[Measured<Summary>]) -> Vec<Figure> {
    cpu_per_request(Scenario::EgressHttp.name(), &rungs_of(contenders))
        .into_iter()
        .collect()
}
