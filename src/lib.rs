//! gt: a multiplexing tensor runtime built like a compiler. This facade re-exports the
//! crates and holds what the binaries share: diagnostic rendering, the filetest runner
//! and the in-process execution of `.gtir` scripts.

pub mod diagnostics;
pub mod filetest;
pub mod script;

pub use gt_frontend as frontend;
pub use gt_ir as ir;
pub use gt_passes as passes;
pub use gt_runtime as runtime;
pub use gt_transport as transport;
