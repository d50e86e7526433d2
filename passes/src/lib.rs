//! gt-passes: composable stream passes over the IR. Today the [`StreamPass`] trait and the
//! [`Pipeline`] that the dispatcher runs on every client stream between receiving and
//! routing; the passes by name ([`registry`]); and the passes: [`HotPath`] (repeated
//! sequences). Shard and fuse come later.

pub mod hotpath;
pub mod pipeline;
pub mod registry;

pub use hotpath::{HotPath, HotPathConfig, HotPathStats};
pub use pipeline::{Emit, Emitted, Pipeline, StreamPass, UnknownPass};
pub use registry::{PassOptions, KNOWN_PASSES};
