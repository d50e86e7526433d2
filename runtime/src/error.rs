//! `RuntimeError`: why the interpreter could not run an instruction or answer a read.

use gt_ir::{FailureKind, Shape, TypeError, ValueId};
use thiserror::Error;

/// Why an instruction or a read failed. Each names the op (its mnemonic; `get` for reads).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    /// An operand that was never defined or was freed.
    #[error("{op}: value {value} is not defined")]
    Undefined {
        /// The op.
        op: &'static str,
        /// The missing value.
        value: ValueId,
    },
    /// Operands that break the op's type rule.
    #[error("{op}: {source}")]
    Type {
        /// The op.
        op: &'static str,
        /// The rule broken.
        #[source]
        source: TypeError,
    },
    /// Results that would take the worker past its memory budget (`GT_WORKER_MEMORY`): the op
    /// fails instead of the process running out of memory.
    #[error("{op}: results need {needed} bytes with {live} bytes held, over the worker's memory budget of {limit} (GT_WORKER_MEMORY)")]
    OutOfMemory {
        /// The op.
        op: &'static str,
        /// Bytes its results need.
        needed: usize,
        /// Bytes the worker holds.
        live: usize,
        /// The budget.
        limit: usize,
    },
    /// A result (or the bookkeeping for one) larger than the interpreter's memory limit.
    #[error("{op}: result needs {bytes} bytes, over the limit of {limit}")]
    TooLarge {
        /// The op.
        op: &'static str,
        /// Bytes needed (saturated at `usize::MAX`).
        bytes: usize,
        /// The limit (`Interpreter::max_tensor_bytes`).
        limit: usize,
    },
    /// A shape whose nonzero dimensions multiply past 2^40 (possible for a tensor with no
    /// elements, which no byte limit catches): such a shape cannot be addressed.
    #[error("{op}: shape {shape} is too large to address (its nonzero dimensions multiply past 2^40)")]
    Extent {
        /// The op.
        op: &'static str,
        /// The shape.
        shape: Shape,
    },
    /// The device failed the instruction (out of memory, a failed launch, a lost device).
    #[error("{op}: {message}")]
    Device {
        /// The op.
        op: &'static str,
        /// What the device or driver said, with what was asked of it.
        message: String,
    },
    /// A kernel that breaks the kernel IR's rules or reaches outside its buffers.
    #[error("{op}: malformed kernel: {message}")]
    Kernel {
        /// The op.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl RuntimeError {
    /// What kind of failure this is, for the wire and for callers to match on.
    pub fn kind(&self) -> FailureKind {
        match self {
            RuntimeError::Undefined { .. } => FailureKind::Undefined,
            RuntimeError::Type { source, .. } => source.kind(),
            RuntimeError::OutOfMemory { .. } => FailureKind::OutOfMemory,
            RuntimeError::TooLarge { .. } | RuntimeError::Extent { .. } => FailureKind::Limit,
            RuntimeError::Device { .. } => FailureKind::Device,
            RuntimeError::Kernel { .. } => FailureKind::Kernel,
        }
    }
}
