//! The profile format: what a dispatcher writes under `GT_PROFILE=DIR` (`gt-run --profile
//! DIR`) and `gt prof` reads. Plain CSV with a header row (pandas: `pd.read_csv(path)`) and
//! one JSON manifest; `docs/profiling.md` documents every column.
//!
//! ```text
//! DIR/manifest.json        run facts: settings, machine, git revision, workers, clients, complete
//! DIR/worker-NAME.csv      one Record per executed instruction, copy or transfer on worker NAME
//! DIR/signals.csv          one SignalRecord per signal scope a client opened
//! ```
//!
//! Times are nanoseconds on the dispatcher's clock (since it started), so every worker's
//! records line up on one timeline; a worker's own clock is mapped onto it by the
//! dispatcher's clock estimates (`gt_runtime` `workers::Clock`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// The signal scopes' file name.
pub const SIGNALS: &str = "signals.csv";
/// The format's version, in the manifest.
pub const FORMAT_VERSION: u32 = 1;

/// The file of the worker named `name`: `worker-NAME.csv` (`worker-0.csv` for `worker-0`),
/// with every character outside `[A-Za-z0-9_.-]` replaced by `_` so a worker's name cannot
/// leave the folder.
pub fn worker_file(name: &str) -> String {
    let safe: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect();
    format!("worker-{}.csv", safe.strip_prefix("worker-").unwrap_or(&safe))
}

/// The header of a worker file: [`Record`]'s fields in order (written even when a worker
/// ran nothing, so every file reads as a table).
pub const RECORD_COLUMNS: [&str; 21] = [
    "kind",
    "worker",
    "client",
    "seq",
    "name",
    "op",
    "kernel_hash",
    "line",
    "signal",
    "direction",
    "scope",
    "hotpath",
    "iteration",
    "inputs",
    "outputs",
    "bytes_read",
    "bytes_written",
    "flops",
    "start_ns",
    "duration_ns",
    "detail",
];

/// The header of `signals.csv`: [`SignalRecord`]'s fields in order.
pub const SIGNAL_COLUMNS: [&str; 8] =
    ["client", "scope", "name", "direction", "depth", "parent", "opened_ns", "closed_ns"];

/// What a [`Record`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordKind {
    /// An instruction or `fused` kernel the worker executed.
    Kernel,
    /// Data between the host and the worker's memory: an upload (`literal`, `detail=h2d`) or a
    /// read for a client (`detail=d2h`, timed by the dispatcher from request to answer).
    Copy,
    /// A worker's part of a collective, data worker to worker (`detail` names the collective,
    /// its rank and its workers).
    Transfer,
}

/// Which pass of training a scope belongs to: its signal's, or its backward signal's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// A signal scope (`signal_start "x"`).
    Forward,
    /// A backward signal scope (`signal_start "x" backward`): the gradient ops of what a
    /// forward scope computed.
    Backward,
}

/// One row of a worker file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// What it is.
    pub kind: RecordKind,
    /// The worker's name.
    pub worker: String,
    /// The client it ran for.
    pub client: u64,
    /// The client's instruction it came from (empty: the dispatcher's own, e.g. a free).
    pub seq: Option<u64>,
    /// Its name: the op, or `fused.HASH8` for a fused kernel (launches of one kernel share it).
    pub name: String,
    /// The instruction's mnemonic.
    pub op: String,
    /// 16 hex digits identifying the kernel: a hash of the instruction with value ids erased
    /// (launches of the same code on the same shapes share it).
    pub kernel_hash: String,
    /// The script line it came from (1-based; empty when the client did not say).
    pub line: Option<u32>,
    /// The innermost signal scope open around it (empty: none).
    pub signal: String,
    /// Whether that scope is a signal or a backward signal (empty: no scope).
    pub direction: Option<Direction>,
    /// The scope's id (a row of `signals.csv` of the same client).
    pub scope: Option<u64>,
    /// The hot path it ran in (`hotpath_start ID`), if any.
    pub hotpath: Option<u64>,
    /// Which repetition of that hot path (1-based).
    pub iteration: Option<u64>,
    /// Operand types, `;`-separated (`f32[64,784];f32[784,256]`).
    pub inputs: String,
    /// Result types, `;`-separated.
    pub outputs: String,
    /// Bytes its operands hold (what it reads).
    pub bytes_read: u64,
    /// Bytes its results hold (what it writes).
    pub bytes_written: u64,
    /// Floating-point operations (`gt_ir::cost`).
    pub flops: u64,
    /// When it started, ns on the dispatcher's clock.
    pub start_ns: u64,
    /// How long it ran, ns (CUDA events on GPUs, a monotonic clock on CPUs).
    pub duration_ns: u64,
    /// For copies `h2d`/`d2h`; for transfers `collective #ID rank R of W0;W1`.
    pub detail: String,
}

impl Record {
    /// A record of `kind` named `name` (its op too) on `worker` for client 1, every other
    /// field empty or zero: a start for tools and tests that fill in the rest.
    pub fn new(kind: RecordKind, worker: &str, name: &str) -> Record {
        Record {
            kind,
            worker: worker.to_string(),
            client: 1,
            seq: None,
            name: name.to_string(),
            op: name.to_string(),
            kernel_hash: String::new(),
            line: None,
            signal: String::new(),
            direction: None,
            scope: None,
            hotpath: None,
            iteration: None,
            inputs: String::new(),
            outputs: String::new(),
            bytes_read: 0,
            bytes_written: 0,
            flops: 0,
            start_ns: 0,
            duration_ns: 0,
            detail: String::new(),
        }
    }

    /// When it ended, ns on the dispatcher's clock.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// One row of `signals.csv`: a scope a client opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalRecord {
    /// The client.
    pub client: u64,
    /// The scope's id, unique within the client; records name it in `scope`.
    pub scope: u64,
    /// The signal's name.
    pub name: String,
    /// Signal or backward signal.
    pub direction: Direction,
    /// 1 for an outermost scope.
    pub depth: u32,
    /// The scope it was opened in (empty: none).
    pub parent: Option<u64>,
    /// When the dispatcher received its `signal_start`, ns on its clock.
    pub opened_ns: u64,
    /// When it received the matching `signal_end` (empty: never closed, the run ended first).
    pub closed_ns: Option<u64>,
}

/// The run's facts, `manifest.json`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// gt's version.
    pub gt_version: String,
    /// The git revision gt was built from (empty when unknown).
    pub git_revision: String,
    /// When profiling began (RFC 3339).
    pub started: String,
    /// When the dispatcher stopped (empty: it did not stop cleanly, files may be cut short).
    pub ended: Option<String>,
    /// Whether the dispatcher stopped cleanly and flushed every file.
    pub complete: bool,
    /// Every `GT_*` environment setting, and the dispatcher's effective settings.
    pub settings: BTreeMap<String, String>,
    /// The machine.
    pub machine: Machine,
    /// The workers that registered.
    pub workers: Vec<ManifestWorker>,
    /// The clients that connected.
    pub clients: Vec<ManifestClient>,
}

/// The machine a profile was taken on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Machine {
    /// Its host name.
    pub hostname: String,
    /// `linux`, `macos`...
    pub os: String,
    /// `x86_64`, `aarch64`...
    pub arch: String,
    /// Logical cores.
    pub cpus: u32,
    /// The CPU's model name, when the OS says.
    pub cpu_model: String,
    /// Physical memory in bytes (0: unknown).
    pub memory_bytes: u64,
}

/// A worker in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestWorker {
    /// Its index at the dispatcher.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// Its backend (`cpu`, `cuda`).
    pub backend: String,
    /// Its records' file, relative to the profile folder.
    pub file: String,
}

/// A client in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestClient {
    /// Its number.
    pub client: u64,
    /// The name it gave (`gt-run mlp.gtir`).
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_files_stay_in_the_folder() {
        assert_eq!(worker_file("worker-0"), "worker-0.csv");
        assert_eq!(worker_file("gpu"), "worker-gpu.csv");
        assert_eq!(worker_file("../../etc/x"), "worker-.._.._etc_x.csv");
        assert!(!worker_file("a/b\\c").contains('/'));
    }

    #[test]
    fn records_round_trip_through_csv_with_empty_optionals() {
        let r = Record {
            kernel_hash: "00000000deadbeef".into(),
            line: Some(3),
            inputs: "f32[2,3];f32[3,4]".into(),
            outputs: "f32[2,4]".into(),
            bytes_read: 72,
            bytes_written: 32,
            flops: 48,
            start_ns: 10,
            duration_ns: 5,
            ..Record::new(RecordKind::Kernel, "w0", "matmul")
        };
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(&r).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next(), Some(RECORD_COLUMNS.join(",").as_str()), "the header is the fields'");
        let back: Record = csv::Reader::from_reader(text.as_bytes()).deserialize().next().unwrap().unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_signal_header_is_the_fields() {
        let row = SignalRecord {
            client: 1,
            scope: 0,
            name: "fc1".into(),
            direction: Direction::Backward,
            depth: 1,
            parent: None,
            opened_ns: 5,
            closed_ns: None,
        };
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(&row).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next(), Some(SIGNAL_COLUMNS.join(",").as_str()));
        assert_eq!(text.lines().nth(1), Some("1,0,fc1,backward,1,,5,"));
    }
}
