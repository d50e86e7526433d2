//! gt-frontend: ways to write tensor programs. Today the async [`Client`] of a dispatcher and
//! the `.gtir` script runner; the
//! Tensor API, autograd, `nn` and the `gt!` DSL grow here. Everything lowers to
//! `gt_ir::Instr` and runs on any `gt_ir::Executor`.

pub mod client;
pub mod script;

pub use client::{Client, ClientError, ClientOptions, Origin};
pub use script::{run_script, RunOptions, RunSummary, ScriptError, ScriptErrorKind};
