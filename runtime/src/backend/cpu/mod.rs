//! The CPU backend: the reference interpreter, the kernel oracle, the Cranelift JIT that
//! compiles kernels to machine code, and the counter-based RNG that every backend
//! reproduces element by element.

pub mod interp;
pub mod jit;
pub mod kernels;
pub mod random;
