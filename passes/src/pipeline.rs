//! [`StreamPass`] and [`Pipeline`]: a pass takes one instruction and emits zero or more; a
//! pipeline runs its passes in order. Passes may hold instructions back (a bounded window)
//! but must release them all on [`StreamPass::flush`], which the dispatcher calls at every
//! sync point, so nothing a client waits for is ever held.
//!
//! Every instruction carries its [`Origin`]: the position in the client's stream it came
//! from (so a failure of an instruction a pass held back is still reported against it) and
//! the pass that injected it, if one did (the instruction log shows those as INJECT
//! events). A pipeline can switch passes off by name and report each pass's stream to a
//! dump hook.

use gt_ir::Instr;
use std::fmt;

/// Where an instruction in a pipeline comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    /// The client's sequence number of the instruction it came from (or that was being
    /// taken when a pass made it); failures are reported against it.
    pub seq: u64,
    /// The pass that injected it; `None` for the client's own instructions.
    pub injected_by: Option<&'static str>,
}

/// What a pass emits into: instructions kept from its input and instructions it injects.
#[derive(Debug, Default)]
pub struct Emit {
    items: Vec<(Instr, Origin)>,
    pass: &'static str,
    /// The origin of the instruction being taken (or, in a flush, of the sync point).
    pub(crate) current: Origin,
}

impl Emit {
    /// An empty output for `pass` (for driving a pass by hand, as tests and tools do).
    pub fn new(pass: &'static str) -> Emit {
        Emit { items: Vec::new(), pass, current: Origin::default() }
    }

    /// What was emitted, with origins.
    pub fn into_items(self) -> Vec<(Instr, Origin)> {
        self.items
    }

    /// The origin of the instruction being taken: a pass that holds instructions back keeps
    /// it with them and emits them with [`Emit::keep_from`].
    pub fn origin(&self) -> Origin {
        self.current
    }

    /// Emits the instruction being taken (keeps its origin).
    pub fn keep(&mut self, instr: Instr) {
        self.items.push((instr, self.current));
    }

    /// Emits an instruction held back from the input, with the origin it came with.
    pub fn keep_from(&mut self, instr: Instr, origin: Origin) {
        self.items.push((instr, origin));
    }

    /// Emits an instruction the pass made.
    pub fn inject(&mut self, instr: Instr) {
        self.inject_for(instr, self.current.seq);
    }

    /// Emits an instruction the pass made on behalf of the client's instruction `seq` (a
    /// failure of it is reported against that one).
    pub fn inject_for(&mut self, instr: Instr, seq: u64) {
        self.items.push((instr, Origin { seq, injected_by: Some(self.pass) }));
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

/// Called with each instruction a pass emits (the pass's name, the instruction).
pub type DumpHook = Box<dyn FnMut(&'static str, &Instr) + Send>;

struct Stage {
    pass: Box<dyn StreamPass>,
    enabled: bool,
}

/// Passes applied in order to one stream.
#[derive(Default)]
pub struct Pipeline {
    stages: Vec<Stage>,
    dump: Option<DumpHook>,
}

/// An instruction out of a pipeline, with its origin.
pub type Emitted = (Instr, Origin);

impl Pipeline {
    /// A pipeline with no passes: instructions go through unchanged.
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// Appends a pass (enabled).
    pub fn push(&mut self, pass: Box<dyn StreamPass>) {
        self.stages.push(Stage { pass, enabled: true });
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

    /// Every pass's counters, in order.
    pub fn stats(&self) -> Vec<(&'static str, Vec<(&'static str, u64)>)> {
        self.stages.iter().map(|s| (s.pass.name(), s.pass.stats())).collect()
    }

    /// Runs the client's instruction `seq` through every enabled pass; what comes out is
    /// pushed onto `out`, in order.
    pub fn run(&mut self, instr: Instr, seq: u64, out: &mut Vec<Emitted>) {
        self.feed(0, vec![(instr, Origin { seq, injected_by: None })], out, None);
    }

    /// Flushes every pass in order (for the sync point `seq`): what one pass releases still
    /// goes through the later ones.
    pub fn flush(&mut self, seq: u64, out: &mut Vec<Emitted>) {
        for k in 0..self.stages.len() {
            self.feed(k, Vec::new(), out, Some(seq));
        }
    }

    /// Tells every pass that no more input is waiting ([`StreamPass::idle`]); what they
    /// release goes through the later passes as ordinary input.
    pub fn idle(&mut self, out: &mut Vec<Emitted>) {
        for k in 0..self.stages.len() {
            if !self.stages[k].enabled {
                continue;
            }
            let stage = &mut self.stages[k];
            let mut emit = Emit { items: Vec::new(), pass: stage.pass.name(), current: Origin::default() };
            stage.pass.idle(&mut emit);
            if !emit.items.is_empty() {
                self.report(&emit);
                self.feed(k + 1, emit.items, out, None);
            }
        }
    }

    fn report(&mut self, emit: &Emit) {
        if let Some(dump) = &mut self.dump {
            for (i, _) in &emit.items {
                dump(emit.pass, i);
            }
        }
    }

    /// Feeds `items` to stage `from` (flushing it first for the sync point `flush`), and
    /// what it emits through the stages after it.
    fn feed(&mut self, from: usize, mut items: Vec<Emitted>, out: &mut Vec<Emitted>, flush: Option<u64>) {
        for k in from..self.stages.len() {
            let stage = &mut self.stages[k];
            if !stage.enabled {
                continue;
            }
            let mut emit = Emit { items: Vec::new(), pass: stage.pass.name(), current: Origin::default() };
            if let (Some(seq), true) = (flush, k == from) {
                emit.current = Origin { seq, injected_by: None };
                stage.pass.flush(&mut emit);
            }
            for (instr, origin) in items.drain(..) {
                emit.current = origin;
                stage.pass.run(instr, &mut emit);
            }
            self.report(&emit);
            items = emit.items;
        }
        out.append(&mut items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::{TensorType, ValueId};
    use std::sync::{Arc, Mutex};

    /// Holds everything until flushed.
    struct Hold(Vec<(Instr, Origin)>);
    impl StreamPass for Hold {
        fn name(&self) -> &'static str {
            "hold"
        }
        fn run(&mut self, instr: Instr, out: &mut Emit) {
            self.0.push((instr, out.origin()));
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

    fn client(seq: u64) -> Origin {
        Origin { seq, injected_by: None }
    }

    fn zeros(n: u32) -> Instr {
        Instr::Zeros { dst: ValueId(n), ty: TensorType::f32(vec![1]) }
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
        let twice = |seq| Origin { seq, injected_by: Some("twice") };
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
        p.set_dump(Box::new(move |pass, i| s.lock().unwrap().push((pass, i.clone()))));
        let mut out = Vec::new();
        p.run(zeros(3), 1, &mut out);
        assert_eq!(*seen.lock().unwrap(), vec![("twice", zeros(3)), ("twice", zeros(3))]);
    }
}
