//! atunnel-bench's reusable parts: cgroups, the open-loop load generator,
//! verdicts and reports, and the scenarios' names. The binary (`main.rs`)
//! wires them into roles.

pub mod cgroup;
pub mod load;
pub mod peers;
pub mod scenario;
pub mod sockmem;
