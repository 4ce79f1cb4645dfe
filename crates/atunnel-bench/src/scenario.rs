//! The scenarios by name: the one place their names are spelled. `run` and
//! `load` parse `--scenarios` with it (and list the names in `--help`),
//! `load` runs them in its order, and the report and the results files name
//! them with it. The names are part of the results schema (`results.json`'s
//! `scenarios[].name`): never rename one.

use std::fmt;

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
