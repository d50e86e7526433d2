//! `gt.signal`, `gt.load_config` and `gt.debug`'s Rust side: signal scopes on the thread's
//! context, the process's signal config, the autograd tape and worker statistics.

use crate::convert::{dtype_from, dtype_name};
use crate::errors::{runtime_error, value_error, OrRaise};
use crate::owned::Owned;
use crate::runtime;
use crate::tensor::PyTensor;
use gt_frontend::config::{Config, ShardConfig, SignalConfig};
use gt_frontend::signal;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An open signal scope (`gt.signal.context`, `enter`/`exit`).
#[pyclass(module = "gt._gt")]
pub struct SignalScope {
    guard: Owned<Option<signal::SignalGuard>>,
    name: String,
}

#[pymethods]
impl SignalScope {
    #[new]
    #[pyo3(signature = (name, backward=None))]
    fn new(name: String, backward: Option<String>) -> PyResult<SignalScope> {
        runtime::context().py()?;
        let guard = match backward {
            Some(b) => signal::context_with_backward(&name, Some(&b)),
            None => signal::context(&name),
        }
        .py()?;
        Ok(SignalScope { guard: Owned::new(Some(guard), "signal scope"), name })
    }

    /// Closes the scope (and any still open inside it).
    fn close(&mut self) -> PyResult<()> {
        match self.guard.get_mut()?.take() {
            Some(g) => g.close().py(),
            None => Ok(()),
        }
    }

    /// The signal's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
}

/// `gt.signal.tensor(t, name)`: a copy of `t` made inside signal `name`.
#[pyfunction]
pub fn _signal_tensor(t: PyRef<'_, PyTensor>, name: &str) -> PyResult<PyTensor> {
    signal::tensor(t.rs()?, name).py().map(PyTensor::new)
}

/// The open signals of this thread, outermost first.
#[pyfunction]
pub fn _signal_stack() -> Vec<String> {
    signal::stack()
}

/// The innermost open signal and its backward signal.
#[pyfunction]
pub fn _signal_current() -> Option<(String, Option<String>)> {
    signal::current().map(|s| (s.name.clone(), s.backward.clone()))
}

/// One signal's config as Python sees it: `(shard, backward, compile, dtype)` with `shard`
/// `(axis, workers, replicated)` or `None`.
type ConfigTuple = (Option<(i64, Option<Vec<usize>>, bool)>, Option<String>, bool, Option<String>);

fn to_tuple(c: &SignalConfig) -> ConfigTuple {
    (
        c.shard.as_ref().map(|s| (s.axis, s.workers.clone(), s.replicated)),
        c.backward.clone(),
        c.compile,
        c.dtype.map(|d| dtype_name(d).to_string()),
    )
}

fn signals(config: &Config) -> Vec<(String, ConfigTuple)> {
    config.signals().map(|(name, c)| (name.to_string(), to_tuple(c))).collect()
}

/// `gt.load_config(path)`: the process's config from a YAML file (a bad file raises
/// `GtValueError` naming its line and field).
#[pyfunction]
pub fn _load_config(path: std::path::PathBuf) -> PyResult<Vec<(String, ConfigTuple)>> {
    let config = Config::load(&path).map_err(|e| value_error(e.to_string()))?;
    let out = signals(&config);
    runtime::set_config(config);
    Ok(out)
}

/// The process's config.
#[pyfunction]
pub fn _config_signals() -> Vec<(String, ConfigTuple)> {
    signals(&runtime::config())
}

/// Forgets every signal's config.
#[pyfunction]
pub fn _clear_config() {
    runtime::set_config(Config::new());
}

/// `gt.register_config(name, SignalConfig(...))`.
#[pyfunction]
#[pyo3(signature = (name, shard, backward, compile, dtype))]
pub fn _register_config(
    name: &str,
    shard: Option<(i64, Option<Vec<usize>>, bool)>,
    backward: Option<String>,
    compile: bool,
    dtype: Option<String>,
) -> PyResult<()> {
    let dtype = dtype.map(|d| dtype_from(&d)).transpose()?;
    let shard = shard.map(|(axis, workers, replicated)| ShardConfig { axis, workers, replicated });
    runtime::register_config(name, SignalConfig { shard, backward, compile, dtype });
    Ok(())
}

/// The autograd tape of this thread, as the Python GT's `gt.debug.get_tape()` lists it.
#[pyfunction]
pub fn _get_tape(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    runtime::context().py()?;
    gt_frontend::debug::get_tape()
        .py()?
        .into_iter()
        .map(|e| {
            let d = PyDict::new(py);
            d.set_item("output_id", e.output.index())?;
            d.set_item("output_shape", e.ty.shape.dims().to_vec())?;
            d.set_item("dtype", dtype_name(e.ty.dtype))?;
            d.set_item("input_ids", e.inputs.iter().map(|v| v.index()).collect::<Vec<_>>())?;
            d.set_item("grad_fn", e.op)?;
            d.set_item("requires_grad", true)?;
            Ok(d)
        })
        .collect()
}

/// The tape as text.
#[pyfunction]
pub fn _format_tape() -> PyResult<String> {
    runtime::context().py()?;
    Ok(gt_frontend::debug::format_tape(&gt_frontend::debug::get_tape().py()?))
}

/// Every worker's statistics: `{name: {backend, instructions, ..., operations: {op: {count,
/// total_ms}}}}`.
#[pyfunction]
pub fn _worker_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let stats = runtime::worker_stats().map_err(|e| runtime_error(format!("{e:#}")))?.unwrap_or_default();
    let out = PyDict::new(py);
    for w in stats {
        let d = PyDict::new(py);
        d.set_item("backend", &w.backend)?;
        d.set_item("instructions", w.instructions)?;
        d.set_item("batches", w.batches)?;
        d.set_item("failures", w.failures)?;
        d.set_item("reads", w.reads)?;
        d.set_item("live_values", w.live_values)?;
        d.set_item("live_bytes", w.live_bytes)?;
        d.set_item("peak_bytes", w.peak_bytes)?;
        let ops = PyDict::new(py);
        for o in &w.ops {
            let od = PyDict::new(py);
            od.set_item("count", o.count)?;
            od.set_item("total_ms", o.nanos as f64 / 1e6)?;
            ops.set_item(&o.op, od)?;
        }
        let totals = PyDict::new(py);
        totals.set_item("total", w.instructions)?;
        d.set_item("operations", totals)?;
        d.set_item("ops", ops)?;
        out.set_item(&w.name, d)?;
    }
    Ok(out)
}

/// The worker statistics as the `gt-run --worker-stats` table.
#[pyfunction]
pub fn _format_worker_stats() -> PyResult<String> {
    let stats = runtime::worker_stats().map_err(|e| runtime_error(format!("{e:#}")))?.unwrap_or_default();
    Ok(gt::session::format_worker_stats(&stats))
}
