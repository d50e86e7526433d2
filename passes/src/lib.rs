//! gt-passes: composable stream passes over the IR. Today the [`StreamPass`] trait and the
//! [`Pipeline`] that the dispatcher runs on every client stream between receiving and
//! routing; the shard, hotpath and fuse passes plug in here.

pub mod pipeline;

pub use pipeline::{Pipeline, StreamPass};
