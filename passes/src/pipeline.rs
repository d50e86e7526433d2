//! [`StreamPass`] and [`Pipeline`]: a pass takes one instruction and emits zero or more; a
//! pipeline runs its passes in order. Passes may hold instructions back (a bounded window)
//! but must release them all on [`StreamPass::flush`], which the dispatcher calls at every
//! sync point, so nothing a client waits for is ever held.
//!
//! The pipeline is the passes' context. At its entry it types each instruction once (the
//! verifier's rules, against the stream as the client sent it) and tracks the signal
//! scopes; every instruction then carries its [`Meta`]: the position in the client's stream
//! it came from (so a failure of an instruction a pass held back is still reported against
//! it), the pass that injected it, its result types, and whether it is inside a compile
//! signal. Passes read those instead of keeping their own copies, and the dispatcher places
//! kept instructions by the carried types. In debug builds (and with
//! [`Pipeline::set_validate`]) the pipeline re-types each pass's output and reports an
//! instruction whose carried types are wrong as a [`PassError`] (rustc's MIR validation is
//! the model). A pipeline can switch passes off by name and report each pass's stream to a
//! dump hook.

use foldhash::HashMap;
use gt_ir::verify::shape::{self, TypeError};
use gt_ir::{Instr, TensorType, ValueId};
use std::fmt;
use std::sync::Arc;

/// The result types of an instruction as it travels: typed at the pipeline's entry
/// (`Some`), or not typed (`None`: made by a pass; the dispatcher types it). Shared, so that
/// passes holding instructions back copy a pointer, not the types.
pub type Typing = Option<Result<Arc<[TensorType]>, Arc<TypeError>>>;

/// What an instruction in a pipeline carries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// The client's sequence number of the instruction it came from (or that was being
    /// taken when a pass made it); failures are reported against it.
    pub seq: u64,
    /// The pass that injected it; `None` for the client's own instructions.
    pub injected_by: Option<&'static str>,
    /// Its result types (or why it does not type).
    pub types: Typing,
    /// Inside the scope of a compile signal (`signal_start "x" compile`).
    pub compile: bool,
    /// Where its results go (the shard pass decides): empty, the client's home worker;
    /// one worker index, every result there; for a collective, one per result. Operands
    /// are wherever their values live.
    pub place: Vec<u32>,
}

impl Meta {
    /// The client's instruction `seq`, not typed.
    pub fn client(seq: u64) -> Meta {
        Meta { seq, ..Meta::default() }
    }
}

/// Value ids from here up are the passes' own (the shard pass names each shard with one);
/// the dispatcher refuses them in a client's stream.
pub const FIRST_PASS_ID: u32 = 1 << 31;

/// A client's instruction that a pass refused (a placement naming a worker that does not
/// exist, an axis out of range): the dispatcher fails it for the client with `error`.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The instruction, as the client sent it.
    pub instr: Instr,
    /// Its meta.
    pub meta: Meta,
    /// Why.
    pub error: Arc<dyn std::error::Error + Send + Sync>,
}

/// A request a pass could honour only in part (a placement it left unapplied to a value,
/// which then stays whole at home): the dispatcher writes it to the instruction log.
#[derive(Debug, Clone)]
pub struct PassNote {
    /// The pass.
    pub pass: &'static str,
    /// The meta of the instruction it is about.
    pub meta: Meta,
    /// What it could not do, and why.
    pub note: Arc<dyn std::error::Error + Send + Sync>,
}

/// A pass broke the pipeline's rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PassError {
    /// An instruction came out with result types other than its own (a pass rewrote it and
    /// kept the old types, or kept another instruction's).
    #[error("pass `{pass}` emitted `{}` carrying result types {carried:?}, but it types as {inferred:?}", gt_ir::text::print_instr(.instr))]
    TypesChanged {
        /// The pass.
        pass: &'static str,
        /// The instruction.
        instr: Box<Instr>,
        /// What it carried.
        carried: Vec<TensorType>,
        /// What it types as after the pass.
        inferred: Result<Vec<TensorType>, TypeError>,
    },
    /// A pass reported a failure of its own.
    #[error("pass `{pass}`: {reason}")]
    Reported {
        /// The pass.
        pass: &'static str,
        /// What went wrong.
        reason: &'static str,
    },
}

/// The types of the values of one stream, kept by typing each instruction in order. A
/// value's type is kept by value, not as a share of its instruction's carried result types
/// ([`Typing`]): a shape of up to four dimensions is copied without an allocation, while a
/// share costs two atomic counts (taken, then dropped with its free), and the entry and
/// each pass that keeps types pay them for every value of a loop of small ops.
#[derive(Debug, Default)]
pub struct StreamTypes {
    types: HashMap<ValueId, TensorType>,
    /// The result types [`StreamTypes::admit`] allocated last, newest first: a loop makes
    /// the same few over and over, and taking one again costs a compare instead of an
    /// allocation now and a free when its last instruction is gone.
    recent: Vec<Arc<[TensorType]>>,
}

/// How many shared result types [`StreamTypes::admit`] keeps for reuse.
const RECENT_TYPES: usize = 8;

impl StreamTypes {
    /// Types `instr` against the stream so far and records what it defines and frees; an
    /// instruction that does not type defines nothing (its results are gone).
    pub fn admit(&mut self, instr: &Instr) -> Result<Arc<[TensorType]>, TypeError> {
        match self.infer(instr) {
            Ok(results) => {
                let results = self.shared(results);
                self.record(instr, &results);
                Ok(results)
            }
            Err(e) => {
                for v in instr.results() {
                    self.types.remove(&v);
                }
                Err(e)
            }
        }
    }

    /// `results` as a shared allocation: one of the recent ones when equal (moved to the
    /// front), else a new one (moved into it: the shapes are not copied) in front.
    fn shared(&mut self, results: gt_ir::verify::shape::ResultTypes) -> Arc<[TensorType]> {
        if let Some(k) = self.recent.iter().position(|r| r[..] == results[..]) {
            self.recent[..=k].rotate_right(1);
            return self.recent[0].clone();
        }
        let fresh: Arc<[TensorType]> = results.into_iter().collect();
        if self.recent.len() == RECENT_TYPES {
            self.recent.pop();
        }
        self.recent.insert(0, fresh.clone());
        fresh
    }

    /// Types `instr` against the stream so far, recording nothing.
    pub fn infer(&self, instr: &Instr) -> Result<gt_ir::verify::shape::ResultTypes, TypeError> {
        shape::infer(instr, &|v| self.get(v).cloned().ok_or(TypeError::UnknownValue(v)))
    }

    /// Records an instruction known to type as `results`: what it defines, and what it frees.
    pub fn record(&mut self, instr: &Instr, results: &[TensorType]) {
        if let Instr::Free { src } = instr {
            // A free defines nothing.
            self.types.remove(src);
            return;
        }
        let mut types = results.iter();
        instr.for_each_result(|v| {
            if let Some(t) = types.next() {
                self.types.insert(v, t.clone());
            }
        });
    }

    /// A value's type, if it is live.
    pub fn get(&self, v: ValueId) -> Option<&TensorType> {
        self.types.get(&v)
    }
}

/// What a pass emits into: instructions kept from its input and instructions it injects.
#[derive(Debug, Default)]
pub struct Emit {
    items: Vec<(Instr, Meta)>,
    pass: &'static str,
    /// The meta of the instruction being taken (or, in a flush, of the sync point).
    pub(crate) current: Meta,
    errors: Vec<(Meta, PassError)>,
    refusals: Vec<Refusal>,
    notes: Vec<PassNote>,
}

impl Emit {
    /// An empty output for `pass` (for driving a pass by hand, as tests and tools do).
    pub fn new(pass: &'static str) -> Emit {
        Emit { pass, ..Emit::default() }
    }

    /// Sets the meta of the instruction about to be taken (for driving a pass by hand).
    pub fn take_next(&mut self, meta: Meta) {
        self.current = meta;
    }

    /// What was emitted, with metas.
    pub fn into_items(self) -> Vec<(Instr, Meta)> {
        self.items
    }

    /// The meta of the instruction being taken: a pass that holds instructions back keeps
    /// it with them and emits them with [`Emit::keep_from`].
    pub fn meta(&self) -> Meta {
        self.current.clone()
    }

    /// Where the instruction being taken goes (see [`Meta::place`]).
    pub fn place(&self) -> &[u32] {
        &self.current.place
    }

    /// Whether the instruction being taken is inside a compile signal's scope.
    pub fn in_compile_signal(&self) -> bool {
        self.current.compile
    }

    /// The result types of the instruction being taken (see [`Typing`]).
    pub fn types(&self) -> &Typing {
        &self.current.types
    }

    /// Emits the instruction being taken with its meta, moved rather than copied (a copy of
    /// the types is an atomic count up and down again, per pass and instruction): a pass
    /// reads the instruction's types and place before it keeps it, and keeps it once (after,
    /// they read as none). Its sequence number and signal scope stay, for what the pass
    /// injects after it.
    pub fn keep(&mut self, instr: Instr) {
        let meta = self.take_meta();
        self.items.push((instr, meta));
    }

    /// The meta of the instruction being taken, moved out as [`Emit::keep`] moves it: for a
    /// pass that holds the instruction back (to emit it later with [`Emit::keep_from`]) and
    /// reads nothing more of it (after, its types and place read as none).
    pub fn take_meta(&mut self) -> Meta {
        let current = &mut self.current;
        Meta {
            seq: current.seq,
            injected_by: current.injected_by,
            types: current.types.take(),
            compile: current.compile,
            place: std::mem::take(&mut current.place),
        }
    }

    /// Emits an instruction held back from the input, with the meta it came with.
    pub fn keep_from(&mut self, instr: Instr, meta: Meta) {
        self.items.push((instr, meta));
    }

    /// Emits instructions held back from the input, in order, with their metas, leaving
    /// `held` empty: as one buffer when nothing was emitted before them (no instruction is
    /// copied), else appended.
    pub fn keep_all(&mut self, held: &mut Vec<Emitted>) {
        if self.items.is_empty() {
            std::mem::swap(&mut self.items, held);
        } else {
            self.items.append(held);
        }
    }

    /// Emits an instruction the pass made.
    pub fn inject(&mut self, instr: Instr) {
        self.inject_for(instr, self.current.seq);
    }

    /// Emits an instruction the pass made on behalf of the client's instruction `seq` (a
    /// failure of it is reported against that one).
    pub fn inject_for(&mut self, instr: Instr, seq: u64) {
        self.inject_at(instr, seq, Vec::new());
    }

    /// Emits an instruction the pass made, its results going to `place` (see [`Meta::place`]).
    pub fn inject_at(&mut self, instr: Instr, seq: u64, place: Vec<u32>) {
        self.inject_typed(instr, seq, place, None);
    }

    /// [`Emit::inject_at`] with its result types known (`types`, as [`Meta::types`]): the
    /// pass vouches for them, and the dispatcher does not type it again (validation, in
    /// debug builds, still does).
    pub fn inject_typed(&mut self, instr: Instr, seq: u64, place: Vec<u32>, types: Typing) {
        let meta = Meta { seq, injected_by: Some(self.pass), types, compile: self.current.compile, place };
        self.items.push((instr, meta));
    }

    /// Refuses the instruction being taken: the dispatcher fails it for the client with
    /// `error` (its results are not computed).
    pub fn refuse(&mut self, instr: Instr, error: impl std::error::Error + Send + Sync + 'static) {
        self.refusals.push(Refusal { instr, meta: self.current.clone(), error: Arc::new(error) });
    }

    /// Notes what the pass could not do for the instruction being taken (it still ran, in
    /// a documented fallback); the dispatcher writes it to the instruction log.
    pub fn note(&mut self, note: impl std::error::Error + Send + Sync + 'static) {
        self.notes.push(PassNote { pass: self.pass, meta: self.current.clone(), note: Arc::new(note) });
    }

    /// Reports a failure of the pass against the instruction being taken; the dispatcher
    /// logs it (and debug builds stop on it).
    pub fn error(&mut self, reason: &'static str) {
        let e = PassError::Reported { pass: self.pass, reason };
        self.errors.push((self.current.clone(), e));
    }

    /// Instructions emitted so far.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing was emitted.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// One stream transformer. Pure: no execution, no I/O.
pub trait StreamPass: Send {
    /// The pass's name (for `--dump-after`, stats and switches).
    fn name(&self) -> &'static str;
    /// Takes one instruction; emits what follows from it (in order).
    fn run(&mut self, instr: Instr, out: &mut Emit);
    /// Takes, from the start of `items`, the instructions that [`StreamPass::run`] would
    /// emit just as they came (each kept with its meta, nothing held, injected or refused),
    /// advancing the pass as `run` would, and says how many: the pipeline sends those on
    /// without moving each through `run` (a loop the `hotpath` pass only follows). The rest
    /// go through `run`. The default takes none.
    fn pass_through(&mut self, items: &[Emitted]) -> usize {
        let _ = items;
        0
    }
    /// Releases everything held, in order.
    fn flush(&mut self, out: &mut Emit) {
        let _ = out;
    }
    /// Called when no more input is waiting: a pass whose output does not depend on where
    /// regions end may release what it holds (so workers are not kept waiting); one whose
    /// output does (fusion) keeps it. Released instructions still go through later passes.
    fn idle(&mut self, out: &mut Emit) {
        let _ = out;
    }
    /// Counters for `--pass-stats`, as (name, value).
    fn stats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// The dispatcher has workers `0..alive.len()`, worker `w` up where `alive[w]` (it
    /// keeps a gone worker's index; placements are checked against both).
    fn set_workers(&mut self, alive: &[bool]) {
        let _ = alive;
    }
    /// The client reads `value`: a pass that spread it over workers emits what puts it
    /// whole on the client's home worker under its own id (called after a flush).
    fn materialize(&mut self, value: ValueId, out: &mut Emit) {
        let _ = (value, out);
    }
}

/// A pass name that no pass has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPass {
    /// The name given.
    pub name: String,
    /// The names there are.
    pub known: Vec<&'static str>,
}

impl fmt::Display for UnknownPass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown pass `{}` (known passes: {})", self.name, self.known.join(", "))
    }
}

impl std::error::Error for UnknownPass {}

/// Called with each instruction a pass emits (the pass's name, the instruction, its meta:
/// dumps show where placed instructions run).
pub type DumpHook = Box<dyn FnMut(&'static str, &Instr, &Meta) + Send>;

struct Stage {
    pass: Box<dyn StreamPass>,
    enabled: bool,
    /// The types of this stage's output stream, when validating.
    check: StreamTypes,
}

/// Passes applied in order to one stream, with the context they share (see the module docs).
pub struct Pipeline {
    stages: Vec<Stage>,
    dump: Option<DumpHook>,
    /// The stream's types as the client sent it.
    entry: StreamTypes,
    /// The open signal scopes, innermost last, and whether each is a compile signal.
    signals: Vec<(String, bool)>,
    /// How many of them are compile signals (kept, not counted per instruction: a client
    /// may nest scopes deeply).
    compiling: usize,
    /// Re-type every pass's output (on in debug builds).
    validate: bool,
    errors: Vec<(Meta, PassError)>,
    refusals: Vec<Refusal>,
    notes: Vec<PassNote>,
    /// Emptied buffers of instructions between stages, used again (a small op would
    /// otherwise allocate one per stage).
    spare: Vec<Vec<Emitted>>,
}

impl Default for Pipeline {
    fn default() -> Pipeline {
        Pipeline {
            stages: Vec::new(),
            dump: None,
            entry: StreamTypes::default(),
            signals: Vec::new(),
            compiling: 0,
            validate: cfg!(debug_assertions),
            errors: Vec::new(),
            refusals: Vec::new(),
            notes: Vec::new(),
            spare: Vec::new(),
        }
    }
}

/// An instruction out of a pipeline, with its meta.
pub type Emitted = (Instr, Meta);

/// Spare buffers a pipeline keeps between instructions.
const SPARE_BUFFERS: usize = 8;
/// The capacity each spare buffer keeps (also what the dispatcher keeps of the buffer a
/// pipeline emits into): a burst's buffers are kept, not its peak.
pub const SPARE_CAPACITY: usize = 64;

impl Pipeline {
    /// A pipeline with no passes: instructions go through typed and unchanged.
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// Appends a pass (enabled).
    pub fn push(&mut self, pass: Box<dyn StreamPass>) {
        self.stages.push(Stage { pass, enabled: true, check: StreamTypes::default() });
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|s| s.pass.name()).collect()
    }

    /// Whether no pass would touch the stream.
    pub fn is_empty(&self) -> bool {
        self.dump.is_none() && !self.stages.iter().any(|s| s.enabled)
    }

    /// Switches a pass on or off.
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<(), UnknownPass> {
        let known = self.names();
        let stage = self
            .stages
            .iter_mut()
            .find(|s| s.pass.name() == name)
            .ok_or_else(|| UnknownPass { name: name.to_string(), known })?;
        stage.enabled = enabled;
        Ok(())
    }

    /// Reports every instruction each enabled pass emits to `hook` (for pass dumps).
    pub fn set_dump(&mut self, hook: DumpHook) {
        self.dump = Some(hook);
    }

    /// Re-types every pass's output and reports wrong carried types ([`PassError`]); on by
    /// default in debug builds.
    pub fn set_validate(&mut self, on: bool) {
        self.validate = on;
    }

    /// The open signal scopes at the entry, innermost last, and whether each compiles.
    pub fn signals(&self) -> &[(String, bool)] {
        &self.signals
    }

    /// The rule breaks found since the last call, with the meta of the instruction each is
    /// about.
    pub fn take_errors(&mut self) -> Vec<(Meta, PassError)> {
        std::mem::take(&mut self.errors)
    }

    /// The instructions passes refused since the last call.
    pub fn take_refusals(&mut self) -> Vec<Refusal> {
        std::mem::take(&mut self.refusals)
    }

    /// What passes noted since the last call.
    pub fn take_notes(&mut self) -> Vec<PassNote> {
        std::mem::take(&mut self.notes)
    }

    /// Tells every pass the dispatcher has workers `0..n`, every one up.
    pub fn set_workers(&mut self, n: usize) {
        self.set_alive_workers(&vec![true; n]);
    }

    /// Tells every pass which of the dispatcher's workers are up ([`StreamPass::set_workers`]).
    pub fn set_alive_workers(&mut self, alive: &[bool]) {
        for stage in &mut self.stages {
            stage.pass.set_workers(alive);
        }
    }

    /// The client reads `value` (the sync point `seq`, after [`Pipeline::flush`]): passes
    /// that spread it emit what assembles it on the home worker; that goes through the
    /// later passes, flushed.
    pub fn materialize(&mut self, value: ValueId, seq: u64, out: &mut Vec<Emitted>) {
        for k in 0..self.stages.len() {
            if !self.stages[k].enabled {
                continue;
            }
            let stage = &mut self.stages[k];
            let mut emit = Emit::new(stage.pass.name());
            emit.take_next(Meta::client(seq));
            stage.pass.materialize(value, &mut emit);
            self.report(k, &mut emit);
            if !emit.items.is_empty() {
                self.feed(k + 1, emit.items, out, Some(seq));
            }
        }
    }

    /// Every pass's counters, in order.
    pub fn stats(&self) -> Vec<(&'static str, Vec<(&'static str, u64)>)> {
        self.stages.iter().map(|s| (s.pass.name(), s.pass.stats())).collect()
    }

    /// Runs the client's instruction `seq` through every enabled pass, typing it first; what
    /// comes out is pushed onto `out`, in order.
    pub fn run(&mut self, instr: Instr, seq: u64, out: &mut Vec<Emitted>) {
        self.run_many([(instr, seq)], out);
    }

    /// Runs the client's instructions, each with its sequence number, through every enabled
    /// pass as [`Pipeline::run`] one by one would (the same output, in the same order), each
    /// pass taking them [`SPARE_CAPACITY`] at a time: a stage is set up once per run of them
    /// rather than once per instruction, which for small ops is much of a pass's cost.
    pub fn run_many(&mut self, instrs: impl IntoIterator<Item = (Instr, u64)>, out: &mut Vec<Emitted>) {
        let mut items = self.spare.pop().unwrap_or_default();
        for (instr, seq) in instrs {
            items.push(self.admit(instr, seq));
            if items.len() == SPARE_CAPACITY {
                self.feed(0, items, out, None);
                items = self.spare.pop().unwrap_or_default();
            }
        }
        if items.is_empty() {
            self.spare.push(items);
        } else {
            self.feed(0, items, out, None);
        }
    }

    /// The client's instruction `seq` typed, with its meta, as the first pass takes it.
    fn admit(&mut self, instr: Instr, seq: u64) -> Emitted {
        match &instr {
            Instr::SignalStart { name, compile, .. } => {
                self.signals.push((name.clone(), *compile));
                self.compiling += usize::from(*compile);
            }
            // An end that does not close the innermost scope closes nothing.
            Instr::SignalEnd { name } if self.signals.last().is_some_and(|(open, _)| open == name) => {
                if let Some((_, compile)) = self.signals.pop() {
                    self.compiling -= usize::from(compile);
                }
            }
            _ => {}
        }
        let types = Some(self.entry.admit(&instr).map_err(Arc::new));
        let compile = self.compiling > 0;
        (instr, Meta { seq, injected_by: None, types, compile, place: Vec::new() })
    }

    /// Flushes every pass in order (for the sync point `seq`): what one pass releases still
    /// goes through the later ones.
    pub fn flush(&mut self, seq: u64, out: &mut Vec<Emitted>) {
        self.feed(0, Vec::new(), out, Some(seq));
    }

    /// Tells every pass that no more input is waiting ([`StreamPass::idle`]); what they
    /// release goes through the later passes as ordinary input.
    pub fn idle(&mut self, out: &mut Vec<Emitted>) {
        for k in 0..self.stages.len() {
            if !self.stages[k].enabled {
                continue;
            }
            let stage = &mut self.stages[k];
            let mut emit = Emit::new(stage.pass.name());
            stage.pass.idle(&mut emit);
            if !emit.items.is_empty() || !emit.errors.is_empty() || !emit.notes.is_empty() {
                self.report(k, &mut emit);
                self.feed(k + 1, emit.items, out, None);
            }
        }
    }

    /// Dumps, validates and collects the errors of what stage `k` emitted.
    fn report(&mut self, k: usize, emit: &mut Emit) {
        if let Some(dump) = &mut self.dump {
            for (i, meta) in &emit.items {
                dump(emit.pass, i, meta);
            }
        }
        self.errors.append(&mut emit.errors);
        self.refusals.append(&mut emit.refusals);
        self.notes.append(&mut emit.notes);
        if self.validate {
            let check = &mut self.stages[k].check;
            for (instr, meta) in &emit.items {
                let inferred = check.admit(instr);
                if let Some(Ok(carried)) = &meta.types {
                    if inferred.as_deref() != Ok(&carried[..]) {
                        let e = PassError::TypesChanged {
                            pass: emit.pass,
                            instr: Box::new(instr.clone()),
                            carried: carried.to_vec(),
                            inferred: inferred.map(|t| t.to_vec()),
                        };
                        self.errors.push((meta.clone(), e));
                    }
                }
            }
        }
    }

    /// Feeds `items` to stage `from`, and what it emits through the stages after it; for the
    /// sync point `flush`, each of those stages is flushed after what it took. One walk down
    /// the stages, in which every stage sees what it would see if each one were flushed in
    /// turn (what the earlier ones held, then its own flush), so a flush costs one visit per
    /// stage instead of one per pair of stages.
    fn feed(&mut self, from: usize, mut items: Vec<Emitted>, out: &mut Vec<Emitted>, flush: Option<u64>) {
        for k in from..self.stages.len() {
            let stage = &mut self.stages[k];
            if !stage.enabled {
                continue;
            }
            let mut emit = Emit::new(stage.pass.name());
            emit.items = self.spare.pop().unwrap_or_default();
            let taken = stage.pass.pass_through(&items);
            if taken == items.len() && emit.items.is_empty() {
                // The whole batch goes on as it came.
                std::mem::swap(&mut emit.items, &mut items);
            } else {
                let mut rest = items.drain(..);
                emit.items.extend(rest.by_ref().take(taken));
                for (instr, meta) in rest {
                    emit.take_next(meta);
                    stage.pass.run(instr, &mut emit);
                }
            }
            if let Some(seq) = flush {
                emit.take_next(Meta::client(seq));
                stage.pass.flush(&mut emit);
            }
            self.report(k, &mut emit);
            self.spare.push(std::mem::replace(&mut items, std::mem::take(&mut emit.items)));
        }
        if out.is_empty() {
            // The whole output moves as one buffer, not instruction by instruction.
            std::mem::swap(out, &mut items);
        } else {
            out.append(&mut items);
        }
        self.spare.push(items);
        // A burst's buffers are kept, not its peak: a few, each no larger than a batch.
        self.spare.truncate(SPARE_BUFFERS);
        for b in &mut self.spare {
            b.shrink_to(SPARE_CAPACITY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::{TensorType, ValueId};
    use std::sync::{Arc, Mutex};

    /// Holds everything until flushed.
    struct Hold(Vec<(Instr, Meta)>);
    impl StreamPass for Hold {
        fn name(&self) -> &'static str {
            "hold"
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            self.0.push((instr, out.meta()));
        }
        fn flush(&mut self, out: &mut Emit) {
            for (i, origin) in self.0.drain(..) {
                out.keep_from(i, origin);
            }
        }
    }

    /// Keeps each instruction and injects a copy.
    struct Twice;
    impl StreamPass for Twice {
        fn name(&self) -> &'static str {
            "twice"
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            out.keep(instr.clone());
            out.inject(instr);
        }
        fn stats(&self) -> Vec<(&'static str, u64)> {
            vec![("copies", 1)]
        }
    }

    /// The meta of the client's instruction `seq`, typed at the entry as `zeros` is.
    fn client(seq: u64) -> Meta {
        Meta {
            seq,
            injected_by: None,
            types: Some(Ok(vec![TensorType::f32(vec![1])].into())),
            compile: false,
            place: Vec::new(),
        }
    }

    fn zeros(n: u32) -> Instr {
        Instr::Zeros { dst: ValueId(n), ty: TensorType::f32(vec![1]) }
    }

    /// Every known pass (fusing everything, a small dead-value window so that regions end
    /// mid-stream), taking a stream many instructions at a time, gives what taking it one by
    /// one gives: the same instructions with the same metas, and the same errors, in order.
    #[test]
    fn many_at_a_time_is_one_by_one() {
        let text = "%a = full f32[4, 3] 1.0\n%b = exp %a\n%c = neg %b\nfree %a\n\
            signal_start \"s\" compile\n%d = add %c, %b\n%e = relu %d\nfree %b\nfree %c\nsignal_end \"s\"\n\
            %f = full f32[3, 2] 2.0\n%g = matmul %e, %f\nfree %d\nfree %e\n%h = tanh %g\n%i = sum %h\n\
            free %g\nfree %f\nsignal_start \"p\" shard axis=0 workers=[0, 7]\n%j = neg %i\nsignal_end \"p\"\n\
            free %h\nfree %q\n%k = add %a, %a\nfree %i\n";
        let program = gt_ir::text::parse(text).unwrap();
        let instrs: Vec<Instr> = program.instrs().into_iter().map(|(i, _)| i.clone()).collect();
        let mut options = crate::registry::default_options();
        options.fuse.regions = crate::fuse::Regions::All;
        options.dead.window = 5;
        let build = || crate::registry::pipeline(crate::registry::KNOWN_PASSES, &options).unwrap();
        let (mut one, mut many) = (build(), build());
        let (mut by_one, mut by_many) = (Vec::new(), Vec::new());
        for (seq, i) in (1u64..).zip(&instrs) {
            one.run(i.clone(), seq, &mut by_one);
        }
        for (lo, hi) in [(0, 3), (3, 17), (17, instrs.len())] {
            let chunk = (lo..hi).map(|k| (instrs[k].clone(), k as u64 + 1));
            many.run_many(chunk, &mut by_many);
        }
        one.flush(100, &mut by_one);
        many.flush(100, &mut by_many);
        assert!(by_one.len() > instrs.len() / 2, "{by_one:?}");
        assert_eq!(by_one, by_many);
        let errors =
            |p: &mut Pipeline| p.take_errors().into_iter().map(|(m, e)| (m, e.to_string())).collect::<Vec<_>>();
        let (e1, e2) = (errors(&mut one), errors(&mut many));
        assert_eq!(e1, e2);
        let refused = |p: &mut Pipeline| p.take_refusals().into_iter().map(|r| format!("{r:?}")).collect::<Vec<_>>();
        let (r1, r2) = (refused(&mut one), refused(&mut many));
        assert_eq!(r1, r2);
        assert!(!r1.is_empty(), "the stream places a scope on a worker that does not exist");
        // The counters agree, timings aside.
        let counters = |p: &Pipeline| {
            let mut stats = p.stats();
            for (_, s) in &mut stats {
                s.retain(|(name, _)| !name.ends_with("_us"));
            }
            stats
        };
        assert_eq!(counters(&one), counters(&many));
    }

    /// A pass driven through `run` alone (the default `pass_through` takes nothing).
    struct RunOnly(Box<dyn StreamPass>);
    impl StreamPass for RunOnly {
        fn name(&self) -> &'static str {
            self.0.name()
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            self.0.run(instr, out)
        }
        fn flush(&mut self, out: &mut Emit) {
            self.0.flush(out)
        }
        fn idle(&mut self, out: &mut Emit) {
            self.0.idle(out)
        }
        fn stats(&self) -> Vec<(&'static str, u64)> {
            self.0.stats()
        }
        fn set_workers(&mut self, alive: &[bool]) {
            self.0.set_workers(alive)
        }
        fn materialize(&mut self, value: ValueId, out: &mut Emit) {
            self.0.materialize(value, out)
        }
    }

    /// What passes let through by the batch (`pass_through`) comes out as `run` would send
    /// it, under each way of choosing regions to compile: a loop of tiny ops (followed by
    /// `hotpath`, outside any region for `fuse`), a training-like loop, signals, frees.
    #[test]
    fn passing_a_batch_through_is_running_it() {
        let step = |k: u32| {
            let b = 100 + 10 * k;
            format!(
                "%v{b} = neg %a\nfree %v{b}\n%v{} = exp %a\n%v{} = add %v{}, %a\n%v{} = relu %v{}\nfree %v{}\nfree %v{}\nfree %v{}\n",
                b + 1, b + 2, b + 1, b + 3, b + 2, b + 1, b + 2, b + 3
            )
        };
        let mut text = String::from("%a = full f32[4, 3] 1.0\n");
        for k in 0..30 {
            text += &format!("%t{k} = neg %a\nfree %t{k}\n");
        }
        for k in 0..12 {
            text += &step(k);
        }
        text += "signal_start \"s\" compile\n%c = exp %a\n%d = neg %c\nfree %c\nsignal_end \"s\"\n";
        // A value split over two workers, then tiny ops again (on it and on a whole one).
        text += "signal_start \"p\" shard axis=0 workers=[0, 1]\n%e = full f32[4, 3] 2.0\nsignal_end \"p\"\n";
        for k in 60..80 {
            text += &format!("%t{k} = neg %e\nfree %t{k}\n%u{k} = neg %a\nfree %u{k}\n");
        }
        text += "free %e\n";
        for k in 30..60 {
            text += &format!("%t{k} = neg %a\nfree %t{k}\n");
        }
        let program = gt_ir::text::parse(&text).unwrap();
        let instrs: Vec<Instr> = program.instrs().into_iter().map(|(i, _)| i.clone()).collect();
        for regions in [crate::fuse::Regions::Signals, crate::fuse::Regions::HotPaths, crate::fuse::Regions::All] {
            let mut options = crate::registry::default_options();
            options.fuse.regions = regions;
            let batched = || crate::registry::pipeline(crate::registry::KNOWN_PASSES, &options).unwrap();
            let mut one = Pipeline::new();
            for stage in batched().stages {
                one.push(Box::new(RunOnly(stage.pass)));
            }
            let mut many = batched();
            one.set_workers(2);
            many.set_workers(2);
            let (mut by_run, mut by_batch) = (Vec::new(), Vec::new());
            for chunk in instrs.chunks(7) {
                let at = |p: &Instr| instrs.iter().position(|i| std::ptr::eq(i, p)).unwrap_or(0) as u64 + 1;
                one.run_many(chunk.iter().map(|i| (i.clone(), at(i))), &mut by_run);
                many.run_many(chunk.iter().map(|i| (i.clone(), at(i))), &mut by_batch);
            }
            one.flush(1000, &mut by_run);
            many.flush(1000, &mut by_batch);
            assert_eq!(by_run, by_batch, "{regions:?}");
            // The counters agree, timings aside.
            let counters = |p: &Pipeline| {
                let mut stats = p.stats();
                for (_, s) in &mut stats {
                    s.retain(|(name, _)| !name.ends_with("_us"));
                }
                stats
            };
            assert_eq!(counters(&one), counters(&many), "{regions:?}");
            assert!(by_run.iter().any(|(i, _)| matches!(i, Instr::HotPathStart { .. })), "the loop is found");
            let sharded = counters(&one)[0].1.iter().any(|&(name, n)| name == "sharded" && n > 0);
            assert!(sharded, "{:?}", counters(&one));
        }
    }

    #[test]
    fn empty_pipeline_passes_through() {
        let mut p = Pipeline::new();
        assert!(p.is_empty());
        let mut out = Vec::new();
        p.run(zeros(1), 7, &mut out);
        assert_eq!(out, vec![(zeros(1), client(7))]);
    }

    #[test]
    fn held_instructions_go_through_later_passes_on_flush() {
        let mut p = Pipeline::new();
        p.push(Box::new(Hold(Vec::new())));
        p.push(Box::new(Twice));
        assert_eq!(p.names(), ["hold", "twice"]);
        let mut out = Vec::new();
        p.run(zeros(1), 1, &mut out);
        p.run(zeros(2), 2, &mut out);
        assert!(out.is_empty());
        p.flush(3, &mut out);
        // Held instructions keep the sequence numbers they came with, not the sync point's.
        let twice = |seq| Meta { seq, injected_by: Some("twice"), types: None, compile: false, place: Vec::new() };
        let expected = vec![(zeros(1), client(1)), (zeros(1), twice(1)), (zeros(2), client(2)), (zeros(2), twice(2))];
        assert_eq!(out, expected);
        assert_eq!(p.stats(), vec![("hold", vec![]), ("twice", vec![("copies", 1)])]);
    }

    #[test]
    fn passes_switch_off_by_name_and_unknown_names_list_the_known() {
        let mut p = Pipeline::new();
        p.push(Box::new(Twice));
        p.set_enabled("twice", false).unwrap();
        assert!(p.is_empty());
        let mut out = Vec::new();
        p.run(zeros(1), 1, &mut out);
        assert_eq!(out, vec![(zeros(1), client(1))]);
        let e = p.set_enabled("fuse", true).unwrap_err();
        assert_eq!(e.to_string(), "unknown pass `fuse` (known passes: twice)");
    }

    #[test]
    fn the_dump_hook_sees_each_pass_output() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut p = Pipeline::new();
        p.push(Box::new(Twice));
        let s = seen.clone();
        p.set_dump(Box::new(move |pass, i, _| s.lock().unwrap().push((pass, i.clone()))));
        let mut out = Vec::new();
        p.run(zeros(3), 1, &mut out);
        assert_eq!(*seen.lock().unwrap(), vec![("twice", zeros(3)), ("twice", zeros(3))]);
    }

    /// Rewrites every `zeros` into a larger one but keeps the carried types: a pass bug.
    struct Liar;
    impl StreamPass for Liar {
        fn name(&self) -> &'static str {
            "liar"
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            match instr {
                Instr::Zeros { dst, .. } => out.keep(Instr::Zeros { dst, ty: TensorType::f32(vec![5]) }),
                other => out.keep(other),
            }
        }
    }

    /// Refuses every `free` it sees (a pass reporting its own failure).
    struct NoFrees;
    impl StreamPass for NoFrees {
        fn name(&self) -> &'static str {
            "nofrees"
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            if matches!(instr, Instr::Free { .. }) {
                out.error("frees are not taken");
            }
            out.keep(instr);
        }
    }

    #[test]
    fn a_pass_reports_errors_against_the_instruction_it_took() {
        let mut p = Pipeline::new();
        p.push(Box::new(NoFrees));
        let mut out = Vec::new();
        p.run(zeros(1), 1, &mut out);
        p.run(Instr::Free { src: ValueId(1) }, 2, &mut out);
        let errors = p.take_errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0.seq, 2);
        assert_eq!(errors[0].1.to_string(), "pass `nofrees`: frees are not taken");
        assert!(p.take_errors().is_empty());
    }

    #[test]
    fn validation_reports_a_pass_that_keeps_wrong_types() {
        let mut p = Pipeline::new();
        p.push(Box::new(Liar));
        p.set_validate(true);
        let mut out = Vec::new();
        p.run(zeros(1), 4, &mut out);
        let errors = p.take_errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0.seq, 4);
        let msg = errors[0].1.to_string();
        assert!(msg.starts_with("pass `liar` emitted `%1 = zeros f32[5]` carrying result types"), "{msg}");
        // Without validation the pipeline trusts its passes.
        p.set_validate(false);
        p.run(zeros(2), 5, &mut out);
        assert!(p.take_errors().is_empty());
    }

    #[test]
    fn the_entry_types_each_instruction_once_and_tracks_compile_scopes() {
        let mut p = Pipeline::new();
        let mut out = Vec::new();
        p.run(Instr::SignalStart { name: "a".into(), compile: true, backward: false, place: None }, 1, &mut out);
        p.run(zeros(1), 2, &mut out);
        p.run(Instr::SignalEnd { name: "b".into() }, 3, &mut out);
        assert_eq!(p.signals(), [("a".to_string(), true)]);
        p.run(Instr::SignalEnd { name: "a".into() }, 4, &mut out);
        p.run(Instr::Free { src: ValueId(7) }, 5, &mut out);
        assert!(p.signals().is_empty());
        let metas: Vec<&Meta> = out.iter().map(|(_, m)| m).collect();
        assert_eq!(metas[1].types, Some(Ok(vec![TensorType::f32(vec![1])].into())));
        assert!(metas[1].compile && !metas[4].compile);
        assert_eq!(metas[4].types, Some(Err(Arc::new(TypeError::UnknownValue(ValueId(7))))));
        // Nested scopes: an inner plain one keeps compiling inside the outer compile one.
        out.clear();
        let start =
            |name: &str, compile| Instr::SignalStart { name: name.into(), compile, backward: false, place: None };
        p.run(start("c", true), 6, &mut out);
        p.run(start("d", false), 7, &mut out);
        p.run(zeros(1), 8, &mut out);
        p.run(Instr::SignalEnd { name: "d".into() }, 9, &mut out);
        p.run(zeros(1), 10, &mut out);
        p.run(Instr::SignalEnd { name: "c".into() }, 11, &mut out);
        p.run(zeros(1), 12, &mut out);
        let compiled: Vec<bool> = out.iter().map(|(_, m)| m.compile).collect();
        assert_eq!(compiled, [true, true, true, true, true, false, false]);
    }
}
