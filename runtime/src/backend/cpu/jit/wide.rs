//! `f64` and `i64` elementwise ops as CLIF, one lane at a time: the ops whose bits IEEE 754
//! or two's complement fix (arithmetic, `sqrt`, comparisons, `maximum`, `relu`...) inline,
//! the others (`exp`, `tanh`, `pow`, composites) as calls to the op table's own scalar
//! functions ([`gt_ir::UnaryOp::apply_f64`] and friends), so a fused kernel gives the bits
//! of the eager ops (`backend/cpu/typed.rs`), which call the same functions. Loads, stores
//! and loops are `codegen.rs`'s; `f32` kernels are `math.rs`'s.

use super::codegen::Shim;
use super::math::float_condition;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, FuncRef, InstBuilder, Type, Value};
use cranelift_frontend::FunctionBuilder;
use gt_ir::kernel::{Compute, Node, Storage};
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
    let float = compute == Compute::F64;
    match *node {
        Node::Unary(op, _) if !inline_unary(op, compute) => Some(if float { Shim::UnaryF64 } else { Shim::UnaryI64 }),
        Node::Binary(op, ..) if !inline_binary(op, compute) => {
            Some(if float { Shim::BinaryF64 } else { Shim::BinaryI64 })
        }
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
        _ => matches!(p, UnaryPrim::Neg | UnaryPrim::Abs | UnaryPrim::Relu | UnaryPrim::Sqrt | UnaryPrim::Rsqrt),
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

/// `op` (by index) on an `f64`, as the eager op computes it.
pub(super) extern "C" fn unary_f64(op: i64, x: f64) -> f64 {
    UnaryOp::ALL.get(op as usize).map_or(f64::NAN, |op| op.apply_f64(x))
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
