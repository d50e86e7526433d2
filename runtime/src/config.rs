//! Runtime settings from the environment: `GT_WORKERS`, `GT_WORKER_BATCH_SIZE`,
//! `GT_INSTRUCTION_LOG`, `GT_MONITOR`, `GT_MAX_MESSAGE_BYTES`, and the passes' (`GT_PASSES`,
//! `GT_HOTPATH` with `GT_HOTPATH_WINDOW`, `GT_HOTPATH_THRESHOLD`, `GT_HOTPATH_MIN_SEQ`,
//! `GT_COMPILE`, `GT_AUTO_COMPILE`, `GT_FUSE_WINDOW`, `GT_FAST_MATH`, `GT_DEAD_WINDOW`,
//! `GT_AUTO_SHARD` with `GT_SHARD_THRESHOLD`, and `GT_DUMP_PASSES`), and security's
//! (`GT_KEY_FILE`, `GT_INSECURE`). A bad value is an error naming the variable, never a silent default.

use crate::backend::{BackendKind, UnknownBackend};
use gt_ir::kernel::Precision;
use gt_passes::{registry, HotPathConfig, PassOptions, Regions, UnknownPass};
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// The largest `GT_FUSE_WINDOW`: the fuse pass's partitioner works on one region at a time,
/// and its work and stack grow with the region.
pub const MAX_FUSE_WINDOW: usize = 4096;

/// A setting with a bad value.
#[derive(Debug, Error)]
#[error("{var}={value:?}: {problem}")]
pub struct EnvConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    #[source]
    pub problem: ConfigProblem,
}

/// What is wrong with a setting's value.
#[derive(Debug, Error)]
pub enum ConfigProblem {
    /// Not a whole number of at least 1.
    #[error("expected a whole number of at least 1")]
    NotPositive,
    /// Below the least that works.
    #[error("at least {min} (a registration, a handshake and one instruction must fit a message)")]
    TooSmall {
        /// The least.
        min: usize,
    },
    /// Past the most that makes sense.
    #[error("at most {max}")]
    TooMany {
        /// The most.
        max: usize,
    },
    /// Not a flag.
    #[error("expected 0 or 1")]
    NotFlag,
    /// Not a matmul precision.
    #[error("expected `highest` (f32) or `high` (TF32 tensor cores)")]
    NotPrecision,
    /// No such backend.
    #[error(transparent)]
    Backend(#[from] UnknownBackend),
    /// No such pass.
    #[error(transparent)]
    Pass(#[from] UnknownPass),
    /// A fuse window over [`MAX_FUSE_WINDOW`].
    #[error("at most {max} (a region is compiled as one unit)")]
    FuseWindow {
        /// The limit.
        max: usize,
    },
    /// A dump directory that cannot be written.
    #[error("cannot write there: {0}")]
    DumpDir(#[source] std::io::Error),
    /// Not a spin time in microseconds.
    #[error("expected a whole number of microseconds from 0 (never spin) to {max}")]
    NotSpin {
        /// The largest accepted.
        max: u64,
    },
    /// A worker memory budget larger than the machine's memory.
    #[error("this machine has {total} bytes of memory; a worker cannot hold more")]
    MoreMemoryThanMachine {
        /// The machine's memory in bytes.
        total: usize,
    },
    /// More compute threads than the machine has cores.
    #[error("this machine has {cores} cores; more threads than cores only slows the work down")]
    TooManyThreads {
        /// The machine's cores.
        cores: usize,
    },
}

/// The longest `GT_SPIN_US`: past a millisecond a spinning waiter only burns a core.
pub const MAX_SPIN_US: u64 = 1000;

/// This machine's cores (as the process may use them).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Each of `workers` workers' share of this machine's cores (at least 1).
pub fn cores_per_worker(workers: usize) -> usize {
    (cores() / workers.max(1)).max(1)
}

/// Every `GT_*` setting gt reads (here and in the client and frontend): what `gt prof sweep
/// --set NAME=...` accepts.
pub const SETTINGS: &[&str] = &[
    "GT_AUTO_COMPILE",
    "GT_AUTO_SHARD",
    "GT_AVX512",
    "GT_BACKEND",
    "GT_CLIENT_BATCH_SIZE",
    "GT_CLIENT_CREDIT",
    "GT_CLIENT_MEMORY",
    "GT_CLIENT_UNREAD_BYTES",
    "GT_CLIENT_WINDOW",
    "GT_COLLECTIVE_TIMEOUT",
    "GT_COMPILE",
    "GT_CONFIG",
    "GT_DEAD_WINDOW",
    "GT_DOORBELL",
    "GT_DUMP_PASSES",
    "GT_FAST_MATH",
    "GT_FUSE_WINDOW",
    "GT_HOTPATH",
    "GT_HOTPATH_MIN_SEQ",
    "GT_HOTPATH_THRESHOLD",
    "GT_HOTPATH_WINDOW",
    "GT_INSECURE",
    "GT_INSTRUCTION_LOG",
    "GT_JIT",
    "GT_KEY_FILE",
    "GT_LANE",
    "GT_MATMUL_PRECISION",
    "GT_MAX_MESSAGE_BYTES",
    "GT_MONITOR",
    "GT_OP_TIMEOUT",
    "GT_PASSES",
    "GT_PINNED",
    "GT_PROFILE",
    "GT_SHARD_THRESHOLD",
    "GT_SHARED_READS",
    "GT_SPIN_US",
    "GT_THREADS",
    "GT_WGMMA",
    "GT_WORKERS",
    "GT_WORKER_BATCH_SIZE",
    "GT_WORKER_MEMORY",
];

/// What the environment asks of the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvConfig {
    /// Embedded workers (`GT_WORKERS`, default 1).
    pub workers: usize,
    /// Instructions per worker batch at most (`GT_WORKER_BATCH_SIZE`, default 256).
    pub worker_batch_size: usize,
    /// The instruction log file (`GT_INSTRUCTION_LOG`).
    pub instruction_log: Option<PathBuf>,
    /// The folder an embedded dispatcher writes its profile into (`GT_PROFILE`; `gt prof`
    /// reads it).
    pub profile: Option<PathBuf>,
    /// Whether an embedded dispatcher binds a monitor socket (`GT_MONITOR=1`).
    pub monitor: bool,
    /// Largest message (`GT_MAX_MESSAGE_BYTES`, default 1 GiB).
    pub max_message_bytes: usize,
    /// The passes each client stream runs through: [`registry::DEFAULT_PASSES`] (`fuse` on
    /// compile signals, `dead`),
    /// or exactly the list `GT_PASSES=a,b` (`none`: no pass); `GT_HOTPATH=1` adds
    /// `hotpath`; `GT_COMPILE=1` adds `fuse` over every region, `GT_AUTO_COMPILE=1` adds
    /// `hotpath` and `fuse` over hot paths; `GT_FAST_MATH=1`, `GT_FUSE_WINDOW=N` set the
    /// fuse pass), in pipeline order.
    pub passes: Vec<&'static str>,
    /// The passes' settings.
    pub pass_options: PassOptions,
    /// Where each pass's output stream is written, one file per pass per client
    /// (`GT_DUMP_PASSES`); checked writable when read.
    pub dump_passes: Option<PathBuf>,
    /// What embedded workers execute on (`GT_BACKEND=cpu|cuda`, default cpu).
    pub backend: BackendKind,
    /// How GPU workers multiply f32 matrices (`GT_MATMUL_PRECISION`: `highest` = f32, the
    /// default; `high` = TF32 tensor cores), as PyTorch's `set_float32_matmul_precision`.
    pub matmul_precision: Precision,
    /// Whether CPU workers compile `fused` kernels with Cranelift (`GT_JIT=0` evaluates them
    /// with the kernel oracle instead, for debugging).
    pub jit: bool,
    /// The most bytes a worker's values may hold at once (`GT_WORKER_MEMORY`, in bytes;
    /// default [`default_worker_memory`]): an op past it fails, the process does not run out.
    pub worker_memory: usize,
    /// The most bytes one client's values may hold (`GT_CLIENT_MEMORY`, in bytes; default no
    /// limit): for a dispatcher shared by several users.
    pub client_memory: u64,
    /// Instructions one client may have in flight to workers (`GT_CLIENT_CREDIT`, default
    /// 2^20).
    pub client_credit: u64,
    /// Bytes of read answers one client may leave unread (`GT_CLIENT_UNREAD_BYTES`, default
    /// 512 MiB): past them its next read fails instead of the dispatcher buffering more.
    pub client_unread_bytes: u64,
    /// Compute threads per CPU worker (`GT_THREADS`; default `None`: the worker's share of
    /// the cores, [`cores_per_worker`]); at most the machine's cores.
    pub threads: Option<usize>,
    /// How long a worker's part of a collective waits for a peer (`GT_COLLECTIVE_TIMEOUT`,
    /// seconds, default [`DEFAULT_COLLECTIVE_TIMEOUT`]).
    pub collective_timeout: Duration,
    /// How long one instruction may run on a worker before it is cancelled and fails
    /// (`GT_OP_TIMEOUT`, seconds; default `None`: as long as it takes).
    pub op_timeout: Option<Duration>,
    /// The cluster key file (`GT_KEY_FILE`, as `--key`): read where a socket needs it
    /// (`gt_transport::ClusterKey::load`), so that a bad file is an error naming it.
    pub key_file: Option<PathBuf>,
    /// Whether a server may listen beyond the loopback without a key (`GT_INSECURE=1`, as
    /// `--insecure`).
    pub insecure: bool,
    /// How long clients, the dispatcher and workers poll for an expected message before they
    /// sleep (`GT_SPIN_US`, microseconds, 0: never; default
    /// [`gt_transport::socket::DEFAULT_SPIN`]).
    pub spin: Duration,
    /// Whether an embedded client's syncs may be answered by its worker directly, through
    /// the client's doorbell (`GT_DOORBELL`, default on; `gt_transport::doorbell`).
    pub doorbell: bool,
    /// Whether embedded clients and workers talk to their dispatcher through in-process
    /// queues instead of `inproc://` ZeroMQ (`GT_LANE`, default on; `gt_transport::lane`).
    pub lane: bool,
    /// Whether clients on `ipc://` take large answers from a file in shared memory instead
    /// of through the socket (`GT_SHARED_READS`, default on; `gt_transport::shared`).
    pub shared_reads: bool,
}

/// The least `GT_MAX_MESSAGE_BYTES` (64 KiB).
pub const MIN_MESSAGE_BYTES: usize = 64 << 10;

/// The most workers one process starts (`GT_WORKERS`, `--workers`).
pub const MAX_WORKERS: usize = 256;

/// How long a worker's part of a collective waits for a peer by default: long enough for a
/// peer's earlier work, short enough that a hung peer is reported.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Four fifths of the memory this process may use ([`machine_memory`]), or no limit where
/// that cannot be read; the workers of one process share it (`embedded.rs`).
pub fn default_worker_memory() -> usize {
    machine_memory().map_or(usize::MAX, |bytes| bytes / 5 * 4)
}

/// The memory this process may use in bytes: this machine's (`MemTotal` in
/// `/proc/meminfo`), or less where its control group (a container's, a systemd unit's)
/// limits it; `None` where neither can be read.
pub fn machine_memory() -> Option<usize> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<usize>().ok()?.saturating_mul(1024))
    });
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok();
    let limit = cgroups.and_then(|text| cgroup_limit(&text, std::path::Path::new("/sys/fs/cgroup")));
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

/// The tightest memory limit of the control groups `/proc/self/cgroup` (`cgroups`) names, and
/// of their ancestors, under `sys` (`/sys/fs/cgroup`): v2's `memory.max`, v1's
/// `memory.limit_in_bytes` (whose "unlimited" is a number near 2^63).
fn cgroup_limit(cgroups: &str, sys: &std::path::Path) -> Option<usize> {
    let read = |file: std::path::PathBuf| -> Option<usize> {
        let text = std::fs::read_to_string(file).ok()?;
        text.trim().parse::<u64>().ok().filter(|&b| b < 1 << 62).map(|b| b as usize)
    };
    let mut tightest: Option<usize> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (root, file) = match controllers {
            "" => (sys.to_path_buf(), "memory.max"),
            c if c.split(',').any(|c| c == "memory") => (sys.join("memory"), "memory.limit_in_bytes"),
            _ => continue,
        };
        let mut dir = Some(std::path::Path::new(path.trim_start_matches('/')));
        while let Some(d) = dir {
            if let Some(limit) = read(root.join(d).join(file)) {
                tightest = Some(tightest.map_or(limit, |t| t.min(limit)));
            }
            dir = d.parent();
        }
    }
    tightest
}

impl Default for EnvConfig {
    fn default() -> Self {
        EnvConfig {
            workers: 1,
            worker_batch_size: 256,
            instruction_log: None,
            profile: None,
            monitor: false,
            max_message_bytes: gt_transport::DEFAULT_MAX_MESSAGE_BYTES,
            passes: registry::DEFAULT_PASSES.to_vec(),
            pass_options: registry::default_options(),
            dump_passes: None,
            worker_memory: default_worker_memory(),
            client_memory: u64::MAX,
            client_credit: crate::dispatcher::CLIENT_CREDIT_INSTRUCTIONS,
            client_unread_bytes: crate::dispatcher::CLIENT_UNREAD_BYTES,
            backend: BackendKind::Cpu,
            matmul_precision: Precision::F32,
            jit: true,
            threads: None,
            collective_timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            op_timeout: None,
            key_file: None,
            insecure: false,
            spin: gt_transport::socket::DEFAULT_SPIN,
            doorbell: true,
            lane: true,
            shared_reads: true,
        }
    }
}

impl EnvConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<EnvConfig, EnvConfigError> {
        EnvConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// Adds passes to run (kept in pipeline order, each once).
    pub fn enable_passes(&mut self, names: &[&'static str]) {
        self.passes.extend_from_slice(names);
        registry::in_pipeline_order(&mut self.passes);
    }

    /// Reads settings through `get` (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<EnvConfig, EnvConfigError> {
        let mut c = EnvConfig::default();
        let positive = |var: &'static str, default: usize| -> Result<usize, EnvConfigError> {
            match get(var) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(EnvConfigError { var, value: v, problem: ConfigProblem::NotPositive }),
                },
            }
        };
        c.workers = positive("GT_WORKERS", c.workers)?;
        c.worker_batch_size = positive("GT_WORKER_BATCH_SIZE", c.worker_batch_size)?;
        c.max_message_bytes = positive("GT_MAX_MESSAGE_BYTES", c.max_message_bytes)?;
        // Registrations, handshakes and one instruction's batch must fit a message.
        if c.max_message_bytes < MIN_MESSAGE_BYTES {
            let value = get("GT_MAX_MESSAGE_BYTES").unwrap_or_default();
            let problem = ConfigProblem::TooSmall { min: MIN_MESSAGE_BYTES };
            return Err(EnvConfigError { var: "GT_MAX_MESSAGE_BYTES", value, problem });
        }
        // Each worker is threads and sockets of its own: a count past this is a mistake that
        // would exhaust the process's threads or files.
        if c.workers > MAX_WORKERS {
            let value = get("GT_WORKERS").unwrap_or_default();
            return Err(EnvConfigError {
                var: "GT_WORKERS",
                value,
                problem: ConfigProblem::TooMany { max: MAX_WORKERS },
            });
        }
        c.worker_memory = positive("GT_WORKER_MEMORY", c.worker_memory)?;
        // A budget the machine cannot hold would let the process be killed for memory instead
        // of failing the op that passes it. Only a set one can (the default is 4/5 of it).
        if let Some(value) = get("GT_WORKER_MEMORY") {
            if let Some(total) = machine_memory().filter(|&total| c.worker_memory > total) {
                let problem = ConfigProblem::MoreMemoryThanMachine { total };
                return Err(EnvConfigError { var: "GT_WORKER_MEMORY", value, problem });
            }
        }
        c.client_credit = positive("GT_CLIENT_CREDIT", c.client_credit as usize)? as u64;
        c.client_unread_bytes = positive("GT_CLIENT_UNREAD_BYTES", c.client_unread_bytes as usize)? as u64;
        let timeout = positive("GT_COLLECTIVE_TIMEOUT", c.collective_timeout.as_secs() as usize)?;
        c.collective_timeout = Duration::from_secs(timeout as u64);
        if get("GT_OP_TIMEOUT").is_some_and(|v| !v.trim().is_empty()) {
            c.op_timeout = Some(Duration::from_secs(positive("GT_OP_TIMEOUT", 1)? as u64));
        }
        if get("GT_THREADS").is_some() {
            let threads = positive("GT_THREADS", 1)?;
            let cores = cores();
            if threads > cores {
                let value = get("GT_THREADS").unwrap_or_default();
                return Err(EnvConfigError {
                    var: "GT_THREADS",
                    value,
                    problem: ConfigProblem::TooManyThreads { cores },
                });
            }
            c.threads = Some(threads);
        }
        if let Some(v) = get("GT_SPIN_US").filter(|v| !v.trim().is_empty()) {
            let us = v.trim().parse::<u64>().ok().filter(|us| *us <= MAX_SPIN_US);
            let problem = ConfigProblem::NotSpin { max: MAX_SPIN_US };
            c.spin = Duration::from_micros(us.ok_or(EnvConfigError { var: "GT_SPIN_US", value: v, problem })?);
        }
        if get("GT_CLIENT_MEMORY").is_some() {
            c.client_memory = positive("GT_CLIENT_MEMORY", 0)? as u64;
        }
        c.instruction_log = get("GT_INSTRUCTION_LOG").filter(|s| !s.is_empty()).map(PathBuf::from);
        c.profile = get("GT_PROFILE").filter(|s| !s.is_empty()).map(PathBuf::from);
        let flag = |var: &'static str| match get(var).as_deref().map(str::trim) {
            None | Some("" | "0" | "false") => Ok(false),
            Some("1" | "true") => Ok(true),
            Some(v) => Err(EnvConfigError { var, value: v.into(), problem: ConfigProblem::NotFlag }),
        };
        c.monitor = flag("GT_MONITOR")?;
        c.insecure = flag("GT_INSECURE")?;
        c.key_file = get("GT_KEY_FILE").filter(|s| !s.trim().is_empty()).map(PathBuf::from);
        c.jit = get("GT_JIT").is_none_or(|v| v.trim().is_empty()) || flag("GT_JIT")?;
        c.doorbell = get("GT_DOORBELL").is_none_or(|v| v.trim().is_empty()) || flag("GT_DOORBELL")?;
        c.lane = get("GT_LANE").is_none_or(|v| v.trim().is_empty()) || flag("GT_LANE")?;
        c.shared_reads = get("GT_SHARED_READS").is_none_or(|v| v.trim().is_empty()) || flag("GT_SHARED_READS")?;
        c.matmul_precision = match get("GT_MATMUL_PRECISION").as_deref().map(str::trim) {
            None | Some("" | "highest") => Precision::F32,
            Some("high") => Precision::Tf32,
            Some(v) => {
                let problem = ConfigProblem::NotPrecision;
                return Err(EnvConfigError { var: "GT_MATMUL_PRECISION", value: v.into(), problem });
            }
        };
        if let Some(v) = get("GT_BACKEND").filter(|s| !s.trim().is_empty()) {
            c.backend = v.trim().parse().map_err(|e: UnknownBackend| EnvConfigError {
                var: "GT_BACKEND",
                value: v.clone(),
                problem: e.into(),
            })?;
        }
        if let Some(list) = get("GT_PASSES") {
            c.passes.clear();
            let names = list.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "none");
            for name in names {
                let known = registry::check(name).map_err(|e| EnvConfigError {
                    var: "GT_PASSES",
                    value: list.clone(),
                    problem: e.into(),
                })?;
                c.enable_passes(&[known]);
            }
        }
        if flag("GT_HOTPATH")? {
            c.enable_passes(&["hotpath"]);
        }
        // GT_COMPILE: every region is compiled; GT_AUTO_COMPILE: hot paths are found and
        // each repetition is compiled. GT_COMPILE wins when both are set.
        if flag("GT_AUTO_COMPILE")? {
            c.enable_passes(&["hotpath", "fuse"]);
            c.pass_options.fuse.regions = Regions::HotPaths;
        }
        if flag("GT_COMPILE")? {
            c.enable_passes(&["fuse"]);
            c.pass_options.fuse.regions = Regions::All;
        }
        c.pass_options.fuse.fast_math = flag("GT_FAST_MATH")?;
        c.pass_options.fuse.window = positive("GT_FUSE_WINDOW", c.pass_options.fuse.window)?;
        if c.pass_options.fuse.window > MAX_FUSE_WINDOW {
            let value = c.pass_options.fuse.window.to_string();
            let problem = ConfigProblem::FuseWindow { max: MAX_FUSE_WINDOW };
            return Err(EnvConfigError { var: "GT_FUSE_WINDOW", value, problem });
        }
        c.pass_options.dead.window = positive("GT_DEAD_WINDOW", c.pass_options.dead.window)?;
        // GT_AUTO_SHARD: the shard pass splits large work over every worker by itself.
        if flag("GT_AUTO_SHARD")? {
            c.enable_passes(&["shard"]);
            c.pass_options.shard.auto = true;
        }
        let threshold = positive("GT_SHARD_THRESHOLD", c.pass_options.shard.threshold as usize)?;
        c.pass_options.shard.threshold = threshold as u64;
        let d = HotPathConfig::default();
        c.pass_options.hotpath = HotPathConfig {
            window: positive("GT_HOTPATH_WINDOW", d.window)?,
            threshold: u32::try_from(positive("GT_HOTPATH_THRESHOLD", d.threshold as usize)?).unwrap_or(u32::MAX),
            min_seq: positive("GT_HOTPATH_MIN_SEQ", d.min_seq)?,
        };
        if let Some(dir) = get("GT_DUMP_PASSES").filter(|s| !s.is_empty()) {
            let path = PathBuf::from(&dir);
            // Checked now: a dump directory that cannot be written is an error at start.
            let probe = path.join(".gt-dump-probe");
            let writable = std::fs::create_dir_all(&path)
                .and_then(|_| std::fs::write(&probe, b""))
                .and_then(|_| std::fs::remove_file(&probe));
            if let Err(e) = writable {
                return Err(EnvConfigError { var: "GT_DUMP_PASSES", value: dir, problem: ConfigProblem::DumpDir(e) });
            }
            c.dump_passes = Some(path);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_control_groups_memory_limit_bounds_the_machines_memory() {
        let sys = std::env::temp_dir().join(format!("gt-cgroup-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let file = sys.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        };
        // v2: the group itself is unlimited, its parent is not.
        write("box/job/memory.max", "max\n");
        write("box/memory.max", "3221225472\n");
        assert_eq!(super::cgroup_limit("0::/box/job\n", &sys), Some(3 << 30));
        // v1: "unlimited" is a number near 2^63; a tighter one is taken.
        write("memory/a/memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(super::cgroup_limit("4:memory:/a\n", &sys), None);
        write("memory/memory.limit_in_bytes", "1048576\n");
        assert_eq!(super::cgroup_limit("4:memory:/a\n0::/box/job\n", &sys), Some(1 << 20));
        // No group or no files: no limit.
        assert_eq!(super::cgroup_limit("1:cpu:/\n", &sys), None);
        std::fs::remove_dir_all(&sys).unwrap();
    }

    use super::*;

    #[test]
    fn a_profile_folder_reaches_the_cluster() {
        let env = EnvConfig::from_lookup(|k| (k == "GT_PROFILE").then(|| "/tmp/p".to_string())).unwrap();
        assert_eq!(env.profile.as_deref(), Some(std::path::Path::new("/tmp/p")));
        let options = crate::ClusterOptions::from_config(&env);
        assert_eq!(options.profile, env.profile);
        assert_eq!(options.settings().get("workers").map(String::as_str), Some("1"));
    }

    #[test]
    fn every_setting_read_here_is_listed() {
        let source = include_str!("config.rs");
        for (i, _) in source.match_indices("\"GT_") {
            let name: String = source[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name == "GT_" {
                continue; // this test's own pattern
            }
            assert!(SETTINGS.contains(&name.as_str()), "{name} is read but not in SETTINGS");
        }
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn defaults_and_values() {
        assert_eq!(EnvConfig::from_lookup(env(&[])).unwrap(), EnvConfig::default());
        let c = EnvConfig::from_lookup(env(&[("GT_WORKERS", "4"), ("GT_WORKER_BATCH_SIZE", "1"), ("GT_MONITOR", "1")]))
            .unwrap();
        let c4 = (c.workers, c.worker_batch_size, c.monitor, c.passes.as_slice(), c.pass_options.fuse.regions);
        assert_eq!(c4, (4, 1, true, &["shard", "fuse", "dead"][..], Regions::Signals));
        let c = EnvConfig::from_lookup(env(&[("GT_HOTPATH", "1"), ("GT_HOTPATH_THRESHOLD", "7")])).unwrap();
        assert_eq!(c.passes, ["shard", "hotpath", "fuse", "dead"]);
        assert_eq!(c.pass_options.hotpath, HotPathConfig { threshold: 7, ..HotPathConfig::default() });
        let c = EnvConfig::from_lookup(env(&[("GT_PASSES", "hotpath, hotpath"), ("GT_HOTPATH", "1")])).unwrap();
        assert_eq!(c.passes, ["hotpath"]);
        // GT_PASSES is the whole list: `none` (or nothing) switches every pass off.
        for none in ["none", ""] {
            let c = EnvConfig::from_lookup(env(&[("GT_PASSES", none), ("GT_DEAD_WINDOW", "8")])).unwrap();
            assert_eq!((c.passes.len(), c.pass_options.dead.window), (0, 8));
        }
        let c = EnvConfig::from_lookup(env(&[("GT_BACKEND", "cuda"), ("GT_MATMUL_PRECISION", "high")])).unwrap();
        assert_eq!((c.backend, c.matmul_precision), (BackendKind::Cuda, Precision::Tf32));
        let c = EnvConfig::from_lookup(env(&[("GT_KEY_FILE", "/k/cluster.key"), ("GT_INSECURE", "1")])).unwrap();
        assert_eq!((c.key_file.as_deref(), c.insecure), (Some(std::path::Path::new("/k/cluster.key")), true));
        let c = EnvConfig::from_lookup(env(&[("GT_AUTO_COMPILE", "1")])).unwrap();
        let passes = (c.passes.as_slice(), c.pass_options.fuse.regions);
        assert_eq!(passes, (&["shard", "hotpath", "fuse", "dead"][..], Regions::HotPaths));
        let c = EnvConfig::from_lookup(env(&[("GT_COMPILE", "1"), ("GT_FUSE_WINDOW", "64")])).unwrap();
        assert_eq!((c.passes.as_slice(), c.pass_options.fuse.window), (&["shard", "fuse", "dead"][..], 64));
        let c =
            EnvConfig::from_lookup(env(&[("GT_PASSES", "dead"), ("GT_AUTO_SHARD", "1"), ("GT_SHARD_THRESHOLD", "64")]))
                .unwrap();
        assert_eq!(
            (c.passes.as_slice(), c.pass_options.shard.auto, c.pass_options.shard.threshold),
            (&["shard", "dead"][..], true, 64)
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("GT_WORKERS", "0"),
            ("GT_WORKERS", "two"),
            ("GT_WORKER_BATCH_SIZE", "-1"),
            ("GT_MONITOR", "yes"),
            ("GT_HOTPATH_WINDOW", "0"),
            ("GT_DEAD_WINDOW", "0"),
            ("GT_FUSE_WINDOW", "4097"),
            ("GT_BACKEND", "tpu"),
            ("GT_MATMUL_PRECISION", "medium"),
            ("GT_THREADS", "0"),
            ("GT_THREADS", "100000"),
            ("GT_AUTO_SHARD", "maybe"),
            ("GT_INSECURE", "yes"),
            ("GT_DOORBELL", "sometimes"),
            ("GT_LANE", "sometimes"),
            ("GT_SHARED_READS", "often"),
            ("GT_SHARD_THRESHOLD", "0"),
            ("GT_SPIN_US", "-5"),
            ("GT_SPIN_US", "1001"),
            ("GT_WORKER_MEMORY", "0"),
            ("GT_WORKERS", "257"),
            ("GT_MAX_MESSAGE_BYTES", "10"),
            ("GT_MAX_MESSAGE_BYTES", "65535"),
        ] {
            let e = EnvConfig::from_lookup(env(&[(k, v), ("GT_HOTPATH", "1")])).unwrap_err();
            assert!(e.to_string().starts_with(&format!("{k}=")), "{e}");
        }
        let e = EnvConfig::from_lookup(env(&[("GT_MAX_MESSAGE_BYTES", "100")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GT_MAX_MESSAGE_BYTES=\"100\": at least 65536 (a registration, a handshake and one instruction must fit a message)"
        );
        assert_eq!(EnvConfig::from_lookup(env(&[("GT_WORKERS", "256")])).map(|c| c.workers).ok(), Some(256));
        let e = EnvConfig::from_lookup(env(&[("GT_SPIN_US", "2ms")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GT_SPIN_US=\"2ms\": expected a whole number of microseconds from 0 (never spin) to 1000"
        );
        if let Some(total) = machine_memory() {
            let more = (total + 1).to_string();
            let e = EnvConfig::from_lookup(env(&[("GT_WORKER_MEMORY", &more)])).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "GT_WORKER_MEMORY=\"{more}\": this machine has {total} bytes of memory; a worker cannot hold more"
                )
            );
            assert!(EnvConfig::from_lookup(env(&[("GT_WORKER_MEMORY", &total.to_string())])).is_ok());
        }
        let c = EnvConfig::from_lookup(env(&[("GT_SPIN_US", "0")])).unwrap();
        assert!(c.spin.is_zero());
        assert!(c.doorbell, "on by default");
        assert!(!EnvConfig::from_lookup(env(&[("GT_DOORBELL", "0")])).unwrap().doorbell);
        assert!(c.lane, "on by default");
        assert!(!EnvConfig::from_lookup(env(&[("GT_LANE", "0")])).unwrap().lane);
        assert!(c.shared_reads, "on by default");
        assert!(!EnvConfig::from_lookup(env(&[("GT_SHARED_READS", "0")])).unwrap().shared_reads);
        let e = EnvConfig::from_lookup(env(&[("GT_PASSES", "hotpath,shards")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GT_PASSES=\"hotpath,shards\": unknown pass `shards` (known passes: shard, hotpath, fuse, dead)"
        );
        let e = EnvConfig::from_lookup(env(&[("GT_DUMP_PASSES", "/proc/gt-cannot-be-here")])).unwrap_err();
        assert!(e.to_string().contains("cannot write there"), "{e}");
    }
}
