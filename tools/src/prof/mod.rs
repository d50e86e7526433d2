//! `gt prof`: profiles recorded under `GT_PROFILE` and what is made of them: reports
//! ([`report`]), the critical path ([`critical`]), configuration sweeps ([`sweep`]), kernel time spread and overlap
//! ([`variance`], [`overlap`]), merged Perfetto traces ([`merge`]) and sweep comparisons
//! ([`compare`]). The format itself is `gt_transport::profile`.

pub mod chart;
pub mod compare;
pub mod critical;
pub mod load;
pub mod merge;
pub mod overlap;
pub mod report;
pub mod sweep;
pub mod variance;

pub use compare::{compare, CompareError, CompareOptions, CompareReport};
pub use load::{load_profile, load_sweep, LoadError, Profile, Sweep, SweepAxis, SweepManifest, SweepRun};
