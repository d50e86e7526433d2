//! Embedded mode: a dispatcher and N workers as threads of this process, over `inproc://`
//! (what `gt-run` and the Rust API use when nothing else is configured), and the same
//! start-up for `gt server`, which listens on TCP and IPC instead.

use crate::backend::BackendKind;
use crate::dispatcher::log::EventLog;
use crate::dispatcher::profile::Profiler;
use crate::dispatcher::{Dispatcher, DispatcherConfig};
use crate::worker::{run_worker, WorkerError, WorkerOptions};
use gt_ir::kernel::Precision;
use gt_transport::endpoint::{
    discovery_path, ensure_runtime_dir, make_private, monitor_ipc_path, runtime_dir, write_private, RuntimeDirError,
};
use gt_transport::{socket, zmq, ClusterKey, Endpoint};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use thiserror::Error;

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where the dispatcher listens; empty: a fresh `inproc://` name.
    pub listen: Vec<Endpoint>,
    /// Worker threads to start in this process.
    pub workers: usize,
    /// Dispatcher settings.
    pub dispatcher: DispatcherConfig,
    /// The instruction log file.
    pub instruction_log: Option<PathBuf>,
    /// The profile folder (`GT_PROFILE`).
    pub profile: Option<PathBuf>,
    /// Where the monitor PUB socket binds (empty: none).
    pub monitor: Vec<Endpoint>,
    /// A name under which the endpoints are written for tools (see
    /// [`gt_transport::endpoint::discovery_path`]); `None`: not written.
    pub discovery_name: Option<String>,
    /// What the in-process workers execute on.
    pub backend: BackendKind,
    /// How GPU workers multiply matrices.
    pub matmul_precision: Precision,
    /// Whether CPU workers compile `fused` kernels (`GT_JIT`).
    pub jit: bool,
    /// Each in-process worker's memory budget (`GT_WORKER_MEMORY`); the default one
    /// ([`crate::config::default_worker_memory`]) is shared by the workers.
    pub worker_memory: usize,
    /// Each in-process worker's compute threads (`GT_THREADS`; `None`: its share of the
    /// cores).
    pub threads: Option<usize>,
    /// How long an in-process worker's collective waits for a peer (`GT_COLLECTIVE_TIMEOUT`).
    pub collective_timeout: std::time::Duration,
    /// How long an in-process worker's instruction may run (`GT_OP_TIMEOUT`; `None`: no limit).
    pub op_timeout: Option<std::time::Duration>,
    /// The cluster key (`--key`, `GT_KEY_FILE`): TCP endpoints are CURVE servers that let in
    /// only its holders (`gt_transport::auth`).
    pub key: Option<ClusterKey>,
    /// Listen beyond the loopback without a key (`--insecure`, `GT_INSECURE=1`); otherwise
    /// that is refused ([`ClusterError::Insecure`]).
    pub insecure: bool,
    /// Whether the in-process workers offer the dispatcher a lane (`GT_LANE`,
    /// `gt_transport::lane`).
    pub lane: bool,
}

impl ClusterOptions {
    /// An in-process cluster with `workers` workers and default settings.
    pub fn embedded(workers: usize) -> ClusterOptions {
        ClusterOptions {
            listen: Vec::new(),
            workers,
            dispatcher: DispatcherConfig::default(),
            instruction_log: None,
            profile: None,
            monitor: Vec::new(),
            discovery_name: None,
            backend: BackendKind::Cpu,
            matmul_precision: Precision::F32,
            jit: true,
            worker_memory: crate::config::default_worker_memory(),
            threads: None,
            collective_timeout: crate::config::DEFAULT_COLLECTIVE_TIMEOUT,
            op_timeout: None,
            key: None,
            insecure: false,
            lane: true,
        }
    }

    /// An embedded cluster as `env` asks (`GT_WORKERS` and the others of
    /// [`crate::config::EnvConfig`]).
    pub fn from_config(env: &crate::config::EnvConfig) -> ClusterOptions {
        let mut o = ClusterOptions::embedded(env.workers);
        o.apply(env);
        if env.monitor {
            let name = format!("embedded-{}", std::process::id());
            o.monitor = vec![Endpoint::Ipc(runtime_dir().join(format!("{name}-monitor.ipc")))];
            o.discovery_name = Some(name);
        }
        o
    }

    /// The settings a profile's manifest records (with the process's `GT_*` environment).
    pub fn settings(&self) -> std::collections::BTreeMap<String, String> {
        let threads = self.threads.map_or_else(|| "auto".to_string(), |t| t.to_string());
        [
            ("workers", self.workers.to_string()),
            ("backend", format!("{:?}", self.backend).to_lowercase()),
            ("matmul_precision", format!("{:?}", self.matmul_precision).to_lowercase()),
            ("jit", self.jit.to_string()),
            ("threads", threads),
            ("worker_batch_size", self.dispatcher.worker_batch_size.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Takes the settings of `env` that are not about the number of workers.
    pub fn apply(&mut self, env: &crate::config::EnvConfig) {
        self.dispatcher.worker_batch_size = env.worker_batch_size;
        self.dispatcher.max_message_bytes = env.max_message_bytes;
        self.dispatcher.client_memory = env.client_memory;
        self.dispatcher.client_credit = env.client_credit;
        self.dispatcher.client_unread_bytes = env.client_unread_bytes;
        self.dispatcher.spin = env.spin;
        self.instruction_log = env.instruction_log.clone();
        self.profile = env.profile.clone();
        self.backend = env.backend;
        self.matmul_precision = env.matmul_precision;
        self.jit = env.jit;
        self.worker_memory = env.worker_memory;
        self.threads = env.threads;
        self.collective_timeout = env.collective_timeout;
        self.op_timeout = env.op_timeout;
        self.insecure = env.insecure;
        self.lane = env.lane;
        let (passes, options, dump) = (env.passes.clone(), env.pass_options, env.dump_passes.clone());
        if !passes.is_empty() {
            self.dispatcher.pipeline = std::sync::Arc::new(move |client| {
                let mut p = gt_passes::registry::pipeline(&passes, &options).expect("names checked by EnvConfig");
                if let Some(dir) = &dump {
                    p.set_dump(crate::dispatcher::dump::hook(dir.clone(), format!("client-{client}")));
                }
                p
            });
        }
    }

    /// The monitor endpoints of a server on `host:port`: an IPC socket for this machine
    /// (`gt top -p PORT` finds it), and, when the server listens beyond the loopback,
    /// `tcp://HOST:MONITOR_PORT` for other machines (`gt top --host H -p PORT` looks at
    /// `PORT + 1`, the default).
    pub fn server_monitor(host: &str, port: u16, monitor_port: u16) -> Vec<Endpoint> {
        let mut endpoints = vec![Endpoint::Ipc(monitor_ipc_path(port))];
        if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
            let host = if matches!(host, "0.0.0.0" | "") { "*" } else { host };
            endpoints.push(Endpoint::Tcp { host: host.to_string(), port: monitor_port });
        }
        endpoints
    }
}

/// Why a cluster did not start.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// A socket could not be made or bound.
    #[error("cannot listen on {}: {source}", describe(endpoints))]
    Bind {
        /// Where (the endpoints of the one socket).
        endpoints: Vec<Endpoint>,
        /// Why.
        source: zmq::Error,
    },
    /// The instruction log could not be opened.
    // The cause is in the message (not a `source`), so a report of the chain says it once.
    #[error("cannot open the instruction log {path}: {error}")]
    Log {
        /// The path.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The profile folder could not be written.
    #[error("cannot write a profile into {path} (GT_PROFILE): {error}")]
    Profile {
        /// The folder.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The private directory for IPC sockets cannot be used.
    #[error(transparent)]
    RuntimeDir(#[from] RuntimeDirError),
    /// A socket file could not be made private.
    #[error("cannot make {path} private: {source}")]
    Private {
        /// The socket file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// The workers' backend cannot run here.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// Asked to listen beyond the loopback with no cluster key.
    #[error(
        "refusing to listen on {endpoint} without a cluster key: anyone who reaches it could run work and read data; \
         run `gt keygen` and start the server, workers and clients with `--key FILE` (or GT_KEY_FILE), \
         or pass --insecure (GT_INSECURE=1) on a network you trust"
    )]
    Insecure {
        /// The endpoint beyond the loopback.
        endpoint: Endpoint,
    },
}

/// A running dispatcher with its in-process workers. Dropping it shuts everything down.
pub struct Cluster {
    ctx: zmq::Context,
    endpoint: Endpoint,
    listen: Vec<Endpoint>,
    monitor: Vec<Endpoint>,
    control: zmq::Socket,
    stop_key: Vec<u8>,
    dispatcher: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    discovery: Option<PathBuf>,
}

/// The dispatcher thread's stack.
const DISPATCHER_STACK: usize = 64 << 20;

static NEXT_CLUSTER: AtomicU64 = AtomicU64::new(0);

impl Cluster {
    /// Starts a dispatcher (and workers) on a new ZeroMQ context.
    pub fn start(options: ClusterOptions) -> Result<Cluster, ClusterError> {
        Cluster::start_in(zmq::Context::new(), options)
    }

    /// Starts a dispatcher (and workers) on `ctx`; clients on `ctx` can use `inproc://`.
    pub fn start_in(ctx: zmq::Context, options: ClusterOptions) -> Result<Cluster, ClusterError> {
        if options.workers > 0 && options.backend != BackendKind::Cpu {
            // A backend that cannot start (no GPU) is an error now, not workers that never
            // register.
            drop(options.backend.start(0, 0, options.matmul_precision, false)?);
        }
        if options.key.is_none() && !options.insecure {
            let open = options.listen.iter().chain(&options.monitor).find(|e| beyond_loopback(e));
            if let Some(endpoint) = open {
                return Err(ClusterError::Insecure { endpoint: endpoint.clone() });
            }
        }
        let n = NEXT_CLUSTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let inproc = Endpoint::Inproc(format!("gt-dispatcher-{pid}-{n}"));
        let mut listen = options.listen.clone();
        if listen.iter().chain(&options.monitor).any(|e| e.ipc_file().is_some()) {
            // IPC sockets and discovery files live in this user's private directory.
            ensure_runtime_dir()?;
        }
        listen.push(inproc.clone());
        let bind_err = |endpoints: &[Endpoint]| {
            let endpoints = endpoints.to_vec();
            move |source| ClusterError::Bind { endpoints, source }
        };
        let key = options.key.as_ref();
        let router =
            socket::router(&ctx, &listen, options.dispatcher.max_message_bytes, key).map_err(bind_err(&listen))?;
        let stop_key = secret_key();
        let control = stop_socket(&ctx, &inproc, &stop_key).map_err(bind_err(std::slice::from_ref(&inproc)))?;
        let monitor = if options.monitor.is_empty() {
            None
        } else {
            Some(socket::monitor_publisher(&ctx, &options.monitor, key).map_err(bind_err(&options.monitor))?)
        };
        for path in options.listen.iter().chain(&options.monitor).filter_map(Endpoint::ipc_file) {
            make_private(path).map_err(|source| ClusterError::Private { path: path.to_path_buf(), source })?;
        }
        let log = EventLog::new(options.instruction_log.as_deref(), monitor)
            .map_err(|error| ClusterError::Log { path: options.instruction_log.clone().unwrap_or_default(), error })?;
        let mut config = options.dispatcher.clone();
        config.min_workers = config.min_workers.max(options.workers);
        let mut dispatcher = Dispatcher::new(router, stop_key.clone(), log, config)
            .with_context(ctx.clone())
            .with_key(options.key.clone());
        if let Some(dir) = &options.profile {
            let profiler = Profiler::create(dir, options.settings())
                .map_err(|error| ClusterError::Profile { path: dir.clone(), error })?;
            dispatcher = dispatcher.with_profile(profiler);
        }
        let handle = std::thread::Builder::new()
            .name("gt-dispatcher".into())
            // The passes' walks are bounded by their windows (GT_FUSE_WINDOW at most 4096);
            // this leaves them a wide margin (address space only until touched).
            .stack_size(DISPATCHER_STACK)
            .spawn(move || {
                if let Err(e) = dispatcher.run() {
                    tracing::error!(target: "gt::dispatcher", "dispatcher stopped: {e}");
                }
            })
            .map_err(ClusterError::Thread)?;
        let mut cluster = Cluster {
            ctx: ctx.clone(),
            endpoint: inproc.clone(),
            listen: options.listen.clone(),
            monitor: options.monitor.clone(),
            control,
            stop_key,
            dispatcher: Some(handle),
            workers: Vec::new(),
            discovery: None,
        };
        // The default budget is the process's: its workers share it (each taking all of it
        // would let N of them ask for N times the memory there is). Read once, not per worker.
        let worker_memory = if options.worker_memory == crate::config::default_worker_memory() {
            options.worker_memory / options.workers.max(1)
        } else {
            options.worker_memory
        };
        for i in 0..options.workers {
            let ctx = ctx.clone();
            let endpoint = inproc.clone();
            let mut wo = WorkerOptions::named(format!("worker-{i}"));
            wo.max_message_bytes = options.dispatcher.max_message_bytes;
            wo.backend = options.backend;
            wo.matmul_precision = options.matmul_precision;
            wo.jit = options.jit;
            wo.memory_budget = worker_memory;
            wo.collective_timeout = options.collective_timeout;
            wo.op_timeout = options.op_timeout;
            wo.spin = options.dispatcher.spin;
            wo.lane = options.lane;
            wo.key = options.key.clone();
            wo.threads = options.threads.unwrap_or_else(|| crate::config::cores_per_worker(options.workers));
            let h = std::thread::Builder::new()
                .name(format!("gt-worker-{i}"))
                .spawn(move || {
                    match run_worker(&ctx, &endpoint, &wo) {
                        // The dispatcher stopped first: a normal end in this process.
                        Ok(()) | Err(WorkerError::DispatcherGone(_)) => {}
                        Err(e) => tracing::error!(target: "gt::worker", "{} stopped: {e}", wo.name),
                    }
                })
                .map_err(ClusterError::Thread)?;
            cluster.workers.push(h);
        }
        if let Some(name) = &options.discovery_name {
            let path = discovery_path(name);
            let mut text = format!("pid={pid}\n");
            for e in &cluster.listen {
                text.push_str(&format!("endpoint={e}\n"));
            }
            for e in &cluster.monitor {
                text.push_str(&format!("monitor={e}\n"));
            }
            if write_private(&path, text.as_bytes()).is_ok() {
                cluster.discovery = Some(path);
            }
        }
        Ok(cluster)
    }

    /// The context to connect in-process clients on.
    pub fn context(&self) -> &zmq::Context {
        &self.ctx
    }

    /// The dispatcher's in-process endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The endpoints it listens on besides `inproc://`.
    pub fn listen(&self) -> &[Endpoint] {
        &self.listen
    }

    /// Where the monitor publishes.
    pub fn monitor(&self) -> &[Endpoint] {
        &self.monitor
    }

    /// Waits until the dispatcher stops (for `gt server`, which stops on a signal).
    pub fn wait(mut self) {
        if let Some(h) = self.dispatcher.take() {
            let _ = h.join();
        }
    }

    /// A handle that stops the dispatcher from another thread (a signal handler).
    pub fn stopper(&self) -> Stopper {
        Stopper { ctx: self.ctx.clone(), endpoint: self.endpoint.clone(), stop_key: self.stop_key.clone() }
    }

    fn stop(&mut self) {
        let _ = self.control.send("stop", zmq::DONTWAIT);
        if let Some(h) = self.dispatcher.take() {
            let _ = h.join();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        for e in self.listen.iter().chain(&self.monitor) {
            if let Some(p) = e.ipc_file() {
                let _ = std::fs::remove_file(p);
            }
        }
        if let Some(p) = self.discovery.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops a cluster's dispatcher from any thread.
#[derive(Clone)]
pub struct Stopper {
    ctx: zmq::Context,
    endpoint: Endpoint,
    stop_key: Vec<u8>,
}

impl Stopper {
    /// Asks the dispatcher to stop (its workers are told to shut down).
    pub fn stop(&self) {
        if let Ok(s) = stop_socket(&self.ctx, &self.endpoint, &self.stop_key) {
            let _ = s.send("stop", zmq::DONTWAIT);
        }
    }
}

/// A random key for stop requests (std's per-process random hash seeds; no crate needed).
fn secret_key() -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    let mut key = b"gt-stop-".to_vec();
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        key.extend_from_slice(&h.finish().to_le_bytes());
    }
    key
}

/// A DEALER whose routing id starts with the stop key (a unique suffix each, since a ROUTER
/// refuses a second peer with the same id).
fn stop_socket(ctx: &zmq::Context, endpoint: &Endpoint, key: &[u8]) -> zmq::Result<zmq::Socket> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let s = ctx.socket(zmq::DEALER)?;
    let mut id = key.to_vec();
    id.extend_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    s.set_identity(&id)?;
    s.set_linger(100)?;
    s.connect(&endpoint.zmq_address())?;
    Ok(s)
}

/// Whether `e` is TCP on an address other machines can reach (every interface included).
fn beyond_loopback(e: &Endpoint) -> bool {
    matches!(e, Endpoint::Tcp { host, .. } if !gt_transport::endpoint::is_loopback(host))
}

fn describe(eps: &[Endpoint]) -> String {
    eps.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", ")
}
