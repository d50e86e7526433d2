//! The reference interpreter: executes [`Instr`]s one at a time on host tensors. Its
//! results define what every other backend must compute, so it is written for correctness
//! first and speed second.
//!
//! Every instruction goes the same way: its operands are looked up, the type rule
//! ([`shape::infer`], the only place type rules live) gives the result types, each result is
//! checked against the memory limit, and then one function per op family computes it.
//! Nothing panics on a malformed stream: undefined values, bad shapes and oversized results
//! are [`RuntimeError`]s, and a failed instruction leaves every value as it was.
//!
//! Values are `ndarray` arrays of their dtype (`value::Value`) kept in standard (row-major
//! contiguous) layout, so a read is a straight copy. Broadcasting, permutes and slices are
//! strided views copied once into their result. The functions here compute in `f32`; those
//! of `value.rs` take every other dtype through them or through their own loops.

use crate::backend::cpu::jit::{Jit, JitError, Wide};
use crate::backend::cpu::threads::{self, Sgemm};
use crate::backend::cpu::value::{self, Value};
use crate::backend::cpu::vmath::{self, RandomKind};
use crate::backend::{checks, Residency};
use crate::error::JitFailure;
use crate::RuntimeError;
use foldhash::{HashMap, HashMapExt};
use gt_ir::data::Elements;
use gt_ir::formula::{Algebra, Term, Var};
use gt_ir::kernel::{Compute, Kernel, Storage};
use gt_ir::ops::{nan_max, nan_min, BinaryKernel, OpDef, UnaryKernel};
use gt_ir::verify::shape::{self, ResolvedSlice};
use gt_ir::{
    BinaryOp, CollectiveOp, Executor, HostTensor, Instr, Operand, ReduceOp, Shape, TensorType, TypeError, UnaryOp,
    ValueId,
};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, CowArray, IxDyn, Zip};
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// An `f32` value as the interpreter computes it: row-major contiguous.
pub(crate) type Tensor = ArrayD<f32>;

/// The reference CPU interpreter: a map from values to host tensors.
///
/// Re-executing an instruction whose result already exists overwrites it (scripts re-run
/// loop bodies). Every result is checked against [`Interpreter::max_tensor_bytes`] before it
/// is allocated.
pub struct Interpreter {
    values: HashMap<ValueId, Value>,
    bytes: Residency,
    max_tensor_bytes: usize,
    /// The most bytes all values may hold at once (the worker's memory budget).
    max_live_bytes: usize,
    /// Runs `fused` kernels as machine code; without it they are evaluated by the kernel
    /// oracle (`cpu::kernels`), which is the reference.
    jit: Option<Box<Jit>>,
    /// Values not computed yet, each a view of a stored `f32` value ([`Pending`]): a product
    /// reads a transpose in place through swapped strides (autograd's weight gradients are
    /// `x.T @ dy`: no copy of `x`), an update `w - t` reads a scaled value `t = g * lr` in
    /// the same pass; anything else that reads one, frees or redefines its source computes
    /// it first ([`Interpreter::settle`]).
    lazy: HashMap<ValueId, Pending>,
}

/// A value left to compute from a stored `f32` value (its source) when something needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pending {
    /// The source with its last two axes swapped.
    Transpose(ValueId),
    /// The source times a scalar (`f32`, as `mul` rounds it): an optimizer's `g * lr`, which
    /// its update `w - t` reads in the same pass as `w` ([`Interpreter::scaled_update`]):
    /// one pass over memory instead of two, and the same bits (`w - fl(g * c)`, no FMA).
    Scaled(ValueId, f32),
}

impl Pending {
    fn source(self) -> ValueId {
        match self {
            Pending::Transpose(src) | Pending::Scaled(src, _) => src,
        }
    }
}

/// The fewest elements a `mul` by a scalar is left pending for: below this the data is in
/// the cache and two passes cost about what one does.
const SCALED_MIN_ELEMENTS: usize = 1 << 14;

impl Interpreter {
    /// The default limit on one tensor's size: 8 GiB.
    pub const DEFAULT_MAX_TENSOR_BYTES: usize = 8 << 30;

    /// An interpreter with no values and the default memory limit.
    pub fn new() -> Interpreter {
        Interpreter::with_max_tensor_bytes(Interpreter::DEFAULT_MAX_TENSOR_BYTES)
    }

    /// An interpreter that refuses any single result larger than `max_tensor_bytes`.
    pub fn with_max_tensor_bytes(max_tensor_bytes: usize) -> Interpreter {
        Interpreter {
            values: HashMap::new(),
            bytes: Residency::default(),
            max_tensor_bytes,
            max_live_bytes: usize::MAX,
            jit: None,
            lazy: HashMap::new(),
        }
    }

    /// The same interpreter running `fused` kernels through the Cranelift JIT (when the host
    /// has a Cranelift backend; otherwise it keeps the oracle and says so in the log).
    pub fn with_jit(mut self) -> Interpreter {
        match Jit::new() {
            Ok(jit) => self.jit = Some(Box::new(jit)),
            Err(e) => tracing::warn!("fused kernels run on the kernel oracle: {e}"),
        }
        self
    }

    /// The limit on one tensor's size, in bytes.
    pub fn max_tensor_bytes(&self) -> usize {
        self.max_tensor_bytes
    }

    /// Refuses (with [`RuntimeError::OutOfMemory`]) any instruction whose results would take
    /// the values held past `bytes`.
    pub fn with_memory_budget(mut self, bytes: usize) -> Interpreter {
        self.max_live_bytes = bytes;
        self
    }

    /// Runs one instruction. On error no value is defined, changed or freed (a transpose it
    /// reads may have been computed: the same value).
    pub fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        self.execute_donating(instr, &[]).map(|_| ())
    }

    /// [`Interpreter::execute`], knowing that the operands in `dying` are freed right after
    /// `instr`: an elementwise `f32` op writes its result over one of them (its storage
    /// becomes the result's) instead of into new memory, and returns it; that value is then
    /// gone, and freeing it is an error. Half the memory traffic of a fresh result where the
    /// data is larger than the cache (an optimizer's `w = w - lr g`), and the same bits.
    pub fn execute_donating(&mut self, instr: &Instr, dying: &[ValueId]) -> Result<Option<ValueId>, RuntimeError> {
        if !self.lazy.is_empty() {
            if let Instr::Free { src } = instr {
                if self.lazy.remove(src).is_some() {
                    return Ok(None);
                }
            }
            if let Some(donor) = self.scaled_update(instr, dying) {
                return Ok(donor);
            }
            self.settle(instr);
        }
        if let Instr::Free { src } = *instr {
            // Nothing to type, check or compute (half of a loop of small ops' instructions).
            return match self.values.remove(&src) {
                Some(gone) => {
                    self.let_go(gone);
                    Ok(None)
                }
                None => Err(RuntimeError::Undefined { op: instr.mnemonic(), value: src }),
            };
        }
        if let Some((dst, src, by)) = self.scalable(instr, dying) {
            if let Some(old) = self.values.remove(&dst) {
                self.let_go(old);
            }
            self.lazy.insert(dst, Pending::Scaled(src, by));
            return Ok(None);
        }
        if dying.is_empty() && self.lazy.is_empty() && self.small_elementwise(instr) {
            return Ok(None);
        }
        let (instr, types) = checks::prepare(instr, &|v| self.type_of(v), self.max_tensor_bytes)?;
        self.admit(&instr, &types)?;
        if let Instr::Transpose { dst, src, .. } = &*instr {
            if self.transposes_last_two(&instr) {
                if let Some(old) = self.values.remove(dst) {
                    self.let_go(old);
                }
                self.lazy.insert(*dst, Pending::Transpose(*src));
                return Ok(None);
            }
        }
        if !dying.is_empty() {
            if let Some(donor) = self.in_place(&instr, &types, dying)? {
                return Ok(Some(donor));
            }
        }
        let results = self.compute(&instr, &types)?;
        for (dst, value) in instr.results().into_iter().zip(results) {
            self.define(dst, value);
        }
        Ok(None)
    }

    /// An elementwise op with an `f32` result over `f32` values stored whole (a unary op, or a
    /// binary one over two values of one shape or a value and a scalar), computed and defined
    /// as the general path would, but typed from the stored operand: [`checks::prepare`]
    /// builds every operand's type and infers from scratch, which for a small tensor costs
    /// more than the op. `false` (nothing done) when it is not such an op or anything would
    /// fail: the general path then runs it and reports the error.
    fn small_elementwise(&mut self, instr: &Instr) -> bool {
        let Some((dst, result)) = self.small_elementwise_result(instr) else { return false };
        self.define(dst, Value::F32(result));
        true
    }

    /// What [`Interpreter::small_elementwise`] defines, computed.
    fn small_elementwise_result(&self, instr: &Instr) -> Option<(ValueId, Tensor)> {
        let f32_value = |v: &ValueId| match self.values.get(v) {
            Some(Value::F32(a)) if a.is_standard_layout() => Some(a),
            _ => None,
        };
        let (dst, result) = match *instr {
            Instr::Unary { dst, op, src } => {
                let a = f32_value(&src)?;
                if op.row().domain.compute(gt_ir::DType::F32)? != gt_ir::DType::F32 || !self.fits(a.len()) {
                    return None;
                }
                (dst, unary(op, a))
            }
            Instr::Binary { dst, op, lhs, rhs } => {
                // Each value looked up once; a scalar as the general path makes it.
                let operand = |o: Operand| match o {
                    Operand::Value(v) => f32_value(&v).map(|a| CowArray::from(a.view())),
                    Operand::Scalar(_) => self.operand(instr.mnemonic(), o).ok(),
                };
                let (x, y) = (operand(lhs)?, operand(rhs)?);
                let (dims, dtype) = match (lhs, rhs) {
                    (Operand::Value(_), Operand::Value(_)) if x.shape() == y.shape() => (x.shape(), gt_ir::DType::F32),
                    (Operand::Value(_), Operand::Scalar(c)) => (x.shape(), gt_ir::DType::F32.promote_scalar(c)),
                    (Operand::Scalar(c), Operand::Value(_)) => (y.shape(), gt_ir::DType::F32.promote_scalar(c)),
                    _ => return None,
                };
                let (_, result) = shape::binary_dtypes(op, dtype).ok()?;
                if result != gt_ir::DType::F32 || !self.fits(dims.iter().product()) {
                    return None;
                }
                (dst, binary(op, &x.view(), &y.view(), dims))
            }
            _ => return None,
        };
        Some((dst, result))
    }

    /// Whether a new `f32` result of `n` elements is within the per-tensor limit and the
    /// memory budget (what [`checks::prepare`] and [`Interpreter::admit`] check).
    fn fits(&self, n: usize) -> bool {
        let bytes = n.saturating_mul(checks::ELEMENT_BYTES);
        bytes <= self.max_tensor_bytes && !self.over_budget(bytes)
    }

    /// A checked elementwise `f32` instruction (a primitive unary or binary op) computed over
    /// the storage of an operand in `dying` that has the result's shape, the result defined
    /// there: that operand, or `None` (nothing done) when no operand can take it. The other
    /// operand must be whole or one element (the loops `binary` runs without strides), and
    /// the donor no source of a pending transpose.
    fn in_place(
        &mut self,
        instr: &Instr,
        types: &[TensorType],
        dying: &[ValueId],
    ) -> Result<Option<ValueId>, RuntimeError> {
        let op = instr.mnemonic();
        let [ty] = types else { return Ok(None) };
        if ty.dtype != gt_ir::DType::F32 || !self.all_f32(instr, types) {
            return Ok(None);
        }
        let dims = ty.shape.dims();
        let donor = |v: ValueId, dst: ValueId| {
            v != dst
                && dying.contains(&v)
                && !self.feeds_pending(v)
                && matches!(self.values.get(&v), Some(Value::F32(a)) if a.shape() == dims && a.is_standard_layout())
        };
        let flat = |o: Operand| self.operand(op, o).is_ok_and(|a| Flat::of(&a.view(), dims).is_some());
        let (donor, plan) = match *instr {
            Instr::Unary { dst, op: unary, src } => match unary.def() {
                OpDef::Prim(p) if donor(src, dst) => (src, InPlace::Unary(p)),
                _ => return Ok(None),
            },
            Instr::Binary { dst, op: binary, lhs, rhs } => {
                let OpDef::Prim(p) = binary.def() else { return Ok(None) };
                match (lhs, rhs) {
                    (Operand::Value(x), Operand::Value(y)) if x == y && donor(x, dst) => (x, InPlace::Same(p)),
                    (Operand::Value(x), other) if donor(x, dst) && flat(other) => (x, InPlace::Lhs(p, other)),
                    (other, Operand::Value(y)) if donor(y, dst) && flat(other) => (y, InPlace::Rhs(p, other)),
                    _ => return Ok(None),
                }
            }
            Instr::Fused { dst, ref srcs, ref kernel, .. } => {
                // A kernel reading the donor once, through the JIT (which checks the rest).
                let once = |v: &ValueId| srcs.iter().filter(|&s| s == v).count() == 1;
                match srcs.iter().position(|&v| once(&v) && donor(v, dst)) {
                    Some(over) if self.jit.is_some() => return self.fused_over(dst, srcs, kernel, over),
                    _ => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let Some(Value::F32(mut a)) = self.values.remove(&donor) else {
            unreachable!("the donor was just found to be a stored f32 value")
        };
        self.bytes.remove(a.len() * std::mem::size_of::<f32>());
        let x = a.as_slice_mut().expect("a standard layout is one slice");
        let computed = match plan {
            InPlace::Unary(p) => {
                match vmath::slice_fn(p) {
                    Some(f) => map_slices_in_place(x, f),
                    None => p.specialize(UnaryInPlace(x)),
                }
                Ok(())
            }
            InPlace::Same(p) => {
                p.specialize(BinaryInPlace(x, Flat::Same, true));
                Ok(())
            }
            InPlace::Lhs(p, other) | InPlace::Rhs(p, other) => self.operand(op, other).map(|b| {
                let b = b.view();
                let flat = Flat::of(&b, dims).expect("found flat above");
                p.specialize(BinaryInPlace(x, flat, matches!(plan, InPlace::Lhs(..))));
            }),
        };
        if let Err(e) = computed {
            // Not reached (the operand was read above); the donor is put back as it was.
            self.bytes.add(a.len() * std::mem::size_of::<f32>());
            self.values.insert(donor, Value::F32(a));
            return Err(e);
        }
        self.define(instr.results()[0], Value::F32(a));
        Ok(Some(donor))
    }

    /// Defines `dst` as `data`, checked as the `literal` instruction it is but moved in rather
    /// than copied: a collective's result, which can be as large as a model's gradients.
    pub fn write(&mut self, dst: ValueId, ty: TensorType, data: Elements) -> Result<(), RuntimeError> {
        let instr = Instr::Literal { dst, ty, data };
        if !self.lazy.is_empty() {
            self.settle(&instr);
        }
        let (_, types) = checks::prepare(&instr, &|v| self.type_of(v), self.max_tensor_bytes)?;
        self.admit(&instr, &types)?;
        let Instr::Literal { dst, ty, data } = instr else { unreachable!("built as a literal above") };
        self.define(dst, Value::from_elements(ty.shape.dims(), data));
        Ok(())
    }

    /// Whether `instr` (checked) swaps the last two axes of a stored `f32` value: what is left
    /// for a product to read in place ([`Interpreter::lazy`]).
    fn transposes_last_two(&self, instr: &Instr) -> bool {
        let Instr::Transpose { dst, src, dim0, dim1 } = instr else { return false };
        // `%x = transpose %x` replaces its own source: computed at once.
        let Some(Value::F32(a)) = self.values.get(src).filter(|_| dst != src) else { return false };
        let rank = a.ndim();
        let axes = (shape::normalize_axis(*dim0, rank), shape::normalize_axis(*dim1, rank));
        rank >= 2 && matches!(axes, (Ok(x), Ok(y)) if x.min(y) == rank - 2 && x.max(y) == rank - 1)
    }

    /// Before `instr` runs: computes the pending transposes it reads (a product reads them in
    /// place) and those whose source it frees or redefines, and forgets those it redefines.
    fn settle(&mut self, instr: &Instr) {
        // A product of `f32` values reads them in place (`compute_f32`); one of mixed dtypes
        // reads stored values.
        let transpose = |v: &ValueId| matches!(self.lazy.get(v), Some(Pending::Transpose(_)));
        let f32_operand = |v: &ValueId| transpose(v) || matches!(self.values.get(v), Some(Value::F32(_)));
        let product = matches!(instr, Instr::MatMul { .. }) && instr.operands().iter().all(f32_operand);
        let mut written = instr.results();
        if let Instr::Free { src } = instr {
            written.push(*src);
        }
        let mut due: Vec<ValueId> = Vec::new();
        let read_in_place = |v: &ValueId| product && transpose(v);
        due.extend(instr.operands().iter().copied().filter(|v| self.lazy.contains_key(v) && !read_in_place(v)));
        due.extend(self.lazy.iter().filter(|(_, p)| written.contains(&p.source())).map(|(&v, _)| v));
        for v in due {
            if let Some(value) = self.pending_value(v) {
                self.lazy.remove(&v);
                self.define(v, value);
            }
        }
        for w in &written {
            self.lazy.remove(w);
        }
    }

    /// A pending value, computed.
    fn pending_value(&self, v: ValueId) -> Option<Value> {
        let pending = *self.lazy.get(&v)?;
        let src = self.values.get(&pending.source())?;
        match pending {
            Pending::Transpose(_) => {
                let rank = src.ndim();
                if rank < 2 {
                    return None;
                }
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(rank - 2, rank - 1);
                Some(src.permuted(&perm))
            }
            Pending::Scaled(_, by) => {
                let Value::F32(a) = src else { return None };
                let x = a.as_slice()?;
                let product = threads::written(x.len(), |at, out| wide_map_into(&x[at..], out, move |x| x * by));
                Some(Value::F32(from_vec(a.shape(), product)))
            }
        }
    }

    /// Whether a pending value reads `v`.
    fn feeds_pending(&self, v: ValueId) -> bool {
        self.lazy.values().any(|p| p.source() == v)
    }

    /// A `mul` of a stored `f32` value by a scalar, large enough to leave pending
    /// ([`Pending::Scaled`]): its result, source and factor. Not when the source dies with
    /// it (then it is computed over the source, in place).
    fn scalable(&self, instr: &Instr, dying: &[ValueId]) -> Option<(ValueId, ValueId, f32)> {
        let Instr::Binary { dst, op: BinaryOp::Mul, lhs, rhs } = *instr else { return None };
        let (src, c) = match (lhs, rhs) {
            (Operand::Value(v), Operand::Scalar(c)) | (Operand::Scalar(c), Operand::Value(v)) => (v, c),
            _ => return None,
        };
        if src == dst || dying.contains(&src) || gt_ir::DType::F32.promote_scalar(c) != gt_ir::DType::F32 {
            return None;
        }
        match self.values.get(&src) {
            Some(Value::F32(a)) if a.len() >= SCALED_MIN_ELEMENTS && a.is_standard_layout() && self.fits(a.len()) => {
                Some((dst, src, c as f32))
            }
            _ => None,
        }
    }

    /// `w - t`, `w + t` or `t + w` with `t` a pending scaled value `g * c` and `w` a stored
    /// `f32` value of its shape, computed in one pass as `w - g * c` (the same bits as the two
    /// ops: the product is rounded, then subtracted). Over `w`'s storage when it dies with the
    /// op (as [`Interpreter::in_place`]); `Some(donor)` then, `Some(None)` for a new result,
    /// `None` (nothing done) when it is not such an op.
    fn scaled_update(&mut self, instr: &Instr, dying: &[ValueId]) -> Option<Option<ValueId>> {
        let Instr::Binary { dst, op, lhs: Operand::Value(x), rhs: Operand::Value(y) } = *instr else { return None };
        let sub = match op {
            BinaryOp::Sub => true,
            BinaryOp::Add => false,
            _ => return None,
        };
        let scaled = |v: ValueId| match self.lazy.get(&v) {
            Some(&Pending::Scaled(g, c)) => Some((g, c)),
            _ => None,
        };
        let (w, (g, c)) = match (scaled(x), scaled(y)) {
            (None, Some(t)) => (x, t),
            (Some(t), None) if !sub => (y, t),
            _ => return None,
        };
        let whole = |v: ValueId| match self.values.get(&v) {
            Some(Value::F32(a)) if a.is_standard_layout() => Some(a),
            _ => None,
        };
        let (wa, ga) = (whole(w)?, whole(g)?);
        // The result must not redefine what a pending value reads.
        if wa.shape() != ga.shape() || self.feeds_pending(dst) {
            return None;
        }
        let n = wa.len();
        if dying.contains(&w) && w != dst && !self.feeds_pending(w) {
            let Some(Value::F32(mut a)) = self.values.remove(&w) else {
                unreachable!("the donor was just found to be a stored f32 value")
            };
            self.bytes.remove(n * std::mem::size_of::<f32>());
            let gs = self.values.get(&g).and_then(|g| g.as_f32()).and_then(|g| g.as_slice());
            let (Some(gs), Some(ws)) = (gs, a.as_slice_mut()) else { unreachable!("both were found whole above") };
            match sub {
                true => threads::rewritten(ws, |at, w| wide_rewrite_with(w, &gs[at..], move |w, g| w - g * c)),
                false => threads::rewritten(ws, |at, w| wide_rewrite_with(w, &gs[at..], move |w, g| w + g * c)),
            }
            self.lazy.remove(&dst);
            self.define(dst, Value::F32(a));
            return Some(Some(w));
        }
        if !self.fits(n) {
            return None;
        }
        let (ws, gs) = (wa.as_slice()?, ga.as_slice()?);
        let out = match sub {
            true => threads::written(n, |at, out| wide_zip_into(&ws[at..], &gs[at..], out, move |w, g| w - g * c)),
            false => threads::written(n, |at, out| wide_zip_into(&ws[at..], &gs[at..], out, move |w, g| w + g * c)),
        };
        let result = from_vec(wa.shape(), out);
        self.lazy.remove(&dst);
        self.define(dst, Value::F32(result));
        Some(None)
    }

    /// An `f32` operand of a product: a stored value, or a pending transpose's source seen
    /// through swapped strides.
    fn product_operand(&self, op: &'static str, v: ValueId) -> Result<ArrayViewD<'_, f32>, RuntimeError> {
        match self.lazy.get(&v) {
            Some(&Pending::Transpose(src)) => {
                let mut view = self.get_f32(op, src)?.view();
                let rank = view.ndim();
                if rank >= 2 {
                    view.swap_axes(rank - 2, rank - 1);
                }
                Ok(view)
            }
            _ => Ok(self.get_f32(op, v)?.view()),
        }
    }

    /// Refuses an instruction whose results would take the live values past the budget.
    fn admit(&self, instr: &Instr, types: &[TensorType]) -> Result<(), RuntimeError> {
        let needed = types.iter().fold(0usize, |n, t| n.saturating_add(t.size_bytes()));
        if self.over_budget(needed) {
            let (op, live, limit) = (instr.mnemonic(), self.bytes.live(), self.max_live_bytes);
            return Err(RuntimeError::OutOfMemory { op, needed, live, limit });
        }
        Ok(())
    }

    /// Whether `needed` more bytes would take the values held past the memory budget.
    fn over_budget(&self, needed: usize) -> bool {
        needed > 0 && self.bytes.live().saturating_add(needed) > self.max_live_bytes
    }

    /// Stores a result (row-major), replacing what `dst` held.
    fn define(&mut self, dst: ValueId, value: Value) {
        self.bytes.add(value.bytes());
        let value = value::map_value!(value, a => standard(a));
        if let Some(old) = self.values.insert(dst, value) {
            self.let_go(old);
        }
    }

    /// Lets go of a value no longer held: its bytes leave the count, and a small result's
    /// buffer is kept for the next one (`spare`).
    fn let_go(&mut self, value: Value) {
        self.bytes.remove(value.bytes());
        super::spare::give(value);
    }

    /// A value's type and row-major data.
    pub fn read(&self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        let a = self.readable(value)?;
        Ok(HostTensor::new(TensorType::new(a.dtype(), a.shape().to_vec()), a.to_elements()))
    }

    /// A stored value's type and row-major little-endian bytes, handed to `f` where they lie;
    /// `false` (nothing done) for a pending value, a `bool` one, or on a big-endian host.
    pub fn with_bytes(&self, value: ValueId, f: &mut dyn FnMut(TensorType, &[u8])) -> bool {
        let Some(v) = self.values.get(&value).filter(|_| cfg!(target_endian = "little")) else { return false };
        let bytes: Option<&[u8]> = match v {
            Value::F64(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::F32(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::F16(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::BF16(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::I64(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::I32(a) => a.as_slice().map(bytemuck::cast_slice),
            Value::Bool(_) => None,
        };
        let Some(bytes) = bytes else { return false };
        f(TensorType::new(v.dtype(), v.shape().to_vec()), bytes);
        true
    }

    /// A value's type and row-major data, and the value freed: a read and a `free`, with its
    /// buffer moved out rather than copied when it is stored whole (a collective's operand
    /// that dies with it, which can be a model's gradients).
    pub fn take(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        let pending = self.lazy.contains_key(&value) || self.feeds_pending(value);
        if pending {
            // A pending transpose, or the source one still reads: copied, then freed as usual.
            let data = self.read(value)?;
            self.execute(&Instr::Free { src: value })?;
            return Ok(data);
        }
        let gone = self.values.remove(&value).ok_or(RuntimeError::Undefined { op: "get", value })?;
        self.bytes.remove(gone.bytes());
        let ty = TensorType::new(gone.dtype(), gone.shape().to_vec());
        Ok(HostTensor::new(ty, gone.into_elements()))
    }

    /// A value to read out: stored, or a pending transpose computed for the read.
    fn readable(&self, value: ValueId) -> Result<std::borrow::Cow<'_, Value>, RuntimeError> {
        match self.pending_value(value) {
            Some(v) => Ok(std::borrow::Cow::Owned(v)),
            None => self.get("get", value).map(std::borrow::Cow::Borrowed),
        }
    }

    /// How many values are defined and not freed.
    pub fn live_values(&self) -> usize {
        self.values.len() + self.lazy.len()
    }

    /// The bytes of data the live values hold.
    pub fn live_bytes(&self) -> usize {
        self.bytes.live()
    }

    /// The most bytes the live values held at once.
    pub fn peak_bytes(&self) -> usize {
        self.bytes.peak()
    }

    fn get(&self, op: &'static str, value: ValueId) -> Result<&Value, RuntimeError> {
        self.values.get(&value).ok_or(RuntimeError::Undefined { op, value })
    }

    /// An `f32` operand (of a `fused` kernel, or of an all-`f32` instruction).
    fn get_f32(&self, op: &'static str, value: ValueId) -> Result<&Tensor, RuntimeError> {
        f32_value(&self.values, op, value)
    }

    fn type_of(&self, value: ValueId) -> Result<TensorType, TypeError> {
        match self.lazy.get(&value).map(|&p| (p, self.values.get(&p.source()))) {
            Some((Pending::Transpose(_), Some(src))) if src.ndim() >= 2 => {
                let mut dims = src.shape().to_vec();
                let rank = dims.len();
                dims.swap(rank - 2, rank - 1);
                return Ok(TensorType::new(src.dtype(), dims));
            }
            Some((Pending::Scaled(..), Some(src))) => return Ok(TensorType::new(gt_ir::DType::F32, src.shape())),
            _ => {}
        }
        self.values.get(&value).map(|a| TensorType::new(a.dtype(), a.shape())).ok_or(TypeError::UnknownValue(value))
    }

    /// An `f32` tensor operand; a scalar acts as a 0-d tensor.
    fn operand(&self, op: &'static str, operand: Operand) -> Result<CowArray<'_, f32, IxDyn>, RuntimeError> {
        Ok(match operand {
            Operand::Value(v) => CowArray::from(self.get_f32(op, v)?.view()),
            Operand::Scalar(s) => CowArray::from(Tensor::from_elem(IxDyn(&[]), s as f32)),
        })
    }

    /// An operand of any dtype; a scalar is a 0-d `f64` (cast to the compute dtype by the op).
    fn operand_value(&self, op: &'static str, operand: Operand) -> Result<std::borrow::Cow<'_, Value>, RuntimeError> {
        Ok(match operand {
            Operand::Value(v) => std::borrow::Cow::Borrowed(self.get(op, v)?),
            Operand::Scalar(s) => std::borrow::Cow::Owned(Value::full(gt_ir::DType::F64, &[], s)),
        })
    }

    /// Refuses a map `kernel` the oracle cannot run within the budget: it holds every node
    /// over the whole iteration space (`element` bytes each), which would otherwise abort the
    /// worker on a failed allocation.
    fn oracle_fits(&self, op: &'static str, kernel: &Kernel, element: usize) -> Result<(), RuntimeError> {
        let Kernel::Map(k) = kernel else { return Ok(()) };
        let needed = k.numel().saturating_mul(element).saturating_mul(k.nodes.len() + 1);
        if self.over_budget(needed) {
            let (live, limit) = (self.bytes.live(), self.max_live_bytes);
            return Err(RuntimeError::OutOfMemory { op, needed, live, limit });
        }
        Ok(())
    }

    /// Whether every operand of `instr` and every result is `f32`: the fast paths.
    fn all_f32(&self, instr: &Instr, types: &[TensorType]) -> bool {
        types.iter().all(|t| t.dtype == gt_ir::DType::F32)
            && instr.operands().iter().all(|v| self.values.get(v).is_none_or(|a| a.dtype() == gt_ir::DType::F32))
    }

    /// A `fused` kernel's result (typed `ty`): run by the JIT when there is one, else
    /// evaluated by the kernel oracle. Kernels compute in `f32` (as on the GPU): halves are
    /// widened as read and the result rounded as written, so a fused chain of halves rounds
    /// once, at its end.
    fn fused(&mut self, srcs: &[ValueId], kernel: &Kernel, ty: &TensorType) -> Result<Value, RuntimeError> {
        let op = "fused";
        let values = &self.values;
        let operands = srcs
            .iter()
            .map(|&value| values.get(&value).ok_or(RuntimeError::Undefined { op, value }))
            .collect::<Result<Vec<_>, RuntimeError>>()?;
        let dims = ty.shape.dims();
        if !is_f32_jit_kernel(kernel) {
            // `f64` and integer maps: compiled where the JIT takes them (the fuse pass's),
            // else (and `f32` kernels with `round` nodes, written by hand) run by the oracle.
            if let Some(jit) = &mut self.jit {
                let inputs: Option<Vec<Wide>> = operands.iter().map(|v| v.wide()).collect();
                if let Some(inputs) = inputs {
                    let (output, n) = (Storage::of(ty.dtype), ty.shape.numel());
                    let compiled = jit.run_wide(kernel, &inputs, output, n).map_err(|e| jit_failure(op, e))?;
                    if let Some((data, took)) = compiled {
                        log_compile(jit, kernel, dims, took);
                        return Ok(Value::from_elements(dims, data));
                    }
                }
            }
            self.oracle_fits(op, kernel, 8)?;
            let mut out = Value::full(ty.dtype, dims, 0.0);
            super::kernels::run_values(kernel, &operands, &mut out).map_err(|e| super::kernels::failed(op, e))?;
            return Ok(out);
        }
        if self.jit.is_none() {
            self.oracle_fits(op, kernel, 4)?;
        }
        let Some(jit) = &mut self.jit else {
            let widened: Vec<_> = operands.iter().map(|v| v.f32()).collect();
            let inputs: Vec<&[f32]> = widened.iter().map(|t| t.as_slice().unwrap_or(&[])).collect();
            let mut out = Tensor::zeros(dims);
            let slice = out.as_slice_mut().unwrap_or(&mut []);
            super::kernels::run(kernel, &inputs, slice).map_err(|e| super::kernels::failed(op, e))?;
            return Ok(Value::F32(out).into_dtype(ty.dtype));
        };
        let not_stored = |dtype| RuntimeError::Type { op, source: TypeError::kernel_dtype(dtype, Compute::F32) };
        let inputs = operands.iter().map(|v| v.stored().ok_or(not_stored(v.dtype()))).collect::<Result<Vec<_>, _>>()?;
        let failed = |e| jit_failure(op, e);
        let (out, took) = if ty.dtype == gt_ir::DType::F32 {
            // Written by the kernel without zeros first (`run_uninit`).
            let n = ty.shape.numel();
            let mut data = Vec::with_capacity(n);
            let took = jit.run_uninit(kernel, &inputs, &mut data.spare_capacity_mut()[..n]).map_err(failed)?;
            // SAFETY: `run_uninit` returned `Ok`, so it wrote each of the first `n` elements.
            #[allow(unsafe_code)]
            unsafe {
                data.set_len(n)
            };
            (Value::F32(from_vec(dims, data)), took)
        } else {
            let mut out = Value::full(ty.dtype, dims, 0.0);
            let took =
                jit.run_stored(kernel, &inputs, out.stored_mut().ok_or(not_stored(ty.dtype))?).map_err(failed)?;
            (out, took)
        };
        log_compile(jit, kernel, dims, took);
        Ok(out)
    }

    /// A `fused` kernel run by the JIT over its operand `srcs[over]` (an `f32` value of the
    /// result's shape that dies with it: [`Interpreter::in_place`]), the result defined there:
    /// that operand, or `None` (nothing done) when the JIT cannot ([`Jit::run_over`]).
    fn fused_over(
        &mut self,
        dst: ValueId,
        srcs: &[ValueId],
        kernel: &Kernel,
        over: usize,
    ) -> Result<Option<ValueId>, RuntimeError> {
        let op = "fused";
        if !is_f32_jit_kernel(kernel) {
            return Ok(None);
        }
        let donor = srcs[over];
        let Some(Value::F32(mut a)) = self.values.remove(&donor) else { return Ok(None) };
        let ran = {
            let values = &self.values;
            let inputs = srcs
                .iter()
                .enumerate()
                .map(|(i, &v)| match values.get(&v) {
                    _ if i == over => Ok(&[][..]),
                    Some(Value::F32(t)) => Ok(t.as_slice().unwrap_or(&[])),
                    _ => Err(RuntimeError::Undefined { op, value: v }),
                })
                .collect::<Result<Vec<&[f32]>, RuntimeError>>();
            match (inputs, &mut self.jit, a.as_slice_mut()) {
                (Ok(inputs), Some(jit), Some(data)) => jit.run_over(kernel, &inputs, over, data).map_err(|e| match e {
                    JitError::Invalid(source) | JitError::Bounds(source) => RuntimeError::Kernel { op, source },
                    e => RuntimeError::Jit { op, source: JitFailure(Arc::new(e)) },
                }),
                (Err(e), ..) => Err(e),
                _ => Ok(None),
            }
        };
        match ran {
            Ok(Some(_)) => {
                self.bytes.remove(a.len() * std::mem::size_of::<f32>());
                self.define(dst, Value::F32(a));
                Ok(Some(donor))
            }
            other => {
                // Not run (or refused before writing): the donor is put back as it was.
                self.values.insert(donor, Value::F32(a));
                other.map(|_| None)
            }
        }
    }

    /// A collective's results, every participant's operand being here: the operands folded
    /// left to right (a mean divides the sum by their count), joined, or copied.
    fn collective(
        &self,
        collective: CollectiveOp,
        srcs: &[ValueId],
        types: &[TensorType],
    ) -> Result<Vec<Value>, RuntimeError> {
        let op = collective.mnemonic();
        let type_error = |source| RuntimeError::Type { op, source };
        let fold = |reduce: ReduceOp| -> Result<Value, RuntimeError> {
            let first = self.get(op, srcs[0])?;
            let (dims, dtype) = (first.shape().to_vec(), first.dtype());
            let combine = match reduce {
                ReduceOp::Max => BinaryOp::Maximum,
                ReduceOp::Min => BinaryOp::Minimum,
                ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
            };
            // The result keeps the operands' dtype (integers wrap, a bool sum is an `or`);
            // the type rule refused means of integers. Halves fold in f64 and round once, as
            // the workers' transport folds them (`exchange::fold`), not after every add.
            shape::reduce_dtype(reduce, op, dtype).map_err(type_error)?;
            let compute = match dtype {
                d if d.is_half() => gt_ir::DType::F64,
                d if d.is_float() => d,
                _ => gt_ir::DType::I64,
            };
            let mut acc = first.cast(compute);
            for &v in &srcs[1..] {
                acc = value::binary(combine, &acc, self.get(op, v)?, &dims, compute, compute);
            }
            if reduce == ReduceOp::Mean {
                let count = Value::full(compute, &[], srcs.len() as f64);
                acc = value::binary(BinaryOp::Div, &acc, &count, &dims, compute, compute);
            }
            Ok(acc.into_dtype(dtype))
        };
        Ok(match collective {
            CollectiveOp::Broadcast | CollectiveOp::Move => vec![self.get(op, srcs[0])?.clone(); types.len()],
            CollectiveOp::AllReduce(reduce) => vec![fold(reduce)?; types.len()],
            CollectiveOp::AllGather { axis } => {
                let values = srcs.iter().map(|&v| self.get(op, v)).collect::<Result<Vec<_>, RuntimeError>>()?;
                let rank = values.first().map_or(0, |v| v.ndim());
                let axis = shape::normalize_axis(axis, rank).map_err(type_error)?;
                let dims = types.first().map_or(&[][..], |t| t.shape.dims());
                vec![value::concat(&values, axis, dims); types.len()]
            }
            CollectiveOp::ReduceScatter { op: reduce, axis } => {
                let whole = fold(reduce)?;
                let axis = shape::normalize_axis(axis, whole.ndim()).map_err(type_error)?;
                whole.split(axis, &types.iter().map(|t| t.shape.dims()[axis]).collect::<Vec<_>>())
            }
        })
    }

    /// Computes the results of an instruction whose result `types` the type rule gave:
    /// all-`f32` work on the `f32` functions here, the rest through `value.rs`.
    fn compute(&mut self, instr: &Instr, types: &[TensorType]) -> Result<Results, RuntimeError> {
        if self.all_f32(instr, types) {
            if let Some(t) = self.compute_f32(instr, types)? {
                return Ok(smallvec::smallvec![Value::F32(t)]);
            }
        }
        let op = instr.mnemonic();
        let type_error = |source| RuntimeError::Type { op, source };
        let dims = || types.first().map_or(&[][..], |t| t.shape.dims());
        let dtype = types.first().map_or(gt_ir::DType::F32, |t| t.dtype);
        let ty = |v: ValueId| self.type_of(v);
        let result = match instr {
            Instr::Randn { seed, .. } => Value::F32(random_tensor(dims(), RandomKind::Normal, *seed)).into_dtype(dtype),
            Instr::Rand { seed, .. } => Value::F32(random_tensor(dims(), RandomKind::Uniform, *seed)).into_dtype(dtype),
            Instr::Zeros { .. } => Value::full(dtype, dims(), 0.0),
            Instr::Ones { .. } => Value::full(dtype, dims(), 1.0),
            Instr::Full { value, .. } => Value::full(dtype, dims(), *value),
            Instr::Arange { start, step, .. } => {
                let n = dims().first().copied().unwrap_or(0);
                let values: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
                Value::from_elements(dims(), gt_ir::data::Elements::F64(values)).into_dtype(dtype)
            }
            Instr::Literal { data, .. } => Value::from_elements(dims(), data.clone()),
            Instr::Cast { src, .. } => self.get(op, *src)?.cast(dtype),
            Instr::Unary { op: unary_op, src, .. } => value::unary(*unary_op, self.get(op, *src)?, dtype),
            Instr::Binary { op: binary_op, lhs, rhs, .. } => {
                let promoted = shape::elementwise(&[*lhs, *rhs], &ty).map_err(type_error)?.dtype;
                let (compute, result) = shape::binary_dtypes(*binary_op, promoted).map_err(type_error)?;
                let (a, b) = (self.operand_value(op, *lhs)?, self.operand_value(op, *rhs)?);
                // A half's `mul`/`div` by a scalar keeps it in `f32` (`binary_scalar`): the
                // op computes in `f32` (as halves do) over the half operand, rounded once.
                let in_f32 = |o: &Operand, rhs| {
                    matches!(o, Operand::Scalar(_)) && gt_ir::data::scalar_in_f32(*binary_op, compute, rhs)
                };
                if in_f32(lhs, false) || in_f32(rhs, true) {
                    let f32 = gt_ir::DType::F32;
                    let widened =
                        |v: &Value| if v.dtype() == gt_ir::DType::F64 { v.cast(f32) } else { v.to(compute).cast(f32) };
                    value::binary(*binary_op, &widened(&a), &widened(&b), dims(), f32, f32).into_dtype(result)
                } else {
                    value::binary(*binary_op, &a, &b, dims(), compute, result)
                }
            }
            Instr::Where { cond, on_true, on_false, .. } => {
                let (t, f) = (self.operand_value(op, *on_true)?, self.operand_value(op, *on_false)?);
                value::select(self.get(op, *cond)?, &t, &f, dims(), dtype)
            }
            Instr::MatMul { lhs, rhs, .. } => {
                value::matmul(self.get(op, *lhs)?, self.get(op, *rhs)?, dims(), dtype).map_err(type_error)?
            }
            Instr::Reduce { op: reduce_op, src, axes, .. } => {
                let a = self.get(op, *src)?;
                let axes = match axes {
                    Some(axes) => shape::normalize_axes(axes, a.ndim()).map_err(type_error)?,
                    None => (0..a.ndim()).collect(),
                };
                value::reduce(*reduce_op, a, &axes, dims(), dtype)
            }
            Instr::Transpose { src, dim0, dim1, .. } => {
                let a = self.get(op, *src)?;
                let mut perm: Vec<usize> = (0..a.ndim()).collect();
                perm.swap(
                    shape::normalize_axis(*dim0, a.ndim()).map_err(type_error)?,
                    shape::normalize_axis(*dim1, a.ndim()).map_err(type_error)?,
                );
                a.permuted(&perm)
            }
            Instr::Permute { src, perm, .. } => {
                let a = self.get(op, *src)?;
                let perm = perm
                    .iter()
                    .map(|&p| shape::normalize_axis(p, a.ndim()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(type_error)?;
                a.permuted(&perm)
            }
            Instr::Reshape { src, .. } | Instr::Squeeze { src, .. } | Instr::Unsqueeze { src, .. } => {
                self.get(op, *src)?.reshaped(dims())
            }
            Instr::BroadcastTo { src, .. } => self.get(op, *src)?.broadcast_to(dims()),
            Instr::Concat { srcs, axis, .. } => {
                let values = srcs.iter().map(|&v| self.get(op, v)).collect::<Result<Vec<_>, RuntimeError>>()?;
                let rank = values.first().map_or(0, |v| v.ndim());
                value::concat(&values, shape::normalize_axis(*axis, rank).map_err(type_error)?, dims())
            }
            Instr::Slice { src, index, .. } => {
                let a = self.get(op, *src)?;
                let resolved = shape::resolve_slice(index, &Shape::from(a.shape())).map_err(type_error)?;
                a.sliced(&slice_axes(&resolved), resolved.shape.dims())
            }
            Instr::Split { src, axis, .. } => {
                let a = self.get(op, *src)?;
                let axis = shape::normalize_axis(*axis, a.ndim()).map_err(type_error)?;
                return Ok(a.split(axis, &types.iter().map(|t| t.shape.dims()[axis]).collect::<Vec<_>>()).into());
            }
            Instr::Fused { srcs, kernel, ty, .. } => self.fused(srcs, kernel, ty)?,
            Instr::Collective { op: collective, srcs, .. } => {
                return self.collective(*collective, srcs, types).map(Results::from_vec)
            }
            Instr::Free { .. }
            | Instr::GetData { .. }
            | Instr::HotPathStart { .. }
            | Instr::HotPathEnd { .. }
            | Instr::SignalStart { .. }
            | Instr::SignalEnd { .. } => return Ok(Results::new()),
        };
        Ok(smallvec::smallvec![result])
    }

    /// [`Interpreter::compute`] of an instruction whose operands and results are all `f32`,
    /// for the ops whose `f32` functions are faster (threaded, the JIT's, sgemm); `None` for
    /// the others, which move data the same way in every dtype.
    fn compute_f32(&mut self, instr: &Instr, types: &[TensorType]) -> Result<Option<Tensor>, RuntimeError> {
        let op = instr.mnemonic();
        let type_error = |source| RuntimeError::Type { op, source };
        let dims = || types.first().map_or(&[][..], |t| t.shape.dims());
        Ok(Some(match instr {
            Instr::Randn { seed, .. } => random_tensor(dims(), RandomKind::Normal, *seed),
            Instr::Rand { seed, .. } => random_tensor(dims(), RandomKind::Uniform, *seed),
            Instr::Zeros { .. } => Tensor::zeros(dims()),
            Instr::Ones { .. } => Tensor::ones(dims()),
            Instr::Full { value, .. } => Tensor::from_elem(dims(), *value as f32),
            Instr::Arange { start, step, .. } => arange(*start, *step, dims()),
            Instr::Unary { op: unary_op, src, .. } => unary(*unary_op, self.get_f32(op, *src)?),
            Instr::Binary { op: binary_op, lhs, rhs, .. } => {
                binary(*binary_op, &self.operand(op, *lhs)?.view(), &self.operand(op, *rhs)?.view(), dims())
            }
            Instr::MatMul { lhs, rhs, .. } => {
                matmul(self.product_operand(op, *lhs)?, self.product_operand(op, *rhs)?, dims()).map_err(type_error)?
            }
            Instr::Reduce { op: reduce_op, src, axes, .. } => {
                let a = self.get_f32(op, *src)?;
                let axes = match axes {
                    Some(axes) => shape::normalize_axes(axes, a.ndim()).map_err(type_error)?,
                    None => (0..a.ndim()).collect(),
                };
                reduce(*reduce_op, a, &axes, dims())
            }
            _ => return Ok(None),
        }))
    }
}

impl Default for Interpreter {
    fn default() -> Interpreter {
        Interpreter::new()
    }
}

impl fmt::Debug for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The values themselves can be gigabytes; show the bookkeeping only.
        f.debug_struct("Interpreter")
            .field("live_values", &self.live_values())
            .field("live_bytes", &self.live_bytes())
            .field("max_tensor_bytes", &self.max_tensor_bytes)
            .field("jit", &self.jit)
            .finish()
    }
}

impl Executor for Interpreter {
    type Error = RuntimeError;

    fn error_kind(error: &RuntimeError) -> gt_ir::FailureKind {
        error.kind()
    }

    fn execute(&mut self, instr: &Instr) -> Result<(), RuntimeError> {
        Interpreter::execute(self, instr)
    }

    fn read(&mut self, value: ValueId) -> Result<HostTensor, RuntimeError> {
        Interpreter::read(self, value)
    }
}

/// An instruction's results: inline for the one result of almost every instruction, so a
/// small op's only allocation is its data.
type Results = smallvec::SmallVec<[Value; 1]>;

/// Value `value` of `values` as `f32` (a borrow of the map alone, so that `fused` can hold
/// its inputs while it uses the JIT).
fn f32_value<'a>(
    values: &'a HashMap<ValueId, Value>,
    op: &'static str,
    value: ValueId,
) -> Result<&'a Tensor, RuntimeError> {
    let v = values.get(&value).ok_or(RuntimeError::Undefined { op, value })?;
    v.as_f32().ok_or(RuntimeError::Type { op, source: TypeError::kernel_dtype(v.dtype(), Compute::F32) })
}

/// `a` itself when row-major contiguous, else a row-major copy.
fn standard<T: Clone>(a: ArrayD<T>) -> ArrayD<T> {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

/// A tensor from row-major data whose length the type rule already checked.
pub(crate) fn from_vec(dims: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from_shape_vec(dims, data).expect("the type rule fixed the element count")
}

/// `a` stretched to `dims` (a view with zero strides on broadcast axes).
fn broadcast<'a>(a: &'a ArrayViewD<'_, f32>, dims: &[usize]) -> ArrayViewD<'a, f32> {
    a.broadcast(dims).expect("the type rule checked the shapes broadcast")
}

/// A `randn` or `rand` tensor: `gt_ir::random`'s elements, filled in vector loops over the
/// worker's threads (each element depends on its index alone).
fn random_tensor(dims: &[usize], kind: RandomKind, seed: u64) -> Tensor {
    let n = dims.iter().product::<usize>();
    from_vec(dims, threads::written(n, |at, out| vmath::random_into(kind, seed, at as u64, out)))
}

fn arange(start: f64, step: f64, dims: &[usize]) -> Tensor {
    // Each element is computed from its index in f64 (no accumulated rounding), then cast.
    let n = dims.first().copied().unwrap_or(0);
    from_vec(dims, (0..n).map(|i| (start + i as f64 * step) as f32).collect())
}

pub(crate) fn unary(op: UnaryOp, a: &Tensor) -> Tensor {
    struct Map<'a>(&'a Tensor);
    impl UnaryKernel<Tensor> for Map<'_> {
        fn call<F: Fn(f32) -> f32 + Copy + Send + Sync>(self, f: F) -> Tensor {
            let a = self.0;
            match a.as_slice() {
                Some(x) => from_vec(a.shape(), threads::written(x.len(), |at, out| wide_map_into(&x[at..], out, f))),
                None => threads::elementwise(a.len(), || Zip::from(a).par_map_collect(|&x| f(x)), || a.mapv(f)),
            }
        }
    }
    match op.def() {
        OpDef::Prim(p) => match vmath::slice_fn(p) {
            Some(f) => map_slices(a, f),
            // One monomorphised loop per op: the match is outside the element loop.
            None => p.specialize(Map(a)),
        },
        OpDef::Composite(t) => composite(t, &[a.view()], a.shape()),
    }
}

/// `f` over `a`'s elements in row-major order, split in stretches over the team when large.
fn map_slices(a: &Tensor, f: vmath::SliceFn) -> Tensor {
    let a = a.as_standard_layout();
    let x = a.as_slice().expect("a standard layout is one slice");
    from_vec(a.shape(), threads::filled(x.len(), |at, out| f(&x[at..at + out.len()], out)))
}

/// `out[i] = f(x[i])` for each element of `out` (`x` at least as long), in the host's widest
/// vectors (`vmath::wide`: the same bits at any width; 1.7x SSE's speed on data in cache).
fn wide_map_into(x: &[f32], out: &mut [MaybeUninit<f32>], f: impl Fn(f32) -> f32) {
    // Everything moved into the body, so that the loop keeps what `f` captured in registers
    // (read through the caller's frame, it is reloaded at every element: stores to `out`
    // could reach it, for all the compiler knows).
    vmath::wide(move || {
        let (x, out, f) = (x, out, f);
        for (o, &x) in out.iter_mut().zip(x) {
            o.write(f(x));
        }
    })
}

/// `out[i] = f(x[i], y[i])` for each element of `out` (`x` and `y` at least as long), in the
/// host's widest vectors (see [`wide_map_into`]).
fn wide_zip_into(x: &[f32], y: &[f32], out: &mut [MaybeUninit<f32>], f: impl Fn(f32, f32) -> f32) {
    vmath::wide(move || {
        let (x, y, out, f) = (x, y, out, f);
        for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
            o.write(f(x, y));
        }
    })
}

pub(crate) fn binary(op: BinaryOp, a: &ArrayViewD<'_, f32>, b: &ArrayViewD<'_, f32>, dims: &[usize]) -> Tensor {
    struct Zipped<'a, 'b, 'c>(&'a ArrayViewD<'b, f32>, &'a ArrayViewD<'c, f32>, &'a [usize]);
    impl BinaryKernel<Tensor> for Zipped<'_, '_, '_> {
        fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) -> Tensor {
            let Zipped(a, b, dims) = self;
            let zip = || Zip::from(broadcast(a, dims)).and(broadcast(b, dims));
            let n = dims.iter().product();
            match (Flat::of(a, dims), Flat::of(b, dims)) {
                // Plain loops over slices, which the compiler vectorizes (`Zip` walks
                // dynamic-rank arrays row by row with strides).
                (Some(Flat::Whole(x)), Some(Flat::Whole(y))) => {
                    from_vec(dims, threads::written(n, |at, out| wide_zip_into(&x[at..], &y[at..], out, f)))
                }
                (Some(Flat::Whole(x)), Some(Flat::One(y))) => {
                    from_vec(dims, threads::written(n, |at, out| wide_map_into(&x[at..], out, move |x| f(x, y))))
                }
                (Some(Flat::One(x)), Some(Flat::Whole(y))) => {
                    from_vec(dims, threads::written(n, |at, out| wide_map_into(&y[at..], out, move |y| f(x, y))))
                }
                (flat_a, flat_b) => {
                    // One whole, the other repeated along leading or trailing axes.
                    let repeated = match (flat_a, flat_b) {
                        (Some(Flat::Whole(x)), None) => Repeat::of(b, dims).map(|r| (r, x, true)),
                        (None, Some(Flat::Whole(y))) => Repeat::of(a, dims).map(|r| (r, y, false)),
                        _ => None,
                    };
                    match repeated {
                        Some((repeat, x, true)) => {
                            from_vec(dims, threads::written(n, |at, out| repeat.write(&x[at..], at, out, f)))
                        }
                        Some((repeat, y, false)) => from_vec(
                            dims,
                            threads::written(n, |at, out| repeat.write(&y[at..], at, out, move |y, x| f(x, y))),
                        ),
                        None => threads::elementwise(
                            n,
                            || zip().par_map_collect(|&x, &y| f(x, y)),
                            || zip().map_collect(|&x, &y| f(x, y)),
                        ),
                    }
                }
            }
        }
    }
    match op.def() {
        OpDef::Prim(p) => p.specialize(Zipped(a, b, dims)),
        OpDef::Composite(t) => composite(t, &[a.view(), b.view()], dims),
    }
}

/// A comparison of `f32` operands each stored whole or one element, straight to `bool`s (the
/// general way computes each 0 or 1 as `f32`, then converts the tensor); `None` for other
/// layouts. The op's own function decides each element, so the results are the same.
pub(crate) fn compare(
    op: BinaryOp,
    a: &ArrayViewD<'_, f32>,
    b: &ArrayViewD<'_, f32>,
    dims: &[usize],
) -> Option<ArrayD<bool>> {
    struct Compared<'a>(Flat<'a>, Flat<'a>, usize);
    impl BinaryKernel<Vec<bool>> for Compared<'_> {
        fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) -> Vec<bool> {
            let Compared(x, y, n) = self;
            vmath::wide(move || match (x, y) {
                (Flat::Whole(x), Flat::Whole(y)) => x.iter().zip(y).map(|(&x, &y)| f(x, y) != 0.0).collect(),
                (Flat::Whole(x), Flat::One(y)) => x.iter().map(|&x| f(x, y) != 0.0).collect(),
                (Flat::One(x), Flat::Whole(y)) => y.iter().map(|&y| f(x, y) != 0.0).collect(),
                (Flat::One(x), Flat::One(y)) => vec![f(x, y) != 0.0; n],
                (Flat::Same, _) | (_, Flat::Same) => unreachable!("`Flat::of` gives no `Same`"),
            })
        }
    }
    let OpDef::Prim(p) = op.def() else { return None };
    let (x, y) = (Flat::of(a, dims)?, Flat::of(b, dims)?);
    let n = dims.iter().product();
    Some(
        ArrayD::from_shape_vec(IxDyn(dims), p.specialize(Compared(x, y, n)))
            .expect("the type rule fixed the element count"),
    )
}

/// An elementwise operand as a plain slice: all of a row-major result's elements, or one
/// element broadcast to every one; (in place) the value being rewritten itself.
#[derive(Clone, Copy)]
enum Flat<'a> {
    Whole(&'a [f32]),
    One(f32),
    Same,
}

/// How an instruction runs in place ([`Interpreter::in_place`]): over its operand, or its
/// left or right operand with the other one given.
#[derive(Clone, Copy)]
enum InPlace {
    Unary(gt_ir::ops::UnaryPrim),
    Same(gt_ir::ops::BinaryPrim),
    Lhs(gt_ir::ops::BinaryPrim, Operand),
    Rhs(gt_ir::ops::BinaryPrim, Operand),
}

/// `x[i] = f(x[i])`, split as `threads::written` splits a result.
struct UnaryInPlace<'a>(&'a mut [f32]);

impl UnaryKernel<()> for UnaryInPlace<'_> {
    fn call<F: Fn(f32) -> f32 + Copy + Send + Sync>(self, f: F) {
        threads::rewritten(self.0, |_, x| wide_rewrite(x, f));
    }
}

/// `x[i] = f(x[i], y[i])` (or `f(y[i], x[i])` when `x` is the right operand).
struct BinaryInPlace<'a, 'b>(&'a mut [f32], Flat<'b>, bool);

impl BinaryKernel<()> for BinaryInPlace<'_, '_> {
    fn call<F: Fn(f32, f32) -> f32 + Copy + Send + Sync>(self, f: F) {
        let BinaryInPlace(x, other, x_is_lhs) = self;
        // One small loop per case, each in the widest vectors (`wide_rewrite`).
        threads::rewritten(x, |at, x| match (other, x_is_lhs) {
            (Flat::Whole(y), true) => wide_rewrite_with(x, &y[at..], f),
            (Flat::Whole(y), false) => wide_rewrite_with(x, &y[at..], move |x, y| f(y, x)),
            (Flat::One(y), true) => wide_rewrite(x, move |x| f(x, y)),
            (Flat::One(y), false) => wide_rewrite(x, move |x| f(y, x)),
            (Flat::Same, _) => wide_rewrite(x, move |x| f(x, x)),
        });
    }
}

/// `x[i] = f(x[i])` in the host's widest vectors (see [`wide_map_into`]).
fn wide_rewrite(x: &mut [f32], f: impl Fn(f32) -> f32) {
    vmath::wide(move || {
        let (x, f) = (x, f);
        for x in x {
            *x = f(*x);
        }
    })
}

/// `x[i] = f(x[i], y[i])` in the host's widest vectors (see [`wide_map_into`]).
fn wide_rewrite_with(x: &mut [f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
    vmath::wide(move || {
        let (x, y, f) = (x, y, f);
        for (x, &y) in x.iter_mut().zip(y) {
            *x = f(*x, y);
        }
    })
}

/// `f` over `x` in place: through a buffer on the stack, as `vmath`'s loops read and write
/// separate slices.
fn map_slices_in_place(x: &mut [f32], f: vmath::SliceFn) {
    const CHUNK: usize = 1024;
    threads::rewritten(x, |_, x| {
        let mut buffer = [0.0f32; CHUNK];
        for chunk in x.chunks_mut(CHUNK) {
            let read = &mut buffer[..chunk.len()];
            read.copy_from_slice(chunk);
            f(read, chunk);
        }
    });
}

impl<'a> Flat<'a> {
    fn of(a: &'a ArrayViewD<'_, f32>, dims: &[usize]) -> Option<Flat<'a>> {
        if a.len() == 1 {
            a.iter().next().map(|&x| Flat::One(x))
        } else if a.shape() == dims {
            a.as_slice().map(Flat::Whole)
        } else {
            None
        }
    }
}

/// A contiguous operand broadcast along leading or trailing axes of a row-major result, as
/// plain slices: a bias (`[n]` over `[m, n]`: element `i` of the result reads `v[i % len]`)
/// or a per-row value (`[m, 1]` over `[m, n]`: element `i` reads `v[i / run]`).
#[derive(Clone, Copy)]
enum Repeat<'a> {
    Period(&'a [f32]),
    Runs(&'a [f32], usize),
}

impl<'a> Repeat<'a> {
    fn of(a: &'a ArrayViewD<'_, f32>, dims: &[usize]) -> Option<Repeat<'a>> {
        let v = a.as_slice()?;
        if v.is_empty() || a.ndim() > dims.len() {
            return None;
        }
        // The operand's shape aligned to the result's trailing axes, ones in front.
        let shape: Vec<usize> =
            std::iter::repeat_n(1, dims.len() - a.ndim()).chain(a.shape().iter().copied()).collect();
        // Ones then the result's own extents: repeated whole (a period).
        let ones = shape.iter().take_while(|&&d| d == 1).count();
        if shape[ones..] == dims[ones..] {
            return Some(Repeat::Period(v));
        }
        // The result's extents then ones: each element repeated over the axes after it.
        let kept = shape.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
        if shape[..kept] == dims[..kept] {
            let run = dims[kept..].iter().product::<usize>();
            return (run > 0).then_some(Repeat::Runs(v, run));
        }
        None
    }

    /// `out[k] = f(x[k], self at element at + k)` for each element of `out`, in stretches of
    /// one operand element (runs) or one period, each in the widest vectors.
    fn write(self, x: &[f32], at: usize, out: &mut [MaybeUninit<f32>], f: impl Fn(f32, f32) -> f32 + Copy) {
        let mut done = 0;
        while done < out.len() {
            let i = at + done;
            let (len, stretch) = match self {
                Repeat::Period(v) => {
                    let j = i % v.len();
                    let len = (v.len() - j).min(out.len() - done);
                    (len, Ok(&v[j..j + len]))
                }
                Repeat::Runs(v, run) => ((run - i % run).min(out.len() - done), Err(v[i / run])),
            };
            let (x, out) = (&x[done..done + len], &mut out[done..done + len]);
            match stretch {
                Ok(y) => wide_zip_into(x, y, out, f),
                Err(y) => wide_map_into(x, out, move |x| f(x, y)),
            }
            done += len;
        }
    }
}

/// A composite op: its expansion evaluated with the primitives' array functions (so it is
/// exactly what the expanded instructions would give), result `dims`.
fn composite(t: &Term, operands: &[ArrayViewD<'_, f32>], dims: &[usize]) -> Tensor {
    struct Arrays<'a, 'b> {
        operands: &'a [ArrayViewD<'b, f32>],
        dims: &'a [usize],
    }
    impl Algebra for Arrays<'_, '_> {
        type Value = Tensor;
        type Error = Var;
        fn var(&mut self, var: Var) -> Result<Tensor, Var> {
            var.operand(self.operands).map(|a| a.to_owned())
        }
        fn constant(&mut self, c: f64) -> Result<Tensor, Var> {
            Ok(ArrayD::from_elem(IxDyn(&[]), c as f32))
        }
        fn unary(&mut self, op: UnaryOp, x: Tensor) -> Result<Tensor, Var> {
            Ok(unary(op, &x))
        }
        fn binary(&mut self, op: BinaryOp, x: Tensor, y: Tensor) -> Result<Tensor, Var> {
            Ok(binary(op, &x.view(), &y.view(), self.dims))
        }
        fn select(&mut self, c: Tensor, t: Tensor, f: Tensor) -> Result<Tensor, Var> {
            Ok(select(&c.view(), &t.view(), &f.view(), self.dims))
        }
    }
    // The op table's tests check that expansions read only their operands.
    let out = t.eval(&mut Arrays { operands, dims }).unwrap_or_else(|var| panic!("an expansion reads {var:?}"));
    // An expansion that never combines its operand with anything keeps the operand's shape.
    if out.shape() == dims {
        out
    } else {
        broadcast(&out.view(), dims).to_owned()
    }
}

/// `where`: `on_true` where `cond` is nonzero (NaN included), else `on_false`.
pub(crate) fn select(
    cond: &ArrayViewD<'_, f32>,
    on_true: &ArrayViewD<'_, f32>,
    on_false: &ArrayViewD<'_, f32>,
    dims: &[usize],
) -> Tensor {
    Zip::from(&broadcast(cond, dims))
        .and(&broadcast(on_true, dims))
        .and(&broadcast(on_false, dims))
        .map_collect(|&c, &t, &f| if c != 0.0 { t } else { f })
}

/// NumPy `matmul`: one `sgemm` per (broadcast) batch index, on strided views.
pub(crate) fn matmul(a: ArrayViewD<'_, f32>, b: ArrayViewD<'_, f32>, dims: &[usize]) -> Result<Tensor, TypeError> {
    value::batched(a, b, dims, |x, y, c| gemm(x.into_dyn(), y.into_dyn(), c.into_dyn()))
}

/// `c = a b` for 2-d views `a` (m x k, k > 0), `b` (k x n) and a contiguous `c` (m x n) not yet
/// written: every element of `c` is written when this returns (zeros where a cancelled
/// product stopped early).
#[allow(unsafe_code)]
fn gemm(a: ArrayViewD<'_, f32>, b: ArrayViewD<'_, f32>, mut c: ArrayViewMutD<'_, std::mem::MaybeUninit<f32>>) {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    debug_assert_eq!((b.shape()[0], c.shape()), (k, &[m, n][..]));
    let (sa, sb, sc) = (a.strides(), b.strides(), c.strides().to_vec());
    // SAFETY (`Sgemm::run`): the pointers and strides come from live views of exactly these shapes
    // (m x k, k x n, m x n), so every element sgemm reads or writes is inside its array.
    // `c` is a view into a freshly allocated row-major array, so its strides do not alias
    // two elements, and it is borrowed mutably while `a` and `b` are only read. With k > 0 and
    // beta = 0, sgemm writes every element of `c` and reads none.
    unsafe {
        Sgemm {
            m,
            k,
            n,
            a: (a.as_ptr(), sa[0], sa[1]),
            b: (b.as_ptr(), sb[0], sb[1]),
            c: (c.as_mut_ptr().cast::<f32>(), sc[0], sc[1]),
        }
        .run();
    }
    // A cancelled product stops between blocks: what it left is written now (the worker
    // discards the result; its memory must hold values all the same).
    if crate::cancel::Token::current().stop() {
        c.fill(std::mem::MaybeUninit::new(0.0));
    }
}

/// Reduces `axes` (sorted, distinct) of `a` into a tensor of shape `dims`.
pub(crate) fn reduce(op: ReduceOp, a: &Tensor, axes: &[usize], dims: &[usize]) -> Tensor {
    // Move the reduced axes last and view the tensor as rows: one row per result element,
    // in row-major order of the kept axes, which is also the order with `keepdim`.
    let kept: Vec<usize> = (0..a.ndim()).filter(|i| !axes.contains(i)).collect();
    let extent = |axes: &[usize]| axes.iter().map(|&i| a.shape()[i]).product::<usize>();
    let (outer, inner) = (extent(&kept), extent(axes));
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let moved = a.view().permuted_axes(perm);
    let rows = moved.to_shape((outer, inner)).expect("the same element count");
    // Sums accumulate in f64 so the reference is at least as accurate as any backend; a
    // contiguous row in the JIT's order (four independent lanes: four times as fast as one
    // chain of dependent additions), any other one element after element, as the JIT does.
    let sum = |row: ndarray::ArrayView1<'_, f32>| match row.as_slice() {
        Some(x) => sum_in_lanes(x),
        None => row.iter().map(|&x| f64::from(x)).sum::<f64>(),
    };
    let values = rows
        .rows()
        .into_iter()
        .map(|row| match op {
            ReduceOp::Sum => sum(row) as f32,
            // 0 / 0 makes the mean of nothing NaN, as in NumPy.
            ReduceOp::Mean => (sum(row) / inner as f64) as f32,
            ReduceOp::Max => row.fold(f32::NEG_INFINITY, |m, &x| nan_max(m, x)),
            ReduceOp::Min => row.fold(f32::INFINITY, |m, &x| nan_min(m, x)),
        })
        .collect();
    from_vec(dims, values)
}

/// `x`'s sum in `f64` in the order of the JIT's vector loop (`jit/codegen.rs`): element `i`
/// of each whole four into lane `i % 4`, the tail one by one from -0 (Rust's `sum` starts
/// there too, so an empty row sums to -0), then lanes 0 + 2 and 1 + 3 added to it.
/// Compiled and interpreted sums of a contiguous row give the same bits.
fn sum_in_lanes(x: &[f32]) -> f64 {
    let mut lanes = [-0.0f64; 4];
    let fours = x.chunks_exact(4);
    let tail = fours.remainder();
    for four in fours {
        for (lane, &x) in lanes.iter_mut().zip(four) {
            *lane += f64::from(x);
        }
    }
    let mut sum = tail.iter().fold(-0.0f64, |s, &x| s + f64::from(x));
    sum += lanes[0] + lanes[2];
    sum += lanes[1] + lanes[3];
    sum
}

/// Per input axis of a slice: the ascending range `lo..hi` its elements `start + j * step`
/// (`j < len`) span, the step's size, and whether to walk it backwards (a negative step).
fn slice_axes(resolved: &ResolvedSlice) -> Vec<(usize, usize, usize, bool)> {
    resolved
        .axes
        .iter()
        .map(|s| {
            let step = s.step.unsigned_abs() as usize;
            let span = s.len.saturating_sub(1) * step;
            let (lo, hi) = match (s.len, s.step > 0) {
                (0, _) => (0, 0),
                (_, true) => (s.start, s.start + span + 1),
                (_, false) => (s.start - span, s.start + 1),
            };
            (lo, hi, step, s.step < 0)
        })
        .collect()
}

/// Whether `kernel` is for the `f32` JIT: not a map computing in `f64` or `i64`, or with
/// `round` nodes.
fn is_f32_jit_kernel(kernel: &Kernel) -> bool {
    !matches!(kernel, Kernel::Map(m) if !m.is_plain_f32())
}

/// A JIT failure of `op` as the runtime reports it.
fn jit_failure(op: &'static str, e: JitError) -> RuntimeError {
    match e {
        JitError::Invalid(source) | JitError::Bounds(source) => RuntimeError::Kernel { op, source },
        e => RuntimeError::Jit { op, source: JitFailure(Arc::new(e)) },
    }
}

/// Logs a kernel's compile (`took` zero: it was cached).
fn log_compile(jit: &Jit, kernel: &Kernel, dims: &[usize], took: std::time::Duration) {
    if !took.is_zero() {
        tracing::debug!(
            target: "gt::compile",
            "jit: compiled a {} kernel for {dims:?} in {:.3} ms ({} compiled so far)",
            kernel.kind(),
            took.as_secs_f64() * 1e3,
            jit.stats().compiled
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gt_ir::random;
    use gt_ir::DType;
    use gt_ir::{SliceItem, SplitSpec};
    use proptest::prelude::*;

    /// `write` defines a value as the literal would, checked the same way, without copying.
    #[test]
    fn write_defines_a_value_as_its_literal_would() {
        let mut it = Interpreter::new().with_memory_budget(64);
        let data = Elements::F32(vec![1.0, 2.0, 3.0, 4.0]);
        let at = data.as_f32().map(<[f32]>::as_ptr);
        it.write(v(1), TensorType::f32(vec![2, 2]), data).unwrap();
        let read = it.read(v(1)).unwrap();
        assert_eq!((read.ty, read.data), (TensorType::f32(vec![2, 2]), Elements::F32(vec![1.0, 2.0, 3.0, 4.0])));
        let Some(Value::F32(stored)) = it.values.get(&v(1)) else { panic!("not stored as f32") };
        assert_eq!(stored.as_ptr(), at.unwrap(), "the data was copied");
        assert_eq!(it.live_bytes(), 16);
        // Data that does not fit its type, and data past the budget, are refused as literals are.
        let short = it.write(v(2), TensorType::f32(vec![3]), Elements::F32(vec![1.0]));
        assert!(matches!(short, Err(RuntimeError::Type { .. })), "{short:?}");
        let big = it.write(v(2), TensorType::f32(vec![16]), Elements::F32(vec![0.0; 16]));
        assert!(matches!(big, Err(RuntimeError::OutOfMemory { .. })), "{big:?}");
        // Writing over a value replaces it.
        it.write(v(1), TensorType::new(DType::I32, vec![1]), Elements::I32(vec![7])).unwrap();
        assert_eq!(it.live_bytes(), 4);
    }

    /// `take` hands a stored value's buffer over and frees it; a pending transpose, and the
    /// source one still reads, are read out and freed as a read and a `free` would.
    #[test]
    fn take_moves_a_stored_value_out_and_frees_it() {
        let mut it = Interpreter::new();
        let data = Elements::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let at = data.as_f32().map(<[f32]>::as_ptr);
        it.write(v(1), TensorType::f32(vec![2, 3]), data).unwrap();
        let taken = it.take(v(1)).unwrap();
        assert_eq!(taken.ty, TensorType::f32(vec![2, 3]));
        assert_eq!(taken.data.as_f32().map(<[f32]>::as_ptr), at, "the data was copied");
        assert_eq!((it.live_values(), it.live_bytes()), (0, 0));
        assert!(matches!(it.take(v(1)), Err(RuntimeError::Undefined { .. })));
        // A transpose left pending: its elements transposed; then its source, read in place
        // by nothing any more.
        it.write(v(1), TensorType::f32(vec![2, 3]), Elements::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
        it.execute(&Instr::Transpose { dst: v(2), src: v(1), dim0: 0, dim1: 1 }).unwrap();
        let t = it.take(v(2)).unwrap();
        assert_eq!((t.ty, t.data), (TensorType::f32(vec![3, 2]), Elements::F32(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])));
        it.execute(&Instr::Transpose { dst: v(2), src: v(1), dim0: 0, dim1: 1 }).unwrap();
        let src = it.take(v(1)).unwrap();
        assert_eq!(src.data, Elements::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        // The transpose of the source taken was computed before it went.
        assert_eq!(it.read(v(2)).unwrap().data, Elements::F32(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
        it.execute(&Instr::Free { src: v(2) }).unwrap();
        assert_eq!((it.live_values(), it.live_bytes()), (0, 0));
        // A slice, whose rows come from the middle of its source, and an integer value.
        lit(&mut it, 3, &[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let rows = SliceItem::Range { start: Some(1), end: None, step: 1 };
        it.execute(&Instr::Slice { dst: v(4), src: v(3), index: vec![rows] }).unwrap();
        assert_eq!(it.take(v(4)).unwrap().data, Elements::F32(vec![3.0, 4.0, 5.0, 6.0]));
        it.write(v(5), TensorType::new(DType::I64, vec![2]), Elements::I64(vec![7, 8])).unwrap();
        assert_eq!(it.take(v(5)).unwrap().data, Elements::I64(vec![7, 8]));
    }

    /// The small elementwise path defines what the general one computes (the same bits) for
    /// every unary and binary op it takes, and leaves the rest to the general path, which
    /// then reports their errors.
    #[test]
    fn comparisons_straight_to_bool_give_what_the_f32_path_converts() {
        // NaN, signed zeros and infinities among values whole and one element.
        let x = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![1.0, f32::NAN, -0.0, 0.0, 2.5, f32::INFINITY, -3.0, 2.5]);
        let y = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![1.0, 1.0, 0.0, -0.0, f32::NAN, 7.0, -3.5, 2.5]);
        let one = ArrayD::from_shape_vec(IxDyn(&[]), vec![2.5f32]);
        let (x, y, one) = (x.unwrap(), y.unwrap(), one.unwrap());
        let mut compared = 0;
        for &op in BinaryOp::ALL.iter().filter(|op| op.is_comparison()) {
            for (a, b) in [(&x, &y), (&x, &one), (&one, &y), (&one, &one)] {
                let dims = if a.len() == 1 && b.len() == 1 { &[][..] } else { &[2, 4][..] };
                let fast = compare(op, &a.view(), &b.view(), dims).expect("whole or one element");
                let slow = Value::F32(binary(op, &a.view(), &b.view(), dims)).into_dtype(DType::Bool);
                assert_eq!(Value::Bool(fast), slow, "{op:?}");
                compared += 1;
            }
        }
        assert_eq!(compared, 24);
        // A broadcast row is the general path's.
        let row = ArrayD::from_shape_vec(IxDyn(&[4]), vec![1.0f32; 4]).unwrap();
        assert!(compare(BinaryOp::Gt, &x.view(), &row.view(), &[2, 4]).is_none());
    }

    #[test]
    fn small_elementwise_ops_compute_what_the_general_path_computes() {
        let mut it = Interpreter::new();
        let (x, y, n) = (awkward(12, 1), awkward(12, 2), 12);
        it.write(v(1), TensorType::f32(vec![3, 4]), Elements::F32(x)).unwrap();
        it.write(v(2), TensorType::f32(vec![3, 4]), Elements::F32(y)).unwrap();
        it.write(v(3), TensorType::f32(vec![4]), Elements::F32(vec![1.0, -2.0, 0.5, 3.0])).unwrap();
        it.write(v(4), TensorType::new(DType::I32, vec![3, 4]), Elements::I32(vec![1; 12])).unwrap();
        let general = |it: &mut Interpreter, instr: &Instr| {
            let (instr, types) = checks::prepare(instr, &|v| it.type_of(v), it.max_tensor_bytes).unwrap();
            it.compute(&instr, &types).unwrap().into_iter().next().unwrap()
        };
        let bits = |t: &Tensor| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut taken = 0;
        let mut instrs: Vec<Instr> = UnaryOp::ALL.iter().map(|&op| Instr::Unary { dst: v(9), op, src: v(1) }).collect();
        for &op in BinaryOp::ALL {
            let binary = |lhs, rhs| Instr::Binary { dst: v(9), op, lhs, rhs };
            let (a, b, row, int) =
                (Operand::Value(v(1)), Operand::Value(v(2)), Operand::Value(v(3)), Operand::Value(v(4)));
            instrs.extend([binary(a, b), binary(a, Operand::Scalar(0.5)), binary(Operand::Scalar(-2.0), b)]);
            // Broadcast and mixed dtypes: the general path's.
            instrs.extend([binary(a, row), binary(a, int)]);
        }
        for instr in &instrs {
            match it.small_elementwise_result(instr) {
                Some((dst, fast)) => {
                    taken += 1;
                    assert_eq!(dst, v(9));
                    let Value::F32(slow) = general(&mut it, instr) else { panic!("{instr:?}: not f32") };
                    assert_eq!((fast.shape(), bits(&fast)), (slow.shape(), bits(&slow)), "{instr:?}");
                }
                None => {
                    let broadcast_or_mixed = instr.operands().iter().any(|&o| o == v(3) || o == v(4));
                    let prepared = checks::prepare(instr, &|v| it.type_of(v), it.max_tensor_bytes);
                    let f32_result = prepared.is_ok_and(|(_, types)| types.iter().all(|t| t.dtype == DType::F32));
                    assert!(broadcast_or_mixed || !f32_result, "{instr:?} was left to the general path");
                }
            }
        }
        assert!(taken >= UnaryOp::ALL.len(), "{taken} taken");
        // Executed, it defines the result and counts its bytes.
        it.execute(&Instr::Unary { dst: v(9), op: UnaryOp::Neg, src: v(1) }).unwrap();
        assert_eq!(it.read(v(9)).unwrap().ty, TensorType::f32(vec![3, 4]));
        assert_eq!(it.live_bytes(), 4 * (4 * n + 4));
        // Past the memory budget, the general path refuses it as before.
        let mut small = Interpreter::new().with_memory_budget(48);
        small.write(v(1), TensorType::f32(vec![12]), Elements::F32(vec![1.0; 12])).unwrap();
        let e = small.execute(&Instr::Unary { dst: v(2), op: UnaryOp::Neg, src: v(1) });
        assert!(matches!(e, Err(RuntimeError::OutOfMemory { .. })), "{e:?}");
        let e = small.execute(&Instr::Unary { dst: v(2), op: UnaryOp::Neg, src: v(7) });
        assert!(matches!(e, Err(RuntimeError::Undefined { .. })), "{e:?}");
    }

    fn v(i: u32) -> ValueId {
        ValueId(i)
    }

    /// Values for in-place checks: every kind of `f32` an op treats apart.
    fn awkward(n: usize, salt: usize) -> Vec<f32> {
        let special =
            [0.0, -0.0, 1.0, -1.5, 0.5, 7.25, -30.0, 88.0, -103.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let plain = data(salt as u64, n);
        (0..n)
            .map(|i| if (i + salt).is_multiple_of(5) { special[(i + salt) % special.len()] } else { plain[i] })
            .collect()
    }

    fn bits(t: &HostTensor) -> Vec<u32> {
        t.to_f32().iter().map(|x| x.to_bits()).collect()
    }

    /// An elementwise op over an operand that dies with it writes over that operand and
    /// gives the bits a fresh result has, for every primitive op, both sides of a binary
    /// op, a whole, one-element or scalar other operand, and loops split over the team.
    #[test]
    fn ops_over_a_dying_operand_write_over_it_with_the_same_bits() {
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        for n in [1usize, 5, 1029, 70_001] {
            let (a, b) = (awkward(n, 0), awkward(n, 3));
            // `instr` run plainly and with `dying`: the same bits, and the donor gone when taken.
            let check = |instr: &Instr, dying: &[ValueId], setup: &dyn Fn(&mut Interpreter)| {
                let (mut fresh, mut over) = (Interpreter::new(), Interpreter::new());
                setup(&mut fresh);
                setup(&mut over);
                fresh.execute(instr).unwrap();
                let before = over.live_bytes();
                let donor = over.execute_donating(instr, dying).unwrap();
                let dst = instr.results()[0];
                let (want, got) = (fresh.read(dst).unwrap(), over.read(dst).unwrap());
                assert_eq!(want.ty, got.ty, "{instr:?}");
                assert_eq!(bits(&want), bits(&got), "{instr:?} n {n}");
                if let Some(d) = donor {
                    assert!(dying.contains(&d), "{instr:?} took {d:?}");
                    assert!(matches!(over.read(d), Err(RuntimeError::Undefined { .. })), "{instr:?}");
                    assert_eq!(over.live_bytes(), before, "{instr:?}: the result took the donor's bytes");
                }
                donor
            };
            for &op in UnaryOp::ALL {
                let instr = Instr::Unary { dst: v(9), op, src: v(0) };
                let donor = check(&instr, &[v(0)], &|it| lit(it, 0, &[n], &a));
                let prim = matches!(op.def(), OpDef::Prim(_));
                assert_eq!(donor.is_some(), prim, "{op:?}");
            }
            for &op in BinaryOp::ALL {
                let prim = matches!(op.def(), OpDef::Prim(_));
                let both = |it: &mut Interpreter| {
                    lit(it, 0, &[n], &a);
                    lit(it, 1, &[n], &b);
                };
                let bool_result = op.is_comparison();
                let takes = prim && !bool_result;
                // Either side dying, or both.
                let d = check(&binary_instr(op, val(0), val(1)), &[v(0)], &both);
                assert_eq!(d, takes.then_some(v(0)), "{op:?}");
                let d = check(&binary_instr(op, val(0), val(1)), &[v(1)], &both);
                assert_eq!(d, takes.then_some(v(1)), "{op:?}");
                check(&binary_instr(op, val(0), val(1)), &[v(0), v(1)], &both);
                // A scalar, a one-element value, and the value with itself.
                let d = check(&binary_instr(op, val(0), Operand::Scalar(2.5)), &[v(0)], &both);
                assert_eq!(d, takes.then_some(v(0)), "{op:?}");
                let one = |it: &mut Interpreter| {
                    both(it);
                    lit(it, 2, &[1], &[-0.75]);
                };
                let d = check(&binary_instr(op, val(2), val(1)), &[v(1)], &one);
                assert_eq!(d, takes.then_some(v(1)), "{op:?}");
                // The one-element operand is broadcast: it cannot hold the result.
                if n > 1 {
                    assert_eq!(check(&binary_instr(op, val(2), val(1)), &[v(2)], &one), None, "{op:?}");
                }
                let d = check(&binary_instr(op, val(0), val(0)), &[v(0)], &both);
                assert_eq!(d, takes.then_some(v(0)), "{op:?}");
            }
        }
        threads::use_threads(1, std::time::Duration::ZERO).unwrap();
    }

    /// A large `mul` by a scalar is left pending, and an update `w - t`, `w + t` or `t + w`
    /// reads it in the same pass, over `w` when `w` dies: the bits of the two ops run one
    /// after the other (`w - fl(g * c)`, not a fused multiply-add). Anything else that reads
    /// it, or changes or frees its source, computes it first.
    #[test]
    fn scaled_values_wait_for_the_update_that_reads_them() {
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let c = 0.01f64;
        for n in [SCALED_MIN_ELEMENTS, 70_001] {
            let (w, g) = (awkward(n, 1), awkward(n, 4));
            let t: Vec<f32> = g.iter().map(|&g| g * c as f32).collect();
            let want = |f: fn(f32, f32) -> f32| w.iter().zip(&t).map(|(&w, &t)| f(w, t).to_bits()).collect::<Vec<_>>();
            let scaled = || {
                let mut it = Interpreter::new();
                lit(&mut it, 0, &[n], &w);
                lit(&mut it, 1, &[n], &g);
                let before = it.live_bytes();
                it.execute(&binary_instr(BinaryOp::Mul, val(1), Operand::Scalar(c))).unwrap();
                assert_eq!(it.live_bytes(), before, "n {n}: the product was computed, not left pending");
                it
            };
            let t_bits: Vec<u32> = t.iter().map(|x| x.to_bits()).collect();
            let update = |op, lhs, rhs| Instr::Binary { dst: v(5), op, lhs, rhs };
            // Over `w`, which dies: the update takes its storage.
            for (instr, f) in [
                (update(BinaryOp::Sub, val(0), val(100)), (|w, t| w - t) as fn(f32, f32) -> f32),
                (update(BinaryOp::Add, val(0), val(100)), |w, t| w + t),
                (update(BinaryOp::Add, val(100), val(0)), |w, t| t + w),
            ] {
                let mut it = scaled();
                let at = it.get_f32("test", v(0)).unwrap().as_ptr();
                assert_eq!(it.execute_donating(&instr, &[v(0), v(100)]).unwrap(), Some(v(0)), "{instr:?}");
                assert_eq!(bits(&it.read(v(5)).unwrap()), want(f), "{instr:?} n {n}");
                assert_eq!(it.get_f32("test", v(5)).unwrap().as_ptr(), at, "{instr:?}: not over w");
                assert!(matches!(it.read(v(0)), Err(RuntimeError::Undefined { .. })));
                // `t` itself still reads as computed, and its free is the last of it.
                assert_eq!(bits(&it.read(v(100)).unwrap()), t_bits);
                it.execute(&Instr::Free { src: v(100) }).unwrap();
                assert_eq!((it.live_values(), it.live_bytes()), (2, 2 * n * 4), "{instr:?}");
            }
            // `t - w`: `t` computed, then the op as any other (over `t`, which dies).
            let mut it = scaled();
            let instr = update(BinaryOp::Sub, val(100), val(0));
            assert_eq!(it.execute_donating(&instr, &[v(0), v(100)]).unwrap(), Some(v(100)));
            assert_eq!(bits(&it.read(v(5)).unwrap()), want(|w, t| t - w));
            // `w` kept: a new result; `w` and `g` unchanged.
            let mut it = scaled();
            it.execute(&update(BinaryOp::Sub, val(0), val(100))).unwrap();
            assert_eq!(bits(&it.read(v(5)).unwrap()), want(|w, t| w - t));
            assert!(bits(&it.read(v(0)).unwrap()).into_iter().eq(w.iter().map(|x| x.to_bits())), "w changed");
            // `g - g * c` over a dying `g` that `t` still reads: a new result, `t` intact.
            let mut it = scaled();
            assert_eq!(it.execute_donating(&update(BinaryOp::Sub, val(1), val(100)), &[v(1)]).unwrap(), None);
            let own: Vec<u32> = g.iter().zip(&t).map(|(&g, &t)| (g - t).to_bits()).collect();
            assert_eq!(bits(&it.read(v(5)).unwrap()), own);
            assert_eq!(bits(&it.read(v(100)).unwrap()), t_bits);
            // Its source redefined, or freed: computed first.
            let mut it = scaled();
            it.execute(&Instr::Unary { dst: v(1), op: UnaryOp::Neg, src: v(1) }).unwrap();
            assert_eq!(bits(&it.read(v(100)).unwrap()), t_bits);
            let mut it = scaled();
            it.execute(&Instr::Free { src: v(1) }).unwrap();
            assert_eq!(bits(&it.read(v(100)).unwrap()), t_bits);
            assert_eq!((it.live_values(), it.live_bytes()), (2, 2 * n * 4));
            // Read by another op (a reduction), or by a product: computed first.
            let mut it = scaled();
            let sum =
                run(&mut it, Instr::Reduce { dst: v(6), op: ReduceOp::Sum, src: v(100), axes: None, keepdim: false });
            let mut plain = Interpreter::new();
            lit(&mut plain, 100, &[n], &t);
            let plain_sum = run(
                &mut plain,
                Instr::Reduce { dst: v(6), op: ReduceOp::Sum, src: v(100), axes: None, keepdim: false },
            );
            assert_eq!(bits(&sum), bits(&plain_sum));
            let mut it = scaled();
            let dot = run(&mut it, Instr::MatMul { dst: v(7), lhs: v(100), rhs: v(0) });
            let plain_dot = {
                lit(&mut plain, 0, &[n], &w);
                run(&mut plain, Instr::MatMul { dst: v(7), lhs: v(100), rhs: v(0) })
            };
            assert_eq!(bits(&dot), bits(&plain_dot));
            // The source dying with the `mul`: computed over it, not left pending.
            let mut it = scaled();
            let mul = Instr::Binary { dst: v(8), op: BinaryOp::Mul, lhs: val(0), rhs: Operand::Scalar(c) };
            assert_eq!(it.execute_donating(&mul, &[v(0)]).unwrap(), Some(v(0)));
        }
        // A small one is computed at once.
        let mut it = Interpreter::new();
        lit(&mut it, 1, &[8], &[1.0; 8]);
        it.execute(&binary_instr(BinaryOp::Mul, val(1), Operand::Scalar(c))).unwrap();
        assert_eq!(it.live_bytes(), 64);
        threads::use_threads(1, std::time::Duration::ZERO).unwrap();
    }

    /// A `fused` kernel reading a dying operand where it writes runs over it through the
    /// JIT (split over the team when large) with the bits of a fresh result; a kernel reading
    /// it elsewhere or twice, or no JIT, leaves it.
    #[test]
    fn a_fused_kernel_over_a_dying_operand_writes_over_it() {
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let kernel = |(r, c): (usize, usize), strides0: (usize, usize)| {
            let text = format!(
                "kernel map [{r}, {c}] {{\n  in0 +0 strides [{}, {}]\n  in1 +0 strides [{c}, 1]\n  %0 = load in0\n  \
                 %1 = load in1\n  %2 = const 0.5\n  %3 = mul %1, %2\n  %4 = sub %0, %3\n  out +0 strides [{c}, 1]\n}}",
                strides0.0, strides0.1
            );
            Box::new(gt_ir::kernel::text::parse(&text).unwrap())
        };
        for (r, c) in [(3usize, 5usize), (300, 301)] {
            let (w, g) = (awkward(r * c, 1), awkward(r * c, 2));
            let setup = |it: &mut Interpreter| {
                lit(it, 0, &[r, c], &w);
                lit(it, 1, &[r, c], &g);
            };
            let fused =
                |srcs: Vec<ValueId>, kernel| Instr::Fused { dst: v(2), ty: TensorType::f32(vec![r, c]), srcs, kernel };
            let straight = fused(vec![v(0), v(1)], kernel((r, c), (c, 1)));
            let mut fresh = Interpreter::new().with_jit();
            setup(&mut fresh);
            fresh.execute(&straight).unwrap();
            let want = bits(&fresh.read(v(2)).unwrap());
            for donor in [v(0), v(1)] {
                let mut over = Interpreter::new().with_jit();
                setup(&mut over);
                assert_eq!(over.execute_donating(&straight, &[donor]).unwrap(), Some(donor));
                assert_eq!(bits(&over.read(v(2)).unwrap()), want, "{r}x{c} over {donor:?}");
                assert!(over.read(donor).is_err());
                assert_eq!(over.live_bytes(), 2 * r * c * 4);
            }
            // The same value read twice, or read transposed (a square's), stays.
            let mut it = Interpreter::new().with_jit();
            setup(&mut it);
            let twice = fused(vec![v(0), v(0)], kernel((r, c), (c, 1)));
            assert_eq!(it.execute_donating(&twice, &[v(0)]).unwrap(), None);
            assert!(it.read(v(0)).is_ok());
            let mut plain = Interpreter::new();
            setup(&mut plain);
            assert_eq!(plain.execute_donating(&straight, &[v(0)]).unwrap(), None);
        }
        let mut it = Interpreter::new().with_jit();
        lit(&mut it, 0, &[4, 4], &iota(16));
        lit(&mut it, 1, &[4, 4], &iota(16));
        let transposed = Instr::Fused {
            dst: v(2),
            ty: TensorType::f32(vec![4, 4]),
            srcs: vec![v(0), v(1)],
            kernel: kernel((4, 4), (1, 4)),
        };
        assert_eq!(it.execute_donating(&transposed, &[v(0)]).unwrap(), None);
        assert_eq!(it.read(v(2)).unwrap().to_f32()[1], 4.0 - 0.5);
        threads::use_threads(1, std::time::Duration::ZERO).unwrap();
    }

    /// What an in-place op must not take: an operand not dying, one redefined by the op, the
    /// source of a pending transpose, and a value of another dtype.
    #[test]
    fn in_place_leaves_what_it_must_not_take() {
        let setup = |it: &mut Interpreter| {
            lit(it, 0, &[2, 2], &[1., 2., 3., 4.]);
            lit(it, 1, &[2, 2], &[5., 6., 7., 8.]);
        };
        let mut it = Interpreter::new();
        setup(&mut it);
        let add = |dst: u32| Instr::Binary { dst: v(dst), op: BinaryOp::Add, lhs: val(0), rhs: val(1) };
        assert_eq!(it.execute_donating(&add(5), &[v(3)]).unwrap(), None);
        assert_eq!(it.execute_donating(&add(0), &[v(0)]).unwrap(), None);
        assert_eq!(it.read(v(0)).unwrap().data, Elements::F32(vec![6., 8., 10., 12.]));
        // A transpose left pending reads v(1) in place.
        let mut it = Interpreter::new();
        setup(&mut it);
        it.execute(&Instr::Transpose { dst: v(2), src: v(1), dim0: 0, dim1: 1 }).unwrap();
        assert_eq!(it.execute_donating(&add(5), &[v(1)]).unwrap(), None);
        assert_eq!(it.read(v(2)).unwrap().data, Elements::F32(vec![5., 7., 6., 8.]));
        assert_eq!(it.read(v(1)).unwrap().data, Elements::F32(vec![5., 6., 7., 8.]));
        // An integer operand: computed as before, nothing taken.
        let mut it = Interpreter::new();
        typed(&mut it, 0, &[2], vec![1i32, 2]);
        typed(&mut it, 1, &[2], vec![3i32, 4]);
        assert_eq!(it.execute_donating(&add(5), &[v(0)]).unwrap(), None);
        assert_eq!(it.read(v(5)).unwrap().data, Elements::I32(vec![4, 6]));
        assert_eq!(it.read(v(0)).unwrap().data, Elements::I32(vec![1, 2]));
    }

    /// A `fused` result of `f32` is written by its kernel with no zeros first (the type rule
    /// refuses a kernel that does not write every element), so each element holds what the
    /// kernel wrote, not what the allocator handed over: each run first frees a value of the
    /// same size full of nines, whose memory the result likely gets.
    #[test]
    fn fused_results_hold_only_what_their_kernel_wrote() {
        let kernel = |extent: usize| {
            let text = format!(
                "kernel map [{extent}] {{\n in0 +0 strides [1]\n %0 = load in0\n %1 = neg %0\n out +0 strides [1]\n}}"
            );
            Box::new(gt_ir::kernel::text::parse(&text).unwrap())
        };
        for jit in [false, true] {
            let mut it = if jit { Interpreter::new().with_jit() } else { Interpreter::new() };
            lit(&mut it, 0, &[4], &[1., 2., 3., 4.]);
            for _ in 0..3 {
                lit(&mut it, 5, &[4], &[9.; 4]);
                it.execute(&Instr::Free { src: v(5) }).unwrap();
                let instr =
                    Instr::Fused { dst: v(1), ty: TensorType::f32(vec![4]), srcs: vec![v(0)], kernel: kernel(4) };
                it.execute(&instr).unwrap();
                assert_eq!(it.read(v(1)).unwrap().data, Elements::F32(vec![-1., -2., -3., -4.]), "jit {jit}");
            }
            let short = Instr::Fused { dst: v(2), ty: TensorType::f32(vec![4]), srcs: vec![v(0)], kernel: kernel(2) };
            assert!(matches!(it.execute(&short), Err(RuntimeError::Type { .. })), "jit {jit}");
        }
    }

    fn lit(it: &mut Interpreter, dst: u32, dims: &[usize], data: &[f32]) {
        it.execute(&Instr::Literal { dst: v(dst), ty: TensorType::f32(dims.to_vec()), data: data.to_vec().into() })
            .unwrap();
    }

    /// Defines `dst` as a literal of any dtype.
    fn typed(it: &mut Interpreter, dst: u32, dims: &[usize], data: impl Into<Elements>) {
        let data = data.into();
        let ty = TensorType::new(data.dtype(), dims.to_vec());
        it.execute(&Instr::Literal { dst: v(dst), ty, data }).unwrap();
    }

    /// Runs `instr` and reads its first result.
    fn run(it: &mut Interpreter, instr: Instr) -> HostTensor {
        let dst = instr.results()[0];
        it.execute(&instr).unwrap();
        it.read(dst).unwrap()
    }

    fn assert_tensor(t: &HostTensor, dims: &[usize], data: &[f32]) {
        assert_eq!(t.ty.shape.dims(), dims, "shape of {t}");
        assert_eq!(t.data.len(), data.len(), "length of {t}");
        for (i, (&x, &y)) in t.to_f32().iter().zip(data).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-6 * (1.0 + y.abs());
            assert!(ok, "element {i}: got {x}, expected {y} (in {t})");
        }
    }

    fn val(i: u32) -> Operand {
        Operand::Value(v(i))
    }

    fn range(start: Option<i64>, end: Option<i64>, step: i64) -> SliceItem {
        SliceItem::Range { start, end, step }
    }

    fn iota(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    fn binary_instr(op: BinaryOp, lhs: Operand, rhs: Operand) -> Instr {
        Instr::Binary { dst: v(100), op, lhs, rhs }
    }

    // ---- creation ----

    #[test]
    fn creation_ops() {
        let mut it = Interpreter::new();
        let t = run(&mut it, Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![2, 2]) });
        assert_tensor(&t, &[2, 2], &[0.0; 4]);
        let t = run(&mut it, Instr::Ones { dst: v(0), ty: TensorType::f32(vec![3]) });
        assert_tensor(&t, &[3], &[1.0; 3]);
        let t = run(&mut it, Instr::Full { dst: v(0), ty: TensorType::f32(vec![]), value: 2.5 });
        assert_tensor(&t, &[], &[2.5]);
        let t = run(&mut it, Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![0, 3]) });
        assert_tensor(&t, &[0, 3], &[]);
        let t = run(
            &mut it,
            Instr::Literal {
                dst: v(0),
                ty: TensorType::f32(vec![2, 2]),
                data: gt_ir::data::Elements::F32(vec![1.0, 2.0, 3.0, 4.0]),
            },
        );
        assert_tensor(&t, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn arange_matches_numpy() {
        let mut it = Interpreter::new();
        let mut arange =
            |start, end, step| run(&mut it, Instr::Arange { dst: v(0), dtype: DType::F32, start, end, step });
        assert_tensor(&arange(0.0, 5.0, 1.0), &[5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_tensor(&arange(1.0, 2.0, 0.25), &[4], &[1.0, 1.25, 1.5, 1.75]);
        assert_tensor(&arange(5.0, 0.0, -2.0), &[3], &[5.0, 3.0, 1.0]);
        assert_tensor(&arange(3.0, 0.0, 1.0), &[0], &[]);
        // f64 index arithmetic: no drift after many steps.
        let t = arange(0.0, 1.0, 0.1);
        assert_eq!(t.data.len(), 10);
        assert_eq!(t.to_f32()[9], (0.0 + 9.0 * 0.1f64) as f32);
    }

    #[test]
    fn random_tensors_follow_the_counter_rng() {
        let mut it = Interpreter::new();
        let a = run(&mut it, Instr::Randn { dst: v(0), ty: TensorType::f32(vec![3, 4]), seed: 5 });
        let b = run(&mut it, Instr::Randn { dst: v(1), ty: TensorType::f32(vec![3, 4]), seed: 5 });
        assert_eq!(a, b);
        let expected: Vec<f32> = (0..12).map(|i| random::normal(5, i)).collect();
        assert_eq!(a.to_f32(), expected);
        let u = run(&mut it, Instr::Rand { dst: v(2), ty: TensorType::f32(vec![2, 5]), seed: 9 });
        let expected: Vec<f32> = (0..10).map(|i| random::uniform(9, i)).collect();
        assert_eq!(u.to_f32(), expected);
        assert!(u.to_f32().iter().all(|&x| (0.0..1.0).contains(&x)));
        let c = run(&mut it, Instr::Randn { dst: v(3), ty: TensorType::f32(vec![3, 4]), seed: 6 });
        assert_ne!(a.data, c.data);
    }

    // ---- unary ----

    #[test]
    fn unary_ops() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[4], &[-2.0, -0.5, 1.0, 4.0]);
        lit(&mut it, 1, &[3], &[1.0, 4.0, 0.25]);
        let mut un = |op, src| run(&mut it, Instr::Unary { dst: v(9), op, src: v(src) });
        assert_tensor(&un(UnaryOp::Neg, 0), &[4], &[2.0, 0.5, -1.0, -4.0]);
        assert_tensor(&un(UnaryOp::Abs, 0), &[4], &[2.0, 0.5, 1.0, 4.0]);
        assert_tensor(&un(UnaryOp::Relu, 0), &[4], &[0.0, 0.0, 1.0, 4.0]);
        assert_tensor(&un(UnaryOp::Sqrt, 1), &[3], &[1.0, 2.0, 0.5]);
        assert_tensor(&un(UnaryOp::Rsqrt, 1), &[3], &[1.0, 0.5, 2.0]);
        assert_tensor(&un(UnaryOp::Exp, 1), &[3], &[1f32.exp(), 4f32.exp(), 0.25f32.exp()]);
        assert_tensor(&un(UnaryOp::Log, 1), &[3], &[0.0, 4f32.ln(), 0.25f32.ln()]);
        assert_tensor(&un(UnaryOp::Tanh, 0), &[4], &[(-2f32).tanh(), (-0.5f32).tanh(), 1f32.tanh(), 4f32.tanh()]);
        let s = un(UnaryOp::Sigmoid, 0);
        assert_tensor(&s, &[4], &[0.11920292, 0.37754067, 0.7310586, 0.98201376]);
    }

    #[test]
    fn sigmoid_is_stable_and_special_values_propagate() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[4], &[-200.0, 200.0, 0.0, f32::NAN]);
        let s = run(&mut it, Instr::Unary { dst: v(1), op: UnaryOp::Sigmoid, src: v(0) });
        assert_tensor(&s, &[4], &[0.0, 1.0, 0.5, f32::NAN]);
        let r = run(&mut it, Instr::Unary { dst: v(1), op: UnaryOp::Relu, src: v(0) });
        assert_tensor(&r, &[4], &[0.0, 200.0, 0.0, f32::NAN]);
        lit(&mut it, 2, &[2], &[-1.0, 0.0]);
        let l = run(&mut it, Instr::Unary { dst: v(3), op: UnaryOp::Log, src: v(2) });
        assert!(l.to_f32()[0].is_nan());
        assert_eq!(l.to_f32()[1], f32::NEG_INFINITY);
    }

    // ---- binary ----

    #[test]
    fn binary_broadcasts_on_both_sides() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[3, 1], &[0.0, 10.0, 20.0]);
        lit(&mut it, 1, &[4], &[1.0, 2.0, 3.0, 4.0]);
        let t = run(&mut it, binary_instr(BinaryOp::Add, val(0), val(1)));
        assert_tensor(&t, &[3, 4], &[1., 2., 3., 4., 11., 12., 13., 14., 21., 22., 23., 24.]);
        let t = run(&mut it, binary_instr(BinaryOp::Sub, val(1), val(0)));
        assert_tensor(&t, &[3, 4], &[1., 2., 3., 4., -9., -8., -7., -6., -19., -18., -17., -16.]);
    }

    #[test]
    fn binary_with_scalars() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let t = run(&mut it, binary_instr(BinaryOp::Mul, val(0), Operand::Scalar(0.5)));
        assert_tensor(&t, &[2, 2], &[0.5, 1.0, 1.5, 2.0]);
        let t = run(&mut it, binary_instr(BinaryOp::Sub, Operand::Scalar(1.0), val(0)));
        assert_tensor(&t, &[2, 2], &[0.0, -1.0, -2.0, -3.0]);
        let t = run(&mut it, binary_instr(BinaryOp::Div, Operand::Scalar(1.0), val(0)));
        assert_tensor(&t, &[2, 2], &[1.0, 0.5, 1.0 / 3.0, 0.25]);
        let t = run(&mut it, binary_instr(BinaryOp::Pow, val(0), Operand::Scalar(2.0)));
        assert_tensor(&t, &[2, 2], &[1.0, 4.0, 9.0, 16.0]);
        let t = run(&mut it, binary_instr(BinaryOp::Add, Operand::Scalar(2.0), Operand::Scalar(3.0)));
        assert_tensor(&t, &[], &[5.0]);
    }

    #[test]
    fn maximum_minimum_and_comparisons() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[4], &[1.0, 5.0, f32::NAN, 3.0]);
        lit(&mut it, 1, &[4], &[2.0, 5.0, 0.0, f32::NAN]);
        let mut bin = |op| run(&mut it, binary_instr(op, val(0), val(1)));
        assert_tensor(&bin(BinaryOp::Maximum), &[4], &[2.0, 5.0, f32::NAN, f32::NAN]);
        assert_tensor(&bin(BinaryOp::Minimum), &[4], &[1.0, 5.0, f32::NAN, f32::NAN]);
        // Comparisons give bools (NaN compares false but for `ne`).
        let bools = |t: HostTensor| match t.data {
            Elements::Bool(b) => b.iter().map(|&b| u8::from(b)).collect::<Vec<_>>(),
            d => panic!("a comparison gave {:?}", d.dtype()),
        };
        assert_eq!(bools(bin(BinaryOp::Eq)), [0, 1, 0, 0]);
        assert_eq!(bools(bin(BinaryOp::Ne)), [1, 0, 1, 1]);
        assert_eq!(bools(bin(BinaryOp::Lt)), [1, 0, 0, 0]);
        assert_eq!(bools(bin(BinaryOp::Le)), [1, 1, 0, 0]);
        assert_eq!(bools(bin(BinaryOp::Gt)), [0, 0, 0, 0]);
        assert_eq!(bools(bin(BinaryOp::Ge)), [0, 1, 0, 0]);
        // IEEE (and NumPy): nan ** 0 is 1.
        assert_tensor(&bin(BinaryOp::Pow), &[4], &[1.0, 3125.0, 1.0, f32::NAN]);
    }

    /// Every dtype through the op families, values as PyTorch 2 gives them.
    #[test]
    fn dtypes_follow_pytorch() {
        let mut it = Interpreter::new();
        typed(&mut it, 0, &[3], vec![i32::MAX, -7, 6]);
        typed(&mut it, 1, &[3], vec![1i32, 2, 4]);
        // i32 arithmetic wraps; true division gives f32; a fractional scalar gives f32, an
        // integral one keeps i32.
        let t = run(&mut it, binary_instr(BinaryOp::Add, val(0), val(1)));
        assert_eq!(t.data, Elements::I32(vec![i32::MIN, -5, 10]));
        let t = run(&mut it, binary_instr(BinaryOp::Div, val(0), val(1)));
        assert_eq!(t.data, Elements::F32(vec![i32::MAX as f32, -3.5, 1.5]));
        let t = run(&mut it, binary_instr(BinaryOp::Mul, val(1), Operand::Scalar(0.5)));
        assert_eq!(t.data, Elements::F32(vec![0.5, 1.0, 2.0]));
        let t = run(&mut it, binary_instr(BinaryOp::Mul, val(1), Operand::Scalar(3.0)));
        assert_eq!(t.data, Elements::I32(vec![3, 6, 12]));
        // exp of an integer is f32; sums of i32 are i64; a mean of integers is refused.
        let t = run(&mut it, Instr::Unary { dst: v(2), op: UnaryOp::Exp, src: v(1) });
        assert_eq!(t.ty.dtype, DType::F32);
        let t = run(&mut it, Instr::Reduce { dst: v(2), op: ReduceOp::Sum, src: v(0), axes: None, keepdim: false });
        assert_eq!(t.data, Elements::I64(vec![i64::from(i32::MAX) - 1]));
        let mean = Instr::Reduce { dst: v(2), op: ReduceOp::Mean, src: v(0), axes: None, keepdim: false };
        assert!(it.execute(&mean).unwrap_err().to_string().contains("`mean` does not take dtype i32"));
        // i32 with f16 promotes to f16; f16 with bf16 to f32; f64 keeps its precision.
        typed(&mut it, 3, &[3], vec![half::f16::from_f32(0.5), half::f16::from_f32(2049.0), half::f16::MAX]);
        let t = run(&mut it, binary_instr(BinaryOp::Add, val(1), val(3)));
        // f16 holds 2049 as 2048 (its spacing is 2 there), plus 2 is 2050; MAX + 4 rounds
        // back to MAX.
        assert_eq!(t.data.to_f32(), vec![1.5, 2050.0, 65504.0]);
        typed(&mut it, 4, &[3], vec![half::bf16::ONE; 3]);
        assert_eq!(run(&mut it, binary_instr(BinaryOp::Add, val(3), val(4))).ty.dtype, DType::F32);
        typed(&mut it, 5, &[2], vec![0.1f64, 1e300]);
        let t = run(&mut it, binary_instr(BinaryOp::Mul, val(5), Operand::Scalar(3.0)));
        assert_eq!(t.data, Elements::F64(vec![0.1 * 3.0, 3e300]));
        // Casts: floats truncate toward zero, nonzero is true, i64 wraps into i32.
        typed(&mut it, 6, &[4], vec![-1.7f32, 2.9, 0.0, f32::NAN]);
        let t = run(&mut it, Instr::Cast { dst: v(7), src: v(6), dtype: DType::I32 });
        assert_eq!(t.data, Elements::I32(vec![-1, 2, 0, 0]));
        let t = run(&mut it, Instr::Cast { dst: v(7), src: v(6), dtype: DType::Bool });
        assert_eq!(t.data, Elements::Bool(vec![true, true, false, true]));
        typed(&mut it, 8, &[1], vec![(1i64 << 32) + 5]);
        let t = run(&mut it, Instr::Cast { dst: v(7), src: v(8), dtype: DType::I32 });
        assert_eq!(t.data, Elements::I32(vec![5]));
        // Integer matmul wraps; f64 matmul is exact here; structural ops keep the dtype.
        typed(&mut it, 9, &[2, 2], vec![1i64, 2, 3, 4]);
        let t = run(&mut it, Instr::MatMul { dst: v(10), lhs: v(9), rhs: v(9) });
        assert_eq!(t.data, Elements::I64(vec![7, 10, 15, 22]));
        let t = run(&mut it, Instr::Transpose { dst: v(10), src: v(9), dim0: 0, dim1: 1 });
        assert_eq!(t.data, Elements::I64(vec![1, 3, 2, 4]));
        typed(&mut it, 11, &[2], vec![true, false]);
        let t = run(&mut it, Instr::Concat { dst: v(12), srcs: vec![v(11), v(11)], axis: 0 });
        assert_eq!(t.data, Elements::Bool(vec![true, false, true, false]));
        // bool + int scalar is i64; max of bools is a bool.
        let t = run(&mut it, binary_instr(BinaryOp::Add, val(11), Operand::Scalar(1.0)));
        assert_eq!(t.data, Elements::I64(vec![2, 1]));
        let t = run(&mut it, Instr::Reduce { dst: v(12), op: ReduceOp::Max, src: v(11), axes: None, keepdim: false });
        assert_eq!(t.data, Elements::Bool(vec![true]));
        // The bytes held count each dtype's size.
        let before = it.live_bytes();
        typed(&mut it, 13, &[4], vec![0u8; 4].into_iter().map(|_| 0.5f64).collect::<Vec<_>>());
        assert_eq!(it.live_bytes() - before, 32);
    }

    #[test]
    fn where_broadcasts_three_ways() {
        let mut it = Interpreter::new();
        typed(&mut it, 0, &[2, 1], vec![true, false]);
        lit(&mut it, 1, &[3], &[1.0, 2.0, 3.0]);
        let t = run(&mut it, Instr::Where { dst: v(2), cond: v(0), on_true: val(1), on_false: Operand::Scalar(-1.0) });
        assert_tensor(&t, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
        typed(&mut it, 3, &[3], vec![false, true, true]);
        let t = run(
            &mut it,
            Instr::Where { dst: v(4), cond: v(3), on_true: Operand::Scalar(7.0), on_false: Operand::Scalar(8.0) },
        );
        assert_tensor(&t, &[3], &[8.0, 7.0, 7.0]);
        // A condition that is not bool is a type error (PyTorch's rule).
        let err = it.execute(&Instr::Where { dst: v(5), cond: v(1), on_true: val(1), on_false: val(1) }).unwrap_err();
        assert!(err.to_string().contains("`where` takes a bool condition, found f32"), "{err}");
    }

    // ---- matmul ----

    #[test]
    fn matmul_2d() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        lit(&mut it, 1, &[3, 2], &[7., 8., 9., 10., 11., 12.]);
        let t = run(&mut it, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) });
        assert_tensor(&t, &[2, 2], &[58., 64., 139., 154.]);
    }

    #[test]
    fn matmul_1d_promotions() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        lit(&mut it, 1, &[3], &[1., 0., -1.]);
        lit(&mut it, 2, &[2], &[1., 1.]);
        let t = run(&mut it, Instr::MatMul { dst: v(3), lhs: v(0), rhs: v(1) });
        assert_tensor(&t, &[2], &[-2., -2.]);
        let t = run(&mut it, Instr::MatMul { dst: v(3), lhs: v(2), rhs: v(0) });
        assert_tensor(&t, &[3], &[5., 7., 9.]);
        let t = run(&mut it, Instr::MatMul { dst: v(3), lhs: v(1), rhs: v(1) });
        assert_tensor(&t, &[], &[2.]);
    }

    #[test]
    fn matmul_batched_with_broadcast() {
        let mut it = Interpreter::new();
        // [2, 1, 1, 2] @ [3, 2, 1] -> [2, 3, 1, 1]
        lit(&mut it, 0, &[2, 1, 1, 2], &[1., 2., 3., 4.]);
        lit(&mut it, 1, &[3, 2, 1], &[1., 0., 0., 1., 1., 1.]);
        let t = run(&mut it, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) });
        assert_tensor(&t, &[2, 3, 1, 1], &[1., 2., 3., 3., 4., 7.]);
        // A 1-d operand against a batch: [2] @ [3, 2, 1] -> [3, 1].
        lit(&mut it, 3, &[2], &[10., 1.]);
        let t = run(&mut it, Instr::MatMul { dst: v(4), lhs: v(3), rhs: v(1) });
        assert_tensor(&t, &[3, 1], &[10., 1., 11.]);
    }

    #[test]
    fn matmul_empty_dimensions() {
        let mut it = Interpreter::new();
        it.execute(&Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![2, 0]) }).unwrap();
        it.execute(&Instr::Zeros { dst: v(1), ty: TensorType::f32(vec![0, 3]) }).unwrap();
        let t = run(&mut it, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) });
        assert_tensor(&t, &[2, 3], &[0.0; 6]);
        it.execute(&Instr::Zeros { dst: v(5), ty: TensorType::f32(vec![0, 2]) }).unwrap();
        let t = run(&mut it, Instr::MatMul { dst: v(6), lhs: v(5), rhs: v(2) });
        assert_eq!(t.ty.shape.dims(), &[0, 3]);
        it.execute(&Instr::Zeros { dst: v(3), ty: TensorType::f32(vec![0, 2, 2]) }).unwrap();
        let t = run(&mut it, Instr::MatMul { dst: v(4), lhs: v(3), rhs: v(3) });
        assert_eq!(t.ty.shape.dims(), &[0, 2, 2]);
    }

    /// A transpose of the last two axes waits for its reader: a product reads its source
    /// through swapped strides, anything else (or a read) gets it computed, and freeing or
    /// redefining its source first computes it; either way every value reads as computed at
    /// once (`[[1, 4], [2, 5], [3, 6]]`, transposed).
    #[test]
    fn pending_transposes_read_as_computed_ones() {
        let t = |dst: u32| Instr::Transpose { dst: v(dst), src: v(0), dim0: -1, dim1: -2 };
        let fresh = || {
            let mut it = Interpreter::new();
            lit(&mut it, 0, &[3, 2], &[1., 4., 2., 5., 3., 6.]);
            lit(&mut it, 2, &[3, 2], &[7., 8., 9., 10., 11., 12.]);
            it
        };
        let transposed = [1., 2., 3., 4., 5., 6.];
        // Read by a product, then freed: nothing computed, nothing left.
        let mut it = fresh();
        it.execute(&t(1)).unwrap();
        assert_eq!((it.live_values(), it.live_bytes()), (3, 48), "pending, not computed");
        assert_tensor(
            &run(&mut it, Instr::MatMul { dst: v(3), lhs: v(1), rhs: v(2) }),
            &[2, 2],
            &[58., 64., 139., 154.],
        );
        it.execute(&Instr::Free { src: v(1) }).unwrap();
        assert_eq!(it.live_values(), 3);
        // Read out, and read by another op.
        let mut it = fresh();
        it.execute(&t(1)).unwrap();
        assert_tensor(&it.read(v(1)).unwrap(), &[2, 3], &transposed);
        assert_tensor(
            &run(&mut it, Instr::Unary { dst: v(3), op: gt_ir::UnaryOp::Neg, src: v(1) }),
            &[2, 3],
            &transposed.map(|x| -x),
        );
        // Its source freed, then redefined: it keeps the source's values of when it was made.
        for redefine in [false, true] {
            let mut it = fresh();
            it.execute(&t(1)).unwrap();
            if redefine {
                lit(&mut it, 0, &[1], &[0.]);
            } else {
                it.execute(&Instr::Free { src: v(0) }).unwrap();
            }
            assert_tensor(&it.read(v(1)).unwrap(), &[2, 3], &transposed);
            assert_tensor(
                &run(&mut it, Instr::MatMul { dst: v(3), lhs: v(1), rhs: v(2) }),
                &[2, 2],
                &[58., 64., 139., 154.],
            );
        }
        // Its source written over as a collective's result is: the same.
        let mut it = fresh();
        it.execute(&t(1)).unwrap();
        it.write(v(0), TensorType::f32(vec![1]), Elements::F32(vec![0.])).unwrap();
        assert_tensor(&it.read(v(1)).unwrap(), &[2, 3], &transposed);
        // Redefined itself (by an instruction or a write): the new value, the source left alone.
        for by_write in [false, true] {
            let mut it = fresh();
            it.execute(&t(1)).unwrap();
            if by_write {
                it.write(v(1), TensorType::f32(vec![1]), Elements::F32(vec![5.])).unwrap();
            } else {
                lit(&mut it, 1, &[1], &[5.]);
            }
            assert_tensor(&it.read(v(1)).unwrap(), &[1], &[5.]);
            assert_tensor(&run(&mut it, Instr::Unary { dst: v(3), op: gt_ir::UnaryOp::Neg, src: v(1) }), &[1], &[-5.]);
            assert_tensor(&it.read(v(0)).unwrap(), &[3, 2], &[1., 4., 2., 5., 3., 6.]);
        }
        // Read by a product of mixed dtypes, which takes the general path: computed first.
        let mut it = fresh();
        it.execute(&t(1)).unwrap();
        typed(&mut it, 2, &[3, 2], Elements::BF16([7., 8., 9., 10., 11., 12.].map(half::bf16::from_f32).to_vec()));
        assert_tensor(
            &run(&mut it, Instr::MatMul { dst: v(3), lhs: v(1), rhs: v(2) }),
            &[2, 2],
            &[58., 64., 139., 154.],
        );
        // Its own source: `%0 = transpose %0`.
        let mut it = fresh();
        it.execute(&Instr::Transpose { dst: v(0), src: v(0), dim0: 0, dim1: 1 }).unwrap();
        assert_tensor(&it.read(v(0)).unwrap(), &[2, 3], &transposed);
        // A batch of matrices, its last two axes swapped, in a batched product.
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 2, 1], &[1., 2., 3., 4.]);
        it.execute(&Instr::Transpose { dst: v(1), src: v(0), dim0: 1, dim1: 2 }).unwrap();
        assert_tensor(
            &run(&mut it, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) }),
            &[2, 2, 2],
            &[1., 2., 2., 4., 9., 12., 12., 16.],
        );
    }

    #[test]
    fn matmul_reads_transposed_operands() {
        // The transposed operand is stored row-major again, so this checks strides end to end.
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[3, 2], &[1., 4., 2., 5., 3., 6.]);
        it.execute(&Instr::Transpose { dst: v(1), src: v(0), dim0: 0, dim1: 1 }).unwrap();
        lit(&mut it, 2, &[3, 2], &[7., 8., 9., 10., 11., 12.]);
        let t = run(&mut it, Instr::MatMul { dst: v(3), lhs: v(1), rhs: v(2) });
        assert_tensor(&t, &[2, 2], &[58., 64., 139., 154.]);
    }

    // ---- reductions ----

    fn reduce_instr(op: ReduceOp, axes: Option<Vec<i64>>, keepdim: bool) -> Instr {
        Instr::Reduce { dst: v(9), op, src: v(0), axes, keepdim }
    }

    #[test]
    fn reductions() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let mut red = |op, axes, keepdim| run(&mut it, reduce_instr(op, axes, keepdim));
        assert_tensor(&red(ReduceOp::Sum, None, false), &[], &[21.]);
        assert_tensor(&red(ReduceOp::Sum, None, true), &[1, 1], &[21.]);
        assert_tensor(&red(ReduceOp::Sum, Some(vec![0]), false), &[3], &[5., 7., 9.]);
        assert_tensor(&red(ReduceOp::Sum, Some(vec![-1]), true), &[2, 1], &[6., 15.]);
        assert_tensor(&red(ReduceOp::Mean, Some(vec![1]), false), &[2], &[2., 5.]);
        assert_tensor(&red(ReduceOp::Mean, Some(vec![0]), true), &[1, 3], &[2.5, 3.5, 4.5]);
        assert_tensor(&red(ReduceOp::Max, Some(vec![0]), false), &[3], &[4., 5., 6.]);
        assert_tensor(&red(ReduceOp::Min, Some(vec![1]), true), &[2, 1], &[1., 4.]);
        assert_tensor(&red(ReduceOp::Max, Some(vec![]), false), &[2, 3], &[1., 2., 3., 4., 5., 6.]);
    }

    #[test]
    fn reduce_over_non_adjacent_axes() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3, 2], &iota(12));
        let t = run(&mut it, reduce_instr(ReduceOp::Sum, Some(vec![0, 2]), false));
        // Middle index j: sum of {2j, 2j+1, 6+2j, 7+2j}.
        assert_tensor(&t, &[3], &[14., 22., 30.]);
        let t = run(&mut it, reduce_instr(ReduceOp::Max, Some(vec![2, 0]), true));
        assert_tensor(&t, &[1, 3, 1], &[7., 9., 11.]);
    }

    #[test]
    fn reduce_nan_and_empty() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 2], &[1., f32::NAN, 3., 4.]);
        let mut red = |op| run(&mut it, reduce_instr(op, Some(vec![1]), false));
        assert_tensor(&red(ReduceOp::Max), &[2], &[f32::NAN, 4.]);
        assert_tensor(&red(ReduceOp::Min), &[2], &[f32::NAN, 3.]);
        assert_tensor(&red(ReduceOp::Sum), &[2], &[f32::NAN, 7.]);
        it.execute(&Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![2, 0]) }).unwrap();
        assert_tensor(&run(&mut it, reduce_instr(ReduceOp::Sum, Some(vec![1]), false)), &[2], &[0., 0.]);
        assert_tensor(&run(&mut it, reduce_instr(ReduceOp::Mean, None, false)), &[], &[f32::NAN]);
        assert_tensor(&run(&mut it, reduce_instr(ReduceOp::Sum, Some(vec![0]), false)), &[0], &[]);
        // Max over an empty axis has no value: the type rule refuses it.
        let err = it.execute(&reduce_instr(ReduceOp::Max, Some(vec![1]), false)).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { op: "max", source: TypeError::EmptyReduction { .. } }));
    }

    // ---- layout ops ----

    #[test]
    fn transpose_and_permute() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let t = run(&mut it, Instr::Transpose { dst: v(1), src: v(0), dim0: -1, dim1: 0 });
        assert_tensor(&t, &[3, 2], &[1., 4., 2., 5., 3., 6.]);
        lit(&mut it, 2, &[2, 3, 4], &iota(24));
        let t = run(&mut it, Instr::Permute { dst: v(3), src: v(2), perm: vec![2, 0, -2] });
        assert_eq!(t.ty.shape.dims(), &[4, 2, 3]);
        // Result [k, i, j] = input [i, j, k] = 12i + 4j + k.
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    assert_eq!(t.to_f32()[k * 6 + i * 3 + j], (12 * i + 4 * j + k) as f32);
                }
            }
        }
    }

    #[test]
    fn reshape_squeeze_unsqueeze() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &iota(6));
        let t = run(&mut it, Instr::Reshape { dst: v(1), src: v(0), shape: vec![3, -1] });
        assert_tensor(&t, &[3, 2], &iota(6));
        let t = run(&mut it, Instr::Reshape { dst: v(1), src: v(0), shape: vec![-1] });
        assert_tensor(&t, &[6], &iota(6));
        lit(&mut it, 2, &[1, 3, 1], &[1., 2., 3.]);
        let t = run(&mut it, Instr::Squeeze { dst: v(3), src: v(2), axes: None });
        assert_tensor(&t, &[3], &[1., 2., 3.]);
        let t = run(&mut it, Instr::Squeeze { dst: v(3), src: v(2), axes: Some(vec![-1]) });
        assert_tensor(&t, &[1, 3], &[1., 2., 3.]);
        let t = run(&mut it, Instr::Unsqueeze { dst: v(3), src: v(0), axis: -1 });
        assert_tensor(&t, &[2, 3, 1], &iota(6));
        let t = run(&mut it, Instr::Unsqueeze { dst: v(3), src: v(0), axis: 1 });
        assert_tensor(&t, &[2, 1, 3], &iota(6));
        // A reshape of a transposed (re-stored) value uses its new row-major order.
        it.execute(&Instr::Transpose { dst: v(4), src: v(0), dim0: 0, dim1: 1 }).unwrap();
        let t = run(&mut it, Instr::Reshape { dst: v(5), src: v(4), shape: vec![6] });
        assert_tensor(&t, &[6], &[0., 3., 1., 4., 2., 5.]);
    }

    #[test]
    fn broadcast_to_and_concat() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 1], &[1., 2.]);
        let t = run(&mut it, Instr::BroadcastTo { dst: v(1), src: v(0), shape: vec![3, 2, 2] });
        assert_tensor(&t, &[3, 2, 2], &[1., 1., 2., 2., 1., 1., 2., 2., 1., 1., 2., 2.]);
        // One element filled; a row (leading ones or not) repeated whole; nothing to repeat.
        lit(&mut it, 4, &[1, 1], &[7.]);
        let t = run(&mut it, Instr::BroadcastTo { dst: v(1), src: v(4), shape: vec![2, 3] });
        assert_tensor(&t, &[2, 3], &[7.; 6]);
        lit(&mut it, 4, &[1, 3], &[1., 2., 3.]);
        let t = run(&mut it, Instr::BroadcastTo { dst: v(1), src: v(4), shape: vec![2, 1, 3] });
        assert_tensor(&t, &[2, 1, 3], &[1., 2., 3., 1., 2., 3.]);
        lit(&mut it, 4, &[3], &[1., 2., 3.]);
        let t = run(&mut it, Instr::BroadcastTo { dst: v(1), src: v(4), shape: vec![0, 3] });
        assert_tensor(&t, &[0, 3], &[]);
        lit(&mut it, 2, &[2, 2], &[3., 4., 5., 6.]);
        let t = run(&mut it, Instr::Concat { dst: v(3), srcs: vec![v(0), v(2), v(0)], axis: -1 });
        assert_tensor(&t, &[2, 4], &[1., 3., 4., 1., 2., 5., 6., 2.]);
        let t = run(&mut it, Instr::Concat { dst: v(3), srcs: vec![v(2), v(2)], axis: 0 });
        assert_tensor(&t, &[4, 2], &[3., 4., 5., 6., 3., 4., 5., 6.]);
        let t = run(&mut it, Instr::Concat { dst: v(3), srcs: vec![v(2)], axis: 0 });
        assert_tensor(&t, &[2, 2], &[3., 4., 5., 6.]);
    }

    // ---- slicing ----

    fn slice_of(it: &mut Interpreter, index: Vec<SliceItem>) -> HostTensor {
        run(it, Instr::Slice { dst: v(9), src: v(0), index })
    }

    #[test]
    fn slice_ranges_and_negative_steps() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[6], &iota(6));
        assert_tensor(&slice_of(&mut it, vec![range(None, None, -1)]), &[6], &[5., 4., 3., 2., 1., 0.]);
        assert_tensor(&slice_of(&mut it, vec![range(Some(5), Some(1), -2)]), &[2], &[5., 3.]);
        assert_tensor(&slice_of(&mut it, vec![range(Some(-2), None, -3)]), &[2], &[4., 1.]);
        assert_tensor(&slice_of(&mut it, vec![range(Some(1), Some(-1), 2)]), &[2], &[1., 3.]);
        assert_tensor(&slice_of(&mut it, vec![range(Some(-100), Some(100), 1)]), &[6], &iota(6));
        assert_tensor(&slice_of(&mut it, vec![range(Some(4), Some(2), 1)]), &[0], &[]);
        assert_tensor(&slice_of(&mut it, vec![range(Some(1), Some(4), -1)]), &[0], &[]);
    }

    #[test]
    fn slice_indices_ellipsis_and_new_axes() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3, 4], &iota(24));
        // x[1] drops the first axis.
        let t = slice_of(&mut it, vec![SliceItem::Index(1)]);
        assert_tensor(&t, &[3, 4], &(12..24).map(|i| i as f32).collect::<Vec<_>>());
        // x[..., -1]: last column of every row.
        let t = slice_of(&mut it, vec![SliceItem::Ellipsis, SliceItem::Index(-1)]);
        assert_tensor(&t, &[2, 3], &[3., 7., 11., 15., 19., 23.]);
        // x[0, new, ::2, 1]
        let t =
            slice_of(&mut it, vec![SliceItem::Index(0), SliceItem::NewAxis, range(None, None, 2), SliceItem::Index(1)]);
        assert_tensor(&t, &[1, 2], &[1., 9.]);
        // x[new, ..., new] keeps everything between two new axes.
        let t = slice_of(&mut it, vec![SliceItem::NewAxis, SliceItem::Ellipsis, SliceItem::NewAxis]);
        assert_tensor(&t, &[1, 2, 3, 4, 1], &iota(24));
        // x[::-1, 1, ::-2]
        let t = slice_of(&mut it, vec![range(None, None, -1), SliceItem::Index(1), range(None, None, -2)]);
        assert_tensor(&t, &[2, 2], &[19., 17., 7., 5.]);
        // A single index on a 1-d tensor gives a 0-d one.
        lit(&mut it, 0, &[3], &[7., 8., 9.]);
        assert_tensor(&slice_of(&mut it, vec![SliceItem::Index(-1)]), &[], &[9.]);
    }

    // ---- split ----

    fn split_of(it: &mut Interpreter, axis: i64, spec: SplitSpec, pieces: u32) -> Vec<HostTensor> {
        let dsts: Vec<ValueId> = (10..10 + pieces).map(v).collect();
        it.execute(&Instr::Split { dsts: dsts.clone(), src: v(0), axis, spec }).unwrap();
        dsts.into_iter().map(|d| it.read(d).unwrap()).collect()
    }

    #[test]
    fn split_and_chunk() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[5, 2], &iota(10));
        let p = split_of(&mut it, 0, SplitSpec::Size(2), 3);
        assert_tensor(&p[0], &[2, 2], &[0., 1., 2., 3.]);
        assert_tensor(&p[1], &[2, 2], &[4., 5., 6., 7.]);
        assert_tensor(&p[2], &[1, 2], &[8., 9.]);
        let p = split_of(&mut it, -1, SplitSpec::Sizes(vec![1, 1]), 2);
        assert_tensor(&p[0], &[5, 1], &[0., 2., 4., 6., 8.]);
        assert_tensor(&p[1], &[5, 1], &[1., 3., 5., 7., 9.]);
        // chunk 3 of 5: pieces of ceil(5/3) = 2.
        let p = split_of(&mut it, 0, SplitSpec::Chunks(3), 3);
        let sizes: Vec<usize> = p.iter().map(|t| t.ty.shape.dims()[0]).collect();
        assert_eq!(sizes, [2, 2, 1]);
        // chunk 4 of 5 gives only 3 pieces, as in torch.
        let p = split_of(&mut it, 0, SplitSpec::Chunks(4), 3);
        assert_tensor(&p[2], &[1, 2], &[8., 9.]);
        let err = it
            .execute(&Instr::Split { dsts: vec![v(1); 4], src: v(0), axis: 0, spec: SplitSpec::Chunks(4) })
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Type { op: "chunk", source: TypeError::SplitResults { .. } }));
    }

    // ---- value lifetime ----

    #[test]
    fn overwrite_free_get_and_accounting() {
        let mut it = Interpreter::new();
        assert_eq!((it.live_values(), it.live_bytes()), (0, 0));
        lit(&mut it, 0, &[2], &[1., 2.]);
        lit(&mut it, 1, &[3], &[1., 2., 3.]);
        assert_eq!((it.live_values(), it.live_bytes()), (2, 20));
        // Re-running a loop body redefines a value, even from itself.
        let t = run(&mut it, binary_instr(BinaryOp::Add, val(0), val(0)));
        assert_tensor(&t, &[2], &[2., 4.]);
        it.execute(&Instr::Binary { dst: v(0), op: BinaryOp::Mul, lhs: val(0), rhs: Operand::Scalar(3.0) }).unwrap();
        assert_tensor(&it.read(v(0)).unwrap(), &[2], &[3., 6.]);
        it.execute(&Instr::GetData { src: v(0) }).unwrap();
        it.execute(&Instr::Free { src: v(0) }).unwrap();
        assert_eq!(it.live_values(), 2);
        assert_eq!(it.read(v(0)).unwrap_err(), RuntimeError::Undefined { op: "get", value: v(0) });
        assert_eq!(
            it.execute(&Instr::Free { src: v(0) }).unwrap_err(),
            RuntimeError::Undefined { op: "free", value: v(0) }
        );
        assert!(it.execute(&Instr::GetData { src: v(0) }).is_err());
    }

    #[test]
    fn runs_through_the_executor_trait() {
        fn drive<E: Executor>(e: &mut E) -> HostTensor {
            e.execute(&Instr::Full { dst: v(0), ty: TensorType::f32(vec![2]), value: 3.0 }).unwrap();
            e.execute(&Instr::Unary { dst: v(1), op: UnaryOp::Sqrt, src: v(0) }).unwrap();
            e.read(v(1)).unwrap()
        }
        assert_tensor(&drive(&mut Interpreter::default()), &[2], &[3f32.sqrt(); 2]);
    }

    // ---- errors ----

    #[test]
    fn undefined_operands_are_errors() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2], &[1., 2.]);
        let err = it.execute(&binary_instr(BinaryOp::Add, val(0), val(3))).unwrap_err();
        assert_eq!(err, RuntimeError::Undefined { op: "add", value: v(3) });
        assert_eq!(err.to_string(), "add: value %3 is not defined");
        let err = it.execute(&Instr::Concat { dst: v(1), srcs: vec![v(0), v(7)], axis: 0 }).unwrap_err();
        assert_eq!(err, RuntimeError::Undefined { op: "concat", value: v(7) });
        // Nothing was defined by the failed instructions.
        assert_eq!(it.live_values(), 1);
    }

    #[test]
    fn type_errors_leave_state_unchanged() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[2, 3], &iota(6));
        lit(&mut it, 1, &[4], &iota(4));
        let err = it.execute(&binary_instr(BinaryOp::Add, val(0), val(1))).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { op: "add", source: TypeError::Broadcast { .. } }), "{err}");
        assert!(err.to_string().starts_with("add: cannot broadcast [2, 3] with [4]"), "{err}");
        let bad = [
            Instr::MatMul { dst: v(5), lhs: v(0), rhs: v(0) },
            Instr::Reshape { dst: v(5), src: v(0), shape: vec![4, -1] },
            Instr::Transpose { dst: v(5), src: v(0), dim0: 0, dim1: 2 },
            Instr::Permute { dst: v(5), src: v(0), perm: vec![0, 0] },
            Instr::Squeeze { dst: v(5), src: v(0), axes: Some(vec![0]) },
            Instr::Concat { dst: v(5), srcs: vec![v(0), v(1)], axis: 0 },
            Instr::Concat { dst: v(5), srcs: vec![], axis: 0 },
            Instr::Slice { dst: v(5), src: v(0), index: vec![SliceItem::Index(2)] },
            Instr::Slice { dst: v(5), src: v(0), index: vec![range(None, None, 0)] },
            Instr::BroadcastTo { dst: v(5), src: v(0), shape: vec![3, 3] },
            Instr::Split { dsts: vec![v(5)], src: v(0), axis: 1, spec: SplitSpec::Sizes(vec![1, 1]) },
            Instr::Literal { dst: v(5), ty: TensorType::f32(vec![2]), data: gt_ir::data::Elements::F32(vec![1.0]) },
            Instr::Randn { dst: v(5), ty: TensorType::new(DType::I32, vec![2]), seed: 1 },
            Instr::Full { dst: v(5), ty: TensorType::new(DType::I32, vec![2]), value: 0.5 },
            Instr::Arange { dst: v(5), dtype: DType::F32, start: 0.0, end: 1.0, step: 0.0 },
            Instr::Reduce { dst: v(5), op: ReduceOp::Sum, src: v(0), axes: Some(vec![1, -1]), keepdim: false },
        ];
        for instr in bad {
            let err = it.execute(&instr).unwrap_err();
            assert!(matches!(err, RuntimeError::Type { .. }), "{instr:?}: {err}");
        }
        assert_eq!(it.live_values(), 2);
    }

    #[test]
    fn oversized_results_are_refused_before_allocation() {
        let mut it = Interpreter::new();
        let err =
            it.execute(&Instr::Randn { dst: v(0), ty: TensorType::f32(vec![10_000_000_000]), seed: 0 }).unwrap_err();
        assert_eq!(err.to_string(), "randn: result needs 40000000000 bytes, over the limit of 8589934592");
        // Element counts past usize saturate rather than wrap.
        let huge = 1usize << 40;
        lit(&mut it, 0, &[1], &[1.0]);
        it.execute(&Instr::Zeros { dst: v(1), ty: TensorType::f32(vec![huge, 0]) }).unwrap();
        it.execute(&Instr::Zeros { dst: v(2), ty: TensorType::f32(vec![0, huge]) }).unwrap();
        let err = it.execute(&Instr::BroadcastTo { dst: v(3), src: v(0), shape: vec![huge, huge] }).unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge { .. } | RuntimeError::Type { .. }), "{err}");
        // A small limit applies to every op.
        let mut small = Interpreter::with_max_tensor_bytes(64);
        assert_eq!(small.max_tensor_bytes(), 64);
        lit(&mut small, 0, &[16], &iota(16));
        let err = small.execute(&Instr::Ones { dst: v(1), ty: TensorType::f32(vec![17]) }).unwrap_err();
        assert_eq!(err, RuntimeError::TooLarge { op: "ones", bytes: 68, limit: 64 });
        lit(&mut small, 2, &[2, 1], &[1., 2.]);
        let err = small.execute(&binary_instr(BinaryOp::Add, val(0), val(2))).unwrap_err();
        assert_eq!(err, RuntimeError::TooLarge { op: "add", bytes: 128, limit: 64 });
        let err = small.execute(&Instr::MatMul { dst: v(3), lhs: v(2), rhs: v(0) }).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { .. }), "{err}");
        assert_eq!(small.live_values(), 2);
    }

    #[test]
    fn absurd_shapes_of_empty_tensors_do_not_panic() {
        let mut it = Interpreter::new();
        let big = 1usize << 40;
        // No bytes, but no way to address it either.
        let err = it.execute(&Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![usize::MAX, 0]) }).unwrap_err();
        // The type rule bounds every dimension, so these never reach the allocator.
        assert!(matches!(err, RuntimeError::Type { op: "zeros", source: TypeError::TooLarge { .. } }), "{err}");
        let err = it.execute(&Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![big, 2, 0]) }).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { source: TypeError::TooLarge { .. }, .. }), "{err}");
        // At the limit it is fine, and every op on it stays in range.
        it.execute(&Instr::Zeros { dst: v(0), ty: TensorType::f32(vec![big, 0]) }).unwrap();
        let err = it.execute(&Instr::Concat { dst: v(1), srcs: vec![v(0), v(0)], axis: 0 }).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { op: "concat", source: TypeError::TooLarge { .. } }), "{err}");
        let err = it.execute(&Instr::Reshape { dst: v(1), src: v(0), shape: vec![0, -1] }).unwrap_err();
        assert!(matches!(err, RuntimeError::Type { .. }), "{err}");
        let err = it.execute(&Instr::Reshape { dst: v(1), src: v(0), shape: vec![1 << 62, 0] }).unwrap_err();
        assert!(matches!(err, RuntimeError::Extent { .. }), "{err}");
        let err = it
            .execute(&Instr::Split { dsts: vec![v(1), v(2)], src: v(0), axis: 0, spec: SplitSpec::Size(1) })
            .unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge { op: "split", .. }), "{err}");
        let err = it
            .execute(&Instr::Split { dsts: vec![v(1)], src: v(0), axis: 0, spec: SplitSpec::Chunks(usize::MAX) })
            .unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge { op: "chunk", .. }), "{err}");
        it.execute(&Instr::Split { dsts: vec![v(1), v(2)], src: v(0), axis: 0, spec: SplitSpec::Chunks(2) }).unwrap();
        assert_eq!(it.read(v(2)).unwrap().ty.shape.dims(), &[big / 2, 0]);
        let t = run(&mut it, Instr::Slice { dst: v(3), src: v(0), index: vec![range(Some(-1), None, i64::MIN)] });
        assert_eq!(t.ty.shape.dims(), &[1, 0]);
        let t = run(&mut it, reduce_instr_on(v(0), ReduceOp::Mean, Some(vec![0])));
        assert_eq!(t.ty.shape.dims(), &[0]);
        // The mean over the empty axis is 2^40 NaNs: 4 TiB, refused.
        let err = it.execute(&reduce_instr_on(v(0), ReduceOp::Mean, Some(vec![1]))).unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge { op: "mean", .. }), "{err}");
    }

    fn reduce_instr_on(src: ValueId, op: ReduceOp, axes: Option<Vec<i64>>) -> Instr {
        Instr::Reduce { dst: v(9), op, src, axes, keepdim: false }
    }

    #[test]
    fn extreme_slice_steps_select_one_element() {
        let mut it = Interpreter::new();
        lit(&mut it, 0, &[4], &iota(4));
        let t = slice_of(&mut it, vec![range(Some(1), None, i64::MAX)]);
        assert_tensor(&t, &[1], &[1.]);
        let t = slice_of(&mut it, vec![range(None, None, i64::MIN)]);
        assert_tensor(&t, &[1], &[3.]);
        let t = slice_of(&mut it, vec![range(Some(i64::MIN), Some(i64::MAX), i64::MIN + 1)]);
        assert_tensor(&t, &[0], &[]);
    }

    // ---- property tests against naive oracles ----

    /// Deterministic test data: multiples of 0.5 in [-3, 3], so comparisons hit equality.
    fn data(seed: u64, n: usize) -> Vec<f32> {
        (0..n as u64).map(|i| (random::uniform(seed, i) * 13.0).floor() * 0.5 - 3.0).collect()
    }

    fn row_major_index(index: &[usize], dims: &[usize]) -> usize {
        index.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
    }

    fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
        let mut index = vec![0; dims.len()];
        for (i, &d) in dims.iter().enumerate().rev() {
            index[i] = flat % d;
            flat /= d;
        }
        index
    }

    /// The element of an operand of shape `dims` that broadcasting maps to `out_index`.
    fn broadcast_index(out_index: &[usize], dims: &[usize]) -> usize {
        let skip = out_index.len() - dims.len();
        let index: Vec<usize> =
            dims.iter().enumerate().map(|(i, &d)| if d == 1 { 0 } else { out_index[skip + i] }).collect();
        row_major_index(&index, dims)
    }

    fn scalar_binary(op: BinaryOp, x: f32, y: f32) -> f32 {
        let b = |c: bool| if c { 1.0 } else { 0.0 };
        match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Pow => x.powf(y),
            BinaryOp::Maximum => {
                if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.max(y)
                }
            }
            BinaryOp::Minimum => {
                if x.is_nan() || y.is_nan() {
                    f32::NAN
                } else {
                    x.min(y)
                }
            }
            BinaryOp::Eq => b(x == y),
            BinaryOp::Ne => b(x != y),
            BinaryOp::Lt => b(x < y),
            BinaryOp::Le => b(x <= y),
            BinaryOp::Gt => b(x > y),
            BinaryOp::Ge => b(x >= y),
        }
    }

    /// A shape and two shapes that broadcast to it (a suffix of it with some sizes 1).
    fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>)> {
        prop::collection::vec(0usize..4, 0..5).prop_flat_map(|out| {
            let r = out.len();
            let side = (0..=r, prop::collection::vec(any::<bool>(), r));
            (Just(out), side.clone(), side).prop_map(move |(out, (ra, ma), (rb, mb))| {
                let pick = |rank: usize, mask: &[bool]| {
                    (r - rank..r).map(|i| if mask[i] { 1 } else { out[i] }).collect::<Vec<_>>()
                };
                let (a, b) = (pick(ra, &ma), pick(rb, &mb));
                (out, a, b)
            })
        })
    }

    /// A whole operand with a bias-like one (repeated along leading axes) or a per-row one
    /// (repeated along trailing axes), on either side, split over the team when large: the
    /// broadcasting oracle's values (the random pairs of the property test below seldom make
    /// one side the whole result).
    #[test]
    fn rows_and_columns_broadcast_as_the_oracle_says() {
        threads::use_threads(2, std::time::Duration::from_micros(200)).unwrap();
        let cases: &[(&[usize], &[usize])] = &[
            (&[3, 5], &[5]),
            (&[3, 5], &[1, 5]),
            (&[3, 5], &[3, 1]),
            (&[2, 3, 4], &[3, 4]),
            (&[2, 3, 4], &[2, 1, 1]),
            (&[2, 3, 4], &[2, 3, 1]),
            (&[2, 3, 4], &[1, 1, 4]),
            (&[300, 301], &[301]),
            (&[300, 301], &[300, 1]),
        ];
        for &(out, other) in cases {
            let n: usize = out.iter().product();
            let (whole, part) = (data(7, n), data(8, other.iter().product()));
            for op in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Maximum] {
                for whole_left in [true, false] {
                    let mut it = Interpreter::new();
                    lit(&mut it, 0, out, &whole);
                    lit(&mut it, 1, other, &part);
                    let (l, r) = if whole_left { (val(0), val(1)) } else { (val(1), val(0)) };
                    let t = run(&mut it, binary_instr(op, l, r));
                    for (flat, &got) in t.to_f32().iter().enumerate() {
                        let (x, y) = (whole[flat], part[broadcast_index(&unravel(flat, out), other)]);
                        let want = if whole_left { scalar_binary(op, x, y) } else { scalar_binary(op, y, x) };
                        assert!(
                            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                            "{op:?} {out:?} {other:?} at {flat}"
                        );
                    }
                }
            }
        }
        threads::use_threads(1, std::time::Duration::ZERO).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn binary_matches_broadcasting_oracle(
            (_, a_dims, b_dims) in broadcast_pair(),
            op in prop::sample::select(BinaryOp::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let mut it = Interpreter::new();
            let (a, b) = (data(seed, a_dims.iter().product()), data(seed ^ 1, b_dims.iter().product()));
            lit(&mut it, 0, &a_dims, &a);
            lit(&mut it, 1, &b_dims, &b);
            let t = run(&mut it, binary_instr(op, val(0), val(1)));
            let out = shape::broadcast_shapes(&Shape::from(a_dims.clone()), &Shape::from(b_dims.clone())).unwrap();
            prop_assert_eq!(t.ty.shape.dims(), out.dims());
            for (flat, &got) in t.to_f32().iter().enumerate() {
                let index = unravel(flat, out.dims());
                let want = scalar_binary(op, a[broadcast_index(&index, &a_dims)], b[broadcast_index(&index, &b_dims)]);
                prop_assert!(got == want || (got.is_nan() && want.is_nan()), "{:?} at {}: {} vs {}", op, flat, got, want);
            }
        }

        #[test]
        fn matmul_matches_triple_loop(
            (_, a_batch, b_batch) in broadcast_pair(),
            (m, k, n) in (0usize..5, 0usize..5, 0usize..5),
            (a_vec, b_vec) in (any::<bool>(), any::<bool>()),
            seed in any::<u64>(),
        ) {
            // 1-d operands have no batch dimensions.
            let (a_batch, b_batch) = (if a_vec { vec![] } else { a_batch }, if b_vec { vec![] } else { b_batch });
            let a_dims: Vec<usize> = if a_vec { vec![k] } else { a_batch.iter().copied().chain([m, k]).collect() };
            let b_dims: Vec<usize> = if b_vec { vec![k] } else { b_batch.iter().copied().chain([k, n]).collect() };
            let (m, n) = (if a_vec { 1 } else { m }, if b_vec { 1 } else { n });
            let (a, b) = (data(seed, a_dims.iter().product()), data(seed ^ 1, b_dims.iter().product()));
            let mut it = Interpreter::new();
            lit(&mut it, 0, &a_dims, &a);
            lit(&mut it, 1, &b_dims, &b);
            let t = run(&mut it, Instr::MatMul { dst: v(2), lhs: v(0), rhs: v(1) });
            let ty = shape::matmul_type(&TensorType::f32(a_dims), &TensorType::f32(b_dims)).unwrap();
            prop_assert_eq!(&t.ty, &ty);
            let batch = shape::broadcast_shapes(&Shape::from(a_batch.clone()), &Shape::from(b_batch.clone())).unwrap();
            let mut want = Vec::new();
            for flat in 0..batch.numel() {
                let index = unravel(flat, batch.dims());
                let (ao, bo) = (broadcast_index(&index, &a_batch) * m * k, broadcast_index(&index, &b_batch) * k * n);
                for i in 0..m {
                    for j in 0..n {
                        want.push((0..k).map(|p| a[ao + i * k + p] * b[bo + p * n + j]).sum::<f32>());
                    }
                }
            }
            prop_assert_eq!(t.data.len(), want.len());
            for (got, want) in t.to_f32().iter().zip(&want) {
                prop_assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{} vs {}", got, want);
            }
        }

        #[test]
        fn slice_matches_gather_oracle(
            dims in prop::collection::vec(0usize..6, 1..4),
            items in prop::collection::vec(
                prop_oneof![
                    (prop::option::of(-8i64..8), prop::option::of(-8i64..8), prop::sample::select(vec![-3i64, -2, -1, 1, 2, 3]))
                        .prop_map(|(start, end, step)| SliceItem::Range { start, end, step }),
                    (-6i64..6).prop_map(SliceItem::Index),
                    Just(SliceItem::NewAxis),
                    Just(SliceItem::Ellipsis),
                ],
                0..4,
            ),
            seed in any::<u64>(),
        ) {
            let a = data(seed, dims.iter().product());
            let mut it = Interpreter::new();
            lit(&mut it, 0, &dims, &a);
            let instr = Instr::Slice { dst: v(1), src: v(0), index: items.clone() };
            match shape::resolve_slice(&items, &Shape::from(dims.clone())) {
                Err(_) => prop_assert!(it.execute(&instr).is_err()),
                Ok(resolved) => {
                    let t = run(&mut it, instr);
                    prop_assert_eq!(t.ty.shape.dims(), resolved.shape.dims());
                    // Gather: every combination of selected indices, in row-major order.
                    let picks: Vec<Vec<usize>> = resolved
                        .axes
                        .iter()
                        .map(|s| (0..s.len).map(|j| (s.start as i64 + j as i64 * s.step) as usize).collect())
                        .collect();
                    let counts: Vec<usize> = picks.iter().map(Vec::len).collect();
                    let want: Vec<f32> = (0..counts.iter().product())
                        .map(|flat| {
                            let index: Vec<usize> = unravel(flat, &counts).iter().zip(&picks).map(|(&j, p)| p[j]).collect();
                            a[row_major_index(&index, &dims)]
                        })
                        .collect();
                    prop_assert_eq!(t.to_f32(), want);
                }
            }
        }

        #[test]
        fn reduce_matches_bucket_oracle(
            dims in prop::collection::vec(0usize..4, 0..4),
            axes_mask in prop::collection::vec(any::<bool>(), 4),
            all in any::<bool>(),
            keepdim in any::<bool>(),
            op in prop::sample::select(ReduceOp::ALL.to_vec()),
            seed in any::<u64>(),
        ) {
            let rank = dims.len();
            let reduced: Vec<usize> = if all { (0..rank).collect() } else { (0..rank).filter(|&i| axes_mask[i]).collect() };
            let axes = if all { None } else { Some(reduced.iter().map(|&i| i as i64 - rank as i64).collect()) };
            let a = data(seed, dims.iter().product());
            let mut it = Interpreter::new();
            lit(&mut it, 0, &dims, &a);
            let instr = Instr::Reduce { dst: v(1), op, src: v(0), axes, keepdim };
            let empty = reduced.iter().any(|&i| dims[i] == 0);
            if empty && matches!(op, ReduceOp::Max | ReduceOp::Min) {
                prop_assert!(it.execute(&instr).is_err());
                return Ok(());
            }
            let t = run(&mut it, instr);
            let out_dims: Vec<usize> = (0..rank).map(|i| if reduced.contains(&i) { 1 } else { dims[i] }).collect();
            let expect_dims: Vec<usize> = (0..rank).filter(|i| keepdim || !reduced.contains(i)).map(|i| out_dims[i]).collect();
            prop_assert_eq!(t.ty.shape.dims(), &expect_dims[..]);
            let n_out: usize = out_dims.iter().product();
            let mut buckets: Vec<Vec<f32>> = vec![Vec::new(); n_out];
            for (flat, &x) in a.iter().enumerate() {
                let mut index = unravel(flat, &dims);
                for &r in &reduced {
                    index[r] = 0;
                }
                buckets[row_major_index(&index, &out_dims)].push(x);
            }
            for (got, bucket) in t.to_f32().iter().zip(&buckets) {
                let sum: f64 = bucket.iter().map(|&x| f64::from(x)).sum();
                let want = match op {
                    ReduceOp::Sum => sum as f32,
                    ReduceOp::Mean => (sum / bucket.len() as f64) as f32,
                    ReduceOp::Max => bucket.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    ReduceOp::Min => bucket.iter().copied().fold(f32::INFINITY, f32::min),
                };
                prop_assert!(*got == want || (got.is_nan() && want.is_nan()), "{} vs {}", got, want);
            }
        }

        #[test]
        fn malformed_instructions_never_panic(
            dims in prop::collection::vec(0usize..4, 0..4),
            axis in -5i64..5,
            shape in prop::collection::vec(-2i64..5, 0..4),
            perm in prop::collection::vec(-4i64..4, 0..4),
            size in 0usize..4,
        ) {
            let mut it = Interpreter::new();
            lit(&mut it, 0, &dims, &data(0, dims.iter().product()));
            let instrs = [
                Instr::Reshape { dst: v(1), src: v(0), shape: shape.clone() },
                Instr::Permute { dst: v(1), src: v(0), perm: perm.clone() },
                Instr::Transpose { dst: v(1), src: v(0), dim0: axis, dim1: -axis },
                Instr::Unsqueeze { dst: v(1), src: v(0), axis },
                Instr::Squeeze { dst: v(1), src: v(0), axes: Some(vec![axis]) },
                Instr::Concat { dst: v(1), srcs: vec![v(0), v(0)], axis },
                Instr::Split { dsts: vec![v(1), v(2)], src: v(0), axis, spec: SplitSpec::Size(size) },
                Instr::Split { dsts: vec![v(1), v(2)], src: v(0), axis, spec: SplitSpec::Chunks(size) },
                Instr::Reduce { dst: v(1), op: ReduceOp::Max, src: v(0), axes: Some(vec![axis]), keepdim: true },
                Instr::BroadcastTo { dst: v(1), src: v(0), shape: shape.iter().map(|&d| d.max(0) as usize).collect() },
                Instr::MatMul { dst: v(1), lhs: v(0), rhs: v(0) },
                Instr::Where { dst: v(1), cond: v(0), on_true: val(0), on_false: Operand::Scalar(1.0) },
            ];
            for instr in &instrs {
                // Ok or Err, but a result always matches the type rule.
                if it.execute(instr).is_ok() {
                    let types = shape::infer(instr, &|id| {
                        if id == v(0) { Ok(TensorType::f32(dims.clone())) } else { Err(TypeError::UnknownValue(id)) }
                    }).unwrap();
                    for (dst, ty) in instr.results().into_iter().zip(types) {
                        prop_assert_eq!(it.read(dst).unwrap().ty, ty);
                    }
                }
            }
        }
    }
}
