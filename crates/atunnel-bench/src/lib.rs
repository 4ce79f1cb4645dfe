//! atunnel-bench's reusable parts: verdicts and reports, the scenarios'
//! names, summaries and figures (`scenario`), and counting what a unit of
//! work costs (`cost`). The binary (`main.rs`) wires them into roles.

pub mod cost;
pub mod load;
pub mod lockstep;
pub mod markdown;
pub mod peers;
pub mod scenario;
