//! The data plane: bytes per second of uploading a tensor (`gt::from_vec`, a literal
//! instruction) and of reading one back (`to_vec`), through an embedded cluster (client ->
//! dispatcher -> worker over inproc ZeroMQ), then from a client connected to the cluster over
//! IPC and over TCP, for 4 MB and 64 MB of `f32`s; a `memcpy` of the same size beside them as
//! the ceiling.
//! Run: `cargo bench --bench dataplane` (`GT_BENCH_SAVE=1` writes
//! `bench/results/dataplane-vm.txt`).

/// gt's allocator, as its binaries and Python package run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

use gt::runtime::{Cluster, ClusterOptions};
use gt::transport::Endpoint;
use gt::Runtime;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Median of `reps` timings of `f`, after one untimed run (the allocator's first requests of
/// a size, the JIT, the first use of a socket).
fn median(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[reps / 2]
}

fn rate(bytes: usize, d: Duration) -> String {
    format!("{:>8.0} MB/s ({:.2} ms)", bytes as f64 / d.as_secs_f64() / 1e6, d.as_secs_f64() * 1e3)
}

/// Upload and read rates of 4 MB and 64 MB through `gt`, with a memcpy of the same size.
fn section(report: &mut String, gt: &Runtime, reps: usize) {
    for mb in [4usize, 64] {
        let n = mb * (1 << 20) / 4;
        let bytes = n * 4;
        let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
        let mut copy = vec![0f32; n];
        let memcpy = median(reps, || copy.copy_from_slice(std::hint::black_box(&data)));
        // An upload leaves with the next batch; the sync waits until the worker has it. (The
        // clone of the host vector is inside the time: a memcpy, see the last column.)
        let upload = median(reps, || {
            let _t = gt::from_vec(data.clone(), &[n]).unwrap();
            gt.sync().unwrap();
        });
        let t = gt::from_vec(data.clone(), &[n]).unwrap();
        let read = median(reps, || assert_eq!(t.to_vec().unwrap().len(), n));
        let _ = writeln!(
            report,
            "{mb:>3} MB  upload {}  read {}  memcpy {}",
            rate(bytes, upload),
            rate(bytes, read),
            rate(bytes, memcpy)
        );
    }
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let reps = if quick { 3 } else { 9 };
    let mut report = String::new();
    let _ = writeln!(report, "gt data plane, median of {reps}");
    let _ = writeln!(report, "embedded cluster (1 worker, inproc):");
    let gt = Runtime::embedded(1).expect("an embedded cluster starts");
    section(&mut report, &gt, reps);
    drop(gt);
    // The same cluster listening on a Unix socket and TCP, the client connected over each: over
    // TCP the data crosses the kernel's socket buffers; over IPC a large read goes through
    // shared memory unless GT_SHARED_READS=0 (issue 16: a 64 MB read >= 2 GB/s over IPC).
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let options = ClusterOptions { listen: Endpoint::for_server("127.0.0.1", port), ..ClusterOptions::embedded(1) };
    let cluster = Cluster::start(options).expect("a listening cluster starts");
    for want in ["ipc", "tcp"] {
        let endpoint =
            cluster.listen().iter().find(|e| e.to_string().starts_with(want)).expect("listens on it").clone();
        let _ = writeln!(report, "client over {want} ({endpoint}), cluster embedded in this process:");
        let gt = Runtime::connect(&endpoint.to_string()).expect("the client connects");
        section(&mut report, &gt, reps);
    }
    print!("{report}");
    if std::env::var_os("GT_BENCH_SAVE").is_some() {
        std::fs::write("bench/results/dataplane-vm.txt", &report).expect("bench/results is writable");
    }
}
