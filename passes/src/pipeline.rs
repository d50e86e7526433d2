//! [`StreamPass`] and [`Pipeline`]: a pass takes one instruction and emits zero or more; a
//! pipeline runs its passes in order. Passes may hold instructions back (a bounded window)
//! but must release them all on [`StreamPass::flush`], which the dispatcher calls at every
//! sync point, so nothing a client waits for is ever held.

use gt_ir::Instr;

/// One stream transformer. Pure: no execution, no I/O.
pub trait StreamPass: Send {
    /// The pass's name (for `--dump-after`, stats and switches).
    fn name(&self) -> &'static str;
    /// Takes one instruction; pushes what it emits (in order) onto `out`.
    fn run(&mut self, instr: Instr, out: &mut Vec<Instr>);
    /// Releases everything held, in order.
    fn flush(&mut self, out: &mut Vec<Instr>) {
        let _ = out;
    }
}

/// Passes applied in order to one stream.
#[derive(Default)]
pub struct Pipeline {
    passes: Vec<Box<dyn StreamPass>>,
    scratch: Vec<Instr>,
}

impl Pipeline {
    /// A pipeline with no passes: instructions go through unchanged.
    pub fn new() -> Pipeline {
        Pipeline::default()
    }

    /// Appends a pass.
    pub fn push(&mut self, pass: Box<dyn StreamPass>) {
        self.passes.push(pass);
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs `instr` through every pass; what comes out is pushed onto `out`, in order.
    pub fn run(&mut self, instr: Instr, out: &mut Vec<Instr>) {
        if self.passes.is_empty() {
            out.push(instr);
            return;
        }
        let mut stage = vec![instr];
        for pass in &mut self.passes {
            self.scratch.clear();
            for i in stage.drain(..) {
                pass.run(i, &mut self.scratch);
            }
            std::mem::swap(&mut stage, &mut self.scratch);
        }
        out.append(&mut stage);
    }

    /// Flushes every pass in order: what one pass releases still goes through the later ones.
    pub fn flush(&mut self, out: &mut Vec<Instr>) {
        for k in 0..self.passes.len() {
            let mut released = Vec::new();
            self.passes[k].flush(&mut released);
            for pass in &mut self.passes[k + 1..] {
                let mut next = Vec::new();
                for i in released.drain(..) {
                    pass.run(i, &mut next);
                }
                released = next;
            }
            out.append(&mut released);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::{TensorType, ValueId};

    /// Holds everything until flushed.
    struct Hold(Vec<Instr>);
    impl StreamPass for Hold {
        fn name(&self) -> &'static str {
            "hold"
        }
        fn run(&mut self, instr: Instr, _: &mut Vec<Instr>) {
            self.0.push(instr);
        }
        fn flush(&mut self, out: &mut Vec<Instr>) {
            out.append(&mut self.0);
        }
    }

    /// Emits each instruction twice.
    struct Twice;
    impl StreamPass for Twice {
        fn name(&self) -> &'static str {
            "twice"
        }
        fn run(&mut self, instr: Instr, out: &mut Vec<Instr>) {
            out.push(instr.clone());
            out.push(instr);
        }
    }

    fn zeros(n: u32) -> Instr {
        Instr::Zeros { dst: ValueId(n), ty: TensorType::f32(vec![1]) }
    }

    #[test]
    fn empty_pipeline_passes_through() {
        let mut p = Pipeline::new();
        let mut out = Vec::new();
        p.run(zeros(1), &mut out);
        assert_eq!(out, vec![zeros(1)]);
    }

    #[test]
    fn held_instructions_go_through_later_passes_on_flush() {
        let mut p = Pipeline::new();
        p.push(Box::new(Hold(Vec::new())));
        p.push(Box::new(Twice));
        assert_eq!(p.names(), ["hold", "twice"]);
        let mut out = Vec::new();
        p.run(zeros(1), &mut out);
        p.run(zeros(2), &mut out);
        assert!(out.is_empty());
        p.flush(&mut out);
        assert_eq!(out, vec![zeros(1), zeros(1), zeros(2), zeros(2)]);
    }
}
