//! `gt prof compare` end to end: two small sweep folders written to disk (sweep.json, a run
//! folder with a worker CSV, PNG plots), loaded with `load_sweep`, compared; the page is
//! checked as text and, when Chromium is installed, rendered headless and the screenshot
//! searched for the test plots' colour.

use gt_tools::prof::compare::{compare, write, CompareError, CompareOptions};
use gt_tools::prof::load::{load_sweep, SweepAxis, SweepManifest, SweepRun, SWEEP_MANIFEST};
use gt_transport::profile::{worker_file, Manifest, Record, RecordKind, MANIFEST};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A colour no page chrome uses, so finding it in a screenshot means the plot was drawn.
const PLOT: [u8; 3] = [250, 20, 200];

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("prof-compare-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn kernel(name: &str, inputs: &str, ns: u64) -> Record {
    Record {
        seq: Some(1),
        kernel_hash: "0123456789abcdef".into(),
        line: Some(3),
        inputs: inputs.into(),
        outputs: inputs.into(),
        bytes_read: 64,
        bytes_written: 64,
        flops: 128,
        start_ns: 1000,
        duration_ns: ns,
        ..Record::new(RecordKind::Kernel, "w0", name)
    }
}

fn solid_png(path: &Path, width: u32, height: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut encoder = png::Encoder::new(file, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().unwrap();
    let data: Vec<u8> = (0..width * height).flat_map(|_| PLOT).collect();
    writer.write_image_data(&data).unwrap();
}

/// A run folder: a complete manifest and one worker file.
fn run_folder(dir: &Path, records: &[Record]) {
    std::fs::create_dir_all(dir).unwrap();
    let manifest = Manifest { format: 1, complete: true, ..Manifest::default() };
    std::fs::write(dir.join(MANIFEST), serde_json::to_string(&manifest).unwrap()).unwrap();
    let mut w = csv::Writer::from_path(dir.join(worker_file("w0"))).unwrap();
    for r in records {
        w.serialize(r).unwrap();
    }
    w.flush().unwrap();
}

fn run(dir: &str, settings: &[(&str, &str)], ok: bool) -> SweepRun {
    SweepRun {
        dir: dir.into(),
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        repetition: 1,
        ok,
        error: (!ok).then(|| "exit status 1: worker crashed".to_string()),
        seconds: 1.5,
    }
}

fn manifest(dir: &Path, axes: &[(&str, &[&str])], runs: Vec<SweepRun>) {
    let m = SweepManifest {
        script: "examples/mlp.gtir".into(),
        started: "2024-05-01T12:00:00Z".into(),
        axes: axes
            .iter()
            .map(|(n, v)| SweepAxis { name: n.to_string(), values: v.iter().map(|s| s.to_string()).collect() })
            .collect(),
        repeat: 1,
        runs,
    };
    std::fs::write(dir.join(SWEEP_MANIFEST), serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

/// Sweep A: runs `run-000` (ok) and `run-001` (failed, no folder); a shared variance plot.
/// Sweep B: its one run in a differently named folder with the same settings, the shared
/// plots, and one plot of each kind only B has.
fn two_sweeps(root: &Path) -> (PathBuf, PathBuf) {
    let a = root.join("before");
    let b = root.join("after");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    manifest(
        &a,
        &[("GT_WORKERS", &["1", "2"])],
        vec![run("run-000", &[("GT_WORKERS", "1")], true), run("run-001", &[("GT_WORKERS", "2")], false)],
    );
    run_folder(
        &a.join("run-000"),
        &[
            kernel("matmul", "f32[64,784];f32[784,256]", 1000),
            kernel("matmul", "f32[64,784];f32[784,256]", 3000),
            kernel("relu", "f32[64,256]", 100),
        ],
    );
    solid_png(&a.join("run-000/report/timeline.png"), 400, 160);
    solid_png(&a.join("variance/spread_by_worker.png"), 400, 160);

    manifest(&b, &[("GT_WORKERS", &["1"])], vec![run("w1-rep1", &[("GT_WORKERS", "1")], true)]);
    run_folder(
        &b.join("w1-rep1"),
        &[kernel("matmul", "f32[64,784];f32[784,256]", 1000), kernel("<script>alert(1)</script>", "f32[1]", 50)],
    );
    solid_png(&b.join("w1-rep1/report/timeline.png"), 400, 160);
    solid_png(&b.join("w1-rep1/report/bottleneck.png"), 400, 160);
    solid_png(&b.join("variance/spread_by_worker.png"), 400, 160);
    solid_png(&b.join("variance/interaction.png"), 400, 160);
    (a, b)
}

#[test]
fn prof_compare_puts_two_sweeps_on_one_page() {
    let root = scratch("pair");
    let (a, b) = two_sweeps(&root);
    let (a, b) = (load_sweep(&a).unwrap(), load_sweep(&b).unwrap());
    let report = compare(&a, &b, &CompareOptions { top_n: 10, ..CompareOptions::default() }).unwrap();
    let html = &report.html;

    // Run plots pair by settings although the folders differ; the variance plot by path.
    assert_eq!(report.images_paired, 2, "{html}");
    assert_eq!(report.images_one_sided, 2);
    assert_eq!(html.matches("data:image/png;base64,").count(), 6);
    assert_eq!(html.matches("only in after").count(), 2 + 1, "two plots and one kernel only in B");
    // matmul 2000 -> 1000, relu only in A, the script kernel only in B.
    assert_eq!(report.kernels, 3);
    let matmul = html.find("matmul").unwrap();
    assert!(matmul < html.find("relu").unwrap() && html.contains("-50.0%"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !html.contains("<script"));
    // Labels default to the folder names; the header shows each sweep's facts.
    assert!(html.contains("before") && html.contains("after") && html.contains("examples/mlp.gtir"));
    assert!(html.contains("1 ok, 1 failed") && html.contains("1 ok, 0 failed"));
    // The failed run is a partial result, on the page and returned; same axes: no mismatch.
    assert!(html.contains("Partial results") && html.contains("worker crashed"));
    assert!(report.warnings.iter().any(|w| w.contains("run-001")));
    assert!(!html.contains("class=\"warn\""));
    for external in ["http://", "https://", "src=\"/", "url("] {
        assert!(!html.contains(external), "page refers to {external}");
    }

    let out = root.join("report.html");
    write(&report, &out).unwrap();
    screenshot_check(&out, &root);
}

#[test]
fn prof_compare_states_mismatched_and_empty_sweeps() {
    let root = scratch("mismatch");
    let (a, b) = two_sweeps(&root);
    manifest(&b, &[("GT_FUSION", &["on"])], vec![run("w1-rep1", &[("GT_FUSION", "on")], true)]);
    let (sa, sb) = (load_sweep(&a).unwrap(), load_sweep(&b).unwrap());
    let options = CompareOptions { label_a: Some("old".into()), label_b: Some("new".into()), top_n: 1 };
    let report = compare(&sa, &sb, &options).unwrap();
    assert!(report.warnings.iter().any(|w| w.contains("different settings") && w.contains("GT_FUSION")));
    assert!(report.html.contains("class=\"warn\"") && report.html.contains("Mismatched sweeps"));
    assert_eq!(report.kernels, 1);
    assert!(report.html.contains("2 more kernel(s)"));
    // Different settings: the run plots no longer pair, each is shown alone.
    assert_eq!(report.images_paired, 1);
    assert_eq!(report.images_one_sided, 4);

    manifest(&b, &[("GT_WORKERS", &["1"])], vec![run("w1-rep1", &[("GT_WORKERS", "1")], false)]);
    let sb = load_sweep(&b).unwrap();
    match compare(&sa, &sb, &options) {
        Err(e @ CompareError::NoSuccessfulRun { .. }) => assert!(e.to_string().contains("new"), "{e}"),
        other => panic!("expected NoSuccessfulRun, got {other:?}"),
    }
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"].into_iter().find(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Renders the page headless at a wide and a phone width: the screenshot must decode, not be
/// blank, and show the plots' colour, in both columns when wide and one when narrow.
fn screenshot_check(page: &Path, root: &Path) {
    let Some(browser) = chromium() else {
        // CI installs chromium and says so, so there the check cannot be skipped.
        assert!(
            std::env::var_os("GT_REQUIRE_CHROMIUM").is_none(),
            "GT_REQUIRE_CHROMIUM is set but no chromium is on PATH"
        );
        println!("chromium not found on PATH: skipped rendering the page headless");
        return;
    };
    let wide = shoot(browser, page, root, "wide", 1200, 900);
    let (w, h, px) = &wide;
    assert!(px.windows(2).any(|p| p[0] != p[1]), "blank screenshot");
    let plot: Vec<(u32, u32)> = plot_pixels(&wide);
    assert!(plot.len() > 1000, "plot colour not in the {w}x{h} screenshot ({} pixels)", plot.len());
    assert!(
        plot.iter().any(|&(x, _)| x < w / 2) && plot.iter().any(|&(x, _)| x >= w / 2),
        "wide: plots not side by side"
    );

    let narrow = shoot(browser, page, root, "narrow", 400, 2400);
    let plot = plot_pixels(&narrow);
    assert!(!plot.is_empty(), "plot colour not in the phone-width screenshot");
    let width = narrow.0;
    assert!(plot.iter().all(|&(x, _)| x < width), "narrow: page wider than the screen");
    // Stacked: one plot per band of rows, so no row holds the colour in two separate runs.
    let mut rows: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for (x, y) in plot {
        rows.entry(y).or_default().push(x);
    }
    for xs in rows.values() {
        // xs is in ascending x order: pixels were visited row by row, left to right.
        assert!(xs.windows(2).all(|p| p[1] - p[0] < 20), "narrow: two plots in one row");
    }
}

type Shot = (u32, u32, Vec<[u8; 3]>);

fn shoot(browser: &str, page: &Path, root: &Path, name: &str, width: u32, height: u32) -> Shot {
    let out = root.join(format!("screenshot-{name}.png"));
    let _ = std::fs::remove_file(&out);
    let mut child = Command::new(browser)
        .args(["--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run"])
        .arg(format!("--user-data-dir={}", root.join(format!("chromium-{name}")).display()))
        .arg(format!("--screenshot={}", out.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("file://{}", page.canonicalize().unwrap().display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let begun = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if begun.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let decoder = png::Decoder::new(std::fs::File::open(&out).expect("chromium wrote no screenshot"));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let px = buf[..info.buffer_size()].chunks(channels).map(|c| [c[0], c[1], c[2]]).collect();
    (info.width, info.height, px)
}

fn plot_pixels((w, _, px): &Shot) -> Vec<(u32, u32)> {
    px.iter()
        .enumerate()
        .filter(|(_, p)| p.iter().zip(PLOT).all(|(&a, b)| a.abs_diff(b) <= 12))
        .map(|(i, _)| (i as u32 % w, i as u32 / w))
        .collect()
}
