//! The kernel IR: what one compiled kernel computes, shared by every code generator (PTX for
//! CUDA today, Cranelift for the CPU with the fusion work). A kernel is either a *map* (an
//! elementwise expression DAG over strided inputs, optionally ending in a reduction over some
//! of its axes) or a *matmul* (batched, strided operands). [`lower`] turns each IR
//! instruction into kernels; the fuse pass will build larger ones from whole regions.
//!
//! Kernels are plain data with `Eq + Hash`, so a backend caches compiled code by the kernel
//! itself (its structural identity: shapes, strides and expression), and they print as text
//! (`Display`) for dumps and snapshots.

pub mod lower;

use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use std::fmt;

/// How a kernel addresses one buffer: element offset plus one stride per iteration axis
/// (in elements; 0 broadcasts along that axis, negative walks backwards).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Access {
    /// Element index of iteration point 0.
    pub offset: i64,
    /// One per iteration axis.
    pub strides: Vec<i64>,
}

impl Access {
    /// Row-major contiguous access of a tensor of shape `dims`.
    pub fn contiguous(dims: &[usize]) -> Access {
        Access { offset: 0, strides: row_major_strides(dims) }
    }

    /// Whether this walks the iteration space `dims` in row-major order from element 0,
    /// ignoring axes of size 1 (the common, vectorisable case).
    pub fn is_contiguous_over(&self, dims: &[usize]) -> bool {
        self.offset == 0 && dims_match(&self.strides, &row_major_strides(dims), dims)
    }

    /// Whether every element of the iteration space reads the same element.
    pub fn is_uniform_over(&self, dims: &[usize]) -> bool {
        self.strides.iter().zip(dims).all(|(&s, &d)| s == 0 || d == 1)
    }
}

fn dims_match(a: &[i64], b: &[i64], dims: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).zip(dims).all(|((x, y), &d)| d == 1 || x == y)
}

/// Row-major strides (elements) of a tensor of shape `dims`.
pub fn row_major_strides(dims: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; dims.len()];
    let mut step = 1i64;
    for (s, &d) in strides.iter_mut().zip(dims).rev() {
        *s = step;
        step = step.saturating_mul(d as i64);
    }
    strides
}

/// One node of a map kernel's expression; operands name earlier nodes by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Node {
    /// The element of input `n` at the current iteration point.
    Input(u32),
    /// An `f32` constant, by its bits (so kernels hash and compare exactly).
    Const(u32),
    /// `(start + i * step) as f32` computed in `f64`, `i` the linear output index (`arange`).
    Iota {
        /// `f64` bits of the first value.
        start: u64,
        /// `f64` bits of the increment.
        step: u64,
    },
    /// `rand` element `i` (linear output index) of stream `seed`.
    Rand {
        /// The seed.
        seed: u64,
    },
    /// `randn` element `i` (linear output index) of stream `seed`.
    Randn {
        /// The seed.
        seed: u64,
    },
    /// An elementwise op of one node.
    Unary(UnaryOp, u32),
    /// An elementwise op of two nodes.
    Binary(BinaryOp, u32, u32),
    /// `cond != 0 ? on_true : on_false`.
    Select(u32, u32, u32),
}

impl Node {
    /// A constant node.
    pub fn constant(x: f32) -> Node {
        Node::Const(x.to_bits())
    }

    /// The nodes this one reads.
    pub fn operands(&self) -> Vec<u32> {
        match *self {
            Node::Unary(_, a) => vec![a],
            Node::Binary(_, a, b) => vec![a, b],
            Node::Select(c, t, f) => vec![c, t, f],
            _ => vec![],
        }
    }
}

/// A reduction closing a map kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reduction {
    /// The op.
    pub op: ReduceOp,
    /// The iteration axes reduced (sorted, distinct); the output access ignores them.
    pub axes: Vec<usize>,
}

/// An elementwise kernel over an iteration space, optionally reducing some of its axes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MapKernel {
    /// The iteration space.
    pub shape: Vec<usize>,
    /// How each input buffer is read.
    pub inputs: Vec<Access>,
    /// The expression; its last node is the value written (or reduced).
    pub nodes: Vec<Node>,
    /// Where results are written (reduced axes' strides are ignored).
    pub output: Access,
    /// The reduction, if any.
    pub reduce: Option<Reduction>,
}

impl MapKernel {
    /// Elements in the iteration space.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Kept (output) and reduced element counts: `(outputs, reduced per output)`.
    pub fn extents(&self) -> (usize, usize) {
        let axes = self.reduce.as_ref().map_or(&[][..], |r| &r.axes[..]);
        let mut kept = 1;
        let mut reduced = 1;
        for (i, &d) in self.shape.iter().enumerate() {
            if axes.contains(&i) {
                reduced *= d;
            } else {
                kept *= d;
            }
        }
        (kept, reduced)
    }
}

/// A batched matrix product `out[b, m, n] = sum_k lhs[b, m, k] * rhs[b, k, n]`, the output
/// contiguous `[batch.., m, n]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MatMulKernel {
    /// Batch dimensions (broadcast already applied).
    pub batch: Vec<usize>,
    /// Rows of the result.
    pub m: usize,
    /// Columns of the result.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Left operand: strides over `[batch.., m, k]`.
    pub lhs: Access,
    /// Right operand: strides over `[batch.., k, n]`.
    pub rhs: Access,
}

impl MatMulKernel {
    /// Number of matrices in the batch.
    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }
}

/// One compiled unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Elementwise (+ reduction).
    Map(MapKernel),
    /// Matrix product.
    MatMul(MatMulKernel),
}

impl Kernel {
    /// How many input buffers the kernel reads.
    pub fn num_inputs(&self) -> usize {
        match self {
            Kernel::Map(m) => m.inputs.len(),
            Kernel::MatMul(_) => 2,
        }
    }

    /// A short name for logs and stats (`map`, `reduce`, `matmul`).
    pub fn kind(&self) -> &'static str {
        match self {
            Kernel::Map(m) if m.reduce.is_some() => "reduce",
            Kernel::Map(_) => "map",
            Kernel::MatMul(_) => "matmul",
        }
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{} strides [{}]", self.offset, list(&self.strides))
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Node::Input(i) => write!(f, "load in{i}"),
            Node::Const(bits) => write!(f, "const {:?}", f32::from_bits(bits)),
            Node::Iota { start, step } => {
                write!(f, "iota {:?}, {:?}", f64::from_bits(start), f64::from_bits(step))
            }
            Node::Rand { seed } => write!(f, "rand seed={seed}"),
            Node::Randn { seed } => write!(f, "randn seed={seed}"),
            Node::Unary(op, a) => write!(f, "{} %{a}", op.mnemonic()),
            Node::Binary(op, a, b) => write!(f, "{} %{a}, %{b}", op.mnemonic()),
            Node::Select(c, t, e) => write!(f, "where %{c}, %{t}, %{e}"),
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Map(k) => {
                write!(f, "kernel map [{}]", list(&k.shape))?;
                if let Some(r) = &k.reduce {
                    write!(f, " {} over [{}]", r.op.mnemonic(), list(&r.axes))?;
                }
                writeln!(f, " {{")?;
                for (i, input) in k.inputs.iter().enumerate() {
                    writeln!(f, "  in{i} {input}")?;
                }
                for (i, node) in k.nodes.iter().enumerate() {
                    writeln!(f, "  %{i} = {node}")?;
                }
                writeln!(f, "  out {}", k.output)?;
                write!(f, "}}")
            }
            Kernel::MatMul(k) => {
                writeln!(f, "kernel matmul batch [{}] m={} n={} k={} {{", list(&k.batch), k.m, k.n, k.k)?;
                writeln!(f, "  lhs {}", k.lhs)?;
                writeln!(f, "  rhs {}", k.rhs)?;
                write!(f, "}}")
            }
        }
    }
}
