//! The one integration-test binary: filetests with snapshots, `gt-run` CLI tests and tidy checks.

mod auth;
mod autograd;
mod cli;
mod cluster;
mod distributed;
mod dsl;
mod filetests;
mod fusion;
mod hostile;
mod kernels;
mod pipeline;
mod placement;
mod prof;
mod ptx;
mod shard;
mod signals;
mod tensor_api;
mod tidy;
mod tools;
mod training;

/// What a fake worker answers every batch with: it ran, nothing failed, no bell rung.
pub(crate) fn done(batch: u64) -> gt::transport::WorkerEvent {
    gt::transport::WorkerEvent::Done { batch, failures: vec![], nanos: 0, timings: vec![], live_bytes: 0, rang: false }
}

/// A fresh scratch folder of one test's own (`part`: the test file).
pub(crate) fn scratch(part: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gt-{part}-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
