//! The Rust API's side of `bench/python/bench.py`: the same loops as the Python ones, run
//! through the Rust Tensor API on this thread's client, so that one run measures both and
//! the difference is what Python adds.

use crate::errors::OrRaise;
use crate::runtime;
use gt_frontend::nn::{self, Optimizer};
use gt_frontend::tensor as api;
use pyo3::prelude::*;
use std::time::Instant;

/// Seconds per op for `n` tiny adds issued (and their results dropped), then one sync.
#[pyfunction]
pub fn _bench_rust_issue(py: Python<'_>, n: usize) -> PyResult<f64> {
    runtime::context().py()?;
    let a = api::ones(&[64]).py()?;
    let start = Instant::now();
    for _ in 0..n {
        drop(a.add(1.0).py()?);
    }
    let issued = start.elapsed().as_secs_f64();
    crate::tensor::synchronize(py)?;
    Ok(issued / n as f64)
}

/// Seconds per op issued and read back (`(a + 1).item()`).
#[pyfunction]
pub fn _bench_rust_round_trip(n: usize) -> PyResult<f64> {
    runtime::context().py()?;
    let a = api::ones(&[1]).py()?;
    let start = Instant::now();
    for _ in 0..n {
        a.add(1.0).py()?.item().py()?;
    }
    Ok(start.elapsed().as_secs_f64() / n as f64)
}

/// Seconds of each of `steps` MLP training steps (x 64x784 @ 784x256, relu, @ 256x10, MSE,
/// backward, SGD, `loss.item()`), after `warmup` steps.
#[pyfunction]
pub fn _bench_rust_mlp(steps: usize, warmup: usize) -> PyResult<Vec<f64>> {
    runtime::context().py()?;
    api::manual_seed(0).py()?;
    let x = api::randn(&[64, 784]).py()?;
    let y = api::randn(&[64, 10]).py()?;
    let w1 = api::randn(&[784, 256]).py()?.mul(0.05).py()?.requires_grad_(true).py()?;
    let w2 = api::randn(&[256, 10]).py()?.mul(0.05).py()?.requires_grad_(true).py()?;
    let mut opt = nn::Sgd::new(vec![w1.clone(), w2.clone()], 0.01);
    let mut times = Vec::with_capacity(steps);
    for i in 0..warmup + steps {
        let start = Instant::now();
        let h = x.matmul(&w1).py()?.relu().py()?;
        let loss = nn::mse_loss(&h.matmul(&w2).py()?, &y).py()?;
        opt.zero_grad();
        loss.backward().py()?;
        opt.step().py()?;
        loss.item().py()?;
        if i >= warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}
