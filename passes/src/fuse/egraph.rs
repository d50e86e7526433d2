//! The fuse pass's e-graph: a region's elementwise expressions in `egg`, algebraic rewrites,
//! constant folding, and extraction of the cheapest equivalent expressions under a cost of
//! bytes read plus arithmetic (kernel launches are the partitioner's: an elementwise
//! expression always becomes part of one kernel).

use egg::{
    rewrite, Analysis, CostFunction, DidMerge, EGraph, Extractor, FromOp, FromOpError, Id, Language, Rewrite, Runner,
};
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::{BinaryOp, BinaryPrim, OpDef, UnaryOp, UnaryPrim};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A scalar constant by its `f32` bits (so it hashes and orders exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scalar(pub u32);

impl Scalar {
    /// The value.
    pub fn value(self) -> f32 {
        f32::from_bits(self.0)
    }
}

impl FromStr for Scalar {
    type Err = ();
    fn from_str(s: &str) -> Result<Scalar, ()> {
        s.parse::<f32>().map(|x| Scalar(x.to_bits())).map_err(|_| ())
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.value())
    }
}

/// A value the e-graph does not look into (a region input, a reduction, a matmul, a view),
/// by its index in the builder's leaf table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Leaf(pub u32);

impl FromStr for Leaf {
    type Err = ();
    fn from_str(s: &str) -> Result<Leaf, ()> {
        s.strip_prefix('$').and_then(|n| n.parse().ok()).map(Leaf).ok_or(())
    }
}

impl fmt::Display for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.0)
    }
}

/// Elementwise expressions, one e-node per primitive op (composites are expanded as they
/// are added: [`add_unary`], [`add_binary`]). Written by hand over the op table instead of
/// with `define_language!`, so a new op needs nothing here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expr {
    /// A primitive op of one operand.
    Unary(UnaryPrim, [Id; 1]),
    /// A primitive op of two operands.
    Binary(BinaryPrim, [Id; 2]),
    /// `where`.
    Select([Id; 3]),
    /// A scalar.
    Const(Scalar),
    /// A value not looked into.
    Leaf(Leaf),
}

/// Which op an e-node is, apart from its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A primitive of one operand.
    Unary(UnaryPrim),
    /// A primitive of two operands.
    Binary(BinaryPrim),
    /// `where`.
    Select,
    /// A scalar.
    Const(Scalar),
    /// A leaf.
    Leaf(Leaf),
}

impl Language for Expr {
    type Discriminant = Kind;

    fn discriminant(&self) -> Kind {
        match self {
            Expr::Unary(op, _) => Kind::Unary(*op),
            Expr::Binary(op, _) => Kind::Binary(*op),
            Expr::Select(_) => Kind::Select,
            Expr::Const(c) => Kind::Const(*c),
            Expr::Leaf(l) => Kind::Leaf(*l),
        }
    }

    fn matches(&self, other: &Expr) -> bool {
        self.discriminant() == other.discriminant()
    }

    fn children(&self) -> &[Id] {
        match self {
            Expr::Unary(_, ids) => ids,
            Expr::Binary(_, ids) => ids,
            Expr::Select(ids) => ids,
            Expr::Const(_) | Expr::Leaf(_) => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            Expr::Unary(_, ids) => ids,
            Expr::Binary(_, ids) => ids,
            Expr::Select(ids) => ids,
            Expr::Const(_) | Expr::Leaf(_) => &mut [],
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Unary(op, _) => f.write_str(op.mnemonic()),
            Expr::Binary(op, _) => f.write_str(op.mnemonic()),
            Expr::Select(_) => f.write_str("where"),
            Expr::Const(c) => c.fmt(f),
            Expr::Leaf(l) => l.fmt(f),
        }
    }
}

impl FromOp for Expr {
    type Error = FromOpError;

    /// Reads rewrite patterns and test expressions: primitive ops by mnemonic, scalars and
    /// leaves.
    fn from_op(op: &str, children: Vec<Id>) -> Result<Expr, FromOpError> {
        let node = match (op, children.as_slice()) {
            ("where", &[c, t, f]) => Some(Expr::Select([c, t, f])),
            (_, &[a]) => UnaryPrim::from_mnemonic(op).map(|p| Expr::Unary(p, [a])),
            (_, &[a, b]) => BinaryPrim::from_mnemonic(op).map(|p| Expr::Binary(p, [a, b])),
            (_, []) => op.parse().map(Expr::Const).or_else(|_| op.parse().map(Expr::Leaf)).ok(),
            _ => None,
        };
        node.ok_or_else(|| FromOpError::new(op, children))
    }
}

/// What an e-node computes, in IR terms.
pub enum Op {
    /// A leaf.
    Leaf(u32),
    /// A scalar.
    Const(f32),
    /// One operand.
    Unary(UnaryOp, Id),
    /// Two operands.
    Binary(BinaryOp, Id, Id),
    /// `where`.
    Select(Id, Id, Id),
}

impl Expr {
    /// The IR op of this e-node.
    pub fn op(&self) -> Op {
        match self {
            Expr::Unary(p, [a]) => Op::Unary(p.op(), *a),
            Expr::Binary(p, [a, b]) => Op::Binary(p.op(), *a, *b),
            Expr::Select([c, t, f]) => Op::Select(*c, *t, *f),
            Expr::Const(c) => Op::Const(c.value()),
            Expr::Leaf(l) => Op::Leaf(l.0),
        }
    }

    /// Relative cost of one element of the op (an add is 1; the op table's weights).
    fn weight(&self) -> f64 {
        match self {
            Expr::Leaf(_) | Expr::Const(_) => 0.0,
            Expr::Unary(p, _) => p.weight(),
            Expr::Binary(p, _) => p.weight(),
            Expr::Select(_) => 1.0,
        }
    }
}

/// Adds `op(a)` to the e-graph, a composite as its expansion.
pub fn add_unary(egraph: &mut EGraph<Expr, Facts>, op: UnaryOp, a: Id) -> Id {
    match op.def() {
        OpDef::Prim(p) => egraph.add(Expr::Unary(p, [a])),
        OpDef::Composite(t) => expand(egraph, t, &[a]),
    }
}

/// Adds `op(a, b)` to the e-graph, a composite as its expansion.
pub fn add_binary(egraph: &mut EGraph<Expr, Facts>, op: BinaryOp, a: Id, b: Id) -> Id {
    match op.def() {
        OpDef::Prim(p) => egraph.add(Expr::Binary(p, [a, b])),
        OpDef::Composite(t) => expand(egraph, t, &[a, b]),
    }
}

/// Adds a composite's expansion over `operands`.
fn expand(egraph: &mut EGraph<Expr, Facts>, t: &Term, operands: &[Id]) -> Id {
    struct Adder<'a, 'b> {
        egraph: &'a mut EGraph<Expr, Facts>,
        operands: &'b [Id],
    }
    impl Algebra for Adder<'_, '_> {
        type Value = Id;
        type Error = Var;
        fn var(&mut self, var: Var) -> Result<Id, Var> {
            var.operand(self.operands)
        }
        fn constant(&mut self, c: f64) -> Result<Id, Var> {
            Ok(self.egraph.add(Expr::Const(Scalar((c as f32).to_bits()))))
        }
        fn unary(&mut self, op: UnaryOp, x: Id) -> Result<Id, Var> {
            Ok(add_unary(self.egraph, op, x))
        }
        fn binary(&mut self, op: BinaryOp, x: Id, y: Id) -> Result<Id, Var> {
            Ok(add_binary(self.egraph, op, x, y))
        }
        fn select(&mut self, c: Id, t: Id, f: Id) -> Result<Id, Var> {
            Ok(self.egraph.add(Expr::Select([c, t, f])))
        }
    }
    // The op table's tests check that expansions read only their operands.
    t.eval(&mut Adder { egraph, operands }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"))
}

/// Per e-class facts: the constant it equals (if any) and its element count.
#[derive(Debug, Clone, PartialEq)]
pub struct Data {
    /// Its value when every element is this constant.
    pub constant: Option<Scalar>,
    /// Elements of the class's (broadcast) shape.
    pub numel: f64,
}

/// Elements an e-node computes: a leaf's count, 1 for a scalar, else the largest operand's
/// (the broadcast shape's count when operands broadcast along one side).
fn numel(egraph: &EGraph<Expr, Facts>, enode: &Expr) -> f64 {
    match enode {
        Expr::Leaf(l) => egraph.analysis.leaf_numel.get(l.0 as usize).copied().unwrap_or(1.0),
        e => e.children().iter().map(|c| egraph[*c].data.numel).fold(1.0, f64::max),
    }
}

/// Constant folding and element counts; `leaf_numel[i]` is leaf `i`'s element count.
#[derive(Debug, Default)]
pub struct Facts {
    /// Element count of each leaf.
    pub leaf_numel: Vec<f64>,
}

impl Analysis<Expr> for Facts {
    type Data = Data;

    fn make(egraph: &mut EGraph<Expr, Facts>, enode: &Expr) -> Data {
        let data = |id: &Id| &egraph[*id].data;
        let numel = numel(egraph, enode);
        let constant = match enode.op() {
            Op::Const(c) => Some(c),
            Op::Unary(op, a) => data(&a).constant.map(|x| op.apply(x.value())),
            Op::Binary(op, a, b) => match (data(&a).constant, data(&b).constant) {
                (Some(x), Some(y)) => Some(op.apply(x.value(), y.value())),
                _ => None,
            },
            _ => None,
        };
        Data { constant: constant.map(|c: f32| Scalar(c.to_bits())), numel }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // Equal classes have equal shapes; a constant found on either side holds for both.
        // Two constants in one class differ at most in a NaN's payload or (with fast-math
        // rewrites) a zero's sign: keep the first.
        let merged = egg::merge_option(&mut a.constant, b.constant, |_, _| DidMerge(false, false));
        a.numel = a.numel.max(b.numel);
        merged
    }

    fn modify(egraph: &mut EGraph<Expr, Facts>, id: Id) {
        if let Some(c) = egraph[id].data.constant {
            let k = egraph.add(Expr::Const(c));
            egraph.union(id, k);
        }
    }
}

/// The rewrites. The default ones keep every value bit for bit (NaN payloads aside), except
/// `x ^ 2 = x * x`, which may round differently from `powf`; `fast_math` adds ones that are
/// exact in real arithmetic but not in floating point: `exp(log x) = x` (NaN for `x < 0`),
/// `x ^ 0.5 = sqrt x` (differs at `-0` and `-inf`), `x + 0 = x` and `-(a - b) = b - a`
/// (the sign of a zero result), and factoring `a*b + a*c = a*(b + c)` (one multiply and one
/// read of `a` fewer, but it may overflow where the original did not, or not where it did).
/// All keep the value's shape: constants are scalars.
pub fn rules(fast_math: bool) -> Vec<Rewrite<Expr, Facts>> {
    let mut rules: Vec<Rewrite<Expr, Facts>> = vec![
        rewrite!("sub-0"; "(sub ?a 0)" => "?a"),
        rewrite!("mul-1"; "(mul ?a 1)" => "?a"),
        rewrite!("1-mul"; "(mul 1 ?a)" => "?a"),
        rewrite!("div-1"; "(div ?a 1)" => "?a"),
        rewrite!("pow-1"; "(pow ?a 1)" => "?a"),
        rewrite!("pow-2"; "(pow ?a 2)" => "(mul ?a ?a)"),
        rewrite!("recip-sqrt"; "(div 1 (sqrt ?a))" => "(rsqrt ?a)"),
        rewrite!("mul-minus-1"; "(mul ?a -1)" => "(neg ?a)"),
        rewrite!("neg-neg"; "(neg (neg ?a))" => "?a"),
        rewrite!("relu-relu"; "(relu (relu ?a))" => "(relu ?a)"),
        rewrite!("abs-abs"; "(abs (abs ?a))" => "(abs ?a)"),
        rewrite!("abs-neg"; "(abs (neg ?a))" => "(abs ?a)"),
        rewrite!("relu-abs"; "(relu (abs ?a))" => "(abs ?a)"),
        rewrite!("add-neg"; "(add ?a (neg ?b))" => "(sub ?a ?b)"),
        rewrite!("sub-neg"; "(sub ?a (neg ?b))" => "(add ?a ?b)"),
        rewrite!("neg-mul-neg"; "(mul (neg ?a) (neg ?b))" => "(mul ?a ?b)"),
        rewrite!("commute-add"; "(add ?a ?b)" => "(add ?b ?a)"),
        rewrite!("commute-mul"; "(mul ?a ?b)" => "(mul ?b ?a)"),
    ];
    if fast_math {
        rules.extend([
            rewrite!("exp-log"; "(exp (log ?a))" => "?a"),
            rewrite!("log-exp"; "(log (exp ?a))" => "?a"),
            rewrite!("pow-half"; "(pow ?a 0.5)" => "(sqrt ?a)"),
            rewrite!("pow-minus-half"; "(pow ?a -0.5)" => "(rsqrt ?a)"),
            rewrite!("add-0"; "(add ?a 0)" => "?a"),
            rewrite!("0-add"; "(add 0 ?a)" => "?a"),
            rewrite!("neg-sub"; "(neg (sub ?a ?b))" => "(sub ?b ?a)"),
            rewrite!("factor"; "(add (mul ?a ?b) (mul ?a ?c))" => "(mul ?a (add ?b ?c))"),
            rewrite!("factor-sub"; "(sub (mul ?a ?b) (mul ?a ?c))" => "(mul ?a (sub ?b ?c))"),
        ]);
    }
    rules
}

/// Elements times op weight, plus 4 bytes per element of every leaf read.
struct Cost<'a> {
    egraph: &'a EGraph<Expr, Facts>,
}

impl CostFunction<Expr> for Cost<'_> {
    type Cost = f64;
    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Expr, mut costs: C) -> f64 {
        let numel = numel(self.egraph, enode);
        let own = match enode {
            Expr::Leaf(_) => 4.0 * numel,
            e => e.weight() * numel,
        };
        enode.fold(own, |sum, id| sum + costs(id))
    }
}

/// Limits that keep saturation bounded (and its result deterministic: no time limit
/// short enough to bite on ordinary regions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// E-nodes at most.
    pub nodes: usize,
    /// Rewrite iterations at most.
    pub iterations: usize,
    /// Wall-clock bound, a safety net.
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { nodes: 20_000, iterations: 12, time: Duration::from_millis(500) }
    }
}

/// What saturation did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Saturation {
    /// E-nodes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Iterations run.
    pub iterations: usize,
}

/// Saturates `egraph` with the rules and gives, for each root, the cheapest expression
/// (nodes in operand-before-use order; the last is the root).
pub fn simplify(
    egraph: EGraph<Expr, Facts>,
    roots: &[Id],
    fast_math: bool,
    limits: Limits,
) -> (Vec<egg::RecExpr<Expr>>, Saturation) {
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_node_limit(limits.nodes)
        .with_iter_limit(limits.iterations)
        .with_time_limit(limits.time)
        .run(&rules(fast_math));
    let egraph = &runner.egraph;
    let extractor = Extractor::new(egraph, Cost { egraph });
    let exprs = roots.iter().map(|&r| extractor.find_best(r).1).collect();
    let stats = Saturation {
        nodes: egraph.total_size(),
        classes: egraph.number_of_classes(),
        iterations: runner.iterations.len(),
    };
    (exprs, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(text: &str, fast_math: bool) -> String {
        let expr: egg::RecExpr<Expr> = text.parse().unwrap();
        let mut egraph = EGraph::new(Facts { leaf_numel: vec![100.0; 4] });
        let root = egraph.add_expr(&expr);
        let (exprs, _) = simplify(egraph, &[root], fast_math, Limits::default());
        exprs[0].to_string()
    }

    #[test]
    fn identities_and_folding() {
        assert_eq!(best("(sub (mul $0 1) 0)", false), "$0");
        // `-0 + 0` is `+0`: only fast math drops the addition.
        assert_eq!(best("(add $0 0)", false), "(add $0 0.0)");
        assert_eq!(best("(add $0 0)", true), "$0");
        // `powf(-inf, 0.5)` is `inf`, `sqrt(-inf)` NaN.
        assert_eq!(best("(pow $0 0.5)", false), "(pow $0 0.5)");
        assert_eq!(best("(neg (neg (relu (relu $1))))", false), "(relu $1)");
        assert_eq!(best("(mul $0 (add 2 3))", false), "(mul $0 5.0)");
        assert_eq!(best("(pow $2 2)", false), "(mul $2 $2)");
        assert_eq!(best("(div 1 (sqrt $0))", false), "(rsqrt $0)");
    }

    #[test]
    fn factoring_reads_the_shared_operand_once() {
        // Only with fast math: `a*(b + c)` may overflow where `a*b + a*c` does not.
        assert!(best("(add (mul $0 $1) (mul $0 $2))", false).starts_with("(add"));
        let e = best("(add (mul $0 $1) (mul $0 $2))", true);
        assert!(e == "(mul $0 (add $1 $2))" || e == "(mul (add $1 $2) $0)" || e == "(mul $0 (add $2 $1))", "{e}");
    }

    #[test]
    fn exp_log_only_with_fast_math() {
        assert_eq!(best("(exp (log $0))", false), "(exp (log $0))");
        assert_eq!(best("(exp (log $0))", true), "$0");
    }
}
