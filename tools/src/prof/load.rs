//! Reading profiles and sweeps from disk: a profile folder (`GT_PROFILE`) into a [`Profile`],
//! a sweep folder (`gt prof sweep`) into a [`Sweep`]. What a crashed run left (a truncated
//! row, a missing manifest) is kept and named in `warnings`, never silently dropped.

use gt_transport::profile::{Manifest, Record, SignalRecord, MANIFEST, SIGNALS};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a profile or sweep could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The folder could not be listed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The folder or file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A folder that holds no profile.
    #[error("{}: not a profile folder (no manifest.json and no worker-*.csv; record one with `gt-run --profile DIR script.gtir`)", .0.display())]
    NotAProfile(PathBuf),
    /// A folder that holds no sweep.
    #[error("{}: not a sweep folder (no sweep.json; make one with `gt prof sweep`)", .0.display())]
    NotASweep(PathBuf),
    /// A sweep manifest that does not parse.
    #[error("{}: {source}", path.display())]
    BadSweep {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
}

/// One profiled run.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Its folder.
    pub dir: PathBuf,
    /// Its manifest (`None`: missing or unreadable, named in `warnings`).
    pub manifest: Option<Manifest>,
    /// Every worker's records, in file order (worker files sorted by name).
    pub records: Vec<Record>,
    /// Every signal scope.
    pub signals: Vec<SignalRecord>,
    /// What was wrong but not fatal: rows cut short, a missing manifest, a run that did
    /// not end cleanly. Reports print these.
    pub warnings: Vec<String>,
}

impl Profile {
    /// Whether the run ended cleanly and every row was read.
    pub fn is_complete(&self) -> bool {
        self.warnings.is_empty()
    }

    /// The worker names, in file order.
    pub fn workers(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for r in &self.records {
            if !names.contains(&r.worker) {
                names.push(r.worker.clone());
            }
        }
        names
    }
}

/// Reads the profile in `dir`.
pub fn load_profile(dir: &Path) -> Result<Profile, LoadError> {
    let io = |source| LoadError::Io { path: dir.to_path_buf(), source };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("worker-") && name.ends_with(".csv")
        })
        .collect();
    files.sort();
    let manifest_path = dir.join(MANIFEST);
    if files.is_empty() && !manifest_path.exists() {
        return Err(LoadError::NotAProfile(dir.to_path_buf()));
    }
    let mut profile = Profile { dir: dir.to_path_buf(), ..Profile::default() };
    match std::fs::read_to_string(&manifest_path) {
        Ok(text) => match serde_json::from_str::<Manifest>(&text) {
            Ok(m) => {
                if !m.complete {
                    profile.warnings.push(format!(
                        "{}: the run did not end cleanly (the dispatcher stopped before closing its files); what it wrote is shown",
                        manifest_path.display()
                    ));
                }
                profile.manifest = Some(m);
            }
            Err(e) => profile.warnings.push(format!("{}: unreadable manifest: {e}", manifest_path.display())),
        },
        Err(e) => profile.warnings.push(format!("{}: {e}", manifest_path.display())),
    }
    for file in files {
        read_rows(&file, &mut profile.records, &mut profile.warnings);
    }
    let signals = dir.join(SIGNALS);
    if signals.exists() {
        read_rows(&signals, &mut profile.signals, &mut profile.warnings);
    }
    Ok(profile)
}

/// Appends the rows of one CSV file; a row that does not parse (a run cut short mid-line)
/// is skipped and named.
fn read_rows<T: serde::de::DeserializeOwned>(path: &Path, rows: &mut Vec<T>, warnings: &mut Vec<String>) {
    let mut reader = match csv::ReaderBuilder::new().flexible(true).from_path(path) {
        Ok(r) => r,
        Err(e) => return warnings.push(format!("{}: {e}", path.display())),
    };
    let mut skipped = Vec::new();
    for (i, row) in reader.deserialize::<T>().enumerate() {
        match row {
            Ok(r) => rows.push(r),
            // Line numbers count the header.
            Err(e) => skipped.push((i + 2, e)),
        }
    }
    if let Some((line, e)) = skipped.first() {
        warnings.push(format!(
            "{}: {} row(s) could not be read and were skipped (first at line {line}: {e}); the file looks cut short",
            path.display(),
            skipped.len()
        ));
    }
}

/// `sweep.json`: what `gt prof sweep` ran.
pub const SWEEP_MANIFEST: &str = "sweep.json";

/// A sweep's manifest.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SweepManifest {
    /// The script it ran.
    pub script: String,
    /// When it began (RFC 3339).
    pub started: String,
    /// The swept settings in the order given, each with its values (`--config` files appear
    /// as the setting `GT_CONFIG`).
    pub axes: Vec<SweepAxis>,
    /// Repetitions of each combination.
    pub repeat: u32,
    /// Every run, in the order run.
    pub runs: Vec<SweepRun>,
}

/// One swept setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepAxis {
    /// The setting (`GT_WORKERS`).
    pub name: String,
    /// Its values.
    pub values: Vec<String>,
}

/// One run of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRun {
    /// Its profile folder, relative to the sweep folder.
    pub dir: String,
    /// The value of each swept setting.
    pub settings: BTreeMap<String, String>,
    /// Which repetition (1-based).
    pub repetition: u32,
    /// Whether it succeeded.
    pub ok: bool,
    /// Why it failed (exit status and the last lines of its output).
    pub error: Option<String>,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// A sweep: its manifest and the profiles of its runs that succeeded.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Its folder.
    pub dir: PathBuf,
    /// What ran.
    pub manifest: SweepManifest,
    /// `(run index, profile)` for every run whose profile could be read.
    pub profiles: Vec<(usize, Profile)>,
    /// Failed runs and unreadable profiles.
    pub warnings: Vec<String>,
}

/// Reads the sweep in `dir`.
pub fn load_sweep(dir: &Path) -> Result<Sweep, LoadError> {
    let path = dir.join(SWEEP_MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::NotASweep(dir.to_path_buf())),
        Err(source) => return Err(LoadError::Io { path, source }),
    };
    let manifest: SweepManifest = serde_json::from_str(&text).map_err(|source| LoadError::BadSweep { path, source })?;
    let mut sweep = Sweep { dir: dir.to_path_buf(), manifest, profiles: Vec::new(), warnings: Vec::new() };
    for (i, run) in sweep.manifest.runs.iter().enumerate() {
        if !run.ok {
            let why = run.error.as_deref().unwrap_or("failed");
            sweep.warnings.push(format!("run {} failed: {why}", run.dir));
        }
        match load_profile(&dir.join(&run.dir)) {
            Ok(p) => {
                for w in &p.warnings {
                    sweep.warnings.push(format!("run {}: {w}", run.dir));
                }
                sweep.profiles.push((i, p));
            }
            Err(e) if run.ok => sweep.warnings.push(format!("run {}: {e}", run.dir)),
            Err(_) => {}
        }
    }
    Ok(sweep)
}
