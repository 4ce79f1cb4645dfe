//! Every plot of a run's report, drawn with plotters' SVG backend.
//!
//! Two layers. The shapes take plain data and return SVG text:
//! [`line_chart`] (numeric x, a line and markers per series), [`bar_chart`]
//! (grouped bars: categories along x, a bar per series in each),
//! [`Panel::stacked_bars`] (one bar per category, a segment per series on
//! top of the one before) and [`render`], panels of any of them one under
//! the other in one file. [`xy`] picks the shape
//! the way issue 15 asks: lines when some series has two or more x values,
//! else bars, one group per x value — a line through one point says
//! nothing. Then one builder per figure reads what the scenarios put in
//! `results.json` ([`of_results`], [`noisy_neighbour`]); a contender
//! measured later (nginx, HAProxy) is one more series with its own label.
//!
//! plotters is built with no font feature: it lays text out by an estimate
//! from the font size (`style/font/naive.rs`) and the SVG backend writes
//! text as `<text>`, which the viewer renders with its own fonts. So the
//! build needs no fontconfig or freetype and the machine no font file.

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

/// A plot could not be drawn (plotters reported an error).
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot {title:?}: {message}")]
pub struct PlotError {
    title: String,
    message: String,
}

/// A chart's title and what its axes show (with units).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Axes {
    pub title: String,
    pub x: String,
    pub y: String,
}

impl Axes {
    pub fn new(title: impl Into<String>, x: impl Into<String>, y: impl Into<String>) -> Self {
        Axes {
            title: title.into(),
            x: x.into(),
            y: y.into(),
        }
    }
}

/// One line: its label in the legend and its (x, y) points. `marked[i]`
/// rings point `i` in red (e.g. a rung whose verdict is not ok).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub marked: Vec<bool>,
}

impl Series {
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.into(),
            points,
            marked: Vec::new(),
        }
    }
}

/// Grouped bars: one group per category, in it one bar per series (a
/// value per category; `None`, or a value that is not finite, is drawn as
/// "n/a": not measured).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bars {
    /// A `\n` in a category breaks its label into lines.
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct BarSeries {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

impl BarSeries {
    pub fn new(label: impl Into<String>, values: Vec<Option<f64>>) -> Self {
        BarSeries {
            label: label.into(),
            values,
        }
    }
}

/// A horizontal dashed line: a bound or a threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub label: String,
    pub y: f64,
}

/// One chart of a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub axes: Axes,
    pub shape: Shape,
    pub limits: Vec<Limit>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    Lines(Vec<Series>),
    Bars(Bars),
    /// One bar per category, its series' values stacked (a part of a whole
    /// each: negative or missing parts add nothing), the total on top.
    StackedBars(Bars),
}

impl Panel {
    pub fn lines(axes: Axes, series: Vec<Series>) -> Self {
        Panel {
            axes,
            shape: Shape::Lines(series),
            limits: Vec::new(),
        }
    }

    pub fn bars(axes: Axes, bars: Bars) -> Self {
        Panel {
            axes,
            shape: Shape::Bars(bars),
            limits: Vec::new(),
        }
    }

    pub fn stacked_bars(axes: Axes, bars: Bars) -> Self {
        Panel {
            axes,
            shape: Shape::StackedBars(bars),
            limits: Vec::new(),
        }
    }

    pub fn with_limits(mut self, limits: Vec<Limit>) -> Self {
        self.limits = limits;
        self
    }
}

/// Lines when some series has at least two distinct x values; otherwise
/// bars with one group per x value (labelled "x value + `x_unit`", e.g.
/// "1000 connections") and one bar per series.
pub fn xy(axes: Axes, series: Vec<Series>, x_unit: &str) -> Panel {
    let distinct = |s: &Series| {
        let mut xs: Vec<f64> = s
            .points
            .iter()
            .map(|p| p.0)
            .filter(|x| x.is_finite())
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.len()
    };
    if series.iter().any(|s| distinct(s) >= 2) {
        return Panel::lines(axes, series);
    }
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let bars = Bars {
        categories: xs
            .iter()
            .map(|x| format!("{} {x_unit}", tick(*x)).trim_end().to_string())
            .collect(),
        series: series
            .iter()
            .map(|s| BarSeries {
                label: s.label.clone(),
                values: xs
                    .iter()
                    .map(|x| s.points.iter().find(|p| p.0 == *x).map(|p| p.1))
                    .collect(),
            })
            .collect(),
    };
    Panel::bars(axes, bars)
}

/// One line chart in a file of its own.
pub fn line_chart(axes: &Axes, series: &[Series]) -> Result<String, PlotError> {
    render(&axes.title, &[Panel::lines(axes.clone(), series.to_vec())])
}

/// One grouped bar chart in a file of its own.
pub fn bar_chart(axes: &Axes, bars: &Bars) -> Result<String, PlotError> {
    render(&axes.title, &[Panel::bars(axes.clone(), bars.clone())])
}

const WIDTH: u32 = 760;
const TITLE_H: u32 = 36;
const CHART_H: u32 = 250;
const LEGEND_ROW_H: u32 = 20;
const LEGEND_ITEM_W: i32 = 225;
const FONT: &str = "sans-serif";
/// Tableau 10: distinguishable in print and to most colour-blind readers.
const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x17, 0xbe, 0xcf),
];
const LIMIT_COLOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

fn legend_rows(labels: usize) -> u32 {
    let per_row = ((WIDTH as i32 - 80) / LEGEND_ITEM_W).max(1) as usize;
    labels.div_ceil(per_row) as u32
}

fn labels_of(panel: &Panel) -> Vec<String> {
    match &panel.shape {
        Shape::Lines(s) => s.iter().map(|s| s.label.clone()).collect(),
        Shape::Bars(b) | Shape::StackedBars(b) => {
            b.series.iter().map(|s| s.label.clone()).collect()
        }
    }
}

fn category_lines(panel: &Panel) -> u32 {
    match &panel.shape {
        Shape::Lines(_) => 1,
        Shape::Bars(b) | Shape::StackedBars(b) => b
            .categories
            .iter()
            .map(|c| wrap(c, b.categories.len()).len().max(1) as u32)
            .max()
            .unwrap_or(1),
    }
}

/// A category's label as lines that fit under its group of `groups`:
/// broken at its `\n`s, then after a `-` or at a space where a line would
/// be wider than the group (about 6.5 px a character at the labels' size).
fn wrap(category: &str, groups: usize) -> Vec<String> {
    let max = ((WIDTH as usize - 90) / groups.max(1) / 7).max(6);
    let mut out = Vec::new();
    for line in category.lines() {
        let mut words: Vec<String> = Vec::new();
        for word in line.split(' ') {
            let mut rest = word;
            while let Some(i) = rest.find('-').filter(|&i| i + 1 < rest.len()) {
                words.push(rest[..=i].to_string());
                rest = &rest[i + 1..];
            }
            words.push(format!("{rest} "));
        }
        let mut current = String::new();
        for w in words {
            if !current.is_empty() && current.trim_end().len() + w.trim_end().len() > max {
                out.push(current.trim_end().to_string());
                current.clear();
            }
            current.push_str(&w);
        }
        out.push(current.trim_end().to_string());
    }
    out
}

fn panel_height(panel: &Panel) -> u32 {
    CHART_H + 14 * category_lines(panel) + LEGEND_ROW_H * legend_rows(labels_of(panel).len())
}

/// `panels` stacked under `title` in one SVG document.
pub fn render(title: &str, panels: &[Panel]) -> Result<String, PlotError> {
    let heights: Vec<u32> = panels.iter().map(panel_height).collect();
    let height = TITLE_H + heights.iter().sum::<u32>().max(1);
    let mut svg = String::new();
    let err = |e: &dyn std::fmt::Display| PlotError {
        title: title.to_string(),
        message: e.to_string(),
    };
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let body = root
            .titled(title, (FONT, 22).into_font().style(FontStyle::Bold))
            .map_err(|e| err(&e))?;
        // A file of one chart has its title once.
        let captions = !(panels.len() == 1 && panels[0].axes.title == title);
        let mut rest = body;
        for (panel, h) in panels.iter().zip(&heights) {
            let (this, below) = rest.split_vertically(*h);
            draw_panel(&this, panel, captions).map_err(|e| err(&e))?;
            rest = below;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error + 'static>>;

fn draw_panel(area: &Area, panel: &Panel, caption: bool) -> DrawResult {
    let labels = labels_of(panel);
    let legend_h = LEGEND_ROW_H * legend_rows(labels.len());
    let (_, h) = area.dim_in_pixel();
    let (chart_area, legend_area) = area.split_vertically(h - legend_h);
    let axes = if caption {
        &panel.axes
    } else {
        &Axes {
            title: String::new(),
            ..panel.axes.clone()
        }
    };
    match &panel.shape {
        Shape::Lines(series) => draw_lines(&chart_area, axes, series, &panel.limits)?,
        Shape::Bars(bars) => draw_bars(
            &chart_area,
            axes,
            bars,
            &panel.limits,
            category_lines(panel),
            false,
        )?,
        Shape::StackedBars(bars) => draw_bars(
            &chart_area,
            axes,
            bars,
            &panel.limits,
            category_lines(panel),
            true,
        )?,
    }
    draw_legend(&legend_area, &labels)
}

/// The y axis: from 0 (or below, for negative values) to a little above
/// the largest value or limit, never empty.
fn y_range(values: impl Iterator<Item = f64>, limits: &[Limit]) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for v in values
        .chain(limits.iter().map(|l| l.y))
        .filter(|v| v.is_finite())
    {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if hi - lo <= 0.0 {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.12;
    (if lo < 0.0 { lo - pad } else { 0.0 })..hi + pad
}

fn draw_lines(area: &Area, axes: &Axes, series: &[Series], limits: &[Limit]) -> DrawResult {
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let points = || series.iter().flat_map(|s| s.points.iter().filter(finite));
    let x_max = points().map(|p| p.0).fold(0.0f64, f64::max);
    let x_min = points().map(|p| p.0).fold(0.0f64, f64::min);
    let x_max = if x_max - x_min <= 0.0 {
        x_min + 1.0
    } else {
        x_max
    };
    let x_range = x_min..x_max + (x_max - x_min) * 0.05;
    let y_range = y_range(points().map(|p| p.1), limits);
    let mut builder = ChartBuilder::on(area);
    if !axes.title.is_empty() {
        builder.caption(&axes.title, (FONT, 17));
    }
    let mut chart = builder
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone(), y_range)?;
    chart
        .configure_mesh()
        .x_desc(&axes.x)
        .y_desc(&axes.y)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .max_light_lines(1)
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let mut pts: Vec<(f64, f64, bool)> = s
            .points
            .iter()
            .enumerate()
            .filter(|(_, p)| finite(p))
            .map(|(k, p)| (p.0, p.1, s.marked.get(k).copied().unwrap_or(false)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = color(i);
        chart.draw_series(std::iter::once(PathElement::new(
            pts.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
            c.stroke_width(2),
        )))?;
        chart.draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 4, c.filled())))?;
        chart.draw_series(
            pts.iter()
                .filter(|p| p.2)
                .map(|p| Circle::new((p.0, p.1), 7, LIMIT_COLOR.stroke_width(2))),
        )?;
    }
    draw_limits(&mut chart, x_range, limits)
}

fn draw_limits(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    x: std::ops::Range<f64>,
    limits: &[Limit],
) -> DrawResult {
    // Labels alternate above and below their lines, so two close bounds
    // (1.1 and 0.9) stay readable.
    for (i, l) in limits.iter().filter(|l| l.y.is_finite()).enumerate() {
        let v = if i % 2 == 0 { VPos::Bottom } else { VPos::Top };
        chart.draw_series(std::iter::once(DashedPathElement::new(
            [(x.start, l.y), (x.end, l.y)],
            6,
            4,
            LIMIT_COLOR.stroke_width(1),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            l.label.clone(),
            (x.end, l.y),
            TextStyle::from((FONT, 12).into_font())
                .color(&LIMIT_COLOR)
                .pos(Pos::new(HPos::Right, v)),
        )))?;
    }
    Ok(())
}

fn draw_bars(
    area: &Area,
    axes: &Axes,
    bars: &Bars,
    limits: &[Limit],
    category_lines: u32,
    stacked: bool,
) -> DrawResult {
    let n = bars.categories.len().max(1);
    let value = |v: &Option<f64>| v.filter(|v| v.is_finite());
    // A stacked bar's parts: the positive ones (a part below zero would
    // overlap the one under it), None when the category has none at all.
    let parts = |k: usize| -> Option<Vec<(usize, f64)>> {
        let parts: Vec<(usize, f64)> = bars
            .series
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, value(s.values.get(k)?)?)))
            .collect();
        (!parts.is_empty()).then(|| parts.into_iter().filter(|p| p.1 > 0.0).collect())
    };
    let y_range = if stacked {
        y_range(
            (0..bars.categories.len()).filter_map(|k| Some(parts(k)?.iter().map(|p| p.1).sum())),
            limits,
        )
    } else {
        y_range(
            bars.series
                .iter()
                .flat_map(|s| s.values.iter().filter_map(value)),
            limits,
        )
    };
    let x_range = 0.0..n as f64;
    let mut builder = ChartBuilder::on(area);
    if !axes.title.is_empty() {
        builder.caption(&axes.title, (FONT, 17));
    }
    let mut chart = builder
        .margin(8)
        .x_label_area_size(22 + 14 * category_lines)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone(), y_range.clone())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(&axes.x)
        .y_desc(&axes.y)
        .y_label_formatter(&|v| tick(*v))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .max_light_lines(1)
        .draw()?;
    let groups = bars.series.len().max(1) as f64;
    let bar_w = 0.8 / groups;
    let base = 0.0f64.max(y_range.start);
    let label_style = TextStyle::from((FONT, 13).into_font());
    // A bar's figure above it, and "n/a" on the axis where a contender has
    // none: the same for stacked and grouped bars.
    let total = |v: f64, x: f64, y: f64| {
        Text::new(
            tick(v),
            (x, y),
            label_style
                .clone()
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    };
    let not_available = |x: f64| {
        Text::new(
            "n/a",
            (x, base),
            label_style
                .clone()
                .color(&LIMIT_COLOR)
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )
    };
    if stacked {
        for k in 0..bars.categories.len() {
            let (x0, x1) = (k as f64 + 0.25, k as f64 + 0.75);
            let mid = k as f64 + 0.5;
            let Some(parts) = parts(k) else {
                chart.draw_series(std::iter::once(not_available(mid)))?;
                continue;
            };
            let mut top = base;
            for (i, v) in parts {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, top), (x1, top + v)],
                    color(i).filled(),
                )))?;
                top += v;
            }
            chart.draw_series(std::iter::once(total(top - base, mid, top)))?;
        }
    }
    for (i, s) in bars.series.iter().enumerate().filter(|_| !stacked) {
        let c = color(i);
        for (k, v) in s.values.iter().take(bars.categories.len()).enumerate() {
            let x0 = k as f64 + 0.1 + i as f64 * bar_w;
            let x1 = x0 + bar_w * 0.92;
            let mid = (x0 + x1) / 2.0;
            match value(v) {
                Some(v) => {
                    chart.draw_series(std::iter::once(Rectangle::new(
                        [(x0, base), (x1, v)],
                        c.filled(),
                    )))?;
                    chart.draw_series(std::iter::once(total(v, mid, v)))?;
                }
                None => {
                    chart.draw_series(std::iter::once(not_available(mid)))?;
                }
            }
        }
    }
    // Category labels under their groups, in pixels below the axis (the
    // mesh's own x labels are off: on a numeric range they would fall on
    // round numbers, not on the groups).
    let (base_x, base_y) = area.get_base_pixel();
    for (k, category) in bars.categories.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(k as f64 + 0.5, y_range.start));
        for (line, text) in wrap(category, bars.categories.len())
            .into_iter()
            .enumerate()
        {
            area.draw(&Text::new(
                text,
                (px - base_x, py - base_y + 6 + 14 * line as i32),
                label_style.clone().pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
        }
    }
    draw_limits(&mut chart, x_range, limits)
}

/// A row of colour swatches with the series' labels.
fn draw_legend(area: &Area, labels: &[String]) -> DrawResult {
    let per_row = ((WIDTH as i32 - 80) / LEGEND_ITEM_W).max(1) as usize;
    let style = TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, label) in labels.iter().enumerate() {
        let x = 72 + (i % per_row) as i32 * LEGEND_ITEM_W;
        let y = (i / per_row) as i32 * LEGEND_ROW_H as i32 + LEGEND_ROW_H as i32 / 2;
        area.draw(&Rectangle::new(
            [(x, y - 5), (x + 10, y + 5)],
            color(i).filled(),
        ))?;
        area.draw(&Text::new(label.clone(), (x + 16, y), style.clone()))?;
    }
    Ok(())
}

/// A short, readable number: at most three decimals, no trailing zeros,
/// thousands without a fraction.
fn tick(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let digits = match v.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" { "0".into() } else { s }
}

/// A plot of a run: its file name in the run folder and its SVG text.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// `<scenario>.svg` for the ladder, `<scenario>.<figure>.svg` for the
    /// others: the scenario is the name up to the first `.`.
    pub file: String,
    pub svg: String,
}

/// Every plot made from `r` but noisy-neighbour's (its report section
/// draws that one with [`noisy_neighbour`], beside its table).
pub fn of_results(r: &Results) -> Result<Vec<Plot>, PlotError> {
    let mut plots = Vec::new();
    let mut add = |scenario: &str, figure: Option<&str>, svg: Option<String>| {
        if let Some(svg) = svg {
            let stem = file_stem(scenario);
            let file = match figure {
                Some(f) => format!("{stem}.{f}.svg"),
                None => format!("{stem}.svg"),
            };
            plots.push(Plot { file, svg });
        }
    };
    for s in r.scenarios.iter().filter(|s| !s.rungs.is_empty()) {
        add(&s.name, None, Some(rungs(s)?));
    }
    for scenario in ["egress-idle", "ingress-idle"] {
        let contenders = idle_contenders(r, scenario);
        if !contenders.is_empty() {
            let svg = memory_per_connection(scenario, &contenders)?;
            add(scenario, Some("memory-per-connection"), Some(svg));
        }
    }
    // atunnel's, from the run or else from the comparison that ran it.
    let hibernates = |s: &ScenarioResult| {
        cases(s)
            .iter()
            .any(|c| f(&c["hibernated_cgroup_bytes_per_conn"]).is_some())
    };
    if let Some((_, s)) = contenders(r, "ingress-idle")
        .into_iter()
        .find(|(_, s)| hibernates(s))
    {
        add(&s.name, Some("hibernation"), hibernation(s)?);
    }
    for scenario in ["egress-http", "ingress-https"] {
        let contenders = contenders(r, scenario);
        let svg = cpu_per_request(scenario, &contenders)?;
        add(scenario, Some("cpu-per-request"), svg);
    }
    let tcp = contenders(r, "egress-tcp");
    add("egress-tcp", Some("throughput"), tcp_throughput(&tcp)?);
    if let Some(s) = find(&r.scenarios, "socket-memory") {
        add(&s.name, Some("stall-memory"), stall_memory(s)?);
    }
    if let Some(s) = find(&r.scenarios, "cost") {
        for unit in s.summary["units"].as_array().into_iter().flatten() {
            let name = unit["name"].as_str().unwrap_or("unit");
            add(&s.name, Some(&file_stem(name)), Some(cost_unit(unit)?));
        }
    }
    Ok(plots)
}

/// One cost unit: a panel per cost kind (instructions; syscalls, one bar
/// per contender stacked by name, the five names the contenders make most
/// and the rest; context switches and allocations), the contenders side by
/// side in each.
pub fn cost_unit(unit: &Value) -> Result<String, PlotError> {
    let contenders = unit["contenders"].as_array().cloned().unwrap_or_default();
    let names: Vec<String> = contenders
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").to_string())
        .collect();
    let per = unit["per"].as_str().unwrap_or("unit");
    let kind = |key: &str| -> BarSeries {
        BarSeries::new(key, contenders.iter().map(|c| f(&c[key])).collect())
    };
    let panel = |title: &str, series: Vec<BarSeries>| {
        Panel::bars(
            Axes::new(title, "contender", format!("per {per}")),
            Bars {
                categories: names.clone(),
                series,
            },
        )
    };
    // The syscalls by name the contenders make most, summed over them.
    let mut totals: std::collections::BTreeMap<String, f64> = Default::default();
    for c in &contenders {
        for (k, v) in c["syscalls_by_name"].as_object().into_iter().flatten() {
            *totals.entry(k.clone()).or_default() += f(v).unwrap_or(0.0).max(0.0);
        }
    }
    let mut top: Vec<(String, f64)> = totals.into_iter().filter(|(k, _)| k != "other").collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(5);
    let mut by_name: Vec<BarSeries> = top
        .iter()
        .map(|(k, _)| {
            BarSeries::new(
                k.clone(),
                contenders
                    .iter()
                    .map(|c| {
                        // A name's per-unit difference can come out a hair
                        // below zero; as a part of the stack it is none.
                        f(&c["syscalls"])
                            .map(|_| f(&c["syscalls_by_name"][k]).unwrap_or(0.0).max(0.0))
                    })
                    .collect(),
            )
        })
        .collect();
    by_name.push(BarSeries::new(
        "rest",
        contenders
            .iter()
            .map(|c| {
                let total = f(&c["syscalls"])?;
                let named: f64 = top
                    .iter()
                    .map(|(k, _)| f(&c["syscalls_by_name"][k]).unwrap_or(0.0).max(0.0))
                    .sum();
                Some((total - named).max(0.0))
            })
            .collect(),
    ));
    render(
        &format!("cost: {} (per {per})", unit["name"].as_str().unwrap_or("")),
        &[
            panel(
                "user-space instructions (callgrind)",
                vec![kind("instructions")],
            ),
            Panel::stacked_bars(
                Axes::new(
                    "system calls (perf), stacked by name",
                    "contender",
                    format!("per {per}"),
                ),
                Bars {
                    categories: names.clone(),
                    series: by_name,
                },
            ),
            panel(
                "context switches and heap allocations",
                vec![kind("context_switches"), kind("allocations")],
            ),
        ],
    )
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

fn find<'a>(scenarios: &'a [ScenarioResult], name: &str) -> Option<&'a ScenarioResult> {
    scenarios.iter().find(|s| s.name == name)
}

/// The same scenario as measured by each contender of the run: atunnel
/// with the run's flags, then each variant of each comparison.
fn contenders<'a>(r: &'a Results, scenario: &str) -> Vec<(String, &'a ScenarioResult)> {
    let mut out: Vec<(String, &ScenarioResult)> = find(&r.scenarios, scenario)
        .map(|s| ("atunnel".to_string(), s))
        .into_iter()
        .collect();
    for c in &r.comparisons {
        for v in &c.variants {
            if let Some(s) = find(&v.scenarios, scenario) {
                out.push((format!("{} ({})", v.label, c.name), s));
            }
        }
    }
    out
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

/// The ladder: tunnel CPU, tunnel cgroup memory and p99 latency against
/// offered rate; rungs whose verdict is not ok ringed in red.
fn rungs(s: &ScenarioResult) -> Result<String, PlotError> {
    type Metric = (&'static str, fn(&RungResult) -> f64);
    const MIB: f64 = 1024.0 * 1024.0;
    let metrics: [Metric; 3] = [
        ("tunnel CPU (cores)", |r| r.tunnel_cpu_cores),
        ("tunnel cgroup memory (MiB)", |r| {
            r.tunnel_cgroup_bytes as f64 / MIB
        }),
        ("p99 latency (ms)", |r| r.latency_us.p99 as f64 / 1000.0),
    ];
    let mut xs: Vec<f64> = s.rungs.iter().map(|r| r.offered).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let panels: Vec<Panel> = metrics
        .iter()
        .map(|(title, value)| {
            if xs.len() >= 2 {
                let series = Series {
                    label: s.name.clone(),
                    points: s.rungs.iter().map(|r| (r.offered, value(r))).collect(),
                    marked: s.rungs.iter().map(|r| r.verdict != Verdict::Ok).collect(),
                };
                let axes = Axes::new(*title, "offered rate (per second)", *title);
                Panel::lines(axes, vec![series])
            } else {
                // One rate (e.g. the same rate with a setting off and on):
                // a bar per rung.
                let bars = Bars {
                    categories: s
                        .rungs
                        .iter()
                        .enumerate()
                        .map(|(i, r)| format!("rung {} at {}/s", i + 1, tick(r.offered)))
                        .collect(),
                    series: vec![BarSeries::new(
                        s.name.clone(),
                        s.rungs.iter().map(|r| Some(value(r))).collect(),
                    )],
                };
                Panel::bars(Axes::new(*title, "rung (offered rate)", *title), bars)
            }
        })
        .collect();
    let note = if xs.len() >= 2 {
        " (red ring: verdict not ok)"
    } else {
        ""
    };
    render(
        &format!("{}: tunnel against offered rate{note}", s.name),
        &panels,
    )
}

/// Memory per idle connection as one contender measured it in one case at
/// one connection count. A contender measured at several counts has one
/// entry per count, and gets a line.
#[derive(Clone, Debug, PartialEq)]
pub struct PerConnection {
    /// The legend's label: "atunnel", "naive (copy-mode)", "nginx (peers)",
    /// "atunnel, hibernated", ...
    pub label: String,
    /// What was held idle ("http2-one-request"); empty when the scenario
    /// has one kind of connection.
    pub case: String,
    pub conns: f64,
    pub heap_bytes: Option<f64>,
    pub cgroup_bytes: Option<f64>,
}

/// What the run measured per idle connection, from atunnel and each
/// compared variant: egress-idle's one figure; ingress-idle's per case,
/// awake, and hibernated where the contender hibernates (atunnel, whose
/// default it is).
fn idle_contenders(r: &Results, scenario: &str) -> Vec<PerConnection> {
    let mut out = Vec::new();
    for (label, s) in contenders(r, scenario) {
        let conns = f(&s.summary["conns"]).unwrap_or(0.0);
        if scenario != "ingress-idle" {
            let heap = f(&s.summary["heap_bytes_per_conn"]);
            let cgroup = f(&s.summary["cgroup_bytes_per_conn"]);
            if heap.is_some() || cgroup.is_some() {
                out.push(PerConnection {
                    label,
                    case: String::new(),
                    conns,
                    heap_bytes: heap,
                    cgroup_bytes: cgroup,
                });
            }
            continue;
        }
        let hibernated = format!("{label}, hibernated");
        for c in cases(s) {
            let case = c["case"].as_str().unwrap_or("?").to_string();
            let at = |label: &str, heap: &str, cgroup: &str| {
                let (heap, cgroup) = (f(&c[heap]), f(&c[cgroup]));
                (heap.is_some() || cgroup.is_some()).then(|| PerConnection {
                    label: label.to_string(),
                    case: case.clone(),
                    conns,
                    heap_bytes: heap,
                    cgroup_bytes: cgroup,
                })
            };
            out.extend(at(&label, "heap_bytes_per_conn", "cgroup_bytes_per_conn"));
            out.extend(at(
                &hibernated,
                "hibernated_heap_bytes_per_conn",
                "hibernated_cgroup_bytes_per_conn",
            ));
        }
    }
    out
}

fn cases(s: &ScenarioResult) -> &[Value] {
    s.summary["cases"].as_array().map_or(&[], Vec::as_slice)
}

/// Heap and cgroup bytes per idle connection. Lines against the number of
/// connections held when a contender was measured at several counts (a
/// line per contender and case); otherwise bars, a group per case and
/// count, a bar per contender.
pub fn memory_per_connection(
    scenario: &str,
    contenders: &[PerConnection],
) -> Result<String, PlotError> {
    let first_seen = |key: &dyn Fn(&PerConnection) -> String| {
        let mut seen: Vec<String> = Vec::new();
        for c in contenders {
            let k = key(c);
            if !seen.contains(&k) {
                seen.push(k);
            }
        }
        seen
    };
    let line_label = |c: &PerConnection| format!("{} {}", c.label, c.case).trim_end().to_string();
    let group = |c: &PerConnection| {
        let count = format!("{} connections", tick(c.conns));
        if c.case.is_empty() {
            count
        } else {
            format!("{}\n{count}", c.case)
        }
    };
    let several_counts = first_seen(&line_label).iter().any(|l| {
        let mut xs: Vec<f64> = contenders
            .iter()
            .filter(|c| line_label(c) == *l)
            .map(|c| c.conns)
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs.len() >= 2
    });
    let x = "idle connections held";
    let panel = |title: &str, y: &str, value: fn(&PerConnection) -> Option<f64>| {
        let axes = Axes::new(title, x, y);
        if several_counts {
            let series = first_seen(&line_label)
                .into_iter()
                .map(|l| {
                    let points = contenders
                        .iter()
                        .filter(|c| line_label(c) == l)
                        .filter_map(|c| value(c).map(|v| (c.conns, v)))
                        .collect();
                    Series::new(l, points)
                })
                .collect();
            return Panel::lines(axes, series);
        }
        let categories = first_seen(&group);
        let series = first_seen(&|c: &PerConnection| c.label.clone())
            .into_iter()
            .map(|label| {
                let values = categories
                    .iter()
                    .map(|g| {
                        contenders
                            .iter()
                            .find(|c| c.label == label && group(c) == *g)
                            .and_then(value)
                    })
                    .collect();
                BarSeries::new(label, values)
            })
            .collect();
        Panel::bars(axes, Bars { categories, series })
    };
    render(
        &format!("{scenario}: memory per idle connection"),
        &[
            panel(
                "heap per idle connection",
                "heap bytes per connection",
                |c| c.heap_bytes,
            ),
            panel(
                "cgroup memory per idle connection (user and kernel)",
                "cgroup bytes per connection",
                |c| c.cgroup_bytes,
            ),
        ],
    )
}

/// ingress-idle per case: heap and cgroup bytes per connection awake
/// (hibernation off) and hibernated, and atunnel's CPU per connection
/// while they went idle. `None` without cases.
fn hibernation(s: &ScenarioResult) -> Result<Option<String>, PlotError> {
    let cases = cases(s);
    if cases.is_empty() {
        return Ok(None);
    }
    let categories: Vec<String> = cases
        .iter()
        .map(|c| c["case"].as_str().unwrap_or("?").to_string())
        .collect();
    let column = |key: &str| cases.iter().map(|c| f(&c[key])).collect::<Vec<_>>();
    let pair = |title: &str, y: &str, awake: &str, asleep: &str, labels: [&str; 2]| {
        Panel::bars(
            Axes::new(title, "case", y),
            Bars {
                categories: categories.clone(),
                series: vec![
                    BarSeries::new(labels[0], column(awake)),
                    BarSeries::new(labels[1], column(asleep)),
                ],
            },
        )
    };
    let mut panels = vec![
        pair(
            "heap per idle connection",
            "heap bytes per connection",
            "heap_bytes_per_conn",
            "hibernated_heap_bytes_per_conn",
            ["awake (hibernation off)", "hibernated"],
        ),
        pair(
            "cgroup memory per idle connection",
            "cgroup bytes per connection",
            "cgroup_bytes_per_conn",
            "hibernated_cgroup_bytes_per_conn",
            ["awake (hibernation off)", "hibernated"],
        ),
    ];
    if cases
        .iter()
        .any(|c| f(&c["hibernated_idle_cpu_us_per_conn"]).is_some())
    {
        panels.push(pair(
            "atunnel CPU per connection while going idle",
            "CPU us per connection",
            "idle_cpu_us_per_conn",
            "hibernated_idle_cpu_us_per_conn",
            ["hibernation off", "hibernation on"],
        ));
    }
    render("ingress-idle: hibernation, before and after", &panels).map(Some)
}

/// Tunnel CPU per request and requests per tunnel core against offered
/// rate, one series per contender (bars when each has one rate). `None`
/// when no contender has a rung that moved.
fn cpu_per_request(
    scenario: &str,
    contenders: &[(String, &ScenarioResult)],
) -> Result<Option<String>, PlotError> {
    let per = |s: &ScenarioResult, y: fn(&RungResult) -> Option<f64>| {
        s.rungs
            .iter()
            .filter(|r| r.achieved > 0.0 && r.tunnel_cpu_cores > 0.0)
            .filter_map(|r| y(r).map(|y| (r.offered, y)))
            .collect::<Vec<_>>()
    };
    let series = |y: fn(&RungResult) -> Option<f64>| -> Vec<Series> {
        contenders
            .iter()
            .map(|(label, s)| Series::new(label.clone(), per(s, y)))
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let cpu = series(|r| Some(r.tunnel_cpu_cores / r.achieved * 1e6));
    if cpu.is_empty() {
        return Ok(None);
    }
    let rps = series(|r| Some(r.achieved / r.tunnel_cpu_cores));
    let x = "offered rate (requests per second)";
    let panels = [
        xy(
            Axes::new("tunnel CPU per request", x, "CPU us per request"),
            cpu,
            "per second",
        ),
        xy(
            Axes::new(
                "throughput per tunnel core",
                x,
                "requests per second per core",
            ),
            rps,
            "per second",
        ),
    ];
    render(&format!("{scenario}: CPU per request"), &panels).map(Some)
}

/// egress-tcp: MB/s and MB/s per tunnel core of each bulk run, a bar per
/// contender. `None` when no contender has runs.
fn tcp_throughput(contenders: &[(String, &ScenarioResult)]) -> Result<Option<String>, PlotError> {
    let runs = |s: &ScenarioResult, key: &str| -> Vec<Option<f64>> {
        s.summary[key]
            .as_array()
            .map(|a| a.iter().map(f).collect())
            .unwrap_or_default()
    };
    let n = contenders
        .iter()
        .map(|(_, s)| runs(s, "mb_per_s").len())
        .max()
        .unwrap_or(0);
    if n == 0 {
        return Ok(None);
    }
    let categories: Vec<String> = (1..=n).map(|i| format!("run {i}")).collect();
    let mut mbps = Vec::new();
    let mut per_core = Vec::new();
    for (label, s) in contenders {
        let (m, c) = (runs(s, "mb_per_s"), runs(s, "tunnel_cores"));
        per_core.push(BarSeries::new(
            label.clone(),
            (0..n)
                .map(
                    |i| match (m.get(i).copied().flatten(), c.get(i).copied().flatten()) {
                        (Some(m), Some(c)) if c > 0.0 => Some(m / c),
                        _ => None,
                    },
                )
                .collect(),
        ));
        mbps.push(BarSeries::new(
            label.clone(),
            (0..n).map(|i| m.get(i).copied().flatten()).collect(),
        ));
    }
    let panel = |title: &str, y: &str, series| {
        Panel::bars(
            Axes::new(title, "bulk run", y),
            Bars {
                categories: categories.clone(),
                series,
            },
        )
    };
    render(
        "egress-tcp: throughput of one connection",
        &[
            panel("throughput", "MB/s", mbps),
            panel(
                "throughput per tunnel core",
                "MB/s per tunnel core",
                per_core,
            ),
        ],
    )
    .map(Some)
}

/// socket-memory: kernel, heap and total KiB per stalled connection per
/// case, with the bound. `None` without cases.
fn stall_memory(s: &ScenarioResult) -> Result<Option<String>, PlotError> {
    let cases = cases(s);
    if cases.is_empty() {
        return Ok(None);
    }
    let categories = cases
        .iter()
        .map(|c| {
            format!(
                "{}\n({})",
                c["case"].as_str().unwrap_or("?"),
                c["measured"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let column = |key: &str| cases.iter().map(|c| f(&c[key])).collect::<Vec<_>>();
    let mut panel = Panel::bars(
        Axes::new(
            "memory one stalled connection holds, over the idle baseline",
            "case (proxy measured)",
            "KiB per stalled connection",
        ),
        Bars {
            categories,
            series: vec![
                BarSeries::new("kernel (socket buffers)", column("kernel_kib")),
                BarSeries::new("heap", column("heap_kib")),
                BarSeries::new("total", column("total_kib")),
            ],
        },
    );
    if let Some(bound) = f(&s.summary["bound_kib"]) {
        panel.limits.push(Limit {
            label: format!("bound {} KiB", tick(bound)),
            y: bound,
        });
    }
    render("socket-memory: stall memory per case", &[panel]).map(Some)
}

/// The bounds noisy-neighbour holds the victim to.
#[derive(Clone, Copy, Debug)]
pub struct VictimBounds {
    /// Largest p99 under the pattern / baseline that passes.
    pub p99_ratio_max: f64,
    /// Smallest throughput under the pattern / baseline that passes.
    pub tcp_ratio_min: f64,
}

/// noisy-neighbour, one group per hostile pattern (`rows`: the summary's
/// `patterns`): the victim's egress-http p50 and p99, ingress-https p99
/// and egress-tcp MB/s at baseline and under the pattern; their ratios
/// with the bounds; atunnel's memory against the soft threshold; and the
/// seconds to recover ("n/a": never).
pub fn noisy_neighbour(rows: &[Value], bounds: VictimBounds) -> Result<String, PlotError> {
    let categories: Vec<String> = rows
        .iter()
        .map(|r| r["pattern"].as_str().unwrap_or("?").to_string())
        .collect();
    let column = |key: &str, scale: f64| {
        rows.iter()
            .map(|r| f(&r[key]).map(|v| v * scale))
            .collect::<Vec<_>>()
    };
    let bars = |series: Vec<BarSeries>| Bars {
        categories: categories.clone(),
        series,
    };
    let axes = |title: &str, y: &str| Axes::new(title, "hostile pattern", y);
    let ms = 1e-3;
    let mib = 1.0 / 1048576.0;
    let soft = rows
        .iter()
        .filter_map(|r| f(&r["soft_threshold_bytes"]))
        .fold(0.0f64, f64::max)
        * mib;
    let panels = vec![
        Panel::bars(
            axes(
                "victim egress-http latency: baseline and under the pattern",
                "ms",
            ),
            bars(vec![
                BarSeries::new("p50 baseline", column("baseline_http_p50_us", ms)),
                BarSeries::new("p50 under", column("victim_http_p50_us", ms)),
                BarSeries::new("p99 baseline", column("baseline_http_p99_us", ms)),
                BarSeries::new("p99 under", column("victim_http_p99_us", ms)),
            ]),
        ),
        Panel::bars(
            axes(
                "victim ingress-https p99: baseline and under the pattern",
                "ms",
            ),
            bars(vec![
                BarSeries::new("p99 baseline", column("baseline_https_p99_us", ms)),
                BarSeries::new("p99 under", column("victim_https_p99_us", ms)),
            ]),
        ),
        Panel::bars(
            axes("victim egress-tcp: baseline and under the pattern", "MB/s"),
            bars(vec![
                BarSeries::new("baseline", column("baseline_tcp_mb_s", 1.0)),
                BarSeries::new("under", column("victim_tcp_mb_s", 1.0)),
            ]),
        ),
        Panel::bars(
            axes("victim under the pattern / its baseline", "ratio"),
            bars(vec![
                BarSeries::new("egress-http p99", column("victim_p99_ratio", 1.0)),
                BarSeries::new("ingress-https p99", column("victim_https_p99_ratio", 1.0)),
                BarSeries::new("egress-tcp MB/s", column("victim_tcp_ratio", 1.0)),
            ]),
        )
        .with_limits(vec![
            Limit {
                label: format!("p99 bound {}", tick(bounds.p99_ratio_max)),
                y: bounds.p99_ratio_max,
            },
            Limit {
                label: format!("tcp bound {}", tick(bounds.tcp_ratio_min)),
                y: bounds.tcp_ratio_min,
            },
        ]),
        Panel::bars(
            axes(
                "atunnel's cgroup memory: at baseline and the pattern's peak",
                "MiB",
            ),
            bars(vec![
                BarSeries::new("baseline", column("baseline_memory_bytes", mib)),
                BarSeries::new("peak", column("peak_memory_bytes", mib)),
            ]),
        )
        .with_limits(
            (soft > 0.0)
                .then(|| Limit {
                    label: format!("soft threshold {} MiB", tick(soft)),
                    y: soft,
                })
                .into_iter()
                .collect(),
        ),
        Panel::bars(
            axes(
                "from the hostile actor stopping to atunnel back at baseline (n/a: never)",
                "seconds",
            ),
            bars(vec![BarSeries::new(
                "recovered",
                column("recovered_s", 1.0),
            )]),
        ),
    ];
    render(
        "noisy-neighbour: the victim beside each hostile pattern",
        &panels,
    )
}

/// Every plot of the run ([`of_results`]: the ladder of each
/// scenario with rungs, memory per idle connection, hibernation, CPU per
/// request, bulk throughput, stall memory), written into `dir` beside
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::load::results::{Comparison, Latency, Variant};

    fn rung(offered: f64, cores: f64, verdict: Verdict) -> RungResult {
        RungResult {
            offered,
            achieved: offered,
            errors: 0,
            verdict,
            tunnel_cpu_cores: cores,
            tunnel_heap_bytes: 10 << 20,
            tunnel_cgroup_bytes: 30 << 20,
            latency_us: Latency {
                p50: 700,
                p99: 2_000,
                max: 9_000,
            },
            shed: 0,
            dispatch_lag_p99_us: 0,
            notes: String::new(),
        }
    }

    fn idle(heap: f64, cgroup: f64) -> ScenarioResult {
        ScenarioResult {
            name: "egress-idle".into(),
            rungs: vec![rung(200.0, 0.05, Verdict::Ok)],
            summary: json!({"conns": 1000, "heap_bytes_per_conn": heap, "cgroup_bytes_per_conn": cgroup}),
            notes: Vec::new(),
        }
    }

    fn tcp(mbps: [f64; 3], cores: [f64; 3]) -> ScenarioResult {
        ScenarioResult {
            name: "egress-tcp".into(),
            summary: json!({"mb_per_s": mbps, "tunnel_cores": cores}),
            ..ScenarioResult::default()
        }
    }

    fn ingress_idle() -> ScenarioResult {
        let case = |name: &str, heap: f64, hib: f64| {
            json!({"case": name, "heap_bytes_per_conn": heap, "hibernated_heap_bytes_per_conn": hib,
                   "cgroup_bytes_per_conn": heap * 2.0, "hibernated_cgroup_bytes_per_conn": hib * 2.0,
                   "idle_cpu_us_per_conn": 1.0, "hibernated_idle_cpu_us_per_conn": 9.0})
        };
        ScenarioResult {
            name: "ingress-idle".into(),
            rungs: vec![
                rung(1000.0, 0.2, Verdict::Ok),
                rung(1000.0, 0.21, Verdict::Ok),
            ],
            summary: json!({"conns": 150, "cases": [
                case("http1-keepalive-short", 8600.0, 2100.0),
                case("http2-one-request", 21100.0, 3300.0),
            ]}),
            notes: Vec::new(),
        }
    }

    fn sample() -> Results {
        Results {
            scenarios: vec![
                idle(1500.0, 5600.0),
                ScenarioResult {
                    name: "ingress-https".into(),
                    rungs: vec![
                        rung(1000.0, 0.1, Verdict::Ok),
                        rung(2000.0, 0.2, Verdict::Ok),
                        rung(4000.0, 0.5, Verdict::TunnelCpu),
                    ],
                    ..ScenarioResult::default()
                },
                tcp([900.0, 950.0, 870.0], [0.9, 0.95, 0.9]),
                ingress_idle(),
                ScenarioResult {
                    name: "socket-memory".into(),
                    summary: json!({"bound_kib": 64, "cases": [
                        {"case": "actor-stops-reading", "measured": "atunnel", "kernel_kib": 20.0, "heap_kib": 1.5, "total_kib": 21.5},
                        {"case": "destination-stops-reading", "measured": "gateway", "kernel_kib": 300.0, "heap_kib": 0.0, "total_kib": 300.0},
                        {"case": "router-stops-reading", "measured": "atunnel", "kernel_kib": null, "heap_kib": 2.0, "total_kib": null},
                    ]}),
                    ..ScenarioResult::default()
                },
            ],
            comparisons: vec![Comparison {
                name: "copy-mode".into(),
                variants: [
                    ("lean", 1500.0, 5600.0, 950.0),
                    ("naive", 69561.0, 140000.0, 700.0),
                ]
                .into_iter()
                .map(|(label, heap, cgroup, mbps)| Variant {
                    label: label.into(),
                    flags: vec![format!("--copy-mode={label}")],
                    scenarios: vec![idle(heap, cgroup), tcp([mbps; 3], [1.0; 3])],
                })
                .collect(),
            }],
            cost: None,
        }
    }

    /// Well-formed enough for a browser: one `<svg>` document, every
    /// `<text>` closed, no number plotters could not format.
    fn check(svg: &str) {
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1, "{svg}");
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }

    fn hex(i: usize) -> String {
        let c = color(i);
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// plotters writes one element a line: the `<rect>`s filled with series
    /// `i`'s colour (its bars, and its legend swatch in each panel).
    fn rects(svg: &str, i: usize) -> usize {
        let fill = format!(r#"fill="{}""#, hex(i));
        svg.lines()
            .filter(|l| l.starts_with("<rect") && l.contains(&fill))
            .count()
    }

    /// Series `i`'s lines (the axes and ticks are 1 px black polylines).
    fn lines(svg: &str, i: usize) -> usize {
        let stroke = format!(r#"stroke="{}" stroke-width="2""#, hex(i));
        svg.lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
            .count()
    }

    fn markers(svg: &str, i: usize) -> usize {
        let fill = format!(r#"fill="{}""#, hex(i));
        svg.lines()
            .filter(|l| l.starts_with("<circle") && l.contains(&fill))
            .count()
    }

    /// A `<text>` whose whole content is `t`.
    fn text(svg: &str, t: &str) -> usize {
        svg.matches(&format!(">\n{t}\n</text>")).count()
    }

    #[test]
    fn a_cost_unit_is_drawn_with_each_contender_side_by_side_and_a_peers_allocations_as_na() {
        let unit = json!({
            "name": "ingress-https",
            "per": "request",
            "n": 200,
            "contenders": [
                {"name": "atunnel", "instructions": 84400.0, "syscalls": 6.1,
                 "syscalls_by_name": {"writev": 2.0, "recvfrom": 2.0, "epoll_wait": 2.1},
                 "context_switches": 2.0, "allocations": 35.0},
                {"name": "nginx", "instructions": null, "syscalls": 8.0,
                 "syscalls_by_name": {"read": 2.0, "writev": 1.0, "epoll_wait": 2.0},
                 "context_switches": 2.0, "allocations": null},
            ],
        });
        let svg = cost_unit(&unit).expect("drawn");
        check(&svg);
        // Each panel names both contenders.
        assert_eq!(text(&svg, "atunnel"), 3, "{svg}");
        assert_eq!(text(&svg, "nginx"), 3, "{svg}");
        // The syscalls panel's series: the top names and the rest.
        for name in ["writev", "epoll_wait", "read", "rest"] {
            assert!(text(&svg, name) >= 1, "{name} missing: {svg}");
        }
        // nginx's instructions and allocations were not measured.
        assert!(svg.contains("n/a"), "{svg}");
    }

    /// A bar's rect: (series, x, y, width, height) in pixels.
    type Drawn = (usize, f64, f64, f64, f64);

    /// The series-coloured `<rect>`s wider than a legend swatch.
    fn bars_drawn(svg: &str, series: usize) -> Vec<Drawn> {
        let attr = |l: &str, a: &str| -> f64 {
            let start = l.find(&format!(" {a}=\"")).expect("attribute") + a.len() + 3;
            l[start..]
                .split('"')
                .next()
                .expect("value")
                .parse()
                .expect("a number")
        };
        svg.lines()
            .filter(|l| l.starts_with("<rect"))
            .filter_map(|l| {
                let i = (0..series).find(|&i| l.contains(&format!(r#"fill="{}""#, hex(i))))?;
                let r = (
                    i,
                    attr(l, "x"),
                    attr(l, "y"),
                    attr(l, "width"),
                    attr(l, "height"),
                );
                (r.3 > 20.0).then_some(r)
            })
            .collect()
    }

    #[test]
    fn a_cost_units_syscalls_are_one_stacked_bar_per_contender_summing_to_its_total() {
        // Top five over both: recvfrom 6, epoll_wait 4, getpid 3, sendto 3,
        // writev 2; atunnel's futex, close and other are its rest.
        let unit = json!({
            "name": "egress-open",
            "per": "tunnel",
            "n": 64,
            "contenders": [
                {"name": "atunnel", "instructions": 90000.0, "syscalls": 10.0,
                 "syscalls_by_name": {"writev": 2.0, "recvfrom": 2.0, "epoll_wait": 2.0,
                     "sendto": 1.0, "futex": 1.0, "close": 0.5, "other": 1.5},
                 "context_switches": 5.0, "allocations": 19.0},
                {"name": "haproxy", "instructions": null, "syscalls": 12.0,
                 "syscalls_by_name": {"recvfrom": 4.0, "sendto": 2.0, "epoll_wait": 2.0,
                     "getpid": 3.0, "other": 1.0},
                 "context_switches": 4.0, "allocations": null},
            ],
        });
        let svg = cost_unit(&unit).expect("drawn");
        check(&svg);
        // The stacked panel's bars are the only ones drawn as columns of
        // several rects of one x and width: (recvfrom, epoll_wait, getpid, sendto,
        // writev, rest) are series 0-5.
        let drawn = bars_drawn(&svg, 6);
        let mut columns: Vec<(f64, f64)> = drawn.iter().map(|r| (r.1, r.3)).collect();
        columns.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        columns.dedup();
        let columns: Vec<Vec<Drawn>> = columns
            .into_iter()
            .map(|(x, w)| {
                drawn
                    .iter()
                    .copied()
                    .filter(|r| (r.1, r.3) == (x, w))
                    .collect::<Vec<_>>()
            })
            .filter(|c| c.len() >= 2)
            .collect();
        assert_eq!(columns.len(), 2, "a stacked bar per contender: {drawn:?}");
        let mut heights = Vec::new();
        for column in &columns {
            // Each segment starts where the one before it ends (y grows
            // downwards), from the axis up.
            for pair in column.windows(2) {
                let (below, above) = (pair[0], pair[1]);
                assert!(
                    (above.2 + above.4 - below.2).abs() <= 1.0,
                    "segments apart: {column:?}"
                );
            }
            heights.push(column.iter().map(|r| r.4).sum::<f64>());
        }
        // atunnel: 2 + 2 + 1 + 2 + a rest of 3 = 10; haproxy: 4 + 2 + 3 + 2
        // + a rest of 1 = 12: the segments sum to each one's total.
        let ratio = heights[0] / heights[1];
        assert!((ratio - 10.0 / 12.0).abs() < 0.02, "{heights:?}");
        let rest = columns[0]
            .iter()
            .find(|r| r.0 == 5)
            .expect("atunnel's rest");
        assert!(
            (rest.4 / heights[0] - 0.3).abs() < 0.02,
            "{rest:?} of {heights:?}"
        );
        assert!(
            !columns[0].iter().any(|r| r.0 == 2),
            "atunnel makes no getpid"
        );
        // The other panels kept.
        assert!(svg.contains("user-space instructions"), "{svg}");
        assert!(
            svg.contains("context switches and heap allocations"),
            "{svg}"
        );
    }

    fn plot(r: &Results, file: &str) -> String {
        let plots = of_results(r).expect("drawn");
        let names: Vec<&str> = plots.iter().map(|p| p.file.as_str()).collect();
        let p = plots
            .iter()
            .find(|p| p.file == file)
            .unwrap_or_else(|| panic!("{file} not in {names:?}"));
        check(&p.svg);
        p.svg.clone()
    }

    #[test]
    fn category_labels_wrap_to_their_group() {
        assert_eq!(wrap("a\n(atunnel)", 2), ["a", "(atunnel)"]);
        // Six groups leave about 15 characters each.
        assert_eq!(
            wrap("destination-stops-reading\n(gateway)", 6),
            ["destination-", "stops-reading", "(gateway)"]
        );
        assert_eq!(wrap("run 1", 3), ["run 1"]);
        assert_eq!(wrap("x-", 9), ["x-"]);
    }

    #[test]
    fn a_series_with_one_x_value_is_drawn_as_bars_and_with_two_as_a_line() {
        let axes = Axes::new("one point", "connections", "bytes");
        let one = xy(
            axes.clone(),
            vec![Series::new("atunnel", vec![(1000.0, 1500.0)])],
            "conns",
        );
        let Shape::Bars(bars) = &one.shape else {
            panic!("one x value drawn as {:?}", one.shape)
        };
        assert_eq!(bars.categories, ["1000 conns"]);
        let svg = render("one point", &[one]).expect("drawn");
        check(&svg);
        // The bar and the legend's swatch; no line, no marker.
        assert_eq!(
            (rects(&svg, 0), lines(&svg, 0), markers(&svg, 0)),
            (2, 0, 0)
        );
        assert_eq!(text(&svg, "1500"), 1, "the bar's value: {svg}");
        assert_eq!(text(&svg, "1000 conns"), 1, "its category: {svg}");

        let two = xy(
            axes,
            vec![Series::new(
                "atunnel",
                vec![(1000.0, 1500.0), (2000.0, 1400.0)],
            )],
            "conns",
        );
        assert!(matches!(two.shape, Shape::Lines(_)), "{:?}", two.shape);
        let svg = render("two points", &[two]).expect("drawn");
        check(&svg);
        assert_eq!(
            (rects(&svg, 0), lines(&svg, 0), markers(&svg, 0)),
            (1, 1, 2)
        );
    }

    #[test]
    fn a_line_chart_has_a_line_and_a_marker_per_point_for_each_series() {
        let axes = Axes::new("CPU per request", "offered rate (per second)", "CPU us");
        let series = [
            Series::new(
                "atunnel",
                vec![(1000.0, 90.0), (2000.0, 80.0), (4000.0, 85.0)],
            ),
            Series {
                marked: vec![false, true],
                ..Series::new("nginx", vec![(1000.0, 120.0), (2000.0, 110.0)])
            },
        ];
        let svg = line_chart(&axes, &series).expect("drawn");
        check(&svg);
        assert_eq!((lines(&svg, 0), markers(&svg, 0)), (1, 3));
        assert_eq!((lines(&svg, 1), markers(&svg, 1)), (1, 2));
        // The marked point's red ring.
        assert_eq!(
            svg.matches(r##"stroke="#D62728" stroke-width="2""##)
                .count(),
            1
        );
        for t in [
            "CPU per request",
            "offered rate (per second)",
            "CPU us",
            "atunnel",
            "nginx",
        ] {
            assert_eq!(text(&svg, t), 1, "{t}: {svg}");
        }
    }

    #[test]
    fn a_bar_chart_has_a_bar_per_value_and_marks_what_was_not_measured() {
        let axes = Axes::new("stall", "case", "KiB");
        let bars = Bars {
            categories: vec!["a\n(atunnel)".into(), "b".into()],
            series: vec![
                BarSeries::new("kernel", vec![Some(20.0), Some(300.0)]),
                BarSeries::new("heap", vec![Some(1.5), None]),
                BarSeries::new("total", vec![Some(f64::INFINITY), Some(f64::NAN)]),
            ],
        };
        let svg = bar_chart(&axes, &bars).expect("drawn");
        check(&svg);
        // Bars plus one swatch each.
        assert_eq!((rects(&svg, 0), rects(&svg, 1), rects(&svg, 2)), (3, 2, 1));
        assert!(text(&svg, "300") >= 1, "the bar's value: {svg}");
        assert_eq!(text(&svg, "n/a"), 3, "{svg}");
        for t in [
            "stall",
            "case",
            "KiB",
            "kernel",
            "heap",
            "total",
            "a",
            "(atunnel)",
            "b",
            "1.5",
        ] {
            assert_eq!(text(&svg, t), 1, "{t}: {svg}");
        }
    }

    #[test]
    fn values_that_are_not_finite_never_reach_the_svg() {
        let axes = Axes::new("odd", "x", "y");
        let series = [Series::new(
            "s",
            vec![
                (f64::NAN, 1.0),
                (1.0, f64::INFINITY),
                (2.0, 3.0),
                (3.0, f64::NEG_INFINITY),
            ],
        )];
        let svg = render("odd", &[xy(axes.clone(), series.to_vec(), "")]).expect("drawn");
        check(&svg);
        // Only (2, 3) is a point: no marker at a coordinate plotters would
        // make of NaN or infinity (0 or i32::MAX).
        assert_eq!((lines(&svg, 0), markers(&svg, 0)), (1, 1), "{svg}");
        assert!(
            !svg.contains("2147483647") && !svg.contains("-2147483648"),
            "{svg}"
        );
        let empty = line_chart(&axes, &[Series::new("none", vec![(f64::NAN, f64::NAN)])]);
        check(&empty.expect("drawn"));
        let none = bar_chart(&axes, &Bars::default()).expect("drawn");
        check(&none);
    }

    #[test]
    fn idle_memory_per_connection_has_a_bar_per_contender_and_variant() {
        let svg = plot(&sample(), "egress-idle.memory-per-connection.svg");
        // Heap and cgroup panels, atunnel then the two copy modes: one bar
        // and one swatch per panel each, at the one connection count.
        for i in 0..3 {
            assert_eq!(
                (rects(&svg, i), lines(&svg, i)),
                (4, 0),
                "series {i}: {svg}"
            );
        }
        assert_eq!(rects(&svg, 3), 0, "{svg}");
        for t in [
            "heap per idle connection",
            "cgroup memory per idle connection (user and kernel)",
            "heap bytes per connection",
            "cgroup bytes per connection",
            "idle connections held",
            "atunnel",
            "lean (copy-mode)",
            "naive (copy-mode)",
            "69561",
            "140000",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
        assert_eq!(text(&svg, "1000 connections"), 2, "{svg}");

        // ingress-idle: a group per case, awake and hibernated bars in
        // each of the two panels, and the swatches.
        let svg = plot(&sample(), "ingress-idle.memory-per-connection.svg");
        assert_eq!((rects(&svg, 0), rects(&svg, 1)), (6, 6), "{svg}");
        for t in [
            "atunnel",
            "atunnel, hibernated",
            "http1-keepalive-short",
            "http2-one-request",
            "8600",
            "2100",
            "6600",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
        assert_eq!(text(&svg, "150 connections"), 2 * 2, "{svg}");
    }

    #[test]
    fn peers_are_one_more_series_in_the_same_plots() {
        // `--compare peers`: atunnel, nginx and HAProxy each on
        // ingress-https and ingress-idle; a peer has no heap figure and
        // does not hibernate.
        let contender = |label: &str, cores: f64, cgroup: f64, hibernates: bool| {
            let case = |name: &str| {
                let mut c = json!({"case": name, "cgroup_bytes_per_conn": cgroup,
                                   "heap_bytes_per_conn": null});
                if hibernates {
                    c["heap_bytes_per_conn"] = json!(cgroup / 2.0);
                    c["hibernated_heap_bytes_per_conn"] = json!(2000.0);
                    c["hibernated_cgroup_bytes_per_conn"] = json!(4000.0);
                }
                c
            };
            Variant {
                label: label.into(),
                flags: Vec::new(),
                scenarios: vec![
                    ScenarioResult {
                        name: "ingress-https".into(),
                        rungs: vec![
                            rung(1000.0, cores, Verdict::Ok),
                            rung(2000.0, cores * 2.0, Verdict::Ok),
                        ],
                        ..ScenarioResult::default()
                    },
                    ScenarioResult {
                        name: "ingress-idle".into(),
                        summary: json!({"conns": 150, "cases": [
                            case("http1-keepalive-short"), case("http2-one-request")]}),
                        ..ScenarioResult::default()
                    },
                ],
            }
        };
        let r = Results {
            scenarios: Vec::new(),
            comparisons: vec![Comparison {
                name: "peers".into(),
                variants: vec![
                    contender("atunnel", 0.1, 16000.0, true),
                    contender("nginx", 0.08, 15600.0, false),
                    contender("haproxy", 0.09, 17300.0, false),
                ],
            }],
            cost: None,
        };
        let files: Vec<String> = of_results(&r)
            .expect("drawn")
            .into_iter()
            .map(|p| p.file)
            .collect();
        assert_eq!(
            files,
            [
                "ingress-idle.memory-per-connection.svg",
                "ingress-idle.hibernation.svg",
                "ingress-https.cpu-per-request.svg",
            ]
        );
        let svg = plot(&r, "ingress-https.cpu-per-request.svg");
        // A line per contender in each of the two panels, two markers each.
        for i in 0..3 {
            assert_eq!(
                (lines(&svg, i), markers(&svg, i)),
                (2, 4),
                "series {i}: {svg}"
            );
        }
        for t in ["atunnel (peers)", "nginx (peers)", "haproxy (peers)"] {
            assert_eq!(text(&svg, t), 2, "{t}: {svg}");
        }
        let svg = plot(&r, "ingress-idle.memory-per-connection.svg");
        // Series: atunnel, atunnel hibernated, nginx, haproxy; two cases.
        // The peers' heap is not measured: "n/a" in the heap panel.
        assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
        assert_eq!(rects(&svg, 1), 2 * 2 + 2, "{svg}");
        assert_eq!(rects(&svg, 2), 2 + 2, "nginx: cgroup bars only: {svg}");
        assert_eq!(rects(&svg, 3), 2 + 2, "haproxy: cgroup bars only: {svg}");
        assert_eq!(text(&svg, "n/a"), 2 * 2, "{svg}");
        for t in ["15600", "17300", "4000", "atunnel (peers), hibernated"] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
    }

    #[test]
    fn a_contender_measured_at_several_counts_is_one_more_line() {
        let at = |label: &str, conns: f64, heap: f64| PerConnection {
            label: label.into(),
            case: String::new(),
            conns,
            heap_bytes: Some(heap),
            cgroup_bytes: Some(heap * 3.0),
        };
        let contenders = [
            at("atunnel", 1000.0, 1500.0),
            at("atunnel", 10000.0, 1450.0),
            at("nginx", 1000.0, 15600.0),
            at("nginx", 10000.0, 15000.0),
            at("nginx", 20000.0, 15100.0),
        ];
        let svg = memory_per_connection("egress-idle", &contenders).expect("drawn");
        check(&svg);
        // Two panels, a line each; markers per point; the swatches.
        assert_eq!(
            (lines(&svg, 0), markers(&svg, 0), rects(&svg, 0)),
            (2, 4, 2)
        );
        assert_eq!(
            (lines(&svg, 1), markers(&svg, 1), rects(&svg, 1)),
            (2, 6, 2)
        );
        assert_eq!(text(&svg, "nginx"), 2);
    }

    #[test]
    fn hibernation_has_awake_and_hibernated_bars_per_case_and_the_cpu() {
        let svg = plot(&sample(), "ingress-idle.hibernation.svg");
        // Heap, cgroup, CPU: two cases each, and a swatch per panel.
        assert_eq!(
            (rects(&svg, 0), rects(&svg, 1)),
            (3 * 2 + 3, 3 * 2 + 3),
            "{svg}"
        );
        for t in [
            "awake (hibernation off)",
            "hibernated",
            "hibernation on",
            "atunnel CPU per connection while going idle",
            "CPU us per connection",
            "http1-keepalive-short",
            "http2-one-request",
            "8600",
            "2100",
            "21100",
            "3300",
            "9",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
        // Without the CPU figure: two panels.
        let mut r = sample();
        let idle = r
            .scenarios
            .iter_mut()
            .find(|s| s.name == "ingress-idle")
            .expect("there");
        for c in idle.summary["cases"].as_array_mut().expect("cases") {
            c["hibernated_idle_cpu_us_per_conn"] = Value::Null;
        }
        let svg = plot(&r, "ingress-idle.hibernation.svg");
        assert_eq!(rects(&svg, 0), 2 * 2 + 2, "{svg}");
    }

    #[test]
    fn cpu_per_request_is_a_line_per_contender_against_the_rate() {
        let svg = plot(&sample(), "ingress-https.cpu-per-request.svg");
        // Three rungs: a line and three markers in each of the two panels.
        assert_eq!((lines(&svg, 0), markers(&svg, 0)), (2, 6), "{svg}");
        for t in [
            "tunnel CPU per request",
            "CPU us per request",
            "throughput per tunnel core",
            "requests per second per core",
            "offered rate (requests per second)",
            "atunnel",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
        // 0.1 cores at 1,000/s is 100 us a request: the y axis reaches it.
        assert!(text(&svg, "100") >= 1, "{svg}");
        assert!(
            !of_results(&sample())
                .expect("drawn")
                .iter()
                .any(|p| p.file == "egress-http.cpu-per-request.svg")
        );
    }

    #[test]
    fn tcp_throughput_has_a_bar_per_run_and_contender() {
        let svg = plot(&sample(), "egress-tcp.throughput.svg");
        // atunnel, lean, naive: three runs in two panels, a swatch each.
        for i in 0..3 {
            assert_eq!(rects(&svg, i), 2 * 3 + 2, "series {i}: {svg}");
        }
        for t in [
            "run 1",
            "run 3",
            "MB/s",
            "MB/s per tunnel core",
            "naive (copy-mode)",
            "950",
            "1000",
            "700",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
    }

    #[test]
    fn stall_memory_has_kernel_heap_and_total_per_case_with_the_bound() {
        let svg = plot(&sample(), "socket-memory.stall-memory.svg");
        // Three cases; the third has no kernel or total figure.
        assert_eq!(
            (rects(&svg, 0), rects(&svg, 1), rects(&svg, 2)),
            (3, 4, 3),
            "{svg}"
        );
        assert_eq!(text(&svg, "n/a"), 2, "{svg}");
        for t in [
            "kernel (socket buffers)",
            "heap",
            "total",
            "bound 64 KiB",
            "destination-stops-reading",
            "(gateway)",
            "KiB per stalled connection",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
    }

    #[test]
    fn a_run_without_the_figures_draws_none_of_them() {
        assert!(of_results(&Results::default()).expect("drawn").is_empty());
        let bare = |name: &str| ScenarioResult {
            name: name.into(),
            ..ScenarioResult::default()
        };
        let r = Results {
            scenarios: [
                "egress-idle",
                "ingress-idle",
                "egress-tcp",
                "socket-memory",
                "ingress-https",
            ]
            .into_iter()
            .map(bare)
            .collect(),
            comparisons: Vec::new(),
            cost: None,
        };
        let plots = of_results(&r).expect("drawn");
        assert!(
            plots.is_empty(),
            "{:?}",
            plots.iter().map(|p| &p.file).collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_plot_of_a_run_is_named_for_its_scenario() {
        let files: Vec<String> = of_results(&sample())
            .expect("drawn")
            .into_iter()
            .map(|p| p.file)
            .collect();
        assert_eq!(
            files,
            [
                "egress-idle.svg",
                "ingress-https.svg",
                "ingress-idle.svg",
                "egress-idle.memory-per-connection.svg",
                "ingress-idle.memory-per-connection.svg",
                "ingress-idle.hibernation.svg",
                "ingress-https.cpu-per-request.svg",
                "egress-tcp.throughput.svg",
                "socket-memory.stall-memory.svg",
            ]
        );
        // A ladder at one rate (ingress-idle: keep-alive with hibernation
        // off and on) is bars, one per rung.
        let svg = plot(&sample(), "ingress-idle.svg");
        assert_eq!((rects(&svg, 0), lines(&svg, 0)), (3 * 2 + 3, 0), "{svg}");
        assert_eq!(text(&svg, "rung 2 at 1000/s"), 3, "{svg}");
    }

    #[test]
    fn noisy_neighbour_draws_the_victim_beside_its_baseline_per_pattern() {
        let row = |pattern: &str, recovered: Value| {
            json!({"pattern": pattern, "baseline_http_p50_us": 400, "victim_http_p50_us": 450,
                   "baseline_http_p99_us": 900, "victim_http_p99_us": 1800,
                   "baseline_https_p99_us": 1500, "victim_https_p99_us": 1400,
                   "baseline_tcp_mb_s": 600.0, "victim_tcp_mb_s": 570.0,
                   "victim_p99_ratio": 2.0, "victim_https_p99_ratio": 0.93, "victim_tcp_ratio": 0.95,
                   "baseline_memory_bytes": 60u64 << 20, "peak_memory_bytes": 120u64 << 20,
                   "soft_threshold_bytes": 870u64 << 20, "recovered_s": recovered})
        };
        let rows = [
            row("unread-downloads", json!(0.4)),
            row("dns-flood", Value::Null),
        ];
        let bounds = VictimBounds {
            p99_ratio_max: 1.1,
            tcp_ratio_min: 0.9,
        };
        let svg = noisy_neighbour(&rows, bounds).expect("drawn");
        check(&svg);
        // Series 0 is in all six panels (http p50 baseline, https p99
        // baseline, tcp baseline, the http ratio, baseline memory, the
        // recovery, which only the first pattern has); series 3 (http p99
        // under) only in the first.
        assert_eq!(rects(&svg, 0), 2 * 5 + 1 + 6, "{svg}");
        assert_eq!(rects(&svg, 3), 2 + 1, "{svg}");
        assert_eq!(text(&svg, "n/a"), 1, "never recovered: {svg}");
        for t in [
            "0.45",
            "1.8",
            "p99 bound 1.1",
            "tcp bound 0.9",
            "soft threshold 870 MiB",
            "dns-flood",
        ] {
            assert!(text(&svg, t) >= 1, "{t}: {svg}");
        }
    }
}
