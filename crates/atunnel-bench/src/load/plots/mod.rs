//! Every plot of a run's report, drawn with plotters' SVG backend.
//!
//! Two layers. The shapes (`chart.rs`) take plain data and return SVG text:
//! [`line_chart`] (numeric x, a line and markers per series), [`bar_chart`]
//! (grouped bars: categories along x, a bar per series in each),
//! [`Panel::stacked_bars`] (one bar per category, a segment per series on
//! top of the one before) and [`render`], panels of any of them one under
//! the other in one file. [`xy`] picks the shape
//! the way issue 15 asks: lines when some series has two or more x values,
//! else bars, one group per x value — a line through one point says
//! nothing. Then one builder per figure (`figures.rs`) reads what the scenarios put in
//! `results.json` ([`of_results`], [`noisy_neighbour`]); a contender
//! measured later (nginx, HAProxy) is one more series with its own label.
//!
//! plotters is built with no font feature: it lays text out by an estimate
//! from the font size (`style/font/naive.rs`) and the SVG backend writes
//! text as `<text>`, which the viewer renders with its own fonts. So the
//! build needs no fontconfig or freetype and the machine no font file.

mod chart;
mod figures;

pub use chart::*;
pub use figures::*;

use std::path::{Path, PathBuf};
use std::{fs, io};

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use super::results::{Results, RungResult, ScenarioResult, write_whole};
use super::verdict::Verdict;

#[cfg(test)]
mod tests;
