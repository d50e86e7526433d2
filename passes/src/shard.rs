//! `shard`: spreads a client's values over workers as its signals' placements say
//! (`signal_start "x" shard axis=0 workers=[0, 1]`, from the client's config), rewriting each
//! instruction on spread values into per-shard instructions plus the collectives and moves
//! their layouts need.
//!
//! Every value lives in one or more *representations*: whole on the client's home worker
//! under its own id (where a client's values live when nothing is placed), split along an
//! axis over an ordered list of workers (piece `i` on worker `i`, sizes as
//! `numpy.array_split` gives them), or as copies on a set of workers. Pieces and copies are
//! named by the pass's own ids (from [`FIRST_PASS_ID`]). An instruction gets the cheapest
//! plan its operands' representations allow:
//! - elementwise ops and casts run shard by shard (an operand broadcast along the split axis
//!   is replicated on the shards' workers); on copies, copy by copy;
//! - `x[rows split] @ w` is data parallel (`w` replicated), as is a batched product split
//!   along a batch axis, `x @ w[columns split]` column parallel (`x` replicated),
//!   `x[k split] @ w[k split]` row parallel (partial products, then `all_reduce sum`);
//!   a product with a vector likewise (the matrix's rows or columns, or k of a dot product);
//!   `x @ x` split along k copies `x` first (one value cannot be split two ways at once);
//! - a slice that takes the split axis whole, and a `concat` or `split` along another axis,
//!   run piece by piece; a slice that cuts the split axis, a `concat`, `split` or `chunk`
//!   along it, and a reshape merging or dividing it assemble each result piece from the
//!   stretches the workers hold, each element moved at most once, straight to the worker
//!   whose piece it lands in ([`relayout`](self::relayout));
//! - a reduction along other axes runs shard by shard; over the split axis, partials and an
//!   `all_reduce` (a mean divides the summed partials by the element count);
//! - partials of halves that are summed across workers (a sum, a mean, a row-parallel
//!   product) are computed and summed in `f32` and each result rounded once, as one worker
//!   accumulates halves in `f32`;
//! - anything else gathers its operands whole on the home worker first (counted as
//!   `gathers`), so it is correct before it is fast.
//!
//! Inside a scope with a placement, results are then split (`shard`) or copied
//! (`replicated`) as it says, except, in a backward signal, a result its plan spread over the
//! scope's workers already, which keeps that layout (a transposed batch stays split along its
//! new axis, a gradient summed by an `all_reduce` stays copied, so data-parallel training
//! keeps its parameters replicated); a result too small to split (rank at most the axis, or
//! fewer elements along it than workers) keeps the representation its plan gave. A read
//! ([`StreamPass::materialize`]) assembles the value whole at home first. With
//! [`ShardConfig::auto`] (`GT_AUTO_SHARD=1`) the pass splits large matmuls and elementwise
//! ops over every worker by itself; what they compute stays split until something reads it.

mod relayout;

use crate::pipeline::{Emit, Emitted, StreamPass, StreamTypes, FIRST_PASS_ID};
use foldhash::{HashMap, HashMapExt};
use gt_ir::verify::shape::{array_split, normalize_axes, normalize_axis, resolve_slice, AxisSlice};
use gt_ir::{
    BinaryOp, CollectiveOp, DType, Instr, Operand, Placement, ReduceOp, SliceItem, SplitSpec, TensorType, ValueId,
};

/// Settings of the shard pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardConfig {
    /// Split large work over every worker without being told (`GT_AUTO_SHARD=1`): a matmul
    /// whose left operand, or an elementwise op whose result, holds at least `threshold`
    /// bytes runs split along its rows (its leading axis).
    pub auto: bool,
    /// The size from which `auto` splits (`GT_SHARD_THRESHOLD`, bytes).
    pub threshold: u64,
}

impl Default for ShardConfig {
    fn default() -> ShardConfig {
        ShardConfig { auto: false, threshold: 16 << 20 }
    }
}

/// A placement that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A worker index past the workers the dispatcher has.
    #[error("signal `{signal}` places values on worker {worker}, but there {}", match .workers { 0 => "are no workers".to_string(), 1 => "is 1 worker (index 0)".to_string(), n => format!("are {n} workers (indices 0 to {})", n - 1) })]
    NoSuchWorker {
        /// The signal.
        signal: String,
        /// The worker named.
        worker: u32,
        /// How many there are.
        workers: usize,
    },
    /// The same worker twice.
    #[error("signal `{signal}` names worker {worker} twice")]
    DuplicateWorker {
        /// The signal.
        signal: String,
        /// The worker.
        worker: u32,
    },
    /// A worker the dispatcher lost.
    #[error(
        "signal `{signal}` places values on worker {worker}, which is gone (its process ended or its connection broke)"
    )]
    GoneWorker {
        /// The signal.
        signal: String,
        /// The worker named.
        worker: u32,
    },
}

/// A placement left unapplied to a value, which stays whole at home (the documented
/// fallback, counted as `unsplit` in `--pass-stats`); written to the instruction log once per
/// signal and reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unplaced {
    /// The axis is not one of the value's.
    #[error("signal `{signal}` splits along axis {axis}, but {value} is {ty} (rank {rank}): it stays whole on its home worker")]
    AxisOutOfRange {
        /// The signal.
        signal: String,
        /// The value.
        value: ValueId,
        /// Its type.
        ty: TensorType,
        /// The axis asked.
        axis: i64,
        /// The value's rank.
        rank: usize,
    },
    /// Fewer elements along the axis than workers.
    #[error("signal `{signal}` splits along axis {axis} over {workers} workers, but {value} is {ty}: fewer than one element per worker, so it stays whole on its home worker")]
    TooSmall {
        /// The signal.
        signal: String,
        /// The value.
        value: ValueId,
        /// Its type.
        ty: TensorType,
        /// The axis asked.
        axis: i64,
        /// The workers it names.
        workers: usize,
    },
    /// One worker: a split over it is the value itself.
    #[error("signal `{signal}` splits its values, but only one worker is up: they stay whole on it")]
    OneWorker {
        /// The signal.
        signal: String,
    },
}

impl Unplaced {
    /// The signal and the kind of reason, so that each is logged once.
    fn key(&self) -> (String, u8) {
        match self {
            Unplaced::AxisOutOfRange { signal, .. } => (signal.clone(), 0),
            Unplaced::TooSmall { signal, .. } => (signal.clone(), 1),
            Unplaced::OneWorker { signal } => (signal.clone(), 2),
        }
    }
}

/// A value split along `axis`: piece `i` is `parts[i].1` on worker `parts[i].0`.
#[derive(Debug, Clone, PartialEq)]
struct Split {
    axis: usize,
    parts: Vec<(u32, ValueId)>,
}

impl Split {
    fn workers(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.0).collect()
    }
}

/// Where a spread value lives (values the pass has no entry for are whole at home only).
#[derive(Debug, Clone, Default)]
struct Dist {
    /// Whole on the home worker under its own id.
    home: bool,
    split: Option<Split>,
    /// Copies, by worker.
    replicas: Vec<(u32, ValueId)>,
}

impl Dist {
    /// Split along `axis` into `parts`, and nowhere else.
    fn pieces(axis: usize, parts: Vec<(u32, ValueId)>) -> Dist {
        Dist { home: false, split: Some(Split { axis, parts }), replicas: Vec::new() }
    }

    fn replica_on(&self, w: u32) -> Option<ValueId> {
        self.replicas.iter().find(|r| r.0 == w).map(|r| r.1)
    }
}

/// What a scope asks of the values computed in it (workers resolved and checked).
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Split { axis: i64, workers: Vec<u32> },
    Replicated { workers: Vec<u32> },
}

/// What the pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Client instructions run shard by shard.
    pub sharded: u64,
    /// Client instructions run once per copy.
    pub replicated: u64,
    /// Collectives emitted (`all_reduce`, `all_gather`, `broadcast`).
    pub collectives: u64,
    /// Point-to-point moves emitted.
    pub moves: u64,
    /// Values split by the pass (from a whole value or from copies).
    pub scatters: u64,
    /// Spread values gathered whole at home because an instruction has no sharded rule.
    pub gathers: u64,
    /// Spread values assembled at home for a read.
    pub reads: u64,
    /// Results a scope asked to split that were too small (kept as they came); not counted:
    /// gradients a backward scope keeps as their plan spread them.
    pub unsplit: u64,
    /// Instructions `GT_AUTO_SHARD` split by itself.
    pub auto: u64,
    /// Placements refused (a worker that does not exist, one named twice).
    pub refused: u64,
}

/// The shard pass.
#[derive(Debug)]
pub struct Shard {
    config: ShardConfig,
    /// The dispatcher's workers, by index: whether each is up (a gone one keeps its index).
    alive: Vec<bool>,
    /// The indices of the workers that are up ("every worker" of a placement).
    live: Vec<u32>,
    /// The client's values' types (every instruction's results, as the pipeline typed them).
    types: StreamTypes,
    dist: HashMap<ValueId, Dist>,
    /// Open signal scopes, innermost last, with what each asks and whether it is a backward
    /// signal's.
    scopes: Vec<(String, Option<Want>, bool)>,
    next_id: u32,
    free_ids: Vec<ValueId>,
    /// The representations a plan gave the results of the instruction being taken (they
    /// replace the old ones once the plan has read those).
    produced: Vec<(ValueId, Dist)>,
    stats: ShardStats,
    /// The unapplied placements already written to the log (per signal and reason).
    noted: foldhash::HashSet<(String, u8)>,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard::new(ShardConfig::default())
    }
}

/// Every item a full range, then `start..end` on `axis`.
fn range_on(axis: usize, start: usize, end: usize) -> Vec<SliceItem> {
    let mut index = vec![SliceItem::Range { start: None, end: None, step: 1 }; axis];
    index.push(SliceItem::Range { start: Some(start as i64), end: Some(end as i64), step: 1 });
    index
}

/// `instr` with its results and operands renamed, in the order `Instr::results` and
/// `Instr::operands` list them.
fn renamed(instr: &Instr, results: &[ValueId], operands: &[ValueId]) -> Instr {
    let mut i = instr.clone();
    let mut next = results.iter().chain(operands).copied();
    i.visit_values_mut(&mut |v| {
        if let Some(n) = next.next() {
            *v = n;
        }
    });
    i
}

/// Where axis `axis` of a `from`-shaped value is in the `to`-shaped result of a reshape (or,
/// `broadcast`, a broadcast), when every element's index along it is kept: the same length,
/// and the same leading axes before it once size-1 axes are dropped (and, for a reshape,
/// everything after it keeps its element count).
fn kept_axis(from: &[usize], to: &[usize], axis: usize, broadcast: bool) -> Option<usize> {
    if broadcast {
        let a = axis + to.len().checked_sub(from.len())?;
        return (to[a] == from[axis]).then_some(a);
    }
    let before = |dims: &[usize]| -> Vec<usize> { dims.iter().copied().filter(|&d| d != 1).collect() };
    let inner: usize = from[axis + 1..].iter().product();
    (0..to.len()).find(|&a| {
        to[a] == from[axis]
            && before(&to[..a]) == before(&from[..axis])
            && to[a + 1..].iter().product::<usize>() == inner
    })
}

/// Whether partial results of `op` that are combined across workers into a `ty` are
/// computed and summed in `f32`: a sum (or product) of halves accumulates in `f32` and rounds
/// once, as PyTorch and the interpreter do, so its partials must not be rounded to the half
/// first (a max or min is exact in any dtype).
fn sums_in_f32(ty: &TensorType, op: ReduceOp) -> bool {
    ty.dtype.is_half() && matches!(op, ReduceOp::Sum | ReduceOp::Mean)
}

impl Shard {
    /// A shard pass; nothing is spread until a scope with a placement opens (or, with
    /// `auto`, until work is large enough).
    pub fn new(config: ShardConfig) -> Shard {
        Shard {
            config,
            alive: vec![true],
            live: vec![0],
            types: StreamTypes::default(),
            dist: HashMap::new(),
            scopes: Vec::new(),
            next_id: FIRST_PASS_ID,
            free_ids: Vec::new(),
            produced: Vec::new(),
            stats: ShardStats::default(),
            noted: <foldhash::HashSet<_> as foldhash::HashSetExt>::new(),
        }
    }

    /// What the pass did so far.
    pub fn shard_stats(&self) -> ShardStats {
        self.stats
    }

    fn fresh(&mut self) -> ValueId {
        self.free_ids.pop().unwrap_or_else(|| {
            let v = ValueId(self.next_id);
            self.next_id = self.next_id.saturating_add(1);
            v
        })
    }

    fn emit(&self, out: &mut Emit, instr: Instr, place: Vec<u32>) {
        let seq = out.current.seq;
        out.inject_at(instr, seq, place);
    }

    /// Frees one of the pass's ids (on whatever worker holds it) and recycles it.
    fn free_own(&mut self, out: &mut Emit, v: ValueId) {
        self.emit(out, Instr::Free { src: v }, Vec::new());
        self.free_ids.push(v);
    }

    fn ty(&self, v: ValueId) -> Option<TensorType> {
        self.types.get(v).cloned()
    }

    fn is_spread(&self, v: ValueId) -> bool {
        self.dist.get(&v).is_some_and(|d| !d.home || d.split.is_some() || !d.replicas.is_empty())
    }

    /// The placement the innermost scope that has one asks for.
    fn want(&self) -> Option<&Want> {
        self.scopes.iter().rev().find_map(|(_, w, _)| w.as_ref())
    }

    /// Whether the placement in force applies to gradients: the scope that has it, or one
    /// opened inside it (autograd's backward signal without a placement of its own, when the
    /// training step runs inside the forward scope), is a backward signal's.
    fn placing_gradients(&self) -> bool {
        for (_, want, backward) in self.scopes.iter().rev() {
            if *backward {
                return true;
            }
            if want.is_some() {
                return false;
            }
        }
        false
    }

    /// Checks a placement against the workers there are (an empty list: all of them).
    fn resolve(&self, signal: &str, place: &Placement) -> Result<Want, PlacementError> {
        let listed = match place {
            Placement::Split { workers, .. } | Placement::Replicated { workers } => workers,
        };
        let workers: Vec<u32> = if listed.is_empty() { self.live.clone() } else { listed.clone() };
        for (i, &w) in workers.iter().enumerate() {
            match self.alive.get(w as usize) {
                None => {
                    return Err(PlacementError::NoSuchWorker {
                        signal: signal.to_string(),
                        worker: w,
                        workers: self.alive.len(),
                    })
                }
                Some(false) => return Err(PlacementError::GoneWorker { signal: signal.to_string(), worker: w }),
                Some(true) => {}
            }
            if workers[..i].contains(&w) {
                return Err(PlacementError::DuplicateWorker { signal: signal.to_string(), worker: w });
            }
        }
        Ok(match place {
            Placement::Split { axis, .. } => Want::Split { axis: *axis, workers },
            Placement::Replicated { .. } => Want::Replicated { workers },
        })
    }

    /// Puts `x` whole at home under its own id; whether anything had to move.
    fn ensure_home(&mut self, out: &mut Emit, x: ValueId) -> bool {
        let Some(d) = self.dist.get(&x).cloned() else { return false };
        if d.home {
            return false;
        }
        if let Some(&(_, copy)) = d.replicas.first() {
            self.emit(out, Instr::Collective { dsts: vec![x], op: CollectiveOp::Move, srcs: vec![copy] }, Vec::new());
            self.stats.moves += 1;
        } else if let Some(split) = d.split.as_ref().filter(|s| s.parts.len() == 1) {
            let srcs = vec![split.parts[0].1];
            self.emit(out, Instr::Collective { dsts: vec![x], op: CollectiveOp::Move, srcs }, Vec::new());
            self.stats.moves += 1;
        } else if let Some(split) = &d.split {
            let mut pieces = Vec::new();
            for &(_, part) in &split.parts {
                let p = self.fresh();
                self.emit(
                    out,
                    Instr::Collective { dsts: vec![p], op: CollectiveOp::Move, srcs: vec![part] },
                    Vec::new(),
                );
                self.stats.moves += 1;
                pieces.push(p);
            }
            let axis = split.axis as i64;
            self.emit(out, Instr::Concat { dst: x, srcs: pieces.clone(), axis }, Vec::new());
            for p in pieces {
                self.free_own(out, p);
            }
        } else {
            return false;
        }
        if let Some(d) = self.dist.get_mut(&x) {
            d.home = true;
        }
        true
    }

    /// Splits `x` along `axis` over `workers` (from copies on them, or from home); its pieces.
    fn ensure_split(&mut self, out: &mut Emit, x: ValueId, axis: usize, workers: &[u32]) -> Vec<ValueId> {
        let d = self.dist.get(&x).cloned().unwrap_or(Dist { home: true, ..Dist::default() });
        if let Some(s) = &d.split {
            if s.axis == axis && s.workers() == workers {
                return s.parts.iter().map(|p| p.1).collect();
            }
        }
        let Some(ty) = self.ty(x) else { return Vec::new() };
        let sizes = array_split(ty.shape.0.get(axis).copied().unwrap_or(0), workers.len());
        let mut parts = Vec::new();
        let moved = d.split.as_ref().filter(|s| s.axis == axis && s.parts.len() == workers.len());
        if let Some(old) = moved {
            // The same pieces elsewhere (a pipeline stage's values going to the next): each
            // moves straight to its new worker.
            for (&w, &(from, p)) in workers.iter().zip(&old.parts) {
                if from == w {
                    parts.push((w, p));
                    continue;
                }
                let q = self.fresh();
                self.emit(out, Instr::Collective { dsts: vec![q], op: CollectiveOp::Move, srcs: vec![p] }, vec![w]);
                self.stats.moves += 1;
                parts.push((w, q));
            }
        } else if workers.iter().all(|&w| d.replica_on(w).is_some()) {
            // Each worker slices its own copy: no communication.
            let mut start = 0;
            for (&w, &n) in workers.iter().zip(&sizes) {
                let p = self.fresh();
                let src = d.replica_on(w).unwrap_or(x);
                self.emit(out, Instr::Slice { dst: p, src, index: range_on(axis, start, start + n) }, vec![w]);
                parts.push((w, p));
                start += n;
            }
        } else {
            self.ensure_home(out, x);
            let pieces: Vec<ValueId> = workers.iter().map(|_| self.fresh()).collect();
            let spec = SplitSpec::Sizes(sizes);
            self.emit(out, Instr::Split { dsts: pieces.clone(), src: x, axis: axis as i64, spec }, Vec::new());
            for (&w, piece) in workers.iter().zip(pieces) {
                let p = self.fresh();
                self.emit(out, Instr::Collective { dsts: vec![p], op: CollectiveOp::Move, srcs: vec![piece] }, vec![w]);
                self.stats.moves += 1;
                self.free_own(out, piece);
                parts.push((w, p));
            }
        }
        if moved.is_none() {
            self.stats.scatters += 1;
        }
        if let Some(old) = &d.split {
            for &(_, p) in &old.parts {
                if !parts.iter().any(|q| q.1 == p) {
                    self.free_own(out, p);
                }
            }
        }
        let ids = parts.iter().map(|p| p.1).collect();
        let entry = self.dist.entry(x).or_insert(Dist { home: true, ..Dist::default() });
        entry.split = Some(Split { axis, parts });
        ids
    }

    /// Copies `x` onto every one of `workers` (gathering its pieces there, or broadcasting it
    /// from home); the copies, in `workers` order.
    fn ensure_replicated(&mut self, out: &mut Emit, x: ValueId, workers: &[u32]) -> Vec<ValueId> {
        let d = self.dist.get(&x).cloned().unwrap_or(Dist { home: true, ..Dist::default() });
        let missing: Vec<u32> = workers.iter().copied().filter(|&w| d.replica_on(w).is_none()).collect();
        if !missing.is_empty() {
            let copies: Vec<ValueId> = missing.iter().map(|_| self.fresh()).collect();
            match &d.split {
                Some(s) if s.workers() == missing => {
                    let srcs = s.parts.iter().map(|p| p.1).collect();
                    let op = CollectiveOp::AllGather { axis: s.axis as i64 };
                    self.emit(out, Instr::Collective { dsts: copies.clone(), op, srcs }, missing.clone());
                }
                _ => {
                    self.ensure_home(out, x);
                    let op = CollectiveOp::Broadcast;
                    self.emit(out, Instr::Collective { dsts: copies.clone(), op, srcs: vec![x] }, missing.clone());
                }
            }
            self.stats.collectives += 1;
            let entry = self.dist.entry(x).or_insert(Dist { home: true, ..Dist::default() });
            entry.replicas.extend(missing.into_iter().zip(copies));
        }
        let d = &self.dist[&x];
        workers.iter().map(|&w| d.replica_on(w).unwrap_or(x)).collect()
    }

    /// Frees every representation the pass made of `x` (not its home copy) and forgets it;
    /// whether it was whole at home.
    fn forget(&mut self, out: &mut Emit, x: ValueId) -> bool {
        let Some(d) = self.dist.remove(&x) else { return true };
        for (_, p) in d.split.iter().flat_map(|s| s.parts.iter().copied()).chain(d.replicas.iter().copied()) {
            self.free_own(out, p);
        }
        d.home
    }

    /// Runs `instr` once per part, part `k` on `workers[k]` reading `operands[k]`; each
    /// part's results.
    fn per_part(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        workers: &[u32],
        operands: &[Vec<ValueId>],
    ) -> Vec<Vec<ValueId>> {
        self.per_part_with(out, instr, workers, operands, &|_, i| i.clone())
    }

    /// [`Shard::per_part`], part `k` running `adapt(k, instr)` (a reshape's target shape
    /// is the piece's).
    fn per_part_with(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        workers: &[u32],
        operands: &[Vec<ValueId>],
        adapt: &dyn Fn(usize, &Instr) -> Instr,
    ) -> Vec<Vec<ValueId>> {
        let n = instr.num_results();
        let mut results = Vec::new();
        for (k, (&w, ops)) in workers.iter().zip(operands).enumerate() {
            let rs: Vec<ValueId> = (0..n).map(|_| self.fresh()).collect();
            self.emit(out, renamed(&adapt(k, instr), &rs, ops), vec![w]);
            results.push(rs);
        }
        results
    }

    /// Operand lists per part: column `j` is operand `j`'s representation on each worker.
    fn columns(per_operand: Vec<Vec<ValueId>>, parts: usize) -> Vec<Vec<ValueId>> {
        (0..parts).map(|k| per_operand.iter().map(|col| col[k]).collect()).collect()
    }

    /// Runs `instr` on copies of its operands on `workers`; its results become copies.
    fn replicated(&mut self, out: &mut Emit, instr: &Instr, workers: &[u32]) {
        let cols: Vec<Vec<ValueId>> =
            instr.operands().into_iter().map(|v| self.ensure_replicated(out, v, workers)).collect();
        let results = self.per_part(out, instr, workers, &Self::columns(cols, workers.len()));
        for (j, r) in instr.results().into_iter().enumerate() {
            let replicas = workers.iter().zip(&results).map(|(&w, rs)| (w, rs[j])).collect();
            self.produced.push((r, Dist { home: false, split: None, replicas }));
        }
        self.stats.replicated += 1;
    }

    /// Runs `instr` shard by shard, operand `j` split along `axes[j]` (`None`: replicated).
    fn sharded(&mut self, out: &mut Emit, instr: &Instr, workers: &[u32], axes: &[Option<usize>], result_axis: usize) {
        self.sharded_with(out, instr, workers, axes, result_axis, &|_, i| i.clone());
    }

    /// [`Shard::sharded`] with each part's instruction adapted (see [`Shard::per_part_with`]).
    fn sharded_with(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        workers: &[u32],
        axes: &[Option<usize>],
        result_axis: usize,
        adapt: &dyn Fn(usize, &Instr) -> Instr,
    ) {
        let operands = instr.operands();
        let cols: Vec<Vec<ValueId>> = operands
            .iter()
            .zip(axes)
            .map(|(&v, a)| match a {
                Some(a) => self.ensure_split(out, v, *a, workers),
                None => self.ensure_replicated(out, v, workers),
            })
            .collect();
        let results = self.per_part_with(out, instr, workers, &Self::columns(cols, workers.len()), adapt);
        for (j, r) in instr.results().into_iter().enumerate() {
            let parts = workers.iter().zip(&results).map(|(&w, rs)| (w, rs[j])).collect();
            self.produced.push((r, Dist::pieces(result_axis, parts)));
        }
        self.stats.sharded += 1;
    }

    /// A split operand of `instr` and its axis, if any.
    fn split_of(&self, v: ValueId) -> Option<&Split> {
        self.dist.get(&v).and_then(|d| d.split.as_ref())
    }

    fn replicas_of(&self, v: ValueId) -> Option<Vec<u32>> {
        self.dist.get(&v).filter(|d| !d.replicas.is_empty()).map(|d| d.replicas.iter().map(|r| r.0).collect())
    }

    /// Plans and emits an instruction that reads spread values (or runs in a placed scope);
    /// `false` when it has no sharded rule (the caller runs it at home).
    fn plan(&mut self, out: &mut Emit, instr: &Instr, results: &[TensorType]) -> bool {
        if let Some(Want::Replicated { workers }) = self.want().cloned() {
            self.replicated(out, instr, &workers);
            return true;
        }
        let operands = instr.operands();
        let types: Option<Vec<TensorType>> = operands.iter().map(|&v| self.ty(v)).collect();
        let Some(types) = types else { return false };
        match instr {
            Instr::Unary { .. } | Instr::Binary { .. } | Instr::Where { .. } | Instr::Cast { .. } => {
                let out_ty = &results[0];
                let rank = out_ty.shape.rank();
                // A split operand that is not broadcast along its split axis sets the plan.
                let lead = operands.iter().zip(&types).find_map(|(&v, t)| {
                    let s = self.split_of(v)?;
                    let a = s.axis + rank - t.shape.rank();
                    (t.shape.0[s.axis] == out_ty.shape.0[a]).then(|| (a, s.workers()))
                });
                if let Some((a, workers)) = lead {
                    let axes: Vec<Option<usize>> = types
                        .iter()
                        .map(|t| {
                            let lead = rank - t.shape.rank();
                            (a >= lead && t.shape.0[a - lead] == out_ty.shape.0[a]).then(|| a - lead)
                        })
                        .collect();
                    self.sharded(out, instr, &workers, &axes, a);
                    return true;
                }
                if let Some(workers) = operands.iter().find_map(|&v| self.replicas_of(v)) {
                    self.replicated(out, instr, &workers);
                    return true;
                }
                false
            }
            Instr::MatMul { lhs, rhs, .. } => {
                let (l, r) = (types[0].shape.rank(), types[1].shape.rank());
                let (ls, rs) = (self.split_of(*lhs).cloned(), self.split_of(*rhs).cloned());
                if l < 2 || r < 2 {
                    return self.vector_product(out, instr, (l, r), (ls, rs), &results[0]);
                }
                // Data parallel: rows or a batch axis of x, or a batch axis of w (attention's
                // `q @ k^T` per head): each operand split along that batch axis where it has it
                // at full length, else copied.
                let out_dims = &results[0].shape.0;
                let n = out_dims.len();
                let batch = ls
                    .as_ref()
                    .filter(|s| s.axis + 2 <= l)
                    .map(|s| (s.axis + n - l, s.workers()))
                    .or_else(|| rs.as_ref().filter(|s| s.axis + 2 < r).map(|s| (s.axis + n - r, s.workers())));
                if let Some((a, workers)) = batch {
                    // Axis `a` of the result in an operand of rank `k` (for w, a batch axis only).
                    let along = |t: &TensorType, batch_only: bool| {
                        let k = t.shape.rank();
                        let b = a.checked_sub(n - k)?;
                        (t.shape.0[b] == out_dims[a] && (!batch_only || b + 2 < k)).then_some(b)
                    };
                    self.sharded(out, instr, &workers, &[along(&types[0], false), along(&types[1], true)], a);
                    return true;
                }
                match (&ls, &rs) {
                    // Column parallel: x replicated, columns of w.
                    (None, Some(s)) if s.axis == r - 1 => {
                        self.sharded(out, instr, &s.workers(), &[None, Some(r - 1)], n - 1);
                        true
                    }
                    // `x @ x` split along k would need x in two layouts at once (re-splitting
                    // it for the right operand frees the left operand's pieces): copies of x,
                    // then rows of the copies (sliced where they are) data parallel.
                    (Some(s), _) if lhs == rhs && s.axis == l - 1 => {
                        let workers = s.workers();
                        self.ensure_replicated(out, *rhs, &workers);
                        self.sharded(out, instr, &workers, &[Some(l - 2), None], n - 2);
                        true
                    }
                    // Row parallel: both split along k; partial products, then their sum.
                    (Some(s), _) | (None, Some(s))
                        if (ls.is_some() && s.axis == l - 1) || (ls.is_none() && s.axis == r - 2) =>
                    {
                        self.row_parallel(out, instr, (l - 1, r - 2), &s.workers(), &results[0]);
                        true
                    }
                    _ => match self.replicas_of(*lhs).or_else(|| self.replicas_of(*rhs)) {
                        Some(workers) => {
                            self.replicated(out, instr, &workers);
                            true
                        }
                        None => false,
                    },
                }
            }
            Instr::Reduce { op, src, axes, keepdim, .. } => {
                let rank = types[0].shape.rank();
                let reduced = match axes {
                    Some(a) => match normalize_axes(a, rank) {
                        Ok(a) => a,
                        Err(_) => return false,
                    },
                    None => (0..rank).collect(),
                };
                if let Some(s) = self.split_of(*src).cloned() {
                    let workers = s.workers();
                    if !reduced.contains(&s.axis) {
                        let before = reduced.iter().filter(|&&a| a < s.axis).count();
                        let axis = if *keepdim { s.axis } else { s.axis - before };
                        self.sharded(out, instr, &workers, &[Some(s.axis)], axis);
                        return true;
                    }
                    // Over the split axis: each shard's partial, then their combination.
                    let partial_op = if *op == ReduceOp::Mean { ReduceOp::Sum } else { *op };
                    let partial = Instr::Reduce {
                        dst: instr.results()[0],
                        op: partial_op,
                        src: *src,
                        axes: axes.clone(),
                        keepdim: *keepdim,
                    };
                    let parts: Vec<ValueId> = s.parts.iter().map(|p| p.1).collect();
                    let widen = sums_in_f32(&results[0], partial_op);
                    let partials = self.partials(out, &partial, &workers, vec![parts], widen);
                    let count: usize = reduced.iter().map(|&a| types[0].shape.0[a]).product();
                    let mean = (*op == ReduceOp::Mean).then_some(count);
                    self.all_reduce(out, instr.results()[0], &results[0], partial_op, &workers, partials, mean);
                    self.stats.sharded += 1;
                    return true;
                }
                match self.replicas_of(*src) {
                    Some(workers) => {
                        self.replicated(out, instr, &workers);
                        true
                    }
                    None => false,
                }
            }
            Instr::Zeros { ty, .. } | Instr::Ones { ty, .. } | Instr::Full { ty, .. } => {
                // Created piece by piece where a scope splits them.
                let Some(Want::Split { axis, workers }) = self.want().cloned() else { return false };
                let Some(a) = self.splittable(ty, axis, workers.len()).filter(|_| self.live.len() > 1) else {
                    return false;
                };
                let sizes = array_split(ty.shape.0[a], workers.len());
                let dst = instr.results()[0];
                let mut parts = Vec::new();
                for (&w, n) in workers.iter().zip(sizes) {
                    let mut piece = ty.clone();
                    piece.shape.0[a] = n;
                    let p = self.fresh();
                    let made = match instr {
                        Instr::Zeros { .. } => Instr::Zeros { dst: p, ty: piece },
                        Instr::Ones { .. } => Instr::Ones { dst: p, ty: piece },
                        Instr::Full { value, .. } => Instr::Full { dst: p, ty: piece, value: *value },
                        _ => unreachable!("matched above"),
                    };
                    self.emit(out, made, vec![w]);
                    parts.push((w, p));
                }
                self.produced.push((dst, Dist::pieces(a, parts)));
                self.stats.sharded += 1;
                true
            }
            Instr::Transpose { src, dim0, dim1, .. } => {
                let rank = types[0].shape.rank();
                let (Some(s), Ok(a), Ok(b)) =
                    (self.split_of(*src).cloned(), normalize_axis(*dim0, rank), normalize_axis(*dim1, rank))
                else {
                    return self.replicated_if_copies(out, instr, &operands);
                };
                let axis = if s.axis == a {
                    b
                } else if s.axis == b {
                    a
                } else {
                    s.axis
                };
                self.sharded(out, instr, &s.workers(), &[Some(s.axis)], axis);
                true
            }
            Instr::Permute { src, perm, .. } => {
                let rank = types[0].shape.rank();
                let perm: Result<Vec<usize>, _> = perm.iter().map(|&p| normalize_axis(p, rank)).collect();
                let (Some(s), Ok(perm)) = (self.split_of(*src).cloned(), perm) else {
                    return self.replicated_if_copies(out, instr, &operands);
                };
                let Some(axis) = perm.iter().position(|&p| p == s.axis) else { return false };
                self.sharded(out, instr, &s.workers(), &[Some(s.axis)], axis);
                true
            }
            Instr::Slice { src, index, .. } => {
                let Some(s) = self.split_of(*src).cloned() else {
                    return self.replicated_if_copies(out, instr, &operands);
                };
                // A slice that takes the split axis whole (from 0, step 1) takes the same from
                // every piece (bounds are clamped); one that cuts it crosses pieces.
                let Ok(r) = resolve_slice(index, &types[0].shape) else { return false };
                let whole = AxisSlice { start: 0, step: 1, len: types[0].shape.0[s.axis] };
                match r.kept[s.axis] {
                    Some(axis) if r.axes[s.axis] == whole => {
                        self.sharded(out, instr, &s.workers(), &[Some(s.axis)], axis);
                        true
                    }
                    _ => self.slice_across(out, instr, &s, &types[0]),
                }
            }
            Instr::Concat { srcs, axis, .. } => {
                let Ok(c) = normalize_axis(*axis, types[0].shape.rank()) else { return false };
                // Joined along another axis than the split one: piece by piece (every operand
                // has the split axis's length).
                match srcs.iter().find_map(|&v| self.split_of(v).filter(|s| s.axis != c)).cloned() {
                    Some(s) => {
                        self.sharded(out, instr, &s.workers(), &vec![Some(s.axis); srcs.len()], s.axis);
                        true
                    }
                    // Along the split axis: the operands' stretches, laid out anew.
                    // Laid out over the workers of the operand split over the most (the
                    // first of those), not merely the first split one.
                    None => match srcs
                        .iter()
                        .rev()
                        .filter_map(|&v| self.split_of(v))
                        .max_by_key(|s| s.parts.len())
                        .map(Split::workers)
                    {
                        Some(workers) => self.concat_along(out, instr, c, &workers),
                        None => self.replicated_if_copies(out, instr, &operands),
                    },
                }
            }
            Instr::Split { src, axis, .. } => {
                let rank = types[0].shape.rank();
                match (self.split_of(*src).cloned(), normalize_axis(*axis, rank)) {
                    // Cut along another axis: piece by piece, every result split as the source.
                    (Some(s), Ok(c)) if s.axis != c => {
                        self.sharded(out, instr, &s.workers(), &[Some(s.axis)], s.axis);
                        true
                    }
                    (Some(s), Ok(_)) => self.split_along(out, instr, &s, results),
                    (Some(_), Err(_)) => false,
                    (None, _) => self.replicated_if_copies(out, instr, &operands),
                }
            }
            Instr::Reshape { src, .. }
            | Instr::BroadcastTo { src, .. }
            | Instr::Squeeze { src, .. }
            | Instr::Unsqueeze { src, .. } => {
                let Some(s) = self.split_of(*src).cloned() else {
                    return self.replicated_if_copies(out, instr, &operands);
                };
                let (from, to) = (&types[0].shape.0, &results[0].shape.0);
                // The split axis keeps its length and its place among the axes before it
                // that are not size 1 (reshapes keeping the leading axes, a keepdim's
                // unsqueeze, a broadcast along other axes): each piece maps to a piece.
                let Some(axis) = kept_axis(from, to, s.axis, matches!(instr, Instr::BroadcastTo { .. })) else {
                    // A reshape merging the split axis with the next ones, or dividing it.
                    return matches!(instr, Instr::Reshape { .. }) && self.reshape_across(out, instr, &s, (from, to));
                };
                let sizes = array_split(from[s.axis], s.parts.len());
                let adapt = |k: usize, i: &Instr| match i {
                    Instr::Reshape { dst, src, .. } => {
                        let mut shape: Vec<i64> = to.iter().map(|&d| d as i64).collect();
                        shape[axis] = sizes[k] as i64;
                        Instr::Reshape { dst: *dst, src: *src, shape }
                    }
                    Instr::BroadcastTo { dst, src, .. } => {
                        let mut shape = to.clone();
                        shape[axis] = sizes[k];
                        Instr::BroadcastTo { dst: *dst, src: *src, shape: shape.to_vec() }
                    }
                    // Squeezing every size-1 axis of a piece could take the split axis
                    // (a piece of length 1): the whole value's size-1 axes, named.
                    Instr::Squeeze { dst, src, axes: None } => {
                        let axes = (0..from.len()).filter(|&a| from[a] == 1).map(|a| a as i64).collect();
                        Instr::Squeeze { dst: *dst, src: *src, axes: Some(axes) }
                    }
                    other => other.clone(),
                };
                self.sharded_with(out, instr, &s.workers(), &[Some(s.axis)], axis, &adapt);
                true
            }
            _ => self.replicated_if_copies(out, instr, &operands),
        }
    }

    /// A row-parallel product: both operands split along k (axes `k` of the left and right
    /// operand), each worker's partial product, then their sum (in `f32` for halves).
    fn row_parallel(&mut self, out: &mut Emit, instr: &Instr, k: (usize, usize), workers: &[u32], ty: &TensorType) {
        let Instr::MatMul { lhs, rhs, .. } = instr else { return };
        let a = self.ensure_split(out, *lhs, k.0, workers);
        let b = self.ensure_split(out, *rhs, k.1, workers);
        let widen = sums_in_f32(ty, ReduceOp::Sum);
        let partials = self.partials(out, instr, workers, vec![a, b], widen);
        self.all_reduce(out, instr.results()[0], ty, ReduceOp::Sum, workers, partials, None);
        self.stats.sharded += 1;
    }

    /// A product with a vector (ranks `l` and `r`, one of them 1; split layouts `ls`, `rs`):
    /// a matrix times a vector split along the matrix's rows (or a batch axis) is data
    /// parallel, a vector times a matrix split along its columns (or a batch axis) column
    /// parallel, and a split k (a dot product's only axis) row parallel.
    fn vector_product(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        (l, r): (usize, usize),
        (ls, rs): (Option<Split>, Option<Split>),
        ty: &TensorType,
    ) -> bool {
        let operands = instr.operands();
        // Axis k of each operand: the matrix's last but one on the right, else the last.
        let k = (l - 1, r.saturating_sub(2));
        match (&ls, &rs) {
            // Matrix @ vector, split along rows or a batch axis (the result has the same axes
            // but k): the vector copied.
            (Some(s), _) if r == 1 && s.axis != k.0 => {
                self.sharded(out, instr, &s.workers(), &[Some(s.axis), None], s.axis);
                true
            }
            // Vector @ matrix, split along columns (the result's last axis) or a batch axis
            // (kept in place): the vector copied.
            (_, Some(s)) if l == 1 && s.axis != k.1 => {
                let axis = if s.axis == r - 1 { r - 2 } else { s.axis };
                self.sharded(out, instr, &s.workers(), &[None, Some(s.axis)], axis);
                true
            }
            (Some(s), _) | (None, Some(s)) => {
                self.row_parallel(out, instr, k, &s.workers(), ty);
                true
            }
            (None, None) => self.replicated_if_copies(out, instr, &operands),
        }
    }

    /// Any instruction whose spread operands are all copies (none split) runs once per
    /// copy, on the first such operand's workers; `false` otherwise.
    fn replicated_if_copies(&mut self, out: &mut Emit, instr: &Instr, operands: &[ValueId]) -> bool {
        if operands.iter().any(|&v| self.split_of(v).is_some()) {
            return false;
        }
        match operands.iter().find_map(|&v| self.replicas_of(v)) {
            Some(workers) => {
                self.replicated(out, instr, &workers);
                true
            }
            None => false,
        }
    }

    /// `make(new, old)` on each of `copies` (one per worker, on `workers`), freeing the old:
    /// the new copies.
    fn each_copy(
        &mut self,
        out: &mut Emit,
        workers: &[u32],
        copies: Vec<ValueId>,
        make: impl Fn(ValueId, ValueId) -> Instr,
    ) -> Vec<ValueId> {
        let mut made = Vec::new();
        for (&w, old) in workers.iter().zip(copies) {
            let new = self.fresh();
            self.emit(out, make(new, old), vec![w]);
            self.free_own(out, old);
            made.push(new);
        }
        made
    }

    /// Each worker's partial of `instr` (its first result), part `k` on `workers[k]` reading
    /// `columns[j][k]` for operand `j`; with `widen`, the operands cast to `f32` first (and
    /// those casts freed), so that partials of halves are summed in `f32`.
    fn partials(
        &mut self,
        out: &mut Emit,
        instr: &Instr,
        workers: &[u32],
        columns: Vec<Vec<ValueId>>,
        widen: bool,
    ) -> Vec<ValueId> {
        let mut casts = Vec::new();
        let columns: Vec<Vec<ValueId>> = columns
            .into_iter()
            .map(|col| {
                if !widen {
                    return col;
                }
                let wide: Vec<ValueId> = workers
                    .iter()
                    .zip(col)
                    .map(|(&w, p)| {
                        let c = self.fresh();
                        self.emit(out, Instr::Cast { dst: c, src: p, dtype: DType::F32 }, vec![w]);
                        c
                    })
                    .collect();
                casts.extend(wide.iter().copied());
                wide
            })
            .collect();
        let parts = self.per_part(out, instr, workers, &Self::columns(columns, workers.len()));
        for c in casts {
            self.free_own(out, c);
        }
        parts.into_iter().map(|p| p[0]).collect()
    }

    /// `all_reduce op` of `partials` (one per worker) into copies that become `dst`'s; a
    /// mean of `count` elements divides them by it. Partials of halves' sums are `f32`
    /// ([`sums_in_f32`]): each copy is rounded to `ty`'s dtype once, at the end.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &mut self,
        out: &mut Emit,
        dst: ValueId,
        ty: &TensorType,
        op: ReduceOp,
        workers: &[u32],
        partials: Vec<ValueId>,
        mean: Option<usize>,
    ) {
        // A forward scope that splits the result over the same workers takes each its piece
        // of the reduction: a reduce_scatter moves half the bytes of an all_reduce. Placing
        // gradients, a reduction over the split axis is taken for a parameter's gradient summed
        // over the batch: every worker gets it whole, so that a replicated parameter updated by
        // it stays replicated (data-parallel training: one all_reduce per gradient, no gathering
        // of split parameters in the next step). A tensor-parallel layer's input gradient is
        // summed whole too (correct, not the cheapest).
        let scatter = match self.want() {
            Some(Want::Split { axis, workers: to })
                if to == workers && partials.len() > 1 && !self.placing_gradients() =>
            {
                self.splittable(ty, *axis, workers.len())
            }
            _ => None,
        };
        let sums = if partials.len() == 1 {
            // One shard: its partial is the whole.
            partials
        } else {
            let sums: Vec<ValueId> = workers.iter().map(|_| self.fresh()).collect();
            let op = match scatter {
                Some(axis) => CollectiveOp::ReduceScatter { op, axis: axis as i64 },
                None => CollectiveOp::AllReduce(op),
            };
            self.emit(out, Instr::Collective { dsts: sums.clone(), op, srcs: partials.clone() }, workers.to_vec());
            self.stats.collectives += 1;
            for p in partials {
                self.free_own(out, p);
            }
            sums
        };
        let mut copies = sums;
        if let Some(count) = mean {
            copies = self.each_copy(out, workers, copies, |dst, s| Instr::Binary {
                dst,
                op: BinaryOp::Div,
                lhs: Operand::Value(s),
                rhs: Operand::Scalar(count as f64),
            });
        }
        if sums_in_f32(ty, op) {
            copies = self.each_copy(out, workers, copies, |dst, src| Instr::Cast { dst, src, dtype: ty.dtype });
        }
        let placed = workers.iter().copied().zip(copies).collect();
        let dist = match scatter {
            Some(axis) => Dist::pieces(axis, placed),
            None => Dist { home: false, split: None, replicas: placed },
        };
        self.produced.push((dst, dist));
    }

    /// `GT_AUTO_SHARD`: splits the operand that sets a large instruction's rows over every
    /// worker (the plan then runs it shard by shard); whether it did.
    fn auto_split(&mut self, out: &mut Emit, instr: &Instr, results: &[TensorType]) -> bool {
        if !self.config.auto || self.live.len() < 2 {
            return false;
        }
        let n = self.live.len();
        let big =
            |t: &TensorType| t.size_bytes() as u64 >= self.config.threshold && t.shape.rank() >= 1 && t.shape.0[0] >= n;
        let lead = match instr {
            Instr::MatMul { lhs, .. } => self.ty(*lhs).filter(|t| t.shape.rank() >= 2 && big(t)).map(|_| *lhs),
            Instr::Unary { .. } | Instr::Binary { .. } | Instr::Where { .. } if big(&results[0]) => {
                let rank = results[0].shape.rank();
                let full = results[0].shape.0[0];
                instr
                    .operands()
                    .into_iter()
                    .find(|&v| self.ty(v).is_some_and(|t| t.shape.rank() == rank && t.shape.0[0] == full))
            }
            _ => None,
        };
        let Some(v) = lead else { return false };
        let workers = self.live.clone();
        self.ensure_split(out, v, 0, &workers);
        self.stats.auto += 1;
        true
    }

    /// The axis to split a value of type `ty` along, when it can be: its rank is above the
    /// axis and it has at least one element per worker there.
    fn splittable(&self, ty: &TensorType, axis: i64, workers: usize) -> Option<usize> {
        let a = normalize_axis(axis, ty.shape.rank()).ok()?;
        (ty.shape.0[a] >= workers).then_some(a)
    }

    /// Applies the innermost placement to the results of the client's instruction.
    fn place_results(&mut self, out: &mut Emit, results: &[ValueId], types: &[TensorType]) {
        let Some(Want::Split { axis, workers }) = self.want().cloned() else { return };
        let signal =
            self.scopes.iter().rev().find(|(_, w, _)| w.is_some()).map_or(String::new(), |(n, _, _)| n.clone());
        let gradients = self.placing_gradients();
        for (&r, ty) in results.iter().zip(types) {
            // Placing gradients, a result its plan spread over the scope's workers keeps that
            // layout: the transpose of a batch-split value is split along the batch's new place
            // (splitting it along the scope's axis would move most of it between workers), and
            // copies made from copies or by an all_reduce stay copies (a gradient summed over
            // the batch). Spread over other workers (a pipeline's previous stage), it moves as
            // the scope says; in forward scopes every result is laid out as the scope says.
            // (Placements and layouts never name a worker twice, so equal sets are equal lengths
            // and containment.)
            let over_scope = || self.split_of(r).map(Split::workers).or_else(|| self.replicas_of(r));
            if gradients
                && over_scope().is_some_and(|on| on.len() == workers.len() && on.iter().all(|w| workers.contains(w)))
            {
                continue;
            }
            // With one worker up a split is the value itself: it stays whole (and the log says so).
            let fits = self.splittable(ty, axis, workers.len()).filter(|_| self.live.len() > 1);
            let Some(a) = fits else {
                self.stats.unsplit += 1;
                let (signal, rank) = (signal.clone(), ty.shape.rank());
                let why = if self.live.len() == 1 {
                    Unplaced::OneWorker { signal }
                } else if normalize_axis(axis, rank).is_err() {
                    Unplaced::AxisOutOfRange { signal, value: r, ty: ty.clone(), axis, rank }
                } else {
                    Unplaced::TooSmall { signal, value: r, ty: ty.clone(), axis, workers: workers.len() }
                };
                if self.noted.insert(why.key()) {
                    out.note(why);
                }
                continue;
            };
            self.ensure_split(out, r, a, &workers);
            // The scope's values live split: other representations go.
            if let Some(d) = self.dist.get(&r).cloned() {
                for (_, c) in d.replicas {
                    self.free_own(out, c);
                }
                if d.home {
                    self.emit(out, Instr::Free { src: r }, Vec::new());
                }
                if let Some(d) = self.dist.get_mut(&r) {
                    d.replicas.clear();
                    d.home = false;
                }
            }
        }
    }

    /// An instruction that computes (not a marker or a free).
    fn compute(&mut self, out: &mut Emit, instr: Instr) {
        let results = match out.types() {
            Some(Ok(t)) => t.clone(),
            // Not typed (the dispatcher reports it) or made by an earlier pass: as it is.
            _ => return out.keep(instr),
        };
        let spread_operand = instr.operands().iter().any(|&v| self.is_spread(v));
        let auto = !spread_operand && self.want().is_none() && self.auto_split(out, &instr, &results);
        if !spread_operand && !auto && self.want().is_none() {
            for r in instr.results() {
                // A redefinition replaces whatever represented the old value.
                if self.dist.contains_key(&r) {
                    self.forget(out, r);
                }
            }
            self.types.record(&instr, &results);
            return out.keep(instr);
        }
        let planned = self.plan(out, &instr, &results);
        if !planned {
            let mut gathered = false;
            for v in instr.operands() {
                gathered |= self.ensure_home(out, v);
            }
            if gathered {
                self.stats.gathers += 1;
            }
            out.keep(instr.clone());
        }
        // The plan has read the operands: the results' old representations go (a result
        // now spread that was whole at home before also leaves home).
        let names = instr.results();
        let mut was_home = Vec::new();
        for &r in &names {
            let live = self.types.get(r).is_some();
            if self.forget(out, r) && live {
                was_home.push(r);
            }
        }
        for (r, d) in std::mem::take(&mut self.produced) {
            if was_home.contains(&r) {
                self.emit(out, Instr::Free { src: r }, Vec::new());
            }
            self.dist.insert(r, d);
        }
        self.types.record(&instr, &results);
        self.place_results(out, &names, &results);
    }
}

impl StreamPass for Shard {
    fn name(&self) -> &'static str {
        "shard"
    }

    /// With nothing spread, no placement asked and no automatic splitting, an instruction goes
    /// on as it came (its types recorded), as `run` sends it, until a signal or a read.
    fn pass_through(&mut self, items: &[Emitted]) -> usize {
        if !self.dist.is_empty() || self.want().is_some() || (self.config.auto && self.live.len() >= 2) {
            return 0;
        }
        let mut taken = 0;
        for (instr, meta) in items {
            if matches!(instr, Instr::SignalStart { .. } | Instr::SignalEnd { .. } | Instr::GetData { .. }) {
                break;
            }
            if let (Some(Ok(types)), false) = (&meta.types, instr.is_marker()) {
                self.types.record(instr, types);
            }
            taken += 1;
        }
        taken
    }

    fn run(&mut self, instr: Instr, out: &mut Emit) {
        match instr {
            Instr::SignalStart { ref name, ref place, backward, .. } => {
                let want = match place {
                    None => None,
                    Some(p) => match self.resolve(name, p) {
                        Ok(w) => Some(w),
                        Err(e) => {
                            self.stats.refused += 1;
                            let name = name.clone();
                            out.refuse(instr.clone(), e);
                            self.scopes.push((name, None, backward));
                            return;
                        }
                    },
                };
                self.scopes.push((name.clone(), want, backward));
                out.keep(instr);
            }
            Instr::SignalEnd { ref name } => {
                if self.scopes.last().is_some_and(|(open, _, _)| open == name) {
                    self.scopes.pop();
                }
                out.keep(instr);
            }
            Instr::Free { src } => {
                let home = self.forget(out, src);
                if let Some(Ok(t)) = out.types() {
                    self.types.record(&instr, t);
                }
                if home {
                    out.keep(instr);
                }
            }
            Instr::GetData { src } => {
                self.ensure_home(out, src);
                out.keep(instr);
            }
            Instr::HotPathStart { .. } | Instr::HotPathEnd { .. } => out.keep(instr),
            _ => self.compute(out, instr),
        }
    }

    fn set_workers(&mut self, alive: &[bool]) {
        self.alive = alive.to_vec();
        self.live = (0..alive.len() as u32).filter(|&w| alive[w as usize]).collect();
        // Before any worker registers, values go to the home worker 0 as they come.
        if self.live.is_empty() {
            self.live.push(0);
        }
        if self.alive.is_empty() {
            self.alive.push(true);
        }
    }

    fn materialize(&mut self, value: ValueId, out: &mut Emit) {
        if self.ensure_home(out, value) {
            self.stats.reads += 1;
        }
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("sharded", s.sharded),
            ("replicated", s.replicated),
            ("collectives", s.collectives),
            ("moves", s.moves),
            ("scatters", s.scatters),
            ("gathers", s.gathers),
            ("reads_assembled", s.reads),
            ("unsplit", s.unsplit),
            ("auto", s.auto),
            ("refused", s.refused),
        ]
    }
}
