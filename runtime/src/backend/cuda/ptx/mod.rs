//! PTX code generation: one kernel of the kernel IR ([`gt_ir::kernel`]) to the text of a PTX
//! module with one entry, `gt_kernel`, plus the launch shape. No CUDA is needed to generate
//! (CI assembles every generated module with `ptxas`); the driver JIT-compiles the text
//! when a CUDA worker loads it.
//!
//! - Maps: a grid-stride loop; 128-bit loads and stores (`v4`) when every buffer is read
//!   contiguously or uniformly and the length divides by 4; otherwise each element's
//!   coordinates are decoded from its linear index and dotted with each buffer's strides.
//! - Reductions: one block per output element; each thread folds a strided share of the
//!   reduced elements, then warp shuffles and shared memory combine the block's partials.
//! - Matmul: shared-memory tiling (`BM x BN` tile per block, `TM x TN` per thread, `BK` deep),
//!   FMA on f32; the tile choice is printed in the module's header comment.
//!
//! Index arithmetic is 32-bit signed, so every buffer and iteration space must have fewer
//! than 2^31 elements ([`PtxError::TooLarge`]).
//!
//! Map kernels compute in their [`gt_ir::kernel::Compute`] type: `f32` (over `f32` and
//! halves), `f64` (every op; `exp`, `log`, `tanh`, `sigmoid` and `erf` are
//! `gt_ir::math64`'s, the CPU's bits, emitted through `wide.rs`; `pow` is `math64::pow`,
//! within about 1e-13 of the CPU's libm `pow`) or `i64` (over the integers and `bool`, wrapping; what integers do not compute,
//! a hand-written `as i64 { exp .. }`, is refused by name, [`PtxError::Compute`]); loads and stores convert between each buffer's dtype and it as `.to(dtype)`
//! does. Matmuls take `f32` and halves only ([`PtxError::MatMulDType`]).
//!
//! Numerics against the interpreter: add/sub/mul/div/sqrt round like IEEE (`.rn`), so they
//! agree exactly; `exp`, `log`, `tanh`, `sigmoid`, `pow` and `randn` use the hardware's
//! approximate `ex2`/`lg2`/`cos` (relative error about 2^-22), so they agree to ~1e-6.
//!
//! This file holds the entry point ([`generate`]), its limits and its types. The rest, in
//! the order a kernel is built: `emit.rs` (the `Emitter`: registers, labels, addresses,
//! loops), `math.rs` (one element's expression: the unary and binary ops, reductions'
//! combine, `exp`/`log`/`tanh`, random numbers), then one file per kind of kernel:
//! `map.rs`, `rows.rs`, `matmul.rs` (FMA), `mma.rs` (tensor cores, `mma.sync`) and
//! `wgmma.rs` (Hopper's warpgroup tensor-core matmul, for [`Target::Sm90a`] only).

mod emit;
mod map;
mod math;
mod matmul;
mod mma;
mod rows;
mod wgmma;
mod wide;

pub use matmul::Tiling;
pub use wgmma::TransposedRhs;

use gt_ir::kernel::{BufferStorage, Compute, Kernel, Storage};
use thiserror::Error;

/// The entry point's name in every generated module.
pub const ENTRY: &str = "gt_kernel";

/// The PTX ISA version and target written into modules (sm_80 code runs on sm_80 and newer:
/// Ampere, Hopper).
pub const PTX_VERSION: &str = "7.0";
/// See [`PTX_VERSION`].
pub const PTX_TARGET: &str = "sm_80";

/// The GPU a module is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Target {
    /// What every CUDA GPU from Ampere on runs ([`PTX_TARGET`]).
    #[default]
    Sm80,
    /// Hopper (H100, H200) only: half-precision matmuls by warpgroups (`wgmma`), which
    /// `sm_80` code cannot use and later GPUs do not run.
    Sm90a,
}

impl Target {
    /// The target for a device of compute capability `major.minor`; `wgmma` off
    /// (`GT_WGMMA=0`, its matmuls on `mma.sync`) gives [`Target::Sm80`] everywhere.
    pub fn of(major: i32, minor: i32, wgmma: bool) -> Target {
        if wgmma && (major, minor) == (9, 0) {
            Target::Sm90a
        } else {
            Target::Sm80
        }
    }
}

/// CUDA's limit on grid dimensions y and z.
pub const MAX_GRID_YZ: u32 = 65_535;

/// Largest element count (of a buffer or an iteration space) the 32-bit indexing handles.
pub const MAX_ELEMENTS: usize = i32::MAX as usize;

/// Why a kernel cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PtxError {
    /// More blocks along grid y or z than CUDA allows (65535).
    #[error(
        "matmul grid too large for CUDA ({row_tiles} row tiles x {matrices} matrices; at most {MAX_GRID_YZ} each)"
    )]
    Grid {
        /// Blocks along grid y: tiles of rows.
        row_tiles: u32,
        /// Blocks along grid z: matrices of the batch.
        matrices: u32,
    },
    /// A kernel that breaks the kernel IR's rules (a bug in whoever built it).
    #[error("malformed kernel: {0}")]
    Malformed(#[from] gt_ir::kernel::KernelError),
    /// A storage list that does not match the kernel's buffers (a bug in whoever built it).
    #[error("the kernel has {expected} inputs but storage was given for {given}")]
    StorageCount {
        /// The kernel's inputs.
        expected: usize,
        /// Storages given.
        given: usize,
    },
    /// An op the GPU does not compute in the kernel's compute type yet.
    #[error("`{op}` computing in {compute} has no CUDA kernel yet; cast to f32 first (or run it on a CPU worker)")]
    Compute {
        /// The op's mnemonic.
        op: &'static str,
        /// What the kernel computes in.
        compute: Compute,
    },
    /// A matmul over buffers that are not `f32` or halves (tensor cores and the FMA tiles
    /// multiply those only).
    #[error("matmul of {dtype} has no CUDA kernel (f32, f16 and bf16 only; cast to f32 first)")]
    MatMulDType {
        /// The first buffer's dtype that is not one.
        dtype: gt_ir::DType,
    },
    /// Too many elements for 32-bit indexing.
    #[error("{elements} elements is too large for the CUDA backend's 32-bit indexing (at most {MAX_ELEMENTS})")]
    TooLarge {
        /// The element count.
        elements: usize,
    },
}

impl PtxError {
    /// Whether this refuses an op or dtype by name ([`PtxError::Compute`],
    /// [`PtxError::MatMulDType`]), rather than a kernel over the limits or malformed.
    pub fn refuses_dtype(&self) -> bool {
        matches!(self, PtxError::Compute { .. } | PtxError::MatMulDType { .. })
    }
}

/// A generated module and how to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxKernel {
    /// The PTX module text.
    pub text: String,
    /// Blocks `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads per block `(x, y, z)`.
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory per block (the pipelined matmul's stages; 0 for
    /// kernels that declare theirs statically).
    pub shared: u32,
}

/// Generates the PTX of `kernel` over `f32` buffers. Its parameters are the output buffer's
/// address, then one address per input (`u64` each).
pub fn generate(kernel: &Kernel) -> Result<PtxKernel, PtxError> {
    generate_stored(kernel, &BufferStorage::f32(kernel.num_inputs()))
}

/// Generates the PTX of `kernel` over buffers stored as `storage` says (halves are widened
/// to `f32` on load and rounded on store; a matmul of two halves runs on tensor cores).
pub fn generate_stored(kernel: &Kernel, storage: &BufferStorage) -> Result<PtxKernel, PtxError> {
    generate_for(kernel, storage, Target::Sm80)
}

/// [`generate_stored`] for `target`: on [`Target::Sm90a`], matmuls of two halves whose rows
/// are 16-byte aligned run on warpgroups (`wgmma`).
pub fn generate_for(kernel: &Kernel, storage: &BufferStorage, target: Target) -> Result<PtxKernel, PtxError> {
    gt_ir::kernel::validate(kernel)?;
    if storage.inputs.len() != kernel.num_inputs() {
        return Err(PtxError::StorageCount { expected: kernel.num_inputs(), given: storage.inputs.len() });
    }
    if let Kernel::Map(k) = kernel {
        math::supports(k)?;
    }
    if let Kernel::MatMul(_) = kernel {
        let mut all = std::iter::once(&storage.output).chain(&storage.inputs);
        if let Some(s) = all.find(|s| !s.is_float32_or_half()) {
            return Err(PtxError::MatMulDType { dtype: s.dtype() });
        }
    }
    match kernel {
        Kernel::Map(k) if k.is_row_kernel() => rows::rows(k, storage),
        Kernel::Map(k) => map::map(k, storage),
        Kernel::MatMul(k) if target == Target::Sm90a && wgmma::applies(k, storage) => wgmma::matmul(k, storage),
        Kernel::MatMul(k) if mma::applies(k, storage) => mma::matmul(k, storage),
        Kernel::MatMul(k) => matmul::matmul(k, storage),
    }
}

/// How `kernel` runs on `target` when not as one kernel: on Hopper a TF32 matmul whose B is
/// row-major copies B transposed first, so that warpgroups (which take TF32 operands with
/// k fastest only) multiply it.
pub fn transposed_rhs(kernel: &Kernel, storage: &BufferStorage, target: Target) -> Option<TransposedRhs> {
    match kernel {
        Kernel::MatMul(k) if target == Target::Sm90a => wgmma::transposed_rhs(k, storage),
        _ => None,
    }
}

/// Whether `k` computes in `f32` over `f32` buffers and halves only: what vector loads and
/// shared-memory tiles (both of `f32`s) take.
fn float32_only(k: &gt_ir::kernel::MapKernel, storage: &BufferStorage) -> bool {
    k.compute == Compute::F32
        && std::iter::once(&storage.output).chain(&storage.inputs).all(|s: &Storage| s.is_float32_or_half())
}

fn check(elements: usize) -> Result<(), PtxError> {
    if elements > MAX_ELEMENTS {
        return Err(PtxError::TooLarge { elements });
    }
    Ok(())
}

/// The strides of `axes` only.
fn pick(strides: &[i64], axes: &[usize]) -> Vec<i64> {
    axes.iter().map(|&i| strides[i]).collect()
}
