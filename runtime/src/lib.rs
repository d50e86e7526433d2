//! gt-runtime: executes instruction streams. The reference CPU interpreter
//! ([`Interpreter`]), whose results define what every other backend must compute; the
//! [`worker`] that runs a stream on it; the [`dispatcher`] that multiplexes clients onto
//! workers; and [`embedded`] start-up of both in one process.

pub mod backend;
pub mod cancel;
pub mod collective;
pub mod config;
pub mod dispatcher;
pub mod embedded;
pub mod error;
pub mod exchange;
pub mod worker;

pub use backend::cpu::interp::Interpreter;
pub use embedded::{Cluster, ClusterOptions};
pub use error::RuntimeError;
