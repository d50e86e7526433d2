//! The instruction-tape timeline picture (`gt visualize`, the seeds' visualizer): a [`Tape`]
//! drawn as one lane per client, the dispatcher and each worker, against seconds since the
//! dispatcher started, in PNG or SVG. Reading logs is [`crate::tape`]'s; this file only draws.
//!
//! What is drawn: a marker per event, coloured by op family ([`OpFamily::rgb`]), shaped by
//! kind (circle RECV, ring SEND, right triangle WORKER_SEND, left triangle WORKER_RECV,
//! diamond INJECT, square CONNECT, hollow square DISCONNECT, cross ERROR, asterisk SIGNAL, dot
//! STATUS) and sized by bytes; EXEC events as bars from their start for their duration; thin
//! arrows client → dispatcher → worker and back; `#SEQ op` labels; signals as red vertical
//! lines (enter solid and named, exit dashed and lighter); a legend of what is present.
//!
//! Large logs are thinned before anything is drawn, so the cost of drawing is bounded by the
//! picture's size, not the log's: markers are merged per (lane, column a few pixels wide,
//! kind, family), EXEC bars per lane and pixel column, signal lines per pixel column, and
//! arrows and labels are drawn only when the log has few events.

use crate::tape::{detail, exec_origin, recv_seq, Lane, LogFormat, OpFamily, Tape};
use gt_transport::{EventKind, LogEvent};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::HashMap;
use std::fmt;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use thiserror::Error;

pub(crate) mod glyphs;

/// The picture's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ImageFormat {
    /// A PNG bitmap.
    #[default]
    Png,
    /// The same picture as SVG.
    Svg,
}

impl ImageFormat {
    /// The format an output path's extension names (`.png`, `.svg`), if any.
    pub fn from_path(path: &Path) -> Option<ImageFormat> {
        let ext = path.extension()?.to_str()?;
        if ext.eq_ignore_ascii_case("png") {
            Some(ImageFormat::Png)
        } else if ext.eq_ignore_ascii_case("svg") {
            Some(ImageFormat::Svg)
        } else {
            None
        }
    }
}

/// How to draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisualizeOptions {
    /// Where the picture is written.
    pub output: PathBuf,
    /// Resolution in dots per inch: every length in the picture (sizes, fonts, lines) is
    /// given in inches or points and scaled by it.
    pub dpi: u32,
    /// PNG or SVG.
    pub format: ImageFormat,
}

impl VisualizeOptions {
    /// The seed's defaults for `output`: 150 dpi, the format its extension names (PNG when
    /// it names none).
    pub fn new(output: impl Into<PathBuf>) -> VisualizeOptions {
        let output = output.into();
        let format = ImageFormat::from_path(&output).unwrap_or_default();
        VisualizeOptions { output, dpi: DEFAULT_DPI, format }
    }
}

impl Default for VisualizeOptions {
    /// The seed's: `tape_timeline.png` at 150 dpi.
    fn default() -> VisualizeOptions {
        VisualizeOptions::new("tape_timeline.png")
    }
}

/// The default resolution.
pub const DEFAULT_DPI: u32 = 150;
/// The resolutions accepted: below this text is unreadable.
pub const MIN_DPI: u32 = 20;
/// Above this a picture of the smallest size already exceeds [`MAX_PIXELS`].
pub const MAX_DPI: u32 = 2400;
/// The largest picture drawn (3 bytes a pixel in memory while drawing a PNG): a 40-inch wide
/// picture at 600 dpi, or a narrower one at more.
pub const MAX_PIXELS: u64 = 200_000_000;

/// Where one lane was drawn, in pixels of the picture: `left..right` is the time axis (the
/// lane's label is left of it), `top..bottom` the lane's band.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneBand {
    /// The lane.
    pub lane: Lane,
    /// Its label as drawn.
    pub label: String,
    /// The first pixel column of the plot.
    pub left: u32,
    /// One past the last pixel column of the plot.
    pub right: u32,
    /// The band's first pixel row.
    pub top: u32,
    /// One past its last pixel row.
    pub bottom: u32,
}

/// What was drawn: the seed's summary lines, and where each lane is.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The file written.
    pub output: PathBuf,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Events in the tape.
    pub events: usize,
    /// Worker lanes.
    pub workers: usize,
    /// Seconds from the first event to the end of the last.
    pub duration: f64,
    /// The lanes, top to bottom.
    pub lanes: Vec<LaneBand>,
    /// Markers, bars and signal lines drawn after thinning (at most a few per pixel column
    /// and lane, however many events).
    pub marks: usize,
    /// Whether the tape had too many events for arrows and labels, which were left out.
    pub dense: bool,
}

impl fmt::Display for Summary {
    /// The seed's lines (no final newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "✓ Visualization saved to: {}", self.output.display())?;
        writeln!(f, "  Resolution: {} x {} pixels", self.width, self.height)?;
        writeln!(f, "  Events: {}", self.events)?;
        writeln!(f, "  Workers: {}", self.workers)?;
        write!(f, "  Duration: {:.3}s", self.duration)
    }
}

/// Why no picture was written.
#[derive(Debug, Error)]
pub enum VisualizeError {
    /// The tape has no event with a usable time (none, or all NaN or absurd).
    #[error("the tape has no events to draw")]
    NoEvents,
    /// The resolution is outside what is drawn.
    #[error("dpi {dpi} is out of range: use {min} to {max}")]
    DpiOutOfRange {
        /// The resolution asked for.
        dpi: u32,
        /// The lowest accepted.
        min: u32,
        /// The highest accepted.
        max: u32,
    },
    /// The picture would be too large to hold in memory.
    #[error("a {width} x {height} picture is larger than {limit} pixels: lower the dpi")]
    TooLarge {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// The limit, [`MAX_PIXELS`].
        limit: u64,
    },
    /// The embedded font could not be loaded (a bug: it is compiled in).
    #[error("the embedded DejaVu Sans font could not be registered")]
    Font,
    /// The drawing library failed.
    #[error("drawing failed: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The PNG encoder failed (it writes the file as it encodes).
    #[error("cannot write {path}: {source}")]
    Encode {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: png::EncodingError,
    },
}

/// Draws `tape` into `options.output` and says what was drawn.
pub fn render(tape: &Tape, options: &VisualizeOptions) -> Result<Summary, VisualizeError> {
    if !(MIN_DPI..=MAX_DPI).contains(&options.dpi) {
        return Err(VisualizeError::DpiOutOfRange { dpi: options.dpi, min: MIN_DPI, max: MAX_DPI });
    }
    register_fonts()?;
    let font = glyphs::font().ok_or(VisualizeError::Font)?;
    let lanes = tape.lanes();
    let layout = Layout::new(tape, &lanes, options.dpi)?;
    let pixels = layout.width as u64 * layout.height as u64;
    if pixels > MAX_PIXELS {
        return Err(VisualizeError::TooLarge { width: layout.width, height: layout.height, limit: MAX_PIXELS });
    }
    let scene = Scene::new(tape, &lanes, &layout);
    let size = (layout.width, layout.height);
    let path = &options.output;
    let write = |source| VisualizeError::Write { path: path.clone(), source };
    match options.format {
        ImageFormat::Png => {
            let mut buf = vec![255u8; pixels as usize * 3];
            {
                let root = glyphs::Canvas::new(BitMapBackend::with_buffer(&mut buf, size), font).into_drawing_area();
                draw(&root, &scene, &layout).map_err(boxed)?;
                root.present().map_err(boxed)?;
            }
            write_png(path, &buf, size, options.dpi)?;
        }
        ImageFormat::Svg => {
            let mut text = String::new();
            {
                let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
                draw(&root, &scene, &layout).map_err(boxed)?;
                root.present().map_err(boxed)?;
            }
            std::fs::write(path, text).map_err(write)?;
        }
    }
    let bands = lanes
        .iter()
        .enumerate()
        .map(|(i, lane)| {
            let (top, bottom) = layout.band(i);
            LaneBand {
                lane: lane.clone(),
                label: scene.lanes[i].label.clone(),
                left: layout.plot.left as u32,
                right: layout.plot.right as u32,
                top: top as u32,
                bottom: bottom as u32,
            }
        })
        .collect();
    Ok(Summary {
        output: path.clone(),
        width: layout.width,
        height: layout.height,
        events: tape.events.len(),
        workers: lanes.iter().filter(|l| matches!(l, Lane::Worker(_))).count(),
        duration: layout.end - layout.start,
        lanes: bands,
        marks: scene.marks(),
        dense: scene.dense,
    })
}

pub(crate) fn boxed<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> VisualizeError {
    VisualizeError::Draw(Box::new(e))
}

/// The family name the font is registered under; SVG viewers read it as their own sans.
pub(crate) const FONT: &str = "sans-serif";

/// Registers DejaVu Sans with plotters once per process, so that no text depends on the
/// fonts the machine has.
pub(crate) fn register_fonts() -> Result<(), VisualizeError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok {
        Ok(())
    } else {
        Err(VisualizeError::Font)
    }
}

pub(crate) fn write_png(path: &Path, rgb: &[u8], (width, height): (u32, u32), dpi: u32) -> Result<(), VisualizeError> {
    let encode = |source| VisualizeError::Encode { path: path.to_path_buf(), source };
    let file =
        std::fs::File::create(path).map_err(|source| VisualizeError::Write { path: path.to_path_buf(), source })?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Mostly white pictures compress well even at the fast level, which keeps a large picture
    // from spending more time in zlib than in drawing.
    encoder.set_compression(png::Compression::Fast);
    let per_metre = (dpi as f64 / 0.0254).round() as u32;
    encoder.set_pixel_dims(Some(png::PixelDimensions { xppu: per_metre, yppu: per_metre, unit: png::Unit::Meter }));
    let mut writer = encoder.write_header().map_err(encode)?;
    writer.write_image_data(rgb).map_err(encode)?;
    writer.finish().map_err(encode)
}

/// Font sizes, in points.
mod pt {
    pub const TITLE: f64 = 14.0;
    pub const NOTE: f64 = 9.0;
    pub const LANE: f64 = 11.0;
    pub const TICK: f64 = 9.0;
    pub const AXIS: f64 = 10.0;
    pub const LEGEND: f64 = 9.0;
    pub const LABEL: f64 = 7.0;
    pub const SIGNAL: f64 = 8.0;
}

/// Lengths, in inches.
mod inch {
    pub const MARGIN: f64 = 0.25;
    pub const TITLE: f64 = 0.55;
    /// The note under the title of a dense picture.
    pub const NOTE: f64 = 0.2;
    /// The strip above the lanes where signal names are written.
    pub const SIGNALS: f64 = 0.45;
    /// The x axis: ticks, their labels and the axis name.
    pub const AXIS: f64 = 0.6;
    /// Between the axis and the legend.
    pub const LEGEND_GAP: f64 = 0.1;
    pub const LEGEND_ROW: f64 = 0.28;
    /// The plot's width: this much, plus [`PER_SECOND`] for each second of the log, up to
    /// [`PLOT_MAX`].
    pub const PLOT_MIN: f64 = 7.0;
    pub const PER_SECOND: f64 = 4.0;
    pub const PLOT_MAX: f64 = 36.0;
    /// Lanes share [`LANES`] inches, each between [`LANE_MIN`] and [`LANE_MAX`].
    pub const LANES: f64 = 24.0;
    pub const LANE_MIN: f64 = 0.3;
    pub const LANE_MAX: f64 = 0.9;
    /// Marker radius: bytes scale it from the smallest to the largest, log-scaled.
    pub const MARKER_MIN: f64 = 0.022;
    pub const MARKER_MAX: f64 = 0.07;
    pub const STATUS_DOT: f64 = 0.012;
}

/// Lane labels longer than this are clipped.
const LABEL_CHARS: usize = 28;
/// Arrows and labels are drawn only when the tape has at most this many events that would
/// get them; past it they would only blacken the picture.
const ANNOTATE_LIMIT: usize = 2000;
/// Bytes for the largest marker: a GiB.
const MARKER_BYTES_MAX: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Copy)]
struct Rect {
    left: i32,
    top: i32,
    right: i32,
    bottom: i32,
}

/// Where everything goes, in pixels, and the time axis.
struct Layout {
    dpi: f64,
    width: u32,
    height: u32,
    /// The time axis, `left..right`, and the lanes, `top..bottom`.
    plot: Rect,
    /// The first event's time and the last one's end.
    start: f64,
    end: f64,
    /// The axis's range (the events' with a margin).
    t0: f64,
    t1: f64,
    lanes: usize,
    /// The title's baseline row, the signal strip's top (equal to `plot.top` without signals).
    title_y: i32,
    /// Whether the tape has too many events for arrows and labels (a note under the title
    /// says so).
    dense: bool,
    signals_top: i32,
    /// Where the legend starts, and its rows.
    legend_top: i32,
    legend_rows: Vec<Vec<LegendItem>>,
}

impl Layout {
    fn new(tape: &Tape, lanes: &[Lane], dpi: u32) -> Result<Layout, VisualizeError> {
        let mut start = f64::INFINITY;
        let mut end = f64::NEG_INFINITY;
        let mut signals = false;
        let mut annotated = 0;
        for e in tape.events.iter().filter(|e| drawable(e)) {
            annotated += usize::from(annotates(e.kind));
            start = start.min(e.elapsed);
            end = end.max(e.elapsed + duration(e));
            signals |= e.kind == EventKind::Signal;
        }
        if start > end || lanes.is_empty() {
            return Err(VisualizeError::NoEvents);
        }
        let span = end - start;
        // A log whose events all happened at once still gets an axis: a millisecond around it.
        let pad = if span >= 1e-6 { span * 0.02 } else { 0.0005 };
        let t0 = if start >= 0.0 { (start - pad).max(0.0) } else { start - pad };
        let t1 = end + pad;

        let dpi_f = dpi as f64;
        let px = |inches: f64| (inches * dpi_f).round() as i32;
        let label_w = lanes.iter().map(|l| text_inches(&lane_label(l), pt::LANE)).fold(0.0, f64::max);
        let label_w = (0.3 + label_w).clamp(1.0, 3.5);
        let plot_w = (inch::PLOT_MIN + inch::PER_SECOND * span).clamp(inch::PLOT_MIN, inch::PLOT_MAX);
        let lane_h = (inch::LANES / lanes.len() as f64).clamp(inch::LANE_MIN, inch::LANE_MAX);
        let width_in = inch::MARGIN + label_w + plot_w + inch::MARGIN * 2.0;

        let left = px(inch::MARGIN + label_w);
        let right = left + px(plot_w);
        let dense = annotated > ANNOTATE_LIMIT;
        let title_y = px(inch::MARGIN + inch::TITLE * 0.55);
        let title_h = if dense { inch::TITLE + inch::NOTE } else { inch::TITLE };
        let signals_top = px(inch::MARGIN + title_h);
        let top = signals_top + if signals { px(inch::SIGNALS) } else { 0 };
        let lanes_h = px(lane_h * lanes.len() as f64);
        let bottom = top + lanes_h;
        let legend_top = bottom + px(inch::AXIS + inch::LEGEND_GAP);
        let legend_rows = legend_rows(tape, (right - left) as f64 / dpi_f);
        let height_in = (legend_top as f64 / dpi_f) + legend_rows.len() as f64 * inch::LEGEND_ROW + inch::MARGIN;
        Ok(Layout {
            dpi: dpi_f,
            width: px(width_in).max(1) as u32,
            height: px(height_in).max(1) as u32,
            plot: Rect { left, top, right, bottom },
            start,
            end,
            t0,
            t1,
            lanes: lanes.len(),
            title_y,
            dense,
            signals_top,
            legend_top,
            legend_rows,
        })
    }

    /// Inches to pixels.
    fn px(&self, inches: f64) -> i32 {
        (inches * self.dpi).round() as i32
    }

    /// Points (font sizes) to pixels.
    fn font(&self, points: f64) -> f64 {
        points * self.dpi / 72.0
    }

    /// A line width given in pixels at 150 dpi.
    fn line(&self, at_150: f64) -> u32 {
        (at_150 * self.dpi / 150.0).round().max(1.0) as u32
    }

    /// The pixel column of time `t`.
    fn x(&self, t: f64) -> i32 {
        let f = (t - self.t0) / (self.t1 - self.t0);
        self.plot.left + (f * (self.plot.right - self.plot.left) as f64).round() as i32
    }

    /// Lane `i`'s band, `top..bottom`.
    fn band(&self, i: usize) -> (i32, i32) {
        let h = (self.plot.bottom - self.plot.top) as f64 / self.lanes as f64;
        (self.plot.top + (h * i as f64).round() as i32, self.plot.top + (h * (i + 1) as f64).round() as i32)
    }

    /// Where lane `i`'s markers sit: its middle, or above its bars when it has some.
    fn marker_y(&self, i: usize, bars: bool) -> i32 {
        let (top, bottom) = self.band(i);
        let f = if bars { 0.33 } else { 0.5 };
        top + ((bottom - top) as f64 * f).round() as i32
    }

    /// Lane `i`'s EXEC bars, `top..bottom`.
    fn bar_rows(&self, i: usize) -> (i32, i32) {
        let (top, bottom) = self.band(i);
        let h = (bottom - top) as f64;
        (top + (h * 0.55).round() as i32, top + (h * 0.82).round() as i32)
    }

    /// Marker radius for `bytes`: log-scaled between the bounds, and no taller than a third
    /// of a lane.
    fn radius(&self, bytes: u64) -> i32 {
        let s = ((1.0 + bytes as f64).ln() / (1.0 + MARKER_BYTES_MAX).ln()).clamp(0.0, 1.0);
        let r = self.px(inch::MARKER_MIN + (inch::MARKER_MAX - inch::MARKER_MIN) * s);
        let (top, bottom) = self.band(0);
        r.min((bottom - top) / 3).max(2)
    }
}

/// The width of `text` in inches at `points`.
fn text_inches(text: &str, points: f64) -> f64 {
    // The font's pixel size for a point size at 72 dpi is the point size.
    glyphs::text_width(text, points) / 72.0
}

/// A duration for people: `2.341 s`, `8.500 ms`, `12.0 µs`.
fn seconds(s: f64) -> String {
    if s == 0.0 {
        "0 s".to_string()
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Times past this many seconds (about 30 years) are garbage, not a long run, and are not
/// drawn: they would stretch the axis to nothing, or past what a float can step through.
const MAX_SECONDS: f64 = 1e9;

/// Whether an event's time can be drawn.
fn drawable(e: &LogEvent) -> bool {
    e.elapsed.abs() <= MAX_SECONDS
}

/// Seconds an event lasted: its duration when it has a sane one.
fn duration(e: &LogEvent) -> f64 {
    match e.duration {
        Some(d) if d > 0.0 && d <= MAX_SECONDS => d,
        _ => 0.0,
    }
}

fn lane_label(lane: &Lane) -> String {
    let label = lane.label();
    if label.chars().count() <= LABEL_CHARS {
        return label;
    }
    let mut clipped: String = label.chars().take(LABEL_CHARS - 1).collect();
    clipped.push('…');
    clipped
}

/// A marker's shape, one per event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    Dot,
    Square,
    HollowSquare,
    Diamond,
    Circle,
    Ring,
    TriangleRight,
    TriangleLeft,
    Cross,
    Asterisk,
}

/// The marker of a kind; `None` for EXEC, drawn as a bar. The order of [`Shape`] is the
/// order of drawing, so that rare kinds (errors, signals) end on top.
fn shape(kind: EventKind) -> Option<Shape> {
    Some(match kind {
        EventKind::Recv => Shape::Circle,
        EventKind::Send => Shape::Ring,
        EventKind::WorkerSend => Shape::TriangleRight,
        EventKind::WorkerRecv => Shape::TriangleLeft,
        EventKind::Connect => Shape::Square,
        EventKind::Disconnect => Shape::HollowSquare,
        EventKind::Signal => Shape::Asterisk,
        EventKind::Inject => Shape::Diamond,
        EventKind::Error => Shape::Cross,
        EventKind::Status => Shape::Dot,
        EventKind::Exec => return None,
    })
}

/// Whether events of a kind get arrows or labels (and so count towards a dense picture).
fn annotates(kind: EventKind) -> bool {
    matches!(kind, EventKind::Recv | EventKind::Send | EventKind::WorkerSend | EventKind::WorkerRecv | EventKind::Exec)
}

/// Whether a kind's colour is its op family's (the others have one colour each).
fn coloured_by_family(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Recv
            | EventKind::Send
            | EventKind::WorkerSend
            | EventKind::WorkerRecv
            | EventKind::Inject
            | EventKind::Exec
    )
}

const SIGNAL_RED: RGBColor = RGBColor(220, 0, 0);
const PEER_GREY: RGBColor = RGBColor(90, 90, 90);
const STATUS_GREY: RGBColor = RGBColor(170, 170, 170);
const ERROR_BLACK: RGBColor = RGBColor(0, 0, 0);
const ARROW: RGBColor = RGBColor(120, 120, 120);
const BAND_SHADE: RGBColor = RGBColor(246, 247, 250);
const RULE: RGBColor = RGBColor(210, 210, 215);
const GRID: RGBColor = RGBColor(228, 228, 232);
const TEXT: RGBColor = RGBColor(20, 20, 20);
const MUTED: RGBColor = RGBColor(110, 110, 110);

fn colour(kind: EventKind, family: OpFamily) -> RGBColor {
    if coloured_by_family(kind) {
        let (r, g, b) = family.rgb();
        return RGBColor(r, g, b);
    }
    match kind {
        EventKind::Signal => SIGNAL_RED,
        EventKind::Error => ERROR_BLACK,
        EventKind::Status => STATUS_GREY,
        _ => PEER_GREY,
    }
}

/// An event's op family: its command's, or for a Python GT message the `op=` in its details.
fn family(e: &LogEvent) -> OpFamily {
    OpFamily::of(&e.command, &e.details)
}

/// A signal's name: `enter`/`exit` events carry it after their `#SEQ`.
fn signal_name(e: &LogEvent) -> &str {
    if is_signal_edge(&e.command) {
        e.details.split_whitespace().find(|w| !w.starts_with('#') && !w.contains('=')).unwrap_or(&e.command)
    } else {
        &e.command
    }
}

fn is_signal_edge(command: &str) -> bool {
    ["enter", "exit"].iter().any(|c| command.eq_ignore_ascii_case(c))
}

fn is_signal_exit(command: &str) -> bool {
    command.eq_ignore_ascii_case("exit")
}

struct LaneInfo {
    label: String,
    /// Whether it has EXEC bars (its markers move up to make room).
    bars: bool,
}

struct Marker {
    x: i32,
    y: i32,
    radius: i32,
    shape: Shape,
    colour: RGBColor,
}

struct Bar {
    x0: i32,
    /// Inclusive: a bar is at least one pixel wide.
    x1: i32,
    top: i32,
    bottom: i32,
    colour: RGBColor,
}

struct Arrow {
    x: i32,
    from_y: i32,
    to_y: i32,
    /// How far short of `to_y` to stop: the target marker's radius.
    short: i32,
}

struct Label {
    x: i32,
    y: i32,
    text: String,
    pos: Pos,
}

struct SignalLine {
    x: i32,
    exit: bool,
}

/// Everything to draw, in pixels, after thinning.
struct Scene {
    title: String,
    lanes: Vec<LaneInfo>,
    markers: Vec<Marker>,
    bars: Vec<Bar>,
    arrows: Vec<Arrow>,
    labels: Vec<Label>,
    signals: Vec<SignalLine>,
    signal_labels: Vec<Label>,
    dense: bool,
}

/// A marker bucket: lane, column, kind (its index in [`EventKind::ALL`]) and family (in
/// [`OpFamily::ALL`]).
type BucketKey = (usize, i32, usize, usize);

/// One lane's EXEC bars, each `(first column, last column, family)`, merged so that at most
/// one bar covers a pixel column: a bar that starts where the run of its family ends extends
/// it, one hidden under the run is dropped, and any other starts a new run after it (a
/// worker runs one instruction at a time, so overlaps are rounding).
fn merge_spans(mut spans: Vec<(i32, i32, OpFamily)>) -> Vec<(i32, i32, OpFamily)> {
    spans.sort_unstable_by_key(|s| (s.0, s.1));
    let mut merged = Vec::new();
    let mut run: Option<(i32, i32, OpFamily)> = None;
    for (x0, x1, fam) in spans {
        run = match run {
            None => Some((x0, x1, fam)),
            Some((r0, r1, rf)) if rf == fam && x0 <= r1 + 1 => Some((r0, r1.max(x1), rf)),
            Some(r) if x1 <= r.1 => Some(r),
            Some(r) => {
                merged.push(r);
                Some((x0.max(r.1 + 1), x1, fam))
            }
        };
    }
    merged.extend(run);
    merged
}

impl Scene {
    fn new(tape: &Tape, lanes: &[Lane], layout: &Layout) -> Scene {
        // Lanes are looked up by source (and whether the event is one that Lane::of puts on
        // the dispatcher's lane whatever its source), so a million events cost a million
        // hash look-ups, not a million lane names built and compared.
        let mut lane_of: HashMap<(&str, bool), Option<usize>> = HashMap::new();
        let mut events: Vec<(usize, &LogEvent)> = Vec::with_capacity(tape.events.len());
        for e in tape.events.iter().filter(|e| drawable(e)) {
            let forced = matches!(e.kind, EventKind::Error | EventKind::Inject);
            let lane = *lane_of.entry((e.source.as_str(), forced)).or_insert_with(|| {
                let lane = Lane::of(e);
                lanes.iter().position(|l| *l == lane)
            });
            if let Some(i) = lane {
                events.push((i, e));
            }
        }

        let mut info: Vec<LaneInfo> = lanes.iter().map(|l| LaneInfo { label: lane_label(l), bars: false }).collect();
        for &(i, e) in &events {
            if e.kind == EventKind::Exec {
                info[i].bars = true;
            }
        }
        let marker_y: Vec<i32> = (0..lanes.len()).map(|i| layout.marker_y(i, info[i].bars)).collect();
        let dispatcher = lanes.iter().position(|l| *l == Lane::Dispatcher);

        // Markers: one per (lane, column, kind, family), sized by the bucket's largest event.
        // A column is a third of the smallest marker wide: markers closer than that overlap
        // anyway.
        let column_w = (layout.radius(0) * 2 / 3).max(1);
        // Per bucket: the largest event's bytes, and how many events it holds.
        let mut buckets: HashMap<BucketKey, (u64, u32)> = HashMap::new();
        // EXEC bars per lane, in pixels: (first column, last column, family).
        let mut spans: Vec<Vec<(i32, i32, OpFamily)>> = vec![Vec::new(); lanes.len()];
        let mut signal_columns: HashMap<(i32, bool), &str> = HashMap::new();
        for &(i, e) in &events {
            let x = layout.x(e.elapsed);
            let fam = family(e);
            match e.kind {
                EventKind::Exec => {
                    let x1 = layout.x(e.elapsed + duration(e)).max(x);
                    spans[i].push((x, x1, fam));
                }
                EventKind::Signal => {
                    let name = signal_name(e);
                    signal_columns.entry((x, is_signal_exit(&e.command))).or_insert(name);
                }
                _ => {}
            }
            if shape(e.kind).is_some() {
                let column = (x - layout.plot.left) / column_w;
                let fam = if coloured_by_family(e.kind) { fam } else { OpFamily::Other };
                let key = (i, column, e.kind as usize, fam as usize);
                let (bytes, count) = buckets.entry(key).or_insert((0, 0));
                *bytes = (*bytes).max(e.bytes);
                *count = count.saturating_add(1);
            }
        }

        // Drawn shape by shape, and within a shape the fullest buckets last, so that where
        // families share a column the most frequent one shows.
        let mut keyed: Vec<(Shape, u32, BucketKey, u64)> = buckets
            .into_iter()
            .filter_map(|(key, (bytes, count))| Some((shape(EventKind::ALL[key.2])?, count, key, bytes)))
            .collect();
        keyed.sort_unstable();
        let markers = keyed
            .into_iter()
            .map(|(shape, _, (lane, column, kind, fam), bytes)| {
                let (kind, fam) = (EventKind::ALL[kind], OpFamily::ALL[fam]);
                let radius = match kind {
                    EventKind::Status => layout.px(inch::STATUS_DOT).max(1),
                    EventKind::Signal | EventKind::Error | EventKind::Connect | EventKind::Disconnect => {
                        layout.radius(1 << 10)
                    }
                    _ => layout.radius(bytes),
                };
                let y = match kind {
                    // Gauges sit at the bottom of the lane, out of the way.
                    EventKind::Status => layout.band(lane).1 - radius - layout.px(0.03),
                    _ => marker_y[lane],
                };
                let x = layout.plot.left + column * column_w + column_w / 2;
                Marker { x, y, radius, shape, colour: colour(kind, fam) }
            })
            .collect();

        let mut bars = Vec::new();
        for (i, spans) in spans.into_iter().enumerate() {
            let (top, bottom) = layout.bar_rows(i);
            bars.extend(merge_spans(spans).into_iter().map(|(x0, x1, fam)| {
                let (r, g, b) = fam.rgb();
                Bar { x0, x1, top, bottom, colour: RGBColor(r, g, b) }
            }));
        }

        let mut signal_columns: Vec<((i32, bool), &str)> = signal_columns.into_iter().collect();
        signal_columns.sort_unstable();
        let signals = signal_columns.iter().map(|&((x, exit), _)| SignalLine { x, exit }).collect();
        let signal_labels = signal_labels(layout, &signal_columns);

        let dense = layout.dense;
        let (mut arrows, mut labels) = (Vec::new(), Vec::new());
        if !dense {
            // Per lane, where the last label ended, so that labels never overlap.
            let mut label_end = vec![i32::MIN; lanes.len()];
            let mut exec_label_end = vec![i32::MIN; lanes.len()];
            let show_exec_labels = {
                let (top, bottom) = layout.band(0);
                (bottom - top) as f64 >= layout.dpi * 0.5
            };
            for &(i, e) in &events {
                let x = layout.x(e.elapsed);
                let radius = layout.radius(e.bytes);
                let flow = match (e.kind, dispatcher) {
                    (EventKind::Recv, Some(d)) => Some((i, d)),
                    (EventKind::Send, Some(d)) => Some((d, i)),
                    (EventKind::WorkerSend, Some(d)) => Some((d, i)),
                    (EventKind::WorkerRecv, Some(d)) => Some((i, d)),
                    _ => None,
                };
                if let Some((from, to)) = flow.filter(|(from, to)| from != to) {
                    arrows.push(Arrow { x, from_y: marker_y[from], to_y: marker_y[to], short: radius });
                }
                let (text, y, pos, ends) = match e.kind {
                    EventKind::Recv => {
                        let seq = recv_seq(e).or((tape.format != LogFormat::Gt).then_some(e.seq));
                        let op = detail(&e.details, "op").unwrap_or(&e.command);
                        let text = match seq {
                            Some(s) => format!("#{s} {op}"),
                            None => op.to_string(),
                        };
                        let y = marker_y[i] - radius - layout.px(0.02);
                        (text, y, Pos::new(HPos::Center, VPos::Bottom), &mut label_end)
                    }
                    EventKind::Exec if show_exec_labels => {
                        let Some((_, seq)) = exec_origin(e) else { continue };
                        let y = layout.bar_rows(i).1 + layout.px(0.01);
                        (format!("#{seq}"), y, Pos::new(HPos::Left, VPos::Top), &mut exec_label_end)
                    }
                    _ => continue,
                };
                let text: String = text.chars().take(18).collect();
                let w = glyphs::text_width(&text, layout.font(pt::LABEL)).ceil() as i32;
                let x0 = if matches!(pos.h_pos, HPos::Center) { x - w / 2 } else { x };
                if x0 > ends[i] {
                    ends[i] = x0 + w + layout.px(0.04);
                    labels.push(Label { x, y, text, pos });
                }
            }
            arrows.sort_unstable_by_key(|a| (a.x, a.from_y, a.to_y));
            arrows.dedup_by_key(|a| (a.x, a.from_y, a.to_y));
        }
        let workers = lanes.iter().filter(|l| matches!(l, Lane::Worker(_))).count();
        let title = format!(
            "gt instruction tape: {} events, {workers} worker{}, {}",
            tape.events.len(),
            if workers == 1 { "" } else { "s" },
            seconds(layout.end - layout.start)
        );
        Scene { title, lanes: info, markers, bars, arrows, labels, signals, signal_labels, dense }
    }

    fn marks(&self) -> usize {
        self.markers.len() + self.bars.len() + self.signals.len()
    }
}

/// Names for the signal lines that begin scopes, in up to two staggered rows above the
/// lanes, skipping any that would overlap the one before in both rows.
fn signal_labels(layout: &Layout, columns: &[((i32, bool), &str)]) -> Vec<Label> {
    let row_h = layout.font(pt::SIGNAL * 1.35).round() as i32;
    let mut ends = [i32::MIN; 2];
    let mut labels = Vec::new();
    for &((x, exit), name) in columns {
        if exit {
            continue;
        }
        let text: String = name.chars().take(24).collect();
        let w = glyphs::text_width(&text, layout.font(pt::SIGNAL)).ceil() as i32;
        let Some(row) = (0..2).find(|&r| x > ends[r]) else { continue };
        ends[row] = x + w + layout.px(0.08);
        let y = layout.signals_top + layout.px(0.04) + row as i32 * row_h;
        labels.push(Label { x: x + layout.px(0.03), y, text, pos: Pos::new(HPos::Left, VPos::Top) });
    }
    labels
}

/// One legend entry: a swatch and a name.
#[derive(Debug, Clone)]
enum LegendItem {
    Heading(&'static str),
    Family(OpFamily),
    Kind(EventKind),
    SignalEnter,
    SignalExit,
}

impl LegendItem {
    fn text(&self) -> String {
        match self {
            LegendItem::Heading(h) => h.to_string(),
            LegendItem::Family(f) => f.name().to_string(),
            LegendItem::Kind(EventKind::Exec) => "EXEC (bar: run time)".to_string(),
            LegendItem::Kind(k) => k.name().to_string(),
            LegendItem::SignalEnter => "signal enter".to_string(),
            LegendItem::SignalExit => "signal exit".to_string(),
        }
    }

    /// Its width in inches: the swatch, the text, the gap after it.
    fn width(&self) -> f64 {
        let swatch = if matches!(self, LegendItem::Heading(_)) { 0.0 } else { 0.25 };
        swatch + text_inches(&self.text(), pt::LEGEND) + 0.2
    }
}

/// The legend: the op families present (in [`OpFamily::ALL`]'s order), then the event kinds,
/// then signals, wrapped into rows `width` inches wide.
fn legend_rows(tape: &Tape, width: f64) -> Vec<Vec<LegendItem>> {
    let mut families = [false; OpFamily::ALL.len()];
    let mut kinds = [false; EventKind::ALL.len()];
    let (mut enter, mut exit) = (false, false);
    for e in &tape.events {
        kinds[e.kind as usize] = true;
        if coloured_by_family(e.kind) {
            families[family(e) as usize] = true;
        }
        if e.kind == EventKind::Signal {
            if is_signal_exit(&e.command) {
                exit = true;
            } else {
                enter = true;
            }
        }
    }
    let mut groups = Vec::new();
    let fams: Vec<LegendItem> =
        OpFamily::ALL.iter().filter(|f| families[**f as usize]).map(|f| LegendItem::Family(*f)).collect();
    if !fams.is_empty() {
        groups.push((LegendItem::Heading("op families:"), fams));
    }
    let ks: Vec<LegendItem> = EventKind::ALL
        .iter()
        .filter(|k| kinds[**k as usize] && **k != EventKind::Signal)
        .map(|k| LegendItem::Kind(*k))
        .collect();
    if !ks.is_empty() {
        groups.push((LegendItem::Heading("events:"), ks));
    }
    let mut sig = Vec::new();
    if enter {
        sig.push(LegendItem::SignalEnter);
    }
    if exit {
        sig.push(LegendItem::SignalExit);
    }
    if !sig.is_empty() {
        groups.push((LegendItem::Heading("signals:"), sig));
    }
    let mut rows = Vec::new();
    for (heading, items) in groups {
        let mut row = vec![heading.clone()];
        let mut used = heading.width();
        for item in items {
            if used + item.width() > width && row.len() > 1 {
                rows.push(std::mem::take(&mut row));
                used = 0.0;
            }
            used += item.width();
            row.push(item);
        }
        rows.push(row);
    }
    rows
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn style(colour: RGBColor, filled: bool, width: u32) -> ShapeStyle {
    ShapeStyle { color: colour.to_rgba(), filled, stroke_width: width }
}

fn text_style(layout: &Layout, points: f64, colour: RGBColor, pos: Pos) -> TextStyle<'static> {
    (FONT, layout.font(points)).into_font().color(&colour).pos(pos)
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, scene: &Scene, layout: &Layout) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let plot = layout.plot;

    // Title, and what was left out of a dense picture.
    let title = text_style(layout, pt::TITLE, TEXT, Pos::new(HPos::Left, VPos::Center));
    root.draw(&Text::new(scene.title.as_str(), (plot.left, layout.title_y), title))?;
    if scene.dense {
        let note = text_style(layout, pt::NOTE, MUTED, Pos::new(HPos::Left, VPos::Center));
        let text = format!(
            "dense log: markers merged per column, EXEC bars per pixel; arrows and labels left out (over {ANNOTATE_LIMIT} events)"
        );
        root.draw(&Text::new(text, (plot.left, layout.title_y + layout.px(inch::NOTE * 1.2)), note))?;
    }

    // Lane bands, shaded in turn, with their labels.
    let lane_text = text_style(layout, pt::LANE, TEXT, Pos::new(HPos::Right, VPos::Center));
    for (i, lane) in scene.lanes.iter().enumerate() {
        let (top, bottom) = layout.band(i);
        if i % 2 == 1 {
            root.draw(&Rectangle::new([(plot.left, top), (plot.right, bottom)], style(BAND_SHADE, true, 1)))?;
        }
        let y = (top + bottom) / 2;
        root.draw(&Text::new(lane.label.clone(), (plot.left - layout.px(0.12), y), lane_text.clone()))?;
    }

    // The time axis and its grid.
    // About a label an inch, and as many decimals as the step between them needs: plotters
    // steps by 1, 2 or 5 times a power of ten, and never by less than span / labels.
    let ticks = (((plot.right - plot.left) as f64 / layout.dpi) as usize).max(2);
    let decimals = {
        let step = (layout.t1 - layout.t0) / ticks as f64;
        (-step.log10().floor()).clamp(0.0, 9.0) as usize
    };
    let formatter = |v: &f64| format!("{v:.decimals$}");
    {
        let area = root.clone().shrink(
            (plot.left, plot.top),
            ((plot.right - plot.left) as u32, (plot.bottom - plot.top + layout.px(inch::AXIS)) as u32),
        );
        let mut chart = ChartBuilder::on(&area)
            .x_label_area_size(layout.px(inch::AXIS) as u32)
            .build_cartesian_2d(layout.t0..layout.t1, 0f64..1f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_labels(ticks)
            .max_light_lines(0)
            .bold_line_style(style(GRID, false, layout.line(1.0)))
            .axis_style(style(MUTED, false, layout.line(1.0)))
            .set_all_tick_mark_size(layout.px(0.05))
            .x_label_formatter(&formatter)
            .x_label_style((FONT, layout.font(pt::TICK)).into_font().color(&TEXT))
            .x_desc("seconds since the dispatcher started")
            .axis_desc_style((FONT, layout.font(pt::AXIS)).into_font().color(&TEXT))
            .draw()?;
    }
    for i in 1..scene.lanes.len() {
        let y = layout.band(i).0;
        root.draw(&PathElement::new(vec![(plot.left, y), (plot.right, y)], style(RULE, false, layout.line(1.0))))?;
    }
    root.draw(&Rectangle::new(
        [(plot.left, plot.top), (plot.right, plot.bottom)],
        style(RULE, false, layout.line(1.0)),
    ))?;

    // Signals under everything else: entered scopes solid, exits dashed and lighter.
    let enter = ShapeStyle { color: SIGNAL_RED.mix(0.8), filled: false, stroke_width: layout.line(1.5) };
    let exit = ShapeStyle { color: SIGNAL_RED.mix(0.35), filled: false, stroke_width: layout.line(1.0) };
    for s in &scene.signals {
        if s.exit {
            let dash = layout.px(0.05).max(2);
            let mut y = layout.signals_top;
            while y < plot.bottom {
                root.draw(&PathElement::new(vec![(s.x, y), (s.x, (y + dash).min(plot.bottom))], exit))?;
                y += dash * 2;
            }
        } else {
            root.draw(&PathElement::new(vec![(s.x, layout.signals_top), (s.x, plot.bottom)], enter))?;
        }
    }
    let signal_text = text_style(layout, pt::SIGNAL, SIGNAL_RED, Pos::new(HPos::Left, VPos::Top));
    for l in &scene.signal_labels {
        root.draw(&Text::new(l.text.clone(), (l.x, l.y), signal_text.clone().pos(l.pos)))?;
    }

    // Flow arrows, thin and light, under the markers.
    let arrow = ShapeStyle { color: ARROW.mix(0.45), filled: false, stroke_width: layout.line(1.0) };
    let head = ShapeStyle { color: ARROW.mix(0.6), filled: true, stroke_width: 1 };
    let head_len = layout.px(0.035).max(3);
    for a in &scene.arrows {
        let dir = if a.to_y > a.from_y { 1 } else { -1 };
        let tip = a.to_y - dir * (a.short + 1);
        root.draw(&PathElement::new(vec![(a.x, a.from_y), (a.x, tip)], arrow))?;
        let base = tip - dir * head_len;
        root.draw(&Polygon::new(vec![(a.x, tip), (a.x - head_len / 2, base), (a.x + head_len / 2, base)], head))?;
    }

    // Execution: bars at least a pixel wide.
    for b in &scene.bars {
        root.draw(&Rectangle::new([(b.x0, b.top), (b.x1 + 1, b.bottom)], style(b.colour, true, 1)))?;
    }

    // Markers.
    let stroke = layout.line(1.5);
    for m in &scene.markers {
        draw_marker(root, (m.x, m.y), m.radius, m.shape, m.colour, stroke)?;
    }

    // Labels on top.
    let label_text = text_style(layout, pt::LABEL, TEXT, Pos::new(HPos::Center, VPos::Bottom));
    for l in &scene.labels {
        root.draw(&Text::new(l.text.clone(), (l.x, l.y), label_text.clone().pos(l.pos)))?;
    }

    draw_legend(root, layout, stroke)
}

fn draw_marker<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    r: i32,
    shape: Shape,
    colour: RGBColor,
    stroke: u32,
) -> DrawResult<DB> {
    let fill = style(colour, true, 1);
    let line = style(colour, false, stroke);
    match shape {
        Shape::Dot | Shape::Circle => root.draw(&Circle::new((x, y), r, fill)),
        Shape::Ring => root.draw(&Circle::new((x, y), r, line)),
        Shape::Square => {
            let h = r * 4 / 5;
            root.draw(&Rectangle::new([(x - h, y - h), (x + h, y + h)], fill))
        }
        Shape::HollowSquare => {
            let h = r * 4 / 5;
            root.draw(&Rectangle::new([(x - h, y - h), (x + h, y + h)], line))
        }
        Shape::Diamond => root.draw(&Polygon::new(vec![(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill)),
        Shape::TriangleRight => root.draw(&Polygon::new(vec![(x - r, y - r), (x + r, y), (x - r, y + r)], fill)),
        Shape::TriangleLeft => root.draw(&Polygon::new(vec![(x + r, y - r), (x - r, y), (x + r, y + r)], fill)),
        Shape::Cross => {
            let bold = style(colour, false, stroke * 2);
            root.draw(&PathElement::new(vec![(x - r, y - r), (x + r, y + r)], bold))?;
            root.draw(&PathElement::new(vec![(x - r, y + r), (x + r, y - r)], bold))
        }
        Shape::Asterisk => {
            let d = r * 7 / 10;
            root.draw(&PathElement::new(vec![(x, y - r), (x, y + r)], line))?;
            root.draw(&PathElement::new(vec![(x - d, y - d), (x + d, y + d)], line))?;
            root.draw(&PathElement::new(vec![(x - d, y + d), (x + d, y - d)], line))
        }
    }
}

fn draw_legend<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, layout: &Layout, stroke: u32) -> DrawResult<DB> {
    let text = text_style(layout, pt::LEGEND, TEXT, Pos::new(HPos::Left, VPos::Center));
    let heading = text_style(layout, pt::LEGEND, MUTED, Pos::new(HPos::Left, VPos::Center));
    let r = layout.radius(1 << 10);
    let row_h = layout.px(inch::LEGEND_ROW);
    for (row, items) in layout.legend_rows.iter().enumerate() {
        let y = layout.legend_top + row as i32 * row_h + row_h / 2;
        let mut x = layout.plot.left;
        for item in items {
            let swatch = x + layout.px(0.08);
            let text_x = match item {
                LegendItem::Heading(_) => x,
                _ => x + layout.px(0.25),
            };
            match item {
                LegendItem::Heading(_) => {}
                LegendItem::Family(f) => {
                    let (cr, cg, cb) = f.rgb();
                    let h = layout.px(0.06);
                    root.draw(&Rectangle::new(
                        [(swatch - h, y - h), (swatch + h, y + h)],
                        style(RGBColor(cr, cg, cb), true, 1),
                    ))?;
                }
                LegendItem::Kind(EventKind::Exec) => {
                    let h = layout.px(0.04);
                    root.draw(&Rectangle::new(
                        [(swatch - 2 * h, y - h), (swatch + 2 * h, y + h)],
                        style(MUTED, true, 1),
                    ))?;
                }
                LegendItem::Kind(k) => {
                    let (radius, y) = match k {
                        EventKind::Status => (layout.px(inch::STATUS_DOT).max(1), y),
                        _ => (r, y),
                    };
                    if let Some(s) = shape(*k) {
                        draw_marker(root, (swatch, y), radius, s, colour(*k, OpFamily::Relu), stroke)?;
                    }
                }
                LegendItem::SignalEnter => {
                    let s = ShapeStyle { color: SIGNAL_RED.mix(0.8), filled: false, stroke_width: layout.line(1.5) };
                    root.draw(&PathElement::new(vec![(swatch, y - r * 2), (swatch, y + r * 2)], s))?;
                }
                LegendItem::SignalExit => {
                    let s = ShapeStyle { color: SIGNAL_RED.mix(0.35), filled: false, stroke_width: layout.line(1.0) };
                    let d = (r / 2).max(1);
                    let mut y0 = y - r * 2;
                    while y0 < y + r * 2 {
                        root.draw(&PathElement::new(vec![(swatch, y0), (swatch, y0 + d)], s))?;
                        y0 += d * 2;
                    }
                }
            }
            let style = if matches!(item, LegendItem::Heading(_)) { heading.clone() } else { text.clone() };
            root.draw(&Text::new(item.text(), (text_x, y), style))?;
            x += layout.px(item.width());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_families_index_their_tables() {
        // Buckets store a kind and a family as their position in `ALL`, read back by index.
        for (i, k) in EventKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
        for (i, f) in OpFamily::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i, "{f:?}");
        }
    }

    #[test]
    fn exec_bars_merge_to_one_per_column() {
        use OpFamily::{Binary as B, MatMul as M};
        // Touching bars of one family become one; a bar under another is dropped; an
        // overlapping bar of another family starts after the run.
        let merged = merge_spans(vec![(10, 12, B), (0, 4, M), (5, 9, M), (2, 3, B), (8, 15, B), (20, 20, B)]);
        assert_eq!(merged, vec![(0, 9, M), (10, 15, B), (20, 20, B)]);
        // Bars one pixel wide at the same column: the first stays.
        assert_eq!(merge_spans(vec![(7, 7, M), (7, 7, B)]), vec![(7, 7, M)]);
        assert_eq!(merge_spans(vec![]), vec![]);
    }

    #[test]
    fn signals_are_named_from_their_details() {
        let e = |command: &str, details: &str| LogEvent {
            elapsed: 0.0,
            seq: 1,
            kind: EventKind::Signal,
            source: "CLIENT 1".into(),
            command: command.into(),
            bytes: 0,
            duration: None,
            details: details.into(),
        };
        assert_eq!(signal_name(&e("enter", "#12 forward depth=0 compile")), "forward");
        assert_eq!(signal_name(&e("exit", "#13 forward depth=0")), "forward");
        assert_eq!(signal_name(&e("START_FORWARD", "")), "START_FORWARD");
        assert!(is_signal_exit("exit") && !is_signal_exit("enter"));
    }

    #[test]
    fn durations_read_for_people() {
        assert_eq!(seconds(2.3414), "2.341 s");
        assert_eq!(seconds(0.0085), "8.500 ms");
        assert_eq!(seconds(0.000012), "12.0 µs");
        assert_eq!(seconds(0.0), "0 s");
    }
}
