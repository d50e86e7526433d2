//! Where a Python process's tensors run: one embedded cluster (or one remote dispatcher) per
//! process, started on first use, and one client per Python thread, so that threads issue
//! their ops in parallel instead of under one lock as the Python GT does.

use gt::session::{client_options, cluster_key};
use gt_frontend::config::{Config, SignalConfig};
use gt_frontend::tensor::Context;
use gt_frontend::Client;
use gt_runtime::config::EnvConfig;
use gt_runtime::{Cluster, ClusterOptions};
use gt_transport::Endpoint;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Why the runtime could not start or a thread could not join it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `connect` or `gpu_workers` after the runtime started.
    #[error("{what}: gt already started in this process ({how}); call it before the first tensor op")]
    AlreadyStarted {
        /// The call.
        what: &'static str,
        /// How it started.
        how: String,
    },
    /// A bad setting, a dispatcher that does not answer, a worker that does not start.
    #[error("cannot start gt: {0:#}")]
    Start(anyhow::Error),
    /// `gpu_workers(0)`.
    #[error("gpu_workers({0}): give at least 1 worker")]
    NoWorkers(usize),
    /// The runtime was shut down (interpreter exit).
    #[error("gt was shut down in this process")]
    ShutDown,
}

/// Where this process's clients connect.
enum Target {
    /// The embedded cluster in this process.
    Embedded {
        /// The cluster.
        cluster: Cluster,
        /// Its workers.
        workers: usize,
    },
    /// A `gt server` (`gt.connect`, or `GT_CONNECT`).
    Remote { address: String, endpoint: Endpoint },
}

struct Shared {
    target: Option<Target>,
    /// Workers to start (`gt.gpu_workers(n)`); `None`: `GT_WORKERS`, else 1.
    workers: Option<usize>,
    shut_down: bool,
    /// The process's signal config (`GT_CONFIG`, `gt.load_config`, `gt.register_config`):
    /// Rust keeps one per thread, Python users expect one per process.
    config: Config,
}

static SHARED: Mutex<Shared> =
    Mutex::new(Shared { target: None, workers: None, shut_down: false, config: Config::new() });
/// Bumped when the process's config changes; each thread copies it when it sees a new one.
static CONFIG_GENERATION: AtomicU64 = AtomicU64::new(0);
/// Threads holding a client (the cluster is stopped at exit only when none is left).
static LIVE_THREADS: AtomicUsize = AtomicUsize::new(0);

struct ThreadRuntime {
    context: Rc<Context>,
    config_generation: u64,
}

impl Drop for ThreadRuntime {
    fn drop(&mut self) {
        // The thread ends: its client flushes and says goodbye.
        self.context.close();
        LIVE_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
}

thread_local! {
    static THREAD: RefCell<Option<ThreadRuntime>> = const { RefCell::new(None) };
}

fn shared() -> std::sync::MutexGuard<'static, Shared> {
    // A panic while holding the lock leaves plain data behind: keep using it.
    SHARED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The context of this thread's tensors, connecting this thread (and starting the process's
/// runtime) first if needed.
pub fn context() -> Result<Rc<Context>, StartError> {
    let generation = CONFIG_GENERATION.load(Ordering::Acquire);
    let ready = THREAD.with(|t| {
        let mut t = t.borrow_mut();
        let rt = t.as_mut()?;
        if rt.context.is_closed() {
            return None;
        }
        if rt.config_generation != generation {
            gt_frontend::signal::set_config(shared().config.clone());
            rt.config_generation = generation;
        }
        Some(rt.context.clone())
    });
    match ready {
        Some(c) => Ok(c),
        None => join(),
    }
}

fn env() -> Result<EnvConfig, StartError> {
    EnvConfig::from_env().map_err(|e| StartError::Start(e.into()))
}

fn start(s: &mut Shared, env: &EnvConfig) -> Result<(), StartError> {
    if s.shut_down {
        return Err(StartError::ShutDown);
    }
    if s.target.is_some() {
        return Ok(());
    }
    // GT_CONFIG is the process's config from the start (a bad file names its line).
    if let Some(config) = Config::from_env().map_err(|e| StartError::Start(e.into()))? {
        s.config = config;
        CONFIG_GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    let target = match std::env::var("GT_CONNECT") {
        Ok(address) if !address.trim().is_empty() => remote(address.trim())?,
        _ => {
            let mut options = ClusterOptions::from_config(env);
            if let Some(n) = s.workers {
                options.workers = n;
            }
            let workers = options.workers;
            let cluster = Cluster::start(options).map_err(|e| StartError::Start(e.into()))?;
            Target::Embedded { cluster, workers }
        }
    };
    s.target = Some(target);
    Ok(())
}

fn remote(address: &str) -> Result<Target, StartError> {
    let endpoint = Endpoint::parse(address).map_err(|e| StartError::Start(e.into()))?;
    Ok(Target::Remote { address: address.to_string(), endpoint })
}

/// Connects this thread: a client of the process's cluster or dispatcher.
fn join() -> Result<Rc<Context>, StartError> {
    let env = env()?;
    let client = {
        let mut s = shared();
        start(&mut s, &env)?;
        let name = format!("python-{}", std::process::id());
        let options = client_options(&name, &env).map_err(StartError::Start)?;
        let client = match s.target.as_ref().expect("started above") {
            Target::Embedded { cluster, .. } => Client::connect_in(cluster.context(), cluster.endpoint(), options),
            Target::Remote { endpoint, .. } => {
                let key = cluster_key(&env).map_err(StartError::Start)?;
                Client::connect(endpoint, gt_frontend::ClientOptions { key, ..options })
            }
        };
        gt_frontend::signal::set_config(s.config.clone());
        client.map_err(|e| StartError::Start(e.into()))?
    };
    let context = Context::new(client);
    // The thread's current context for good: `gt_frontend`'s free functions use it.
    std::mem::forget(context.install());
    let generation = CONFIG_GENERATION.load(Ordering::Acquire);
    LIVE_THREADS.fetch_add(1, Ordering::SeqCst);
    THREAD.with(|t| *t.borrow_mut() = Some(ThreadRuntime { context: context.clone(), config_generation: generation }));
    Ok(context)
}

/// `gt.connect("host:port")`: this process's clients use that dispatcher.
pub fn connect(address: &str) -> Result<(), StartError> {
    {
        let mut s = shared();
        if let Some(t) = &s.target {
            return Err(StartError::AlreadyStarted { what: "connect", how: describe(t) });
        }
        if let Some(config) = Config::from_env().map_err(|e| StartError::Start(e.into()))? {
            s.config = config;
            CONFIG_GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        s.target = Some(remote(address)?);
    }
    // Connect this thread now, so that a dispatcher that is not there is an error here.
    if let Err(e) = context() {
        shared().target = None;
        return Err(e);
    }
    Ok(())
}

fn describe(t: &Target) -> String {
    match t {
        Target::Embedded { workers, .. } => format!("an embedded cluster of {workers} worker(s)"),
        Target::Remote { address, .. } => format!("connected to {address}"),
    }
}

/// `gt.gpu_workers(n)`: the embedded cluster's size, before it starts.
pub fn set_workers(n: usize) -> Result<(), StartError> {
    if n == 0 {
        return Err(StartError::NoWorkers(n));
    }
    let mut s = shared();
    if let Some(t) = &s.target {
        return Err(StartError::AlreadyStarted { what: "gpu_workers", how: describe(t) });
    }
    s.workers = Some(n);
    Ok(())
}

/// What the process runs on, for `repr`s and errors.
pub fn description() -> Option<String> {
    shared().target.as_ref().map(describe)
}

/// Interpreter exit: this thread's client flushes and leaves; the embedded cluster stops
/// when no other thread holds a client (otherwise the process's end stops it).
pub fn shutdown() {
    THREAD.with(|t| drop(t.borrow_mut().take()));
    let mut s = shared();
    s.shut_down = true;
    if LIVE_THREADS.load(Ordering::SeqCst) == 0 {
        drop(s.target.take());
    } else if let Some(t) = s.target.take() {
        // Another thread's client still holds the cluster's sockets: stopping it could wait
        // on them, and the process is ending anyway.
        std::mem::forget(t);
    }
}

/// The process's signal config.
pub fn config() -> Config {
    shared().config.clone()
}

/// Replaces the process's signal config.
pub fn set_config(config: Config) {
    shared().config = config;
    CONFIG_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Adds or replaces one signal's config in the process's.
pub fn register_config(name: &str, config: SignalConfig) {
    shared().config.insert(name, config);
    CONFIG_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Worker statistics from this thread's client.
pub fn worker_stats() -> Result<Option<Vec<gt_transport::WorkerStats>>, anyhow::Error> {
    let ctx = context()?;
    ctx.with_executor(|c: &mut Client| c.worker_stats().map_err(anyhow::Error::from)).transpose()
}
