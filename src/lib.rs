//! gt: a multiplexing tensor runtime built like a compiler. This facade re-exports the
//! crates and holds what the binaries share: the `gt` command line (`cli`), diagnostic
//! rendering, the filetest runner, logging set-up, and sessions (embedded cluster or remote
//! dispatcher) that run `.gtir` scripts; and the Tensor API (`gt::init`, `gt::randn`,
//! `gt::nn`, ...).

pub mod cli;
pub mod diagnostics;
pub mod filetest;
pub mod init;
pub mod kernels;
pub mod logging;
pub mod mirror;
pub mod script;
pub mod session;
pub mod streamgen;

pub use gt_frontend as frontend;
pub use gt_ir as ir;
pub use gt_passes as passes;
pub use gt_runtime as runtime;
pub use gt_tools as tools;
pub use gt_transport as transport;

pub use gt_frontend::tensor::autocast::{autocast, AutocastGuard};
pub use gt_frontend::tensor::{
    arange, arange_dtype, cat, from_data, from_vec, full, full_dtype, is_grad_enabled, manual_seed, no_grad, ones,
    rand, rand_seeded, randn, randn_seeded, range_step, scalar, step, tensor, where_, zeros, zeros_dtype, Arg,
    ELLIPSIS, NEW,
};
pub use gt_frontend::{autograd, config, debug, nn, s, signal, Tensor, TensorError};
pub use gt_ir::data::Elements;
pub use gt_ir::DType;
pub use init::{init, Runtime};

/// The allocator gt's binaries, Python package and benchmarks run on (mimalloc): it keeps the
/// memory of a freed large tensor for the next one, where the system allocator hands it back
/// and the next buffer of that size pays a page fault per 4 KiB on its first touch (a 64 MB
/// copy into fresh memory: 50 ms against 8 on this VM). A Rust program using the Tensor API
/// opts in with `#[global_allocator] static GLOBAL: gt::Allocator = gt::Allocator;`.
pub use mimalloc::MiMalloc as Allocator;

/// Tensor programs in `.gtir` instruction syntax, lowered at compile time (`docs/dsl.md`).
pub use gt_macros::gt;
