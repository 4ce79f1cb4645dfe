//! The scenarios by name: the one place their names are spelled. `run` and
//! `load` parse `--scenarios` with it (and list the names in `--help`),
//! `load` runs them in its order, and the report and the results files name
//! them with it. The names are part of the results schema (`results.json`'s
//! `scenarios[].name`): never rename one.
//!
//! Beside the names, one module per scenario holds what it writes in
//! `results.json`'s `scenarios[].summary` (its `Summary`, a
//! [`ScenarioSummary`]) and the figures drawn from it. The field names are
//! the summary's keys as other tools read them: never rename one either.

pub mod actor_scale;
pub mod chaos;
pub mod cost;
pub mod egress_http;
pub mod egress_idle;
pub mod egress_new;
pub mod egress_tcp;
mod family;
pub mod ingress_connect;
pub mod ingress_https;
pub mod ingress_idle;
pub mod noisy_neighbour;
pub mod socket_memory;

pub use family::PerFamily;

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::load::rung::RungResult;

/// A scenario of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    EgressIdle,
    EgressTcp,
    EgressHttp,
    EgressNew,
    IngressHttps,
    IngressConnect,
    SocketMemory,
    IngressIdle,
    NoisyNeighbour,
    Chaos,
    ActorScale,
    Cost,
}

impl Scenario {
    /// Every scenario, in the order they run.
    pub const ALL: [Scenario; 12] = [
        Scenario::EgressIdle,
        Scenario::EgressTcp,
        Scenario::EgressHttp,
        Scenario::EgressNew,
        Scenario::IngressHttps,
        Scenario::IngressConnect,
        Scenario::SocketMemory,
        Scenario::IngressIdle,
        Scenario::NoisyNeighbour,
        Scenario::Chaos,
        Scenario::ActorScale,
        Scenario::Cost,
    ];

    /// Its name on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::EgressIdle => "egress-idle",
            Scenario::EgressTcp => "egress-tcp",
            Scenario::EgressHttp => "egress-http",
            Scenario::EgressNew => "egress-new",
            Scenario::IngressHttps => "ingress-https",
            Scenario::IngressConnect => "ingress-connect",
            Scenario::SocketMemory => "socket-memory",
            Scenario::IngressIdle => "ingress-idle",
            Scenario::NoisyNeighbour => "noisy-neighbour",
            Scenario::Chaos => "chaos",
            Scenario::ActorScale => "actor-scale",
            Scenario::Cost => "cost",
        }
    }

    /// The scenario named `name` (a results file's), if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--scenarios` accepts the names (and `--help` lists them); an unknown one
/// is refused with the known ones listed.
impl clap::ValueEnum for Scenario {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

/// What one scenario writes as its `summary`, and the scenario that writes
/// it: a result is made from one (`ScenarioResult::new`) and read back as
/// one (`ScenarioResult::summary`), so a key renamed on one side is renamed
/// on the other or does not compile.
///
/// Every field is `#[serde(default)]` or an `Option`, so that a results
/// file written before a field was added still reads.
pub trait ScenarioSummary: Serialize + DeserializeOwned {
    const SCENARIO: Scenario;
}

/// One contender's result of a scenario, as the scenario's figures take
/// it (`Results::measured` gathers them).
#[derive(Clone, Debug, PartialEq)]
pub struct Measured<'a, S> {
    /// The legend's label: "atunnel" for the run's own result, "naive
    /// (copy-mode)" or "nginx (peers)" for a comparison's.
    pub label: String,
    /// `None` when the scenario failed before it had one.
    pub summary: Option<S>,
    pub rungs: &'a [RungResult],
}

/// Each contender's label and rungs, as the figures drawn from rungs alone
/// take them.
pub(crate) fn rungs_of<'a, S>(contenders: &'a [Measured<S>]) -> Vec<(&'a str, &'a [RungResult])> {
    contenders
        .iter()
        .map(|m| (m.label.as_str(), m.rungs))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_its_own_name_and_is_found_by_it() {
        let names: std::collections::HashSet<&str> =
            Scenario::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Scenario::ALL.len());
        for s in Scenario::ALL {
            assert_eq!(Scenario::from_name(s.name()), Some(s));
            assert_eq!(s.to_string(), s.name());
            assert_eq!(
                <Scenario as clap::ValueEnum>::from_str(s.name(), false),
                Ok(s)
            );
        }
        assert_eq!(Scenario::from_name("egress-nope"), None);
    }
}
