//! gt's errors as Python exceptions: `gt.GtError` (a `RuntimeError`) for failures of the
//! runtime, and `gt.GtValueError` (both a `GtError` and a `ValueError`) for bad arguments
//! found on the client (shapes, axes, dtypes), each carrying gt's own message.

use crate::runtime::StartError;
use gt_frontend::TensorError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes `gt/__init__.py` defines and hands over at import.
static CLASSES: PyOnceLock<(Py<PyType>, Py<PyType>)> = PyOnceLock::new();

/// `_gt._register_errors(GtError, GtValueError)`.
#[pyfunction]
pub fn _register_errors(py: Python<'_>, runtime: Bound<'_, PyType>, value: Bound<'_, PyType>) {
    let _ = CLASSES.set(py, (runtime.unbind(), value.unbind()));
}

/// A `gt.GtError` with this message.
pub fn runtime_error(message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some((runtime, _)) => PyErr::from_type(runtime.bind(py).clone(), message),
        None => PyRuntimeError::new_err(message),
    })
}

/// A `gt.GtValueError` with this message.
pub fn value_error(message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some((_, value)) => PyErr::from_type(value.bind(py).clone(), message),
        None => PyValueError::new_err(message),
    })
}

/// A tensor error as the exception a Python user expects.
pub fn tensor_error(e: TensorError) -> PyErr {
    match e {
        TensorError::Type { .. } | TensorError::Invalid { .. } => value_error(e.to_string()),
        TensorError::Exec { .. } | TensorError::NoRuntime | TensorError::Closed => runtime_error(e.to_string()),
    }
}

/// A start error as `gt.GtError` (or `GtValueError` for bad calls).
pub fn start_error(e: StartError) -> PyErr {
    match e {
        StartError::NoWorkers(_) => value_error(e.to_string()),
        _ => runtime_error(e.to_string()),
    }
}

/// `?` on gt results inside Python-facing functions.
pub trait OrRaise<T> {
    /// The value, or the Python exception for the error.
    fn py(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, TensorError> {
    fn py(self) -> PyResult<T> {
        self.map_err(tensor_error)
    }
}

impl<T> OrRaise<T> for Result<T, StartError> {
    fn py(self) -> PyResult<T> {
        self.map_err(start_error)
    }
}
