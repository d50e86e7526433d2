//! Chart helpers shared by `gt prof`'s pictures (reports, sweep variance): a PNG
//! [`Picture`], categorical box plots (optionally two series side by side), violin plots,
//! interaction line plots, horizontal bar charts and scatter plots, with time and size axes
//! scaled for people. Drawing goes through `visualize`'s glyph canvas and embedded DejaVu Sans,
//! so no picture depends on the machine's fonts.

use crate::visualize::glyphs::{self, Canvas};
use crate::visualize::{boxed, register_fonts, write_png, VisualizeError, FONT};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;
use std::path::Path;

/// A drawing area of a [`Picture`]; split it (`split_evenly`, `split_vertically`) for panels.
pub(crate) type Area<'a> = DrawingArea<Canvas<'a>, Shift>;

/// What drawing on an [`Area`] can fail with.
pub(crate) type DrawError = DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;

/// The result of drawing one chart.
pub(crate) type DrawResult = Result<(), DrawError>;

/// A chart on an [`Area`] with plain number axes.
pub(crate) type Chart<'a, 'b> = ChartContext<'a, Canvas<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Pictures are written at this resolution (it only sets the PNG's pixel density).
const DPI: u32 = 100;

/// Text sizes in pixels, for pictures around 1600 × 1000.
pub(crate) mod px {
    /// Chart titles.
    pub const TITLE: f64 = 20.0;
    /// Tick labels and category names.
    pub const LABEL: f64 = 13.0;
    /// Axis descriptions.
    pub const AXIS: f64 = 15.0;
    /// Notes and legends.
    pub const NOTE: f64 = 14.0;
}

/// Series colours (matplotlib's tab10, which people read as distinct), in order.
pub(crate) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The `i`th palette colour, wrapping around.
pub(crate) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const TEXT: RGBColor = RGBColor(40, 40, 40);
const GREY: RGBColor = RGBColor(120, 120, 120);

/// An RGB picture in memory, white until drawn on, saved as PNG.
pub(crate) struct Picture {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Picture {
    /// A white `width` × `height` picture.
    pub(crate) fn new(width: u32, height: u32) -> Picture {
        Picture { width, height, rgb: vec![255; width as usize * height as usize * 3] }
    }

    /// Draws on the whole picture with `f`.
    pub(crate) fn draw(&mut self, f: impl FnOnce(&Area<'_>) -> DrawResult) -> Result<(), VisualizeError> {
        // plotters draws turned text (axis descriptions) with its own font lookup.
        register_fonts()?;
        let font = glyphs::font().ok_or(VisualizeError::Font)?;
        let root =
            Canvas::new(BitMapBackend::with_buffer(&mut self.rgb, (self.width, self.height)), font).into_drawing_area();
        f(&root).map_err(boxed)?;
        root.present().map_err(boxed)
    }

    /// Writes the picture to `path` as PNG.
    pub(crate) fn save(&self, path: &Path) -> Result<(), VisualizeError> {
        write_png(path, &self.rgb, (self.width, self.height), DPI)
    }

    /// A white `width` × `height` picture drawn by `f`, written to `path` as PNG.
    pub(crate) fn write(
        path: &Path,
        (width, height): (u32, u32),
        f: impl FnOnce(&Area<'_>) -> DrawResult,
    ) -> Result<(), VisualizeError> {
        let mut picture = Picture::new(width, height);
        picture.draw(f)?;
        picture.save(path)
    }

    /// The pixels, RGB row by row.
    #[cfg_attr(not(test), allow(dead_code))] // for checking pictures in tests
    pub(crate) fn pixels(&self) -> &[u8] {
        &self.rgb
    }
}

/// What a chart's values measure, so its axis is scaled for people.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Unit {
    /// Nanoseconds, shown as ns, µs, ms or s.
    Nanoseconds,
    /// Bytes, shown as B, KB, MB or GB (powers of 1000).
    Bytes,
    /// Shown as they are, with this unit name (`TFLOP/s`, `launches`).
    Plain(&'static str),
}

impl Unit {
    /// The divisor and unit name that show values up to `max` as numbers under 1000.
    pub(crate) fn scale(self, max: f64) -> (f64, &'static str) {
        let steps: &[(f64, &'static str)] = match self {
            Unit::Nanoseconds => &[(1.0, "ns"), (1e3, "µs"), (1e6, "ms"), (1e9, "s")],
            Unit::Bytes => &[(1.0, "B"), (1e3, "KB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB")],
            Unit::Plain(name) => return (1.0, name),
        };
        let max = if max.is_finite() { max.abs() } else { 0.0 };
        steps.iter().rev().find(|(d, _)| max >= *d).copied().unwrap_or(steps[0])
    }

    /// `value` in the unit that suits it: `12.3 ms`, `4.56 GB`, `0.8 TFLOP/s`.
    pub(crate) fn format(self, value: f64) -> String {
        let (div, name) = self.scale(value);
        format!("{} {name}", number(value / div))
    }
}

/// A duration in nanoseconds for people: `850 ns`, `12.3 µs`, `4.50 s`.
pub(crate) fn format_ns(ns: f64) -> String {
    Unit::Nanoseconds.format(ns)
}

/// A byte count for people: `512 B`, `1.50 MB`.
pub(crate) fn format_bytes(bytes: f64) -> String {
    Unit::Bytes.format(bytes)
}

/// Three significant digits (`12.3`, `4.50`, `0.0123`), none after the point for whole
/// numbers.
fn number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        "0".to_string()
    } else if x.abs() >= 100.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        let decimals = (2 - x.abs().log10().floor() as i32).clamp(0, 9) as usize;
        format!("{x:.decimals$}")
    }
}

/// The summary of one box: quartiles by linear interpolation (numpy's default), the extremes
/// as whiskers and the mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BoxStats {
    /// Smallest sample.
    pub min: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Largest sample.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// How many samples.
    pub n: usize,
}

/// The box of `samples` (non-finite ones ignored); `None` when none is left.
pub(crate) fn box_stats(samples: &[f64]) -> Option<BoxStats> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(BoxStats {
        min: v[0],
        q1: quantile(&v, 0.25),
        median: quantile(&v, 0.5),
        q3: quantile(&v, 0.75),
        max: v[v.len() - 1],
        mean: v.iter().sum::<f64>() / v.len() as f64,
        n: v.len(),
    })
}

/// The `q` quantile of sorted, non-empty `v`, interpolating between neighbours.
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    let at = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

/// One series of a categorical chart: its name (in the legend) and colour, and samples per
/// category.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Series<'d> {
    /// Its name in the legend.
    pub name: &'d str,
    /// Its colour.
    pub colour: RGBColor,
    /// `(category, samples)`; a category may be missing from a series.
    pub data: &'d [(String, Vec<f64>)],
}

/// The axes of a chart: titles and what the values measure.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axes<'d> {
    /// The chart's title.
    pub title: &'d str,
    /// The horizontal axis' description.
    pub x: &'d str,
    /// The vertical axis' description (the unit is added in brackets).
    pub y: &'d str,
    /// What the vertical values measure.
    pub unit: Unit,
}

/// Every category of `series`, in first-seen order.
fn categories(series: &[Series<'_>]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for s in series {
        for (c, _) in s.data {
            if !names.contains(c) {
                names.push(c.clone());
            }
        }
    }
    names
}

fn text(size: f64, colour: RGBColor, pos: Pos) -> TextStyle<'static> {
    (FONT, size).into_font().color(&colour).pos(pos)
}

/// `label`, cut with `…` to at most `width` pixels at `size`.
fn fit(label: &str, width: f64, size: f64) -> String {
    if glyphs::text_width(label, size) <= width {
        return label.to_string();
    }
    let mut cut: String = label.to_string();
    while cut.pop().is_some() {
        let candidate = format!("{cut}…");
        if glyphs::text_width(&candidate, size) <= width {
            return candidate;
        }
    }
    String::new()
}

/// The value range that shows `lo..hi` with a little room, from 0 when all values are
/// positive (sizes and times read against zero).
fn padded(lo: f64, hi: f64, from_zero: bool) -> Range<f64> {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let lo = if from_zero && lo >= 0.0 { 0.0 } else { lo };
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    let lo = if from_zero && lo >= 0.0 { lo } else { lo - span * 0.05 };
    lo..hi + span * 0.08
}

/// The axis description for `label` in `unit` scaled by `div` to `name`.
fn described(label: &str, name: &str) -> String {
    if name.is_empty() {
        label.to_string()
    } else {
        format!("{label} ({name})")
    }
}

/// A chart frame: title, axes and mesh over `x` × `y`, the vertical axis showing `y_unit`
/// scaled by `y_div`; horizontal tick labels only when `x_ticks` (categorical charts draw
/// their own).
#[allow(clippy::too_many_arguments)]
pub(crate) fn frame<'a, 'b>(
    area: &'a Area<'b>,
    title: &str,
    x: Range<f64>,
    y: Range<f64>,
    x_desc: &str,
    y_desc: &str,
    x_fmt: &dyn Fn(&f64) -> String,
    y_fmt: &dyn Fn(&f64) -> String,
    x_ticks: bool,
) -> Result<Chart<'a, 'b>, DrawError> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, px::TITLE).into_font().color(&TEXT))
        .margin(12)
        .x_label_area_size(if x_ticks { 48 } else { 56 })
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)?;
    let mut mesh = chart.configure_mesh();
    mesh.label_style((FONT, px::LABEL).into_font().color(&TEXT))
        .axis_desc_style((FONT, px::AXIS).into_font().color(&TEXT))
        .light_line_style(TRANSPARENT)
        .x_labels(8)
        .bold_line_style(RGBColor(215, 215, 215))
        .y_desc(y_desc)
        .y_label_formatter(y_fmt)
        .x_label_formatter(x_fmt);
    if x_ticks {
        mesh.x_desc(x_desc);
    } else {
        mesh.disable_x_mesh().x_labels(0);
    }
    mesh.draw()?;
    Ok(chart)
}

/// Names the categories under a categorical chart's slots, centred on `0..n` and cut to fit
/// the slot, with `x_desc` below them.
fn category_labels(area: &Area<'_>, chart: &Chart<'_, '_>, names: &[String], x_desc: &str) -> DrawResult {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    let (bx, by) = area.get_base_pixel();
    let slot = (xs.end - xs.start) as f64 / names.len().max(1) as f64;
    let style = text(px::LABEL, TEXT, Pos::new(HPos::Center, VPos::Top));
    for (i, name) in names.iter().enumerate() {
        let x = chart.backend_coord(&(i as f64, 0.0)).0 - bx;
        let label = fit(name, slot - 4.0, px::LABEL);
        area.draw(&Text::new(label, (x, ys.end - by + 6), style.clone()))?;
    }
    let centre = (xs.start + xs.end) / 2 - bx;
    let desc = text(px::AXIS, TEXT, Pos::new(HPos::Center, VPos::Top));
    area.draw(&Text::new(x_desc.to_string(), (centre, ys.end - by + 28), desc))
}

/// A legend of `items` (name, colour) in the top right corner of the chart's plotting area.
fn legend(area: &Area<'_>, chart: &Chart<'_, '_>, items: &[(&str, RGBColor)]) -> DrawResult {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    let (bx, by) = area.get_base_pixel();
    let width = items.iter().map(|(n, _)| glyphs::text_width(n, px::NOTE)).fold(0.0, f64::max) as i32 + 34;
    let (left, top) = (xs.end - bx - width - 8, ys.start - by + 8);
    let row = 20;
    area.draw(&Rectangle::new(
        [(left - 6, top - 4), (left + width, top + row * items.len() as i32)],
        ShapeStyle { color: WHITE.mix(0.85), filled: true, stroke_width: 0 },
    ))?;
    for (i, (name, c)) in items.iter().enumerate() {
        let y = top + row * i as i32;
        area.draw(&Rectangle::new([(left, y + 3), (left + 18, y + 15)], c.filled()))?;
        let style = text(px::NOTE, TEXT, Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(name.to_string(), (left + 24, y + 9), style))?;
    }
    Ok(())
}

/// Writes `note` in grey at the top left of `area`, under where a title goes: for what a
/// chart leaves out ("no backward signals recorded").
pub(crate) fn note(area: &Area<'_>, note: &str) -> DrawResult {
    let style = text(px::NOTE, GREY, Pos::new(HPos::Left, VPos::Top));
    area.draw(&Text::new(note.to_string(), (96, 36), style))
}

/// An empty chart: `title` and `why` there is nothing to draw.
pub(crate) fn empty(area: &Area<'_>, title: &str, why: &str) -> DrawResult {
    let (w, h) = area.dim_in_pixel();
    let head = text(px::TITLE, TEXT, Pos::new(HPos::Center, VPos::Top));
    area.draw(&Text::new(title.to_string(), (w as i32 / 2, 12), head))?;
    let body = text(px::NOTE, GREY, Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(why.to_string(), (w as i32 / 2, h as i32 / 2), body))
}

/// The vertical scale of values `lo..hi` in `unit`: padded range in scaled units, divisor,
/// and the axis description.
fn y_scale(lo: f64, hi: f64, unit: Unit, label: &str, from_zero: bool) -> (Range<f64>, f64, String) {
    let (div, name) = unit.scale(hi.abs().max(lo.abs()));
    (padded(lo / div, hi / div, from_zero), div, described(label, name))
}

/// A tick label: the value with three significant digits, trailing zeros dropped (`0.2`,
/// `0.015`).
pub(crate) fn tick(v: &f64) -> String {
    let s = number(*v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Box plots of samples per category: a box from the first to the third quartile, the
/// median as a line, whiskers to the smallest and largest sample, the mean as a diamond.
/// With several series each category holds their boxes side by side, and a legend names
/// them; a series without samples for a category leaves its slot empty.
pub(crate) fn box_plot(area: &Area<'_>, axes: Axes<'_>, series: &[Series<'_>]) -> DrawResult {
    let names = categories(series);
    let stats: Vec<Vec<Option<BoxStats>>> = series
        .iter()
        .map(|s| names.iter().map(|c| s.data.iter().find(|(n, _)| n == c).and_then(|(_, v)| box_stats(v))).collect())
        .collect();
    let all: Vec<BoxStats> = stats.iter().flatten().flatten().copied().collect();
    if all.is_empty() {
        return empty(area, axes.title, "no samples");
    }
    let lo = all.iter().map(|b| b.min).fold(f64::INFINITY, f64::min);
    let hi = all.iter().map(|b| b.max).fold(f64::NEG_INFINITY, f64::max);
    let (yr, div, y_desc) = y_scale(lo, hi, axes.unit, axes.y, true);
    let chart = frame(area, axes.title, -0.5..names.len() as f64 - 0.5, yr, "", &y_desc, &tick, &tick, false)?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    let plot = chart.plotting_area();
    for (j, (s, row)) in series.iter().zip(&stats).enumerate() {
        for (i, b) in row.iter().enumerate() {
            let Some(b) = b else { continue };
            let centre = i as f64 - 0.4 + width * (j as f64 + 0.5);
            let (l, r) = (centre - width * 0.4, centre + width * 0.4);
            let line = s.colour.stroke_width(2);
            let y = |v: f64| v / div;
            plot.draw(&PathElement::new(vec![(centre, y(b.min)), (centre, y(b.q1))], line))?;
            plot.draw(&PathElement::new(vec![(centre, y(b.q3)), (centre, y(b.max))], line))?;
            for v in [b.min, b.max] {
                plot.draw(&PathElement::new(vec![(centre - width * 0.2, y(v)), (centre + width * 0.2, y(v))], line))?;
            }
            plot.draw(&Rectangle::new([(l, y(b.q1)), (r, y(b.q3))], s.colour.mix(0.35).filled()))?;
            plot.draw(&Rectangle::new([(l, y(b.q1)), (r, y(b.q3))], line))?;
            plot.draw(&PathElement::new(vec![(l, y(b.median)), (r, y(b.median))], BLACK.stroke_width(2)))?;
            // The mean: a white diamond outlined in black, a few pixels across.
            let corners = vec![(0, -6), (6, 0), (0, 6), (-6, 0)];
            let mut outline = corners.clone();
            outline.push((0, -6));
            plot.draw(
                &(EmptyElement::at((centre, y(b.mean)))
                    + Polygon::new(corners, WHITE.filled())
                    + PathElement::new(outline, BLACK.stroke_width(2))),
            )?;
        }
    }
    category_labels(area, &chart, &names, axes.x)?;
    if series.len() > 1 {
        let items: Vec<(&str, RGBColor)> = series.iter().map(|s| (s.name, s.colour)).collect();
        legend(area, &chart, &items)?;
    }
    Ok(())
}

/// A violin per category: the samples' kernel density (Gaussian kernel, Silverman's
/// bandwidth) mirrored about the slot's centre, widest where samples crowd, with the median
/// as a line. A category whose samples are all equal is a flat line.
pub(crate) fn violin_plot(area: &Area<'_>, axes: Axes<'_>, data: &[(String, Vec<f64>)]) -> DrawResult {
    let clean: Vec<(String, Vec<f64>)> = data
        .iter()
        .map(|(c, v)| {
            let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
            v.sort_by(f64::total_cmp);
            (c.clone(), v)
        })
        .collect();
    let curves: Vec<Vec<(f64, f64)>> = clean.iter().map(|(_, v)| density(v, 64)).collect();
    // The axis holds the densities' tails as well as the samples.
    let values = clean.iter().flat_map(|(_, v)| v.iter().copied()).chain(curves.iter().flatten().map(|p| p.0));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo > hi {
        return empty(area, axes.title, "no samples");
    }
    let (yr, div, y_desc) = y_scale(lo, hi, axes.unit, axes.y, true);
    let chart = frame(area, axes.title, -0.5..clean.len() as f64 - 0.5, yr, "", &y_desc, &tick, &tick, false)?;
    let plot = chart.plotting_area();
    for (i, ((_, v), curve)) in clean.iter().zip(&curves).enumerate() {
        if v.is_empty() {
            continue;
        }
        let c = colour(i);
        let centre = i as f64;
        let peak = curve.iter().map(|p| p.1).fold(0.0, f64::max);
        if peak > 0.0 && curve.len() > 1 {
            let right = curve.iter().map(|&(y, d)| (centre + 0.4 * d / peak, y / div));
            let left = curve.iter().rev().map(|&(y, d)| (centre - 0.4 * d / peak, y / div));
            let outline: Vec<(f64, f64)> = right.chain(left).collect();
            plot.draw(&Polygon::new(outline.clone(), c.mix(0.4).filled()))?;
            let mut closed = outline;
            closed.push(closed[0]);
            plot.draw(&PathElement::new(closed, c.stroke_width(2)))?;
        } else {
            plot.draw(&PathElement::new(
                vec![(centre - 0.4, v[0] / div), (centre + 0.4, v[0] / div)],
                c.stroke_width(2),
            ))?;
        }
        let median = quantile(v, 0.5) / div;
        plot.draw(&PathElement::new(vec![(centre - 0.15, median), (centre + 0.15, median)], BLACK.stroke_width(3)))?;
    }
    let names: Vec<String> = clean.into_iter().map(|(c, _)| c).collect();
    category_labels(area, &chart, &names, axes.x)
}

/// `(value, density)` at `points` values spanning sorted `v` and three bandwidths beyond
/// (cut at zero when every sample is positive: times and sizes are); empty when `v` has no
/// spread.
pub(crate) fn density(v: &[f64], points: usize) -> Vec<(f64, f64)> {
    let n = v.len() as f64;
    if v.len() < 2 || v[0] == v[v.len() - 1] {
        return Vec::new();
    }
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let iqr = quantile(v, 0.75) - quantile(v, 0.25);
    let spread = if iqr > 0.0 { sd.min(iqr / 1.34) } else { sd };
    let h = 0.9 * spread * n.powf(-0.2);
    let lo = if v[0] >= 0.0 { (v[0] - 3.0 * h).max(0.0) } else { v[0] - 3.0 * h };
    let hi = v[v.len() - 1] + 3.0 * h;
    let norm = 1.0 / (n * h * (2.0 * std::f64::consts::PI).sqrt());
    (0..points)
        .map(|k| {
            let y = lo + (hi - lo) * k as f64 / (points - 1) as f64;
            let d: f64 = v.iter().map(|x| (-0.5 * ((y - x) / h).powi(2)).exp()).sum();
            (y, d * norm)
        })
        .collect()
}

/// An interaction plot: one line per series across the categories `x` (in order), a dot at
/// each value; `None` leaves a gap. A legend names the series.
pub(crate) fn line_plot(
    area: &Area<'_>,
    axes: Axes<'_>,
    x: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> DrawResult {
    let values = series.iter().flat_map(|(_, v)| v.iter().flatten().copied()).filter(|v| v.is_finite());
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo > hi || x.is_empty() {
        return empty(area, axes.title, "no values");
    }
    let (yr, div, y_desc) = y_scale(lo, hi, axes.unit, axes.y, true);
    let chart = frame(area, axes.title, -0.5..x.len() as f64 - 0.5, yr, "", &y_desc, &tick, &tick, false)?;
    let plot = chart.plotting_area();
    for (j, (_, v)) in series.iter().enumerate() {
        let c = colour(j);
        // Consecutive known values are joined; a gap starts a new line.
        let mut run: Vec<(f64, f64)> = Vec::new();
        for (i, value) in v.iter().take(x.len()).enumerate() {
            match value.filter(|v| v.is_finite()) {
                Some(value) => {
                    let p = (i as f64, value / div);
                    run.push(p);
                    plot.draw(&Circle::new(p, 5, c.filled()))?;
                }
                None => {
                    plot.draw(&PathElement::new(std::mem::take(&mut run), c.stroke_width(2)))?;
                }
            }
        }
        plot.draw(&PathElement::new(run, c.stroke_width(2)))?;
    }
    category_labels(area, &chart, x, axes.x)?;
    let items: Vec<(&str, RGBColor)> = series.iter().enumerate().map(|(j, (n, _))| (n.as_str(), colour(j))).collect();
    legend(area, &chart, &items)
}

/// Horizontal bars, the first on top, each named on the left and with its value at its end.
pub(crate) fn bar_chart(area: &Area<'_>, axes: Axes<'_>, bars: &[(String, f64)]) -> DrawResult {
    let hi = bars.iter().map(|b| b.1).filter(|v| v.is_finite()).fold(0.0, f64::max);
    if bars.is_empty() {
        return empty(area, axes.title, "no values");
    }
    let (div, name) = axes.unit.scale(hi);
    let n = bars.len() as f64;
    let x_desc = described(axes.x, name);
    let none = |_: &f64| String::new();
    // Room on the left for the names, a third of the area at most.
    let names_width = (area.dim_in_pixel().0 / 3).min(240) as i32;
    let (_, right) = area.split_horizontally(names_width);
    let chart =
        frame(&right, axes.title, padded(0.0, hi / div * 1.1, true), -0.5..n - 0.5, &x_desc, "", &tick, &none, true)?;
    let plot = chart.plotting_area();
    let (bx, by) = area.get_base_pixel();
    let label = text(px::LABEL, TEXT, Pos::new(HPos::Right, VPos::Center));
    let value = text(px::LABEL, TEXT, Pos::new(HPos::Left, VPos::Center));
    for (i, (bar, v)) in bars.iter().enumerate() {
        let y = n - 1.0 - i as f64;
        let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
        plot.draw(&Rectangle::new([(0.0, y - 0.35), (v / div, y + 0.35)], colour(0).filled()))?;
        let (px_end, py) = chart.backend_coord(&(v / div, y));
        area.draw(&Text::new(axes.unit.format(v), (px_end - bx + 4, py - by), value.clone()))?;
        let name = fit(bar, names_width as f64 + 70.0, px::LABEL);
        let left = chart.backend_coord(&(0.0, y)).0 - bx - 8;
        area.draw(&Text::new(name, (left, py - by), label.clone()))?;
    }
    Ok(())
}

/// A scatter plot of `points` (`x`, `y`), each axis scaled by its own unit.
pub(crate) fn scatter(area: &Area<'_>, axes: Axes<'_>, x_unit: Unit, points: &[(f64, f64)]) -> DrawResult {
    let finite: Vec<(f64, f64)> = points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    if finite.is_empty() {
        return empty(area, axes.title, "no values");
    }
    let max = |f: fn(&(f64, f64)) -> f64| finite.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
    let min = |f: fn(&(f64, f64)) -> f64| finite.iter().map(f).fold(f64::INFINITY, f64::min);
    let (xdiv, xname) = x_unit.scale(max(|p| p.0));
    let (yr, ydiv, y_desc) = y_scale(min(|p| p.1), max(|p| p.1), axes.unit, axes.y, true);
    let xr = padded(min(|p| p.0) / xdiv, max(|p| p.0) / xdiv, true);
    let x_desc = described(axes.x, xname);
    let chart = frame(area, axes.title, xr, yr, &x_desc, &y_desc, &tick, &tick, true)?;
    for (x, y) in finite {
        chart.plotting_area().draw(&Circle::new((x / xdiv, y / ydiv), 5, colour(0).mix(0.7).filled()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_interpolate_like_numpy() {
        let b = box_stats(&[4.0, 1.0, 3.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((b.min, b.q1, b.median, b.q3, b.max, b.mean, b.n), (1.0, 1.75, 2.5, 3.25, 4.0, 2.5, 4));
        assert_eq!(box_stats(&[]), None);
        assert_eq!(box_stats(&[7.0]).unwrap().q3, 7.0);
    }

    #[test]
    fn units_scale_for_people() {
        assert_eq!(format_ns(850.0), "850 ns");
        assert_eq!(format_ns(12_300.0), "12.3 µs");
        assert_eq!(format_ns(4.5e9), "4.50 s");
        assert_eq!(format_bytes(1.5e6), "1.50 MB");
        assert_eq!(format_bytes(0.0), "0 B");
        assert_eq!(Unit::Nanoseconds.scale(2.5e6), (1e6, "ms"));
        assert_eq!(Unit::Plain("TFLOP/s").format(0.5), "0.500 TFLOP/s");
        assert_eq!(tick(&0.015), "0.015");
        assert_eq!(tick(&0.2000000001), "0.2");
        assert_eq!(tick(&250.0), "250");
    }

    #[test]
    fn density_integrates_to_about_one() {
        let v: Vec<f64> = (0..50).map(|i| (i % 7) as f64 + 10.0).collect();
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let curve = density(&sorted, 400);
        let step = curve[1].0 - curve[0].0;
        let area: f64 = curve.iter().map(|p| p.1 * step).sum();
        assert!((area - 1.0).abs() < 0.05, "{area}");
        assert!(density(&[3.0, 3.0], 10).is_empty());
    }

    /// Whether the picture's middle has a pixel that is not white.
    fn drawn(p: &Picture) -> bool {
        let (w, h) = (p.width as usize, p.height as usize);
        (h / 4..h * 3 / 4)
            .any(|y| (w / 4..w * 3 / 4).any(|x| p.pixels()[(y * w + x) * 3..][..3].iter().any(|&c| c < 200)))
    }

    #[test]
    fn every_chart_draws() {
        let data = vec![("a".to_string(), vec![1e6, 2e6, 2.5e6, 4e6]), ("b".to_string(), vec![3e6, 3.5e6])];
        let other = vec![("b".to_string(), vec![1e6, 1.2e6])];
        let axes = Axes { title: "t", x: "layer", y: "runtime", unit: Unit::Nanoseconds };
        let series = [
            Series { name: "forward", colour: colour(0), data: &data },
            Series { name: "backward", colour: colour(1), data: &other },
        ];
        let x = vec!["1".to_string(), "2".to_string(), "4".to_string()];
        let lines =
            vec![("fast".to_string(), vec![Some(1.0), None, Some(3.0)]), ("slow".to_string(), vec![Some(2.0); 3])];
        let bars = vec![("matmul".to_string(), 5e6), ("a very long kernel name indeed".to_string(), 1e6)];
        let charts: [&dyn Fn(&Area<'_>) -> DrawResult; 5] = [
            &|a| box_plot(a, axes, &series),
            &|a| violin_plot(a, axes, &data),
            &|a| line_plot(a, axes, &x, &lines),
            &|a| bar_chart(a, axes, &bars),
            &|a| scatter(a, axes, Unit::Plain(""), &[(1.0, 2e3), (5.0, 3e3), (10.0, 5e3)]),
        ];
        for (i, f) in charts.iter().enumerate() {
            let mut p = Picture::new(640, 480);
            p.draw(*f).unwrap();
            assert!(drawn(&p), "chart {i} is blank");
        }
        let mut p = Picture::new(320, 200);
        p.draw(|a| box_plot(a, axes, &[])).unwrap();
    }
}
