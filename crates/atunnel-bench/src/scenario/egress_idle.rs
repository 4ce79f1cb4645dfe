//! egress-idle's summary: what one idle egress connection costs, and its
//! figure (memory per idle connection, a bar per contender).

use serde::{Deserialize, Serialize};

use super::{Measured, Scenario, ScenarioSummary};
use crate::load::plots::chart::Figure;
use crate::load::plots::per_connection::{PerConnection, memory_per_connection};

/// Per connection held idle, over the baseline before they were opened.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// Connections opened and held (the generator's fd limit may cap them).
    pub conns: usize,
    pub heap_bytes_per_conn: f64,
    /// The tunnel cgroup's memory, user and kernel.
    pub cgroup_bytes_per_conn: f64,
    pub socket_bytes_per_conn: f64,
    pub tasks_per_conn: f64,
    pub open_cpu_ms_per_conn: f64,
    /// The tunnel's CPU while they were held, in cores.
    pub hold_cpu_cores: f64,
    pub actors: usize,
    /// What the allocator kept once they were all closed (fragmentation).
    pub retained_cgroup_bytes_after_close: f64,
    pub retained_rss_bytes_after_close: f64,
    /// The bench's allocator (jemalloc, mimalloc or system).
    pub allocator: String,
    pub tunnel_worker_threads: usize,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::EgressIdle;
}

/// Heap and cgroup bytes per idle connection, a bar per contender.
pub fn figures(contenders: &[Measured<Summary>]) -> Vec<Figure> {
    let per_connection: Vec<PerConnection> = contenders
        .iter()
        .filter_map(|m| {
            let s = m.summary.as_ref()?;
            Some(PerConnection {
                label: m.label.clone(),
                case: String::new(),
                conns: s.conns as f64,
                heap_bytes: Some(s.heap_bytes_per_conn),
                cgroup_bytes: Some(s.cgroup_bytes_per_conn),
            })
        })
        .collect();
    if per_connection.is_empty() {
        return Vec::new();
    }
    vec![memory_per_connection(
        Scenario::EgressIdle.name(),
        &per_connection,
    )]
}
