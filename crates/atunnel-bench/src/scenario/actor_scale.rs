//! actor-scale's summary: many actors on one atunnel, brought up, held
//! idle and torn down; the time and memory each costs, and what teardown
//! left behind.

use serde::{Deserialize, Serialize};

use super::{Scenario, ScenarioSummary};

/// Per actor unless named otherwise; bytes over the baseline before the
/// first was brought up.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    pub actors: usize,
    pub bring_up: Timing,
    /// atunnel's CPU over the first and the last tenth of the bring-ups
    /// (`None` when it could not be read).
    pub bring_up_cpu_first_tenth: Option<TenthCpu>,
    pub bring_up_cpu_last_tenth: Option<TenthCpu>,
    pub bring_up_total_s: f64,
    pub bring_up_cpu_ms_per_actor: f64,
    pub teardown: Timing,
    pub teardown_total_s: f64,
    pub teardown_cpu_ms_per_actor: f64,
    /// Once its idle connection and pooled gateway connection closed.
    pub heap_bytes_per_idle_actor: f64,
    pub heap_bytes_per_actor_just_activated: f64,
    pub heap_bytes_per_actor_first_half: f64,
    pub heap_bytes_per_actor_second_half: f64,
    pub heap_bytes_per_pooled_gateway_connection: f64,
    pub heap_bytes_per_idle_tunnel: f64,
    pub rss_bytes_per_idle_actor: f64,
    pub cgroup_bytes_per_idle_actor: f64,
    pub cgroup_kernel_bytes_per_idle_actor: f64,
    /// Host-wide kernel memory (slab, per-CPU, stacks, page tables).
    pub kernel_host_bytes_per_actor: f64,
    pub fds_per_idle_actor: f64,
    /// In all, not per actor.
    pub pooled_gateway_connections: f64,
    pub idle_tunnels: usize,
    pub after_teardown: AfterTeardown,
    pub pass: bool,
}

impl ScenarioSummary for Summary {
    const SCENARIO: Scenario = Scenario::ActorScale;
}

/// One step's time per actor, in ms, in the order taken: p50 and p99 over
/// all, and the p50 of the first and the last tenth.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Timing {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub first_tenth_p50_ms: f64,
    pub last_tenth_p50_ms: f64,
    /// The last tenth's p50 over the first's (0 when the first's is 0):
    /// a cost growing with the count.
    pub last_over_first: f64,
}

/// atunnel's user and system CPU per actor over a tenth of the bring-ups.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct TenthCpu {
    pub user_ms_per_actor: f64,
    pub system_ms_per_actor: f64,
}

/// What the teardown left, in all.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(default)]
pub struct AfterTeardown {
    pub namespaces_left: usize,
    pub actors_still_known: usize,
    pub fds_left: f64,
    pub heap_bytes_left: f64,
    pub cgroup_bytes_left: f64,
}
