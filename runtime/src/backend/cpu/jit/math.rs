//! Elementwise ops as CLIF, the same code for one lane (`f32`) and four (`f32x4`): the
//! exact ops (bit-for-bit the interpreter's), and polynomial `exp`, `log`, `tanh`,
//! `sigmoid` and `erf` that vectorise, so a fused kernel never calls libm per element. Loops, loads
//! and stores live in `codegen.rs`.
//!
//! # Accuracy
//!
//! The transcendental functions follow Cephes' single-precision algorithms (range
//! reduction, then a short polynomial), evaluated without fused multiply-adds so one and
//! four lanes give identical bits:
//!
//! - `exp`: `x = n ln2 + r` with `ln2` split in two constants, Cephes' degree-7
//!   polynomial for `e^r`, and `2^n` applied as two exact powers of two (so overflow gives `inf`,
//!   underflow gradual subnormals then 0).
//! - `log`: exponent/mantissa split (subnormal inputs are scaled by `2^23` first), the
//!   mantissa folded into `[sqrt(1/2), sqrt(2))`, Cephes' polynomial in `m - 1`.
//! - `tanh`: an odd polynomial below `|x| = 0.625` (so tiny `x` keep full relative accuracy),
//!   `1 - 2 / (e^{2|x|} + 1)` above, with the sign of `x`.
//! - `sigmoid`: `1 / (1 + e^{-x})` for `x >= 0`, `e^x / (1 + e^x)` below (the interpreter's
//!   formulas, with this `exp`), so nothing overflows.
//!
//! - `erf`: Eigen's rational approximation on `[-4, 4]` (see [`Emit::erf`]); within 8 ulp
//!   (absolute error < 5e-7) of libm's `erff`.
//!
//! Composite ops are their expansions over these. `backend/cpu/vmath.rs` is their Rust twin
//! for the interpreter (the same operations, so interpreted and fused give the same bits):
//! change both together.
//!
//! Measured against libm (the oracle) on 70,000 values (wide random ranges, every positive
//! magnitude, thresholds): `exp` and `log` within 1 ulp, `tanh` and `sigmoid` within 2 ulp
//! (relative error < 2.4e-7) on normal results; subnormal results within one subnormal step.
//! The tests hold them to 2 ulp.
//!
//! Special values are the interpreter's: NaN in gives NaN out; `exp(-inf) = 0`,
//! `exp(inf) = inf`; `log(0) = -inf`, `log(x < 0) = NaN`, `log(inf) = inf`;
//! `tanh(+-inf) = +-1`; `sigmoid(-inf) = 0`, `sigmoid(inf) = 1`.

use crate::backend::cpu::vmath::{EXP_P, LOG_P, TANH_P};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::immediates::Ieee32;
use cranelift_codegen::ir::{types, Endianness, FuncRef, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::{BinaryOp, BinaryPrim, OpDef, UnaryOp, UnaryPrim};

/// How many `f32` lanes one value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lanes {
    /// A scalar `f32`.
    One,
    /// An `f32x4` vector.
    Four,
}

/// Emits elementwise code at the builder's current position for values of `lanes` lanes.
pub(super) struct Emit<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    pub lanes: Lanes,
    /// Polynomials use fused multiply-adds (the host has them).
    pub fma: bool,
    /// The imported `powf` shim, where the kernel needs it ([`needs_powf`]).
    pub powf: Option<FuncRef>,
}

/// Whether an op calls the `powf` shim (`pow`, or a composite whose expansion has one).
pub(super) fn needs_powf(node: &gt_ir::kernel::Node) -> bool {
    use gt_ir::kernel::Node;
    match *node {
        Node::Unary(op, _) => op.uses(BinaryPrim::Pow),
        Node::Binary(op, ..) => op.uses(BinaryPrim::Pow),
        _ => false,
    }
}

/// The float condition of a comparison primitive (`None` for the others).
pub(super) fn float_condition(op: BinaryPrim) -> Option<FloatCC> {
    Some(match op {
        BinaryPrim::Eq => FloatCC::Equal,
        // `NotEqual` is unordered-or-not-equal: NaN != NaN, as in Rust.
        BinaryPrim::Ne => FloatCC::NotEqual,
        BinaryPrim::Lt => FloatCC::LessThan,
        BinaryPrim::Le => FloatCC::LessThanOrEqual,
        BinaryPrim::Gt => FloatCC::GreaterThan,
        BinaryPrim::Ge => FloatCC::GreaterThanOrEqual,
        _ => return None,
    })
}

/// Bit-level reinterpretation between same-size types; vectors need an explicit lane order.
fn bitcast_flags(lanes: Lanes) -> MemFlagsData {
    match lanes {
        Lanes::One => MemFlagsData::new(),
        Lanes::Four => MemFlagsData::new().with_endianness(Endianness::Little),
    }
}

impl Emit<'_, '_> {
    /// The float type of a value.
    pub fn fty(&self) -> Type {
        match self.lanes {
            Lanes::One => types::F32,
            Lanes::Four => types::F32X4,
        }
    }

    fn ity(&self) -> Type {
        match self.lanes {
            Lanes::One => types::I32,
            Lanes::Four => types::I32X4,
        }
    }

    /// A float constant by its bits (NaN payloads kept), splat across the lanes.
    pub fn fbits(&mut self, bits: u32) -> Value {
        match self.lanes {
            Lanes::One => self.b.ins().f32const(Ieee32::with_bits(bits)),
            // One load from the constant pool rather than a scalar move and a shuffle.
            Lanes::Four => self.vconst(types::F32X4, bits),
        }
    }

    /// A 128-bit constant of four equal 32-bit lanes.
    fn vconst(&mut self, ty: Type, bits: u32) -> Value {
        let bytes: Vec<u8> = bits.to_le_bytes().repeat(4);
        let c = self.b.func.dfg.constants.insert(bytes.into());
        self.b.ins().vconst(ty, c)
    }

    /// A float constant splat across the lanes.
    pub fn f(&mut self, x: f32) -> Value {
        self.fbits(x.to_bits())
    }

    fn i(&mut self, x: i32) -> Value {
        match self.lanes {
            Lanes::One => self.b.ins().iconst(types::I32, i64::from(x)),
            Lanes::Four => self.vconst(types::I32X4, x as u32),
        }
    }

    fn bits_of(&mut self, x: Value) -> Value {
        let ty = self.ity();
        self.b.ins().bitcast(ty, bitcast_flags(self.lanes), x)
    }

    fn float_of(&mut self, x: Value) -> Value {
        let ty = self.fty();
        self.b.ins().bitcast(ty, bitcast_flags(self.lanes), x)
    }

    /// A comparison as a mask: an `i8` flag for one lane, an all-ones/all-zeros `i32x4`
    /// for four.
    pub fn cmp(&mut self, cc: FloatCC, x: Value, y: Value) -> Value {
        self.b.ins().fcmp(cc, x, y)
    }

    fn or(&mut self, m1: Value, m2: Value) -> Value {
        self.b.ins().bor(m1, m2)
    }

    /// `mask ? t : f` per lane, for float or `i32` values.
    pub fn select(&mut self, mask: Value, t: Value, f: Value) -> Value {
        match self.lanes {
            Lanes::One => self.b.ins().select(mask, t, f),
            Lanes::Four => {
                let ty = self.b.func.dfg.value_type(t);
                let mask =
                    if ty == types::I32X4 { mask } else { self.b.ins().bitcast(ty, bitcast_flags(self.lanes), mask) };
                self.b.ins().bitselect(mask, t, f)
            }
        }
    }

    fn add(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fadd(x, y)
    }

    fn sub(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fsub(x, y)
    }

    fn mul(&mut self, x: Value, y: Value) -> Value {
        self.b.ins().fmul(x, y)
    }

    fn mulc(&mut self, x: Value, c: f32) -> Value {
        let c = self.f(c);
        self.mul(x, c)
    }

    fn addc(&mut self, x: Value, c: f32) -> Value {
        let c = self.f(c);
        self.add(x, c)
    }

    /// `((c0 x + c1) x + c2) x + ...` (Horner; with fused multiply-adds where the host has
    /// them, the same in one lane and four).
    fn horner(&mut self, x: Value, coefficients: &[f32]) -> Value {
        let mut p = self.f(coefficients[0]);
        for &c in &coefficients[1..] {
            if self.fma {
                let c = self.f(c);
                p = self.b.ins().fma(p, x, c);
            } else {
                p = self.mul(p, x);
                p = self.addc(p, c);
            }
        }
        p
    }

    /// The interpreter's `nan_max`: `x` if `x >= y` or `x` is NaN, else `y`.
    pub fn nan_max(&mut self, x: Value, y: Value) -> Value {
        let ge = self.cmp(FloatCC::GreaterThanOrEqual, x, y);
        let nan = self.cmp(FloatCC::Unordered, x, x);
        let m = self.or(ge, nan);
        self.select(m, x, y)
    }

    /// The interpreter's `nan_min`: `x` if `x <= y` or `x` is NaN, else `y`.
    pub fn nan_min(&mut self, x: Value, y: Value) -> Value {
        let le = self.cmp(FloatCC::LessThanOrEqual, x, y);
        let nan = self.cmp(FloatCC::Unordered, x, x);
        let m = self.or(le, nan);
        self.select(m, x, y)
    }

    /// 1.0 where `mask`, else 0.0.
    fn truth(&mut self, mask: Value) -> Value {
        let (one, zero) = (self.f(1.0), self.f(0.0));
        self.select(mask, one, zero)
    }

    /// One unary op (a composite as its expansion).
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        match op.def() {
            OpDef::Prim(p) => self.unary_prim(p, x),
            OpDef::Composite(t) => self.formula(t, &[x]),
        }
    }

    /// One binary op (a composite as its expansion).
    pub fn binary(&mut self, op: BinaryOp, x: Value, y: Value) -> Value {
        match op.def() {
            OpDef::Prim(p) => self.binary_prim(p, x, y),
            OpDef::Composite(t) => self.formula(t, &[x, y]),
        }
    }

    fn unary_prim(&mut self, op: UnaryPrim, x: Value) -> Value {
        match op {
            UnaryPrim::Neg => self.b.ins().fneg(x),
            UnaryPrim::Abs => self.b.ins().fabs(x),
            UnaryPrim::Relu => {
                // `x < 0` is false for NaN, which passes through (the interpreter's rule).
                let zero = self.f(0.0);
                let neg = self.cmp(FloatCC::LessThan, x, zero);
                self.select(neg, zero, x)
            }
            UnaryPrim::Sigmoid => self.sigmoid(x),
            UnaryPrim::Tanh => self.tanh(x),
            UnaryPrim::Exp => self.exp(x),
            UnaryPrim::Log => self.log(x),
            UnaryPrim::Sqrt => self.b.ins().sqrt(x),
            UnaryPrim::Rsqrt => {
                let (one, root) = (self.f(1.0), self.b.ins().sqrt(x));
                self.b.ins().fdiv(one, root)
            }
            UnaryPrim::Erf => self.erf(x),
        }
    }

    /// `pow` calls the imported scalar `powf` shim once per lane (the caller imports it
    /// for kernels that need it: [`needs_powf`]).
    fn binary_prim(&mut self, op: BinaryPrim, x: Value, y: Value) -> Value {
        if let Some(cc) = float_condition(op) {
            let m = self.cmp(cc, x, y);
            return self.truth(m);
        }
        match op {
            BinaryPrim::Add => self.add(x, y),
            BinaryPrim::Sub => self.sub(x, y),
            BinaryPrim::Mul => self.mul(x, y),
            BinaryPrim::Div => self.b.ins().fdiv(x, y),
            BinaryPrim::Pow => self.per_lane2(self.powf.expect("`pow` comes with the powf shim"), x, y),
            BinaryPrim::Maximum => self.nan_max(x, y),
            BinaryPrim::Minimum => self.nan_min(x, y),
            _ => unreachable!("comparisons are above"),
        }
    }

    /// A composite's expansion over `operands`.
    fn formula(&mut self, t: &Term, operands: &[Value]) -> Value {
        struct Clif<'e, 'a, 'f> {
            e: &'e mut Emit<'a, 'f>,
            operands: &'e [Value],
        }
        impl Algebra for Clif<'_, '_, '_> {
            type Value = Value;
            type Error = Var;
            fn var(&mut self, var: Var) -> Result<Value, Var> {
                var.operand(self.operands)
            }
            fn constant(&mut self, c: f64) -> Result<Value, Var> {
                Ok(self.e.f(c as f32))
            }
            fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, Var> {
                Ok(self.e.unary(op, x))
            }
            fn binary(&mut self, op: BinaryOp, x: Value, y: Value) -> Result<Value, Var> {
                Ok(self.e.binary(op, x, y))
            }
            fn select(&mut self, c: Value, t: Value, f: Value) -> Result<Value, Var> {
                Ok(self.e.where_(c, t, f))
            }
        }
        // The op table's tests check that expansions read only their operands.
        t.eval(&mut Clif { e: self, operands }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"))
    }

    /// `c != 0 ? t : f`; NaN counts as nonzero.
    pub fn where_(&mut self, c: Value, t: Value, f: Value) -> Value {
        let zero = self.f(0.0);
        let m = self.cmp(FloatCC::NotEqual, c, zero);
        self.select(m, t, f)
    }

    /// A scalar `(f32, f32) -> f32` function applied lane by lane.
    fn per_lane2(&mut self, func: FuncRef, x: Value, y: Value) -> Value {
        let call = |b: &mut FunctionBuilder<'_>, x: Value, y: Value| {
            let inst = b.ins().call(func, &[x, y]);
            b.inst_results(inst)[0]
        };
        match self.lanes {
            Lanes::One => call(self.b, x, y),
            Lanes::Four => {
                let mut v = x;
                for lane in 0..4u8 {
                    let (a, c) = (self.b.ins().extractlane(x, lane), self.b.ins().extractlane(y, lane));
                    let r = call(self.b, a, c);
                    v = self.b.ins().insertlane(v, r, lane);
                }
                v
            }
        }
    }

    /// `e^x` (Cephes `expf`, see the module docs).
    pub fn exp(&mut self, x: Value) -> Value {
        // Past these every result is inf or 0 anyway; clamping keeps `n` small enough for the
        // rounding trick and the two-step scaling below. A compare and a select (two
        // instructions, where NaN-aware `fmax`/`fmin` take about eight on x86) keep NaN, for
        // which both comparisons are false. Below -104 the result (+0) is computed from 0 and
        // replaced: computing it from -104 makes a subnormal on the way, a microcode assist
        // on x86 (a masked softmax, half its elements at -1e30, ran 3x slower).
        let lo = self.f(-104.0);
        let hi = self.f(89.0);
        let dead = self.cmp(FloatCC::LessThan, x, lo);
        let zero = self.f(0.0);
        let x = self.select(dead, zero, x);
        let above = self.cmp(FloatCC::GreaterThan, x, hi);
        let x = self.select(above, hi, x);
        // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer (to nearest even), and
        // the low bits of the sum are that integer.
        let magic = 12_582_912.0f32;
        let t = self.mulc(x, std::f32::consts::LOG2_E);
        let t = self.addc(t, magic);
        let magic_v = self.f(magic);
        let nf = self.sub(t, magic_v);
        let (ti, mi) = (self.bits_of(t), self.i(magic.to_bits() as i32));
        let n = self.b.ins().isub(ti, mi);
        // r = x - n ln2, ln2 = C1 + C2 with C1 exact in few bits, so n * C1 is exact.
        let r = self.mulc(nf, 0.693_359_4);
        let r = self.sub(x, r);
        let r2 = self.mulc(nf, -2.121_944_4e-4);
        let r = self.sub(r, r2);
        let z = self.mul(r, r);
        let p = self.horner(r, &EXP_P);
        let y = self.mul(p, z);
        let y = self.add(y, r);
        let y = self.addc(y, 1.0);
        // 2^n as 2^(n/2) * 2^(n - n/2): each factor is a normal float for |n| <= 252, and the
        // final product rounds once, so overflow and gradual underflow come out right.
        let n1 = self.b.ins().sshr_imm_u(n, 1);
        let n2 = self.b.ins().isub(n, n1);
        let s1 = self.pow2(n1);
        let s2 = self.pow2(n2);
        let y = self.mul(y, s1);
        let y = self.mul(y, s2);
        self.select(dead, zero, y)
    }

    /// `2^n` for an integer `-126 <= n <= 127`, built in the exponent bits.
    fn pow2(&mut self, n: Value) -> Value {
        let bias = self.i(127);
        let e = self.b.ins().iadd(n, bias);
        let e = self.b.ins().ishl_imm_u(e, 23);
        self.float_of(e)
    }

    /// Natural logarithm (Cephes `logf`, see the module docs).
    pub fn log(&mut self, x0: Value) -> Value {
        // Subnormals: scale into the normal range, remember the 23 extra powers of two.
        let min_normal = self.f(f32::MIN_POSITIVE);
        let sub = self.cmp(FloatCC::LessThan, x0, min_normal);
        let scaled = self.mulc(x0, 8_388_608.0);
        let x = self.select(sub, scaled, x0);
        let bits = self.bits_of(x);
        // x = m 2^e with m in [0.5, 1) (`frexp`).
        let biased = self.b.ins().ushr_imm_u(bits, 23);
        let bias = self.i(126);
        let e = self.b.ins().isub(biased, bias);
        let (e23, zero_i) = (self.i(23), self.i(0));
        let shift = self.select(sub, e23, zero_i);
        let e = self.b.ins().isub(e, shift);
        let mant_mask = self.i(0x007f_ffff);
        let half_bits = self.i(0x3f00_0000);
        let m = self.b.ins().band(bits, mant_mask);
        let m = self.b.ins().bor(m, half_bits);
        let m = self.float_of(m);
        // Fold m into [sqrt(1/2), sqrt(2)) and take m - 1 (exact by Sterbenz).
        let sqrt_half = self.f(std::f32::consts::FRAC_1_SQRT_2);
        let small = self.cmp(FloatCC::LessThan, m, sqrt_half);
        let (one_i, zero_i) = (self.i(1), self.i(0));
        let dec = self.select(small, one_i, zero_i);
        let e = self.b.ins().isub(e, dec);
        let m2 = self.add(m, m);
        let m = self.select(small, m2, m);
        let one = self.f(1.0);
        let m = self.sub(m, one);
        let fty = self.fty();
        let ef = self.b.ins().fcvt_from_sint(fty, e);
        let z = self.mul(m, m);
        let y = self.horner(m, &LOG_P);
        let y = self.mul(y, m);
        let y = self.mul(y, z);
        let t = self.mulc(ef, -2.121_944_4e-4);
        let y = self.add(y, t);
        let t = self.mulc(z, -0.5);
        let y = self.add(y, t);
        let r = self.add(m, y);
        let t = self.mulc(ef, 0.693_359_4);
        let r = self.add(r, t);
        // Special values, last wins: inf, zeros, negatives, NaN.
        let inf = self.f(f32::INFINITY);
        let is_inf = self.cmp(FloatCC::Equal, x0, inf);
        let r = self.select(is_inf, inf, r);
        let zero = self.f(0.0);
        let is_zero = self.cmp(FloatCC::Equal, x0, zero);
        let neg_inf = self.f(f32::NEG_INFINITY);
        let r = self.select(is_zero, neg_inf, r);
        let is_neg = self.cmp(FloatCC::LessThan, x0, zero);
        let nan = self.f(f32::NAN);
        let r = self.select(is_neg, nan, r);
        let is_nan = self.cmp(FloatCC::Unordered, x0, x0);
        self.select(is_nan, x0, r)
    }

    /// Hyperbolic tangent (Cephes `tanhf`, see the module docs).
    pub fn tanh(&mut self, x: Value) -> Value {
        let ax = self.b.ins().fabs(x);
        // Small |x|: x + x^3 P(x^2).
        let z = self.mul(x, x);
        let p = self.horner(z, &TANH_P);
        let p = self.mul(p, z);
        let p = self.mul(p, x);
        let small = self.add(p, x);
        // Large |x|: 1 - 2 / (e^{2|x|} + 1), which is 1 once e^{2|x|} overflows; NaN stays NaN.
        let two_ax = self.add(ax, ax);
        let e = self.exp(two_ax);
        let e1 = self.addc(e, 1.0);
        let two = self.f(2.0);
        let q = self.b.ins().fdiv(two, e1);
        let one = self.f(1.0);
        let big = self.sub(one, q);
        // Give `big` (never negative) the sign of x.
        let (bb, xb, sign) = (self.bits_of(big), self.bits_of(x), self.i(i32::MIN));
        let s = self.b.ins().band(xb, sign);
        let big = self.b.ins().bor(bb, s);
        let big = self.float_of(big);
        let limit = self.f(0.625);
        let is_small = self.cmp(FloatCC::LessThan, ax, limit);
        self.select(is_small, small, big)
    }

    /// `erf(x)`: `x` clamped to `[-4, 4]` (beyond, `erf` is `+-1` in `f32`), then the
    /// odd-over-even rational approximation of Eigen/XLA (`x p(x^2) / q(x^2)`); NaN stays NaN
    /// (`fmin`/`fmax` propagate it).
    pub fn erf(&mut self, x: Value) -> Value {
        use gt_ir::ops::{ERF_DENOMINATOR as Q, ERF_NUMERATOR as P};
        let (hi, lo) = (self.f(4.0), self.f(-4.0));
        let x = self.b.ins().fmin(x, hi);
        let x = self.b.ins().fmax(x, lo);
        let x2 = self.mul(x, x);
        let p = self.horner(x2, &P);
        let q = self.horner(x2, &Q);
        // `(p / q) x`, not `(p x) / q`: `p x` would lose bits to underflow for tiny `x`.
        let r = self.b.ins().fdiv(p, q);
        let r = self.mul(r, x);
        // The fit overshoots 1 by an ulp near 4 (`fmin`/`fmax` keep a NaN).
        let (one, minus_one) = (self.f(1.0), self.f(-1.0));
        let r = self.b.ins().fmin(r, one);
        self.b.ins().fmax(r, minus_one)
    }

    /// The logistic function, by the interpreter's two formulas (see the module docs).
    pub fn sigmoid(&mut self, x: Value) -> Value {
        let ax = self.b.ins().fabs(x);
        let nax = self.b.ins().fneg(ax);
        let e = self.exp(nax);
        let d = self.addc(e, 1.0);
        let one = self.f(1.0);
        let pos = self.b.ins().fdiv(one, d);
        let neg = self.b.ins().fdiv(e, d);
        let zero = self.f(0.0);
        let is_neg = self.cmp(FloatCC::LessThan, x, zero);
        self.select(is_neg, neg, pos)
    }
}
