//! Kernel time spread across a sweep: for each run and worker, the kernels whose launches
//! varied most in duration (max − min), when the fastest and slowest launch ran, and which
//! copies and collective parts on that worker overlapped the slowest one (the usual suspect
//! for a slow launch is contention). One [`VarianceRow`] per kernel, written as CSV by
//! [`write_csv`]; [`spread_by`] groups the spreads for plots, which are drawn elsewhere.

use super::load::{Profile, Sweep, SweepAxis, SWEEP_MANIFEST};
use super::overlap::{self, Interval};
use gt_transport::profile::{Record, RecordKind};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Why no spread table could be made or written.
#[derive(Debug, thiserror::Error)]
pub enum VarianceError {
    /// Every run of the sweep failed, so any numbers would describe failures.
    #[error("every run of {} failed; see {}", .0.display(), .0.join(SWEEP_MANIFEST).display())]
    AllRunsFailed(PathBuf),
    /// The sweep ran nothing.
    #[error("{} holds no runs; see {}", .0.display(), .0.join(SWEEP_MANIFEST).display())]
    NoRuns(PathBuf),
    /// The CSV file could not be written.
    #[error("{}: {source}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// Why.
        source: csv::Error,
    },
    /// The CSV file could not be flushed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A picture could not be drawn or written.
    #[error(transparent)]
    Picture(#[from] crate::visualize::VisualizeError),
}

/// One kernel of one worker in one run: how its launches' durations spread, and what
/// overlapped its slowest launch. Times are milliseconds; timestamps are on the
/// dispatcher's clock (since it started), as in the profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VarianceRow {
    /// The run's folder, relative to the sweep folder.
    pub run: String,
    /// The run's value of each swept setting, in the sweep's axis order (CSV: one column
    /// per setting, named by it).
    pub settings: Vec<(String, String)>,
    /// Which repetition of its combination (1-based).
    pub repetition: u32,
    /// Whether the run failed or its profile is incomplete (rows cut short, no clean end):
    /// its numbers cover what was written.
    pub partial: bool,
    /// The worker.
    pub worker: String,
    /// The kernel's name (the op, or `fused.HASH8`).
    pub name: String,
    /// The kernel's hash: same code on the same shapes.
    pub kernel_hash: String,
    /// The instruction's mnemonic.
    pub op: String,
    /// Operand types of the first launch (the hash fixes them).
    pub inputs: String,
    /// How many launches.
    pub launches: usize,
    /// The fastest launch's duration.
    pub min_ms: f64,
    /// The slowest launch's duration.
    pub max_ms: f64,
    /// The mean duration.
    pub mean_ms: f64,
    /// `max_ms - min_ms`, what rows are ranked by.
    pub spread_ms: f64,
    /// When the fastest launch started (the first, among equals).
    pub min_timestamp_ms: f64,
    /// When the slowest launch started (the first, among equals).
    pub max_timestamp_ms: f64,
    /// How far apart they started (absolute; compare the two timestamps for which came first).
    pub time_between_min_max_ms: f64,
    /// Copies and collective parts on the same worker that overlapped the slowest launch.
    pub overlapping_count: usize,
    /// Their names, `;`-joined, each once, in start order.
    pub overlapping_names: String,
    /// The largest share of the slowest launch any one of them overlapped, percent.
    pub max_overlap_percent: f64,
    /// Its name (empty: none overlapped).
    pub max_overlap_name: String,
    /// How much of the slowest launch at least one of them overlapped (merged: concurrent
    /// ones counted once).
    pub total_overlap_ms: f64,
}

/// The CSV columns before the swept settings' columns.
const LEADING: [&str; 1] = ["run"];
/// The CSV columns after them.
const TRAILING: [&str; 20] = [
    "repetition",
    "partial",
    "worker",
    "name",
    "kernel_hash",
    "op",
    "inputs",
    "launches",
    "min_ms",
    "max_ms",
    "mean_ms",
    "spread_ms",
    "min_timestamp_ms",
    "max_timestamp_ms",
    "time_between_min_max_ms",
    "overlapping_count",
    "overlapping_names",
    "max_overlap_percent",
    "max_overlap_name",
    "total_overlap_ms",
];

/// The `top_k` kernels with the largest spread (max − min duration) of each worker in each
/// run of `sweep` that has a profile, runs in sweep order, workers in file order, kernels by
/// spread, largest first. A kernel is its `name` and `kernel_hash` (same code on the same
/// shapes); only kernels launched at least twice have a spread. Failed runs whose profile
/// could be read are included and marked `partial`.
pub fn variance(sweep: &Sweep, top_k: usize) -> Result<Vec<VarianceRow>, VarianceError> {
    let runs = &sweep.manifest.runs;
    if runs.is_empty() {
        return Err(VarianceError::NoRuns(sweep.dir.clone()));
    }
    if runs.iter().all(|r| !r.ok) {
        return Err(VarianceError::AllRunsFailed(sweep.dir.clone()));
    }
    let mut rows = Vec::new();
    for (index, profile) in &sweep.profiles {
        let Some(run) = runs.get(*index) else { continue };
        let mut settings: Vec<(String, String)> = sweep
            .manifest
            .axes
            .iter()
            .filter_map(|a| run.settings.get(&a.name).map(|v| (a.name.clone(), v.clone())))
            .collect();
        // Settings the axes do not name (a hand-edited sweep.json) still get columns.
        for (k, v) in &run.settings {
            if !settings.iter().any(|(name, _)| name == k) {
                settings.push((k.clone(), v.clone()));
            }
        }
        let context = RunContext {
            run: &run.dir,
            settings: &settings,
            repetition: run.repetition,
            partial: !run.ok || !profile.is_complete(),
        };
        rows.extend(profile_rows(profile, &context, top_k));
    }
    Ok(rows)
}

/// What every row of one run repeats.
struct RunContext<'a> {
    run: &'a str,
    settings: &'a [(String, String)],
    repetition: u32,
    partial: bool,
}

fn profile_rows(profile: &Profile, context: &RunContext, top_k: usize) -> Vec<VarianceRow> {
    let mut rows = Vec::new();
    for worker in profile.workers() {
        let on_worker = || profile.records.iter().filter(|r| r.worker == worker);
        // What could contend with a kernel on this worker: its copies and its parts of
        // collectives (another worker's part of the same collective is not on this device).
        let mut contenders: Vec<&Record> =
            on_worker().filter(|r| matches!(r.kind, RecordKind::Copy | RecordKind::Transfer)).collect();
        contenders.sort_by_key(|r| (r.start_ns, r.end_ns()));
        let contender_intervals: Vec<Interval> = contenders.iter().map(|r| (r.start_ns, r.end_ns())).collect();
        let mut kernels: HashMap<(&str, &str), Vec<&Record>> = HashMap::new();
        for r in on_worker().filter(|r| r.kind == RecordKind::Kernel) {
            kernels.entry((r.name.as_str(), r.kernel_hash.as_str())).or_default().push(r);
        }
        let mut worker_rows: Vec<VarianceRow> = kernels
            .into_values()
            .filter(|launches| launches.len() >= 2)
            .map(|launches| kernel_row(&launches, &contenders, &contender_intervals, context))
            .collect();
        worker_rows.sort_by(|a, b| {
            b.spread_ms.total_cmp(&a.spread_ms).then_with(|| (&a.name, &a.kernel_hash).cmp(&(&b.name, &b.kernel_hash)))
        });
        worker_rows.truncate(top_k);
        rows.extend(worker_rows);
    }
    rows
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// One kernel's row; `launches` holds at least one record, in file order.
fn kernel_row(
    launches: &[&Record],
    contenders: &[&Record],
    contender_intervals: &[Interval],
    context: &RunContext,
) -> VarianceRow {
    let first = launches[0];
    // The first among equals, so repeated runs of the tool agree.
    let fastest = launches.iter().copied().fold(first, |m, r| if r.duration_ns < m.duration_ns { r } else { m });
    let slowest = launches.iter().copied().fold(first, |m, r| if r.duration_ns > m.duration_ns { r } else { m });
    let total: f64 = launches.iter().map(|r| r.duration_ns as f64).sum();
    let target = (slowest.start_ns, slowest.end_ns());
    let shares = overlap::shares(target, contender_intervals);
    let mut names: Vec<&str> = Vec::new();
    for s in &shares {
        let name = contenders[s.index].name.as_str();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let largest = overlap::largest(&shares);
    VarianceRow {
        run: context.run.to_string(),
        settings: context.settings.to_vec(),
        repetition: context.repetition,
        partial: context.partial,
        worker: first.worker.clone(),
        name: first.name.clone(),
        kernel_hash: first.kernel_hash.clone(),
        op: first.op.clone(),
        inputs: first.inputs.clone(),
        launches: launches.len(),
        min_ms: ms(fastest.duration_ns),
        max_ms: ms(slowest.duration_ns),
        mean_ms: total / launches.len() as f64 / 1e6,
        spread_ms: ms(slowest.duration_ns - fastest.duration_ns),
        min_timestamp_ms: ms(fastest.start_ns),
        max_timestamp_ms: ms(slowest.start_ns),
        time_between_min_max_ms: ms(slowest.start_ns.abs_diff(fastest.start_ns)),
        overlapping_count: shares.len(),
        overlapping_names: names.join(";"),
        max_overlap_percent: largest.map_or(0.0, |s| s.percent),
        max_overlap_name: largest.map_or_else(String::new, |s| contenders[s.index].name.clone()),
        total_overlap_ms: ms(overlap::covered(target, contender_intervals)),
    }
}

/// The swept settings' names across `rows`, in the order they first appear (the sweep's
/// axis order, since every row lists them so).
fn setting_columns(rows: &[VarianceRow]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for row in rows {
        for (name, _) in &row.settings {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    names
}

/// Writes `rows` to `path` as CSV with a header: `run`, one column per swept setting (named
/// by the setting), then the row's fields in declaration order. A row without a value for
/// some setting leaves its cell empty.
pub fn write_csv(rows: &[VarianceRow], path: &Path) -> Result<(), VarianceError> {
    let csv_err = |source| VarianceError::Csv { path: path.to_path_buf(), source };
    let settings = setting_columns(rows);
    let mut out = csv::Writer::from_path(path).map_err(csv_err)?;
    let header: Vec<&str> = LEADING.iter().chain(&settings).chain(TRAILING.iter()).copied().collect();
    out.write_record(&header).map_err(csv_err)?;
    for row in rows {
        let mut cells: Vec<String> = vec![row.run.clone()];
        for name in &settings {
            let value = row.settings.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            cells.push(value.unwrap_or_default());
        }
        cells.extend([
            row.repetition.to_string(),
            row.partial.to_string(),
            row.worker.clone(),
            row.name.clone(),
            row.kernel_hash.clone(),
            row.op.clone(),
            row.inputs.clone(),
            row.launches.to_string(),
            row.min_ms.to_string(),
            row.max_ms.to_string(),
            row.mean_ms.to_string(),
            row.spread_ms.to_string(),
            row.min_timestamp_ms.to_string(),
            row.max_timestamp_ms.to_string(),
            row.time_between_min_max_ms.to_string(),
            row.overlapping_count.to_string(),
            row.overlapping_names.clone(),
            row.max_overlap_percent.to_string(),
            row.max_overlap_name.clone(),
            row.total_overlap_ms.to_string(),
        ]);
        out.write_record(&cells).map_err(csv_err)?;
    }
    out.flush().map_err(|source| VarianceError::Io { path: path.to_path_buf(), source })
}

/// How [`spread_by`] groups rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupKey {
    /// By the value of one swept setting (label: the value).
    Axis(String),
    /// By worker (label: its name).
    Worker,
    /// By the values of two swept settings together, for interactions (label: `A × B`).
    Interaction(String, String),
}

/// The spreads (ms) of `rows` grouped by `key`, groups in the order they first appear
/// (sweep order, so axis values come as given to the sweep). Rows lacking a setting the key
/// names are left out.
pub fn spread_by(rows: &[VarianceRow], key: &GroupKey) -> Vec<(String, Vec<f64>)> {
    let setting = |row: &VarianceRow, name: &str| row.settings.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for row in rows {
        let label = match key {
            GroupKey::Axis(a) => setting(row, a),
            GroupKey::Worker => Some(row.worker.clone()),
            GroupKey::Interaction(a, b) => setting(row, a).zip(setting(row, b)).map(|(x, y)| format!("{x} × {y}")),
        };
        let Some(label) = label else { continue };
        match groups.iter_mut().find(|(l, _)| *l == label) {
            Some((_, samples)) => samples.push(row.spread_ms),
            None => groups.push((label, vec![row.spread_ms])),
        }
    }
    groups
}

/// The spread pictures of a sweep, as the seed's analysis draws them: a box plot of the
/// spreads by each swept setting (`spread_by_SETTING.png`), by worker
/// (`spread_by_worker.png`), a violin per run (`spread_violin.png`) and, with two or more
/// settings, the first two's interaction: the mean spread over the first's values, one line
/// per value of the second (`interaction.png`). Returns the files written.
pub fn plots(rows: &[VarianceRow], axes: &[SweepAxis], out_dir: &Path) -> Result<Vec<PathBuf>, VarianceError> {
    use super::chart::{self, Axes, Picture, Series, Unit};
    std::fs::create_dir_all(out_dir).map_err(|source| VarianceError::Io { path: out_dir.to_path_buf(), source })?;
    // Spreads are drawn from nanoseconds so that the axis picks a readable unit.
    let in_ns = |groups: Vec<(String, Vec<f64>)>| -> Vec<(String, Vec<f64>)> {
        groups.into_iter().map(|(l, v)| (l, v.into_iter().map(|ms| ms * 1e6).collect())).collect()
    };
    let mut files = Vec::new();
    let mut save = |name: String, draw: &dyn Fn(&chart::Area<'_>) -> chart::DrawResult| -> Result<(), VarianceError> {
        let path = out_dir.join(name);
        Picture::write(&path, (1400, 900), draw)?;
        files.push(path);
        Ok(())
    };
    let boxes = |area: &chart::Area<'_>, title: &str, x: &str, data: &[(String, Vec<f64>)]| {
        let series = [Series { name: "spread", colour: chart::colour(0), data }];
        let axes = Axes { title, x, y: "spread (max - min)", unit: Unit::Nanoseconds };
        chart::box_plot(area, axes, &series)
    };
    for axis in axes {
        let data = in_ns(spread_by(rows, &GroupKey::Axis(axis.name.clone())));
        let title = format!("Kernel time spread by {}", axis.name);
        save(format!("spread_by_{}.png", file_safe(&axis.name)), &|area| boxes(area, &title, &axis.name, &data))?;
    }
    let data = in_ns(spread_by(rows, &GroupKey::Worker));
    save("spread_by_worker.png".into(), &|area| boxes(area, "Kernel time spread by worker", "worker", &data))?;
    let mut by_run: Vec<(String, Vec<f64>)> = Vec::new();
    for row in rows {
        match by_run.iter_mut().find(|(r, _)| *r == row.run) {
            Some((_, v)) => v.push(row.spread_ms * 1e6),
            None => by_run.push((row.run.clone(), vec![row.spread_ms * 1e6])),
        }
    }
    let axes_violin = Axes { title: "Kernel time spread per run", x: "run", y: "spread", unit: Unit::Nanoseconds };
    save("spread_violin.png".into(), &|area| chart::violin_plot(area, axes_violin, &by_run))?;
    if let [a, b, ..] = axes {
        let mean_spread = |x: &str, y: &str| {
            let hits: Vec<f64> = rows
                .iter()
                .filter(|r| r.settings.iter().any(|(k, v)| *k == a.name && v == x))
                .filter(|r| r.settings.iter().any(|(k, v)| *k == b.name && v == y))
                .map(|r| r.spread_ms * 1e6)
                .collect();
            (!hits.is_empty()).then(|| hits.iter().sum::<f64>() / hits.len() as f64)
        };
        let lines: Vec<(String, Vec<Option<f64>>)> = b
            .values
            .iter()
            .map(|y| (format!("{} = {y}", b.name), a.values.iter().map(|x| mean_spread(x, y)).collect()))
            .collect();
        let title = format!("Mean kernel time spread: {} × {}", a.name, b.name);
        let axes = Axes { title: &title, x: &a.name, y: "mean spread", unit: Unit::Nanoseconds };
        save("interaction.png".into(), &|area| chart::line_plot(area, axes, &a.values, &lines))?;
    }
    Ok(files)
}

/// A setting's name as part of a file name.
fn file_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "_-".contains(c) { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prof::load::{SweepManifest, SweepRun};
    use crate::prof::Profile;
    use std::collections::BTreeMap;

    fn record(kind: RecordKind, worker: &str, name: &str, hash: &str, start_ns: u64, duration_ns: u64) -> Record {
        Record {
            seq: Some(1),
            kernel_hash: hash.into(),
            inputs: "f32[4,4];f32[4,4]".into(),
            outputs: "f32[4,4]".into(),
            bytes_read: 128,
            bytes_written: 64,
            flops: 128,
            start_ns,
            duration_ns,
            ..Record::new(kind, worker, name)
        }
    }

    fn kernel(worker: &str, name: &str, hash: &str, start_ns: u64, duration_ns: u64) -> Record {
        record(RecordKind::Kernel, worker, name, hash, start_ns, duration_ns)
    }

    fn run(dir: &str, workers: &str, repetition: u32, ok: bool) -> SweepRun {
        SweepRun {
            dir: dir.into(),
            settings: BTreeMap::from([("GT_WORKERS".to_string(), workers.to_string())]),
            repetition,
            ok,
            error: (!ok).then(|| "exit status 1".to_string()),
            seconds: 1.0,
        }
    }

    fn sweep(runs: Vec<SweepRun>, profiles: Vec<(usize, Profile)>) -> Sweep {
        Sweep {
            dir: PathBuf::from("/sweeps/s"),
            manifest: SweepManifest {
                script: "mlp.gtir".into(),
                started: String::new(),
                axes: vec![crate::prof::load::SweepAxis {
                    name: "GT_WORKERS".into(),
                    values: vec!["1".into(), "2".into()],
                }],
                repeat: 1,
                runs,
            },
            profiles,
            warnings: Vec::new(),
        }
    }

    fn profile(records: Vec<Record>) -> Profile {
        Profile { dir: PathBuf::from("run"), records, ..Profile::default() }
    }

    /// Worker w0: matmul launched three times (1, 5, 2 ms), relu twice (equal), add once;
    /// matmul with another hash (other shapes) twice. A transfer and a copy overlap the slow
    /// matmul; a transfer on w1 at the same time does not count.
    fn busy() -> Profile {
        const MS: u64 = 1_000_000;
        profile(vec![
            kernel("w0", "matmul", "aaaa", 0, MS),
            kernel("w0", "relu", "bbbb", MS, MS),
            kernel("w0", "matmul", "aaaa", 10 * MS, 5 * MS),
            kernel("w0", "relu", "bbbb", 20 * MS, MS),
            kernel("w0", "matmul", "aaaa", 30 * MS, 2 * MS),
            kernel("w0", "add", "cccc", 40 * MS, MS),
            kernel("w0", "matmul", "dddd", 50 * MS, MS),
            kernel("w0", "matmul", "dddd", 60 * MS, 3 * MS),
            // 11..13 ms and 12..14 ms: 3 ms of the slow matmul's 5 covered, once.
            record(RecordKind::Transfer, "w0", "all_reduce", "", 11 * MS, 2 * MS),
            record(RecordKind::Copy, "w0", "literal", "", 12 * MS, 2 * MS),
            // Touching the slow matmul's end: no overlap.
            record(RecordKind::Transfer, "w0", "all_gather", "", 15 * MS, MS),
            record(RecordKind::Transfer, "w1", "all_reduce", "", 10 * MS, 5 * MS),
            kernel("w1", "matmul", "aaaa", 0, MS),
            kernel("w1", "matmul", "aaaa", 5 * MS, MS),
        ])
    }

    #[test]
    fn kernels_are_ranked_by_spread_per_worker() {
        let s = sweep(vec![run("GT_WORKERS=2/1", "2", 1, true)], vec![(0, busy())]);
        let rows = variance(&s, 10).unwrap();
        let keys: Vec<(&str, &str, &str)> =
            rows.iter().map(|r| (r.worker.as_str(), r.name.as_str(), r.kernel_hash.as_str())).collect();
        // add ran once: no spread. Same name, other hash: its own kernel.
        assert_eq!(
            keys,
            [("w0", "matmul", "aaaa"), ("w0", "matmul", "dddd"), ("w0", "relu", "bbbb"), ("w1", "matmul", "aaaa")]
        );
        let m = &rows[0];
        assert_eq!((m.launches, m.min_ms, m.max_ms, m.spread_ms), (3, 1.0, 5.0, 4.0));
        assert!((m.mean_ms - 8.0 / 3.0).abs() < 1e-12);
        assert_eq!((m.min_timestamp_ms, m.max_timestamp_ms, m.time_between_min_max_ms), (0.0, 10.0, 10.0));
        assert_eq!((m.overlapping_count, m.overlapping_names.as_str()), (2, "all_reduce;literal"));
        assert_eq!((m.max_overlap_percent, m.max_overlap_name.as_str()), (40.0, "all_reduce"));
        assert_eq!(m.total_overlap_ms, 3.0);
        assert_eq!(m.settings, [("GT_WORKERS".to_string(), "2".to_string())]);
        assert!(!m.partial);
        // Equal launches: zero spread, still a row.
        assert_eq!((rows[2].spread_ms, rows[2].overlapping_count, rows[2].max_overlap_name.as_str()), (0.0, 0, ""));
        // Nothing on w1 but its kernels and its own transfer, which missed its slow launch.
        assert_eq!(rows[3].total_overlap_ms, 0.0);

        let top1 = variance(&s, 1).unwrap();
        assert_eq!(
            top1.iter().map(|r| (r.worker.as_str(), r.kernel_hash.as_str())).collect::<Vec<_>>(),
            [("w0", "aaaa"), ("w1", "aaaa")]
        );
    }

    #[test]
    fn every_run_failed_is_an_error() {
        let s = sweep(vec![run("a", "1", 1, false), run("b", "2", 1, false)], vec![(0, busy())]);
        let err = variance(&s, 5).unwrap_err();
        assert!(matches!(err, VarianceError::AllRunsFailed(_)));
        assert_eq!(err.to_string(), "every run of /sweeps/s failed; see /sweeps/s/sweep.json");
        assert!(matches!(variance(&sweep(vec![], vec![]), 5), Err(VarianceError::NoRuns(_))));
    }

    #[test]
    fn failed_and_incomplete_runs_are_marked_partial() {
        let mut cut = busy();
        cut.warnings.push("worker-w0.csv: 1 row(s) could not be read".into());
        let s = sweep(
            vec![run("a", "1", 1, true), run("b", "2", 1, false), run("c", "2", 2, true)],
            vec![(0, busy()), (1, busy()), (2, cut)],
        );
        let rows = variance(&s, 1).unwrap();
        let marks: Vec<(&str, u32, bool)> = rows.iter().map(|r| (r.run.as_str(), r.repetition, r.partial)).collect();
        assert_eq!(
            marks,
            [("a", 1, false), ("a", 1, false), ("b", 1, true), ("b", 1, true), ("c", 2, true), ("c", 2, true)]
        );
    }

    #[test]
    fn spreads_group_by_axis_worker_and_interaction() {
        let mut s = sweep(vec![run("a", "1", 1, true), run("b", "2", 1, true)], vec![(0, busy()), (1, busy())]);
        s.manifest.runs[0].settings.insert("GT_FUSE".into(), "on".into());
        s.manifest.runs[1].settings.insert("GT_FUSE".into(), "off".into());
        let rows = variance(&s, 1).unwrap();
        assert_eq!(
            spread_by(&rows, &GroupKey::Axis("GT_WORKERS".into())),
            [("1".to_string(), vec![4.0, 0.0]), ("2".to_string(), vec![4.0, 0.0])]
        );
        assert_eq!(
            spread_by(&rows, &GroupKey::Worker),
            [("w0".to_string(), vec![4.0, 4.0]), ("w1".to_string(), vec![0.0, 0.0])]
        );
        let pairs = spread_by(&rows, &GroupKey::Interaction("GT_WORKERS".into(), "GT_FUSE".into()));
        assert_eq!(
            pairs.iter().map(|(l, v)| (l.as_str(), v.len())).collect::<Vec<_>>(),
            [("1 × on", 2), ("2 × off", 2)]
        );
        assert_eq!(spread_by(&rows, &GroupKey::Axis("GT_NONE".into())), []);
    }

    #[test]
    fn the_csv_has_a_column_per_setting() {
        let mut s = sweep(vec![run("a", "1", 1, true)], vec![(0, busy())]);
        s.manifest.runs[0].settings.insert("GT_FUSE".into(), "on".into());
        s.manifest.axes.push(crate::prof::load::SweepAxis { name: "GT_FUSE".into(), values: vec!["on".into()] });
        let rows = variance(&s, 1).unwrap();
        let dir = std::env::temp_dir().join(format!("gt-variance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("variance.csv");
        write_csv(&rows, &path).unwrap();
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let header: Vec<String> = reader.headers().unwrap().iter().map(str::to_string).collect();
        assert_eq!(header[..4], ["run", "GT_WORKERS", "GT_FUSE", "repetition"]);
        assert_eq!(header.last().map(String::as_str), Some("total_overlap_ms"));
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        assert_eq!(records.len(), 2);
        let cell = |name: &str| &records[0][header.iter().position(|h| h == name).unwrap()];
        assert_eq!((cell("GT_WORKERS"), cell("GT_FUSE"), cell("partial")), ("1", "on", "false"));
        assert_eq!(
            (cell("spread_ms"), cell("overlapping_names"), cell("total_overlap_ms")),
            ("4", "all_reduce;literal", "3")
        );
        assert!(records.iter().all(|r| r.len() == header.len()));
        std::fs::remove_dir_all(&dir).unwrap();
        // A folder that does not exist: a typed error naming the file.
        let missing = dir.join("no/such/dir.csv");
        assert!(matches!(write_csv(&rows, &missing), Err(VarianceError::Csv { path, .. }) if path == missing));
    }
}
