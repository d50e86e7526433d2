//! The data plane: bytes per second of uploading a tensor (`gt::from_vec`, a literal
//! instruction) and of reading one back (`to_vec`), through an embedded cluster (client ->
//! dispatcher -> worker over inproc ZeroMQ), for 4 MB and 64 MB of `f32`s; a `memcpy` of the
//! same size beside them as the ceiling.
//! Run: `cargo bench --bench dataplane` (`GT_BENCH_SAVE=1` writes
//! `bench/results/dataplane-vm.txt`).

/// gt's allocator, as its binaries and Python package run on.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

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

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let reps = if quick { 3 } else { 9 };
    let mut report = String::new();
    let _ = writeln!(report, "gt data plane, embedded cluster (1 worker, inproc), median of {reps}");
    let gt = Runtime::embedded(1).expect("an embedded cluster starts");
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
    print!("{report}");
    if std::env::var_os("GT_BENCH_SAVE").is_some() {
        std::fs::write("bench/results/dataplane-vm.txt", &report).expect("bench/results is writable");
    }
}
