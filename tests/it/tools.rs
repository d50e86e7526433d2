//! The observability tools on real runs: an embedded cluster with two workers logs one EXEC
//! event per executed instruction, and `gt perfetto`'s trace of that log follows the Trace
//! Event Format with one slice per instruction and the workers' own time in them.

use gt::frontend::{run_script, Client, ClientOptions};
use gt::runtime::{Cluster, ClusterOptions};
use gt::tools::perfetto;
use gt::tools::tape::{Lane, Tape};
use gt::transport::EventKind;
use std::path::{Path, PathBuf};
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
    drop(clients);
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Frees the dispatcher injected (not a client's instruction: no arrow).
fn frees(tape: &Tape) -> u64 {
    tape.events.iter().filter(|e| e.kind == EventKind::Exec && e.details.starts_with("dispatcher")).count() as u64
}
