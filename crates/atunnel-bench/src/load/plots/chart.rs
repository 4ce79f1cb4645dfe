//! The shapes: plain series in, SVG text out (lines, grouped and stacked
//! bars, panels one under the other). They know nothing of scenarios.

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A plot could not be drawn (plotters reported an error).
#[derive(Debug, thiserror::Error)]
#[error("drawing the plot {title:?}: {message}")]
pub struct PlotError {
    pub(super) title: String,
    pub(super) message: String,
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

pub(super) const WIDTH: u32 = 760;
pub(super) const TITLE_H: u32 = 36;
pub(super) const CHART_H: u32 = 250;
pub(super) const LEGEND_ROW_H: u32 = 20;
pub(super) const LEGEND_ITEM_W: i32 = 225;
pub(super) const FONT: &str = "sans-serif";
/// Tableau 10: distinguishable in print and to most colour-blind readers.
pub(super) const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x17, 0xbe, 0xcf),
];
pub(super) const LIMIT_COLOR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

pub(super) fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

pub(super) fn legend_rows(labels: usize) -> u32 {
    let per_row = ((WIDTH as i32 - 80) / LEGEND_ITEM_W).max(1) as usize;
    labels.div_ceil(per_row) as u32
}

pub(super) fn labels_of(panel: &Panel) -> Vec<String> {
    match &panel.shape {
        Shape::Lines(s) => s.iter().map(|s| s.label.clone()).collect(),
        Shape::Bars(b) | Shape::StackedBars(b) => {
            b.series.iter().map(|s| s.label.clone()).collect()
        }
    }
}

pub(super) fn category_lines(panel: &Panel) -> u32 {
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
pub(super) fn wrap(category: &str, groups: usize) -> Vec<String> {
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

pub(super) fn panel_height(panel: &Panel) -> u32 {
    CHART_H + 14 * category_lines(panel) + LEGEND_ROW_H * legend_rows(labels_of(panel).len())
}

/// Panels one under the other under a title: one SVG file's worth.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: String,
    pub panels: Vec<Panel>,
}

impl Chart {
    pub fn new(title: impl Into<String>, panels: Vec<Panel>) -> Self {
        Chart {
            title: title.into(),
            panels,
        }
    }

    /// Its SVG document ([`render`]).
    pub fn render(&self) -> Result<String, PlotError> {
        render(&self.title, &self.panels)
    }
}

/// One figure of a scenario's: its chart, drawn into
/// `<scenario>.<name>.svg`.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: String,
    pub chart: Chart,
}

impl Figure {
    pub fn new(name: impl Into<String>, chart: Chart) -> Self {
        Figure {
            name: name.into(),
            chart,
        }
    }
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

pub(super) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
pub(super) type DrawResult = Result<(), Box<dyn std::error::Error + 'static>>;

pub(super) fn draw_panel(area: &Area, panel: &Panel, caption: bool) -> DrawResult {
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
pub(super) fn y_range(values: impl Iterator<Item = f64>, limits: &[Limit]) -> std::ops::Range<f64> {
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

pub(super) fn draw_lines(
    area: &Area,
    axes: &Axes,
    series: &[Series],
    limits: &[Limit],
) -> DrawResult {
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

pub(super) fn draw_limits(
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

pub(super) fn draw_bars(
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
pub(super) fn draw_legend(area: &Area, labels: &[String]) -> DrawResult {
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
pub fn tick(v: f64) -> String {
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
