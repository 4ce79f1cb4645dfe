//! The open-loop load generator and what is made of its numbers.
//!
//! - the schedule (`atunnel_measure::schedule`, re-exported here): runs one
//!   rung of load open-loop — unit `i` is due at `start + i / rate` whether
//!   or not earlier units finished, and its latency counts from when it was
//!   due.
//! - [`confidence`]: a ratio's 95 % interval over paired baseline and
//!   test windows, and pass / fail / inconclusive against a bound.
//! - [`verdict`]: names what limited each rung (the tunnel, the generator,
//!   the far end, errors) and picks the sustainable rate of a ladder.
//! - [`rung`]: one rung's result as results.json has it.
//! - [`results`]: `results.json` (read by other tools), `results.txt` (read
//!   by people first), and writes the plots.
//! - [`plots`]: every plot of the report (plotters, SVG backend).

pub mod confidence;
pub mod plots;
pub mod results;
pub mod rung;
pub mod verdict;

pub use atunnel_measure::schedule::{
    END_GRACE, Rung, RungOutcome, new_histogram, run_rung, run_rung_with_grace,
};
pub use plots::write_plots;
pub use results::{
    Latency, Results, RungResult, ScenarioResult, write_results_json, write_results_txt,
};
pub use verdict::{RungEvidence, Verdict, sustainable_rate, verdict};
