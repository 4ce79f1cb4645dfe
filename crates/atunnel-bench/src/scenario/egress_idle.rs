//! egress-idle's summary: what one idle egress connection costs.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

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
