//! ingress-https's summary: requests from the router through the HTTPS
//! listener, a ladder of rates and then saturated; and its figure (CPU per
//! request against the rate).

use serde::{Deserialize, Serialize};

use super::{Measured, Scenario, ScenarioSummary, rungs_of};
use crate::load::plots::chart::Figure;
use crate::load::plots::per_request::cpu_per_request;
use crate::load::verdict::Verdict;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// The fastest rung that kept up.
    pub sustainable_rps: Option<f64>,
    /// The contender's CPU per request at that rung (the last rung when
    /// none kept up), in microseconds.
    pub cpu_us_per_request: Option<f64>,
    pub saturated: Option<Saturated>,
    /// New connections to the actors per 1,000 requests after warm-up
    /// (atunnel's /stats; `None` for a peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_upstream_conns_per_1000: Option<f64>,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::IngressHttps;
}

/// Every router connection kept `streams_in_flight / 4` requests in
/// flight for a rung's length, closed-loop.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Saturated {
    pub streams_in_flight: usize,
    pub rps: f64,
    pub errors: u64,
    pub tunnel_cores: f64,
    pub cpu_us_per_request: Option<f64>,
    /// Whose CPU ran out first.
    pub verdict: Option<Verdict>,
}

/// Tunnel CPU per request against the offered rate, a series per contender.
pub fn figures(contenders: &[Measured<Summary>]) -> Vec<Figure> {
    cpu_per_request(Scenario::IngressHttps.name(), &rungs_of(contenders))
        .into_iter()
        .collect()
}
