//! `gt.nn`'s Rust side: the optimizers (`SGD`, `Adam`) over the Rust ones, `Linear`'s
//! initial weights, and the losses and functions of `gt_frontend::nn`.

use crate::errors::OrRaise;
use crate::owned::Owned;
use crate::tensor::{size_arg, PyTensor};
use gt_frontend::nn::{self, Optimizer};
use gt_frontend::Tensor;
use pyo3::prelude::*;

fn tensors(params: &Bound<'_, PyAny>) -> PyResult<Vec<Tensor>> {
    params.try_iter()?.map(|p| Ok(p?.cast::<PyTensor>()?.borrow().rs()?.clone())).collect()
}

/// Stochastic gradient descent (`p -= lr * g`, with optional momentum and weight decay,
/// PyTorch's rules).
#[pyclass(name = "SGD", module = "gt.nn")]
pub struct PySgd {
    inner: Owned<nn::Sgd>,
}

#[pymethods]
impl PySgd {
    #[new]
    #[pyo3(signature = (params, lr=0.01, momentum=0.0, weight_decay=0.0))]
    fn new(params: &Bound<'_, PyAny>, lr: f64, momentum: f64, weight_decay: f64) -> PyResult<PySgd> {
        let inner = nn::Sgd::new(tensors(params)?, lr).with_momentum(momentum).with_weight_decay(weight_decay);
        Ok(PySgd { inner: Owned::new(inner, "optimizer") })
    }

    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> PyResult<()> {
        self.inner.get_mut()?.step().py()
    }

    /// Forgets every parameter's gradient.
    fn zero_grad(&self) -> PyResult<()> {
        self.inner.get()?.zero_grad();
        Ok(())
    }

    /// The learning rate.
    #[getter]
    fn get_lr(&self) -> PyResult<f64> {
        Ok(self.inner.get()?.lr)
    }

    #[setter]
    fn set_lr(&mut self, lr: f64) -> PyResult<()> {
        self.inner.get_mut()?.lr = lr;
        Ok(())
    }
}

/// Adam (PyTorch's rules; betas (0.9, 0.999), eps 1e-8 by default).
#[pyclass(name = "Adam", module = "gt.nn")]
pub struct PyAdam {
    inner: Owned<nn::Adam>,
}

#[pymethods]
impl PyAdam {
    #[new]
    #[pyo3(signature = (params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8))]
    fn new(params: &Bound<'_, PyAny>, lr: f64, betas: (f64, f64), eps: f64) -> PyResult<PyAdam> {
        let mut inner = nn::Adam::new(tensors(params)?, lr);
        inner.betas = betas;
        inner.eps = eps;
        Ok(PyAdam { inner: Owned::new(inner, "optimizer") })
    }

    /// One update of every parameter that has a gradient.
    fn step(&mut self) -> PyResult<()> {
        self.inner.get_mut()?.step().py()
    }

    /// Forgets every parameter's gradient.
    fn zero_grad(&self) -> PyResult<()> {
        self.inner.get()?.zero_grad();
        Ok(())
    }

    /// The learning rate.
    #[getter]
    fn get_lr(&self) -> PyResult<f64> {
        Ok(self.inner.get()?.lr)
    }

    #[setter]
    fn set_lr(&mut self, lr: f64) -> PyResult<()> {
        self.inner.get_mut()?.lr = lr;
        Ok(())
    }
}

/// `Linear`'s parameters: weight `[in, out]` and bias `[out]`, uniform in `±1/sqrt(in)`.
#[pyfunction]
pub fn _linear_init(
    inputs: &Bound<'_, PyAny>,
    outputs: &Bound<'_, PyAny>,
    bias: bool,
) -> PyResult<(PyTensor, Option<PyTensor>)> {
    let inputs = size_arg("Linear: in_features", inputs, 0)?;
    let outputs = size_arg("Linear: out_features", outputs, 0)?;
    crate::runtime::context().py()?;
    let l = nn::Linear::with_bias(inputs, outputs, bias).py()?;
    Ok((PyTensor::new(l.weight), l.bias.map(PyTensor::new)))
}

/// Mean squared error.
#[pyfunction]
pub fn mse_loss(prediction: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    nn::mse_loss(prediction.rs()?, target.rs()?).py().map(PyTensor::new)
}

/// Binary cross-entropy of probabilities.
#[pyfunction]
pub fn binary_cross_entropy(p: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    nn::binary_cross_entropy(p.rs()?, target.rs()?).py().map(PyTensor::new)
}

/// Binary cross-entropy of `sigmoid(logits)`, computed stably.
#[pyfunction]
pub fn binary_cross_entropy_with_logits(
    logits: PyRef<'_, PyTensor>,
    target: PyRef<'_, PyTensor>,
) -> PyResult<PyTensor> {
    nn::binary_cross_entropy_with_logits(logits.rs()?, target.rs()?).py().map(PyTensor::new)
}

/// Softmax cross-entropy of `[N, C]` logits against `[N, C]` target probabilities.
#[pyfunction]
pub fn _cross_entropy(logits: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    nn::cross_entropy(logits.rs()?, target.rs()?).py().map(PyTensor::new)
}

/// Rows of `classes` values, 1 at each label.
#[pyfunction]
pub fn _one_hot(labels: Vec<usize>, classes: usize) -> PyResult<PyTensor> {
    crate::runtime::context().py()?;
    nn::one_hot(&labels, classes).py().map(PyTensor::new)
}

/// Layer normalisation over the last `axes` axes together (no learned scale).
#[pyfunction]
#[pyo3(signature = (x, eps, axes = 1))]
pub fn _layer_norm(x: PyRef<'_, PyTensor>, eps: f64, axes: usize) -> PyResult<PyTensor> {
    nn::layer_norm_over(x.rs()?, axes, eps).py().map(PyTensor::new)
}

/// GELU: exact (`approximate="none"`, PyTorch's default) or its tanh approximation
/// (`approximate="tanh"`).
#[pyfunction]
#[pyo3(signature = (x, approximate = "none"))]
pub fn gelu(x: PyRef<'_, PyTensor>, approximate: &str) -> PyResult<PyTensor> {
    let f = match approximate {
        "none" => nn::gelu,
        "tanh" => nn::gelu_tanh,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "gelu: approximate must be 'none' or 'tanh', not {other:?}"
            )))
        }
    };
    f(x.rs()?).py().map(PyTensor::new)
}
