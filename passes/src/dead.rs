//! `dead`: frees each value as soon as nothing reads it any more. A client says it no longer
//! holds a value by freeing it, but it says so late: a tensor handle is dropped at the end
//! of a scope, a garbage-collected client frees when its collector runs, autograd releases
//! a graph after the whole backward, and the fuse pass puts the frees of a region after
//! all of its kernels. Until then the worker keeps the buffer. This pass holds a region of
//! the stream and moves each `free` up to right after the last instruction that reads or
//! defines the value it frees, so a worker's peak memory is what the program needs, not
//! what the client's timing leaves alive.
//!
//! Moving a free is always safe within a region: nothing between the value's last use and
//! the client's free reads it (the client freed it, so nothing after does either), and a
//! redefinition of the id counts as a use, so a free never overtakes the definition it
//! frees. The pass needs no types and does not look at what instructions compute.
//!
//! A region ends at a sync point (`flush`), a hot-path or signal marker, a full window
//! (`GT_DEAD_WINDOW`), and whenever the dispatcher finds no message waiting
//! ([`StreamPass::idle`]): waiting for more would only keep workers idle. Where regions end
//! changes where frees land, never a value. A moved free keeps the client's sequence number
//! (a free of a value that is not defined is reported against it).

use crate::pipeline::{Emit, Meta, StreamPass};
use foldhash::{HashMap, HashMapExt};
use gt_ir::{Instr, ValueId};

/// Settings of the dead-value pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadConfig {
    /// Most instructions held at once (`GT_DEAD_WINDOW`).
    pub window: usize,
}

impl Default for DeadConfig {
    fn default() -> DeadConfig {
        DeadConfig { window: 256 }
    }
}

/// What the pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadStats {
    /// Instructions seen.
    pub instructions: u64,
    /// Regions released.
    pub regions: u64,
    /// Frees seen.
    pub frees: u64,
    /// Frees moved up.
    pub moved: u64,
    /// Instructions the moved frees overtook, summed (how much earlier memory came back).
    pub overtaken: u64,
}

/// The dead-value pass.
#[derive(Debug, Default)]
pub struct Dead {
    config: DeadConfig,
    region: Vec<(Instr, Meta)>,
    /// Scratch: the region's slots while frees are moved (each emptied as it is emitted).
    slots: Vec<Option<(Instr, Meta)>>,
    stats: DeadStats,
    /// Scratch: each value's last touch in the region.
    last_touch: HashMap<ValueId, usize>,
}

impl Dead {
    /// A dead-value pass with these settings (a zero window is taken as 1).
    pub fn new(config: DeadConfig) -> Dead {
        Dead { config: DeadConfig { window: config.window.max(1) }, ..Dead::default() }
    }

    /// What it did so far.
    pub fn dead_stats(&self) -> DeadStats {
        self.stats
    }

    /// Releases the held region with each free moved up to right after its value's last
    /// touch (at the region's start when the region does not touch it before).
    fn release(&mut self, out: &mut Emit) {
        if self.region.is_empty() {
            return;
        }
        self.stats.regions += 1;
        // `after[k]`: the frees that go right after instruction k; `first`: before all.
        let mut after: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut first: Vec<usize> = Vec::new();
        self.last_touch.clear();
        for (k, (instr, _)) in self.region.iter().enumerate() {
            if let Instr::Free { src } = instr {
                let to = self.last_touch.get(src).copied();
                let overtaken = to.map_or(k, |t| k - t - 1) as u64;
                if overtaken > 0 {
                    self.stats.moved += 1;
                    self.stats.overtaken += overtaken;
                    match to {
                        Some(t) => after.entry(t).or_default().push(k),
                        None => first.push(k),
                    }
                }
                // A second free of the id (an error the dispatcher reports) stays behind
                // this one.
                self.last_touch.insert(*src, k);
                continue;
            }
            instr.visit_values(&mut |v| {
                self.last_touch.insert(v, k);
            });
        }
        if first.is_empty() && after.is_empty() {
            // Nothing moves (a loop of small ops frees each result right after its use): the
            // region goes on as it came, as one buffer.
            return out.keep_all(&mut self.region);
        }
        // Each instruction leaves the region once, moved (not cloned); the buffers are kept.
        // A moved free is still the client's instruction: it keeps its origin. It leaves its
        // slot empty, so reaching the slot later emits nothing.
        let mut region = std::mem::take(&mut self.slots);
        region.extend(self.region.drain(..).map(Some));
        let emit = |out: &mut Emit, item: &mut Option<(Instr, Meta)>| {
            if let Some((instr, origin)) = item.take() {
                out.keep_from(instr, origin);
            }
        };
        for &k in &first {
            emit(out, &mut region[k]);
        }
        for k in 0..region.len() {
            emit(out, &mut region[k]);
            if let Some(frees) = after.get(&k) {
                for &f in frees {
                    emit(out, &mut region[f]);
                }
            }
        }
        region.clear();
        self.slots = region;
    }
}

impl StreamPass for Dead {
    fn name(&self) -> &'static str {
        "dead"
    }

    fn run(&mut self, instr: Instr, out: &mut Emit) {
        self.stats.instructions += 1;
        if instr.is_marker() {
            self.release(out);
            out.keep(instr);
            return;
        }
        if matches!(instr, Instr::Free { .. }) {
            self.stats.frees += 1;
        }
        if self.region.is_empty() {
            // A region handed on whole leaves another buffer: sized once, not grown by doubling.
            self.region.reserve(self.config.window.min(1024));
        }
        self.region.push((instr, out.take_meta()));
        if self.region.len() >= self.config.window {
            self.release(out);
        }
    }

    fn flush(&mut self, out: &mut Emit) {
        self.release(out);
    }

    fn idle(&mut self, out: &mut Emit) {
        self.release(out);
    }

    fn stats(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats;
        vec![
            ("instructions", s.instructions),
            ("regions", s.regions),
            ("frees", s.frees),
            ("frees_moved", s.moved),
            ("instructions_overtaken", s.overtaken),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::text::parse;
    use gt_ir::{Program, Stmt, StmtKind};

    /// Runs `text` (a `.gtir` program of plain instructions) through the pass and prints
    /// what comes out with the program's names, marking the frees it moved.
    fn run(text: &str, window: usize) -> (String, DeadStats) {
        let program = parse(text).unwrap();
        let mut pass = Dead::new(DeadConfig { window });
        let mut out = Emit::new("dead");
        let instrs = program.instrs();
        for (seq, (i, _)) in (0u64..).zip(&instrs) {
            out.take_next(Meta::client(seq));
            pass.run((*i).clone(), &mut out);
        }
        pass.flush(&mut out);
        let items = out.into_items();
        let mut lines = Vec::new();
        for (k, (instr, origin)) in items.iter().enumerate() {
            // Moved: it comes out before an instruction that came in before it.
            let moved = if items[k + 1..].iter().any(|(_, o)| o.seq < origin.seq) { "   ; moved" } else { "" };
            let stmt = Stmt { kind: StmtKind::Instr(instr.clone()), span: Default::default() };
            let one = Program { body: vec![stmt], names: program.names.clone() };
            lines.push(format!("{}{moved}", gt_ir::text::print(&one).trim_end()));
        }
        (lines.join("\n"), pass.dead_stats())
    }

    #[test]
    fn frees_move_up_to_the_last_use() {
        let (text, stats) = run(
            "%a = full f32[4] 1.0\n%b = exp %a\n%c = neg %b\n%d = add %c, %b\n%e = relu %d\nfree %a\nfree %b\nfree %c\nfree %d\n",
            64,
        );
        insta::assert_snapshot!(text, @r"
        %a = full f32[4] 1.0
        %b = exp %a
        free %a   ; moved
        %c = neg %b
        %d = add %c, %b
        free %b   ; moved
        free %c   ; moved
        %e = relu %d
        free %d
        ");
        assert_eq!((stats.frees, stats.moved), (4, 4));
        assert_eq!(stats.overtaken, 3 + 2 + 3 + 3);
    }

    #[test]
    fn a_free_never_overtakes_a_redefinition_or_an_earlier_free() {
        // `free %x` frees the second definition; the second `free %x` is the client's error
        // and must stay after the first.
        let (text, _) =
            run("%x = full f32[2] 1.0\n%y = neg %x\n%x = full f32[2] 2.0\n%z = neg %y\nfree %x\nfree %x\n", 64);
        insta::assert_snapshot!(text, @r"
        %x = full f32[2] 1.0
        %y = neg %x
        %x = full f32[2] 2.0
        free %x   ; moved
        %z = neg %y
        free %x
        ");
    }

    #[test]
    fn values_from_before_the_region_are_freed_at_its_start() {
        let mut pass = Dead::new(DeadConfig::default());
        let mut out = Emit::new("dead");
        let a = ValueId(0);
        let b = ValueId(1);
        pass.run(Instr::Zeros { dst: a, ty: gt_ir::TensorType::f32(vec![1]) }, &mut out);
        pass.flush(&mut out);
        pass.run(Instr::Zeros { dst: b, ty: gt_ir::TensorType::f32(vec![1]) }, &mut out);
        pass.run(Instr::Free { src: a }, &mut out);
        pass.flush(&mut out);
        let instrs: Vec<Instr> = out.into_items().into_iter().map(|(i, _)| i).collect();
        assert_eq!(instrs[1], Instr::Free { src: a });
        assert_eq!(instrs.len(), 3);
    }

    #[test]
    fn markers_and_the_window_end_regions() {
        // The window is 2: the free cannot reach back past the region it is in.
        let (text, stats) = run("%a = full f32[1] 1.0\n%b = neg %a\n%c = neg %b\nfree %a\n", 2);
        insta::assert_snapshot!(text, @r"
        %a = full f32[1] 1.0
        %b = neg %a
        free %a   ; moved
        %c = neg %b
        ");
        assert_eq!(stats.regions, 2);
        let (text, _) =
            run("%a = full f32[1] 1.0\n%b = neg %a\nhotpath_start 7\n%c = neg %b\nfree %a\nhotpath_end 7\n", 64);
        assert!(text.contains("hotpath_start 7\nfree %a   ; moved\n%c = neg %b"), "{text}");
    }

    #[test]
    fn moved_frees_keep_the_origin_of_the_client_free() {
        let mut p = crate::Pipeline::new();
        p.push(Box::new(Dead::new(DeadConfig::default())));
        let mut out = Vec::new();
        p.run(Instr::Zeros { dst: ValueId(0), ty: gt_ir::TensorType::f32(vec![1]) }, 10, &mut out);
        p.run(Instr::Zeros { dst: ValueId(1), ty: gt_ir::TensorType::f32(vec![1]) }, 11, &mut out);
        p.run(Instr::Free { src: ValueId(0) }, 12, &mut out);
        p.flush(13, &mut out);
        let seqs: Vec<(u64, Option<&str>)> = out.iter().map(|(_, o)| (o.seq, o.injected_by)).collect();
        assert_eq!(seqs, vec![(10, None), (12, None), (11, None)]);
    }

    #[test]
    fn a_region_where_nothing_moves_goes_on_whole_with_its_origins() {
        // A loop of small ops freeing each result at once, over windows that fill (window 4,
        // so regions end mid-batch and one region's output follows another's in one emit).
        let mut p = crate::Pipeline::new();
        p.push(Box::new(Dead::new(DeadConfig { window: 4 })));
        let x = ValueId(0);
        let mut input = vec![(Instr::Zeros { dst: x, ty: gt_ir::TensorType::f32(vec![1]) }, 100)];
        for k in 1..=20u32 {
            let dst = ValueId(k);
            input.push((Instr::Unary { dst, op: gt_ir::UnaryOp::Neg, src: x }, 100 + 2 * k as u64 - 1));
            input.push((Instr::Free { src: dst }, 100 + 2 * k as u64));
        }
        let mut out = Vec::new();
        p.run_many(input.clone(), &mut out);
        p.flush(200, &mut out);
        let got: Vec<(Instr, u64)> = out.into_iter().map(|(i, m)| (i, m.seq)).collect();
        assert_eq!(got, input);
        let stats = p.stats();
        let dead: std::collections::HashMap<_, _> = stats[0].1.iter().copied().collect();
        assert_eq!((dead["frees_moved"], dead["regions"]), (0, 11));
    }
}
