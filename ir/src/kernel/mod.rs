//! The kernel IR: what one compiled kernel computes, shared by every code generator (PTX for
//! CUDA today, Cranelift for the CPU with the fusion work). A kernel is either a *map* (an
//! elementwise expression DAG over strided inputs; with *row axes* it may reduce within
//! each row, mid-expression (`softmax`: max, then sum of exps, then divide, in one kernel),
//! and may end in a reduction of each row) or a *matmul* (batched, strided operands, with an
//! elementwise epilogue applied to each product element before it is stored). [`lower`]
//! turns each IR instruction into kernels; the fuse pass will build larger ones from whole
//! regions.
//!
//! Kernels are plain data with `Eq + Hash`, so a backend caches compiled code by the kernel
//! itself (its structural identity: shapes, strides and expression), and they print as text
//! (`Display`) for dumps and snapshots.

pub mod error;
pub mod lower;
pub mod samples;
pub mod text;

pub use error::{Buffer, KernelError};

use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::verify::shape::{MAX_RANK, MAX_WORK};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How a kernel addresses one buffer: element offset plus one stride per iteration axis
/// (in elements; 0 broadcasts along that axis, negative walks backwards).
// Equality is the derived one field for field (so it agrees with the derived `Hash`),
// written out to keep empty vectors away from `memcmp` ([`crate::same_elements`]): a
// worker looks every kernel it runs up by value.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Debug, Clone, Eq, Hash, Serialize, Deserialize)]
pub struct Access {
    /// Element index of iteration point 0.
    pub offset: i64,
    /// One per iteration axis.
    pub strides: Vec<i64>,
}

impl PartialEq for Access {
    fn eq(&self, other: &Access) -> bool {
        let Access { offset, strides } = self;
        *offset == other.offset && crate::same_elements(strides, &other.strides)
    }
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

impl Access {
    /// The lowest and highest element index read over the iteration space `dims`, or `None`
    /// when the space is empty.
    pub fn range(&self, dims: &[usize]) -> Option<(i128, i128)> {
        if dims.contains(&0) {
            return None;
        }
        let (mut lo, mut hi) = (i128::from(self.offset), i128::from(self.offset));
        for (&s, &d) in self.strides.iter().zip(dims) {
            let reach = i128::from(s) * (d as i128 - 1);
            if reach > 0 {
                hi += reach;
            } else {
                lo += reach;
            }
        }
        Some((lo, hi))
    }

    /// Whether this visits each element of a row-major buffer of `dims.product()` elements
    /// exactly once over the iteration space `dims` (a permutation of axes, no gaps).
    pub fn is_permutation_of(&self, dims: &[usize]) -> bool {
        if self.offset != 0 || self.strides.len() != dims.len() {
            return false;
        }
        if dims.contains(&0) {
            return true;
        }
        let mut axes: Vec<(i64, usize)> =
            self.strides.iter().zip(dims).filter(|(_, &d)| d > 1).map(|(&s, &d)| (s, d)).collect();
        axes.sort_unstable();
        let mut step = 1i64;
        for (s, d) in axes {
            if s != step {
                return false;
            }
            step = step.saturating_mul(d as i64);
        }
        true
    }

    /// Elements of index arithmetic this access needs over `dims`: `max(|lo|, hi) + 1`.
    pub fn span(&self, dims: &[usize]) -> usize {
        self.range(dims).map_or(0, |(lo, hi)| (hi.max(-lo) + 1).min(usize::MAX as i128) as usize)
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Node {
    /// The element of input `n` at the current iteration point.
    Input(u32),
    /// An `f32` constant, by its bits (so kernels hash and compare exactly).
    Const(u32),
    /// An `f64` constant, by its bits, converted to the kernel's [`Compute`] type as a
    /// `.to(dtype)` would (what `f64` and integer kernels hold: an `f32` cannot).
    Const64(u64),
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
    /// A node's value converted to a dtype and back (what storing it there and loading it
    /// again gives): an integer operand of an op on halves is rounded to the half first, as
    /// the interpreter and PyTorch convert operands to the op's dtype; an `i32` op's result
    /// in an `i64` kernel wraps back to 32 bits, as the eager op wraps.
    Round(Storage, u32),
    /// The reduction of a node over the current row (the kernel's row axes), the same at
    /// every element of the row.
    Reduce(ReduceOp, u32),
    /// The matmul product at the current element (matmul epilogues only).
    Acc,
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
            Node::Reduce(_, a) | Node::Round(_, a) => vec![a],
            _ => vec![],
        }
    }
}

/// An elementwise kernel over an iteration space. With row axes, one row (the elements
/// that differ only in row-axis coordinates) is handled as a unit: [`Node::Reduce`] reduces
/// within it, and `reduce` ends the kernel with one reduction per row.
#[allow(clippy::derived_hash_with_manual_eq)] // as `Access`'s
#[derive(Debug, Clone, Eq, Hash, Serialize, Deserialize)]
pub struct MapKernel {
    /// The iteration space.
    pub shape: Vec<usize>,
    /// How each input buffer is read.
    pub inputs: Vec<Access>,
    /// The expression; its last node is the value written (or reduced).
    pub nodes: Vec<Node>,
    /// Where results are written (with `reduce`, the row axes' strides are ignored).
    pub output: Access,
    /// The axes of one row (sorted, distinct); empty for a plain elementwise kernel.
    pub rows: Vec<usize>,
    /// Reduce the last node over each row and write one value per row.
    pub reduce: Option<ReduceOp>,
    /// What the expression computes in: loads convert each buffer's elements to it, the
    /// store converts back to the output's.
    #[serde(default)]
    pub compute: Compute,
}

impl PartialEq for MapKernel {
    fn eq(&self, other: &MapKernel) -> bool {
        let MapKernel { shape, inputs, nodes, output, rows, reduce, compute } = self;
        crate::same_elements(shape, &other.shape)
            && *inputs == other.inputs
            && *nodes == other.nodes
            && *output == other.output
            && crate::same_elements(rows, &other.rows)
            && *reduce == other.reduce
            && *compute == other.compute
    }
}

impl MapKernel {
    /// Elements in the iteration space.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// `(rows, elements per row)`; a plain map has one-element rows.
    pub fn extents(&self) -> (usize, usize) {
        let mut kept = 1;
        let mut row = 1;
        for (i, &d) in self.shape.iter().enumerate() {
            if self.rows.contains(&i) {
                row *= d;
            } else {
                kept *= d;
            }
        }
        (kept, row)
    }

    /// Whether it computes in `f32` without `round` nodes: what the fuse pass makes and the
    /// CPU's JIT compiles.
    pub fn is_plain_f32(&self) -> bool {
        self.compute == Compute::F32 && !self.nodes.iter().any(|n| matches!(n, Node::Round(..)))
    }

    /// Whether a block must own each row (in-row reductions or a final reduction).
    pub fn is_row_kernel(&self) -> bool {
        self.reduce.is_some() || self.nodes.iter().any(|n| matches!(n, Node::Reduce(..)))
    }
}

/// What a map kernel's expression computes in, as the interpreter computes the op: `f32`
/// for `f32` and the halves (widened as loaded, rounded once as stored), `f64` for `f64`,
/// `i64` for the integers and `bool` (wrapping, narrowed as stored; `bool` is 0 or 1).
/// Matmul kernels compute in `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Compute {
    /// IEEE binary32.
    #[default]
    F32,
    /// IEEE binary64.
    F64,
    /// Signed 64-bit integers, wrapping.
    I64,
}

impl Compute {
    /// What an op whose operands (promoted) or result are `dtype` computes in.
    pub fn of(dtype: crate::DType) -> Compute {
        use crate::DType;
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Compute::F32,
            DType::F64 => Compute::F64,
            DType::I64 | DType::I32 | DType::Bool => Compute::I64,
        }
    }

    /// The dtype of its values.
    pub fn dtype(self) -> crate::DType {
        match self {
            Compute::F32 => crate::DType::F32,
            Compute::F64 => crate::DType::F64,
            Compute::I64 => crate::DType::I64,
        }
    }
}

impl fmt::Display for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dtype().name())
    }
}

/// How a kernel buffer's elements lie in memory: one per dtype. A load converts them to the
/// kernel's [`Compute`] type and a store converts back as `.to(dtype)` does (halves round to
/// nearest even, floats truncate into integers, integers wrap into narrower ones, nonzero
/// is `true`), so a backend only needs each buffer's storage beside the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Storage {
    /// IEEE binary32.
    #[default]
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE binary64.
    F64,
    /// Signed 64-bit integers.
    I64,
    /// Signed 32-bit integers.
    I32,
    /// One byte, 0 or 1.
    Bool,
}

impl Storage {
    /// The storage of a `dtype`.
    pub fn of(dtype: crate::DType) -> Storage {
        use crate::DType;
        match dtype {
            DType::F32 => Storage::F32,
            DType::F16 => Storage::F16,
            DType::BF16 => Storage::Bf16,
            DType::F64 => Storage::F64,
            DType::I64 => Storage::I64,
            DType::I32 => Storage::I32,
            DType::Bool => Storage::Bool,
        }
    }

    /// The dtype stored.
    pub fn dtype(self) -> crate::DType {
        use crate::DType;
        match self {
            Storage::F32 => DType::F32,
            Storage::F16 => DType::F16,
            Storage::Bf16 => DType::BF16,
            Storage::F64 => DType::F64,
            Storage::I64 => DType::I64,
            Storage::I32 => DType::I32,
            Storage::Bool => DType::Bool,
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        self.dtype().size_bytes()
    }

    /// Whether this is a 16-bit float (the tensor cores' `m16n8k16` inputs).
    pub fn is_half(self) -> bool {
        matches!(self, Storage::F16 | Storage::Bf16)
    }

    /// Whether this is `f32` or a half: what matmuls and `f32` kernels' vector loads take.
    pub fn is_float32_or_half(self) -> bool {
        self == Storage::F32 || self.is_half()
    }
}

/// The storage of each buffer of one kernel: its output, then its inputs in kernel order
/// (a matmul's `lhs`, `rhs`, then its epilogue inputs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BufferStorage {
    /// The output buffer.
    pub output: Storage,
    /// One per input.
    pub inputs: Vec<Storage>,
}

impl BufferStorage {
    /// Every buffer `f32`, for a kernel of `inputs` inputs.
    pub fn f32(inputs: usize) -> BufferStorage {
        BufferStorage { output: Storage::F32, inputs: vec![Storage::F32; inputs] }
    }

    /// Whether every buffer is `f32`.
    pub fn is_f32(&self) -> bool {
        self.output == Storage::F32 && self.inputs.iter().all(|&s| s == Storage::F32)
    }
}

/// How a matmul multiplies f32 operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Precision {
    /// Full f32 products and sums (what the interpreter computes).
    #[default]
    F32,
    /// Operands rounded to TF32 (10-bit mantissa) for tensor cores, f32 sums: about 1e-3
    /// relative error, several times faster (PyTorch's `allow_tf32`).
    Tf32,
}

/// A batched matrix product `out[b, m, n] = sum_k lhs[b, m, k] * rhs[b, k, n]`, the output
/// contiguous `[batch.., m, n]`.
#[allow(clippy::derived_hash_with_manual_eq)] // as `Access`'s
#[derive(Debug, Clone, Eq, Hash, Serialize, Deserialize)]
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
    /// Applied to each product element before it is stored: [`Node::Acc`] is the product,
    /// [`Node::Input`] `i` reads `epilogue_inputs[i]`; empty stores the product as is.
    pub epilogue: Vec<Node>,
    /// Extra inputs of the epilogue (bias, residual), strides over `[batch.., m, n]`;
    /// they are kernel inputs 2, 3, ... after `lhs` and `rhs`.
    pub epilogue_inputs: Vec<Access>,
    /// How the products are computed.
    pub precision: Precision,
}

impl PartialEq for MatMulKernel {
    fn eq(&self, other: &MatMulKernel) -> bool {
        let MatMulKernel { batch, m, n, k, lhs, rhs, epilogue, epilogue_inputs, precision } = self;
        crate::same_elements(batch, &other.batch)
            && (*m, *n, *k) == (other.m, other.n, other.k)
            && *lhs == other.lhs
            && *rhs == other.rhs
            && *epilogue == other.epilogue
            && *epilogue_inputs == other.epilogue_inputs
            && *precision == other.precision
    }
}

impl MatMulKernel {
    /// Number of matrices in the batch (saturating: absurd sizes are refused later).
    pub fn batch_count(&self) -> usize {
        self.batch.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// One compiled unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kernel {
    /// Elementwise (+ reduction).
    Map(MapKernel),
    /// Matrix product.
    MatMul(MatMulKernel),
}

impl Kernel {
    /// How many times its innermost operation runs at most: the iteration space's extent (a 0
    /// counted as 1, as loops over it may still trip), times `k` for a matmul; saturating.
    pub fn work(&self) -> u128 {
        let extent =
            |dims: &mut dyn Iterator<Item = usize>| dims.fold(1u128, |n, d| n.saturating_mul(d.max(1) as u128));
        match self {
            Kernel::Map(k) => extent(&mut k.shape.iter().copied()),
            Kernel::MatMul(k) => extent(&mut k.batch.iter().copied().chain([k.m, k.n, k.k])),
        }
    }

    /// How many input buffers the kernel reads.
    pub fn num_inputs(&self) -> usize {
        match self {
            Kernel::Map(m) => m.inputs.len(),
            Kernel::MatMul(k) => 2 + k.epilogue_inputs.len(),
        }
    }

    /// Checks that every element the kernel reads or writes lies inside buffers of these
    /// lengths (one per input, in order, and the output), so that running it can never
    /// touch memory outside them.
    pub fn check_bounds(&self, inputs: &[usize], output: usize) -> Result<(), KernelError> {
        validate(self)?;
        if inputs.len() != self.num_inputs() {
            return Err(KernelError::InputCount { expected: self.num_inputs(), given: inputs.len() });
        }
        let inside = |buffer: Buffer, a: &Access, dims: &[usize], len: usize| match a.range(dims) {
            Some((lo, hi)) if lo < 0 || hi >= len as i128 => Err(KernelError::OutOfBounds { buffer, lo, hi, len }),
            _ => Ok(()),
        };
        match self {
            Kernel::Map(k) => {
                for (i, (a, &len)) in k.inputs.iter().zip(inputs).enumerate() {
                    inside(Buffer::Input(i), a, &k.shape, len)?;
                }
                if k.reduce.is_none() {
                    return inside(Buffer::Output, &k.output, &k.shape, output);
                }
                // One value per row, written even for empty rows: the output is addressed
                // over the shape with the row axes collapsed.
                let kept: Vec<usize> =
                    k.shape.iter().enumerate().map(|(i, &d)| if k.rows.contains(&i) { 1 } else { d }).collect();
                inside(Buffer::Output, &k.output, &kept, output)
            }
            Kernel::MatMul(k) => {
                let with = |r: usize, c: usize| k.batch.iter().copied().chain([r, c]).collect::<Vec<_>>();
                inside(Buffer::Lhs, &k.lhs, &with(k.m, k.k), inputs[0])?;
                inside(Buffer::Rhs, &k.rhs, &with(k.k, k.n), inputs[1])?;
                for (i, a) in k.epilogue_inputs.iter().enumerate() {
                    inside(Buffer::EpilogueInput(i), a, &with(k.m, k.n), inputs[2 + i])?;
                }
                let needed = k.batch_count().saturating_mul(k.m).saturating_mul(k.n);
                if needed > output {
                    return Err(KernelError::OutputTooSmall { needed, len: output });
                }
                Ok(())
            }
        }
    }

    /// Checks that the kernel writes every element of an output of `len` elements exactly
    /// once (a `fused` result has no other writer), in any order.
    pub fn check_covers(&self, len: usize) -> Result<(), KernelError> {
        let written = match self {
            Kernel::Map(k) => {
                let dims: Vec<usize> = match k.reduce {
                    None => k.shape.clone(),
                    Some(_) => {
                        k.shape.iter().enumerate().map(|(i, &d)| if k.rows.contains(&i) { 1 } else { d }).collect()
                    }
                };
                if !k.output.is_permutation_of(&dims) {
                    return Err(KernelError::OutputNotPermutation { output: k.output.clone(), len });
                }
                dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
            }
            Kernel::MatMul(k) => k.batch_count().checked_mul(k.m).and_then(|x| x.checked_mul(k.n)),
        };
        match written {
            Some(n) if n == len => Ok(()),
            written => Err(KernelError::WrittenCount { written, len }),
        }
    }

    /// A short name for logs and stats (`map`, `rows`, `reduce`, `matmul`).
    pub fn kind(&self) -> &'static str {
        match self {
            Kernel::Map(m) if m.reduce.is_some() => "reduce",
            Kernel::Map(m) if m.is_row_kernel() => "rows",
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
            Node::Const64(bits) => write!(f, "const64 {:?}", f64::from_bits(bits)),
            Node::Iota { start, step } => {
                write!(f, "iota {:?}, {:?}", f64::from_bits(start), f64::from_bits(step))
            }
            Node::Rand { seed } => write!(f, "rand seed={seed}"),
            Node::Randn { seed } => write!(f, "randn seed={seed}"),
            Node::Unary(op, a) => write!(f, "{} %{a}", op.mnemonic()),
            Node::Binary(op, a, b) => write!(f, "{} %{a}, %{b}", op.mnemonic()),
            Node::Select(c, t, e) => write!(f, "where %{c}, %{t}, %{e}"),
            Node::Reduce(op, a) => write!(f, "row_{} %{a}", op.mnemonic()),
            Node::Round(s, a) => write!(f, "round {} %{a}", s.dtype().name()),
            Node::Acc => f.write_str("acc"),
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Map(k) => {
                write!(f, "kernel map [{}]", list(&k.shape))?;
                if !k.rows.is_empty() {
                    write!(f, " rows [{}]", list(&k.rows))?;
                }
                if let Some(op) = k.reduce {
                    write!(f, " {}", op.mnemonic())?;
                }
                if k.compute != Compute::F32 {
                    write!(f, " as {}", k.compute)?;
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
                let tf32 = if k.precision == Precision::Tf32 { " tf32" } else { "" };
                writeln!(f, "kernel matmul{tf32} batch [{}] m={} n={} k={} {{", list(&k.batch), k.m, k.n, k.k)?;
                writeln!(f, "  lhs {}", k.lhs)?;
                writeln!(f, "  rhs {}", k.rhs)?;
                for (i, input) in k.epilogue_inputs.iter().enumerate() {
                    writeln!(f, "  in{i} {input}")?;
                }
                for (i, node) in k.epilogue.iter().enumerate() {
                    writeln!(f, "  %{i} = {node}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// Checks what the generator relies on: operands name earlier nodes, inputs exist, strides
/// match the rank, `acc` only in epilogues, row reductions only with row axes.
pub fn validate(kernel: &Kernel) -> Result<(), KernelError> {
    let nodes_ok = |nodes: &[Node], inputs: usize, epilogue: bool, rows: bool| -> Result<(), KernelError> {
        if nodes.is_empty() && !epilogue {
            return Err(KernelError::NoNodes);
        }
        for (node, n) in nodes.iter().enumerate() {
            if let Some(&operand) = n.operands().iter().find(|&&o| o as usize >= node) {
                return Err(KernelError::LaterNode { node, op: *n, operand });
            }
            match *n {
                Node::Input(input) if input as usize >= inputs => {
                    return Err(KernelError::InputOutOfRange { node, input, inputs })
                }
                Node::Acc if !epilogue => return Err(KernelError::AccOutsideEpilogue { node }),
                Node::Reduce(..) if !rows => return Err(KernelError::ReduceWithoutRows { node }),
                _ => {}
            }
        }
        Ok(())
    };
    let rank_ok = |buffer: Buffer, a: &Access, rank: usize| {
        if a.strides.len() == rank {
            Ok(())
        } else {
            Err(KernelError::StrideCount { buffer, strides: a.strides.len(), rank })
        }
    };
    let rank = match kernel {
        Kernel::Map(k) => k.shape.len(),
        Kernel::MatMul(k) => k.batch.len() + 2,
    };
    if rank > MAX_RANK {
        return Err(KernelError::TooManyAxes { rank });
    }
    if kernel.work() > MAX_WORK {
        return Err(KernelError::TooMuchWork { work: kernel.work() });
    }
    match kernel {
        Kernel::Map(k) => {
            let rank = k.shape.len();
            if k.rows.iter().any(|&a| a >= rank) || k.rows.windows(2).any(|w| w[0] >= w[1]) {
                return Err(KernelError::RowAxes { rows: k.rows.clone(), rank });
            }
            nodes_ok(&k.nodes, k.inputs.len(), false, !k.rows.is_empty())?;
            rank_ok(Buffer::Output, &k.output, rank)?;
            k.inputs.iter().enumerate().try_for_each(|(i, a)| rank_ok(Buffer::Input(i), a, rank))
        }
        Kernel::MatMul(k) => {
            let rank = k.batch.len() + 2;
            nodes_ok(&k.epilogue, k.epilogue_inputs.len(), true, false)?;
            rank_ok(Buffer::Lhs, &k.lhs, rank)?;
            rank_ok(Buffer::Rhs, &k.rhs, rank)?;
            k.epilogue_inputs.iter().enumerate().try_for_each(|(i, a)| rank_ok(Buffer::EpilogueInput(i), a, rank))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernels are equal exactly when every field is (the written-out equality agrees with
    /// the derived one it replaces, empty vectors included).
    #[test]
    fn kernels_equal_field_for_field() {
        use super::samples;
        let map = match samples::softmax(&[4, 6]) {
            Kernel::Map(m) => m,
            Kernel::MatMul(_) => unreachable!("softmax is a map"),
        };
        let product = match samples::linear_relu(4, 3, 5) {
            Kernel::MatMul(k) => k,
            Kernel::Map(_) => unreachable!("linear_relu is a product"),
        };
        assert_eq!(map, map.clone());
        assert_eq!(product, product.clone());
        let maps: [fn(&mut MapKernel); 7] = [
            |m| m.shape.push(1),
            |m| m.inputs.push(Access::contiguous(&[4, 6])),
            |m| m.nodes.push(Node::Input(0)),
            |m| m.output.offset += 1,
            |m| m.output.strides.clear(),
            |m| m.rows = if m.rows.is_empty() { vec![0] } else { vec![] },
            |m| m.reduce = if m.reduce.is_some() { None } else { Some(ReduceOp::Sum) },
        ];
        for (i, change) in maps.iter().enumerate() {
            let mut other = map.clone();
            change(&mut other);
            assert_ne!(map, other, "map field change {i}");
            assert_ne!(other, map, "map field change {i}");
        }
        let products: [fn(&mut MatMulKernel); 8] = [
            |k| k.batch.push(1),
            |k| k.m += 1,
            |k| k.n += 1,
            |k| k.k += 1,
            |k| k.lhs.strides.push(0),
            |k| k.rhs.offset += 1,
            |k| k.epilogue.clear(),
            |k| k.epilogue_inputs.push(Access::contiguous(&[4, 5])),
        ];
        for (i, change) in products.iter().enumerate() {
            let mut other = product.clone();
            change(&mut other);
            assert_ne!(product, other, "product field change {i}");
        }
        let mut other = product.clone();
        other.precision = match product.precision {
            Precision::F32 => Precision::Tf32,
            Precision::Tf32 => Precision::F32,
        };
        assert_ne!(product, other, "precision");
        // Empty and equal, empty against not.
        assert!(crate::same_elements::<u32>(&[], &Vec::new()));
        assert!(!crate::same_elements(&[1u32], &[]) && crate::same_elements(&[1u32, 2], &[1, 2]));
    }

    fn copy(dims: &[usize], input: Access, output: Access) -> Kernel {
        Kernel::Map(MapKernel {
            shape: dims.to_vec(),
            inputs: vec![input],
            nodes: vec![Node::Input(0)],
            output,
            rows: vec![],
            reduce: None,
            compute: Compute::F32,
        })
    }

    #[test]
    fn bounds_are_checked_for_every_buffer() {
        let k = copy(&[4, 3], Access { offset: 0, strides: vec![1, 4] }, Access::contiguous(&[4, 3]));
        assert_eq!(k.check_bounds(&[12], 12), Ok(()));
        let e = k.check_bounds(&[11], 12).unwrap_err();
        assert_eq!(e, KernelError::OutOfBounds { buffer: Buffer::Input(0), lo: 0, hi: 11, len: 11 });
        assert_eq!(e.to_string(), "input 0 reads elements 0..=11 of a buffer of 11");
        let e = k.check_bounds(&[12], 11).unwrap_err();
        assert_eq!(e.to_string(), "the output writes elements 0..=11 of a buffer of 11");
        let e = k.check_bounds(&[12, 5], 12).unwrap_err();
        assert_eq!(e, KernelError::InputCount { expected: 1, given: 2 });
        assert!(e.to_string().contains("reads 1 inputs, 2 given"));
        // A backwards stride below element 0.
        let k = copy(&[3], Access { offset: 1, strides: vec![-1] }, Access::contiguous(&[3]));
        assert!(matches!(k.check_bounds(&[3], 3), Err(KernelError::OutOfBounds { lo: -1, hi: 1, .. })));
        // Empty spaces touch nothing.
        let k = copy(&[0, 3], Access::contiguous(&[0, 3]), Access::contiguous(&[0, 3]));
        assert_eq!(k.check_bounds(&[0], 0), Ok(()));
    }

    #[test]
    fn reductions_write_one_value_per_row_even_for_empty_rows() {
        let k = Kernel::Map(MapKernel {
            shape: vec![4, 0],
            inputs: vec![Access::contiguous(&[4, 0])],
            nodes: vec![Node::Input(0)],
            output: Access { offset: 1000, strides: vec![1, 0] },
            rows: vec![1],
            reduce: Some(crate::ReduceOp::Sum),
            compute: Compute::F32,
        });
        let e = k.check_bounds(&[0], 4).unwrap_err();
        assert_eq!(e, KernelError::OutOfBounds { buffer: Buffer::Output, lo: 1000, hi: 1003, len: 4 });
        // A malformed kernel is refused before any index is looked at.
        let Kernel::Map(mut bad) = k else { unreachable!() };
        bad.rows = vec![5];
        let e = Kernel::Map(bad).check_bounds(&[0], 4).unwrap_err();
        assert_eq!(e, KernelError::RowAxes { rows: vec![5], rank: 2 });
        assert!(e.to_string().contains("row axes"));
    }

    #[test]
    fn matmul_bounds() {
        let k = samples::linear_relu(4, 5, 6);
        assert_eq!(k.check_bounds(&[20, 30, 6], 24), Ok(()));
        let e = k.check_bounds(&[20, 30, 5], 24).unwrap_err();
        assert!(matches!(e, KernelError::OutOfBounds { buffer: Buffer::EpilogueInput(0), .. }), "{e}");
        assert!(e.to_string().contains("epilogue input 0"));
        let e = k.check_bounds(&[20, 30, 6], 23).unwrap_err();
        assert_eq!(e, KernelError::OutputTooSmall { needed: 24, len: 23 });
        assert!(e.to_string().contains("needs 24"));
    }
}
