//! gt-passes: composable stream passes over the IR. Today the [`StreamPass`] trait and the
//! [`Pipeline`] that the dispatcher runs on every client stream between receiving and
//! routing; the passes by name ([`registry`]); and the passes: [`HotPath`] (repeated
//! sequences), [`Fuse`] (regions compiled into fused kernels with an e-graph) and [`Dead`]
//! (frees moved up to each value's last use). Shard comes later.

pub mod dead;
pub mod fuse;
pub mod hotpath;
pub mod pipeline;
pub mod registry;
pub mod shard;

pub use dead::{Dead, DeadConfig, DeadStats};
pub use fuse::{Fuse, FuseConfig, FuseStats, Regions};
pub use hotpath::{HotPath, HotPathConfig, HotPathStats};
pub use pipeline::{Emit, Emitted, Meta, PassError, PassNote, Pipeline, StreamPass, StreamTypes, Typing, UnknownPass};
pub use registry::{PassOptions, DEFAULT_PASSES, KNOWN_PASSES};
pub use shard::{PlacementError, Shard, ShardConfig, ShardStats, Unplaced};
