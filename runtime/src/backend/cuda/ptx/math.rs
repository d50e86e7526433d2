//! Per-op PTX: a kernel-IR expression evaluated for one element ([`Emitter::eval`]), the
//! unary and binary ops, the reductions' combine step, `exp`/`log`/`tanh`/`sigmoid`/`pow`
//! on the hardware's approximate `ex2`/`lg2`, and the f64 `ln`, `cos` and counter-based
//! random bits behind `rand`/`randn`. Values are of the kernel's compute type ([`Compute`]):
//! `f32` kernels take every op; `f64` ones every op (the transcendental ones are
//! `gt_ir::math64`'s, emitted through `wide.rs`); `i64` ones the integer ops (add, sub, mul, max, min, neg, abs, relu,
//! comparisons), which wrap ([`supports`] says which, checked before anything is
//! generated). Loops, loads and stores live in the kernel files.

use super::emit::{f32_imm, f64_imm, Emitter, Reg};
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::kernel::{Compute, MapKernel, Node};
use gt_ir::random;
use gt_ir::{BinaryOp, BinaryPrim, OpDef, ReduceOp, UnaryOp, UnaryPrim};

/// What a node reads besides other nodes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Leaf {
    /// A kernel input at the current element.
    Input(u32),
    /// The matmul product at the current element.
    Acc,
    /// The current element's linear index in the iteration space (s32).
    Index,
}

/// `acc ⊕ x` for a reduction: a sum, or NaN-propagating max / min (as the interpreter).
pub(super) fn fold(e: &mut Emitter, op: ReduceOp, acc: &str, x: &str) -> String {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => e.arith("add", acc, x),
        ReduceOp::Max => e.nan_extreme(true, acc, x),
        ReduceOp::Min => e.nan_extreme(false, acc, x),
    }
}

/// A reduction's starting value in the compute type (the integers' extremes for `i64`).
pub(super) fn identity(e: &Emitter, op: ReduceOp) -> String {
    match (op, e.compute()) {
        (ReduceOp::Sum | ReduceOp::Mean, _) => e.imm(0.0),
        // In hex: a decimal i64::MIN would be read as the negation of a number past i64.
        (ReduceOp::Max, Compute::I64) => "0x8000000000000000".to_string(),
        (ReduceOp::Min, Compute::I64) => "0x7FFFFFFFFFFFFFFF".to_string(),
        (ReduceOp::Max, _) => e.imm(f64::NEG_INFINITY),
        (ReduceOp::Min, _) => e.imm(f64::INFINITY),
    }
}

/// Whether a `compute` kernel takes the unary op `op` (every op in `f32`).
fn takes_unary(compute: Compute, op: UnaryOp) -> bool {
    match (compute, op.def()) {
        (Compute::F32, _) => true,
        (_, OpDef::Prim(UnaryPrim::Neg | UnaryPrim::Abs | UnaryPrim::Relu)) => true,
        (Compute::F64, OpDef::Prim(_)) => true,
        (Compute::F64, OpDef::Composite(t)) => term_takes(compute, t),
        (Compute::I64, _) => false,
    }
}

/// Whether a `compute` kernel takes the binary op `op`.
fn takes_binary(compute: Compute, op: BinaryOp) -> bool {
    match (compute, op.def()) {
        (Compute::F32 | Compute::F64, OpDef::Prim(_)) => true,
        (Compute::I64, OpDef::Prim(p)) => !matches!(p, BinaryPrim::Div | BinaryPrim::Pow),
        (_, OpDef::Composite(t)) => compute != Compute::I64 && term_takes(compute, t),
    }
}

/// Whether every op of a composite's expansion is taken (expansions are a few ops deep).
fn term_takes(compute: Compute, t: &Term) -> bool {
    match t {
        Term::Var(_) | Term::Const(_) => true,
        Term::Unary(op, x) => takes_unary(compute, *op) && term_takes(compute, x),
        Term::Binary(op, x, y) => takes_binary(compute, *op) && term_takes(compute, x) && term_takes(compute, y),
        Term::Where(c, x, y) => term_takes(compute, c) && term_takes(compute, x) && term_takes(compute, y),
    }
}

/// Whether a `compute` kernel takes `node`'s op.
fn takes(compute: Compute, node: &Node) -> bool {
    match *node {
        Node::Unary(op, _) => takes_unary(compute, op),
        Node::Binary(op, ..) => takes_binary(compute, op),
        _ => true,
    }
}

/// Checks that the GPU computes every op of `k` in its compute type.
pub(super) fn supports(k: &MapKernel) -> Result<(), super::PtxError> {
    match k.nodes.iter().find(|n| !takes(k.compute, n)) {
        Some(Node::Unary(op, _)) => Err(super::PtxError::Compute { op: op.mnemonic(), compute: k.compute }),
        Some(Node::Binary(op, ..)) => Err(super::PtxError::Compute { op: op.mnemonic(), compute: k.compute }),
        _ => Ok(()),
    }
}

impl Emitter {
    /// `a op b` (`add`, `sub`, `mul`) in the compute type: rounded to nearest for floats,
    /// wrapping for integers.
    pub(super) fn arith(&mut self, op: &str, a: &str, b: &str) -> String {
        let (kind, ty) = (self.num(), self.ty());
        let instr = match (self.compute(), op) {
            (Compute::I64, "mul") => "mul.lo.s64".to_string(),
            (Compute::I64, _) => format!("{op}.s64"),
            _ => format!("{op}.rn.{ty}"),
        };
        self.value(kind, &instr, &format!("{a}, {b}"))
    }

    /// `e^x` as `2^(x log2 e)`. `.ftz`: one hardware instruction, where without it each
    /// `ex2` scales its argument around the special unit's range; it differs only for results
    /// under 2^-126 (x < -87.3), which are 0 instead of subnormal.
    fn exp(&mut self, x: &str) -> String {
        let t = self.value(Reg::F32, "mul.rn.f32", &format!("{x}, {}", f32_imm(std::f32::consts::LOG2_E)));
        self.value(Reg::F32, "ex2.approx.ftz.f32", &t)
    }

    /// Evaluates node `target` and what it needs, memoised in `memo` (one slot per node,
    /// reused when filled; row reductions are filled in before). `leaf` gives inputs, the
    /// matmul product and the element's linear index (for iota and random nodes).
    pub(super) fn eval(
        &mut self,
        nodes: &[Node],
        target: usize,
        memo: &mut [Option<String>],
        leaf: &mut dyn FnMut(&mut Emitter, Leaf) -> String,
    ) -> String {
        if let Some(r) = &memo[target] {
            return r.clone();
        }
        for o in nodes[target].operands() {
            self.eval(nodes, o as usize, memo, leaf);
        }
        let v = |i: u32| memo[i as usize].clone().unwrap_or_default();
        let r = match nodes[target] {
            Node::Input(i) => leaf(self, Leaf::Input(i)),
            Node::Acc => leaf(self, Leaf::Acc),
            // `validate` guarantees reductions are computed first; never reached.
            Node::Reduce(..) => self.constant(0.0),
            Node::Const(bits) => self.constant(f64::from(f32::from_bits(bits))),
            Node::Const64(bits) => self.constant(f64::from_bits(bits)),
            Node::Iota { start, step } => {
                let i = leaf(self, Leaf::Index);
                let fi = self.value(Reg::F64, "cvt.rn.f64.u32", &i);
                let scaled = self.value(Reg::F64, "mul.rn.f64", &format!("{fi}, {}", f64_imm(f64::from_bits(step))));
                let sum = self.value(Reg::F64, "add.rn.f64", &format!("{scaled}, {}", f64_imm(f64::from_bits(start))));
                self.converted("f64", &sum)
            }
            Node::Rand { seed } => {
                let i = leaf(self, Leaf::Index);
                let i64r = self.value(Reg::B64, "cvt.u64.u32", &i);
                let bits = self.random_bits(seed, &i64r);
                let top = self.value(Reg::B64, "shr.u64", &format!("{bits}, 40"));
                let f = self.value(Reg::F32, "cvt.rn.f32.u64", &top);
                let u = self.value(Reg::F32, "mul.rn.f32", &format!("{f}, {}", f32_imm(1.0 / 16_777_216.0)));
                // The f32 generator's value, converted.
                self.converted("f32", &u)
            }
            Node::Randn { seed } => {
                let i = leaf(self, Leaf::Index);
                let wide = self.value(Reg::B64, "cvt.u64.u32", &i);
                let c1 = self.value(Reg::B64, "shl.b64", &format!("{wide}, 1"));
                let c2 = self.value(Reg::B64, "add.u64", &format!("{c1}, 1"));
                let unit = |e: &mut Emitter, c: &str| {
                    let b = e.random_bits(seed, c);
                    let top = e.value(Reg::B64, "shr.u64", &format!("{b}, 11"));
                    let f = e.value(Reg::F64, "cvt.rn.f64.u64", &top);
                    e.value(Reg::F64, "mul.rn.f64", &format!("{f}, {}", f64_imm(1.0 / 9_007_199_254_740_992.0)))
                };
                let (u1, u2) = (unit(self, &c1), unit(self, &c2));
                // The interpreter's expression (`gt_ir::random`), in f64 throughout, with
                // `math64`'s `ln` and `cos`: the same operations, so the same bits.
                let one_minus = self.value(Reg::F64, "sub.rn.f64", &format!("{}, {u1}", f64_imm(1.0)));
                let ln = gt_ir::math64::ln(self, &one_minus);
                let m2 = self.value(Reg::F64, "mul.rn.f64", &format!("{}, {ln}", f64_imm(-2.0)));
                let r = self.value(Reg::F64, "sqrt.rn.f64", &m2);
                let angle = self.value(Reg::F64, "mul.rn.f64", &format!("{}, {u2}", f64_imm(std::f64::consts::TAU)));
                let cos = gt_ir::math64::cos_within_turn(self, &angle);
                let x = self.value(Reg::F64, "mul.rn.f64", &format!("{r}, {cos}"));
                let f = self.value(Reg::F32, "cvt.rn.f32.f64", &x);
                self.converted("f32", &f)
            }
            Node::Unary(op, a) => self.unary(op, &v(a)),
            Node::Binary(op, a, b) => self.binary(op, &v(a), &v(b)),
            Node::Select(c, t, f) => {
                let p = self.nonzero(&v(c));
                self.select(&p, &v(t), &v(f))
            }
            Node::Round(s, a) => self.round_through(s, &v(a)),
        };
        memo[target] = Some(r.clone());
        r
    }

    /// `splitmix64(splitmix64(seed) + counter)` (see `gt_ir::random`).
    fn random_bits(&mut self, seed: u64, counter: &str) -> String {
        let start = random::splitmix64(seed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.value(Reg::B64, "add.u64", &format!("{counter}, {start}"));
        for (shift, mul) in [(30, 0xBF58_476D_1CE4_E5B9u64), (27, 0x94D0_49BB_1331_11EB)] {
            let s = self.value(Reg::B64, "shr.u64", &format!("{z}, {shift}"));
            let x = self.value(Reg::B64, "xor.b64", &format!("{z}, {s}"));
            z = self.value(Reg::B64, "mul.lo.u64", &format!("{x}, {mul}"));
        }
        let s = self.value(Reg::B64, "shr.u64", &format!("{z}, 31"));
        self.value(Reg::B64, "xor.b64", &format!("{z}, {s}"))
    }

    /// One unary op (a composite as its expansion).
    fn unary(&mut self, op: UnaryOp, x: &str) -> String {
        match op.def() {
            OpDef::Prim(p) => self.unary_prim(p, x),
            OpDef::Composite(t) => self.formula(t, &[x]),
        }
    }

    /// One binary op (a composite as its expansion).
    fn binary(&mut self, op: BinaryOp, a: &str, b: &str) -> String {
        match op.def() {
            OpDef::Prim(p) => self.binary_prim(p, a, b),
            OpDef::Composite(t) => self.formula(t, &[a, b]),
        }
    }

    /// A composite's expansion over `operands`.
    fn formula(&mut self, t: &Term, operands: &[&str]) -> String {
        struct Ptx<'e, 'o> {
            e: &'e mut Emitter,
            operands: &'o [&'o str],
        }
        impl Algebra for Ptx<'_, '_> {
            type Value = String;
            type Error = Var;
            fn var(&mut self, var: Var) -> Result<String, Var> {
                var.operand(self.operands).map(str::to_string)
            }
            fn constant(&mut self, c: f64) -> Result<String, Var> {
                Ok(self.e.imm(c))
            }
            fn unary(&mut self, op: UnaryOp, x: String) -> Result<String, Var> {
                Ok(self.e.unary(op, &x))
            }
            fn binary(&mut self, op: BinaryOp, x: String, y: String) -> Result<String, Var> {
                Ok(self.e.binary(op, &x, &y))
            }
            fn select(&mut self, c: String, t: String, f: String) -> Result<String, Var> {
                // NaN counts as nonzero, as `where` does.
                let p = self.e.nonzero(&c);
                Ok(self.e.select(&p, &t, &f))
            }
        }
        // The op table's tests check that expansions read only their operands.
        t.eval(&mut Ptx { e: self, operands }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"))
    }

    /// `erf(x)`: the JIT's rational approximation (`cpu/jit/math.rs`, `Emit::erf`) with
    /// fused multiply-adds; NaN stays NaN.
    fn erf(&mut self, x: &str) -> String {
        use gt_ir::ops::{ERF_DENOMINATOR as Q, ERF_NUMERATOR as P};
        let hi = self.value(Reg::F32, "min.f32", &format!("{x}, {}", f32_imm(4.0)));
        let c = self.value(Reg::F32, "max.f32", &format!("{hi}, {}", f32_imm(-4.0)));
        let x2 = self.value(Reg::F32, "mul.rn.f32", &format!("{c}, {c}"));
        let horner = |e: &mut Emitter, coefficients: &[f32]| {
            let mut acc = f32_imm(coefficients[0]);
            for &k in &coefficients[1..] {
                acc = e.value(Reg::F32, "fma.rn.f32", &format!("{acc}, {x2}, {}", f32_imm(k)));
            }
            acc
        };
        let p = horner(self, &P);
        let q = horner(self, &Q);
        let ratio = self.value(Reg::F32, "div.rn.f32", &format!("{p}, {q}"));
        let r = self.value(Reg::F32, "mul.rn.f32", &format!("{ratio}, {c}"));
        // The fit overshoots 1 by an ulp near 4.
        let r = self.value(Reg::F32, "min.f32", &format!("{r}, {}", f32_imm(1.0)));
        let r = self.value(Reg::F32, "max.f32", &format!("{r}, {}", f32_imm(-1.0)));
        // `min`/`max` return the other operand for a NaN; put it back.
        let nan = self.predicate("nan.f32", x, x);
        self.select(&nan, x, &r)
    }

    fn unary_prim(&mut self, op: UnaryPrim, x: &str) -> String {
        if self.compute() != Compute::F32 {
            return self.unary_wide(op, x);
        }
        let zero = f32_imm(0.0);
        let one = f32_imm(1.0);
        match op {
            UnaryPrim::Neg => self.value(Reg::F32, "neg.f32", x),
            UnaryPrim::Abs => self.value(Reg::F32, "abs.f32", x),
            UnaryPrim::Relu => {
                // `x < 0` is false for NaN, which passes through (as in the interpreter).
                let p = self.predicate("lt.f32", x, &zero);
                self.select(&p, &zero, x)
            }
            UnaryPrim::Sigmoid => {
                // e / (1 + e) with e = exp(-|x|) never overflows; mirrored for x >= 0.
                let a = self.value(Reg::F32, "abs.f32", x);
                let na = self.value(Reg::F32, "neg.f32", &a);
                let e = self.exp(&na);
                let den = self.value(Reg::F32, "add.rn.f32", &format!("{e}, {one}"));
                // Already approximate (ex2.approx): divisions within 2 ulp (`div.full`), with
                // no slow path for IEEE's corner cases, change nothing that shows.
                let neg_side = self.value(Reg::F32, "div.full.f32", &format!("{e}, {den}"));
                let pos_side = self.value(Reg::F32, "div.full.f32", &format!("{one}, {den}"));
                let p = self.predicate("lt.f32", x, &zero);
                self.select(&p, &neg_side, &pos_side)
            }
            UnaryPrim::Tanh => {
                // sign(x) (1 - e) / (1 + e), e = exp(-2|x|).
                let a = self.value(Reg::F32, "abs.f32", x);
                let m2 = self.value(Reg::F32, "mul.rn.f32", &format!("{a}, {}", f32_imm(-2.0)));
                let e = self.exp(&m2);
                let num = self.value(Reg::F32, "sub.rn.f32", &format!("{one}, {e}"));
                let den = self.value(Reg::F32, "add.rn.f32", &format!("{one}, {e}"));
                let t = self.value(Reg::F32, "div.full.f32", &format!("{num}, {den}"));
                self.value(Reg::F32, "copysign.f32", &format!("{x}, {t}"))
            }
            UnaryPrim::Exp => self.exp(x),
            UnaryPrim::Log => {
                let l = self.value(Reg::F32, "lg2.approx.f32", x);
                self.value(Reg::F32, "mul.rn.f32", &format!("{l}, {}", f32_imm(std::f32::consts::LN_2)))
            }
            UnaryPrim::Sqrt => self.value(Reg::F32, "sqrt.rn.f32", x),
            UnaryPrim::Rsqrt => {
                let s = self.value(Reg::F32, "sqrt.rn.f32", x);
                self.value(Reg::F32, "rcp.rn.f32", &s)
            }
            UnaryPrim::Erf => self.erf(x),
        }
    }

    /// A unary op in `f64` or `i64` ([`supports`] checked it is one of these).
    fn unary_wide(&mut self, op: UnaryPrim, x: &str) -> String {
        let (kind, ty) = (self.num(), self.ty());
        match op {
            UnaryPrim::Neg => self.value(kind, &format!("neg.{ty}"), x),
            // `abs` of the smallest integer wraps to itself, as `wrapping_abs` does.
            UnaryPrim::Abs => self.value(kind, &format!("abs.{ty}"), x),
            UnaryPrim::Relu => {
                // `x < 0` is false for NaN, which passes through.
                let zero = self.imm(0.0);
                let p = self.predicate(&format!("lt.{ty}"), x, &zero);
                self.select(&p, &zero, x)
            }
            UnaryPrim::Sqrt => self.value(kind, "sqrt.rn.f64", x),
            UnaryPrim::Rsqrt => {
                let s = self.value(kind, "sqrt.rn.f64", x);
                self.value(kind, "rcp.rn.f64", &s)
            }
            UnaryPrim::Exp => gt_ir::math64::exp(self, &x.to_string()),
            UnaryPrim::Log => gt_ir::math64::ln(self, &x.to_string()),
            UnaryPrim::Tanh => gt_ir::math64::tanh(self, &x.to_string()),
            UnaryPrim::Sigmoid => gt_ir::math64::sigmoid(self, &x.to_string()),
            UnaryPrim::Erf => gt_ir::math64::erf(self, &x.to_string()),
        }
    }

    fn binary_prim(&mut self, op: BinaryPrim, a: &str, b: &str) -> String {
        if self.compute() != Compute::F32 {
            return self.binary_wide(op, a, b);
        }
        let ab = format!("{a}, {b}");
        let truth = |e: &mut Emitter, cmp: &str| {
            let p = e.predicate(cmp, a, b);
            e.select(&p, &f32_imm(1.0), &f32_imm(0.0))
        };
        match op {
            BinaryPrim::Add => self.value(Reg::F32, "add.rn.f32", &ab),
            BinaryPrim::Sub => self.value(Reg::F32, "sub.rn.f32", &ab),
            BinaryPrim::Mul => self.value(Reg::F32, "mul.rn.f32", &ab),
            BinaryPrim::Div => self.value(Reg::F32, "div.rn.f32", &ab),
            BinaryPrim::Pow => self.pow(a, b),
            BinaryPrim::Maximum => self.nan_extreme(true, a, b),
            BinaryPrim::Minimum => self.nan_extreme(false, a, b),
            BinaryPrim::Eq => truth(self, "eq.f32"),
            // Unordered: NaN != anything is true.
            BinaryPrim::Ne => truth(self, "neu.f32"),
            BinaryPrim::Lt => truth(self, "lt.f32"),
            BinaryPrim::Le => truth(self, "le.f32"),
            BinaryPrim::Gt => truth(self, "gt.f32"),
            BinaryPrim::Ge => truth(self, "ge.f32"),
        }
    }

    /// A binary op in `f64` or `i64` ([`supports`] checked it is one of these); comparisons
    /// give 1 or 0.
    fn binary_wide(&mut self, op: BinaryPrim, a: &str, b: &str) -> String {
        let ty = self.ty();
        let truth = |e: &mut Emitter, cmp: &str| {
            let p = e.predicate(&format!("{cmp}.{ty}"), a, b);
            let (one, zero) = (e.imm(1.0), e.imm(0.0));
            e.select(&p, &one, &zero)
        };
        match op {
            BinaryPrim::Add => self.arith("add", a, b),
            BinaryPrim::Sub => self.arith("sub", a, b),
            BinaryPrim::Mul => self.arith("mul", a, b),
            BinaryPrim::Div => self.value(Reg::F64, "div.rn.f64", &format!("{a}, {b}")),
            BinaryPrim::Maximum => self.nan_extreme(true, a, b),
            BinaryPrim::Minimum => self.nan_extreme(false, a, b),
            BinaryPrim::Eq => truth(self, "eq"),
            // Unordered for floats: NaN != anything is true.
            BinaryPrim::Ne => truth(self, if ty == "f64" { "neu" } else { "ne" }),
            BinaryPrim::Lt => truth(self, "lt"),
            BinaryPrim::Le => truth(self, "le"),
            BinaryPrim::Gt => truth(self, "gt"),
            BinaryPrim::Ge => truth(self, "ge"),
            BinaryPrim::Pow => gt_ir::math64::pow(self, &a.to_string(), &b.to_string()),
        }
    }

    /// The larger (`max`) or smaller of two values, NaN if either is (numpy.maximum, the
    /// interpreter's nan_max / nan_min): keeps `a` when it wins or is NaN. Integers have no
    /// NaN: `max`/`min`.
    fn nan_extreme(&mut self, max: bool, a: &str, b: &str) -> String {
        let ty = self.ty();
        if self.compute() == Compute::I64 {
            return self.value(Reg::B64, if max { "max.s64" } else { "min.s64" }, &format!("{a}, {b}"));
        }
        let wins = self.predicate(&format!("{}.{ty}", if max { "ge" } else { "le" }), a, b);
        let nan = self.predicate(&format!("nan.{ty}"), a, a);
        let keep = self.value(Reg::Pred, "or.pred", &format!("{wins}, {nan}"));
        self.select(&keep, a, b)
    }

    /// `powf`: `2^(b log2 |a|)`, negated for a negative base with an odd integer exponent,
    /// NaN for a negative base with a fractional one; `x^0 = 1^y = 1`.
    fn pow(&mut self, a: &str, b: &str) -> String {
        let one = f32_imm(1.0);
        let abs = self.value(Reg::F32, "abs.f32", a);
        let l = self.value(Reg::F32, "lg2.approx.f32", &abs);
        let t = self.value(Reg::F32, "mul.rn.f32", &format!("{b}, {l}"));
        let mag = self.value(Reg::F32, "ex2.approx.f32", &t);
        let bi = self.value(Reg::F32, "cvt.rzi.f32.f32", b);
        let is_int = self.predicate("eq.f32", &bi, b);
        let half = self.value(Reg::F32, "mul.rn.f32", &format!("{b}, {}", f32_imm(0.5)));
        let half_i = self.value(Reg::F32, "cvt.rzi.f32.f32", &half);
        let odd = self.predicate("neu.f32", &half_i, &half);
        let neg_mag = self.value(Reg::F32, "neg.f32", &mag);
        let signed = self.select(&odd, &neg_mag, &mag);
        let nan = f32_imm(f32::NAN);
        let negative_base = self.select(&is_int, &signed, &nan);
        let is_neg = self.predicate("lt.f32", a, &f32_imm(0.0));
        let r = self.select(&is_neg, &negative_base, &mag);
        let zero_exp = self.predicate("eq.f32", b, &f32_imm(0.0));
        let unit_base = self.predicate("eq.f32", a, &one);
        // (-1)^(+-inf) = 1, as in C's pow.
        let b_abs = self.value(Reg::F32, "abs.f32", b);
        let inf_exp = self.predicate("eq.f32", &b_abs, &f32_imm(f32::INFINITY));
        let unit_abs = self.predicate("eq.f32", &abs, &one);
        let minus_one_inf = self.value(Reg::Pred, "and.pred", &format!("{inf_exp}, {unit_abs}"));
        let trivial = self.value(Reg::Pred, "or.pred", &format!("{zero_exp}, {unit_base}"));
        let trivial = self.value(Reg::Pred, "or.pred", &format!("{trivial}, {minus_one_inf}"));
        self.select(&trivial, &one, &r)
    }
}
