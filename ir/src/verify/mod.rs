//! The verifier: checks a whole program (names defined before use and once, no use after
//! `free`, every instruction's type rule, `expect` shapes) and infers every value's type.
//! It collects all errors rather than stopping at the first.

pub mod shape;

use crate::{Comparison, Instr, Optimizer, Program, Span, Stmt, StmtKind, TensorType, Train, ValueId};
use foldhash::{HashSet, HashSetExt};
pub use shape::TypeError;
use thiserror::Error;

/// One verifier finding, at a statement.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{kind}")]
pub struct VerifyError {
    /// The statement's span.
    pub span: Span,
    /// What is wrong.
    pub kind: VerifyErrorKind,
}

/// What the verifier found.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum VerifyErrorKind {
    /// A read of a name no statement defined before.
    #[error("use of undefined value %{name}")]
    Undefined {
        /// The name.
        name: String,
    },
    /// A name defined by two statements.
    #[error("value %{name} is defined twice (values are SSA: define each once)")]
    Redefined {
        /// The name.
        name: String,
        /// The first definition.
        first: Span,
    },
    /// A read of a freed value.
    #[error("use of %{name} after it was freed")]
    UseAfterFree {
        /// The name.
        name: String,
        /// Where it was freed.
        freed: Span,
    },
    /// An instruction whose operands break its type rule.
    #[error("{op}: {source}")]
    Type {
        /// The op's mnemonic.
        op: &'static str,
        /// The rule broken.
        #[source]
        source: TypeError,
    },
    /// `repeat 0`.
    #[error("repeat count must be at least 1")]
    RepeatZero,
    /// `expect` with the wrong number of values.
    #[error("expect: %{name} has {found} elements but {expected} values are given")]
    ExpectCount {
        /// The value.
        name: String,
        /// Values given.
        expected: usize,
        /// Elements of the value.
        found: usize,
    },
    /// `expect` with a type that differs from the value's.
    #[error("expect: %{name} has type {found}, expected {expected}")]
    ExpectType {
        /// The value.
        name: String,
        /// Type given.
        expected: TensorType,
        /// The value's type.
        found: TensorType,
    },
    /// A tolerance that is negative or not finite.
    #[error("expect: tolerance must be finite and >= 0, found {tol}")]
    Tolerance {
        /// As written.
        tol: f64,
    },
    /// A file with no instructions.
    #[error("program has no instructions")]
    Empty,
    /// `backward` of a loss with other than one element.
    #[error("backward: the loss %{name} must have one element; it has type {ty}")]
    LossShape {
        /// The loss.
        name: String,
        /// Its type.
        ty: TensorType,
    },
    /// An optimizer setting out of its range (`lr=0`, `beta1=1`).
    #[error("{keyword}: {name}={value} must be {want}")]
    Hyperparameter {
        /// The statement's keyword.
        keyword: &'static str,
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
        /// Its range, in words.
        want: &'static str,
    },
}

impl VerifyError {
    /// A second place worth showing with the error, and what it is.
    pub fn related(&self) -> Option<(Span, &'static str)> {
        match &self.kind {
            VerifyErrorKind::Redefined { first, .. } => Some((*first, "first defined here")),
            VerifyErrorKind::UseAfterFree { freed, .. } => Some((*freed, "freed here")),
            _ => None,
        }
    }
}

/// Every error the verifier found, in source order.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{} verifier error(s), first: {}", .0.len(), .0.first().map(|e| e.to_string()).unwrap_or_default())]
pub struct VerifyErrors(pub Vec<VerifyError>);

/// The type of every value of a verified program, indexed by [`ValueId`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Types(pub Vec<Option<TensorType>>);

impl Types {
    /// The type of a value, if known.
    pub fn get(&self, v: ValueId) -> Option<&TensorType> {
        self.0.get(v.index()).and_then(|t| t.as_ref())
    }
}

struct Checker<'p> {
    program: &'p Program,
    /// Defining statement (by address, stable while verifying) and its span.
    defined: Vec<Option<(usize, Span)>>,
    freed: Vec<Option<Span>>,
    types: Vec<Option<TensorType>>,
    errors: Vec<VerifyError>,
}

/// Verifies a program and infers the type of every value.
pub fn verify(program: &Program) -> Result<Types, VerifyErrors> {
    let n = program.names.len().max(max_id(program));
    let mut c =
        Checker { program, defined: vec![None; n], freed: vec![None; n], types: vec![None; n], errors: Vec::new() };
    c.block(&program.body);
    if program.instrs().is_empty() {
        c.errors.push(VerifyError { span: Span::default(), kind: VerifyErrorKind::Empty });
    }
    let mut seen = HashSet::new();
    let mut errors: Vec<VerifyError> =
        c.errors.into_iter().filter(|e| seen.insert((e.span, e.kind.to_string()))).collect();
    errors.sort_by_key(|e| e.span.start);
    if errors.is_empty() {
        Ok(Types(c.types))
    } else {
        Err(VerifyErrors(errors))
    }
}

fn max_id(p: &Program) -> usize {
    p.instrs()
        .iter()
        .flat_map(|(i, _)| i.results().into_iter().chain(i.operands()))
        .map(|v| v.index() + 1)
        .max()
        .unwrap_or(0)
}

impl Checker<'_> {
    fn block(&mut self, body: &[Stmt]) {
        for stmt in body {
            self.stmt(stmt);
        }
    }

    fn error(&mut self, span: Span, kind: VerifyErrorKind) {
        self.errors.push(VerifyError { span, kind });
    }

    /// Checks a read; returns whether the value is usable.
    fn read(&mut self, v: ValueId, span: Span) -> bool {
        let name = self.program.name(v);
        if v.index() >= self.defined.len() || self.defined[v.index()].is_none() {
            self.error(span, VerifyErrorKind::Undefined { name });
            return false;
        }
        if let Some(freed) = self.freed[v.index()] {
            self.error(span, VerifyErrorKind::UseAfterFree { name, freed });
            return false;
        }
        true
    }

    fn stmt(&mut self, stmt: &Stmt) {
        let span = stmt.span;
        match &stmt.kind {
            StmtKind::Const { .. } => {}
            StmtKind::Instr(instr) => self.instr(instr, stmt),
            StmtKind::Print { src } => {
                self.read(*src, span);
            }
            StmtKind::Expect { src, cmp, ty, data } => {
                if let Comparison::Close { tol } = cmp {
                    if !(tol.is_finite() && *tol >= 0.0) {
                        self.error(span, VerifyErrorKind::Tolerance { tol: *tol });
                    }
                }
                if !self.read(*src, span) {
                    return;
                }
                let Some(t) = self.types[src.index()].clone() else { return };
                let name = self.program.name(*src);
                if let Some(expected) = ty {
                    if *expected != t {
                        self.error(span, VerifyErrorKind::ExpectType { name, expected: expected.clone(), found: t });
                        return;
                    }
                }
                if data.len() != t.shape.numel() {
                    let found = t.shape.numel();
                    self.error(span, VerifyErrorKind::ExpectCount { name, expected: data.len(), found });
                }
            }
            StmtKind::Repeat { count, body } => {
                if *count == 0 {
                    self.error(span, VerifyErrorKind::RepeatZero);
                }
                // A second walk finds what only shows from the second iteration on (a value
                // freed in the body and read again); errors are deduplicated afterwards.
                for _ in 0..(*count).clamp(1, 2) {
                    self.block(body);
                }
            }
            StmtKind::Signal { body, .. } => self.block(body),
            StmtKind::Train(t) => self.train(t, stmt),
        }
    }

    fn train(&mut self, t: &Train, stmt: &Stmt) {
        let span = stmt.span;
        let keyword = t.keyword();
        let mut ok = true;
        for v in t.operands() {
            ok &= self.read(v, span);
        }
        match t {
            Train::Backward { loss } if ok => {
                if let Some(ty) = self.types[loss.index()].clone() {
                    if ty.shape.numel() != 1 {
                        let name = self.program.name(*loss);
                        self.error(span, VerifyErrorKind::LossShape { name, ty });
                    }
                }
            }
            Train::Grad { dst, of } => {
                let ty = if ok { self.types[of.index()].clone() } else { None };
                self.define(*dst, ty, stmt);
            }
            Train::Step { optimizer, .. } => {
                const POSITIVE: &str = "a positive number";
                const UNIT: &str = "in [0, 1)";
                let checks = match *optimizer {
                    Optimizer::Sgd { lr, momentum, weight_decay } => vec![
                        ("lr", lr, lr.is_finite() && lr > 0.0, POSITIVE),
                        ("momentum", momentum, (0.0..1.0).contains(&momentum), UNIT),
                        ("weight_decay", weight_decay, weight_decay.is_finite() && weight_decay >= 0.0, ">= 0"),
                    ],
                    Optimizer::Adam { lr, beta1, beta2, eps } => vec![
                        ("lr", lr, lr.is_finite() && lr > 0.0, POSITIVE),
                        ("beta1", beta1, (0.0..1.0).contains(&beta1), UNIT),
                        ("beta2", beta2, (0.0..1.0).contains(&beta2), UNIT),
                        ("eps", eps, eps.is_finite() && eps > 0.0, POSITIVE),
                    ],
                };
                for (name, value, fine, want) in checks {
                    if !fine {
                        self.error(span, VerifyErrorKind::Hyperparameter { keyword, name, value, want });
                    }
                }
            }
            _ => {}
        }
    }

    /// Records a definition of `v` by `stmt` (an error if another statement defined it).
    fn define(&mut self, v: ValueId, ty: Option<TensorType>, stmt: &Stmt) {
        let site = stmt as *const Stmt as usize;
        let i = v.index();
        if i >= self.defined.len() {
            // A result id beyond the name table (a program built in code).
            self.defined.resize(i + 1, None);
            self.freed.resize(i + 1, None);
            self.types.resize(i + 1, None);
        }
        if let Some((prev, first)) = self.defined[i] {
            if prev != site {
                self.error(stmt.span, VerifyErrorKind::Redefined { name: self.program.name(v), first });
                return;
            }
        }
        self.defined[i] = Some((site, stmt.span));
        self.freed[i] = None;
        self.types[i] = ty;
    }

    fn instr(&mut self, instr: &Instr, stmt: &Stmt) {
        let span = stmt.span;
        let mut ok = true;
        for v in instr.operands() {
            ok &= self.read(v, span);
        }
        if let Instr::Free { src } = instr {
            if ok {
                self.freed[src.index()] = Some(span);
            }
            return;
        }
        let types = &self.types;
        let inferred = if ok {
            shape::infer(instr, &|v: ValueId| types.get(v.index()).cloned().flatten().ok_or(TypeError::UnknownValue(v)))
        } else {
            Err(TypeError::UnknownValue(ValueId(u32::MAX)))
        };
        let inferred = match inferred {
            Ok(t) => t.into_iter().map(Some).collect(),
            Err(source) => {
                // An operand without a type already has its own error; do not cascade.
                if !matches!(source, TypeError::UnknownValue(_)) {
                    self.error(span, VerifyErrorKind::Type { op: instr.mnemonic(), source });
                }
                vec![None; instr.results().len()]
            }
        };
        for (v, t) in instr.results().into_iter().zip(inferred) {
            self.define(v, t, stmt);
        }
    }
}
