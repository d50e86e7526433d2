//! Tensor ops: each builds one IR instruction, types it with the verifier's rules, queues it
//! and (when gradients are on and an input requires them) records its autograd node.

use super::{Arg, Misuse, Result, Tensor, TensorError};
use crate::autograd::{GradNode, GradOp, Side};
use gt_ir::verify::shape;
use gt_ir::{BinaryOp, Instr, Operand, ReduceOp, SliceItem, SplitSpec, TensorType, TypeError, UnaryOp, ValueId};
use std::rc::Rc;

/// The operands' types for the verifier's rules.
fn types_of<'a>(inputs: &'a [&'a Tensor]) -> impl Fn(ValueId) -> Result<TensorType, TypeError> + 'a {
    move |v| inputs.iter().find(|t| t.id() == v).map(|t| t.ty().clone()).ok_or(TypeError::UnknownValue(v))
}

/// The runtime all `inputs` (at least one) belong to, or the misuse of mixing two.
fn context_of(inputs: &[&Tensor]) -> Result<Rc<super::Context>> {
    let ctx = inputs[0].ctx();
    if let Some(other) = inputs.iter().find(|t| !Rc::ptr_eq(&t.ctx(), &ctx)) {
        let misuse = Misuse::OtherRuntime {
            tensor: other.id(),
            ty: Box::new(other.ty().clone()),
            first: inputs[0].id(),
            first_ty: inputs[0].ty().clone(),
        };
        return Err(TensorError::invalid("op", misuse));
    }
    Ok(ctx)
}

/// Whether the results of an op over `inputs` get autograd nodes.
fn tracked(ctx: &super::Context, inputs: &[&Tensor]) -> bool {
    ctx.is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// The tensor of result `dst` (of type `ty`) of instruction `op` over `inputs`, with its
/// autograd node when `grad` is given.
fn result(
    ctx: &Rc<super::Context>,
    inputs: &[&Tensor],
    (op, dst, ty): (&'static str, ValueId, TensorType),
    grad: Option<GradOp>,
) -> Tensor {
    let node = grad.map(|g| {
        let node = GradNode::new(ctx, g, op, inputs, dst, ty.clone());
        ctx.record(&node);
        node
    });
    let t = Tensor::wrap(ctx.clone(), dst, ty, node.clone());
    if let Some(n) = &node {
        n.set_output(&t);
    }
    t
}

/// Runs an instruction over `inputs` (at least one), giving one tensor per result; records
/// `grad` for each result when gradients flow.
fn apply_multi(
    inputs: &[&Tensor],
    results: usize,
    make: impl FnOnce(Vec<ValueId>) -> Instr,
    grad: impl Fn(usize, &TensorType) -> Option<GradOp>,
) -> Result<Vec<Tensor>> {
    let ctx = context_of(inputs)?;
    let dsts: Vec<ValueId> = (0..results).map(|_| ctx.fresh_id()).collect();
    let instr = make(dsts.clone());
    let op = instr.mnemonic();
    let types = shape::infer(&instr, &types_of(inputs)).map_err(|source| TensorError::Type { op, source })?;
    ctx.submit(&instr)?;
    let track = tracked(&ctx, inputs);
    Ok(dsts
        .into_iter()
        .zip(types)
        .enumerate()
        .map(|(i, (dst, ty))| {
            let grad = if track { grad(i, &ty) } else { None };
            result(&ctx, inputs, (op, dst, ty), grad)
        })
        .collect())
}

/// [`apply_multi`] for an instruction of one result (no lists to build: the small-op path).
fn apply(inputs: &[&Tensor], make: impl FnOnce(ValueId) -> Instr, grad: Option<GradOp>) -> Result<Tensor> {
    let ctx = context_of(inputs)?;
    let dst = ctx.fresh_id();
    let instr = make(dst);
    let op = instr.mnemonic();
    let mut types = shape::infer(&instr, &types_of(inputs)).map_err(|source| TensorError::Type { op, source })?;
    ctx.submit(&instr)?;
    let ty = types.swap_remove(0);
    let grad = grad.filter(|_| tracked(&ctx, inputs));
    Ok(result(&ctx, inputs, (op, dst, ty), grad))
}

/// One method per elementwise op of one operand, named by its mnemonic (called with the
/// op table's rows by `gt_ir::each_unary_op!`).
macro_rules! unary_methods {
    ($($(#[$doc:meta])* $op:ident $name:ident;)*) => {$(
        $(#[$doc])*
        #[doc = ""]
        #[doc = concat!("Elementwise: `", stringify!($name), "` of the op table (`gt_ir::UnaryOp::", stringify!($op), "`).")]
        pub fn $name(&self) -> Result<Tensor> {
            self.unary(UnaryOp::$op)
        }
    )*};
}

/// One method per elementwise op of two operands (a tensor or a scalar on the right), named
/// by its mnemonic (called with the op table's rows by `gt_ir::each_binary_op!`).
macro_rules! binary_methods {
    ($($(#[$doc:meta])* $op:ident $name:ident;)*) => {$(
        $(#[$doc])*
        #[doc = ""]
        #[doc = concat!("Elementwise with NumPy broadcasting: `", stringify!($name), "` of the op table (`gt_ir::BinaryOp::", stringify!($op), "`).")]
        pub fn $name<'a>(&self, rhs: impl Into<Arg<'a>>) -> Result<Tensor> {
            self.binary(BinaryOp::$op, rhs)
        }
    )*};
}

impl Tensor {
    /// The elementwise op `op` of the op table (what the named methods call).
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if let Some(t) = super::autocast::unary_operand(op, self)? {
            return t.unary(op);
        }
        apply(&[self], |dst| Instr::Unary { dst, op, src: self.id() }, Some(GradOp::Unary(op)))
    }

    fn binary<'a>(&self, op: BinaryOp, rhs: impl Into<Arg<'a>>) -> Result<Tensor> {
        binary(op, Arg::Tensor(self), rhs.into())
    }

    /// The tensor converted to `dtype` (PyTorch's `.to(dtype)`): floats to integers truncate
    /// toward zero, integers wrap to a narrower one, anything nonzero becomes `true`. The
    /// gradient flows back through a cast between float dtypes.
    pub fn to(&self, dtype: gt_ir::DType) -> Result<Tensor> {
        let grad = (self.dtype().is_float() && dtype.is_float()).then_some(GradOp::Cast);
        apply(&[self], |dst| Instr::Cast { dst, src: self.id(), dtype }, grad)
    }

    gt_ir::each_unary_op!(unary_methods);

    gt_ir::each_binary_op!(binary_methods);

    /// `scalar - self` (the operators write it `2.0 - &x`).
    pub fn rsub(&self, lhs: f64) -> Result<Tensor> {
        binary(BinaryOp::Sub, Arg::Scalar(lhs), Arg::Tensor(self))
    }
    /// `scalar / self`.
    pub fn rdiv(&self, lhs: f64) -> Result<Tensor> {
        binary(BinaryOp::Div, Arg::Scalar(lhs), Arg::Tensor(self))
    }

    /// Matrix product (1-d operands promoted as in NumPy, batch axes broadcast).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some((l, r)) = super::autocast::matmul_operands(self, rhs)? {
            if (l.id(), r.id()) != (self.id(), rhs.id()) {
                return l.matmul(&r);
            }
        }
        apply(&[self, rhs], |dst| Instr::MatMul { dst, lhs: self.id(), rhs: rhs.id() }, Some(GradOp::MatMul))
    }

    fn reduce(&self, op: ReduceOp, axes: Option<&[i64]>, keepdim: bool) -> Result<Tensor> {
        if let Some(t) = super::autocast::reduce_operand(self)? {
            return t.reduce(op, axes, keepdim);
        }
        let axes = axes.map(|a| a.to_vec());
        let grad = GradOp::Reduce { op, axes: axes.clone(), keepdim };
        apply(&[self], |dst| Instr::Reduce { dst, op, src: self.id(), axes, keepdim }, Some(grad))
    }

    /// Sum of every element (0-d).
    pub fn sum(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, None, false)
    }
    /// Sum over `axes` (negative count from the end), keeping them as size 1 when `keepdim`.
    pub fn sum_dims(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, Some(axes), keepdim)
    }
    /// Mean of every element.
    pub fn mean(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, None, false)
    }
    /// Mean over `axes`.
    pub fn mean_dims(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, Some(axes), keepdim)
    }
    /// Largest element.
    pub fn max(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, None, false)
    }
    /// Largest over `axes` (the gradient is shared among ties).
    pub fn max_dims(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, Some(axes), keepdim)
    }
    /// Smallest element.
    pub fn min(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, None, false)
    }
    /// Smallest over `axes`.
    pub fn min_dims(&self, axes: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, Some(axes), keepdim)
    }

    /// Swaps two axes.
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        apply(
            &[self],
            |dst| Instr::Transpose { dst, src: self.id(), dim0, dim1 },
            Some(GradOp::Transpose { dim0, dim1 }),
        )
    }
    /// Swaps the last two axes (a tensor of rank below 2 is returned as it is).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(-2, -1)
    }
    /// Reorders axes: result axis `i` is axis `perm[i]`.
    pub fn permute(&self, perm: &[i64]) -> Result<Tensor> {
        let perm = perm.to_vec();
        let grad = GradOp::Permute { perm: perm.clone() };
        apply(&[self], |dst| Instr::Permute { dst, src: self.id(), perm }, Some(grad))
    }
    /// Same elements, new shape; one dimension may be `-1`.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let shape = shape.to_vec();
        apply(&[self], |dst| Instr::Reshape { dst, src: self.id(), shape }, Some(GradOp::Reshape))
    }
    /// Removes `axis` where its size is 1; another axis stays, as in PyTorch.
    pub fn squeeze(&self, axis: i64) -> Result<Tensor> {
        // As PyTorch's: an axis that is not 1 stays (the instruction, as NumPy's, refuses it).
        if let Ok(a) = shape::normalize_axis(axis, self.rank()) {
            if self.shape()[a] != 1 {
                let dims: Vec<i64> = self.shape().iter().map(|&d| d as i64).collect();
                return self.reshape(&dims);
            }
        }
        apply(&[self], |dst| Instr::Squeeze { dst, src: self.id(), axes: Some(vec![axis]) }, Some(GradOp::Reshape))
    }
    /// Removes every axis of size 1.
    pub fn squeeze_all(&self) -> Result<Tensor> {
        apply(&[self], |dst| Instr::Squeeze { dst, src: self.id(), axes: None }, Some(GradOp::Reshape))
    }
    /// Inserts an axis of size 1 at `axis` (in the result's numbering).
    pub fn unsqueeze(&self, axis: i64) -> Result<Tensor> {
        apply(&[self], |dst| Instr::Unsqueeze { dst, src: self.id(), axis }, Some(GradOp::Reshape))
    }
    /// Broadcasts to a shape (NumPy rules).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        let shape = shape.to_vec();
        apply(&[self], |dst| Instr::BroadcastTo { dst, src: self.id(), shape }, Some(GradOp::BroadcastTo))
    }
    /// NumPy basic indexing: `x.slice(&s![.., 1..3])`.
    pub fn slice(&self, index: &[SliceItem]) -> Result<Tensor> {
        let index = index.to_vec();
        let grad = GradOp::Slice { index: index.clone() };
        apply(&[self], |dst| Instr::Slice { dst, src: self.id(), index }, Some(grad))
    }

    fn split_by(&self, spec: SplitSpec, axis: i64) -> Result<Vec<Tensor>> {
        let op = if matches!(spec, SplitSpec::Chunks(_)) { "chunk" } else { "split" };
        let type_error = |source| TensorError::Type { op, source };
        let ax = shape::normalize_axis(axis, self.rank()).map_err(type_error)?;
        let sizes = shape::split_sizes(&spec, self.shape()[ax], ax).map_err(type_error)?;
        let starts: Vec<usize> = sizes.iter().scan(0, |at, n| Some(std::mem::replace(at, *at + n))).collect();
        apply_multi(
            &[self],
            sizes.len(),
            |dsts| Instr::Split { dsts, src: self.id(), axis, spec },
            |i, _| Some(GradOp::SplitPiece { axis: ax, start: starts[i], len: sizes[i] }),
        )
    }
    /// Pieces of `size` along `axis` (the last one smaller when it does not divide).
    pub fn split(&self, size: usize, axis: i64) -> Result<Vec<Tensor>> {
        self.split_by(SplitSpec::Size(size), axis)
    }
    /// Pieces of exactly these sizes along `axis`.
    pub fn split_sizes(&self, sizes: &[usize], axis: i64) -> Result<Vec<Tensor>> {
        self.split_by(SplitSpec::Sizes(sizes.to_vec()), axis)
    }
    /// `chunks` pieces of equal size along `axis` (fewer when the axis is short).
    pub fn chunk(&self, chunks: usize, axis: i64) -> Result<Vec<Tensor>> {
        self.split_by(SplitSpec::Chunks(chunks), axis)
    }
}

/// An operand as the instruction names it and as its autograd node does; a tensor joins
/// `inputs`.
fn operand<'a>(a: Arg<'a>, inputs: &mut Vec<&'a Tensor>) -> (Operand, Side) {
    match a {
        Arg::Tensor(t) => {
            inputs.push(t);
            (Operand::Value(t.id()), Side::Input(inputs.len() - 1))
        }
        Arg::Scalar(s) => (Operand::Scalar(s), Side::Scalar(s)),
    }
}

/// A binary op between tensors and scalars (at least one tensor).
pub fn binary<'a>(op: BinaryOp, lhs: Arg<'a>, rhs: Arg<'a>) -> Result<Tensor> {
    // Under autocast, float tensor operands of another dtype are cast first.
    let cast = |a: &Arg<'a>| match a {
        Arg::Tensor(t) => super::autocast::binary_operand(op, t),
        Arg::Scalar(_) => Ok(None),
    };
    let (lc, rc) = (cast(&lhs)?, cast(&rhs)?);
    if lc.is_some() || rc.is_some() {
        let l = lc.as_ref().map_or(lhs, Arg::Tensor);
        let r = rc.as_ref().map_or(rhs, Arg::Tensor);
        return binary(op, l, r);
    }
    let mut inputs: Vec<&Tensor> = Vec::with_capacity(2);
    let (l, ls) = operand(lhs, &mut inputs);
    let (r, rs) = operand(rhs, &mut inputs);
    if inputs.is_empty() {
        return Err(TensorError::invalid(op.mnemonic(), Misuse::NoTensorOperand));
    }
    let grad = (!op.is_comparison()).then_some(GradOp::Binary { op, lhs: ls, rhs: rs });
    apply(&inputs, |dst| Instr::Binary { dst, op, lhs: l, rhs: r }, grad)
}

/// `cond != 0 ? on_true : on_false`, all three broadcast together (no gradient to `cond`).
pub fn where_<'a>(cond: &'a Tensor, on_true: impl Into<Arg<'a>>, on_false: impl Into<Arg<'a>>) -> Result<Tensor> {
    let mut inputs: Vec<&Tensor> = vec![cond];
    let (t, ts) = operand(on_true.into(), &mut inputs);
    let (f, fs) = operand(on_false.into(), &mut inputs);
    apply(
        &inputs,
        |dst| Instr::Where { dst, cond: cond.id(), on_true: t, on_false: f },
        Some(GradOp::Where { on_true: ts, on_false: fs }),
    )
}

/// Joins tensors along an existing axis.
pub fn cat(tensors: &[&Tensor], axis: i64) -> Result<Tensor> {
    if tensors.is_empty() {
        return Err(TensorError::Type { op: "concat", source: TypeError::ConcatEmpty });
    }
    let srcs = tensors.iter().map(|t| t.id()).collect();
    apply(tensors, |dst| Instr::Concat { dst, srcs, axis }, Some(GradOp::Concat { axis }))
}

/// Runs one IR instruction on tensors through the Tensor API (so autograd records it): each
/// operand `ValueId(k)` of `instr` names `operands[k]`; result ids are ignored (fresh ones are
/// used). Creation instructions run on the current context and keep their seeds. This is how
/// the `gt!` macro and `.gtir` training scripts execute what they lowered to IR.
pub fn apply_instr(instr: &Instr, operands: &[&Tensor]) -> Result<Vec<Tensor>> {
    let op = instr.mnemonic();
    let get = |v: &ValueId| {
        operands
            .get(v.index())
            .copied()
            .ok_or_else(|| TensorError::invalid(op, Misuse::OperandNotGiven { operand: *v, given: operands.len() }))
    };
    let arg = |o: &Operand| -> Result<Arg<'_>> {
        Ok(match o {
            Operand::Value(v) => Arg::Tensor(get(v)?),
            Operand::Scalar(s) => Arg::Scalar(*s),
        })
    };
    let one = |t: Result<Tensor>| t.map(|t| vec![t]);
    match instr {
        Instr::Randn { .. }
        | Instr::Rand { .. }
        | Instr::Zeros { .. }
        | Instr::Ones { .. }
        | Instr::Full { .. }
        | Instr::Arange { .. }
        | Instr::Literal { .. } => {
            let ctx = super::Context::current()?;
            let instr = instr.clone();
            one(super::creation::create(&ctx, move |dst| {
                let mut instr = instr;
                // A creation instruction names only its result.
                instr.visit_values_mut(&mut |r| *r = dst);
                instr
            }))
        }
        Instr::Unary { op, src, .. } => one(get(src)?.unary(*op)),
        Instr::Cast { src, dtype, .. } => one(get(src)?.to(*dtype)),
        Instr::Binary { op, lhs, rhs, .. } => one(binary(*op, arg(lhs)?, arg(rhs)?)),
        Instr::Where { cond, on_true, on_false, .. } => one(where_(get(cond)?, arg(on_true)?, arg(on_false)?)),
        Instr::MatMul { lhs, rhs, .. } => one(get(lhs)?.matmul(get(rhs)?)),
        Instr::Reduce { op, src, axes, keepdim, .. } => one(get(src)?.reduce(*op, axes.as_deref(), *keepdim)),
        Instr::Transpose { src, dim0, dim1, .. } => one(get(src)?.transpose(*dim0, *dim1)),
        Instr::Permute { src, perm, .. } => one(get(src)?.permute(perm)),
        Instr::Reshape { src, shape, .. } => one(get(src)?.reshape(shape)),
        Instr::Squeeze { src, axes: None, .. } => one(get(src)?.squeeze_all()),
        Instr::Squeeze { src, axes: Some(axes), .. } => {
            let src = get(src)?;
            let axes = axes.clone();
            one(apply(&[src], |dst| Instr::Squeeze { dst, src: src.id(), axes: Some(axes) }, Some(GradOp::Reshape)))
        }
        Instr::Unsqueeze { src, axis, .. } => one(get(src)?.unsqueeze(*axis)),
        Instr::BroadcastTo { src, shape, .. } => one(get(src)?.broadcast_to(shape)),
        Instr::Concat { srcs, axis, .. } => {
            let ts = srcs.iter().map(get).collect::<Result<Vec<_>>>()?;
            one(cat(&ts, *axis))
        }
        Instr::Slice { src, index, .. } => one(get(src)?.slice(index)),
        Instr::Split { src, axis, spec, .. } => get(src)?.split_by(spec.clone(), *axis),
        Instr::Collective { dsts, op: collective, srcs } => {
            // Collectives are what the shard pass emits; a script that writes them gets their
            // values (the stream says where they run), not gradients through them.
            let ts = srcs.iter().map(get).collect::<Result<Vec<_>>>()?;
            let (collective, ids) = (*collective, ts.iter().map(|t| t.id()).collect());
            apply_multi(&ts, dsts.len(), |dsts| Instr::Collective { dsts, op: collective, srcs: ids }, |_, _| None)
        }
        Instr::Fused { .. }
        | Instr::Free { .. }
        | Instr::GetData { .. }
        | Instr::HotPathStart { .. }
        | Instr::HotPathEnd { .. }
        | Instr::SignalStart { .. }
        | Instr::SignalEnd { .. } => Err(TensorError::invalid(op, Misuse::NotATensorOp)),
    }
}
