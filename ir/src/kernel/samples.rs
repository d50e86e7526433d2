//! Hand-written kernels of common fused computations (softmax, layer norm, GELU, a linear
//! layer with bias and ReLU): what the fuse pass is to produce, used meanwhile by tests and
//! benchmarks of the code generators.

use super::lower::broadcast_access;
use super::{Access, Compute, Kernel, MapKernel, MatMulKernel, Node};
use crate::{BinaryOp, ReduceOp, UnaryOp};

fn row_kernel(dims: &[usize], rows: Vec<usize>, nodes: Vec<Node>) -> Kernel {
    Kernel::Map(MapKernel {
        shape: dims.to_vec(),
        inputs: vec![Access::contiguous(dims)],
        nodes,
        output: Access::contiguous(dims),
        rows,
        reduce: None,
        compute: Compute::F32,
    })
}

/// Softmax over the last axis of a tensor of shape `dims`, in one kernel:
/// `e = exp(x - max(x)); e / sum(e)`.
pub fn softmax(dims: &[usize]) -> Kernel {
    use Node::*;
    let last = dims.len().saturating_sub(1);
    row_kernel(
        dims,
        vec![last],
        vec![
            Input(0),
            Reduce(ReduceOp::Max, 0),
            Binary(BinaryOp::Sub, 0, 1),
            Unary(UnaryOp::Exp, 2),
            Reduce(ReduceOp::Sum, 3),
            Binary(BinaryOp::Div, 3, 4),
        ],
    )
}

/// Layer norm over the last axis (no affine part): `(x - mean) / sqrt(var + eps)`.
pub fn layer_norm(dims: &[usize], eps: f32) -> Kernel {
    use Node::*;
    let last = dims.len().saturating_sub(1);
    row_kernel(
        dims,
        vec![last],
        vec![
            Input(0),
            Reduce(ReduceOp::Mean, 0),
            Binary(BinaryOp::Sub, 0, 1),
            Binary(BinaryOp::Mul, 2, 2),
            Reduce(ReduceOp::Mean, 3),
            Node::constant(eps),
            Binary(BinaryOp::Add, 4, 5),
            Unary(UnaryOp::Rsqrt, 6),
            Binary(BinaryOp::Mul, 2, 7),
        ],
    )
}

/// GELU (tanh form) elementwise: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu(dims: &[usize]) -> Kernel {
    use Node::*;
    row_kernel(
        dims,
        vec![],
        vec![
            Input(0),
            Binary(BinaryOp::Mul, 0, 0),
            Binary(BinaryOp::Mul, 1, 0),
            Node::constant(0.044715),
            Binary(BinaryOp::Mul, 2, 3),
            Binary(BinaryOp::Add, 0, 4),
            Node::constant(0.797_884_6),
            Binary(BinaryOp::Mul, 5, 6),
            Unary(UnaryOp::Tanh, 7),
            Node::constant(1.0),
            Binary(BinaryOp::Add, 8, 9),
            Node::constant(0.5),
            Binary(BinaryOp::Mul, 0, 11),
            Binary(BinaryOp::Mul, 12, 10),
        ],
    )
}

/// `relu(x @ w + b)` for `x: [m, k]`, `w: [k, n]`, `b: [n]`, as one matmul with its
/// epilogue (inputs: x, w, b).
pub fn linear_relu(m: usize, k: usize, n: usize) -> Kernel {
    use Node::*;
    Kernel::MatMul(MatMulKernel {
        batch: vec![],
        m,
        n,
        k,
        lhs: Access::contiguous(&[m, k]),
        rhs: Access::contiguous(&[k, n]),
        epilogue: vec![Acc, Input(0), Binary(BinaryOp::Add, 0, 1), Unary(UnaryOp::Relu, 2)],
        epilogue_inputs: vec![broadcast_access(&[n], &[m, n])],
        precision: Default::default(),
    })
}
