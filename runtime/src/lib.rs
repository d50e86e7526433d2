//! gt-runtime: executes instruction streams. Today that is the reference CPU interpreter
//! ([`Interpreter`]), whose results define what every other backend must compute; the
//! dispatcher, workers and accelerator backends grow here later.

pub mod backend;
pub mod error;

pub use backend::cpu::interp::Interpreter;
pub use error::RuntimeError;
