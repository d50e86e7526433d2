//! `gt prof report DIR`: the five pictures of a profile (bottlenecks, the signal stack, layer
//! runtimes, layer throughput, the transfer and pass timeline) and its text summary, with the
//! per-scope and per-worker statistics they are drawn from as pure functions.

use super::chart::{self, Area, Axes, DrawResult, Picture, Series, Unit};
use super::load::Profile;
use crate::visualize::{VisualizeError, FONT};
use gt_transport::profile::{Direction, Record, RecordKind};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The pictures' file names, in the order they are written.
pub const PICTURES: [&str; 5] =
    ["bottleneck.png", "signal_stack.png", "layer_runtime.png", "layer_throughput.png", "timeline.png"];

/// How a report is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportOptions {
    /// How many kernels the bottleneck bars and the summary list.
    pub top_n: usize,
    /// Each picture's width in pixels.
    pub width: u32,
    /// Each picture's height in pixels.
    pub height: u32,
    /// Layers doing fewer floating-point operations per byte than this are memory-bound and
    /// get a GB/s panel (10: under most accelerators' ridge point).
    pub ridge_flops_per_byte: f64,
}

impl Default for ReportOptions {
    fn default() -> ReportOptions {
        ReportOptions { top_n: 20, width: 1600, height: 1000, ridge_flops_per_byte: 10.0 }
    }
}

/// The smallest picture side drawn: below it the charts' labels do not fit.
pub const MIN_SIDE: u32 = 400;
/// The largest picture side drawn.
pub const MAX_SIDE: u32 = 8000;

/// What [`report`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// The folder the pictures are in.
    pub out_dir: PathBuf,
    /// Every picture, in [`PICTURES`] order.
    pub files: Vec<PathBuf>,
    /// What the pictures leave out and why ("no backward signals recorded").
    pub notes: Vec<String>,
}

/// Why no report was written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Nothing to draw: no kernel ran, or the worker files are empty.
    #[error("{}: holds no kernel records (record some with `gt-run --profile DIR script.gtir`)", .0.display())]
    NoKernels(PathBuf),
    /// A picture size outside [`MIN_SIDE`]..=[`MAX_SIDE`].
    #[error("a {width} x {height} picture is out of range: use {} to {} pixels a side", MIN_SIDE, MAX_SIDE)]
    Size {
        /// Width asked for.
        width: u32,
        /// Height asked for.
        height: u32,
    },
    /// The output folder could not be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Drawing or writing a picture failed.
    #[error(transparent)]
    Picture(#[from] VisualizeError),
}

/// One signal scope instance with the kernels run inside it, its descendant scopes' included.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeRuntime {
    /// The client that opened it.
    pub client: u64,
    /// Its id within the client.
    pub scope: u64,
    /// The signal's name.
    pub name: String,
    /// Signal or backward signal.
    pub direction: Direction,
    /// 1 for an outermost scope.
    pub depth: u32,
    /// How many kernels ran in it or its descendants.
    pub kernels: usize,
    /// Their summed durations, ns.
    pub duration_ns: u64,
    /// Their floating-point operations.
    pub flops: u64,
    /// Their bytes read and written.
    pub bytes: u64,
    /// When the scope ran: its kernels' first start and last end (ns), `None` if none ran.
    /// Not the markers' arrival at the dispatcher, which runs ahead of the workers.
    pub span: Option<(u64, u64)>,
}

impl ScopeRuntime {
    /// TFLOP/s over its kernels' time (flops per ns are GFLOP/s); `None` without kernel time.
    pub fn tflops(&self) -> Option<f64> {
        (self.duration_ns > 0).then(|| self.flops as f64 / self.duration_ns as f64 / 1e3)
    }

    /// GB/s over its kernels' time (bytes per ns are GB/s); `None` without kernel time.
    pub fn gbps(&self) -> Option<f64> {
        (self.duration_ns > 0).then(|| self.bytes as f64 / self.duration_ns as f64)
    }
}

fn kernels(profile: &Profile) -> impl Iterator<Item = &Record> {
    profile.records.iter().filter(|r| r.kind == RecordKind::Kernel)
}

/// Every scope of `signals.csv`, in file order, with the kernels run in it or in a scope
/// nested in it (by `parent`) summed: an outer layer's runtime includes its sublayers'.
/// Kernels naming a scope the file lacks (cut short) count for no scope.
pub fn scope_runtimes(profile: &Profile) -> Vec<ScopeRuntime> {
    let mut out: Vec<ScopeRuntime> = profile
        .signals
        .iter()
        .map(|s| ScopeRuntime {
            client: s.client,
            scope: s.scope,
            name: s.name.clone(),
            direction: s.direction,
            depth: s.depth,
            kernels: 0,
            duration_ns: 0,
            flops: 0,
            bytes: 0,
            span: None,
        })
        .collect();
    let index: HashMap<(u64, u64), usize> =
        profile.signals.iter().enumerate().map(|(i, s)| ((s.client, s.scope), i)).collect();
    let parent: Vec<Option<usize>> =
        profile.signals.iter().map(|s| s.parent.and_then(|p| index.get(&(s.client, p)).copied())).collect();
    for r in kernels(profile) {
        let Some(mut at) = r.scope.and_then(|s| index.get(&(r.client, s)).copied()) else { continue };
        // A malformed file could make parents loop; no chain is longer than the file.
        for _ in 0..out.len() {
            let s = &mut out[at];
            s.kernels += 1;
            s.duration_ns = s.duration_ns.saturating_add(r.duration_ns);
            s.flops = s.flops.saturating_add(r.flops);
            s.bytes = s.bytes.saturating_add(r.bytes_read.saturating_add(r.bytes_written));
            s.span = Some(s.span.map_or((r.start_ns, r.end_ns()), |(a, b)| (a.min(r.start_ns), b.max(r.end_ns()))));
            match parent[at] {
                Some(p) => at = p,
                None => break,
            }
        }
    }
    out
}

/// A worker's kernel time.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerBusy {
    /// Its name.
    pub worker: String,
    /// Kernels it ran.
    pub kernels: usize,
    /// Their summed durations, ns: a worker runs one kernel at a time, so this is the time it
    /// was busy.
    pub busy_ns: u64,
    /// From its first kernel's start to its last one's end, ns.
    pub span_ns: u64,
}

/// Each worker's kernel time, workers in file order.
pub fn busy_per_worker(profile: &Profile) -> Vec<WorkerBusy> {
    let mut out: Vec<(WorkerBusy, u64, u64)> = Vec::new();
    for r in kernels(profile) {
        let i = match out.iter().position(|(w, _, _)| w.worker == r.worker) {
            Some(i) => i,
            None => {
                let w = WorkerBusy { worker: r.worker.clone(), kernels: 0, busy_ns: 0, span_ns: 0 };
                out.push((w, u64::MAX, 0));
                out.len() - 1
            }
        };
        let (w, first, last) = &mut out[i];
        w.kernels += 1;
        w.busy_ns = w.busy_ns.saturating_add(r.duration_ns);
        *first = (*first).min(r.start_ns);
        *last = (*last).max(r.end_ns());
    }
    out.into_iter().map(|(w, first, last)| WorkerBusy { span_ns: last.saturating_sub(first), ..w }).collect()
}

/// One kernel's launches: records sharing a name and kernel hash (the same code on the same
/// shapes).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTotal {
    /// Its name, with the hash's first 8 digits when another kernel shares the name.
    pub label: String,
    /// Its name.
    pub name: String,
    /// Its kernel hash.
    pub kernel_hash: String,
    /// How often it ran.
    pub launches: usize,
    /// Its summed durations, ns.
    pub total_ns: u64,
}

impl KernelTotal {
    /// Mean duration, ns.
    pub fn mean_ns(&self) -> f64 {
        self.total_ns as f64 / self.launches.max(1) as f64
    }
}

/// Every kernel's launches, longest total first (ties by name).
pub fn kernel_totals(profile: &Profile) -> Vec<KernelTotal> {
    let mut by: BTreeMap<(&str, &str), (usize, u64)> = BTreeMap::new();
    for r in kernels(profile) {
        let e = by.entry((r.name.as_str(), r.kernel_hash.as_str())).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(r.duration_ns);
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for &(name, _) in by.keys() {
        *names.entry(name).or_default() += 1;
    }
    let mut out: Vec<KernelTotal> = by
        .iter()
        .map(|(&(name, hash), &(launches, total_ns))| KernelTotal {
            label: if names[name] > 1 {
                format!("{name} #{}", hash.chars().take(8).collect::<String>())
            } else {
                name.to_string()
            },
            name: name.to_string(),
            kernel_hash: hash.to_string(),
            launches,
            total_ns,
        })
        .collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.label.cmp(&b.label)));
    out
}

/// Kernel time per signal name and pass, each kernel counted for its innermost scope only,
/// so the rows add up to the workers' busy time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SignalTime {
    /// The signal's name (empty: kernels outside every scope).
    pub signal: String,
    /// Kernel time in its forward scopes, ns.
    pub forward_ns: u64,
    /// Kernel time in its backward scopes, ns.
    pub backward_ns: u64,
}

/// Kernel time per innermost signal, by the records' `signal` and `direction` columns, in
/// first-seen order with kernels outside every scope last.
pub fn signal_times(profile: &Profile) -> Vec<SignalTime> {
    let mut out: Vec<SignalTime> = Vec::new();
    let mut outside = SignalTime::default();
    for r in kernels(profile) {
        let row = match r.direction {
            None => &mut outside,
            Some(_) => match out.iter().position(|s| s.signal == r.signal) {
                Some(i) => &mut out[i],
                None => {
                    out.push(SignalTime { signal: r.signal.clone(), ..SignalTime::default() });
                    out.last_mut().expect("just pushed")
                }
            },
        };
        match r.direction {
            Some(Direction::Backward) => row.backward_ns = row.backward_ns.saturating_add(r.duration_ns),
            _ => row.forward_ns = row.forward_ns.saturating_add(r.duration_ns),
        }
    }
    if kernels(profile).any(|r| r.direction.is_none()) {
        out.push(outside);
    }
    out
}

/// Data moved between the host and workers (copies) and between workers (transfers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Transfers {
    /// Copy records.
    pub copies: usize,
    /// Bytes they moved.
    pub copy_bytes: u64,
    /// Their summed durations, ns.
    pub copy_ns: u64,
    /// Transfer records.
    pub transfers: usize,
    /// Bytes they moved.
    pub transfer_bytes: u64,
    /// Their summed durations, ns.
    pub transfer_ns: u64,
}

/// What a copy or transfer moved: the larger of its bytes read and written (a copy reads and
/// writes the same bytes; a collective's part may receive more than it sends).
fn moved(r: &Record) -> u64 {
    r.bytes_read.max(r.bytes_written)
}

/// The profile's copies and transfers, summed.
pub fn transfer_totals(profile: &Profile) -> Transfers {
    let mut t = Transfers::default();
    for r in &profile.records {
        match r.kind {
            RecordKind::Copy => {
                t.copies += 1;
                t.copy_bytes = t.copy_bytes.saturating_add(moved(r));
                t.copy_ns = t.copy_ns.saturating_add(r.duration_ns);
            }
            RecordKind::Transfer => {
                t.transfers += 1;
                t.transfer_bytes = t.transfer_bytes.saturating_add(moved(r));
                t.transfer_ns = t.transfer_ns.saturating_add(r.duration_ns);
            }
            RecordKind::Kernel => {}
        }
    }
    t
}

/// Records on the critical path the report lists at most (`gt prof critical` lists more).
const CRITICAL_TOP: usize = 5;

/// The text summary `gt prof report` prints: busy time per worker, the `top_n` kernels by
/// total time, kernel time per signal and pass, the critical path, copies and transfers, and
/// the profile's warnings (a partial profile says so first).
pub fn summary_text(profile: &Profile, top_n: usize) -> String {
    let mut s = String::new();
    let complete = if profile.is_complete() { "" } else { " (PARTIAL: see the warnings at the end)" };
    let _ = writeln!(s, "Profile {}{complete}", profile.dir.display());
    let workers = busy_per_worker(profile);
    let busy: u64 = workers.iter().map(|w| w.busy_ns).fold(0, u64::saturating_add);
    let _ = writeln!(s, "\nWorkers (busy: summed kernel time; span: first kernel start to last kernel end)");
    for w in &workers {
        let share = if w.span_ns > 0 { 100.0 * w.busy_ns as f64 / w.span_ns as f64 } else { 0.0 };
        let _ = writeln!(
            s,
            "  {:<20} {:>8} kernels  busy {:>10}  span {:>10}  {share:5.1}% busy",
            w.worker,
            w.kernels,
            chart::format_ns(w.busy_ns as f64),
            chart::format_ns(w.span_ns as f64)
        );
    }
    let totals = kernel_totals(profile);
    let _ = writeln!(s, "\nTop {} of {} kernels by total time", top_n.min(totals.len()), totals.len());
    let _ = writeln!(s, "  {:<32} {:>9} {:>11} {:>11} {:>7}", "kernel", "launches", "total", "mean", "share");
    for k in totals.iter().take(top_n) {
        let share = if busy > 0 { 100.0 * k.total_ns as f64 / busy as f64 } else { 0.0 };
        let _ = writeln!(
            s,
            "  {:<32} {:>9} {:>11} {:>11} {share:6.1}%",
            k.label,
            k.launches,
            chart::format_ns(k.total_ns as f64),
            chart::format_ns(k.mean_ns())
        );
    }
    let signals = signal_times(profile);
    let _ = writeln!(s, "\nKernel time per signal (each kernel counted for its innermost scope)");
    if signals.iter().all(|t| t.signal.is_empty()) {
        let _ = writeln!(s, "  no signal scopes recorded");
    } else {
        let _ = writeln!(s, "  {:<32} {:>11} {:>11}", "signal", "forward", "backward");
        for t in &signals {
            let name = if t.signal.is_empty() { "(outside every scope)" } else { t.signal.as_str() };
            let _ = writeln!(
                s,
                "  {name:<32} {:>11} {:>11}",
                chart::format_ns(t.forward_ns as f64),
                chart::format_ns(t.backward_ns as f64)
            );
        }
        if !profile.signals.iter().any(|s| s.direction == Direction::Backward) {
            let _ = writeln!(s, "  no backward signals recorded");
        }
    }
    s.push('\n');
    s.push_str(&super::critical::summary_text(profile, top_n.min(CRITICAL_TOP)));
    let t = transfer_totals(profile);
    let _ = writeln!(s, "\nData movement");
    let _ = writeln!(
        s,
        "  copies     {:>8}  {:>10}  {:>10}",
        t.copies,
        chart::format_bytes(t.copy_bytes as f64),
        chart::format_ns(t.copy_ns as f64)
    );
    let _ = writeln!(
        s,
        "  transfers  {:>8}  {:>10}  {:>10}",
        t.transfers,
        chart::format_bytes(t.transfer_bytes as f64),
        chart::format_ns(t.transfer_ns as f64)
    );
    if !profile.warnings.is_empty() {
        let _ = writeln!(s, "\nWarnings (the profile is partial)");
        for w in &profile.warnings {
            let _ = writeln!(s, "  - {w}");
        }
    }
    s
}

/// Draws the five pictures of `profile` into `out_dir` (made if missing) as [`PICTURES`].
pub fn report(profile: &Profile, out_dir: &Path, options: &ReportOptions) -> Result<ReportSummary, ReportError> {
    let (width, height) = (options.width, options.height);
    if !(MIN_SIDE..=MAX_SIDE).contains(&width) || !(MIN_SIDE..=MAX_SIDE).contains(&height) {
        return Err(ReportError::Size { width, height });
    }
    if kernels(profile).next().is_none() {
        return Err(ReportError::NoKernels(profile.dir.clone()));
    }
    std::fs::create_dir_all(out_dir)
        .map_err(|source| ReportError::CreateDir { path: out_dir.to_path_buf(), source })?;
    let scopes = scope_runtimes(profile);
    let mut notes = Vec::new();
    if profile.signals.is_empty() {
        notes.push("no signal scopes recorded: the stack and layer pictures are empty".to_string());
    } else if !profile.signals.iter().any(|s| s.direction == Direction::Backward) {
        notes.push("no backward signals recorded: the layer pictures show forward passes only".to_string());
    }
    if !profile.records.iter().any(|r| r.kind != RecordKind::Kernel) {
        notes.push("no copies or transfers recorded: the timeline's top panel is empty".to_string());
    }
    let mut files = Vec::new();
    let mut draw = |name: &str, f: &dyn Fn(&Area<'_>) -> DrawResult| -> Result<(), ReportError> {
        let path = out_dir.join(name);
        Picture::write(&path, (width, height), f)?;
        files.push(path);
        Ok(())
    };
    draw(PICTURES[0], &|root| bottleneck(root, profile, options.top_n))?;
    draw(PICTURES[1], &|root| signal_stack(root, profile))?;
    draw(PICTURES[2], &|root| layer_runtime(root, &scopes))?;
    draw(PICTURES[3], &|root| layer_throughput(root, &scopes, options.ridge_flops_per_byte))?;
    draw(PICTURES[4], &|root| timeline(root, profile))?;
    Ok(ReportSummary { out_dir: out_dir.to_path_buf(), files, notes })
}

const FORWARD: RGBColor = chart::PALETTE[0];
const BACKWARD: RGBColor = chart::PALETTE[1];
const UNSCOPED: RGBColor = RGBColor(150, 150, 150);

fn direction_colour(d: Option<Direction>) -> RGBColor {
    match d {
        Some(Direction::Forward) => FORWARD,
        Some(Direction::Backward) => BACKWARD,
        None => UNSCOPED,
    }
}

/// Picture 1: the top kernels' total time, and mean duration against launches for all.
fn bottleneck(root: &Area<'_>, profile: &Profile, top_n: usize) -> DrawResult {
    let totals = kernel_totals(profile);
    let (left, right) = root.split_horizontally(root.dim_in_pixel().0 * 11 / 20);
    let bars: Vec<(String, f64)> = totals.iter().take(top_n).map(|k| (k.label.clone(), k.total_ns as f64)).collect();
    let title = format!("Total time by kernel (top {} of {})", bars.len(), totals.len());
    chart::bar_chart(&left, Axes { title: &title, x: "total time", y: "", unit: Unit::Nanoseconds }, &bars)?;
    let points: Vec<(f64, f64)> = totals.iter().map(|k| (k.launches as f64, k.mean_ns())).collect();
    let axes = Axes { title: "Mean duration vs launches", x: "launches", y: "mean duration", unit: Unit::Nanoseconds };
    chart::scatter(&right, axes, Unit::Plain(""), &points)
}

/// The time range every record (and so every scope's execution) falls in, ns.
fn time_range(profile: &Profile) -> (u64, u64) {
    let starts = profile.records.iter().map(|r| r.start_ns);
    let ends = profile.records.iter().map(Record::end_ns);
    let t0 = starts.min().unwrap_or(0);
    let t1 = ends.max().unwrap_or(0).max(t0 + 1);
    (t0, t1)
}

/// Intervals `(start, end, tag)` sorted and merged where they touch or lie closer than `gap`
/// with the same tag, so a picture draws at most about one bar per pixel column.
fn merge<T: Copy + PartialEq>(mut spans: Vec<(f64, f64, T)>, gap: f64) -> Vec<(f64, f64, T)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64, T)> = Vec::with_capacity(spans.len().min(4096));
    for s in spans {
        match out.last_mut() {
            Some(last) if last.2 == s.2 && s.0 <= last.1 + gap => last.1 = last.1.max(s.1),
            _ => out.push(s),
        }
    }
    out
}

/// A chart over the profile's time span: x in scaled time since the first record, y over
/// `y`; returns the chart and the ns per x unit.
fn time_frame<'a, 'b>(
    area: &'a Area<'b>,
    profile: &Profile,
    title: &str,
    y: std::ops::Range<f64>,
    y_desc: &str,
    y_fmt: &dyn Fn(&f64) -> String,
) -> Result<(chart::Chart<'a, 'b>, f64, u64), chart::DrawError> {
    let (t0, t1) = time_range(profile);
    let (div, unit) = Unit::Nanoseconds.scale((t1 - t0) as f64);
    let x_desc = format!("time since the first record ({unit})");
    let c = chart::frame(area, title, 0.0..(t1 - t0) as f64 / div, y, &x_desc, y_desc, &chart::tick, y_fmt, true)?;
    Ok((c, div, t0))
}

/// Picture 2: each scope instance as a bar at its depth over its interval (backward ones
/// paler), named when the bar is wide enough, and every kernel in a row beneath (depth 0),
/// coloured by the pass its scope belongs to.
fn signal_stack(root: &Area<'_>, profile: &Profile) -> DrawResult {
    let max_depth = profile.signals.iter().map(|s| s.depth).max().unwrap_or(0);
    // Only whole depths are rows; depth 0 is the kernels' row.
    // Tick values come from a float range: near-whole ones are rows.
    let y_fmt = |&v: &f64| {
        let row = v.round();
        if (v - row).abs() > 1e-6 || row < 0.0 || row > max_depth as f64 {
            String::new()
        } else if row == 0.0 {
            "kernels".to_string()
        } else {
            format!("{row}")
        }
    };
    let title = "Signal scope stack over time, kernels beneath";
    let (c, div, t0) = time_frame(root, profile, title, -0.6..max_depth as f64 + 0.6, "scope depth", &y_fmt)?;
    let (_, t1) = time_range(profile);
    let x = |ns: u64| ns.saturating_sub(t0) as f64 / div;
    let plot = c.plotting_area();
    let per_px = (t1 - t0) as f64 / div / plot.dim_in_pixel().0.max(1) as f64;
    let spans = kernels(profile).map(|r| (x(r.start_ns), x(r.end_ns()), r.direction)).collect();
    for (a, b, d) in merge(spans, per_px) {
        plot.draw(&Rectangle::new([(a, -0.35), (b.max(a + per_px), 0.35)], direction_colour(d).filled()))?;
    }
    let mut names: Vec<&str> = Vec::new();
    let mut order: Vec<usize> = (0..profile.signals.len()).collect();
    order.sort_by_key(|&i| profile.signals[i].depth);
    let runs = scope_runtimes(profile);
    let (bx, by) = root.get_base_pixel();
    let label = (FONT, chart::px::LABEL).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    for i in order {
        let s = &profile.signals[i];
        let n = match names.iter().position(|n| *n == s.name) {
            Some(n) => n,
            None => {
                names.push(&s.name);
                names.len() - 1
            }
        };
        // A scope that ran nothing has no place on the time axis.
        let Some((start, end)) = runs[i].span else { continue };
        let (a, b) = (x(start), x(end));
        let d = s.depth as f64;
        let alpha = if s.direction == Direction::Backward { 0.4 } else { 0.8 };
        let colour = chart::colour(n + 2);
        plot.draw(&Rectangle::new([(a, d - 0.4), (b.max(a + per_px), d + 0.4)], colour.mix(alpha).filled()))?;
        let (l, y) = c.backend_coord(&(a, d));
        let r = c.backend_coord(&(b, d)).0;
        let text = if s.direction == Direction::Backward { format!("{} (bwd)", s.name) } else { s.name.clone() };
        if crate::visualize::glyphs::text_width(&text, chart::px::LABEL) + 6.0 < (r - l) as f64 {
            root.draw(&Text::new(text, (l - bx + 3, y - by), label.clone()))?;
        }
    }
    if profile.signals.is_empty() {
        chart::note(root, "no signal scopes recorded")?;
    }
    Ok(())
}

/// Samples per signal name for `direction`: one per scope instance that ran kernels.
fn samples(
    scopes: &[ScopeRuntime],
    direction: Direction,
    value: impl Fn(&ScopeRuntime) -> Option<f64>,
    keep: impl Fn(&str) -> bool,
) -> Vec<(String, Vec<f64>)> {
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    for s in scopes.iter().filter(|s| s.direction == direction && s.kernels > 0 && keep(&s.name)) {
        let Some(v) = value(s) else { continue };
        match out.iter_mut().find(|(n, _)| *n == s.name) {
            Some((_, vs)) => vs.push(v),
            None => out.push((s.name.clone(), vec![v])),
        }
    }
    out
}

/// Box plots of `value` per layer, forward and backward side by side; the backward series is
/// left out, and said to be, when no backward scope ran kernels.
fn pass_boxes(
    area: &Area<'_>,
    axes: Axes<'_>,
    scopes: &[ScopeRuntime],
    value: &dyn Fn(&ScopeRuntime) -> Option<f64>,
    keep: &dyn Fn(&str) -> bool,
) -> DrawResult {
    let forward = samples(scopes, Direction::Forward, value, keep);
    let backward = samples(scopes, Direction::Backward, value, keep);
    let mut series = vec![Series { name: "forward", colour: FORWARD, data: &forward }];
    if !backward.is_empty() {
        series.push(Series { name: "backward", colour: BACKWARD, data: &backward });
    }
    if forward.is_empty() && backward.is_empty() {
        return chart::empty(area, axes.title, "no signal scope ran kernels");
    }
    chart::box_plot(area, axes, &series)?;
    if backward.is_empty() {
        chart::note(area, "no backward signals recorded")?;
    }
    Ok(())
}

/// Picture 3: runtime per layer instance (its kernels' time, sublayers included).
fn layer_runtime(root: &Area<'_>, scopes: &[ScopeRuntime]) -> DrawResult {
    let axes = Axes {
        title: "Layer runtime per scope instance (kernel time, nested scopes included)",
        x: "signal",
        y: "runtime",
        unit: Unit::Nanoseconds,
    };
    pass_boxes(root, axes, scopes, &|s| Some(s.duration_ns as f64), &|_| true)
}

/// Picture 4: TFLOP/s per layer instance on top; GB/s beneath for the memory-bound layers
/// (fewer flops per byte than `ridge`, over all their instances).
fn layer_throughput(root: &Area<'_>, scopes: &[ScopeRuntime], ridge: f64) -> DrawResult {
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
    let axes =
        Axes { title: "Compute throughput per scope instance", x: "signal", y: "TFLOP/s", unit: Unit::Plain("") };
    pass_boxes(&top, axes, scopes, &|s| s.tflops(), &|_| true)?;
    let mut intensity: HashMap<&str, (u64, u64)> = HashMap::new();
    for s in scopes {
        let e = intensity.entry(&s.name).or_default();
        e.0 = e.0.saturating_add(s.flops);
        e.1 = e.1.saturating_add(s.bytes);
    }
    let bound = |name: &str| intensity.get(name).is_some_and(|&(f, b)| b > 0 && (f as f64) < ridge * b as f64);
    let title = format!("Memory throughput of memory-bound layers (under {ridge} FLOP/byte)");
    if !scopes.iter().any(|s| s.kernels > 0 && bound(&s.name)) {
        return chart::empty(&bottom, &title, "no memory-bound layer");
    }
    let axes = Axes { title: &title, x: "signal", y: "GB/s", unit: Unit::Plain("") };
    pass_boxes(&bottom, axes, scopes, &|s| s.gbps(), &bound)
}

/// Picture 5: copies and transfers over time with the bytes moved so far (a step line) on
/// top; forward and backward scopes as bars on one line beneath.
fn timeline(root: &Area<'_>, profile: &Profile) -> DrawResult {
    let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 * 3 / 5);
    let mut moves: Vec<&Record> = profile.records.iter().filter(|r| r.kind != RecordKind::Kernel).collect();
    moves.sort_by_key(|r| r.end_ns());
    let total: u64 = moves.iter().map(|r| moved(r)).fold(0, u64::saturating_add);
    let (bdiv, bunit) = Unit::Bytes.scale(total as f64);
    let y_desc = format!("bytes moved so far ({bunit})");
    let hi = (total as f64 / bdiv).max(1.0) * 1.08;
    let (c, div, t0) = time_frame(&top, profile, "Copies and transfers", 0.0..hi, &y_desc, &chart::tick)?;
    let x = |ns: u64| ns.saturating_sub(t0) as f64 / div;
    let plot = c.plotting_area();
    if moves.is_empty() {
        chart::note(&top, "no copies or transfers recorded")?;
    } else {
        let per_px = c.x_range().end / plot.dim_in_pixel().0.max(1) as f64;
        let spans = moves.iter().map(|r| (x(r.start_ns), x(r.end_ns()), r.kind == RecordKind::Copy)).collect();
        for (a, b, copy) in merge(spans, per_px) {
            let colour = if copy { chart::PALETTE[2] } else { chart::PALETTE[4] };
            plot.draw(&Rectangle::new([(a, 0.0), (b.max(a + per_px), hi * 0.05)], colour.filled()))?;
        }
        let mut step = vec![(0.0, 0.0)];
        let mut sum = 0u64;
        for r in &moves {
            let at = x(r.end_ns());
            step.push((at, sum as f64 / bdiv));
            sum = sum.saturating_add(moved(r));
            step.push((at, sum as f64 / bdiv));
        }
        step.push((c.x_range().end, sum as f64 / bdiv));
        plot.draw(&PathElement::new(step, BLACK.stroke_width(2)))?;
        let style = (FONT, chart::px::NOTE).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Top));
        let (xs, ys) = plot.get_pixel_range();
        let (bx, by) = top.get_base_pixel();
        for (i, (name, colour)) in [("copy", chart::PALETTE[2]), ("transfer", chart::PALETTE[4])].iter().enumerate() {
            let y = ys.start - by + 8 + 20 * i as i32;
            let x = xs.start - bx + 10;
            top.draw(&Rectangle::new([(x, y + 2), (x + 16, y + 14)], colour.filled()))?;
            top.draw(&Text::new(name.to_string(), (x + 22, y), style.clone()))?;
        }
    }
    let y_fmt = |_: &f64| String::new();
    let (c, _, _) = time_frame(&bottom, profile, "Forward and backward scopes", 0.0..1.0, "", &y_fmt)?;
    let plot = c.plotting_area();
    let per_px = c.x_range().end / plot.dim_in_pixel().0.max(1) as f64;
    let spans = scope_runtimes(profile)
        .iter()
        .filter_map(|s| s.span.map(|(a, b)| (x(a), x(b), s.direction == Direction::Backward)))
        .collect();
    for (a, b, backward) in merge(spans, 0.0) {
        let colour = if backward { BACKWARD } else { FORWARD };
        plot.draw(&Rectangle::new([(a, 0.15), (b.max(a + per_px), 0.85)], colour.mix(0.85).filled()))?;
    }
    if profile.signals.is_empty() {
        chart::note(&bottom, "no signal scopes recorded")?;
    } else if !profile.signals.iter().any(|s| s.direction == Direction::Backward) {
        chart::note(&bottom, "no backward signals recorded")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_transport::profile::SignalRecord;

    fn record(kind: RecordKind, worker: &str, name: &str, start_ns: u64, duration_ns: u64) -> Record {
        Record {
            seq: Some(1),
            kernel_hash: format!("{:016x}", name.len()),
            bytes_read: 400,
            bytes_written: 100,
            flops: 1000,
            start_ns,
            duration_ns,
            ..Record::new(kind, worker, name)
        }
    }

    fn scoped(mut r: Record, scope: u64, signal: &str, direction: Direction) -> Record {
        r.scope = Some(scope);
        r.signal = signal.into();
        r.direction = Some(direction);
        r
    }

    fn signal(scope: u64, name: &str, direction: Direction, parent: Option<u64>, span: (u64, u64)) -> SignalRecord {
        let depth = if parent.is_some() { 2 } else { 1 };
        SignalRecord {
            client: 1,
            scope,
            name: name.into(),
            direction,
            depth,
            parent,
            opened_ns: span.0,
            closed_ns: Some(span.1),
        }
    }

    /// `model` (forward) holds `linear` and `relu`; a backward `linear` follows; one kernel
    /// runs outside every scope, on a second worker; one copy and one transfer.
    fn sample() -> Profile {
        use Direction::{Backward, Forward};
        let k = |worker, name, start, duration| record(RecordKind::Kernel, worker, name, start, duration);
        Profile {
            dir: PathBuf::from("sample"),
            records: vec![
                record(RecordKind::Copy, "w0", "literal", 0, 5),
                scoped(k("w0", "matmul", 10, 100), 2, "linear", Forward),
                scoped(k("w0", "relu", 420, 40), 3, "relu", Forward),
                scoped(k("w0", "add", 700, 30), 1, "model", Forward),
                scoped(k("w0", "matmul", 1100, 200), 4, "linear", Backward),
                k("w1", "add", 1600, 20),
                record(RecordKind::Transfer, "w1", "all_reduce", 1700, 10),
            ],
            signals: vec![
                signal(1, "model", Forward, None, (0, 1000)),
                signal(2, "linear", Forward, Some(1), (0, 400)),
                signal(3, "relu", Forward, Some(1), (400, 600)),
                signal(4, "linear", Backward, None, (1000, 1500)),
            ],
            ..Profile::default()
        }
    }

    #[test]
    fn scope_runtimes_fold_in_descendants() {
        let scopes = scope_runtimes(&sample());
        let by = |id: u64| scopes.iter().find(|s| s.scope == id).unwrap();
        assert_eq!((by(1).duration_ns, by(1).kernels), (170, 3), "model holds linear, relu and its own add");
        assert_eq!(by(2).duration_ns, 100);
        assert_eq!(by(3).duration_ns, 40);
        assert_eq!((by(4).duration_ns, by(4).direction), (200, Direction::Backward));
        assert_eq!(by(1).flops, 3000);
        assert_eq!(by(2).tflops(), Some(1000.0 / 100.0 / 1e3));
    }

    #[test]
    fn parent_loops_do_not_hang() {
        let mut p = sample();
        p.signals[0].parent = Some(2);
        let scopes = scope_runtimes(&p);
        assert!(scopes.iter().all(|s| s.kernels <= p.records.len()));
    }

    #[test]
    fn signal_times_add_up_to_busy_time() {
        let p = sample();
        let busy: u64 = busy_per_worker(&p).iter().map(|w| w.busy_ns).sum();
        let signals = signal_times(&p);
        let sum: u64 = signals.iter().map(|s| s.forward_ns + s.backward_ns).sum();
        assert_eq!(busy, 390);
        assert_eq!(sum, busy);
        let linear = signals.iter().find(|s| s.signal == "linear").unwrap();
        assert_eq!((linear.forward_ns, linear.backward_ns), (100, 200));
        assert_eq!(signals.last().unwrap().signal, "", "kernels outside every scope come last");
        let w = busy_per_worker(&p);
        assert_eq!((w[0].worker.as_str(), w[0].busy_ns, w[0].span_ns), ("w0", 370, 1290));
    }

    #[test]
    fn kernel_totals_rank_by_total_time() {
        let totals = kernel_totals(&sample());
        assert_eq!(totals[0].name, "matmul");
        assert_eq!((totals[0].launches, totals[0].total_ns), (2, 300));
        assert_eq!(totals[0].mean_ns(), 150.0);
        let t = transfer_totals(&sample());
        assert_eq!((t.copies, t.copy_bytes, t.transfers, t.transfer_ns), (1, 400, 1, 10));
    }

    #[test]
    fn summary_names_kernels_signals_and_warnings() {
        let mut p = sample();
        p.warnings.push("worker-w0.csv: 1 row(s) could not be read".into());
        let text = summary_text(&p, 2);
        assert!(text.contains("PARTIAL"), "{text}");
        let top = text.split("Top 2 of 3 kernels").nth(1).expect(&text).split("\n\n").next().unwrap();
        assert!(top.contains("matmul") && top.contains("add") && !top.contains("relu"), "{text}");
        assert!(text.contains("linear") && text.contains("(outside every scope)"), "{text}");
        assert!(text.contains("could not be read"), "{text}");
    }

    fn out_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gt-prof-report-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Decodes `path` and says whether its middle holds a pixel that is not white.
    fn drawn(path: &Path, (width, height): (u32, u32)) -> bool {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (width, height), "{}", path.display());
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let row = info.line_size;
        (height as usize / 4..height as usize * 3 / 4).any(|y| {
            (width as usize / 4..width as usize * 3 / 4)
                .any(|x| buf[y * row + x * 3..y * row + x * 3 + 3].iter().any(|&c| c < 200))
        })
    }

    #[test]
    fn report_writes_five_drawn_pictures() {
        let dir = out_dir("five");
        let options = ReportOptions { width: 900, height: 600, ..ReportOptions::default() };
        let summary = report(&sample(), &dir, &options).unwrap();
        assert_eq!(summary.files.len(), 5);
        for (file, name) in summary.files.iter().zip(PICTURES) {
            assert_eq!(file, &dir.join(name));
            assert!(drawn(file, (900, 600)), "{name} is blank");
        }
        assert!(summary.notes.is_empty(), "{:?}", summary.notes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_without_backward_signals_or_transfers_still_draws() {
        let mut p = sample();
        p.signals.retain(|s| s.direction == Direction::Forward);
        p.records.retain(|r| r.kind == RecordKind::Kernel && r.direction != Some(Direction::Backward));
        let dir = out_dir("forward");
        let options = ReportOptions { width: 640, height: 480, ..ReportOptions::default() };
        let summary = report(&p, &dir, &options).unwrap();
        assert_eq!(summary.files.len(), 5);
        assert!(summary.notes.iter().any(|n| n.contains("no backward signals")), "{:?}", summary.notes);
        assert!(summary.notes.iter().any(|n| n.contains("no copies or transfers")), "{:?}", summary.notes);
        assert!(summary_text(&p, 5).contains("no backward signals recorded"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_without_kernels_is_a_typed_error() {
        let mut p = sample();
        p.records.retain(|r| r.kind != RecordKind::Kernel);
        let dir = out_dir("empty");
        let err = report(&p, &dir, &ReportOptions::default()).unwrap_err();
        assert!(matches!(err, ReportError::NoKernels(ref d) if d == Path::new("sample")), "{err:?}");
        assert!(err.to_string().contains("holds no kernel records"), "{err}");
        assert!(!dir.exists(), "nothing is written for an empty profile");
        let err = report(&Profile::default(), &dir, &ReportOptions::default()).unwrap_err();
        assert!(matches!(err, ReportError::NoKernels(_)));
        let small = ReportOptions { width: 10, ..ReportOptions::default() };
        assert!(matches!(report(&sample(), &dir, &small), Err(ReportError::Size { width: 10, .. })));
    }
}
