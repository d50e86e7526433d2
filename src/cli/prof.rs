//! `gt prof`: the profile tools' command line (arguments, checks, summary lines), part of
//! `gt::cli`; the work is `gt_tools::prof`'s.

use crate::runtime::config::{EnvConfig, SETTINGS};
use crate::tools::prof::{self, sweep, SweepAxis};
use anyhow::{bail, Context as _};
use clap::Subcommand;
use std::path::{Path, PathBuf};

/// What `gt prof` does.
#[derive(Debug, Subcommand)]
pub enum ProfCommand {
    /// Draw a profile (`gt-run --profile DIR`): bottlenecks, the signal stack over time,
    /// per-layer runtime and throughput for forward and backward, and the transfers and
    /// passes timeline, as PNGs; a text summary on stdout.
    Report {
        /// The profile folder.
        dir: PathBuf,
        /// Where the pictures go (default: DIR/report).
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// Kernels listed and drawn in the bottleneck bars.
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// The critical path of a profile: what the run's end waited on, walked back through
    /// each worker's records and, at each collective, to the part that arrived last; its
    /// time as kernels, copies, transfers and idle time, per worker, and the records on it.
    Critical {
        /// The profile folder.
        dir: PathBuf,
        /// Records listed, longest time on the path first.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Also write every stretch of the path to this CSV file.
        #[arg(long, value_name = "FILE")]
        csv: Option<PathBuf>,
    },
    /// Run a script once per combination of settings (and repetition) with profiling on,
    /// into a timestamped folder with a subfolder per run, a summary log and each run's report.
    Sweep {
        /// The script.
        script: PathBuf,
        /// A setting and its values, `GT_WORKERS=1,2,4` (repeatable; the first varies slowest).
        #[arg(long = "set", value_name = "NAME=V1,V2")]
        sets: Vec<String>,
        /// Signal config files to sweep over (`GT_CONFIG`), comma-separated.
        #[arg(long, value_delimiter = ',', value_name = "A.yaml,B.yaml")]
        config: Vec<PathBuf>,
        /// Runs per combination.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        repeat: u32,
        /// The sweep folder (default: ./sweep_YYYYMMDD_HHMMSS).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The kernels whose time spreads most across a sweep's runs (top k per run and worker),
    /// with what overlapped their slowest launch: a CSV and pictures by setting, worker, run
    /// and the first two settings' interaction.
    Variance {
        /// The sweep folder.
        sweep: PathBuf,
        /// Kernels kept per run and worker.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
        /// Where the CSV and pictures go (default: SWEEP/variance).
        #[arg(short, long)]
        out: Option<PathBuf>,
    },
    /// Every worker's records of a profile in one Perfetto trace (a process per worker,
    /// names prefixed [W0], [W1]...).
    Merge {
        /// The profile folder.
        dir: PathBuf,
        /// The trace to write.
        #[arg(short, long, default_value = "merged.json")]
        output: PathBuf,
    },
    /// Two sweeps side by side in one self-contained HTML page, with the kernels whose time
    /// changed most.
    Compare {
        /// The first sweep.
        sweep1: PathBuf,
        /// The second sweep.
        sweep2: PathBuf,
        /// The first sweep's name on the page (default: its folder's).
        #[arg(long)]
        label1: Option<String>,
        /// The second sweep's name on the page.
        #[arg(long)]
        label2: Option<String>,
        /// Kernels in the table.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// The page to write.
        #[arg(short, long, default_value = "sweep_comparison.html")]
        output: PathBuf,
    },
}

/// Runs one `gt prof` command, printing what it made.
pub fn run(command: ProfCommand) -> anyhow::Result<()> {
    match command {
        ProfCommand::Report { dir, out, top } => report(&dir, out, top),
        ProfCommand::Critical { dir, top, csv } => critical(&dir, top, csv),
        ProfCommand::Sweep { script, sets, config, repeat, out } => sweep(script, &sets, config, repeat, out),
        ProfCommand::Variance { sweep, top_k, out } => variance(&sweep, top_k, out),
        ProfCommand::Merge { dir, output } => {
            let profile = prof::load_profile(&dir)?;
            let file = std::fs::File::create(&output).with_context(|| format!("cannot write {}", output.display()))?;
            let counts = prof::merge::write(&profile, std::io::BufWriter::new(file))
                .with_context(|| format!("cannot write {}", output.display()))?;
            warn(&profile.warnings);
            println!(
                "Wrote {}: {} workers, {} records, {} signal scopes (open it at ui.perfetto.dev)",
                output.display(),
                counts.workers,
                counts.records,
                counts.signals
            );
            Ok(())
        }
        ProfCommand::Compare { sweep1, sweep2, label1, label2, top, output } => {
            let (a, b) = (prof::load_sweep(&sweep1)?, prof::load_sweep(&sweep2)?);
            let options = prof::CompareOptions { label_a: label1, label_b: label2, top_n: top };
            let page = prof::compare(&a, &b, &options)?;
            prof::compare::write(&page, &output)?;
            warn(&page.warnings);
            println!(
                "Wrote {}: {} pictures side by side, {} on one side only, {} kernels compared",
                output.display(),
                page.images_paired,
                page.images_one_sided,
                page.kernels
            );
            Ok(())
        }
    }
}

/// What was wrong but not fatal, on stderr.
fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

fn report(dir: &Path, out: Option<PathBuf>, top: usize) -> anyhow::Result<()> {
    let profile = prof::load_profile(dir)?;
    let out = out.unwrap_or_else(|| dir.join("report"));
    let options = prof::report::ReportOptions { top_n: top, ..Default::default() };
    let written = prof::report::report(&profile, &out, &options)?;
    print!("{}", prof::report::summary_text(&profile, top));
    println!("Wrote {} pictures to {}", written.files.len(), out.display());
    Ok(())
}

fn critical(dir: &Path, top: usize, csv: Option<PathBuf>) -> anyhow::Result<()> {
    let profile = prof::load_profile(dir)?;
    warn(&profile.warnings);
    let path = prof::critical::critical_path(&profile)?;
    print!("{}", prof::critical::path_text(&profile, &path, top));
    if let Some(file) = csv {
        prof::critical::write_csv(&profile, &path, &file)
            .with_context(|| format!("cannot write {}", file.display()))?;
        println!("Wrote {} ({} stretches)", file.display(), path.segments.len());
    }
    Ok(())
}

fn sweep(
    script: PathBuf,
    sets: &[String],
    config: Vec<PathBuf>,
    repeat: u32,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    if !script.is_file() {
        bail!("{}: no such script", script.display());
    }
    let mut axes = Vec::new();
    for set in sets {
        let Some((name, values)) = set.split_once('=') else {
            bail!("--set {set}: write NAME=V1,V2 (e.g. --set GT_WORKERS=1,2)");
        };
        let name = name.trim();
        if !SETTINGS.contains(&name) {
            bail!("--set {name}: unknown setting; gt reads {}", SETTINGS.join(", "));
        }
        if name == "GT_PROFILE" {
            bail!("--set GT_PROFILE: the sweep sets it to each run's folder");
        }
        axes.push(SweepAxis {
            name: name.to_string(),
            values: values.split(',').map(|v| v.trim().to_string()).collect(),
        });
    }
    if !config.is_empty() {
        if axes.iter().any(|a| a.name == "GT_CONFIG") {
            bail!("GT_CONFIG is swept twice: give --config or --set GT_CONFIG=..., not both");
        }
        let mut values = Vec::new();
        for c in &config {
            // Absolute, so that runs find it whatever their folder.
            let path = std::fs::canonicalize(c).with_context(|| format!("--config {}", c.display()))?;
            values.push(path.display().to_string());
        }
        axes.push(SweepAxis { name: "GT_CONFIG".into(), values });
    }
    sweep::check_axes(&axes)?;
    // Every combination is checked as the runs will read it, so a bad value fails now, not
    // in every run.
    for combination in sweep::combinations(&axes) {
        EnvConfig::from_lookup(|k| combination.get(k).cloned().or_else(|| std::env::var(k).ok()))
            .map_err(|e| anyhow::anyhow!("{e} (in the sweep's settings)"))?;
    }
    let out = out.unwrap_or_else(|| PathBuf::from(sweep::timestamped_name()));
    let gt_run = gt_run_binary();
    let options = sweep::SweepOptions { script, axes, repeat, out: out.clone(), gt_run };
    let report_options = prof::report::ReportOptions::default();
    let manifest = sweep::run_with_progress(&options, &mut |dir| {
        let profile = prof::load_profile(dir).map_err(|e| e.to_string())?;
        prof::report::report(&profile, &dir.join("report"), &report_options).map(|_| ()).map_err(|e| e.to_string())
    })?;
    let failed = manifest.runs.iter().filter(|r| !r.ok).count();
    println!(
        "Wrote {}: {} runs, {} ok, {failed} failed (see {}); next: gt prof variance {}",
        out.display(),
        manifest.runs.len(),
        manifest.runs.len() - failed,
        out.join(sweep::SUMMARY).display(),
        out.display()
    );
    if failed == manifest.runs.len() {
        bail!("every run failed; see {}", out.join(sweep::SUMMARY).display());
    }
    Ok(())
}

/// The `gt-run` beside this `gt` (cargo builds them into one folder), else the one on PATH.
fn gt_run_binary() -> PathBuf {
    let beside =
        std::env::current_exe().ok().map(|exe| exe.with_file_name(format!("gt-run{}", std::env::consts::EXE_SUFFIX)));
    beside.filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("gt-run"))
}

fn variance(sweep_dir: &Path, top_k: usize, out: Option<PathBuf>) -> anyhow::Result<()> {
    let sweep = prof::load_sweep(sweep_dir)?;
    warn(&sweep.warnings);
    let rows = prof::variance::variance(&sweep, top_k)?;
    let out = out.unwrap_or_else(|| sweep_dir.join("variance"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let csv = out.join(format!("top{top_k}_kernels_time_variance.csv"));
    prof::variance::write_csv(&rows, &csv)?;
    let pictures = prof::variance::plots(&rows, &sweep.manifest.axes, &out)?;
    println!("Wrote {} ({} kernels) and {} pictures to {}", csv.display(), rows.len(), pictures.len(), out.display());
    Ok(())
}
