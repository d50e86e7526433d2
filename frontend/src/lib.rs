//! gt-frontend: ways to write tensor programs. The async [`Client`] of a dispatcher, the
//! `.gtir` script runner, and the Rust Tensor API ([`tensor`]) with autograd ([`autograd`])
//! and [`nn`]. Everything lowers to `gt_ir::Instr` and runs on any `gt_ir::Executor`.

pub mod autograd;
pub mod client;
pub mod config;
pub mod debug;
pub mod nn;
pub mod script;
pub mod signal;
pub mod tensor;

pub use client::{Client, ClientError, ClientOptions, Origin};
pub use script::{run_script, RunOptions, RunSummary, ScriptError, ScriptErrorKind};
pub use tensor::{Tensor, TensorError};
