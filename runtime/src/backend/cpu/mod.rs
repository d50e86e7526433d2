//! The CPU backend: the reference interpreter and the counter-based RNG that every backend
//! reproduces element by element.

pub mod interp;
pub mod kernels;
pub mod random;
