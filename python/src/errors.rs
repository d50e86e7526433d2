//! gt's errors as Python exceptions: `gt.GtError` (a `RuntimeError`) for failures of the
//! runtime, `gt.GtValueError` (both a `GtError` and a `ValueError`) for bad arguments
//! found on the client (shapes, axes, dtypes), and `gt.GtIndexError` (a `GtValueError` and
//! an `IndexError`) for an index out of range, each carrying gt's own message (said in
//! Python's terms where the Rust frontend's names a Rust call).

use crate::runtime::StartError;
use gt_frontend::tensor::Misuse;
use gt_frontend::TensorError;
use gt_ir::TypeError;
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes `gt/__init__.py` defines and hands over at import.
struct Classes {
    runtime: Py<PyType>,
    value: Py<PyType>,
    index: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// `_gt._register_errors(GtError, GtValueError, GtIndexError)`.
#[pyfunction]
pub fn _register_errors(
    py: Python<'_>,
    runtime: Bound<'_, PyType>,
    value: Bound<'_, PyType>,
    index: Bound<'_, PyType>,
) {
    let _ = CLASSES.set(py, Classes { runtime: runtime.unbind(), value: value.unbind(), index: index.unbind() });
}

/// A `gt.GtError` with this message.
pub fn runtime_error(message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some(c) => PyErr::from_type(c.runtime.bind(py).clone(), message),
        None => PyRuntimeError::new_err(message),
    })
}

/// A `gt.GtValueError` with this message.
pub fn value_error(message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some(c) => PyErr::from_type(c.value.bind(py).clone(), message),
        None => PyValueError::new_err(message),
    })
}

/// A `gt.GtIndexError` with this message: an `IndexError`, as NumPy and PyTorch raise for an
/// index out of range, and a `GtValueError`, as gt raised before.
pub fn index_error(message: String) -> PyErr {
    Python::attach(|py| match CLASSES.get(py) {
        Some(c) => PyErr::from_type(c.index.bind(py).clone(), message),
        None => PyIndexError::new_err(message),
    })
}

/// A tensor error as the exception a Python user expects.
pub fn tensor_error(e: TensorError) -> PyErr {
    match e {
        TensorError::Type { source: TypeError::SliceIndex { .. }, .. } => index_error(e.to_string()),
        TensorError::Invalid { op, misuse } => value_error(format!("{op}: {}", python_words(misuse))),
        TensorError::Type { .. } => value_error(e.to_string()),
        TensorError::NoRuntime => {
            runtime_error("no gt runtime on this thread: it has not started, or was shut down at exit".into())
        }
        TensorError::Exec { .. } | TensorError::Closed => runtime_error(e.to_string()),
    }
}

/// A misuse's message, with the Python spelling where the frontend's names Rust code.
fn python_words(misuse: Misuse) -> String {
    match misuse {
        Misuse::UpdateRequiresGrad => "the update requires grad, and an in-place update cannot carry a gradient: \
                                       write `x = x + y` (or update inside `with gt.no_grad():`)"
            .into(),
        Misuse::InPlaceWithGrad => "a tensor that requires grad can only be updated in place inside \
                                    `with gt.no_grad():` (as optimizers do)"
            .into(),
        Misuse::LossNotScalar { numel, ty } => {
            format!("the loss must have one element, not {numel} ({ty}); use backward(gradient) otherwise")
        }
        other => other.to_string(),
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
