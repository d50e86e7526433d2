//! `gt prof sweep`: runs a script once per combination of settings (and repetition) with
//! profiling on, each run in a subfolder of a timestamped sweep folder, and writes what ran
//! (`sweep.json`, read back by [`super::load::load_sweep`]) and a summary log. A failed run
//! is recorded with its exit status and the end of its output, and the sweep goes on.

use super::load::{SweepAxis, SweepManifest, SweepRun, SWEEP_MANIFEST};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The summary log's file name.
pub const SUMMARY: &str = "summary.log";
/// Each run's output (stdout and stderr), in its folder.
pub const RUN_OUTPUT: &str = "run_output.log";

/// What to sweep.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// The script.
    pub script: PathBuf,
    /// The settings to sweep, in order (the first varies slowest), each with its values;
    /// `--config a.yaml,b.yaml` is the setting `GT_CONFIG`.
    pub axes: Vec<SweepAxis>,
    /// Runs per combination (at least 1).
    pub repeat: u32,
    /// The sweep folder (created; it must not hold a sweep already).
    pub out: PathBuf,
    /// The `gt-run` to run.
    pub gt_run: PathBuf,
}

/// Why a sweep could not run at all (a failing run is not one of these: it is recorded).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Nothing to sweep over.
    #[error("nothing to sweep: give at least one --set NAME=V1,V2 or --config A.yaml,B.yaml")]
    NoAxes,
    /// A setting without values.
    #[error("--set {0}: no values (write --set {0}=V1,V2)")]
    NoValues(String),
    /// A setting given twice.
    #[error("{0} is swept twice; give its values once (--set {0}=V1,V2)")]
    Twice(String),
    /// The sweep folder holds a sweep already.
    #[error("{}: holds a sweep already (sweep.json); choose another --out", .0.display())]
    Exists(PathBuf),
    /// A file or folder could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Every combination of the axes' values, the first axis varying slowest.
pub fn combinations(axes: &[SweepAxis]) -> Vec<BTreeMap<String, String>> {
    let mut out = vec![BTreeMap::new()];
    for axis in axes {
        out = out
            .into_iter()
            .flat_map(|c| {
                axis.values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.insert(axis.name.clone(), v.clone());
                    c
                })
            })
            .collect();
    }
    out
}

/// The folder name of a run: each setting as `NAME-VALUE` in axis order (a config file by its
/// stem), characters a file name should not hold replaced, and `_repN` when repeating.
pub fn run_dir(axes: &[SweepAxis], settings: &BTreeMap<String, String>, repetition: u32, repeat: u32) -> String {
    let safe = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "-.".contains(c) { c } else { '_' }).collect()
    };
    let mut parts = Vec::new();
    for axis in axes {
        let value = settings.get(&axis.name).map_or("", String::as_str);
        let value = if axis.name == "GT_CONFIG" {
            Path::new(value).file_stem().and_then(|s| s.to_str()).unwrap_or(value).to_string()
        } else {
            value.to_string()
        };
        parts.push(format!("{}-{}", safe(axis.name.trim_start_matches("GT_")), safe(&value)));
    }
    let mut name = parts.join("_");
    if repeat > 1 {
        name.push_str(&format!("_rep{repetition}"));
    }
    name
}

/// A sweep folder name for now: `sweep_YYYYMMDD_HHMMSS` (UTC).
pub fn timestamped_name() -> String {
    format!("sweep_{}", crate::capture::stamp())
}

/// Checks the axes before anything runs.
pub fn check_axes(axes: &[SweepAxis]) -> Result<(), SweepError> {
    if axes.is_empty() {
        return Err(SweepError::NoAxes);
    }
    for (i, axis) in axes.iter().enumerate() {
        if axis.values.is_empty() || axis.values.iter().any(|v| v.is_empty()) {
            return Err(SweepError::NoValues(axis.name.clone()));
        }
        if axes[..i].iter().any(|a| a.name == axis.name) {
            return Err(SweepError::Twice(axis.name.clone()));
        }
    }
    Ok(())
}

/// Runs the sweep; `progress` hears of each run as it ends (index, runs in all, the run).
pub fn run_sweep(
    options: &SweepOptions,
    progress: &mut dyn FnMut(usize, usize, &SweepRun),
) -> Result<SweepManifest, SweepError> {
    check_axes(&options.axes)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SweepError::Io { path, source }
    };
    if options.out.join(SWEEP_MANIFEST).exists() {
        return Err(SweepError::Exists(options.out.clone()));
    }
    std::fs::create_dir_all(&options.out).map_err(io(&options.out))?;
    let repeat = options.repeat.max(1);
    let mut manifest = SweepManifest {
        script: options.script.display().to_string(),
        started: crate::capture::humantime_now(),
        axes: options.axes.clone(),
        repeat,
        runs: Vec::new(),
    };
    let summary_path = options.out.join(SUMMARY);
    let mut summary = std::fs::File::create(&summary_path).map_err(io(&summary_path))?;
    let combos = combinations(&options.axes);
    let total = combos.len() * repeat as usize;
    writeln!(summary, "sweep of {} started {}: {total} runs", manifest.script, manifest.started)
        .map_err(io(&summary_path))?;
    for settings in &combos {
        for repetition in 1..=repeat {
            let dir = run_dir(&options.axes, settings, repetition, repeat);
            let run = run_one(options, settings, &dir, repetition);
            let status = match &run.error {
                None => "ok".to_string(),
                Some(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
            };
            writeln!(summary, "{dir}: {status} ({:.2} s)", run.seconds).map_err(io(&summary_path))?;
            manifest.runs.push(run);
            // Written after every run, so an interrupted sweep still reads as one.
            write_manifest(&options.out, &manifest)?;
            progress(manifest.runs.len(), total, manifest.runs.last().expect("pushed"));
        }
    }
    let failed = manifest.runs.iter().filter(|r| !r.ok).count();
    writeln!(summary, "done: {} ok, {failed} failed", manifest.runs.len() - failed).map_err(io(&summary_path))?;
    Ok(manifest)
}

/// [`run_sweep`] with a progress bar on stderr (drawn only on a terminal), each run's
/// outcome printed above it, and `after` called on each run that succeeded (e.g. to draw its
/// report).
pub fn run_with_progress(
    options: &SweepOptions,
    after: &mut dyn FnMut(&Path) -> Result<(), String>,
) -> Result<SweepManifest, SweepError> {
    let runs = combinations(&options.axes).len() as u64 * u64::from(options.repeat.max(1));
    let bar = indicatif::ProgressBar::new(runs);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs, {elapsed} ({eta} left) {msg}")
            .expect("a fixed template parses"),
    );
    let out = options.out.clone();
    let result = run_sweep(options, &mut |_, _, run| {
        let mut line = format!("{}: {}", run.dir, if run.ok { "ok".to_string() } else { "FAILED".to_string() });
        if run.ok {
            if let Err(e) = after(&out.join(&run.dir)) {
                line.push_str(&format!(" (report: {e})"));
            }
        } else if let Some(e) = &run.error {
            line.push_str(&format!(": {}", e.lines().next().unwrap_or("")));
        }
        let line = format!("{line} ({:.1} s)", run.seconds);
        // Without a terminal the bar is hidden, and so would be its lines.
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
        bar.inc(1);
    });
    bar.finish_and_clear();
    result
}

fn write_manifest(dir: &Path, manifest: &SweepManifest) -> Result<(), SweepError> {
    let path = dir.join(SWEEP_MANIFEST);
    let text = serde_json::to_string_pretty(manifest).expect("a manifest always serializes");
    std::fs::write(&path, text + "\n").map_err(|source| SweepError::Io { path, source })
}

/// One run: `gt-run --quiet --profile DIR script` with the combination's settings in its
/// environment, its output kept in `DIR/run_output.log`.
fn run_one(options: &SweepOptions, settings: &BTreeMap<String, String>, dir: &str, repetition: u32) -> SweepRun {
    let folder = options.out.join(dir);
    let started = Instant::now();
    let outcome = (|| -> Result<(), String> {
        std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        let log_path = folder.join(RUN_OUTPUT);
        let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err_log = log.try_clone().map_err(|e| format!("{}: {e}", log_path.display()))?;
        let status = Command::new(&options.gt_run)
            .arg("--quiet")
            .arg("--profile")
            .arg(&folder)
            .arg(&options.script)
            .envs(settings)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", options.gt_run.display()))?;
        if status.success() {
            return Ok(());
        }
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = output.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("gt-run exited with {status}: {}", tail.join(" | ")))
    })();
    SweepRun {
        dir: dir.to_string(),
        settings: settings.clone(),
        repetition,
        ok: outcome.is_ok(),
        error: outcome.err(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(name: &str, values: &[&str]) -> SweepAxis {
        SweepAxis { name: name.into(), values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn combinations_vary_the_last_axis_fastest() {
        let axes = [axis("GT_WORKERS", &["1", "2"]), axis("GT_JIT", &["0", "1", "true"])];
        let c = combinations(&axes);
        assert_eq!(c.len(), 6);
        assert_eq!((c[0]["GT_WORKERS"].as_str(), c[0]["GT_JIT"].as_str()), ("1", "0"));
        assert_eq!((c[1]["GT_WORKERS"].as_str(), c[1]["GT_JIT"].as_str()), ("1", "1"));
        assert_eq!((c[5]["GT_WORKERS"].as_str(), c[5]["GT_JIT"].as_str()), ("2", "true"));
    }

    #[test]
    fn run_folders_name_their_settings_safely() {
        let axes = [axis("GT_WORKERS", &["2"]), axis("GT_CONFIG", &["../cfg/a b.yaml"])];
        let c = &combinations(&axes)[0];
        assert_eq!(run_dir(&axes, c, 1, 1), "WORKERS-2_CONFIG-a_b");
        assert_eq!(run_dir(&axes, c, 3, 3), "WORKERS-2_CONFIG-a_b_rep3");
        assert!(!run_dir(&[axis("GT_X", &["a/../../b"])], &combinations(&[axis("GT_X", &["a/../../b"])])[0], 1, 1)
            .contains('/'));
    }

    #[test]
    fn bad_axes_are_refused_before_anything_runs() {
        assert!(matches!(check_axes(&[]), Err(SweepError::NoAxes)));
        assert!(matches!(check_axes(&[axis("GT_JIT", &[])]), Err(SweepError::NoValues(_))));
        assert!(matches!(check_axes(&[axis("GT_JIT", &["0", ""])]), Err(SweepError::NoValues(_))));
        let twice = [axis("GT_JIT", &["0"]), axis("GT_JIT", &["1"])];
        assert!(matches!(check_axes(&twice), Err(SweepError::Twice(_))));
    }

    #[test]
    fn sweep_names_are_timestamps() {
        let name = timestamped_name();
        assert!(name.starts_with("sweep_") && name.len() == "sweep_20261125_015543".len(), "{name}");
    }

    #[test]
    fn a_failing_run_is_recorded_and_the_sweep_goes_on() {
        let dir = std::env::temp_dir().join(format!("gt-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // `false` fails every run without reading its arguments.
        let options = SweepOptions {
            script: "x.gtir".into(),
            axes: vec![axis("GT_WORKERS", &["1", "2"])],
            repeat: 1,
            out: dir.clone(),
            gt_run: "false".into(),
        };
        let mut seen = Vec::new();
        let manifest = run_sweep(&options, &mut |i, n, r| seen.push((i, n, r.ok))).unwrap();
        assert_eq!(seen, vec![(1, 2, false), (2, 2, false)]);
        assert!(manifest.runs.iter().all(|r| r.error.as_deref().is_some_and(|e| e.contains("exited with"))));
        let summary = std::fs::read_to_string(dir.join(SUMMARY)).unwrap();
        assert!(summary.contains("WORKERS-1: FAILED") && summary.contains("done: 0 ok, 2 failed"), "{summary}");
        assert!(matches!(run_sweep(&options, &mut |_, _, _| {}), Err(SweepError::Exists(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
