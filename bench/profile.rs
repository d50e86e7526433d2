//! What profiling costs: the same scripts on the same embedded cluster with and without a
//! profile being written (`GT_PROFILE`), in one run: 40,000 tiny elementwise ops (the cost
//! per recorded instruction: timing it on the worker, its row at the dispatcher) and ten
//! training steps of the per-layer MLP (`examples/profile_mlp.gtir`, two workers). Prints
//! medians and the difference per executed instruction; asserts nothing.
//! Run: `cargo bench --bench profile` (`GT_BENCH_N=REPS`; `GT_BENCH_SAVE=NAME` writes
//! `bench/results/profile-NAME.txt`).

use gt::frontend::RunOptions;
use gt::runtime::config::EnvConfig;
use gt::script::{load, run_on, run_training, Loaded};
use gt::session::{Session, Target};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

const TINY: &str = "%a = ones f32[64]\nrepeat 20000 {\n  %b = exp %a\n  %c = mul %b, 0.5\n}\nprint %c\n";

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// One run of `loaded` on a fresh embedded cluster of `workers`, profiling into `profile`
/// when given; the time from the first instruction to the end of the script.
fn run(loaded: &Loaded, workers: usize, profile: Option<&Path>) -> anyhow::Result<Duration> {
    let mut env = EnvConfig::from_env()?;
    env.profile = profile.map(Path::to_path_buf);
    let session = Session::open_with(&Target::Embedded { workers: Some(workers) }, "bench", &env)?;
    let quiet = RunOptions { quiet: true, ..RunOptions::default() };
    let (mut client, cluster) = session.into_parts();
    let t = Instant::now();
    if loaded.program.trains() {
        let (result, _client) = run_training(loaded, client, &mut std::io::sink(), quiet);
        result?;
    } else {
        run_on(loaded, &mut client, &mut std::io::sink(), quiet)?;
    }
    let elapsed = t.elapsed();
    drop(cluster);
    Ok(elapsed)
}

fn main() -> anyhow::Result<()> {
    let reps: usize = std::env::var("GT_BENCH_N").ok().and_then(|n| n.parse().ok()).unwrap_or(7);
    let dir = std::env::temp_dir().join(format!("gt-bench-profile-{}", std::process::id()));
    let mlp = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/profile_mlp.gtir"))?;
    let parse = |bytes: &[u8]| load(bytes).map_err(|e| anyhow::anyhow!("{:?}", e.diags()));
    let cases =
        [("40,000 tiny ops, 1 worker", parse(TINY.as_bytes())?, 1), ("MLP, 10 steps, 2 workers", parse(&mlp)?, 2)];
    let mut report = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    writeln!(report, "gt profiling overhead, {cores} cores, medians of {reps} runs")?;
    writeln!(report, "{:<28} {:>12} {:>12} {:>12} {:>16}", "workload", "plain", "profiled", "rows", "extra per row")?;
    for (name, loaded, workers) in &cases {
        let (mut plain, mut profiled) = (Vec::new(), Vec::new());
        let mut rows = 0;
        for _ in 0..reps {
            plain.push(run(loaded, *workers, None)?);
            let _ = std::fs::remove_dir_all(&dir);
            profiled.push(run(loaded, *workers, Some(&dir))?);
            rows = gt::tools::prof::load_profile(&dir)?.records.len();
        }
        let (p, q) = (median(plain), median(profiled));
        let extra = (q.as_secs_f64() - p.as_secs_f64()) / rows.max(1) as f64;
        writeln!(
            report,
            "{name:<28} {:>9.2} ms {:>9.2} ms {rows:>12} {:>13.2} µs",
            p.as_secs_f64() * 1e3,
            q.as_secs_f64() * 1e3,
            extra * 1e6
        )?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    print!("{report}");
    if let Ok(name) = std::env::var("GT_BENCH_SAVE") {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("bench/results/profile-{name}.txt"));
        std::fs::write(&path, &report)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
