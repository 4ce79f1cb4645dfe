//! Every plot of a run's report, drawn with plotters' SVG backend.
//!
//! - `chart.rs`, the shapes: plain data in, SVG text out. [`line_chart`]
//!   (numeric x, a line and markers per series), [`bar_chart`] (grouped
//!   bars), [`Panel::stacked_bars`], and [`Chart`], panels of any of them
//!   one under the other in one file; [`xy`] picks lines or bars the way
//!   issue 15 asks (a line through one point says nothing). It knows
//!   nothing of scenarios.
//! - The figures several scenarios draw, from plain records: the ladder of
//!   any scenario with rungs (`ladder.rs`), memory per idle connection
//!   (`per_connection.rs`), CPU per request (`per_request.rs`).
//! - Each scenario's own figures live with its summary
//!   (`crate::scenario::<name>::figures`), fed that summary and each
//!   contender's rungs; a contender measured later (nginx, HAProxy) is one
//!   more series with its own label.
//! - This module asks each scenario for its figures ([`of_results`]) and
//!   writes the files. The scenarios import the shapes and the shared
//!   figures, never this module, so the imports run one way.
//!
//! plotters is built with no font feature: it lays text out by an estimate
//! from the font size (`style/font/naive.rs`) and the SVG backend writes
//! text as `<text>`, which the viewer renders with its own fonts. So the
//! build needs no fontconfig or freetype and the machine no font file.

pub(crate) mod chart;
mod ladder;
pub(crate) mod per_connection;
pub(crate) mod per_request;

pub use chart::*;
pub use per_connection::*;
pub use per_request::*;

use std::path::{Path, PathBuf};
use std::{fs, io};

use super::results::{Results, write_whole};
use crate::scenario::{
    Scenario, cost, egress_http, egress_idle, egress_tcp, ingress_https, ingress_idle,
    socket_memory,
};

#[cfg(test)]
pub(crate) mod tests;

/// A plot of a run: its file name in the run folder and its SVG text.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// `<scenario>.svg` for the ladder, `<scenario>.<figure>.svg` for the
    /// others: the scenario is the name up to the first `.`.
    pub file: String,
    pub svg: String,
}

/// The scenarios with figures of their own, in the order their files
/// follow the ladders (report.md lists a comparison's plots in it).
const WITH_FIGURES: [Scenario; 7] = [
    Scenario::EgressIdle,
    Scenario::IngressIdle,
    Scenario::EgressHttp,
    Scenario::IngressHttps,
    Scenario::EgressTcp,
    Scenario::SocketMemory,
    Scenario::Cost,
];

/// Every plot made from `r` but noisy-neighbour's (its report section
/// draws that one, beside its table): the ladder of each scenario with
/// rungs, then each scenario's own figures, from every contender of the
/// run where the figure compares them.
pub fn of_results(r: &Results) -> Result<Vec<Plot>, PlotError> {
    let mut plots = Vec::new();
    for s in r.scenarios.iter().filter(|s| !s.rungs.is_empty()) {
        plots.push(Plot {
            file: format!("{}.svg", file_stem(&s.name)),
            svg: ladder::chart(&s.name, &s.rungs).render()?,
        });
    }
    for scenario in WITH_FIGURES {
        for figure in figures(r, scenario) {
            plots.push(Plot {
                file: format!(
                    "{}.{}.svg",
                    file_stem(scenario.name()),
                    file_stem(&figure.name)
                ),
                svg: figure.chart.render()?,
            });
        }
    }
    Ok(plots)
}

/// `scenario`'s own figures: from every contender (atunnel's, then each
/// comparison variant's) where it compares them, else from the run's own.
fn figures(r: &Results, scenario: Scenario) -> Vec<Figure> {
    match scenario {
        Scenario::EgressIdle => egress_idle::figures(&r.measured()),
        Scenario::IngressIdle => ingress_idle::figures(&r.measured()),
        Scenario::EgressHttp => egress_http::figures(&r.measured()),
        Scenario::IngressHttps => ingress_https::figures(&r.measured()),
        Scenario::EgressTcp => egress_tcp::figures(&r.measured()),
        Scenario::SocketMemory => r
            .summary::<socket_memory::Summary>()
            .map(|s| socket_memory::figures(&s))
            .unwrap_or_default(),
        Scenario::Cost => r
            .summary::<cost::Summary>()
            .map(|s| cost::figures(&s))
            .unwrap_or_default(),
        // Their figures are their rungs' ladder, or (noisy-neighbour) drawn
        // by their report section.
        Scenario::EgressNew
        | Scenario::IngressConnect
        | Scenario::NoisyNeighbour
        | Scenario::Chaos
        | Scenario::ActorScale => Vec::new(),
    }
}

/// A scenario's file name: characters other than letters, digits, `-`
/// and `_` become `_` (no `.`: it separates the scenario from the figure).
pub fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() {
        "scenario".to_string()
    } else {
        stem
    }
}

/// Every plot of the run ([`of_results`]), written into `dir` beside
/// report.md; returns their paths. A file is `<scenario>.svg` (the ladder)
/// or `<scenario>.<figure>.svg`.
pub fn write_plots(dir: &Path, r: &Results) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    for plot in of_results(r).map_err(io::Error::other)? {
        let path = dir.join(&plot.file);
        write_whole(&path, plot.svg)?;
        paths.push(path);
    }
    Ok(paths)
}
