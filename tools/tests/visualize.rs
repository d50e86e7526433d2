//! Tests of the timeline picture: tapes built from synthetic events are drawn to PNG and SVG,
//! and the files read back (PNG decoded) to check sizes, lanes and text.

use gt_tools::tape::{Lane, LogFormat, OpFamily, Tape};
use gt_tools::visualize::{render, ImageFormat, LaneBand, Summary, VisualizeError, VisualizeOptions};
use gt_transport::{EventKind, LogEvent};
use std::path::{Path, PathBuf};

fn ev(t: f64, kind: EventKind, source: &str, command: &str, bytes: u64, details: &str) -> LogEvent {
    LogEvent {
        elapsed: t,
        seq: 0,
        kind,
        source: source.into(),
        command: command.into(),
        bytes,
        duration: None,
        details: details.into(),
    }
}

fn exec(t: f64, dur: f64, worker: &str, command: &str, seq: u64) -> LogEvent {
    LogEvent {
        duration: Some(dur),
        ..ev(
            t,
            EventKind::Exec,
            &format!("WORKER {worker}"),
            command,
            0,
            &format!("client=1 #{seq} %b1 = {command} %b0"),
        )
    }
}

fn tape(mut events: Vec<LogEvent>) -> Tape {
    for (i, e) in events.iter_mut().enumerate() {
        e.seq = i as u64 + 1;
    }
    let mut t = Tape { events, format: LogFormat::Gt, skipped: 0 };
    t.sort();
    t
}

/// A fresh output path under cargo's scratch folder for integration tests.
fn out(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("visualize");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn options(path: &Path, format: ImageFormat) -> VisualizeOptions {
    VisualizeOptions { output: path.to_path_buf(), dpi: 150, format }
}

struct Image {
    width: u32,
    height: u32,
    rgb: Vec<u8>,
}

impl Image {
    fn read(path: &Path) -> Image {
        let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.color_type, info.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight));
        buf.truncate(info.buffer_size());
        Image { width: info.width, height: info.height, rgb: buf }
    }

    fn pixel(&self, x: u32, y: u32) -> (u8, u8, u8) {
        let i = (y as usize * self.width as usize + x as usize) * 3;
        (self.rgb[i], self.rgb[i + 1], self.rgb[i + 2])
    }

    /// Pixels in `xs` × `ys` for which `f` holds.
    fn count(&self, xs: std::ops::Range<u32>, ys: std::ops::Range<u32>, f: impl Fn((u8, u8, u8)) -> bool) -> usize {
        ys.flat_map(|y| xs.clone().map(move |x| (x, y))).filter(|&(x, y)| f(self.pixel(x, y))).count()
    }

    /// Pixels of exactly `rgb` in the plot part of `band` (not its label).
    fn in_band(&self, band: &LaneBand, rgb: (u8, u8, u8)) -> usize {
        self.count(band.left..band.right, band.top..band.bottom, |p| p == rgb)
    }

    /// Saturated pixels (not white, grey or black: a marker or bar, not a rule or text) in the
    /// plot part of `band`.
    fn coloured_in_band(&self, band: &LaneBand) -> usize {
        self.count(band.left..band.right, band.top..band.bottom, |(r, g, b)| {
            let (max, min) = (r.max(g).max(b), r.min(g).min(b));
            max - min > 40
        })
    }
}

fn band<'a>(summary: &'a Summary, lane: &Lane) -> &'a LaneBand {
    summary.lanes.iter().find(|b| b.lane == *lane).unwrap_or_else(|| panic!("no band for {lane:?}"))
}

/// Two clients, the dispatcher and two workers: client 1 asks for a matmul and an add, the
/// add runs on worker-0 and the matmul on worker-1, a pass injects a relu, a signal scope
/// covers it all.
fn small_tape() -> Tape {
    tape(vec![
        ev(0.0005, EventKind::Connect, "CLIENT 1", "Hello", 0, ""),
        ev(0.0006, EventKind::Signal, "CLIENT 1", "enter", 0, "#1 forward depth=0"),
        ev(0.0010, EventKind::Recv, "CLIENT 1", "matmul", 120, "#2 %2 = matmul %0, %1"),
        ev(0.0020, EventKind::Recv, "CLIENT 1", "add", 40, "#3 %3 = add %2, %0"),
        ev(0.0021, EventKind::Recv, "CLIENT 2", "sum", 30_000, "#1 %1 = sum %0"),
        ev(0.0022, EventKind::Inject, "CLIENT 1", "relu", 0, "%4 = relu %3"),
        ev(0.0025, EventKind::WorkerSend, "WORKER worker-1", "Exec", 2048, "batch=1"),
        exec(0.0027, 0.0030, "worker-1", "matmul", 2),
        ev(0.0058, EventKind::WorkerRecv, "WORKER worker-1", "Done", 64, ""),
        ev(0.0060, EventKind::WorkerSend, "WORKER worker-0", "Exec", 1024, "batch=2"),
        exec(0.0062, 0.0004, "worker-0", "add", 3),
        exec(0.0067, 0.0000001, "worker-0", "add", 5),
        ev(0.0070, EventKind::Send, "CLIENT 1", "Data", 4 << 20, ""),
        ev(0.0075, EventKind::Status, "WORKER worker-0", "memory", 0, "live=4096"),
        ev(0.0080, EventKind::Signal, "CLIENT 1", "exit", 0, "#9 forward depth=0"),
        ev(0.0085, EventKind::Error, "CLIENT 3", "garbage", 9, "bad version"),
        ev(0.0090, EventKind::Disconnect, "CLIENT 1", "Bye", 0, ""),
    ])
}

fn rgb(f: OpFamily) -> (u8, u8, u8) {
    f.rgb()
}

#[test]
fn png_matches_its_summary_and_draws_every_lane() {
    let t = small_tape();
    let path = out("small.png");
    let summary = render(&t, &options(&path, ImageFormat::Png)).unwrap();
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), (summary.width, summary.height));
    assert_eq!((summary.events, summary.workers, summary.dense), (17, 2, false));
    assert!((summary.duration - (0.0090 - 0.0005)).abs() < 1e-12, "{}", summary.duration);
    let labels: Vec<&str> = summary.lanes.iter().map(|b| b.label.as_str()).collect();
    assert_eq!(labels, ["client 1", "client 2", "dispatcher", "worker-1", "worker-0"]);

    // Bands tile the plot top to bottom, inside the picture.
    for pair in summary.lanes.windows(2) {
        assert_eq!(pair[0].bottom, pair[1].top);
    }
    let last = summary.lanes.last().unwrap();
    assert!(last.bottom < img.height && last.right < img.width);

    // Each lane shows its own events' colours, and not another lane's.
    let client1 = band(&summary, &Lane::Client("1".into()));
    let client2 = band(&summary, &Lane::Client("2".into()));
    let dispatcher = band(&summary, &Lane::Dispatcher);
    let w0 = band(&summary, &Lane::Worker("worker-0".into()));
    let w1 = band(&summary, &Lane::Worker("worker-1".into()));
    assert!(img.in_band(client1, rgb(OpFamily::MatMul)) > 10);
    assert!(img.in_band(client1, rgb(OpFamily::Binary)) > 10);
    assert!(img.in_band(client2, rgb(OpFamily::Sum)) > 10);
    assert_eq!(img.in_band(client2, rgb(OpFamily::MatMul)), 0);
    assert!(img.in_band(dispatcher, rgb(OpFamily::Relu)) > 10, "the injected relu");
    assert!(img.in_band(w1, rgb(OpFamily::MatMul)) > 100, "worker-1's matmul bar");
    assert!(img.in_band(w0, rgb(OpFamily::Binary)) > 10, "worker-0's add bars");
    assert_eq!(img.in_band(w0, rgb(OpFamily::MatMul)), 0);
    assert_eq!(img.in_band(w1, rgb(OpFamily::Binary)), 0);
    for b in &summary.lanes {
        assert!(img.coloured_in_band(b) > 0, "{} is empty", b.label);
    }

    // The matmul ran 3 ms of a 9.5 ms axis: its bar is about that share of the plot wide.
    let plot_w = (w1.right - w1.left) as f64;
    let bar_rows = w1.top..w1.bottom;
    let widest = bar_rows
        .map(|y| (w1.left..w1.right).filter(|&x| img.pixel(x, y) == rgb(OpFamily::MatMul)).count())
        .max()
        .unwrap() as f64;
    let share = 0.0030 / (0.0090 - 0.0005);
    assert!((widest / plot_w - share).abs() < 0.05, "bar {widest} px of {plot_w}");

    // Text renders from the embedded font: the lane labels left of the plot are dark pixels,
    // and nothing else is drawn there.
    for b in &summary.lanes {
        let dark = img.count(0..b.left.saturating_sub(4), b.top..b.bottom, |(r, g, bl)| r < 100 && g < 100 && bl < 100);
        assert!(dark > 20, "no label text for {}: {dark} dark pixels", b.label);
    }
    // The signal line is red and runs through every lane.
    for b in &summary.lanes {
        let red = img.count(b.left..b.right, b.top..b.bottom, |(r, g, bl)| r > 200 && g < 90 && bl < 90);
        assert!(red > 0, "no signal line in {}", b.label);
    }
}

#[test]
fn svg_is_the_same_picture() {
    let t = small_tape();
    let path = out("small.svg");
    let summary = render(&t, &options(&path, ImageFormat::Svg)).unwrap();
    let png = render(&t, &options(&out("small-too.png"), ImageFormat::Png)).unwrap();
    assert_eq!((summary.width, summary.height), (png.width, png.height));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.trim_start().starts_with("<svg"), "{}", &text[..80]);
    assert!(text.trim_end().ends_with("</svg>"));
    assert!(text.contains(&format!("width=\"{}\"", summary.width)));
    assert!(text.contains(&format!("height=\"{}\"", summary.height)));
    for label in ["client 1", "client 2", "dispatcher", "worker-0", "worker-1", "forward", "#2 matmul"] {
        assert!(text.contains(&format!(">\n{label}\n<")) || text.contains(&format!(">{label}<")), "no {label:?}");
    }
    // Every text element is closed.
    assert_eq!(text.matches("<text").count(), text.matches("</text>").count());
    let (r, g, b) = OpFamily::MatMul.rgb();
    assert!(text.contains(&format!("#{r:02X}{g:02X}{b:02X}")), "no matmul colour");
}

#[test]
fn a_hundred_thousand_events_render_thinned() {
    let workers = ["w0", "w1", "w2", "w3"];
    let ops = ["add", "matmul", "relu", "sum", "exp", "free"];
    let mut events = Vec::with_capacity(100_000);
    let mut t = 0.0;
    let mut seq = 0;
    while events.len() < 100_000 {
        seq += 1;
        let op = ops[seq % ops.len()];
        let w = workers[seq % workers.len()];
        let client = format!("CLIENT {}", seq % 2);
        events.push(ev(t, EventKind::Recv, &client, op, 64 + (seq as u64 % 1000), &format!("#{seq} %{seq} = {op}")));
        events.push(ev(t + 1e-6, EventKind::WorkerSend, &format!("WORKER {w}"), "Exec", 256, "batch=1"));
        events.push(exec(t + 2e-6, 2e-5, w, op, seq as u64));
        events.push(ev(t + 3e-5, EventKind::WorkerRecv, &format!("WORKER {w}"), "Done", 32, ""));
        if seq % 1000 == 0 {
            events.push(ev(t, EventKind::Signal, &client, "enter", 0, &format!("#{seq} step{seq} depth=0")));
        }
        t += 2e-5;
    }
    let t = tape(events);
    let path = out("large.png");
    let summary = render(&t, &options(&path, ImageFormat::Png)).unwrap();
    assert_eq!((summary.events, summary.workers), (t.events.len(), 4));
    assert!(summary.dense);
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), (summary.width, summary.height));
    for b in &summary.lanes {
        assert!(img.coloured_in_band(b) > 1000, "{} is nearly empty", b.label);
    }
    // Thinned: a few marks per pixel column and lane at most, far fewer than the events.
    let columns = (summary.lanes[0].right - summary.lanes[0].left) as usize;
    assert!(summary.marks < columns * summary.lanes.len() * 8, "{} marks", summary.marks);
    assert!(summary.marks < t.events.len() / 2, "{} marks", summary.marks);
}

#[test]
fn events_all_at_one_time_still_render() {
    let t = tape(vec![
        ev(0.25, EventKind::Recv, "CLIENT 1", "add", 40, "#1 %2 = add %0, %1"),
        ev(0.25, EventKind::WorkerSend, "WORKER w", "Exec", 100, ""),
        ev(0.25, EventKind::Exec, "WORKER w", "add", 0, "client=1 #1"),
    ]);
    let path = out("instant.png");
    let summary = render(&t, &options(&path, ImageFormat::Png)).unwrap();
    assert_eq!(summary.duration, 0.0);
    let img = Image::read(&path);
    assert_eq!((img.width, img.height), (summary.width, summary.height));
    for b in &summary.lanes {
        if b.lane != Lane::Dispatcher {
            assert!(img.in_band(b, OpFamily::Binary.rgb()) > 0, "{} is empty", b.label);
        }
    }
}

#[test]
fn python_gt_logs_render() {
    // The Python GT's own log format (its header, a size column only when not zero).
    let log = include_str!("data/python-gt.log");
    let mut t = Tape::from_reader(log.as_bytes(), Path::new("python.log")).unwrap();
    t.sort();
    let path = out("python.svg");
    let summary = render(&t, &options(&path, ImageFormat::Svg)).unwrap();
    assert_eq!((summary.events, summary.workers), (4, 1));
    let text = std::fs::read_to_string(&path).unwrap();
    for label in ["client 006b8b4568", "dispatcher", "auto_worker", "#42 add"] {
        assert!(text.contains(label), "no {label:?}");
    }
    let path = out("python.png");
    let summary = render(&t, &options(&path, ImageFormat::Png)).unwrap();
    let img = Image::read(&path);
    let client = band(&summary, &Lane::Client("006b8b4568".into()));
    assert!(img.in_band(client, OpFamily::Binary.rgb()) > 0);
    assert!(img.in_band(client, OpFamily::Relu.rgb()) > 0);
}

#[test]
fn size_follows_duration_lanes_and_dpi() {
    let span = |seconds: f64, workers: usize| {
        let mut events = vec![
            ev(0.0, EventKind::Recv, "CLIENT 1", "add", 40, "#1"),
            ev(seconds, EventKind::Recv, "CLIENT 1", "add", 40, "#2"),
        ];
        for w in 0..workers {
            events.push(ev(seconds / 2.0, EventKind::WorkerSend, &format!("WORKER w{w}"), "Exec", 10, ""));
        }
        tape(events)
    };
    let size = |t: &Tape, dpi| {
        let path = out(&format!("size-{dpi}.png"));
        let s = render(t, &VisualizeOptions { output: path, dpi, format: ImageFormat::Png }).unwrap();
        (s.width, s.height)
    };
    let short = size(&span(0.1, 1), 150);
    let long = size(&span(3.0, 1), 150);
    let very_long = size(&span(3600.0, 1), 150);
    assert!(long.0 > short.0 && long.1 == short.1, "{short:?} {long:?}");
    assert!(very_long.0 <= 40 * 150 + 1, "bounded: {very_long:?}");
    let tall = size(&span(0.1, 6), 150);
    assert!(tall.1 > short.1 && tall.0 == short.0, "{short:?} {tall:?}");
    let sharp = size(&span(0.1, 1), 300);
    assert!(sharp.0.abs_diff(short.0 * 2) <= 2 && sharp.1.abs_diff(short.1 * 2) <= 2, "{short:?} {sharp:?}");
}

#[test]
fn bad_requests_are_errors() {
    let t = small_tape();
    let dpi = |dpi| render(&t, &VisualizeOptions { output: out("dpi.png"), dpi, format: ImageFormat::Png });
    assert!(matches!(dpi(0), Err(VisualizeError::DpiOutOfRange { dpi: 0, .. })));
    assert!(matches!(dpi(2000), Err(VisualizeError::TooLarge { .. })));
    let missing = out("no-such-dir").join("x.png");
    let err = render(&t, &options(&missing, ImageFormat::Png)).unwrap_err();
    assert!(matches!(err, VisualizeError::Write { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-dir"), "{err}");
    let err = render(&t, &options(&missing, ImageFormat::Svg)).unwrap_err();
    assert!(matches!(err, VisualizeError::Write { .. }), "{err:?}");
    let empty = Tape { events: vec![], format: LogFormat::Gt, skipped: 0 };
    assert!(matches!(render(&empty, &options(&out("e.png"), ImageFormat::Png)), Err(VisualizeError::NoEvents)));
    let nan = tape(vec![ev(f64::NAN, EventKind::Recv, "CLIENT 1", "add", 0, "")]);
    assert!(matches!(render(&nan, &options(&out("n.png"), ImageFormat::Png)), Err(VisualizeError::NoEvents)));
}

#[test]
fn garbage_times_are_left_out() {
    let mut events = small_tape().events;
    events.push(ev(f64::NAN, EventKind::Recv, "CLIENT 1", "add", 0, ""));
    events.push(ev(1e300, EventKind::Recv, "CLIENT 1", "add", 0, ""));
    events.push(LogEvent { duration: Some(f64::INFINITY), ..exec(0.003, 0.0, "worker-0", "add", 9) });
    let t = tape(events);
    let path = out("garbage.png");
    let summary = render(&t, &options(&path, ImageFormat::Png)).unwrap();
    assert_eq!(summary.events, 20);
    assert!((summary.duration - (0.0090 - 0.0005)).abs() < 1e-12, "{}", summary.duration);
    let img = Image::read(&path);
    assert!(img.in_band(band(&summary, &Lane::Client("1".into())), OpFamily::MatMul.rgb()) > 10);
}

#[test]
fn summary_prints_the_seeds_lines() {
    let s = Summary {
        output: "timeline.png".into(),
        width: 4000,
        height: 2400,
        events: 156,
        workers: 4,
        duration: 2.341,
        lanes: vec![],
        marks: 0,
        dense: false,
    };
    assert_eq!(
        s.to_string(),
        "✓ Visualization saved to: timeline.png\n  Resolution: 4000 x 2400 pixels\n  Events: 156\n  Workers: 4\n  Duration: 2.341s"
    );
    assert_eq!(VisualizeOptions::new("a.SVG").format, ImageFormat::Svg);
    assert_eq!(VisualizeOptions::default().dpi, 150);
    assert_eq!(ImageFormat::from_path(Path::new("a.jpg")), None);
}
