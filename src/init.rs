//! Starting the Tensor API: a [`Runtime`] opens an embedded cluster, a connection to a
//! dispatcher, or the reference interpreter, and makes it the thread's current context
//! (what `gt::randn`, `gt::zeros`, ... use) until it is dropped.

use crate::session::{Session, Target};
use gt_frontend::tensor::{Context, ContextGuard};
use gt_frontend::TensorError;
use gt_runtime::config::EnvConfig;
use gt_runtime::{Cluster, Interpreter};
use std::rc::Rc;

/// A running gt for this thread's tensors. Dropping it closes the client (its pending
/// instructions are sent first) and stops an embedded cluster; tensors that outlive it fail
/// with "shut down" errors.
pub struct Runtime {
    // Field order is drop order: the context (and its client) goes before the cluster.
    guard: Option<ContextGuard>,
    context: Rc<Context>,
    cluster: Option<Cluster>,
}

impl Runtime {
    /// From the environment: `GT_CONNECT=HOST:PORT` connects to a `gt server`; otherwise an
    /// embedded cluster with `GT_WORKERS` workers (default 1). Other `GT_*` settings apply.
    pub fn init() -> anyhow::Result<Runtime> {
        match std::env::var("GT_CONNECT") {
            Ok(address) if !address.trim().is_empty() => Runtime::connect(address.trim()),
            _ => Runtime::open(&Target::Embedded { workers: None }),
        }
    }

    /// An embedded cluster (dispatcher and `workers` worker threads in this process).
    pub fn embedded(workers: usize) -> anyhow::Result<Runtime> {
        Runtime::open(&Target::Embedded { workers: Some(workers) })
    }

    /// A connection to a dispatcher (`HOST:PORT` or an endpoint URL).
    pub fn connect(address: &str) -> anyhow::Result<Runtime> {
        Runtime::open(&Target::Remote(address.to_string()))
    }

    fn open(target: &Target) -> anyhow::Result<Runtime> {
        load_signal_config()?;
        let (client, cluster) = Session::open_with(target, "tensor-api", &EnvConfig::from_env()?)?.into_parts();
        Ok(Runtime::install(Context::new(client), cluster))
    }

    /// The reference interpreter on this thread: no dispatcher, no threads, every op run
    /// at once (for tests and gradient checks).
    pub fn reference() -> Runtime {
        Runtime::install(Context::new(Interpreter::new()), None)
    }

    fn install(context: Rc<Context>, cluster: Option<Cluster>) -> Runtime {
        Runtime { guard: Some(context.install()), context, cluster }
    }

    /// The context its tensors run on.
    pub fn context(&self) -> &Rc<Context> {
        &self.context
    }

    /// Every worker's statistics (values held, op counts), when connected to a dispatcher
    /// (`None` on the reference interpreter).
    pub fn worker_stats(&self) -> Option<anyhow::Result<Vec<gt_transport::WorkerStats>>> {
        self.context.with_executor(|c: &mut gt_frontend::Client| c.worker_stats().map_err(anyhow::Error::from))
    }

    /// Waits until every queued op has run; reports any failure.
    pub fn sync(&self) -> Result<(), TensorError> {
        self.context.sync()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.guard.take();
        self.context.close();
        self.cluster.take();
    }
}

/// Loads the signal config `GT_CONFIG` names, if any, as this thread's (a bad file is an
/// error naming its line and field).
pub fn load_signal_config() -> anyhow::Result<()> {
    if let Some(config) = gt_frontend::config::Config::from_env()? {
        gt_frontend::signal::set_config(config);
    }
    Ok(())
}

/// [`Runtime::init`]: `let _gt = gt::init()?;` at the top of `main`.
pub fn init() -> anyhow::Result<Runtime> {
    Runtime::init()
}
