//! `Program`: a parsed `.gtir` file: statements (instructions plus the script forms
//! `const`, `print`, `expect`, `repeat`, `signal`, and the training statements of [`Train`])
//! and the name of every value.

use crate::{Instr, Span, TensorType, ValueId};

/// A whole `.gtir` program.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Program {
    /// Top-level statements in order.
    pub body: Vec<Stmt>,
    /// Text name of each value (without `%`), indexed by [`ValueId::index`]. Ids are dense.
    pub names: Vec<String>,
}

/// A statement and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    /// What it does.
    pub kind: StmtKind,
    /// Its source span (default for built programs).
    pub span: Span,
}

/// A literal number as written: integers stay exact (seeds, dims), floats are `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer literal (wide enough for every `u64` and `i64`).
    Int(i128),
    /// A literal with a fraction, exponent, `inf` or `nan`.
    Float(f64),
}

impl Number {
    /// The value as a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

/// How `expect` compares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Comparison {
    /// `==`: bit-for-bit equal values (NaN equals NaN).
    Exact,
    /// `~=`: `|a - b| <= tol * max(1, |b|)` elementwise.
    Close {
        /// Tolerance, absolute below 1 and relative above.
        tol: f64,
    },
}

/// The kinds of statement.
#[derive(Debug, Clone, PartialEq)]
pub enum StmtKind {
    /// `const name = 64`: a named number. Uses are resolved at parse time; the declaration
    /// stays so that printing shows it.
    Const {
        /// The name.
        name: String,
        /// The value.
        value: Number,
    },
    /// An instruction of the stream.
    Instr(Instr),
    /// `print %v`: fetch a value and print it.
    Print {
        /// The value.
        src: ValueId,
    },
    /// `expect %v ~= [..] tol=1e-5`: fetch a value and compare it; a mismatch is a run error.
    Expect {
        /// The value.
        src: ValueId,
        /// How to compare.
        cmp: Comparison,
        /// Expected type, when given (`expect %v == f32[2] [1, 2]`).
        ty: Option<TensorType>,
        /// Expected values, row-major (of the expected type's dtype; `f64` without one).
        data: crate::data::Elements,
    },
    /// `repeat N { .. }`: runs the body `count` times. Values defined in the body are
    /// visible after it (from the last iteration).
    Repeat {
        /// Iterations, at least 1.
        count: u64,
        /// The body.
        body: Vec<Stmt>,
    },
    /// `signal "name" { .. }`: a named region (sharding and compilation configs refer to it).
    Signal {
        /// The signal's name.
        name: String,
        /// The body.
        body: Vec<Stmt>,
    },
    /// A training statement (run through autograd).
    Train(Train),
}

/// Training statements: gradients and parameter updates, run through the frontend's autograd.
#[derive(Debug, Clone, PartialEq)]
pub enum Train {
    /// `requires_grad %w, %b`: the values become leaves whose gradients are tracked.
    RequiresGrad {
        /// The parameters.
        values: Vec<ValueId>,
    },
    /// `backward %loss`: gradients of a one-element value, added to its leaves'.
    Backward {
        /// The loss.
        loss: ValueId,
    },
    /// `%g = grad %w`: a leaf's accumulated gradient as a value.
    Grad {
        /// Result.
        dst: ValueId,
        /// The leaf.
        of: ValueId,
    },
    /// `zero_grad %w, %b`: forgets the gradients.
    ZeroGrad {
        /// The parameters.
        values: Vec<ValueId>,
    },
    /// `sgd %w, %b lr=0.1 momentum=0.9` / `adam %w, %b lr=0.001`: one optimizer step over the
    /// parameters (each statement keeps its own state across loop iterations), then their
    /// gradients are cleared.
    Step {
        /// Which update.
        optimizer: Optimizer,
        /// The parameters.
        params: Vec<ValueId>,
    },
}

/// An optimizer and its settings (PyTorch's update rules and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optimizer {
    /// `sgd lr=.. momentum=0 weight_decay=0`.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// Momentum factor.
        momentum: f64,
        /// L2 penalty.
        weight_decay: f64,
    },
    /// `adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-8`.
    Adam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
}

impl Train {
    /// The statement's keyword.
    pub fn keyword(&self) -> &'static str {
        match self {
            Train::RequiresGrad { .. } => "requires_grad",
            Train::Backward { .. } => "backward",
            Train::Grad { .. } => "grad",
            Train::ZeroGrad { .. } => "zero_grad",
            Train::Step { optimizer: Optimizer::Sgd { .. }, .. } => "sgd",
            Train::Step { optimizer: Optimizer::Adam { .. }, .. } => "adam",
        }
    }

    /// The values it reads.
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            Train::RequiresGrad { values } | Train::ZeroGrad { values } | Train::Step { params: values, .. } => {
                values.clone()
            }
            Train::Backward { loss } => vec![*loss],
            Train::Grad { of, .. } => vec![*of],
        }
    }

    /// Calls `f` on every value it names, in text order (the result of `grad` first).
    pub fn visit_values_mut(&mut self, f: &mut dyn FnMut(&mut ValueId)) {
        match self {
            Train::RequiresGrad { values } | Train::ZeroGrad { values } | Train::Step { params: values, .. } => {
                values.iter_mut().for_each(f)
            }
            Train::Backward { loss } => f(loss),
            Train::Grad { dst, of } => {
                f(dst);
                f(of);
            }
        }
    }

    /// The value it defines (`grad`).
    pub fn result(&self) -> Option<ValueId> {
        match self {
            Train::Grad { dst, .. } => Some(*dst),
            _ => None,
        }
    }
}

impl Stmt {
    /// A statement with a default span, for programs built in code.
    pub fn new(kind: StmtKind) -> Stmt {
        Stmt { kind, span: Span::default() }
    }
}

impl Program {
    /// Whether it has training statements (and so must run through autograd).
    pub fn trains(&self) -> bool {
        fn walk(body: &[Stmt]) -> bool {
            body.iter().any(|s| match &s.kind {
                StmtKind::Train(_) => true,
                StmtKind::Repeat { body, .. } | StmtKind::Signal { body, .. } => walk(body),
                _ => false,
            })
        }
        walk(&self.body)
    }

    /// The text name of a value (`"x"` for `%x`); ids without a name print as their number.
    pub fn name(&self, v: ValueId) -> String {
        match self.names.get(v.index()) {
            Some(n) => n.clone(),
            None => v.0.to_string(),
        }
    }

    /// The same program with every span reset, for comparing programs by content.
    pub fn without_spans(&self) -> Program {
        fn strip(body: &[Stmt]) -> Vec<Stmt> {
            body.iter()
                .map(|s| Stmt {
                    span: Span::default(),
                    kind: match &s.kind {
                        StmtKind::Repeat { count, body } => StmtKind::Repeat { count: *count, body: strip(body) },
                        StmtKind::Signal { name, body } => StmtKind::Signal { name: name.clone(), body: strip(body) },
                        k => k.clone(),
                    },
                })
                .collect()
        }
        Program { body: strip(&self.body), names: self.names.clone() }
    }

    /// Every instruction in source order, entering blocks (each once, not per iteration).
    pub fn instrs(&self) -> Vec<(&Instr, Span)> {
        fn walk<'a>(body: &'a [Stmt], out: &mut Vec<(&'a Instr, Span)>) {
            for s in body {
                match &s.kind {
                    StmtKind::Instr(i) => out.push((i, s.span)),
                    StmtKind::Repeat { body, .. } | StmtKind::Signal { body, .. } => walk(body, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.body, &mut out);
        out
    }
}
