//! What atunnel-bench measures the host with, apart from atunnel itself:
//!
//! - [`cgroup`]: one cgroup per measured process (v1 or v2), created with
//!   CPU and memory limits, sampled while the process runs, removed after;
//! - [`sockmem`]: another process's kernel socket memory (`SO_MEMINFO`);
//! - [`schedule`]: one rung of load, open-loop, at a fixed rate.
//!
//! Reading the host (where the hierarchies are, a group's counters) is
//! `atunnel-host`'s; this crate creates and drives. Only atunnel-bench
//! (and its tests) may depend on it.

pub mod cgroup;
pub mod schedule;
pub mod sockmem;
