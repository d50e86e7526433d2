//! `KernelError`: what can be wrong with a kernel ([`super::validate`]) or with the buffers it
//! is run on ([`super::Kernel::check_bounds`], [`super::Kernel::check_covers`]).

use super::{Access, Node};
use crate::verify::shape::{MAX_RANK, MAX_WORK};
use std::fmt;
use thiserror::Error;

/// One buffer of a kernel, for naming it in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buffer {
    /// A map kernel's input `n`.
    Input(usize),
    /// The buffer written.
    Output,
    /// A matmul's left operand.
    Lhs,
    /// A matmul's right operand.
    Rhs,
    /// A matmul epilogue's input `n` (kernel input `2 + n`).
    EpilogueInput(usize),
}

impl Buffer {
    /// `reads` or `writes`.
    fn verb(self) -> &'static str {
        if self == Buffer::Output {
            "writes"
        } else {
            "reads"
        }
    }
}

impl fmt::Display for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Buffer::Input(i) => write!(f, "input {i}"),
            Buffer::Output => f.write_str("the output"),
            Buffer::Lhs => f.write_str("lhs"),
            Buffer::Rhs => f.write_str("rhs"),
            Buffer::EpilogueInput(i) => write!(f, "epilogue input {i}"),
        }
    }
}

/// Why a kernel is malformed, or does not fit the buffers it is given. Nodes are named by
/// their index (`%i`), as in the kernel's text form.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A map kernel with an empty expression.
    #[error("a map kernel needs at least one node")]
    NoNodes,
    /// A node whose operand is itself or a later node (the expression must be a DAG in order).
    #[error("node %{node} ({op}) reads %{operand}, a node that is not before it")]
    LaterNode {
        /// The node's index.
        node: usize,
        /// The node.
        op: Node,
        /// The operand it names.
        operand: u32,
    },
    /// A `load` of an input the kernel does not have.
    #[error("node %{node} reads input {input} of {inputs}")]
    InputOutOfRange {
        /// The node's index.
        node: usize,
        /// The input it loads.
        input: u32,
        /// How many inputs the kernel has.
        inputs: usize,
    },
    /// `acc` (the matmul product) in a map kernel.
    #[error("node %{node}: `acc` outside a matmul epilogue")]
    AccOutsideEpilogue {
        /// The node's index.
        node: usize,
    },
    /// A row reduction in a kernel without row axes (or in a matmul epilogue).
    #[error("node %{node}: a row reduction without row axes")]
    ReduceWithoutRows {
        /// The node's index.
        node: usize,
    },
    /// Row axes that are out of range, unsorted or repeated.
    #[error("row axes {rows:?} are not sorted distinct axes of rank {rank}")]
    RowAxes {
        /// The row axes.
        rows: Vec<usize>,
        /// The iteration space's rank.
        rank: usize,
    },
    /// An access with a stride count other than the iteration space's rank.
    #[error("{buffer} has {strides} strides for {rank} axes")]
    StrideCount {
        /// The buffer.
        buffer: Buffer,
        /// Its strides.
        strides: usize,
        /// The iteration space's rank.
        rank: usize,
    },
    /// An iteration space of more than [`MAX_RANK`] axes.
    #[error("the kernel has {rank} axes, over the limit of {MAX_RANK}")]
    TooManyAxes {
        /// Its axes.
        rank: usize,
    },
    /// More iterations than [`MAX_WORK`].
    #[error("the kernel would do {work} iterations, over the limit of 2^42")]
    TooMuchWork {
        /// Its iterations ([`super::Kernel::work`]).
        work: u128,
    },
    /// A different number of buffers than the kernel has inputs.
    #[error("the kernel reads {expected} inputs, {given} given")]
    InputCount {
        /// The kernel's inputs.
        expected: usize,
        /// Buffers given.
        given: usize,
    },
    /// An access reaching outside its buffer.
    #[error("{buffer} {} elements {lo}..={hi} of a buffer of {len}", buffer.verb())]
    OutOfBounds {
        /// The buffer.
        buffer: Buffer,
        /// Lowest element index touched.
        lo: i128,
        /// Highest element index touched.
        hi: i128,
        /// The buffer's length in elements.
        len: usize,
    },
    /// A matmul's output buffer shorter than its product.
    #[error("the output needs {needed} elements, the buffer has {len}")]
    OutputTooSmall {
        /// Elements written (`batch * m * n`, saturating).
        needed: usize,
        /// The buffer's length.
        len: usize,
    },
    /// An output access that skips or repeats elements of the result.
    #[error("the output {output} does not write each of the {len} elements once")]
    OutputNotPermutation {
        /// The output access.
        output: Access,
        /// The result's elements.
        len: usize,
    },
    /// A kernel writing a different number of elements than the result has.
    #[error("the kernel writes {} elements, the result has {len}", written.map_or("too many".to_string(), |n| n.to_string()))]
    WrittenCount {
        /// Elements written; `None` when the count overflows `usize`.
        written: Option<usize>,
        /// The result's elements.
        len: usize,
    },
}

const _: () = assert!(MAX_WORK == 1 << 42, "the TooMuchWork message says 2^42");
