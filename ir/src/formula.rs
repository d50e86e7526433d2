//! Formulas over the op table's ops: the gradients and composite expansions that rows of
//! `ops.rs` write as s-expressions in `.gtir` mnemonics (`"(mul g (gt x 0))"`), parsed once,
//! and evaluated by whoever needs them through an [`Algebra`]: scalars (constant folding, the
//! reference semantics of composites), tensors (autograd, the interpreter), CLIF values (the
//! JIT), PTX registers, e-graph nodes.

use crate::ops::{BinaryOp, BinaryPrim, UnaryOp};
use std::fmt;

/// A variable of a formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// Operand `i`: `x` (or `a`) is 0, `b` is 1.
    Operand(u8),
    /// The op's result, `y`.
    Result,
    /// The gradient flowing into the result, `g`.
    Grad,
}

impl Var {
    /// The value of an operand variable among `operands` (what expansions read); `Err(self)`
    /// for the result, the gradient, or an operand index past the end.
    pub fn operand<T: Clone>(self, operands: &[T]) -> Result<T, Var> {
        match self {
            Var::Operand(i) => operands.get(i as usize).cloned().ok_or(self),
            Var::Result | Var::Grad => Err(self),
        }
    }
}

/// One formula: a tree of ops over variables and constants.
#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    /// A variable.
    Var(Var),
    /// A scalar.
    Const(f64),
    /// An op of one operand.
    Unary(UnaryOp, Box<Term>),
    /// An op of two operands.
    Binary(BinaryOp, Box<Term>, Box<Term>),
    /// `(where c t f)`: `t` where `c` is nonzero, else `f`.
    Where(Box<Term>, Box<Term>, Box<Term>),
}

/// A formula that does not parse (a bug in the op table; every row is parsed by a test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("formula `{text}`: {kind} at byte {at}")]
pub struct FormulaError {
    /// The formula.
    pub text: String,
    /// Where it went wrong.
    pub at: usize,
    /// What went wrong.
    pub kind: FormulaErrorKind,
}

/// What went wrong in a formula.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormulaErrorKind {
    /// Not a variable, a number or an op.
    #[error("unknown word")]
    UnknownWord,
    /// An op with the wrong number of operands.
    #[error("wrong number of operands")]
    Arity,
    /// A parenthesis is missing, or text follows the formula.
    #[error("unbalanced parentheses")]
    Unbalanced,
}

/// What a formula is evaluated over. `Where` with a condition whose truth is known
/// ([`Algebra::truth`]) evaluates only the branch taken, so a formula may guard a branch
/// that would be wasted (or undefined) work.
pub trait Algebra {
    /// A value.
    type Value: Clone;
    /// Why an evaluation failed.
    type Error;
    /// A variable's value.
    fn var(&mut self, var: Var) -> Result<Self::Value, Self::Error>;
    /// A scalar.
    fn constant(&mut self, c: f64) -> Result<Self::Value, Self::Error>;
    /// An op of one operand.
    fn unary(&mut self, op: UnaryOp, x: Self::Value) -> Result<Self::Value, Self::Error>;
    /// An op of two operands.
    fn binary(&mut self, op: BinaryOp, x: Self::Value, y: Self::Value) -> Result<Self::Value, Self::Error>;
    /// `where`.
    fn select(&mut self, c: Self::Value, t: Self::Value, f: Self::Value) -> Result<Self::Value, Self::Error>;
    /// Whether a condition is known to hold (`Some(true)`), known not to (`Some(false)`), or
    /// varies by element (`None`).
    fn truth(&mut self, _c: &Self::Value) -> Option<bool> {
        None
    }
}

impl Term {
    /// Parses an s-expression: `x`/`a` (operand 0), `b` (operand 1), `y` (the result),
    /// `g` (the incoming gradient), numbers (`-inf` too), `(op t ...)` with an op's mnemonic,
    /// and `(where c t f)`.
    pub fn parse(text: &str) -> Result<Term, FormulaError> {
        let mut p = Parser { text, at: 0 };
        let term = p.term()?;
        p.skip_space();
        if p.at != text.len() {
            return Err(p.error(FormulaErrorKind::Unbalanced));
        }
        Ok(term)
    }

    /// Evaluates the formula over `algebra`. Formulas come from the op table and are a few
    /// levels deep, so the recursion is bounded by the table.
    pub fn eval<A: Algebra>(&self, algebra: &mut A) -> Result<A::Value, A::Error> {
        match self {
            Term::Var(v) => algebra.var(*v),
            Term::Const(c) => algebra.constant(*c),
            Term::Unary(op, x) => {
                let x = x.eval(algebra)?;
                algebra.unary(*op, x)
            }
            Term::Binary(op, x, y) => {
                let x = x.eval(algebra)?;
                let y = y.eval(algebra)?;
                algebra.binary(*op, x, y)
            }
            Term::Where(c, t, f) => {
                let c = c.eval(algebra)?;
                match algebra.truth(&c) {
                    Some(true) => t.eval(algebra),
                    Some(false) => f.eval(algebra),
                    None => {
                        let t = t.eval(algebra)?;
                        let f = f.eval(algebra)?;
                        algebra.select(c, t, f)
                    }
                }
            }
        }
    }

    /// The sum of the weights of its ops (the cost of one element, an add being 1).
    pub fn weight(&self) -> f64 {
        match self {
            Term::Var(_) | Term::Const(_) => 0.0,
            Term::Unary(op, x) => op.weight() + x.weight(),
            Term::Binary(op, x, y) => op.weight() + x.weight() + y.weight(),
            Term::Where(c, t, f) => 1.0 + c.weight() + t.weight() + f.weight(),
        }
    }

    /// Whether it computes `prim` anywhere (inside composites' expansions too).
    pub fn uses(&self, prim: BinaryPrim) -> bool {
        match self {
            Term::Var(_) | Term::Const(_) => false,
            Term::Unary(op, x) => op.uses(prim) || x.uses(prim),
            Term::Binary(op, x, y) => op.uses(prim) || x.uses(prim) || y.uses(prim),
            Term::Where(c, t, f) => c.uses(prim) || t.uses(prim) || f.uses(prim),
        }
    }

    /// Whether it reads this variable.
    pub fn reads(&self, var: Var) -> bool {
        match self {
            Term::Var(v) => *v == var,
            Term::Const(_) => false,
            Term::Unary(_, x) => x.reads(var),
            Term::Binary(_, x, y) => x.reads(var) || y.reads(var),
            Term::Where(c, t, f) => c.reads(var) || t.reads(var) || f.reads(var),
        }
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Term::Var(Var::Operand(0)) => f.write_str("x"),
            Term::Var(Var::Operand(i)) => write!(f, "{}", (b'a' + i) as char),
            Term::Var(Var::Result) => f.write_str("y"),
            Term::Var(Var::Grad) => f.write_str("g"),
            Term::Const(c) => write!(f, "{c}"),
            Term::Unary(op, x) => write!(f, "({} {x})", op.mnemonic()),
            Term::Binary(op, x, y) => write!(f, "({} {x} {y})", op.mnemonic()),
            Term::Where(c, t, e) => write!(f, "(where {c} {t} {e})"),
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn error(&self, kind: FormulaErrorKind) -> FormulaError {
        FormulaError { text: self.text.to_string(), at: self.at, kind }
    }

    fn skip_space(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn word(&mut self) -> &str {
        self.skip_space();
        let rest = &self.text[self.at..];
        let n = rest.find(|c: char| c.is_whitespace() || c == '(' || c == ')').unwrap_or(rest.len());
        self.at += n;
        &rest[..n]
    }

    fn term(&mut self) -> Result<Term, FormulaError> {
        self.skip_space();
        if !self.text[self.at..].starts_with('(') {
            let start = self.at;
            let word = self.word();
            return match word {
                "x" | "a" => Ok(Term::Var(Var::Operand(0))),
                "b" => Ok(Term::Var(Var::Operand(1))),
                "y" => Ok(Term::Var(Var::Result)),
                "g" => Ok(Term::Var(Var::Grad)),
                w => w.parse().map(Term::Const).map_err(|_| {
                    self.at = start;
                    self.error(FormulaErrorKind::UnknownWord)
                }),
            };
        }
        self.at += 1;
        let start = self.at;
        let op = self.word().to_string();
        let mut args = Vec::new();
        loop {
            self.skip_space();
            match self.text[self.at..].chars().next() {
                Some(')') => break,
                Some(_) => args.push(self.term()?),
                None => return Err(self.error(FormulaErrorKind::Unbalanced)),
            }
        }
        self.at += 1;
        let count = args.len();
        let arity = |n: usize, at: usize| {
            if count == n {
                Ok(())
            } else {
                Err(FormulaError { text: self.text.to_string(), at, kind: FormulaErrorKind::Arity })
            }
        };
        let mut args = args.into_iter().map(Box::new);
        let mut next = || args.next().expect("arity checked");
        if op == "where" {
            arity(3, start)?;
            Ok(Term::Where(next(), next(), next()))
        } else if let Some(u) = UnaryOp::from_mnemonic(&op) {
            arity(1, start)?;
            Ok(Term::Unary(u, next()))
        } else if let Some(b) = BinaryOp::from_mnemonic(&op) {
            arity(2, start)?;
            Ok(Term::Binary(b, next(), next()))
        } else {
            Err(FormulaError { text: self.text.to_string(), at: start, kind: FormulaErrorKind::UnknownWord })
        }
    }
}

/// A float type the ops have reference semantics in (`f32`, and `f64` for `f64` tensors).
pub trait Real: num_traits::Float {
    /// A unary op on it.
    fn unary(op: UnaryOp, x: Self) -> Self;
    /// A binary op on it.
    fn binary(op: BinaryOp, x: Self, y: Self) -> Self;
}

impl Real for f32 {
    fn unary(op: UnaryOp, x: f32) -> f32 {
        op.apply(x)
    }
    fn binary(op: BinaryOp, x: f32, y: f32) -> f32 {
        op.apply(x, y)
    }
}

impl Real for f64 {
    fn unary(op: UnaryOp, x: f64) -> f64 {
        op.apply_f64(x)
    }
    fn binary(op: BinaryOp, x: f64, y: f64) -> f64 {
        op.apply_f64(x, y)
    }
}

/// Evaluation on scalars with the ops' reference semantics.
pub struct Scalars<'a, T = f32> {
    /// The operands.
    pub operands: &'a [T],
}

impl<T: Real> Algebra for Scalars<'_, T> {
    type Value = T;
    type Error = std::convert::Infallible;
    fn var(&mut self, var: Var) -> Result<T, Self::Error> {
        Ok(match var {
            Var::Operand(i) => self.operands.get(i as usize).copied().unwrap_or_else(T::nan),
            Var::Result | Var::Grad => T::nan(),
        })
    }
    fn constant(&mut self, c: f64) -> Result<T, Self::Error> {
        Ok(T::from(c).unwrap_or_else(T::nan))
    }
    fn unary(&mut self, op: UnaryOp, x: T) -> Result<T, Self::Error> {
        Ok(T::unary(op, x))
    }
    fn binary(&mut self, op: BinaryOp, x: T, y: T) -> Result<T, Self::Error> {
        Ok(T::binary(op, x, y))
    }
    fn select(&mut self, c: T, t: T, f: T) -> Result<T, Self::Error> {
        Ok(if c != T::zero() { t } else { f })
    }
    fn truth(&mut self, c: &T) -> Option<bool> {
        Some(*c != T::zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let t = Term::parse("(mul (where (eq b 0) 0 (pow a (sub b 1))) g)").unwrap();
        assert_eq!(t.to_string(), "(mul (where (eq b 0) 0 (pow x (sub b 1))) g)");
        assert_eq!(Term::parse(" -inf ").unwrap(), Term::Const(f64::NEG_INFINITY));
        assert!(t.reads(Var::Grad) && !t.reads(Var::Result));
    }

    #[test]
    fn bad_formulas_name_the_place() {
        let e = Term::parse("(mul g (frob x))").unwrap_err();
        assert_eq!((e.kind, e.at), (FormulaErrorKind::UnknownWord, 8));
        assert_eq!(Term::parse("(neg x x)").unwrap_err().kind, FormulaErrorKind::Arity);
        assert_eq!(Term::parse("(neg x").unwrap_err().kind, FormulaErrorKind::Unbalanced);
        assert_eq!(Term::parse("x)").unwrap_err().kind, FormulaErrorKind::Unbalanced);
        assert_eq!(Term::parse("q").unwrap_err().kind, FormulaErrorKind::UnknownWord);
    }

    #[test]
    fn where_takes_only_the_known_branch() {
        let t = Term::parse("(where (gt x 0) x (log -1))").unwrap();
        assert_eq!(t.eval(&mut Scalars { operands: &[2.0f32] }).unwrap(), 2.0);
        assert!(t.eval(&mut Scalars { operands: &[-2.0f32] }).unwrap().is_nan());
    }
}
