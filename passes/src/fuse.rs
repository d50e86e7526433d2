//! `fuse`: compiles regions of the stream into `fused` instructions, each one kernel of the
//! kernel IR that never writes its intermediates to memory. A region is the stream between
//! boundaries: with [`Regions::All`] (`GT_COMPILE=1`) every stretch between sync points,
//! markers and a window limit; with [`Regions::HotPaths`] (`GT_AUTO_COMPILE=1`) each
//! repetition of a hot path (between `hotpath_start` and `hotpath_end`); in every mode, the
//! scope of a signal whose config says `compile: true` (`signal_start "x" compile`), which
//! is all [`Regions::Signals`] (the default) compiles.
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

use crate::pipeline::{Emit, Meta, StreamPass, StreamTypes, Typing};
use foldhash::{HashMap, HashMapExt};
use gt_ir::{Instr, TensorType, ValueId};
use std::sync::Arc;
use std::time::Duration;

pub use egraph::Limits;

/// Which stretches of the stream are compiled (besides compile signals, always).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Regions {
    /// Every stretch between boundaries (`GT_COMPILE=1`).
    #[default]
    All,
    /// Hot-path repetitions (`GT_AUTO_COMPILE=1`, with the hotpath pass before this one).
    HotPaths,
    /// Only the scopes of compile signals (what a runtime does when nothing else is asked).
    Signals,
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
    /// Regions that were compiled before up to value names (their result reused).
    pub cache_hits: u64,
    /// Hot-path repetitions that ran from their hot path's plan as they streamed in.
    pub streamed: u64,
    /// Streamed repetitions that broke off from the plan (finished unfused from there).
    pub stream_breaks: u64,
    /// Time in the e-graph and partitioner.
    pub time: Duration,
    /// The longest one region took.
    pub max_region_time: Duration,
}

/// Distinct regions whose result is kept (then the cache starts over).
const REGION_CACHE: usize = 256;

/// A region renamed in place: its value ids become `0, 1, ..` by first appearance. Returns
/// the original id of each canonical one and the region's cache key, a hash of every
/// instruction's structure ([`gt_ir::structure`]), its canonical ids and the types of the
/// values it names. Hashing the structure and the ids in two goes cost a small fraction of
/// encoding the renamed region: the key is only a hash, so a hit is checked exactly
/// ([`Cached::is`]).
fn canonicalize(region: &mut [Instr], types: &HashMap<ValueId, TensorType>) -> (u64, Vec<ValueId>) {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut index: HashMap<ValueId, ValueId> = HashMap::with_capacity(2 * region.len());
    let mut names = Vec::new();
    let mut key = foldhash::fast::FixedState::default().build_hasher();
    for i in region.iter_mut() {
        i.visit_values_mut(&mut |v| {
            *v = *index.entry(*v).or_insert_with(|| {
                names.push(*v);
                ValueId(names.len() as u32 - 1)
            })
        });
        gt_ir::structure::structure_hash(i, &[]).hash(&mut key);
        i.visit_values(&mut |v| v.0.hash(&mut key));
    }
    for v in &names {
        types.get(v).hash(&mut key);
    }
    (key.finish(), names)
}

/// A compiled region in canonical ids ([`canonicalize`]): what came in, with the types of
/// its values, and what came out.
#[derive(Debug)]
struct Cached {
    region: Vec<Instr>,
    types: Vec<Option<TensorType>>,
    out: Vec<Instr>,
    stats: build::BuildStats,
}

impl Cached {
    /// Whether it is this canonical region over values of these types (a key is a hash).
    fn is(&self, region: &[Instr], names: &[ValueId], types: &HashMap<ValueId, TensorType>) -> bool {
        self.region == region
            && self.types.len() == names.len()
            && self.types.iter().zip(names).all(|(t, v)| t.as_ref() == types.get(v))
    }
}

/// Hot paths whose plan is kept (then they start over).
const PLANS: usize = 64;

/// A hot path's plan: its repetition as it was compiled, and when each instruction out may
/// go while the next repetition streams in ([`Streaming`]).
#[derive(Debug)]
struct Plan {
    /// Where the repetition's instructions ran.
    place: Vec<u32>,
    /// Shared with the cache.
    compiled: Arc<Cached>,
    /// For each instruction out, how many of the repetition's instructions must have come
    /// before it can go: up to the last one naming a value it names.
    need: Vec<usize>,
    /// For each instruction out that is one of the repetition's own kept as it was (not
    /// fused): its index in the repetition.
    kept: Vec<Option<usize>>,
    /// For each kernel out, its result type as its instruction carries it: the kernels
    /// were typed when the plan's repetition first went, and a repetition streams from
    /// the plan only over operands of the plan's types, so they are not typed again.
    typing: Vec<Typing>,
}

impl Plan {
    fn new(compiled: Arc<Cached>, place: Vec<u32>) -> Plan {
        let region = &compiled.region;
        let mut first: HashMap<ValueId, usize> = HashMap::new();
        for (k, i) in region.iter().enumerate() {
            i.visit_values(&mut |v| {
                first.entry(v).or_insert(k);
            });
        }
        let need = compiled
            .out
            .iter()
            .map(|i| {
                let mut need = 0;
                i.visit_values(&mut |v| need = need.max(first.get(&v).map_or(region.len(), |k| k + 1)));
                need
            })
            .collect();
        let mut taken = vec![false; region.len()];
        let kept = compiled
            .out
            .iter()
            .map(|o| {
                if matches!(o, Instr::Fused { .. } | Instr::Free { .. }) {
                    return None;
                }
                let k = (0..region.len()).find(|&k| !taken[k] && region[k] == *o)?;
                taken[k] = true;
                Some(k)
            })
            .collect();
        let typing = compiled
            .out
            .iter()
            .map(|o| match o {
                Instr::Fused { ty, .. } => Some(Ok(Arc::from([ty.clone()]))),
                _ => None,
            })
            .collect();
        Plan { place, compiled, need, kept, typing }
    }
}

/// A repetition of a hot path with a plan, as it streams in: each instruction is checked
/// against the plan's, and each instruction out goes as soon as what it needs has come, so
/// the worker starts on the step while the client is still sending it. The plan's frees
/// wait for the end: if the repetition breaks off, what the plan computed inside its
/// kernels is computed again from values that must still exist.
#[derive(Debug)]
struct Streaming {
    plan: Arc<Plan>,
    /// Each value named so far, and the original of each canonical id.
    index: HashMap<ValueId, Named>,
    names: Vec<ValueId>,
    /// The repetition's instructions so far.
    arrived: Vec<(Instr, Meta)>,
    /// The plan's instructions out before this one have gone (its frees are held).
    next: usize,
    /// The plan's frees, in canonical ids.
    frees: Vec<Instr>,
    /// Scratch of [`Fuse::stream_one`], kept so that taking an instruction allocates
    /// nothing: its value ids as it came, and those it names first.
    originals: Vec<ValueId>,
    fresh: Vec<ValueId>,
}

impl Streaming {
    fn new(plan: Arc<Plan>) -> Streaming {
        Streaming {
            plan,
            index: HashMap::new(),
            names: Vec::new(),
            arrived: Vec::new(),
            next: 0,
            frees: Vec::new(),
            originals: Vec::new(),
            fresh: Vec::new(),
        }
    }

    /// The meta of the repetition's instruction that defined (or, for a free, freed) what
    /// `i` (in the repetition's ids) writes: what an instruction out is reported against.
    fn origin(&self, i: &Instr) -> Option<&Meta> {
        let at = match i {
            Instr::Free { src } => self.index.get(src)?.freed,
            _ => self.index.get(i.results().first()?)?.defined,
        };
        Some(&self.arrived[at? as usize].1)
    }
}

/// A value a streaming repetition named: its canonical id (the plan's), and which of the
/// repetition's instructions defined and freed it (indices into `arrived`; a plan's region
/// defines a value at most once).
#[derive(Debug, Clone, Copy)]
struct Named {
    canonical: ValueId,
    defined: Option<u32>,
    freed: Option<u32>,
}

/// A region being collected: instructions of one placement (a region runs on one worker).
#[derive(Debug, Default)]
struct Held {
    /// Where its instructions run (`Meta::place`).
    place: Vec<u32>,
    /// Types of the values it names (kept when the region frees them).
    types: HashMap<ValueId, TensorType>,
    instrs: Vec<Instr>,
    /// Where each instruction came from.
    origins: Vec<Meta>,
}

/// The fuse pass.
#[derive(Debug)]
pub struct Fuse {
    config: FuseConfig,
    /// The type of every live value of the stream.
    types: StreamTypes,
    /// One region per placement, in the order they started: the shard pass interleaves its
    /// workers' instructions, and each worker's stretch is fused as one region.
    held: Vec<Held>,
    /// Inside a hot-path repetition.
    in_hot: bool,
    stats: FuseStats,
    /// Regions compiled, by key ([`canonicalize`]).
    cache: HashMap<u64, Arc<Cached>>,
    /// Hot paths' plans, by hot path id.
    plans: HashMap<u64, Arc<Plan>>,
    /// The repetition streaming in, when its hot path has a plan.
    streaming: Option<Streaming>,
    /// Nothing of the hot-path repetition in progress went out before its end (so the region
    /// released at its end is the whole repetition, and may become its plan).
    whole: bool,
}

impl Fuse {
    /// A fuse pass with these settings.
    pub fn new(config: FuseConfig) -> Fuse {
        Fuse {
            config,
            types: StreamTypes::default(),
            held: Vec::new(),
            in_hot: false,
            stats: FuseStats::default(),
            cache: HashMap::new(),
            plans: HashMap::new(),
            streaming: None,
            whole: false,
        }
    }

    /// What the pass did so far.
    pub fn fuse_stats(&self) -> FuseStats {
        self.stats
    }

    fn collecting(&self, in_compile_signal: bool) -> bool {
        match self.config.regions {
            Regions::All => true,
            Regions::HotPaths => self.in_hot || in_compile_signal,
            Regions::Signals => in_compile_signal,
        }
    }

    /// Records the types an instruction defines (carried from the pipeline's entry) and
    /// forgets what it frees; `false` when it does not type (the dispatcher will report it).
    fn track(&mut self, instr: &Instr, typing: &Typing) -> bool {
        match typing {
            Some(Ok(results)) => self.types.record(instr, results),
            Some(Err(_)) => return false,
            // Made by an earlier pass (hot-path markers): typed here.
            None => match self.types.infer(instr) {
                Ok(results) => self.types.record(instr, &results),
                Err(_) => return false,
            },
        }
        true
    }

    /// Compiles and releases every held region, in the order they started.
    fn release(&mut self, out: &mut Emit) {
        for held in std::mem::take(&mut self.held) {
            self.release_one(held, out);
        }
    }

    /// Compiles and releases the held regions `which` picks (the others stay, in order).
    fn release_where(&mut self, out: &mut Emit, which: impl Fn(&Held) -> bool) {
        let (go, stay): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held).into_iter().partition(|h| which(h));
        self.held = stay;
        self.whole &= go.is_empty();
        for held in go {
            self.release_one(held, out);
        }
    }

    /// Compiles and releases one region; the key of its compiled form in the cache, when it
    /// went through it.
    fn release_one(&mut self, held: Held, out: &mut Emit) -> Option<u64> {
        let Held { instrs: region, origins, types, .. } = held;
        if region.is_empty() {
            return None;
        }
        // A region with nothing to fuse goes out as it came.
        let worth = region.iter().filter(|i| !matches!(i, Instr::Free { .. })).count() >= 2;
        if !worth {
            for (i, origin) in region.into_iter().zip(origins) {
                out.keep_from(i, origin);
            }
            return None;
        }
        // An output with no client instruction of its own is reported against the region's
        // last one (its types are not that instruction's: carried as unknown).
        let last = Meta { types: None, ..origins.last().cloned().unwrap_or_default() };
        let mut defined_by: HashMap<ValueId, &Meta> = HashMap::new();
        let mut freed_by: HashMap<ValueId, &Meta> = HashMap::new();
        for (i, origin) in region.iter().zip(&origins) {
            match i {
                Instr::Free { src } => {
                    freed_by.insert(*src, origin);
                }
                _ => defined_by.extend(i.results().into_iter().map(|r| (r, origin))),
            }
        }
        let start = std::time::Instant::now();
        self.stats.regions += 1;
        let n_in = region.len();
        self.stats.instructions_in += n_in as u64;
        // A region seen before up to value names (a loop's next iteration, a hot path's next
        // repetition) reuses its result: the e-graph runs once per distinct region.
        let mut region = region;
        let (key, names) = canonicalize(&mut region, &types);
        let original = |instrs: &mut Vec<Instr>| {
            for i in instrs {
                i.visit_values_mut(&mut |v| *v = names.get(v.index()).copied().unwrap_or(*v));
            }
        };
        let (instrs, stats, hit) = match self.cache.get(&key).filter(|c| c.is(&region, &names, &types)) {
            Some(cached) => {
                self.stats.cache_hits += 1;
                let mut instrs = cached.out.clone();
                original(&mut instrs);
                (instrs, build::BuildStats { saturation: Default::default(), ..cached.stats }, true)
            }
            None => {
                // Built in canonical ids (the result does not depend on the names), so the
                // result is the cache's template as it comes.
                let canonical_types: HashMap<ValueId, TensorType> = names
                    .iter()
                    .enumerate()
                    .filter_map(|(k, v)| Some((ValueId(k as u32), types.get(v)?.clone())))
                    .collect();
                let (out, stats) =
                    build::Region::build(region.clone(), &canonical_types, self.config.fast_math, self.config.limits);
                if self.cache.len() >= REGION_CACHE {
                    self.cache.clear();
                }
                let mut instrs = out.clone();
                original(&mut instrs);
                let types = names.iter().map(|v| types.get(v).cloned()).collect();
                self.cache.insert(key, Arc::new(Cached { region, types, out, stats }));
                (instrs, stats, false)
            }
        };
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
            "fuse: region of {} instructions -> {} ({} kernels, {} values never written); {}; {:.3} ms",
            n_in,
            instrs.len(),
            stats.kernels,
            stats.elided,
            if hit {
                "seen before".to_string()
            } else {
                format!(
                    "e-graph {} nodes, {} classes, {} iterations",
                    stats.saturation.nodes, stats.saturation.classes, stats.saturation.iterations
                )
            },
            took.as_secs_f64() * 1e3,
        );
        for i in instrs {
            let origin = match &i {
                Instr::Free { src } => freed_by.get(src).copied(),
                _ => i.results().first().and_then(|r| defined_by.get(r).copied()),
            };
            send_compiled(i, origin, || last.clone(), None, out);
        }
        Some(key)
    }

    /// Takes the next instruction of a repetition streaming in from its plan; gives it back
    /// when it is not the plan's (the plan is then abandoned: [`Fuse::break_stream`]).
    fn stream_one(&mut self, mut instr: Instr, out: &mut Emit) -> Option<Instr> {
        let st = self.streaming.as_mut()?;
        // A free of a value the repetition does not name goes at once, as when collecting.
        if let Instr::Free { src } = instr {
            if !st.index.contains_key(&src) {
                self.track(&instr, out.types());
                out.keep(instr);
                return None;
            }
        }
        let k = st.arrived.len();
        let plan = st.plan.clone();
        let Some(expected) = plan.compiled.region.get(k).filter(|_| gt_ir::same_elements(out.place(), &plan.place))
        else {
            self.break_stream(out);
            return Some(instr);
        };
        // Renamed in place as the plan's region was (a value not named yet takes the next
        // canonical id), compared, then given its own ids back: no copy of it is made.
        let named = st.names.len();
        let (index, fresh, originals) = (&st.index, &mut st.fresh, &mut st.originals);
        fresh.clear();
        originals.clear();
        instr.visit_values_mut(&mut |v| {
            originals.push(*v);
            *v = match index.get(v) {
                Some(n) => n.canonical,
                None => {
                    let at = fresh.iter().position(|f| f == v).unwrap_or_else(|| {
                        fresh.push(*v);
                        fresh.len() - 1
                    });
                    ValueId((named + at) as u32)
                }
            }
        });
        let same = instr == *expected;
        let mut originals = originals.iter();
        instr.visit_values_mut(&mut |v| *v = originals.next().copied().unwrap_or(*v));
        // The values it names first have the plan's types (operands now; results once typed).
        let typed_as_planned = |types: &StreamTypes, fresh: &[ValueId], vs: &[ValueId]| {
            vs.iter()
                .filter_map(|v| Some((v, fresh.iter().position(|f| f == v)?)))
                .all(|(v, at)| plan.compiled.types.get(named + at).is_some_and(|t| t.as_ref() == types.get(*v)))
        };
        if !same || !typed_as_planned(&self.types, &st.fresh, &instr.operands()) || !self.track(&instr, out.types()) {
            self.break_stream(out);
            return Some(instr);
        }
        let st = self.streaming.as_mut()?;
        if !typed_as_planned(&self.types, &st.fresh, &instr.results()) {
            self.break_stream(out);
            return Some(instr);
        }
        for &v in &st.fresh {
            st.index.insert(v, Named { canonical: ValueId(st.names.len() as u32), defined: None, freed: None });
            st.names.push(v);
        }
        let at = Some(k as u32);
        match instr {
            Instr::Free { src } => {
                if let Some(n) = st.index.get_mut(&src) {
                    n.freed = at;
                }
            }
            _ => {
                for r in instr.results() {
                    if let Some(n) = st.index.get_mut(&r) {
                        n.defined = at;
                    }
                }
            }
        }
        st.arrived.push((instr, out.take_meta()));
        let arrived = st.arrived.len();
        while st.next < plan.compiled.out.len() && plan.need[st.next] <= arrived {
            let i = plan.compiled.out[st.next].clone();
            let typing = plan.typing[st.next].clone();
            st.next += 1;
            if matches!(i, Instr::Free { .. }) {
                st.frees.push(i);
            } else {
                emit_planned(st, i, typing, out);
            }
        }
        None
    }

    /// The repetition streaming in reached its hot path's end: the rest of its plan goes, or,
    /// if it stopped short, it breaks off.
    fn end_stream(&mut self, out: &mut Emit) {
        let Some(st) = self.streaming.as_mut() else { return };
        let plan = st.plan.clone();
        if st.arrived.len() < plan.compiled.region.len() {
            self.break_stream(out);
            return;
        }
        let Some(mut st) = self.streaming.take() else { return };
        let rest = plan.compiled.out[st.next..].iter().cloned().zip(plan.typing[st.next..].iter().cloned());
        for (i, typing) in rest.chain(std::mem::take(&mut st.frees).into_iter().map(|f| (f, None))) {
            emit_planned(&st, i, typing, out);
        }
        let stats = &plan.compiled.stats;
        tracing::debug!(
            target: "gt::compile",
            "fuse: region of {} instructions -> {} ({} kernels, {} values never written); streamed from its hot path's plan",
            plan.compiled.region.len(),
            plan.compiled.out.len(),
            stats.kernels,
            stats.elided,
        );
        let s = &mut self.stats;
        s.regions += 1;
        s.cache_hits += 1;
        s.streamed += 1;
        s.instructions_in += plan.compiled.region.len() as u64;
        s.instructions_out += plan.compiled.out.len() as u64;
        s.kernels += stats.kernels;
        s.elided += stats.elided;
        s.fallbacks += stats.fallbacks;
    }

    /// Abandons the plan of the repetition streaming in, which broke off from it: what the
    /// plan computed inside the kernels that went is computed again, from the repetition's
    /// own instructions (the kernels' results and the instructions kept as they were went
    /// already), then its frees go. The stream after it is as if it had never been planned.
    fn break_stream(&mut self, out: &mut Emit) {
        let Some(st) = self.streaming.take() else { return };
        self.stats.stream_breaks += 1;
        let plan = &st.plan;
        let gone = &plan.compiled.out[..st.next];
        let mut computed: foldhash::HashSet<ValueId> = foldhash::HashSet::default();
        for i in gone.iter().filter(|i| !matches!(i, Instr::Free { .. })) {
            computed.extend(i.results());
        }
        let kept: Vec<usize> = plan.kept[..st.next].iter().flatten().copied().collect();
        let mut frees = Vec::new();
        for (k, (i, meta)) in st.arrived.into_iter().enumerate() {
            let results = plan.compiled.region[k].results();
            if matches!(i, Instr::Free { .. }) {
                frees.push((i, meta));
            } else if !kept.contains(&k) && (results.is_empty() || !results.iter().all(|r| computed.contains(r))) {
                out.keep_from(i, meta);
            }
        }
        for (i, meta) in frees {
            out.keep_from(i, meta);
        }
    }
}

/// Sends one of a streaming plan's instructions out, renamed to the repetition's ids (a
/// kernel with its `typing`).
fn emit_planned(st: &Streaming, mut i: Instr, typing: Typing, out: &mut Emit) {
    i.visit_values_mut(&mut |v| *v = st.names.get(v.index()).copied().unwrap_or(*v));
    let last = || Meta { types: None, ..st.arrived.last().map(|(_, m)| m.clone()).unwrap_or_default() };
    let origin = st.origin(&i);
    send_compiled(i, origin, last, typing, out);
}

/// Sends one compiled instruction out, reported against `origin`, the client instruction that
/// defined its result (a kernel: its value's; a free: the client's free), else against
/// `fallback`; a kernel carries `typing` (`None`: the dispatcher types it).
fn send_compiled(i: Instr, origin: Option<&Meta>, fallback: impl FnOnce() -> Meta, typing: Typing, out: &mut Emit) {
    let origin = origin.map_or_else(fallback, Meta::clone);
    if matches!(i, Instr::Fused { .. }) {
        out.inject_typed(i, origin.seq, origin.place.clone(), typing);
    } else {
        out.keep_from(i, origin);
    }
}

impl StreamPass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    /// Outside the regions it compiles, with nothing held, an instruction goes on as it came
    /// (its types recorded), as `run` sends it.
    fn pass_through(&mut self, items: &[(Instr, Meta)]) -> usize {
        if self.streaming.is_some() || !self.held.is_empty() {
            return 0;
        }
        let mut taken = 0;
        for (instr, meta) in items {
            let marker = matches!(
                instr,
                Instr::HotPathStart { .. }
                    | Instr::HotPathEnd { .. }
                    | Instr::SignalStart { .. }
                    | Instr::SignalEnd { .. }
            );
            if marker || self.collecting(meta.compile) {
                break;
            }
            self.track(instr, &meta.types);
            taken += 1;
        }
        taken
    }

    fn run(&mut self, instr: Instr, out: &mut Emit) {
        let instr = match instr {
            Instr::HotPathStart { .. }
            | Instr::HotPathEnd { .. }
            | Instr::SignalStart { .. }
            | Instr::SignalEnd { .. } => instr,
            _ if self.streaming.is_some() => match self.stream_one(instr, out) {
                Some(instr) => instr,
                None => return,
            },
            _ => instr,
        };
        match instr {
            Instr::HotPathStart { id } => {
                self.break_stream(out);
                self.release(out);
                self.in_hot = true;
                self.whole = true;
                out.keep(instr);
                if let Some(plan) = self.plans.get(&id).filter(|_| self.collecting(out.in_compile_signal())) {
                    self.streaming = Some(Streaming::new(plan.clone()));
                }
            }
            Instr::HotPathEnd { id } => {
                if self.streaming.is_some() {
                    self.end_stream(out);
                    self.release(out);
                } else if self.whole && self.held.len() == 1 {
                    // The whole repetition, one region: its compiled form becomes the hot
                    // path's plan, which its next repetitions stream from.
                    let held = self.held.pop().expect("one region");
                    let place = held.place.clone();
                    if let Some(compiled) = self.release_one(held, out).and_then(|key| self.cache.get(&key).cloned()) {
                        if self.plans.len() >= PLANS {
                            self.plans.clear();
                        }
                        self.plans.insert(id, Arc::new(Plan::new(compiled, place)));
                    }
                } else {
                    self.release(out);
                }
                self.in_hot = false;
                self.whole = false;
                out.keep(instr);
            }
            // A signal scope is a region boundary (its instructions may be placed elsewhere).
            // (The pipeline tracks the scopes: `Emit::in_compile_signal`.)
            Instr::SignalStart { .. } | Instr::SignalEnd { .. } => {
                self.break_stream(out);
                self.release(out);
                self.whole = false;
                out.keep(instr);
            }
            _ if !self.collecting(out.in_compile_signal()) => {
                self.release(out);
                self.track(&instr, out.types());
                out.keep(instr);
            }
            // A free joins the region that names its value (so that value need not exist
            // after it); one no region names goes at once.
            Instr::Free { src } if self.held.iter().filter(|h| h.types.contains_key(&src)).count() <= 1 => {
                self.track(&instr, out.types());
                match self.held.iter_mut().find(|h| h.types.contains_key(&src)) {
                    Some(h) => {
                        h.instrs.push(instr);
                        h.origins.push(out.take_meta());
                    }
                    None => out.keep(instr),
                }
            }
            // An instruction that reads its own result (the verifier refuses it; a raw client
            // can send one) would make the value a view or expression of itself: never fused.
            _ if instr.results().iter().any(|r| instr.operands().contains(r)) => {
                self.whole = false;
                self.release(out);
                self.track(&instr, out.types());
                out.keep(instr);
            }
            _ => {
                // A value defined twice in the region, or defined after the region read its
                // old value (a script's loop body), would break the region's
                // single-definition view: the region ends before it. (Redefining a live
                // value the region never names is fine: the new one replaces it.)
                let place = out.place().to_vec();
                let (results, operands) = (instr.results(), instr.operands());
                // A region of another placement that names a value this one reads or writes
                // (a move or collective reading a shard's result) goes first.
                let names = |h: &Held| results.iter().chain(&operands).any(|v| h.types.contains_key(v));
                self.release_where(out, |h| !gt_ir::same_elements(&h.place, &place) && names(h));
                let redefines = |h: &Held| {
                    gt_ir::same_elements(&h.place, &place) && results.iter().any(|r| h.types.contains_key(r))
                };
                self.release_where(out, redefines);
                if !self.track(&instr, out.types()) {
                    self.whole = false;
                    self.release(out);
                    out.keep(instr);
                    return;
                }
                let at = match self.held.iter().position(|h| gt_ir::same_elements(&h.place, &place)) {
                    Some(at) => at,
                    None => {
                        self.held.push(Held { place, ..Held::default() });
                        self.held.len() - 1
                    }
                };
                let h = &mut self.held[at];
                for v in operands.iter().chain(&results) {
                    if let Some(t) = self.types.get(*v) {
                        h.types.insert(*v, t.clone());
                    }
                }
                h.instrs.push(instr);
                h.origins.push(out.take_meta());
                if h.instrs.len() >= self.config.window {
                    self.whole = false;
                    let full = self.held.remove(at);
                    self.release_one(full, out);
                }
            }
        }
    }

    fn flush(&mut self, out: &mut Emit) {
        self.break_stream(out);
        self.release(out);
        self.whole = false;
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
            ("regions_seen_before", s.cache_hits),
            ("streamed_repetitions", s.streamed),
            ("stream_breaks", s.stream_breaks),
            ("egraph_nodes", s.egraph_nodes),
            ("egraph_classes", s.egraph_classes),
            ("egraph_iterations", s.egraph_iterations),
            ("time_us", s.time.as_micros() as u64),
            ("max_region_us", s.max_region_time.as_micros() as u64),
        ]
    }
}
