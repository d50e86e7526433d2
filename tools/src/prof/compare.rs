//! `gt prof compare`: two sweeps side by side in one self-contained HTML page (plots embedded
//! as base64 PNG, no external requests, readable on a phone and a wide screen) with a table
//! of the kernels whose mean time changed most. Mismatched or partial sweeps are stated on
//! the page, never silently dropped.

use super::load::{Sweep, SweepRun};
use base64::Engine as _;
use gt_transport::profile::{Record, RecordKind};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why a comparison could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A sweep with no run that succeeded and left a readable profile: nothing to compare.
    #[error("{label} ({}): no successful run with a readable profile; check its sweep.json and run folders", dir.display())]
    NoSuccessfulRun {
        /// The sweep's label.
        label: String,
        /// Its folder.
        dir: PathBuf,
    },
    /// The report could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How to compare.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The first sweep's name on the page (`None`: its folder name).
    pub label_a: Option<String>,
    /// The second sweep's name on the page (`None`: its folder name).
    pub label_b: Option<String>,
    /// How many kernels the change table lists.
    pub top_n: usize,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions { label_a: None, label_b: None, top_n: 20 }
    }
}

/// The page and what went into it.
#[derive(Debug, Clone)]
pub struct CompareReport {
    /// The self-contained HTML page.
    pub html: String,
    /// Images shown next to their counterpart.
    pub images_paired: usize,
    /// Images only one sweep has (shown alone, marked).
    pub images_one_sided: usize,
    /// Rows of the kernel table.
    pub kernels: usize,
    /// Everything the page warns about: mismatched settings, failed runs, cut-short files,
    /// unreadable images. Each is also on the page.
    pub warnings: Vec<String>,
}

/// One kernel's time in one sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelStats {
    /// Mean duration of one launch, ns.
    pub mean_ns: f64,
    /// Launches, over all runs counted.
    pub launches: u64,
}

/// A kernel by name and operand types (one name can run on several shapes).
pub type KernelKey = (String, String);

/// One row of the kernel table.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelChange {
    /// The kernel's name (`Record::name`).
    pub name: String,
    /// Its operand types (`Record::inputs`).
    pub inputs: String,
    /// Its time in the first sweep (`None`: only in the second).
    pub a: Option<KernelStats>,
    /// Its time in the second sweep (`None`: only in the first).
    pub b: Option<KernelStats>,
}

impl KernelChange {
    /// B's mean minus A's, ns; a kernel only one side has counts its whole mean (appeared:
    /// positive, disappeared: negative), so it ranks by the time it adds or removes.
    pub fn change_ns(&self) -> f64 {
        self.b.map_or(0.0, |s| s.mean_ns) - self.a.map_or(0.0, |s| s.mean_ns)
    }

    /// The change relative to A's mean, in percent (`None`: one-sided or A's mean is 0).
    pub fn change_pct(&self) -> Option<f64> {
        match (self.a, self.b) {
            (Some(a), Some(b)) if a.mean_ns > 0.0 => Some((b.mean_ns - a.mean_ns) / a.mean_ns * 100.0),
            _ => None,
        }
    }
}

/// Mean duration and launch count of every kernel record among `records`, by name and inputs.
pub fn kernel_stats<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeMap<KernelKey, KernelStats> {
    let mut sums: BTreeMap<KernelKey, (u128, u64)> = BTreeMap::new();
    for r in records.into_iter().filter(|r| r.kind == RecordKind::Kernel) {
        let e = sums.entry((r.name.clone(), r.inputs.clone())).or_default();
        e.0 += u128::from(r.duration_ns);
        e.1 += 1;
    }
    sums.into_iter().map(|(k, (sum, n))| (k, KernelStats { mean_ns: sum as f64 / n as f64, launches: n })).collect()
}

/// Every kernel of either side, sorted by |change| descending (ties by name, then inputs, so
/// the page is reproducible), cut to `top_n`. Also returns how many were cut.
pub fn kernel_changes(
    a: &BTreeMap<KernelKey, KernelStats>,
    b: &BTreeMap<KernelKey, KernelStats>,
    top_n: usize,
) -> (Vec<KernelChange>, usize) {
    let keys: BTreeSet<&KernelKey> = a.keys().chain(b.keys()).collect();
    let mut rows: Vec<KernelChange> = keys
        .into_iter()
        .map(|k| KernelChange { name: k.0.clone(), inputs: k.1.clone(), a: a.get(k).copied(), b: b.get(k).copied() })
        .collect();
    rows.sort_by(|x, y| {
        y.change_ns()
            .abs()
            .total_cmp(&x.change_ns().abs())
            .then_with(|| x.name.cmp(&y.name))
            .then_with(|| x.inputs.cmp(&y.inputs))
    });
    let cut = rows.len().saturating_sub(top_n);
    rows.truncate(top_n);
    (rows, cut)
}

/// Escapes text for HTML content and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Compares sweep `a` with sweep `b` (B's change relative to A).
pub fn compare(a: &Sweep, b: &Sweep, options: &CompareOptions) -> Result<CompareReport, CompareError> {
    let (label_a, label_b) = labels(a, b, options);
    let stats_a = successful_stats(a, &label_a)?;
    let stats_b = successful_stats(b, &label_b)?;

    let mut mismatch = Vec::new();
    let axes = |s: &Sweep| s.manifest.axes.iter().map(|x| x.name.clone()).collect::<BTreeSet<String>>();
    let (axes_a, axes_b) = (axes(a), axes(b));
    if axes_a != axes_b {
        let list = |s: &BTreeSet<String>| {
            if s.is_empty() {
                "no settings".to_string()
            } else {
                s.iter().cloned().collect::<Vec<_>>().join(", ")
            }
        };
        mismatch.push(format!(
            "the sweeps swept different settings: {label_a} swept {}, {label_b} swept {}; runs' plots are paired only where their folders match, and kernel means mix different configurations",
            list(&axes_a),
            list(&axes_b)
        ));
    }

    let mut partial: Vec<String> = Vec::new();
    partial.extend(a.warnings.iter().map(|w| format!("{label_a}: {w}")));
    partial.extend(b.warnings.iter().map(|w| format!("{label_b}: {w}")));

    let images_a = find_images(a, &mut partial, &label_a);
    let images_b = find_images(b, &mut partial, &label_b);
    let rows = pair_images(images_a, images_b);
    let images_paired = rows.iter().filter(|r| r.a.is_some() && r.b.is_some()).count();
    let images_one_sided = rows.len() - images_paired;

    let (changes, cut) = kernel_changes(&stats_a, &stats_b, options.top_n);

    let mut html = String::new();
    page(&mut html, a, b, &label_a, &label_b, &mismatch, &partial, &changes, cut, &rows);

    let mut warnings = mismatch;
    warnings.extend(partial);
    Ok(CompareReport { html, images_paired, images_one_sided, kernels: changes.len(), warnings })
}

/// Writes the page to `path`.
pub fn write(report: &CompareReport, path: &Path) -> Result<(), CompareError> {
    std::fs::write(path, &report.html).map_err(|source| CompareError::Io { path: path.to_path_buf(), source })
}

/// The two labels: the options', else the folder names; two equal labels get `(A)`/`(B)` so
/// the page can tell the sides apart.
fn labels(a: &Sweep, b: &Sweep, options: &CompareOptions) -> (String, String) {
    let folder = |s: &Sweep| {
        let dir = s.dir.canonicalize().unwrap_or_else(|_| s.dir.clone());
        dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| dir.display().to_string())
    };
    let la = options.label_a.clone().unwrap_or_else(|| folder(a));
    let lb = options.label_b.clone().unwrap_or_else(|| folder(b));
    if la == lb {
        (format!("{la} (A)"), format!("{lb} (B)"))
    } else {
        (la, lb)
    }
}

/// Kernel stats over the runs that succeeded (`load_sweep` also keeps what failed runs left,
/// which would skew the means).
fn successful_stats(s: &Sweep, label: &str) -> Result<BTreeMap<KernelKey, KernelStats>, CompareError> {
    let ok: Vec<_> =
        s.profiles.iter().filter(|(i, _)| s.manifest.runs.get(*i).is_some_and(|r| r.ok)).map(|(_, p)| p).collect();
    if ok.is_empty() {
        return Err(CompareError::NoSuccessfulRun { label: label.to_string(), dir: s.dir.clone() });
    }
    Ok(kernel_stats(ok.iter().flat_map(|p| p.records.iter())))
}

/// A PNG found in a sweep folder.
#[derive(Debug, Clone)]
struct Image {
    /// Its path relative to the sweep folder, `/`-separated.
    rel: String,
    /// Where it was grouped: the run's settings (`GT_WORKERS=2, repetition 1`) or its folder.
    section: String,
    /// Its path within the run folder, or its file name.
    name: String,
    /// Sort rank of its section: sweep-level plots first, then runs in manifest order.
    rank: (u8, usize),
    /// Whether it belongs to a run that failed.
    failed_run: bool,
    /// `data:` URL, or why the file could not be embedded.
    data: Result<String, String>,
}

/// Walk depth: sweep/run/report/x.png is 3; a little slack for nested run folders.
const MAX_DEPTH: usize = 6;

/// Every PNG under the sweep folder, grouped by run settings where it lies in a run folder.
fn find_images(s: &Sweep, warnings: &mut Vec<String>, label: &str) -> Vec<Image> {
    let mut files = Vec::new();
    walk(&s.dir, 0, &mut files, warnings, label);
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let rel_path = path.strip_prefix(&s.dir).ok()?.to_path_buf();
            let rel = slash(&rel_path);
            let run = s
                .manifest
                .runs
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.dir.is_empty() && rel_path.starts_with(&r.dir))
                // The longest run folder holding it, in case one run folder nests another.
                .max_by_key(|(_, r)| r.dir.len());
            let (section, name, rank, failed_run) = match run {
                Some((i, r)) => {
                    let inner = slash(rel_path.strip_prefix(&r.dir).unwrap_or(&rel_path));
                    (run_key(r), inner, (1, i), !r.ok)
                }
                None => {
                    let parent = rel_path.parent().map(slash).unwrap_or_default();
                    let file = rel_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    (if parent.is_empty() { "sweep".to_string() } else { parent }, file, (0, 0), false)
                }
            };
            let data = embed(&path);
            if let Err(e) = &data {
                warnings.push(format!("{label}: {rel}: {e}"));
            }
            Some(Image { rel, section, name, rank, failed_run, data })
        })
        .collect()
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>, warnings: &mut Vec<String>, label: &str) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return warnings.push(format!("{label}: {}: {e}; its plots are missing", dir.display())),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        // file_type does not follow symbolic links, so a link loop cannot recurse forever.
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() && depth < MAX_DEPTH {
            walk(&path, depth + 1, out, warnings, label);
        } else if kind.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
            out.push(path);
        }
    }
}

fn slash(p: &Path) -> String {
    p.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

/// What identifies a run across sweeps: its settings and repetition, not its folder name
/// (two sweeps may number their runs differently).
fn run_key(r: &SweepRun) -> String {
    let mut parts: Vec<String> = r.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.push(format!("repetition {}", r.repetition));
    parts.join(", ")
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

fn embed(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // A truncated or mislabelled file would show as a broken image; say so instead.
    if !bytes.starts_with(PNG_SIGNATURE) {
        return Err("not a PNG file (no PNG signature); not shown".to_string());
    }
    Ok(format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes)))
}

/// One row of plots: the same plot from each side.
struct ImageRow {
    section: String,
    name: String,
    a: Option<Image>,
    b: Option<Image>,
}

/// Pairs images by (run settings or folder, name), then what is left by relative path (so
/// runs of sweeps with different settings still pair when their folders match).
fn pair_images(a: Vec<Image>, b: Vec<Image>) -> Vec<ImageRow> {
    let mut rows: Vec<ImageRow> = Vec::new();
    let mut b: Vec<Option<Image>> = b.into_iter().map(Some).collect();
    let mut left_a = Vec::new();
    for img in a {
        match b.iter().position(|x| x.as_ref().is_some_and(|x| x.section == img.section && x.name == img.name)) {
            Some(j) => rows.push(ImageRow {
                section: img.section.clone(),
                name: img.name.clone(),
                a: Some(img),
                b: b[j].take(),
            }),
            None => left_a.push(img),
        }
    }
    for img in left_a {
        match b.iter().position(|x| x.as_ref().is_some_and(|x| x.rel == img.rel)) {
            Some(j) => rows.push(ImageRow {
                section: format!("{} | {}", img.section, b[j].as_ref().map_or("", |x| x.section.as_str())),
                name: img.name.clone(),
                a: Some(img),
                b: b[j].take(),
            }),
            None => rows.push(ImageRow { section: img.section.clone(), name: img.name.clone(), a: Some(img), b: None }),
        }
    }
    rows.extend(b.into_iter().flatten().map(|img| ImageRow {
        section: img.section.clone(),
        name: img.name.clone(),
        a: None,
        b: Some(img),
    }));
    let rank = |r: &ImageRow| {
        let x = r.a.as_ref().map(|i| i.rank);
        let y = r.b.as_ref().map(|i| (i.rank.0, i.rank.1 + 1_000_000));
        x.or(y).unwrap_or((2, 0))
    };
    rows.sort_by(|x, y| {
        rank(x).cmp(&rank(y)).then_with(|| x.section.cmp(&y.section)).then_with(|| x.name.cmp(&y.name))
    });
    rows
}

/// A duration for people: ns, µs, ms or s, three significant-ish digits.
fn duration(ns: f64) -> String {
    let a = ns.abs();
    if a >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if a >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if a >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

// The system font stack only and no url(): the page must not fetch anything. One column on a
// phone; two side by side from 900px.
const CSS: &str = r#"
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0 auto;padding:12px;max-width:1800px;color:#1b1b1b;background:#fff;line-height:1.4}
h1{font-size:1.4rem;margin:.2em 0 .6em}
h2{font-size:1.15rem;margin:1.4em 0 .5em;border-bottom:1px solid #ddd}
h3{font-size:1rem;margin:1em 0 .4em;color:#333}
.pair{display:grid;grid-template-columns:1fr;gap:12px}
@media (min-width:900px){.pair{grid-template-columns:1fr 1fr}}
.side{border:1px solid #ddd;border-radius:6px;padding:8px;min-width:0;overflow-wrap:anywhere}
.side.a{border-top:4px solid #2a6fdb}
.side.b{border-top:4px solid #d9822b}
.side dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:0}
.side dt{font-weight:600}
.side dd{margin:0}
.warn{border:2px solid #c0392b;background:#fdecea;color:#611;padding:8px 12px;border-radius:6px;margin:8px 0}
.partial{border:1px solid #e0a800;background:#fff8e1;padding:8px 12px;border-radius:6px}
.partial li{overflow-wrap:anywhere}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.9rem;width:100%}
th,td{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;white-space:nowrap}
td.k{overflow-wrap:anywhere;min-width:12ch;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85rem}
.up{color:#b00020}.down{color:#0a7a2f}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:6px;min-width:0}
figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:.8rem;color:#444;overflow-wrap:anywhere}
.tag{display:inline-block;font-size:.75rem;font-weight:600;padding:0 6px;border-radius:4px;background:#555;color:#fff}
.tag.only{background:#8e44ad}
.missing{border:2px dashed #bbb;color:#666;display:flex;align-items:center;justify-content:center;min-height:80px}
"#;

#[allow(clippy::too_many_arguments)]
fn page(
    out: &mut String,
    a: &Sweep,
    b: &Sweep,
    label_a: &str,
    label_b: &str,
    mismatch: &[String],
    partial: &[String],
    changes: &[KernelChange],
    cut: usize,
    rows: &[ImageRow],
) {
    let (la, lb) = (escape(label_a), escape(label_b));
    // write! to a String cannot fail.
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>gt prof compare: {la} vs {lb}</title><style>{CSS}</style></head><body>\n\
         <h1>{la} <span style=\"font-weight:400\">vs</span> {lb}</h1>\n"
    );
    for w in mismatch {
        let _ =
            writeln!(out, "<div class=\"warn\" role=\"alert\"><strong>Mismatched sweeps:</strong> {}</div>", escape(w));
    }
    out.push_str("<div class=\"pair\">\n");
    header(out, a, label_a, "a");
    header(out, b, label_b, "b");
    out.push_str("</div>\n");

    if !partial.is_empty() {
        let _ = writeln!(
            out,
            "<h2 id=\"partial\">Partial results</h2><div class=\"partial\"><p>Some runs failed or left files cut short; \
             what could be read is shown, and the rest is named here.</p><ul>"
        );
        for w in partial {
            let _ = writeln!(out, "<li>{}</li>", escape(w));
        }
        out.push_str("</ul></div>\n");
    }

    kernel_table(out, changes, cut, &la, &lb);

    out.push_str("<h2 id=\"plots\">Plots</h2>\n");
    if rows.is_empty() {
        out.push_str("<p>Neither sweep has plots (run <code>gt prof variance</code> and <code>gt prof report</code> on them).</p>\n");
    }
    let mut last_section = None;
    for row in rows {
        if last_section != Some(&row.section) {
            let _ = writeln!(out, "<h3>{}</h3>", escape(&row.section));
            last_section = Some(&row.section);
        }
        out.push_str("<div class=\"pair\">\n");
        figure(out, row.a.as_ref(), row.b.is_none(), &la, &row.name);
        figure(out, row.b.as_ref(), row.a.is_none(), &lb, &row.name);
        out.push_str("</div>\n");
    }
    out.push_str("</body></html>\n");
}

fn header(out: &mut String, s: &Sweep, label: &str, side: &str) {
    let m = &s.manifest;
    let ok = m.runs.iter().filter(|r| r.ok).count();
    let failed = m.runs.len() - ok;
    let _ = write!(
        out,
        "<div class=\"side {side}\"><strong>{}</strong><dl><dt>Folder</dt><dd>{}</dd><dt>Script</dt><dd>{}</dd>\
         <dt>Started</dt><dd>{}</dd><dt>Runs</dt><dd>{ok} ok, {failed} failed ({} repetition(s) each)</dd><dt>Settings</dt><dd>",
        escape(label),
        escape(&s.dir.display().to_string()),
        escape(&m.script),
        escape(&m.started),
        m.repeat,
    );
    if m.axes.is_empty() {
        out.push_str("none swept");
    }
    for (i, axis) in m.axes.iter().enumerate() {
        let _ = write!(
            out,
            "{}<code>{}</code> = {}",
            if i > 0 { "<br>" } else { "" },
            escape(&axis.name),
            escape(&axis.values.join(", "))
        );
    }
    out.push_str("</dd></dl></div>\n");
}

fn kernel_table(out: &mut String, changes: &[KernelChange], cut: usize, la: &str, lb: &str) {
    let _ = writeln!(
        out,
        "<h2 id=\"kernels\">Kernels whose time changed most</h2>\
         <p>Mean duration of one launch over every successful run; change is {lb} minus {la}.</p>"
    );
    if changes.is_empty() {
        out.push_str("<p>No kernel records in either sweep.</p>\n");
        return;
    }
    let _ = writeln!(
        out,
        "<div class=\"scroll\"><table><thead><tr><th>Kernel</th><th>Inputs</th><th class=\"n\">{la} mean</th>\
         <th class=\"n\">{la} launches</th><th class=\"n\">{lb} mean</th><th class=\"n\">{lb} launches</th>\
         <th class=\"n\">Change</th><th class=\"n\">Change %</th></tr></thead><tbody>"
    );
    let side = |s: Option<KernelStats>| match s {
        Some(s) => (duration(s.mean_ns), s.launches.to_string()),
        None => ("—".to_string(), "—".to_string()),
    };
    for c in changes {
        let (am, al) = side(c.a);
        let (bm, bl) = side(c.b);
        let d = c.change_ns();
        let class = if d > 0.0 {
            "up"
        } else if d < 0.0 {
            "down"
        } else {
            ""
        };
        let pct = match (c.a, c.b) {
            (Some(_), None) => format!("<span class=\"tag only\">only in {la}</span>"),
            (None, Some(_)) => format!("<span class=\"tag only\">only in {lb}</span>"),
            _ => c.change_pct().map_or("—".to_string(), |p| format!("{p:+.1}%")),
        };
        let sign = if d > 0.0 { "+" } else { "" };
        let _ = writeln!(
            out,
            "<tr><td class=\"k\">{}</td><td class=\"k\">{}</td><td class=\"n\">{am}</td><td class=\"n\">{al}</td>\
             <td class=\"n\">{bm}</td><td class=\"n\">{bl}</td><td class=\"n {class}\">{sign}{}</td><td class=\"n {class}\">{pct}</td></tr>",
            escape(&c.name),
            escape(&c.inputs),
            duration(d),
        );
    }
    out.push_str("</tbody></table></div>\n");
    if cut > 0 {
        let _ = writeln!(out, "<p>{cut} more kernel(s) changed less and are not listed.</p>");
    }
}

/// One side of a plot row; `alone` marks an image the other side lacks.
fn figure(out: &mut String, img: Option<&Image>, alone: bool, label: &str, name: &str) {
    let Some(img) = img else {
        let _ = writeln!(out, "<div class=\"missing\">{} — not in {label}</div>", escape(name));
        return;
    };
    out.push_str("<figure>");
    match &img.data {
        Ok(url) => {
            let _ = write!(out, "<img src=\"{url}\" alt=\"{} ({label})\" loading=\"lazy\">", escape(&img.rel));
        }
        Err(e) => {
            let _ = write!(out, "<div class=\"missing\">{}</div>", escape(e));
        }
    }
    let _ = write!(out, "<figcaption><strong>{label}</strong> · {}", escape(&img.rel));
    if alone {
        let _ = write!(out, " <span class=\"tag only\">only in {label}</span>");
    }
    if img.failed_run {
        out.push_str(" <span class=\"tag\">failed run</span>");
    }
    let _ = writeln!(out, "</figcaption></figure>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prof::load::{Profile, SweepAxis, SweepManifest};

    fn rec(name: &str, inputs: &str, ns: u64) -> Record {
        Record {
            seq: Some(1),
            kernel_hash: "0123456789abcdef".into(),
            inputs: inputs.into(),
            duration_ns: ns,
            ..Record::new(RecordKind::Kernel, "w0", name)
        }
    }

    fn stats(records: &[Record]) -> BTreeMap<KernelKey, KernelStats> {
        kernel_stats(records.iter())
    }

    #[test]
    fn means_count_kernels_only_and_key_by_inputs() {
        let mut copy = rec("matmul", "f32[2]", 1_000_000);
        copy.kind = RecordKind::Copy;
        let s = stats(&[rec("matmul", "f32[2]", 100), rec("matmul", "f32[2]", 300), rec("matmul", "f32[4]", 50), copy]);
        assert_eq!(s.len(), 2);
        assert_eq!(s[&("matmul".into(), "f32[2]".into())], KernelStats { mean_ns: 200.0, launches: 2 });
        assert_eq!(s[&("matmul".into(), "f32[4]".into())], KernelStats { mean_ns: 50.0, launches: 1 });
    }

    #[test]
    fn changes_sort_by_absolute_change_and_keep_one_sided() {
        let a = stats(&[rec("add", "", 100), rec("mul", "", 1000), rec("gone", "", 500), rec("same", "", 7)]);
        let b = stats(&[rec("add", "", 150), rec("mul", "", 200), rec("new", "", 300), rec("same", "", 7)]);
        let (rows, cut) = kernel_changes(&a, &b, 10);
        assert_eq!(cut, 0);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        // mul -800, gone -500, new +300, add +50, same 0.
        assert_eq!(names, ["mul", "gone", "new", "add", "same"]);
        assert_eq!(rows[0].change_ns(), -800.0);
        assert_eq!(rows[0].change_pct(), Some(-80.0));
        assert!(rows[1].b.is_none() && rows[1].a.is_some());
        assert_eq!(rows[1].change_pct(), None);
        assert!(rows[2].a.is_none());
        assert_eq!(rows[2].change_ns(), 300.0);
        assert_eq!(rows[3].change_pct(), Some(50.0));

        let (top, cut) = kernel_changes(&a, &b, 2);
        assert_eq!(top.len(), 2);
        assert_eq!(cut, 3);
    }

    #[test]
    fn ties_sort_by_name() {
        let a = stats(&[rec("b", "", 10), rec("a", "", 10)]);
        let b = stats(&[rec("b", "", 20), rec("a", "", 20)]);
        let (rows, _) = kernel_changes(&a, &b, 10);
        assert_eq!(rows[0].name, "a");
    }

    #[test]
    fn escape_covers_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gt-compare-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn sweep(dir: PathBuf, axis: &str, records: Vec<Record>, ok: bool) -> Sweep {
        let run = SweepRun {
            dir: "run-000".into(),
            settings: [(axis.to_string(), "1".to_string())].into(),
            repetition: 1,
            ok,
            error: None,
            seconds: 1.0,
        };
        Sweep {
            dir,
            manifest: SweepManifest {
                script: "<b>mlp</b>.gtir".into(),
                started: "2024-01-01T00:00:00Z".into(),
                axes: vec![SweepAxis { name: axis.into(), values: vec!["1".into()] }],
                repeat: 1,
                runs: vec![run],
            },
            profiles: vec![(0, Profile { records, ..Profile::default() })],
            warnings: vec!["run run-001 failed: <exit 1>".into()],
        }
    }

    #[test]
    fn page_escapes_file_strings_and_fetches_nothing() {
        let dir = temp_dir("escape");
        let a = sweep(dir.clone(), "GT_WORKERS", vec![rec("<script>alert(1)</script>", "f32[2]", 10)], true);
        let b = sweep(dir.clone(), "GT_OTHER", vec![rec("<script>alert(1)</script>", "f32[2]", 20)], true);
        let options =
            CompareOptions { label_a: Some("<i>old</i>".into()), label_b: Some("new".into()), ..Default::default() };
        let report = compare(&a, &b, &options).unwrap();
        let html = &report.html;
        assert!(!html.contains("<script"), "unescaped script in page");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("<i>old</i>") && html.contains("&lt;i&gt;old&lt;/i&gt;"));
        assert!(!html.contains("<b>mlp"));
        for external in ["http://", "https://", "src=\"/", "url(", "@import", "<link"] {
            assert!(!html.contains(external), "page refers to {external}");
        }
        assert_eq!(report.kernels, 1);
        // The different axes and the sweeps' own warnings are both returned and on the page.
        assert!(report.warnings.iter().any(|w| w.contains("different settings")));
        assert!(report.warnings.iter().any(|w| w.contains("&lt;exit 1&gt;") || w.contains("<exit 1>")));
        assert!(html.contains("class=\"warn\"") && html.contains("Partial results") && html.contains("&lt;exit 1&gt;"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_sweep_without_a_successful_run_is_named() {
        let dir = temp_dir("empty");
        let a = sweep(dir.clone(), "GT_WORKERS", vec![rec("add", "", 10)], true);
        let b = sweep(dir.clone(), "GT_WORKERS", vec![rec("add", "", 10)], false);
        let options = CompareOptions { label_a: Some("old".into()), label_b: Some("new".into()), top_n: 5 };
        match compare(&a, &b, &options) {
            Err(CompareError::NoSuccessfulRun { label, .. }) => assert_eq!(label, "new"),
            other => panic!("expected NoSuccessfulRun, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
