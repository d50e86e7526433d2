//! The observability tools on real runs: an embedded cluster with two workers logs one EXEC
//! event per executed instruction; `gt perfetto`'s trace of that log follows the Trace Event
//! Format with one slice per instruction and the workers' own time in them; `gt visualize`
//! draws every lane that had events; `gt trace` captures a script run on `gt server`;
//! bad logs are one clear line and exit code 2.

use gt::frontend::{run_script, Client, ClientOptions};
use gt::runtime::{Cluster, ClusterOptions};
use gt::tools::perfetto;
use gt::tools::tape::{Lane, Tape};
use gt::transport::EventKind;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The seed's example workload, in a signal scope.
const WORKLOAD: &str = "\
%a = randn f32[100, 100] seed=1
%b = randn f32[100, 100] seed=2
signal \"forward\" {
  %c = matmul %a, %b
  %d = relu %c
}
%s = sum %d
print %s
";

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gt-tools-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Reads the log until `done` holds for it (the dispatcher writes it out when it idles).
fn read_log_until(path: &Path, done: impl Fn(&Tape) -> bool) -> Tape {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = Tape::read(path) {
            if done(&t) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "the log at {} never got there", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_embedded_run_on_two_workers_becomes_a_valid_trace_with_a_slice_per_instruction() {
    let dir = temp_dir("perfetto");
    let log = dir.join("run.log");
    let mut options = ClusterOptions::embedded(2);
    options.instruction_log = Some(log.clone());
    let cluster = Cluster::start(options).unwrap();
    let program = gt::ir::text::parse(WORKLOAD).unwrap();
    // Two clients: each new client's home is the least loaded worker, so both work.
    let mut clients: Vec<Client> = (0..2)
        .map(|_| Client::connect_in(cluster.context(), cluster.endpoint(), ClientOptions::default()).unwrap())
        .collect();
    for c in &mut clients {
        run_script(&program, c, &mut Vec::new(), Default::default()).unwrap();
    }
    let stats = clients[0].worker_stats().unwrap();
    assert_eq!(stats.len(), 2);
    let executed: u64 = stats.iter().map(|w| w.instructions).sum();
    let nanos: u64 = stats.iter().flat_map(|w| &w.ops).map(|o| o.nanos).sum();
    assert!(stats.iter().all(|w| w.instructions > 0), "both workers ran something: {stats:?}");
    let tape =
        read_log_until(&log, |t| t.events.iter().filter(|e| e.kind == EventKind::Exec).count() as u64 >= executed);
    let execs: Vec<_> = tape.events.iter().filter(|e| e.kind == EventKind::Exec).collect();
    assert_eq!(execs.len() as u64, executed, "one EXEC event per instruction the workers ran");
    // The workers' own times: the log rounds each to the nanosecond.
    let logged: f64 = execs.iter().map(|e| e.duration.unwrap()).sum();
    assert!((logged * 1e9 - nanos as f64).abs() <= execs.len() as f64, "{logged} s logged, {nanos} ns measured");
    // Each instruction ran after its batch was sent, on the dispatcher's clock.
    for e in &execs {
        let lane = Lane::of(e);
        let sent = tape
            .events
            .iter()
            .filter(|s| s.kind == EventKind::WorkerSend && Lane::of(s) == lane && s.command == "Exec");
        assert!(
            sent.clone().any(|s| s.elapsed <= e.elapsed),
            "{e:?} starts before any batch was sent to its worker\n{}",
            std::fs::read_to_string(&log).unwrap()
        );
    }
    let (trace, counts) = perfetto::trace(&tape);
    assert_eq!(perfetto::violations(&trace), vec![]);
    assert_eq!(counts.slices as u64, executed);
    assert_eq!(
        counts.flows as u64,
        executed - frees(&tape),
        "every instruction but the dispatcher's frees has an arrow"
    );
    assert_eq!(counts.signals, 2, "one forward scope per client");
    let events = trace["traceEvents"].as_array().unwrap();
    let slice_us: f64 = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 0)
        .filter_map(|e| {
            let worker = e["args"].get("instruction").is_some() && e["cat"] != "recv";
            worker.then(|| e["dur"].as_f64().unwrap())
        })
        .sum::<f64>();
    assert!(slice_us > 0.0);
    let matmul = events.iter().find(|e| e["ph"] == "X" && e["name"] == "matmul" && e["args"]["seq"].is_u64()).unwrap();
    assert_eq!(matmul["args"]["signal"], "forward", "{matmul}");
    assert_eq!(matmul["args"]["result"], "f32[100,100]", "{matmul}");
    drop(clients);
    drop(cluster);
    picture_has_every_lane(&log, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `gt visualize` on the run's log: the PNG decodes, has the size printed, and each lane's
/// band holds drawn (coloured or dark) pixels.
fn picture_has_every_lane(log: &Path, dir: &Path) {
    let out = dir.join("timeline.png");
    let o = Command::new(env!("CARGO_BIN_EXE_gt"))
        .args(["visualize", log.to_str().unwrap(), "-o", out.to_str().unwrap(), "--dpi", "100"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.starts_with("✓ Visualization saved to: ") && stdout.contains("Workers: 2"), "{stdout}");
    let decoder = png::Decoder::new(std::fs::File::open(&out).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert!(stdout.contains(&format!("Resolution: {} x {} pixels", info.width, info.height)), "{stdout}");
    let channels = info.color_type.samples();
    // The bands as drawn: the library reports them (same tape, same options).
    let tape = Tape::read(log).unwrap();
    let options = gt::tools::visualize::VisualizeOptions {
        dpi: 100,
        ..gt::tools::visualize::VisualizeOptions::new(dir.join("again.png"))
    };
    let summary = gt::tools::visualize::render(&tape, &options).unwrap();
    assert_eq!((summary.width, summary.height), (info.width, info.height));
    assert_eq!(summary.lanes.len(), 5, "two clients, the dispatcher, two workers: {:?}", summary.lanes);
    for band in &summary.lanes {
        let drawn = (band.top..band.bottom).any(|y| {
            (band.left..band.right).any(|x| {
                let at = (y as usize * info.width as usize + x as usize) * channels;
                let (r, g, b) = (pixels[at] as i32, pixels[at + 1] as i32, pixels[at + 2] as i32);
                r.max(g).max(b) - r.min(g).min(b) > 60 || r + g + b < 300
            })
        });
        assert!(drawn, "nothing drawn in the band of {}", band.label);
    }
}

#[test]
fn gt_trace_captures_a_script_run_on_a_server() {
    use crate::distributed::{free_port, gt_run, server, worker, Proc};
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[]);
    let _worker = worker(port);
    let dir = temp_dir("trace");
    let mut trace = Command::new(env!("CARGO_BIN_EXE_gt"));
    trace.args(["trace", "-p", &port.to_string(), "-s", "4", "--dir", dir.to_str().unwrap(), "-o", "run.log"]);
    let mut trace = Proc(trace.stdout(Stdio::piped()).spawn().unwrap());
    let mut out = BufReader::new(trace.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("Capturing ipc://"), "{line}");
    // The subscription reaches the dispatcher within its next housekeeping; run the script
    // until the capture ends.
    let mut runs = 0;
    while trace.0.try_wait().unwrap().is_none() {
        let o = gt_run(&["--connect", &format!("127.0.0.1:{port}"), "examples/timeline.gtir"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        runs += 1;
    }
    assert!(trace.0.wait().unwrap().success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(rest.contains("✓ Captured") && rest.contains("gt visualize"), "{rest}");
    let tape = Tape::read(&dir.join("run.log")).unwrap();
    let has = |kind: EventKind, command: &str| tape.events.iter().any(|e| e.kind == kind && e.command == command);
    assert!(
        has(EventKind::Recv, "matmul") && has(EventKind::Exec, "matmul") && has(EventKind::Signal, "enter"),
        "{runs} runs: {:?}",
        tape.events.len()
    );
    let (trace_json, counts) = perfetto::trace(&tape);
    assert_eq!(perfetto::violations(&trace_json), vec![]);
    assert!(counts.slices > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_logs_are_one_clear_line_and_exit_code_2() {
    let dir = temp_dir("bad");
    let empty = dir.join("empty.log");
    std::fs::write(&empty, "").unwrap();
    let truncated = dir.join("truncated.log");
    std::fs::write(&truncated, gt::transport::event::log_header("2026-11-24T00:00:00Z") + "  0.00012").unwrap();
    let foreign = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let missing = dir.join("missing.log");
    let cases: [(&Path, &str); 4] = [
        (&empty, "is empty"),
        (&truncated, "holds no events"),
        (&foreign, "is not an instruction log"),
        (&missing, "cannot read"),
    ];
    for (log, why) in cases {
        for tool in ["visualize", "perfetto"] {
            let o = Command::new(env!("CARGO_BIN_EXE_gt"))
                .args([tool, log.to_str().unwrap(), "-o", dir.join("out").to_str().unwrap()])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{tool} {}: {stderr}", log.display());
            assert!(
                stderr.starts_with("error: ") && stderr.contains(why) && stderr.lines().count() == 1,
                "{tool}: {stderr}"
            );
        }
    }
    // No dispatcher to attach to.
    let o = Command::new(env!("CARGO_BIN_EXE_gt")).args(["trace", "-p", "1", "-s", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no dispatcher on port 1"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Frees the dispatcher injected (not a client's instruction: no arrow).
fn frees(tape: &Tape) -> u64 {
    tape.events.iter().filter(|e| e.kind == EventKind::Exec && e.details.starts_with("dispatcher")).count() as u64
}

/// `gt top` for real, in a tmux terminal, watching `gt server` run a script: it shows the
/// worker with the ops it ran, and `q` quits it. Skipped (with a line saying so) where tmux
/// is not installed; CI installs it.
#[test]
fn gt_top_watches_a_server_in_a_real_terminal() {
    use crate::distributed::{free_port, gt_run, server, worker};
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("skipped: tmux is not installed");
        return;
    }
    let port = free_port();
    let (_server, _) = server(port, "127.0.0.1", &[]);
    let _worker = worker(port);
    let session = format!("gt-top-test-{}", std::process::id());
    let tmux = |args: &[&str]| Command::new("tmux").args(["-L", &session]).args(args).output().unwrap();
    let top = format!("{} top -p {port}; echo top-exited-$?; sleep 30", env!("CARGO_BIN_EXE_gt"));
    let o = tmux(&["new-session", "-d", "-s", &session, "-x", "120", "-y", "30", &top]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    // Matmuls that take most of the worker's busy time, so that their share of its wall time
    // (between one gt-run and the next) stays well above what top hides, on a loaded machine too.
    let script = std::env::temp_dir().join(format!("gt-top-test-{}.gtir", std::process::id()));
    let body = "%a = randn f32[256, 256] seed=1\nrepeat 16 {\n  %c = matmul %a, %a\n}\n%s = sum %c\nprint %s\n";
    std::fs::write(&script, body).unwrap();
    // Run it until top has seen its matmul on the worker.
    while !(last.contains("w-test") && last.contains("matmul")) {
        assert!(Instant::now() < deadline, "gt top never showed the worker's matmul:\n{last}");
        let o = gt_run(&["--quiet", "--connect", &format!("127.0.0.1:{port}"), script.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        last = screen();
    }
    std::fs::remove_file(&script).unwrap();
    assert!(last.contains("gt top") && last.contains("q  quit"), "{last}");
    tmux(&["send-keys", "-t", &session, "q"]);
    while !last.contains("top-exited-0") {
        assert!(Instant::now() < deadline, "q did not quit gt top:\n{last}");
        std::thread::sleep(Duration::from_millis(50));
        last = screen();
    }
    tmux(&["kill-server"]);
}

#[test]
fn a_workers_memory_gauge_is_logged_once_per_probe_interval_at_most() {
    // A loop of tiny synced batches: each batch's `Done` carries the worker's live bytes,
    // but the log writes that gauge every 100 ms at most (it wrote one per batch).
    let dir = temp_dir("status-rate");
    let log = dir.join("run.log");
    let mut options = ClusterOptions::embedded(1);
    options.instruction_log = Some(log.clone());
    let cluster = Cluster::start(options).unwrap();
    let program = gt::ir::text::parse("%a = ones f32[4]\nrepeat 300 {\n  %b = neg %a\n  print %b\n}\n").unwrap();
    let mut client = Client::connect_in(cluster.context(), cluster.endpoint(), ClientOptions::default()).unwrap();
    run_script(&program, &mut client, &mut Vec::new(), Default::default()).unwrap();
    let tape = read_log_until(&log, |t| t.events.iter().filter(|e| e.kind == EventKind::Exec).count() >= 300);
    let gauges: Vec<f64> = tape
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Status && e.command == "memory")
        .map(|e| e.elapsed)
        .collect();
    assert!(!gauges.is_empty(), "the worker's memory is logged");
    for pair in gauges.windows(2) {
        // The log prints microseconds.
        assert!(pair[1] - pair[0] >= 0.1 - 2e-6, "two memory gauges {} s apart", pair[1] - pair[0]);
    }
}
