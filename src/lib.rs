//! gt: a multiplexing tensor runtime built like a compiler. This facade re-exports the
//! crates and holds what the binaries share: diagnostic rendering, the filetest runner,
//! logging set-up, and sessions (embedded cluster or remote dispatcher) that run `.gtir`
//! scripts.

pub mod diagnostics;
pub mod filetest;
pub mod kernels;
pub mod logging;
pub mod mirror;
pub mod passdump;
pub mod script;
pub mod session;

pub use gt_frontend as frontend;
pub use gt_ir as ir;
pub use gt_passes as passes;
pub use gt_runtime as runtime;
pub use gt_transport as transport;
