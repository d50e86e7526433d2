//! `gt._gt`: the extension module behind `import gt` (PyO3). It binds the Rust frontend (the
//! Tensor API, autograd, `nn`, signals) and runtime: the pure-Python parts in `python/gt/`
//! shape the Python GT's API around it.

/// gt's allocator (`gt::Allocator`) for everything the extension allocates, as in gt's
/// binaries: large tensors reuse freed memory instead of faulting fresh pages in.
#[global_allocator]
static GLOBAL: gt::Allocator = gt::Allocator;

mod bench;
mod convert;
mod errors;
mod nn;
mod owned;
mod runtime;
mod signal;
mod tensor;

use errors::OrRaise;
use pyo3::prelude::*;

/// A dtype argument as its canonical name: `gt.float32`/`"float32"`, `"f32"`, NumPy dtypes
/// and scalar types (`np.float16`), PyTorch-style aliases (`"float"`, `"long"`, ...).
pub(crate) fn dtype_arg(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    if dtype.is_none() {
        return Err(pyo3::exceptions::PyTypeError::new_err("a dtype is needed, got None"));
    }
    if let Ok(s) = dtype.extract::<String>() {
        let s = s.strip_prefix("torch.").unwrap_or(&s).to_string();
        let canonical = match s.as_str() {
            "float" | "f32" => "float32",
            "double" | "f64" => "float64",
            "half" | "f16" => "float16",
            "bf16" => "bfloat16",
            "int" | "i32" => "int32",
            "long" | "i64" => "int64",
            other => other,
        };
        return Ok(canonical.to_string());
    }
    if dtype.is(py.get_type::<pyo3::types::PyBool>()) {
        return Ok("bool".into());
    }
    if dtype.is(py.get_type::<pyo3::types::PyFloat>()) {
        return Ok("float32".into());
    }
    if dtype.is(py.get_type::<pyo3::types::PyInt>()) {
        return Ok("int64".into());
    }
    // A NumPy dtype or scalar type.
    let name = py.import("numpy")?.call_method1("dtype", (dtype,))?.getattr("name")?.extract::<String>()?;
    Ok(name)
}

/// `gt._dtype`'s core: any spelling of a dtype as its canonical name (not checked).
#[pyfunction]
fn _dtype_name(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    dtype_arg(py, dtype)
}

/// `gt.connect("host:port")`: this process's tensors run on that `gt server` (call it before
/// the first tensor op).
#[pyfunction]
fn connect(address: &str) -> PyResult<()> {
    runtime::connect(address).py()
}

/// `gt.gpu_workers(n)`: the embedded cluster starts `n` workers (call it before the first
/// tensor op).
#[pyfunction]
fn gpu_workers(n: usize) -> PyResult<()> {
    runtime::set_workers(n).py()
}

/// What this process runs on (`None` before the first op).
#[pyfunction]
fn _runtime() -> Option<String> {
    runtime::description()
}

/// Interpreter exit: flush this thread's client and stop the embedded cluster.
#[pyfunction]
fn _shutdown(py: Python<'_>) {
    py.detach(runtime::shutdown);
}

/// `gt.server`, `gt.worker`, `gt.scripts`: the `gt` binary's command line on `argv` (the first
/// item is the program name), run by the same library code, with the GIL released; gives
/// the exit code.
#[pyfunction]
fn _cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(move || gt::cli::run(argv))
}

#[pymodule]
fn _gt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<tensor::NoGrad>()?;
    m.add_class::<tensor::Autocast>()?;
    m.add_class::<nn::PySgd>()?;
    m.add_class::<nn::PyAdam>()?;
    m.add_class::<signal::SignalScope>()?;
    m.add_function(wrap_pyfunction!(errors::_register_errors, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::_register_as_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(_dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_workers, m)?)?;
    m.add_function(wrap_pyfunction!(_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(_cli, m)?)?;
    for f in [
        wrap_pyfunction!(tensor::_from_array, m)?,
        wrap_pyfunction!(tensor::_randn, m)?,
        wrap_pyfunction!(tensor::_rand, m)?,
        wrap_pyfunction!(tensor::_full, m)?,
        wrap_pyfunction!(tensor::_arange, m)?,
        wrap_pyfunction!(tensor::_cat, m)?,
        wrap_pyfunction!(tensor::where_, m)?,
        wrap_pyfunction!(tensor::manual_seed, m)?,
        wrap_pyfunction!(tensor::is_grad_enabled, m)?,
        wrap_pyfunction!(tensor::synchronize, m)?,
        wrap_pyfunction!(nn::_linear_init, m)?,
        wrap_pyfunction!(nn::mse_loss, m)?,
        wrap_pyfunction!(nn::binary_cross_entropy, m)?,
        wrap_pyfunction!(nn::binary_cross_entropy_with_logits, m)?,
        wrap_pyfunction!(nn::_cross_entropy, m)?,
        wrap_pyfunction!(nn::_one_hot, m)?,
        wrap_pyfunction!(nn::_layer_norm, m)?,
        wrap_pyfunction!(nn::gelu, m)?,
        wrap_pyfunction!(signal::_signal_tensor, m)?,
        wrap_pyfunction!(signal::_signal_stack, m)?,
        wrap_pyfunction!(signal::_signal_current, m)?,
        wrap_pyfunction!(signal::_load_config, m)?,
        wrap_pyfunction!(signal::_config_signals, m)?,
        wrap_pyfunction!(signal::_clear_config, m)?,
        wrap_pyfunction!(signal::_register_config, m)?,
        wrap_pyfunction!(signal::_get_tape, m)?,
        wrap_pyfunction!(signal::_format_tape, m)?,
        wrap_pyfunction!(signal::_worker_stats, m)?,
        wrap_pyfunction!(signal::_format_worker_stats, m)?,
        wrap_pyfunction!(bench::_bench_rust_issue, m)?,
        wrap_pyfunction!(bench::_bench_rust_round_trip, m)?,
        wrap_pyfunction!(bench::_bench_rust_mlp, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
