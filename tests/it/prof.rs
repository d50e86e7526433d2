//! Profiles on real runs: `gt-run --profile` on the per-layer MLP with two embedded workers
//! (costs checked against hand computations, lines, signals and backward signals, hot-path
//! repetitions, per-signal times adding up to the busy time), and the `gt prof` commands end
//! to end: report, the critical path, a two-combination sweep, variance, merge, compare, and
//! their bad inputs.

use gt::tools::prof::{self, report};
use gt::transport::profile::{Direction, Record, RecordKind};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    crate::scratch("prof", name)
}

fn gt(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gt")).args(args).current_dir(dir).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

const MLP: &str = "examples/profile_mlp.gtir";

/// Profiles `script` on `workers` embedded workers into `dir` (`env`: more settings) and
/// reads the profile back.
fn profile(dir: &Path, script: &Path, workers: &str, env: &[(&str, &str)]) -> prof::Profile {
    let out = Command::new(env!("CARGO_BIN_EXE_gt-run"))
        .args(["--quiet", "--workers", workers, "--profile"])
        .arg(dir)
        .arg(script)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    prof::load_profile(dir).unwrap()
}

/// The 1-based line of the script holding `needle`.
fn line_of(needle: &str) -> u32 {
    let source = std::fs::read_to_string(root().join(MLP)).unwrap();
    source.lines().position(|l| l.contains(needle)).expect("in the script") as u32 + 1
}

fn find<'p>(p: &'p prof::Profile, op: &str, inputs: &str, direction: Option<Direction>) -> &'p Record {
    p.records
        .iter()
        .find(|r| r.op == op && r.inputs == inputs && r.direction == direction)
        .unwrap_or_else(|| panic!("no {op} of {inputs} ({direction:?}) in the profile"))
}

#[test]
fn a_profiled_mlp_records_costs_lines_and_layers() {
    let dir = scratch("mlp");
    let p = profile(&dir, &root().join(MLP), "2", &[]);
    assert!(p.is_complete(), "{:?}", p.warnings);
    let manifest = p.manifest.as_ref().unwrap();
    assert_eq!(manifest.workers.len(), 2, "both workers in the manifest");
    assert_eq!(manifest.settings.get("workers").map(String::as_str), Some("2"));
    assert!(manifest.clients.iter().any(|c| c.name.contains("profile_mlp.gtir")));

    // The first layer's product: 2·m·n·k FLOPs, operands and result in bytes, at its line.
    let fc1 = find(&p, "matmul", "f32[64,784];f32[784,256]", Some(Direction::Forward));
    assert_eq!(fc1.kind, RecordKind::Kernel);
    assert_eq!(fc1.flops, 2 * 64 * 256 * 784);
    assert_eq!(fc1.bytes_read, 4 * (64 * 784 + 784 * 256));
    assert_eq!(fc1.bytes_written, 4 * 64 * 256);
    assert_eq!((fc1.signal.as_str(), fc1.line), ("fc1", Some(line_of("%h0 = matmul"))));
    assert!(fc1.duration_ns > 0);
    // Elementwise: one per element; a reduction: one per element it reads.
    let relu = find(&p, "relu", "f32[64,256]", Some(Direction::Forward));
    assert_eq!((relu.flops, relu.bytes_read, relu.bytes_written), (64 * 256, 4 * 64 * 256, 4 * 64 * 256));
    let mean = find(&p, "mean", "f32[64,10]", Some(Direction::Forward));
    assert_eq!((mean.flops, mean.bytes_read, mean.bytes_written, mean.signal.as_str()), (640, 2560, 4, "loss"));
    // The gradient of the first layer's weights runs in its backward signal, attributed to
    // the `backward` statement.
    let grad = find(&p, "matmul", "f32[784,64];f32[64,256]", Some(Direction::Backward));
    assert_eq!((grad.signal.as_str(), grad.line), ("fc1", Some(line_of("backward %loss"))));
    assert_eq!(grad.flops, 2 * 784 * 256 * 64);
    // Every scope the records name is in signals.csv, forward and backward for each layer.
    for layer in ["fc1", "fc2", "loss"] {
        for d in [Direction::Forward, Direction::Backward] {
            let n = p.signals.iter().filter(|s| s.name == layer && s.direction == d).count();
            assert_eq!(n, 10, "{layer} {d:?}: one scope per iteration");
        }
    }
    // Reads are device-to-host copies of the printed losses.
    let reads: Vec<&Record> = p.records.iter().filter(|r| r.detail == "d2h").collect();
    assert_eq!(reads.len(), 10);
    assert!(reads.iter().all(|r| r.kind == RecordKind::Copy && r.bytes_read == 4 && r.inputs == "f32[]"));

    // Per-signal kernel times (forward + backward + outside every scope) add up to the
    // workers' busy time: both are sums of the same kernels' durations, so within 0.1%.
    let busy: u64 = report::busy_per_worker(&p).iter().map(|w| w.busy_ns).sum();
    let by_signal: u64 = report::signal_times(&p).iter().map(|s| s.forward_ns + s.backward_ns).sum();
    assert!(busy > 0);
    assert!((busy as f64 - by_signal as f64).abs() <= busy as f64 * 1e-3, "{busy} vs {by_signal}");
    // And each layer's scope runtimes hold its kernels, nested scopes included.
    let scopes = report::scope_runtimes(&p);
    assert!(scopes.iter().filter(|s| s.name == "fc1").all(|s| s.kernels >= 2 && s.span.is_some()));

    // The report draws its five pictures and says where the time went.
    let out = gt(&["prof", "report", "."], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("fc1") && said.contains("Wrote 5 pictures"), "{said}");
    for picture in report::PICTURES {
        assert!(dir.join("report").join(picture).is_file(), "{picture}");
    }
    // The merged trace: a process per worker.
    let out = gt(&["prof", "merge", ".", "-o", "merged.json"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("merged.json")).unwrap()).unwrap();
    assert!(gt::tools::perfetto::violations(&trace).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn collectives_across_workers_are_transfers_on_each_worker() {
    let dir = scratch("sharded");
    let p = profile(&dir, &root().join("examples/sharded.gtir"), "2", &[]);
    let transfers: Vec<&Record> = p.records.iter().filter(|r| r.kind == RecordKind::Transfer).collect();
    assert!(!transfers.is_empty(), "the sharded example exchanges data");
    // Each part names its collective and both workers, and each worker records its own part.
    for t in &transfers {
        let named = t.detail.contains("worker-0") && t.detail.contains("worker-1");
        assert!(t.detail.starts_with("collective #") && named, "{}", t.detail);
    }
    for w in ["worker-0", "worker-1"] {
        assert!(transfers.iter().any(|t| t.worker == w), "{w} has no transfer");
        assert!(p.records.iter().any(|r| r.worker == w && r.kind == RecordKind::Kernel), "{w} ran nothing");
    }
    // A part moves what its worker holds and receives.
    assert!(transfers.iter().all(|t| t.bytes_read + t.bytes_written > 0 && t.flops == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_critical_path_of_a_sharded_run_covers_it_and_crosses_collectives() {
    let dir = scratch("critical");
    let p = profile(&dir, &root().join("examples/sharded.gtir"), "2", &[]);
    let path = prof::critical::critical_path(&p).unwrap();
    // Contiguous, from the first record's start to the last one's end.
    let first = p.records.iter().map(|r| r.start_ns).min().unwrap();
    let last = p.records.iter().map(Record::end_ns).max().unwrap();
    assert_eq!((path.start_ns(), path.end_ns()), (first, last));
    assert!(path.segments.windows(2).all(|w| w[0].end_ns == w[1].start_ns));
    assert!(path.waits.collectives > 0, "the example's collectives have parts on both workers");
    // Each stretch of a record lies within that record.
    for s in &path.segments {
        if let Some(i) = s.record {
            let r = &p.records[i];
            assert!(r.start_ns <= s.start_ns && s.end_ns <= r.end_ns() && r.worker == s.worker, "{s:?} {r:?}");
        }
    }
    // The command prints it and writes one CSV row per stretch, adding up to the span.
    let out = gt(&["prof", "critical", ".", "--top", "3", "--csv", "path.csv"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Critical path: ") && text(&out).contains("Top 3 of"), "{}", text(&out));
    let csv = std::fs::read_to_string(dir.join("path.csv")).unwrap();
    let total: u64 = csv.lines().skip(1).map(|l| l.split(',').nth(3).unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!((csv.lines().count() - 1, total), (path.segments.len(), last - first));
    // The report's summary has it too; a folder without a profile is refused.
    let out = gt(&["prof", "report", "."], &dir);
    assert!(text(&out).contains("Critical path: "), "{}", text(&out));
    let out = gt(&["prof", "critical", "no-such-folder"], &dir);
    assert!(!out.status.success() && text(&out).contains("no-such-folder"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hot_path_repetitions_are_numbered() {
    let dir = scratch("hot");
    let script = "%a = ones f32[8]\nrepeat 12 {\n  %b = exp %a\n  %c = mul %b, 0.5\n}\nprint %c\n";
    std::fs::write(dir.join("loop.gtir"), script).unwrap();
    let p = profile(&dir, &dir.join("loop.gtir"), "1", &[("GT_HOTPATH", "1")]);
    let hot: Vec<&Record> = p.records.iter().filter(|r| r.hotpath.is_some()).collect();
    assert!(!hot.is_empty(), "the loop is a hot path");
    let last = hot.iter().filter_map(|r| r.iteration).max().unwrap();
    assert!(last >= 2, "repetitions are numbered: {last}");
    // Each repetition runs the loop's body once.
    let first: Vec<&str> = hot.iter().filter(|r| r.iteration == Some(1)).map(|r| r.op.as_str()).collect();
    assert_eq!(first.iter().filter(|op| **op == "exp").count(), first.len() / 2, "{first:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_profile_cut_short_is_read_and_marked() {
    let dir = scratch("cut");
    profile(&dir, &root().join(MLP), "2", &[]);
    // As a crash leaves it: the manifest not marked complete, a row cut mid-line.
    let manifest = dir.join("manifest.json");
    let m = std::fs::read_to_string(&manifest).unwrap().replace("\"complete\": true", "\"complete\": false");
    std::fs::write(&manifest, m).unwrap();
    // The file of the worker that ran the script (the client's home: either).
    let size = |w: &str| std::fs::metadata(dir.join(w)).unwrap().len();
    let file = dir.join(if size("worker-0.csv") > size("worker-1.csv") { "worker-0.csv" } else { "worker-1.csv" });
    let mut rows = std::fs::read(&file).unwrap();
    rows.truncate(rows.len() - 30);
    std::fs::write(&file, rows).unwrap();
    let out = gt(&["prof", "report", "."], &dir);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("did not end cleanly") && said.contains("cut short"), "{said}");
    // Not a profile at all: named as such.
    let empty = scratch("empty");
    let out = gt(&["prof", "report", "."], &empty);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("not a profile folder"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn a_two_combination_sweep_runs_end_to_end() {
    let dir = scratch("sweep");
    let script = root().join(MLP);
    let script = script.to_str().unwrap();
    let out = gt(&["prof", "sweep", script, "--set", "GT_WORKERS=1,2", "--out", "a"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let sweep = prof::load_sweep(&dir.join("a")).unwrap();
    assert_eq!(sweep.manifest.runs.len(), 2);
    assert!(sweep.manifest.runs.iter().all(|r| r.ok));
    assert_eq!(sweep.profiles.len(), 2);
    assert!(dir.join("a/WORKERS-2/report/bottleneck.png").is_file(), "each run's report is drawn");
    assert!(std::fs::read_to_string(dir.join("a/summary.log")).unwrap().contains("done: 2 ok, 0 failed"));

    let out = gt(&["prof", "variance", "a", "--top-k", "3"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let csv = std::fs::read_to_string(dir.join("a/variance/top3_kernels_time_variance.csv")).unwrap();
    assert!(csv.starts_with("run,GT_WORKERS,"), "{csv}");
    assert!(csv.lines().count() > 1, "kernels with several launches are ranked");
    for picture in ["spread_by_GT_WORKERS.png", "spread_by_worker.png", "spread_violin.png"] {
        assert!(dir.join("a/variance").join(picture).is_file(), "{picture}");
    }

    // A second sweep over another setting: compared, the mismatch stated on the page.
    let out = gt(&["prof", "sweep", script, "--set", "GT_THREADS=1", "--out", "b"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let out = gt(&["prof", "compare", "a", "b", "--label1", "two", "--label2", "one", "-o", "c.html"], &dir);
    assert!(out.status.success(), "{}", text(&out));
    let page = std::fs::read_to_string(dir.join("c.html")).unwrap();
    assert!(page.contains("data:image/png;base64,") && !page.contains("http://") && !page.contains("https://"));
    assert!(text(&out).contains("warning") && page.contains("GT_THREADS"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sweeps_are_refused_or_recorded() {
    let dir = scratch("bad");
    let script = root().join(MLP);
    let script = script.to_str().unwrap();
    // Unknown settings and bad values are refused before anything runs.
    let out = gt(&["prof", "sweep", script, "--set", "GT_NOPE=1,2"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("GT_NOPE: unknown setting"), "{}", text(&out));
    let out = gt(&["prof", "sweep", script, "--set", "GT_MATMUL_PRECISION=highest,bogus"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("bogus"), "{}", text(&out));
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "nothing was run or written");
    // A script that fails in every run: each failure recorded, the sweep kept and said so.
    std::fs::write(dir.join("fails.gtir"), "%a = ones f32[2]\nexpect %a == f32[2] [5, 5]\n").unwrap();
    let out = gt(&["prof", "sweep", "fails.gtir", "--set", "GT_WORKERS=1,2", "--out", "s"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("every run failed"), "{}", text(&out));
    let sweep = prof::load_sweep(&dir.join("s")).unwrap();
    assert!(sweep.manifest.runs.iter().all(|r| !r.ok && r.error.as_deref().is_some_and(|e| e.contains("expect"))));
    let out = gt(&["prof", "variance", "s"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("every run of s failed"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
