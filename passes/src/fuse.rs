//! `fuse`: compiles regions of the stream into `fused` instructions, each one kernel of the
//! kernel IR that never writes its intermediates to memory. A region is the stream between
//! boundaries: with [`Regions::All`] (`GT_COMPILE=1`) every stretch between sync points,
//! hot-path markers and a window limit; with [`Regions::HotPaths`] (`GT_AUTO_COMPILE=1`) only
//! each repetition of a hot path (between `hotpath_start` and `hotpath_end`).
//!
//! For each region: the elementwise expressions go through an e-graph (`egraph`: algebraic
//! rewrites, extraction by bytes read plus arithmetic), then the partitioner (`build`)
//! makes one kernel per value that must exist in memory: values live after the region (not
//! freed in it), values read by instructions it does not fuse, and values that cannot be
//! recomputed where they are read. Everything else is computed inside those kernels.
//!
//! The pass types every instruction it sees (the verifier's rules), so it needs the whole
//! stream of a client; an instruction that does not type ends the region and goes through
//! unchanged, for the dispatcher to report.

mod build;
mod egraph;

use crate::pipeline::{Emit, StreamPass};
use gt_ir::verify::shape;
use gt_ir::{Instr, TensorType, ValueId};
use std::collections::HashMap;
use std::time::Duration;

pub use egraph::Limits;

/// Which stretches of the stream are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Regions {
    /// Every stretch between boundaries (`GT_COMPILE=1`).
    #[default]
    All,
    /// Only hot-path repetitions (`GT_AUTO_COMPILE=1`, with the hotpath pass before this one).
    HotPaths,
}

/// Settings of the fuse pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FuseConfig {
    /// Which regions.
    pub regions: Regions,
    /// Most instructions in one region (the pass holds at most this many).
    pub window: usize,
    /// Also rewrite `exp(log x)` and `log(exp x)` to `x` (wrong outside their domain).
    pub fast_math: bool,
    /// Bounds of e-graph saturation.
    pub limits: Limits,
}

impl Default for FuseConfig {
    fn default() -> FuseConfig {
        FuseConfig { regions: Regions::All, window: 512, fast_math: false, limits: Limits::default() }
    }
}

/// What the pass did, summed over regions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FuseStats {
    /// Regions compiled.
    pub regions: u64,
    /// Instructions that entered regions.
    pub instructions_in: u64,
    /// Instructions that came out of regions (kernels, kept instructions, frees).
    pub instructions_out: u64,
    /// `fused` instructions made.
    pub kernels: u64,
    /// Values computed inside kernels, never written to memory.
    pub elided: u64,
    /// Kernels that could not be built (their instruction was kept).
    pub fallbacks: u64,
    /// E-nodes, summed over regions.
    pub egraph_nodes: u64,
    /// E-classes, summed over regions.
    pub egraph_classes: u64,
    /// Saturation iterations, summed.
    pub egraph_iterations: u64,
    /// Time in the e-graph and partitioner.
    pub time: Duration,
    /// The longest one region took.
    pub max_region_time: Duration,
}

/// The fuse pass.
#[derive(Debug)]
pub struct Fuse {
    config: FuseConfig,
    /// The type of every live value of the stream.
    types: HashMap<ValueId, TensorType>,
    /// Types of the values the held region names (kept when the region frees them).
    region_types: HashMap<ValueId, TensorType>,
    region: Vec<Instr>,
    /// Inside a hot-path repetition.
    in_hot: bool,
    stats: FuseStats,
}

impl Fuse {
    /// A fuse pass with these settings.
    pub fn new(config: FuseConfig) -> Fuse {
        Fuse {
            config,
            types: HashMap::new(),
            region_types: HashMap::new(),
            region: Vec::new(),
            in_hot: false,
            stats: FuseStats::default(),
        }
    }

    /// What the pass did so far.
    pub fn fuse_stats(&self) -> FuseStats {
        self.stats
    }

    fn collecting(&self) -> bool {
        match self.config.regions {
            Regions::All => true,
            Regions::HotPaths => self.in_hot,
        }
    }

    /// Records the types an instruction defines and forgets what it frees; `false` when it
    /// does not type (the dispatcher will report it).
    fn track(&mut self, instr: &Instr) -> bool {
        let types = &self.types;
        let Ok(results) = shape::infer(instr, &|v| types.get(&v).cloned().ok_or(shape::TypeError::UnknownValue(v)))
        else {
            return false;
        };
        if let Instr::Free { src } = instr {
            self.types.remove(src);
        }
        for (v, t) in instr.results().into_iter().zip(results) {
            self.types.insert(v, t);
        }
        true
    }

    /// Compiles and releases the held region.
    fn release(&mut self, out: &mut Emit) {
        if self.region.is_empty() {
            return;
        }
        let region = std::mem::take(&mut self.region);
        let types = std::mem::take(&mut self.region_types);
        // A region with nothing to fuse goes out as it came.
        let worth = region.iter().filter(|i| !matches!(i, Instr::Free { .. })).count() >= 2;
        if !worth {
            for i in region {
                out.keep(i);
            }
            return;
        }
        let start = std::time::Instant::now();
        self.stats.regions += 1;
        let n_in = region.len();
        self.stats.instructions_in += n_in as u64;
        let (instrs, stats) = build::Region::build(region, &types, self.config.fast_math, self.config.limits);
        let took = start.elapsed();
        self.stats.time += took;
        self.stats.max_region_time = self.stats.max_region_time.max(took);
        self.stats.instructions_out += instrs.len() as u64;
        self.stats.kernels += stats.kernels;
        self.stats.elided += stats.elided;
        self.stats.fallbacks += stats.fallbacks;
        self.stats.egraph_nodes += stats.saturation.nodes as u64;
        self.stats.egraph_classes += stats.saturation.classes as u64;
        self.stats.egraph_iterations += stats.saturation.iterations as u64;
        tracing::debug!(
            target: "gt::compile",
            "fuse: region of {} instructions -> {} ({} kernels, {} values never written); e-graph {} nodes, {} classes, {} iterations; {:.3} ms",
            n_in,
            instrs.len(),
            stats.kernels,
            stats.elided,
            stats.saturation.nodes,
            stats.saturation.classes,
            stats.saturation.iterations,
            took.as_secs_f64() * 1e3,
        );
        for i in instrs {
            if matches!(i, Instr::Fused { .. }) {
                out.inject(i);
            } else {
                out.keep(i);
            }
        }
    }
}

impl StreamPass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn run(&mut self, instr: Instr, out: &mut Emit) {
        match instr {
            Instr::HotPathStart { .. } | Instr::HotPathEnd { .. } => {
                self.release(out);
                self.in_hot = matches!(instr, Instr::HotPathStart { .. });
                out.keep(instr);
            }
            _ if !self.collecting() => {
                self.track(&instr);
                out.keep(instr);
            }
            _ => {
                // A value defined twice in the region, or defined after the region read its
                // old value (a script's loop body), would break the region's
                // single-definition view: the region ends before it. (Redefining a live
                // value the region never names is fine: the new one replaces it.)
                let redefines = instr.results().iter().any(|r| self.region_types.contains_key(r));
                if redefines {
                    self.release(out);
                }
                for v in instr.operands() {
                    if let Some(t) = self.types.get(&v) {
                        self.region_types.insert(v, t.clone());
                    }
                }
                if !self.track(&instr) {
                    self.release(out);
                    out.keep(instr);
                    return;
                }
                for v in instr.results() {
                    if let Some(t) = self.types.get(&v) {
                        self.region_types.insert(v, t.clone());
                    }
                }
                self.region.push(instr);
                if self.region.len() >= self.config.window {
                    self.release(out);
                }
            }
        }
    }

    fn flush(&mut self, out: &mut Emit) {
        self.release(out);
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("regions", s.regions),
            ("instructions_in", s.instructions_in),
            ("instructions_out", s.instructions_out),
            ("kernels", s.kernels),
            ("values_elided", s.elided),
            ("fallbacks", s.fallbacks),
            ("egraph_nodes", s.egraph_nodes),
            ("egraph_classes", s.egraph_classes),
            ("egraph_iterations", s.egraph_iterations),
            ("time_us", s.time.as_micros() as u64),
            ("max_region_us", s.max_region_time.as_micros() as u64),
        ]
    }
}
