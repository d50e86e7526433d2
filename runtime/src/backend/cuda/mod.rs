//! The CUDA backend: every instruction lowered to kernel-IR kernels ([`gt_ir::kernel::lower`]),
//! each generated as PTX ([`ptx`]) and run through the CUDA driver API (`cust`). The
//! generator and the on-disk kernel cache ([`cache`]) need no CUDA; the device part is
//! behind the `cuda` feature.

pub mod cache;
pub mod ptx;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod staging;

#[cfg(feature = "cuda")]
pub use device::CudaBackend;
