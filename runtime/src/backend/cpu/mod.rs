//! The CPU backend: the reference interpreter, the kernel oracle and the Cranelift JIT that
//! compiles kernels to machine code, and the worker's compute threads. The counter-based RNG they share with every backend is
//! `gt_ir::random`.

pub mod interp;
pub mod jit;
pub mod kernels;
pub(crate) mod small_product;
pub(crate) mod spare;
pub mod threads;
pub(crate) mod typed;
pub(crate) mod value;
pub mod vmath;
