//! `f64` and `i64` elementwise ops as CLIF, one lane at a time, with the bits of the eager
//! ops (`backend/cpu/typed.rs`): the ops whose bits IEEE 754 or two's complement fix
//! (arithmetic, `sqrt`, comparisons, `maximum`, `relu`...) as instructions; `f64`'s `exp`,
//! `log`, `tanh`, `sigmoid` and `erf` as `gt_ir::math64`'s code, emitted inline through
//! [`Ieee64`] (the code the eager ops run); composites as their expansions; `pow` as a call
//! to the op table's own scalar function ([`gt_ir::BinaryOp::apply_f64`], libm's). Loads,
//! stores and loops are `codegen.rs`'s; `f32` kernels are `math.rs`'s.

use super::codegen::Shim;
use super::math::float_condition;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::MemFlagsData;
use cranelift_codegen::ir::{types, FuncRef, InstBuilder, Type, Value};
use cranelift_frontend::FunctionBuilder;
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::kernel::{Compute, Node, Storage};
use gt_ir::math64::{self, F64Ops};
use gt_ir::{BinaryOp, BinaryPrim, OpDef, ReduceOp, UnaryOp, UnaryPrim};

/// The scalar type of a kernel computing in `compute`.
pub(super) fn scalar_type(compute: Compute) -> Type {
    match compute {
        Compute::F32 => types::F32,
        Compute::F64 => types::F64,
        Compute::I64 => types::I64,
    }
}

/// The shim `node` calls in a kernel computing in `compute` (`f64` or `i64`), if any.
pub(super) fn shim_of(node: &Node, compute: Compute) -> Option<Shim> {
    if compute == Compute::F64 {
        // Only `pow` is called, itself or in a composite's expansion.
        let calls = match *node {
            Node::Unary(op, _) => op.uses(BinaryPrim::Pow),
            Node::Binary(op, ..) => op.uses(BinaryPrim::Pow),
            _ => false,
        };
        return calls.then_some(Shim::BinaryF64);
    }
    match *node {
        Node::Unary(op, _) if !inline_unary(op, compute) => Some(Shim::UnaryI64),
        Node::Binary(op, ..) if !inline_binary(op, compute) => Some(Shim::BinaryI64),
        _ => None,
    }
}

/// Whether `storage` loads into (and stores from) a kernel computing in `compute` here: its
/// own dtypes, and `bool`s (a mask read as 0 and 1, a comparison stored nonzero as true);
/// `f32` code reads and writes `f32` only (halves and `bool`s are converted around it).
pub(super) fn holds(compute: Compute, storage: Storage) -> bool {
    match compute {
        Compute::F32 => storage == Storage::F32,
        Compute::F64 => matches!(storage, Storage::F64 | Storage::Bool),
        Compute::I64 => matches!(storage, Storage::I64 | Storage::I32 | Storage::Bool),
    }
}

/// Whether a `round` through `storage` is compiled in a kernel computing in `compute`.
pub(super) fn rounds_through(compute: Compute, storage: Storage) -> bool {
    match compute {
        Compute::F32 => false,
        Compute::F64 => matches!(storage, Storage::F64 | Storage::F32),
        Compute::I64 => matches!(storage, Storage::I64 | Storage::I32 | Storage::Bool),
    }
}

fn inline_unary(op: UnaryOp, compute: Compute) -> bool {
    let OpDef::Prim(p) = op.def() else { return false };
    match compute {
        Compute::I64 => matches!(p, UnaryPrim::Neg | UnaryPrim::Abs | UnaryPrim::Relu),
        _ => true,
    }
}

fn inline_binary(op: BinaryOp, compute: Compute) -> bool {
    let OpDef::Prim(p) = op.def() else { return false };
    match compute {
        // Integer division and `pow` are float-only ops (the type rules never give them
        // integers): the shim gives what the eager op gives.
        Compute::I64 => !matches!(p, BinaryPrim::Div | BinaryPrim::Pow),
        _ => p != BinaryPrim::Pow,
    }
}

/// Emits `f64` or `i64` code at the builder's current position.
pub(super) struct Wide<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    pub compute: Compute,
    /// The imported shims, by [`Shim`] index (the caller imports what [`shim_of`] names).
    pub shims: &'a [Option<FuncRef>],
}

impl Wide<'_, '_> {
    fn float(&self) -> bool {
        self.compute == Compute::F64
    }

    /// `x` (an `f64`) converted to the compute type as `.to(dtype)` converts it.
    pub fn constant(&mut self, x: f64) -> Value {
        if self.float() {
            self.b.ins().f64const(x)
        } else {
            self.b.ins().iconst(types::I64, x as i64)
        }
    }

    /// 1 where `mask` (an `i8` flag), else 0.
    fn truth(&mut self, mask: Value) -> Value {
        if self.float() {
            let (one, zero) = (self.constant(1.0), self.constant(0.0));
            self.b.ins().select(mask, one, zero)
        } else {
            self.b.ins().uextend(types::I64, mask)
        }
    }

    /// Whether `x` is nonzero (NaN counts), as an `i8` flag.
    fn nonzero(&mut self, x: Value) -> Value {
        if self.float() {
            let zero = self.constant(0.0);
            self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
        } else {
            self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0)
        }
    }

    fn call(&mut self, shim: Shim, args: &[Value]) -> Value {
        let f = self.shims[shim as usize].expect("the kernel imported the shims its nodes call");
        let inst = self.b.ins().call(f, args);
        self.b.inst_results(inst)[0]
    }

    /// One unary op.
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        let prim = match op.def() {
            OpDef::Prim(p) if inline_unary(op, self.compute) => p,
            OpDef::Composite(t) if self.float() => return self.formula(t, &[x]),
            _ => {
                let (shim, code) = (shim_of(&Node::Unary(op, 0), self.compute), op as i64);
                let code = self.b.ins().iconst(types::I64, code);
                return self.call(shim.expect("not inline: a call"), &[code, x]);
            }
        };
        match (prim, self.float()) {
            (UnaryPrim::Neg, true) => self.b.ins().fneg(x),
            (UnaryPrim::Abs, true) => self.b.ins().fabs(x),
            (UnaryPrim::Relu, true) => {
                // `x < 0` is false for NaN, which passes through (the op table's rule).
                let zero = self.constant(0.0);
                let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                self.b.ins().select(neg, zero, x)
            }
            (UnaryPrim::Sqrt, _) => self.b.ins().sqrt(x),
            (UnaryPrim::Rsqrt, _) => {
                let (one, root) = (self.constant(1.0), self.b.ins().sqrt(x));
                self.b.ins().fdiv(one, root)
            }
            (UnaryPrim::Exp, true) => math64::exp(&mut Ieee64(self.b), &x),
            (UnaryPrim::Log, true) => math64::ln(&mut Ieee64(self.b), &x),
            (UnaryPrim::Tanh, true) => math64::tanh(&mut Ieee64(self.b), &x),
            (UnaryPrim::Sigmoid, true) => math64::sigmoid(&mut Ieee64(self.b), &x),
            (UnaryPrim::Erf, true) => math64::erf(&mut Ieee64(self.b), &x),
            (UnaryPrim::Neg, false) => self.b.ins().ineg(x),
            // Wrapping, as `i64::wrapping_abs`.
            (UnaryPrim::Abs, false) => self.b.ins().iabs(x),
            (UnaryPrim::Relu, false) => {
                let zero = self.b.ins().iconst(types::I64, 0);
                self.b.ins().smax(x, zero)
            }
            _ => unreachable!("inline_unary names only these"),
        }
    }

    /// One binary op.
    pub fn binary(&mut self, op: BinaryOp, x: Value, y: Value) -> Value {
        let prim = match op.def() {
            OpDef::Prim(p) if inline_binary(op, self.compute) => p,
            OpDef::Composite(t) if self.float() => return self.formula(t, &[x, y]),
            _ => {
                let (shim, code) = (shim_of(&Node::Binary(op, 0, 0), self.compute), op as i64);
                let code = self.b.ins().iconst(types::I64, code);
                return self.call(shim.expect("not inline: a call"), &[code, x, y]);
            }
        };
        if self.float() {
            if let Some(cc) = float_condition(prim) {
                let m = self.b.ins().fcmp(cc, x, y);
                return self.truth(m);
            }
            match prim {
                BinaryPrim::Add => self.b.ins().fadd(x, y),
                BinaryPrim::Sub => self.b.ins().fsub(x, y),
                BinaryPrim::Mul => self.b.ins().fmul(x, y),
                BinaryPrim::Div => self.b.ins().fdiv(x, y),
                // `nan_max`/`nan_min`: `x` if it wins or is NaN, else `y`.
                BinaryPrim::Maximum | BinaryPrim::Minimum => {
                    let cc = if prim == BinaryPrim::Maximum {
                        FloatCC::GreaterThanOrEqual
                    } else {
                        FloatCC::LessThanOrEqual
                    };
                    let wins = self.b.ins().fcmp(cc, x, y);
                    let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
                    let m = self.b.ins().bor(wins, nan);
                    self.b.ins().select(m, x, y)
                }
                _ => unreachable!("comparisons are above; `pow` is called"),
            }
        } else {
            let cc = match prim {
                BinaryPrim::Add => return self.b.ins().iadd(x, y),
                BinaryPrim::Sub => return self.b.ins().isub(x, y),
                BinaryPrim::Mul => return self.b.ins().imul(x, y),
                BinaryPrim::Maximum => return self.b.ins().smax(x, y),
                BinaryPrim::Minimum => return self.b.ins().smin(x, y),
                BinaryPrim::Eq => IntCC::Equal,
                BinaryPrim::Ne => IntCC::NotEqual,
                BinaryPrim::Lt => IntCC::SignedLessThan,
                BinaryPrim::Le => IntCC::SignedLessThanOrEqual,
                BinaryPrim::Gt => IntCC::SignedGreaterThan,
                BinaryPrim::Ge => IntCC::SignedGreaterThanOrEqual,
                BinaryPrim::Div | BinaryPrim::Pow => unreachable!("called"),
            };
            let m = self.b.ins().icmp(cc, x, y);
            self.truth(m)
        }
    }

    /// A composite's expansion over `operands`, op by op as the op table's scalar evaluation
    /// (`gt_ir::formula::Scalars`) computes it.
    fn formula(&mut self, t: &Term, operands: &[Value]) -> Value {
        struct Ops<'w, 'a, 'f> {
            w: &'w mut Wide<'a, 'f>,
            operands: &'w [Value],
        }
        impl Algebra for Ops<'_, '_, '_> {
            type Value = Value;
            type Error = Var;
            fn var(&mut self, var: Var) -> Result<Value, Var> {
                var.operand(self.operands)
            }
            fn constant(&mut self, c: f64) -> Result<Value, Var> {
                Ok(self.w.constant(c))
            }
            fn unary(&mut self, op: UnaryOp, x: Value) -> Result<Value, Var> {
                Ok(self.w.unary(op, x))
            }
            fn binary(&mut self, op: BinaryOp, x: Value, y: Value) -> Result<Value, Var> {
                Ok(self.w.binary(op, x, y))
            }
            fn select(&mut self, c: Value, t: Value, f: Value) -> Result<Value, Var> {
                Ok(self.w.select(c, t, f))
            }
        }
        // The op table's tests check that expansions read only their operands.
        t.eval(&mut Ops { w: self, operands }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"))
    }

    /// What a reduction starts from: what the eager fold starts from.
    pub fn reduce_init(&mut self, op: ReduceOp) -> Value {
        match (op, self.float()) {
            // -0 is the identity of addition, and where Rust's `f64` sum starts.
            (ReduceOp::Sum | ReduceOp::Mean, true) => self.constant(-0.0),
            (ReduceOp::Max, true) => self.constant(f64::NEG_INFINITY),
            (ReduceOp::Min, true) => self.constant(f64::INFINITY),
            (ReduceOp::Sum | ReduceOp::Mean, false) => self.b.ins().iconst(types::I64, 0),
            (ReduceOp::Max, false) => self.b.ins().iconst(types::I64, i64::MIN),
            (ReduceOp::Min, false) => self.b.ins().iconst(types::I64, i64::MAX),
        }
    }

    /// One step of a reduction's fold: `acc op x`.
    pub fn reduce_step(&mut self, op: ReduceOp, acc: Value, x: Value) -> Value {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => self.binary(BinaryOp::Add, acc, x),
            ReduceOp::Max => self.binary(BinaryOp::Maximum, acc, x),
            ReduceOp::Min => self.binary(BinaryOp::Minimum, acc, x),
        }
    }

    /// `c != 0 ? t : f`.
    pub fn select(&mut self, c: Value, t: Value, f: Value) -> Value {
        let m = self.nonzero(c);
        self.b.ins().select(m, t, f)
    }

    /// `x` stored as `storage` and loaded again ([`rounds_through`] says which are).
    pub fn round(&mut self, storage: Storage, x: Value) -> Value {
        match (storage, self.float()) {
            (Storage::F64, true) | (Storage::I64, false) => x,
            (Storage::F32, true) => {
                let narrow = self.b.ins().fdemote(types::F32, x);
                self.b.ins().fpromote(types::F64, narrow)
            }
            (Storage::I32, false) => {
                let narrow = self.b.ins().ireduce(types::I32, x);
                self.b.ins().sextend(types::I64, narrow)
            }
            (Storage::Bool, false) => {
                let m = self.nonzero(x);
                self.b.ins().uextend(types::I64, m)
            }
            _ => unreachable!("`rounds_through` refuses the others"),
        }
    }

    /// Loads one element of `storage` at `addr`, converted to the compute type.
    pub fn load(&mut self, storage: Storage, addr: Value) -> Value {
        let flags = super::codegen::mem();
        match storage {
            Storage::F64 => self.b.ins().load(types::F64, flags, addr, 0),
            Storage::I64 => self.b.ins().load(types::I64, flags, addr, 0),
            Storage::I32 => self.b.ins().sload32(flags, addr, 0),
            Storage::Bool => {
                let x = self.b.ins().uload8(types::I64, flags, addr, 0);
                if self.float() {
                    self.b.ins().fcvt_from_uint(types::F64, x)
                } else {
                    x
                }
            }
            _ => unreachable!("`holds` refuses the others"),
        }
    }

    /// Stores `x` as one element of `storage` at `addr` (integers wrap, nonzero is `true`).
    pub fn store(&mut self, storage: Storage, x: Value, addr: Value) {
        let flags = super::codegen::mem();
        match storage {
            Storage::F64 | Storage::I64 => {
                self.b.ins().store(flags, x, addr, 0);
            }
            Storage::I32 => {
                self.b.ins().istore32(flags, x, addr, 0);
            }
            Storage::Bool => {
                let m = self.nonzero(x);
                self.b.ins().store(flags, m, addr, 0);
            }
            _ => unreachable!("`holds` refuses the others"),
        }
    }
}

/// `f64`'s IEEE operations as scalar CLIF, for `gt_ir::math64`'s functions: each rounds as
/// [`math64::Lane`]'s (the eager ops') does, so the emitted code gives the same bits. `fma`
/// is one rounding on every host (the instruction, or libm's exact `fma` through a libcall
/// where the CPU lacks it), as `Lane`'s `mul_add`.
pub(super) struct Ieee64<'a, 'f>(pub &'a mut FunctionBuilder<'f>);

impl Ieee64<'_, '_> {
    fn bits(&mut self, x: Value) -> Value {
        self.0.ins().bitcast(types::I64, MemFlagsData::new(), x)
    }
    fn float(&mut self, bits: Value) -> Value {
        self.0.ins().bitcast(types::F64, MemFlagsData::new(), bits)
    }
}

impl F64Ops for Ieee64<'_, '_> {
    type V = Value;
    type P = Value;

    fn c(&mut self, x: f64) -> Value {
        self.0.ins().f64const(x)
    }
    fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fadd(*a, *b)
    }
    fn sub(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fsub(*a, *b)
    }
    fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fmul(*a, *b)
    }
    fn div(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fdiv(*a, *b)
    }
    fn fma(&mut self, a: &Value, b: &Value, c: &Value) -> Value {
        self.0.ins().fma(*a, *b, *c)
    }
    fn rint(&mut self, a: &Value) -> Value {
        self.0.ins().nearest(*a)
    }
    fn trunc(&mut self, a: &Value) -> Value {
        self.0.ins().trunc(*a)
    }
    fn abs(&mut self, a: &Value) -> Value {
        self.0.ins().fabs(*a)
    }
    fn neg(&mut self, a: &Value) -> Value {
        self.0.ins().fneg(*a)
    }
    fn copysign(&mut self, magnitude: &Value, sign: &Value) -> Value {
        self.0.ins().fcopysign(*magnitude, *sign)
    }
    fn clear_low_word(&mut self, a: &Value) -> Value {
        let bits = self.bits(*a);
        let high = self.0.ins().band_imm_u(bits, 0xFFFF_FFFF_0000_0000_u64 as i64);
        self.float(high)
    }
    fn frexp(&mut self, a: &Value) -> (Value, Value) {
        let bits = self.bits(*a);
        let mantissa = self.0.ins().band_imm_u(bits, 0x000F_FFFF_FFFF_FFFF);
        let m = self.0.ins().bor_imm_u(mantissa, 0x3FF0_0000_0000_0000);
        let shifted = self.0.ins().ushr_imm_u(bits, 52);
        let biased = self.0.ins().band_imm_u(shifted, 2047);
        let e = self.0.ins().iadd_imm_s(biased, -1023);
        (self.float(m), self.0.ins().fcvt_from_sint(types::F64, e))
    }
    fn ldexp(&mut self, a: &Value, k: &Value) -> Value {
        // `Lane::ldexp`'s steps: `k` in two halves, each power of two built in the float
        // unit (`j + 1023 + 2^52` holds the biased exponent in its low bits).
        let half = self.c(0.5);
        let k_half = self.0.ins().fmul(*k, half);
        let k1 = self.0.ins().floor(k_half);
        let k2 = self.0.ins().fsub(*k, k1);
        let bias = self.c(1023.0 + 4_503_599_627_370_496.0);
        let power = |w: &mut Self, j: Value| {
            let biased = w.0.ins().fadd(j, bias);
            let bits = w.bits(biased);
            let shifted = w.0.ins().ishl_imm_u(bits, 52);
            w.float(shifted)
        };
        let (p1, p2) = (power(self, k1), power(self, k2));
        let scaled = self.0.ins().fmul(*a, p1);
        self.0.ins().fmul(scaled, p2)
    }
    fn lt(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fcmp(FloatCC::LessThan, *a, *b)
    }
    fn gt(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fcmp(FloatCC::GreaterThan, *a, *b)
    }
    fn eq(&mut self, a: &Value, b: &Value) -> Value {
        self.0.ins().fcmp(FloatCC::Equal, *a, *b)
    }
    fn ne(&mut self, a: &Value, b: &Value) -> Value {
        // Unordered or not equal: NaN != NaN, as `Lane`'s `!=`.
        self.0.ins().fcmp(FloatCC::NotEqual, *a, *b)
    }
    fn is_nan(&mut self, a: &Value) -> Value {
        self.0.ins().fcmp(FloatCC::Unordered, *a, *a)
    }
    fn or(&mut self, p: &Value, q: &Value) -> Value {
        self.0.ins().bor(*p, *q)
    }
    fn and(&mut self, p: &Value, q: &Value) -> Value {
        self.0.ins().band(*p, *q)
    }
    fn select(&mut self, p: &Value, on_true: &Value, on_false: &Value) -> Value {
        self.0.ins().select(*p, *on_true, *on_false)
    }
}

/// `op` (by index) on two `f64`s, as the eager op computes it.
pub(super) extern "C" fn binary_f64(op: i64, x: f64, y: f64) -> f64 {
    BinaryOp::ALL.get(op as usize).map_or(f64::NAN, |op| op.apply_f64(x, y))
}

/// `op` (by index) on an integer, as the eager op computes it (0 for a float-only op).
pub(super) extern "C" fn unary_i64(op: i64, x: i64) -> i64 {
    UnaryOp::ALL.get(op as usize).and_then(|op| op.apply_int(x)).unwrap_or(0)
}

/// `op` (by index) on two integers, as the eager op computes it (0 for a float-only op).
pub(super) extern "C" fn binary_i64(op: i64, x: i64, y: i64) -> i64 {
    BinaryOp::ALL.get(op as usize).and_then(|op| op.apply_int(x, y)).unwrap_or(0)
}
