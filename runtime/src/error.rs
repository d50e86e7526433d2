//! `RuntimeError`: why the interpreter could not run an instruction or answer a read.

use crate::backend::cpu::jit::JitError;
use crate::backend::cuda::ptx::PtxError;
use gt_ir::kernel::KernelError;
use gt_ir::{FailureKind, Shape, TypeError, ValueId};
use std::fmt;
use std::sync::Arc;
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
    /// A dtype the backend does not compute for this op (products of integers or `f64` on
    /// kernel backends, whose products take `f32` and halves).
    #[error("{op}: the {backend} backend does not compute it in {dtype} (its products take f32, f16 and bf16; the CPU worker takes every dtype)")]
    BackendDType {
        /// The op.
        op: &'static str,
        /// The backend.
        backend: &'static str,
        /// The dtype it does not take.
        dtype: gt_ir::DType,
    },
    /// The device failed the instruction (a failed launch, copy or sync, a lost device).
    #[error("{op}: {step}: {driver_message}")]
    Device {
        /// The op.
        op: &'static str,
        /// What was asked of the device.
        step: DeviceStep,
        /// The driver's own description of its error code: text from outside gt (the
        /// driver's codes exist only with the `cuda` feature).
        driver_message: String,
    },
    /// The device has no memory for a result.
    #[error("{op}: cannot allocate {bytes} bytes on {device} ({driver_message}; {values} values hold {live} bytes)")]
    DeviceMemory {
        /// The op.
        op: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The device's name.
        device: String,
        /// The driver's own description of its error code (text from outside gt, as for
        /// [`RuntimeError::Device`]).
        driver_message: String,
        /// Values the backend holds.
        values: usize,
        /// Their bytes.
        live: usize,
    },
    /// A kernel the PTX generator cannot translate (over its limits, or malformed).
    #[error("{op}: {source}")]
    Ptx {
        /// The op.
        op: &'static str,
        /// Why.
        #[source]
        source: PtxError,
    },
    /// A kernel that breaks the kernel IR's rules or reaches outside its buffers.
    #[error("{op}: malformed kernel: {source}")]
    Kernel {
        /// The op.
        op: &'static str,
        /// What is wrong.
        #[source]
        source: KernelError,
    },
    /// The CPU JIT failed to compile a well-formed kernel (a bug in the JIT).
    #[error("{op}: {source}")]
    Jit {
        /// The op.
        op: &'static str,
        /// Why.
        #[source]
        source: JitFailure,
    },
}

/// What the CUDA backend asked of the device when the driver failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceStep {
    /// Copying a buffer to a new one on the device.
    CopyDeviceToDevice,
    /// Copying host data to the device.
    CopyToDevice,
    /// Copying device data to the host.
    CopyFromDevice,
    /// Loading a generated PTX module.
    LoadModule {
        /// The kernel's kind ([`gt_ir::kernel::Kernel::kind`]).
        kernel: &'static str,
    },
    /// Finding a module's entry point.
    FindEntry {
        /// The kernel's kind.
        kernel: &'static str,
    },
    /// Launching a kernel.
    Launch {
        /// The kernel's kind.
        kernel: &'static str,
        /// Blocks.
        grid: (u32, u32, u32),
        /// Threads per block.
        block: (u32, u32, u32),
    },
    /// Waiting for queued work.
    Sync,
}

impl fmt::Display for DeviceStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceStep::CopyDeviceToDevice => f.write_str("device-to-device copy failed"),
            DeviceStep::CopyToDevice => f.write_str("copying data to the device failed"),
            DeviceStep::CopyFromDevice => f.write_str("copying data from the device failed"),
            DeviceStep::LoadModule { kernel } => write!(f, "loading the PTX of a {kernel} kernel failed"),
            DeviceStep::FindEntry { kernel } => write!(f, "the {kernel} kernel has no entry"),
            DeviceStep::Launch { kernel, grid, block } => {
                write!(f, "launching a {kernel} kernel (grid {grid:?}, block {block:?}) failed")
            }
            DeviceStep::Sync => f.write_str("the device failed queued work"),
        }
    }
}

/// A [`JitError`] that clones share: it holds Cranelift's errors, which are neither `Clone`
/// nor `PartialEq`, and a [`RuntimeError`] is both (the mirror compares failures). Two are
/// equal when they say the same; it displays as, and its source is that of, the error.
#[derive(Debug, Clone)]
pub struct JitFailure(pub Arc<JitError>);

impl PartialEq for JitFailure {
    fn eq(&self, other: &JitFailure) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl fmt::Display for JitFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for JitFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl RuntimeError {
    /// Whether the backend refused the op by its dtype, by name (a product of integers, an
    /// `f64` op a code generator does not compute yet): work a mirror leaves to the reference.
    pub fn refuses_dtype(&self) -> bool {
        match self {
            RuntimeError::BackendDType { .. } => true,
            RuntimeError::Ptx { source, .. } => source.refuses_dtype(),
            _ => false,
        }
    }

    /// What kind of failure this is, for the wire and for callers to match on.
    pub fn kind(&self) -> FailureKind {
        match self {
            RuntimeError::Undefined { .. } => FailureKind::Undefined,
            RuntimeError::Type { source, .. } => source.kind(),
            RuntimeError::OutOfMemory { .. } => FailureKind::OutOfMemory,
            RuntimeError::TooLarge { .. } | RuntimeError::Extent { .. } => FailureKind::Limit,
            RuntimeError::BackendDType { .. } => FailureKind::Type,
            RuntimeError::Device { .. } | RuntimeError::DeviceMemory { .. } => FailureKind::Device,
            // A code generator's refusal (over its limits, or a bug of its own) is a kernel
            // failure, as a malformed kernel is.
            RuntimeError::Kernel { .. } | RuntimeError::Ptx { .. } | RuntimeError::Jit { .. } => FailureKind::Kernel,
        }
    }
}
