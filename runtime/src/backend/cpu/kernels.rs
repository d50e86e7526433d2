//! The kernel IR evaluated on the CPU with the interpreter's own op functions: the oracle
//! for the code generators (a kernel must compute what this computes), and
//! [`KernelBackend`], a backend that executes every instruction through its lowering
//! ([`gt_ir::kernel::lower`]), so CI checks lowering against the interpreter without a GPU.
//! Written for clarity, not speed: every node materialises a whole tensor.

use super::interp::{binary, from_vec, matmul, reduce, select, unary, Tensor};
use super::random;
use crate::backend::checks::{self, ELEMENT_BYTES};
use crate::backend::Backend;
use crate::RuntimeError;
use gt_ir::kernel::lower::{lower, Step};
use gt_ir::kernel::{Access, Kernel, MapKernel, MatMulKernel, Node};
use gt_ir::{HostTensor, Instr, TensorType, TypeError, ValueId};
use ndarray::{Dimension, IxDyn};
use std::collections::HashMap;

/// Element offset of iteration point `index` under `access`.
fn offset(access: &Access, index: &[usize]) -> usize {
    let o = access.offset + index.iter().zip(&access.strides).map(|(&i, &s)| i as i64 * s).sum::<i64>();
    o as usize
}

/// The elements `access` reads from `buffer` over the iteration space `dims`.
fn gather(access: &Access, buffer: &[f32], dims: &[usize]) -> Tensor {
    let data = ndarray::indices(IxDyn(dims)).into_iter().map(|i| buffer[offset(access, i.slice())]).collect();
    from_vec(dims, data)
}

/// A tensor over `dims` whose element `i` (row-major) is `f(i)`.
fn by_index(dims: &[usize], f: impl Fn(u64) -> f32) -> Tensor {
    let n = dims.iter().product::<usize>() as u64;
    from_vec(dims, (0..n).map(f).collect())
}

fn map(k: &MapKernel, inputs: &[&[f32]], out: &mut [f32]) {
    let dims = &k.shape[..];
    let mut values: Vec<Tensor> = Vec::with_capacity(k.nodes.len());
    for node in &k.nodes {
        let value = match *node {
            Node::Input(i) => gather(&k.inputs[i as usize], inputs[i as usize], dims),
            Node::Const(bits) => Tensor::from_elem(IxDyn(dims), f32::from_bits(bits)),
            Node::Iota { start, step } => {
                let (start, step) = (f64::from_bits(start), f64::from_bits(step));
                by_index(dims, |i| (start + i as f64 * step) as f32)
            }
            Node::Rand { seed } => by_index(dims, |i| random::uniform(seed, i)),
            Node::Randn { seed } => by_index(dims, |i| random::normal(seed, i)),
            Node::Unary(op, a) => unary(op, &values[a as usize]),
            Node::Binary(op, a, b) => binary(op, &values[a as usize].view(), &values[b as usize].view(), dims),
            Node::Select(c, t, f) => {
                let v = |i: u32| values[i as usize].view();
                select(&v(c), &v(t), &v(f), dims)
            }
        };
        values.push(value);
    }
    let Some(result) = values.pop() else { return };
    match &k.reduce {
        None => {
            for (i, x) in ndarray::indices(IxDyn(dims)).into_iter().zip(result.iter()) {
                out[offset(&k.output, i.slice())] = *x;
            }
        }
        Some(r) => {
            let kept_axes: Vec<usize> = (0..dims.len()).filter(|a| !r.axes.contains(a)).collect();
            let kept: Vec<usize> = kept_axes.iter().map(|&a| dims[a]).collect();
            let reduced = reduce(r.op, &result, &r.axes, &kept);
            let strides: Vec<i64> = kept_axes.iter().map(|&a| k.output.strides[a]).collect();
            let access = Access { offset: k.output.offset, strides };
            for (i, x) in ndarray::indices(IxDyn(&kept)).into_iter().zip(reduced.iter()) {
                out[offset(&access, i.slice())] = *x;
            }
        }
    }
}

fn matmul_kernel(k: &MatMulKernel, lhs: &[f32], rhs: &[f32], out: &mut [f32]) -> Result<(), TypeError> {
    let with = |rows: usize, cols: usize| k.batch.iter().copied().chain([rows, cols]).collect::<Vec<_>>();
    let a = gather(&k.lhs, lhs, &with(k.m, k.k));
    let b = gather(&k.rhs, rhs, &with(k.k, k.n));
    let c = matmul(&a, &b, &with(k.m, k.n))?;
    out.iter_mut().zip(c.iter()).for_each(|(o, x)| *o = *x);
    Ok(())
}

/// Runs `kernel` reading `inputs` (one buffer per kernel input) and writing into `out`.
pub fn run(kernel: &Kernel, inputs: &[&[f32]], out: &mut [f32]) -> Result<(), TypeError> {
    match kernel {
        Kernel::Map(k) => map(k, inputs, out),
        Kernel::MatMul(k) => matmul_kernel(k, inputs[0], inputs[1], out)?,
    }
    Ok(())
}

/// A backend that runs every instruction as the kernels it lowers to, on host buffers.
#[derive(Debug)]
pub struct KernelBackend {
    values: HashMap<ValueId, (TensorType, Vec<f32>)>,
    max_tensor_bytes: usize,
}

impl KernelBackend {
    /// An empty backend refusing results over `max_tensor_bytes`.
    pub fn new(max_tensor_bytes: usize) -> KernelBackend {
        KernelBackend { values: HashMap::new(), max_tensor_bytes }
    }

    fn type_of(&self, v: ValueId) -> Result<TensorType, TypeError> {
        self.values.get(&v).map(|(t, _)| t.clone()).ok_or(TypeError::UnknownValue(v))
    }
}

impl Backend for KernelBackend {
    fn name(&self) -> &'static str {
        "kernels"
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        let op = instr.mnemonic();
        let (instr, types) = checks::prepare(instr, &|v| self.type_of(v), self.max_tensor_bytes)?;
        let steps = lower(&instr, &|v| self.values[&v].0.clone(), &types);
        let mut outputs: Vec<Vec<f32>> = types.iter().map(|t| vec![0.0; t.shape.numel()]).collect();
        for step in &steps {
            match step {
                Step::Launch { kernel, inputs, output } => {
                    let buffers: Vec<&[f32]> = inputs.iter().map(|v| &self.values[v].1[..]).collect();
                    run(kernel, &buffers, &mut outputs[*output]).map_err(|source| RuntimeError::Type { op, source })?;
                }
                Step::Upload { output } => {
                    if let Instr::Literal { data, .. } = &*instr {
                        outputs[*output].copy_from_slice(data);
                    }
                }
            }
        }
        if let Instr::Free { src } = &*instr {
            self.values.remove(src);
        }
        for ((dst, ty), data) in instr.results().into_iter().zip(types).zip(outputs) {
            self.values.insert(dst, (ty, data));
        }
        Ok(())
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        let (ty, data) = self.values.get(&value).ok_or(RuntimeError::Undefined { op: "get", value })?;
        Ok(HostTensor::new(ty.clone(), data.clone()))
    }

    fn live_values(&self) -> usize {
        self.values.len()
    }

    fn live_bytes(&self) -> usize {
        self.values.values().map(|(_, d)| d.len() * ELEMENT_BYTES).sum()
    }
}
